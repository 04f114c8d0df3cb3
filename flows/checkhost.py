"""testinfra's hosts for ``invoke check`` through the tool's own runner: a
testinfra backend (``runner://<node>``) whose commands are
``Runner.exec(node, command)``, so they reach a node the way every other
command of the tool does, through the cluster's launcher's transport (over
SSH on the default launcher; as job steps from the login host on Slurm).
``invoke check`` uses it on a cluster whose launcher admits no outside SSH
client (``LauncherPlugin.outside_ssh``); testinfra's own ssh backend stays
the one for the others.

tests/node/conftest.py registers the scheme (:func:`register`) in each
pytest process; each process keeps one runner per cluster
(:func:`runner_of`, closed by :func:`close` when its session ends), which
reaches every node of the cluster (pytest-xdist hands a worker any host's
tests). What the launcher holds for the command (an allocation) is held by
``invoke check`` itself and handed to these runners through the environment
(``LauncherPlugin.handoff``), so a worker's runner holds nothing of its own.

The runner reads a command's output as UTF-8 (an undecodable byte is
replaced): ``stdout_bytes`` of a binary output is not the node's bytes.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import testinfra.backend
from testinfra.backend import base

from llmdeploy.errors import UnreachableError
from flows.binding import load
from llmdeploy.runner import Runner

# the scheme of testinfra's host specs (``runner://<node name>``) and the pytest ids (``test_x[runner://<node>]``)
SCHEME = "runner"
# the cluster whose nodes the node tests run on (set by invoke check)
CLUSTER_ENV = "LLMDEPLOY_NODE_TESTS"

_LOCK = threading.Lock()
_RUNNERS: dict[str, Runner] = {}


class NodeUnreachable(RuntimeError):
    """A node's command did not run (the node is not reachable, or no step can
    start there); the message names the node (testinfra's ssh backend raises a
    RuntimeError too when ssh itself fails)."""


def register() -> None:
    """Make ``runner://`` a testinfra connection of this process (``--hosts=runner://node0``, ``testinfra.get_host``)."""
    testinfra.backend.BACKENDS[SCHEME] = f"{__name__}.{RunnerBackend.__name__}"


def runner_of(cluster_name: str) -> Runner:
    """This process's runner of the cluster, made on first use."""
    with _LOCK:
        r = _RUNNERS.get(cluster_name)
        if r is None:
            r = _RUNNERS[cluster_name] = load(cluster_name).runner()
        return r


def close() -> None:
    """Close this process's runners (their connections; nothing they were handed is given back here)."""
    with _LOCK:
        runners = list(_RUNNERS.values())
        _RUNNERS.clear()
    for r in runners:
        r.close()


class RunnerBackend(base.BaseBackend):
    """A node of the cluster ``LLMDEPLOY_NODE_TESTS`` names, its commands
    through this process's runner (``runner``: another runner, for a test)."""

    NAME = SCHEME

    def __init__(self, hostspec: str, *args: Any, runner: Runner | None = None, **kwargs: Any):
        # testinfra's pytest plugin passes its other options (ssh_config, ...) to every backend: not used here
        super().__init__(self.parse_hostspec(hostspec).name, sudo=kwargs.get("sudo") or False, sudo_user=kwargs.get("sudo_user"))
        self._runner = runner

    @property
    def runner(self) -> Runner:
        if self._runner is None:
            name = os.environ.get(CLUSTER_ENV)
            if not name:
                raise NodeUnreachable(f"{self.hostname}: {CLUSTER_ENV} names no cluster (invoke check sets it)")
            self._runner = runner_of(name)
        return self._runner

    def get_encoding(self) -> str:
        """The runner decodes every output as UTF-8: no command asks the node."""
        return "utf-8"

    def run(self, command: str, *args: str, **kwargs: Any) -> base.CommandResult:
        command = self.get_command(command, *args)
        runner = self.runner
        try:
            node = runner.cluster.node(self.hostname)
        except KeyError:
            raise NodeUnreachable(f"{self.hostname}: not a node of cluster {runner.cluster.name}") from None
        try:
            out, err, code = runner.exec(node, command)
        except UnreachableError as exc:
            raise NodeUnreachable(f"{self.hostname}: {exc}") from exc
        return self.result(code, self.encode(command), out, err)
