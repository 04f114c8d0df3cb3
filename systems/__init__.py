"""Serving systems: each module turns the inventory (and prepare's records)
into a release plan (``llmdeploy.releaseplan.ReleasePlan``). The start order
of each is a playbook in ``playbooks/serve-<system>.yaml``, read here; the
module builds the units and probes the playbook names.

Nothing outside this package knows a system by name: flows call
:func:`build` and :func:`signatures`.
"""

from __future__ import annotations

import importlib
import shlex
from pathlib import Path

import jinja2
import yaml

from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import Cluster
from llmdeploy.releaseplan import ReleasePlan, Service, order_services
from roles.mpi import nics  # noqa: F401 (the systems' OpenMPI *_if_include lists)

PLAYBOOKS = Path(__file__).resolve().parent.parent / "playbooks"
TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
_jinja = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
_jinja.filters["q"] = shlex.quote

# profile kind -> module
MODULES = {"vllm-ascend": "vllm_ascend", "trtllm-serve": "trtllm", "dynamo": "dynamo"}


def render(template: str, **values) -> str:
    return _jinja.get_template(template).render(**values)


def serving_image(cluster: Cluster, node, prepared: dict[str, dict]) -> str:
    """The image a node's serving containers run: what prepare recorded (the
    image with its wheels, if any), else what the inventory implies."""
    from roles import wheels

    rec = prepared.get(node.name) or {}
    return (rec.get("image") or {}).get("serving_ref") or wheels.serving_ref(cluster)


def module_for(kind: str):
    name = MODULES.get(kind)
    if name is None:
        raise LlmdeployError(f"deploy cannot start {kind} profiles yet (it starts: {', '.join(MODULES)})")
    return importlib.import_module(f"{__name__}.{name}")


def playbook(kind: str) -> dict:
    path = PLAYBOOKS / f"serve-{kind}.yaml"
    try:
        doc = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise LlmdeployError(f"{path}: no start order for {kind}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), list):
        raise LlmdeployError(f"{path}: expected 'services:' (a list)")
    return doc


def hosts_of(cluster: Cluster, selection: str) -> list:
    if selection == "all":
        return list(cluster.nodes)
    if selection == "node0":
        return [cluster.node0]
    if selection == "workers":
        return list(cluster.nodes[1:])
    raise LlmdeployError(f"unknown host selection {selection!r} in a serve playbook (all, node0, workers)")


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
        if hasattr(mod, "services"):
            made = mod.services(cluster, entry, nodes, prepared, rid)
            for svc in made:
                svc.after = after + [a for a in svc.after if a not in after]
                svc.restart = entry.get("restart", svc.restart)
        else:
            units, started = mod.units(cluster, name, nodes, prepared, rid, entry)
            made = [Service(name=name, units=units, after=after, started=started, restart=entry.get("restart", "each"))]
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
    plan.stop_cleanup = getattr(mod, "STOP_CLEANUP", "")
    plan.drift_env_prefixes = list(getattr(mod, "DRIFT_ENV_PREFIXES", []))
    plan.files = mod.files(cluster, plan, prepared, image_id)
    return plan


def signatures(kind: str) -> list[tuple[str, str]]:
    """The system's failure signatures (the common ones are added by llmdeploy.logs)."""
    name = MODULES.get(kind)
    return list(importlib.import_module(f"{__name__}.{name}").SIGNATURES) if name else []


def check_doc(cluster: Cluster, plan: ReleasePlan, secrets: list[str]) -> dict:
    """What ``deploy --check --json`` shows: per node its main unit's commands, then every service."""
    mod = module_for(plan.system)
    return mod.check_doc(cluster, plan, secrets)
