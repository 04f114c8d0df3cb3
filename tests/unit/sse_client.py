"""A small client for the serving stand-ins' HTTP, shared by the tests that
start them as real processes: a streamed chat read event by event, GETs,
Prometheus samples, and waiting for a condition (by polling, never by a
wall-clock figure)."""

from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.request


class Stream:
    """``POST path`` with ``stream: true``; its SSE events as they come."""

    def __init__(self, host: str, port: int, path: str, body: dict, timeout: float = 60):
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        self.conn.request("POST", path, json.dumps({**body, "stream": True}), {"Content-Type": "application/json"})
        self.resp = self.conn.getresponse()
        self.done = False

    def next(self) -> dict | None:
        """The next event's JSON; None after ``data: [DONE]`` (or at the end)."""
        while not self.done:
            line = self.resp.readline()
            if not line:
                self.done = True
                return None
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                self.done = True
                return None
            return json.loads(line[6:])
        return None

    def next_token(self) -> tuple[str, str]:
        """Read events until one that carries a token: (field, piece)."""
        while True:
            ev = self.next()
            assert ev is not None, "the stream ended before a token"
            got = tokens_of([ev])
            if got:
                return got[0]

    def rest(self) -> list[dict]:
        out = []
        while (ev := self.next()) is not None:
            out.append(ev)
        return out

    def close(self) -> None:
        self.conn.close()


def tokens_of(events: list[dict]) -> list[tuple[str, str]]:
    """(field, piece) of every chunk whose delta carries text."""
    out = []
    for ev in events:
        for ch in ev.get("choices") or []:
            for field in ("reasoning_content", "content"):
                piece = (ch.get("delta") or {}).get(field)
                if piece:
                    out.append((field, piece))
    return out


def finish_reasons(events: list[dict]) -> list[str]:
    return [ch["finish_reason"] for ev in events for ch in ev.get("choices") or [] if ch.get("finish_reason")]


def usage_of(events: list[dict]) -> dict | None:
    found = [ev["usage"] for ev in events if ev.get("usage")]
    return found[-1] if found else None


def get(url: str, timeout: float = 10) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def post(url: str, body: dict, timeout: float = 60) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def sample(text: str, name: str, **labels) -> float | None:
    """The value of the first sample ``name{...}`` whose labels include ``labels``."""
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            return float(m.group(4))
    return None


def wait_until(check, what: str, timeout: float = 30.0, every: float = 0.05):
    """Poll ``check()`` until it returns something true; that value. Fails with ``what`` after ``timeout``."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        try:
            last = check()
        except OSError as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")
