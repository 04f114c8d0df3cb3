"""``invoke stop``, ``restart`` and ``rollback``: what runs, changed under
the deploy lock, from the release's own files on the nodes (its plan.json:
order, restart policies, failure signatures, clean-up), never from today's
code for its serving system.

- stop: every container of the cluster in reverse start order, then the
  current release's clean-up; with no readable current plan, the containers
  alone (said so);
- restart: the current release as a whole, or one node's or one service's
  units (by their service's policy: an MPI world whole); attempt numbers
  continue the release's; a failed restart stops what it started and writes
  a log bundle;
- rollback: a release that was good, brought back in its own order.
"""

from __future__ import annotations

import sys
import time
from typing import Any, cast

from rich.console import Console
from rich.markup import escape

from flows import deploy as deploy_flow
from flows.engine import Engine, Outcome, unit_key
from flows.releases import OnNodes, current_plan, plan_of, read_ledger, read_release, serving_plan
from llmdeploy import lock, report
from llmdeploy.deployment import Deployment
from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import Cluster
from llmdeploy.release import RELEASE_RE, ledger_record, on_cluster, rollback_target
from llmdeploy.releaseplan import ReleasePlan, Unit
from llmdeploy.runner import Runner, Step
from roles.status import current_script, parse_status


# --- stop -------------------------------------------------------------------------------------
def _plan_for_stop(runner: Runner, cluster: Cluster) -> tuple[ReleasePlan | None, str]:
    """(the current release's plan, or None and why there is none to use)."""
    res = runner.run(Step(name="read current release", build=lambda n: current_script(cluster)))
    sts = {h: (parse_status(r.stdout) if not r.failed else None) for h, r in res.items()}
    try:
        plan = current_plan(cluster, sts)
    except LlmdeployError as exc:
        return None, str(exc)
    if plan is not None:
        return plan, ""
    gone = [h for h, r in res.items() if r.failed]
    current = sorted({st["release"] for st in sts.values() if st and st["release"]})
    if current:
        return None, (f"release {', '.join(current)} is current on some nodes, but neither a plan.json nor every node's release.json could be read"
                      + (f" ({', '.join(gone)} unreachable)" if gone else ""))
    return None, "no node has a current release" + (f" ({', '.join(gone)} unreachable)" if gone else "")


def stop(dep: Deployment, con: Console, message: str | None, lock_wait: float) -> int:
    """Every container of the cluster, in reverse start order, then the
    current release's own clean-up on every node. Without a readable plan of
    the current release (none yet, or refused) the containers are stopped all
    the same and no clean-up runs: clean-up text is run only from a plan this
    tool could read and check."""
    cluster = dep.cluster
    with dep.runner() as runner:
        with lock.held(runner, cluster, "stop", message, lock_wait) as holder:
            plan, why = _plan_for_stop(runner, cluster)
            if plan is None:
                con.print(f"[yellow]{escape(cluster.name)}: no readable plan of a current release ({escape(why)}): stopping every container "
                          f"of {escape(cluster.name)}, with no clean-up of a serving system[/]", soft_wrap=True)
            cleanup = plan.stop_cleanup if plan is not None else ""
            eng = Engine(dep, runner, con)
            try:
                eng.drain(plan)
                res = eng.stop(None, "stop", cleanup=cleanup)
            except KeyboardInterrupt:
                with report.shielded():
                    lock.audit(runner, cluster, "stop", "interrupted", plan.release if plan else None, message=message or "")
                    print(f"stop interrupted: some containers may still run; the deploy lock is released; to finish: invoke stop --cluster {cluster.name}",
                          file=sys.stderr)
                raise
            failed = False
            for h, r in res.items():
                if r.failed:
                    con.print(f"[red]{h}: {escape(r.msg)}[/]")
                    failed = True
            # a node of the release no step reached (lost: the launcher says it is gone) had nothing stopped: it is named,
            # and stop fails (a node the release never ran on is none of its business)
            for h, why in sorted(runner.unreachable.items()):
                if plan is not None and h in plan.hosts() and not (h in res and res[h].failed):
                    con.print(f"[red]{h}: not reached, nothing was stopped there: {escape(why)}[/]", soft_wrap=True)
                    failed = True
            lock.audit(runner, cluster, "stop", "failed" if failed else "stopped", plan.release if plan else None, held=holder, message=message or "")
            tail = f"; the clean-up of release {plan.release} ran on every node" if cleanup and plan is not None else ""
            con.print(f"{cluster.name}: stopped (in reverse start order){'; some nodes failed, see above' if failed else ''}{tail}")
            return 1 if failed else 0


# --- restart ----------------------------------------------------------------------------------
def _current(runner: Runner, dep: Deployment, host: str | None) -> tuple[ReleasePlan, OnNodes]:
    """The current release's plan and what the nodes hold of it (its units' attempt numbers)."""
    cluster = dep.cluster
    records, current = read_ledger(runner, cluster)
    if not current or not RELEASE_RE.match(current):
        raise LlmdeployError(f"{cluster.name} has no current release to restart{' ' + host + ' into' if host else ''}")
    on = read_release(runner, dep, current, "read release")
    if on.unreadable:
        h, why = next(iter(on.unreadable.items()))
        raise LlmdeployError(f"{h}: the current release {current} has no readable release.json ({why})")
    return plan_of(cluster, current, on.plan_text, on.metas), on


def _units_to_restart(plan: ReleasePlan, host: str | None, service: str | None) -> list[Unit] | None:
    """The units ``--host``/``--service`` restart (a group service's every
    unit); None: the whole release."""
    if host is None and service is None:
        return None
    if host is not None and not host:
        raise LlmdeployError("--host: an empty host name (name one of the cluster's nodes, or leave --host out to restart them all)")
    if service is not None and service not in {s.name for s in plan.services}:
        raise LlmdeployError(f"--service {service}: release {plan.release} has no such service (it has {', '.join(s.name for s in plan.services)})")
    if host:
        units = plan.units(host)
    else:
        assert service is not None  # no --host: --service names what to restart (checked above)
        units = plan.service(service).units
    if not units:
        raise LlmdeployError(f"--host {host} runs nothing in release {plan.release}" if host else f"--service {service} runs nothing here")
    todo: list[Unit] = []
    for u in units:
        svc = plan.service_of(u)
        if svc.restart == "none":
            raise LlmdeployError(f"--{'host ' + host if host else f'service {service}'} is {plan.name_of(u)}: restarting it alone cannot re-form "
                                 f"what depends on it; restart without --host restarts the whole release in order")
        todo += [x for x in (svc.units if svc.restart == "group" else [u]) if x not in todo]
    return todo


def _earlier(plan: ReleasePlan, on: OnNodes) -> dict[str, int]:
    """Each unit's latest start number on its node; a unit the nodes keep no
    number of (a release started before numbers were recorded) started once."""
    return {unit_key(u): on.attempts.get(unit_key(u), 1) for u in plan.units()}


def _numbered(out: Outcome):
    """A unit's log name when it is stopped: its latest attempt's number."""
    return lambda u: f"attempt-{out.number(unit_key(u))}"


def _restart_whole(eng: Engine, plan: ReleasePlan, out: Outcome) -> bool:
    eng.say(f"{eng.c.name}: restarting release {plan.release} as a whole ({' -> '.join(s.name for s in plan.services)})")
    eng.drain(plan)
    for svc in reversed(plan.services):
        eng.stop_units(plan, svc.units, _numbered(out), f"stop {svc.name}")
    eng.stop(None, "stop", cleanup=plan.stop_cleanup)
    return eng.start(plan, out)


def _restart_units(eng: Engine, plan: ReleasePlan, todo: list[Unit], out: Outcome, host: str | None, service: str | None) -> bool:
    # the rest of the release keeps serving: nothing is told to refuse new work
    eng.drain(plan, refuse=False)
    for svc in plan.services:
        if svc.restart == "group" and any(u in todo for u in svc.units):
            eng.stop_units(plan, svc.units, _numbered(out), f"stop {svc.name}")
    ok = eng.start_units(plan, todo, out)
    shown = next((plan.shown_text(u) for u in todo if (host is None or u.host == host) and plan.shown_text(u)), "")
    eng.say(f"{host or service}: restarted {', '.join(f'{u.container} (attempt {out.number(unit_key(u))})' for u in todo if host is None or u.host == host)}"
            + (f" ({escape(shown)})" if shown and host else "") + f"; waiting for {waiting_for(plan)}")
    return ok and eng.watch(plan, out)


def _stop_started(eng: Engine, plan: ReleasePlan, todo: list[Unit] | None, out: Outcome) -> str:
    """Stop what a restart started; what is left, in words."""
    if todo is None:
        eng.stop(None, "stop", cleanup=plan.stop_cleanup)
        return "the cluster is stopped (no serving container runs)"
    started = [u for u in plan.units() if unit_key(u) in out.attempts]
    eng.stop_units(plan, started, _numbered(out), "stop what the restart started")
    return f"stopped again: {', '.join(u.container for u in started) or 'nothing'}; the rest of release {plan.release} is as the restart found it"


def restart(dep: Deployment, con: Console, host: str | None, message: str | None, lock_wait: float, service: str | None = None) -> int:
    """``host``: that node's units into the current release (by their service's
    policy: a group such as an MPI world is restarted whole); ``service``: that
    service's units; neither: the whole current release, in the system's order."""
    cluster = dep.cluster
    if host and service:
        raise LlmdeployError("restart takes --host or --service, not both")
    if host and host not in {n.name for n in cluster.nodes}:
        raise LlmdeployError(f"--host {host}: no such node in {cluster.name} (nodes: {', '.join(n.name for n in cluster.nodes)})")
    what = f"restart {host}" if host else (f"restart {service}" if service else "restart")
    with dep.runner() as runner:
        with lock.held(runner, cluster, "restart", message, lock_wait):
            plan, on = _current(runner, dep, host)
            todo = _units_to_restart(plan, host, service)
            eng = deploy_flow.engine_for(dep, runner, con, False, plan)
            out = Outcome(ok=False, release=plan.release, earlier=_earlier(plan, on))
            try:
                ok = _restart_whole(eng, plan, out) if todo is None else _restart_units(eng, plan, todo, out, host, service)
            except KeyboardInterrupt:
                with report.shielded():
                    con.print("[bold red]interrupted[/]: stopping what the restart started")
                    deploy_flow.stop_interrupted(eng, "stopping what the restart started", lambda: _stop_started(eng, plan, todo, out))
                    lock.audit(runner, cluster, what, "interrupted", plan.release, message=message or "")
                raise
            if not ok:
                return _restart_failed(runner, cluster, con, eng, plan, todo, out, what)
            lock.audit(runner, cluster, what, "good", plan.release, message=message or "")
            _say_back(cluster, con, plan, host, service)
            return 0


def _restart_failed(runner: Runner, cluster: Cluster, con: Console, eng: Engine, plan: ReleasePlan, todo: list[Unit] | None, out: Outcome,
                    what: str) -> int:
    """Like a failed deploy: every node's logs into a bundle, then what the restart started stopped."""
    root, tgz = eng.collect_bundle(plan, [])
    left = _stop_started(eng, plan, todo, out)
    lock.audit(runner, cluster, what, "failed", plan.release, reason=out.reason, where=out.where, bundle=str(tgz))
    con.print(f"[bold red]{what} failed[/] on {out.where}: {escape(out.reason)}", soft_wrap=True)
    con.print(f"logs: {root} ({tgz})", soft_wrap=True)
    con.print(left, soft_wrap=True)
    return 1


def _say_back(cluster: Cluster, con: Console, plan: ReleasePlan, host: str | None, service: str | None) -> None:
    if host is None and service is None:
        con.print(f"[bold green]{cluster.name} healthy[/]: release {plan.release} restarted")
    elif service is not None:
        con.print(f"[bold green]{cluster.name} healthy[/]: {service} is back")
    else:
        shown = next((plan.shown_text(u) for u in plan.units(host) if plan.shown_text(u)), "")
        con.print(f"[bold green]{cluster.name} healthy[/]: {host} re-joined" + (f" with {escape(shown)}" if shown else ""))


def waiting_for(plan: ReleasePlan) -> str:
    """What ``Engine.watch`` waits for, in words: every readiness probe."""
    if not plan.ready:
        return "the containers"
    more = len(plan.ready) - 1
    return plan.ready[0].name + (f" and {more} more readiness check{'s' if more > 1 else ''}" if more else "")


# --- rollback ---------------------------------------------------------------------------------
def rollback(dep: Deployment, con: Console, to: str | None, message: str | None, lock_wait: float, json_out: bool, gate: bool = False) -> int:
    with dep.runner() as runner:
        with lock.held(runner, dep.cluster, "rollback", message, lock_wait):
            return rollback_locked(dep, runner, con, to, message, json_out, gate)


def _target(runner: Runner, dep: Deployment, con: Console, to: str | None) -> tuple[list[dict], str | None, str, OnNodes]:
    """(ledger, the release on the cluster, the target, what the nodes hold of
    it); refused, before anything is stopped, unless every node has all of it."""
    cluster = dep.cluster
    records, current = read_ledger(runner, cluster)
    source = on_cluster(records, current)
    target = rollback_target(records, current, to)
    con.print(f"[bold]rollback {cluster.name}[/]: {source or 'nothing'} -> {target}")
    on = read_release(runner, dep, target, "verify target")
    problems = {**on.missing, **on.unreadable}
    if problems:
        origin: dict[str, Any] = {"from": source}  # "from": a keyword
        lock.audit(runner, cluster, "rollback", "refused", target, problems=problems, **origin)
        raise LlmdeployError(f"rollback to {target} refused before stopping anything: " + "; ".join(f"{h}: {p}" for h, p in problems.items()))
    return records, source, target, on


def rollback_locked(dep: Deployment, runner: Runner, con: Console, to: str | None, message: str | None, json_out: bool, gate: bool = False) -> int:
    """The rollback itself, for a caller that holds the deploy lock. Needs
    nothing but SSH: the target's plan, files, image and secrets are the
    release's own on the nodes (no secret, model path or serving value of
    today's inventory is read). Its attempt numbers continue the release's.
    ``gate``: the quality gate after readiness; a release that fails it keeps
    serving (it is the one that was good) and the rollback says it failed."""
    cluster = dep.cluster
    previous, _ = serving_plan(runner, cluster)
    records, source, target, on = _target(runner, dep, con, to)
    plan = plan_of(cluster, target, on.plan_text, on.metas)
    meta0 = on.metas.get(cluster.node0.name) or next(iter(on.metas.values()))
    image_id = meta0.get("image_id")
    # every ledger line this tool writes has its config_hash (llmdeploy.release.ledger_record)
    chash = next((cast(str, r.get("config_hash")) for r in records if r["release"] == target), "")
    recorded = {"action": "rollback", "from": source, "image": meta0.get("image")}
    origin: dict[str, Any] = {"from": source}  # "from": a keyword
    deploy_flow.ledger(runner, cluster, ledger_record(cluster, target, "started", image_id, chash, **recorded))
    eng = deploy_flow.engine_for(dep, runner, con, json_out, plan)
    out = Outcome(ok=False, release=target, earlier=_earlier(plan, on))
    t0 = time.monotonic()
    try:
        started = eng.start(plan, out, previous)
    except KeyboardInterrupt:
        with report.shielded():
            con.print("[bold red]interrupted[/]: stopping what the rollback started")
            deploy_flow.stop_interrupted(eng, "stopping what the rollback started", lambda: eng.stop(None, "stop", cleanup=plan.stop_cleanup))
            deploy_flow.last_ledger_line(runner, cluster, ledger_record(cluster, target, "failed", image_id, chash, reason="interrupted", **recorded))
            lock.audit(runner, cluster, "rollback", "interrupted", target, **origin, message=message or "")
            print(f"rollback interrupted; the deploy lock is released; to run it again: invoke rollback --cluster {cluster.name} --to {target}",
                  file=sys.stderr)
        raise
    if started and gate:
        return _gated_rollback(cluster, runner, con, eng, plan, out, image_id, chash, recorded, source, message, json_out)
    if started:
        deploy_flow.finish(runner, cluster, plan, out, image_id, chash, **recorded, **({"gate": {"verdict": "skipped", "why": "rollback without --gate"}}))
        if out.ok and source and source != target:
            deploy_flow.ledger(runner, cluster, ledger_record(cluster, source, "rolled back", None, "", to=target, image=meta0.get("image")))
    status = deploy_flow.report_outcome(cluster, runner, con, eng, plan, out, image_id, chash, [], json_out,
                                time.monotonic() - t0, verb="rollback", **origin, image=meta0.get("image"))
    lock.audit(runner, cluster, "rollback", "good" if status == 0 else "failed", target, **origin, message=message or "")
    return status


def _gated_rollback(cluster: Cluster, runner: Runner, con: Console, eng: Engine, plan: ReleasePlan, out: Outcome, image_id, chash: str,
                    recorded: dict, source: str | None, message: str | None, json_out: bool) -> int:
    """``rollback --gate``: the gate on the release that came back. It passes:
    good, as any rollback. It fails: the release keeps serving (stopping it
    would leave nothing), the ledger and the exit status say it failed."""
    where = {"gate": True}
    origin: dict[str, Any] = {"from": source}  # "from": a keyword
    t0 = time.monotonic()
    if deploy_flow.gate_passes(runner, cluster, con, plan, out, where, json_out):
        deploy_flow.finish(runner, cluster, plan, out, image_id, chash, **recorded, gate=out.gate)
        if out.ok and source and source != plan.release:
            deploy_flow.ledger(runner, cluster, ledger_record(cluster, source, "rolled back", None, "", to=plan.release, image=recorded.get("image")))
        status = deploy_flow.report_outcome(cluster, runner, con, eng, plan, out, image_id, chash, [], json_out, time.monotonic() - t0,
                                    verb="rollback", **origin, image=recorded.get("image"))
    else:
        status = deploy_flow.keep_serving(cluster, runner, con, eng, plan, out, image_id, chash, [], json_out,
                                  "it is the release rolled back to; stopping it would leave nothing serving", verb="rollback", **recorded)
    lock.audit(runner, cluster, "rollback", "good" if status == 0 else "failed", plan.release, **origin, message=message or "")
    return status
