"""What the Invoke tasks call: load, plan, run, report. Each returns an exit status."""

from __future__ import annotations

from rich.console import Console

from . import report
from .errors import LlmdeployError
from .inventory import Cluster, load_cluster
from .plan import load_playbook, resolve_step, select_nodes
from .runner import FAILED, SKIPPED, HostResult, Runner


def run_playbook(cluster: Cluster, name: str, limit: str | None, con: Console, show_progress: bool = True):
    """Run every play of a playbook; returns (runner recap, {step: {host: HostResult}}, round trips per host)."""
    plays = load_playbook(name)
    targets = select_nodes(cluster, limit)
    results: dict[str, dict[str, HostResult]] = {}
    with report.host_progress(con, len(targets), enabled=show_progress) as cb:
        with Runner(cluster, nodes=targets, progress=cb) as runner:
            for play in plays:
                if not _run_play(runner, cluster, play, limit, results):
                    break
    return runner.recap, results, dict(runner.round_trips)


def _run_play(runner: Runner, cluster: Cluster, play, limit: str | None, results: dict) -> bool:
    """Run one play's steps; False when a failure must stop the playbook."""
    nodes = select_nodes(cluster, limit, play.hosts)
    for ref in play.steps:
        step = resolve_step(ref, cluster)
        res = runner.run(step, nodes)
        results[step.name] = res
        if play.any_errors_fatal and any(r.failed for r in res.values()):
            return False
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
