"""The deploy lock on node 0: a directory made with ``mkdir`` (atomic: of two
racing deploys exactly one succeeds) holding ``holder.json`` (who, from
where, when, the command, a message, a random token). Released on every
exit path by the holder (matched by its token). A holder that vanished
leaves it behind: it is a lease that only ``invoke lock.break`` removes, and
``invoke lock.status`` shows with its age."""

from __future__ import annotations

import json
import os
import secrets
import shlex
import socket
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed

from . import interrupt
from .errors import LlmdeployError, UnreachableError
from .inventory import Cluster
from .release import append_script, root, who
from .runner import Runner


class LockHeld(LlmdeployError):
    """The deploy lock is held by someone else (and ``--lock-wait`` ran out)."""

    exit_code = 4


def lock_dir(cluster: Cluster) -> str:
    return f"{root(cluster)}/lock"


def audit_path(cluster: Cluster) -> str:
    return f"{root(cluster)}/audit.jsonl"


def holder_record(command: str, message: str | None) -> dict[str, Any]:
    return {
        "who": who(),
        "from": socket.gethostname(),
        "pid": os.getpid(),
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "since_epoch": int(time.time()),
        "command": command,
        "message": message or "",
        "token": secrets.token_hex(8),
    }


def acquire_script(cluster: Cluster, holder: dict[str, Any]) -> str:
    d = shlex.quote(lock_dir(cluster))
    body = shlex.quote(json.dumps(holder, sort_keys=True))
    # a folder the user cannot make is said as such (base_dir), not as a lock someone holds
    cannot = shlex.quote(f"(base_dir {cluster.base_dir}: a folder the user the tool runs as can write)")
    return (
        f"e=$(mkdir -p \"$(dirname {d})\" 2>&1) || {{ printf '%s %s\\n' \"$e\" {cannot} >&2; exit 1; }}\n"
        f"if e=$(mkdir {d} 2>&1); then printf '%s\\n' {body} > {d}/holder.json; echo acquired; "
        f"elif [ -d {d} ]; then echo held; cat {d}/holder.json 2>/dev/null || echo '{{}}'; "
        f"else printf '%s %s\\n' \"$e\" {cannot} >&2; exit 1; fi\n"
    )


def release_script(cluster: Cluster, token: str) -> str:
    d = shlex.quote(lock_dir(cluster))
    return f"if grep -q {shlex.quote(token)} {d}/holder.json 2>/dev/null; then rm -rf {d} && echo released; else echo not-ours; fi\n"


def status_script(cluster: Cluster) -> str:
    d = shlex.quote(lock_dir(cluster))
    return f"if [ -d {d} ]; then echo held; cat {d}/holder.json 2>/dev/null || echo '{{}}'; else echo free; fi\n"


def break_script(cluster: Cluster) -> str:
    d = shlex.quote(lock_dir(cluster))
    return f"if [ -d {d} ]; then cat {d}/holder.json 2>/dev/null || echo '{{}}'; rm -rf {d}; echo broken; else echo free; fi\n"


def parse_holder(out: str) -> dict[str, Any]:
    lines = out.strip().splitlines()
    try:
        doc = json.loads(lines[1]) if len(lines) > 1 else {}
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "an unknown holder (holder.json is missing or unreadable)"
    try:
        age = f"{int(time.time()) - int(holder.get('since_epoch', time.time()))}s ago"
    except (TypeError, ValueError):
        age = f"since_epoch {str(holder.get('since_epoch'))[:40]!r} unreadable"
    msg = f", message {holder['message']!r}" if holder.get("message") else ""
    def get(key: str) -> str:
        return str(holder.get(key)) if holder.get(key) is not None else "?"

    return f"{get('who')} (pid {get('pid')}) since {get('since')} ({age}), running {get('command')!r}{msg}"


AUDIT_FAILED = "llmdeploy: could not write the audit log"


def audit(runner: Runner, cluster: Cluster, command: str, result: str, release: str | None = None, held: dict[str, Any] | None = None, **extra: Any) -> None:
    """One line in node 0's audit log; a failure to write it is reported, never fatal.
    ``held``: the holder :func:`held` yielded, when the lock is released right
    after: the line is then written by the release's command (one round trip less)."""
    rec = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "who": who(), "command": command,
           "release": release, "result": result, **extra}
    if held is not None:
        held["_audit"] = append_script(audit_path(cluster), rec)
        return

    def write() -> None:
        try:
            out, err, code = runner.exec(cluster.node0, append_script(audit_path(cluster), rec), timeout=interrupt.LAST_LINE_S)
            if code != 0:
                print(f"warning: could not write the audit log on {cluster.node0.name}: {err.strip()}", file=sys.stderr)
        except Exception as exc:  # the audit must not turn a done job into a failure
            print(f"warning: could not write the audit log on {cluster.node0.name}: {exc}", file=sys.stderr)

    if interrupt.unwinding():
        # the interrupted command's last line: with a deadline, beside the interruption, never instead of it
        interrupt.bounded(f"the audit log's last line on {cluster.node0.name}", interrupt.LAST_LINE_S + 5, write)
    else:
        write()


@contextmanager
def held(runner: Runner, cluster: Cluster, command: str, message: str | None = None, wait: float = 0) -> Iterator[dict[str, Any]]:
    """Take the lock (waiting up to ``wait`` seconds), yield, release it on every exit path."""
    holder = holder_record(command, message)
    node0 = cluster.node0

    def attempt() -> dict[str, Any] | None:
        # shielded: a lock taken is always released (a Ctrl-C now is raised inside the try below)
        with interrupt.shield():
            try:
                out, err, code = runner.exec(node0, acquire_script(cluster, holder))
            except UnreachableError as exc:
                raise LlmdeployError(f"{node0.name}: cannot take the deploy lock: unreachable: {exc}") from None
        if code != 0 or not out.strip():
            raise LlmdeployError(f"{node0.name}: cannot take the deploy lock: {err.strip() or out.strip()}")
        return None if out.startswith("acquired") else parse_holder(out)

    if wait > 0:
        # poll until it is free or the wait is over; the last holder seen is reported
        said: list[bool] = []

        def waiting(rs: RetryCallState) -> None:
            assert rs.outcome is not None  # before_sleep: after an attempt
            if not said:  # once: who holds it, and how long this command waits
                said.append(True)
                print(f"the deploy lock of {cluster.name} is held by {describe(rs.outcome.result())}; waiting up to {wait:g}s (--lock-wait)",
                      file=sys.stderr, flush=True)

        def last_holder(rs: RetryCallState) -> dict[str, Any] | None:
            assert rs.outcome is not None  # called after the last attempt
            seen: dict[str, Any] | None = rs.outcome.result()
            return seen

        other = Retrying(
            stop=stop_after_delay(wait),
            wait=wait_fixed(min(2.0, wait)),
            retry=retry_if_result(lambda r: r is not None),
            retry_error_callback=last_holder,
            before_sleep=waiting,
            sleep=interrupt.sleep,  # a Ctrl-C while waiting ends the wait at once
            reraise=True,
        )(attempt)
    else:
        other = attempt()
    if other is not None:
        raise LockHeld(
            f"the deploy lock of {cluster.name} on {node0.name} is held by {describe(other)}"
            f"{f' (waited {wait:g}s)' if wait else ''}; if that holder is gone: invoke lock.break --cluster {cluster.name} --reason '...'"
        )
    try:
        yield holder
    finally:
        _release(runner, cluster, holder)


def _release(runner: Runner, cluster: Cluster, holder: dict[str, Any]) -> None:
    """Release the lock ``holder`` took (and write the audit line it carries):
    shielded, with a deadline, on every exit path, an interrupted one too."""
    node0 = cluster.node0
    script = release_script(cluster, holder["token"])
    pending = holder.pop("_audit", None)
    if pending:
        # the audit line first (as if written before the release), then the release, whatever became of the line
        script = f"{{ {pending} ; }} || echo {shlex.quote(AUDIT_FAILED)} >&2\n{script}"

    def release() -> bool:
        try:
            out, err, code = runner.exec(node0, script, timeout=interrupt.LAST_LINE_S)
            if pending and AUDIT_FAILED in err:
                print(f"warning: could not write the audit log on {node0.name}: {err.replace(AUDIT_FAILED, '').strip()}", file=sys.stderr)
        except Exception as exc:
            print(f"warning: could not release the deploy lock on {node0.name}: {exc}", file=sys.stderr)
        return True  # ended (what went wrong is said)

    with interrupt.shield():
        ended = interrupt.bounded(f"releasing the deploy lock on {node0.name}", interrupt.LAST_LINE_S + 5, release)
    if ended is None:
        print(f"the deploy lock of {cluster.name} may still be held by this command (pid {holder.get('pid')}); once it has ended: "
              f"invoke lock.break --cluster {cluster.name} --reason '...'", file=sys.stderr)
