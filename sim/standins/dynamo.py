"""The TensorRT-LLM engine and the GPUs under NVIDIA's ``dynamo.trtllm``, on a
simulated GB300 host. Everything else of Dynamo here is NVIDIA's own code.

What is NVIDIA's: the ai-dynamo and ai-dynamo-runtime wheels of the version
the catalogue pins, which prepare's wheels step installs with pip from the
simulator's package index (sim/images.py, sim/pypi.py): ``python3 -m
dynamo.frontend`` (HTTP, preprocessing, the KV-aware router, discovery over
the cluster's real etcd, events over its real NATS), ``dynamo.trtllm``'s
``__main__`` and argument parser, and ``dynamo.mocker``, Dynamo's own engine
simulator, which registers the worker in etcd, serves its system port
(``DYN_SYSTEM_PORT``: ``/health``, ``/live``, ``/metrics`` with the
``dynamo_component_*`` families) and answers the frontend's requests.

What stands in (this module): the part of ``dynamo.trtllm`` that builds a
TensorRT-LLM engine on the GPUs (its ``main`` module, which the simulated
TensorRT-LLM image's start-up hook replaces by this one: see
``images.tensorrt_llm_package``). So ``mpirun ... trtllm-llmapi-launch
python3 -m dynamo.trtllm --model-path M --disaggregation-mode decode
--extra-engine-args Y --publish-metrics``, on every rank:

1. is parsed by ai-dynamo's own ``dynamo.trtllm.args.parse_args``: an option
   Dynamo does not know fails as Dynamo fails (argparse's usage, exit 2);
2. checks what TensorRT-LLM and CUDA would: the container got GPUs
   (``--gpus``), ``CUDA_VISIBLE_DEVICES`` gives each of this host's ranks one
   existing GPU that no other world holds, ``M/config.json`` exists, the YAML
   reads and its ``tensor_parallel_size * pipeline_parallel_size`` is the MPI
   world's size, ``NCCL_SOCKET_IFNAME`` names an interface of this host, and
   a world of more than one rank runs under ``trtllm-llmapi-launch``;
3. forms the MPI world across the nodes as the trtllm-serve stand-in does
   (trtllm.py: rank 0 listens, the others join it); ranks other than 0 hold
   their GPU and wait, as TensorRT-LLM's MPI workers do;
4. rank 0 runs ``python3 -m dynamo.mocker`` with what the command line and
   the YAML say: the served model name Dynamo registers (``--served-model-name``,
   else the model path as given), the endpoint (``dyn://<namespace>.prefill.generate``
   for prefill, ``.backend.generate`` otherwise, or ``--endpoint``), the
   disaggregation mode, the KV block size, the batch and token limits, the
   discovery backend and the request and event planes. It inherits the
   worker's environment (ETCD_ENDPOINTS, NATS_SERVER, DYN_NAMESPACE,
   DYN_SYSTEM_PORT, ...).

The mock engine lives and dies with rank 0 (``PR_SET_PDEATHSIG``): a killed
rank 0 leaves what a killed Dynamo worker leaves, its etcd lease until the
lease expires. SIGTERM on rank 0 goes to the mock engine (Dynamo's graceful
shutdown: its instances leave etcd at once) and rank 0 exits with its status.
A lost rank kills the mock engine and ends rank 0 with exit 1 after
``abort_after_s``, as a broken NCCL world ends a TensorRT-LLM executor.

Faults from the host's node.json ``dynamo`` entry: ``crash_starts`` (each
worker group -- a disaggregation mode and system port on this host -- crashes
on its first N world starts with a CUDA out-of-memory line; counted in
``<state>/dynamo-starts-<mode>-<port>``, delete it to count again),
``crash_mode`` (only that mode crashes), ``crash_message``, ``slow_start_s``
(rank 0 loads that long before it starts the engine), ``join_timeout_s``
(default 600) and ``abort_after_s`` (default 5).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import trtllm as trtllm_sim

STATE_DIR = os.environ.get("LLMDEPLOY_SIM_STATE", "/etc/llmdeploy-sim")
# dynamo.trtllm's DisaggregationMode values -> dynamo.mocker's --disaggregation-mode
MOCKER_MODE = {"prefill_and_decode": "agg", "prefill": "prefill", "decode": "decode"}


def registered_model_name(served_model_name: str | None, model: str) -> str:
    """The model name a TensorRT-LLM worker registers (what the frontend's
    /v1/models lists and a request's "model" must name), as ai-dynamo derives
    it: ``DynamoTrtllmConfig.validate`` (dynamo/trtllm/backend_args.py) turns
    an empty --served-model-name into None; ``init_llm_worker``
    (dynamo/trtllm/workers/llm_worker.py) calls ``register_model(...,
    config.model, config.served_model_name, ...)``; the runtime names the
    model ``model_name`` or else the model path exactly as given
    (lib/llm/src/local_model.rs: "The served model name defaults to the full
    model path"). The mock engine gets it as ``--model-name``."""
    return served_model_name or model


def check_visible_gpus(visible: str | None, local_ranks: int, host_gpus: int | None) -> str | None:
    """What is wrong with ``CUDA_VISIBLE_DEVICES`` for this world's ranks on this host, or None."""
    if visible is None:
        if host_gpus is not None and local_ranks > host_gpus:
            return f"{local_ranks} ranks of this world run on this host, which has {host_gpus} GPUs"
        return None
    ids = [x.strip() for x in visible.split(",") if x.strip()]
    if any(not x.isdigit() for x in ids):
        return f"CUDA_VISIBLE_DEVICES={visible!r} is not a list of GPU indices"
    if len(set(ids)) != len(ids):
        return f"CUDA_VISIBLE_DEVICES={visible} lists a GPU twice"
    if len(ids) != local_ranks:
        return (f"CUDA_VISIBLE_DEVICES={visible} makes {len(ids)} GPU(s) visible, but {local_ranks} rank(s) of this "
                "MPI world run on this host: each rank needs exactly one GPU of the mask")
    if host_gpus is not None:
        bad = [int(x) for x in ids if int(x) >= host_gpus]
        if bad:
            return f"CUDA error: invalid device ordinal: GPU {bad[0]} of CUDA_VISIBLE_DEVICES={visible} does not exist (this host has {host_gpus} GPUs)"
    return None


def _faults() -> dict:
    try:
        return json.loads((Path(STATE_DIR) / "node.json").read_text()).get("dynamo") or {}
    except (OSError, ValueError):
        return {}


def _yaml_config(path: str | None) -> tuple[dict | None, str | None]:
    """The --extra-engine-args YAML or the error TensorRT-LLM's loader gives."""
    if not path:
        return {}, None
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None, f"FileNotFoundError: [Errno 2] No such file or directory: '{path}'"
    except OSError as exc:
        return None, f"OSError: [Errno {exc.errno}] {exc.strerror}: '{path}'"
    import yaml

    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return None, f"yaml.scanner.ScannerError: {exc}"
    if cfg is not None and not isinstance(cfg, dict):
        return None, f"ValueError: --extra-engine-args {path} must hold a mapping, not {type(cfg).__name__}"
    return ({} if cfg is None else cfg), None


_GPU_LOCKS: list = []  # open for the life of the rank: the kernel drops the lock when it dies


def claim_gpu(gpu: int, world: str) -> int | None:
    """Hold GPU ``gpu`` of this host for this rank: the pid (in its own
    container) of another world's live rank that holds it already, else None.
    A lock per GPU in the host's state directory, held while the rank lives
    (flock works across the containers of a host; their pids do not)."""
    import fcntl

    try:
        f = open(Path(STATE_DIR) / f"dynamo-gpu{gpu}.lock", "a+")
    except OSError:
        return None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        try:
            held = json.loads(f.read() or "{}")
        except ValueError:
            held = {}
        f.close()
        if held.get("world") == world:
            return None  # a rank of this same world
        return int(held.get("pid") or 0)
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "world": world}))
    f.flush()
    _GPU_LOCKS.append(f)
    return None


def _value(x) -> str:
    """An option's value as a command line spells it (enums by their value)."""
    return str(getattr(x, "value", x))


def mocker_argv(config, cfg: dict) -> list[str]:
    """``python3 -m dynamo.mocker``'s arguments for a parsed ``dynamo.trtllm``
    ``config`` (ai-dynamo's Config) and its --extra-engine-args YAML ``cfg``
    (which wins over the command line, as in TensorRT-LLM's LLM API)."""
    mode = _value(config.disaggregation_mode)
    if mode not in MOCKER_MODE:
        raise ValueError(f"the simulated TensorRT-LLM engine serves prefill, decode or aggregated workers, not {mode}")
    argv = ["--model-path", config.model,
            "--model-name", registered_model_name(config.served_model_name, config.model),
            "--endpoint", f"dyn://{config.namespace}.{config.component}.{config.endpoint}",
            "--disaggregation-mode", MOCKER_MODE[mode],
            "--engine-type", "trtllm",
            "--block-size", str((cfg.get("kv_cache_config") or {}).get("tokens_per_block") or config.kv_block_size)]
    for key, flag in (("max_batch_size", "--max-num-seqs"), ("max_num_tokens", "--max-num-batched-tokens"),
                      ("max_seq_len", "--max-model-len")):
        value = cfg.get(key, getattr(config, key, None))
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            argv += [flag, str(value)]
    for key, flag in (("discovery_backend", "--discovery-backend"), ("request_plane", "--request-plane"),
                      ("event_plane", "--event-plane")):
        value = getattr(config, key, None)
        if value not in (None, ""):
            argv += [flag, _value(value)]
    return argv


def _pdeathsig() -> None:
    """In the engine's process: die with rank 0 (PR_SET_PDEATHSIG = 1, SIGKILL)."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)


class Rank0(trtllm_sim.Rank0):
    """Rank 0 of a Dynamo TensorRT-LLM worker: the trtllm-serve stand-in's
    rendezvous (accept, handshake, lost ranks), then the mock engine."""

    def __init__(self, config, cfg: dict, size: int, rdv: dict, faults: dict, tlog, config_id: str, version: str):
        served = registered_model_name(config.served_model_name, config.model)
        super().__init__({"served_model_name": served, "model": config.model}, cfg, size, rdv, faults, tlog, config_id, version)
        self.config = config
        self.engine_proc: subprocess.Popen | None = None
        self.terminated = False

    def serve(self) -> int:
        signal.signal(signal.SIGTERM, self._sigterm)
        code = self.gather(stopped=lambda: self.terminated)
        if code is not None:
            return code
        cfg = self.cfg
        self.log(f"Loading model {self.config.model} (mode={_value(self.config.disaggregation_mode)}, "
                 f"tp={cfg.get('tensor_parallel_size', self.config.tensor_parallel_size)}, "
                 f"ep={cfg.get('moe_expert_parallel_size', self.config.expert_parallel_size)}, "
                 f"attention_dp={bool(cfg.get('enable_attention_dp', False))}, "
                 f"spec={(cfg.get('speculative_config') or {}).get('decoding_type')})")
        end = time.monotonic() + float(self.faults.get("slow_start_s", 0))
        while time.monotonic() < end and not self.lost.is_set() and not self.terminated:
            time.sleep(0.1)
        if self.terminated:
            return 0
        if self.lost.is_set():
            return self._abort()
        argv = [sys.executable, "-m", "dynamo.mocker", *mocker_argv(self.config, cfg)]
        self.log("engine: " + " ".join(argv[1:]))
        # the engine is rank 0's, in-process in TensorRT-LLM: not a rank of the MPI job
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
        self.engine_proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=env, preexec_fn=_pdeathsig)
        while True:
            try:
                code = self.engine_proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                code = None
            if code is not None:
                if not self.terminated:
                    self.log(f"the engine exited with status {code}", "E")
                return 0 if self.terminated and code in (0, -signal.SIGTERM) else (code if code > 0 else 1)
            if self.lost.is_set():
                self.engine_proc.kill()
                self.engine_proc.wait()
                return self._abort()

    def _sigterm(self, *_):
        self.terminated = True
        if self.engine_proc is not None and self.engine_proc.poll() is None:
            self.engine_proc.send_signal(signal.SIGTERM)


def main(argv: list[str] | None = None) -> int:
    """``python3 -m dynamo.trtllm`` (ai-dynamo's __main__ calls ``main()``)."""
    argv = sys.argv[1:] if argv is None else argv
    code = run(argv)
    sys.exit(code)


def run(argv: list[str]) -> int:
    from dynamo.trtllm.args import parse_args  # ai-dynamo's own parser: unknown options exit 2 with its usage

    env = os.environ
    rank, size, local_rank, local_size = trtllm_sim.world_of(env)
    tlog = trtllm_sim.Log(rank)
    version = trtllm_sim._image_version()
    config = parse_args(argv)
    host = os.uname().nodename
    mode = _value(config.disaggregation_mode)
    print(f"[TensorRT-LLM] TensorRT-LLM version: {version} (simulated), rank {rank} of {size} on {host}", flush=True)
    if rank == 0:
        forced = env.get("TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS")
        if forced not in (None, ""):
            tlog(f"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS={forced} is set: speculative decoding acceptance is forced "
                 "(synthetic, for benchmarking only); output quality and throughput do not reflect the model. "
                 "Never set it in production or accuracy runs", "W")
    if size > 1 and env.get("TLLM_SPAWN_PROXY_PROCESS") != "1":
        tlog("dynamo.trtllm runs in an MPI world of more than one rank without trtllm-llmapi-launch: start it as "
             "`mpirun ... trtllm-llmapi-launch python3 -m dynamo.trtllm ...`", "E")
        return 1
    if not trtllm_sim._container_has_gpus():
        print("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver "
              "from http://www.nvidia.com/Download/index.aspx", flush=True)
        return 1
    visible = env.get("CUDA_VISIBLE_DEVICES")
    err = check_visible_gpus(visible, local_size, trtllm_sim._gpus())
    if err:
        tlog(err, "E")
        print(f"RuntimeError: {err}", flush=True)
        return 1
    if not Path(config.model, "config.json").is_file():
        print(f"OSError: {config.model} does not appear to have a file named config.json. "
              f"Checkout 'https://huggingface.co/{config.model.strip('/')}/tree/main' for available files.", flush=True)
        return 1
    cfg, err = _yaml_config(config.extra_engine_args)
    if err:
        print(err, flush=True)
        return 1
    # the YAML's parallel mapping wins over the CLI's, as in dynamo.trtllm
    known = {k: v for k, v in cfg.items() if k in trtllm_sim.LLM_API_KEYS}
    err = trtllm_sim.check_llm_config(known, size, config.tensor_parallel_size, config.pipeline_parallel_size)
    if err:
        print(err, flush=True)
        return 1
    err = trtllm_sim._nccl_ifname_error()
    if err:
        print(err, flush=True)
        return 1
    system_port = int(env.get("DYN_SYSTEM_PORT") or 0)
    if size > 1:
        rdv = trtllm_sim.rendezvous_of(env, system_port or None)
        if rdv is None:
            tlog(f"cannot find rank 0: no OMPI_MCA_orte_hnp_uri (nor SLURM_STEP_NODELIST) in the environment of a world of {size} ranks", "E")
            return 1
    else:
        rdv = trtllm_sim.one_rank_world(env)
    faults = _faults()
    gpu = int(visible.split(",")[local_rank]) if visible else local_rank
    holder = claim_gpu(gpu, rdv["world"])
    if holder is not None:
        print(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {local_rank} has a total capacity of "
              f"278.56 GiB of which 1.06 GiB is free. Process {holder} has 277.41 GiB memory in use. (GPU {gpu} of {host} is "
              "already used by another worker: give colocated workers disjoint CUDA_VISIBLE_DEVICES)", flush=True)
        tlog(f"Failed to initialize the executor on rank {rank}", "E")
        return 1
    try:
        n = trtllm_sim.count_world_start(rdv["world"], f"dynamo-starts-{mode}-{system_port}")
    except OSError:
        n = 1 << 30  # no state directory: no faults
    if n <= int(faults.get("crash_starts", 0)) and faults.get("crash_mode") in (None, "", mode):
        time.sleep(0.5)
        msg = faults.get("crash_message") or (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {local_rank} has a total "
            "capacity of 278.56 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 277.50 GiB memory in use.")
        print(msg, flush=True)
        tlog(f"Failed to initialize the executor on rank {rank} (simulated crash: {mode} worker start {n} on {host})", "E")
        return 1
    config_id = json.dumps({"model": config.model, "mode": mode, "config": cfg}, sort_keys=True, default=str)
    if rank != 0:
        return trtllm_sim.worker(rank, size, rdv, faults, tlog, config_id, host)
    return Rank0(config, cfg, size, rdv, faults, tlog, config_id, version).serve()
