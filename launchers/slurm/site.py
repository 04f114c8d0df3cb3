"""What a Slurm site must give a pyxis cluster before its first deploy, read
by prepare and ``invoke check`` (:meth:`SlurmJobs.site_checks`): each
condition that fails a first deploy far from its cause, named with the
setting that fixes it. Pure: command lines and their readers.

- **pmix in ``srun --mpi=list``** (on the login host): the units' worlds
  are ``srun --mpi=pmix`` steps. Since 23.11, Slurm is built with PMIx only
  when the site asks for it (``--with-pmix``; the 23.11 release notes).
- **PMIx inside the container**: a 2-task world over 2 nodes (1 on a
  one-node cluster) in the cluster's imported image, each task
  ``MPI_Init`` (the image's libmpi, through Python's ctypes) and says its
  rank. An enroot container reaches slurmstepd's PMIx server only through
  enroot's ``50-slurm-pmi.sh`` hook, which ``make install`` leaves among the
  opt-in hooks (``share/enroot/hooks.d``); without it every rank's
  ``MPI_Init`` fails.
- **memlock in a step**: Slurm gives the tasks srun's soft limits
  (slurm.conf ``PropagateResourceLimits``, default ALL: the login shell's,
  often 64 KiB), and NCCL, UCX and NIXL memory registration then fails. The
  fix is the site's ``PropagateResourceLimitsExcept=MEMLOCK``, or
  ``slurm.propagate_limits = False`` (``--propagate=NONE``).
- ``--mem=0`` beside every ``--exclusive`` (``commands.EXCLUSIVE``) is the
  tool's own, held by a unit test: nothing to ask the site.
"""

from __future__ import annotations

import re
import shlex

from llmdeploy.inventory import Cluster
from .schema import section
from . import commands as slurm

MPI_LIST = "srun --mpi=list 2>&1"


def pmix_listed(out: str) -> bool:
    """Whether ``srun --mpi=list``'s output names a pmix plug-in (22.05:
    ``srun: mpi/pmix_v4``; 23.02 and later: a line ``pmix``, then
    ``specific pmix plugin versions available: pmix_v4``)."""
    return bool(re.search(r"(^|[\s/:])pmix(_v\d+)?\s*$", out, re.M))


def listed(out: str) -> str:
    """The plug-ins ``srun --mpi=list`` names, for a message: its lines of one name each (after 22.05's
    ``srun: `` and an ``mpi/``), not its headings."""
    names = [m.group(1) for line in out.splitlines()
             if (m := re.fullmatch(r"\s*(?:srun:\s*)?(?:mpi/)?([a-z][a-z0-9_]*)\s*", line))]
    return ", ".join(dict.fromkeys(names)) or "nothing"


def mpi_list_problem(out: str, code: int) -> str | None:
    if code == 0 and pmix_listed(out):
        return None
    said = f"lists {listed(out)}" if code == 0 else f"failed (exit {code}): {out.strip()[-300:]}"
    return (f"srun --mpi=list on the login host {said}, no pmix: the units' worlds are srun --mpi=pmix steps. "
            "Slurm 23.11 and later have PMIx only when built --with-pmix: ask the site for mpi/pmix")


# the memlock of a task, as ulimit prints it: KiB or "unlimited"
MEMLOCK_SCRIPT = "echo memlock=$(ulimit -l)\n"


def memlock_of(out: str) -> int | None:
    """A task's memlock in KiB from :data:`MEMLOCK_SCRIPT`'s output; -1: unlimited; None: not said."""
    m = re.search(r"^memlock=(unlimited|\d+)\s*$", out, re.M)
    if not m:
        return None
    return -1 if m.group(1) == "unlimited" else int(m.group(1))


def memlock_problem(cluster: Cluster, have: int | None) -> str | None:
    """Why ``have`` (KiB, -1 unlimited) in a step is not what the units need (``slurm.memlock_kib``, None: unlimited)."""
    s = section(cluster)
    need = s.memlock_kib
    if have == -1 or (have is not None and need is not None and have >= need):
        return None
    shown = "not said" if have is None else f"{have} KiB"
    wanted = "unlimited" if need is None else f"{need} KiB"
    where = ("srun --propagate=NONE gives the tasks slurmd's limit: raise slurmd's (its systemd unit's LimitMEMLOCK=infinity)"
             if not s.propagate_limits else
             "Slurm gives the tasks your login shell's limit (slurm.conf PropagateResourceLimits, default ALL): "
             "ask the site for PropagateResourceLimitsExcept=MEMLOCK, or set slurm.propagate_limits = False "
             "(the tool then runs srun --propagate=NONE and the tasks get slurmd's limit)")
    return f"memlock in a job step is {shown}, the units need {wanted} (NCCL, UCX and NIXL register memory): {where}"


# each rank: MPI_Init through the image's own libmpi (OpenMPI: MPI_COMM_WORLD is &ompi_mpi_comm_world; MPICH's is 0x44000000)
PROBE = """import ctypes, ctypes.util, socket, sys
lib = None
for name in (ctypes.util.find_library("mpi"), "libmpi.so.40", "libmpi.so.12", "libmpi.so"):
    try:
        lib = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL) if name else None
    except OSError:
        continue
    if lib:
        break
if lib is None:
    sys.exit("no libmpi in the image")
if lib.MPI_Init(None, None) != 0:
    sys.exit("MPI_Init failed")
try:
    world = ctypes.c_void_p(ctypes.addressof(ctypes.c_char.in_dll(lib, "ompi_mpi_comm_world")))
except ValueError:
    world = ctypes.c_int(0x44000000)
rank, size = ctypes.c_int(-1), ctypes.c_int(-1)
lib.MPI_Comm_rank(world, ctypes.byref(rank))
lib.MPI_Comm_size(world, ctypes.byref(size))
print("pmix-rank %d of %d on %s" % (rank.value, size.value, socket.gethostname()), flush=True)
lib.MPI_Finalize()
"""


def pmix_world_command(cluster: Cluster, job: str, names: list[str], image_file: str) -> str:
    """On the login host: the probe as a world of one task on each of ``names``
    (Slurm's names, at most 2) in the cluster's imported image, through PMIx
    as the units' worlds are."""
    step = slurm.UnitStep(node=names[0], name="llmdeploy-pmix-check", script="", log="", nodes=names, tasks=1, mpi="pmix",
                          args=[f"--container-image={image_file}", "python3", "-c", PROBE])
    return " ".join(shlex.quote(a) for a in slurm.unit_srun_args(cluster, job, step)) + " < /dev/null 2>&1"


def pmix_world_problem(out: str, code: int, tasks: int) -> str | None:
    ranks = set(re.findall(r"^(?:\d+: )?pmix-rank (\d+) of (\d+) on ", out, re.M))
    if code == 0 and ranks == {(str(r), str(tasks)) for r in range(tasks)}:
        return None
    said = " ".join(line.strip() for line in out.strip().splitlines()[-4:])[-400:] or f"exit {code}"
    if "no libmpi in the image" in out:
        return f"the cluster's image has no MPI library (libmpi.so) for the {tasks}-task PMIx world: its ranks cannot MPI_Init ({said})"
    return (f"PMIx does not work inside the container: a {tasks}-task srun --mpi=pmix world in the cluster's image failed "
            f"({said}). enroot's 50-slurm-pmi.sh hook gives a container the step's PMIx server; make install leaves it in "
            "share/enroot/hooks.d: copy it into the nodes' enroot hooks.d (ENROOT_SYSCONF_PATH/hooks.d), and the image needs an MPI built with PMIx")
