"""What the Invoke tasks call for facts, prepare, check, deploy, verify-comm
and disconnect: load, plan, run, report. Each returns an exit status. The
operations on a running cluster are their own flows (``flows.releases``,
``status``, ``lifecycle``, ``serving_logs``), called by tasks.py directly."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from rich.console import Console
from rich.markup import escape

from flows.plan import Context, load_playbook, resolve_step, select_nodes
from flows.binding import load
from llmdeploy import report
from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster, load_cluster
from llmdeploy.runner import SKIPPED, Runner

if TYPE_CHECKING:  # pragma: no cover - types only (flows.stage is imported where prepare stages or distributes)
    from flows.stage import ImageOutcome, Outcome


def run_playbook(
    dep: Deployment,
    name: str,
    limit: str | None,
    con: Console,
    show_progress: bool = True,
    ctx: Context | None = None,
    host_lines: bool = True,
):
    """Run every play of a playbook; returns (runner recap, {step: {host: HostResult}}, round trips per host).
    On a terminal a bar per step, and (``host_lines``) a row per host for the
    long commands (pull, load, checksums, wheels): how far each got."""
    plays = load_playbook(name)
    targets = select_nodes(dep.cluster, limit)
    ctx = ctx or Context(dep)
    # the playbook's steps, for the probes facts.inspect runs on their behalf
    ctx.options.setdefault("steps", [ref for play in plays for ref in play.steps])
    with report.host_progress(con, len(targets), enabled=show_progress) as cb:
        with dep.runner(nodes=targets, progress=cb, lines=cb.line if host_lines else None) as runner:
            for play in plays:
                if not _run_play(runner, ctx, play, limit):
                    break
    return runner.recap, ctx.results, dict(runner.round_trips)


def _run_play(runner: Runner, ctx: Context, play, limit: str | None) -> bool:
    """Run one play's steps; False when a failure must stop the playbook."""
    nodes = select_nodes(ctx.cluster, limit, play.hosts)
    failed_here: dict[str, str] = {}
    for ref in play.steps:
        step = resolve_step(ref, ctx)
        res = runner.run(step, nodes)
        ctx.results[step.name] = res
        for host, r in res.items():
            if r.failed and host not in failed_here:
                failed_here[host] = f"not run: failed at {step.name!r}"
                if not play.continue_after_failure:
                    runner.excluded[host] = failed_here[host]
        if play.any_errors_fatal and failed_here:
            return False
    runner.excluded.update(failed_here)
    return True


def _exit_status(recap: dict[str, dict[str, int]]) -> int:
    return 1 if any(c.get("failed") or c.get("unreachable") for c in recap.values()) else 0


def facts(cluster_name: str, json_out: bool = False, limit: str | None = None, wide: bool = False) -> int:
    con = report.console(json_out)
    dep = load(cluster_name)
    cluster = dep.cluster
    recap, results, trips = run_playbook(dep, "facts", limit, con)
    per_host = results["facts"]
    status = _exit_status(recap)
    if json_out:
        report.emit_json(
            {
                "cluster": cluster.name,
                "platform": cluster.platform,
                "ok": status == 0,
                "hosts": {
                    h: {"status": r.status, "msg": r.msg, "facts": r.data if r.status != SKIPPED else None}
                    for h, r in per_host.items()
                },
                "recap": recap,
                "round_trips": trips,
            }
        )
    else:
        report.print_table(con, facts_table(cluster, con, per_host, wide), wide)
        con.print(report.recap_table(recap))
    return status


def _facts_row(h: str, r) -> list[str]:
    f = r.data or {}
    if r.failed:
        return [f"[bold red]{h}[/]", f"[red]{r.status}[/]"] + [""] * 6 + [f"[red]{escape(r.msg)}[/]"]
    nic = f.get("nic") or {}
    nic_txt = f"{nic.get('name', f.get('nic_configured'))} {','.join(nic.get('ipv4', [])) or '-'} mtu {nic.get('mtu')} {'up' if nic.get('up') else 'DOWN'}" if nic else f"[red]{f.get('nic_configured')} missing[/]"
    acc = f"{f['devices_healthy']}/{len(f['devices'])} {f['accelerator'].upper()} OK"
    numa_aff = sorted({d['numa'] for d in f["devices"] if d.get("numa") is not None})
    problems = "; ".join(f.get("problems") or []) or "[green]none[/]"
    return [h, f"{f.get('hostname')}\n{f.get('os')}, {f.get('kernel')}", f"{f.get('cpus')} / {f.get('numa_nodes')}", f"{f.get('mem_total_gib')} GiB",
            f"{f.get('model_disk_free_gib')} GiB", f"{acc}\nNUMA {','.join(map(str, numa_aff)) or '-'}", nic_txt,
            f.get("container_engine") or "[red]none[/]", problems]


def facts_table(cluster: Cluster, con, per_host: dict, wide: bool = False):
    """One line per host, fitted to ``con``: host names whole; engine, OS,
    disk, memory, CPUs left out first."""
    C = report.Col
    cols = [C("host", whole=True), C("hostname / OS / kernel", drop=2), C("CPUs / NUMA", drop=5), C("memory", drop=4),
            C("free disk (model)", drop=3), C("devices"), C("serving NIC"), C("engine", drop=1), C("problems")]
    rows = [_facts_row(h, r) for h, r in per_host.items()]
    return report.table(f"facts: {cluster.name} ({cluster.platform_info.name}, {len(per_host)} nodes)", cols, rows, con=con, wide=wide)


def prepare(
    cluster_name: str,
    check: bool = False,
    diff: bool = False,
    limit: str | None = None,
    json_out: bool = False,
    run_checks: bool = True,
    locked: bool = False,
    message: str | None = None,
    lock_wait: float = 0,
) -> int:
    """Make every node ready to serve; with ``check`` change nothing and say
    what would change. Changes are made under the deploy lock (``locked``: the
    caller, a deploy, holds it already)."""
    if not check and not locked:
        return _prepare_locked(cluster_name, diff, limit, json_out, run_checks, message, lock_wait)
    con = report.console(json_out)
    dep = load(cluster_name)
    cluster = dep.cluster
    ctx = Context(dep, check=check, diff=diff)
    mode = " (check mode: nothing is changed)" if check else ""
    if not json_out:
        con.print(f"[bold]prepare {cluster.name}[/]: {len(select_nodes(cluster, limit))} nodes{mode}")
    staged, failed = _stage_first(dep, con, check, json_out, limit)
    if failed:
        return 1
    distributed, wheels_sent, failed = _distribute(dep, con, json_out, limit) if not check else (None, None, False)
    if failed:
        return 1
    # --json: no host rows (the step bars on a terminal's stderr, as before)
    recap, results, trips = run_playbook(dep, "prepare", limit, con, ctx=ctx, host_lines=not json_out)
    status = _exit_status(recap)
    _prepare_report(con, cluster, check, diff, json_out, recap, results, trips, status,
                    stage=staged.as_json(cluster.stage.link_mbit) if staged else None,
                    image=distributed.as_json() if distributed else None, wheels=wheels_sent.as_json() if wheels_sent else None)
    if status == 0 and run_checks and not check:
        from flows import check as node_check

        if not json_out:
            con.print("[bold]node acceptance tests[/] (invoke check)")
        status = node_check.run(dep, limit=limit, con=con, quiet=json_out)
    return status


def _stage_first(dep: Deployment, con: Console, check: bool, json_out: bool, limit: str | None) -> tuple[Outcome | None, bool]:
    """prepare's first part where the model is staged (invoke stage): what is
    missing, resumed and verified, so that the model check then passes.
    (the stage's outcome or None, whether it failed and prepare stops)."""
    cluster = dep.cluster
    if not cluster.model.stage_from:
        return None, False
    from flows import stage as stage_flow

    staged = stage_flow.run(dep, con, check=check, quiet=json_out, limit=limit)
    if not json_out:
        stage_flow.show(con, cluster, staged, False)
    if staged.ok or check:
        return staged, False
    if json_out:
        report.emit_json({"cluster": cluster.name, "check": check, "ok": False, "changed": 0, "steps": {}, "recap": {},
                          "round_trips": {}, "stage": staged.as_json(cluster.stage.link_mbit)})
    else:
        con.print("[bold red]FAILED[/]: staging the model did not finish; nothing else was prepared")
    return staged, True


def _distribute(dep: Deployment, con: Console, json_out: bool, limit: str | None) -> tuple[ImageOutcome | None, ImageOutcome | None, bool]:
    """The image (one pull or load, then down the nodes' chain; the image step
    then compares IDs) and the image with the pinned wheels (one pip install
    for the cluster, then down the same chain). (what each sent, whether a
    node lacks one and prepare stops)."""
    from flows import stage as stage_flow

    cluster, distributed = dep.cluster, None
    if cluster.image.distribute:
        distributed = stage_flow.distribute_image(dep, con, quiet=json_out, limit=limit)
        if _not_everywhere(con, cluster, json_out, "image", cluster.image.ref, distributed):
            return distributed, None, True
    wheels_sent = stage_flow.distribute_wheels(dep, con, quiet=json_out, limit=limit)
    if wheels_sent is not None and _not_everywhere(con, cluster, json_out, "wheels", wheels_sent.ref or "", wheels_sent):
        return distributed, wheels_sent, True
    return distributed, wheels_sent, False


def _prepare_locked(cluster_name: str, diff: bool, limit: str | None, json_out: bool, run_checks: bool, message: str | None,
                    lock_wait: float) -> int:
    """prepare under the deploy lock, audited (held on node 0 for the whole run)."""
    import contextlib

    from llmdeploy import lock

    dep = load(cluster_name)
    cluster = dep.cluster
    with contextlib.ExitStack() as stack:
        runner = stack.enter_context(dep.runner(nodes=[cluster.node0]))
        holder = stack.enter_context(lock.held(runner, cluster, "prepare", message, lock_wait))
        try:
            status = prepare(cluster_name, False, diff, limit, json_out, run_checks, locked=True)
        except KeyboardInterrupt:
            with report.shielded():
                lock.audit(runner, cluster, "prepare", "interrupted", None, limit=limit or "", message=message or "")
                print(f"prepare interrupted: the nodes may be partly prepared (nothing serving was stopped); the deploy lock is released; "
                      f"to finish: invoke prepare --cluster {cluster.name}", file=sys.stderr)
            raise
        lock.audit(runner, cluster, "prepare", "good" if status == 0 else "failed", None, held=holder, limit=limit or "", message=message or "")
        return status


def _not_everywhere(con, cluster: Cluster, json_out: bool, what: str, ref: str, d) -> bool:
    """Say what an image's distribution did (``d``: flows.stage.ImageOutcome);
    True when it did not reach every node (then prepare stops, and said why)."""
    key = "image_distribution" if what == "image" else "wheels_distribution"
    if not json_out:
        con.print(f"[bold]{what} {escape(ref)}[/]: {escape(d.said())}")
    if not d.failed:
        return False
    why = "; ".join(f"{h}: {m}" for h, m in d.failed.items())
    if json_out:
        report.emit_json({"cluster": cluster.name, "check": False, "ok": False, "changed": 0, "steps": {}, "recap": {},
                          "round_trips": {}, key: d.as_json()})
    else:
        con.print(f"[bold red]FAILED[/]: the {'image' if what == 'image' else 'image with the wheels'} did not reach every node "
                  f"({escape(why)}); nothing else was prepared")
    return True


def _prepare_report(con, cluster: Cluster, check: bool, diff: bool, json_out: bool, recap: dict, results: dict, trips, status: int,
                    stage: dict | None = None, image: dict | None = None, wheels: dict | None = None) -> None:
    """prepare's recap: per step and host, the RECAP table and what changed; or the same as JSON."""
    changed = sum(c.get("changed", 0) for c in recap.values())
    if json_out:
        report.emit_json(
            {
                "cluster": cluster.name,
                "check": check,
                "ok": status == 0,
                "changed": changed,
                "steps": {
                    step: {h: {"status": r.status, "msg": r.msg, **({"diff": r.data.get("diff")} if diff and isinstance(r.data, dict) and r.data.get("diff") else {})} for h, r in res.items()}
                    for step, res in results.items()
                },
                "recap": recap,
                "round_trips": trips,
                **({"stage": stage} if stage is not None else {}),
                **({"image_distribution": image} if image is not None else {}),
                **({"wheels_distribution": wheels} if wheels is not None else {}),
            }
        )
        return
    for step, res in results.items():
        report.step_lines(con, step, res, diff=diff)
    con.print(report.recap_table(recap))
    verb = "would change" if check else "changed"
    con.print(f"{changed} {verb}" + ("" if status == 0 else ", [bold red]FAILED[/] (see the failed lines above)"))

def check(cluster_name: str, limit: str | None = None, select: str | None = None) -> int:
    from flows import check as node_check

    return node_check.run(load(cluster_name), limit=limit, select=select)


def deploy(
    cluster_name: str,
    check: bool = False,
    json_out: bool = False,
    skip_prepare: bool = False,
    force: bool = False,
    message: str | None = None,
    lock_wait: float = 0,
    rollback_on_failure: bool = True,
    gate: bool = True,
) -> int:
    """Prepare (unless skipped), then start serving as a new release, under the
    deploy lock; see flows.deploy."""
    from flows import deploy as deploy_flow

    con = report.console(json_out)
    dep = load(cluster_name)

    def prepare_fn(name: str, quiet: bool) -> int:
        # the deploy holds the lock
        return _prepare_quiet(name) if quiet else prepare(name, run_checks=False, locked=True)

    def rollback_fn(dep, runner, con, message, json_out) -> int:
        from flows import lifecycle

        return lifecycle.rollback_locked(dep, runner, con, None, message, json_out)

    return deploy_flow.deploy(dep, con, check, json_out, skip_prepare, force, message, lock_wait, rollback_on_failure, prepare_fn, rollback_fn, gate)


def _prepare_quiet(cluster_name: str) -> int:
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        return prepare(cluster_name, json_out=True, run_checks=False, locked=True)


def disconnect(cluster_name: str) -> int:
    """End the cluster's connection holders (ssh.persist_s; transports/ssh/mux.py)."""
    from transports.ssh import mux

    cluster = load_cluster(cluster_name)  # its holders go by its name: nothing to bind
    n = mux.stop(cluster.name)
    print(f"{cluster.name}: {n} connection holder{'s' if n != 1 else ''} ended" if n else f"{cluster.name}: no connection holder runs")
    return 0


def verify_comm(cluster_name: str, json_out: bool = False, full: bool = False, report_dir: str | None = None) -> int:
    from flows import verify

    return verify.run(load(cluster_name), report.console(json_out), json_out, full, report_dir)
