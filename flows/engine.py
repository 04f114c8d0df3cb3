"""The starter, the watcher and the ordered stop: one implementation for every
serving system, driven by a :class:`~llmdeploy.releaseplan.ReleasePlan`.

- ``start``: stop what else runs (reverse start order, in phases across the
  nodes), then each service in the plan's order: its units in ``order``
  groups, all hosts of a group at once; a service with a ``started`` probe
  gates the services after it;
- ``watch``: one round trip per host per poll reads every unit's state (a
  standing read, ``flows/reads.py``: the launcher's reader of the release
  may answer it, never with a state from before the engine's last change);
  an exited unit is matched against the system's failure signatures and handled
  by its service's restart policy (``each``: that unit again, with
  exponential backoff; ``group``: every unit of the service stopped and the
  service started again; ``none``: the release fails); the first readiness
  probe is polled until it passes, then the others must pass once;
- ``stop``: phase by phase (phase 0 first), every node at once within a phase.

Deadlines and the retry policy are the inventory's ``DeploySettings``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape

from flows.probes import UNREADABLE, BodyProblem, fetch, http_probe, inflight
from flows.reads import standing, watch_read
from llmdeploy import interrupt, logs, report
from llmdeploy.deployment import Deployment
from llmdeploy.errors import UnreachableError
from llmdeploy.inventory import Node
from llmdeploy.release import release_dir
from llmdeploy.releaseplan import Metrics, Probe, ReleasePlan, Service, Unit
from llmdeploy.runner import SKIPPED, HostResult, Runner, Step
from roles import containers as ctr


@dataclass
class Outcome:
    ok: bool
    release: str
    reason: str = ""
    where: str = ""
    bundle: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    # starts per unit in this command, keyed "host/container" (the retry budget counts these)
    attempts: dict[str, int] = field(default_factory=dict)
    # the release's starts of each unit before this command (a restart's): its
    # attempt numbers, and the logs named for them, continue from there
    earlier: dict[str, int] = field(default_factory=dict)
    # the quality gate's verdict (llmdeploy.gate.Verdict.record()), when it ran
    gate: dict | None = None
    # files for the log bundle besides the nodes' (the gate's comparison)
    bundle_files: dict[str, str] = field(default_factory=dict)
    # refused before anything was stopped (the launcher's preflight: a node Slurm cannot give): what serves keeps serving
    refused: bool = False

    def number(self, key: str) -> int:
        """The attempt number of a unit's latest start: the release's, counted across commands."""
        return self.earlier.get(key, 0) + self.attempts.get(key, 0)


def unit_key(u: Unit) -> str:
    return f"{u.host}/{u.container}"


@dataclass
class _Watching:
    """What ``Engine.watch`` keeps between polls."""

    t: float  # the start of the current phase
    keyed: dict[str, Unit]  # unit key -> unit
    stage: int = 0  # plan.ready[:stage] have passed
    pending: dict[str, float] = field(default_factory=dict)  # unit key or "service:<name>" -> when to restart it
    reasons: dict[str, str] = field(default_factory=dict)  # unit key -> why it exited last
    last_probe: str = ""


# the answers of a server that is up but not serving yet (DOMAIN.md: a Dynamo
# worker's system port says 503 "notready" until its endpoints register;
# sparkrun retries 408/429/502/503/504)
NOT_YET_STATUS = (408, 429, 502, 503, 504)


def not_yet(problem: str, statuses: Iterable[int] = ()) -> bool:
    """Whether a probe's problem says "not yet" rather than "wrong": a port
    that does not accept connections (the SSH forward's "Connect failed", a
    refused connection) or an HTTP status that means "try again" (for every
    probe, or in ``statuses``: the probe's own, ``Probe.not_yet``)."""
    if "Connect failed" in problem or "Connection refused" in problem:
        return True
    m = re.search(r" answered (\d{3}): ", problem)
    return m is not None and (int(m.group(1)) in NOT_YET_STATUS or int(m.group(1)) in statuses)


def waiting_note(plan: ReleasePlan, w: "_Watching") -> str:
    """What the readiness row says while it waits: the restarts due, else
    the last probe's answer, else which probe is polled."""
    if w.pending:
        return "restarting " + ", ".join(k.removeprefix("service:") for k in w.pending)
    if w.last_probe:
        return w.last_probe
    return f"{plan.ready[w.stage].name}: no answer yet" if w.stage < len(plan.ready) else ""


def poll_delay(n: int, poll_s: float) -> float:
    """The wait before poll ``n + 1``: 0.1 s, doubling up to ``poll_s``. A
    server that is up at once is seen at once; a model that loads for minutes
    is polled every ``poll_s``."""
    return min(poll_s, 0.1 * 2 ** min(n, 16))


class Engine:
    def __init__(self, dep: Deployment, runner: Runner, con: Console, quiet: bool = False, signatures=None):
        """``dep``: the cluster and its plug-ins; ``signatures``: the failure signatures of the release's plan
        (``ReleasePlan.signatures``)."""
        # whether this engine stopped or signalled units already (a restart stops before it starts): a start the
        # launcher then refuses has changed the cluster, and says so (Outcome.refused only where it has not)
        self.touched = False
        self.dep = dep
        self.c = cluster = dep.cluster
        self.r = runner
        self.con = con
        self.quiet = quiet
        self.d = cluster.deploy
        self.signatures = signatures
        # how the units start, are held and end: the cluster's launcher (llmdeploy/launcher.py)
        self.launcher = dep.units(runner, self.say)
        # the node's scripts of the units (Docker's, or the launcher's own: roles/runtime)
        self.rt = dep.runtime

    def say(self, msg: str) -> None:
        if not self.quiet:
            self.con.print(msg)

    def node(self, host: str) -> Node:
        return self.c.node(host)

    def _fail(self, out: Outcome, where: str, reason: str) -> bool:
        out.ok, out.where, out.reason = False, where, reason
        return False

    # -- stopping ---------------------------------------------------------------------------
    def stop(self, keep_release: str | None, name: str = "stop", cleanup: str = "", hosts: list[Node] | None = None) -> dict[str, HostResult]:
        """Stop this cluster's containers (except ``keep_release``'s) in
        reverse start order: the phases found on the nodes, phase 0 first.
        ``cleanup`` runs on every node afterwards."""
        c = self.c
        self.touched = True
        nodes = hosts if hosts is not None else list(c.nodes)
        found = self.r.run(Step(name=f"{name}: phases", build=lambda n: self.rt.phases_script(keep_release)), nodes)
        results: dict[str, HostResult] = {h: r for h, r in found.items() if r.failed}
        phases = sorted({int(x) for r in found.values() if not r.failed for x in r.stdout.split() if x.isascii() and x.isdigit()})
        for ph in phases:
            group = [n for n in nodes if n.name not in results and str(ph) in found[n.name].stdout.split()]
            def build(n: Node, ph: int = ph) -> str:
                return self.rt.stop_script(keep_release, c.deploy.stop_timeout_s, ph)

            res = self.r.run(Step(name=name, build=build, timeout=c.deploy.stop_timeout_s + 60), group)
            for h, r in res.items():
                for line in r.stdout.splitlines():
                    self.say(f"  {h}: {escape(line)}")
                if r.failed:
                    results[h] = r
        if cleanup:
            for h, r in self.r.run(Step(name=f"{name}: clean up", build=lambda n: cleanup), [n for n in nodes if n.name not in results]).items():
                if r.failed:
                    results[h] = r
        if hosts is None:
            for problem in self.launcher.end(keep_release):
                self.say(f"  [yellow]{escape(problem)}[/]")
        for n in nodes:
            results.setdefault(n.name, HostResult(n.name))
        return results

    def drain(self, plan: ReleasePlan | None, refuse: bool = True) -> int | None:
        """Before ``plan``'s release stops: its services that stop taking new
        work on SIGTERM (``refuse``) are signalled, then its in-flight
        requests (its metrics) are waited for, up to ``deploy.drain_s``. Says
        what it saw; returns how many requests were still in flight when the
        wait ended (None: not known)."""
        if plan is None:
            return None
        d, m, limit = plan.drain, plan.metrics, self.d.drain_s
        if d is None or m is None:
            self.say(f"drain: release {plan.release}'s plan does not say how to drain it (written before drains were planned): stopping without waiting")
            return None
        if limit <= 0:
            self.say("drain: deploy.drain_s is 0: stopping without waiting for requests in flight")
            return None
        refused = refuse and self._refuse(plan, d.refuse_first)
        t0 = time.monotonic()
        n, polls, said = None, 0, False
        while True:
            n, detail = self._inflight(m)
            if n is None and refused and not_yet(detail):
                # its listener is closed; it still finishes what it holds until it exits (Dynamo: after its grace period)
                if not self._still_running(plan, d.refuse_first):
                    self.say(f"drained: {', '.join(d.refuse_first)} finished what it held and exited ({time.monotonic() - t0:.1f}s)")
                    return 0
                if time.monotonic() - t0 >= limit:
                    self.say(f"[yellow]drain: {', '.join(d.refuse_first)} still finishing its requests after {limit:g}s: stopping cuts them[/]")
                    return None
                interrupt.sleep(min(1.0, max(0.05, limit - (time.monotonic() - t0))))
                continue
            if n is None and not_yet(detail):
                self.say(f"drain: nothing answers at {escape(m.probe.describe())}: no request to wait for")
                return None
            if n is None:
                self.say(f"[yellow]drain: cannot read the requests in flight ({escape(detail)}): stopping without waiting[/]")
                return None
            if n == 0:
                self.say(f"drained: no request in flight on {m.probe.host}" + (f" after {time.monotonic() - t0:.1f}s" if said else ""))
                return 0
            if not said:
                self.say(f"drain: {n} request{'s' if n != 1 else ''} in flight on {m.probe.host} ({escape(detail)}); waiting up to {limit:g}s"
                         + (f" ({escape(d.note)})" if d.note and not refused else ""))
                said = True
            if time.monotonic() - t0 >= limit:
                self.say(f"[yellow]drain: {n} request{'s' if n != 1 else ''} still in flight after {limit:g}s ({escape(detail)}): stopping cuts them[/]")
                return n
            interrupt.sleep(min(poll_delay(polls, 1.0), max(0.05, limit - (time.monotonic() - t0))))
            polls += 1

    def _refuse(self, plan: ReleasePlan, services: list[str]) -> bool:
        """SIGTERM to the units of ``services`` (they stop admitting and finish what they hold). Whether any was signalled."""
        units = [u for s in plan.services if s.name in services for u in s.units]
        if not units:
            return False
        by_host: dict[str, list[str]] = {}
        for u in units:
            by_host.setdefault(u.host, []).append(u.container)
        self.touched = True
        res = self.r.run(Step(name="drain: stop new work", build=lambda n: self.rt.signal_script(by_host[n.name], "TERM")), [self.node(h) for h in by_host])
        done = [line.split(None, 1)[1] for r in res.values() if not r.failed for line in r.stdout.splitlines() if line.startswith("signalled ")]
        if done:
            self.say(f"drain: {', '.join(services)} told to stop taking new requests (SIGTERM to {', '.join(done)})")
        return bool(done)

    def _still_running(self, plan: ReleasePlan, services: list[str]) -> bool:
        """Whether any unit of ``services`` still runs (an unreadable host counts as running)."""
        units = [u for s in plan.services if s.name in services for u in s.units]
        return any(st in ("running", "unreachable", "unreadable") for st, _ in self.states(plan, units).values()) if units else False

    def _inflight(self, m: Metrics) -> tuple[int | None, str]:
        p = m.probe
        got = fetch(self.r, self.node(p.host), p, min(10, self.d.request_timeout_s), shown=120)
        if got.problem is not None:  # not got.ok
            return None, got.problem
        try:
            return inflight(got.body, m.inflight)
        except UNREADABLE as exc:
            return None, f"{p.describe()}: {exc}"

    def stop_service(self, plan: ReleasePlan, svc: Service, log_suffix: str) -> None:
        """Stop every unit of one service, launcher (highest order) first."""
        self.stop_units(plan, svc.units, lambda u: log_suffix, f"stop {svc.name}")

    def stop_units(self, plan: ReleasePlan, units: list[Unit], suffix, name: str = "stop") -> dict[str, HostResult]:
        """Stop ``units`` of the plan's release, highest ``order`` first, every
        host of an order at once; each one's log is kept in the release as
        ``<container>.<suffix(unit)>.log``."""
        self.touched = True
        rd = release_dir(self.c, plan.release)
        results: dict[str, HostResult] = {}
        for order in sorted({u.order for u in units}, reverse=True):
            by_host: dict[str, list[Unit]] = {}
            for u in units:
                if u.order == order:
                    by_host.setdefault(u.host, []).append(u)
            script = {h: "".join(self.rt.stop_units_script(rd, [u.container], self.d.stop_timeout_s, suffix(u)) for u in us) for h, us in by_host.items()}
            res = self.r.run(Step(name=name, build=lambda n: script[n.name], timeout=self.d.stop_timeout_s + 60), [self.node(h) for h in by_host])
            results.update({h: r for h, r in res.items() if r.failed or h not in results})
        return results

    # -- starting ------------------------------------------------------------------------------
    def start_units(self, plan: ReleasePlan, units: list[Unit], out: Outcome) -> bool:
        """Start ``units`` in ``order`` groups; all hosts of a group at once."""
        rd = release_dir(self.c, plan.release)
        for order in sorted({u.order for u in units}):
            group = [u for u in units if u.order == order]
            for u in group:
                out.attempts[unit_key(u)] = out.attempts.get(unit_key(u), 0) + 1
            failed = self.launcher.start_units(plan, group, lambda u: self.rt.start_script(rd, u.container, u.run_file, out.number(unit_key(u))) or "",
                                               lambda u: out.number(unit_key(u)))
            if failed is not None:
                return self._fail(out, *failed)
        return True

    def wait_started(self, plan: ReleasePlan, svc: Service, out: Outcome) -> bool:
        p = svc.started
        if p is None:
            return True
        # a service with no units is a check of something the release does not run (an external control plane)
        unit = next((u for u in svc.units if u.host == p.host), svc.units[0] if svc.units else None)
        if p.kind == "port" and unit is None:
            end = time.monotonic() + self.d.rpc_timeout_s
            while (problem := self.probe(p)) is not None:
                if time.monotonic() >= end:
                    return self._fail(out, p.host, f"{svc.name} not reachable within {self.d.rpc_timeout_s:g}s: {problem}")
                interrupt.sleep(self.d.poll_s)
            return True
        if p.kind == "port":
            assert unit is not None  # a port check without a unit returned above
            try:
                o, e, code = self.r.exec(self.node(p.host), self.rt.wait_port_script(unit.container, p.ip, p.port, self.d.rpc_timeout_s),
                                         timeout=self.d.rpc_timeout_s + 30)
            except UnreachableError as exc:
                return self._fail(out, p.host, f"{p.host} unreachable while waiting for {p.describe()}: {exc}")
            if code != 0:
                why = "exited" if code == 3 else f"did not open port {p.port} within {self.d.rpc_timeout_s:g}s"
                reason = self.exit_reason(unit) if code == 3 else ""
                return self._fail(out, p.host, f"{svc.name} {why} ({o.strip()}{'; ' + reason if reason else ''})")
            return True
        end = time.monotonic() + self.d.rpc_timeout_s
        while True:
            problem = http_probe(self.r, self.node(p.host), p, min(10, self.d.request_timeout_s))
            if problem is None:
                return True
            if time.monotonic() >= end:
                return self._fail(out, p.host, f"{svc.name} not started within {self.d.rpc_timeout_s:g}s: {problem}")
            interrupt.sleep(self.d.poll_s)

    def start(self, plan: ReleasePlan, out: Outcome, previous: ReleasePlan | None = None) -> bool:
        """Drain ``previous`` (the release serving now), stop what else runs,
        start ``plan`` in order, wait until it is ready."""
        t = time.monotonic()
        failed = self.launcher.preflight(plan)
        if failed is not None:
            out.refused = not self.touched
            return self._fail(out, *failed)
        if previous is not None and previous.release != plan.release:
            self.drain(previous)
            out.phases["drain"] = time.monotonic() - t
            t = time.monotonic()
        self.stop(plan.release, "stop previous")
        out.phases["stop previous"] = time.monotonic() - t
        failed = self.launcher.hold(plan)
        if failed is not None:
            return self._fail(out, *failed)
        # status's, top's and the watcher's reads of this release, for the launcher to keep answering if it can
        self.launcher.serve_reads(plan, standing(self.dep, plan))
        for svc in plan.services:
            t = time.monotonic()
            if not self.start_units(plan, svc.units, out):
                return False
            hosts = svc.hosts()
            gate = f"; waiting for {svc.started.describe()}" if svc.started else ""
            self.say(f"[bold]{escape(svc.name)}[/]: started on {', '.join(hosts[:6])}{' and more' if len(hosts) > 6 else ''}{escape(gate)}")
            if not self.wait_started(plan, svc, out):
                return False
            out.phases[f"{svc.name} started"] = time.monotonic() - t
        return self.watch(plan, out)

    def probe(self, p: Probe) -> str | None:
        if p.kind == "http":
            return http_probe(self.r, self.node(p.host), p, self.d.request_timeout_s)
        try:
            o, e, code = self.r.exec(self.node(p.host), ctr.port_open_script(p.ip, p.port))
        except UnreachableError as exc:
            return f"{p.describe()}: {p.host} unreachable: {exc}"
        return None if "open" in o else f"{p.describe()}: closed"

    # -- watching ---------------------------------------------------------------------------
    def states(self, plan: ReleasePlan, units: list[Unit] | None = None) -> dict[str, tuple[str, str]]:
        """{unit key: (status, exit code)}; unreachable hosts give ``unreachable``."""
        units = units if units is not None else plan.units()
        by_host: dict[str, list[Unit]] = {}
        for u in units:
            by_host.setdefault(u.host, []).append(u)
        res = self.r.run(watch_read(self.dep, units), [self.node(h) for h in by_host])
        out = {}
        for h, us in by_host.items():
            r = res[h]
            gone = r.failed or r.status == SKIPPED
            st = ctr.parse_states(r.stdout) if not gone else {}
            for u in us:
                out[unit_key(u)] = st.get(u.container, ("unreachable" if gone else "missing", r.msg if gone else ""))
        return out

    def exit_reason(self, u: Unit) -> str:
        """The known failure in a unit's log, or ''."""
        try:
            text = self.r.exec(self.node(u.host), self.rt.log_tail_script(u.container))[0]
        except Exception:  # the node went away: the state says so
            return ""
        found = logs.match(text, self.signatures)
        return f"{found[0]} [{found[1]}]" if found else ""

    def watch(self, plan: ReleasePlan, out: Outcome) -> bool:
        """Until every readiness probe has passed, in order: restart what exits,
        by policy. The first probe is polled until it passes. A later one is
        polled while its server is not serving yet (``not_yet``: the first
        passing does not mean every server is up; Dynamo's frontend lists
        workers from etcd, whose leases outlive a restart, before a worker's
        own /health is ready); a wrong answer from it fails at once. A restart
        of any unit starts the probes from the first again."""
        w = _Watching(t=time.monotonic(), keyed={unit_key(u): u for u in plan.units()})
        start = w.t
        end = start + self.d.ready_timeout_s
        polls = 0
        # on a terminal: one row for the cluster, the time so far of
        # ready_timeout_s and what the last probe said
        with report.waiting(self.con, f"ready? {plan.entry_host}", self.d.ready_timeout_s, enabled=not self.quiet) as shown:
            while True:
                if not self._exits(plan, w, out) or not self._restart_due(plan, w, out):
                    return False
                if not w.pending:
                    ready = self._probes(plan, w, out)
                    if ready is not None:
                        return ready
                if time.monotonic() >= end:
                    waiting = ", ".join(f"{k}: {m}" for k, m in w.reasons.items()) or w.last_probe or "no unit reported an error"
                    return self._fail(out, plan.entry_host, f"not ready within {self.d.ready_timeout_s:g}s ({waiting})")
                shown(time.monotonic() - start, waiting_note(plan, w))
                interrupt.sleep(poll_delay(polls, self.d.poll_s))
                polls += 1

    def _exits(self, plan: ReleasePlan, w: "_Watching", out: Outcome) -> bool:
        """Read every unit's state; each exit is handled by its service's
        policy (a restart scheduled with backoff in ``w.pending``). False:
        the release failed (a ``none`` unit exited, or retries ran out)."""
        d, now = self.d, time.monotonic()
        for key, (status, code) in self.states(plan).items():
            # a garbled read of a state is read again at the next poll, never taken for an exit
            if status in ("running", "unreadable"):
                continue
            u = w.keyed[key]
            svc = plan.service_of(u)
            if key in w.pending or f"service:{svc.name}" in w.pending:
                continue
            why = self.exit_reason(u) or f"container {status} {code}".strip()
            w.reasons[key] = why
            if svc.restart == "none":
                return self._fail(out, u.host, f"{plan.name_of(u)} exited: {why}")
            n = out.attempts.get(key, 1)
            if n > d.worker_retries:
                what = svc.name if svc.restart == "group" else plan.name_of(u)
                return self._fail(out, u.host, f"{what} exited {n} times; last reason: {why}")
            delay = min(d.backoff_s * (2 ** (n - 1)), d.backoff_max_s)
            if svc.restart == "group":
                self.say(f"  [yellow]{escape(svc.name)}: {u.host} {escape(u.container)} {status}[/] (attempt {out.number(key)}): {escape(why)}; "
                         f"restarting the whole group ({len(svc.units)} containers) in {delay:g}s")
                w.pending[f"service:{svc.name}"] = now + delay
            else:
                shown = f" ({plan.shown_text(u)})" if plan.shown_text(u) else ""
                self.say(f"  [yellow]{escape(plan.name_of(u))} {u.host}{escape(shown)} exited[/] (attempt {out.number(key)}): {escape(why)}; "
                         f"again in {delay:g}s")
                w.pending[key] = now + delay
        return True

    def _restart_due(self, plan: ReleasePlan, w: "_Watching", out: Outcome) -> bool:
        """Start again what is due (a group: every unit stopped first); the probes then start from the first. False: a start failed."""
        for key, when in list(w.pending.items()):
            if time.monotonic() < when:
                continue
            del w.pending[key]
            w.stage = 0
            if key.startswith("service:"):
                svc = plan.service(key.split(":", 1)[1])
                self.stop_units(plan, svc.units, lambda u: f"attempt-{out.number(unit_key(u))}", f"stop {svc.name}")
                if not self.start_units(plan, svc.units, out):
                    return False
            elif not self.start_units(plan, [w.keyed[key]], out):
                return False
        return True

    def _probes(self, plan: ReleasePlan, w: "_Watching", out: Outcome) -> bool | None:
        """The readiness probes from ``w.stage`` on: True when all passed,
        False on a wrong answer from a later one, None while waiting."""
        while w.stage < len(plan.ready):
            p = plan.ready[w.stage]
            problem = self.probe(p)
            if problem is not None:
                waiting = not_yet(problem, p.not_yet) or (p.wait_body and isinstance(problem, BodyProblem))
                if w.stage > 0 and not waiting:
                    return self._fail(out, p.host, f"{p.name}: {problem}")
                w.last_probe = f"{p.name}: {problem}" if w.stage > 0 else problem
                return None
            w.stage += 1
            if w.stage in (1, len(plan.ready)):  # the phases: the first probe, then the later ones together
                names = plan.ready[0].name if w.stage == 1 else " + ".join(x.name for x in plan.ready[1:])
                out.phases[names] = time.monotonic() - w.t
                w.t = time.monotonic()
        if not plan.ready:
            out.phases["running"] = time.monotonic() - w.t
        return True

    # -- after a failure ----------------------------------------------------------------------
    def collect_bundle(self, plan: ReleasePlan, secrets: list[str], extra: dict[str, str] | None = None) -> tuple[str, str]:
        rd = release_dir(self.c, plan.release)
        units = {n.name: self.rt.bundle_sections([u.container for u in plan.units(n.name)], logs.BUNDLE_BYTES) for n in self.c.nodes}
        res = self.r.run(Step(name="collect logs", build=lambda n: logs.bundle_script(self.c, n, rd, units[n.name], self.dep.vendor.LOG_FILES)))
        per_host = {h: logs.split_bundle(r.stdout) for h, r in res.items() if not r.failed}
        for h, r in res.items():
            if r.failed:
                per_host[h] = {"unreachable.txt": f"could not collect from {h}: {r.msg}\n"}
        root, tgz = logs.save_bundle(self.c, plan.release, per_host, secrets, extra)
        return str(root), str(tgz)
