"""Releases on the nodes: ``<base>/<cluster>/releases/<id>/`` with a
``current`` link on every node, and an append-only ledger on node 0.

Every function here builds a shell script, parses output or reads the
ledger's records (every release's attempts, the rollback target); the
runner executes the scripts. The ledger is JSON lines, appended under ``flock`` with one
``write`` per line, so an interrupted deploy never leaves a torn line. It
records attempts: every line is one event of one release (``started``,
``good``, ``failed``, ``rolled back``), never rewritten, so a release that
was good once stays known as such whatever happened to it later. Each line
carries ``sum``, a hash of the rest of it: a line edited by hand, torn or
foreign is reported and skipped, never trusted. (The audit log is written
the same way.)
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import io
import json
import re
import shlex
import socket
import time
from collections.abc import Mapping
from typing import Any

from .errors import LlmdeployError
from .inventory import Cluster

RELEASE_RE = re.compile(r"^\d{8}T\d{6}Z-[0-9a-f]{8}$")


def root(cluster: Cluster) -> str:
    return f"{cluster.base_dir}/{cluster.name}"


def releases_dir(cluster: Cluster) -> str:
    return f"{root(cluster)}/releases"


def release_dir(cluster: Cluster, rid: str) -> str:
    if not RELEASE_RE.match(rid):
        raise ValueError(f"not a release id: {rid!r}")
    return f"{releases_dir(cluster)}/{rid}"


def current_link(cluster: Cluster) -> str:
    return f"{root(cluster)}/current"


def ledger_path(cluster: Cluster) -> str:
    return f"{root(cluster)}/ledger.jsonl"


def new_id(content_hash: str, now: float | None = None) -> str:
    """Time + short hash of the rendered files and the image digest."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now)) + "-" + content_hash[:8]


def content_hash(parts: list[str]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def who() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def write_script(cluster: Cluster, rid: str, files: Mapping[str, tuple[str, int]]) -> str:
    """Unpack the release's files (``write_payload``, on standard input: no
    content, the 0600 env file's secrets included, is ever part of a command
    line on the node) into a staging directory, then rename it into place: a
    release directory is complete or absent. A failure (a torn payload, a full
    disk) leaves no staging directory and touches no other release."""
    for name in files:
        if not re.match(r"^[A-Za-z0-9._-]+$", name):
            raise ValueError(f"bad release file name {name!r}")
    final = shlex.quote(release_dir(cluster, rid))
    stage = shlex.quote(f"{releases_dir(cluster)}/.stage-{rid}")
    size = len(base64.b64decode(write_payload(files)))
    rd = shlex.quote(releases_dir(cluster))
    # a failed write says how much room is left where it wrote (a full disk is the usual cause)
    room = (f"df -Pk {rd} 2>/dev/null | awk 'NR==2 {{printf \"%s KiB free on %s\", $4, $6; "
            f"if ($4 < 1024) printf \" (the disk is full: No space left on device)\"}}'")
    lines = [
        "set -e",
        f"if [ -d {final} ]; then cat >/dev/null; echo exists; exit 0; fi",
        f'cannot() {{ echo "cannot write {releases_dir(cluster)}: $1; $({room})" >&2; exit 1; }}',
        f"rm -rf {stage} {stage}.tar",
        f"trap 'rm -rf {stage} {stage}.tar' EXIT; trap 'exit 129' HUP INT TERM",
        f'mkdir -p {stage}/logs || cannot "mkdir failed"',
        f"chmod 700 {stage}",
        f'base64 -d > {stage}.tar || cannot "the release archive could not be stored"',
        f'[ "$(wc -c < {stage}.tar)" -eq {size} ] || {{ echo "the release archive arrived torn" >&2; exit 1; }}',
        f'tar -x --no-same-owner -f {stage}.tar -C {stage} || cannot "the release files could not be unpacked"',
        f"rm -f {stage}.tar",
    ]
    lines += [f"[ -f {stage}/{name} ]" for name in sorted(files)]
    lines += [f"mv {stage} {final}", "trap - EXIT HUP INT TERM", "echo written"]
    return "\n".join(lines) + "\n"


def write_payload(files: Mapping[str, tuple[str, int]]) -> str:
    """The release's files as a base64 tar archive (modes kept), for ``write_script``'s standard input."""
    import tarfile  # only a deploy that writes a release needs it

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, (content, mode) in sorted(files.items()):
            data = content.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode()


def ledger_record(cluster: Cluster, rid: str, result: str, image_id: str | None, config_hash: str, **extra: Any) -> dict[str, Any]:
    rec = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "release": rid,
        "cluster": cluster.name,
        "who": who(),
        "image": cluster.image.ref,
        "image_id": image_id,
        "config_hash": config_hash,
        "result": result,
    }
    rec.update(extra)
    return rec


RESULTS = ("started", "good", "failed", "rolled back")


def line_sum(record: dict[str, Any]) -> str:
    """The hash a ledger or audit line carries of the rest of itself."""
    body = {k: v for k, v in record.items() if k != "sum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def append_script(path: str, record: dict[str, Any]) -> str:
    """Append one JSON line, with its ``sum``, under flock (one write: never a torn line)."""
    record = {**{k: v for k, v in record.items() if k != "sum"}, "sum": line_sum(record)}
    line = json.dumps(record, sort_keys=True, separators=(",", ":"))
    if "\n" in line:
        raise ValueError("a ledger line must be one line")
    q = shlex.quote(path)
    return (
        f"mkdir -p \"$(dirname {q})\" && "
        f"flock {shlex.quote(path + '.lock')} sh -c 'printf \"%s\\n\" \"$1\" >> \"$2\"' _ {shlex.quote(line)} {q}"
    )


def set_current_script(cluster: Cluster, rid: str) -> str:
    """Point ``current`` at the release, atomically (rename over the old link)."""
    link = current_link(cluster)
    tmp = f"{link}.tmp"
    return f"ln -sfn {shlex.quote('releases/' + rid)} {shlex.quote(tmp)} && mv -T {shlex.quote(tmp)} {shlex.quote(link)}"


def parse_lines(text: str, what: str = "ledger") -> tuple[list[dict[str, Any]], list[str]]:
    """(every trustworthy line, a problem per line that is not): a line that
    is not JSON (torn), not an object, or whose ``sum`` does not match what it
    says (edited) is skipped and named by its line number. Lines written
    before lines carried a sum are kept."""
    out, problems = [], []
    for no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            problems.append(f"{what} line {no} is not JSON (torn or edited), skipped: {line[:80]!r}")
            continue
        if not isinstance(rec, dict):
            problems.append(f"{what} line {no} is not a record, skipped: {line[:80]!r}")
            continue
        if "sum" in rec and rec["sum"] != line_sum(rec):
            problems.append(f"{what} line {no} does not match its checksum (edited after it was written), skipped: {line[:80]!r}")
            continue
        out.append(rec)
    return out, problems


def parse_ledger_checked(text: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Ledger records and the problems of the lines that were skipped."""
    recs, problems = parse_lines(text, "ledger")
    out = []
    for rec in recs:
        rid, result = rec.get("release"), rec.get("result")
        if not isinstance(rid, str) or not RELEASE_RE.match(rid) or result not in RESULTS:
            problems.append(f"ledger line for {str(rid)[:40]!r} has no valid release id and result ({str(result)[:20]!r}), skipped")
            continue
        out.append(rec)
    return out, problems


def parse_ledger(text: str) -> list[dict[str, Any]]:
    """Every trustworthy ledger line; a torn, edited or foreign line is skipped, never fatal."""
    return parse_ledger_checked(text)[0]


# --- what the ledger says: every release, its attempts, the rollback target ------------------------
def _event(r: dict[str, Any]) -> str:
    action = r.get("action") or "deploy"
    if r.get("result") == "rolled back":
        text = f"rolled back to {r.get('to')}"
    else:
        text = f"{action} {r.get('result')}"
        if r.get("from"):
            text += f" (from {r['from']})"
    text += f" {r.get('time')} by {r.get('who')}"
    if r.get("reason") and r.get("result") == "failed":
        text += f": {str(r['reason'])[:80]}"
    if r.get("serving"):
        text += " (kept serving)"
    g = r.get("gate")
    if isinstance(g, dict) and g.get("verdict") == "skipped" and r.get("result") == "good":
        text += f" (gate skipped: {g.get('why', '')})"
    return text


def release_table(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per release, oldest first: when and by whom it was made, its
    digest and hash, whether it was ever good (and when last), its latest
    attempt, and every event it had (nothing is ever rewritten)."""
    rows: dict[str, dict[str, Any]] = {}
    for r in records:
        row = rows.setdefault(r["release"], {"release": r["release"], "time": r.get("time"), "who": r.get("who"),
                                             "image_id": r.get("image_id"), "config_hash": r.get("config_hash"),
                                             "was_good": False, "last_good": None, "latest": None, "result": None, "gate": None, "events": []})
        if r.get("result") == "good":
            row["was_good"], row["last_good"] = True, r.get("time")
        if r.get("result") in ("good", "failed") and isinstance(r.get("gate"), dict):
            row["gate"] = r["gate"]
        if r.get("result") in ("started", "good", "failed"):
            row["latest"] = {k: r.get(k) for k in ("result", "action", "time", "who", "reason", "from", "serving") if r.get(k)}
            row["latest"].setdefault("action", "deploy")
            row["result"] = r.get("result")
        row["events"].append(_event(r))
    return list(rows.values())


def latest_attempt(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest line that ended an attempt (good or failed)."""
    return next((r for r in reversed(records) if r.get("result") in ("good", "failed")), None)


def failing_release(records: list[dict[str, Any]]) -> str | None:
    """The release whose deploy failed last, when nothing was good after it: the one currently failing."""
    for r in reversed(records):
        if r.get("result") == "good" and (r.get("action") or "deploy") == "deploy":
            return None
        if r.get("result") == "failed" and (r.get("action") or "deploy") == "deploy":
            release: str = r["release"]
            return release
    return None


def on_cluster(records: list[dict[str, Any]], current: str | None) -> str | None:
    """The release the cluster runs, or last tried to: the latest attempt's."""
    last = latest_attempt(records)
    return last["release"] if last else current


def rollback_target(records: list[dict[str, Any]], current: str | None, to: str | None) -> str:
    """``to`` when it was ever good; else the release that was good most
    recently and is not what the cluster runs now (after a good deploy or
    rollback) nor the release currently failing (after a failed one)."""
    rows = {r["release"]: r for r in release_table(records)}
    if to:
        if to not in rows:
            raise LlmdeployError(f"--to {to}: no such release in the ledger")
        if not rows[to]["was_good"]:
            raise LlmdeployError(f"--to {to}: that release was never good (its latest attempt: {rows[to]['result']})")
        return to
    last = latest_attempt(records)
    exclude = set()
    if last and last["result"] == "good":
        exclude.add(last["release"])
    failing = failing_release(records)
    if failing:
        exclude.add(failing)
    last_good: dict[str, int] = {}
    for i, r in enumerate(records):
        if r.get("result") == "good":
            last_good[r["release"]] = i
    candidates = sorted((i, rid) for rid, i in last_good.items() if rid not in exclude)
    if not candidates:
        now = last["release"] if last else current
        raise LlmdeployError(f"no release that was ever good to roll back to from {now or 'nothing'} (invoke releases to see them)")
    return candidates[-1][1]
