"""Dynamo disaggregated serving (seed 000, "Qwen3.5 GB300 NVL72 Agentic
Disaggregated Serving") as pure functions of the inventory: the topologies
and role profiles as data, where every worker runs (``placement``), the role
settings each worker layers on its base file (``role_yaml``, merged inside
the container by the same ``merge-config.py`` as trtllm-serve's overrides,
``systems.trtllm.config.merge_script()``), and the environments of the seed's shells.

Nothing here opens a connection. The inventory is validated with the same
placement when it loads (``systems.dynamo.placement``), so these
functions do not fail on a loaded cluster.

Placement, from the topology and the inventory's four-GPU GB300 nodes:

- the frontend, etcd and NATS on node 0 (etcd/NATS only when not external);
- the workers in order, the prefill replicas then the decode replicas, named
  prefill0.., decode0..; each is its own MPI group of TP x PP ranks, one per
  GPU; a worker that fits in what is left of the current node goes there
  (the colocated 1P1D: P1 on GPU 0, D2 on GPUs 1,2 of node 0), any other
  starts on a fresh node and takes whole nodes (TP8: two nodes, TP16: four,
  4 ranks per node);
- DYN_SYSTEM_PORT 8081, 8082, ... in that order (profile.system_port_base),
  bound by rank 0 on the worker's first node;
- prefill workers get CUDA_SCALE_LAUNCH_QUEUES=4x and
  TRTLLM_SKIP_KV_CACHE_ESTIMATION=1; the colocated 1P1D topologies also
  TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL=1 on both workers, every other
  topology's workers unset it after sourcing the profile environment
  (``worker_unsets``).
"""

from __future__ import annotations

import posixpath

import yaml

from llmdeploy.inventory import Cluster, Node
from roles import renderer

from .profile import (
    DYNAMO_DECODE_PROFILES,
    DYNAMO_FORBIDDEN_ENV,
    DYNAMO_PREFILL_PROFILES,
    DYNAMO_TOPOLOGIES,
    DynamoDecodeProfile,
    DynamoPlacedWorker,
    DynamoPrefillProfile,
    DynamoProfile,
    DynamoTopology,
)



def _yaml_value(value) -> str:
    """One YAML scalar or flow list, e.g. true, CUTEDSL, [1, 2, 4]."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20)
    return text.removesuffix("\n").removesuffix("\n...").strip()


# the role files' templates write YAML scalars with ``| y``: their own environment, not the shared one
render_template = renderer(y=_yaml_value)

# --- data (seed 000, "Select Another Topology") ---------------------------------------
PREFILL_PROFILES: dict[str, DynamoPrefillProfile] = DYNAMO_PREFILL_PROFILES
DECODE_PROFILES: dict[str, DynamoDecodeProfile] = DYNAMO_DECODE_PROFILES
TOPOLOGIES: dict[str, DynamoTopology] = DYNAMO_TOPOLOGIES
Worker = DynamoPlacedWorker

# "Prefill retains ..."
PREFILL_RETAINED = {
    "max_batch_size": 64,
    "max_seq_len": 262144,
    "free_gpu_memory_fraction": 0.8,  # kv_cache_config.
    "moe_backend": "CUTEDSL",  # moe_config.backend
}
# "Decode retains ... and MTP6"
DECODE_RETAINED = {
    "max_seq_len": 262148,
    "avg_seq_len": 102150,  # kv_cache_config.
    "free_gpu_memory_fraction": 0.85,  # kv_cache_config.
    "use_low_precision_moe_combine": True,  # moe_config.
    "decoding_type": "MTP",  # speculative_config.
    "max_draft_len": 6,  # speculative_config.
}
# "All workers keep pipeline_parallel_size: 1 ... 128 GiB of host cache per
# rank" and the metrics settings of both workers (host_cache_size comes from
# profile.host_cache_bytes_per_rank)
BOTH_RETAINED = {
    "pipeline_parallel_size": 1,
    "enable_iter_perf_stats": True,
    "iter_perf_stats_interval": 40,
    "iteration_stats_interval": 40,  # kv_cache_config.
    "return_perf_metrics": False,
    "event_buffer_max_size": 0,  # kv_cache_config.
}
# the colocated 1P1D profiles' cache_transceiver_config.kv_cache_bounce_size_mb
BOUNCE_SIZE_MB = 2048
BOUNCE_KEY = "cache_transceiver_config.kv_cache_bounce_size_mb"
# merge-config.py removes the dotted keys listed under this top-level key
DELETE_KEY = "__delete__"
# removed from every worker's environment (the seed's ``unset``)
UNSET_ENV = (DYNAMO_FORBIDDEN_ENV,)
# the weight-loading variable: "For the two colocated 1P1D profiles, retain ...
# TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL=1 on both workers. For the other
# profiles, remove that bounce-size override and unset the weight-loading
# variable to use the pinned runtime's defaults" (seed 000, "Select Another Topology")
WEIGHT_LOADING_ENV = "TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL"


def placement(cluster: Cluster, prof: DynamoProfile) -> list[Worker]:
    """Every worker of the topology, placed on the cluster's nodes, in start
    order (prefill replicas, then decode replicas). ``prof``, here and in
    every function below that takes it: the cluster's profile, as the hook
    that builds the plan (or the profile's own hook) received it."""
    return prof.placement(cluster.nodes)


def worker(cluster: Cluster, prof: DynamoProfile, name: str) -> Worker:
    for w in placement(cluster, prof):
        if w.name == name:
            return w
    raise KeyError(name)


def workers_on(cluster: Cluster, prof: DynamoProfile, node: Node | str) -> list[Worker]:
    """The workers with at least one rank on ``node``."""
    name = node if isinstance(node, str) else node.name
    return [w for w in placement(cluster, prof) if name in w.node_names]


def ranks_on(cluster: Cluster, prof: DynamoProfile, node: Node | str) -> dict[str, int]:
    """{worker name: ranks on ``node``} for the workers with ranks there."""
    name = node if isinstance(node, str) else node.name
    return {w.name: w.ranks_on(name) for w in workers_on(cluster, prof, name)}


def role_profile(worker: Worker) -> DynamoPrefillProfile | DynamoDecodeProfile:
    return PREFILL_PROFILES[worker.profile] if worker.role == "prefill" else DECODE_PROFILES[worker.profile]


def base_yaml_name(prof: DynamoProfile, worker: Worker) -> str:
    return prof.base_prefill_yaml if worker.role == "prefill" else prof.base_decode_yaml


def base_yaml_path(prof: DynamoProfile, worker: Worker) -> str:
    """The base role file inside the container, e.g.
    /opt/trtllm-recipes/examples/configs/curated/qwen3.5-gb300-agentic-prefill.yaml."""
    return posixpath.join(prof.config_dir, base_yaml_name(prof, worker))


def role_yaml(cluster: Cluster, prof: DynamoProfile, worker: Worker) -> str:
    """The worker's role settings (templates/dynamo/<role>.yaml.j2): a header
    naming the base file it layers on, then the keys of the seed's tables;
    for topologies other than the colocated 1P1D a ``__delete__`` list that
    removes the base file's bounce-size override."""
    topo = prof.topology_info
    retained = PREFILL_RETAINED if worker.role == "prefill" else DECODE_RETAINED
    return render_template(f"dynamo/{worker.role}.yaml.j2",
        cluster=cluster.name,
        worker=worker,
        topology=topo,
        p=role_profile(worker),
        r=retained,
        c=BOTH_RETAINED,
        host_cache_size=prof.host_cache_bytes_per_rank,
        bounce_size_mb=BOUNCE_SIZE_MB,
        base=base_yaml_path(prof, worker),
    )


def role_overrides(cluster: Cluster, prof: DynamoProfile, worker: Worker) -> dict:
    """The role settings as data: exactly what ``role_yaml`` holds (including
    the ``__delete__`` list when there is one)."""
    return yaml.safe_load(role_yaml(cluster, prof, worker))


def role_yaml_name(worker: Worker) -> str:
    """A file name for the worker's role settings in the release, e.g. decode1.yaml."""
    return f"{worker.name}.yaml"


def common_env(cluster: Cluster, prof: DynamoProfile, node: Node) -> dict[str, str]:
    """The seed's per-shell setup block, for every process on ``node``
    (frontend and workers): the model and config directories inside the
    container, the control plane (node 0's serving IP, or the external
    endpoints), the namespace, etcd discovery and the TCP request plane."""
    node0 = cluster.node0
    return {
        "MODEL_PATH": prof.model_mount,
        "CONFIG_DIR": prof.config_dir,
        "ETCD_ENDPOINTS": prof.etcd_endpoints or f"http://{node0.ip}:{prof.etcd_port}",
        "NATS_SERVER": prof.nats_server or f"nats://{node0.ip}:{prof.nats_port}",
        "DYN_NAMESPACE": prof.namespace,
        "DYN_DISCOVERY_BACKEND": "etcd",
        "DYN_REQUEST_PLANE": "tcp",
    }


def node_env(cluster: Cluster, prof: DynamoProfile, node: Node) -> dict[str, str]:
    """Variables every worker on ``node`` shares beyond ``common_env``: the
    colocated 1P1D topologies' TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL=1 (both
    of its workers run there). Written into the node's environment file."""
    if prof.topology_info.colocated and workers_on(cluster, prof, node):
        return {"TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL": "1"}
    return {}


def worker_unsets(prof: DynamoProfile) -> list[tuple[str, str]]:
    """What a worker's shell unsets after sourcing the profile environment,
    beyond the forced acceptance every shell unsets, each with why: for every
    topology but the colocated 1P1D the weight-loading variable, which the
    profile environment may set, so that the pinned runtime's default applies."""
    if prof.topology_info.colocated:
        return []
    return [(WEIGHT_LOADING_ENV, f"topology {prof.topology_info.name} is not the colocated 1P1D: "
             "the pinned runtime's default weight loading (seed 000, \"Select Another Topology\")")]


def frontend_env(prof: DynamoProfile) -> dict[str, str]:
    """The frontend shell's variables (ETCD_LEASE_TTL, DYN_TOKENIZER_*), in the seed's order."""
    return dict(prof.frontend_env)


def worker_env(cluster: Cluster, worker: Worker, node: Node | str | None = None) -> dict[str, str]:
    """The worker shell's variables in the seed's order: CUDA_VISIBLE_DEVICES
    (only with ``node``: it is per node), DYN_SYSTEM_PORT, the prefill
    variables, TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL (colocated 1P1D), then
    profile.worker_env and the worker's own env. The seed also unsets
    ``UNSET_ENV`` in every worker shell, and ``worker_unsets`` in those of
    the topologies that are not the colocated 1P1D."""
    out: dict[str, str] = {}
    if node is not None:
        out["CUDA_VISIBLE_DEVICES"] = worker.cuda_visible_devices(node if isinstance(node, str) else node.name)
    out.update(worker.env)
    return out
