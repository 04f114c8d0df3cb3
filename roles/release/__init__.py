"""Reading a cluster's history from its nodes, as pure shell builders and
parsers (the flows run them): the ledger and the ``current`` link on node 0,
what a node holds of one release (its files, images, ``release.json``,
``plan.json`` and the attempt numbers of its units), and the audit log.

Every path is quoted; nothing here opens a connection.
"""

from __future__ import annotations

import json
import re
import shlex

from llmdeploy.inventory import Cluster
from llmdeploy.lock import audit_path
from llmdeploy.release import append_script, current_link, ledger_path, release_dir, releases_dir
from llmdeploy.sections import section, split_sections


def ledger_script(cluster: Cluster, benches: bool = False) -> str:
    """Node 0's ledger and where its ``current`` link points (sections ledger,
    current); with ``benches``, also the last benchmark line each release keeps (section bench)."""
    q = shlex.quote
    out = section("ledger", f"cat {q(ledger_path(cluster))} 2>/dev/null || true") + "\n" + section("current", f"readlink {q(current_link(cluster))} || true") + "\n"
    if benches:
        out += section("bench", f"for f in {q(releases_dir(cluster))}/*/{BENCH_FILE}; do [ -f \"$f\" ] && tail -n 1 \"$f\"; done; true") + "\n"
    return out


# each release's benchmark results, one JSON line per run (invoke bench, the gate), in its own directory on node 0
BENCH_FILE = "bench.jsonl"


def bench_append_script(cluster: Cluster, rid: str, record: dict) -> str:
    """Append one benchmark record to release ``rid``'s ``bench.jsonl`` (the ledger's way: flock, one write, a sum)."""
    return append_script(f"{release_dir(cluster, rid)}/{BENCH_FILE}", record)


def parse_benches(out: str) -> tuple[dict[str, dict], list[str]]:
    """{release: its last benchmark record} from ``ledger_script(benches=True)``'s
    bench section, and the problems of lines that cannot be trusted."""
    from llmdeploy.release import RELEASE_RE, parse_lines

    recs, problems = parse_lines(split_sections(out).get("bench", ("", 0))[0], "bench record")
    return {r["release"]: r for r in recs if isinstance(r.get("release"), str) and RELEASE_RE.match(r["release"])}, problems


def parse_ledger_read(out: str) -> tuple[str, str | None] | None:
    """(the ledger's text, the current release's id or None) from ``ledger_script``'s
    output; None when the ledger section is missing (the script did not run)."""
    s = split_sections(out)
    if "ledger" not in s:
        return None
    current = s.get("current", ("", 0))[0].strip().rsplit("/", 1)[-1] or None
    return s["ledger"][0], current


def _problems(d: str, image_id: str) -> str:
    """Lines ``missing <file>``/``missing image <ref>``/``image <ref> is ...``
    for what release directory ``d`` needs and lacks: the files its
    release.json lists (else those every release had before plans were
    recorded), its image with the recorded ID and its serving image, as the
    units' runtime has them (``image_id``: its ``image_id_script``, which
    defines ``llmdeploy_image_id``)."""
    q = shlex.quote
    listed = f"sed -n '/\"files\": \\[/,/\\]/p' {q(d)}/release.json 2>/dev/null | grep -o '\"[^\"]*\"' | tr -d '\"' | grep -vx files"
    return (
        f"for f in env release.json $({listed}); do [ -f {q(d)}/\"$f\" ] || echo \"missing {d}/$f\"; done\n"
        f"[ -f {q(d)}/plan.json ] || for f in run.sh serve.sh; do [ -f {q(d)}/$f ] || echo \"missing {d}/$f\"; done\n"
        + image_id
        + f"if [ -f {q(d)}/release.json ]; then\n"
        f"  img=$(sed -n 's/.*\"image\": \"\\([^\"]*\\)\".*/\\1/p' {q(d)}/release.json)\n"
        f"  want=$(sed -n 's/.*\"image_id\": \"\\([^\"]*\\)\".*/\\1/p' {q(d)}/release.json)\n"
        '  have=$(llmdeploy_image_id "$img")\n'
        '  [ -n "$have" ] || echo "missing image $img"\n'
        '  [ -z "$have" ] || [ -z "$want" ] || [ "$have" = "$want" ] || echo "image $img is $have, the release ran $want"\n'
        f"  simg=$(sed -n 's/.*\"serving_image\": \"\\([^\"]*\\)\".*/\\1/p' {q(d)}/release.json)\n"
        '  [ -z "$simg" ] || llmdeploy_image_id "$simg" >/dev/null 2>&1 || echo "missing image $simg"\n'
        "fi"
    )


def _attempts(d: str) -> str:
    """One line per attempt record (``recorded <container>.attempt <n>``) and
    per kept attempt log (``log <container>.attempt-<n>.log``) of release directory ``d``."""
    logs = shlex.quote(f"{d}/logs")
    return (
        f"for f in {logs}/*.attempt; do [ -f \"$f\" ] && printf 'recorded %s %s\\n' \"${{f##*/}}\" \"$(head -c 12 \"$f\" | tr -d '\\n')\"; done\n"
        f"for f in {logs}/*.attempt-*.log; do [ -f \"$f\" ] && printf 'log %s\\n' \"${{f##*/}}\"; done\n"
        "true"
    )


def release_script(cluster: Cluster, rid: str, image_id_script: str) -> str:
    """What one node holds of release ``rid``, in one round trip. Sections:
    problems (what it needs to run and lacks), meta (release.json), plan
    (plan.json, empty if none), attempts (how often each unit was started). ``image_id_script``:
    the unit runtime's ``llmdeploy_image_id`` function (``UnitRuntime.image_id_script``)."""
    d = release_dir(cluster, rid)
    q = shlex.quote
    return "\n".join([
        section("problems", _problems(d, image_id_script)),
        section("meta", f"cat {q(d)}/release.json"),
        section("plan", f"cat {q(d)}/plan.json 2>/dev/null || true"),
        section("attempts", _attempts(d)),
    ]) + "\n"


def parse_attempts(text: str) -> dict[str, int]:
    """{container: the number of its latest start} from the attempts section:
    the recorded number where there is one; else (a release started before
    numbers were recorded) one more than its highest kept attempt log. A
    container with neither is left out."""
    recorded: dict[str, int] = {}
    logged: dict[str, int] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        m = re.fullmatch(r"(\S+)\.attempt ([0-9]{1,9})", rest) if kind == "recorded" else re.fullmatch(r"(\S+)\.attempt-([0-9]{1,9})\.log", rest)
        if kind in ("recorded", "log") and m:
            into = recorded if kind == "recorded" else logged
            into[m.group(1)] = max(into.get(m.group(1), 0), int(m.group(2)))
    # a kept log is a replaced start's (start_script) or a stopped one's
    # (named for its own number): only without a record does it count
    return {c: n + 1 for c, n in logged.items()} | recorded


def parse_release(out: str) -> dict:
    """``release_script``'s output: {"problems": [lines], "meta": dict or None
    (None: missing or not JSON), "meta_ran": whether the meta section ran,
    "plan": plan.json text, "attempts": {container: latest start number}}."""
    sec = split_sections(out)
    problems = [ln for ln in sec.get("problems", ("", 0))[0].splitlines() if ln.startswith(("missing", "image "))]
    meta = None
    if "meta" in sec:
        try:
            doc = json.loads(sec["meta"][0])
            meta = doc if isinstance(doc, dict) else None
        except ValueError:
            meta = None
    return {"problems": problems, "meta": meta, "meta_ran": "meta" in sec, "plan": sec.get("plan", ("", 0))[0],
            "attempts": parse_attempts(sec.get("attempts", ("", 0))[0])}


def audit_script(cluster: Cluster) -> str:
    """The audit log on node 0 (empty if none)."""
    return f"cat {shlex.quote(audit_path(cluster))} 2>/dev/null; true"
