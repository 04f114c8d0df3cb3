"""Serving profiles with the values of the seed guides (``shared/seeds``).

Inventory modules call these and override what their cluster needs; every
flag and variable of the guides lives here once.
"""

from __future__ import annotations

from .inventory import DynamoProfile, Image, TrtllmProfile, VllmAscendProfile

# vLLM-Ascend 0.23.0, Qwen3.8-2.4T-A95B (seed 001)
IMAGE_A3 = "quay.io/ascend/vllm-ascend:qwen3.8-a3"
IMAGE_A2 = "quay.io/ascend/vllm-ascend:v0.23.0"
# TensorRT LLM (seed 000)
IMAGE_TRTLLM = "nvcr.io/nvidia/tensorrt-llm/release:1.4.0rc1"
IMAGE_DYNAMO = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0a0.dev202610151219"

_VLLM_COMMON = dict(
    served_model_name="qwen3.8",
    dp_local=1,
    quantization="ascend",
    safetensors_load_strategy="lazy",
    trust_remote_code=True,
    enable_prefix_caching=True,
    enable_expert_parallel=True,
    max_num_seqs=8,
    speculative_config={"method": "qwen3_5_mtp", "num_speculative_tokens": 1},
    compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"},
    additional_config={"enable_cpu_binding": True, "enable_fused_mc2": 1},
)


def a3_env() -> dict[str, str]:
    """The A3 block of seed 001, in its order, without the per-node values."""
    return {
        "HCCL_BUFFSIZE_EP": "2048",
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3000",
        "HCCL_BUFFSIZE": "1024",
        "HCCL_INTRA_ROCE_ENABLE": "0",
        "HCCL_OP_EXPANSION_MODE": "AIV",
        "ASCEND_RT_VISIBLE_DEVICES": ",".join(str(i) for i in range(16)),
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
        "OPENBLAS_NUM_THREADS": "1",
    }


def a2_env() -> dict[str, str]:
    """The A2 block of seed 001, in its order, without the per-node values."""
    return {
        "VLLM_ENGINE_READY_TIMEOUT_S": "7200",
        "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3000",
        "HCCL_BUFFSIZE": "1024",
        "HCCL_BUFFSIZE_EP": "2048",
        "HCCL_CONNECT_TIMEOUT": "1800",
        "HCCL_EXEC_TIMEOUT": "1800",
        "HCCL_INTRA_PCIE_ENABLE": "1",
        "HCCL_INTRA_ROCE_ENABLE": "0",
        "HCCL_OP_EXPANSION_MODE": "AIV",
        "ASCEND_RT_VISIBLE_DEVICES": ",".join(str(i) for i in range(8)),
        "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",
        "TASK_QUEUE_ENABLE": "1",
        "OMP_PROC_BIND": "false",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
    }


def vllm_a3_w8a8(**overrides) -> VllmAscendProfile:
    """4 x Atlas 800 A3, W8A8, DP4/TP16/EP64."""
    values = dict(
        _VLLM_COMMON,
        dp=4, tp=16, ep=64,
        max_model_len=131072,
        max_num_batched_tokens=16384,
        gpu_memory_utilization=0.85,
        env=a3_env(),
        ifname_env=["HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"],
    )
    values.update(overrides)
    return VllmAscendProfile(**values)


def vllm_a2_w4a8(**overrides) -> VllmAscendProfile:
    """8 x Atlas 800 A2, W4A8, DP8/TP8/EP64, 262144 context."""
    values = dict(
        _VLLM_COMMON,
        dp=8, tp=8, ep=64,
        max_model_len=262144,
        max_num_batched_tokens=4096,
        gpu_memory_utilization=0.92,
        env=a2_env(),
        ifname_env=["HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"],
    )
    values.update(overrides)
    return VllmAscendProfile(**values)


def trtllm_qwen38_fp8(config: str = "qwen3.8-low-latency.yaml", **overrides) -> TrtllmProfile:
    """Qwen3.8-2.4T-A95B FP8 at TP16 (16 GPUs minimum) with one of the curated
    profiles: qwen3.8-low-latency.yaml, qwen3.8-low-latency-mtp3.yaml (EP1),
    qwen3.8-high-throughput.yaml, qwen3.8-high-throughput-mtp3.yaml (attention
    DP, EP = TP; the guide measured them at tp=32 on 32 GPUs; ``eplb_map=``
    for its 544-slot static placement, which is for EP32: tp=32)."""
    values = dict(served_model_name="Qwen/Qwen3.8-2.4T-A95B-FP8", tp=16, config=config)
    values.update(overrides)
    # ep: unset is the guide's (TrtllmProfile: EP1 low latency, EP = TP high throughput)
    return TrtllmProfile(**values)


def trtllm_qwen35_nvfp4(**overrides) -> TrtllmProfile:
    """Qwen3.5-397B-A17B NVFP4 at TP4 (general deployment, qwen3.5.yaml)."""
    # the guide gives TP4 only: EP stays the curated file's (profile.ep sets it)
    values = dict(served_model_name="nvidia/Qwen3.5-397B-A17B-NVFP4", tp=4, config="qwen3.5.yaml")
    values.update(overrides)
    return TrtllmProfile(**values)


def dynamo_gb300(topology: str = "1P1D-B8", *, recipes_dir: str, **overrides) -> DynamoProfile:
    """Qwen3.5 GB300 NVL72 agentic disaggregated serving on Dynamo in one of
    the seed's topologies (``DYNAMO_TOPOLOGIES``): 1P1D-B8 and 1P1D-B4 on one
    four-GPU node (prefill P1 on GPU 0, decode D2 on GPUs 1,2), 1P2D (5 nodes),
    1P4D-B1 and 1P4D-B4 (9), 2P3D (8), 3P1D (7), 3P2D (5). ``recipes_dir`` is
    the TensorRT-LLM checkout on every node (mounted at /opt/trtllm-recipes);
    the workers are placed from the topology (roles.dynamo.placement)."""
    values = dict(
        served_model_name="nvidia/Qwen3.5-397B-A17B-NVFP4-V2",
        namespace="qwen35-gb300",
        topology=topology,
        recipes_dir=recipes_dir,
        wheels=["ai-dynamo==1.6.0.dev20261010", "ai-dynamo-runtime==1.6.0.dev20261010"],
        frontend_env={
            "ETCD_LEASE_TTL": "120",
            "DYN_TOKENIZER_CACHE": "1",
            "DYN_TOKENIZER_CACHE_BYTES": "8000000000",
            "DYN_TOKENIZER": "fastokens",
        },
    )
    values.update(overrides)
    return DynamoProfile(**values)


def image(ref: str, tarball: str | None = None) -> Image:
    return Image(ref=ref, tarball=tarball)
