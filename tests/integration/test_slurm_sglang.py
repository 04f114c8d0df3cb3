"""SGLang on pyxis (sim-h200-sglang-slurm): the world is one Slurm step with
a task per node and ``--mpi=none`` (its nodes meet at node rank 0's
torch.distributed store, not through MPI); each node's task runs that node's
own line with its own ``--node-rank``, inside an enroot container, with the
node's 8 GPUs as Slurm gives them. A killed node's server ends the world and
status names the task; restart brings the whole world back as one step of the
same job; stop leaves no job, step, container or server; no node SSHes into
another."""

import json
import os
import signal
import time

import pytest

from launchers.slurm import commands as slurm
from llmdeploy.release import parse_ledger
from sim import hostview
from sim.paths import on_host, host_dir
from tests.conftest import run_invoke
from tests.integration.test_slurm_b200 import jobs, login, unit_steps

# the inventory's base_dir: on a Slurm cluster the default of the user it runs as (sim/users.py OPERATOR)
BASE = "/var/tmp/llmdeploy-ops/lib"
SIM_CLUSTER = "sim-h200-sglang-slurm"
NODES = ["sim-h200-sglang-slurm-0", "sim-h200-sglang-slurm-1"]


def _servers(job: str) -> dict[str, tuple[int, dict[str, str], str]]:
    """{node: (pid, environment, command line)} of the job's SGLang servers (one a node)."""
    out = {}
    for node in NODES:
        for pid, (env, cmd, _) in hostview.processes(SIM_CLUSTER, node).items():
            if "sglang.launch_server" in cmd and env.get("SLURM_JOB_ID") == job:
                assert node not in out, (node, out[node], cmd)
                out[node] = (pid, env, cmd)
    return out


def _arg(cmd: str, flag: str) -> str:
    words = cmd.split()
    return words[words.index(flag) + 1]


def _ledger():
    return parse_ledger((on_host(SIM_CLUSTER, NODES[0], BASE) / f"{SIM_CLUSTER}/ledger.jsonl").read_text())


@pytest.mark.slow
def test_sglang_on_pyxis_one_step_a_task_per_node_with_its_own_rank(sim_cluster):
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--no-check", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, "--skip-prepare", timeout=500)
    assert res.returncode == 0, res.stdout + res.stderr
    rid = _ledger()[-1]["release"]
    (job,) = jobs(SIM_CLUSTER)
    assert job.name == slurm.release_job_name(SIM_CLUSTER, rid) and job.state == "RUNNING"
    # the world: one step over both nodes, a task each, no MPI plug-in
    assert list(unit_steps(job).values()) == [(f"{SIM_CLUSTER}-{rid}", "sim-h200-sglang-slurm-[0-1]")], job.steps
    (sid,) = unit_steps(job)
    shown = login(f"scontrol show step {sid}", SIM_CLUSTER)
    assert " Tasks=2 " in shown, shown
    servers = _servers(job.id)
    assert sorted(servers) == NODES, servers
    for rank, node in enumerate(NODES):
        _, env, cmd = servers[node]
        # its own line: the node's rank, node 0's store; Slurm's GPU mask; no PMIx or OpenMPI rank
        assert env["SLURMD_NODENAME"] == node and env["SLURM_STEP_ID"] == sid.split(".")[1], env
        assert _arg(cmd, "--node-rank") == str(rank) and _arg(cmd, "--nnodes") == "2", cmd
        assert _arg(cmd, "--dist-init-addr").startswith("198.19.41.10:"), cmd
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7", env
        assert "PMIX_RANK" not in env and "OMPI_COMM_WORLD_RANK" not in env, env
        assert hostview.containers(SIM_CLUSTER, node) == {}  # no Docker container: the step is the container
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--diff", "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["healthy"] and doc["slurm"]["job"] == job.id, res.stdout + res.stderr

    # node rank 1's server killed: the world's step ends (--kill-on-bad-exit), status exits 1 and names the task
    os.kill(servers[NODES[1]][0], signal.SIGKILL)
    end = time.monotonic() + 60
    while time.monotonic() < end and (unit_steps(jobs(SIM_CLUSTER)[0]) or _servers(job.id)):
        time.sleep(0.3)
    assert not unit_steps(jobs(SIM_CLUSTER)[0]) and _servers(job.id) == {}
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and not doc["healthy"], doc
    reason = doc["nodes"][NODES[1]]["reason"]
    assert f"{NODES[1]}: task 1: Exited with exit code 137" in reason, reason

    # restart: the whole world again, one step of the same job, each node its own rank
    res = run_invoke("restart", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    (job_r,) = jobs(SIM_CLUSTER)
    assert job_r.name == job.name and len(unit_steps(job_r)) == 1, job_r.steps
    servers = _servers(job_r.id)
    assert [_arg(servers[n][2], "--node-rank") for n in NODES] == ["0", "1"], servers

    res = run_invoke("stop", "--cluster", SIM_CLUSTER, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert jobs(SIM_CLUSTER) == [] and login("squeue --noheader --all --steps", SIM_CLUSTER).strip() == ""
    for node in NODES:
        assert not [p for p, (env, cmd, _) in hostview.processes(SIM_CLUSTER, node).items() if "sglang.launch_server" in cmd]
    # no node reached another over SSH (the simulated nodes refuse it; nothing needed it)
    for node in NODES:
        assert "Accepted " not in (host_dir(SIM_CLUSTER, node) / "sshd.log").read_text(), node
