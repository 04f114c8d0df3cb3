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

import yaml

from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import Cluster
from llmdeploy.releaseplan import ReleasePlan, Service, order_services
from roles import render  # noqa: F401 (the systems render their files with it)
from roles import mpi
from roles.mpi import nics  # noqa: F401 (the systems' OpenMPI *_if_include lists)

PLAYBOOKS = Path(__file__).resolve().parent.parent / "playbooks"

# profile kind -> module
MODULES = {"vllm-ascend": "vllm_ascend", "trtllm-serve": "trtllm", "dynamo": "dynamo"}


def serving_image(cluster: Cluster, node, prepared: dict[str, dict]) -> str:
    """The image a node's serving containers run: what prepare recorded (the
    image with its wheels, if any), else what the inventory implies."""
    from roles import wheels

    rec = prepared.get(node.name) or {}
    return (rec.get("image") or {}).get("serving_ref") or wheels.serving_ref(cluster)


# A rank whose NCCL_SOCKET_IFNAME or GLOO_SOCKET_IFNAME names no interface of its node: NCCL's
# (src/bootstrap.cc, src/transport/net_socket.cc) and Gloo's (gloo/transport/tcp/device.cc) own words.
NIC_PATTERN = r"Bootstrap : no socket interface found|NET/Socket : no interface found|Unable to find address for: \S+"
NIC_REASON = ("no network interface of a rank's node matches NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME (the NIC of that "
              "node's environment file; the node is named in this line; invoke prepare checks each node's NIC)")


def nic_signature() -> tuple[str, str]:
    """The failure signature of a NIC variable that names no interface of a rank's node."""
    return NIC_PATTERN, NIC_REASON


def nic_reason(cluster: Cluster) -> str:
    """NIC_REASON with the NIC the inventory gives each node (what each node's environment file names)."""
    return f"{NIC_REASON}; the inventory's NIC per node: " + ", ".join(f"{n.name} {n.nic}" for n in cluster.nodes)


def mpi_exports(envs: list[dict[str, str]], node_specific: list[str] | tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """Which variables of one MPI world mpirun exports with ``-x NAME``, and
    which each node keeps from its own environment: (exported, per node).

    ``envs`` is the environment file of every node of the world, the launch
    node's first. ``-x NAME`` gives every rank, on every node, the launch
    node's value. A rank needs its own node's value of a per-node variable
    (the NIC in NCCL_SOCKET_IFNAME, a GPU mask), and it has it already: the
    launch agent starts each node's ORTE daemon with ``docker exec`` in that
    node's serving container, whose ``--env-file`` is the node's own file, and
    the ranks inherit the daemon's environment (on the launch node, mpirun's).
    So a variable is per node, and never exported, when it is declared so
    (``node_specific``) or its value differs between the nodes or some node
    lacks it; the rest is the same everywhere and is exported. Pure."""
    if not envs:
        return [], []
    first, others = envs[0], envs[1:]
    declared = set(node_specific)
    per_node = [k for k in first if k in declared or any(e.get(k) != first[k] for e in others)]
    for e in others:
        per_node += [k for k in e if k not in first and k not in per_node]
    return [k for k in first if k not in per_node], per_node


def hostfile(cluster: Cluster, release: str, ranks: list[tuple[str, int]]) -> str:
    """An OpenMPI hostfile for the nodes ``ranks`` names, in rank order
    [(node name, slots)]. Across nodes each entry is the node's serving IP:
    mpirun takes the entry that is one of its own interfaces' addresses for
    the launch node (checked with OpenMPI 4.1) and hands the others to the
    launch agent, so no node name has to resolve on node 0 or in its
    container. One node alone keeps its name (its container's hostname)."""
    by_ip = len(ranks) > 1
    entries = [(str(cluster.node(name).ip) if by_ip else name, slots, name) for name, slots in ranks]
    return render("hostfile.j2", release=release, cluster=cluster.name, by_ip=by_ip, entries=entries)


def launch_agent(cluster: Cluster, release: str, container: str, names: list[str], ssh_config: str | None) -> str:
    """The launch agent (``mpi-agent.sh``) of an MPI world over ``names``:
    each node's serving IP (its hostfile entry) to its SSH host, the node's
    name (a Host the launch ssh_config knows), over ssh with the launch
    settings every MPI launch from node 0 uses (``roles.mpi``), then ``docker
    exec`` into ``container`` there. Every value is quoted."""
    return mpi.launch_agent(cluster, names, ssh_config, release, container)


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


def signatures(kind: str, cluster: Cluster | None = None) -> list[tuple[str, str]]:
    """The system's failure signatures (the common ones are added by llmdeploy.logs);
    with ``cluster``, the NIC signature names every node's NIC."""
    name = MODULES.get(kind)
    if not name:
        return []
    sigs = list(importlib.import_module(f"{__name__}.{name}").SIGNATURES)
    if cluster is not None:
        sigs = [(p, nic_reason(cluster)) if p == NIC_PATTERN else (p, r) for p, r in sigs]
    return sigs


def check_doc(cluster: Cluster, plan: ReleasePlan, secrets: list[str]) -> dict:
    """What ``deploy --check --json`` shows: per node its main unit's commands, then every service."""
    mod = module_for(plan.system)
    return mod.check_doc(cluster, plan, secrets)
