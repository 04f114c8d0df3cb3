"""``invoke deploy``, the flow: prepare, then start serving as a recorded release.

1. the serving system builds the release plan (``systems``): the
   services in their playbook's order, every file each node needs, and a
   release id from the time and a hash of those files and the image digest;
2. the files go under ``releases/<id>/`` on every node (staged, then renamed),
   with ``plan.json``, from which rollback, status, stop and restart work;
   the ledger on node 0 says ``started``;
3. the engine (``flows.engine``) stops what the previous release left
   running (reverse start order, logs kept), starts the services in order,
   watches every container (restart policies, failure signatures) and
   probes readiness through the SSH connection;
4. ``current`` -> the release on every node, ledger ``good``, a summary.

On failure: a log bundle from every node, ledger ``failed``, the new
release's containers stopped, and the last good release brought back
(``--no-rollback`` leaves the failed state for debugging). Interrupted
(Ctrl-C, SIGTERM): the new release's containers stopped, the lock released,
and the one command that rolls back printed.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rich.console import Console
from rich.markup import escape

import systems
from flows import bench, verify
from flows.releases import serving_plan
from flows.engine import Engine, Outcome, unit_key
from llmdeploy import interrupt, lock, report
from llmdeploy.deployment import Deployment
from llmdeploy.errors import LlmdeployError, UnreachableError, mask
from llmdeploy.inventory import Cluster
from llmdeploy.release import (
    append_script,
    content_hash,
    ledger_path,
    ledger_record,
    new_id,
    release_dir,
    set_current_script,
    write_payload,
    write_script,
)
from llmdeploy.releaseplan import ReleasePlan
from llmdeploy.runner import SKIPPED, Runner, Step
from llmdeploy.serving import ReleaseFile

DRAFT_ID = "00000000T000000Z-00000000"
# a part of the placeholder that no release id has (its date): left after the id is set, a system derived something from it
_DRAFT_PART = DRAFT_ID.split("-")[0]
# files whose content names the release itself: not part of the config hash
_SELF_NAMING = ("release.json", "plan.json")


def plan_release(dep: Deployment, prepared: dict[str, dict | None], image_key: str, image_id: str | None = None) -> tuple[str, str, ReleasePlan]:
    """(release id, content hash, plan): the id is the time plus a hash of
    what every node runs and of the image (``image_key``). The plan is built
    once, with a placeholder id that the hash covers, then given its id.
    Pure."""
    cluster = dep.cluster
    draft = systems.build(dep, prepared, DRAFT_ID, image_id)
    parts = [image_key] + [
        f"{host}/{name}\0{content}" for host in sorted(draft.files) for name, (content, _) in sorted(draft.files[host].items()) if name not in _SELF_NAMING
    ]
    chash = content_hash(parts)
    rid = new_id(chash)
    plan = draft.with_release(DRAFT_ID, rid)
    left = [f"{host}/{name}" for host, files in plan.files.items() for name, (content, _) in files.items() if _DRAFT_PART in content]
    if left or _DRAFT_PART in plan.to_json():
        # a system made something of the id other than the id itself: the placeholder cannot stand for it
        raise ValueError(f"the plan names its release id in a form other than the id itself ({', '.join(left[:3]) or 'plan.json'})")
    text = plan.to_json()
    for host, files in plan.files.items():
        files["plan.json"] = ReleaseFile(text, 0o644)
        # release.json names every file of the release on this node (rollback checks them)
        meta_text, mode = files["release.json"]
        meta = json.loads(meta_text)
        meta["files"] = sorted(files)
        # names only: rollback and log bundles mask these values read from the nodes' own env files
        meta["secret_keys"] = sorted(cluster.secret_env)
        files["release.json"] = ReleaseFile(json.dumps(meta, indent=1, sort_keys=True) + "\n", mode)
    return rid, chash, plan


def check_doc(dep: Deployment, plan: ReleasePlan, chash: str, secrets: list[str]) -> dict:
    cluster = dep.cluster
    doc: dict[str, Any] = {"cluster": cluster.name, "system": plan.system, "release": plan.release, "config_hash": chash[:16]}
    doc.update(systems.check_doc(cluster, plan, secrets))
    doc["services"] = [
        {"name": s.name, "after": s.after, "restart": s.restart, "started": s.started.describe() if s.started else None,
         "units": [{"host": u.host, "container": u.container, "role": u.role, "order": u.order} for u in s.units]}
        for s in plan.services
    ]
    # a probe that reads the same URL as another (Dynamo's frontend /health, first and last) says which it is
    said = [p.describe() for p in plan.ready]
    doc["ready"] = [f"{d} ({p.name})" if said.count(d) > 1 else d for d, p in zip(said, plan.ready)]
    # how the cluster's launcher starts them (Slurm: each step's srun line), beside each unit's own command
    rd = release_dir(cluster, plan.release)
    rt = dep.runtime
    steps = dep.launcher.start_lines(cluster, plan, lambda u: rt.start_script(rd, u.container, u.run_file, 1) or "")
    if steps:
        doc["launch_steps"] = [{"what": what, "command": mask(line, secrets)} for what, line in steps]
    return doc


def print_check(con: Console, doc: dict, labels: dict[str, str]) -> None:
    """``doc`` as lines per node; ``labels``: the plan's show labels, for the values each node's entry has of them."""
    for p in doc["nodes"]:
        shown = "".join(f", {label} {p[key]}" for key, label in labels.items() if p.get(key) is not None)
        con.print(f"[bold]{p['host']}[/] ({p['role']}{escape(shown)})")
        con.print(f"  container: {escape(p['container_command'])}", soft_wrap=True)
        if p.get("serve_command"):
            con.print(f"  serve:     {escape(p['serve_command'])}", soft_wrap=True)
        for u in p.get("units") or []:
            if u.get("serve_command"):
                con.print(f"  serve ({escape(u['service'])}): {escape(u['serve_command'])}", soft_wrap=True)
        for name, text in (p.get("files") or {}).items():
            con.print(f"  [dim]{escape(name)}:[/]")
            con.print(escape(text.rstrip()), soft_wrap=True)
    for step in doc.get("launch_steps") or []:
        con.print(f"[bold]step[/] {escape(step['what'])}:")
        con.print(f"  {escape(step['command'])}", soft_wrap=True)
    con.print("start order: " + " -> ".join(f"{s['name']} ({s['restart']})" for s in doc["services"]) + "; ready: " + ", ".join(doc["ready"]))
    con.print("check mode: nothing was read from or changed on any node")


def ledger(runner: Runner, cluster: Cluster, record: dict, timeout: float | None = None) -> None:
    out, err, code = runner.exec(cluster.node0, append_script(ledger_path(cluster), record), timeout=timeout)
    if code != 0:
        raise LlmdeployError(f"{cluster.node0.name}: cannot append to the ledger: {err.strip() or out.strip()}")


def last_ledger_line(runner: Runner, cluster: Cluster, record: dict) -> None:
    """An interrupted command's ledger line: with a deadline, and a failure
    said beside the interruption, never instead of it (the exit stays 130)."""
    interrupt.bounded(f"the ledger's last line on {cluster.node0.name}", interrupt.LAST_LINE_S + 5,
                      lambda: ledger(runner, cluster, record, timeout=interrupt.LAST_LINE_S))


def stop_interrupted(eng, what: str, fn) -> None:
    """An interrupted command's stop (``fn``), with the deadline its stop
    steps allow; one that overruns is said, and the command still ends."""
    if interrupt.bounded(what, eng.c.deploy.stop_timeout_s + 90, lambda: fn() or True) is None:
        print(f"{what}: not done; the nodes may still run some of it", file=sys.stderr)


def read_prepared(runner: Runner, cluster: Cluster) -> dict[str, dict | None]:
    """Each node's prepare record (None where there is none)."""
    import json

    from roles import record
    from roles.files import read_script

    res = runner.run(Step(name="read prepare records", build=lambda n: read_script(record.prepared_path(cluster))))
    # a node an earlier step found unreachable is skipped: its record is unknown, not absent
    bad = {h: r.msg for h, r in res.items() if r.failed or r.status == SKIPPED}
    if bad:
        raise LlmdeployError("cannot read the nodes' prepare records: " + "; ".join(f"{h}: {m}" for h, m in bad.items()))
    out = {}
    for h, r in res.items():
        try:
            doc = json.loads(r.stdout) if r.stdout.strip() else None
        except ValueError:
            doc = None
        out[h] = doc if isinstance(doc, dict) else None
    return out


def write_release(runner: Runner, cluster: Cluster, plan: ReleasePlan) -> dict[str, str]:
    """The plan's files on every node; {host: problem} where it failed."""
    res = runner.run(Step(name="write release", build=lambda n: write_script(cluster, plan.release, plan.files[n.name]),
                          stdin=lambda n: write_payload(plan.files[n.name])))
    return {h: r.msg for h, r in res.items() if r.failed}


def finish(runner: Runner, cluster: Cluster, plan: ReleasePlan, out: Outcome, image_id, config_hash: str, **extra) -> None:
    """``current`` -> the release everywhere; the ledger says good."""
    res = runner.run(Step(name="set current", build=lambda n: set_current_script(cluster, plan.release)))
    bad = {h: r.msg for h, r in res.items() if r.failed}
    if bad:
        out.ok, out.where, out.reason = False, next(iter(bad)), f"could not set the current release: {next(iter(bad.values()))}"
        return
    ledger(runner, cluster, ledger_record(cluster, plan.release, "good", image_id, config_hash, **extra))
    out.ok = True


def engine_for(dep: Deployment, runner: Runner, con: Console, quiet: bool, plan: ReleasePlan) -> Engine:
    """The engine for one release: it reads exits with the failure signatures its plan carries."""
    return Engine(dep, runner, con, quiet=quiet, signatures=plan.signatures)


def deploy(dep: Deployment, con: Console, check: bool, json_out: bool, skip_prepare: bool, force: bool, message: str | None,
           lock_wait: float, rollback_on_failure: bool, prepare_fn, rollback_fn, gate: bool = True) -> int:
    """``prepare_fn(name, quiet)`` runs prepare; ``rollback_fn(dep, runner,
    con, message, json_out)`` brings back the last good release under the lock
    held here. ``gate``: run the quality gate after readiness (when the
    inventory's ``deploy.gate.enabled``). The binding (``dep``) refused a
    profile no serving system of this tool starts before any node was touched."""
    cluster = dep.cluster
    secrets = list(cluster.secret_values().values())
    # the plan needs no node (prepare's records only repeat what the inventory
    # decides): what it refuses, an unusable EPLB map say, is refused before any connection
    try:
        _, chash, plan = plan_release(dep, {}, cluster.image.ref)
    except (ValueError, KeyError, TypeError) as exc:
        # a value the schema let through but a builder cannot use: say which, touch nothing
        raise LlmdeployError(f"{cluster.name}: cannot build the release plan ({type(exc).__name__}: {exc}); nothing was read or changed on any node") from None
    if check:
        doc = check_doc(dep, plan, chash, secrets)
        if json_out:
            report.emit_json(doc)
        else:
            print_check(con, doc, plan.show_labels)
        return 0
    with dep.runner() as runner:
        with lock.held(runner, cluster, "deploy", message, lock_wait):
            where: dict[str, Any] = {"phase": "before anything was stopped", "gate": gate and cluster.deploy.gate.enabled, "rollback": rollback_on_failure}
            try:
                status, rid = _deploy_locked(dep, runner, con, json_out, skip_prepare, secrets, force, prepare_fn, where)
            except KeyboardInterrupt:
                with report.shielded():
                    lock.audit(runner, cluster, "deploy", "interrupted", where.get("release"), phase=where["phase"])
                    said = where["phase"] if where["phase"] == "before anything was stopped" else "after the serving release was stopped"
                    print(f"deploy interrupted {said}; the deploy lock is released", file=sys.stderr)
                    if where["phase"] != "before anything was stopped":
                        print(f"to bring back the last good release: invoke rollback --cluster {cluster.name}", file=sys.stderr)
                raise
            lock.audit(runner, cluster, "deploy", "good" if status == 0 else "failed", rid, message=message or "")
            if where.get("kept"):
                return status  # failed the gate, and keeps serving: nothing to bring back
            if status and rid and where["phase"] != "before anything was stopped":
                if not rollback_on_failure:
                    con.print(f"--no-rollback: the cluster is left as the failed deploy left it, for debugging; to bring back the last good release: "
                              f"invoke rollback --cluster {cluster.name}", soft_wrap=True)
                    return status
                con.print("[bold]bringing back the last good release[/] (deploy --no-rollback leaves the failed state for debugging)")
                try:
                    back = rollback_fn(dep, runner, con, message, json_out)
                except (LlmdeployError, UnreachableError) as exc:
                    con.print(f"[bold red]no rollback[/]: {escape(str(exc))}")
                    back = None
                if back != 0 and where.get("gated"):
                    # a gate never makes an outage worse: the slower release serves again
                    return _serve_again(dep, runner, con, json_out, where["gated"], where["image_id"], where["config_hash"],
                                        "the last good release could not come back", secrets)
                if back is None:
                    con.print("the cluster is stopped")
                    return status
                con.print("the last good release is serving again; the deploy still failed" if back == 0
                          else "[bold red]the rollback failed too[/]: the cluster is stopped; see the bundles above")
            return status


def platform_refusal(runner: Runner, dep: Deployment) -> str | None:
    """Every node's facts, one round trip each: why nothing may start (a node
    that is not what its platform declares, roles.facts.platform_mismatch), or None."""
    from roles import facts

    return facts.refusal(dep.cluster, runner.run(facts.gather_step(dep)))


def _ready_to_deploy(dep: Deployment, runner: Runner, con: Console, json_out: bool, skip_prepare: bool, force: bool,
                     prepare_fn) -> tuple[int, dict[str, Any], str]:
    """What a deploy checks before it writes anything: the last communication
    check (kept on node 0), prepare (or, without it, the platform's refusal
    of a node), and the nodes' prepare records, which must name one image.
    (prepare's status, non-zero when it failed; the records; the image ID)."""
    cluster = dep.cluster
    out, _, _ = runner.exec(cluster.node0, verify.last_report_script(cluster))
    go, said = verify.gate(cluster, out, force)
    if not go:
        raise LlmdeployError(f"deploy refused: {said}")
    con.print(f"[yellow]{escape(said)}[/]" if "not verified" in said or "--force" in said else escape(said))

    if skip_prepare:
        # prepare refuses a node that is not what its platform declares; without prepare, deploy reads the facts itself
        refused = platform_refusal(runner, dep)
        if refused:
            raise LlmdeployError(f"deploy refused: {refused}")
    else:
        status = prepare_fn(cluster.name, json_out)
        if status:
            if not json_out:
                con.print("[bold red]deploy stopped: prepare failed[/] (nothing was started or stopped)")
            return status, {}, ""
    prepared = read_prepared(runner, cluster)
    missing = [h for h, p in prepared.items() if p is None]
    if missing:
        raise LlmdeployError(f"no prepare record on {', '.join(missing)}: run invoke prepare --cluster {cluster.name} first")
    image_ids = {(p or {}).get("image", {}).get("id") for p in prepared.values()} - {None}
    if len(image_ids) != 1:
        raise LlmdeployError(f"the nodes' prepare records name {len(image_ids)} image IDs: run invoke prepare --cluster {cluster.name}")
    return 0, prepared, image_ids.pop()


def _deploy_locked(dep: Deployment, runner: Runner, con: Console, json_out: bool, skip_prepare: bool, secrets: list[str], force: bool,
                   prepare_fn, where: dict) -> tuple[int, str | None]:
    """The deploy under the lock; ``where["phase"]`` says how far it got (for an interruption or a failure)."""
    cluster = dep.cluster
    status, prepared, image_id = _ready_to_deploy(dep, runner, con, json_out, skip_prepare, force, prepare_fn)
    if status:
        return status, None
    rid, chash, plan = plan_release(dep, prepared, image_id, image_id)
    where.update(release=rid, image_id=image_id, config_hash=chash[:16])
    con.print(f"[bold]deploy {cluster.name}[/]: release {rid} ({plan.system}: {' -> '.join(s.name for s in plan.services)})")
    previous, why = serving_plan(runner, cluster)
    if previous is None and why != "no current release":
        con.print(f"[yellow]the serving release cannot be drained: {escape(why)}[/]", soft_wrap=True)
    eng = engine_for(dep, runner, con, json_out, plan)
    t0 = time.monotonic()
    outcome = Outcome(ok=False, release=rid)
    try:
        t = time.monotonic()
        bad = write_release(runner, cluster, plan)
        if bad:
            h, msg = next(iter(bad.items()))
            outcome.where, outcome.reason = h, f"writing the release files failed: {msg}"
            started = False
        else:
            ledger(runner, cluster, ledger_record(cluster, rid, "started", image_id, chash[:16]))
            outcome.phases["write"] = time.monotonic() - t
            started = True
            where["phase"] = "while the new release was starting"
            if eng.start(plan, outcome, previous) and gate_passes(runner, cluster, con, plan, outcome, where, json_out):
                finish(runner, cluster, plan, outcome, image_id, chash[:16], **({"gate": outcome.gate} if outcome.gate else {}))
            elif outcome.refused:
                # the launcher refused it before anything stopped: the serving release serves on, nothing to bring back
                where["phase"] = "before anything was stopped"
    except KeyboardInterrupt:
        with report.shielded():
            if where["phase"] != "before anything was stopped":
                con.print("[bold red]interrupted[/]: stopping the new release's containers")
                stop_interrupted(eng, "stopping the new release's containers", lambda: eng.stop(None, "stop", cleanup=plan.stop_cleanup))
            last_ledger_line(runner, cluster, ledger_record(cluster, rid, "failed", image_id, chash[:16], reason="interrupted"))
        raise
    if where.get("gated") and (keep := _cannot_return(runner, dep, rid, where)):
        where["kept"] = keep
        return keep_serving(cluster, runner, con, eng, plan, outcome, image_id, chash[:16], secrets, json_out, keep), rid
    return report_outcome(cluster, runner, con, eng, plan, outcome, image_id, chash[:16], secrets, json_out, time.monotonic() - t0,
                          stopped_nothing=not started), rid


# --- the quality gate ------------------------------------------------------------------------
def gate_passes(runner: Runner, cluster: Cluster, con: Console, plan: ReleasePlan, out: Outcome, where: dict, json_out: bool) -> bool:
    """Run the gate on the ready release (unless ``--no-gate`` or the
    inventory turns it off: then the ledger says it was skipped). False: it
    failed; ``out`` says why and ``where["gated"]`` holds the plan."""
    if not where.get("gate"):
        said = "--no-gate" if cluster.deploy.gate.enabled else "deploy.gate.enabled is false in the inventory"
        out.gate = {"verdict": "skipped", "why": said}
        con.print(f"[yellow]quality gate skipped ({said})[/]")
        return True
    t = time.monotonic()
    try:
        v = bench.run_gate(runner, cluster, con, plan, quiet=json_out)
    except (LlmdeployError, UnreachableError) as exc:  # node 0 unreachable (ConnectionLost is one too): the gate could not judge
        out.ok, out.where, out.reason = False, plan.entry_host, f"quality gate: {exc}"
        where["gated"] = plan
        return False
    out.phases["quality gate"] = time.monotonic() - t
    out.gate = v.record()
    bench.say_verdict(con, v)
    if v.ok:
        return True
    out.ok, out.where, out.reason = False, plan.entry_host, v.reason()
    out.bundle_files.update(bench.verdict_files(v))
    where["gated"] = plan
    return False


def _cannot_return(runner: Runner, dep: Deployment, rid: str, where: dict) -> str | None:
    """Why the release that failed the gate must keep serving (None: the last
    good one can come back): ``--no-rollback``, no release to return to, or
    one that some node no longer has whole. Checked before anything is stopped."""
    from flows.releases import plan_of, read_ledger, read_release
    from llmdeploy.release import rollback_target

    cluster = dep.cluster
    if not where.get("rollback", True):
        return "--no-rollback"
    try:
        records, current = read_ledger(runner, cluster)
        target = rollback_target(records + [{"release": rid, "result": "failed"}], current, None)
        on = read_release(runner, dep, target, "check the rollback target")
        problems = {**on.missing, **on.unreadable}
        if problems:
            h, p = next(iter(problems.items()))
            return f"the last good release {target} cannot come back ({h}: {p})"
        plan_of(cluster, target, on.plan_text, on.metas)  # the rollback would refuse a plan it cannot read
    except (LlmdeployError, UnreachableError) as exc:
        return str(exc)
    return None


def keep_serving(cluster: Cluster, runner: Runner, con: Console, eng: Engine, plan: ReleasePlan, out: Outcome, image_id, config_hash: str,
                 secrets: list[str], json_out: bool, why: str, verb: str = "deploy", **extra) -> int:
    """A release that failed the gate keeps serving (a gate never makes an
    outage worse): ``current`` -> it, the ledger says failed and serving, the bundle keeps the comparison."""
    root, tgz = eng.collect_bundle(plan, secrets, out.bundle_files)
    res = runner.run(Step(name="set current", build=lambda n: set_current_script(cluster, plan.release)))
    bad = {h: r.msg for h, r in res.items() if r.failed}
    if verb != "deploy":
        extra["action"] = verb
    if out.gate:
        extra["gate"] = out.gate
    try:
        ledger(runner, cluster, ledger_record(cluster, plan.release, "failed", image_id, config_hash, reason=out.reason, where=out.where,
                                              serving=True, kept=why, **extra))
    except (LlmdeployError, UnreachableError) as exc:
        con.print(f"[red]{escape(str(exc))}[/]")
    con.print(f"[bold red]{verb} failed[/] on {out.where}: {escape(out.reason)}", soft_wrap=True)
    con.print(f"logs: {root} ({tgz})")
    hint = f"; to bring back the last good release: invoke rollback --cluster {cluster.name}" if verb == "deploy" else ""
    con.print(f"[bold yellow]release {plan.release} keeps serving[/] ({escape(why)}): it failed the quality gate{hint}", soft_wrap=True)
    if bad:
        con.print(f"[red]could not point current at it on {', '.join(bad)}[/]")
    if json_out:
        report.emit_json({"cluster": cluster.name, "release": plan.release, "ok": False, "serving": True, "kept": why, "where": out.where,
                          "reason": out.reason, "gate": out.gate, "bundle": root, "archive": tgz})
    return 1


def _serve_again(dep: Deployment, runner: Runner, con: Console, json_out: bool, plan: ReleasePlan, image_id, config_hash: str, why: str,
                 secrets: list[str]) -> int:
    """The release that failed the gate, started again after the last good one could not come back."""
    from flows.releases import read_release

    cluster = dep.cluster
    con.print(f"[bold]{escape(why)}: starting release {plan.release} again[/] (it failed the quality gate, but served)")
    eng = engine_for(dep, runner, con, json_out, plan)
    # its attempt numbers continue the release's (the logs of earlier attempts are kept under their own numbers)
    on = read_release(runner, dep, plan.release, "read release")
    out = Outcome(ok=False, release=plan.release, reason="it failed the quality gate", where=plan.entry_host,
                  earlier={unit_key(u): on.attempts.get(unit_key(u), 1) for u in plan.units()})
    if not eng.start(plan, out):
        eng.stop(None, "stop", cleanup=plan.stop_cleanup)
        try:
            ledger(runner, cluster, ledger_record(cluster, plan.release, "failed", image_id, config_hash, reason=out.reason, where=out.where))
        except (LlmdeployError, UnreachableError) as exc:
            con.print(f"[red]{escape(str(exc))}[/]")
        con.print(f"[bold red]release {plan.release} did not come back either[/]: {escape(out.reason)}; the cluster is stopped")
        return 1
    out.reason, out.where = "it failed the quality gate", plan.entry_host
    return keep_serving(cluster, runner, con, eng, plan, out, image_id, config_hash, secrets, json_out, why)


def summary(cluster: Cluster, plan: ReleasePlan, states: dict[str, tuple[str, str]], attempts: dict[str, int], con: Console | None = None):
    rows = []
    for svc in plan.services:
        for u in svc.units:
            st = states.get(unit_key(u), ("?", ""))[0]
            style = "green" if st == "running" else "bold red"
            shown = [escape(str(u.show.get(k) if u.show.get(k) is not None else "")) for k in plan.show_labels]
            rows.append([u.host, u.role or svc.name, u.container, *shown, f"[{style}]{st}[/]", str(attempts.get(unit_key(u), 1))])
    C = report.Col
    cols = [C("host", whole=True), C("role"), C("container", drop=1), *(C(x) for x in plan.show_labels.values()), C("state"), C("attempts", drop=2)]
    return report.table(f"release on {cluster.name}", cols, rows, con=con, hint="")


def endpoint(cluster: Cluster, plan: ReleasePlan) -> str:
    return f"http://{cluster.node(plan.entry_host).ip}:{plan.entry_port}"


def report_outcome(cluster, runner, con, eng: Engine, plan: ReleasePlan, outcome: Outcome, image_id, config_hash, secrets, json_out, took,
                   verb="deploy", stopped_nothing: bool = False, **extra) -> int:
    """The summary; on failure the log bundle, the ledger line (an attempt of
    ``verb``, with ``extra``) and the stop (unless the release never started:
    then what serves keeps serving, as when the launcher refused it before
    anything stopped: ``Outcome.refused``)."""
    rid = outcome.release
    stopped_nothing = stopped_nothing or outcome.refused
    states = eng.states(plan)
    # each unit's attempt number: the release's, counted across the commands that started it
    numbers = {k: outcome.number(k) for k in outcome.attempts}
    if outcome.ok:
        con.print(summary(cluster, plan, states, numbers, con))
        for k, v in outcome.phases.items():
            con.print(f"  {k}: {v:.1f}s")
        model = next((p.arg for p in plan.ready if p.check == "models"), cluster.profile.served_model_name)
        con.print(f"[bold green]serving, release {rid}, healthy[/]: {endpoint(cluster, plan)}/v1 (model {model}) in {took:.1f}s")
        if json_out:
            report.emit_json({"cluster": cluster.name, "release": rid, "ok": True, "attempts": numbers, "phases": outcome.phases, "gate": outcome.gate})
        return 0
    # failure: bundle, ledger, stop
    root, tgz = eng.collect_bundle(plan, secrets, outcome.bundle_files)
    action = {} if verb == "deploy" else {"action": verb}
    if outcome.gate:
        extra["gate"] = outcome.gate
    try:
        ledger(runner, cluster, ledger_record(cluster, rid, "failed", image_id, config_hash, reason=outcome.reason, where=outcome.where, **action, **extra))
    except LlmdeployError as exc:
        con.print(f"[red]{escape(str(exc))}[/]")
    if not stopped_nothing:
        eng.stop(None, "stop", cleanup=plan.stop_cleanup)
    con.print(summary(cluster, plan, states, numbers, con))
    con.print(f"[bold red]{verb} failed[/] on {outcome.where}: {escape(outcome.reason)}")
    con.print(f"logs: {root} ({tgz})")
    if stopped_nothing and verb == "deploy":
        con.print(f"release {rid} is marked failed before anything was stopped or started: what served before still serves")
    elif stopped_nothing:
        # a rollback after a failed deploy finds the cluster stopped already: this command stopped nothing, and says only that
        con.print(f"release {rid} is marked failed: this {verb} stopped and started nothing")
    else:
        con.print(f"release {rid} is marked failed; the cluster is stopped (no serving container runs)")
    if json_out:
        report.emit_json({"cluster": cluster.name, "release": rid, "ok": False, "where": outcome.where, "reason": outcome.reason,
                          "bundle": root, "archive": tgz, "attempts": numbers})
    return 1
