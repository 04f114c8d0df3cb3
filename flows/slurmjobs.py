"""The engine's Slurm launcher: a release is a job that holds its nodes, its
units are the job's steps (started in the plan's order by the engine, as on
SSH), and stopping a release cancels its steps in reverse order, then the job.

The engine (flows/engine.py) stays the one for both launchers: it calls
here where a Slurm cluster differs (holding the job, starting a unit,
ending the jobs); what runs on the nodes is the same containers and the same
scripts, sent as job steps (llmdeploy/slurmrun.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from llmdeploy import slurm
from llmdeploy.release import release_dir
from llmdeploy.releaseplan import ReleasePlan, Unit
from llmdeploy.runner import UnreachableError
from roles import containers as ctr

if TYPE_CHECKING:
    from flows.engine import Engine, Outcome


class SlurmJobs:
    def __init__(self, engine: "Engine"):
        self.e = engine
        self.c = engine.c
        self.s = engine.r.slurm
        self.held: str | None = None  # the release whose job the steps run in

    def nodes_of(self, plan: ReleasePlan) -> list[str]:
        """Slurm's names of the nodes the plan's units run on, in the inventory's order."""
        hosts = {u.host for u in plan.units()}
        return [self.c.slurm_name(n) for n in self.c.nodes if n.name in hosts]

    def preflight(self, plan: ReleasePlan, out: "Outcome") -> bool:
        """Before anything stops: every node of the plan can be given to a new
        job (Slurm's own state; a draining node runs its jobs but takes no new one)."""
        try:
            states = self.s.node_states(self.nodes_of(plan))
        except UnreachableError as exc:
            return self.e._fail(out, self.c.slurm.login, f"cannot read Slurm's node states: {exc}")
        bad = [st for st in states.values() if not st.schedulable]
        if bad:
            return self.e._fail(out, bad[0].name, "; ".join(st.describe() for st in bad) + ": release "
                                + f"{plan.release} cannot have its nodes (nothing was stopped)")
        return True

    def hold(self, plan: ReleasePlan, out: "Outcome") -> bool:
        """The release's job: the running one (a restart keeps it), else a new
        batch job on the plan's nodes, waited for until it runs."""
        try:
            return self._hold(plan, out)
        except UnreachableError as exc:
            # cut off from the login host: a job of this release that was submitted goes by its name
            try:
                self.s.login_exec(slurm.scancel_name_command(slurm.release_job_name(self.c.name, plan.release)), 30)
            except UnreachableError:
                pass
            return self.e._fail(out, self.c.slurm.login, f"Slurm job of release {plan.release}: {exc}")

    def _hold(self, plan: ReleasePlan, out: "Outcome") -> bool:
        try:
            jobs = self.s.squeue()
        except UnreachableError as exc:
            return self.e._fail(out, self.c.slurm.login, f"cannot read Slurm's queue: {exc}")
        held = slurm.release_job([j for j in jobs if j.state == "RUNNING"], self.c.name, plan.release)
        if held is not None:
            self.s.use_job(held.id)
            self.held = plan.release
            return True
        names = self.nodes_of(plan)
        # the command's own allocation (its steps so far) would keep an exclusive job waiting
        self.s.use_job(None)
        o, e, code = self.s.login_exec(slurm.sbatch_command(self.c, names, plan.release), 60)
        job = o.strip().split(";")[0] if code == 0 else ""
        if not job.isdigit():
            return self.e._fail(out, self.c.slurm.login, f"sbatch refused release {plan.release}'s job: {(e or o).strip()[-300:]}")
        limit = self.c.slurm.alloc_timeout_s
        o, e, code = self.s.login_exec(slurm.wait_running_command(job, limit), limit + 30)
        if code != 0:
            self.s.login_exec(slurm.scancel_job_command(job, 30), 60)
            others = [j for j in self.s.squeue() if j.id != job]
            held = "; ".join(f"job {j.id} ({j.name}, {j.state}) holds {j.nodes}" for j in others if j.nodes)
            return self.e._fail(out, self.c.slurm.login, f"Slurm job {job} of release {plan.release} did not start within {limit:g}s "
                                                        f"({o.strip() or e.strip()}); cancelled"
                                                        + (f"; the cluster's other jobs: {held} (a command of the tool's that still runs, "
                                                           f"or one that was killed: scancel it)" if held else ""))
        self.s.use_job(job)
        self.held = plan.release
        self.e.say(f"slurm: job {job} ({slurm.release_job_name(self.c.name, plan.release)}) holds {', '.join(names)}")
        return True

    def start_units(self, plan: ReleasePlan, units: list[Unit], out: "Outcome", number: Callable[[Unit], int]) -> dict[str, str]:
        """Each unit as a step of the release's job; {"<host>/<container>": "" or why it did not start}."""
        if self.held != plan.release and not self.hold(plan, out):
            return {f"{u.host}/{u.container}": out.reason for u in units}
        rd = release_dir(self.c, plan.release)
        logdir = slurm.login_log_dir(self.c, plan.release)
        steps = [
            slurm.UnitStep(
                node=self.c.slurm_name(self.c.node(u.host)),
                name=u.container,
                script=slurm.unit_step_body(ctr.start_script(rd, u.container, u.run_file, number(u)), u.container, self.c.deploy.stop_timeout_s),
                log=f"{logdir}/{u.host}.{u.container}.attempt-{number(u)}.step.log",
            )
            for u in units
        ]
        wait = self.c.deploy.rpc_timeout_s
        try:
            o, e, code = self.s.login_exec(slurm.start_units_script(self.c, self.s.job, steps, wait), wait + 60)
        except UnreachableError as exc:
            return {f"{u.host}/{u.container}": f"login host unreachable while its step started: {exc}" for u in units}
        got = slurm.parse_started(o)
        return {f"{u.host}/{u.container}": got.get(f"{self.c.slurm_name(self.c.node(u.host))}/{u.container}",
                                                   f"no answer from its step ({(e or o).strip()[-200:]})") for u in units}

    def end_jobs(self, keep_release: str | None) -> list[str]:
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
            self.s.login_exec(slurm.scancel_steps_command(steps, self.c.deploy.stop_timeout_s + 5),
                              60 + len(steps) * (self.c.deploy.stop_timeout_s + 5))
        o, e, code = self.s.login_exec(slurm.scancel_job_command(job.id, 30), 60)
        if self.s.job == job.id:
            self.s.use_job(None)
            self.held = None
        if code != 0:
            return [f"Slurm job {job.id}: {o.strip() or e.strip()}"]
        self.e.say(f"slurm: job {job.id} of release {release} cancelled" + (f" ({len(steps)} steps, last started first)" if steps else ""))
        return []
