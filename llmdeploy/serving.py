"""The serving-system interface: the one place that says what a serving
system (vLLM-Ascend, TensorRT-LLM, Dynamo, SGLang, ...) gives the rest of the
tool. Everything generic calls a system only through what is declared here.

A serving system is a folder ``systems/<name>/`` with two faces:

1. **Its profile** (:class:`ServingProfile`): the pydantic schema of
   ``cluster.profile``, with the seed's values in the folder's catalogue.
   The cluster and the generic prepare roles ask it, never switch on its type:

   ============================  ===============================================
   ``kind``                      the name inventories and release plans carry
   ``ranks_per_node()``          step of the default ``start_rank`` per node
   ``problems(cluster)``         the system's own checks of the whole cluster
   ``ports()``                   ports the profile binds ({field: port})
   ``node_ports(cluster, n)``    ports on node ``n`` (prepare's budget)
   ``host_memory_gib(c, n)``     host memory the system reserves on ``n``
   ``environment(cluster, n)``   the node's environment file, in order
   ``node_env(cluster, n)``      the variables whose values are ``n``'s own
   ``numa(cluster, n, facts)``   the NUMA binding prepare records, or problems
   ``wheel_set()``               pinned wheels to install into the image
   ``accessory_images()``        images node 0 needs besides the serving one
   ``operator_env()``            the variables the operator sets (``env``)
   ``launch_ssh()``              an MPI launch agent's SSH configuration
   ============================  ===============================================

   Each has a default that is right for a system that needs none of it.

2. **Its plan builder** (:class:`ServingSystem`), registered with one line in
   ``systems/__init__.py`` and checked against this Protocol when it is first
   loaded (:func:`register`: every hook present, each with the Protocol's
   parameters): it turns the inventory into a release plan
   (``llmdeploy.releaseplan``), which then carries everything later commands
   need (stop clean-up, failure signatures, table labels, the environment
   prefixes ``status --diff`` compares), so stop, status, restart and rollback
   of a release read its stored plan, not today's code.

Core: imports nothing above ``llmdeploy``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, ClassVar, NamedTuple, Protocol, TypeVar, get_origin, get_type_hints

from pydantic import Field

from .errors import LlmdeployError
from .plugin import members, signature_problem
from .releaseplan import ReleaseFile as ReleaseFile, ReleaseFiles as ReleaseFiles  # where they were first declared
from .schema import Strict

if TYPE_CHECKING:  # pragma: no cover - types only
    from .deployment import Deployment
    from .inventory import Cluster, Node
    from .releaseplan import Drain, Metrics, Probe, ReleasePlan, Service

# kind -> profile class, filled as the systems' profile classes are defined
PROFILE_KINDS: dict[str, type["ServingProfile"]] = {}
# pydantic model title -> the inventory field it stands for, for messages about
# a model built on its own in an inventory module (a profile, a profile's part)
INVENTORY_FIELDS: dict[str, str] = {}

_Model = TypeVar("_Model", bound=type)


def inventory_field(field: str) -> Callable[[_Model], _Model]:
    """Class decorator: errors of this model, built on its own in an inventory
    module, name ``field`` (e.g. ``profile.workers[]``)."""

    def mark(cls: _Model) -> _Model:
        INVENTORY_FIELDS[cls.__name__] = field
        return cls

    return mark


class WheelSet(Strict):
    """Pinned wheels a system installs into its image (``roles.wheels``)."""

    pins: list[str] = Field(default_factory=list)  # name==version
    index_url: str = "https://pypi.org/simple"
    extra_index_urls: list[str] = Field(default_factory=list)
    # a directory of wheels on every node (clusters without index access)
    wheel_dir: str | None = None
    # packages whose installed version is read and recorded with the pins
    report: list[str] = Field(default_factory=list)

    def by_name(self) -> dict[str, str]:
        return dict(w.split("==", 1) for w in self.pins)


class ServingProfile(Strict):
    """The base of every system's profile class (see the module's table)."""

    kind: str
    # the seed guide and section the profile's values come from, for messages
    seed: ClassVar[str] = ""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        field = cls.model_fields.get("kind")
        kind = field.default if field is not None else None
        if isinstance(kind, str) and kind:
            if kind in PROFILE_KINDS and PROFILE_KINDS[kind].__qualname__ != cls.__qualname__:
                raise TypeError(f"two serving profiles claim kind {kind!r}: {PROFILE_KINDS[kind].__module__} and {cls.__module__}")
            PROFILE_KINDS[kind] = cls
            INVENTORY_FIELDS[cls.__name__] = "profile"

    # --- the inventory ---------------------------------------------------------
    def ranks_per_node(self) -> int:
        """The default ``start_rank`` of node i is i times this."""
        return 1

    def problems(self, cluster: "Cluster") -> list[tuple[str, str]]:
        """(field path, message) for whatever in ``cluster`` this system cannot run."""
        return []

    def ports(self) -> dict[str, int]:
        """{profile field: port} of every port the profile binds somewhere."""
        return {}

    def launched_worlds(self, cluster: "Cluster") -> str | None:
        """Why this system's worlds on ``cluster`` cannot each be one launch
        over their nodes (Slurm's one step on pyxis: the same command and the
        same number of tasks on every node), None when they can or it has
        none. A cluster that leaves its runtime to the platform then keeps
        Docker; one that asks for that runtime is refused with it."""
        return None

    # --- prepare ---------------------------------------------------------------
    def node_ports(self, cluster: "Cluster", node: "Node") -> dict[int, str]:
        """Ports serving binds on ``node`` -> the inventory field they come from
        (default: every port on node 0, none on the others)."""
        if node.name != cluster.node0.name:
            return {}
        return {port: f"profile.{key}" for key, port in self.ports().items()}

    def host_memory_gib(self, cluster: "Cluster", node: "Node") -> dict[str, float]:
        """Host memory (GiB) the system reserves on ``node``, by purpose."""
        return {}

    def node_env(self, cluster: "Cluster", node: "Node") -> dict[str, str]:
        """The variables whose value is the node's own (its IP, its NIC):
        each node's environment file holds its own, and nothing may carry one
        node's value to another (mpirun's ``-x`` exports none of them)."""
        return {}

    def environment(self, cluster: "Cluster", node: "Node") -> dict[str, str]:
        """Every variable of the node's environment file, in the seed's order
        (the secrets are added after, by ``roles.commenv``)."""
        return dict(self.node_env(cluster, node))

    def numa(self, cluster: "Cluster", node: "Node", facts: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """(binding prepare records for the start step, problems) from the facts."""
        return {"kind": "none", "reason": "the profile asks for no binding"}, []

    def wheel_set(self) -> WheelSet | None:
        """Pinned wheels to install into the serving image, or None."""
        return None

    def accessory_images(self) -> list[str]:
        """Images node 0 needs besides the serving image."""
        return []

    def operator_env(self) -> dict[str, str]:
        """The variables the operator sets in the profile (its ``env``), which win over the tool's."""
        env = getattr(self, "env", None)
        return dict(env) if isinstance(env, dict) else {}

    def launch_ssh(self) -> str | None:
        """The SSH client configuration an MPI launch agent uses on node 0 (None: the container's own)."""
        return None


# --- what crosses the interface ------------------------------------------------------------------




@dataclass(frozen=True)
class PlaybookEntry:
    """One entry of ``services:`` in ``playbooks/serve-<kind>.yaml``: a service
    (or, for a system that expands it, several) on the nodes ``hosts`` names,
    started after the services ``after`` names; ``started``: the probe that
    says it started (the system reads it), ``restart``: its restart policy
    (None: the system's own); ``stop_phase``: its place in the stop order
    (the reverse of the start order), given by ``systems.build``."""

    name: str
    hosts: str = "all"
    after: tuple[str, ...] = ()
    restart: str | None = None
    started: str | None = None
    stop_phase: int = 0

    @classmethod
    def from_doc(cls, doc: object, where: str, stop_phase: int = 0) -> "PlaybookEntry":
        """The entry ``doc`` read from ``where`` (a playbook's file and index);
        an error names the field and ``where``."""
        if not isinstance(doc, dict):
            raise LlmdeployError(f"{where}: expected a mapping (name, hosts, after, restart, started), found {type(doc).__name__}")
        unknown = sorted(set(doc) - {"name", "hosts", "after", "restart", "started"})
        if unknown:
            raise LlmdeployError(f"{where}: unknown field {', '.join(map(str, unknown))} (name, hosts, after, restart, started)")
        for key in ("name", "hosts", "restart", "started"):
            if key in doc and not isinstance(doc[key], str):
                raise LlmdeployError(f"{where}.{key}: expected a string, found {doc[key]!r}")
        if not doc.get("name"):
            raise LlmdeployError(f"{where}.name: every service needs a name")
        after = doc.get("after", [])
        if not isinstance(after, list) or not all(isinstance(a, str) for a in after):
            raise LlmdeployError(f"{where}.after: expected a list of service names, found {after!r}")
        return cls(name=doc["name"], hosts=doc.get("hosts", "all"), after=tuple(after), restart=doc.get("restart"),
                   started=doc.get("started"), stop_phase=stop_phase)


@dataclass(frozen=True)
class PreparedNode:
    """What prepare recorded on a node (its ``prepared.json``) that a plan
    builder uses: the image its serving containers run (the pulled image with
    the system's wheels), the NUMA binding prepare decided, and
    ``accessories``: {accessory image reference: the file prepare imported it
    as}, on a runtime with images of its own (pyxis; empty on Docker, whose
    units run the references)."""

    serving_ref: str | None = None
    binding: dict[str, Any] = field(default_factory=dict)
    accessories: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_record(cls, record: dict[str, Any] | None) -> "PreparedNode | None":
        """The node's record as read (None: the node was not read, as in ``deploy --check``)."""
        if record is None:
            return None
        image = record.get("image")
        if not isinstance(image, dict):
            image = {}
        binding = record.get("binding")
        if not isinstance(binding, dict):
            binding = {}
        ref = image.get("serving_ref")
        found = image.get("accessories")
        if not isinstance(found, dict):
            found = {}
        # a file is a path (a unit's image as pyxis takes it), never a reference
        acc = {k: v for k, v in found.items() if isinstance(k, str) and isinstance(v, str) and v.startswith("/") and "\n" not in v}
        return cls(serving_ref=ref if isinstance(ref, str) and ref else None, binding=dict(binding), accessories=acc)


@dataclass(frozen=True)
class Prepared:
    """Every node's :class:`PreparedNode` (none for a node that was not read)."""

    nodes: dict[str, PreparedNode] = field(default_factory=dict)

    @classmethod
    def from_records(cls, records: "dict[str, dict[str, Any] | None] | Prepared") -> "Prepared":
        if isinstance(records, Prepared):
            return records
        out = {}
        for host, rec in records.items():
            node = PreparedNode.from_record(rec)
            if node is not None:
                out[host] = node
        return cls(out)

    def of(self, host: str) -> PreparedNode | None:
        return self.nodes.get(host)


# check(body, arg) -> the problem, or None when the body is right
ProbeCheck = Callable[[bytes, str], "str | None"]


# --- the interface ---------------------------------------------------------------------------------


class ServingSystem(Protocol):
    """What ``systems`` calls in a system's package (``systems/<name>/__init__.py``).

    Every hook gets the cluster and its profile, resolved once by the
    registry (:meth:`System.profile`: the cluster's profile is this system's
    ``PROFILE``, else an error naming both kinds), so no hook asks for it
    again: the builders a hook calls take that profile as a parameter.

    ``services`` builds the services of one entry of the system's playbook
    (:class:`PlaybookEntry`) on ``nodes``, with what prepare recorded
    (:class:`Prepared`), for the cluster bound to its plug-ins (a
    :class:`~llmdeploy.deployment.Deployment`: its vendor's devices, whether
    its unit runtime starts a world in one launch); ``probe`` the readiness probes one name of the
    playbook's ``ready`` stands for (a list: one or several); ``files`` every
    file of the release per host (:data:`ReleaseFiles`); ``check_doc`` what
    ``deploy --check --json`` shows per node; ``metrics`` where its server
    says how loaded it is (the metrics page and the names of its running,
    waiting, KV cache and generated-token samples: drain and the live view
    read them); ``drain`` which services stop taking new work on SIGTERM
    before a stop and, in words, what cannot be drained.

    What it declares goes into every plan it builds (``systems.declared``):
    ``STOP_CLEANUP`` (``rm -f`` of absolute paths, run on every node after a
    stop; the flows refuse any other shape read back), ``SIGNATURES``,
    ``DRIFT_ENV_PREFIXES``, ``LABELS`` (the column each ``Unit.show`` key
    gets in tables). A plan.json written by an earlier version that lacks
    some of them gets them from these declarations (``systems.read_plan``).
    What a system may leave out is :class:`OptionalHooks`."""

    KIND: str
    PROFILE: type[ServingProfile]
    SIGNATURES: list[tuple[str, str]]
    STOP_CLEANUP: str
    DRIFT_ENV_PREFIXES: list[str]
    LABELS: dict[str, str]

    def services(self, dep: "Deployment", profile: Any, entry: PlaybookEntry, nodes: "list[Node]", prepared: Prepared,
                 rid: str) -> "list[Service]": ...

    def entry_port(self, cluster: "Cluster", profile: Any) -> int: ...

    def probe(self, cluster: "Cluster", profile: Any, name: str) -> "list[Probe]": ...

    def files(self, cluster: "Cluster", profile: Any, plan: "ReleasePlan", prepared: Prepared, image_id: str | None) -> ReleaseFiles: ...

    def check_doc(self, cluster: "Cluster", profile: Any, plan: "ReleasePlan", secrets: list[str]) -> dict[str, Any]: ...

    def metrics(self, cluster: "Cluster", profile: Any) -> "Metrics": ...

    def drain(self, cluster: "Cluster", profile: Any) -> "Drain": ...


class OptionalHooks(Protocol):
    """What a system may declare besides :class:`ServingSystem` (checked the
    same way when present; :class:`System` gives the default when absent):
    ``PROBE_CHECKS`` ({name: check(body, arg) -> problem or None}, readiness
    body checks its probes name, resolved by ``flows.probes`` after the
    generic ones), ``ROLE_LABELS`` (how messages name a unit of a role, e.g.
    {"node0": "node 0"}) and ``old_release_plan(cluster, rid, metas)``, the
    plan of a release this system wrote before plan.json existed, from every
    node's release.json (None for a release it did not write)."""

    PROBE_CHECKS: dict[str, ProbeCheck]
    ROLE_LABELS: dict[str, str]

    def old_release_plan(self, cluster: "Cluster", rid: str, metas: dict[str, dict[str, Any]]) -> "ReleasePlan | None": ...


REQUIRED_VALUES, REQUIRED_HOOKS = members(ServingSystem)
OPTIONAL_VALUES, OPTIONAL_HOOKS = members(OptionalHooks)
# every name a system must have, from the Protocol itself
REQUIRED = REQUIRED_VALUES + REQUIRED_HOOKS


def _value_problem(pkg: str, name: str, value: object, hint: Any) -> str | None:
    want = get_origin(hint) or hint
    if not isinstance(value, want):
        return f"{pkg}.{name} is a {type(value).__name__}, expected {getattr(hint, '__name__', None) or hint}"
    if want is type and not (isinstance(value, type) and issubclass(value, ServingProfile)):
        return f"{pkg}.{name} is {value!r}, expected a subclass of llmdeploy.serving.ServingProfile"
    return None


def interface_problems(pkg: ModuleType) -> list[str]:
    """Everything in which ``pkg`` is not a :class:`ServingSystem` (empty: it is one)."""
    name = pkg.__name__
    missing = [n for n in REQUIRED if not hasattr(pkg, n)]
    out = [f"{name} is no serving system: it lacks {', '.join(missing)} (llmdeploy.serving.ServingSystem)"] if missing else []
    for proto, values, hooks, required in ((ServingSystem, REQUIRED_VALUES, REQUIRED_HOOKS, True),
                                           (OptionalHooks, OPTIONAL_VALUES, OPTIONAL_HOOKS, False)):
        hints = get_type_hints(proto)
        for v in values:
            if hasattr(pkg, v):
                out += [p for p in [_value_problem(name, v, getattr(pkg, v), hints[v])] if p]
        for h in hooks:
            if hasattr(pkg, h):
                out += [p for p in [signature_problem(name, proto, h, getattr(pkg, h))] if p]
    return out


@dataclass(frozen=True)
class System:
    """A registered serving system: its package, checked against
    :class:`ServingSystem`, with the optional hooks resolved (their defaults
    where the package has none)."""

    module: Any  # the package: a ServingSystem
    probe_checks: dict[str, ProbeCheck]
    role_labels: dict[str, str]
    old_release_plan: Callable[..., "ReleasePlan | None"] | None

    @property
    def kind(self) -> str:
        kind: str = self.module.KIND
        return kind

    @property
    def name(self) -> str:
        name: str = self.module.__name__
        return name

    def profile(self, cluster: "Cluster") -> ServingProfile:
        """``cluster.profile`` when it is this system's, else an error naming both kinds."""
        profile_class: type[ServingProfile] = self.module.PROFILE
        if not isinstance(cluster.profile, profile_class):
            raise LlmdeployError(f"{cluster.name}: the profile is {cluster.profile.kind}, not {self.kind}")
        return cluster.profile


def register(pkg: ModuleType, kind: str) -> System:
    """``pkg`` as the serving system of ``kind``; TypeError naming the package,
    each hook or value that is missing or wrong, and what was expected."""
    problems = interface_problems(pkg)
    if not problems:
        claimed = pkg.PROFILE.model_fields["kind"].default
        if claimed != pkg.KIND:
            problems.append(f"{pkg.__name__}: KIND {pkg.KIND!r} is not its profile's kind {claimed!r}")
        elif pkg.KIND != kind:
            problems.append(f"{pkg.__name__}: KIND {pkg.KIND!r} is not the kind it is registered as, {kind!r} (systems.SYSTEMS)")
    if problems:
        raise TypeError("; ".join(problems))
    return System(module=pkg, probe_checks=dict(getattr(pkg, "PROBE_CHECKS", {})), role_labels=dict(getattr(pkg, "ROLE_LABELS", {})),
                  old_release_plan=getattr(pkg, "old_release_plan", None))
