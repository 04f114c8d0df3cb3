"""The Slurm launcher's inventory section, ``cluster.slurm`` (an
``llmdeploy.launcher.LauncherSection``): its schema, and its rules, which the
inventory's validation runs before any connection (``Slurm.settle``): the
per-user folders a job's user writes, the login host that is not a node, one
Slurm name per node, the container runtime the platform's units run with
under Slurm (the vendor's first that can run the cluster as planned), what a
pyxis step cannot give, and the vendor's word for its accelerators as the
GRES name. An inventory imports :class:`Slurm` from here.

Imports only the core (a launcher's module; ``launchers/slurm/`` is loaded
with it).
"""

from __future__ import annotations

import getpass
import ipaddress
import re
from typing import TYPE_CHECKING, Literal, cast

from pydantic import Field, field_validator

from llmdeploy.inventory import USER_RE, Node
from llmdeploy.schema import NAME_RE, Port
from llmdeploy.launcher import LauncherSection

if TYPE_CHECKING:  # pragma: no cover - types only
    from llmdeploy.inventory import Cluster
    from llmdeploy.platform import Vendor

# partition, account and reservation names as Slurm takes them (no spaces, no shell syntax)
SLURM_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds, or UNLIMITED (sbatch(1))
SLURM_TIME_RE = re.compile(r"^(\d+|\d+:\d{2}|\d+:\d{2}:\d{2}|\d+-\d+|\d+-\d+:\d{2}|\d+-\d+:\d{2}:\d{2}|UNLIMITED|infinite)$")
# a Slurm cluster's per-user defaults of base_dir, etc_dir and log_dir: /var/tmp/llmdeploy-<user>/<this>
USER_DIRS = {"base_dir": "lib", "etc_dir": "etc", "log_dir": "log"}


class Slurm(LauncherSection):
    """The cluster's nodes belong to a Slurm controller: commands reach them as
    job steps (srun) from the login host, and a release is a job whose steps
    are its units (the Slurm launcher, launchers/slurm/)."""

    SECTION = "slurm"

    # the login host: reached over SSH like a node (an ssh_config name or an address)
    login: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9.:-]*$")
    login_port: Port | None = None
    partition: str = Field(pattern=SLURM_NAME_RE.pattern)
    account: str | None = Field(default=None, pattern=SLURM_NAME_RE.pattern)
    reservation: str | None = Field(default=None, pattern=SLURM_NAME_RE.pattern)
    # Slurm's names of the inventory's nodes, in the same order; default: the nodes' names
    nodelist: list[str] | None = None
    # the release's job time limit (sbatch --time); None: the partition's default. deploy refuses one longer
    # than the partition's own (Slurm would leave the job pending); status and top show the time left
    time_limit: str | None = Field(default=None, pattern=SLURM_TIME_RE.pattern)
    # this many seconds before its time limit the release's job writes a warning into node 0's audit log
    # (command slurm.time-limit, result warning); None: no warning. A job whose whole limit is shorter warns when it starts
    end_warning_s: int | None = Field(default=3600, ge=60)
    # how a unit's container starts on its node: "pyxis" (each unit a step
    # with srun --container-image, enroot) or "docker" (srun runs the unit's
    # docker run there); None: the platform's vendor's default (NVIDIA:
    # pyxis, or docker for a cluster that needs what only docker does: an
    # image tarball or chain; Ascend: docker)
    container: Literal["docker", "pyxis"] | None = None
    # the nodes' accelerators as Slurm's generic resources (gres.conf Name=):
    # every job and step asks for ``--gres=<gres>:<per node>``; None: the
    # vendor's word for one accelerator ("gpu", "npu"; where a site names them otherwise, say so)
    gres: str | None = Field(default=None, pattern=SLURM_NAME_RE.pattern)
    # how many per node; None: the platform's devices; 0: the site has no GRES for them (nothing is asked for)
    gres_per_node: int | None = Field(default=None, ge=0, le=64)
    # seconds to wait for an allocation (salloc/sbatch) before giving up
    alloc_timeout_s: float = Field(default=120, gt=0)
    # the time limit of a command's own allocation (facts, prepare, verify-comm,
    # status when no release job runs): what a tool killed mid-command leaves
    # allocated ends by then
    command_time_limit: str = Field(default="4:00:00", pattern=SLURM_TIME_RE.pattern)
    # seconds between two rounds of the release's reader: one step of its job
    # that reads every node for status, top and the engine's watcher, so that
    # their reads are not a new job step each (Slurm ends a job at
    # MaxStepCount). A read is answered from it when its record is at most
    # 3 periods and 2 s old, else it runs as a step. Each round runs status's,
    # top's and the watcher's scripts on every node: docker inspect, the
    # accelerators' query, the metrics page on its node
    reader_period_s: float = Field(default=1.0, ge=0.2, le=10)
    # Slurm gives a step's tasks srun's own soft limits, i.e. the login
    # shell's (slurm.conf PropagateResourceLimits=ALL, the default): often a
    # memlock of 64 KiB to 8 MiB, under which NCCL, UCX and NIXL cannot
    # register memory. Where the site does not set
    # PropagateResourceLimitsExcept=MEMLOCK, False makes every srun and
    # sbatch of the tool run with --propagate=NONE (salloc has no such
    # option): the tasks then get slurmd's limits. prepare and invoke check read the memlock in a step.
    propagate_limits: bool = True
    # the memlock (KiB) a pyxis unit's tasks need at least; None: unlimited
    # (RDMA registration, as the seeds' docker run --ulimit memlock=-1)
    memlock_kib: int | None = Field(default=None, ge=1)

    @field_validator("nodelist")
    @classmethod
    def _slurm_names(cls, v: list[str] | None) -> list[str] | None:
        """Each name is one Slurm and a shell can take (letters, digits, '-')."""
        for name in v or []:
            if not NAME_RE.match(name):
                raise ValueError(f"{name!r} is not a node name Slurm and a shell can take (letters, digits, '-')")
        return v

    def login_node(self) -> Node:
        """The login host as a node of the runner's (its name: the host's first label)."""
        name = re.sub(r"[^A-Za-z0-9-]", "-", self.login.split(".")[0]).strip("-")[:63] or "login"
        return Node(name=name, ip=ipaddress.IPv4Address("0.0.0.0"), ssh_host=self.login, ssh_port=self.login_port)

    def node_name(self, cluster: Cluster, node: Node) -> str:
        """Slurm's name of one of the inventory's nodes."""
        if self.nodelist is None:
            return node.name
        return self.nodelist[[n.name for n in cluster.nodes].index(node.name)]

    # --- the rules (the inventory's validation runs them, before any connection) ---------------
    def settle(self, cluster: Cluster, vendor: Vendor | None) -> list[tuple[str, str]]:
        """What contradicts in ``slurm``, named; and what it leaves to the
        cluster filled: the per-user folders, the container runtime, the GRES
        name (``vendor``: the platform's; None when it is unknown)."""
        problems = _user_dirs(cluster)
        if cluster.ssh.become:
            # sudo on the login host would submit every job step as root: srun runs as the user who calls it
            problems.append(("ssh.become", "not with slurm: a Slurm job runs as the user who submits it, and under sudo "
                                           "srun would run every step as root; log in as the user the jobs should run as"))
        problems += self._node_problems(cluster)
        if vendor is None:
            return problems  # the platform's own problem is named where it is checked
        if self.gres is None:
            self.gres = vendor.DEVICE
        allowed = vendor.SCHEDULED_CONTAINERS
        if self.container is None:
            # the vendor's first that can run the cluster as planned (what only docker does keeps it on docker)
            # (a vendor's SCHEDULED_CONTAINERS are values of this field: the Vendor protocol types them as str)
            self.container = cast(Literal["docker", "pyxis"], next((c for c in allowed if not pyxis_problems(cluster, c)), allowed[-1]))
        elif self.container not in allowed:
            problems.append(("slurm.container", f"{self.container!r}: {cluster.platform}'s units run under Slurm with "
                                                f"{' or '.join(map(repr, allowed))} (the README, \"Clusters run by Slurm\")"))
        return problems + pyxis_problems(cluster, self.container)

    def _node_problems(self, cluster: Cluster) -> list[tuple[str, str]]:
        """One Slurm name per node, none twice, and the login host not a node."""
        problems = []
        names = [n.name for n in cluster.nodes]
        if self.nodelist is not None:
            if len(self.nodelist) != len(cluster.nodes):
                problems.append(("slurm.nodelist", f"names {len(self.nodelist)} Slurm nodes for the inventory's {len(cluster.nodes)} "
                                                   "(one per node, in the nodes' order)"))
            dup = sorted({x for x in self.nodelist if self.nodelist.count(x) > 1})
            if dup:
                problems.append(("slurm.nodelist", f"names {', '.join(dup)} more than once"))
        login = self.login_node().name
        if login in names or self.login in names or login in (self.nodelist or []):
            problems.append(("slurm.login", f"{self.login} is one of the cluster's nodes: the login host submits jobs, it does not serve"))
        return problems


def section(cluster: Cluster) -> Slurm:
    """The cluster's ``slurm`` section: this launcher runs only the clusters that set it (``launcher.name_of``)."""
    s = cluster.slurm
    assert isinstance(s, Slurm), f"{cluster.name} has no slurm section"
    return s


def _user_dirs(cluster: Cluster) -> list[tuple[str, str]]:
    """On a Slurm cluster, what the tool writes on a node defaults to the user's own folder (``base_dir``)."""
    unset = [f for f in USER_DIRS if f not in cluster.model_fields_set]
    if not unset:
        return []
    try:
        user = cluster.ssh.user or getpass.getuser()
    except (KeyError, OSError):  # a uid without a passwd entry here
        return [("ssh.user", "unset, and your own user has no name here: set ssh.user, or base_dir, etc_dir and log_dir")]
    if not re.match(USER_RE, user):
        return [("ssh.user", f"unset, and your own name {user!r} is no user name a path can hold: set ssh.user, or base_dir, etc_dir and log_dir")]
    for f in unset:
        setattr(cluster, f, f"/var/tmp/llmdeploy-{user}/{USER_DIRS[f]}")
    return []


def pyxis_problems(cluster: Cluster, container: str) -> list[tuple[str, str]]:
    """What a cluster on ``container`` asks for that a pyxis step cannot give (nothing for docker)."""
    if container != "pyxis":
        return []
    if cluster.image.tarball:
        return [("slurm.container", "pyxis imports images from a registry (enroot): image.tarball is loaded by docker on each node; "
                                    "use container 'docker' or drop image.tarball")]
    problems = []
    why = cluster.profile.launched_worlds(cluster)
    if why:
        problems.append(("slurm.container", f"'pyxis': {why}; use container 'docker'"))
    if cluster.image.distribute:
        problems.append(("image.distribute", "sends the image down the nodes' chain with docker save and docker load; pyxis imports it "
                                             "on each node from the registry (enroot): drop image.distribute or use container 'docker'"))
    wheels = cluster.profile.wheel_set()
    if wheels and wheels.pins and wheels.wheel_dir and not re.fullmatch(r"/[^\s:]*", wheels.wheel_dir):
        # enroot mounts it (start --mount SRC:DST:...): a path with no space or colon
        problems.append(("profile.wheel_dir", f"{wheels.wheel_dir!r}: with pyxis, enroot mounts the wheel directory while pip installs "
                                              "the wheels, which takes an absolute path without spaces or colons"))
    return problems
