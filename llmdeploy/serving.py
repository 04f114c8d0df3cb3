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
   ============================  ===============================================

   Each has a default that is right for a system that needs none of it.

2. **Its plan builder** (:class:`ServingSystem`), registered with one line in
   ``systems/__init__.py``: it turns the inventory into a release plan
   (``llmdeploy.releaseplan``), which then carries everything later commands
   need (stop clean-up, failure signatures, table labels, the environment
   prefixes ``status --diff`` compares), so stop, status, restart and rollback
   of a release read its stored plan, not today's code.

Core: imports nothing above ``llmdeploy``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from pydantic import Field

from .schema import Strict

if TYPE_CHECKING:  # pragma: no cover - types only
    from .inventory import Cluster, Node
    from .releaseplan import Drain, Metrics, Probe, ReleasePlan, Service

# kind -> profile class, filled as the systems' profile classes are defined
PROFILE_KINDS: dict[str, type["ServingProfile"]] = {}
# pydantic model title -> the inventory field it stands for, for messages about
# a model built on its own in an inventory module (a profile, a profile's part)
INVENTORY_FIELDS: dict[str, str] = {}


def inventory_field(field: str):
    """Class decorator: errors of this model, built on its own in an inventory
    module, name ``field`` (e.g. ``profile.workers[]``)."""

    def mark(cls):
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

    def numa(self, cluster: "Cluster", node: "Node", facts: dict) -> tuple[dict, list[str]]:
        """(binding prepare records for the start step, problems) from the facts."""
        return {"kind": "none", "reason": "the profile asks for no binding"}, []

    def wheel_set(self) -> WheelSet | None:
        """Pinned wheels to install into the serving image, or None."""
        return None

    def accessory_images(self) -> list[str]:
        """Images node 0 needs besides the serving image."""
        return []


@runtime_checkable
class ServingSystem(Protocol):
    """What ``systems`` calls in a system's package (``systems/<name>/__init__.py``).

    ``services`` builds the services of one entry of the system's playbook
    (``playbooks/serve-<kind>.yaml``: name, hosts, after, restart, ...) on
    ``nodes``; ``probe`` the readiness probes the playbook's ``ready`` names;
    ``files`` every file of the release per host ({host: {name: (text, mode)}});
    ``check_doc`` what ``deploy --check --json`` shows per node; ``metrics``
    where its server says how loaded it is (the metrics page and the names
    of its running, waiting, KV cache and generated-token samples: drain and
    the live view read them); ``drain`` which services stop taking new work
    on SIGTERM before a stop and, in words, what cannot be drained.

    What it declares goes into every plan it builds (``systems.declared``):
    ``STOP_CLEANUP`` (``rm -f`` of absolute paths, run on every node after a
    stop; the flows refuse any other shape read back), ``SIGNATURES``,
    ``DRIFT_ENV_PREFIXES``, ``LABELS`` (the column each ``Unit.show`` key
    gets in tables) and, optionally, ``ROLE_LABELS`` (how messages name a
    unit of a role, e.g. {"node0": "node 0"}). A plan.json written by an
    earlier version that lacks some of them gets them from these
    declarations (``systems.read_plan``).

    Optional: ``PROBE_CHECKS`` ({name: check(body, arg) -> problem or None},
    readiness body checks its probes name, resolved by ``flows.probes``
    after the generic ones) and ``old_release_plan(cluster, rid, metas)``,
    the plan of a release this system wrote before plan.json existed, from
    every node's release.json (None for a release it did not write)."""

    KIND: str
    PROFILE: type[ServingProfile]
    SIGNATURES: list[tuple[str, str]]
    STOP_CLEANUP: str
    DRIFT_ENV_PREFIXES: list[str]
    LABELS: dict[str, str]

    def services(self, cluster: "Cluster", entry: dict, nodes: list, prepared: dict, rid: str) -> list["Service"]: ...

    def entry_port(self, cluster: "Cluster") -> int: ...

    def probe(self, cluster: "Cluster", name: str) -> "Probe | list[Probe]": ...

    def files(self, cluster: "Cluster", plan: "ReleasePlan", prepared: dict, image_id: str | None) -> dict: ...

    def check_doc(self, cluster: "Cluster", plan: "ReleasePlan", secrets: list[str]) -> dict: ...

    def metrics(self, cluster: "Cluster") -> "Metrics": ...

    def drain(self, cluster: "Cluster") -> "Drain": ...
