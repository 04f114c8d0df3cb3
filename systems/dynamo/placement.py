"""Where a Dynamo topology's workers run: GPUs per worker on the inventory's
nodes, ranks, DYN_SYSTEM_PORTs, and every reason a topology does not fit."""

from __future__ import annotations

from llmdeploy.inventory import Node
from llmdeploy.platform import PLATFORMS

from .profile import DynamoPlacedWorker, DynamoProfile, DynamoWorker


def _derive_gpus(sizes: list[int], nodes: list[Node], spare_devices: int) -> list[list[tuple[str, list[int]]]]:
    """GPUs per worker, in order: a worker that fits in what is left of the
    current node goes there (the colocated 1P1D: P1 on GPU 0, D2 on 1,2),
    any other starts on a fresh node and takes whole nodes in order (TP8: two
    four-GPU nodes, TP16: four). Past the inventory's nodes it continues on
    virtual nodes named "+1", "+2", ... of ``spare_devices`` GPUs."""
    out: list[list[tuple[str, list[int]]]] = []
    cur, used = 0, 0

    def node_at(i: int) -> tuple[str, int]:
        if i < len(nodes):
            return nodes[i].name, nodes[i].devices or spare_devices
        return f"+{i - len(nodes) + 1}", spare_devices

    for size in sizes:
        name, devices = node_at(cur)
        if used and size <= devices - used:
            out.append([(name, list(range(used, used + size)))])
            used += size
            continue
        if used:
            cur, used = cur + 1, 0
        parts, left = [], size
        while left > 0:
            name, devices = node_at(cur)
            take = min(left, devices)
            parts.append((name, list(range(take))))
            left -= take
            if take == devices:
                cur, used = cur + 1, 0
            else:
                used = take
        out.append(parts)
    return out


# ai-dynamo 1.6 reads DYN_SYSTEM_PORT as an i16: 40000 ends a worker at start with
# "invalid value unsigned int `40000`, expected i16 for key "SYSTEM_PORT"" (seen here)
MAX_SYSTEM_PORT = 32767


def dynamo_placement(profile: DynamoProfile, nodes: list[Node]) -> tuple[list[DynamoPlacedWorker], list[tuple[str, str]]]:
    """(workers, problems): the topology's workers placed on ``nodes`` (node 0
    first; it also runs the frontend, etcd and NATS), each its own MPI group of
    TP x PP ranks, one per GPU; DYN_SYSTEM_PORT 8081, 8082, ... in order.
    Pure; the problems name the field or node.

    Checked in stages, each only when the one before found nothing: the
    number of profile.workers, the GPU layout, each worker's GPUs and ranks,
    then ports and nodes left idle together."""
    topo = profile.topology_info
    specs = profile.worker_specs()
    explicit = profile.workers
    if explicit is not None and len(explicit) != len(specs):
        names = ", ".join(name for name, _, _ in specs)
        return [], [("profile.workers", f"{len(explicit)} entries but topology {topo.name} has {len(specs)} workers ({names})")]
    per = [explicit[i] if explicit else DynamoWorker() for i in range(len(specs))]
    layout, problems = _layout(profile, specs, per, nodes)
    if problems:
        return [], problems
    workers, problems = _place_workers(profile, specs, per, layout, nodes)
    if problems:
        return [], problems
    problems = _port_problems(profile, workers, per, nodes) + _idle_node_problems(profile, workers, nodes)
    return (workers if not problems else []), problems


def _layout(profile: DynamoProfile, specs: list, per: list[DynamoWorker], nodes: list[Node]) -> tuple[list[list[tuple[str, list[int]]]], list[tuple[str, str]]]:
    """(GPUs per worker, problems): the masks of profile.workers when every
    worker has one, else derived from the topology; a derived layout that
    needs more nodes than the inventory has is a problem."""
    topo = profile.topology_info
    given = [w.gpus is not None for w in per]
    spare = (nodes[0].devices if nodes else None) or PLATFORMS["gb300"].devices
    if any(given) and not all(given):
        i = given.index(False)
        return [], [(f"profile.workers[{i}].gpus", "set gpus on every worker or on none (derived from the topology)")]
    if all(given) and per:
        return [list((n, list(g)) for n, g in w.gpus.items()) for w in per if w.gpus is not None], []  # all given: every worker
    layout = _derive_gpus([p.gpus for _, p, _ in specs], nodes, spare)
    virtual = sorted({n for parts in layout for n, _ in parts if n.startswith("+")})
    if not virtual:
        return layout, []
    need_nodes = len(nodes) + len(virtual)
    need_gpus = sum(p.gpus for _, p, _ in specs)
    have_gpus = sum(n.devices or 0 for n in nodes)
    desc = f"{topo.prefill_replicas} x {topo.prefill_profile} + {topo.decode_replicas} x {topo.decode_profile}"
    return [], [
        ("profile.topology",
         f"{topo.name} ({desc}) needs {need_nodes} nodes of {spare} GPUs ({need_gpus} GPUs in use) "
         f"but the inventory has {len(nodes)} node{'s' if len(nodes) != 1 else ''} ({have_gpus} GPUs)")
    ]


def _place_workers(
    profile: DynamoProfile, specs: list, per: list[DynamoWorker], layout: list[list[tuple[str, list[int]]]], nodes: list[Node]
) -> tuple[list[DynamoPlacedWorker], list[tuple[str, str]]]:
    """(workers, problems): each worker on its GPUs, with its ranks, system
    port and environment; a worker with a problem is left out."""
    by_name = {n.name: (i, n) for i, n in enumerate(nodes)}
    owner: dict[tuple[str, int], str] = {}
    problems: list[tuple[str, str]] = []
    workers: list[DynamoPlacedWorker] = []
    for i, ((name, prof, replica), w, parts) in enumerate(zip(specs, per, layout)):
        field = f"profile.workers[{i}].gpus" if w.gpus is not None else "profile.topology"
        gpu_problems = _gpu_problems(name, field, parts, by_name, owner)
        problems += gpu_problems
        ok = not gpu_problems
        ranks = sum(len(g) for _, g in parts)
        pp = 1
        if ranks != prof.tp * pp:
            problems.append((field, f"{name} ({prof.name}) has {ranks} ranks (GPUs) but runs TP {prof.tp} x PP {pp} = {prof.tp * pp}"))
            ok = False
        port = w.system_port if w.system_port is not None else profile.system_port_base + i
        env = _worker_env(profile, prof.role, w, port)
        if ok:
            workers.append(
                DynamoPlacedWorker(
                    name=name, role=prof.role, profile=prof.name, index=i, replica=replica, tp=prof.tp, ep=prof.ep,
                    pp=pp, ranks=ranks, nodes=[(n, list(g)) for n, g in parts], system_port=port, env=env,
                )
            )
    return workers, problems


def _gpu_problems(
    name: str, field: str, parts: list[tuple[str, list[int]]], by_name: dict[str, tuple[int, Node]], owner: dict[tuple[str, int], str]
) -> list[tuple[str, str]]:
    """Worker ``name``'s GPUs: on a node of the inventory, existing there, not
    listed twice, not another worker's. ``owner`` (node, GPU) -> worker is
    filled in with the GPUs that pass."""
    problems: list[tuple[str, str]] = []
    for node_name, gpus in parts:
        if node_name not in by_name:
            problems.append((f"{field}.{node_name}", f"no node named {node_name!r} (nodes: {', '.join(by_name)})"))
            continue
        j, node = by_name[node_name]
        if not gpus:
            problems.append((f"{field}.{node_name}", f"{name} has no GPU on nodes[{j}] ({node_name})"))
        for g in gpus:
            if g >= (node.devices or 0):
                problems.append((f"{field}.{node_name}", f"GPU {g} does not exist on nodes[{j}] ({node_name}), which has {node.devices} GPUs"))
            elif owner.get((node_name, g)) == name:
                problems.append((f"{field}.{node_name}", f"GPU {g} is listed twice for {name}"))
            elif (node_name, g) in owner:
                problems.append((f"{field}.{node_name}", f"{name}'s GPU mask overlaps {owner[(node_name, g)]}: GPU {g} on nodes[{j}] ({node_name})"))
            else:
                owner[(node_name, g)] = name
    return problems


# Without it a worker's system port /health stays 503 "notready" for good: the
# runtime starts at DYN_SYSTEM_STARTING_HEALTH_STATUS (notready) and only the
# endpoints named here turn it ready (Dynamo's Health Check Reference;
# dynamo.trtllm never sets the status itself). Seen with ai-dynamo 1.6 on the
# simulated hosts: {"status":"notready","endpoints":{"generate":"ready"}} until
# this is set, then 200 {"status":"ready"} once generate is served. Dynamo's
# Kubernetes operator sets the same for its workers' readiness probes.
HEALTH_ENDPOINTS = '["generate"]'


def _worker_env(profile: DynamoProfile, role: str, w: DynamoWorker, port: int) -> dict[str, str]:
    """A worker's environment: its DYN_SYSTEM_PORT, what its role and a
    colocated topology need, then the profile's worker_env and its own env."""
    env: dict[str, str] = {"DYN_SYSTEM_PORT": str(port), "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS": HEALTH_ENDPOINTS}
    if role == "prefill":
        env["CUDA_SCALE_LAUNCH_QUEUES"] = "4x"
        env["TRTLLM_SKIP_KV_CACHE_ESTIMATION"] = "1"
    if profile.topology_info.colocated:
        env["TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL"] = "1"
    env.update(profile.worker_env)
    env.update(w.env)
    return env


def _port_problems(profile: DynamoProfile, workers: list[DynamoPlacedWorker], per: list[DynamoWorker], nodes: list[Node]) -> list[tuple[str, str]]:
    """Each worker's system port on its rank-0 node: a valid port, its own,
    and not one of node 0's services."""
    by_name = {n.name: (i, n) for i, n in enumerate(nodes)}
    problems: list[tuple[str, str]] = []
    # ports: node 0's services, then each worker's system port on its rank-0 node
    used_ports: dict[tuple[str, int], str] = {}
    if nodes:
        for field_name, port in profile.ports().items():
            used_ports.setdefault((nodes[0].name, port), f"profile.{field_name}")
    seen_ports: dict[int, str] = {}
    for w, spec in zip(workers, per):
        field = (f"profile.workers[{w.index}].system_port" if spec.system_port is not None
                 else f"profile.system_port_base (+{w.index})")
        what = f"{w.name}'s DYN_SYSTEM_PORT {w.system_port}"
        key = (w.rank0_node, w.system_port)
        if w.system_port > MAX_SYSTEM_PORT:
            problems.append((field, f"{what} is above {MAX_SYSTEM_PORT}: Dynamo's runtime reads it as a 16-bit signed integer"))
        elif w.system_port in seen_ports:
            problems.append((field, f"{what} is also {seen_ports[w.system_port]}'s: every worker needs its own DYN_SYSTEM_PORT"))
        elif key in used_ports:
            j = by_name[w.rank0_node][0]
            problems.append((field, f"{what} on nodes[{j}] ({w.rank0_node}) is also {used_ports[key]}"))
        else:
            used_ports[key] = field
        seen_ports.setdefault(w.system_port, w.name)
    return problems


def _idle_node_problems(profile: DynamoProfile, workers: list[DynamoPlacedWorker], nodes: list[Node]) -> list[tuple[str, str]]:
    """Every node but node 0 (which runs the frontend, etcd and NATS) runs a worker."""
    topo = profile.topology_info
    busy = {n for w in workers for n in w.node_names}
    problems: list[tuple[str, str]] = []
    for j, n in enumerate(nodes):
        if n.name not in busy and j != 0:
            problems.append(
                (f"nodes[{j}] ({n.name})",
                 f"topology {topo.name} places no worker on this node (it uses {len(busy | {nodes[0].name})} of "
                 f"{len(nodes)} nodes): remove it or choose a larger topology")
            )
    return problems
