"""The launcher interface: the one place that says how a command reaches a
node (a :class:`Transport`) and how a release's units start, are watched and
stop (a :class:`Launcher`). The generic code (the runner, the engine, the
flows, the roles) asks a cluster's launcher through what is declared here
and never names one.

A launcher is a module or package ``launchers/<name>``
(``launchers/ssh.py``: SSH and Docker; ``launchers/slurm/``:
job steps from a login host, Docker on the nodes) registered with one line in
``launchers/__init__.py`` (``LAUNCHERS``: the launcher -> the
inventory section that picks it, None for the default one). A cluster's
launcher is picked once, from its inventory (:func:`name_of`), and its module
is loaded on first use (:func:`plugin`) and checked against
:class:`LauncherPlugin` (``llmdeploy.plugin``, as the serving systems and the
hardware vendors are).

The SSH connections the runner's commands go over are a transport's too
(:class:`Connector`, ``Transport.connector``): ``transports/ssh``, the SSH
connector both launchers use (the SSH launcher to every node, the Slurm
launcher to its login host), declared here and never imported by the core.

Core: imports nothing above ``llmdeploy``; nothing outside
``launchers/`` imports a launcher, and only the launchers and the flows
import ``transports/`` (import-linter's ``launchers`` and ``transports``
contracts).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ContextManager, Protocol

from .errors import LlmdeployError
from .plugin import Registry, check
from .schema import Strict

if TYPE_CHECKING:  # pragma: no cover - types only
    from fabric import Connection
    from rich.console import Console

    from .container import ContainerSpec
    from .inventory import Cluster, Node
    from .platform import Vendor
    from .releaseplan import ReleasePlan, Unit
    from .runner import HostResult, Runner, Step

# the package that holds the launchers and their registry (``LAUNCHERS``)
PLUGINS = "launchers"


# each launcher's inventory section class, by its field name (``cluster.slurm``), as its package declares it
SECTIONS: dict[str, type["LauncherSection"]] = {}


class LauncherSection(Strict):
    """The base of a launcher's inventory section (``cluster.slurm``): its
    schema is the launcher's own (``launchers/slurm/schema.py``), as a serving
    system's profile is the system's, and so are its rules.

    ``SECTION``: the inventory field it is (a class that sets it is
    registered in :data:`SECTIONS` when its module loads). ``settle(cluster,
    vendor)``: run by the inventory's validation, before any connection;
    fills what the section leaves to the cluster and its platform (``vendor``:
    the platform's :class:`~llmdeploy.platform.Vendor`, None when the
    platform is unknown, which the inventory names itself) and returns what
    contradicts, as (field, message) pairs. ``node_name(cluster, node)``: the
    launcher's own name of one of the inventory's nodes."""

    SECTION: ClassVar[str] = ""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if cls.SECTION:
            SECTIONS[cls.SECTION] = cls

    def settle(self, cluster: "Cluster", vendor: "Vendor | None") -> list[tuple[str, str]]:
        return []

    def node_name(self, cluster: "Cluster", node: "Node") -> str:
        return node.name


class Connector(Protocol):
    """The SSH connections a runner's commands go over (``Runner.ssh``; one
    per runner): the one its transport gives it (``Transport.connector``;
    ``transports/ssh``'s ``SshSession``, which the core never imports), to
    the hosts the transport sends the commands to (``Transport.hosts``).

    ``exec(node, command, timeout, stdin, on_line)``: one command on host
    ``node`` over its connection, opened on first use and reused (or
    through the cluster's connection holder, ``ssh.persist_s``), put on the
    wire by ``Runner.wire``: ``(stdout, stderr, exit code, fired)``,
    ``fired`` (deadline, what became of the command) when its deadline
    (``timeout``, else ``ssh.command_timeout``) fired, else None; an
    :class:`~llmdeploy.errors.UnreachableError` (``ConnectionLost``: it
    died under the command) when the host cannot be reached.
    ``stream(host, command)``: a command whose output goes straight to this
    terminal (a log followed), its exit code. ``connection(node)``: the
    open Fabric connection that carries ``node``'s commands and port
    forwards (its transport's ``carrier``), ``connection_name(node)``: that
    host's name. ``abandon(host)``: ``host``'s connection given up after an
    interrupt ended a command on it (the commands after get a new one).
    ``close()``: every connection closed."""

    def exec(self, node: "Node", command: str, timeout: float | None, stdin: str | bytes | None,
             on_line: Callable[[str, str], None] | None) -> tuple[str, str, int, tuple[float, str] | None]: ...

    def stream(self, node: "Node", command: str) -> int: ...

    def connection(self, node: "Node") -> "Connection": ...

    def connection_name(self, node: "Node") -> str: ...

    def abandon(self, node: "Node") -> None: ...

    def close(self) -> None: ...


class Transport(Protocol):
    """How the runner's commands reach a node (``Runner.transport``; one per runner).

    ``hosts(nodes)``: the hosts the runner opens its SSH connections to for
    ``nodes`` (the nodes themselves, or the one host they are reached
    through). ``carrier(node)``: the host whose SSH connection carries
    ``node``'s commands and port forwards. ``exec``: one command on one node
    (``Runner.exec``). ``run(step, targets)``: a step on many nodes, one
    :class:`~llmdeploy.runner.HostResult` per node (in parallel over SSH, or
    as one command that fans out). ``follow(node, command, name)``: the host
    and the command that print ``command``'s output on ``node`` as it comes
    (``Runner.stream``). ``forward_dest(node, dest)``: the address a port
    forward over ``carrier(node)``'s connection asks for to reach ``dest``
    as ``node`` sees it. ``close()``: what the transport holds for this
    runner is given back. ``world(nodes, tasks, argv, env, timeout)``: ``argv`` as
    one MPI world of ``tasks`` processes on each of ``nodes``, its ranks
    wired up by the launcher (no mpirun, no SSH between the nodes; ``env``:
    node name -> variables for that node's processes), output and exit
    code; None when the transport has no such launch (the caller runs
    mpirun on the first node instead). ``holder``: whether commands may go through the
    cluster's connection holder (``ssh.persist_s``, ``transports/ssh/mux.py``).
    ``connector(hosts, persist)``: the runner's SSH connections to ``hosts``
    (``hosts(runner.nodes)``), a :class:`Connector` (``transports/ssh``;
    ``persist``: through the connection holder when the cluster has one),
    made once by the runner's constructor, after the transport."""

    holder: bool

    def hosts(self, nodes: "list[Node]") -> "list[Node]": ...

    def carrier(self, node: "Node") -> "Node": ...

    def exec(self, node: "Node", command: str, timeout: float | None, stdin: str | bytes | None,
             on_line: Callable[[str, str], None] | None) -> tuple[str, str, int]: ...

    def run(self, step: "Step", targets: "list[Node]", deadline: float | None,
            on_line: Callable[[str, str, str], None] | None) -> "dict[str, HostResult]": ...

    def follow(self, node: "Node", command: str, name: str) -> "tuple[Node, str]": ...

    def forward_dest(self, node: "Node", dest: str) -> str: ...

    def world(self, nodes: "list[Node]", tasks: int, argv: list[str], env: dict[str, dict[str, str]],
              timeout: float | None) -> tuple[str, str, int] | None: ...

    def close(self) -> None: ...

    def connector(self, hosts: "list[Node]", persist: bool) -> Connector: ...


@dataclass
class ReleaseView:
    """What a launcher adds to ``status`` of a release: why the release is
    not serving as the launcher runs it (``problem``), a unit's state as the
    launcher sees it (``unit_state(state, unit)``) and the keys it adds to
    the unit's entry (``unit_doc(unit)``), the keys it adds to the document
    (``doc``), and what it prints after the table (``show(console)``).
    ``ends``: when the launcher's hold of the release ends by itself (what
    ends, seconds left when read: a Slurm job's time limit), None when it
    does not (``top`` counts it down)."""

    problem: str | None = None
    ends: tuple[str, float] | None = None
    doc: dict[str, Any] = field(default_factory=dict)
    unit_state: Callable[[str, "Unit"], str] = lambda state, unit: state
    unit_doc: Callable[["Unit"], dict[str, Any]] = lambda unit: {}
    show: Callable[["Console"], None] = lambda con: None


@dataclass(frozen=True)
class Wheels:
    """Pinned wheels to install into the units' image once for the cluster
    (prepare's wheels step, ``roles.wheels``), as a runtime's
    ``wheels_script`` is given them: the same command whatever the runtime.

    ``ref``: the base image, as the inventory names it (what the image step
    has on the node). ``name``: what tells the image with the wheels from
    its base (``wheels-<hash of the base reference and the pins>``: one
    name per base and pins; ``[A-Za-z0-9_.-]``). ``install``: the argv that
    installs them in a writable container of the base, as root, on the
    node's network (pip with its index options). ``progress``: the awk rules
    that read how far ``install`` got from its lines (``sections.counted``).
    ``mounts``: (directory on the node, path in the container) mounted
    read-only while ``install`` runs (a directory of wheels), each a
    directory the node must have. ``verify``: the argv that, run in the
    result, prints ``unitscripts.WHEELS_MARK versions <JSON>`` and fails
    unless the pinned versions are installed."""

    ref: str
    name: str
    install: tuple[str, ...]
    progress: str
    mounts: tuple[tuple[str, str], ...]
    verify: tuple[str, ...]


class Launcher(Protocol):
    """How the engine (``flows/engine.py``) starts, watches and stops a
    release's units on a cluster (one per engine).

    Each step that can fail returns None or ``(where, why)`` (a host, and the
    reason the release failed there). ``preflight(plan)``: before anything
    stops, whether the plan's nodes can be had. ``hold(plan)``: the
    release's hold on its nodes, once the previous release stopped.
    ``start_units(plan, units, script, number)``: ``units`` started at once,
    each by ``script(unit)`` (the container's start, ``roles.containers``),
    ``number(unit)`` its attempt. ``end(keep_release)``: after the engine
    stopped the containers, what the launcher holds for every release but
    ``keep_release`` is let go; its problems. ``view(plan)``: what
    ``status`` adds (:class:`ReleaseView`). ``serve_reads(plan, reads)``:
    once the release is held, the ``standing`` steps (status's, top's and
    the watcher's reads of its nodes, ``Step.standing``) that the launcher
    may answer from one long-lived reader of its own instead of a command
    each; it says what it did (``say``), and a reader it could not start
    only costs the reads their commands. ``site_checks(nodes, image)``: what
    prepare and ``invoke check`` ask of the site the launcher runs the units
    on (``image()``: what the units run, as the first node's prepare record
    names it, read when called; None: not prepared), as (what, its problem
    or None); empty where the launcher needs nothing of a site."""

    def preflight(self, plan: "ReleasePlan") -> tuple[str, str] | None: ...

    def hold(self, plan: "ReleasePlan") -> tuple[str, str] | None: ...

    def start_units(self, plan: "ReleasePlan", units: "list[Unit]", script: Callable[["Unit"], str],
                    number: Callable[["Unit"], int]) -> tuple[str, str] | None: ...

    def end(self, keep_release: str | None) -> list[str]: ...

    def view(self, plan: "ReleasePlan | None") -> ReleaseView: ...

    def serve_reads(self, plan: "ReleasePlan", reads: "list[Step]") -> None: ...

    def site_checks(self, nodes: "list[Node]", image: Callable[[], str | None]) -> list[tuple[str, str | None]]: ...


class UnitRuntime(Protocol):
    """What runs a release's units on a node, as the node's scripts (pure
    builders; the runner runs them): Docker's (``roles/runtime``, the
    default), or a launcher's own (``LauncherPlugin.runtime``: a pyxis unit
    on a Slurm node is a job step's processes, with no daemon that keeps its
    state). Every runtime prints what Docker's scripts print, so the flows
    read every runtime with the same parsers (``roles.containers.parse_states``,
    ``roles.status.parse_status``, ``parse_top``, ``parse_logs``).

    ``run_command(spec, release)``: what runs unit ``spec``
    (``llmdeploy.container``) of ``release``, as one shell line: Docker's
    ``docker run``, a pyxis step's ``srun --container-*`` options and
    command. ``deploy --check`` shows it, and Docker's run script is it.
    ``start_script(release_dir, container, run_file, attempt)``: what a
    node runs to start one unit (None: the launcher starts it itself, from
    the unit's plan, ``Launcher.start_units``). ``states_script``: one
    ``<name> <status> <exit code>`` line per unit. ``wait_port_script``:
    until a port accepts, exit 3 as soon as the unit is not running.
    ``log_tail_script``: the end of a unit's log. ``phases_script``,
    ``stop_script``, ``stop_units_script``: the ordered stop (every unit of
    the cluster but ``keep_release``'s, by stop phase; or named units, each
    one's log kept in its release). ``signal_script``: a signal to each
    named unit's command. ``status_script``, ``top_script``,
    ``logs_script``, ``follow_command``: status's, top's and logs' reads
    (``top_script``'s ``accel``: the platform's query of its devices, ``Vendor.TOP_QUERY``).
    ``bundle_sections(containers, max_bytes)``: a failure bundle's files of
    each unit, ``(file name, shell command)``.

    The units' image and engine, as prepare, facts and the release's reads
    see them: ``image_script(ref, check)``, what a node runs to have image
    ``ref`` the way its units run it, printing ``unitscripts.IMAGE_MARK``'s
    lines (``check``: read-only, what it would do; the facts script probes
    with it): the cluster's image on every node, and each of the profile's
    accessory images on node 0; None: Docker's pull or load (``roles.image``).
    ``image_id_script()``: shell that defines ``llmdeploy_image_id REF``,
    which prints the ID of image REF on the node (the config digest, Docker's
    image ID) and fails when the node lacks it (REF as a release records it:
    a reference, or what prepare recorded for the units to run).
    ``engine_script()``: the engine that runs the units, a line
    ``<name> version <version>`` per part (``-``: a version the node cannot
    tell), failing with the reason when the node cannot run them (a
    section of the facts script: it must not exit the script).
    ``running_script()``: the names of the cluster's units that run on the
    node, one a line. ``wheels_script(wheels, check)``: what a node runs to
    have the image its units run with the pinned wheels installed
    (:class:`Wheels`), once, printing ``unitscripts.WHEELS_MARK``'s lines
    (``serving``: what the units run, which prepare records as the node's
    ``serving_ref``; ``check``: read-only, what it would do); None: Docker's
    derived image (``docker run`` + pip + ``docker commit``, ``roles.wheels``).
    ``wheels_files(serving)``: the node's files that hold the runtime's own
    image with the wheels whose units run ``serving`` (what ``wheels_script``
    printed), in the order a copy puts them in place: sent whole from the
    node that built it, they make another node find it present, so that the
    cluster builds it once (``flows.stage.distribute_wheels``); () for
    Docker's, which travels as ``docker save``. A builder raises
    ``LlmdeployError`` for what its runtime cannot do (a pyxis unit's log
    has no times: ``logs --since``).

    ``worlds``: whether the runtime starts a world (a service whose units
    are one, ``Service.world``) as one start over its nodes, each task given
    its place by the launcher (its MPI rank through PMIx when ``Service.mpi``);
    otherwise a world's launch unit runs mpirun, which reaches the other
    units itself, or each node's unit joins the others (SGLang's store)."""

    worlds: bool
    # variables the runtime itself puts in a unit's environment (Slurm's GPU mask on pyxis): status --diff
    # counts them only where the release sets them too
    own_env: tuple[str, ...]

    def run_command(self, spec: "ContainerSpec", release: str) -> str: ...

    def start_script(self, release_dir: str, container: str, run_file: str, attempt: int) -> str | None: ...

    def states_script(self, containers: list[str]) -> str: ...

    def wait_port_script(self, container: str, ip: str, port: int, timeout: float) -> str: ...

    def log_tail_script(self, container: str) -> str: ...

    def phases_script(self, keep_release: str | None) -> str: ...

    def stop_script(self, keep_release: str | None, timeout: int, phase: int | None = None) -> str: ...

    def stop_units_script(self, release_dir: str, containers: list[str], timeout: int, log_suffix: str = "stopped") -> str: ...

    def signal_script(self, containers: list[str], sig: str = "TERM") -> str: ...

    def status_script(self) -> str: ...

    def top_script(self, accel: str, metrics: tuple[str, int, str] | None = None) -> str: ...

    def logs_script(self, service: str | None, opts: list[str], with_logs: bool = True) -> str: ...

    def follow_command(self, container: str, opts: list[str]) -> str: ...

    def bundle_sections(self, containers: list[str], max_bytes: int) -> list[tuple[str, str]]: ...

    def image_script(self, ref: str, check: bool) -> str | None: ...

    def image_id_script(self) -> str: ...

    def engine_script(self) -> str: ...

    def running_script(self) -> str: ...

    def wheels_script(self, wheels: Wheels, check: bool) -> str | None: ...

    def wheels_files(self, serving: str) -> tuple[str, ...]: ...


class LauncherPlugin(Protocol):
    """What a launcher's module declares (``launchers/<name>``).

    ``NAME``: the registry's name of it. ``MPIRUN_ARGS``: the options an
    ``mpirun`` needs when it runs through this transport (verify-comm's
    all_reduce). ``transport(runner)`` and ``launcher(cluster, runner, say)``: the
    runner's :class:`Transport` and the engine's :class:`Launcher` (``say``:
    how the launcher tells the operator what it did). ``outside_ssh(cluster)``:
    whether an SSH client of its own (``invoke check``'s testinfra, its ssh
    backend) may log in to the nodes, directly or through the inventory's
    jump host; else ``invoke check``'s commands go through the tool's runner
    (``flows/checkhost.py``), as every other command's do.
    ``handoff(cluster, nodes)``: entered by a command whose runners work in
    child processes (``invoke check``'s pytest workers), what the launcher
    holds on ``nodes`` meanwhile (Slurm: the release's job, or an allocation
    of the command's own), given back when it exits; it yields the
    environment that hands it to those processes, whose transports then use
    it instead of holding their own. ``runtime(cluster)``: the
    :class:`UnitRuntime` of the cluster's units when the launcher has its
    own, None for Docker's (``roles/runtime``). ``start_lines(cluster, plan,
    script)``: what ``deploy --check`` prints of how the launcher starts the
    plan's units ((what, command line) each; ``script(unit)``: a unit's start
    on its node), empty when a unit's own docker run is all there is."""

    NAME: str
    MPIRUN_ARGS: tuple[str, ...]

    def transport(self, runner: "Runner") -> Transport: ...

    def launcher(self, cluster: "Cluster", runner: "Runner", say: Callable[[str], None]) -> Launcher: ...

    def outside_ssh(self, cluster: "Cluster") -> bool: ...

    def handoff(self, cluster: "Cluster", nodes: "list[Node]") -> ContextManager[dict[str, str]]: ...

    def runtime(self, cluster: "Cluster") -> UnitRuntime | None: ...

    def start_lines(self, cluster: "Cluster", plan: "ReleasePlan", script: Callable[["Unit"], str]) -> list[tuple[str, str]]: ...



def _registry() -> ModuleType:
    """The registry (``launchers/__init__.py``: ``LAUNCHERS``)."""
    return importlib.import_module(PLUGINS)


def section_class(field: str) -> "type[LauncherSection] | None":
    """The section class of the inventory field ``field`` (``slurm``): its
    launcher (the registry's line that names the field) loaded, which
    declares it; None when no registered launcher has that section."""
    if field not in SECTIONS:
        registered: dict[str, str | None] = _registry().LAUNCHERS
        for name, section in registered.items():
            if section == field:
                plugin(name)
    return SECTIONS.get(field)


def name_of(cluster: "Cluster") -> str:
    """The launcher of ``cluster``: the one whose inventory section it sets, else the default (no section)."""
    registered: dict[str, str | None] = _registry().LAUNCHERS
    for name, section in registered.items():
        if section is not None and getattr(cluster, section, None) is not None:
            return name
    return next(name for name, section in registered.items() if section is None)


def _accept(mod: ModuleType, name: str) -> LauncherPlugin:
    check(mod, LauncherPlugin, "launcher")
    if mod.NAME != name:
        raise TypeError(f"{mod.__name__}: NAME {mod.NAME!r} is not its registered name {name!r}")
    accepted: LauncherPlugin = mod
    return accepted


# the launchers: the module launchers/<name> of each name LAUNCHERS lists
LAUNCHERS: Registry[LauncherPlugin] = Registry("launcher", PLUGINS, lambda: {name: name for name in _registry().LAUNCHERS}, _accept)


def plugin(name: str) -> LauncherPlugin:
    """The module ``launchers/<name>``, loaded on first use and checked against :class:`LauncherPlugin`."""
    return LAUNCHERS.load(name)
