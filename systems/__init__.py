"""Serving systems as plug-ins: each is a package ``systems/<name>/`` behind
the interface ``llmdeploy.serving`` declares (its profile schema and catalogue,
environment, ports, NUMA needs, wheels, plan builder, failure signatures,
readiness probes, and how to read its releases written by earlier versions).
Registering one is one line in ``SYSTEMS`` below; its package is imported
and checked against the interface only when its kind is first asked for.

The start order of each is a playbook, ``playbooks/serve-<kind>.yaml``; its
package builds the units and probes the playbook names. The flows call only
the generic functions here (:func:`build`, :func:`check_doc`,
:func:`read_plan`: a release's plan from its own files, old releases
included, :func:`probe_check`, ...); nothing outside ``systems/`` knows a
system by name.
"""

from __future__ import annotations

from llmdeploy import playbook as playbooks
from llmdeploy.errors import LlmdeployError
from llmdeploy.plugin import Registry
from llmdeploy.inventory import Cluster
from llmdeploy.releaseplan import ReleasePlan, Service, order_services
from llmdeploy.serving import PlaybookEntry, Prepared, System, register
from llmdeploy.deployment import Deployment
from systems.common import nic_reason, NIC_PATTERN


def _registry(**packages: str) -> Registry[System]:
    """kind=package under ``systems/``; a package named twice is refused. A
    system's package is imported, and checked against the interface
    (``llmdeploy.serving.register``), when its kind is first asked for."""
    seen: dict[str, str] = {}
    for kind, package in packages.items():
        if package in seen:
            raise TypeError(f"systems.{package}: registered already, as {seen[package]!r}")
        seen[package] = kind
    return Registry("serving system", __name__, lambda: packages, register)


# kind -> the system's package: one line per system
SYSTEMS = _registry(**{
    "vllm-ascend": "vllm_ascend",
    "trtllm-serve": "trtllm",
    "dynamo": "dynamo",
    "sglang": "sglang",
})


def system(kind: str) -> System:
    """The registered system ``kind`` (its package loaded and checked)."""
    if kind not in SYSTEMS:
        raise LlmdeployError(f"deploy cannot start {kind} profiles yet (it starts: {', '.join(SYSTEMS)})")
    return SYSTEMS[kind]


def module_for(kind: str):
    """The package of the system ``kind``."""
    return system(kind).module


def playbook(kind: str) -> dict:
    """The start order of ``kind``: ``playbooks/serve-<kind>.yaml``."""
    try:
        doc = playbooks.load(f"serve-{kind}")
    except LlmdeployError as exc:
        raise LlmdeployError(f"{exc}: no start order for {kind}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), list):
        raise LlmdeployError(f"{playbooks.PLAYBOOK_DIR}/serve-{kind}.yaml: expected 'services:' (a list)")
    return doc


def hosts_of(cluster: Cluster, selection: str) -> list:
    """The nodes a serve playbook's ``hosts:`` names (the one host selector)."""
    return playbooks.select_nodes(cluster, None, selection)


def build(dep: Deployment, prepared: dict[str, dict | None] | Prepared, rid: str, image_id: str | None) -> ReleasePlan:
    """The release plan of a deployment: the playbook's services, built by its system's module
    (``prepared``: each node's prepare record as read, or none)."""
    cluster, sys_ = dep.cluster, dep.system
    kind = sys_.kind
    mod, prof = sys_.module, sys_.profile(cluster)
    prepared = Prepared.from_records(prepared)
    pb = playbook(kind)
    units_runtime = dep.runtime
    where = f"{playbooks.PLAYBOOK_DIR}/serve-{kind}.yaml: services"
    entries = [PlaybookEntry.from_doc(e, f"{where}[{i}]") for i, e in enumerate(pb["services"])]
    present = [(e, hosts_of(cluster, e.hosts)) for e in entries]
    absent = {e.name for e, nodes in present if not nodes}
    present = [(e, nodes) for e, nodes in present if nodes]
    services: list[Service] = []
    # a playbook entry may stand for several services (a Dynamo role: one MPI
    # group per replica) or none (a control plane the inventory says exists)
    expanded: dict[str, list[str]] = {name: [] for name in absent}
    for i, (entry, nodes) in enumerate(present):
        entry = PlaybookEntry(**{**entry.__dict__, "stop_phase": len(present) - 1 - i})  # the reverse of the start order
        after: list[str] = []
        for a in entry.after:
            after += expanded.get(a, [a])
        made = mod.services(dep, prof, entry, nodes, prepared, rid)
        for svc in made:
            for u in svc.units:
                if u.spec is None or u.spec.name != u.container:
                    raise LlmdeployError(f"systems/{sys_.module.__name__.split('.')[-1]}: service {svc.name}'s unit {u.container} on {u.host} "
                                         f"has {'no container spec' if u.spec is None else f'a container spec named {u.spec.name}'}: "
                                         f"every unit carries the spec of its own container (Unit.spec)")
                # what the cluster's container runtime runs for it (deploy --check shows it; Docker's run.sh is it)
                u.show = {"container_command": units_runtime.run_command(u.spec, rid), **u.show}
            svc.after = after + [a for a in svc.after if a not in after]
            if entry.restart is not None:
                svc.restart = entry.restart
        expanded[entry.name] = [s.name for s in made]
        services += made
    try:
        order_services(services)
    except ValueError as exc:
        raise LlmdeployError(f"playbooks/serve-{kind}.yaml: {exc}") from None
    plan = ReleasePlan(system=kind, cluster=cluster.name, release=rid, services=services, entry_host=cluster.node0.name,
                       entry_port=mod.entry_port(cluster, prof))
    plan.ready = []
    for name in pb.get("ready", []):
        plan.ready += mod.probe(cluster, prof, name)
    for key, value in declared(kind, cluster).items():
        setattr(plan, key, value)
    plan.metrics = mod.metrics(cluster, prof)
    plan.drain = mod.drain(cluster, prof)
    plan.files = mod.files(cluster, prof, plan, prepared, image_id)
    return plan


def declared(kind: str, cluster: Cluster) -> dict:
    """What a system gives every plan for the commands after a deploy (the
    fields ``releaseplan.DECLARED``): its clean-up after stop, the environment
    prefixes ``status --diff`` compares, its failure signatures, and the
    labels tables give its ``show`` keys and roles."""
    sys_ = system(kind)
    mod = sys_.module
    return {
        "stop_cleanup": mod.STOP_CLEANUP,
        "drift_env_prefixes": list(mod.DRIFT_ENV_PREFIXES),
        "signatures": signatures(kind, cluster),
        "show_labels": dict(mod.LABELS),
        "role_labels": dict(sys_.role_labels),
    }


def read_plan(cluster: Cluster, rid: str, plan_text: str, metas: dict[str, dict]) -> ReleasePlan:
    """A release's plan from its own files on the nodes: its ``plan.json``
    (``plan_text``), whose fields an earlier version did not write are filled
    from what the release's system declares; or, for a release written before
    plans were recorded (no plan.json), the plan the system that wrote it reads
    from every node's ``release.json`` (``metas``: host -> its content; each
    registered system's ``old_release_plan`` is asked, the first that knows
    the release answers). A plan.json that is not JSON raises ValueError,
    KeyError or TypeError (the caller says where it read it)."""
    if plan_text.strip():
        plan = ReleasePlan.from_json(plan_text)
        if plan.absent:
            if plan.system not in SYSTEMS:
                raise LlmdeployError(f"release {rid}: its plan.json lacks {', '.join(plan.absent)}, which only its system "
                                     f"{plan.system!r} could give, and this tool has no such system (it has: {', '.join(SYSTEMS)})")
            have = declared(plan.system, cluster)
            for key in plan.absent:
                setattr(plan, key, have[key])
        return plan
    for kind in SYSTEMS:
        reader = SYSTEMS[kind].old_release_plan
        old = reader(cluster, rid, metas) if reader else None
        if old is not None:
            for key, value in declared(old.system, cluster).items():
                setattr(old, key, value)
            return old
    raise LlmdeployError(f"release {rid} has no plan.json on {cluster.node0.name}, and no serving system of this tool "
                         f"({', '.join(SYSTEMS)}) reads it from its release.json files")


def probe_check(name: str):
    """The readiness body check ``name`` a system adds to the generic ones
    (``flows.probes``: its ``PROBE_CHECKS``), check(body, arg); None if no
    system has one of that name."""
    for kind in SYSTEMS:
        if name in SYSTEMS[kind].probe_checks:
            return SYSTEMS[kind].probe_checks[name]
    return None


def signatures(kind: str, cluster: Cluster | None = None) -> list[tuple[str, str]]:
    """The system's failure signatures (the common ones are added by llmdeploy.logs);
    with ``cluster``, the NIC signature names every node's NIC."""
    if kind not in SYSTEMS:
        return []
    sigs = list(SYSTEMS[kind].module.SIGNATURES)
    if cluster is not None:
        sigs = [(p, nic_reason(cluster)) if p == NIC_PATTERN else (p, r) for p, r in sigs]
    return sigs


def check_doc(cluster: Cluster, plan: ReleasePlan, secrets: list[str]) -> dict:
    """What ``deploy --check --json`` shows: per node its main unit's commands, then every service."""
    sys_ = system(plan.system)
    return sys_.module.check_doc(cluster, sys_.profile(cluster), plan, secrets)
