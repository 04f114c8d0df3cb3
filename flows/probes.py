"""Readiness probes through the SSH connection.

An HTTP probe is one request to ``127.0.0.1:port`` on a node, carried by a
direct-tcpip channel of the runner's connection to it: it works wherever SSH
does, with no other route to the cluster. A probe passes when the status is
the expected one *and* its body check (named in the plan, defined here)
passes: a ``curl -s`` that only sees an HTTP answer would call a 503 ready.
"""

from __future__ import annotations

import http.client
import io
import json
import re
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import systems
from llmdeploy import interrupt
from llmdeploy.errors import UnreachableError
from llmdeploy.inventory import Node
from llmdeploy.loadgen import SendError
from llmdeploy.releaseplan import Probe
from llmdeploy.runner import COUNTS, Runner

if TYPE_CHECKING:  # pragma: no cover - types only
    import paramiko


def ssh_errors() -> tuple[type[Exception], ...]:
    """What a forward over a node's SSH connection raises when it cannot reach
    the port (paramiko is imported here, by a probe, not when the tool starts)."""
    import paramiko

    return (paramiko.SSHException, UnreachableError)


def probe_errors() -> tuple[type[Exception], ...]:
    """What an HTTP request over SSH raises when it gets no answer (``except probe_errors():``)."""
    return (OSError, ValueError, http.client.HTTPException, *ssh_errors())

# what a body check raises on an answer it cannot read (RecursionError: JSON nested too deep)
UNREADABLE = (ValueError, KeyError, AttributeError, TypeError, RecursionError)


def http_via_ssh(runner: Runner, node: Node, port: int, method: str, path: str, body: dict | None, timeout: float,
                 headers: dict[str, str] | None = None, dest: str = "127.0.0.1") -> tuple[int, bytes]:
    """One HTTP request to ``dest:port`` as seen from ``node`` (default: its
    own loopback) over its SSH connection. Interrupted (KeyboardInterrupt),
    its channel is left open and the connection given up (``connect.left_open``,
    ``Runner.abandon``)."""
    hc = None
    try:
        hc = _http_over_ssh(runner, node, port, dest, timeout)
        data = json.dumps(body).encode() if body is not None else None
        hdrs = dict(headers or {})
        if data:
            hdrs.setdefault("Content-Type", "application/json")
        hc.request(method, path, body=data, headers=hdrs)
        resp = hc.getresponse()
        status, answer = resp.status, resp.read()
    except (Exception, interrupt.Interrupted):  # Interrupted: raised between two reads, holding no lock
        if hc is not None:
            hc.close()
        raise
    except BaseException:
        from transports.ssh.connect import left_open

        if hc is not None and isinstance(hc.sock, _ChannelSocket):
            left_open(hc.sock.chan)
        runner.abandon(runner.transport.carrier(node))
        raise
    hc.close()
    return status, answer


class _ChannelRaw(io.RawIOBase):
    """A paramiko channel as a raw stream, so that ``io.BufferedReader`` can
    buffer it: paramiko's own file object lacks ``peek``, which
    http.client's readline needs for a chunked answer (a streamed one)."""

    def __init__(self, chan: paramiko.Channel):
        self.chan = chan
        self.cut = interrupt.Command()

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        # the channel's timeout, waited in slices: a Ctrl-C that came after the request started cuts it between two
        timeout = self.chan.gettimeout()
        for left in interrupt.slices(None if timeout is None else time.monotonic() + timeout, self.cut.check):
            self.chan.settimeout(left)
            try:
                data = self.chan.recv(len(b))
                break
            except socket.timeout:
                continue
            finally:
                self.chan.settimeout(timeout)
        else:
            raise socket.timeout("timed out")
        b[:len(data)] = data
        return len(data)


class _ChannelSocket:
    """What http.client needs of a socket, on a paramiko channel."""

    def __init__(self, chan: paramiko.Channel):
        self.chan = chan

    def sendall(self, data) -> None:
        self.chan.sendall(data)

    def makefile(self, mode: str = "rb", *args, **kwargs):
        return io.BufferedReader(_ChannelRaw(self.chan))

    def settimeout(self, t) -> None:
        self.chan.settimeout(t)

    def close(self) -> None:
        self.chan.close()


def _http_over_ssh(runner: Runner, node: Node, port: int, dest: str, timeout: float) -> http.client.HTTPConnection:
    """An HTTP connection to ``dest:port`` as seen from ``node``: a direct-tcpip channel of its SSH connection."""
    transport = runner.connection(node).client.get_transport()
    # the forward may leave another host than the node (the transport's carrier): the address it asks for there
    dest = runner.transport.forward_dest(node, dest)
    COUNTS.add(node.name, "forwards")
    chan = transport.open_channel("direct-tcpip", (dest, port), ("127.0.0.1", 0), timeout=timeout)
    chan.settimeout(timeout)
    hc = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    hc.sock = _ChannelSocket(chan)
    return hc


def stream_lines(hc: http.client.HTTPConnection, path: str, body: dict, headers: dict[str, str] | None) -> Iterator[bytes]:
    """POST ``body`` as JSON and yield the answer's lines as they arrive (a
    streamed chat completion's server-sent events); an HTTP status other than
    200 raises ``loadgen.SendError`` with the start of the answer. The
    connection is closed when the lines end or the reader stops."""
    try:
        hc.request("POST", path, body=json.dumps(body).encode(), headers={"Content-Type": "application/json", **(headers or {})})
        resp = hc.getresponse()
        if resp.status != 200:
            raise SendError(f"HTTP {resp.status}: {resp.read(200).decode(errors='replace').strip()[:120]}")
        while True:
            line = resp.readline()
            if not line:
                return
            yield line
    finally:
        hc.close()


def ssh_sender(runner: Runner, node: Node, port: int, path: str, headers: dict[str, str] | None, dest: str = "127.0.0.1"):
    """``send(body, timeout)`` for ``loadgen.run_level``: each request on its own channel of ``node``'s SSH connection."""
    runner.connection(node)  # opened here, once, not by the load's threads at the same time

    def send(body: dict, timeout: float) -> Iterator[bytes]:
        try:
            hc = _http_over_ssh(runner, node, port, dest, timeout)
        except ssh_errors() as exc:  # the forward was refused: the port is closed
            raise SendError(f"no connection to {dest}:{port} from {node.name}: {exc}") from None
        return stream_lines(hc, path, body, headers)

    return send


def direct_sender(ip: str, port: int, path: str, headers: dict[str, str] | None):
    """``send(body, timeout)`` straight to ``ip:port`` (where the endpoint is reachable from here)."""

    def send(body: dict, timeout: float) -> Iterator[bytes]:
        return stream_lines(http.client.HTTPConnection(ip, port, timeout=timeout), path, body, headers)

    return send


def chat_message(raw: bytes) -> tuple[str, str]:
    """(reasoning, content) of a chat completion, streamed (SSE) or not."""
    text = raw.decode(errors="replace")
    reasoning, content = [], []
    if text.lstrip().startswith("{"):
        doc = json.loads(text)
        for c in doc.get("choices", []):
            m = c.get("message") or {}
            reasoning.append(m.get("reasoning_content") or m.get("reasoning") or "")
            content.append(m.get("content") or "")
    else:
        events = [line for line in text.splitlines() if line.startswith("data:")]
        if not events:
            raise ValueError("neither a JSON chat completion nor server-sent events")
        for line in events:
            if line[5:].strip() not in ("", "[DONE]"):
                doc = json.loads(line[5:])
                for c in doc.get("choices", []):
                    d = c.get("delta") or {}
                    reasoning.append(d.get("reasoning_content") or d.get("reasoning") or "")
                    content.append(d.get("content") or "")
    return "".join(reasoning), "".join(content)


def _models(body: bytes, model: str) -> str | None:
    ids = [m.get("id") for m in json.loads(body).get("data", [])]
    return None if model in ids else f"does not list {model!r} (has {ids})"


def split_think(content: str) -> tuple[str, str] | None:
    """(reasoning, answer) of content that begins with a <think>...</think>
    block (a server without a reasoning parser), else None."""
    if not (content.lstrip().startswith("<think>") and "</think>" in content):
        return None
    head, answer = content.split("</think>", 1)
    return head.replace("<think>", "", 1), answer


def _think(body: bytes, _: str) -> str | None:
    """Thinking on, no reasoning parser: the content begins with a <think>...</think> block."""
    _, content = chat_message(body)
    if split_think(content) is not None:
        return None
    return f"answered {content[:120]!r} (expected content that begins with <think>...</think>)"


def _reasoning(body: bytes, _: str) -> str | None:
    """A reasoning parser split the thinking out: reasoning content and an answer."""
    reasoning, content = chat_message(body)
    if reasoning.strip() and content.strip():
        return None
    return f"answered reasoning {reasoning[:80]!r}, content {content[:80]!r} (expected both: the reasoning parser splits <think> out)"


def _any(body: bytes, _: str) -> str | None:
    return None


def _answer(body: bytes, _: str) -> str | None:
    """A chat completion with an answer (content or reasoning)."""
    reasoning, content = chat_message(body)
    return None if (content or reasoning).strip() else f"answered no content: {body[:160]!r}"


def _json_field(body: bytes, arg: str) -> str | None:
    """``arg`` is ``key=value``: the JSON body has that value (as text), e.g. etcd's health=true."""
    key, _, want = arg.partition("=")
    doc = json.loads(body)
    if not isinstance(doc, dict):
        return f"answered {body[:200]!r}, not a JSON object (expected {key}={want})"
    have = doc.get(key)
    return None if str(have).lower() == want.lower() else f"says {key}={have!r} (expected {want})"


def _metric(body: bytes, name: str) -> str | None:
    """Prometheus text that has a sample of ``name``."""
    lines = body.decode(errors="replace").splitlines()
    for line in lines:
        if line.startswith(name) and line[len(name):len(name) + 1] in ("{", " "):
            return None
    if not any(_SAMPLE.match(line) for line in lines):
        return f"has no {name} sample: not Prometheus text: {body[:200]!r}"
    return f"has no {name} sample"


# a Prometheus text-format sample: name{labels} value
_SAMPLE = re.compile(r"^[A-Za-z_:][A-Za-z0-9_:]*(\{[^}]*\})?\s+\S")


def _prometheus(body: bytes, _: str) -> str | None:
    """A metrics page in Prometheus text format (comments and samples; no
    particular metric: which ones a server shows may depend on the traffic it had)."""
    lines = [ln for ln in body.decode(errors="replace").splitlines() if ln.strip()]
    bad = next((ln for ln in lines if not ln.startswith("#") and not _SAMPLE.match(ln)), None)
    if bad is not None:
        return f"is not Prometheus text (line {bad[:80]!r}): {body[:200]!r}"
    return None


# the generic checks; a serving system adds its own (systems.probe_checks: e.g. a
# frontend's health document), under the names its plans (and plan.json files) use
CHECKS: dict[str, Callable[[bytes, str], str | None]] = {
    "": _any, "models": _models, "think": _think, "reasoning": _reasoning, "answer": _answer,
    "json": _json_field, "metric": _metric, "prometheus": _prometheus,
}


def check_named(name: str) -> Callable[[bytes, str], str | None] | None:
    """The body check a probe names: a generic one, or one a serving system adds; None if none has that name.
    A system's package is loaded only for a name that is not a generic check."""
    return CHECKS.get(name) or systems.probe_check(name)


def unknown_check(name: str) -> str:
    return f"names the readiness check {name!r}, which neither this tool nor any of its serving systems defines"


def body_problem(p: Probe, body: bytes) -> str | None:
    """What the probe's body check says of ``body`` (None: passes), for a
    reader that shows it without the probe's description (status)."""
    check = check_named(p.check)
    if check is None:
        return unknown_check(p.check)
    try:
        return check(body, p.arg)
    except UNREADABLE as exc:
        return f"unreadable answer ({type(exc).__name__}): {body[:200]!r}"


@dataclass(frozen=True)
class Fetched:
    """What the one request of a probe got (:func:`fetch`): ``status``, the
    HTTP status it answered (None: no answer), with ``body``; or ``error``,
    what kept it from an answer (the SSH forward refused, the connection
    lost, a timeout). ``problem`` is None when it answered the probe's
    status, else what was seen, in words that name the probe."""

    status: int | None
    body: bytes = b""
    error: Exception | None = None
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """It answered the probe's status (its body is not checked here)."""
        return self.problem is None


def fetch(runner: Runner, node: Node, p: Probe, timeout: float, shown: int = 200) -> Fetched:
    """The one request of ``p`` over ``node``'s SSH connection and its status
    checked: what it answered, or the error that kept it from an answer; the
    problem, when it did not answer ``p.status``, shows the start of the
    body (``shown`` bytes) or the error. Every "request over SSH and check
    the status" of the flows (readiness, drain's in-flight count, status's
    endpoint health, the demo's question) is this."""
    try:
        status, body = http_via_ssh(runner, node, p.port, p.method, p.path, p.body, timeout, p.headers, dest=p.ip)
    except probe_errors() as exc:
        return Fetched(status=None, error=exc, problem=f"{p.describe()}: {type(exc).__name__}: {exc}")
    if status != p.status:
        return Fetched(status=status, body=body, problem=f"{p.describe()} answered {status}: {body[:shown]!r}")
    return Fetched(status=status, body=body)


class BodyProblem(str):
    """What :func:`http_probe` says when the probe's status came but its body
    failed the check (a ``str``: shown as any other problem)."""


def http_probe(runner: Runner, node: Node, p: Probe, timeout: float) -> str | None:
    """None when ``p`` passes, else what was seen (a :class:`BodyProblem`
    when the answer came with the probe's status and its body failed the check)."""
    got = fetch(runner, node, p, timeout)
    if not got.ok:
        return got.problem
    body = got.body
    check = check_named(p.check)
    if check is None:
        return f"{p.describe()} {unknown_check(p.check)}"
    try:
        problem = check(body, p.arg)
    except UNREADABLE as exc:
        return f"{p.describe()}: unreadable answer ({type(exc).__name__}: {exc}): {body[:200]!r}"
    return BodyProblem(f"{p.describe()} {problem}") if problem else None


def samples(body: bytes, names: list[str]) -> dict[str, float]:
    """{name: the sum of its samples} for each of ``names`` a metrics page
    has: Prometheus text (labels aside), or JSON iteration statistics (a
    list of objects, TensorRT-LLM's ``/metrics``: the last one's fields; an
    empty list has none). ValueError: a page that is neither."""
    text = body.decode(errors="replace").strip()
    if text.startswith("["):
        stats = json.loads(text)
        if not isinstance(stats, list):
            raise ValueError("metrics JSON is not a list")
        last = stats[-1] if stats and isinstance(stats[-1], dict) else {}
        return {n: float(last[n]) for n in names if isinstance(last.get(n), (int, float)) and not isinstance(last.get(n), bool)}
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not _SAMPLE.match(line):
            continue
        name = line.split("{", 1)[0].split(None, 1)[0]
        if name in names:
            # name{labels} value [timestamp]
            after = line[len(name):]
            rest = (after[after.index("}") + 1:] if after.startswith("{") else after).split()
            try:
                sums[name] = sums.get(name, 0.0) + float(rest[0])
            except (ValueError, IndexError):
                continue
    return sums


def inflight(body: bytes, names: list[str]) -> tuple[int, str]:
    """(requests in flight, the samples that make it up, in words) from a
    metrics page: the sum of ``names``' samples (``samples``). JSON iteration
    statistics with no iteration since the last read mean nothing is in
    flight. ValueError when none of ``names`` is there."""
    if body.strip() == b"[]":
        return 0, "no iteration since the last read"
    got = samples(body, names)
    if not got:
        raise ValueError(f"the metrics page has no sample of {', '.join(names)}")
    return int(round(sum(got.values()))), ", ".join(f"{k} {v:g}" for k, v in got.items())
