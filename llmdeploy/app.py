"""What the Invoke tasks call: load, plan, run, report. Each returns an exit status."""

from __future__ import annotations

from rich.console import Console

from . import report
from .errors import LlmdeployError
from .inventory import Cluster, load_cluster
from .plan import Context, load_playbook, resolve_step, select_nodes
from .runner import FAILED, SKIPPED, HostResult, Runner


def run_playbook(
    cluster: Cluster,
    name: str,
    limit: str | None,
    con: Console,
    show_progress: bool = True,
    ctx: Context | None = None,
):
    """Run every play of a playbook; returns (runner recap, {step: {host: HostResult}}, round trips per host)."""
    plays = load_playbook(name)
    targets = select_nodes(cluster, limit)
    ctx = ctx or Context(cluster)
    with report.host_progress(con, len(targets), enabled=show_progress) as cb:
        with Runner(cluster, nodes=targets, progress=cb) as runner:
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


def facts(cluster_name: str, json_out: bool = False, limit: str | None = None) -> int:
    con = report.console(json_out)
    cluster = load_cluster(cluster_name)
    recap, results, trips = run_playbook(cluster, "facts", limit, con)
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
        rows = []
        for h, r in per_host.items():
            f = r.data or {}
            if r.failed:
                rows.append([f"[bold red]{h}[/]", f"[red]{r.status}[/]"] + [""] * 6 + [f"[red]{r.msg}[/]"])
                continue
            nic = f.get("nic") or {}
            nic_txt = f"{nic.get('name', f.get('nic_configured'))} {','.join(nic.get('ipv4', [])) or '-'} mtu {nic.get('mtu')} {'up' if nic.get('up') else 'DOWN'}" if nic else f"[red]{f.get('nic_configured')} missing[/]"
            acc = f"{f['devices_healthy']}/{len(f['devices'])} {f['accelerator'].upper()} OK"
            numa_aff = sorted({d['numa'] for d in f["devices"] if d.get("numa") is not None})
            problems = "; ".join(f.get("problems") or []) or "[green]none[/]"
            rows.append(
                [
                    h,
                    f"{f.get('hostname')}\n{f.get('os')}, {f.get('kernel')}",
                    f"{f.get('cpus')} / {f.get('numa_nodes')}",
                    f"{f.get('mem_total_gib')} GiB",
                    f"{f.get('model_disk_free_gib')} GiB",
                    f"{acc}\nNUMA {','.join(map(str, numa_aff)) or '-'}",
                    nic_txt,
                    f.get("container_engine") or "[red]none[/]",
                    problems,
                ]
            )
        con.print(
            report.table(
                f"facts: {cluster.name} ({cluster.platform_info.name}, {len(per_host)} nodes)",
                ["host", "hostname / OS / kernel", "CPUs / NUMA", "memory", "free disk (model)", "devices", "serving NIC", "engine", "problems"],
                rows,
            )
        )
        con.print(report.recap_table(recap))
    return status


def prepare(
    cluster_name: str,
    check: bool = False,
    diff: bool = False,
    limit: str | None = None,
    json_out: bool = False,
    run_checks: bool = True,
) -> int:
    """Make every node ready to serve; with ``check`` change nothing and say what would change."""
    con = report.console(json_out)
    cluster = load_cluster(cluster_name)
    ctx = Context(cluster, check=check, diff=diff)
    mode = " (check mode: nothing is changed)" if check else ""
    if not json_out:
        con.print(f"[bold]prepare {cluster.name}[/]: {len(select_nodes(cluster, limit))} nodes{mode}")
    recap, results, trips = run_playbook(cluster, "prepare", limit, con, ctx=ctx)
    status = _exit_status(recap)
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
            }
        )
    else:
        for step, res in results.items():
            report.step_lines(con, step, res, diff=diff)
        con.print(report.recap_table(recap))
        verb = "would change" if check else "changed"
        con.print(f"{changed} {verb}" + ("" if status == 0 else ", [bold red]FAILED[/] (see the failed lines above)"))
    if status == 0 and run_checks and not check:
        from . import check as node_check

        if not json_out:
            con.print("[bold]node acceptance tests[/] (invoke check)")
        status = node_check.run(cluster, limit=limit, con=con, quiet=json_out)
    return status


def check(cluster_name: str, limit: str | None = None, select: str | None = None) -> int:
    from . import check as node_check

    cluster = load_cluster(cluster_name)
    return node_check.run(cluster, limit=limit, select=select)


def sim_up(cluster_name: str) -> int:
    from sim import cluster as simc

    cluster = load_cluster(cluster_name)
    if not cluster.name.startswith("sim-"):
        raise LlmdeployError(f"{cluster.name} is not a simulated cluster (its name must start with sim-)")
    simc.up(cluster)
    return 0


def sim_down(cluster_name: str | None) -> int:
    """Take down ``cluster_name``, or every simulated cluster that is up."""
    from sim import cluster as simc

    names = [cluster_name] if cluster_name else simc.running()
    if not names:
        print("sim: nothing is up")
    for name in names:
        simc.down(name)
    return 0


def sim_status() -> int:
    from sim import cluster as simc

    names = simc.running()
    print("\n".join(names) if names else "sim: nothing is up")
    return 0
