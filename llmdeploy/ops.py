"""On-call operations: releases, rollback, status, stop, restart of one
worker, the audit log, and the deploy lock's status and break. Each reads
the cluster's own history from the nodes (ledger and audit on node 0, release
directories on every node), so any laptop with the repository and SSH
access can run them."""

from __future__ import annotations

import calendar
import json
import shlex
import time

from rich.console import Console
from rich.markup import escape

from roles.facts import section, split_sections

from . import deploy as dep
from . import lock, report
from .errors import LlmdeployError
from .inventory import Cluster, Node
from .release import RELEASE_RE, current_link, ledger_path, parse_ledger, release_dir, root
from .runner import Runner, Step


def read_ledger(runner: Runner, cluster: Cluster) -> tuple[list[dict], str | None]:
    """(ledger lines, node 0's current release)."""
    q = shlex.quote
    script = section("ledger", f"cat {q(ledger_path(cluster))} 2>/dev/null || true") + "\n" + section("current", f"readlink {q(current_link(cluster))} || true")
    out, err, code = runner.exec(cluster.node0, script)
    s = split_sections(out)
    if code != 0 or "ledger" not in s:
        raise LlmdeployError(f"{cluster.node0.name}: cannot read the ledger: {err.strip() or out.strip()}")
    current = s.get("current", ("", 0))[0].strip().rsplit("/", 1)[-1] or None
    return parse_ledger(s["ledger"][0]), current


def release_table(records: list[dict]) -> list[dict]:
    """One row per release, oldest first: first time, who, digest, hash, last result, actions."""
    rows: dict[str, dict] = {}
    for r in records:
        row = rows.setdefault(r["release"], {"release": r["release"], "time": r.get("time"), "who": r.get("who"),
                                             "image_id": r.get("image_id"), "config_hash": r.get("config_hash"),
                                             "result": None, "events": []})
        row["result"] = r.get("result")
        if r.get("action"):
            row["events"].append(f"{r['action']} {r.get('time')} by {r.get('who')}" + (f" from {r['from']}" if r.get("from") else ""))
    return list(rows.values())


def rollback_target(records: list[dict], current: str | None, to: str | None) -> str:
    rows = release_table(records)
    good = [r["release"] for r in rows if r["result"] == "good"]
    if to:
        if to not in {r["release"] for r in rows}:
            raise LlmdeployError(f"--to {to}: no such release in the ledger")
        if to not in good:
            raise LlmdeployError(f"--to {to}: that release is not good (its last result is {next(r['result'] for r in rows if r['release'] == to)})")
        return to
    order = [r["release"] for r in rows]
    before = order[: order.index(current)] if current in order else order
    candidates = [r for r in before if r in good and r != current]
    if not candidates:
        raise LlmdeployError(f"no good release before the current one ({current}) to roll back to")
    return candidates[-1]


def verify_script(cluster: Cluster, rid: str) -> str:
    """What a node needs to run release ``rid``: its files, and its image with the recorded ID."""
    d = release_dir(cluster, rid)
    q = shlex.quote
    return (
        f"for f in env run.sh serve.sh release.json; do [ -f {q(d)}/$f ] || echo \"missing {d}/$f\"; done\n"
        f"if [ -f {q(d)}/release.json ]; then\n"
        f"  img=$(sed -n 's/.*\"image\": \"\\([^\"]*\\)\".*/\\1/p' {q(d)}/release.json)\n"
        f"  want=$(sed -n 's/.*\"image_id\": \"\\([^\"]*\\)\".*/\\1/p' {q(d)}/release.json)\n"
        "  have=$(docker image inspect --format '{{.Id}}' \"$img\" 2>/dev/null)\n"
        '  [ -n "$have" ] || echo "missing image $img"\n'
        '  [ -z "$have" ] || [ -z "$want" ] || [ "$have" = "$want" ] || echo "image $img is $have, the release ran $want"\n'
        f"  cat {q(d)}/release.json\n"
        "fi\n"
    )


def plans_from_releases(cluster: Cluster, metas: dict[str, dict]) -> list[dep.NodePlan]:
    return [
        dep.NodePlan(host=n.name, role=metas[n.name]["role"], start_rank=metas[n.name]["start_rank"], env={}, env_text="",
                     serve_command="", container_command="", container=metas[n.name]["container"], image=metas[n.name]["image"])
        for n in cluster.nodes
    ]


def rollback(cluster: Cluster, con: Console, to: str | None, message: str | None, lock_wait: float, json_out: bool, finish_outcome) -> int:
    with Runner(cluster) as runner:
        with lock.held(runner, cluster, "rollback", message, lock_wait):
            return rollback_locked(cluster, runner, con, to, message, json_out, finish_outcome)


def rollback_locked(cluster: Cluster, runner: Runner, con: Console, to: str | None, message: str | None, json_out: bool, finish_outcome, after_failed: bool = False) -> int:
    """The rollback itself, for a caller that holds the deploy lock. After a
    failed deploy (``after_failed``) the target is the current release: the
    last good one, which the failed deploy stopped."""
    records, current = read_ledger(runner, cluster)
    if after_failed:
        if not current:
            raise LlmdeployError("no good release to bring back: this cluster has never served")
        to = current
    target = rollback_target(records, current, to)
    con.print(f"[bold]rollback {cluster.name}[/]: {current} -> {target}")
    # everything must be there on every node before anything is stopped
    res = runner.run(Step(name="verify target", build=lambda n: verify_script(cluster, target)))
    problems, metas = {}, {}
    for h, r in res.items():
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith(("missing", "image "))]
        if r.failed or lines:
            problems[h] = r.msg if r.failed else "; ".join(lines)
            continue
        metas[h] = json.loads(r.stdout[r.stdout.index("{"):])
    if problems:
        lock.audit(runner, cluster, "rollback", "refused", target, problems=problems)
        raise LlmdeployError(
            f"rollback to {target} refused before stopping anything: "
            + "; ".join(f"{h}: {p}" for h, p in problems.items())
        )
    plans = plans_from_releases(cluster, metas)
    image_id = next(iter(metas.values())).get("image_id")
    chash = next((r.get("config_hash") for r in records if r["release"] == target), "")
    d = dep.Deployer(cluster, runner, con, quiet=json_out)
    out = dep.Outcome(ok=False, release=target)
    t0 = time.monotonic()
    if d.start(plans, target, out):
        d.finish(target, image_id, chash, out, action="rollback", **{"from": current})
    status = finish_outcome(cluster, runner, con, d, plans, out, image_id, chash, list(cluster.secret_values().values()), json_out, time.monotonic() - t0, verb="rollback")
    lock.audit(runner, cluster, "rollback", "good" if status == 0 else "failed", target, **{"from": current, "message": message or ""})
    return status


def releases(cluster: Cluster, con: Console, json_out: bool) -> int:
    with Runner(cluster, nodes=[cluster.node0]) as runner:
        records, current = read_ledger(runner, cluster)
    rows = release_table(records)
    if json_out:
        report.emit_json({"cluster": cluster.name, "current": current, "releases": rows})
        return 0
    out = []
    for r in rows:
        cur = "[bold green]current[/]" if r["release"] == current else ""
        style = {"good": "green", "failed": "red"}.get(r["result"], "yellow")
        out.append([r["release"], r["time"], r["who"], (r["image_id"] or "-")[:19], r["config_hash"] or "-",
                    f"[{style}]{r['result']}[/]", "\n".join(r["events"]) or "-", cur])
    con.print(report.table(f"releases of {cluster.name} (ledger on {cluster.node0.name})",
                           ["release", "time", "who", "image", "config", "result", "events", ""], out))
    return 0


def status_script(cluster: Cluster) -> str:
    q = shlex.quote
    rel = f'{q(root(cluster))}/releases/"$rel"'
    return "\n".join([
        f"rel=$(readlink {q(current_link(cluster))} 2>/dev/null); rel=${{rel##*/}}",
        section("release", 'echo "$rel"'),
        section("meta", f'[ -n "$rel" ] && cat {rel}/release.json'),
        section("env", f'[ -n "$rel" ] && cat {rel}/env'),
        section("inspect", f"[ -n \"$rel\" ] && docker inspect --format '{{{{json .}}}}' {q(cluster.name)}-\"$rel\""),
    ]) + "\n"


def parse_status(out: str) -> dict:
    from roles.commenv import parse_env_file

    s = split_sections(out)

    def text(name: str) -> str:
        v = s.get(name)
        return v[0] if v and v[1] == 0 else ""

    def load(name: str):
        try:
            return json.loads(text(name)) if text(name).strip() else None
        except ValueError:
            return None

    return {"release": text("release").strip() or None, "meta": load("meta"), "env": parse_env_file(text("env")),
            "container": load("inspect")}


def drift(cluster: Cluster, node: Node, st: dict) -> list[str]:
    """How the running container differs from the current release's record."""
    meta, c = st["meta"] or {}, st["container"]
    if c is None:
        return ["the release's container is missing"]
    out = []
    if meta.get("image_id") and c.get("Image") != meta["image_id"]:
        out.append(f"image {c.get('Image', '')[:19]} runs, the release has {meta['image_id'][:19]}")
    env = dict(x.split("=", 1) for x in (c.get("Config") or {}).get("Env", []) if "=" in x)
    for k in sorted(set(st["env"]) | set(k for k in env if k in st["env"] or k.startswith(("HCCL_", "GLOO_", "TP_", "VLLM_", "ASCEND_")))):
        if st["env"].get(k) != env.get(k):
            out.append(f"environment {k}: running {env.get(k)!r}, release {st['env'].get(k)!r}")
    labels = (c.get("Config") or {}).get("Labels") or {}
    if labels.get("llmdeploy.release") != st["release"]:
        out.append(f"container label llmdeploy.release={labels.get('llmdeploy.release')!r}, current release {st['release']}")
    cmd = (c.get("Config") or {}).get("Cmd") or []
    want = meta.get("command")
    if want and cmd != want:
        have, need = _flag_pairs(cmd), _flag_pairs(want)
        added = [a for a in have if a not in need]
        dropped = [a for a in need if a not in have]
        out.append(f"command line differs from the release: running has {' '.join(added[:6]) or '-'}, lacks {' '.join(dropped[:6]) or '-'}")
    return out


def _flag_pairs(args: list[str]) -> list[str]:
    """``--flag value`` pairs (and bare flags/positionals) of a command line."""
    out, i = [], 0
    while i < len(args):
        if args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            out.append(f"{args[i]} {args[i + 1]}")
            i += 2
        else:
            out.append(args[i])
            i += 1
    return out


def status(cluster: Cluster, con: Console, show_diff: bool, json_out: bool) -> int:
    with Runner(cluster) as runner:
        res = runner.run(Step(name="status", build=lambda n: status_script(cluster)))
        health = None
        try:
            code, _ = dep.http_via_ssh(runner, cluster.node0, cluster.profile.port, "GET", "/health", None, 10)
            health = code
        except Exception as exc:  # any way the endpoint can be down
            health = f"unreachable ({type(exc).__name__})"
    rows, doc, bad = [], {}, False
    for n in cluster.nodes:
        r = res[n.name]
        if r.failed:
            rows.append([n.name, "-", "-", f"[red]{escape(r.msg)}[/]", "-", "-", "-"])
            doc[n.name] = {"error": r.msg}
            bad = True
            continue
        st = parse_status(r.stdout)
        c = st["container"]
        if c is None:
            state = "missing"
        else:
            s = c["State"]
            state = "running" if s.get("Running") else f"exited ({s.get('ExitCode')})"
        started = (c or {}).get("State", {}).get("StartedAt") or ""
        uptime = "-"
        if started and state == "running":
            try:
                uptime = f"{int(time.time() - calendar.timegm(time.strptime(started[:19], '%Y-%m-%dT%H:%M:%S')))}s"
            except ValueError:
                uptime = started
        drifts = drift(cluster, n, st) if show_diff and st["release"] else []
        if state != "running" or drifts:
            bad = True
        labels = ((c or {}).get("Config") or {}).get("Labels") or {}
        rows.append([n.name, st["release"] or "-", labels.get("llmdeploy.start_rank", str(n.start_rank)),
                     state if state == "running" else f"[bold red]{state}[/]", ((c or {}).get("Image") or "-")[:19], uptime,
                     "\n".join(f"[red]{escape(x)}[/]" for x in drifts) if show_diff else ""])
        doc[n.name] = {"release": st["release"], "state": state, "image_id": (c or {}).get("Image"), "uptime": uptime, "drift": drifts}
    healthy = health == 200
    if json_out:
        report.emit_json({"cluster": cluster.name, "health": health, "healthy": healthy and not bad, "nodes": doc})
    else:
        cols = ["host", "release", "start rank", "container", "image", "uptime"] + (["drift"] if show_diff else [""])
        con.print(report.table(f"status of {cluster.name}", cols, rows))
        style = "green" if healthy else "bold red"
        con.print(f"endpoint http://{cluster.node0.ip}:{cluster.profile.port}/health: [{style}]{health}[/]")
    return 0 if healthy and not bad else 1


def stop(cluster: Cluster, con: Console, message: str | None, lock_wait: float) -> int:
    with Runner(cluster) as runner:
        with lock.held(runner, cluster, "stop", message, lock_wait):
            script = dep.stop_script(cluster, None, cluster.deploy.stop_timeout_s) + "rm -f /dev/shm/moe_* 2>/dev/null; true\n"
            res = dep.stop_in_order(runner, cluster, script, "stop", con.print)
            failed = False
            for h, r in res.items():
                if r.failed:
                    con.print(f"[red]{h}: {escape(r.msg)}[/]")
                    failed = True
            lock.audit(runner, cluster, "stop", "failed" if failed else "stopped", None, message=message or "")
            con.print(f"{cluster.name}: stopped (workers first, then node 0); stale /dev/shm/moe_* removed")
            return 1 if failed else 0


def restart(cluster: Cluster, con: Console, host: str, message: str | None, lock_wait: float) -> int:
    node = next((n for n in cluster.nodes if n.name == host), None)
    if node is None:
        raise LlmdeployError(f"--host {host}: no such node in {cluster.name}")
    if node is cluster.node0:
        raise LlmdeployError(f"--host {host} is node 0: restarting it alone cannot re-form the DP group; use invoke rollback --to the current release, or deploy")
    with Runner(cluster) as runner:
        with lock.held(runner, cluster, "restart", message, lock_wait):
            records, current = read_ledger(runner, cluster)
            if not current or not RELEASE_RE.match(current):
                raise LlmdeployError(f"{cluster.name} has no current release to restart {host} into")
            name = f"{cluster.name}-{current}"
            o, e, code = runner.exec(node, dep.start_script(cluster, current, name, int(time.time())))
            if code != 0:
                lock.audit(runner, cluster, f"restart {host}", "failed", current)
                raise LlmdeployError(f"{host}: the container did not start: {(e or o).strip()}")
            con.print(f"{host}: restarted {name} (start rank {node.start_rank}); waiting for /health")
            end = time.monotonic() + cluster.deploy.ready_timeout_s
            while time.monotonic() < end:
                st = runner.exec(node, dep.inspect_script(name))[0].split()
                if not st or st[0] != "running":
                    lock.audit(runner, cluster, f"restart {host}", "failed", current)
                    log = runner.exec(node, f"docker logs {shlex.quote(name)} 2>&1 | tail -c 100000")[0]
                    from .logs import match

                    found = match(log)
                    raise LlmdeployError(f"{host}: the restarted worker exited: {found[0] if found else ' '.join(st)}")
                try:
                    code, _ = dep.http_via_ssh(runner, cluster.node0, cluster.profile.port, "GET", "/health", None, 10)
                    if code == 200:
                        lock.audit(runner, cluster, f"restart {host}", "good", current, message=message or "")
                        con.print(f"[bold green]{cluster.name} healthy[/]: {host} re-joined with start rank {node.start_rank}")
                        return 0
                except Exception:
                    pass
                time.sleep(cluster.deploy.poll_s)
            lock.audit(runner, cluster, f"restart {host}", "failed", current)
            raise LlmdeployError(f"{cluster.name} not healthy within {cluster.deploy.ready_timeout_s:g}s after restarting {host}")


def audit_log(cluster: Cluster, con: Console, last: int | None, json_out: bool) -> int:
    with Runner(cluster, nodes=[cluster.node0]) as runner:
        out, err, code = runner.exec(cluster.node0, f"cat {shlex.quote(lock.audit_path(cluster))} 2>/dev/null; true")
    recs = []
    for line in out.splitlines():
        try:
            recs.append(json.loads(line))
        except ValueError:
            continue
    if last:
        recs = recs[-last:]
    if json_out:
        report.emit_json({"cluster": cluster.name, "audit": recs})
        return 0
    rows = [[r.get("time"), r.get("who"), r.get("command"), r.get("release") or "-", r.get("result"),
             escape(", ".join(f"{k}={v}" for k, v in r.items() if k not in ("time", "who", "command", "release", "result") and v))] for r in recs]
    con.print(report.table(f"audit log of {cluster.name} (on {cluster.node0.name})", ["time", "who", "command", "release", "result", "details"], rows))
    return 0


def lock_status(cluster: Cluster, con: Console) -> int:
    with Runner(cluster, nodes=[cluster.node0]) as runner:
        out, err, code = runner.exec(cluster.node0, lock.status_script(cluster))
    if out.startswith("free"):
        con.print(f"{cluster.name}: the deploy lock is free")
        return 0
    con.print(f"{cluster.name}: the deploy lock is held by {escape(lock.describe(lock.parse_holder(out)))}")
    return 1


def lock_break(cluster: Cluster, con: Console, reason: str) -> int:
    if not reason or not reason.strip():
        raise LlmdeployError("lock.break needs --reason: say why the holder is gone")
    with Runner(cluster, nodes=[cluster.node0]) as runner:
        out, err, code = runner.exec(cluster.node0, lock.break_script(cluster))
        if out.startswith("free"):
            con.print(f"{cluster.name}: the deploy lock is not held; nothing to break")
            return 0
        holder = lock.parse_holder("x\n" + out.splitlines()[0])
        lock.audit(runner, cluster, "lock.break", "broken", None, reason=reason, holder=lock.describe(holder))
    con.print(f"{cluster.name}: broke the deploy lock held by {escape(lock.describe(holder))}")
    return 0
