"""invoke deploy of trtllm-serve on the simulated B200 pair: one real OpenMPI
world of 16 ranks (8 per node) started from node 0's container, whose launch
agent enters node 1's container over SSH; the world restarted as a whole
when a rank dies; status, restart, rollback and stop on the same engine."""

import json
import os
import re
import signal
import subprocess
import time

import pytest
import yaml

from llmdeploy.release import parse_ledger
from sim import hardware
from sim import hostview
from sim.paths import host_dir
from tests.integration.conftest import top_once
from tests.conftest import INVOKE, REPO, run_invoke, tool_env

SIM_CLUSTER = "sim-b200"
NODES = ["sim-b200-0", "sim-b200-1"]


def _base(node):
    return host_dir(SIM_CLUSTER, node) / "root/var/lib/llmdeploy/sim-b200"


def _state(node):
    return host_dir(SIM_CLUSTER, node) / "root/etc/llmdeploy-sim"


def _ledger():
    return parse_ledger((_base("sim-b200-0") / "ledger.jsonl").read_text())


def _containers(node):
    """name -> state, from the host's own Docker daemon."""
    return hostview.containers(SIM_CLUSTER, node)


def _procs(node, cluster=SIM_CLUSTER):
    """{pid: (environment, command line, container name)} of every process in a container of the simulated host."""
    return {pid: p for pid, p in hostview.processes(cluster, node).items() if p[2]}


def _ranks(node, not_of=None):
    """{MPI rank: pid} of the trtllm-serve ranks on ``node`` (not those of release ``not_of``)."""
    return {int(env["OMPI_COMM_WORLD_RANK"]): pid for pid, (env, cmd, name) in _procs(node).items()
            if "OMPI_COMM_WORLD_RANK" in env and "trtllm-serve" in cmd
            and not (not_of and name == f"sim-b200-{not_of}")}


@pytest.fixture
def faults(sim_cluster):
    saved = {n: hardware.load(_state(n)) for n in NODES}

    def set_fault(node, **values):
        hw = hardware.load(_state(node))
        hw["trtllm"] = values
        hardware.save(_state(node), hw)
        (_state(node) / "trtllm-starts").unlink(missing_ok=True)

    yield set_fault
    for n, hw in saved.items():
        hardware.save(_state(n), hw)
        (_state(n) / "trtllm-starts").unlink(missing_ok=True)


def _deploy(*extra, env=None):
    return run_invoke("deploy", "--cluster", SIM_CLUSTER, *extra, env=env, timeout=400)


def test_one_mpi_world_across_both_nodes_then_status(faults):
    res = _deploy()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "serving, release " in res.stdout and ", healthy" in res.stdout
    rid = _ledger()[-1]["release"]
    assert _ledger()[-1]["result"] == "good"
    # the real OpenMPI: ranks 0-7 on node 0, 8-15 on node 1, each inside its node's container
    assert sorted(_ranks("sim-b200-0")) == list(range(8))
    assert sorted(_ranks("sim-b200-1")) == list(range(8, 16))
    for pid in _ranks("sim-b200-1").values():
        env, _, name = _procs("sim-b200-1")[pid]
        assert name == f"sim-b200-{rid}" and env["OMPI_COMM_WORLD_SIZE"] == "16"
        assert env["NCCL_SOCKET_IFNAME"] == "ens1f0"
    assert any("orted" in cmd for env, cmd, _ in _procs("sim-b200-1").values())
    rel = _base("sim-b200-0") / "releases" / rid
    # each node by its serving IP: OpenMPI took node 0's for its own node, the agent mapped node 1's to its SSH host
    assert (rel / "hostfile").read_text().splitlines()[-2:] == ["198.19.20.10 slots=8", "198.19.20.11 slots=8"]
    for node in NODES:
        # every node merged the curated profile with the release's overrides
        assert "tensor_parallel_size: 16" in (_base(node) / "releases" / rid / "config.yaml").read_text()
        assert _containers(node) == {f"sim-b200-{rid}": "running"}
    # status: every rank's node, exit 0 while serving
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["healthy"] and doc["system"] == "trtllm-serve" and doc["health"] == 200
    table = run_invoke("status", "--cluster", SIM_CLUSTER).stdout
    assert "0-7" in table.split("sim-b200-0")[1].split("\n")[0] and "8-15" in table.split("sim-b200-1")[1].split("\n")[0]
    # the live view's snapshot: both nodes, trtllm-serve's /metrics read
    assert top_once(SIM_CLUSTER, NODES)["system"] == "trtllm-serve"


def test_killing_one_rank_makes_the_watcher_restart_the_world(faults):
    # rank 0 waits 8 s after every rank joined: a rank is killed in that window
    faults("sim-b200-0", slow_rank0_s=8)
    before = _ledger()[-1]["release"] if (_base("sim-b200-0") / "ledger.jsonl").exists() else None
    p = subprocess.Popen(INVOKE + ["deploy", "--cluster", SIM_CLUSTER, ], cwd=REPO,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL, env=tool_env())
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and len(_ranks("sim-b200-1", not_of=before)) < 8:
            time.sleep(0.2)
        ranks = _ranks("sim-b200-1", not_of=before)
        assert len(ranks) == 8, "the world never formed"
        os.kill(ranks[13], signal.SIGKILL)
        out, _ = p.communicate(timeout=300)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, out
    # which line names the death first is a race between mpirun and the ranks
    # that lose their peer: either way the whole world is restarted
    assert "restarting the whole group (2 containers)" in out, out
    assert re.search(r"world: sim-b200-0 \S+ exited \(attempt 1\): (a rank was killed|NCCL error between ranks|a rank exited)", out), out
    rid = _ledger()[-1]["release"]
    assert _ledger()[-1]["result"] == "good"
    # the first world's output is kept, with mpirun's own words
    kept = (_base("sim-b200-0") / "releases" / rid / "logs" / f"sim-b200-{rid}.attempt-1.log").read_text()
    assert re.search(r"mpirun noticed that process rank \d+|mpirun detected that one or more processes exited|lost rank", kept), kept[-2000:]
    assert sorted(_ranks("sim-b200-1")) == list(range(8, 16))


@pytest.mark.slow
def test_a_rank_that_crashes_once_is_retried_and_one_that_always_crashes_fails_with_logs(faults, tmp_path):
    faults("sim-b200-1", crash_starts=1)
    res = _deploy()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "CUDA out of memory on a rank" in res.stdout and "restarting the whole group" in res.stdout

    faults("sim-b200-1", crash_starts=10)
    res = _deploy("--skip-prepare", "--no-rollback", env={"LLMDEPLOY_LOG_DIR": str(tmp_path)})
    assert res.returncode == 1
    assert "deploy failed on sim-b200-0: world exited 3 times; last reason: CUDA out of memory on a rank" in res.stdout
    rid = _ledger()[-1]["release"]
    assert _ledger()[-1]["result"] == "failed"
    bundle = tmp_path / SIM_CLUSTER / rid
    assert "CUDA out of memory" in (bundle / "sim-b200-0" / "container.log").read_text()
    assert (bundle / "sim-b200-1" / "container.log").exists() and (bundle / "sim-b200-0" / "nvidia-smi.txt").exists()
    assert sorted(p.name for p in (bundle / "sim-b200-0" / "release").glob("*.attempt-*.log")) == [
        f"sim-b200-{rid}.attempt-1.log", f"sim-b200-{rid}.attempt-2.log"]
    assert all(_containers(n) == {} for n in NODES)


@pytest.mark.slow
def test_restart_rollback_and_stop(faults, tmp_path):
    res = _deploy()
    assert res.returncode == 0, res.stdout + res.stderr
    a = _ledger()[-1]["release"]
    inv = tmp_path / "inventory"
    inv.mkdir()
    text = (REPO / "inventory" / "sim_b200.py").read_text()
    assert 'trtllm_qwen38_fp8("qwen3.8-low-latency.yaml", ' in text
    (inv / "sim_b200.py").write_text(text.replace('trtllm_qwen38_fp8("qwen3.8-low-latency.yaml", ',
                                                  'trtllm_qwen38_fp8("qwen3.8-low-latency.yaml", overrides={"max_batch_size": 4}, '))
    res = _deploy("--skip-prepare", env={"LLMDEPLOY_INVENTORY": str(inv)})
    assert res.returncode == 0, res.stdout + res.stderr
    b = _ledger()[-1]["release"]
    assert a != b and yaml.safe_load((_base("sim-b200-1") / "releases" / b / "config.yaml").read_text())["max_batch_size"] == 4

    # a rank killed after healthy: status says so; restart of that node's ranks restarts the world
    os.kill(_ranks("sim-b200-1")[9], signal.SIGKILL)
    end = time.monotonic() + 30
    while time.monotonic() < end and _containers("sim-b200-0").get(f"sim-b200-{b}") == "running":
        time.sleep(0.2)
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and not doc["healthy"] and doc["nodes"]["sim-b200-0"]["state"].startswith("exited")
    res = run_invoke("restart", "--cluster", SIM_CLUSTER, "--host", "sim-b200-1", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0

    # rollback to A from its own files, in the same order
    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{b} -> {a}" in res.stdout and f"serving, release {a}, healthy" in res.stdout
    for node in NODES:
        assert _containers(node) == {f"sim-b200-{a}": "running"}
        assert (_base(node) / "current").readlink().name == a
    assert yaml.safe_load((_base("sim-b200-1") / "releases" / a / "config.yaml").read_text())["max_batch_size"] == 32  # the curated value

    # stop leaves no process of the release on any node
    res = run_invoke("stop", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0, res.stdout + res.stderr
    for node in NODES:
        assert _containers(node) == {}
        assert _procs(node) == {}, _procs(node)
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 1
