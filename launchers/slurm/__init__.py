"""The Slurm launcher: a cluster whose inventory has a ``slurm`` section.
Commands reach its nodes as job steps from its login host, a release is a
job that holds its nodes, and each unit is a step of it: a pyxis
container of the step (``container="pyxis"``, a world one step over its
nodes, through PMIx for an MPI one) or a container Docker runs on the node.

- ``commands.py``: the command lines (srun, sbatch, salloc, squeue, sinfo,
  scancel) and the readers of their output; pure;
- ``steps.py``: the transport (``SlurmSteps``): a step over many nodes as one
  srun from the login host, the allocation (and the job a command hands to
  its child processes, ``handoff``), Slurm's node states;
- ``jobs.py``: the launcher (``SlurmJobs``): the release's job, its units as
  steps, stopping them last-started first, what status adds;
- ``reader.py``: the release's reader, one more step of its job that reads
  the nodes for status, top and the watcher (its scripts and the reader of
  what it leaves on the login host); pure;
- ``pyxis.py`` and ``units.py`` (``container="pyxis"``): a unit's docker run
  line as a pyxis step, the wrapper its step runs so that the unit keeps a
  record on its node, and the node's scripts that read and stop such units
  with the Docker scripts' output (``PyxisUnits``, the runtime); pure;
- ``images.py`` and ``wheels.py`` (prepare's image and wheels steps on a
  pyxis cluster): the image imported once per node with enroot into a
  squashfs file named by its ID, the pinned wheels built into one of its
  own, the node's engine check; pure.
"""

from __future__ import annotations

import shlex
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, ContextManager, Iterator, cast

from llmdeploy.errors import UnreachableError
from llmdeploy.inventory import Cluster, Node
from llmdeploy.releaseplan import ReleasePlan, Unit
from llmdeploy.runner import Runner
from .schema import section
from . import steps
from .commands import unit_srun_args
from .jobs import SlurmJobs, plan_steps
from .steps import AllocationError, SlurmSteps
from .units import PyxisUnits

NAME = "slurm"

# run as a Slurm job step, mpirun would take the step's allocation
# (ras/slurm) and start its daemons with srun (plm/slurm), a nested
# step that waits for the one it runs in: the daemons go over SSH
# from node 0 as on any cluster (OpenMPI 4.1 orte/mca/plm, orte/mca/ras)
MPIRUN_ARGS: tuple[str, ...] = ("--mca", "plm", "rsh", "--mca", "ras", "^slurm")


def transport(runner: Runner) -> SlurmSteps:
    return SlurmSteps(runner)


def launcher(cluster: Cluster, runner: Runner, say: Callable[[str], None]) -> SlurmJobs:
    return SlurmJobs(cluster, runner, say)


def outside_ssh(cluster: Cluster) -> bool:
    """The nodes are reached as job steps from the login host only: a site
    without pam_slurm_adopt refuses an SSH login to a node, and with it the
    login would need a job of the user's on the node. ``invoke check``'s
    commands are steps too (through the runner, ``flows/checkhost.py``)."""
    return False


@contextmanager
def _handed(cluster: Cluster, nodes: list[Node]) -> Iterator[dict[str, str]]:
    with Runner(cluster, nodes=nodes, transport=transport) as runner:
        t = cast(SlurmSteps, runner.transport)  # this launcher's runners carry its transport (``transport``)
        try:
            job = t.allocation(nodes)
        except AllocationError as exc:
            raise UnreachableError(str(exc)) from exc
        yield steps.handed_env(cluster.name, job, t.release)
    # the runner's close gave back the allocation when it was this command's own (scancel); a release's job stays


def handoff(cluster: Cluster, nodes: list[Node]) -> ContextManager[dict[str, str]]:
    """The job the child processes' steps run in: the running release's job,
    else an allocation of this command's own (one for all of them: a salloc
    of each would wait for the others', ``--exclusive``), cancelled when the
    command is done with it; a killed command's ends at its time limit
    (``slurm.command_time_limit``). Its id goes to the children in
    ``steps.HANDED_ENV``."""
    return _handed(cluster, nodes)


def runtime(cluster: Cluster) -> PyxisUnits | None:
    """A pyxis cluster's units are steps' processes (``units.py``); Docker's units are Docker's (None)."""
    return PyxisUnits(cluster) if section(cluster).container == "pyxis" else None


def start_lines(cluster: Cluster, plan: ReleasePlan, script: Callable[[Unit], str]) -> list[tuple[str, str]]:
    """Each step that starts the plan's units, as its srun line (``deploy
    --check``): the steps of the release's job (``--jobid=JOB``: the job is
    made at deploy), first attempts; ``script(unit)``: a Docker unit's start."""
    shown = []
    for svc in plan.services:
        for step, units in plan_steps(cluster, plan, svc.units, script, lambda u: 1):
            hosts = ", ".join(u.host for u in units)
            shown.append((f"{svc.name}: {step.name} on {hosts}", " ".join(shlex.quote(a) for a in unit_srun_args(cluster, "JOB", step))))
    return shown


# this plug-in's conformance, for the type checker (the registry checks it again when it loads)
if TYPE_CHECKING:  # pragma: no cover - types only
    import launchers.slurm as _this
    from llmdeploy.launcher import Launcher, LauncherPlugin, Transport, UnitRuntime

    _conforms: LauncherPlugin = _this
    _transport: Callable[[Runner], Transport] = SlurmSteps
    _launcher: Callable[[Cluster, Runner, Callable[[str], None]], Launcher] = SlurmJobs
    _runtime: Callable[[Cluster], UnitRuntime] = PyxisUnits
