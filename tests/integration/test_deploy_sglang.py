"""SGLang multi-node, the fourth serving system, on the simulated H200 pair:
prepare, verify-comm, deploy (one world across both nodes, node rank 0
serving HTTP), status, a lost node ending the world and the whole world
restarted, restart, rollback and stop, all on the same engine as the other
systems. The stand-in (sim/standins/sglang.py) forms the world the way SGLang
does: torch's store at --dist-init-addr on node rank 0, every node within
--dist-timeout, HTTP only when every node has loaded."""

import json
import os
import signal
import time

import pytest

from llmdeploy.release import parse_ledger
from sim import hardware, hostview
from sim.paths import host_dir
from tests.conftest import REPO, run_invoke

SIM_CLUSTER = "sim-h200-sglang"
NODES = ["sim-h200-sglang-0", "sim-h200-sglang-1"]


def _base(node):
    return host_dir(SIM_CLUSTER, node) / "root/var/lib/llmdeploy/sim-h200-sglang"


def _state(node):
    return host_dir(SIM_CLUSTER, node) / "root/etc/llmdeploy-sim"


def _ledger():
    return parse_ledger((_base(NODES[0]) / "ledger.jsonl").read_text())


def _servers(node):
    """{pid: (environment, command line, container)} of the node's SGLang servers."""
    return {pid: p for pid, p in hostview.processes(SIM_CLUSTER, node).items() if p[2] and "sglang.launch_server" in p[1]}


@pytest.fixture
def faults(sim_cluster):
    saved = {n: hardware.load(_state(n)) for n in NODES}

    def set_fault(node, **values):
        hw = hardware.load(_state(node))
        hw["sglang"] = values
        hardware.save(_state(node), hw)
        (_state(node) / "sglang-starts").unlink(missing_ok=True)

    yield set_fault
    for n, hw in saved.items():
        hardware.save(_state(n), hw)
        (_state(n) / "sglang-starts").unlink(missing_ok=True)


def _deploy(*extra, env=None):
    return run_invoke("deploy", "--cluster", SIM_CLUSTER, *extra, env=env, timeout=400)


def test_prepare_and_verify_comm(sim_cluster):
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    # the NVIDIA checks and all_reduce_perf across both nodes: nothing in verify-comm is per serving system
    res = run_invoke("verify-comm", "--cluster", SIM_CLUSTER, "--json", timeout=600)
    doc = json.loads(res.stdout)
    assert res.returncode == 0, doc
    assert doc["all_reduce"]["ok"] and "-H 198.19.40.11:8" in doc["all_reduce"]["command"], doc["all_reduce"]


def test_one_world_across_both_nodes_then_status(faults):
    res = _deploy()
    assert res.returncode == 0, res.stdout + res.stderr
    assert ", healthy" in res.stdout
    rid = _ledger()[-1]["release"]
    assert _ledger()[-1]["result"] == "good"
    for rank, node in enumerate(NODES):
        (env, cmd, name), = _servers(node).values()
        assert name == f"{SIM_CLUSTER}-{rid}"
        # every node its own rank, node 0's serving IP as the store, its own NIC for NCCL and Gloo
        assert f"--node-rank {rank}" in cmd and "--nnodes 2" in cmd and "--dist-init-addr 198.19.40.10:20000" in cmd, cmd
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "ens1f0"
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["healthy"] and doc["system"] == "sglang" and doc["health"] == 200, res.stdout
    meta = json.loads((_base(NODES[1]) / "releases" / rid / "release.json").read_text())
    assert meta["node_rank"] == 1 and meta["system"] == "sglang"


def test_a_lost_node_ends_the_world_and_the_whole_world_is_restarted(faults):
    res = _deploy()
    assert res.returncode == 0, res.stdout + res.stderr
    rid = _ledger()[-1]["release"]
    # the world ends on every node when one node goes: status names it, restart brings the world back
    (pid,) = _servers(NODES[1])
    os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + 30
    while time.monotonic() < end and _servers(NODES[0]):
        time.sleep(0.2)
    assert not _servers(NODES[0]), "node rank 0 kept serving without node 1"
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    assert res.returncode == 1 and not json.loads(res.stdout)["healthy"]
    res = run_invoke("restart", "--cluster", SIM_CLUSTER, "--host", NODES[1], timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0
    assert all(len(_servers(n)) == 1 for n in NODES) and _ledger()[-1]["release"] == rid


def test_a_node_that_crashes_once_restarts_the_world_then_rollback_and_stop(faults, tmp_path):
    faults(NODES[1], crash_starts=1)
    res = _deploy()
    assert res.returncode == 0, res.stdout + res.stderr
    assert "restarting the whole group (2 containers)" in res.stdout and "CUDA out of memory on a node" in res.stdout, res.stdout
    a = _ledger()[-1]["release"]
    inv = tmp_path / "inventory"
    inv.mkdir()
    text = (REPO / "inventory" / "sim_h200_sglang.py").read_text()
    assert "sglang_qwen38_fp8(dist_timeout_s=30, " in text
    (inv / "sim_h200_sglang.py").write_text(text.replace("sglang_qwen38_fp8(dist_timeout_s=30, ", "sglang_qwen38_fp8(dist_timeout_s=30, mem_fraction_static=0.8, "))
    res = _deploy("--skip-prepare", env={"LLMDEPLOY_INVENTORY": str(inv)})
    assert res.returncode == 0, res.stdout + res.stderr
    b = _ledger()[-1]["release"]
    assert a != b and all("--mem-fraction-static 0.8" in p[1] for n in NODES for p in _servers(n).values())

    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{b} -> {a}" in res.stdout and f"serving, release {a}, healthy" in res.stdout
    for node in NODES:
        assert hostview.containers(SIM_CLUSTER, node) == {f"{SIM_CLUSTER}-{a}": "running"}
        assert not any("--mem-fraction-static" in p[1] for p in _servers(node).values())

    res = run_invoke("stop", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0, res.stdout + res.stderr
    for node in NODES:
        assert hostview.containers(SIM_CLUSTER, node) == {}
        assert _servers(node) == {}
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 1
