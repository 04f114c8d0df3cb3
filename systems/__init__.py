"""Serving systems as plug-ins: each is a package ``systems/<name>/`` behind
the interface ``llmdeploy.serving`` declares (its profile schema and catalogue,
environment, ports, NUMA needs, wheels, plan builder, failure signatures,
readiness probes, and how to read its releases written by earlier versions).
Registering one is one line in ``SYSTEMS`` below.

The start order of each is a playbook, ``playbooks/serve-<kind>.yaml``; its
package builds the units and probes the playbook names. The flows call only
the generic functions here (:func:`build`, :func:`check_doc`,
:func:`read_plan`: a release's plan from its own files, old releases
included, :func:`probe_checks`, ...); nothing outside ``systems/`` knows a
system by name.
"""

from __future__ import annotations

import importlib

from llmdeploy import playbook as playbooks
from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import Cluster
from llmdeploy.releaseplan import ReleasePlan, Service, order_services
from llmdeploy.serving import ServingSystem
from systems.common import nic_reason, NIC_PATTERN


def _registry(*names: str) -> dict:
    out = {}
    for name in names:
        pkg = importlib.import_module(f"{__name__}.{name}")
        missing = [name for name in ServingSystem.__annotations__ if not hasattr(pkg, name)]
        missing += [name for name in ("services", "entry_port", "probe", "files", "check_doc", "metrics", "drain") if not hasattr(pkg, name)]
        if missing:
            raise TypeError(f"{pkg.__name__} is no serving system: it lacks {', '.join(missing)} (llmdeploy.serving.ServingSystem)")
        claimed = pkg.PROFILE.model_fields["kind"].default
        if claimed != pkg.KIND:
            raise TypeError(f"{pkg.__name__}: KIND {pkg.KIND!r} is not its profile's kind {claimed!r}")
        if pkg.KIND in out:
            raise TypeError(f"{pkg.__name__}: kind {pkg.KIND!r} is registered already by {out[pkg.KIND].__name__}")
        out[pkg.KIND] = pkg
    return out


# kind -> the system's package: one line per system
SYSTEMS = _registry(
    "vllm_ascend",
    "trtllm",
    "dynamo",
    "sglang",
)


def module_for(kind: str):
    """The package of the system ``kind``."""
    mod = SYSTEMS.get(kind)
    if mod is None:
        raise LlmdeployError(f"deploy cannot start {kind} profiles yet (it starts: {', '.join(SYSTEMS)})")
    return mod


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


def build(cluster: Cluster, prepared: dict[str, dict], rid: str, image_id: str | None) -> ReleasePlan:
    """The release plan of ``cluster``: the playbook's services, built by the system's module."""
    kind = cluster.profile.kind
    mod = module_for(kind)
    pb = playbook(kind)
    present = [(dict(e), hosts_of(cluster, e.get("hosts", "all"))) for e in pb["services"]]
    absent = {e["name"] for e, nodes in present if not nodes}
    present = [(e, nodes) for e, nodes in present if nodes]
    services: list[Service] = []
    # a playbook entry may stand for several services (a Dynamo role: one MPI
    # group per replica) or none (a control plane the inventory says exists)
    expanded: dict[str, list[str]] = {name: [] for name in absent}
    for i, (entry, nodes) in enumerate(present):
        name = entry["name"]
        entry["stop_phase"] = len(present) - 1 - i  # the reverse of the start order
        after: list[str] = []
        for a in entry.get("after", []):
            after += expanded.get(a, [a])
        made = mod.services(cluster, entry, nodes, prepared, rid)
        for svc in made:
            svc.after = after + [a for a in svc.after if a not in after]
            svc.restart = entry.get("restart", svc.restart)
        expanded[name] = [s.name for s in made]
        services += made
    try:
        order_services(services)
    except ValueError as exc:
        raise LlmdeployError(f"playbooks/serve-{kind}.yaml: {exc}") from None
    plan = ReleasePlan(system=kind, cluster=cluster.name, release=rid, services=services, entry_host=cluster.node0.name,
                       entry_port=mod.entry_port(cluster))
    plan.ready = []
    for name in pb.get("ready", []):
        p = mod.probe(cluster, name)
        plan.ready += p if isinstance(p, list) else [p]
    for key, value in declared(kind, cluster).items():
        setattr(plan, key, value)
    plan.metrics = mod.metrics(cluster)
    plan.drain = mod.drain(cluster)
    plan.files = mod.files(cluster, plan, prepared, image_id)
    return plan


def declared(kind: str, cluster: Cluster) -> dict:
    """What a system gives every plan for the commands after a deploy (the
    fields ``releaseplan.DECLARED``): its clean-up after stop, the environment
    prefixes ``status --diff`` compares, its failure signatures, and the
    labels tables give its ``show`` keys and roles."""
    mod = module_for(kind)
    return {
        "stop_cleanup": mod.STOP_CLEANUP,
        "drift_env_prefixes": list(mod.DRIFT_ENV_PREFIXES),
        "signatures": signatures(kind, cluster),
        "show_labels": dict(mod.LABELS),
        "role_labels": dict(getattr(mod, "ROLE_LABELS", {})),
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
        reader = getattr(module_for(kind), "old_release_plan", None)
        plan = reader(cluster, rid, metas) if reader else None
        if plan is not None:
            for key, value in declared(plan.system, cluster).items():
                setattr(plan, key, value)
            return plan
    raise LlmdeployError(f"release {rid} has no plan.json on {cluster.node0.name}, and no serving system of this tool "
                         f"({', '.join(SYSTEMS)}) reads it from its release.json files")


def probe_checks() -> dict:
    """The readiness body checks the systems add to the generic ones
    (``flows.probes``): each module's ``PROBE_CHECKS``, name -> check(body, arg)."""
    out: dict = {}
    for kind in SYSTEMS:
        out.update(getattr(module_for(kind), "PROBE_CHECKS", {}))
    return out


def signatures(kind: str, cluster: Cluster | None = None) -> list[tuple[str, str]]:
    """The system's failure signatures (the common ones are added by llmdeploy.logs);
    with ``cluster``, the NIC signature names every node's NIC."""
    mod = SYSTEMS.get(kind)
    if mod is None:
        return []
    sigs = list(mod.SIGNATURES)
    if cluster is not None:
        sigs = [(p, nic_reason(cluster)) if p == NIC_PATTERN else (p, r) for p, r in sigs]
    return sigs


def check_doc(cluster: Cluster, plan: ReleasePlan, secrets: list[str]) -> dict:
    """What ``deploy --check --json`` shows: per node its main unit's commands, then every service."""
    mod = module_for(plan.system)
    return mod.check_doc(cluster, plan, secrets)
