"""The vLLM-Ascend profile: ``vllm serve`` on Ascend, node 0 plus headless
data-parallel workers (seed 001), and the checks of a cluster it runs on."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from llmdeploy.inventory import Cluster, Node
from llmdeploy.schema import ENV_NAME_RE, ClusterProblems, Port, env_name_list, env_values_one_line, json_value_problem
from llmdeploy.serving import ServingProfile

KIND = "vllm-ascend"
# vllm-ascend cpu_binding.md: enable_cpu_binding needs at least this many CPUs per NPU
MIN_CPUS_PER_NPU = 5


class VllmAscendProfile(ServingProfile):
    """``vllm serve`` on Ascend: node 0 plus headless data-parallel workers."""

    kind: Literal["vllm-ascend"] = "vllm-ascend"
    served_model_name: str = Field(default="qwen3.8", pattern=r"^[A-Za-z0-9._/-]+$")
    dp: int = Field(ge=1)
    tp: int = Field(ge=1)
    ep: int = Field(ge=1)
    # DP ranks per node: dp_local x TP is the node's devices (at most 64), so
    # no larger value is valid (and the rank check loops over it per node)
    dp_local: int = Field(default=1, ge=1, le=64)
    host: str = "0.0.0.0"
    port: Port = 8000
    rpc_port: Port = 13389
    quantization: str | None = "ascend"
    safetensors_load_strategy: str | None = "lazy"
    trust_remote_code: bool = True
    enable_prefix_caching: bool = True
    enable_expert_parallel: bool = True
    max_model_len: int = Field(ge=1)
    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=1)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    speculative_config: dict | None = None
    compilation_config: dict | None = None
    additional_config: dict | None = None
    # Static environment of the seed. Per-node values are added per node:
    # ``ip_env`` get the node's IP, ``ifname_env`` the node's NIC.
    env: dict[str, str] = Field(default_factory=dict)
    ip_env: list[str] = Field(default_factory=lambda: ["HCCL_IF_IP"])
    ifname_env: list[str] = Field(default_factory=lambda: ["HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"])

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        """Valid environment variable names, each value one line."""
        for k in v:
            if not ENV_NAME_RE.match(k):
                raise ValueError(f"environment variable name {k!r} is not valid")
        return env_values_one_line(v)

    # names of variables in the node's environment file
    _env_lists = field_validator("ip_env", "ifname_env")(classmethod(lambda cls, v: env_name_list(v)))

    @field_validator("speculative_config", "compilation_config", "additional_config")
    @classmethod
    def _plain_json(cls, v: dict | None) -> dict | None:
        """Only what JSON can say (strings, finite numbers, booleans, None, lists, mappings with string keys)."""
        # vllm serve gets these as JSON arguments: only what JSON can say
        problem = json_value_problem(v, "")
        if problem:
            raise ClusterProblems([problem]) if problem[0] else ValueError(problem[1])
        return v

    def ports(self) -> dict[str, int]:
        # the API and the DP RPC port live on node 0; headless workers bind neither
        return {"port": self.port, "rpc_port": self.rpc_port}

    def ranks_per_node(self) -> int:
        return self.dp_local

    def problems(self, cluster: Cluster) -> list[tuple[str, str]]:
        return cluster_problems(self, cluster)

    def node_env(self, cluster: Cluster, node: Node) -> dict[str, str]:
        # HCCL/Gloo/TP interface and address: the node's own
        out = {key: str(node.ip) for key in self.ip_env}
        assert node.nic is not None  # the cluster's validation gives every node one (Cluster._derive_nodes)
        out.update({key: node.nic for key in self.ifname_env})
        return out

    def environment(self, cluster: Cluster, node: Node) -> dict[str, str]:
        return {**self.env, **self.node_env(cluster, node)}

    def numa(self, cluster: Cluster, node: Node, facts: dict) -> tuple[dict, list[str]]:
        return cpu_binding(self, cluster, node, facts)



def cluster_problems(prof: VllmAscendProfile, cluster: Cluster) -> list[tuple[str, str]]:
    """DP x TP fills every NPU, one DP group per node, EP = DP x TP, ranks unique."""
    problems: list[tuple[str, str]] = []
    nodes = cluster.nodes
    if cluster.platform_info.vendor != "ascend":
        problems.append(("profile.kind", f"{KIND} needs an Ascend platform, not {cluster.platform}"))
    if prof.dp != len(nodes) * prof.dp_local:
        problems.append(("profile.dp", f"DP {prof.dp} != {len(nodes)} nodes x dp_local {prof.dp_local}"))
    total_devices = sum(n.devices or 0 for n in nodes)
    if prof.dp * prof.tp != total_devices:
        problems.append(("profile.tp", f"DP {prof.dp} x TP {prof.tp} = {prof.dp * prof.tp} but the nodes have {total_devices} devices"))
    for i, n in enumerate(nodes):
        if prof.dp_local * prof.tp != n.devices:
            problems.append((cluster.where(i, "devices"), f"dp_local {prof.dp_local} x TP {prof.tp} != {n.devices} devices on this node"))
    if prof.enable_expert_parallel and prof.ep != prof.dp * prof.tp:
        problems.append(("profile.ep", f"EP {prof.ep} != DP {prof.dp} x TP {prof.tp} (vLLM's expert-parallel size)"))
    if not prof.enable_expert_parallel and prof.ep != 1:
        problems.append(("profile.ep", "EP must be 1 when enable_expert_parallel is off"))
    return problems + rank_problems(prof, cluster)


def rank_problems(prof: VllmAscendProfile, cluster: Cluster) -> list[tuple[str, str]]:
    """Every DP rank owned by exactly one node, node 0 owning rank 0."""
    problems: list[tuple[str, str]] = []
    ranks: dict[int, int] = {}
    for i, n in enumerate(cluster.nodes):
        assert n.start_rank is not None  # Cluster._derive_nodes gives every node one before the profile's checks
        for r in range(n.start_rank, n.start_rank + prof.dp_local):
            if r in ranks:
                j = ranks[r]
                problems.append((cluster.where(i, "start_rank"), f"DP rank {r} is also owned by nodes[{j}] ({cluster.nodes[j].name})"))
            elif r >= prof.dp:
                problems.append((cluster.where(i, "start_rank"), f"DP rank {r} is outside 0..{prof.dp - 1}"))
            else:
                ranks[r] = i
    if cluster.nodes[0].start_rank != 0:
        problems.append((cluster.where(0, "start_rank"), "node 0 must own DP rank 0"))
    return problems


def cpu_binding(prof: VllmAscendProfile, cluster: Cluster, node: Node, facts: dict) -> tuple[dict, list[str]]:
    """``additional_config.enable_cpu_binding`` needs at least 5 CPUs per NPU and
    a CPU affinity for every NPU; A3 slices CPUs globally, A2 follows the
    topology affinity (vllm-ascend cpu_binding.md)."""
    if not (prof.additional_config or {}).get("enable_cpu_binding"):
        return {"kind": "none", "reason": "enable_cpu_binding is off"}, []
    cpu_nodes = sorted({int(n) for n in (facts.get("cpu_nodes") or {}).values()})
    cpus = facts.get("cpus") or 0
    devices = node.devices or 1
    per = cpus // devices
    problems = []
    if per < MIN_CPUS_PER_NPU:
        problems.append(
            f"enable_cpu_binding needs >= {MIN_CPUS_PER_NPU} CPUs per NPU: {cpus} CPUs for {devices} NPUs is {per} "
            "(vllm-ascend would log 'Insufficient CPUs for binding'; set additional_config.enable_cpu_binding=False)"
        )
    missing = [str(d["id"]) for d in facts.get("devices", []) if not d.get("cpu_affinity")]
    if cluster.platform == "a2" and missing:
        problems.append(f"NPU topo affinity not found for NPU {','.join(missing)} (npu-smi info -t topo)")
    mode = "global-slice" if cluster.platform == "a3" else "topo-affinity"
    return {"kind": "vllm-ascend-cpu-binding", "mode": mode, "cpus_per_npu": per, "numa_nodes": cpu_nodes}, problems
