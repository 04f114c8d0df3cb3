"""The SGLang profile: ``python3 -m sglang.launch_server`` on every node, one
distributed world (``--nnodes N --node-rank i --dist-init-addr <node 0>:PORT``)
with the HTTP server on node rank 0, and the checks of a cluster it runs on.

Sources: SGLang's docs/references/multi_node_deployment/multi_node.md (the
command, node 0's IP for every node), benchmark/deepseek_v3/README.md (two
H200 x 8 nodes in Docker: ``--gpus all --network host --ipc=host --shm-size
32g``; GLOO_SOCKET_IFNAME when the world does not form) and
python/sglang/srt/server_args.py (its option names and checks)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from llmdeploy.inventory import Cluster, Node
from llmdeploy.schema import Port, SafePath, env_name_list, env_values_one_line, safe_path
from llmdeploy.serving import ServingProfile
from systems.common import NcclEnvironment

KIND = "sglang"


class SglangProfile(NcclEnvironment, ServingProfile):
    """One SGLang world across the nodes: TP ranks split evenly over them."""

    kind: Literal["sglang"] = "sglang"
    served_model_name: str = Field(pattern=r"^[A-Za-z0-9._/-]+$")
    # --tp (tp_size): every node runs tp / nodes ranks, one per GPU
    tp: int = Field(ge=1)
    # --ep (ep_size), for MoE models; None leaves SGLang's default (1)
    ep: int | None = Field(default=None, ge=1)
    # --enable-dp-attention --dp N: data-parallel attention (the only data
    # parallelism SGLang runs across nodes)
    enable_dp_attention: bool = False
    dp: int | None = Field(default=None, ge=1)
    trust_remote_code: bool = False
    # --reasoning-parser: the chat's <think> part comes back as reasoning_content
    reasoning_parser: str | None = Field(default="qwen3", pattern=r"^[A-Za-z0-9._-]+$")
    host: str = Field(default="0.0.0.0", pattern=r"^[0-9.:]+$")
    # --port: node rank 0's API; the other nodes answer /health there (SGLang's dummy health server)
    port: Port = 30000
    # the port of --dist-init-addr on node 0: torch.distributed's store
    dist_port: Port = 20000
    # --dist-timeout (seconds); None: torch's default (10 minutes)
    dist_timeout_s: int | None = Field(default=None, ge=1)
    # --mem-fraction-static; None: SGLang's own choice
    mem_fraction_static: float | None = Field(default=None, gt=0, le=1)
    # --enable-metrics: /metrics with sglang:num_running_reqs, sglang:num_queue_reqs, ...
    enable_metrics: bool = True
    shm_size: str = Field(default="32g", pattern=r"^[0-9]+[bkmg]?$")
    # --privileged: RDMA (InfiniBand/RoCE) devices in the container, as SGLang's docs ask for
    privileged: bool = False
    # the ssh_config (a path on node 0) verify-comm's all_reduce_perf uses to reach the other nodes
    launch_ssh_config: SafePath | None = None
    # variables for every node (NCCL_IB_*, ...), after each node's own NIC
    env: dict[str, str] = Field(default_factory=dict)

    _check_path = field_validator("launch_ssh_config")(classmethod(lambda cls, v: v if v is None else safe_path(v)))

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        env_name_list(list(v))
        return env_values_one_line(v)

    def launch_ssh(self) -> str | None:
        return self.launch_ssh_config

    def ports(self) -> dict[str, int]:
        return {"port": self.port, "dist_port": self.dist_port}

    def node_ports(self, cluster: Cluster, node: Node) -> dict[int, str]:
        # every node binds --port (node rank 0 the API, the others the health server); node 0 the store too
        if node.name == cluster.node0.name:
            return super().node_ports(cluster, node)
        return {self.port: "profile.port"}

    def problems(self, cluster: Cluster) -> list[tuple[str, str]]:
        return cluster_problems(self, cluster)



def cluster_problems(prof: SglangProfile, cluster: Cluster) -> list[tuple[str, str]]:
    """SGLang's own checks (server_args.py) on this cluster: TP split evenly
    over the nodes, one rank per GPU, DP only with DP attention and dividing TP."""
    problems: list[tuple[str, str]] = []
    nodes = cluster.nodes
    if cluster.platform_info.vendor != "nvidia":
        problems.append(("profile.kind", f"{KIND} needs an NVIDIA platform here, not {cluster.platform}"))
    if prof.tp % len(nodes):
        problems.append(("profile.tp", f"TP {prof.tp} is not divisible by the {len(nodes)} nodes (SGLang: tp_size must be divisible by number of nodes)"))
    else:
        per = prof.tp // len(nodes)
        for i, n in enumerate(nodes):
            if per != n.devices:
                problems.append((cluster.where(i, "devices"), f"TP {prof.tp} over {len(nodes)} nodes is {per} ranks per node, but this node has {n.devices} GPUs"))
    if prof.dp not in (None, 1) and not prof.enable_dp_attention:
        problems.append(("profile.dp", "SGLang runs data parallelism across nodes only with DP attention: set enable_dp_attention"))
    if prof.enable_dp_attention and (prof.dp is None or prof.tp % prof.dp):
        problems.append(("profile.dp", f"DP attention needs dp dividing TP {prof.tp} (got {prof.dp})"))
    if prof.ep is not None and prof.tp % prof.ep:
        problems.append(("profile.ep", f"EP {prof.ep} must divide TP {prof.tp}"))
    return problems
