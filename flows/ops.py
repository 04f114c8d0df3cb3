"""On-call operations: releases, rollback, status, stop, restart of one
worker, the audit log, and the deploy lock's status and break. Each reads
the cluster's own history from the nodes (ledger and audit on node 0, release
directories on every node), so any laptop with the repository and SSH
access can run them."""

from __future__ import annotations

import calendar
import json
import re
import shlex
import sys
import time

from rich.console import Console
from rich.markup import escape

from flows import deploy as dep
from flows.engine import Engine, Outcome, unit_key, who
from flows.probes import body_problem, http_via_ssh
from llmdeploy import lock, report
from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import Cluster
from llmdeploy.release import (
    RELEASE_RE,
    current_link,
    ledger_record,
    ledger_path,
    parse_ledger_checked,
    parse_lines,
    release_dir,
    root,
)
from llmdeploy.releaseplan import Probe, ReleasePlan, Service, Unit
from llmdeploy.runner import Runner, Step
from roles.facts import section, split_sections


def read_ledger(runner: Runner, cluster: Cluster, problems: list[str] | None = None) -> tuple[list[dict], str | None]:
    """(ledger lines, node 0's current release). Lines that cannot be trusted
    (torn, edited) are skipped; each is said on stderr, and added to
    ``problems`` when the caller passes a list."""
    q = shlex.quote
    script = section("ledger", f"cat {q(ledger_path(cluster))} 2>/dev/null || true") + "\n" + section("current", f"readlink {q(current_link(cluster))} || true")
    out, err, code = runner.exec(cluster.node0, script)
    s = split_sections(out)
    if code != 0 or "ledger" not in s:
        raise LlmdeployError(f"{cluster.node0.name}: cannot read the ledger: {err.strip() or out.strip()}")
    current = s.get("current", ("", 0))[0].strip().rsplit("/", 1)[-1] or None
    records, bad = parse_ledger_checked(s["ledger"][0])
    for b in bad:
        print(f"warning: {cluster.node0.name}:{ledger_path(cluster)}: {b}", file=sys.stderr)
    if problems is not None:
        problems.extend(bad)
    return records, current


def _event(r: dict) -> str:
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
    return text


def release_table(records: list[dict]) -> list[dict]:
    """One row per release, oldest first: when and by whom it was made, its
    digest and hash, whether it was ever good (and when last), its latest
    attempt, and every event it had (nothing is ever rewritten)."""
    rows: dict[str, dict] = {}
    for r in records:
        row = rows.setdefault(r["release"], {"release": r["release"], "time": r.get("time"), "who": r.get("who"),
                                             "image_id": r.get("image_id"), "config_hash": r.get("config_hash"),
                                             "was_good": False, "last_good": None, "latest": None, "result": None, "events": []})
        if r.get("result") == "good":
            row["was_good"], row["last_good"] = True, r.get("time")
        if r.get("result") in ("started", "good", "failed"):
            row["latest"] = {k: r.get(k) for k in ("result", "action", "time", "who", "reason", "from") if r.get(k)}
            row["latest"].setdefault("action", "deploy")
            row["result"] = r.get("result")
        row["events"].append(_event(r))
    return list(rows.values())


def latest_attempt(records: list[dict]) -> dict | None:
    """The newest line that ended an attempt (good or failed)."""
    return next((r for r in reversed(records) if r.get("result") in ("good", "failed")), None)


def failing_release(records: list[dict]) -> str | None:
    """The release whose deploy failed last, when nothing was good after it: the one currently failing."""
    for r in reversed(records):
        if r.get("result") == "good" and (r.get("action") or "deploy") == "deploy":
            return None
        if r.get("result") == "failed" and (r.get("action") or "deploy") == "deploy":
            return r["release"]
    return None


def on_cluster(records: list[dict], current: str | None) -> str | None:
    """The release the cluster runs, or last tried to: the latest attempt's."""
    last = latest_attempt(records)
    return last["release"] if last else current


def rollback_target(records: list[dict], current: str | None, to: str | None) -> str:
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


LEGACY_FILES = ["env", "run.sh", "serve.sh", "release.json"]


def verify_script(cluster: Cluster, rid: str) -> str:
    """What a node needs to run release ``rid``: its files (those its
    release.json lists, else the files every release had before plans were
    recorded), and its image with the recorded ID. Sections: problems, meta, plan."""
    d = release_dir(cluster, rid)
    q = shlex.quote
    listed = f"sed -n '/\"files\": \\[/,/\\]/p' {q(d)}/release.json 2>/dev/null | grep -o '\"[^\"]*\"' | tr -d '\"' | grep -vx files"
    problems = (
        f"for f in env release.json $({listed}); do [ -f {q(d)}/\"$f\" ] || echo \"missing {d}/$f\"; done\n"
        f"[ -f {q(d)}/plan.json ] || for f in run.sh serve.sh; do [ -f {q(d)}/$f ] || echo \"missing {d}/$f\"; done\n"
        f"if [ -f {q(d)}/release.json ]; then\n"
        f"  img=$(sed -n 's/.*\"image\": \"\\([^\"]*\\)\".*/\\1/p' {q(d)}/release.json)\n"
        f"  want=$(sed -n 's/.*\"image_id\": \"\\([^\"]*\\)\".*/\\1/p' {q(d)}/release.json)\n"
        "  have=$(docker image inspect --format '{{.Id}}' \"$img\" 2>/dev/null)\n"
        '  [ -n "$have" ] || echo "missing image $img"\n'
        '  [ -z "$have" ] || [ -z "$want" ] || [ "$have" = "$want" ] || echo "image $img is $have, the release ran $want"\n'
        f"  simg=$(sed -n 's/.*\"serving_image\": \"\\([^\"]*\\)\".*/\\1/p' {q(d)}/release.json)\n"
        '  [ -z "$simg" ] || docker image inspect "$simg" >/dev/null 2>&1 || echo "missing image $simg"\n'
        "fi"
    )
    return "\n".join([
        section("problems", problems),
        section("meta", f"cat {q(d)}/release.json"),
        section("plan", f"cat {q(d)}/plan.json 2>/dev/null || true"),
    ]) + "\n"


def read_release(runner: Runner, cluster: Cluster, rid: str, step: str) -> tuple[dict[str, dict], str, dict[str, str], dict[str, str]]:
    """Release ``rid`` as every node has it, in one round trip each:
    (release.json per host, node 0's plan.json text, {host: why its release.json
    cannot be read}, {host: files or images it lacks})."""
    res = runner.run(Step(name=step, build=lambda n: verify_script(cluster, rid)))
    metas, plan_text, unreadable, missing = {}, "", {}, {}
    for h, r in res.items():
        sec = split_sections(r.stdout)
        lines = [ln for ln in sec.get("problems", ("", 0))[0].splitlines() if ln.startswith(("missing", "image "))]
        if lines:
            missing[h] = "; ".join(lines)
        if r.failed or "meta" not in sec:
            unreadable[h] = r.msg if r.failed else (missing.get(h) or "no release.json")
            continue
        try:
            metas[h] = json.loads(sec["meta"][0])
        except ValueError:
            unreadable[h] = missing.get(h) or f"{release_dir(cluster, rid)}/release.json is unreadable"
            continue
        if h == cluster.node0.name:
            plan_text = sec.get("plan", ("", 0))[0]
    return metas, plan_text, unreadable, missing


def legacy_plan(cluster: Cluster, rid: str, metas: dict[str, dict]) -> ReleasePlan:
    """The plan of a release written before plans were recorded (vLLM-Ascend
    only then): one container per node, node 0 first, then the workers."""
    from systems import vllm_ascend

    prof = cluster.profile
    node0 = cluster.node0
    services = [Service(name="node0", units=[Unit(host=node0.name, container=metas[node0.name]["container"], role="node0",
                                                   show={"start_rank": metas[node0.name].get("start_rank")})],
                        started=Probe(name="the DP RPC port", kind="port", host=node0.name, ip=str(node0.ip), port=getattr(prof, "rpc_port", 13389)),
                        restart="none")]
    workers = [Unit(host=n.name, container=metas[n.name]["container"], role="worker", show={"start_rank": metas[n.name].get("start_rank")})
               for n in cluster.nodes[1:]]
    if workers:
        services.append(Service(name="workers", units=workers, after=["node0"], restart="each"))
    plan = ReleasePlan(system="vllm-ascend", cluster=cluster.name, release=rid, services=services, entry_host=node0.name,
                       entry_port=getattr(prof, "port", 8000), stop_cleanup=vllm_ascend.STOP_CLEANUP,
                       drift_env_prefixes=list(vllm_ascend.DRIFT_ENV_PREFIXES))
    port = plan.entry_port
    served = getattr(prof, "served_model_name", "")
    plan.ready = [Probe(name="/health 200", kind="http", host=node0.name, port=port, path="/health"),
                  Probe(name="/v1/models", kind="http", host=node0.name, port=port, path="/v1/models", check="models", arg=served),
                  Probe(name="chat check", kind="http", host=node0.name, port=port, method="POST", path="/v1/chat/completions",
                        body=vllm_ascend.chat_request(served), check="think")]
    return plan


def plan_of(cluster: Cluster, rid: str, plan_text: str, metas: dict[str, dict]) -> ReleasePlan:
    """A release's plan from its own files on the nodes."""
    if plan_text.strip():
        try:
            plan = ReleasePlan.from_json(plan_text)
        except (ValueError, KeyError, TypeError) as exc:
            raise LlmdeployError(f"release {rid}: plan.json on {cluster.node0.name} is unreadable: {type(exc).__name__}: {exc}") from None
        unknown = sorted(set(plan.hosts()) - {n.name for n in cluster.nodes})
        if unknown:
            raise LlmdeployError(f"release {rid} runs on {', '.join(unknown)}, which the inventory of {cluster.name} no longer has")
        bad = plan_problems(cluster, rid, plan)
        if bad:
            raise LlmdeployError(f"release {rid}: plan.json on {cluster.node0.name} is not one this tool wrote ({'; '.join(bad[:4])}): refusing to run it")
        return plan
    return legacy_plan(cluster, rid, metas)


_SAFE = {
    "container": re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"),
    "prefix": re.compile(r"^([a-z0-9][a-z0-9-]*\.)?$"),
    "ip": re.compile(r"^[A-Za-z0-9.:-]+$"),
    "path": re.compile(r"^/[A-Za-z0-9/._-]*$"),
}


def plan_problems(cluster: Cluster, rid: str, plan: ReleasePlan) -> list[str]:
    """What in a plan read back from a node does not look like one this tool
    wrote: its values reach remote shells and probes, so they are checked."""
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
    return out


def rollback(cluster: Cluster, con: Console, to: str | None, message: str | None, lock_wait: float, json_out: bool) -> int:
    with Runner(cluster) as runner:
        with lock.held(runner, cluster, "rollback", message, lock_wait):
            return rollback_locked(cluster, runner, con, to, message, json_out)


def rollback_locked(cluster: Cluster, runner: Runner, con: Console, to: str | None, message: str | None, json_out: bool) -> int:
    """The rollback itself, for a caller that holds the deploy lock. Needs
    nothing but SSH: the target's plan, files, image and secrets are the
    release's own on the nodes (no secret, model path or serving value of
    today's inventory is read)."""
    records, current = read_ledger(runner, cluster)
    source = on_cluster(records, current)
    target = rollback_target(records, current, to)
    con.print(f"[bold]rollback {cluster.name}[/]: {source or 'nothing'} -> {target}")
    # everything must be there on every node before anything is stopped
    metas, plan_text, unreadable, missing = read_release(runner, cluster, target, "verify target")
    problems = {**missing, **unreadable}
    if problems:
        lock.audit(runner, cluster, "rollback", "refused", target, problems=problems, **{"from": source})
        raise LlmdeployError(
            f"rollback to {target} refused before stopping anything: "
            + "; ".join(f"{h}: {p}" for h, p in problems.items())
        )
    plan = plan_of(cluster, target, plan_text, metas)
    meta0 = metas.get(cluster.node0.name) or next(iter(metas.values()))
    image_id = meta0.get("image_id")
    chash = next((r.get("config_hash") for r in records if r["release"] == target), "")
    recorded = {"action": "rollback", "from": source, "image": meta0.get("image")}
    dep.ledger(runner, cluster, ledger_record(cluster, target, "started", image_id, chash, **recorded))
    eng = dep.engine_for(cluster, runner, con, json_out, plan.system)
    out = Outcome(ok=False, release=target)
    t0 = time.monotonic()
    try:
        started = eng.start(plan, out)
    except KeyboardInterrupt:
        with report.shielded():
            con.print("[bold red]interrupted[/]: stopping what the rollback started")
            eng.stop(None, "stop", cleanup=systems_cleanup(plan))
            dep.ledger(runner, cluster, ledger_record(cluster, target, "failed", image_id, chash, reason="interrupted", **recorded))
            lock.audit(runner, cluster, "rollback", "interrupted", target, **{"from": source, "message": message or ""})
            print(f"rollback interrupted; the deploy lock is released; to run it again: invoke rollback --cluster {cluster.name} --to {target}",
                  file=sys.stderr)
        raise
    if started:
        dep.finish(runner, cluster, plan, out, image_id, chash, **recorded)
        if out.ok and source and source != target:
            dep.ledger(runner, cluster, ledger_record(cluster, source, "rolled back", None, "", to=target,
                                                      image=(metas.get(cluster.node0.name) or {}).get("image")))
    status = dep.report_outcome(cluster, runner, con, eng, plan, out, image_id, chash, [], json_out,
                                time.monotonic() - t0, verb="rollback", **{"from": source, "image": meta0.get("image")})
    lock.audit(runner, cluster, "rollback", "good" if status == 0 else "failed", target, **{"from": source, "message": message or ""})
    return status


def releases(cluster: Cluster, con: Console, json_out: bool) -> int:
    """Every release in the ledger: was it ever good, its latest attempt, every event."""
    problems: list[str] = []
    with Runner(cluster, nodes=[cluster.node0]) as runner:
        records, current = read_ledger(runner, cluster, problems)
    rows = release_table(records)
    try:
        default = rollback_target(records, current, None)
    except LlmdeployError:
        default = None
    if json_out:
        report.emit_json({"cluster": cluster.name, "current": current, "on_cluster": on_cluster(records, current),
                          "rollback_target": default, "releases": rows, "problems": problems})
        return 0
    out = []
    for r in rows:
        marks = []
        if r["release"] == current:
            marks.append("[bold green]current[/]")
        if r["release"] == default:
            marks.append("rollback target")
        latest = r["latest"] or {}
        style = {"good": "green", "failed": "red"}.get(latest.get("result"), "yellow")
        was = f"[green]yes[/] (last {r['last_good']})" if r["was_good"] else "[red]never[/]"
        out.append([r["release"], r["time"], r["who"], (r["image_id"] or "-")[:19], r["config_hash"] or "-", was,
                    f"[{style}]{latest.get('action', '-')} {latest.get('result', '-')}[/]", escape("\n".join(r["events"])) or "-", "\n".join(marks)])
    con.print(report.table(f"releases of {cluster.name} (ledger on {cluster.node0.name})",
                           ["release", "made", "by", "image", "config", "was good", "latest attempt", "events", ""], out))
    for p in problems:
        con.print(f"[bold red]ledger problem[/]: {escape(p)}")
    return 0


def status_script(cluster: Cluster) -> str:
    """The current release's record on this node and the state of its containers (one round trip)."""
    q = shlex.quote
    rel = f'{q(root(cluster))}/releases/"$rel"'
    return "\n".join([
        f"rel=$(readlink {q(current_link(cluster))} 2>/dev/null); rel=${{rel##*/}}",
        section("release", 'echo "$rel"'),
        section("meta", f'[ -n "$rel" ] && cat {rel}/release.json'),
        section("env", f'[ -n "$rel" ] && cat {rel}/env'),
        section("plan", f'[ -n "$rel" ] && cat {rel}/plan.json 2>/dev/null; true'),
        # every container of the cluster on this node, as docker inspect JSON lines
        section("inspect", f"for c in $(docker ps -a --filter label=llmdeploy.cluster={q(cluster.name)} --format '{{{{.Names}}}}'); do "
                           "docker inspect --format '{{json .}}' \"$c\"; done"),
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

    containers = {}
    for line in text("inspect").splitlines():
        try:
            c = json.loads(line)
        except ValueError:
            continue
        if isinstance(c, dict) and isinstance(c.get("Name"), str):
            containers[c["Name"].lstrip("/")] = c
    return {"release": text("release").strip() or None, "meta": load("meta"), "env": parse_env_file(text("env")),
            "plan": text("plan"), "containers": containers}


def drift(plan: ReleasePlan, st: dict, c: dict | None, main: bool, secret_keys: set[str] = frozenset()) -> list[str]:
    """How a running container differs from the current release's record.
    A host's main unit (vLLM's and trtllm's container) is compared with
    release.json (image, command) and the env file; other units (Dynamo's
    services) with their release label. Secret values are never shown."""
    meta = st["meta"] or {}
    if c is None:
        return ["the release's container is missing"]
    out = []
    if main and not meta.get("serving_image") and meta.get("image_id") and c.get("Image") != meta["image_id"]:
        out.append(f"image {c.get('Image', '')[:19]} runs, the release has {meta['image_id'][:19]}")
    labels = (c.get("Config") or {}).get("Labels") or {}
    if labels.get("llmdeploy.release") != st["release"]:
        out.append(f"container label llmdeploy.release={labels.get('llmdeploy.release')!r}, current release {st['release']}")
    if not main:
        return out
    env = dict(x.split("=", 1) for x in (c.get("Config") or {}).get("Env", []) if "=" in x)
    prefixes = tuple(plan.drift_env_prefixes)
    for k in sorted(set(st["env"]) | set(k for k in env if k in st["env"] or (prefixes and k.startswith(prefixes)))):
        if st["env"].get(k) != env.get(k):
            if k in secret_keys:
                out.append(f"environment {k}: the running value differs from the release's (a secret: not shown)")
            else:
                out.append(f"environment {k}: running {env.get(k)!r}, release {st['env'].get(k)!r}")
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


def _docker_state(c: dict | None) -> dict:
    s = (c or {}).get("State")
    return s if isinstance(s, dict) else {}


def _uptime(c: dict | None) -> str:
    started = str(_docker_state(c).get("StartedAt") or "")
    if not started or not _docker_state(c).get("Running"):
        return "-"
    try:
        return f"{int(time.time() - calendar.timegm(time.strptime(started[:19], '%Y-%m-%dT%H:%M:%S')))}s"
    except ValueError:
        return started


def _state(c: dict | None) -> str:
    if c is None:
        return "missing"
    s = _docker_state(c)
    return "running" if s.get("Running") else f"exited ({s.get('ExitCode')})"


def current_plan(cluster: Cluster, sts: dict[str, dict]) -> ReleasePlan | None:
    """The current release's plan, from node 0's files (else another node's)."""
    order = [cluster.node0.name] + [n.name for n in cluster.nodes[1:]]
    for h in order:
        st = sts.get(h)
        if st and st["release"] and RELEASE_RE.match(st["release"]):
            metas = {x: (sts[x]["meta"] or {}) for x in sts if sts[x] and sts[x]["meta"]}
            if st["plan"].strip() or len(metas) == len(cluster.nodes):
                return plan_of(cluster, st["release"], st["plan"], metas)
    return None


def status(cluster: Cluster, con: Console, show_diff: bool, json_out: bool) -> int:
    with Runner(cluster) as runner:
        res = runner.run(Step(name="status", build=lambda n: status_script(cluster)))
        sts = {h: (parse_status(r.stdout) if not r.failed else None) for h, r in res.items()}
        plan = current_plan(cluster, sts)
        health, health_problem = None, None
        if plan is not None and plan.ready:
            p = plan.ready[0]
            try:
                code, body = http_via_ssh(runner, cluster.node(p.host), p.port, p.method, p.path, p.body, 10, p.headers, dest=p.ip)
                health = code
                if code == p.status:
                    health_problem = body_problem(p, body)
            except Exception as exc:  # any way the endpoint can be down
                health = f"unreachable ({type(exc).__name__})"
    rows, doc, bad = [], {}, plan is None
    for n in cluster.nodes:
        r, st = res[n.name], sts[n.name]
        if st is None:
            rows.append([n.name, "-", "-", "-", f"[red]unreachable: {escape(r.msg)}[/]", "-", "-", ""])
            doc[n.name] = {"error": r.msg, "state": "unreachable", "reason": f"unreachable: {r.msg}"}
            bad = True
            continue
        units = plan.units(n.name) if plan is not None and st["release"] == plan.release else []
        if not units:
            rows.append([n.name, st["release"] or "-", "-", "-", "[bold red]no current release[/]" if not st["release"] else "[bold red]not in the release[/]", "-", "-", ""])
            why = ("no current release here" if not st["release"]
                   else f"runs release {st['release']}, the current release is {plan.release}" if plan is not None and plan.units(n.name)
                   else "not in the current release")
            doc[n.name] = {"release": st["release"], "state": "missing", "drift": [], "units": {}, "reason": why}
            # not serving: no release here, or another one than the current release runs here
            bad = bad or not st["release"] or (plan is not None and bool(plan.units(n.name)))
            continue
        node_doc = {"release": st["release"], "state": "running", "image_id": None, "uptime": "-", "drift": [], "units": {}, "reason": None}
        whys = []
        for i, u in enumerate(units):
            c = st["containers"].get(u.container)
            state = _state(c)
            drifts = drift(plan, st, c, u.prefix == "", set(cluster.secret_env)) if show_diff else []
            if state != "running" or drifts:
                bad = True
            if state != "running" and node_doc["state"] == "running":
                node_doc["state"] = state
            labels = ((c or {}).get("Config") or {}).get("Labels") or {}
            rank = labels.get("llmdeploy.start_rank") or str(u.show.get("start_rank", u.show.get("ranks", "")))
            rows.append([n.name, st["release"], f"{u.role or plan.service_of(u).name}", rank,
                         state if state == "running" else f"[bold red]{state}[/]", ((c or {}).get("Image") or "-")[:19], _uptime(c),
                         "\n".join(f"[red]{escape(x)}[/]" for x in drifts) if show_diff else ""])
            node_doc["units"][u.container] = {"service": plan.service_of(u).name, "state": state, "uptime": _uptime(c)}
            if state != "running":
                whys.append(f"{u.role or plan.service_of(u).name} container {u.container} {state}")
            whys += drifts
            node_doc["drift"] += drifts
            if i == 0:
                node_doc["image_id"], node_doc["uptime"] = (c or {}).get("Image"), _uptime(c)
        node_doc["reason"] = "; ".join(whys) or None
        doc[n.name] = node_doc
    if plan is not None and health_problem is None and plan.ready and health != plan.ready[0].status:
        health_problem = f"{plan.ready[0].path} answered {health}, not {plan.ready[0].status}"
    if plan is not None and health_problem and plan.entry_host in doc:
        entry = doc[plan.entry_host]
        entry["reason"] = "; ".join(x for x in (entry.get("reason"), f"endpoint: {health_problem}") if x)
    healthy = plan is not None and plan.ready and health == plan.ready[0].status and not health_problem
    if json_out:
        report.emit_json({"cluster": cluster.name, "release": plan.release if plan else None, "system": plan.system if plan else None,
                          "health": health, "health_problem": health_problem, "healthy": bool(healthy and not bad), "nodes": doc})
    else:
        cols = ["host", "release", "role", "start rank" if plan is None or plan.system == "vllm-ascend" else "ranks", "container", "image", "uptime"]
        cols += ["drift"] if show_diff else [""]
        con.print(report.table(f"status of {cluster.name}", cols, rows))
        style = "green" if healthy else "bold red"
        if plan is None:
            con.print(f"[bold red]{cluster.name} has no current release[/] (invoke releases --cluster {cluster.name})")
        else:
            p = plan.ready[0] if plan.ready else None
            con.print(f"endpoint http://{cluster.node(plan.entry_host).ip}:{plan.entry_port}{p.path if p else ''}: [{style}]{health}[/]"
                      + (f" [bold red]{escape(health_problem)}[/]" if health_problem else ""))
        for h, d in doc.items():
            if d.get("reason"):
                con.print(f"[bold red]not serving[/] {h}: {escape(d['reason'])}", soft_wrap=True)
    return 0 if healthy and not bad else 1


def stop(cluster: Cluster, con: Console, message: str | None, lock_wait: float) -> int:
    with Runner(cluster) as runner:
        with lock.held(runner, cluster, "stop", message, lock_wait) as holder:
            eng = Engine(cluster, runner, con)
            res = eng.stop(None, "stop", cleanup=_cleanups())
            failed = False
            for h, r in res.items():
                if r.failed:
                    con.print(f"[red]{h}: {escape(r.msg)}[/]")
                    failed = True
            lock.audit(runner, cluster, "stop", "failed" if failed else "stopped", None, held=holder, message=message or "")
            con.print(f"{cluster.name}: stopped (in reverse start order){'; some nodes failed, see above' if failed else ''}; stale /dev/shm/moe_* removed")
            return 1 if failed else 0


def _cleanups() -> str:
    """Every system's clean-up after stop (stale files only: safe on any node)."""
    import systems

    parts = []
    for kind in systems.SYSTEMS:
        text = systems.module_for(kind).STOP_CLEANUP
        if text and text not in parts:
            parts.append(text)
    return "".join(parts)


def restart(cluster: Cluster, con: Console, host: str | None, message: str | None, lock_wait: float, service: str | None = None) -> int:
    """``host``: that node's units into the current release (by their service's
    policy: a group such as an MPI world is restarted whole); ``service``: that
    service's units; neither: the whole current release, in the system's order."""
    if host and service:
        raise LlmdeployError("restart takes --host or --service, not both")
    node = None
    if host:
        node = next((n for n in cluster.nodes if n.name == host), None)
        if node is None:
            raise LlmdeployError(f"--host {host}: no such node in {cluster.name} (nodes: {', '.join(n.name for n in cluster.nodes)})")
    what = f"restart {host}" if host else (f"restart {service}" if service else "restart")
    with Runner(cluster) as runner:
        with lock.held(runner, cluster, "restart", message, lock_wait):
            records, current = read_ledger(runner, cluster)
            if not current or not RELEASE_RE.match(current):
                raise LlmdeployError(f"{cluster.name} has no current release to restart{' ' + host + ' into' if host else ''}")
            metas, plan_text, unreadable, _ = read_release(runner, cluster, current, "read release")
            if unreadable:
                h, why = next(iter(unreadable.items()))
                raise LlmdeployError(f"{h}: the current release {current} has no readable release.json ({why})")
            plan = plan_of(cluster, current, plan_text, metas)
            eng = dep.engine_for(cluster, runner, con, False, plan.system)
            out = Outcome(ok=False, release=current)
            if service is not None and service not in {s.name for s in plan.services}:
                raise LlmdeployError(f"--service {service}: release {current} has no such service (it has {', '.join(s.name for s in plan.services)})")
            if node is None and service is None:
                con.print(f"{cluster.name}: restarting release {current} as a whole ({' -> '.join(s.name for s in plan.services)})")
                eng.stop(None, "stop", cleanup=systems_cleanup(plan))
                ok = eng.start(plan, out)
            else:
                units = plan.units(host) if host else plan.service(service).units
                if not units:
                    raise LlmdeployError(f"--host {host} runs nothing in release {current}" if host else f"--service {service} runs nothing here")
                todo = []
                for u in units:
                    svc = plan.service_of(u)
                    if svc.restart == "none":
                        raise LlmdeployError(f"--{'host ' + host if host else 'service ' + service} is {who(u, svc)}: restarting it alone cannot re-form "
                                             f"what depends on it; restart without --host restarts the whole release in order")
                    todo += [x for x in (svc.units if svc.restart == "group" else [u]) if x not in todo]
                for svc in plan.services:
                    mine = [u for u in svc.units if u in todo]
                    if mine and svc.restart == "group":
                        eng.stop_service(plan, svc, f"restart-{int(time.time())}")
                for u in todo:
                    out.attempts[unit_key(u)] = int(time.time()) - 1  # a fresh attempt number: earlier logs are kept
                ok = eng.start_units(plan, todo, out)
                rank = next((u.show.get("start_rank") for u in units if u.show.get("start_rank") is not None), None)
                con.print(f"{host or service}: restarted {', '.join(u.container for u in todo if host is None or u.host == host)}"
                          + (f" (start rank {rank})" if rank is not None else "") + f"; waiting for {waiting_for(plan)}")
                out.attempts = {k: 1 for k in out.attempts}
                ok = ok and eng.watch(plan, out)
            if not ok:
                lock.audit(runner, cluster, what, "failed", current, reason=out.reason)
                raise LlmdeployError(f"{out.where}: {out.reason}")
            lock.audit(runner, cluster, what, "good", current, message=message or "")
            if node is None and service is None:
                con.print(f"[bold green]{cluster.name} healthy[/]: release {current} restarted")
            elif service is not None:
                con.print(f"[bold green]{cluster.name} healthy[/]: {service} is back")
            else:
                rank = next((u.show.get("start_rank") for u in plan.units(host) if u.show.get("start_rank") is not None), None)
                con.print(f"[bold green]{cluster.name} healthy[/]: {host} re-joined" + (f" with start rank {rank}" if rank is not None else ""))
            return 0


def waiting_for(plan: ReleasePlan) -> str:
    """What ``Engine.watch`` waits for, in words: every readiness probe."""
    if not plan.ready:
        return "the containers"
    more = len(plan.ready) - 1
    return plan.ready[0].name + (f" and {more} more readiness check{'s' if more > 1 else ''}" if more else "")


def systems_cleanup(plan: ReleasePlan) -> str:
    import systems

    return systems.module_for(plan.system).STOP_CLEANUP


def audit_log(cluster: Cluster, con: Console, last: int | None, json_out: bool) -> int:
    with Runner(cluster, nodes=[cluster.node0]) as runner:
        out, err, code = runner.exec(cluster.node0, f"cat {shlex.quote(lock.audit_path(cluster))} 2>/dev/null; true")
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
