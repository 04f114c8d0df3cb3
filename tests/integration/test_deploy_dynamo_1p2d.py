"""Dynamo 1P2D on five simulated GB300 nodes: prefill P4-TEP on node 0 with
the control plane and the frontend, two decode D8-B4 workers each one TP8
MPI group across two nodes (the launch agent enters the second node's container)."""

import json

import pytest

from llmdeploy.release import parse_ledger
from sim.paths import host_dir
from tests.integration.conftest import top_once
from tests.conftest import run_invoke
from tests.integration.test_deploy_trtllm import _procs

SIM_CLUSTER = "sim-gb300-1p2d"
NODES = [f"sim-gb300-1p2d-{i}" for i in range(5)]


@pytest.mark.slow
def test_1p2d_decode_groups_span_two_nodes(sim_cluster):
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "(dynamo: etcd -> nats -> frontend -> prefill0 -> decode0 -> decode1)" in res.stdout
    base = host_dir(SIM_CLUSTER, NODES[0]) / "root/var/lib/llmdeploy/sim-gb300-1p2d"
    rid = parse_ledger((base / "ledger.jsonl").read_text())[-1]["release"]
    # decode0: ranks 0-3 on node 1 and 4-7 on node 2, in one MPI world of 8, each in its node's decode0 container
    for node, ranks, worker in ((NODES[1], range(0, 4), "decode0"), (NODES[2], range(4, 8), "decode0"),
                                (NODES[3], range(0, 4), "decode1"), (NODES[4], range(4, 8), "decode1")):
        found = sorted(int(env["OMPI_COMM_WORLD_RANK"]) for env, cmd, name in _procs(node, SIM_CLUSTER).values()
                       if name == f"{SIM_CLUSTER}-{rid}-{worker}" and "OMPI_COMM_WORLD_RANK" in env)
        assert found == list(ranks), (node, found)
        assert all(env.get("OMPI_COMM_WORLD_SIZE") == "8" for env, _, _ in _procs(node, SIM_CLUSTER).values() if "OMPI_COMM_WORLD_RANK" in env)
    assert (base / "releases" / rid / "decode0.hostfile").exists() is False  # decode0's launcher is node 1
    hostfile = host_dir(SIM_CLUSTER, NODES[1]) / f"root/var/lib/llmdeploy/sim-gb300-1p2d/releases/{rid}/decode0.hostfile"
    # each node by its serving IP (inventory/sim_gb300_1p2d.py: 198.19.31.10 + index)
    assert hostfile.read_text().splitlines()[-2:] == ["198.19.31.11 slots=4", "198.19.31.12 slots=4"]
    doc = json.loads(run_invoke("status", "--cluster", SIM_CLUSTER, "--json").stdout)
    assert doc["healthy"]
    assert sorted(u["service"] for n in NODES for u in doc["nodes"][n]["units"].values()) == sorted(
        ["etcd", "nats", "frontend", "prefill0", "decode0", "decode0", "decode1", "decode1"])
    # the live view's snapshot: every node, the frontend's /metrics read
    snap = top_once(SIM_CLUSTER, NODES)
    assert snap["server"]["host"] == NODES[0] and snap["system"] == "dynamo"
    res = run_invoke("stop", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0, res.stdout + res.stderr
    for node in NODES:
        assert _procs(node, SIM_CLUSTER) == {}, node
