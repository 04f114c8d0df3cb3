"""vLLM-Ascend DP4/TP16 on the simulated A3 run by a real Slurm controller:
prepare and verify-comm (hccn_tool and the NPU ping matrix) as job steps,
the release as a job whose steps are node 0's server and the three headless
workers (each with its own DP start rank), a killed step named by status,
and stop leaving no job, step or serving process; invoke stage as steps of
an allocation."""

import hashlib
import json
import random
import shutil
from pathlib import Path

import pytest

from launchers.slurm import commands as slurm
from llmdeploy.release import parse_ledger
from sim import hostview
from sim import users
from sim.paths import on_host, host_dir
from tests.conftest import run_invoke
from tests.integration import test_slurm_b200 as b200

# the inventory's base_dir: on a Slurm cluster the default of the user it runs as (sim/users.py OPERATOR)
BASE = "/var/tmp/llmdeploy-ops/lib"
SIM_CLUSTER = "sim-a3-slurm"
NODES = [f"sim-a3-slurm-{i}" for i in range(4)]


def jobs():
    return b200.jobs(SIM_CLUSTER)


def _ledger():
    return parse_ledger((on_host(SIM_CLUSTER, NODES[0], BASE) / f"{SIM_CLUSTER}/ledger.jsonl").read_text())


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
    # a step per unit, each on its own node (and the release's reader)
    assert sorted(nodes for _, nodes in b200.unit_steps(job).values()) == NODES, job.steps
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["healthy"], doc
    # every headless worker with its own DP start rank, as on SSH
    for i, node in enumerate(NODES):
        run_sh = (on_host(SIM_CLUSTER, node, BASE) / f"{SIM_CLUSTER}/releases/{rid}/run.sh").read_text()
        assert ("--headless" in run_sh) == (i > 0) and (f"--data-parallel-start-rank {i}" in run_sh) == (i > 0)
        assert hostview.containers(SIM_CLUSTER, node) == {f"{SIM_CLUSTER}-{rid}": "running"}

    unit = next(name for name, nodes in b200.unit_steps(job).values() if nodes == NODES[2])
    b200.kill_step(SIM_CLUSTER, NODES[2], unit, 4)
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and unit in doc["nodes"][NODES[2]]["reason"] and "job step" in doc["nodes"][NODES[2]]["reason"], doc

    res = run_invoke("stop", "--cluster", SIM_CLUSTER, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    b200.nothing_left(SIM_CLUSTER, NODES)


MODEL = "/data/models/Qwen3.8-2.4T-A95B-w8a8"


def _model(node):
    return on_host(SIM_CLUSTER, node, MODEL)


def _theirs(node):
    """The model folder on ``node`` and what is in it belong to the site's user (sim/users.py), as when they made it."""
    users.give(on_host(SIM_CLUSTER, node, users.DATA), _model(node), users.OPERATOR_UID)


def _digest(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".")}


def _task_launches(node):
    """Tasks slurmd on ``node`` has launched so far (its log: one line per task launch request)."""
    log = host_dir(SIM_CLUSTER, node).parents[1] / "slurm" / "nodes" / node / "slurmd.log"
    return log.read_text(errors="replace").count("launch task")


def test_stage_runs_as_steps_of_an_allocation(sim_cluster):
    """invoke stage on a Slurm cluster: the agents are tasks of steps of the
    command's own allocation, the stream goes over the data network, every
    node gets the checkpoint verified, nothing stays allocated, and a second
    run moves 0 bytes."""
    keep = {n: Path(str(_model(n)) + ".sim-saved") for n in NODES}
    for n in NODES:
        shutil.copytree(_model(n), keep[n])
    try:
        rnd = random.Random(29)
        for i in range(1, 4):
            (_model(NODES[0]) / f"model-{i:05d}-of-00003.safetensors").write_bytes(rnd.randbytes(3 << 20))
        for n in NODES[1:]:
            shutil.rmtree(_model(n))
            _model(n).mkdir()
            _theirs(n)  # the site's user staged the model there: it writes into their folder
        _theirs(NODES[0])
        want = _digest(_model(NODES[0]))
        before = {n: _task_launches(n) for n in NODES}
        res = run_invoke("stage", "--cluster", SIM_CLUSTER, "--json", timeout=300)
        doc = json.loads(res.stdout)
        assert res.returncode == 0 and doc["ok"], res.stdout + res.stderr
        for n in NODES[1:]:
            assert _digest(_model(n)) == want, n
            assert doc["nodes"][n]["written_bytes"] > 9 << 20
        # scan, hash, relay, record: each a step with a task on every node
        assert all(_task_launches(n) >= before[n] + 3 for n in NODES), {n: _task_launches(n) - before[n] for n in NODES}
        assert jobs() == [] and b200.login("squeue --noheader --all", SIM_CLUSTER).strip() == ""
        res = run_invoke("stage", "--cluster", SIM_CLUSTER, "--json", timeout=300)
        doc = json.loads(res.stdout)
        assert res.returncode == 0 and doc["sent_bytes"] == 0, res.stdout
    finally:
        for n in NODES:
            shutil.rmtree(_model(n))
            shutil.copytree(keep[n], _model(n))
            _theirs(n)
            shutil.rmtree(keep[n])
