"""The Dynamo profile of seed 000 ("Qwen3.5 GB300 NVL72 Agentic Disaggregated
Serving"): inventory modules call it and override what their cluster needs."""

from __future__ import annotations

from typing import Any

from llmdeploy.inventory import image  # noqa: F401 (inventories take it from here with the image names)

from .profile import DynamoProfile

IMAGE_DYNAMO = "nvcr.io/nvidia/tensorrt-llm/release:1.3.0a0.dev202610151219"


def dynamo_gb300(topology: str = "1P1D-B8", *, recipes_dir: str, **overrides) -> DynamoProfile:
    """Qwen3.5 GB300 NVL72 agentic disaggregated serving on Dynamo in one of
    the seed's topologies (``DYNAMO_TOPOLOGIES``): 1P1D-B8 and 1P1D-B4 on one
    four-GPU node (prefill P1 on GPU 0, decode D2 on GPUs 1,2), 1P2D (5 nodes),
    1P4D-B1 and 1P4D-B4 (9), 2P3D (8), 3P1D (7), 3P2D (5). ``recipes_dir`` is
    the TensorRT-LLM checkout on every node (mounted at /opt/trtllm-recipes);
    the workers are placed from the topology (systems.dynamo.workers.placement)."""
    values: dict[str, Any] = dict(
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
