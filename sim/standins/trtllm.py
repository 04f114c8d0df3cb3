"""A simulated ``trtllm-serve`` for one rank of an MPI world (TensorRT-LLM's
multi-node launch: ``mpirun ... trtllm-llmapi-launch trtllm-serve MODEL ...``).

Every rank of the world runs this program. The rank and world size come from
the launcher's environment, as TensorRT-LLM reads them: OpenMPI's
``OMPI_COMM_WORLD_RANK``/``OMPI_COMM_WORLD_SIZE``, else ``PMI_RANK``/``PMI_SIZE``,
else Slurm's ``SLURM_PROCID``/``SLURM_NTASKS``.

Rendezvous (how the ranks find rank 0 across simulated nodes, with nothing
passed by the tool that a real cluster would not have): OpenMPI 4.1 puts
``OMPI_MCA_orte_hnp_uri`` (``<jobfam>.0;tcp://<ip>[,<ip>...]:<port>``, the
address of ``mpirun``'s own daemon, restricted by ``oob_tcp_if_include``) and
``OMPI_MCA_ess_base_jobid`` (the application's job id, the same on every rank
and different for every ``mpirun``) into every rank's environment, on every
node. Rank 0 runs on mpirun's host (the hostfile lists node 0 first), so rank 0
listens on ``0.0.0.0:<rendezvous port>`` and every other rank connects to the
hnp addresses at that port; the port is derived from the job id
(``20000 + jobid % 10000``, skipping the HTTP port), so two worlds never meet.
Started by ``srun --mpi=pmix`` (no mpirun), rank 0 is on one of the step's
nodes (``SLURM_STEP_NODELIST``), which the other ranks try in turn (a real
rank asks PMIx where rank 0 is); the world's id is the job and step id.
A rank that cannot reach rank 0 within ``join_timeout_s`` fails the way an
NCCL bootstrap timeout does.

Rank 0 checks its arguments like the real server (model directory with
``config.json``, the ``--config`` YAML and its keys, parsers, and
``tensor_parallel_size * pipeline_parallel_size`` = the MPI world size), waits
until every other rank has joined, then serves the OpenAI API on
``--host:--port`` (``/health`` 200 while the whole world is up, 503 once a
rank is lost; ``/v1/models`` lists the model argument as given, or
``--served_model_name``; ``/v1/chat/completions`` with the reasoning parser's
``reasoning_content``, streaming too). A lost rank (or, on the other ranks, a
lost rank 0) makes the rank exit 1 after ``abort_after_s`` (an NCCL
watchdog), by which time the real ``mpirun`` has usually killed the world and
printed which rank died.

Rank 0's answers follow streaming.py (shared by the serving stand-ins): one
SSE chunk per token paced by node.json ``latency``, ``max_tokens``,
``ignore_eos``, ``usage``; ``max_batch_size`` (YAML, else ``--max_batch_size``)
is the batch limit beyond which requests queue. Its metrics are trtllm-serve's
(tensorrt_llm/serve/openai_server.py): ``GET /metrics`` is the JSON list of
iteration stats since the last call (``numActiveRequests``,
``numQueuedRequests``, ``kvCacheStats``...; ``[]`` while idle, and always
without ``enable_iter_perf_stats: true`` in the YAML); ``return_perf_metrics:
true`` adds ``GET /prometheus/metrics`` (``trtllm_num_requests_running``,
``trtllm_num_requests_waiting``, ``trtllm_kv_cache_utilization`` with
``enable_iter_perf_stats``; ``trtllm_request_success_total``,
``trtllm_prompt_tokens_total``, ``trtllm_generation_tokens_total``). SIGTERM
on rank 0 once it serves is uvicorn's graceful shutdown: the listening socket
closes (new connections are refused), the answers in flight finish, then the
process ends killed by SIGTERM, as uvicorn's ``capture_signals`` re-raises it.

Every rank checks its interface variables against its own host's interfaces
(``/sys/class/net``) as NCCL and Gloo do (``nccl_interfaces``, ``gloo_missing``):
an ``NCCL_SOCKET_IFNAME`` that matches no running interface fails the rank with
NCCL's ``Bootstrap : no socket interface found``, a ``GLOO_SOCKET_IFNAME``
naming no interface with Gloo's ``Unable to find address for: <name>``; every
rank logs its variables and the interfaces NCCL picks (``ifname_line``).

Faults come from the host's node.json ``trtllm`` entry:
``crash_starts`` (this host's ranks crash on their first N world starts, with
a CUDA out-of-memory line; starts are counted per world in
``<state>/trtllm-starts``; delete it to start counting again),
``crash_message`` (the line printed instead), ``slow_rank0_s`` (rank 0 loads
for that long after every rank joined, before it serves), ``join_timeout_s``
(default 600) and ``abort_after_s`` (default 5).
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path

from llmdeploy.hostlist import expand as expand_hostlist

from . import nccl, streaming
from .nccl import NCCL_INVALID_USAGE

STATE_DIR = os.environ.get("LLMDEPLOY_SIM_STATE", "/etc/llmdeploy-sim")

REASONING_PARSERS = ("deepseek-r1", "qwen3", "qwen3_5", "nano-v3", "gpt_oss")
TOOL_PARSERS = ("qwen3", "qwen3_coder", "kimi_k2", "deepseekv3", "deepseekv31", "deepseekv32", "glm4", "gpt_oss")
# top-level keys of TensorRT-LLM's LLM API (TorchLlmArgs): others are refused (pydantic extra=forbid)
LLM_API_KEYS = frozenset("""
model tokenizer tokenizer_mode skip_tokenizer_init trust_remote_code tensor_parallel_size dtype revision
tokenizer_revision pipeline_parallel_size context_parallel_size gpus_per_node moe_cluster_parallel_size
moe_tensor_parallel_size moe_expert_parallel_size enable_attention_dp attention_dp_config cp_config
load_format fail_fast_on_attention_window_too_large enable_lora lora_config kv_cache_config
enable_chunked_prefill guided_decoding_backend batched_logits_processor iter_stats_max_iterations
request_stats_max_iterations peft_cache_config scheduler_config cache_transceiver_config speculative_config
max_batch_size max_input_len max_seq_len max_beam_width max_num_tokens gather_generation_logits
num_postprocess_workers postprocess_tokenizer_dir reasoning_parser decoding_config mpi_session
otlp_traces_endpoint backend return_perf_metrics orchestrator_type build_config quant_config
garbage_collection_gen0_threshold cuda_graph_config disable_overlap_scheduler moe_config attn_backend
sampler_type enable_iter_perf_stats enable_iter_req_stats print_iter_log torch_compile_config
enable_autotuner enable_layerwise_nvtx_marker enable_min_latency stream_interval force_dynamic_quantization
allreduce_strategy checkpoint_loader checkpoint_format kv_connector_config mm_encoder_only enable_sleep
disable_flashinfer_sampling max_stats_len batch_wait_timeout_ms batch_wait_timeout_iters
batch_wait_max_tokens_ratio sparse_attention_config use_cuda_graph enable_chunked_context
""".split())
DECODING_TYPES = ("MTP", "Eagle", "Eagle3", "NGram", "Medusa", "Lookahead", "DraftTarget", "UserProvided", "AUTO")
MOE_BACKENDS = ("CUTLASS", "TRTLLM", "WIDEEP", "DEEPGEMM", "CUTEDSL", "TRITON", "VANILLA", "AUTO")


# --- pure parts ------------------------------------------------------------------------
def world_of(env) -> tuple[int, int, int, int]:
    """(rank, size, local rank, local size) from the launcher's environment."""
    def first(*keys, default):
        for k in keys:
            v = env.get(k)
            if v not in (None, ""):
                return int(v)
        return default

    rank = first("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID", default=0)
    size = first("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS", default=1)
    local_rank = first("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID", default=rank)
    local_size = first("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", default=None)
    if local_size is None:
        local_size = slurm_local_size(env) or first("SLURM_NTASKS_PER_NODE", default=size)
    return rank, size, local_rank, local_size


def slurm_local_size(env) -> int | None:
    """The tasks of a Slurm step on this node: its entry (``SLURM_NODEID``)
    in ``SLURM_STEP_TASKS_PER_NODE`` (Slurm's ``8(x2)``, ``2,1`` or
    ``4(x2),2``, in the step's node order), set whatever the distribution
    (``--ntasks-per-node`` alone sets SLURM_NTASKS_PER_NODE); None outside a step."""
    text, node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE"), env.get("SLURM_NODEID")
    if not text or node in (None, ""):
        return None
    counts: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return None
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    i = int(node)
    return counts[i] if 0 <= i < len(counts) else None


def parse_hnp_uri(uri: str) -> tuple[str, list[str]]:
    """``'3425566720.0;tcp://198.19.20.10,10.0.0.1:41234;tcp6://[::1]:41235'`` ->
    (``'3425566720'``, ``['198.19.20.10', '10.0.0.1']``): the job family and the IPv4 addresses."""
    parts = uri.split(";")
    jobfam = parts[0].split(".", 1)[0] if parts and parts[0] else ""
    addrs: list[str] = []
    for p in parts[1:]:
        if p.startswith("tcp://"):
            hosts = p[len("tcp://"):].rsplit(":", 1)[0]
            addrs += [h for h in hosts.split(",") if h]
    return jobfam, addrs


def rendezvous_port(world: str, avoid: int | None = None) -> int:
    n = int(world) if world.isdigit() else sum(world.encode()) * 7919
    port = 20000 + n % 10000
    return port + 1 if port == avoid else port


def one_rank_world(env) -> dict:
    """A world of one rank (no rank 0 to meet): the launch's own id under
    mpirun, else one of this start's own (a container's pid and mpirun's job
    id repeat at every start)."""
    one = rendezvous_of(env)
    return {"world": one["world"] if one else f"{os.getpid()}.{time.time_ns()}", "addrs": [], "port": 0}


def rendezvous_of(env, avoid_port: int | None = None) -> dict | None:
    """Where rank 0 listens and the world's id, from the launcher's environment:
    {"world": id, "addrs": [ip...], "port": p}, or None if the launcher says nothing."""
    uri = env.get("OMPI_MCA_orte_hnp_uri")
    if uri:
        jobfam, addrs = parse_hnp_uri(uri)
        world = env.get("OMPI_MCA_ess_base_jobid") or jobfam
        if world:
            # OpenMPI derives the job family from mpirun's host name and pid,
            # which in a container are the same at every start (mpirun is
            # always the same pid of the container's pid namespace): the
            # ports mpirun listens on (in the URI) tell one launch from another
            import zlib

            world = f"{world}.{zlib.crc32(uri.encode()):08x}"
        if addrs and world:
            return {"world": world, "addrs": addrs, "port": rendezvous_port(world, avoid_port)}
    nodes = expand_hostlist(env.get("SLURM_STEP_NODELIST") or "")
    if nodes and env.get("SLURM_JOB_ID"):
        # a step srun started (``srun --mpi=pmix``: no mpirun, no hnp): task 0
        # runs on whichever of the step's nodes the distribution put it
        # (--distribution=arbitrary: the --nodelist's first; block: Slurm's
        # first), which a real rank learns from PMIx; the stand-in has no
        # PMIx client: the other ranks try each node at the rendezvous port,
        # where only rank 0 listens
        world = f"{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
        return {"world": world, "addrs": [resolve(n) for n in nodes], "port": rendezvous_port(world, avoid_port)}
    return None


def resolve(host: str) -> str:
    """A node's address by its name (the host's /etc/hosts, which enroot mounts into its containers); the name if it has none."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return host


class UsageError(Exception):
    """A click usage error: exit 2 with the usage line."""


_OPTIONS = {
    # name: (dest, type) ; type None = flag
    "--tokenizer": ("tokenizer", str), "--host": ("host", str), "--port": ("port", int),
    "--backend": ("backend", str), "--log_level": ("log_level", str), "--max_beam_width": ("max_beam_width", int),
    "--max_batch_size": ("max_batch_size", int), "--max_num_tokens": ("max_num_tokens", int),
    "--max_seq_len": ("max_seq_len", int), "--tp_size": ("tp_size", int), "--pp_size": ("pp_size", int),
    "--ep_size": ("ep_size", int), "--cluster_size": ("cluster_size", int), "--gpus_per_node": ("gpus_per_node", int),
    "--kv_cache_free_gpu_memory_fraction": ("kv_cache_free_gpu_memory_fraction", float),
    "--num_postprocess_workers": ("num_postprocess_workers", int), "--trust_remote_code": ("trust_remote_code", None),
    "--config": ("config", str), "--extra_llm_api_options": ("config", str),
    "--reasoning_parser": ("reasoning_parser", str), "--tool_parser": ("tool_parser", str),
    "--metadata_server_config_file": ("metadata_server_config_file", str), "--server_role": ("server_role", str),
    "--fail_fast_on_attention_window_too_large": ("fail_fast", None), "--served_model_name": ("served_model_name", str),
    "--chat_template": ("chat_template", str), "--otlp_traces_endpoint": ("otlp_traces_endpoint", str),
    "--disagg_cluster_uri": ("disagg_cluster_uri", str), "--enable_chunked_prefill": ("enable_chunked_prefill", None),
}
_CHOICES = {"backend": ("pytorch", "tensorrt", "trt", "_autodeploy"), "reasoning_parser": REASONING_PARSERS,
            "tool_parser": TOOL_PARSERS, "log_level": ("internal_error", "error", "warning", "info", "verbose", "debug", "trace")}


def parse_args(argv: list[str]) -> dict:
    """trtllm-serve's options (click: ``--opt value`` or ``--opt=value``); raises UsageError."""
    a: dict = {"model": None, "host": "localhost", "port": 8000, "backend": "pytorch", "tp_size": 1, "pp_size": 1,
               "ep_size": None, "config": None, "reasoning_parser": None, "tool_parser": None, "served_model_name": None,
               "trust_remote_code": False}
    rest = list(argv[1:] if argv[:1] == ["serve"] else argv)
    i = 0
    while i < len(rest):
        x = rest[i]
        if x.startswith("--"):
            name, eq, value = x.partition("=")
            if name not in _OPTIONS:
                raise UsageError(f"No such option: {name}")
            dest, typ = _OPTIONS[name]
            if typ is None:
                a[dest] = True
                i += 1
                continue
            if not eq:
                if i + 1 >= len(rest):
                    raise UsageError(f"Option '{name}' requires an argument.")
                value = rest[i + 1]
                i += 1
            try:
                a[dest] = typ(value)
            except ValueError:
                kind = {int: "integer", float: "float"}[typ]
                raise UsageError(f"Invalid value for '{name}': '{value}' is not a valid {kind}.") from None
            choices = _CHOICES.get(dest)
            if choices and a[dest] not in choices:
                raise UsageError(f"Invalid value for '{name}': '{value}' is not one of " + ", ".join(f"'{c}'" for c in choices) + ".")
            i += 1
            continue
        if a["model"] is not None:
            raise UsageError(f"Got unexpected extra argument ({x})")
        a["model"] = x
        i += 1
    if a["model"] is None:
        raise UsageError("Missing argument 'MODEL'.")
    return a


def check_llm_config(cfg, world_size: int, tp_cli: int = 1, pp_cli: int = 1) -> str | None:
    """What TensorRT-LLM says about an LLM-API YAML (parsed) for this world, or None."""
    if not isinstance(cfg, dict):
        return f"ValueError: the LLM API options file must hold a mapping, not {type(cfg).__name__}"
    extra = sorted(k for k in cfg if k not in LLM_API_KEYS)
    if extra:
        lines = [f"pydantic_core._pydantic_core.ValidationError: {len(extra)} validation error{'s' if len(extra) > 1 else ''} for TorchLlmArgs"]
        for k in extra:
            lines += [k, f"  Extra inputs are not permitted [type=extra_forbidden, input_value={cfg[k]!r}, input_type={type(cfg[k]).__name__}]"]
        return "\n".join(lines)
    tp = cfg.get("tensor_parallel_size", tp_cli)
    pp = cfg.get("pipeline_parallel_size", pp_cli)
    if not isinstance(tp, int) or not isinstance(pp, int) or tp < 1 or pp < 1:
        return f"ValueError: tensor_parallel_size ({tp!r}) and pipeline_parallel_size ({pp!r}) must be positive integers"
    if tp * pp != world_size:
        return (f"RuntimeError: tp_size * pp_size = {tp} * {pp} = {tp * pp} does not match the MPI world size {world_size}: "
                "trtllm-llmapi-launch needs one MPI rank per GPU of the parallel mapping")
    ep = cfg.get("moe_expert_parallel_size")
    mtp = cfg.get("moe_tensor_parallel_size")
    if ep is not None and (not isinstance(ep, int) or ep < 1 or tp % ep):
        return f"ValueError: moe_expert_parallel_size ({ep}) must divide tensor_parallel_size ({tp})"
    if ep is not None and mtp is not None and ep * mtp != tp:
        return f"ValueError: moe_tp_size ({mtp}) * moe_ep_size ({ep}) must equal tp_size ({tp})"
    kv = cfg.get("kv_cache_config") or {}
    frac = kv.get("free_gpu_memory_fraction") if isinstance(kv, dict) else None
    if frac is not None and not (isinstance(frac, (int, float)) and 0 < frac <= 1):
        return f"ValueError: kv_cache_config.free_gpu_memory_fraction must be in (0, 1], got {frac!r}"
    spec = cfg.get("speculative_config")
    if spec is not None:
        if not isinstance(spec, dict) or spec.get("decoding_type") not in DECODING_TYPES:
            dt = spec.get("decoding_type") if isinstance(spec, dict) else spec
            return f"ValueError: speculative_config.decoding_type {dt!r} is not one of {', '.join(DECODING_TYPES)}"
        mdl = spec.get("max_draft_len", spec.get("num_nextn_predict_layers", 1))
        if not isinstance(mdl, int) or mdl < 1:
            return f"ValueError: speculative_config.max_draft_len must be a positive integer, got {mdl!r}"
    moe = cfg.get("moe_config")
    if isinstance(moe, dict) and moe.get("backend") is not None and moe["backend"] not in MOE_BACKENDS:
        return f"ValueError: moe_config.backend {moe['backend']!r} is not one of {', '.join(MOE_BACKENDS)}"
    return None


def split_reasoning(text: str) -> tuple[str | None, str]:
    """The qwen3 / qwen3_5 reasoning parser: (reasoning, content). Qwen3.5's
    template opens ``<think>`` in the prompt, so the output may lack it."""
    if "</think>" not in text:
        return None, text
    head, _, tail = text.partition("</think>")
    return head.replace("<think>", "", 1).strip("\n"), tail.lstrip("\n")


# --- runtime --------------------------------------------------------------------------
def _now() -> str:
    return time.strftime("%m/%d/%Y-%H:%M:%S")


class Log:
    def __init__(self, rank: int):
        self.rank = rank

    def __call__(self, msg: str, level: str = "I") -> None:
        print(f"[{_now()}] [TRT-LLM] [RANK {self.rank}] [{level}] {msg}", flush=True)


def _faults() -> dict:
    try:
        return json.loads((Path(STATE_DIR) / "node.json").read_text()).get("trtllm") or {}
    except (OSError, ValueError):
        return {}


def _gpus() -> int | None:
    try:
        return len(json.loads((Path(STATE_DIR) / "node.json").read_text()).get("gpus") or [])
    except (OSError, ValueError):
        return None


def count_world_start(world: str, counter: str = "trtllm-starts") -> int:
    """How many worlds have started on this host, this one included (every
    rank of the host calls this; the first one of a world counts it). The
    count lives in ``<state>/<counter>``."""
    import fcntl

    d = Path(STATE_DIR)
    with open(d / f"{counter}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        p = d / counter
        try:
            data = json.loads(p.read_text())
            if isinstance(data, int):
                data = {"count": data, "worlds": {}}
        except (OSError, ValueError):
            data = {"count": 0, "worlds": {}}
        if world not in data["worlds"]:
            data["count"] += 1
            data["worlds"][world] = data["count"]
            data["worlds"] = dict(list(data["worlds"].items())[-32:])
            tmp = p.with_name(p.name + f".{os.getpid()}")
            tmp.write_text(json.dumps(data))
            tmp.replace(p)
        return data["worlds"][world]


def _image_version() -> str | None:
    """TensorRT-LLM's version in this container's image (its dist-info)."""
    import importlib.metadata as md

    try:
        return md.version("tensorrt-llm")
    except md.PackageNotFoundError:
        return None


def _container_has_gpus() -> bool:
    """Whether this container was started with GPUs: Docker's ``--gpus`` sets
    ``NVIDIA_VISIBLE_DEVICES`` in the container's process environment (moby
    daemon/nvidia_linux.go, ``setNvidiaGPUs``). Processes that ``docker exec``
    starts (the ranks' orted) do not inherit it: the container's first
    process (pid 1 of its pid namespace) has it."""
    if os.environ.get("NVIDIA_VISIBLE_DEVICES"):
        return os.environ["NVIDIA_VISIBLE_DEVICES"] not in ("void", "none")
    try:
        with open("/proc/1/environ", "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
    except OSError:
        return False
    return env.get(b"NVIDIA_VISIBLE_DEVICES", b"void") not in (b"void", b"none", b"")


# --- the network interfaces NCCL and Gloo pick (pure, stdlib only) ----------------------------------
# NCCL (github.com/NVIDIA/nccl): src/misc/socket.cc ncclFindInterfaces reads NCCL_SOCKET_IFNAME when it is
# longer than one character; src/os/linux.cc ncclOsFindInterfaces strips a leading '^' (exclude), then a
# leading '=' (exact), splits the rest at ',' into "prefix[:port]" entries (src/misc/utils.cc
# parseStringList: empty entries dropped) and keeps each running interface for which matchIfList (prefix,
# or whole name with '=', an empty list matching everything) differs from '^'. None found:
# src/bootstrap.cc "Bootstrap : no socket interface found" (ncclInvalidUsage),
# src/transport/net_socket.cc "NET/Socket : no interface found".
# Gloo through PyTorch: torch/csrc/distributed/c10d/init.cpp splits GLOO_SOCKET_IFNAME (longer than one
# character) at ',' and creates a device per name; gloo/transport/tcp/device.cc lookupAddrForIface wants an
# interface of exactly that name, else "Unable to find address for: <name>".


def nccl_interfaces(spec: str | None, names: list[str]) -> list[str] | None:
    """The interfaces of ``names`` NCCL uses for ``NCCL_SOCKET_IFNAME=spec``;
    None when NCCL ignores the variable (unset, or one character) and picks one itself."""
    if spec is None or len(spec) <= 1:
        return None
    return [n for n in names if nccl.match(n, spec)]


def gloo_missing(spec: str | None, names: list[str]) -> list[str]:
    """The names of ``GLOO_SOCKET_IFNAME=spec`` that are no interface of ``names`` (Gloo fails on the first)."""
    if spec is None or len(spec) <= 1:
        return []
    return [i for i in spec.split(",") if i not in names]


def host_interfaces(net: str = "/sys/class/net") -> tuple[list[str], list[str]]:
    """(every interface of this host, for Gloo's exact names; those NCCL can
    use: running, with an IPv4 address, as ``nccl.local_interfaces`` reads them)."""
    try:
        names = sorted(os.listdir(net))
    except OSError:
        return [], []
    usable = {n for n, _ in nccl.local_interfaces()}
    return names, [n for n in names if n in usable]


def ifname_error(env, host: str, pid: int, local_rank: int, names: list[str], running: list[str]) -> str | None:
    """What a rank prints when its interface variables name no interface of its host, as NCCL and Gloo say it; None if fine."""
    want = env.get("NCCL_SOCKET_IFNAME")
    found = nccl_interfaces(want, running)
    prefix = f"{host}:{pid}:{pid} [{local_rank}]"
    if found == []:
        return (f"{prefix} NCCL INFO NCCL_SOCKET_IFNAME set by environment to {want}\n"
                f"{prefix} bootstrap.cc:126 NCCL WARN Bootstrap : no socket interface found\n"
                f"RuntimeError: NCCL error in: /src/tensorrt_llm/cpp/tensorrt_llm/runtime/ncclCommunicator.cpp:65, {NCCL_INVALID_USAGE}")
    missing = gloo_missing(env.get("GLOO_SOCKET_IFNAME"), names)
    if missing:
        return ("RuntimeError: [enforce fail at /opt/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/device.cc:83] "
                f"ifa != nullptr. Unable to find address for: {missing[0]}")
    return None


def ifname_line(env, rank: int, size: int, host: str, running: list[str]) -> str:
    """The rank's interface variables and what NCCL picks from them (tests read every rank's line)."""
    want = env.get("NCCL_SOCKET_IFNAME")
    found = nccl_interfaces(want, running)
    picked = ",".join(found) if found is not None else "auto"
    return (f"rank {rank} of {size} on {host}: network interfaces NCCL_SOCKET_IFNAME={want or ''} (NCCL uses {picked}), "
            f"GLOO_SOCKET_IFNAME={env.get('GLOO_SOCKET_IFNAME') or ''}")


def _nccl_ifname_error() -> str | None:
    """ifname_error for this process (also the Dynamo worker stand-in's)."""
    _, _, local_rank, _ = world_of(os.environ)
    names, running = host_interfaces()
    if not names:
        return None
    return ifname_error(os.environ, os.uname().nodename, os.getpid(), local_rank, names, running)


def main(argv: list[str]) -> int:
    env = os.environ
    rank, size, local_rank, local_size = world_of(env)
    log = Log(rank)
    version = _image_version()
    if version is None:
        print("sh: 1: trtllm-serve: not found", file=sys.stderr, flush=True)
        return 127
    try:
        a = parse_args(argv)
    except UsageError as exc:
        print(f"Usage: trtllm-serve serve [OPTIONS] MODEL\nTry 'trtllm-serve serve --help' for help.\n\nError: {exc}", file=sys.stderr, flush=True)
        return 2
    host = os.uname().nodename
    print(f"[TensorRT-LLM] TensorRT-LLM version: {version} (simulated), rank {rank} of {size} on {host}", flush=True)
    if size > 1 and env.get("TLLM_SPAWN_PROXY_PROCESS") != "1":
        log("trtllm-serve runs in an MPI world of more than one rank without trtllm-llmapi-launch: "
            "every rank would start its own server; start it as `mpirun ... trtllm-llmapi-launch trtllm-serve ...`", "E")
        return 1
    if not _container_has_gpus():
        print("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver "
              "from http://www.nvidia.com/Download/index.aspx", flush=True)
        return 1
    gpus = _gpus()
    if gpus is not None and local_size > gpus:
        log(f"Only {gpus} GPUs are available on {host}, but {local_size} ranks of the world run there", "E")
        return 1
    if not Path(a["model"], "config.json").is_file():
        print(f"OSError: {a['model']} does not appear to have a file named config.json. "
              f"Checkout 'https://huggingface.co/{a['model'].strip('/')}/tree/main' for available files.", flush=True)
        return 1
    cfg = {}
    if a["config"] is not None:
        if not Path(a["config"]).is_file():
            print(f"Usage: trtllm-serve serve [OPTIONS] MODEL\nTry 'trtllm-serve serve --help' for help.\n\n"
                  f"Error: Invalid value for '--config': File '{a['config']}' does not exist.", file=sys.stderr, flush=True)
            return 2
        import yaml

        try:
            cfg = yaml.safe_load(Path(a["config"]).read_text())
        except yaml.YAMLError as exc:
            print(f"yaml.scanner.ScannerError: {exc}", flush=True)
            return 1
        if cfg is None:
            cfg = {}
    err = check_llm_config(cfg, size, a["tp_size"], a["pp_size"])
    if err:
        print(err, flush=True)
        return 1
    err = _nccl_ifname_error()
    if err:
        print(err, flush=True)
        return 1
    log(ifname_line(env, rank, size, host, host_interfaces()[1]))
    rdv = rendezvous_of(env, a["port"]) if size > 1 else one_rank_world(env)
    if rdv is None:
        log("cannot find rank 0: no OMPI_MCA_orte_hnp_uri (nor SLURM_STEP_NODELIST) in the environment of a world "
            f"of {size} ranks", "E")
        return 1
    faults = _faults()
    n = count_world_start(rdv["world"])
    if n <= int(faults.get("crash_starts", 0)):
        time.sleep(0.5)
        msg = faults.get("crash_message") or (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {local_rank} has a total "
            "capacity of 178.35 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 177.28 GiB memory in use.")
        print(msg, flush=True)
        log(f"Failed to initialize the executor on rank {rank} (simulated crash: world start {n} on {host})", "E")
        return 1
    config_id = json.dumps({"model": a["model"], "config": cfg}, sort_keys=True, default=str)
    if rank == 0:
        return Rank0(a, cfg, size, rdv, faults, log, config_id, version).run()
    return worker(rank, size, rdv, faults, log, config_id, host)


# --- ranks other than 0 ---------------------------------------------------------------
def worker(rank: int, size: int, rdv: dict, faults: dict, log: Log, config_id: str, host: str) -> int:
    log(f"rank {rank} of {size} on {host}: joining rank 0 of world {rdv['world']} at "
        + ",".join(f"{h}:{rdv['port']}" for h in rdv["addrs"]))
    end = time.monotonic() + float(faults.get("join_timeout_s", 600))
    sock = None
    while sock is None and time.monotonic() < end:
        for h in rdv["addrs"]:
            try:
                sock = socket.create_connection((h, rdv["port"]), timeout=2)
                break
            except OSError:
                continue
        if sock is None:
            time.sleep(0.2)
    if sock is None:
        log(f"NCCL bootstrap timed out: rank 0 of world {rdv['world']} did not answer at "
            + ",".join(f"{h}:{rdv['port']}" for h in rdv["addrs"]), "E")
        print("RuntimeError: NCCL error: remote process exited or there was a network error (ncclRemoteError)", flush=True)
        return 1
    hello = {"world": rdv["world"], "rank": rank, "size": size, "host": host, "config": config_id}
    sock.sendall((json.dumps(hello) + "\n").encode())
    f = sock.makefile("r")
    sock.settimeout(None)
    line = f.readline()
    reply = json.loads(line) if line else {"ok": False, "error": "rank 0 closed the connection during the handshake"}
    if not reply.get("ok"):
        log(str(reply.get("error")), "E")
        print(f"RuntimeError: {reply.get('error')}", flush=True)
        return 1
    log(f"rank {rank} of {size} on {host} joined the world; executor worker ready")
    try:
        while f.readline():
            pass
    except OSError:
        pass
    log("lost rank 0: NCCL communicator aborted (ncclRemoteError)", "E")
    time.sleep(float(faults.get("abort_after_s", 5)))
    print("RuntimeError: NCCL error: remote process exited or there was a network error", flush=True)
    return 1


# --- rank 0 ----------------------------------------------------------------------------
class Rank0:
    def __init__(self, a, cfg, size, rdv, faults, log, config_id, version):
        self.a, self.cfg, self.size, self.rdv, self.faults, self.log = a, cfg, size, rdv, faults, log
        self.config_id, self.version = config_id, version
        self.joined: dict[int, str] = {}
        self.lock = threading.Lock()
        self.all_joined = threading.Event()
        self.lost = threading.Event()
        self.serving = False
        self.served = a["served_model_name"] or a["model"]
        cfg = cfg if isinstance(cfg, dict) else {}
        batch = cfg.get("max_batch_size", a.get("max_batch_size"))
        self.max_batch_size = batch if isinstance(batch, int) and batch > 0 else None
        self.engine = streaming.Engine(max_running=self.max_batch_size)
        # LLM-API options that decide what the metrics endpoints serve (openai_server.py)
        self.iter_stats = cfg.get("enable_iter_perf_stats") is True
        self.perf_metrics = cfg.get("return_perf_metrics") is True
        self.iteration = 0
        self.seen_activity = 0
        self.stats_lock = threading.Lock()
        self.stopped = threading.Event()

    def healthy(self) -> bool:
        return self.serving and self.all_joined.is_set() and not self.lost.is_set()

    def gather(self, stopped=lambda: False) -> int | None:
        """Rank 0's side of the rendezvous: listen for the other ranks and
        wait until every one joined. None once the whole world is there; else
        the exit code (1: cannot listen, or a rank did not come within
        ``join_timeout_s``; 0: ``stopped()`` said so meanwhile)."""
        if self.size <= 1:
            self.all_joined.set()
            return None
        host = os.uname().nodename
        srv = socket.socket()
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind(("0.0.0.0", self.rdv["port"]))
        except OSError as exc:
            self.log(f"cannot listen for the world's ranks on port {self.rdv['port']}: {exc.strerror}", "E")
            return 1
        srv.listen(256)
        self.log(f"rank 0 of {self.size} on {host}: world {self.rdv['world']}, waiting for {self.size - 1} rank(s) on port {self.rdv['port']}")
        threading.Thread(target=self._accept, args=(srv,), daemon=True).start()
        end = time.monotonic() + float(self.faults.get("join_timeout_s", 600))
        while not self.all_joined.wait(0.5):
            if stopped():
                return 0
            if time.monotonic() > end:
                with self.lock:
                    missing = sorted(set(range(1, self.size)) - set(self.joined))
                self.log(f"timed out waiting for rank(s) {missing[:16]} to join", "E")
                print("RuntimeError: NCCL error: remote process exited or there was a network error (ncclRemoteError)", flush=True)
                return 1
        self.log(f"all {self.size} ranks joined: " + ", ".join(f"{h} ({n} ranks)" for h, n in self._per_host()))
        return None

    def run(self) -> int:
        code = self.gather()
        if code is not None:
            return code
        self.log(f"Loading model {self.a['model']} (tp={self.cfg.get('tensor_parallel_size', self.a['tp_size'])}, "
                 f"ep={self.cfg.get('moe_expert_parallel_size', self.a['ep_size'] or 1)}, "
                 f"attention_dp={bool(self.cfg.get('enable_attention_dp', False))}, "
                 f"spec={((self.cfg.get('speculative_config') or {}).get('decoding_type'))})")
        slow = float(self.faults.get("slow_rank0_s", 0))
        if slow:
            time.sleep(slow)
        if self.lost.is_set():
            return self._abort()
        try:
            httpd = _server(self)
        except OSError as exc:
            print(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address ('{self.a['host']}', {self.a['port']}): "
                  f"{exc.strerror.lower() if exc.strerror else exc}", flush=True)
            return 1
        self.serving = True
        print(f"INFO:     Started server process [{os.getpid()}]", flush=True)
        print("INFO:     Waiting for application startup.", flush=True)
        print("INFO:     Application startup complete.", flush=True)
        print(f"INFO:     Uvicorn running on http://{self.a['host']}:{self.a['port']} (Press CTRL+C to quit)", flush=True)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        streaming.on_sigterm_once(lambda: self._drain(httpd))
        while not self.lost.wait(0.2):
            if self.stopped.is_set():
                return _die_by_sigterm()
        return self._abort()

    def _drain(self, httpd) -> None:
        """uvicorn's Server.shutdown on SIGTERM: no new connection, the answers
        in flight finish, the lifespan ends; then the main thread re-raises
        SIGTERM (uvicorn's capture_signals)."""
        print("INFO:     Shutting down", flush=True)
        streaming.stop_listening(httpd)
        if not self.engine.idle():
            print("INFO:     Waiting for connections to close. (CTRL+C to force quit)", flush=True)
            self.engine.wait_idle()
        print("INFO:     Waiting for application shutdown.", flush=True)
        print("INFO:     Application shutdown complete.", flush=True)
        print(f"INFO:     Finished server process [{os.getpid()}]", flush=True)
        self.stopped.set()

    def iteration_stats(self) -> list:
        """GET /metrics: the iteration stats since the last call (the executor
        iterates only while requests are in flight); [] without enable_iter_perf_stats."""
        if not self.iter_stats:
            return []
        with self.stats_lock:
            activity = self.engine.stats()["activity"]
            if activity == self.seen_activity and self.engine.idle():
                return []
            self.seen_activity = activity
            self.iteration += 1
            return [streaming.trtllm_iteration_stats(self.engine, self.iteration, self.max_batch_size)]

    def _abort(self) -> int:
        time.sleep(float(self.faults.get("abort_after_s", 5)))
        print("RuntimeError: NCCL error: remote process exited or there was a network error (ncclRemoteError)", flush=True)
        return 1

    def _per_host(self):
        counts: dict[str, int] = {os.uname().nodename: 1}
        with self.lock:
            for h in self.joined.values():
                counts[h] = counts.get(h, 0) + 1
        return sorted(counts.items())

    def _accept(self, srv: socket.socket) -> None:
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=self._handshake, args=(conn,), daemon=True).start()

    def _handshake(self, conn: socket.socket) -> None:
        f = conn.makefile("r")
        try:
            hello = json.loads(f.readline() or "{}")
        except (ValueError, OSError):
            conn.close()
            return
        rank = hello.get("rank")
        error = None
        if hello.get("world") != self.rdv["world"]:
            error = f"rank {rank} belongs to another MPI world ({hello.get('world')}, this is {self.rdv['world']})"
        elif hello.get("size") != self.size or not isinstance(rank, int) or not 1 <= rank < self.size:
            error = f"rank {rank} of {hello.get('size')} does not fit a world of {self.size}"
        elif hello.get("config") != self.config_id:
            error = f"rank {rank} on {hello.get('host')} was started with another model or LLM API config than rank 0"
        with self.lock:
            if error is None and rank in self.joined:
                error = f"rank {rank} joined twice"
            if error is None:
                self.joined[rank] = hello.get("host", "?")
                n = len(self.joined)
        if error:
            self.log(error, "E")
            try:
                conn.sendall((json.dumps({"ok": False, "error": error}) + "\n").encode())
            finally:
                conn.close()
            return
        conn.sendall(b'{"ok": true}\n')
        if n == self.size - 1:
            self.all_joined.set()
        try:
            while f.readline():
                pass
        except OSError:
            pass
        self.log(f"lost rank {rank} on {hello.get('host')}: NCCL communicator aborted (ncclRemoteError); the world is broken", "E")
        self.lost.set()


THINK = ("The user wants two sorted linked lists merged. Walk both lists with a dummy head, "
         "always taking the smaller node, then append what is left.")
ANSWER = ("def merge(a, b):\n    dummy = tail = ListNode()\n    while a and b:\n        if a.val <= b.val:\n"
          "            tail.next, a = a, a.next\n        else:\n            tail.next, b = b, b.next\n"
          "        tail = tail.next\n    tail.next = a or b\n    return dummy.next\n")


def _die_by_sigterm() -> int:
    """What uvicorn's capture_signals does after a graceful shutdown: SIGTERM
    again, with the default handler (the process ends killed by it)."""
    import signal

    sys.stdout.flush()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.raise_signal(signal.SIGTERM)
    os._exit(0)  # pid 1 of a container ignores it


def _server(r0: Rank0):
    a = r0.a

    class Handler(streaming.json_handler()):

        def log_message(self, fmt, *args):
            code = args[1] if len(args) > 1 else ""
            print(f'INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" {code}', flush=True)

        def do_GET(self):
            if self.path == "/health":
                return self._send(200, b"") if r0.healthy() else self._send(503, b"")
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [
                    {"id": r0.served, "object": "model", "created": int(time.time()), "owned_by": "tensorrt_llm"}]})
            if self.path == "/version":
                return self._send(200, {"version": r0.version})
            if self.path == "/metrics":
                return self._send(200, r0.iteration_stats())
            if self.path == "/prometheus/metrics" and r0.perf_metrics:
                return self._send(200, streaming.trtllm_prometheus(r0.engine, r0.iter_stats), streaming.PROMETHEUS_TYPE)
            return self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            try:
                req = self._json_body()
            except ValueError:
                return self._send(400, {"object": "error", "message": "invalid JSON body", "type": "BadRequestError", "code": 400})
            if self.path not in ("/v1/chat/completions", "/v1/completions"):
                return self._send(404, {"detail": "Not Found"})
            if not r0.healthy():
                return self._send(503, {"object": "error", "message": "the executor is not healthy", "type": "ServiceUnavailable", "code": 503})
            cid = f"chatcmpl-{os.urandom(16).hex()}"
            created = int(time.time())
            if self.path == "/v1/completions":
                return self._send(200, {"id": cid, "object": "text_completion", "created": created, "model": r0.served,
                                        "choices": [{"index": 0, "text": ANSWER, "finish_reason": "stop"}],
                                        "usage": {"prompt_tokens": 8, "completion_tokens": 64, "total_tokens": 72}})
            if not isinstance(req.get("messages"), list) or not req["messages"]:
                return self._send(400, {"object": "error", "message": "messages: Field required", "type": "BadRequestError", "code": 400})
            thinking = (req.get("chat_template_kwargs") or {}).get("enable_thinking", True)
            raw = (f"{THINK}\n</think>\n\n" if thinking else "") + ANSWER
            if a["reasoning_parser"]:
                reasoning, content = split_reasoning(raw)
            else:
                reasoning, content = None, ("<think>\n" + raw if thinking else raw)
            try:
                answer = streaming.plan([("reasoning_content", reasoning), ("content", content)],
                                        streaming.max_tokens_of(req), streaming.ignore_eos_of(req))
            except streaming.BadRequest as exc:
                return self._send(400, {"object": "error", "message": str(exc), "type": "BadRequestError", "code": 400})
            prompt = streaming.prompt_tokens(req)
            lat = streaming.read_latency(STATE_DIR)
            try:
                r = r0.engine.request(prompt)
            except streaming.Closed:
                return self._send(503, {"object": "error", "message": "the server is shutting down", "type": "ServiceUnavailable", "code": 503})
            with r:
                try:
                    if req.get("stream"):
                        return self._stream(r, answer, lat, req, cid, created)
                    ok = streaming.generate(r, answer, lat)
                    finish = answer.finish_reason if ok else "abort"
                    r.finish(finish)
                    return self._send(200, {"id": cid, "object": "chat.completion", "created": created, "model": r0.served,
                                            "choices": [{"index": 0, "message": {"role": "assistant",
                                                                                 "content": answer.text("content", r.generated) or "",
                                                                                 "reasoning_content": answer.text("reasoning_content", r.generated),
                                                                                 "tool_calls": []},
                                                         "logprobs": None, "finish_reason": finish, "stop_reason": None}],
                                            "usage": streaming.usage(prompt, r.generated)})
                except streaming.DISCONNECTED:
                    streaming.gone(self)

        def _stream(self, r, answer, lat, req, cid, created):
            sse = streaming.SSE(self, [("Content-Type", "text/event-stream; charset=utf-8"), ("Transfer-Encoding", "chunked")])

            def event(delta=None, finish=None):
                sse.event({"id": cid, "object": "chat.completion.chunk", "created": created, "model": r0.served,
                           "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}]})

            event({"role": "assistant", "content": ""})
            ok = streaming.generate(r, answer, lat, lambda field, piece: event({field: piece}))
            finish = answer.finish_reason if ok else "abort"
            r.finish(finish)  # out of the batch before the client sees the end
            event({}, finish)
            if streaming.include_usage(req):
                sse.event({"id": cid, "object": "chat.completion.chunk", "created": created, "model": r0.served, "choices": [],
                           "usage": streaming.usage(r.prompt, r.generated)})
            sse.done()

    httpd = streaming.http_server((a["host"], a["port"]), Handler)
    httpd.daemon_threads = True
    return httpd
