"""What prepare and invoke check ask of a Slurm site (launchers/slurm/site.py): the readers of
srun --mpi=list, of a step's memlock and of the PMIx world, and what the tool passes itself
(--propagate=NONE, --mem=0 beside --exclusive)."""

import shlex

import pytest

from llmdeploy.inventory import load_cluster
from launchers.slurm import commands as slurm
from launchers.slurm import site


def _cluster(**slurm_settings):
    c = load_cluster("sim-gb300-1p2d-slurm")
    return c.model_copy(update={"slurm": c.slurm.model_copy(update=slurm_settings)})


# what srun --mpi=list prints: Slurm 25.11.7 (src/srun/srun.c with mpi_g_client_init) and Debian's 22.05
LIST_25 = "MPI plugin types are...\n\tnone\n\tcray_shasta\n\tpmi2\n\tpmix\nspecific pmix plugin versions available: pmix_v4\n"
LIST_22 = "srun: MPI types are...\nsrun: cray_shasta\nsrun: none\nsrun: pmi2\nsrun: pmix\nsrun: pmix_v4\n"
LIST_NO_PMIX = "MPI plugin types are...\n\tnone\n\tcray_shasta\n\tpmi2\n"


def test_pmix_in_srun_mpi_list_of_each_slurm():
    assert site.mpi_list_problem(LIST_25, 0) is None and site.mpi_list_problem(LIST_22, 0) is None
    problem = site.mpi_list_problem(LIST_NO_PMIX, 0)
    assert problem.startswith("srun --mpi=list on the login host lists none, cray_shasta, pmi2, no pmix")
    assert "--with-pmix" in problem and "mpi/pmix" in problem
    assert "failed (exit 1)" in site.mpi_list_problem("srun: error: bad", 1)


@pytest.mark.parametrize("out, kib", [("memlock=unlimited\n", -1), ("memlock=64\n", 64), ("x\nmemlock=8192\n", 8192), ("", None)])
def test_memlock_of_a_step(out, kib):
    assert site.memlock_of(out) == kib


def test_memlock_below_the_need_names_both_fixes_and_the_setting_made_names_slurmd():
    c = _cluster(memlock_kib=None, propagate_limits=True)
    assert site.memlock_problem(c, -1) is None
    p = site.memlock_problem(c, 64)
    assert p.startswith("memlock in a job step is 64 KiB, the units need unlimited")
    assert "PropagateResourceLimitsExcept=MEMLOCK" in p and "slurm.propagate_limits = False" in p
    c = _cluster(memlock_kib=8192, propagate_limits=True)
    assert site.memlock_problem(c, 8192) is None and "need 8192 KiB" in site.memlock_problem(c, 64)
    p = site.memlock_problem(_cluster(memlock_kib=None, propagate_limits=False), 8192)
    assert "--propagate=NONE gives the tasks slurmd's limit" in p and "LimitMEMLOCK=infinity" in p


def test_propagate_none_on_every_srun_and_sbatch_only_when_asked():
    for c, want in ((_cluster(propagate_limits=True), False), (_cluster(propagate_limits=False), True)):
        names = ["sim-gb300-1p2d-slurm-0", "sim-gb300-1p2d-slurm-1"]
        # salloc has no --propagate (salloc(1)): "unrecognized option"
        assert "--propagate" not in slurm.salloc_command(c, names, "x")
        lines = [slurm.sbatch_command(c, names, "r1"),
                 slurm.srun_dispatch_command(c, "42", names, "facts"), slurm.srun_one_command(c, "42", names[0], "f", "true"),
                 site.pmix_world_command(c, "42", names, "/i.sqsh")]
        for line in lines:
            assert ("--propagate=NONE" in shlex.split(line)) == want, line


def test_exclusive_always_with_all_the_memory():
    c = _cluster()
    for line in (slurm.salloc_command(c, ["a"], "x"), slurm.sbatch_command(c, ["a"], "r1")):
        args = shlex.split(line)
        assert "--exclusive" in args and "--mem=0" in args, line


def test_the_pmix_world_runs_the_probe_in_the_image_a_task_per_node():
    c = _cluster()
    args = shlex.split(site.pmix_world_command(c, "42", ["n0", "n1"], "/var/x/img.sqsh").removesuffix(" < /dev/null 2>&1"))
    assert args[:3] == ["srun", "--jobid=42", "--overlap"]
    assert "--ntasks=2" in args and "--distribution=arbitrary" in args and "--nodelist=n0,n1" in args and "--mpi=pmix" in args
    assert args[-4:] == ["--container-image=/var/x/img.sqsh", "python3", "-c", site.PROBE]
    compile(site.PROBE, "probe", "exec")


def test_the_pmix_world_is_read_by_its_ranks():
    ok = "0: pmix-rank 0 of 2 on n0\n1: pmix-rank 1 of 2 on n1\n"
    assert site.pmix_world_problem(ok, 0, 2) is None
    half = "pmix-rank 0 of 2 on n0\n"
    assert site.pmix_world_problem(half, 0, 2) is not None
    bad = "[n0:1234] PMIX ERROR: ... \nsrun: error: n0: task 0: Exited with exit code 1\n"
    p = site.pmix_world_problem(bad, 1, 2)
    assert p.startswith("PMIx does not work inside the container: a 2-task srun --mpi=pmix world in the cluster's image failed")
    assert "task 0: Exited with exit code 1" in p and "50-slurm-pmi.sh" in p and "hooks.d" in p


def test_an_image_without_mpi_is_named_as_such():
    p = site.pmix_world_problem("0: no libmpi in the image\nsrun: error: n0: task 0: Exited with exit code 1\n", 1, 2)
    assert p.startswith("the cluster's image has no MPI library (libmpi.so)")
