"""The trtllm-serve profiles of seed 000 (TensorRT LLM on Blackwell):
inventory modules call these and override what their cluster needs."""

from __future__ import annotations

from typing import Any

from llmdeploy.inventory import image  # noqa: F401 (inventories take it from here with the image names)

from .profile import TrtllmProfile

IMAGE_TRTLLM = "nvcr.io/nvidia/tensorrt-llm/release:1.4.0rc1"


def trtllm_qwen38_fp8(config: str = "qwen3.8-low-latency.yaml", **overrides) -> TrtllmProfile:
    """Qwen3.8-2.4T-A95B FP8 at TP16 (16 GPUs minimum) with one of the curated
    profiles: qwen3.8-low-latency.yaml, qwen3.8-low-latency-mtp3.yaml (EP1),
    qwen3.8-high-throughput.yaml, qwen3.8-high-throughput-mtp3.yaml (attention
    DP, EP = TP; the guide measured them at tp=32 on 32 GPUs; ``eplb_map=``
    for its 544-slot static placement, which is for EP32: tp=32)."""
    values: dict[str, Any] = dict(served_model_name="Qwen/Qwen3.8-2.4T-A95B-FP8", tp=16, config=config)
    values.update(overrides)
    # ep: unset is the guide's (TrtllmProfile: EP1 low latency, EP = TP high throughput)
    return TrtllmProfile(**values)


def trtllm_qwen35_nvfp4(**overrides) -> TrtllmProfile:
    """Qwen3.5-397B-A17B NVFP4 at TP4 (general deployment, qwen3.5.yaml)."""
    # the guide gives TP4 only: EP stays the curated file's (profile.ep sets it)
    values: dict[str, Any] = dict(served_model_name="nvidia/Qwen3.5-397B-A17B-NVFP4", tp=4, config="qwen3.5.yaml")
    values.update(overrides)
    return TrtllmProfile(**values)
