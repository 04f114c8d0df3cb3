"""What the serving stand-ins (vllm.py, trtllm.py, dynamo.py, sglang.py) share:
paced token streaming, the requests in flight, the metrics each real server
shows for them, and the pieces of a graceful stop. Standard library only (it
goes into the simulated images with the stand-ins and runs under Debian's
python3).

Latency (the simulator's, one key for every system): the host's node.json
``"latency": {"first_token_s": F, "per_token_s": P}`` (both default 0: the
stand-ins answer at once, as they always did). It is read when a request
arrives, so a test can make a running release slower by editing node.json.
The first token of an answer comes F seconds after the request got a slot,
each next one P seconds after the one before; a non-streamed answer takes the
same time and comes whole at the end.

Tokens: an answer's text is cut into short word pieces (whitespace with up to
four characters after it, ``tokenize``); a streamed answer sends one SSE
chunk per piece. ``max_completion_tokens`` (else ``max_tokens``) caps the
pieces; ``ignore_eos: true`` (vLLM's, SGLang's and TensorRT-LLM's extra
sampling parameter; Dynamo's ``nvext: {"ignore_eos": true}`` too) makes the
answer exactly ``max_tokens`` pieces long, repeating the answer's text, with
``finish_reason`` ``length`` (without ``max_tokens`` it has no effect here).
``usage`` counts the prompt roughly (its words) and the pieces sent.

Requests in flight (``Engine``): a request is *running* from the moment it has
a slot in the batch until its last token; with a batch limit (vLLM
``--max-num-seqs``, TensorRT-LLM ``max_batch_size``, SGLang
``--max-running-requests``) the requests beyond it *wait* in a queue, in
arrival order, until a slot frees. A request leaves the counts when it ends,
when it is aborted, and when its client goes away (the write that fails ends
it; the handler's ``with`` block gives its slot back whatever happens). The
KV cache in use is the prompt and generated tokens of the running requests
over ``kv_capacity_tokens`` (1048576, what the SGLang stand-in says it
allocated).

Metric names, by server (the stand-ins serve these; sources read for them):

- vLLM (``GET /metrics``, Prometheus text, labels ``engine`` and
  ``model_name``): ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
  ``vllm:kv_cache_usage_perc``, ``vllm:prompt_tokens_total``,
  ``vllm:generation_tokens_total``, ``vllm:request_success_total``
  (``finished_reason``). vllm/v1/metrics/loggers.py PrometheusStatLogger
  (labelnames ``model_name``, ``engine``). ``vllm:gpu_cache_usage_perc`` is
  not there: deprecated for ``vllm:kv_cache_usage_perc`` in vllm-project/vllm
  #18354 (0.9.2/0.10), hidden in 0.11 (#24245) and removed (#29330, Nov 2025),
  long before 0.23.
- TensorRT-LLM ``trtllm-serve`` (tensorrt_llm/serve/openai_server.py of
  TensorRT-LLM main, 2026, which the simulated 1.3.0a0 stands for):
  ``GET /metrics`` is ``get_iteration_stats``: a JSON list of the executor's
  iteration stats queued since the last call (``get_stats_async(2)``), which
  the PyTorch backend only produces with ``enable_iter_perf_stats: true`` in
  the LLM-API YAML (else ``[]``); each has ``numActiveRequests``,
  ``numQueuedRequests``, ``numCompletedRequests``, ``maxNumActiveRequests``,
  ``kvCacheStats`` {``maxNumBlocks``, ``freeNumBlocks``, ``usedNumBlocks``,
  ``tokensPerBlock``, ...} and ``inflightBatchingStats``. With
  ``return_perf_metrics: true`` it also mounts ``GET /prometheus/metrics``
  (``mount_metrics``), Prometheus text from tensorrt_llm/metrics/collector.py
  MetricsCollector (prefix ``trtllm_``, labels ``model_name`` and
  ``engine_type``, both ``"undefined"`` as openai_server.py creates it):
  ``trtllm_request_success_total`` (``finished_reason``),
  ``trtllm_prompt_tokens_total``, ``trtllm_generation_tokens_total`` per
  finished request, and, set from the iteration stats (so with
  ``enable_iter_perf_stats`` too), ``trtllm_num_requests_running``,
  ``trtllm_num_requests_waiting``, ``trtllm_kv_cache_utilization``.
- Dynamo frontend (``GET /metrics``, Prometheus text, prefix
  ``dynamo_frontend_``): ai-dynamo/dynamo lib/runtime/src/metrics/prometheus_names.rs
  ``frontend_service``: ``inflight_requests`` (gauge, requests going to the
  engine), ``queued_requests`` (gauge, "requests waiting in HTTP queue
  before receiving the first response"), ``requests_total``,
  ``output_tokens_total``; label ``model``.
- SGLang (``GET /metrics`` with ``--enable-metrics``): sglang/srt/metrics/collector.py
  ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
  ``sglang:num_used_tokens``, ``sglang:token_usage``, ``sglang:gen_throughput``
  (rendered by sglang.py's Metrics with its labels).

Graceful stop, what each real server does on SIGTERM (each stand-in's
docstring says how it imitates it):

- vLLM 0.23 ``--shutdown-timeout`` (vllm-project/vllm #34730/#36666;
  tests/entrypoints/launchers/test_shutdown.py): 0, the default, aborts the
  requests in flight at once (``finish_reason`` ``abort``) and exits; N > 0
  refuses new requests (503) and lets those in flight finish for up to N
  seconds, then aborts the rest.
- trtllm-serve runs ``uvicorn.Server(config).serve()`` with uvicorn's own
  signal handling: ``Server.shutdown`` closes the listening socket (new
  connections are refused), closes idle connections, waits for the open ones
  to finish their responses ("Waiting for connections to close."), runs the
  lifespan shutdown, and ``capture_signals`` then re-raises SIGTERM with the
  default handler (the process ends killed by SIGTERM).
- Dynamo frontend (lib/llm/src/http/service/service_v2.rs, health.rs): the
  cancelled service answers ``/live`` and ``/health`` 503
  ``{"status": "shutting_down", "message": "Service is shutting down"}``,
  keeps its listener ``DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS`` (default 5)
  "to allow incorrectly routed requests to arrive", then stops accepting and
  drains the connections in flight; Dynamo's graceful-shutdown guide:
  ``runtime.shutdown()`` "invalidate[s] endpoints and stop[s] accepting new
  requests", in-flight requests finish, exit 0.
- SGLang (python/sglang/srt/managers/tokenizer_manager.py ``SignalHandler``,
  ``sigterm_watchdog``; entrypoints/http_server.py ``health_generate``):
  "SIGTERM received. ... Draining requests and shutting down...", ``/health``
  and ``/health_generate`` 503, new requests still served, "Gracefully
  exiting... Remaining number of requests N" every 5 s until none is left,
  then the process tree ends.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterable

STATE_DIR = os.environ.get("LLMDEPLOY_SIM_STATE", "/etc/llmdeploy-sim")
LATENCY_KEY = "latency"
DEFAULT_KV_TOKENS = 1048576
# what a client that went away looks like to the writing thread
DISCONNECTED = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


# --- latency ------------------------------------------------------------------------------------
def http_server(address: tuple[str, int], handler):
    """The stand-ins' HTTP server: a thread per connection, and a client that
    resets its connection is not an error worth a traceback (uvicorn, which
    serves vLLM, trtllm-serve, SGLang and Dynamo's frontend, closes such a
    connection without a word; http.server would print socketserver's
    traceback for the ConnectionResetError of a reset keep-alive connection)."""
    import sys
    from http.server import ThreadingHTTPServer

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request, client_address):
            if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)):
                return
            super().handle_error(request, client_address)

    return Server(address, handler)


class Latency:
    """(first_token_s, per_token_s) of this host's node.json."""

    __slots__ = ("first_token_s", "per_token_s")

    def __init__(self, first_token_s: float = 0.0, per_token_s: float = 0.0):
        self.first_token_s, self.per_token_s = first_token_s, per_token_s

    def __eq__(self, other):
        return isinstance(other, Latency) and (self.first_token_s, self.per_token_s) == (other.first_token_s, other.per_token_s)

    def __repr__(self):
        return f"Latency(first_token_s={self.first_token_s}, per_token_s={self.per_token_s})"

    def slowest(self, other: "Latency | None") -> "Latency":
        if other is None:
            return self
        return Latency(max(self.first_token_s, other.first_token_s), max(self.per_token_s, other.per_token_s))

    def as_dict(self) -> dict:
        return {"first_token_s": self.first_token_s, "per_token_s": self.per_token_s}

    def total(self, tokens: int) -> float:
        """How long an answer of ``tokens`` pieces takes."""
        return sum(delays(tokens, self))


def _seconds(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    return float(value) if value > 0 else 0.0


def latency_of(node: dict | None) -> Latency:
    """The ``latency`` entry of a parsed node.json (missing or bad values: 0)."""
    entry = (node or {}).get(LATENCY_KEY) if isinstance(node, dict) else None
    if not isinstance(entry, dict):
        return Latency()
    return Latency(_seconds(entry.get("first_token_s")), _seconds(entry.get("per_token_s")))


def read_latency(state_dir: str | None = None) -> Latency:
    """This host's latency, read now from ``<state>/node.json``."""
    try:
        node = json.loads((Path(state_dir or STATE_DIR) / "node.json").read_text())
    except (OSError, ValueError):
        return Latency()
    return latency_of(node)


def delays(tokens: int, lat: Latency) -> list[float]:
    """The wait before each of ``tokens`` pieces: first_token_s, then per_token_s."""
    return [lat.first_token_s if i == 0 else lat.per_token_s for i in range(tokens)]


# --- tokens -------------------------------------------------------------------------------------
TOKEN = re.compile(r"\s+\S{1,4}|\S{1,4}|\s+")


def tokenize(text: str | None) -> list[str]:
    """``text`` as short word pieces; ``"".join(tokenize(t)) == t``."""
    return TOKEN.findall(text or "")


class BadRequest(ValueError):
    """A request parameter the real server refuses with 400 (the message is vLLM's)."""


def max_tokens_of(req: dict) -> int | None:
    """``max_completion_tokens``, else ``max_tokens`` (None: not given)."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = req.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest(f"{key} must be at least 1, got {value}.")
        return value
    return None


def ignore_eos_of(req: dict, nvext: bool = False) -> bool:
    """``ignore_eos: true`` (and, with ``nvext``, Dynamo's ``nvext.ignore_eos``)."""
    if req.get("ignore_eos") is True:
        return True
    ext = req.get("nvext") if nvext else None
    return isinstance(ext, dict) and ext.get("ignore_eos") is True


def include_usage(req: dict) -> bool:
    opts = req.get("stream_options")
    return isinstance(opts, dict) and opts.get("include_usage") is True


def prompt_tokens(req: dict) -> int:
    """A rough token count of the prompt: its words (at least 1)."""
    words = 0
    messages = req.get("messages")
    if isinstance(messages, list):
        for m in messages:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, list):
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            words += len(str(content or "").split())
    prompt = req.get("prompt")
    if isinstance(prompt, str):
        words += len(prompt.split())
    return max(1, words)


def usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Plan:
    """The pieces an answer sends, each with the field it goes into, and why it ends."""

    def __init__(self, tokens: list[tuple[str, str]], finish_reason: str):
        self.tokens, self.finish_reason = tokens, finish_reason

    def __len__(self) -> int:
        return len(self.tokens)

    def text(self, field: str, upto: int | None = None) -> str | None:
        """The pieces of ``field`` (among the first ``upto``) joined; None if the answer has none."""
        parts = [p for f, p in self.tokens[:upto] if f == field]
        return "".join(parts) if parts else None


def plan(fields: Iterable[tuple[str, str | None]], max_tokens: int | None = None, ignore_eos: bool = False) -> Plan:
    """The answer ``fields`` ((field, text), in order; None or empty skipped) as
    pieces, capped at ``max_tokens``; with ``ignore_eos`` exactly ``max_tokens``
    pieces, the last field's text (the answer) repeated after the whole."""
    fields = [(f, t) for f, t in fields if t]
    tokens = [(f, p) for f, t in fields for p in tokenize(t)]
    if ignore_eos and max_tokens is not None and tokens and len(tokens) < max_tokens:
        f, t = fields[-1]
        again = [(f, p) for p in tokenize(t)]
        while len(tokens) < max_tokens:
            tokens += again[: max_tokens - len(tokens)]
        return Plan(tokens, "length")
    if max_tokens is not None and len(tokens) > max_tokens:
        return Plan(tokens[:max_tokens], "length")
    if ignore_eos and max_tokens is not None and len(tokens) == max_tokens:
        return Plan(tokens, "length")
    return Plan(tokens, "stop")


# --- requests in flight ---------------------------------------------------------------------------
class Closed(Exception):
    """The server no longer admits requests (it is stopping)."""


class Engine:
    """The requests in flight of one server, thread-safe. ``max_running`` None
    or < 1: no batch limit. ``wait(seconds) -> bool`` (False: aborted) is how a
    request waits for its next token; a test can pass its own."""

    def __init__(self, max_running: int | None = None, kv_capacity_tokens: int = DEFAULT_KV_TOKENS,
                 clock: Callable[[], float] = time.monotonic, wait: Callable[[float], bool] | None = None):
        self.max_running = max_running if isinstance(max_running, int) and max_running > 0 else None
        self.kv_capacity_tokens = max(1, int(kv_capacity_tokens))
        self.clock = clock
        self.cond = threading.Condition()
        self.running = 0
        self.waiting = 0
        self.before_first = 0  # admitted, no token sent yet (Dynamo's "queued")
        self.open = 0  # admitted answers whose handler has not let go yet (their last bytes may be on the way)
        self.kv_tokens = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.finished: dict[str, int] = {}
        self._queue: deque = deque()
        self.activity = 0  # bumped by every admission, token and end (TensorRT-LLM's iterations)
        self.closing = False
        self.aborted = threading.Event()
        self._recent: deque[tuple[float, int]] = deque(maxlen=65536)
        self._wait = wait or self._default_wait

    def _default_wait(self, seconds: float) -> bool:
        if seconds <= 0:
            return not self.aborted.is_set()
        return not self.aborted.wait(seconds)

    def request(self, prompt: int) -> "Request":
        """A slot for a request of ``prompt`` tokens, once one is free (in
        arrival order); raises Closed if the server is stopping."""
        with self.cond:
            if self.closing or self.aborted.is_set():
                raise Closed()
            me = object()
            self._queue.append(me)
            self.waiting += 1
            self.activity += 1
            try:
                while not self.aborted.is_set() and (
                        self._queue[0] is not me or (self.max_running is not None and self.running >= self.max_running)):
                    self.cond.wait(0.5)
            finally:
                self._queue.remove(me)
                self.waiting -= 1
                self.cond.notify_all()
            if self.aborted.is_set():
                raise Closed()
            self.running += 1
            self.open += 1
            self.before_first += 1
            self.kv_tokens += prompt
            self.prompt_tokens_total += prompt
            self.activity += 1
            return Request(self, prompt)

    def close(self) -> None:
        """Admit no new request."""
        with self.cond:
            self.closing = True
            self.cond.notify_all()

    def abort(self) -> None:
        """Admit nothing and end the requests in flight at their next token."""
        with self.cond:
            self.closing = True
            self.aborted.set()
            self.cond.notify_all()

    def idle(self) -> bool:
        """No request runs or waits, and every answer is out."""
        with self.cond:
            return self.running == 0 and self.waiting == 0 and self.open == 0

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Until no request runs or waits and every answer is out (True), or ``timeout`` passed (False)."""
        end = None if timeout is None else self.clock() + timeout
        with self.cond:
            while self.running or self.waiting or self.open:
                left = None if end is None else end - self.clock()
                if left is not None and left <= 0:
                    return False
                self.cond.wait(0.05 if left is None else min(left, 0.05))
            return True

    def throughput(self, window: float = 5.0) -> float:
        """Generated tokens per second over the last ``window`` seconds."""
        now = self.clock()
        with self.cond:
            n = sum(k for t, k in self._recent if now - t <= window)
        return n / window

    def stats(self) -> dict:
        with self.cond:
            return {"running": self.running, "waiting": self.waiting, "queued": self.before_first + self.waiting,
                    "kv_tokens": self.kv_tokens, "kv_capacity_tokens": self.kv_capacity_tokens,
                    "kv_usage": min(1.0, self.kv_tokens / self.kv_capacity_tokens),
                    "prompt_tokens_total": self.prompt_tokens_total,
                    "generation_tokens_total": self.generation_tokens_total,
                    "finished": dict(self.finished), "completed": sum(self.finished.values()),
                    "activity": self.activity, "max_running": self.max_running}


class Request:
    """One admitted request: ``with engine.request(p) as r:``; ``r.token()``
    for each piece sent, ``r.finish(reason)`` when the last one is out (the
    ``with`` block ends an unfinished request as ``abort``: a client that went
    away, an error; its end is when the answer's last bytes are out)."""

    def __init__(self, engine: Engine, prompt: int):
        self.engine, self.prompt = engine, prompt
        self.generated = 0
        self.done = False

    def __enter__(self) -> "Request":
        return self

    def __exit__(self, *exc) -> None:
        self.finish("abort")
        e = self.engine
        with e.cond:
            e.open -= 1
            e.cond.notify_all()

    def wait(self, seconds: float) -> bool:
        """Wait ``seconds`` for the next token; False if the engine aborted."""
        return self.engine._wait(seconds)

    def token(self, n: int = 1) -> None:
        e = self.engine
        with e.cond:
            if self.done:
                return
            if self.generated == 0:
                e.before_first -= 1
            self.generated += n
            e.kv_tokens += n
            e.generation_tokens_total += n
            e.activity += 1
            e._recent.append((e.clock(), n))

    def finish(self, reason: str) -> None:
        """The request leaves the batch (idempotent)."""
        e = self.engine
        with e.cond:
            if self.done:
                return
            self.done = True
            if self.generated == 0:
                e.before_first -= 1
            e.running -= 1
            e.kv_tokens -= self.prompt + self.generated
            e.finished[reason] = e.finished.get(reason, 0) + 1
            e.activity += 1
            e.cond.notify_all()


def generate(req: Request, the_plan: Plan, lat: Latency, emit: Callable[[str, str], None] | None = None) -> bool:
    """Send the plan's pieces paced by ``lat`` (``emit(field, piece)`` for each;
    None: a non-streamed answer, the same waits). False if the engine aborted
    the request (the pieces sent so far are in ``req.generated``). A client
    that went away raises from ``emit``."""
    for wait_s, (field, piece) in zip(delays(len(the_plan), lat), the_plan.tokens):
        if not req.wait(wait_s):
            return False
        req.token()
        if emit is not None:
            emit(field, piece)
    if not the_plan.tokens and not req.wait(lat.first_token_s):
        return False
    return True


# --- the wire -------------------------------------------------------------------------------------
class SSE:
    """A ``text/event-stream`` answer in HTTP/1.1 chunked framing, one chunk per event."""

    def __init__(self, handler, headers: list[tuple[str, str]]):
        self.h = handler
        handler.send_response(200)
        for k, v in headers:
            handler.send_header(k, v)
        handler.end_headers()
        handler.wfile.flush()

    def raw(self, data: bytes) -> None:
        self.h.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.h.wfile.flush()

    def event(self, body) -> None:
        self.raw(b"data: " + (body if isinstance(body, bytes) else json.dumps(body).encode()) + b"\n\n")

    def done(self) -> None:
        self.raw(b"data: [DONE]\n\n")
        self.h.wfile.write(b"0\r\n\r\n")
        self.h.wfile.flush()


def gone(handler) -> None:
    """The client went away mid-answer: this connection ends."""
    handler.close_connection = True


# --- Prometheus text ------------------------------------------------------------------------------
def _escape(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value) -> str:
    return repr(float(value))


def family(name: str, kind: str, doc: str, samples: list[tuple[dict, float]]) -> list[str]:
    """One metric family in the Prometheus text format 0.0.4 (labels sorted)."""
    out = [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        lab = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(labels.items()))
        out.append(f"{name}{{{lab}}} {_num(value)}" if lab else f"{name} {_num(value)}")
    return out


PROMETHEUS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def vllm_metrics(engine: Engine, model_name: str, engine_index: int = 0) -> str:
    """vLLM's /metrics (vllm/v1/metrics/loggers.py names and labels)."""
    s = engine.stats()
    lab = {"model_name": model_name, "engine": str(engine_index)}
    out = family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", [(lab, s["running"])])
    out += family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", [(lab, s["waiting"])])
    out += family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", [(lab, s["kv_usage"])])
    out += family("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", [(lab, s["prompt_tokens_total"])])
    out += family("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
                  [(lab, s["generation_tokens_total"])])
    out += family("vllm:request_success_total", "counter", "Count of successfully processed requests.",
                  [({**lab, "finished_reason": r}, s["finished"].get(r, 0)) for r in ("stop", "length", "abort")])
    return "\n".join(out) + "\n"


TRTLLM_TOKENS_PER_BLOCK = 32


def trtllm_iteration_stats(engine: Engine, iteration: int, max_batch_size: int | None) -> dict:
    """One of trtllm-serve's /metrics iteration stats (the executor's IterationStats as JSON)."""
    s = engine.stats()
    blocks = s["kv_capacity_tokens"] // TRTLLM_TOKENS_PER_BLOCK
    used = min(blocks, -(-s["kv_tokens"] // TRTLLM_TOKENS_PER_BLOCK))
    return {
        "iter": iteration, "iterLatencyMS": 0.0, "timestamp": time.strftime("%m-%d-%Y %H:%M:%S"),
        "numActiveRequests": s["running"], "numQueuedRequests": s["waiting"], "numCompletedRequests": s["completed"],
        "maxNumActiveRequests": max_batch_size or 2048, "maxBatchSizeStatic": max_batch_size or 2048,
        "gpuMemUsage": 0, "cpuMemUsage": 0, "pinnedMemUsage": 0, "newActiveRequestsQueueLatencyMS": 0.0,
        "kvCacheStats": {"maxNumBlocks": blocks, "freeNumBlocks": blocks - used, "usedNumBlocks": used,
                         "tokensPerBlock": TRTLLM_TOKENS_PER_BLOCK, "allocTotalBlocks": used, "allocNewBlocks": 0,
                         "reusedBlocks": 0, "missedBlocks": 0, "cacheHitRate": 0.0},
        "inflightBatchingStats": {"numScheduledRequests": s["running"], "numContextRequests": 0,
                                  "numGenRequests": s["running"], "numPausedRequests": 0, "numCtxTokens": 0,
                                  "microBatchId": 0, "avgNumDecodedTokensPerIter": 1.0},
    }


def trtllm_prometheus(engine: Engine, iteration_stats: bool) -> str:
    """trtllm-serve's /prometheus/metrics (tensorrt_llm/metrics/collector.py)."""
    s = engine.stats()
    lab = {"model_name": "undefined", "engine_type": "undefined"}
    out = family("trtllm_request_success_total", "counter", "Count of successfully processed requests.",
                 [({**lab, "finished_reason": r}, n) for r, n in sorted(s["finished"].items())])
    out += family("trtllm_prompt_tokens_total", "counter", "Cumulative number of prompt (input) tokens processed.",
                  [(lab, s["prompt_tokens_total"])])
    out += family("trtllm_generation_tokens_total", "counter", "Cumulative number of generation (output) tokens produced.",
                  [(lab, s["generation_tokens_total"])])
    if iteration_stats:
        out += family("trtllm_num_requests_running", "gauge", "Number of active requests", [(lab, s["running"])])
        out += family("trtllm_num_requests_waiting", "gauge", "Number of queued requests", [(lab, s["waiting"])])
        out += family("trtllm_kv_cache_utilization", "gauge", "KV cache utilization", [(lab, s["kv_usage"])])
    return "\n".join(out) + "\n"


# --- stopping ---------------------------------------------------------------------------------------
def on_sigterm_once(run: Callable[[], None]) -> None:
    """SIGTERM starts ``run`` in a thread (once; later ones are ignored): the
    signal handler returns at once, so the accept loop goes on answering
    (503s, health) while the server drains."""
    import signal

    started = threading.Event()

    def handler(signum, frame):
        if not started.is_set():
            started.set()
            threading.Thread(target=run, daemon=True).start()

    signal.signal(signal.SIGTERM, handler)


def stop_listening(httpd) -> None:
    """No new connection (the listening socket closed, so connects are refused);
    the connections in flight go on in their threads."""
    httpd.shutdown()
    httpd.server_close()


@functools.lru_cache(maxsize=None)
def json_handler() -> type:
    """What the vLLM and TensorRT-LLM stand-ins' HTTP handlers share (their
    base class: ``class Handler(streaming.json_handler())``): HTTP/1.1
    keep-alive, a response from bytes, text or a JSON document with its
    length, and the request's JSON body (``ValueError`` when it is not JSON,
    or its Content-Length not a number). http.server is imported here, by
    the ranks that serve, not by every importer of this module (about 25 ms)."""
    from http.server import BaseHTTPRequestHandler

    class JsonHandler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, code: int, body, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body).encode())
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _json_body(self):
            length = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(length) or b"{}")

    return JsonHandler
