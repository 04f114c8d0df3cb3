"""SGLang profiles: Qwen3.8-2.4T-A95B FP8 on two Hopper nodes (16 GPUs, the
minimum the TensorRT LLM guide gives for the checkpoint, seed 000), served as
SGLang's multi-node docs run a model across two H200 x 8 nodes."""

from __future__ import annotations

from typing import Any

from llmdeploy.inventory import image  # noqa: F401 (inventories take it from here with the image names)

from .profile import SglangProfile

# docs.sglang.io, Installation: the CUDA 13 images; v0.5.21 (2026-10-01)
IMAGE_SGLANG = "lmsysorg/sglang:v0.5.21"


def sglang_qwen38_fp8(**overrides) -> SglangProfile:
    """TP16 across two 8-GPU nodes, EP16 for the MoE layers, Qwen3's reasoning parser."""
    values: dict[str, Any] = dict(served_model_name="Qwen/Qwen3.8-2.4T-A95B-FP8", tp=16, ep=16, trust_remote_code=True, reasoning_parser="qwen3")
    values.update(overrides)
    return SglangProfile(**values)
