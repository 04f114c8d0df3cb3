"""A bounded, streaming load against an OpenAI-compatible chat endpoint, and
what it measured.

The figures are the ones serving benchmarks report (vLLM's ``vllm bench
serve``, NVIDIA's aiperf, SGLang's ``bench_serving``), measured the same way:

- TTFT: from sending the request to the first streamed chunk that carries
  text (content or reasoning);
- ITL: the gaps between chunks that carry text, after the first;
- TPOT: (end-to-end - TTFT) / (output tokens - 1), per request;
- end-to-end latency: from sending to the stream's end (``[DONE]``);
- output tokens: the server's own count (``usage.completion_tokens``, asked
  for with ``stream_options.include_usage``), else the text chunks counted;
- output tokens/s and requests/s: over the wall time of one concurrency level.

Input length is counted in words (no tokenizer: the tool runs where no
model hub is reachable); the server's ``usage.prompt_tokens`` says what it
made of them. ``ignore_eos`` asks for exactly ``output_tokens`` tokens, as
the benchmarks above do (vLLM, SGLang and TensorRT-LLM take it as an extra
parameter of the chat request).

Everything here but :func:`run_level` is pure. ``run_level`` takes the way a
request is sent (``send``: body -> the response's lines), so the same loop
runs through an SSH channel, a direct socket, or a test's local server.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator

from . import interrupt

# the figures a level reports, in milliseconds (latencies) and per second (rates)
LATENCIES = ("ttft", "tpot", "itl", "e2e")
PERCENTILES = (50, 90, 95, 99)


class SendError(Exception):
    """A request that got no stream: an HTTP status other than 200, a refused
    or cut connection. Its text is the reason a level's errors are grouped by."""


@dataclass(frozen=True)
class Load:
    """What to send: ``requests`` per concurrency level, each asking for
    ``output_tokens`` tokens from a prompt of ``input_tokens`` words (or the
    ``prompts`` given, in turn). Bounded: no request starts after
    ``duration_s`` from a level's start, and each has ``request_timeout_s``."""

    requests: int = 32
    concurrency: tuple[int, ...] = (1, 4)
    input_tokens: int = 128
    output_tokens: int = 128
    prompts: tuple[str, ...] = ()
    duration_s: float = 300.0
    request_timeout_s: float = 120.0

    def describe(self) -> str:
        src = f"{len(self.prompts)} prompts" if self.prompts else f"{self.input_tokens} words in"
        return f"{self.requests} requests at concurrency {','.join(map(str, self.concurrency))}, {src}, {self.output_tokens} tokens out"

    def shape(self) -> str:
        """The load's shape, for comparing like with like (the gate's baseline key)."""
        src = f"p{len(self.prompts)}" if self.prompts else f"in{self.input_tokens}"
        return f"n{self.requests}-c{'.'.join(map(str, self.concurrency))}-{src}-out{self.output_tokens}"


@dataclass
class Sample:
    """One request: when it started (seconds from the level's start), its
    latencies in seconds (None where it failed before them), the tokens it got."""

    start: float
    ok: bool = False
    error: str = ""
    ttft: float | None = None
    e2e: float | None = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: int | None = None

    @property
    def tpot(self) -> float | None:
        if not self.ok or self.ttft is None or self.e2e is None or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


# --- the requests ------------------------------------------------------------------------------
_WORDS = ("the cluster serves requests while every node keeps its own shard of the model and the "
          "scheduler batches tokens across many users so that latency stays low and throughput high").split()


def synthetic_prompt(words: int, i: int) -> str:
    """A prompt of ``words`` words, different per request ``i`` (so no two
    share a prefix-cache hit beyond the first word)."""
    out = [f"request {i}:"]
    out += [_WORDS[(i * 7 + k) % len(_WORDS)] for k in range(max(0, words - 2))]
    return " ".join(out)


def request_body(base: dict[str, Any], load: Load, i: int) -> dict[str, Any]:
    """The chat request ``i`` of a load: ``base`` (the release's own chat
    check: its model and template arguments) with the prompt, a streamed
    answer with usage, and a fixed output length."""
    prompt = load.prompts[i % len(load.prompts)] if load.prompts else synthetic_prompt(load.input_tokens, i)
    body = {k: v for k, v in base.items() if k not in ("messages", "stream", "stream_options", "max_tokens", "max_completion_tokens")}
    body.update({
        "messages": [{"role": "user", "content": prompt}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": load.output_tokens,
        "ignore_eos": True,
    })
    return body


def measure(lines: Iterable[bytes], t0: float, clock: Callable[[], float] = time.monotonic, start: float = 0.0) -> Sample:
    """A :class:`Sample` from a response's server-sent event lines, read as
    they arrive (``clock`` read at each); ``t0`` is when the request was sent."""
    s = Sample(start=start)
    last: float | None = None
    chunks = 0
    usage_tokens: int | None = None
    done = False
    for raw in lines:
        line = raw.decode(errors="replace").strip() if isinstance(raw, bytes) else str(raw).strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            done = True
            break
        try:
            doc = json.loads(data)
        except ValueError:
            s.error = f"unreadable event {data[:60]!r}"
            return s
        if not isinstance(doc, dict):
            continue
        if doc.get("error"):
            err = doc["error"]
            s.error = "server error: " + str(err.get("message") if isinstance(err, dict) else err)[:120]
            return s
        usage = doc.get("usage") or {}
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            usage_tokens = int(usage["completion_tokens"])
            if usage.get("prompt_tokens") is not None:
                s.prompt_tokens = int(usage["prompt_tokens"])
        if any(_has_text(c) for c in doc.get("choices") or []):
            now = clock()
            if last is None:
                s.ttft = now - t0
            else:
                s.itl.append(now - last)
            last = now
            chunks += 1
    end = clock()
    if not done:
        s.error = f"stream cut after {chunks} chunks (no [DONE])"
        return s
    if chunks == 0:
        s.error = "no text in the answer"
        return s
    s.ok, s.e2e = True, end - t0
    s.output_tokens = usage_tokens if usage_tokens is not None else chunks
    return s


def _has_text(choice: object) -> bool:
    d = choice.get("delta") if isinstance(choice, dict) else None
    return isinstance(d, dict) and bool(d.get("content") or d.get("reasoning_content") or d.get("reasoning"))


# --- one concurrency level ---------------------------------------------------------------------
def run_level(send: Callable[[dict[str, Any], float], Iterator[bytes]], bodies: list[dict[str, Any]], concurrency: int, load: Load,
              clock: Callable[[], float] = time.monotonic, stop: threading.Event | None = None) -> tuple[list[Sample], float]:
    """Send ``bodies`` with at most ``concurrency`` in flight; no request starts
    after ``load.duration_s`` (or once ``stop`` is set). (samples in sending
    order, the level's wall time in seconds)."""
    t_start = clock()
    samples: list[Sample | None] = [None] * len(bodies)
    next_i = [0]
    lock = threading.Lock()
    stop = stop or threading.Event()

    def worker() -> None:
        while True:
            with lock:
                i = next_i[0]
                if i >= len(bodies) or stop.is_set() or clock() - t_start >= load.duration_s:
                    return
                next_i[0] += 1
            t0 = clock()
            try:
                samples[i] = measure(send(bodies[i], load.request_timeout_s), t0, clock, start=t0 - t_start)
            except SendError as exc:
                samples[i] = Sample(start=t0 - t_start, error=str(exc))
            except interrupt.Interrupted:  # Ctrl-C: the main thread raises it too, from its join
                return
            except Exception as exc:  # a cut channel, a timeout, a garbled answer: one request's error, never the loop's
                samples[i] = Sample(start=t0 - t_start, error=f"{type(exc).__name__}: {exc}"[:160])

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(max(1, min(concurrency, len(bodies))))]
    for t in threads:
        t.start()
    try:
        for t in threads:
            interrupt.join(t)  # in slices: a Ctrl-C is raised here, holding no lock
    except BaseException:  # Ctrl-C: no request starts any more; those in flight end with their timeout
        stop.set()
        raise
    return [s for s in samples if s is not None], clock() - t_start


# --- the figures -------------------------------------------------------------------------------
def percentile(values: list[float], p: float) -> float | None:
    """The ``p``-th percentile, linearly interpolated between the closest
    ranks (numpy's default, which vLLM's benchmark uses)."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(samples: list[Sample], wall_s: float, concurrency: int) -> dict[str, Any]:
    """One level's figures: latencies in ms (mean and percentiles), rates,
    and the errors grouped by reason."""
    ok = [s for s in samples if s.ok]
    series = {
        "ttft": [s.ttft for s in ok if s.ttft is not None],
        "tpot": [t for s in ok if (t := s.tpot) is not None],
        "itl": [x for s in ok for x in s.itl],
        "e2e": [s.e2e for s in ok if s.e2e is not None],
    }
    out: dict[str, Any] = {
        "concurrency": concurrency, "requests": len(samples), "ok": len(ok), "errors": len(samples) - len(ok), "duration_s": round(wall_s, 3),
    }
    for name, xs in series.items():
        out[name] = {"mean": _ms(sum(xs) / len(xs)) if xs else None, **{f"p{p}": _ms(percentile(xs, p)) for p in PERCENTILES}}
    tokens = sum(s.output_tokens for s in ok)
    prompt = [s.prompt_tokens for s in ok if s.prompt_tokens is not None]
    out["output_tokens"] = tokens
    out["mean_prompt_tokens"] = round(sum(prompt) / len(prompt), 1) if prompt else None
    out["output_tokens_per_s"] = round(tokens / wall_s, 2) if wall_s > 0 else None
    out["requests_per_s"] = round(len(ok) / wall_s, 3) if wall_s > 0 else None
    reasons: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            reasons[s.error] = reasons.get(s.error, 0) + 1
    out["error_reasons"] = reasons
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def load_doc(load: Load) -> dict[str, Any]:
    doc = asdict(load)
    doc["prompts"] = len(load.prompts)
    doc["concurrency"] = list(load.concurrency)
    return doc


def read_prompts(text: str, where: str) -> tuple[str, ...]:
    """Prompts from a file's text: JSON lines with a ``prompt`` (or
    ``text``) field, else one prompt per non-empty line. ValueError names the line."""
    out = []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{where}:{no}: not JSON: {exc}") from None
            p = doc.get("prompt") if isinstance(doc, dict) else None
            p = p if p is not None else (doc.get("text") if isinstance(doc, dict) else None)
            if not isinstance(p, str) or not p.strip():
                raise ValueError(f"{where}:{no}: a JSON line needs a non-empty \"prompt\" (or \"text\") string")
            out.append(p)
        else:
            out.append(line.strip())
    if not out:
        raise ValueError(f"{where}: no prompts in it")
    return tuple(out)
