"""A release plan: the services a release runs, in start order.

A *service* is one or more *units*; a unit is one container on one host.
How a service is launched is in its units' commands (a container per node; an
MPI world whose launcher container runs ``mpirun`` and whose other containers
hold the ranks; a plain process in a container); what the engine needs to
know is data:

- ``after``: services whose ``started`` probe must pass before it starts;
- ``started``: the probe that tells dependents they may start (e.g. vLLM's
  DP RPC port on node 0);
- ``restart``: ``each`` (an exited unit is started again on its own, with
  backoff), ``group`` (any exited unit ends the service: every unit of it is
  stopped and the whole service started again, as an MPI world must be) or
  ``none`` (an exit fails the release: node 0 of a DP group);
- units start in ``order`` within a service (an MPI world's holders before
  its launcher); services stop in reverse start order.

The plan also carries what the commands after a deploy need from the
serving system, so that status, stop, restart and rollback of a release
work from its own ``plan.json`` and never from today's code: the shell
clean-up after its containers stopped, its failure signatures, the labels
its tables give ``show`` keys and roles, and the environment prefixes
``status --diff`` compares. A plan.json written before a field existed lacks
it; ``absent`` names those fields (``systems.read_plan`` fills them).

Everything here is plain data and pure functions: no connection is opened.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, is_dataclass, replace
from typing import Any, Literal, NamedTuple

from .container import ContainerSpec, read_docker_run

RestartPolicy = Literal["each", "group", "none"]

# what the system contributes to a plan for later commands (systems.declared);
# a plan.json written by an earlier version may lack any of them
DECLARED = ("stop_cleanup", "drift_env_prefixes", "signatures", "show_labels", "role_labels")


class ReleaseFile(NamedTuple):
    """One file of a release on one node: its text and its mode (e.g. 0o755).
    A tuple, so ``text, mode = f`` reads it as the release records always did."""

    text: str
    mode: int


# host -> file name (in the release directory) -> the file
ReleaseFiles = dict[str, dict[str, ReleaseFile]]


@dataclass
class Probe:
    """How readiness is read. ``kind``: ``port`` (``ip:port`` accepts a TCP
    connection, tested on ``host``) or ``http`` (a request to
    ``127.0.0.1:port`` on ``host`` through its SSH connection, whose status
    must be ``status`` and whose body must satisfy the named ``check``)."""

    name: str
    kind: Literal["port", "http"]
    host: str
    port: int
    ip: str = "127.0.0.1"
    method: str = "GET"
    path: str = "/"
    body: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    status: int = 200
    # a predicate from flows.probes.CHECKS, with its argument
    check: str = ""
    arg: str = ""
    # HTTP statuses that mean "not yet" for this probe, beyond the ones that do for every probe
    # (flows.engine.NOT_YET_STATUS): what a server answers for a while after it became ready
    not_yet: list[int] = field(default_factory=list)
    # a body that fails the check means "not yet" too: the server answers before it has everything
    # (Dynamo's frontend lists its workers a moment before their model is in /v1/models)
    wait_body: bool = False

    def describe(self) -> str:
        if self.kind == "port":
            return f"{self.name} ({self.ip}:{self.port} on {self.host})"
        if self.ip not in ("127.0.0.1", "localhost"):
            return f"{self.method} {self.path} on {self.ip}:{self.port} (from {self.host})"
        return f"{self.method} {self.path} on {self.host}:{self.port}"


@dataclass
class Metrics:
    """Where a release's server says how loaded it is: ``probe`` (a GET of
    its metrics page, through ``host``'s SSH connection; Prometheus text, or
    JSON iteration statistics) and the names of the samples that count its
    requests ``running`` and ``waiting``, its KV cache use (a fraction) and
    the tokens it generated (a counter)."""

    probe: Probe
    running: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    kv_cache: list[str] = field(default_factory=list)
    generated_tokens: list[str] = field(default_factory=list)

    @property
    def inflight(self) -> list[str]:
        return self.running + self.waiting


@dataclass
class Drain:
    """How a release is drained before it stops (its requests in flight are
    counted by its ``Metrics``): ``refuse_first``, the services that stop
    taking new work on SIGTERM and finish what they hold (Dynamo's
    frontend), signalled before the wait; ``note``, what cannot be drained,
    in words (a server that takes requests until it is stopped)."""

    refuse_first: list[str] = field(default_factory=list)
    note: str = ""


@dataclass
class Unit:
    """One container of a service on one host."""

    host: str
    container: str
    # release files of this unit are named <prefix>run.sh, ...; "" for a host's main unit
    prefix: str = ""
    order: int = 0
    role: str = ""
    # what `deploy --check` shows for this unit (command lines, ranks, ...)
    show: dict[str, Any] = field(default_factory=dict)
    # the tasks (ranks) of its command on its host when its service is a world (``Service.world``)
    tasks: int = 1
    # the accelerators it uses on its host (a scheduler's launcher asks for as many: Slurm's GRES);
    # None: every one the node has; 0: none (a control plane, a frontend)
    devices: int | None = None
    # its container, as data each runtime renders (``llmdeploy.container``); None: a unit of an old
    # plan whose line could not be read back (``unit_of``)
    spec: ContainerSpec | None = None

    @property
    def run_file(self) -> str:
        return f"{self.prefix}run.sh"


@dataclass
class Service:
    name: str
    units: list[Unit]
    after: list[str] = field(default_factory=list)
    started: Probe | None = None
    restart: RestartPolicy = "each"
    # its units are one world that the runtime starts as one (``UnitRuntime.worlds``): every unit the
    # same container and command, ``Unit.tasks`` tasks on each host, each task's place from the launcher
    world: bool = False
    # a world's ranks meet through MPI, their ranks from the launcher's PMIx (``srun --mpi=pmix``); False:
    # through the system's own rendezvous (SGLang's torch.distributed store; ``--mpi=none``)
    mpi: bool = True

    def hosts(self) -> list[str]:
        out: list[str] = []
        for u in self.units:
            if u.host not in out:
                out.append(u.host)
        return out


@dataclass
class ReleasePlan:
    system: str
    cluster: str
    release: str
    services: list[Service]
    # where clients reach the release (the HTTP endpoint)
    entry_host: str
    entry_port: int
    # readiness, in order: the first is polled until it passes, the others
    # then pass in turn, polled while their server is not serving yet
    # (flows.engine.not_yet) and failed at once by a wrong answer
    ready: list[Probe] = field(default_factory=list)
    # shell run on every node after its containers stopped (stale files)
    stop_cleanup: str = ""
    # container environment prefixes that status --diff compares
    drift_env_prefixes: list[str] = field(default_factory=list)
    # the system's failure signatures (regular expression, reason), tried on an exited unit's log
    signatures: list[tuple[str, str]] = field(default_factory=list)
    # the column label of each ``Unit.show`` key that tables show, in order ({"start_rank": "start rank"})
    show_labels: dict[str, str] = field(default_factory=dict)
    # how messages name a unit of a role ({"node0": "node 0"}); else the role, else its service
    role_labels: dict[str, str] = field(default_factory=dict)
    # where its server says how loaded it is, and how it is drained before it
    # stops (None: a plan written before these were planned)
    metrics: Metrics | None = None
    drain: Drain | None = None
    # release files per host: name -> ReleaseFile(text, mode); not part of plan.json
    files: ReleaseFiles = field(default_factory=dict, repr=False)
    # DECLARED fields the plan.json read lacked (written by an earlier version); not part of plan.json
    absent: tuple[str, ...] = field(default=(), repr=False, compare=False)

    # -- views -------------------------------------------------------------------------
    def service(self, name: str) -> Service:
        for s in self.services:
            if s.name == name:
                return s
        raise KeyError(name)

    def units(self, host: str | None = None) -> list[Unit]:
        return [u for s in self.services for u in s.units if host is None or u.host == host]

    def service_of(self, unit: Unit) -> Service:
        return next(s for s in self.services if unit in s.units)

    def hosts(self) -> list[str]:
        out: list[str] = []
        for u in self.units():
            if u.host not in out:
                out.append(u.host)
        return out

    def stop_phase(self, service: Service) -> int:
        """0 is stopped first: the reverse of the start order."""
        return len(self.services) - 1 - self.services.index(service)

    def name_of(self, unit: Unit) -> str:
        """How messages name a unit: its role's label, its role, or its service."""
        return self.role_labels.get(unit.role, unit.role) or self.service_of(unit).name

    def shown(self, unit: Unit) -> list[tuple[str, Any]]:
        """(label, value) of each ``show`` key the tables show that ``unit`` has."""
        return [(label, unit.show[key]) for key, label in self.show_labels.items() if unit.show.get(key) is not None]

    def shown_text(self, unit: Unit) -> str:
        """``shown`` as words: "start rank 3", "ranks 0-7 (8 here)", or ""."""
        return ", ".join(f"{label} {value}" for label, value in self.shown(unit))

    # -- (de)serialisation: plan.json in every release -----------------------------------
    def to_json(self) -> str:
        doc = asdict(self)
        doc.pop("files")
        doc.pop("absent")
        return json.dumps(doc, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "ReleasePlan":
        doc = json.loads(text)
        services = []
        for s in doc["services"]:
            services.append(
                Service(
                    name=s["name"],
                    units=[unit_of(u) for u in s["units"]],
                    after=list(s.get("after") or []),
                    started=Probe(**s["started"]) if s.get("started") else None,
                    restart=s.get("restart", "each"),
                    world=bool(s.get("world", False)),
                    mpi=bool(s.get("mpi", True)),
                )
            )
        return cls(
            system=doc["system"],
            cluster=doc["cluster"],
            release=doc["release"],
            services=services,
            entry_host=doc["entry_host"],
            entry_port=int(doc["entry_port"]),
            ready=[Probe(**p) for p in doc.get("ready") or []],
            stop_cleanup=doc.get("stop_cleanup", ""),
            drift_env_prefixes=list(doc.get("drift_env_prefixes") or []),
            signatures=[(str(p), str(r)) for p, r in doc.get("signatures") or []],
            show_labels=dict(doc.get("show_labels") or {}),
            role_labels=dict(doc.get("role_labels") or {}),
            metrics=_metrics(doc.get("metrics")),
            drain=Drain(**doc["drain"]) if doc.get("drain") else None,
            absent=tuple(k for k in DECLARED if k not in doc),
        )

    def with_release(self, placeholder: str, rid: str) -> "ReleasePlan":
        """This plan with every ``placeholder`` in it (the release id it was
        built with) replaced by ``rid``: in every string of every unit, probe,
        file and field. Pure: the plan is not changed."""
        swapped: ReleasePlan = _swap(self, placeholder, rid)  # _swap keeps the type of what it is given
        return swapped


def unit_of(doc: dict[str, Any]) -> Unit:
    """A unit as plan.json keeps it. A plan written before units carried a
    spec has its unit's ``docker run`` line (``show["container_command"]``):
    its spec is read back from it (``container.read_docker_run``), or stays
    None where the line is not one this tool wrote (a launcher that needs
    the spec then names the unit and its release)."""
    spec = doc.get("spec")
    if spec is not None:
        return Unit(**{**doc, "spec": ContainerSpec.from_dict(spec)})
    line = (doc.get("show") or {}).get("container_command")
    try:
        spec = read_docker_run(line) if isinstance(line, str) else None
    except ValueError:
        spec = None
    return Unit(**{**doc, "spec": spec})


def _metrics(doc: dict[str, Any] | None) -> Metrics | None:
    if not doc:
        return None
    lists = {k: [str(x) for x in doc.get(k) or []] for k in ("running", "waiting", "kv_cache", "generated_tokens")}
    return Metrics(probe=Probe(**doc["probe"]), **lists)


def _swap(value: Any, old: str, new: str) -> Any:
    """``value`` with ``old`` replaced by ``new`` in every string it holds,
    keys included; containers and dataclasses keep their types."""
    if isinstance(value, str):
        return value.replace(old, new)
    if isinstance(value, dict):
        return {_swap(k, old, new): _swap(v, old, new) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple (a ReleaseFile)
        return type(value)(*(_swap(v, old, new) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_swap(v, old, new) for v in value)
    if is_dataclass(value) and not isinstance(value, type):
        return replace(value, **{f.name: _swap(getattr(value, f.name), old, new) for f in fields(value) if f.init})
    return value


def order_services(services: list[Service]) -> list[Service]:
    """Check that every ``after`` names an earlier service (the playbook's
    order is the start order); raise ValueError otherwise."""
    seen: set[str] = set()
    for s in services:
        for dep in s.after:
            if dep not in seen:
                raise ValueError(f"service {s.name!r} starts after {dep!r}, which is not started before it")
        seen.add(s.name)
    return services
