"""The Dynamo profile (seed 000, "Qwen3.5 GB300 NVL72 Agentic Disaggregated
Serving"): the role tables and topologies as data, the profile, and what it
tells the generic roles (ports, host memory, environment, NUMA, wheels)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from llmdeploy.inventory import Cluster, Node
from llmdeploy.schema import ENV_NAME_RE, IMAGE_RE, NAME_RE, ClusterProblems, Port, SafePath, Strict, safe_path
from llmdeploy.serving import ServingProfile, WheelSet, inventory_field
from systems.common import nccl_node_env

KIND = "dynamo"


# --- Dynamo disaggregated serving (seed 000, "Qwen3.5 GB300 NVL72 Agentic
# Disaggregated Serving"): the role profiles and topologies as data ------------------
class _DynamoRoleRow(BaseModel):
    """A row of one of the seed's role tables: "TP=EP in every row", one GPU per rank."""

    model_config = ConfigDict(frozen=True)

    name: str
    gpus: int

    @property
    def tp(self) -> int:
        return self.gpus

    @property
    def ep(self) -> int:
        return self.gpus


class DynamoPrefillProfile(_DynamoRoleRow):
    """A row of the seed's prefill table. GPUs = TP = EP per worker."""

    enable_attention_dp: bool
    max_num_tokens: int

    @property
    def role(self) -> str:
        return "prefill"

    @property
    def capture_num_tokens(self) -> list[int]:
        """torch_compile_config.capture_num_tokens: the powers of two from 1
        through max_num_tokens, complete."""
        out, n = [], 1
        while n <= self.max_num_tokens:
            out.append(n)
            n *= 2
        return out


class DynamoDecodeProfile(_DynamoRoleRow):
    """A row of the seed's decode table. GPUs = TP = EP per worker."""

    enable_attention_dp: bool
    enable_lm_head_tp_in_adp: bool
    max_batch_size: int
    max_num_tokens: int
    cuda_graph_batch_sizes: tuple[int, ...]
    moe_backend: str

    @property
    def role(self) -> str:
        return "decode"


class DynamoTopology(BaseModel):
    """A row of the seed's topology table: replicas x profile per role and the
    physical four-GPU nodes it occupies. The colocated ones run both roles on
    one node and keep the bounce buffer and TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL=1."""

    model_config = ConfigDict(frozen=True)

    name: str
    title: str  # the seed's wording
    prefill_replicas: int
    prefill_profile: str
    decode_replicas: int
    decode_profile: str
    nodes: int
    colocated: bool


DYNAMO_PREFILL_PROFILES: dict[str, DynamoPrefillProfile] = {
    p.name: p
    for p in (
        DynamoPrefillProfile(name="P1", gpus=1, enable_attention_dp=True, max_num_tokens=8192),
        DynamoPrefillProfile(name="P4-TEP", gpus=4, enable_attention_dp=False, max_num_tokens=32768),
        DynamoPrefillProfile(name="P4-DEP", gpus=4, enable_attention_dp=True, max_num_tokens=8192),
    )
}

DYNAMO_DECODE_PROFILES: dict[str, DynamoDecodeProfile] = {
    d.name: d
    for d in (
        DynamoDecodeProfile(name="D2-B8", gpus=2, enable_attention_dp=False, enable_lm_head_tp_in_adp=False,
                            max_batch_size=8, max_num_tokens=56, cuda_graph_batch_sizes=(1, 2, 4, 8), moe_backend="TRTLLM"),
        DynamoDecodeProfile(name="D2-B4", gpus=2, enable_attention_dp=False, enable_lm_head_tp_in_adp=False,
                            max_batch_size=4, max_num_tokens=28, cuda_graph_batch_sizes=(1, 2, 4), moe_backend="TRTLLM"),
        DynamoDecodeProfile(name="D8-B4", gpus=8, enable_attention_dp=False, enable_lm_head_tp_in_adp=False,
                            max_batch_size=4, max_num_tokens=28, cuda_graph_batch_sizes=(1, 2, 4), moe_backend="CUTEDSL"),
        DynamoDecodeProfile(name="D8-B1", gpus=8, enable_attention_dp=False, enable_lm_head_tp_in_adp=False,
                            max_batch_size=1, max_num_tokens=7, cuda_graph_batch_sizes=(1, 2, 4), moe_backend="CUTEDSL"),
        DynamoDecodeProfile(name="D16-B8", gpus=16, enable_attention_dp=True, enable_lm_head_tp_in_adp=True,
                            max_batch_size=8, max_num_tokens=56, cuda_graph_batch_sizes=(1, 2, 4, 8), moe_backend="CUTEDSL"),
        DynamoDecodeProfile(name="D4-B32", gpus=4, enable_attention_dp=True, enable_lm_head_tp_in_adp=True,
                            max_batch_size=32, max_num_tokens=224, cuda_graph_batch_sizes=(1, 2, 4, 8, 16, 24, 32),
                            moe_backend="CUTEDSL"),
    )
}

DYNAMO_TOPOLOGIES: dict[str, DynamoTopology] = {
    t.name: t
    for t in (
        DynamoTopology(name="1P1D-B8", title="1P1D, decode batch 8", prefill_replicas=1, prefill_profile="P1",
                       decode_replicas=1, decode_profile="D2-B8", nodes=1, colocated=True),
        DynamoTopology(name="1P1D-B4", title="1P1D, decode batch 4", prefill_replicas=1, prefill_profile="P1",
                       decode_replicas=1, decode_profile="D2-B4", nodes=1, colocated=True),
        DynamoTopology(name="1P2D", title="1P2D", prefill_replicas=1, prefill_profile="P4-TEP",
                       decode_replicas=2, decode_profile="D8-B4", nodes=5, colocated=False),
        DynamoTopology(name="1P4D-B1", title="1P4D, decode batch 1", prefill_replicas=1, prefill_profile="P4-TEP",
                       decode_replicas=4, decode_profile="D8-B1", nodes=9, colocated=False),
        DynamoTopology(name="1P4D-B4", title="1P4D, decode batch 4", prefill_replicas=1, prefill_profile="P4-TEP",
                       decode_replicas=4, decode_profile="D8-B4", nodes=9, colocated=False),
        DynamoTopology(name="2P3D", title="2P3D", prefill_replicas=2, prefill_profile="P4-TEP",
                       decode_replicas=3, decode_profile="D8-B4", nodes=8, colocated=False),
        DynamoTopology(name="3P1D", title="3P1D", prefill_replicas=3, prefill_profile="P4-DEP",
                       decode_replicas=1, decode_profile="D16-B8", nodes=7, colocated=False),
        DynamoTopology(name="3P2D", title="3P2D", prefill_replicas=3, prefill_profile="P4-DEP",
                       decode_replicas=2, decode_profile="D4-B32", nodes=5, colocated=False),
    )
}

# the platforms seed 000 gives the Dynamo profile for: "Use a GB300 NVL72 system"
DYNAMO_PLATFORMS = ("gb300",)
# never set in production or accuracy runs (seed 000); the workers unset it
DYNAMO_FORBIDDEN_ENV = "TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS"
# set from the topology and the placement, never through an env dict
DYNAMO_PLACEMENT_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "DYN_SYSTEM_PORT",
    "CUDA_SCALE_LAUNCH_QUEUES",
    "TRTLLM_SKIP_KV_CACHE_ESTIMATION",
    "TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL",
)
# the seed's per-shell setup block: from the profile's fields (workers.common_env)
DYNAMO_COMMON_ENV = (
    "MODEL_PATH",
    "CONFIG_DIR",
    "ETCD_ENDPOINTS",
    "NATS_SERVER",
    "DYN_NAMESPACE",
    "DYN_DISCOVERY_BACKEND",
    "DYN_REQUEST_PLANE",
)

_ETCD_URL_RE = r"https?://[A-Za-z0-9.-]+:\d{1,5}"
_NATS_URL_RE = r"nats://[A-Za-z0-9.-]+:\d{1,5}"


@inventory_field("profile.workers[]")
class DynamoWorker(Strict):
    """Optional settings of one worker of the topology, in its order (the
    prefill replicas, then the decode replicas). Every field is optional."""

    # node name -> GPU ids on it, in rank order (the nodes in the given order);
    # None: derived from the topology. Set it on every worker or on none.
    gpus: dict[Annotated[str, Field(pattern=NAME_RE.pattern)], list[Annotated[int, Field(ge=0, le=63)]]] | None = None
    # DYN_SYSTEM_PORT; None: profile.system_port_base + the worker's index
    system_port: Port | None = None
    # variables for this worker only (after profile.worker_env)
    env: dict[str, str] = Field(default_factory=dict)


@dataclass(frozen=True)
class DynamoPlacedWorker:
    """One worker (one MPI group) of a Dynamo release, placed on the nodes.
    ``env`` is the worker's own environment in the seed's order, without
    CUDA_VISIBLE_DEVICES, which is per node: ``cuda_visible_devices(node)``."""

    name: str  # prefill0, prefill1, ..., decode0, ...
    role: str  # prefill / decode
    profile: str  # P1, P4-TEP, D8-B4, ...
    index: int  # position in the topology's order (0 = first prefill replica)
    replica: int  # position among the workers of its role
    tp: int
    ep: int
    pp: int
    ranks: int  # = tp * pp, one per GPU
    nodes: list  # [(node name, [GPU ids])] in rank order; rank 0 on the first
    system_port: int
    env: dict

    @property
    def node_names(self) -> list[str]:
        return [name for name, _ in self.nodes]

    @property
    def rank0_node(self) -> str:
        """The node of rank 0: where dynamo.trtllm and its system port run."""
        return self.nodes[0][0]

    def gpus_on(self, node: str) -> list[int]:
        for name, gpus in self.nodes:
            if name == node:
                return list(gpus)
        return []

    def ranks_on(self, node: str) -> int:
        return len(self.gpus_on(node))

    def cuda_visible_devices(self, node: str) -> str:
        """CUDA_VISIBLE_DEVICES on ``node``, e.g. "1,2"; KeyError if the worker has no rank there."""
        gpus = self.gpus_on(node)
        if not gpus:
            raise KeyError(f"{self.name} has no rank on {node}")
        return ",".join(str(g) for g in gpus)

    def as_dict(self) -> dict:
        return {
            "name": self.name, "role": self.role, "profile": self.profile, "index": self.index,
            "replica": self.replica, "tp": self.tp, "ep": self.ep, "pp": self.pp, "ranks": self.ranks,
            "nodes": [[n, list(g)] for n, g in self.nodes], "system_port": self.system_port, "env": dict(self.env),
        }


class DynamoProfile(ServingProfile):
    """Dynamo disaggregated prefill/decode (frontend, etcd and NATS on node 0)
    in one of the seed's topologies; the workers are placed from it."""

    kind: Literal["dynamo"] = "dynamo"
    served_model_name: str = Field(pattern=r"^[A-Za-z0-9._/-]+$")
    namespace: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    # one of DYNAMO_TOPOLOGIES: 1P1D-B8, 1P1D-B4, 1P2D, 1P4D-B1, 1P4D-B4, 2P3D, 3P1D, 3P2D
    topology: str
    # the base role files the rendered role settings layer on, in config_dir
    base_prefill_yaml: str = Field(default="qwen3.5-gb300-agentic-prefill.yaml", pattern=r"^[A-Za-z0-9._-]+\.yaml$")
    base_decode_yaml: str = Field(default="qwen3.5-gb300-agentic-decode.yaml", pattern=r"^[A-Za-z0-9._-]+\.yaml$")
    # the TensorRT-LLM checkout on every node (host path), mounted read-only
    # at recipes_mount; the base files come from it, not from the image
    recipes_dir: SafePath
    recipes_mount: SafePath = "/opt/trtllm-recipes"
    # CONFIG_DIR inside the container: under recipes_mount
    config_dir: SafePath = "/opt/trtllm-recipes/examples/configs/curated"
    # the model directory (cluster.model.path) inside the container: MODEL_PATH
    model_mount: SafePath = "/models/qwen35"
    frontend_port: Port = 8000
    etcd_port: Port = 2379
    etcd_peer_port: Port = 2380
    nats_port: Port = 4222
    nats_monitor_port: Port = 8222
    # DYN_SYSTEM_PORT of the workers in order: 8081, 8082, ... (the seed's)
    system_port_base: Port = 8081
    # An external control plane: when set, the tool checks its health and
    # does not start it on node 0. "http://host:2379[,http://host2:2379]".
    etcd_endpoints: str | None = Field(default=None, pattern=rf"^{_ETCD_URL_RE}(,{_ETCD_URL_RE})*$")
    # "nats://host:4222"
    nats_server: str | None = Field(default=None, pattern=rf"^{_NATS_URL_RE}$")
    # the control plane the tool starts on node 0 (unless the endpoints above
    # are given): one container each, pulled by prepare like Kamal's accessories
    # (on pyxis imported into a file each, which their units run)
    etcd_image: str = Field(default="quay.io/coreos/etcd:v3.5.17", pattern=IMAGE_RE.pattern)
    nats_image: str = Field(default="nats:2.10.24-alpine", pattern=IMAGE_RE.pattern)
    # the ssh_config mpirun's launch agent uses to reach the other nodes of a
    # worker that spans several (None: ssh's default for root)
    launch_ssh_config: SafePath | None = None
    # kv_cache_config.host_cache_size of every rank (128 GiB, the seed's)
    host_cache_bytes_per_rank: int = Field(default=137438953472, ge=1)
    # Pinned wheels installed into the image (name==version), from the seed's
    # indexes or, on clusters without PyPI access, from ``wheel_dir`` on each node.
    wheels: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]+==[A-Za-z0-9._+!-]+$")]] = Field(default_factory=list)
    wheel_index_url: str = Field(default="https://pypi.org/simple", pattern=r"^https?://[A-Za-z0-9._:/@%-]+$")
    wheel_extra_index_urls: list[Annotated[str, Field(pattern=r"^https?://[A-Za-z0-9._:/@%-]+$")]] = Field(
        default_factory=lambda: ["https://pypi.nvidia.com"]
    )
    wheel_dir: SafePath | None = None
    # Bind worker host memory with ``numactl -m``: "auto" applies the seed's
    # "0,1" only where the node has that Grace-Blackwell layout (CPU NUMA
    # nodes 0 and 1, GPU memory as CPU-less nodes); "off" never; a list such
    # as "0,1" demands it (prepare refuses a node that cannot give it).
    numa_membind: str = Field(default="auto", pattern=r"^(auto|off|\d+(,\d+)*)$")
    frontend_env: dict[str, str] = Field(default_factory=dict)
    # every worker, after the topology's own variables
    worker_env: dict[str, str] = Field(default_factory=dict)
    # optional per-worker settings, one per worker of the topology
    workers: list[DynamoWorker] | None = None

    _check_paths = field_validator("recipes_dir", "recipes_mount", "config_dir", "model_mount", "wheel_dir", "launch_ssh_config")(
        classmethod(lambda cls, v: v if v is None else safe_path(v))
    )

    @field_validator("topology")
    @classmethod
    def _known_topology(cls, v: str) -> str:
        """One of the seed's topologies (``DYNAMO_TOPOLOGIES``)."""
        if v not in DYNAMO_TOPOLOGIES:
            raise ValueError(f"{v!r} is not a topology; use one of: {', '.join(DYNAMO_TOPOLOGIES)}")
        return v

    @model_validator(mode="after")
    def _check_profile(self) -> "DynamoProfile":
        """``config_dir`` lies under ``recipes_mount``; the env dicts use valid names with one-line values,
        never set TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS, nor what the profile's fields or the placement set."""
        problems: list[tuple[str, str]] = []
        mount = self.recipes_mount.rstrip("/")
        if not (self.config_dir == mount or self.config_dir.startswith(mount + "/")):
            problems.append(
                ("config_dir", f"{self.config_dir} is not under recipes_mount {self.recipes_mount}: "
                 "the base files come from the recipes checkout, not from the image")
            )
        envs = [("frontend_env", self.frontend_env), ("worker_env", self.worker_env)]
        envs += [(f"workers[{i}].env", w.env) for i, w in enumerate(self.workers or [])]
        for field, env in envs:
            for key, value in env.items():
                where = f"{field}.{key}"
                if not ENV_NAME_RE.match(key):
                    problems.append((where, f"environment variable name {key!r} is not valid"))
                elif key == DYNAMO_FORBIDDEN_ENV:
                    problems.append((where, "must never be set in production or accuracy runs (seed 000); the workers unset it"))
                elif key in DYNAMO_COMMON_ENV:
                    problems.append((where, "comes from the profile's fields (the seed's setup block); set those instead"))
                elif key in DYNAMO_PLACEMENT_ENV and field != "frontend_env":
                    problems.append((where, "comes from the topology and the placement, not from an env dict"))
                elif "\n" in value or "\r" in value or "\0" in value:
                    problems.append((where, "a value must be one line"))
        if problems:
            raise ClusterProblems(problems)
        return self

    @property
    def topology_info(self) -> DynamoTopology:
        return DYNAMO_TOPOLOGIES[self.topology]

    def worker_specs(self) -> list[tuple[str, DynamoPrefillProfile | DynamoDecodeProfile, int]]:
        """(name, role profile, replica) of every worker in the topology's
        order: the prefill replicas, then the decode replicas."""
        t = self.topology_info
        out: list = []
        for r in range(t.prefill_replicas):
            out.append((f"prefill{r}", DYNAMO_PREFILL_PROFILES[t.prefill_profile], r))
        for r in range(t.decode_replicas):
            out.append((f"decode{r}", DYNAMO_DECODE_PROFILES[t.decode_profile], r))
        return out

    def launch_ssh(self) -> str | None:
        return self.launch_ssh_config

    def accessory_images(self) -> list[str]:
        """Images node 0 needs besides the serving image: the control plane the tool starts."""
        return ([] if self.etcd_endpoints else [self.etcd_image]) + ([] if self.nats_server else [self.nats_image])

    def ports(self) -> dict[str, int]:
        """The ports node 0 binds: the frontend, and etcd and NATS unless external."""
        out = {"frontend_port": self.frontend_port}
        if self.etcd_endpoints is None:
            out["etcd_port"] = self.etcd_port
            out["etcd_peer_port"] = self.etcd_peer_port
        if self.nats_server is None:
            out["nats_port"] = self.nats_port
            out["nats_monitor_port"] = self.nats_monitor_port
        return out

    def placement(self, nodes: list[Node]) -> list[DynamoPlacedWorker]:
        """The workers on ``nodes`` (see dynamo_placement); ClusterProblems if they do not fit."""
        from .placement import dynamo_placement

        workers, problems = dynamo_placement(self, nodes)
        if problems:
            raise ClusterProblems(problems)
        return workers

    # --- the serving-system interface (llmdeploy.serving) -----------------------
    def launched_worlds(self, cluster: Cluster) -> str | None:
        """A worker group is one launch over its nodes: a task per GPU, the
        same number on each node. A group with more GPUs on one of its nodes
        than on another (the inventory's GPU masks) cannot be one."""
        uneven = [f"{w.name} ({', '.join(f'{len(g)} on {h}' for h, g in w.nodes)})" for w in self.placement(cluster.nodes)
                  if len({len(g) for _, g in w.nodes}) > 1]
        if uneven:
            return (f"worker groups with unequal GPUs per node, {'; '.join(uneven)}: one srun step starts the same number "
                    "of tasks on each of its nodes")
        return None

    def problems(self, cluster: Cluster) -> list[tuple[str, str]]:
        """The platform is GB300 (the seed's only one); the topology fits the nodes (GPU masks, ranks = TP x PP,
        nodes and GPUs, ports per node); TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS is no secret either."""
        from .placement import dynamo_placement

        problems: list[tuple[str, str]] = []
        if cluster.platform not in DYNAMO_PLATFORMS:
            # seed 000 gives Dynamo's profile, topologies and placement for
            # four-GPU GB300 NVL72 nodes only ("Use a GB300 NVL72 system")
            problems.append(
                ("platform", f"{cluster.platform} ({cluster.platform_info.name}): the {KIND} profile (profile.kind) is the seed's "
                 f"Qwen3.5 GB300 NVL72 agentic profile, for {', '.join(DYNAMO_PLATFORMS)} only; its topologies, "
                 "GPU placement and host-memory budget are not given for other platforms")
            )
        else:
            # GPU masks, ranks = TP x PP, nodes and GPUs the topology needs,
            # ports per node (node 0's services and every DYN_SYSTEM_PORT)
            problems += dynamo_placement(self, cluster.nodes)[1]
        if DYNAMO_FORBIDDEN_ENV in cluster.secret_env:
            problems.append((f"secret_env.{DYNAMO_FORBIDDEN_ENV}",
                             "must never be set in production or accuracy runs (seed 000); the workers unset it"))
        return problems

    def node_ports(self, cluster: Cluster, node: Node) -> dict[int, str]:
        # node 0: the frontend, and etcd and NATS unless external; every
        # worker's DYN_SYSTEM_PORT on the node of its rank 0
        out = super().node_ports(cluster, node)
        for w in self.placement(cluster.nodes):
            if w.rank0_node == node.name:
                out[w.system_port] = f"{w.name} DYN_SYSTEM_PORT"
        return out

    def host_memory_gib(self, cluster: Cluster, node: Node) -> dict[str, float]:
        # kv_cache_config.host_cache_size of every rank on this node, from the placement
        ranks = sum(w.ranks_on(node.name) for w in self.placement(cluster.nodes))
        if not ranks:
            return {}
        per = self.host_cache_bytes_per_rank / 1024**3
        return {f"host KV cache ({ranks} ranks x {per:g} GiB)": ranks * per}

    def node_env(self, cluster: Cluster, node: Node) -> dict[str, str]:
        return nccl_node_env(node)

    def environment(self, cluster: Cluster, node: Node) -> dict[str, str]:
        # the seed's per-shell setup block, then what every worker of this node
        # shares (the colocated 1P1D's TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL=1);
        # per-worker variables come from workers.worker_env
        from . import workers

        return {**self.node_env(cluster, node), **workers.common_env(cluster, self, node), **workers.node_env(cluster, self, node)}

    def numa(self, cluster: Cluster, node: Node, facts: dict) -> tuple[dict, list[str]]:
        from .numa import plan

        return plan(self, node, facts)

    def wheel_set(self) -> WheelSet | None:
        if not self.wheels:
            return None
        return WheelSet(pins=list(self.wheels), index_url=self.wheel_index_url,
                        extra_index_urls=list(self.wheel_extra_index_urls), wheel_dir=self.wheel_dir,
                        report=["tensorrt-llm"])  # the runtime the pins must match, for the record


