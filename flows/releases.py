"""The cluster's history, read from its nodes: the ledger and the ``current``
link on node 0, what every node holds of one release and that release's plan
(its own ``plan.json``, or what its serving system reads from a release
written before plans were recorded), and the views of it: ``invoke
releases``, ``audit``, ``lock.status`` and ``lock.break``.

Any laptop with the repository and SSH access reads the same history; the
shell text comes from ``roles.release`` and ``llmdeploy.lock``.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding

import systems
from flows.probes import check_named
from llmdeploy import lock, report
from llmdeploy.errors import LlmdeployError
from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster
from llmdeploy.release import RELEASE_RE, ledger_path, on_cluster, parse_ledger_checked, parse_lines, release_dir, release_table, rollback_target
from llmdeploy.releaseplan import ReleasePlan
from llmdeploy.runner import Runner, Step
from roles import release as rel


def read_ledger(runner: Runner, cluster: Cluster, problems: list[str] | None = None, benches: dict | None = None) -> tuple[list[dict], str | None]:
    """(ledger lines, node 0's current release). Lines that cannot be trusted
    (torn, edited) are skipped; each is said on stderr, and added to
    ``problems`` when the caller passes a list. ``benches``: filled with each
    release's last benchmark record, read in the same round trip."""
    out, err, code = runner.exec(cluster.node0, rel.ledger_script(cluster, benches=benches is not None))
    if benches is not None:
        found, bad = rel.parse_benches(out)
        benches.update(found)
        if problems is not None:
            problems.extend(bad)
    got = rel.parse_ledger_read(out)
    if code != 0 or got is None:
        raise LlmdeployError(f"{cluster.node0.name}: cannot read the ledger: {err.strip() or out.strip()}")
    text, current = got
    records, bad = parse_ledger_checked(text)
    for b in bad:
        print(f"warning: {cluster.node0.name}:{ledger_path(cluster)}: {b}", file=sys.stderr)
    if problems is not None:
        problems.extend(bad)
    return records, current


@dataclass
class OnNodes:
    """What the nodes hold of one release."""

    metas: dict[str, dict] = field(default_factory=dict)  # host -> release.json
    plan_text: str = ""  # node 0's plan.json ("" if none)
    unreadable: dict[str, str] = field(default_factory=dict)  # host -> why its release.json cannot be read
    missing: dict[str, str] = field(default_factory=dict)  # host -> files or images it lacks
    attempts: dict[str, int] = field(default_factory=dict)  # "host/container" -> the number of its latest start


def read_release(runner: Runner, dep: Deployment, rid: str, step: str) -> OnNodes:
    """Release ``rid`` as every node has it (its image as the unit runtime sees it), in one round trip each."""
    cluster, image_id_script = dep.cluster, dep.runtime.image_id_script()
    res = runner.run(Step(name=step, build=lambda n: rel.release_script(cluster, rid, image_id_script)))
    got = OnNodes()
    for h, r in res.items():
        doc = rel.parse_release(r.stdout)
        if doc["problems"]:
            got.missing[h] = "; ".join(doc["problems"])
        if r.failed or not doc["meta_ran"]:
            got.unreadable[h] = r.msg if r.failed else (got.missing.get(h) or "no release.json")
            continue
        if doc["meta"] is None:
            got.unreadable[h] = got.missing.get(h) or f"{release_dir(cluster, rid)}/release.json is unreadable"
            continue
        got.metas[h] = doc["meta"]
        got.attempts.update({f"{h}/{c}": n for c, n in doc["attempts"].items()})
        if h == cluster.node0.name:
            got.plan_text = doc["plan"]
    return got


def plan_of(cluster: Cluster, rid: str, plan_text: str, metas: dict[str, dict]) -> ReleasePlan:
    """A release's plan from its own files on the nodes (``systems.read_plan``),
    refused unless it is one this tool could have written for this cluster."""
    where = f"plan.json on {cluster.node0.name}" if plan_text.strip() else "release.json files (no plan.json)"
    try:
        plan = systems.read_plan(cluster, rid, plan_text, metas)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LlmdeployError(f"release {rid}: its {where} is unreadable: {type(exc).__name__}: {exc}") from None
    unknown = sorted(set(plan.hosts()) - {n.name for n in cluster.nodes})
    if unknown:
        raise LlmdeployError(f"release {rid} runs on {', '.join(unknown)}, which the inventory of {cluster.name} no longer has")
    bad = plan_problems(cluster, rid, plan)
    if bad:
        raise LlmdeployError(f"release {rid}: its {where} is not one this tool wrote ({'; '.join(bad[:4])}): refusing to run it")
    return plan


_SAFE = {
    "container": re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"),
    "prefix": re.compile(r"^([a-z0-9][a-z0-9-]*\.)?$"),
    "ip": re.compile(r"^[A-Za-z0-9.:-]+$"),
    "path": re.compile(r"^/[A-Za-z0-9/._-]*$"),
    # the clean-up after stop runs on every node: only the shape the systems write, removing files by absolute path
    "cleanup": re.compile(r"^(rm -f( /[A-Za-z0-9/._*-]+)+ 2>/dev/null; true\n)*$"),
}


def plan_problems(cluster: Cluster, rid: str, plan: ReleasePlan) -> list[str]:
    """What in a plan read back from the nodes does not look like one this
    tool wrote: its values reach remote shells, probes and this process's
    regular expressions, so they are checked."""
    out = []
    if plan.release != rid or plan.cluster != cluster.name:
        out.append(f"it names release {plan.release} of {plan.cluster}")
    nodes = {n.name for n in cluster.nodes}
    for u in plan.units():
        if not _SAFE["container"].match(u.container) or not _SAFE["prefix"].match(u.prefix):
            out.append(f"unit {u.container!r} (prefix {u.prefix!r})")
    for p in plan.ready + [s.started for s in plan.services if s.started]:
        if p.host not in nodes or not _SAFE["ip"].match(p.ip) or not _SAFE["path"].match(p.path) or p.kind not in ("port", "http"):
            out.append(f"probe {p.name!r} ({p.host} {p.ip} {p.path})")
        elif p.kind == "http" and check_named(p.check) is None:
            out.append(f"probe {p.name!r} names the check {p.check!r}, which no system of this tool defines")
    if not isinstance(plan.stop_cleanup, str) or not _SAFE["cleanup"].match(plan.stop_cleanup):
        out.append(f"stop clean-up {str(plan.stop_cleanup)[:80]!r} (only 'rm -f <absolute paths> 2>/dev/null; true' is run)")
    for pattern, _ in plan.signatures:
        try:
            re.compile(pattern)
        except re.error as exc:
            out.append(f"failure signature {pattern[:60]!r}: {exc}")
    texts = [*plan.drift_env_prefixes, *plan.show_labels, *plan.show_labels.values(), *plan.role_labels, *plan.role_labels.values()]
    if not all(isinstance(t, str) for t in texts):
        out.append("labels or environment prefixes that are not text")
    return out


def current_plan(cluster: Cluster, sts: dict[str, dict | None]) -> ReleasePlan | None:
    """The current release's plan, from node 0's files (else another node's).
    ``sts``: each host's ``roles.status.parse_status`` (None: unreachable).
    None when no node has a current release."""
    order = [cluster.node0.name] + [n.name for n in cluster.nodes[1:]]
    for h in order:
        st = sts.get(h)
        if st and st["release"] and RELEASE_RE.match(st["release"]):
            metas = {x: s["meta"] for x, s in sts.items() if s and s["meta"]}
            if st["plan"].strip() or len(metas) == len(cluster.nodes):
                return plan_of(cluster, st["release"], st["plan"], metas)
    return None


def serving_plan(runner: Runner, cluster: Cluster) -> tuple[ReleasePlan | None, str]:
    """(the plan of the release node 0's ``current`` names, or None and why),
    in one round trip to node 0 (a standing read, ``flows/reads.py``): what a
    deploy or rollback drains before it stops it, and what top shows."""
    from flows.reads import current_read
    from roles.status import parse_status

    try:
        r = runner.run(current_read(cluster), [cluster.node0])[cluster.node0.name]
    except Exception as exc:  # unreachable: the caller says it drains nothing
        return None, f"{cluster.node0.name}: {type(exc).__name__}: {exc}"
    if r.failed or r.status == "skipped":
        return None, f"{cluster.node0.name}: {r.msg or 'no answer'}"
    st = parse_status(r.stdout)
    if not st["release"]:
        return None, "no current release"
    if not st["plan"].strip():
        return None, f"release {st['release']} has no plan.json on {cluster.node0.name}"
    try:
        return plan_of(cluster, st["release"], st["plan"], {cluster.node0.name: st["meta"] or {}}), ""
    except LlmdeployError as exc:
        return None, str(exc)


def releases(dep: Deployment, con: Console, json_out: bool, events: bool = False, wide: bool = False) -> int:
    """Every release in the ledger: was it ever good, its latest attempt; with
    ``events`` every event of every release, one a line, after the table."""
    cluster = dep.cluster
    problems: list[str] = []
    benches: dict[str, dict] = {}
    with dep.runner(nodes=[cluster.node0]) as runner:
        records, current = read_ledger(runner, cluster, problems, benches)
    rows = release_table(records)
    for r in rows:
        r["bench"] = bench_summary(benches.get(r["release"]))
    try:
        default = rollback_target(records, current, None)
    except LlmdeployError:
        default = None
    if json_out:
        report.emit_json({"cluster": cluster.name, "current": current, "on_cluster": on_cluster(records, current),
                          "rollback_target": default, "releases": rows, "problems": problems})
        return 0
    print_releases(cluster, con, rows, current, default, events, wide)
    for p in problems:
        con.print(f"[bold red]ledger problem[/]: {escape(p)}")
    return 0


def bench_summary(rec: dict | None) -> dict | None:
    """The last benchmark kept with a release, in brief: when, what kind, and
    per concurrency level its p50 TTFT and TPOT (ms), tokens/s and errors."""
    if not isinstance(rec, dict):
        return None
    levels = [lv for lv in rec.get("levels") or [] if isinstance(lv, dict)]

    def p50(lv, series):
        v = lv.get(series)
        return v.get("p50") if isinstance(v, dict) else None
    return {"time": rec.get("time"), "kind": rec.get("kind"),
            "levels": [{"concurrency": lv.get("concurrency"), "ttft_p50_ms": p50(lv, "ttft"), "tpot_p50_ms": p50(lv, "tpot"),
                        "output_tokens_per_s": lv.get("output_tokens_per_s"), "errors": lv.get("errors")} for lv in levels]}


def serving_text(row: dict) -> str:
    """The gate's verdict (with its TPOT, or why it was skipped) and the last
    benchmark of a release: the table's "gate / bench" and ``--events``."""
    from llmdeploy.gate import fmt

    parts = []
    g = row.get("gate")
    if isinstance(g, dict):
        figs = g.get("figures") or {}
        shown = f" (TPOT {fmt(figs.get('tpot_p50'))} ms)" if figs.get("tpot_p50") is not None else ""
        shown += f": {g['why']}" if g.get("verdict") == "skipped" and g.get("why") else ""
        parts.append(f"gate {g.get('verdict')}{shown}")
    b = row.get("bench")
    if b:
        for lv in b["levels"]:
            parts.append(f"{b['kind']} c{lv['concurrency']}: TTFT {fmt(lv['ttft_p50_ms'])} ms, {fmt(lv['output_tokens_per_s'])} tok/s"
                         + (f", {lv['errors']} errors" if lv.get("errors") else ""))
    return "\n".join(parts) or "-"


def releases_table(cluster: Cluster, con: Console, rows: list[dict], current: str | None, default: str | None, wide: bool = False):
    """The releases, fitted to ``con``, each id whole (``rollback --to``
    takes nothing shorter). The gate's figures and the last benchmark ("gate
    / bench") are left out first, and a column of the gate's verdict alone
    takes their place; then image, config, who, when made and when last good.
    If a release still needs more than a line, the marks (current, rollback
    target) move from their column into the title. The events are not in the
    table: ``--events`` lists them, and the gate's figures and benchmarks, below it."""
    out = []
    for r in rows:
        marks = (["[bold green]current[/]"] if r["release"] == current else []) + (["rollback target"] if r["release"] == default else [])
        latest = r["latest"] or {}
        style = {"good": "green", "failed": "red"}.get(latest.get("result", ""), "yellow")
        was = "[green]yes[/]" if r["was_good"] else "[red]never[/]"
        out.append([r["release"], r["time"], r["who"], (r["image_id"] or "-")[:19], r["config_hash"] or "-", was, r["last_good"] or "-",
                    f"[{style}]{latest.get('action', '-')} {latest.get('result', '-')}[/]", gate_verdict(r), escape(serving_text(r)), "\n".join(marks)])
    C = report.Col
    cols = [C("release", whole=True), C("made", drop=5), C("by", drop=4), C("image", drop=2), C("config", drop=3),
            C("was good"), C("last good", drop=6), C("latest attempt"), C("gate"), C("gate / bench", drop=1), C("")]
    title = f"releases of {cluster.name} (ledger on {cluster.node0.name})"
    # whole, "gate / bench" says the verdict too: the short column only stands in for it
    t = report.table(title, cols[:8] + cols[9:], [r[:8] + r[9:] for r in out], con=con, wide=wide)
    if wide or not t.caption:
        return t
    t = report.table(title, cols, out, con=con, one_line=True)
    said = ([f"current [bold green]{current}[/]"] if current else []) + ([f"rollback target {default}"] if default else [])
    if report.natural_width(con, t) <= con.width or not said:
        return t
    return report.table("\n".join([title, *said]), cols[:-1], [r[:-1] for r in out], con=con, one_line=True)


GATE_STYLE = {"pass": "green", "baseline": "green", "skipped": "yellow", "regressed": "bold red", "failed": "bold red"}


def gate_verdict(row: dict) -> str:
    """The gate's verdict on a release in one word (markup), "-" when it had none."""
    g = row.get("gate")
    v = g.get("verdict") if isinstance(g, dict) else None
    if not v:
        return "-"
    return f"[{GATE_STYLE.get(str(v), 'yellow')}]{escape(str(v))}[/]"


def print_releases(cluster: Cluster, con: Console, rows: list[dict], current: str | None, default: str | None,
                   events: bool = False, wide: bool = False) -> None:
    """The table; with ``events``, below it each release's id, then its gate
    verdict and last benchmark, and every event, one a line."""
    report.print_table(con, releases_table(cluster, con, rows, current, default, wide), wide)
    if not events:
        if rows:
            con.print(f"every release's events, gate figures and benchmark: invoke releases --cluster {cluster.name} --events")
        return
    for r in rows:
        con.print(f"[bold]{r['release']}[/]")
        detail = serving_text(r)
        for line in ([] if detail == "-" else detail.splitlines()) + r["events"]:
            con.print(Padding(escape(line), (0, 0, 0, 2), expand=False))


def audit_log(dep: Deployment, con: Console, last: int | None, json_out: bool) -> int:
    cluster = dep.cluster
    with dep.runner(nodes=[cluster.node0]) as runner:
        out, err, code = runner.exec(cluster.node0, rel.audit_script(cluster))
    recs, problems = parse_lines(out, "audit log")
    for b in problems:
        print(f"warning: {cluster.node0.name}:{lock.audit_path(cluster)}: {b}", file=sys.stderr)
    if last:
        recs = recs[-last:]
    if json_out:
        report.emit_json({"cluster": cluster.name, "audit": recs, "problems": problems})
        return 0
    rows = [[r.get("time"), r.get("who"), r.get("command"), r.get("release") or "-", r.get("result"),
             escape(", ".join(f"{k}={v}" for k, v in r.items() if k not in ("time", "who", "command", "release", "result", "sum") and v))] for r in recs]
    con.print(report.table(f"audit log of {cluster.name} (on {cluster.node0.name})", ["time", "who", "command", "release", "result", "details"], rows))
    return 0


def lock_status(dep: Deployment, con: Console) -> int:
    cluster = dep.cluster
    with dep.runner(nodes=[cluster.node0]) as runner:
        out, err, code = runner.exec(cluster.node0, lock.status_script(cluster))
    if out.startswith("free"):
        con.print(f"{cluster.name}: the deploy lock is free")
        return 0
    con.print(f"{cluster.name}: the deploy lock is held by {escape(lock.describe(lock.parse_holder(out)))}")
    return 1


def lock_break(dep: Deployment, con: Console, reason: str) -> int:
    if not reason or not reason.strip():
        raise LlmdeployError("lock.break needs --reason: say why the holder is gone")
    cluster = dep.cluster
    with dep.runner(nodes=[cluster.node0]) as runner:
        out, err, code = runner.exec(cluster.node0, lock.break_script(cluster))
        if out.startswith("free"):
            con.print(f"{cluster.name}: the deploy lock is not held; nothing to break")
            return 0
        holder = lock.parse_holder("x\n" + out.splitlines()[0])
        lock.audit(runner, cluster, "lock.break", "broken", None, reason=reason, holder=lock.describe(holder))
    con.print(f"{cluster.name}: broke the deploy lock held by {escape(lock.describe(holder))}")
    return 0
