"""``invoke bench`` and the release quality gate.

``bench``: a bounded streaming load (``llmdeploy.loadgen``) against the
current release's chat endpoint, the one its own readiness check uses (its
model, template arguments and headers), sent through node 0's SSH
connection (a channel per request, the way ``status`` probes) or, with
``--direct``, straight to the endpoint. The figures are printed as a table
(``--json``: as data) and kept with the release on node 0
(``releases/<id>/bench.jsonl``), where ``invoke releases`` shows them.

The gate (``gate``): after readiness, deploy (and ``rollback --gate``) runs
the inventory's smoke benchmark (``deploy.gate``) and judges it
(``llmdeploy.gate``) against the last good release of the same cluster,
system, model and load shape; the ledger line of the release keeps the
verdict and figures.
"""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from flows.probes import direct_sender, ssh_sender
from flows.releases import read_ledger, serving_plan
from llmdeploy import gate as judge, loadgen, report
from llmdeploy.errors import LlmdeployError
from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster
from llmdeploy.release import who
from llmdeploy.releaseplan import Probe, ReleasePlan
from llmdeploy.runner import Runner
from roles.release import bench_append_script


def chat_probe(plan: ReleasePlan) -> Probe:
    """The release's chat check: where a chat request goes and what it carries."""
    for p in plan.ready:
        if p.kind == "http" and p.method == "POST" and p.path.endswith("/chat/completions") and isinstance(p.body, dict):
            return p
    raise LlmdeployError(f"release {plan.release} ({plan.system}) has no chat check in its plan: nothing says where chat requests go")


def measure(runner: Runner, cluster: Cluster, plan: ReleasePlan, load: loadgen.Load, direct: bool = False,
            progress=None) -> dict:
    """Run ``load`` against ``plan``'s chat endpoint, level by level; the result document."""
    p = chat_probe(plan)
    node = cluster.node(p.host)
    if direct:
        ip = str(node.ip) if p.ip in ("127.0.0.1", "localhost") else p.ip
        send, via = direct_sender(ip, p.port, p.path, p.headers), f"http://{ip}:{p.port}{p.path}"
    else:
        send, via = ssh_sender(runner, node, p.port, p.path, p.headers, dest=p.ip), f"{p.ip}:{p.port}{p.path} through {runner.connection_name(node)}'s SSH connection"
    model = (p.body or {}).get("model")
    levels = []
    for c in load.concurrency:
        bodies = [loadgen.request_body(p.body or {}, load, i) for i in range(load.requests)]
        if progress:
            progress(f"concurrency {c}: {load.requests} requests")
        samples, wall = loadgen.run_level(send, bodies, c, load)
        levels.append(loadgen.summarize(samples, wall, c))
    return {"cluster": cluster.name, "release": plan.release, "system": plan.system, "model": model, "endpoint": via,
            "load": loadgen.load_doc(load), "levels": levels}


def record(runner: Runner, cluster: Cluster, doc: dict, kind: str, **extra) -> str | None:
    """Keep a result with its release on node 0; the problem, if it could not be kept."""
    rec = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "who": who(), "kind": kind, **doc, **extra}
    try:
        out, err, code = runner.exec(cluster.node0, bench_append_script(cluster, doc["release"], rec))
    except Exception as exc:  # unreachable node 0: the result is still printed
        return f"{type(exc).__name__}: {exc}"
    return None if code == 0 else (err.strip() or out.strip() or f"exit {code}")


def levels_table(title: str, levels: list[dict]):
    rows = []
    for lv in levels:
        def f(series: str, stat: str) -> str:
            v = (lv.get(series) or {}).get(stat)
            return "-" if v is None else f"{v:.1f}"
        errs = str(lv["errors"]) if not lv["errors"] else f"[red]{lv['errors']}[/]"
        rows.append([str(lv["concurrency"]), f"{lv['ok']}/{lv['requests']}", f("ttft", "p50"), f("ttft", "p90"), f("ttft", "p99"),
                     f("tpot", "p50"), f("tpot", "p90"), f("tpot", "p99"), f("e2e", "p50"), f("e2e", "p99"),
                     f"{lv['output_tokens_per_s'] or 0:.1f}", f"{lv['requests_per_s'] or 0:.2f}", errs])
    return report.table(title, ["conc", "ok", "TTFT p50", "p90", "p99", "TPOT p50", "p90", "p99", "e2e p50", "p99", "tok/s", "req/s", "errors"], rows)


def print_errors(con: Console, levels: list[dict]) -> None:
    for lv in levels:
        for reason, n in lv["error_reasons"].items():
            con.print(f"  [red]concurrency {lv['concurrency']}: {n} failed[/]: {escape(reason)}", soft_wrap=True)


def bench(dep: Deployment, con: Console, load: loadgen.Load, json_out: bool, direct: bool) -> int:
    """``invoke bench``: exit 0 when every request succeeded, 1 when any failed."""
    cluster = dep.cluster
    with dep.runner() as runner:
        plan, why = serving_plan(runner, cluster)
        if plan is None:
            raise LlmdeployError(f"{cluster.name}: nothing to benchmark: {why}")
        con.print(f"[bold]bench {cluster.name}[/]: release {plan.release} ({plan.system}), {escape(load.describe())}")
        doc = measure(runner, cluster, plan, load, direct, progress=lambda m: con.print(f"  {escape(m)}"))
        problem = record(runner, cluster, doc, "bench")
    failed = sum(lv["errors"] for lv in doc["levels"])
    if json_out:
        report.emit_json({**doc, "recorded": problem is None, "ok": failed == 0})
    con.print(levels_table(f"{cluster.name} release {plan.release}: latencies in ms ({escape(doc['endpoint'])})", doc["levels"]))
    print_errors(con, doc["levels"])
    con.print(f"kept with release {plan.release} on {cluster.node0.name}" if problem is None
              else f"[yellow]not kept on {cluster.node0.name}: {escape(problem)}[/]")
    return 1 if failed else 0


# --- the gate ----------------------------------------------------------------------------------
def smoke_load(cluster: Cluster) -> loadgen.Load:
    g = cluster.deploy.gate
    return loadgen.Load(requests=g.requests, concurrency=(g.concurrency,), input_tokens=g.input_tokens, output_tokens=g.output_tokens,
                        duration_s=g.timeout_s, request_timeout_s=cluster.deploy.request_timeout_s)


def gate_key(plan: ReleasePlan, load: loadgen.Load) -> str:
    return judge.key(plan.system, str((chat_probe(plan).body or {}).get("model")), load.shape())


def run_gate(runner: Runner, cluster: Cluster, con: Console, plan: ReleasePlan, quiet: bool = False) -> judge.Verdict:
    """The smoke benchmark on the release that just became ready, judged
    against the baseline in the ledger; the run is kept with the release."""
    g, load = cluster.deploy.gate, smoke_load(cluster)
    key = gate_key(plan, load)
    records, _ = read_ledger(runner, cluster)
    base = judge.baseline(records, key, exclude=plan.release)
    if not quiet:
        con.print(f"[bold]quality gate[/]: {escape(load.describe())}"
                  + (f", against release {base[0]}" if base else ": no earlier release to compare with (this one becomes the baseline)"))
    doc = measure(runner, cluster, plan, load)
    verdict = judge.judge(doc["levels"][0], key, base, g.tolerance.model_dump(), g.floor_ms, g.max_errors)
    problem = record(runner, cluster, doc, "gate", verdict=verdict.record())
    if problem and not quiet:
        con.print(f"[yellow]the gate's run is not kept on {cluster.node0.name}: {escape(problem)}[/]")
    verdict.levels = doc["levels"]
    return verdict


def verdict_table(v: judge.Verdict):
    rows = []
    for name, label in judge.LABELS.items():
        c = next((x for x in v.checks or [] if x.figure == name), None)
        now = v.figures.get(name)
        if c is None:
            rows.append([label, "-", judge.fmt(now), "-", "baseline" if v.verdict == "baseline" else "-"])
        else:
            rows.append([label, judge.fmt(c.baseline), judge.fmt(c.now), judge.fmt(c.limit), "[green]ok[/]" if c.ok else "[bold red]regressed[/]"])
    against = f" against release {v.against}" if v.against else ""
    return report.table(f"quality gate: {v.verdict}{against} (ms; tok/s)", ["figure", "baseline", "now", "limit", ""], rows)


def say_verdict(con: Console, v: judge.Verdict) -> None:
    con.print(verdict_table(v))
    if not v.ok:
        con.print(f"[bold red]{escape(v.reason())}[/]", soft_wrap=True)


def verdict_files(v: judge.Verdict) -> dict[str, str]:
    """The comparison, for a failed release's log bundle."""
    import io
    import json

    buf = io.StringIO()
    Console(file=buf, width=120, no_color=True, highlight=False).print(verdict_table(v))
    text = buf.getvalue() + ("\n" + v.reason() + "\n" if not v.ok else "")
    return {"gate.txt": text, "gate.json": json.dumps({**v.record(), "levels": v.levels}, indent=1) + "\n"}


def read_prompts_file(path: str) -> tuple[str, ...]:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise LlmdeployError(f"--prompts {path}: {exc.strerror or exc}") from None
    try:
        return loadgen.read_prompts(text, path)
    except ValueError as exc:
        raise LlmdeployError(f"--prompts {exc}") from None


def load_from_flags(concurrency: str, requests, input_tokens, output_tokens, prompts: str | None, duration) -> loadgen.Load:
    """The load the command line asks for; a bad value is named by its flag."""
    try:
        levels = tuple(int(x) for x in str(concurrency).split(",") if x.strip())
    except ValueError:
        raise LlmdeployError(f"--concurrency {concurrency!r}: expected numbers separated by commas, e.g. 1,4,16") from None
    if not levels or any(c < 1 or c > 4096 for c in levels):
        raise LlmdeployError(f"--concurrency {concurrency!r}: each level is 1 to 4096")
    numbers = {}
    for flag, value, lo, hi in (("requests", requests, 1, 100000), ("input-tokens", input_tokens, 1, 1_000_000),
                                ("output-tokens", output_tokens, 2, 1_000_000)):
        try:
            numbers[flag] = int(value)
        except (TypeError, ValueError):
            raise LlmdeployError(f"--{flag} {value!r}: not a whole number") from None
        if not lo <= numbers[flag] <= hi:
            raise LlmdeployError(f"--{flag} {value}: expected {lo} to {hi}")
    try:
        secs = float(duration)
    except (TypeError, ValueError):
        raise LlmdeployError(f"--duration {duration!r}: not a number of seconds") from None
    if not 0 < secs <= 86400:
        raise LlmdeployError(f"--duration {duration}: expected more than 0 and at most 86400 seconds")
    return loadgen.Load(requests=numbers["requests"], concurrency=levels, input_tokens=numbers["input-tokens"],
                        output_tokens=numbers["output-tokens"], prompts=read_prompts_file(prompts) if prompts else (), duration_s=secs)
