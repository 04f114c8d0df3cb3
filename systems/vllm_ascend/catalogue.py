"""The vLLM-Ascend profiles of seed 001 (vLLM-Ascend 0.23.0, Qwen3.8-2.4T-A95B):
inventory modules call these and override what their cluster needs; every
flag and variable of the guide lives here once."""

from __future__ import annotations

from typing import Any

from llmdeploy.inventory import image  # noqa: F401 (inventories take it from here with the image names)

from .profile import VllmAscendProfile

IMAGE_A3 = "quay.io/ascend/vllm-ascend:qwen3.8-a3"
IMAGE_A2 = "quay.io/ascend/vllm-ascend:v0.23.0"

_VLLM_COMMON: dict[str, Any] = dict(
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
    values: dict[str, Any] = dict(
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
    values: dict[str, Any] = dict(
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
