"""The default launcher: every node over SSH, each unit a Docker container.

The transport is the runner's own SSH connections (``transports/ssh``: its
session, ``transports/ssh/session.py``), one per node, or the cluster's
connection holder (``ssh.persist_s``, ``transports/ssh/mux.py``), which keeps
them for the commands of many processes;
a step runs as one command per node on the runner's pool. The launcher starts
a release's units with one command per node (their containers'
``docker run``, ``roles.containers``), holds nothing besides the containers,
and lets ``status`` read the containers alone.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, ContextManager

from llmdeploy.inventory import Cluster, Node
from llmdeploy.launcher import ReleaseView
from llmdeploy.releaseplan import ReleasePlan, Unit
from llmdeploy.runner import SKIPPED, Runner, Step
from transports.ssh.session import SshTransport

NAME = "ssh"

# mpirun starts its daemons over SSH from the first node, as it does by default
MPIRUN_ARGS: tuple[str, ...] = ()


class DockerUnits:
    """A release's units as Docker containers the nodes' dockerd runs."""

    def __init__(self, cluster: Cluster, runner: Runner, say: Callable[[str], None]):
        self.c = cluster
        self.r = runner
        self.say = say

    def preflight(self, plan: ReleasePlan) -> tuple[str, str] | None:
        """Nothing to ask before the previous release stops: a node that is down fails its first command."""
        return None

    def hold(self, plan: ReleasePlan) -> tuple[str, str] | None:
        """The nodes are the cluster's: nothing holds them for a release."""
        return None

    def start_units(self, plan: ReleasePlan, units: list[Unit], script: Callable[[Unit], str],
                    number: Callable[[Unit], int]) -> tuple[str, str] | None:
        """One command per node starts its units, in order; the first node where one did not start."""
        by_host: dict[str, list[Unit]] = {}
        for u in units:
            by_host.setdefault(u.host, []).append(u)
        res = self.r.run(
            Step(name="start", build=lambda n: "set -e\n" + "".join(script(u) for u in by_host[n.name])),
            [self.c.node(h) for h in by_host],
        )
        for h, r in res.items():
            if r.failed or r.status == SKIPPED:  # skipped: the runner gave up on this host earlier
                return h, f"{', '.join(u.container for u in by_host[h])} did not start: {r.msg}"
        return None

    def end(self, keep_release: str | None) -> list[str]:
        """The stopped containers were all a release held."""
        return []

    def view(self, plan: ReleasePlan | None) -> ReleaseView:
        """The containers' states are the units' states."""
        return ReleaseView()

    def serve_reads(self, plan: ReleasePlan, reads: list[Step]) -> None:
        """Every read is one command per node over SSH (or the connection holder): nothing to keep running."""

    def site_checks(self, nodes: list[Node], image: Callable[[], str | None]) -> list[tuple[str, str | None]]:
        """Nothing of a site: prepare's own steps check each node."""
        return []


def transport(runner: Runner) -> SshTransport:
    """Every node over its own SSH connection (``transports.ssh.session.SshTransport``)."""
    return SshTransport(runner)


def launcher(cluster: Cluster, runner: Runner, say: Callable[[str], None]) -> DockerUnits:
    return DockerUnits(cluster, runner, say)


def outside_ssh(cluster: Cluster) -> bool:
    """The nodes are SSH hosts: ``invoke check``'s testinfra logs in to each
    one itself (its ssh backend, one master connection per host), directly or
    through the inventory's jump host. Not with ``ssh.become``: its commands
    would run as the user who logs in; they go through the runner, which
    runs every command under sudo (``Runner.wire``)."""
    return not cluster.ssh.become


def handoff(cluster: Cluster, nodes: list[Node]) -> ContextManager[dict[str, str]]:
    """Nothing is held on the nodes for a command: nothing to hand to its child processes."""
    return contextlib.nullcontext({})


def runtime(cluster: Cluster) -> None:
    """Each unit is a container of the node's dockerd (the default runtime, ``roles/runtime``)."""
    return None


def start_lines(cluster: Cluster, plan: ReleasePlan, script: Callable[[Unit], str]) -> list[tuple[str, str]]:
    """Each unit starts by its node's run.sh (its docker run, already shown): no launch line of the launcher's own."""
    return []


# this plug-in's conformance, for the type checker (the registry checks it again when it loads)
if TYPE_CHECKING:  # pragma: no cover - types only
    import launchers.ssh as _this
    from llmdeploy.launcher import Launcher, LauncherPlugin, Transport

    _conforms: LauncherPlugin = _this
    _transport: Callable[[Runner], Transport] = SshTransport
    _launcher: Callable[[Cluster, Runner, Callable[[str], None]], Launcher] = DockerUnits
