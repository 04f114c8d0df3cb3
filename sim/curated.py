"""The curated TensorRT-LLM LLM-API configurations "inside the image"
(``/app/tensorrt_llm/examples/configs/curated/`` on every simulated NVIDIA
host): what ``trtllm-serve --config`` reads. Plausible values, in the LLM
API's YAML keys, that the trtllm-serve stand-in checks like the real one.
"""

from __future__ import annotations

import os
from pathlib import Path

CURATED_DIR = "/app/tensorrt_llm/examples/configs/curated"

_QWEN38_HEAD = """\
# Qwen3.8-2.4T-A95B FP8 on 16 Blackwell GPUs (2 x 8 B200/B300, or 4 x 4 GB200/GB300)
# trtllm-serve <model> --config {name} --reasoning_parser qwen3_5 --tool_parser qwen3
"""

_LOW_LATENCY = """\
tensor_parallel_size: 16
moe_expert_parallel_size: 1
enable_attention_dp: false
max_batch_size: 32
max_num_tokens: 8192
max_seq_len: 262144
trust_remote_code: true
print_iter_log: false
stream_interval: 1
kv_cache_config:
  dtype: fp8
  free_gpu_memory_fraction: 0.8
  enable_block_reuse: true
cuda_graph_config:
  enable_padding: true
  max_batch_size: 32
moe_config:
  backend: TRTLLM
"""

_HIGH_THROUGHPUT = """\
tensor_parallel_size: 16
moe_expert_parallel_size: 16
enable_attention_dp: true
attention_dp_config:
  enable_balance: true
  batching_wait_iters: 0
  timeout_iters: 60
max_batch_size: 256
max_num_tokens: 16384
max_seq_len: 262144
trust_remote_code: true
print_iter_log: false
stream_interval: 10
kv_cache_config:
  dtype: fp8
  free_gpu_memory_fraction: 0.85
  enable_block_reuse: false
cuda_graph_config:
  enable_padding: true
  max_batch_size: 256
moe_config:
  backend: CUTLASS
"""

_MTP3 = """\
speculative_config:
  decoding_type: MTP
  max_draft_len: 3
  num_nextn_predict_layers: 3
"""

_QWEN35 = """\
# Qwen3.5-397B-A17B NVFP4 on 4 Blackwell GPUs (general deployment)
# trtllm-serve <model> --config qwen3.5.yaml --reasoning_parser qwen3_5 --tool_parser qwen3
tensor_parallel_size: 4
moe_expert_parallel_size: 4
enable_attention_dp: false
max_batch_size: 64
max_num_tokens: 8192
max_seq_len: 262144
trust_remote_code: true
stream_interval: 2
kv_cache_config:
  dtype: fp8
  free_gpu_memory_fraction: 0.85
  enable_block_reuse: true
cuda_graph_config:
  enable_padding: true
  max_batch_size: 64
moe_config:
  backend: TRTLLM
"""


def files() -> dict[str, str]:
    out = {}
    for name, body in (
        ("qwen3.8-low-latency.yaml", _LOW_LATENCY),
        ("qwen3.8-low-latency-mtp3.yaml", _LOW_LATENCY + _MTP3),
        ("qwen3.8-high-throughput.yaml", _HIGH_THROUGHPUT),
        ("qwen3.8-high-throughput-mtp3.yaml", _HIGH_THROUGHPUT + _MTP3),
    ):
        out[name] = _QWEN38_HEAD.format(name=name) + body
    out["qwen3.5.yaml"] = _QWEN35
    return out


# --- a TensorRT-LLM checkout ("recipes"): the Dynamo agentic base role files ---------------
# Seed 000, "Qwen3.5 GB300 NVL72 Agentic Disaggregated Serving": the files the
# guide adds under examples/configs/curated/ of the checkout (not in the older
# container). The colocated 1P1D profile: prefill P1, decode D2-B8.
RECIPES_CURATED = "examples/configs/curated"

_AGENTIC_PREFILL = """\
# Qwen3.5-397B-A17B-NVFP4-V2 on GB300 NVL72, agentic disaggregated serving: prefill (P1)
# python3 -m dynamo.trtllm --disaggregation-mode prefill --extra-engine-args qwen3.5-gb300-agentic-prefill.yaml --publish-metrics
tensor_parallel_size: 1
moe_expert_parallel_size: 1
pipeline_parallel_size: 1
enable_attention_dp: true
max_batch_size: 64
max_num_tokens: 8192
max_seq_len: 262144
trust_remote_code: true
enable_chunked_prefill: true
disable_overlap_scheduler: true
print_iter_log: false
enable_iter_perf_stats: true
iter_perf_stats_interval: 40
return_perf_metrics: false
kv_cache_config:
  dtype: fp8
  free_gpu_memory_fraction: 0.8
  enable_block_reuse: true
  use_kv_cache_manager_v2: true
  host_cache_size: 137438953472
  iteration_stats_interval: 40
  event_buffer_max_size: 0
cache_transceiver_config:
  backend: NIXL
  transceiver_runtime: PYTHON
  kv_cache_bounce_size_mb: 2048
moe_config:
  backend: CUTEDSL
torch_compile_config:
  enable_fullgraph: true
  enable_piecewise_cuda_graph: true
  capture_num_tokens: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
"""

_AGENTIC_DECODE = """\
# Qwen3.5-397B-A17B-NVFP4-V2 on GB300 NVL72, agentic disaggregated serving: decode (D2-B8, MTP6)
# python3 -m dynamo.trtllm --disaggregation-mode decode --extra-engine-args qwen3.5-gb300-agentic-decode.yaml --publish-metrics
tensor_parallel_size: 2
moe_expert_parallel_size: 2
pipeline_parallel_size: 1
enable_attention_dp: false
enable_lm_head_tp_in_adp: false
max_batch_size: 8
max_num_tokens: 56
max_seq_len: 262148
trust_remote_code: true
stream_interval: 20
print_iter_log: false
enable_iter_perf_stats: true
iter_perf_stats_interval: 40
return_perf_metrics: false
kv_cache_config:
  dtype: fp8
  free_gpu_memory_fraction: 0.85
  avg_seq_len: 102150
  enable_block_reuse: true
  use_kv_cache_manager_v2: true
  host_cache_size: 137438953472
  iteration_stats_interval: 40
  event_buffer_max_size: 0
cache_transceiver_config:
  backend: NIXL
  transceiver_runtime: PYTHON
  kv_cache_bounce_size_mb: 2048
cuda_graph_config:
  enable_padding: true
  batch_sizes: [1, 2, 4, 8]
scheduler_config:
  capacity_scheduler_policy: GUARANTEED_NO_EVICT
moe_config:
  backend: TRTLLM
  use_low_precision_moe_combine: true
speculative_config:
  decoding_type: MTP
  max_draft_len: 6
  num_nextn_predict_layers: 6
"""

_AGENTIC_ENV = """\
# Worker environment of the Qwen3.5 GB300 agentic profile (from the source
# sweep). Source it, then unset TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS:
# the sweep forced synthetic speculative acceptance, production must not.
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
export MIMALLOC_PURGE_DELAY=
export CUDA_DEVICE_MAX_CONNECTIONS=1
export TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS=6
"""


def recipes_files() -> dict[str, str]:
    """Path in the checkout -> text: the curated configs and the agentic ones."""
    out = {f"{RECIPES_CURATED}/{name}": text for name, text in files().items()}
    out[f"{RECIPES_CURATED}/qwen3.5-gb300-agentic-prefill.yaml"] = _AGENTIC_PREFILL
    out[f"{RECIPES_CURATED}/qwen3.5-gb300-agentic-decode.yaml"] = _AGENTIC_DECODE
    out[f"{RECIPES_CURATED}/qwen3.5-gb300-agentic.env"] = _AGENTIC_ENV
    return out


def write_recipes(directory: str | Path) -> None:
    """A TensorRT-LLM checkout at ``directory`` with the files of ``recipes_files``."""
    d = Path(directory)
    for rel, text in recipes_files().items():
        p = d / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        os.chmod(p, 0o644)
