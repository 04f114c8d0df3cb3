"""The Slurm launcher's engine side (``llmdeploy.launcher.Launcher``): a
release is a job that holds its nodes, its units are the job's steps (started
in the plan's order by the engine, as on SSH), and stopping a release cancels
its steps in reverse order, then the job.

The engine (flows/engine.py) stays the one for every launcher: it calls
here where a launcher differs (holding the job, starting a unit, ending the
jobs, what status adds); what runs on the nodes is the same containers and
the same scripts, sent as job steps (``steps.py``), or with pyxis each
unit's container as its step (``plan_steps``). Once the job holds the
nodes, one more step of it, the release's reader (``reader.py``), answers
status's, top's and the watcher's reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, cast

from rich.console import Console
from rich.markup import escape

from llmdeploy.container import read_docker_run
from llmdeploy import report
from llmdeploy.errors import LlmdeployError, UnreachableError
from llmdeploy.inventory import Cluster, Node
from .schema import Slurm, section
from llmdeploy.launcher import ReleaseView
from llmdeploy.release import release_dir
from llmdeploy.releaseplan import ReleasePlan, Unit
from llmdeploy.runner import FAILED, OK, HostResult, Runner, Step
from . import commands as slurm
from . import pyxis, reader, site
from . import units as units_mod
from .steps import AllocationError

if TYPE_CHECKING:
    from .steps import SlurmSteps

Failure = tuple[str, str] | None


def plan_steps(cluster: Cluster, plan: ReleasePlan, units: list[Unit], script: Callable[[Unit], str],
               number: Callable[[Unit], int]) -> list[tuple[slurm.UnitStep, list[Unit]]]:
    """The steps that start ``units``, each with the units it starts. With
    Docker, each unit's step runs ``script(unit)`` (its docker run) and
    holds the container. With pyxis, each unit's container spec
    (``Unit.spec``) is its step's container (``pyxis.py``,
    ``units.unit_step_args``), and a world's units
    (``Service.world``) are one step over their nodes, ``Unit.tasks`` on
    each, wired by PMIx (``--mpi=none`` when ``Service.mpi`` is off: the
    system's own rendezvous, SGLang's). LlmdeployError: a unit pyxis cannot run as planned. Pure."""
    logdir = slurm.login_log_dir(cluster, plan.release)
    if section(cluster).container != "pyxis":
        return [(slurm.UnitStep(node=cluster.slurm_name(cluster.node(u.host)), name=u.container,
                                script=slurm.unit_step_body(script(u), u.container, cluster.deploy.stop_timeout_s),
                                log=f"{logdir}/{u.host}.{u.container}.attempt-{number(u)}.step.log", devices=u.devices), [u]) for u in units]
    rd = release_dir(cluster, plan.release)
    groups: list[list[Unit]] = []
    for u in units:
        world = plan.service_of(u).world
        same = next((g for g in groups if world and plan.service_of(g[0]).world and g[0].container == u.container), None)
        if same is not None:
            same.append(u)
        else:
            groups.append([u])
    out = []
    for group in groups:
        first = group[0]
        if first.spec is None:
            raise LlmdeployError(f"{first.container} on {first.host}: release {plan.release}'s plan has no container spec for it "
                                 f"({_unread(first)}): deploy it again to run it on pyxis")
        odd = [u for u in group if u.spec != first.spec or u.tasks != first.tasks]
        if odd:
            raise LlmdeployError(f"world {first.container}: {odd[0].host}'s unit differs from {first.host}'s (a pyxis world is one step: "
                                 f"every node the same container, command and number of tasks)")
        n = number(first)
        world = len(group) > 1 or plan.service_of(first).world
        # a unit that is not a launched world sees no Slurm variables (an mpirun in it is its own, as in Docker)
        args = units_mod.unit_step_args(first.spec, rd, first.container, n, pyxis.container_name(first.container, plan.release, n), plain=not world)
        out.append((slurm.UnitStep(node=cluster.slurm_name(cluster.node(first.host)), name=first.container, script="", args=args,
                                   nodes=[cluster.slurm_name(cluster.node(u.host)) for u in group], tasks=first.tasks,
                                   # a world not of MPI says so: the site's MpiDefault (often pmix) does not apply
                                   mpi=("pmix" if plan.service_of(first).mpi else "none") if world else None, devices=first.devices,
                                   log=f"{logdir}/{first.host}.{first.container}.attempt-{n}.step.log"), group))
    return out


def _unread(unit: Unit) -> str:
    """Why a unit of a plan recorded before specs has none: what its recorded line is not."""
    line = unit.show.get("container_command")
    if not isinstance(line, str):
        return "it records no container command"
    try:
        read_docker_run(line)
    except ValueError as exc:
        return f"its recorded command: {exc}"
    return "its recorded command was not read"


class SlurmJobs:
    def __init__(self, cluster: Cluster, runner: Runner, say: Callable[[str], None]):
        self.c = cluster
        self.r = runner
        self.s = cast("SlurmSteps", runner.transport)  # the runner's SlurmSteps (this launcher's transport)
        self.say = say
        self.held: str | None = None  # the release whose job the steps run in

    @property
    def conf(self) -> Slurm:
        """The cluster's ``slurm`` section: this launcher runs only the clusters that set it (``launcher.name_of``)."""
        return section(self.c)

    def nodes_of(self, plan: ReleasePlan) -> list[str]:
        """Slurm's names of the nodes the plan's units run on, in the inventory's order."""
        hosts = {u.host for u in plan.units()}
        return [self.c.slurm_name(n) for n in self.c.nodes if n.name in hosts]

    def site_checks(self, nodes: list[Node], image: Callable[[], str | None]) -> list[tuple[str, str | None]]:
        """What a pyxis cluster needs of its site (``site.py``): pmix in srun's
        MPI plug-ins, the memlock of a job step on every node, and PMIx
        inside the cluster's image (a world over its first two nodes). A
        Docker cluster's units get their limits from docker run: nothing."""
        if self.conf.container != "pyxis" or not nodes:
            return []
        o, e, code = self.s.login_exec(site.MPI_LIST, 60, read=True)
        found: list[tuple[str, str | None]] = [("pmix in srun --mpi=list", site.mpi_list_problem(o + e, code))]
        found += self._memlock(nodes)
        pair = nodes[:2]
        what = f"PMIx in the container ({len(pair)}-task world)"
        try:
            imported = image()
            if imported is None:
                return found + [(what, f"no image recorded on {nodes[0].name}: run invoke prepare")]
            job = self.s.allocation(pair)
            outside = self.s.outside(job, pair)
            if outside:
                return found + [(what, "; ".join(outside.values()))]
            o, e, code = self.s.login_exec(site.pmix_world_command(self.c, job, [self.c.slurm_name(n) for n in pair], imported), 300)
        except (UnreachableError, AllocationError) as exc:
            return found + [(what, f"not run: {exc}")]
        return found + [(what, site.pmix_world_problem(o + e, code, len(pair)))]

    def _memlock(self, nodes: list[Node]) -> list[tuple[str, str | None]]:
        """The memlock in a job step on each node, one line per distinct problem."""
        def parse(node: Node, out: str, err: str, code: int) -> HostResult:
            have = site.memlock_of(out)
            problem = site.memlock_problem(self.c, have) if code == 0 else (err.strip() or out.strip() or f"exit {code}")
            return HostResult(node.name, FAILED if problem else OK, msg=problem or f"memlock {have}")

        results = self.r.run(Step(name="memlock", build=lambda n: site.MEMLOCK_SCRIPT, parse=parse), nodes)
        by_problem: dict[str | None, list[str]] = {}
        for n in nodes:
            r = results.get(n.name)
            # a node the step did not run on (skipped, unreachable) is no answer, never an ok
            by_problem.setdefault(None if r is not None and r.status == OK else ("no answer" if r is None else r.msg or r.status), []).append(n.name)
        return [(f"memlock in a job step on {', '.join(names)}", problem) for problem, names in by_problem.items()]

    def preflight(self, plan: ReleasePlan) -> Failure:
        """Before anything stops: the plan's units can be its steps (a pyxis
        world the same line and tasks on every node), and every node of the
        plan can be given to a new job (Slurm's own state; a draining node
        runs its jobs but takes no new one)."""
        try:
            plan_steps(self.c, plan, plan.units(), lambda u: "", lambda u: 1)
        except LlmdeployError as exc:
            return self.conf.login, f"{exc}: release {plan.release} cannot start as planned (nothing was stopped)"
        try:
            states = self.s.node_states(self.nodes_of(plan))
        except UnreachableError as exc:
            return self.conf.login, f"cannot read Slurm's node states: {exc}"
        bad = [st for st in states.values() if not st.schedulable]
        if bad:
            return bad[0].name, "; ".join(st.describe() for st in bad) + f": release {plan.release} cannot have its nodes (nothing was stopped)"
        return self._time_limit_fits(plan)

    def _time_limit_fits(self, plan: ReleasePlan) -> Failure:
        """The inventory's ``slurm.time_limit`` is no longer than the
        partition's: sbatch would leave such a job pending, possibly
        indefinitely (sbatch(1) ``--time``), after the serving release stopped."""
        s = self.conf
        if not s.time_limit:
            return None  # the partition's default: within its limit
        # 0, UNLIMITED, infinite: no limit (sbatch(1) --time: "A time limit of zero requests that no time limit be imposed")
        want = slurm.slurm_seconds(s.time_limit) or None
        try:
            o, e, code = self.s.login_exec(slurm.partition_limit_command(s.partition), 30)
        except UnreachableError as exc:
            return s.login, f"cannot read partition {s.partition}'s time limit: {exc}"
        got = slurm.partition_limit(o) if code == 0 else None
        if got is None:
            return s.login, f"cannot read partition {s.partition}'s time limit: {(e or o).strip()[-200:] or f'sinfo lists no partition {s.partition}'}"
        said, limit = got
        if limit is not None and (want is None or want > limit):
            return s.login, (f"slurm.time_limit {s.time_limit} is longer than partition {s.partition}'s time limit {said}: "
                             f"Slurm would leave release {plan.release}'s job pending (nothing was stopped); "
                             f"set slurm.time_limit to {said} or less")
        return None

    def hold(self, plan: ReleasePlan) -> Failure:
        """The release's job: the running one (a restart keeps it), else a new
        batch job on the plan's nodes, waited for until it runs."""
        try:
            return self._hold(plan)
        except UnreachableError as exc:
            # cut off from the login host: a job of this release that was submitted goes by its name
            try:
                self.s.login_exec(slurm.scancel_name_command(slurm.release_job_name(self.c.name, plan.release)), 30)
            except UnreachableError:
                pass
            return self.conf.login, f"Slurm job of release {plan.release}: {exc}"

    def _hold(self, plan: ReleasePlan) -> Failure:
        try:
            jobs = self.s.squeue()
        except UnreachableError as exc:
            return self.conf.login, f"cannot read Slurm's queue: {exc}"
        held = slurm.release_job([j for j in jobs if j.state == "RUNNING"], self.c.name, plan.release)
        if held is not None:
            self.s.use_job(held.id, plan.release, slurm.expand_hostlist(held.nodes) if held.nodes else None)
            self.held = plan.release
            return None
        names = self.nodes_of(plan)
        # the command's own allocation (its steps so far) would keep an exclusive job waiting
        self.s.use_job(None)
        o, e, code = self.s.login_exec(slurm.sbatch_command(self.c, names, plan.release), 60)
        job = o.strip().split(";")[0] if code == 0 else ""
        if not job.isdigit():
            return self.conf.login, f"sbatch refused release {plan.release}'s job: {(e or o).strip()[-300:]}"
        limit = self.conf.alloc_timeout_s
        o, e, code = self.s.login_exec(slurm.wait_running_command(job, limit), limit + 30)
        if code != 0:
            self.s.login_exec(slurm.scancel_job_command(job, 30), 60)
            others = [j for j in self.s.squeue() if j.id != job]
            holders = "; ".join(f"job {j.id} ({j.name}, {j.state}) holds {j.nodes}" for j in others if j.nodes)
            return self.conf.login, (f"Slurm job {job} of release {plan.release} did not start within {limit:g}s "
                                     f"({o.strip() or e.strip()}); cancelled"
                                     + (f"; the cluster's other jobs: {holders} (a command of the tool's that still runs, "
                                        f"or one that was killed: scancel it)" if holders else ""))
        self.s.use_job(job, plan.release, names)
        self.held = plan.release
        self.say(f"slurm: job {job} ({slurm.release_job_name(self.c.name, plan.release)}) holds {', '.join(names)}")
        return None

    def start_units(self, plan: ReleasePlan, units: list[Unit], script: Callable[[Unit], str],
                    number: Callable[[Unit], int]) -> Failure:
        """Each unit as a step of the release's job (``script(unit)`` starts its
        container in the step); the first unit that did not start, and why each did not."""
        started = self._start_steps(plan, units, script, number)
        failed = [u for u in units if started.get(f"{u.host}/{u.container}")]
        if failed:
            return failed[0].host, "; ".join(f"{u.container} on {u.host} did not start as a job step: {started[f'{u.host}/{u.container}']}"
                                             for u in failed)
        return None

    def _start_steps(self, plan: ReleasePlan, units: list[Unit], script: Callable[[Unit], str], number: Callable[[Unit], int]) -> dict[str, str]:
        """{"<host>/<container>": "" or why it did not start}. The release's job
        is held again when this command does not hold it, or no longer does
        (a step found it ended, ``SlurmSteps.forget``): a step is never sent
        to a job that is gone."""
        if self.held != plan.release or self.s.job is None or self.s.release != plan.release:
            self.held = None
            failed = self.hold(plan)
            if failed is not None:
                return {f"{u.host}/{u.container}": failed[1] for u in units}
        try:
            made = self.unit_steps(plan, units, script, number)
        except LlmdeployError as exc:
            return {f"{u.host}/{u.container}": str(exc) for u in units}
        steps = [step for step, _ in made]
        wait = self.c.deploy.rpc_timeout_s
        job = self.s.job
        if job is None:  # hold() set it; nothing ran between
            return {f"{u.host}/{u.container}": f"release {plan.release} holds no Slurm job" for u in units}
        try:
            o, e, code = self.s.login_exec(slurm.start_units_script(self.c, job, steps, wait), wait + 60)
        except UnreachableError as exc:
            return {f"{u.host}/{u.container}": f"login host unreachable while its step started: {exc}" for u in units}
        finally:
            self.s.changed()
        got = slurm.parse_started(o)
        # a world's units started or failed with its step (its first node's line)
        return {f"{u.host}/{u.container}": got.get(f"{step.node}/{step.name}", f"no answer from its step ({(e or o).strip()[-200:]})")
                for step, us in made for u in us}

    def unit_steps(self, plan: ReleasePlan, units: list[Unit], script: Callable[[Unit], str],
                   number: Callable[[Unit], int]) -> list[tuple[slurm.UnitStep, list[Unit]]]:
        """The steps that start ``units`` (``plan_steps``)."""
        return plan_steps(self.c, plan, units, script, number)

    def end(self, keep_release: str | None) -> list[str]:
        """Cancel every release job of the cluster but ``keep_release``'s:
        its steps in reverse order, then the job. Says what it did; returns problems."""
        problems = []
        try:
            jobs = self.s.squeue()
        except UnreachableError as exc:
            return [f"cannot read Slurm's queue: {exc}"]
        for job in jobs:
            release = slurm.release_of_job(self.c.name, job.name)
            if release is None or release == keep_release:
                continue
            steps = sorted(job.steps, key=lambda sid: int(sid.split(".", 1)[1]) if sid.split(".", 1)[1].isdigit() else -1, reverse=True)
            try:
                problems += self._end(job, release, steps)
            except UnreachableError as exc:
                problems.append(f"Slurm job {job.id} of release {release}: {exc}")
        return problems

    def _end(self, job: slurm.Job, release: str, steps: list[str]) -> list[str]:
        if steps:
            try:
                self.s.login_exec(slurm.scancel_steps_command(steps, self.c.deploy.stop_timeout_s + 5),
                                  60 + len(steps) * (self.c.deploy.stop_timeout_s + 5))
            finally:
                self.s.changed()
        o, e, code = self.s.login_exec(slurm.scancel_job_command(job.id, 30), 60)
        # the job's end ended its reader: its records (the env file among them) go too
        try:
            self.s.login_exec(reader.stop_command(reader.reader_dir(self.c, release)), 30)
        except UnreachableError:
            pass
        if self.s.job == job.id:
            self.s.use_job(None)
            self.held = None
        if code != 0:
            return [f"Slurm job {job.id}: {o.strip() or e.strip()}"]
        self.say(f"slurm: job {job.id} of release {release} cancelled" + (f" ({len(steps)} steps, last started first)" if steps else ""))
        return []

    # -- the release's reader (reader.py) ------------------------------------------------
    def serve_reads(self, plan: ReleasePlan, reads: list[Step]) -> None:
        """The release's reader: one step of its job, a task on each of its
        nodes, that runs ``reads`` (each node's command of each) every
        ``slurm.reader_period_s``; the transport answers a standing step of
        the same name and command from it (``SlurmSteps.from_reader``). A
        reader of this release that runs (a restart's) is replaced: the reads
        may have changed. One that does not start costs only a warning: the
        reads are steps then, as without it."""
        if self.held != plan.release or not self.s.job:
            return
        hosts = {u.host for u in plan.units()}
        per_node: dict[str, dict[str, str]] = {}
        for n in self.c.nodes:
            if n.name not in hosts:
                continue
            mine = {}
            for step in reads:
                # a read the reader can run as it is: a command of its own per node, nothing on its standard input
                if step.standing and step.build and not (step.local or step.decide or step.stdin) and reader.READ_RE.match(step.name):
                    command = step.build(n)
                    if command:
                        mine[step.name] = command
            if mine:
                per_node[self.c.slurm_name(n)] = mine
        if not per_node:
            return
        job, s = self.s.job, self.conf
        d = reader.reader_dir(self.c, plan.release)
        why = ""
        try:
            o, e, code = self.s.login_exec(reader.start_command(self.c, d, list(per_node), job), 60,
                                           reader.spec(per_node, s.reader_period_s, self.c.ssh.command_timeout))
            if code != 0 or not o.startswith("started"):
                why = (o.strip() or e.strip())[-300:] or f"exit {code}"
        except UnreachableError as exc:
            why = str(exc)
        names = sorted({name for reads_ in per_node.values() for name in reads_})
        if why:
            self.say(f"[yellow]slurm: no reader step in job {job} ({escape(why)}): {', '.join(names)} read the nodes with a step each[/]")
        else:
            self.say(f"slurm: a reader step in job {job} reads {', '.join(names)} on {len(per_node)} nodes every {s.reader_period_s:g}s")

    # -- status --------------------------------------------------------------------------
    def release_job(self, plan: ReleasePlan | None) -> tuple[slurm.Job | None, str | None]:
        """The job of the current release: (the job, None) or (None, why there is none)."""
        if plan is None:
            return None, None
        try:
            jobs = self.s.squeue(recent=True)  # the one this command's status read with the nodes' states
        except Exception as exc:  # the login host is down: the job cannot be read
            return None, f"cannot read Slurm's queue: {exc}"
        job = slurm.release_job(jobs, self.c.name, plan.release)
        if job is None:
            return None, (f"release {plan.release} has no Slurm job of yours ({slurm.release_job_name(self.c.name, plan.release)} is not in "
                          f"squeue --me; a release another user deployed is theirs to run and stop in Slurm)")
        if job.state != "RUNNING":
            return job, f"Slurm job {job.id} of release {plan.release} is {job.state} ({job.reason})"
        return job, None

    def step_end(self, plan: ReleasePlan, container: str) -> str:
        """What srun said when the latest step of ``container`` ended (its
        ``srun: error:`` lines: which tasks, on which node, exited or were
        killed), from its log on the login host; '' when it said nothing or
        the login host cannot be read."""
        try:
            o, e, code = self.s.login_exec(slurm.step_end_command(slurm.login_log_dir(self.c, plan.release), container), 30)
        except UnreachableError:
            return ""
        return "; ".join(line.removeprefix("srun: error: ").strip() for line in o.splitlines() if line.startswith("srun: error: "))[:400]

    def view(self, plan: ReleasePlan | None) -> ReleaseView:
        """The release's job in status: a unit's container that runs while its
        step is gone is not serving as the job; the job's state, time limit and steps."""
        c = self.c
        job, problem = self.release_job(plan)

        ended: dict[str, str] = {}

        def unit_state(state: str, u: Unit) -> str:
            if state != "running" and job is not None and job.state == "RUNNING" and job.step_named(u.container, c.slurm_name(c.node(u.host))) is None:
                # its step ended: srun's own words on which tasks (a world's ranks) ended how
                if u.container not in ended:
                    ended[u.container] = self.step_end(plan, u.container) if plan is not None else ""
                return f"{state}; its step ended: {ended[u.container]}" if ended[u.container] else state
            if state != "running" or (job is None and problem is None):
                return state
            if job is None or job.state != "RUNNING":
                return "running outside its Slurm job"
            if job.step_named(u.container, c.slurm_name(c.node(u.host))) is None:
                return f"running, its job step ({job.id}.*, {u.container}) is gone"
            return state

        def unit_doc(u: Unit) -> dict:
            return {"slurm_step": job.step_named(u.container, c.slurm_name(c.node(u.host)))} if job is not None else {}

        # a node of the release that is not plainly its job's (draining, down, reserved, not responding), with the admin's reason:
        # Slurm's state as this command's reads found it (no read of its own)
        hosts = set(plan.hosts()) if plan is not None else set()
        odd = {n.name: st for n in c.nodes if n.name in hosts and (st := self.s.states.get(n.name)) is not None and not st.plain}

        left = slurm.slurm_seconds(job.time_left) if job is not None and job.state == "RUNNING" else None

        def show(con: Console) -> None:
            if job:
                ends = f", time limit {job.time_limit}" + (f" (ends {job.end})" if job.end not in ("", "N/A", "Unknown", "NONE") else "") if job.time_limit else ""
                ends += f", time left {report.clock(left)}" if left is not None else ""
                con.print(f"slurm: job {job.id} {job.state}, {len(job.steps)} steps{ends}")
            for st in odd.values():
                con.print(f"[yellow]slurm: {escape(st.describe())}[/]", soft_wrap=True)
            if problem:
                con.print(f"[bold red]not serving[/] slurm: {escape(problem)}", soft_wrap=True)

        doc = {"job": job.id if job else None, "state": job.state if job else None, "problem": problem,
               "time_limit": job.time_limit if job else None, "ends": job.end if job else None, "time_left_s": left,
               "steps": dict(sorted(job.steps.items())) if job else {},
               "nodes": {h: {"state": st.state, "reason": st.reason, "said": st.describe()} for h, st in odd.items()}}
        return ReleaseView(problem=problem, doc={"slurm": doc}, unit_state=unit_state, unit_doc=unit_doc, show=show,
                           ends=(f"Slurm job {job.id}'s time limit", float(left)) if job is not None and left is not None else None)
