"""trtllm-serve on four simulated four-GPU GB200 nodes: one MPI world of 16
ranks, 4 per node, through the launch agent on three remote nodes."""

import json

from llmdeploy.release import parse_ledger
from sim.paths import host_dir
from tests.conftest import run_invoke
from tests.integration.test_deploy_trtllm import _procs

SIM_CLUSTER = "sim-gb200"
NODES = [f"sim-gb200-{i}" for i in range(4)]


def _ranks(node):
    return sorted(int(env["OMPI_COMM_WORLD_RANK"]) for env, cmd, _ in _procs(node, SIM_CLUSTER).values()
                  if "OMPI_COMM_WORLD_RANK" in env and "trtllm-serve" in cmd)


def test_four_nodes_one_world_status_and_stop(sim_cluster):
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    base = host_dir(SIM_CLUSTER, "sim-gb200-0") / "root/var/lib/llmdeploy/sim-gb200"
    rec = parse_ledger((base / "ledger.jsonl").read_text())[-1]
    assert rec["result"] == "good"
    for i, node in enumerate(NODES):
        assert _ranks(node) == list(range(4 * i, 4 * i + 4))
    doc = json.loads(run_invoke("status", "--cluster", SIM_CLUSTER, "--json").stdout)
    assert doc["healthy"] and all(doc["nodes"][n]["state"] == "running" for n in NODES)
    assert (base / "releases" / rec["release"] / "hostfile").read_text().count("slots=4") == 4
    res = run_invoke("stop", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0, res.stdout + res.stderr
    for node in NODES:
        assert _procs(node, SIM_CLUSTER) == {}
