"""Releases on the nodes: ``<base>/<cluster>/releases/<id>/`` with a
``current`` link on every node, and an append-only ledger on node 0.

Every function here builds a shell script or parses output; the runner
executes them. The ledger is JSON lines, appended under ``flock`` with one
``write`` per line, so an interrupted deploy never leaves a torn line; a
release's result is the last line that names it.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import json
import re
import shlex
import socket
import time

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


def write_script(cluster: Cluster, rid: str, files: dict[str, tuple[str, int]]) -> str:
    """Write the release's files into a staging directory, then rename it into
    place: a release directory is complete or absent."""
    final = release_dir(cluster, rid)
    stage = f"{releases_dir(cluster)}/.stage-{rid}"
    lines = ["set -e", f"rm -rf {shlex.quote(stage)}", f"mkdir -p {shlex.quote(stage)}/logs", f"chmod 700 {shlex.quote(stage)}"]
    for name, (content, mode) in files.items():
        if not re.match(r"^[A-Za-z0-9._-]+$", name):
            raise ValueError(f"bad release file name {name!r}")
        b64 = base64.b64encode(content.encode()).decode()
        target = shlex.quote(f"{stage}/{name}")
        lines.append(f"printf %s {shlex.quote(b64)} | base64 -d > {target}")
        lines.append(f"chmod {mode:o} {target}")
    lines += [
        f"if [ -d {shlex.quote(final)} ]; then rm -rf {shlex.quote(stage)}; echo exists; exit 0; fi",
        f"mv {shlex.quote(stage)} {shlex.quote(final)}",
        "echo written",
    ]
    return "\n".join(lines) + "\n"


def ledger_record(cluster: Cluster, rid: str, result: str, image_id: str | None, config_hash: str, **extra) -> dict:
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


def append_script(path: str, record: dict) -> str:
    """Append one JSON line under flock (one write: never a torn line)."""
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


def parse_ledger(text: str) -> list[dict]:
    """Every parsable line; a torn or foreign line is skipped, never fatal."""
    out = []
    for line in text.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and "release" in rec:
            out.append(rec)
    return out
