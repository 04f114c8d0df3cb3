"""A simulated SGLang server for one node of a multi-node world:
``python3 -m sglang.launch_server --model-path M --tp TP --dist-init-addr IP:PORT
--nnodes N --node-rank I --host 0.0.0.0 --port 30000 [...]`` (the ``sglang``
package of the simulated ``lmsysorg/sglang`` image is a shim that runs
:func:`main`, sim/images.py). Standard library only: it runs in the image's
Debian python3.

What SGLang does, and so what this does (sources: SGLang's
docs/references/multi_node_deployment/multi_node.md and
benchmark/deepseek_v3/README.md; python/sglang/srt/server_args.py,
entrypoints/engine.py, distributed/parallel_state.py, utils/common.py; torch's
c10d TCPStore; NCCL's bootstrap.cc):

- The command line is parsed by ``argparse`` as ``prepare_server_args`` does
  (``ArgumentParser(prog="sglang serve")``): an option it does not have, a
  missing ``--model-path`` or a bad value exits 2 with argparse's usage and
  ``sglang serve: error: ...`` on stderr, before anything starts. The options
  are a subset of ServerArgs (``OPTIONS``: those a deployment uses, with their
  real names, aliases, types and choices); argparse's prefix matching applies
  as in SGLang (``--tp`` is ``--tp-size``, ``--dp`` is ``--dp-size``).
- ServerArgs' checks: ``(tp_size * pp_size) % nnodes == 0`` ("tp_size must be
  divisible by number of nodes"), data parallelism across nodes only with DP
  attention, ``tp_size % dp_size == 0`` with DP attention, ``base_gpu_id``,
  ``gpu_id_step``; the model directory's ``config.json``; GPUs in the
  container (``--gpus``), and one per local TP rank (``base_gpu_id +
  i * gpu_id_step`` below the node's GPU count, node.json or
  ``CUDA_VISIBLE_DEVICES``) or CUDA's "invalid device ordinal".
- Every node runs ``tp_size * pp_size / nnodes`` TP ranks; torch.distributed
  is initialised with ``init_method=tcp://<dist-init-addr>`` and the timeout
  ``--dist-timeout`` (None: torch's default for the NCCL backend, 10 minutes).
  Node rank 0 hosts the store (TCP, every address, the port of
  ``--dist-init-addr``) and waits until all ``world_size`` ranks joined, or
  fails with torch's ``DistStoreError: Timed out after N seconds waiting for
  clients. J/W clients joined.``; the other nodes connect (retrying) and fail
  with ``DistNetworkError: The client socket has timed out after Nms while
  trying to connect to (IP, PORT).`` when nobody answers. A node that joined
  fails when node rank 0 goes away (``failed to recv, got 0 bytes``). The
  store counts ranks, not nodes: a node started with another ``--nnodes``
  or ``--tp`` brings another number of ranks (``12/16 clients joined``).
- Then NCCL's bootstrap root (on rank 0) refuses a world whose nodes disagree:
  a node rank that checked in twice (``Bootstrap Root : rank R of W ranks has
  already checked in``), another world size (``mismatch in info from procs``),
  a node rank outside the world. (NCCL's root only warns and the real world
  then hangs; here the world fails at once.)
- Every node checks its interface variables against its own interfaces, as
  Gloo (the CPU groups, first) and NCCL (pynccl, then) do:
  ``GLOO_SOCKET_IFNAME`` naming no interface fails with Gloo's ``Unable to
  find address for: X``, an ``NCCL_SOCKET_IFNAME`` matching no running
  interface with NCCL's ``Bootstrap : no socket interface found`` and
  ``NCCL error: invalid usage``. The helpers are trtllm.py's.
- Node rank 0 serves HTTP on ``--host:--port`` only once every node has
  loaded, warms up, then logs ``The server is fired up and ready to roll!``;
  ``/health`` and ``/health_generate`` are 503 until then. ``/v1/models``
  lists ``--served-model-name`` (default: the model path as given);
  ``/v1/chat/completions`` answers with a ``<think>`` block, split into
  ``reasoning_content`` when ``--reasoning-parser`` is given (and the request
  does not say ``separate_reasoning: false``), streaming too; ``/metrics``
  (with ``--enable-metrics``) has SGLang's metric names. Other node ranks,
  once loaded, serve SGLang's dummy health server on their own
  ``--host:--port`` (``/health``, ``/health_generate``, ``/ping``: 200).
- A lost node ends the world: the rank that sees its connection drop fails
  (during init with NCCL's ``remote process exited or there was a network
  error``, once serving with Gloo's ``Connection closed by peer``), logs
  ``Scheduler hit an exception`` and ``Received sigquit from a child
  process. It usually means the child failed.``, and exits 1; the others
  then see it go.
- Node rank 0's answers follow streaming.py (shared by the serving
  stand-ins): one SSE chunk per token paced by node.json ``latency``,
  ``max_tokens``, ``ignore_eos``, ``usage``; ``--max-running-requests`` is
  the batch limit beyond which requests queue; ``/metrics`` shows them live
  (``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
  ``sglang:num_used_tokens``, ``sglang:token_usage``, ``sglang:gen_throughput``).
- SIGTERM on node rank 0 once it serves drains as SGLang's TokenizerManager
  does (``SignalHandler``, ``sigterm_watchdog``): ``/health`` and
  ``/health_generate`` answer 503, new requests are still served, "Gracefully
  exiting... Remaining number of requests N." until none is left (every
  ``drain_poll_s``), then exit 0. Other nodes (and node rank 0 before it
  serves) exit 0 at once.

Faults from the host's node.json ``sglang`` entry: ``crash_starts`` (the
first N starts on this host crash while loading weights, with a CUDA
out-of-memory line; counted in ``<state>/sglang-starts``, delete it to count
again), ``crash_message`` (printed instead), ``slow_start_s`` (this node
loads that long after the world formed), ``die_after_ready_s`` (the node
dies that long after it is up), ``default_dist_timeout_s`` (replaces torch's
600 s when ``--dist-timeout`` is not given), ``abort_after_s`` (between
seeing a lost node and exiting, default 0.5), ``warmup_s`` (node rank 0's
warm-up, default 0.2) and ``drain_poll_s`` (how often a draining node rank 0
counts what is left; SGLang's is 5 s; default 0.5).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
import uuid
from pathlib import Path

from . import streaming
from . import trtllm as _trt

STATE_DIR = os.environ.get("LLMDEPLOY_SIM_STATE", "/etc/llmdeploy-sim")
VERSION = "0.5.21"
PROG = "sglang serve"
# torch: init_process_group's timeout for the NCCL backend when none is given
# (torch.distributed.constants.default_pg_nccl_timeout, 10 minutes); SGLang
# passes --dist-timeout, which defaults to None
TORCH_NCCL_DEFAULT_TIMEOUT_S = 600
# sglang/srt/parser/reasoning_parser.py ReasoningParser.DetectorMap (the choices of --reasoning-parser)
REASONING_PARSERS = ("deepseek-r1", "deepseek-v3", "glm45", "gpt-oss", "kimi", "kimi_k2", "mimo", "qwen3",
                     "qwen3-thinking", "minimax", "minimax-append-think", "step3", "step3p5", "mistral",
                     "nemotron_3", "interns1", "gemma4")
# sglang/srt/function_call/function_call_parser.py ToolCallParserEnum (the choices of --tool-call-parser)
TOOL_CALL_PARSERS = ("deepseekv3", "deepseekv31", "deepseekv32", "glm", "glm45", "glm47", "gpt-oss", "kimi_k2",
                     "llama3", "mistral", "pythonic", "qwen", "qwen25", "qwen3_coder", "step3", "minimax-m2",
                     "hermes", "mimo")
GLOO = "/pytorch/third_party/gloo/gloo/transport/tcp"
# NCCL's bootstrap root only warns (src/bootstrap.cc) and the real world then hangs in its NCCL
# init; the stand-in ends it at once, as a failed NCCL init (ncclInternalError's string)
NCCL_ROOT_FAILED = "RuntimeError: NCCL error: internal error - please report this issue to the NCCL developers"
NCCL_REMOTE = "RuntimeError: NCCL error: remote process exited or there was a network error"
SIGQUIT_LINE = "Received sigquit from a child process. It usually means the child failed."


# --- the command line ---------------------------------------------------------------------------
class ArgError(Exception):
    """What argparse would print after ``sglang serve: error: ``."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ArgError(message)


def _flag(*names, **kw):
    return (names, {"action": "store_true", **kw})


def _opt(*names, type=str, **kw):  # noqa: A002 (argparse's own keyword)
    return (names, {"type": type, **kw})


# (option strings, argparse keywords): ServerArgs' names, aliases, types,
# defaults and choices, for the options a deployment uses
OPTIONS = [
    # model and tokenizer
    _opt("--model-path", "--model", dest="model_path", required=True),
    _opt("--tokenizer-path"), _opt("--tokenizer-mode", choices=["auto", "slow"], default="auto"),
    _flag("--skip-tokenizer-init"), _opt("--load-format", default="auto"), _flag("--trust-remote-code"),
    _opt("--context-length", type=int), _flag("--is-embedding"), _opt("--revision"), _opt("--model-impl", default="auto"),
    _opt("--dtype", default="auto"), _opt("--quantization"), _opt("--kv-cache-dtype", default="auto"),
    _opt("--download-dir"), _opt("--served-model-name"), _opt("--chat-template"), _opt("--completion-template"),
    # HTTP server and logging
    _opt("--host", default="127.0.0.1"), _opt("--port", type=int, default=30000), _opt("--api-key"),
    _flag("--enable-metrics"), _flag("--enable-metrics-for-all-schedulers"), _opt("--log-level", default="info"),
    _opt("--log-level-http"), _flag("--log-requests"), _opt("--log-requests-level", type=int, default=2),
    _flag("--skip-server-warmup"), _opt("--nccl-port", type=int), _flag("--enable-cache-report"),
    _opt("--decode-log-interval", type=int, default=40), _opt("--watchdog-timeout", type=float, default=300),
    _opt("--tokenizer-worker-num", type=int, default=1), _flag("--show-time-cost"),
    # memory and scheduling
    _opt("--mem-fraction-static", type=float), _opt("--max-running-requests", type=int),
    _opt("--max-queued-requests", type=int), _opt("--max-total-tokens", type=int),
    _opt("--chunked-prefill-size", type=int), _opt("--max-prefill-tokens", type=int, default=16384),
    _opt("--schedule-policy", default="fcfs"), _opt("--schedule-conservativeness", type=float, default=1.0),
    _opt("--page-size", type=int), _opt("--cuda-graph-max-bs", type=int), _opt("--cuda-graph-bs", type=int, nargs="+"),
    _flag("--disable-cuda-graph"), _flag("--disable-radix-cache"), _flag("--enable-torch-compile"),
    _opt("--torch-compile-max-bs", type=int, default=32), _flag("--disable-overlap-schedule"),
    _flag("--enable-mixed-chunk"), _opt("--stream-interval", type=int, default=1), _opt("--random-seed", type=int),
    # parallelism and the distributed world
    _opt("--tp-size", "--tensor-parallel-size", type=int, default=1, dest="tp_size"),
    _opt("--pp-size", "--pipeline-parallel-size", type=int, default=1, dest="pp_size"),
    _opt("--dp-size", "--data-parallel-size", type=int, default=1, dest="dp_size"),
    _opt("--ep-size", "--expert-parallel-size", "--ep", type=int, default=1, dest="ep_size"),
    _flag("--enable-dp-attention"), _flag("--enable-dp-lm-head"), _opt("--load-balance-method", default="auto"),
    _opt("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr"), _opt("--nnodes", type=int, default=1),
    _opt("--node-rank", type=int, default=0), _opt("--dist-timeout", type=int),
    _opt("--base-gpu-id", type=int, default=0), _opt("--gpu-id-step", type=int, default=1), _opt("--device"),
    _opt("--moe-dense-tp-size", type=int), _opt("--moe-a2a-backend", default="none"),
    _opt("--moe-runner-backend", default="auto"), _opt("--ep-num-redundant-experts", type=int, default=0),
    _flag("--enable-eplb"), _opt("--deepep-mode", default="auto"), _flag("--enable-p2p-check"),
    # kernels, parsers, speculative decoding, disaggregation
    _opt("--attention-backend"), _opt("--sampling-backend"), _opt("--grammar-backend"),
    _opt("--reasoning-parser", choices=list(REASONING_PARSERS)),
    _opt("--tool-call-parser", choices=list(TOOL_CALL_PARSERS)),
    _opt("--speculative-algorithm"), _opt("--speculative-draft-model-path"),
    _opt("--speculative-num-steps", type=int), _opt("--speculative-eagle-topk", type=int),
    _opt("--speculative-num-draft-tokens", type=int),
    _opt("--disaggregation-mode", choices=["null", "prefill", "decode"], default="null"),
    _opt("--disaggregation-transfer-backend", default="mooncake"),
    _opt("--disaggregation-bootstrap-port", type=int, default=8998), _opt("--disaggregation-ib-device"),
]


def build_parser() -> _Parser:
    p = _Parser(prog=PROG)
    for names, kw in OPTIONS:
        p.add_argument(*names, **kw)
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    """SGLang's command line (``argv`` without the program); raises ArgError."""
    return build_parser().parse_args(argv)


def check_server_args(a: argparse.Namespace) -> str | None:
    """ServerArgs' own checks (its ``__post_init__`` and ``check_server_args``), as SGLang says them; None if fine."""
    if a.tp_size < 1 or a.pp_size < 1 or a.nnodes < 1:
        return "AssertionError: tp_size, pp_size and nnodes must be positive (simulator's wording)"
    if (a.tp_size * a.pp_size) % a.nnodes:
        return "AssertionError: tp_size must be divisible by number of nodes"
    dp_attention = a.enable_dp_attention and a.dp_size > 1  # dp_size 1 turns DP attention off
    if a.dp_size > 1 and a.nnodes != 1 and not dp_attention:
        return "AssertionError: multi-node data parallel is not supported unless dp attention!"
    if dp_attention and a.tp_size % a.dp_size:
        return "AssertionError"  # `assert self.tp_size % self.dp_size == 0`, without a message
    if a.base_gpu_id < 0:
        return "AssertionError: base_gpu_id must be non-negative"
    if a.gpu_id_step < 1:
        return "AssertionError: gpu_id_step must be positive"
    if a.ep_size < 1 or a.tp_size % a.ep_size:
        # (the simulator's wording: the MoE layers split tp_size ranks into ep_size groups)
        return f"AssertionError: tp_size ({a.tp_size}) must be divisible by ep_size ({a.ep_size})"
    return None


def dist_init_addr(a: argparse.Namespace) -> tuple[str, int] | str:
    """(host, port) of the store, or what SGLang says about ``--dist-init-addr``.
    Without it every node initialises at 127.0.0.1 (its own host)."""
    if not a.dist_init_addr:
        return "127.0.0.1", a.nccl_port or _free_port()
    value = a.dist_init_addr
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        parts = value.split(":")
        if len(parts) != 2:
            return "AssertionError: please provide --dist-init-addr as host:port of head node"
        host, port = parts
    try:
        return host, int(port)
    except ValueError:
        return f"ValueError: invalid literal for int() with base 10: {port!r}"


def world_of(a: argparse.Namespace) -> tuple[int, int, range]:
    """(world size, ranks per node, this node's TP ranks)."""
    world = a.tp_size * a.pp_size
    per_node = world // a.nnodes
    return world, per_node, range(per_node * a.node_rank, per_node * (a.node_rank + 1))


def gpu_ids(a: argparse.Namespace, per_node: int) -> list[int]:
    """The GPU each local TP rank takes (scheduler.py: base_gpu_id + local rank * gpu_id_step)."""
    return [a.base_gpu_id + i * a.gpu_id_step for i in range(per_node)]


def split_reasoning(text: str, force: bool = False) -> tuple[str | None, str]:
    """SGLang's Qwen3 reasoning detector, non-streaming (BaseReasoningFormatDetector.detect_and_parse):
    (reasoning_content, content)."""
    start, end = "<think>", "</think>"
    if not (force or start in text):
        return None, text
    body = text.replace(start, "").strip()
    if end not in body:
        return body, ""
    reasoning, _, normal = body.partition(end)
    return reasoning, normal.strip()


def bind_error(host: str, port: int, exc: OSError) -> str:
    """What uvicorn says when it cannot bind."""
    why = (exc.strerror or str(exc)).lower()
    return f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address ('{host}', {port}): {why}"


# --- logging ------------------------------------------------------------------------------------
def _ts() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S")


def log(msg: str, tp: int | None = None, dp: int | None = None) -> None:
    """SGLang's logger (configure_logger: ``[%(asctime)s{ DPd}{ TPr}] %(message)s``, on stderr)."""
    prefix = (f" DP{dp}" if dp is not None else "") + (f" TP{tp}" if tp is not None else "")
    print(f"[{_ts()}{prefix}] {msg}", file=sys.stderr, flush=True)


def _scheduler_exception(tp: int, exc: str) -> None:
    log("Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", in run_scheduler_process\n'
        "  ...\n" + exc + "\n", tp=tp)


def nccl_warn(text: str) -> None:
    """A WARN line of NCCL on this node's first rank (``host:pid:tid [dev] file:line NCCL WARN ...``)."""
    pid = os.getpid()
    print(f"{os.uname().nodename}:{pid}:{pid} [0] bootstrap.cc:365 NCCL WARN {text}", file=sys.stderr, flush=True)


def _die(first_tp: int, exc: str, code: int = 1, after: float = 0.0) -> None:
    """A scheduler failed: its traceback, the parent's SIGQUIT line, the process tree gone."""
    if after > 0:
        time.sleep(after)
    _scheduler_exception(first_tp, exc)
    log(SIGQUIT_LINE)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


# --- the node's state ---------------------------------------------------------------------------
def _node() -> dict:
    try:
        return json.loads((Path(STATE_DIR) / "node.json").read_text())
    except (OSError, ValueError):
        return {}


def _faults(node: dict) -> dict:
    f = node.get("sglang")
    return f if isinstance(f, dict) else {}


def _count_start() -> int:
    """How many times the server has started on this host (this one included)."""
    import fcntl

    d = Path(STATE_DIR)
    try:
        with open(d / "sglang-starts.lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            p = d / "sglang-starts"
            try:
                n = int(p.read_text()) + 1
            except (OSError, ValueError):
                n = 1
            p.write_text(str(n))
            return n
    except OSError:
        return 1


def visible_gpus(node: dict, env) -> int | None:
    """How many GPUs the ranks can see: CUDA_VISIBLE_DEVICES, else node.json's; None if unknown."""
    mask = env.get("CUDA_VISIBLE_DEVICES")
    if mask is not None:
        return len([x for x in mask.split(",") if x.strip()])
    gpus = node.get("gpus")
    return len(gpus) if isinstance(gpus, list) else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nic_error(env, host: str, pid: int, local_rank: int, names: list[str], running: list[str]) -> str | None:
    """What a rank says when its interface variables name no interface of its host: Gloo's
    (the CPU groups come first), then NCCL's (pynccl's communicator); None if fine."""
    missing = _trt.gloo_missing(env.get("GLOO_SOCKET_IFNAME"), names)
    if missing:
        return f"RuntimeError: [{GLOO}/device.cc:83] ifa != nullptr. Unable to find address for: {missing[0]}"
    want = env.get("NCCL_SOCKET_IFNAME")
    if _trt.nccl_interfaces(want, running) == []:
        prefix = f"{host}:{pid}:{pid} [{local_rank}]"
        return (f"{prefix} NCCL INFO NCCL_SOCKET_IFNAME set by environment to {want}\n"
                f"{prefix} bootstrap.cc:126 NCCL WARN Bootstrap : no socket interface found\n"
                "RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)")
    return None


# --- the wire between the nodes (the simulator's: torch's store, then NCCL's and Gloo's sockets) --------
def _send(conn: socket.socket, msg: dict) -> bool:
    try:
        conn.sendall((json.dumps(msg) + "\n").encode())
        return True
    except OSError:
        return False


class Peer:
    def __init__(self, conn, addr, hello):
        self.conn, self.addr, self.hello = conn, addr, hello
        self.rank = hello["node_rank"]
        self.alive = True
        self.ready = False
        self.greeted = threading.Event()
        self.wlock = threading.Lock()  # the greeting and a broadcast come from different threads

    def send(self, msg: dict) -> bool:
        with self.wlock:
            return _send(self.conn, msg)


class Store:
    """Node rank 0's end: torch's TCPStore (counting ranks until the world is
    complete), NCCL's bootstrap root (refusing nodes that disagree), and
    the watch on every node's connection."""

    def __init__(self, a, world: int, per_node: int, faults: dict):
        self.a, self.world, self.per_node, self.faults = a, world, per_node, faults
        self.nonce = uuid.uuid4().hex
        self.peers: dict[int, Peer] = {}
        self.lock = threading.Lock()
        self.count = per_node  # this node's ranks
        self.phase = "store"  # store -> init -> serving
        self.all_joined = threading.Event()
        self.all_ready = threading.Event()
        self.failed = threading.Event()
        self.failure = ""
        self.srv: socket.socket | None = None

    def listen(self, port: int) -> str | None:
        srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            srv.bind(("0.0.0.0", port))
        except OSError as exc:
            srv.close()
            name = {98: "EADDRINUSE", 13: "EACCES"}.get(exc.errno or 0, "E?")
            return ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
                    f"address. port: {port}, useIpv6: false, code: -{exc.errno}, name: {name}, message: "
                    f"{(exc.strerror or '').lower()}")
        srv.listen(256)
        self.srv = srv
        threading.Thread(target=self._accept, daemon=True).start()
        return None

    def _accept(self) -> None:
        while True:
            try:
                conn, addr = self.srv.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, addr), daemon=True).start()

    def fail(self, text: str) -> None:
        """The world is broken: remember why (the main thread ends it)."""
        with self.lock:
            if not self.failed.is_set():
                self.failure = text
                self.failed.set()

    def _serve(self, conn: socket.socket, addr) -> None:
        f = conn.makefile("r")
        try:
            hello = json.loads(f.readline() or "{}")
        except (ValueError, OSError):
            conn.close()
            return
        if hello.get("t") == "probe":  # node rank 0's own client
            _send(conn, {"t": "probe", "nonce": self.nonce})
            conn.close()
            return
        if hello.get("t") != "hello" or not isinstance(hello.get("node_rank"), int):
            conn.close()
            return
        peer = Peer(conn, addr, hello)
        refuse, kind = None, "nccl"
        with self.lock:
            old = self.peers.get(peer.rank)
            if self.phase != "store":
                refuse, kind = (f"node rank {peer.rank} came to a world that has already formed (its {hello.get('procs')} "
                                "ranks never complete their NCCL bootstrap; simulator's wording)"), "late"
            elif peer.rank == 0 or (old is not None and old.alive):
                first = peer.rank * int(hello.get("procs") or self.per_node)
                refuse = f"Bootstrap Root : rank {first} of {self.world} ranks has already checked in"
                nccl_warn(refuse)
                self.failure = self.failure or NCCL_ROOT_FAILED
                self.failed.set()
            else:
                self.peers[peer.rank] = peer
                self.count += int(hello.get("procs", 0))
                if self.count >= self.world:
                    self.all_joined.set()
        if refuse:
            _send(conn, {"t": "error", "kind": kind, "text": refuse})
            conn.close()
            return
        peer.send({"t": "ok"})
        peer.greeted.set()
        try:
            for line in f:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("t") == "ready":
                    with self.lock:
                        peer.ready = True
                        if self.phase != "store" and all(p.ready for p in self.peers.values()):
                            self.all_ready.set()
        except OSError:
            pass
        peer.alive = False
        with self.lock:
            phase = self.phase
            if phase == "store" and self.peers.get(peer.rank) is peer:
                # torch's store keeps counting it; a node that comes back takes its place here
                del self.peers[peer.rank]
                self.count -= int(hello.get("procs", 0))
                return
        host, port = addr[0], addr[1]
        if phase == "serving":
            self.fail(f"RuntimeError: [{GLOO}/pair.cc:534] Connection closed by peer [{host}]:{port}")
        else:
            self.fail(NCCL_REMOTE)

    def self_probe(self, host: str, port: int, deadline: float) -> bool:
        """Node rank 0's own store client connects to --dist-init-addr too: it must reach this store."""
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((host, port), timeout=2) as s:
                    s.sendall(b'{"t": "probe"}\n')
                    got = json.loads(s.makefile("r").readline() or "{}")
                    if got.get("nonce") == self.nonce:
                        return True
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        return False

    def nccl_root_check(self) -> str | None:
        """What NCCL's bootstrap root says about the nodes that joined, once the store is complete."""
        with self.lock:
            peers = list(self.peers.values())
        for p in peers:
            if p.hello.get("world") != self.world:
                return (f"Bootstrap Root : mismatch in info from procs, nranks {self.world} vs "
                        f"{p.hello.get('world')}, nroots 1 vs 1, iroot 0 vs 0")
            if not 0 < p.rank < self.a.nnodes:
                return f"Bootstrap Root : localId {p.rank * self.per_node} is out of range"
        return None

    def broadcast(self, msg: dict) -> None:
        """To every node that joined, after its greeting."""
        with self.lock:
            peers = list(self.peers.values())
        for p in peers:
            p.greeted.wait(5)
            p.send(msg)

    def set_phase(self, phase: str) -> None:
        with self.lock:
            self.phase = phase
            if phase != "store" and all(p.ready for p in self.peers.values()):
                self.all_ready.set()


# --- the HTTP API -------------------------------------------------------------------------------
THINK = "The user wants two sorted linked lists merged. Walk both with a dummy head, always taking the smaller node."
ANSWER = ("def merge(a, b):\n    dummy = tail = ListNode()\n    while a and b:\n        if a.val <= b.val:\n"
          "            tail.next, a = a, a.next\n        else:\n            tail.next, b = b, b.next\n"
          "        tail = tail.next\n    tail.next = a or b\n    return dummy.next")
BUCKETS = {
    "time_to_first_token_seconds": (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0),
    "e2e_request_latency_seconds": (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0),
    "inter_token_latency_seconds": (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1),
}
GAUGES = [("num_running_reqs", "The number of running requests."),
          ("num_used_tokens", "The number of used tokens."),
          ("token_usage", "The token usage."),
          ("gen_throughput", "The generation throughput (token/s)."),
          ("num_queue_reqs", "The number of requests in the waiting queue."),
          ("cache_hit_rate", "The prefix cache hit rate.")]
COUNTERS = [("prompt_tokens_total", "Number of prefill tokens processed."),
            ("generation_tokens_total", "Number of generation tokens processed."),
            ("cached_tokens_total", "Number of cached prompt tokens."),
            ("num_requests_total", "Number of requests processed.")]
HISTOGRAMS = [("time_to_first_token_seconds", "Histogram of time to first token in seconds."),
              ("e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds"),
              ("inter_token_latency_seconds", "Histogram of inter-token latency in seconds.")]


class Metrics:
    """What ``/metrics`` shows with ``--enable-metrics`` (sglang/srt/metrics/collector.py; TP rank 0's scheduler
    and the tokenizer manager; labels model_name, engine_type, tp_rank, pp_rank)."""

    def __init__(self, model_name: str, engine: "streaming.Engine | None" = None):
        self.engine = engine  # the live gauges (running, queued, KV tokens, throughput) come from it
        self.labels = {"engine_type": "unified", "model_name": model_name, "pp_rank": "0", "tp_rank": "0"}
        self.lock = threading.Lock()
        self.counters = {name: 0.0 for name, _ in COUNTERS}
        self.gauges = {name: 0.0 for name, _ in GAUGES}
        self.hist = {name: [0] * (len(BUCKETS[name]) + 1) for name, _ in HISTOGRAMS}
        self.sums = {name: 0.0 for name, _ in HISTOGRAMS}

    def request(self, prompt: int, generated: int, seconds: float) -> None:
        with self.lock:
            self.counters["prompt_tokens_total"] += prompt
            self.counters["generation_tokens_total"] += generated
            self.counters["num_requests_total"] += 1
            self.gauges["gen_throughput"] = generated / seconds if seconds > 0 else 0.0
            for name, value in (("time_to_first_token_seconds", seconds / 4), ("e2e_request_latency_seconds", seconds),
                                ("inter_token_latency_seconds", seconds / max(generated, 1))):
                self.sums[name] += value
                i = next((k for k, le in enumerate(BUCKETS[name]) if value <= le), len(BUCKETS[name]))
                self.hist[name][i] += 1

    def render(self) -> str:
        lab = ",".join(f'{k}="{v}"' for k, v in sorted(self.labels.items()))
        out = []
        if self.engine is not None:
            st = self.engine.stats()
            with self.lock:
                self.gauges.update(num_running_reqs=float(st["running"]), num_queue_reqs=float(st["waiting"]),
                                   num_used_tokens=float(st["kv_tokens"]), token_usage=st["kv_usage"],
                                   gen_throughput=self.engine.throughput())
        with self.lock:
            for name, doc in GAUGES:
                out += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} gauge", f"sglang:{name}{{{lab}}} {self.gauges[name]}"]
            for name, doc in COUNTERS:
                out += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} counter", f"sglang:{name}{{{lab}}} {self.counters[name]}"]
            for name, doc in HISTOGRAMS:
                out += [f"# HELP sglang:{name} {doc}", f"# TYPE sglang:{name} histogram"]
                running = 0
                for le, n in zip([*BUCKETS[name], "+Inf"], self.hist[name]):
                    running += n
                    out.append(f'sglang:{name}_bucket{{{lab},le="{le}"}} {float(running)}')
                out.append(f"sglang:{name}_count{{{lab}}} {float(running)}")
                out.append(f"sglang:{name}_sum{{{lab}}} {self.sums[name]}")
        return "\n".join(out) + "\n"


def _handler_base():
    from http import HTTPStatus
    from http.server import BaseHTTPRequestHandler

    class Base(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        quiet = False

        def log_message(self, fmt, *args):
            if self.quiet:
                return
            code = args[1] if len(args) > 1 else ""
            try:
                phrase = HTTPStatus(int(code)).phrase
            except ValueError:
                phrase = ""
            print(f'[{_ts()}] INFO:     {self.client_address[0]}:{self.client_address[1]} - "{self.requestline}" {code} {phrase}',
                  file=sys.stderr, flush=True)

        def send(self, code: int, body, ctype: str = "application/json"):
            data = body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
            self.send_response(code)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def body(self):
            length = int(self.headers.get("content-length") or 0)
            try:
                return json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return None

    return Base


def _error(message: str, code: int = 400) -> dict:
    return {"object": "error", "message": message, "type": "BadRequest" if code == 400 else "ServiceUnavailable",
            "param": None, "code": code}


class Api:
    """Node rank 0's HTTP server (sglang/srt/entrypoints/http_server.py)."""

    def __init__(self, a, model_cfg: dict, store: Store | None):
        self.a, self.cfg, self.store = a, model_cfg, store
        self.served = a.served_model_name or a.model_path
        self.version = _version()
        self.warm = False
        self.gracefully_exit = False  # SIGTERM: draining
        self.engine = streaming.Engine(max_running=a.max_running_requests)
        self.metrics = Metrics(self.served, self.engine)
        self.context_len = a.context_length or int(model_cfg.get("max_position_embeddings") or 262144)

    def failed(self) -> bool:
        return bool(self.store and self.store.failed.is_set())

    def healthy(self) -> bool:
        """/health and /health_generate: 503 while warming up, after a failure, and while draining."""
        return self.warm and not self.failed() and not self.gracefully_exit

    def model_info(self) -> dict:
        return {"model_path": self.a.model_path, "tokenizer_path": self.a.tokenizer_path or self.a.model_path,
                "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                "has_image_understanding": False, "has_audio_understanding": False,
                "model_type": self.cfg.get("model_type"), "architectures": self.cfg.get("architectures")}

    def answer(self, req: dict) -> streaming.Plan:
        """The pieces of a chat answer (max_tokens, ignore_eos: streaming.py); raises streaming.BadRequest."""
        thinking = (req.get("chat_template_kwargs") or {}).get("enable_thinking", True)
        raw = (f"<think>\n{THINK}\n</think>\n\n" if thinking else "") + ANSWER
        if self.a.reasoning_parser and req.get("separate_reasoning", True):
            reasoning, content = split_reasoning(raw, force=self.a.reasoning_parser == "qwen3-thinking")
        else:
            reasoning, content = None, raw
        return streaming.plan([("reasoning_content", reasoning), ("content", content)],
                              streaming.max_tokens_of(req), streaming.ignore_eos_of(req))

    def chat(self, req: dict) -> tuple[str | None, str, dict]:
        """(reasoning_content, content, usage) of the whole answer."""
        answer = self.answer(req)
        prompt = streaming.prompt_tokens(req)
        return (answer.text("reasoning_content"), answer.text("content") or "",
                {**streaming.usage(prompt, len(answer)), "prompt_tokens_details": None})

    def server(self):
        api = self
        Base = _handler_base()

        class Handler(Base):
            def do_GET(self):
                path = self.path.split("?", 1)[0]
                if path in ("/health", "/health_generate"):
                    return self.send(200, b"") if api.healthy() else self.send(503, b"")
                if path == "/v1/models":
                    return self.send(200, {"object": "list", "data": [
                        {"id": api.served, "object": "model", "created": int(time.time()), "owned_by": "sglang",
                         "root": api.served, "parent": None, "max_model_len": api.context_len}]})
                if path in ("/get_model_info", "/model_info"):
                    return self.send(200, api.model_info())
                if path in ("/get_server_info", "/server_info"):
                    return self.send(200, {**vars(api.a), "version": api.version,
                                           "served_model_name": api.served})
                if path == "/version":
                    return self.send(200, {"version": api.version})
                if path == "/metrics" and api.a.enable_metrics:
                    return self.send(200, api.metrics.render(), "text/plain; version=0.0.4; charset=utf-8")
                return self.send(404, {"detail": "Not Found"})

            def do_POST(self):
                path = self.path.split("?", 1)[0]
                req = self.body()
                if req is None:
                    return self.send(400, _error("Invalid JSON in the request body"))
                if path not in ("/v1/chat/completions", "/v1/completions", "/generate"):
                    return self.send(404, {"detail": "Not Found"})
                if api.warm and api.failed():  # (a draining server still serves: SGLang refuses nothing new)
                    return self.send(503, _error("The server is not healthy", 503))
                t0 = time.monotonic()
                if path == "/generate":
                    api.metrics.request(8, 16, time.monotonic() - t0 + 0.05)
                    return self.send(200, {"text": " " + ANSWER.splitlines()[0], "meta_info": {
                        "id": uuid.uuid4().hex, "finish_reason": {"type": "length", "length": 16},
                        "prompt_tokens": 8, "completion_tokens": 16, "cached_tokens": 0}})
                model = req.get("model") or "default"
                cid, created = uuid.uuid4().hex, int(time.time())
                if path == "/v1/completions":
                    api.metrics.request(8, 64, time.monotonic() - t0 + 0.05)
                    return self.send(200, {"id": cid, "object": "text_completion", "created": created, "model": model,
                                           "choices": [{"index": 0, "text": ANSWER, "logprobs": None, "finish_reason": "stop",
                                                        "matched_stop": None}],
                                           "usage": {"prompt_tokens": 8, "total_tokens": 72, "completion_tokens": 64,
                                                     "prompt_tokens_details": None}})
                if not isinstance(req.get("messages"), list) or not req["messages"]:
                    return self.send(400, _error("1 validation error for ChatCompletionRequest\nmessages\n  Field required"))
                try:
                    answer = api.answer(req)
                except streaming.BadRequest as exc:
                    return self.send(400, _error(str(exc)))
                prompt = streaming.prompt_tokens(req)
                lat = streaming.read_latency(STATE_DIR)
                try:
                    r = api.engine.request(prompt)
                except streaming.Closed:
                    return self.send(503, _error("The server is shutting down", 503))
                with r:
                    try:
                        if req.get("stream"):
                            return self._stream(r, answer, lat, cid, created, model, req, t0)
                        ok = streaming.generate(r, answer, lat)
                        finish = answer.finish_reason if ok else "abort"
                        r.finish(finish)
                        api.metrics.request(prompt, r.generated, time.monotonic() - t0 + 0.05)
                        return self.send(200, {"id": cid, "object": "chat.completion", "created": created, "model": model,
                                               "choices": [{"index": 0, "message": {"role": "assistant",
                                                                                    "content": answer.text("content", r.generated) or "",
                                                                                    "reasoning_content": answer.text("reasoning_content", r.generated),
                                                                                    "tool_calls": None},
                                                            "logprobs": None, "finish_reason": finish,
                                                            "matched_stop": 151645 if finish == "stop" else None}],
                                               "usage": {**streaming.usage(prompt, r.generated), "prompt_tokens_details": None}})
                    except streaming.DISCONNECTED:
                        streaming.gone(self)

            def _stream(self, r, answer, lat, cid, created, model, req, t0):
                sse = streaming.SSE(self, [("content-type", "text/event-stream; charset=utf-8"), ("transfer-encoding", "chunked")])

                def event(delta, finish=None, use=None):
                    sse.event({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                               "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish,
                                            "matched_stop": 151645 if finish == "stop" else None}], "usage": use})

                event({"role": "assistant", "content": "", "reasoning_content": None, "tool_calls": None})
                ok = streaming.generate(r, answer, lat, lambda field, piece: event({field: piece}))
                finish = answer.finish_reason if ok else "abort"
                r.finish(finish)  # out of the batch before the client sees the end
                api.metrics.request(r.prompt, r.generated, time.monotonic() - t0 + 0.05)
                event({}, finish)
                if streaming.include_usage(req):
                    sse.event({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                               "choices": [], "usage": {**streaming.usage(r.prompt, r.generated), "prompt_tokens_details": None}})
                sse.done()


        httpd = streaming.http_server((self.a.host, self.a.port), Handler)
        httpd.daemon_threads = True
        return httpd


def dummy_health_server(host: str, port: int, enable_metrics: bool):
    """What a node rank >= 1 serves once its schedulers are ready (utils launch_dummy_health_check_server)."""
    Base = _handler_base()

    class Handler(Base):
        quiet = True  # uvicorn at log level warning

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path in ("/health", "/health_generate", "/ping"):
                return self.send(200, b"")
            if path == "/metrics" and enable_metrics:
                return self.send(200, b"", "text/plain; version=0.0.4; charset=utf-8")
            return self.send(404, {"detail": "Not Found"})


    httpd = streaming.http_server((host, port), Handler)
    httpd.daemon_threads = True
    return httpd


# --- the node's life ----------------------------------------------------------------------------
def _on_sigterm(rank0: bool) -> None:
    def stop(signum, frame):
        if rank0:
            for line in ("Shutting down", "Waiting for application shutdown.", "Application shutdown complete.",
                         f"Finished server process [{os.getpid()}]"):
                print(f"[{_ts()}] INFO:     {line}", file=sys.stderr, flush=True)
        else:
            log(f"Received signal {signum}; the node's processes exit")
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)


def _wait_in_main_thread(event: threading.Event) -> None:
    """Wait for ``event`` in short slices: a signal the kernel hands to another
    thread runs its Python handler only when the main thread wakes up, and an
    endless Event.wait() never does (SIGTERM would go unanswered)."""
    while not event.wait(0.2):
        pass


def _drain_on_sigterm(api: "Api", poll_s: float) -> None:
    """Node rank 0's SIGTERM once it serves, as SGLang's TokenizerManager
    (SignalHandler.sigterm_handler, sigterm_watchdog): /health and
    /health_generate answer 503, new requests are still served, the requests
    left are counted every ``poll_s`` (SGLang: 5 s; node.json
    ``sglang.drain_poll_s``, default 0.5) until none is left; then uvicorn's
    lines and exit 0."""

    def drain():
        log("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        api.gracefully_exit = True
        while True:
            st = api.engine.stats()
            left = st["running"] + st["waiting"]
            log(f"Gracefully exiting... Remaining number of requests {left}.")
            if left == 0:
                break
            time.sleep(poll_s)
        api.engine.wait_idle(5)  # the last answers' final bytes
        for line in ("Shutting down", "Waiting for application shutdown.", "Application shutdown complete.",
                     f"Finished server process [{os.getpid()}]"):
            print(f"[{_ts()}] INFO:     {line}", file=sys.stderr, flush=True)
        os._exit(0)

    streaming.on_sigterm_once(drain)


def _load(a, local: range, node: dict, faults: dict, start: int, dp_of) -> str | None:
    """Loading the weights on this node's ranks: the slow-start and crash faults; an error line or None."""
    mem = next((g.get("mem_mib") for g in node.get("gpus") or [] if isinstance(g, dict)), None) or 143771
    avail = mem / 1024 * 0.99
    for r in local:
        log(f"Load weight begin. avail mem={avail:.2f} GB", tp=r, dp=dp_of(r))
    slow = float(faults.get("slow_start_s", 0) or 0)
    if slow > 0:
        time.sleep(slow)
    if start <= int(faults.get("crash_starts", 0) or 0):
        time.sleep(0.2)
        return faults.get("crash_message") or (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
            f"{mem / 1024:.2f} GiB of which 1.06 GiB is free. (simulated crash: start {start} on {os.uname().nodename})")
    for r in local:
        log(f"Load weight end. type={','.join(_model_cfg(a.model_path).get('architectures') or ['?'])}, "
            f"dtype=torch.bfloat16, avail mem={avail * 0.6:.2f} GB, mem usage={avail * 0.3:.2f} GB.", tp=r, dp=dp_of(r))
        log(f"KV Cache is allocated. #tokens: 1048576, K size: {avail * 0.2:.2f} GB, V size: {avail * 0.2:.2f} GB",
            tp=r, dp=dp_of(r))
    if not a.disable_cuda_graph:
        log(f"Capture cuda graph begin. This can take up to several minutes. avail mem={avail * 0.2:.2f} GB",
            tp=local[0], dp=dp_of(local[0]))
        log("Capture cuda graph end. Time elapsed: 0.10 s. mem usage=0.50 GB.", tp=local[0], dp=dp_of(local[0]))
    return None


def _version() -> str:
    """SGLang's version in this container's image (its dist-info), else the one simulated."""
    import importlib.metadata as md

    try:
        return md.version("sglang")
    except md.PackageNotFoundError:
        return VERSION


def _model_cfg(path: str) -> dict:
    try:
        cfg = json.loads((Path(path) / "config.json").read_text())
        return cfg if isinstance(cfg, dict) else {}
    except (OSError, ValueError):
        return {}


def _die_later(first_tp: int, seconds: float) -> None:
    def run():
        time.sleep(seconds)
        _die(first_tp, "RuntimeError: CUDA error: an illegal memory access was encountered (simulated: die_after_ready_s)")

    threading.Thread(target=run, daemon=True).start()


def main(argv: list[str]) -> int:
    """``python3 -m sglang.launch_server ARGV`` on one node."""
    parser = build_parser()
    try:
        a = parser.parse_args(argv)
    except ArgError as exc:
        parser.print_usage(sys.stderr)
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    rank0 = a.node_rank == 0
    _on_sigterm(rank0)
    node, env = _node(), os.environ
    faults = _faults(node)
    log(f"server_args=ServerArgs(model_path={a.model_path!r}, served_model_name={a.served_model_name or a.model_path!r}, "
        f"host={a.host!r}, port={a.port}, tp_size={a.tp_size}, pp_size={a.pp_size}, dp_size={a.dp_size}, "
        f"ep_size={a.ep_size}, enable_dp_attention={a.enable_dp_attention}, dist_init_addr={a.dist_init_addr!r}, "
        f"nnodes={a.nnodes}, node_rank={a.node_rank}, dist_timeout={a.dist_timeout}, "
        f"trust_remote_code={a.trust_remote_code}, reasoning_parser={a.reasoning_parser!r}, "
        f"enable_metrics={a.enable_metrics}, ...) (sglang {_version()}, simulated)")
    err = check_server_args(a)
    if err:
        print(f"Traceback (most recent call last):\n  ...\n{err}", file=sys.stderr, flush=True)
        return 1
    if not _trt._container_has_gpus():
        print("Traceback (most recent call last):\n  ...\nRuntimeError: No accelerator (CUDA, XPU, HPU) is available.",
              file=sys.stderr, flush=True)
        return 1
    model = Path(a.model_path)
    if not (model / "config.json").is_file():
        if model.is_dir():
            why = (f"OSError: {a.model_path} does not appear to have a file named config.json. Checkout "
                   f"'https://huggingface.co/{a.model_path.strip('/')}/tree/main' for available files.")
        else:
            why = (f"OSError: Incorrect path_or_model_id: '{a.model_path}'. Please provide either the path to a local "
                   "folder or the repo_id of a model on the Hub.")
        print(f"Traceback (most recent call last):\n  ...\n{why}", file=sys.stderr, flush=True)
        return 1
    addr = dist_init_addr(a)
    if isinstance(addr, str):
        print(f"Traceback (most recent call last):\n  ...\n{addr}", file=sys.stderr, flush=True)
        return 1
    host, port = addr
    world, per_node, local = world_of(a)
    dp = a.dp_size if (a.enable_dp_attention and a.dp_size > 1) else None
    per_dp = world // dp if dp else None

    def dp_of(r):
        return r // per_dp if per_dp else None

    # each scheduler takes its GPU first (torch.cuda.set_device), before torch.distributed
    gpus = visible_gpus(node, env)
    for r, g in zip(local, gpu_ids(a, per_node)):
        if gpus is not None and g >= gpus:
            _die(r, "torch.AcceleratorError: CUDA error: invalid device ordinal\nGPU device may be out of range, do you have "
                    "enough GPUs?\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
    for r in local:
        log("Init torch distributed begin.", tp=r, dp=dp_of(r))
    timeout = a.dist_timeout if a.dist_timeout is not None else float(
        faults.get("default_dist_timeout_s", TORCH_NCCL_DEFAULT_TIMEOUT_S))
    if a.dist_timeout is not None and a.dist_timeout <= 0:
        _die(local[0], "AssertionError: timeout must be positive")  # parallel_state.init_distributed_environment
    abort_after = float(faults.get("abort_after_s", 0.5))
    start = _count_start()
    hostname = os.uname().nodename
    names, running = _trt.host_interfaces()
    if rank0:
        return _run_rank0(a, host, port, world, per_node, local, timeout, abort_after, faults, node, start, hostname,
                          names, running, dp_of)
    return _run_worker(a, host, port, world, per_node, local, timeout, abort_after, faults, node, start, hostname,
                       names, running, dp_of)


def _client_timeout(host: str, port: int, timeout: float) -> str:
    return (f"torch.distributed.DistNetworkError: The client socket has timed out after {int(timeout * 1000)}ms "
            f"while trying to connect to ({host}, {port}).")


def _run_rank0(a, host, port, world, per_node, local, timeout, abort_after, faults, node, start, hostname,
               names, running, dp_of) -> int:
    store = Store(a, world, per_node, faults)
    t0 = time.monotonic()
    err = store.listen(port)
    if err:
        _die(local[0], err)
    if not store.self_probe(host, port, t0 + timeout):
        _die(local[0], _client_timeout(host, port, timeout))
    if world > per_node:
        while not store.all_joined.wait(0.2):
            if store.failed.is_set():
                store.broadcast({"t": "abort", "text": store.failure})
                _die(local[0], store.failure, after=abort_after)
            if time.monotonic() - t0 > timeout:
                with store.lock:
                    joined = store.count
                _die(local[0], f"torch.distributed.DistStoreError: Timed out after {int(time.monotonic() - t0) + 1} "
                               f"seconds waiting for clients. {joined}/{world} clients joined.")
    store.set_phase("init")
    warn = store.nccl_root_check()
    if warn:
        nccl_warn(warn)
        store.fail(NCCL_ROOT_FAILED)
    if store.failed.is_set():
        store.broadcast({"t": "abort"})
        _die(local[0], store.failure, after=abort_after)
    store.broadcast({"t": "go"})
    for r in local:
        log(f"Init torch distributed ends. elapsed={time.monotonic() - t0:.2f} s, mem usage=0.50 GB", tp=r, dp=dp_of(r))
    err = nic_error(os.environ, hostname, os.getpid(), 0, names, running) if names else None
    if err:
        _die(local[0], err)
    err = _load(a, local, node, faults, start, dp_of)
    if err:
        _die(local[0], err)
    # node rank 0 serves once every node's schedulers are up (they meet in collectives)
    while not store.all_ready.wait(0.2):
        if store.failed.is_set():
            _die(local[0], store.failure, after=abort_after)
    if store.failed.is_set():
        _die(local[0], store.failure, after=abort_after)
    api = Api(a, _model_cfg(a.model_path), store)
    try:
        httpd = api.server()
    except OSError as exc:
        print(f"[{_ts()}] {bind_error(a.host, a.port, exc)}", file=sys.stderr, flush=True)
        os._exit(1)
    store.set_phase("serving")
    for line in (f"Started server process [{os.getpid()}]", "Waiting for application startup.",
                 "Application startup complete.", f"Uvicorn running on http://{a.host}:{a.port} (Press CTRL+C to quit)"):
        print(f"[{_ts()}] INFO:     {line}", file=sys.stderr, flush=True)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    if not a.skip_server_warmup:
        time.sleep(float(faults.get("warmup_s", 0.2)))
        print(f'[{_ts()}] INFO:     127.0.0.1:{_free_port()} - "GET /model_info HTTP/1.1" 200 OK', file=sys.stderr, flush=True)
        print(f'[{_ts()}] INFO:     127.0.0.1:{_free_port()} - "POST /generate HTTP/1.1" 200 OK', file=sys.stderr, flush=True)
    api.warm = True
    _drain_on_sigterm(api, float(faults.get("drain_poll_s", 0.5)))
    log("The server is fired up and ready to roll!")
    _record_ready("api")
    if faults.get("die_after_ready_s") is not None:
        _die_later(local[0], float(faults["die_after_ready_s"]))
    _wait_in_main_thread(store.failed)
    _die(local[0], store.failure, after=abort_after)
    return 1


def _run_worker(a, host, port, world, per_node, local, timeout, abort_after, faults, node, start, hostname,
                names, running, dp_of) -> int:
    t0 = time.monotonic()
    sock, warned = None, False
    while sock is None:
        try:
            sock = socket.create_connection((host, port), timeout=2)
        except OSError as exc:
            if not warned:
                print(f"[W{time.strftime('%m%d %H:%M:%S')} socket.cpp:767] [c10d] The client socket has failed to connect to "
                      f"[{host}]:{port} (errno: {exc.errno or 110} - {exc.strerror or 'Connection timed out'}).",
                      file=sys.stderr, flush=True)
                warned = True
            if time.monotonic() - t0 > timeout:
                _die(local[0], _client_timeout(host, port, timeout))
            time.sleep(0.2)
    sock.settimeout(None)
    lost = {"phase": "store"}
    peer_host, peer_port = sock.getpeername()[:2]
    _send(sock, {"t": "hello", "node_rank": a.node_rank, "nnodes": a.nnodes, "world": world, "procs": per_node,
                 "host": hostname})
    f = sock.makefile("r")

    def read() -> dict | None:
        try:
            line = f.readline()
        except OSError:
            return None
        try:
            return json.loads(line) if line else None
        except ValueError:
            return None

    msg = read()
    while msg is not None and msg.get("t") == "ok":  # joined; wait for the world
        msg = read()
    if msg is None:
        _die(local[0], "torch.distributed.DistNetworkError: failed to recv, got 0 bytes", after=abort_after)
    if msg.get("t") == "error":  # NCCL's root refused this node (it says why in its own log)
        _die(local[0], f"RuntimeError: {msg.get('text')}" if msg.get("kind") == "late" else NCCL_REMOTE)
    if msg.get("t") != "go":
        _die(local[0], NCCL_REMOTE, after=abort_after)
    lost["phase"] = "init"
    gone = threading.Event()

    def watch():
        while True:
            m = read()
            if m is None:
                break
        gone.set()

    threading.Thread(target=watch, daemon=True).start()
    for r in local:
        log(f"Init torch distributed ends. elapsed={time.monotonic() - t0:.2f} s, mem usage=0.50 GB", tp=r, dp=dp_of(r))
    err = nic_error(os.environ, hostname, os.getpid(), 0, names, running) if names else None
    if err:
        _die(local[0], err)
    err = _load(a, local, node, faults, start, dp_of)
    if err:
        _die(local[0], err)
    if gone.is_set():
        _die(local[0], NCCL_REMOTE, after=abort_after)
    _send(sock, {"t": "ready"})
    try:
        httpd = dummy_health_server(a.host, a.port, a.enable_metrics)
    except OSError as exc:
        print(f"[{_ts()}] {bind_error(a.host, a.port, exc)}", file=sys.stderr, flush=True)
        os._exit(1)
    log(f"Starting dummy health check server at {a.host}:{a.port}")
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    _record_ready("worker")
    if faults.get("die_after_ready_s") is not None:
        _die_later(local[0], float(faults["die_after_ready_s"]))
    _wait_in_main_thread(gone)
    _die(local[0], f"RuntimeError: [{GLOO}/pair.cc:534] Connection closed by peer [{peer_host}]:{peer_port}", after=abort_after)
    return 1


def _record_ready(role: str) -> None:
    """Simulator bookkeeping shared with the vLLM stand-in (serving-times.jsonl, bench/deploy_overhead.py:
    ``api`` when node rank 0 serves, ``worker`` when another node is up)."""
    try:
        from . import vllm as _vllm

        _vllm.record_ready(role)
    except Exception:  # bookkeeping only
        pass
