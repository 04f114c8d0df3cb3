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
moe_expert_parallel_size: 16
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


def write(directory: str | Path) -> None:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for name, text in files().items():
        (d / name).write_text(text)
        os.chmod(d / name, 0o644)
