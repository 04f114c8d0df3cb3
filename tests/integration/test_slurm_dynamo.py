"""Dynamo 1P2D on five simulated GB300 hosts run by a real Slurm controller,
on pyxis + enroot (issue 29, "Done when"): etcd, NATS and the frontend (the
real ai-dynamo frontend, from the squashfs prepare built with the pinned
wheels) are steps of their own on node 0; prefill0 and the TP8 decode
groups are each one ``srun --mpi=pmix`` step, a task per GPU, no mpirun, no
Docker container, no SSH between the nodes. A killed decode rank is named by
status; that group alone is restarted; stop leaves nothing."""

import base64
import hashlib
import json
import os
import signal
import time

import pytest

from launchers.slurm import commands as slurm
from llmdeploy.release import parse_ledger
from sim import hostview
from sim.paths import on_host, host_dir
from tests.conftest import run_invoke, sim_pids
from tests.integration.test_slurm_b200 import jobs, login, pmix_ranks, unit_steps

# the inventory's base_dir: on a Slurm cluster the default of the user it runs as (sim/users.py OPERATOR)
BASE = "/var/tmp/llmdeploy-ops/lib"
SIM_CLUSTER = "sim-gb300-1p2d-slurm"
NODES = [f"{SIM_CLUSTER}-{i}" for i in range(5)]
GROUPS = {"prefill0": NODES[:1], "decode0": NODES[1:3], "decode1": NODES[3:5]}


def _ranks(job: str, worker: str) -> dict[int, tuple[int, dict[str, str]]]:
    """{PMIX_RANK: (pid, environment)} of ``worker``'s dynamo.trtllm ranks in ``job``, the worker
    known by its own role settings (--extra-engine-args .../<worker>.config.yaml)."""
    return pmix_ranks(job, lambda cmd: b"dynamo.trtllm" in cmd[:4] and any(a.endswith(f"/{worker}.config.yaml".encode()) for a in cmd),
                      SIM_CLUSTER)


def _mpi_processes() -> list[str]:
    """mpirun or OpenMPI daemons in the cluster's hosts (none may run: the groups are PMIx launches)."""
    found = []
    for pid in sorted(sim_pids(SIM_CLUSTER)):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv0 = os.path.basename(f.read().split(b"\0")[0].decode(errors="replace"))
        except (OSError, IndexError):
            continue
        if argv0 in ("mpirun", "orted", "prted", "prterun"):
            found.append(f"{pid} {argv0}")
    return found


@pytest.mark.slow
def test_dynamo_1p2d_on_pyxis_worker_groups_are_pmix_steps(sim_cluster):
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, timeout=900)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "(dynamo: etcd -> nats -> frontend -> prefill0 -> decode0 -> decode1)" in res.stdout, res.stdout
    base = on_host(SIM_CLUSTER, NODES[0], BASE) / f"{SIM_CLUSTER}"
    # prepare built the squashfs with the wheels once (one pip install, on node 0) and sent it down the chain:
    # the same bytes on every node (two enroot exports of two pip installs differ in their files' times)
    assert f"built on {NODES[0]}, then 4 node(s) got it from {NODES[0]} (files)" in " ".join(res.stdout.split()), res.stdout
    sums = {n: sorted(hashlib.sha256(p.read_bytes()).hexdigest()
                      for p in (on_host(SIM_CLUSTER, n, BASE) / f"{SIM_CLUSTER}/images").glob("*-wheels-*.sqsh"))
            for n in NODES}
    assert all(len(v) == 1 for v in sums.values()) and len({v[0] for v in sums.values()}) == 1, sums
    rid = parse_ledger((base / "ledger.jsonl").read_text())[-1]["release"]
    (job,) = jobs(SIM_CLUSTER)
    assert job.name == slurm.release_job_name(SIM_CLUSTER, rid) and job.state == "RUNNING"
    steps = {name.removeprefix(f"{SIM_CLUSTER}-{rid}-"): nodes for name, nodes in unit_steps(job).values()}
    assert steps == {"etcd": NODES[0], "nats": NODES[0], "frontend": NODES[0], "prefill0": NODES[0],
                     "decode0": f"{SIM_CLUSTER}-[1-2]", "decode1": f"{SIM_CLUSTER}-[3-4]"}, job.steps
    for sid, (name, _) in unit_steps(job).items():
        shown = login(f"scontrol show step {sid}", SIM_CLUSTER)
        tasks = {"decode0": 8, "decode1": 8, "prefill0": 4}.get(name.rsplit("-", 1)[-1], 1)
        assert f" Tasks={tasks} " in shown, shown
    for worker, nodes in GROUPS.items():
        ranks = _ranks(job.id, worker)
        assert sorted(ranks) == list(range(4 * len(nodes))), (worker, sorted(ranks))
        for rank, (_, env) in ranks.items():
            # block distribution, 4 tasks a node; each node's 4 GPUs; ranks from PMIx, not from mpirun
            assert env["SLURMD_NODENAME"] == nodes[rank // 4] and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3", (worker, rank, env)
            assert "OMPI_MCA_orte_hnp_uri" not in env and "OMPI_COMM_WORLD_RANK" not in env, (worker, rank)
            assert env["TLLM_SPAWN_PROXY_PROCESS"] == "1"  # under trtllm-llmapi-launch
    assert _mpi_processes() == []
    assert all(hostview.containers(SIM_CLUSTER, n) == {} for n in NODES)  # no Docker container: each step is its containers
    # no hostfile, no launch agent: only each node's task.sh
    rd = on_host(SIM_CLUSTER, NODES[1], BASE) / f"{SIM_CLUSTER}/releases/{rid}"
    assert (rd / "decode0.task.sh").exists() and not list(rd.glob("decode0.hostfile")) and not list(rd.glob("*.mpi-agent.sh"))
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["healthy"] and doc["slurm"]["job"] == job.id, doc
    assert sorted(u["service"] for n in NODES for u in doc["nodes"][n]["units"].values()) == sorted(
        ["etcd", "nats", "frontend", "prefill0", "decode0", "decode0", "decode1", "decode1"])

    # rank 6 of decode1 (node 4) killed: srun ends that group's step (--kill-on-bad-exit); status exits 1 and names the task
    pid, _ = _ranks(job.id, "decode1")[6]
    os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + 60
    while time.monotonic() < end and (_ranks(job.id, "decode1") or len(unit_steps(jobs(SIM_CLUSTER)[0])) == 6):
        time.sleep(0.3)
    assert _ranks(job.id, "decode1") == {} and len(unit_steps(jobs(SIM_CLUSTER)[0])) == 5
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and not doc["healthy"], doc
    reason = doc["nodes"][NODES[4]]["reason"]
    assert "its step ended" in reason and f"{NODES[4]}: task 6: Exited with exit code 137" in reason, reason
    # the other groups were not touched
    assert sorted(_ranks(job.id, "decode0")) == list(range(8))

    # that group alone, started again as one step of the same job; healthy (the frontend lists it again)
    res = run_invoke("restart", "--cluster", SIM_CLUSTER, "--service", "decode1", timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    (job_r,) = jobs(SIM_CLUSTER)
    assert job_r.id == job.id and len(unit_steps(job_r)) == 6, job_r.steps
    assert sorted(_ranks(job.id, "decode1")) == list(range(8))
    # the killed group's rank 0 left its etcd lease (SIGKILL: no deregistration): restart's readiness waited until
    # the frontend no longer listed that instance, so status agrees at once
    res = run_invoke("status", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0, res.stdout

    # the release restarted whole (etcd alone is refused: control-plane): etcd runs in an enroot container of
    # this start (named per attempt), so what the previous one wrote in its writable root (--data-dir
    # /etcd-data) is not there (etcd's v3 JSON gateway, from the login host)
    key = base64.b64encode(b"llmdeploy-test-marker").decode()
    kv = f"http://{NODES[0]}:2379/v3/kv"
    login(f"curl -sf -X POST {kv}/put -d '{{\"key\": \"{key}\", \"value\": \"{key}\"}}'", SIM_CLUSTER)
    assert '"kvs"' in login(f"curl -sf -X POST {kv}/range -d '{{\"key\": \"{key}\"}}'", SIM_CLUSTER)
    res = run_invoke("restart", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert '"kvs"' not in login(f"curl -sf -X POST {kv}/range -d '{{\"key\": \"{key}\"}}'", SIM_CLUSTER)

    res = run_invoke("stop", "--cluster", SIM_CLUSTER, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert jobs(SIM_CLUSTER) == [] and login("squeue --noheader --all --steps", SIM_CLUSTER).strip() == ""
    assert [w for w in GROUPS if _ranks(job.id, w)] == [] and _mpi_processes() == []
    enroot = login(f"srun -N{len(NODES)} -w {','.join(NODES)} enroot list", SIM_CLUSTER)
    assert enroot.strip() == "" and jobs(SIM_CLUSTER) == []
    for node in NODES:
        assert hostview.containers(SIM_CLUSTER, node) == {}
        assert not [p for p, (_, _, name) in hostview.processes(SIM_CLUSTER, node).items() if name]
        # prepare, its node tests, deploy, status, restart and stop reached the nodes as job steps only
        assert "Accepted " not in (host_dir(SIM_CLUSTER, node) / "sshd.log").read_text(), node
