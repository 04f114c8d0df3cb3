"""invoke verify-comm on a simulated B200 pair: GPUs, topology, ibstat, the
NCCL interface, and all_reduce_perf under mpirun against the busbw floor."""

import json

from sim import hardware
from sim.paths import host_dir
from tests.conftest import run_invoke

SIM_CLUSTER = "sim-b200"


def _state(node):
    return host_dir(SIM_CLUSTER, node) / "root/etc/llmdeploy-sim"


def test_b200_pair_passes_then_a_slow_fabric_fails(sim_cluster):
    res = run_invoke("verify-comm", "--cluster", SIM_CLUSTER, "--json", timeout=300)
    doc = json.loads(res.stdout)
    assert res.returncode == 0, doc
    perf = doc["all_reduce"]
    assert perf["ok"] and perf["max_busbw"] > 300 and perf["oob_ok"] and perf["sizes"] == 31
    assert perf["command"].startswith("mpirun --allow-run-as-root -np 16 -H 198.19.20.10:8,198.19.20.11:8")
    for host in ("sim-b200-0", "sim-b200-1"):
        assert all(c["ok"] for c in doc["nodes"][host]["checks"].values())

    saved0 = hardware.load(_state("sim-b200-0"))
    saved1 = hardware.load(_state("sim-b200-1"))
    try:
        hardware.save(_state("sim-b200-0"), dict(saved0, nccl={"busbw": 180.0}))
        hw = json.loads(json.dumps(saved1))
        hw["ib_ports"][5]["state"] = "Down"
        hardware.save(_state("sim-b200-1"), hw)
        res = run_invoke("verify-comm", "--cluster", SIM_CLUSTER, timeout=300)
    finally:
        hardware.save(_state("sim-b200-0"), saved0)
        hardware.save(_state("sim-b200-1"), saved1)
    assert res.returncode == 1
    assert "busbw" in res.stdout and "< floor 300 GB/s (verify.nccl_min_busbw)" in res.stdout
    assert "IB mlx5_5 port 1: State Down" in res.stdout
    assert "communication FAILED" in res.stdout
