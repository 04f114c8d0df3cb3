"""``deploy --check --json`` of every real inventory is byte-identical to its
recorded document. The SSH inventories' were recorded before the serving
systems became plug-ins (issue 20): the restructuring changed where the code
lives, not one command, file or variable that reaches a node. The real Slurm
inventories' (``b200_slurm``, ``gb300_slurm``: run as the site's ordinary
user) hold what a user's release writes and runs: the per-user folders
(``/var/tmp/llmdeploy-<user>/``), the units' pyxis ``srun`` steps. Release
ids (a timestamp and a hash) are normalised.

``deploy --check`` shows the units' steps, not the jobs that hold the nodes:
for each real Slurm inventory the release's ``sbatch`` and a command's own
``salloc`` (``--exclusive --mem=0``) are held to ``jobs/<name>.txt`` beside.

To record a deliberate change: run ``deploy --cluster X --check --json``,
replace the release id with RELEASE and review the diff like any other (the
jobs' lines: ``job_lines`` below)."""

import re
from pathlib import Path

import pytest

from llmdeploy.inventory import load_cluster
from launchers.slurm import commands as slurm
from tests.conftest import run_invoke

GOLDEN = Path(__file__).resolve().parent.parent / "data" / "check_golden"
JOBS = GOLDEN / "jobs"
RELEASE_RE = re.compile(r"[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}")
INVENTORY = Path(__file__).resolve().parent.parent.parent / "inventory"


def real_inventories() -> set[str]:
    return {p.stem for p in INVENTORY.glob("*.py") if not p.stem.startswith(("sim_", "_"))}


@pytest.mark.parametrize("cluster", sorted(p.stem for p in GOLDEN.glob("*.json")))
def test_check_json_is_unchanged(cluster):
    res = run_invoke("deploy", "--cluster", cluster, "--check", "--json", timeout=120)
    assert res.returncode == 0, res.stderr
    assert RELEASE_RE.sub("RELEASE", res.stdout) == (GOLDEN / f"{cluster}.json").read_text()


def test_every_real_inventory_has_a_golden():
    assert real_inventories() <= {p.stem for p in GOLDEN.glob("*.json")}


def job_lines(cluster: str) -> str:
    """The release's job (sbatch, release RELEASE) and a command's own allocation (salloc, token TOKEN) of ``cluster``."""
    c = load_cluster(cluster)
    names = [c.slurm_name(n) for n in c.nodes]
    return (slurm.sbatch_command(c, names, "RELEASE") + "\n"
            + slurm.salloc_command(c, names, slurm.command_job_name(c.name, "TOKEN")) + "\n")


@pytest.mark.parametrize("cluster", sorted(p.stem for p in JOBS.glob("*.txt")))
def test_slurm_job_lines_are_unchanged(cluster):
    assert job_lines(cluster) == (JOBS / f"{cluster}.txt").read_text()


def test_every_real_slurm_inventory_has_its_job_lines():
    slurm_ones = {name for name in real_inventories() if load_cluster(name).slurm is not None}
    assert slurm_ones == {p.stem for p in JOBS.glob("*.txt")}
    assert {"b200_slurm", "gb300_slurm"} <= slurm_ones
