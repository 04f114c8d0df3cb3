"""vLLM-Ascend DP4/TP16 on the simulated A3 run by a real Slurm controller:
prepare and verify-comm (hccn_tool and the NPU ping matrix) as job steps,
the release as a job whose steps are node 0's server and the three headless
workers (each with its own DP start rank), a killed step named by status,
and stop leaving no job, step or serving process."""

import json

import pytest

from llmdeploy.launchers.slurm import commands as slurm
from llmdeploy.release import parse_ledger
from sim import hostview
from sim.paths import host_dir
from tests.conftest import run_invoke
from tests.integration import test_slurm_b200 as b200

SIM_CLUSTER = "sim-a3-slurm"
NODES = [f"sim-a3-slurm-{i}" for i in range(4)]


def jobs():
    return b200.jobs(SIM_CLUSTER)


def _ledger():
    return parse_ledger((host_dir(SIM_CLUSTER, NODES[0]) / f"root/var/lib/llmdeploy/{SIM_CLUSTER}/ledger.jsonl").read_text())


@pytest.mark.slow
def test_prepare_verify_deploy_kill_a_step_and_stop(sim_cluster):
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    res = run_invoke("verify-comm", "--cluster", SIM_CLUSTER, "--json", timeout=600)
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["ok"], doc
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, timeout=500)
    assert res.returncode == 0, res.stdout + res.stderr
    rid = _ledger()[-1]["release"]
    (job,) = jobs()
    assert job.name == slurm.release_job_name(SIM_CLUSTER, rid) and job.state == "RUNNING"
    # a step per unit, each on its own node
    assert sorted(nodes for _, nodes in job.steps.values()) == NODES, job.steps
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["healthy"], doc
    # every headless worker with its own DP start rank, as on SSH
    for i, node in enumerate(NODES):
        run_sh = (host_dir(SIM_CLUSTER, node) / f"root/var/lib/llmdeploy/{SIM_CLUSTER}/releases/{rid}/run.sh").read_text()
        assert ("--headless" in run_sh) == (i > 0) and (f"--data-parallel-start-rank {i}" in run_sh) == (i > 0)
        assert hostview.containers(SIM_CLUSTER, node) == {f"{SIM_CLUSTER}-{rid}": "running"}

    unit = next(name for name, nodes in job.steps.values() if nodes == NODES[2])
    b200.kill_step(SIM_CLUSTER, NODES[2], unit, 4)
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and unit in doc["nodes"][NODES[2]]["reason"] and "job step" in doc["nodes"][NODES[2]]["reason"], doc

    res = run_invoke("stop", "--cluster", SIM_CLUSTER, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    b200.nothing_left(SIM_CLUSTER, NODES)
