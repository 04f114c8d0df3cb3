"""Readiness probes through the SSH connection.

An HTTP probe is one request to ``127.0.0.1:port`` on a node, carried by a
direct-tcpip channel of the runner's connection to it: it works wherever SSH
does, with no other route to the cluster. A probe passes when the status is
the expected one *and* its body check (named in the plan, defined here)
passes: a ``curl -s`` that only sees an HTTP answer would call a 503 ready.
"""

from __future__ import annotations

import http.client
import json
from typing import Callable

import paramiko

from llmdeploy.inventory import Node
from llmdeploy.releaseplan import Probe
from llmdeploy.runner import Runner

PROBE_ERRORS = (OSError, ValueError, http.client.HTTPException, paramiko.SSHException)


def http_via_ssh(runner: Runner, node: Node, port: int, method: str, path: str, body: dict | None, timeout: float,
                 headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """One HTTP request to ``127.0.0.1:port`` on ``node`` over its SSH connection."""
    conn = runner.connection(node)
    transport = conn.client.get_transport()
    chan = transport.open_channel("direct-tcpip", ("127.0.0.1", port), ("127.0.0.1", 0), timeout=timeout)
    chan.settimeout(timeout)
    hc = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    hc.sock = chan
    try:
        data = json.dumps(body).encode() if body is not None else None
        hdrs = dict(headers or {})
        if data:
            hdrs.setdefault("Content-Type", "application/json")
        hc.request(method, path, body=data, headers=hdrs)
        resp = hc.getresponse()
        return resp.status, resp.read()
    finally:
        hc.close()


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
        for line in text.splitlines():
            if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
                doc = json.loads(line[5:])
                for c in doc.get("choices", []):
                    d = c.get("delta") or {}
                    reasoning.append(d.get("reasoning_content") or d.get("reasoning") or "")
                    content.append(d.get("content") or "")
    return "".join(reasoning), "".join(content)


def _models(body: bytes, model: str) -> str | None:
    ids = [m.get("id") for m in json.loads(body).get("data", [])]
    return None if model in ids else f"does not list {model!r} (has {ids})"


def _think(body: bytes, _: str) -> str | None:
    """vLLM with thinking on: the content begins with a <think>...</think> block."""
    reasoning, content = chat_message(body)
    text = content
    if text.lstrip().startswith("<think>") and "</think>" in text:
        return None
    return f"answered {text[:120]!r} (expected content that begins with <think>...</think>)"


def _reasoning(body: bytes, _: str) -> str | None:
    """A reasoning parser split the thinking out: reasoning content and an answer."""
    reasoning, content = chat_message(body)
    if reasoning.strip() and content.strip():
        return None
    return f"answered reasoning {reasoning[:80]!r}, content {content[:80]!r} (expected both: the reasoning parser splits <think> out)"


def _any(body: bytes, _: str) -> str | None:
    return None


CHECKS: dict[str, Callable[[bytes, str], str | None]] = {"": _any, "models": _models, "think": _think, "reasoning": _reasoning}


def http_probe(runner: Runner, node: Node, p: Probe, timeout: float) -> str | None:
    """None when ``p`` passes, else what was seen."""
    try:
        status, body = http_via_ssh(runner, node, p.port, p.method, p.path, p.body, timeout, p.headers)
    except PROBE_ERRORS as exc:
        return f"{p.describe()}: {type(exc).__name__}: {exc}"
    if status != p.status:
        return f"{p.describe()} answered {status}: {body[:200]!r}"
    try:
        problem = CHECKS[p.check](body, p.arg)
    except (ValueError, KeyError, AttributeError, TypeError) as exc:
        return f"{p.describe()}: unreadable answer ({type(exc).__name__}: {exc}): {body[:200]!r}"
    return f"{p.describe()} {problem}" if problem else None
