"""invoke prepare on the simulated GB300 Dynamo node: pinned wheels in a
derived image (verified with importlib.metadata inside it), the seed's
numactl -m 0,1 binding on that NUMA layout, the host-memory budget of 3 x
128 GiB host KV cache, InfiniBand ports."""

import json

import pytest

from sim import hardware, hostview
from sim.paths import host_dir
from tests.conftest import run_invoke

SIM_CLUSTER = "sim-gb300-agentic"
NODE = "sim-gb300-0"


def _state():
    return host_dir(SIM_CLUSTER, NODE) / "root/etc/llmdeploy-sim"


def _prepare(*extra):
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--json", *extra)
    assert res.stdout.startswith("{"), res.stderr
    return res, json.loads(res.stdout)


@pytest.fixture
def node_json(sim_cluster):
    saved = hardware.load(_state())
    yield saved
    hardware.save(_state(), saved)


def test_wheels_from_an_unreachable_index_fail_with_pip_message(sim_cluster):
    saved = hostview.unreachable(SIM_CLUSTER, NODE, "pypi.org")
    try:
        res, doc = _prepare("--no-check")
    finally:
        hostview.rewrite(host_dir(SIM_CLUSTER, NODE) / "hosts", saved)
    assert res.returncode == 1
    r = doc["steps"]["wheels"][NODE]
    assert r["status"] == "failed"
    assert "No matching distribution found for ai-dynamo==1.6.0.dev20261010" in r["msg"]
    assert doc["steps"]["communication environment"][NODE]["status"] == "skipped"


def test_prepare_installs_and_verifies_wheels_binds_numa(sim_cluster):
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ai-dynamo==1.6.0.dev20261010, ai-dynamo-runtime==1.6.0.dev20261010" in res.stdout
    root = host_dir(SIM_CLUSTER, NODE) / "root"
    rec = json.loads((root / "var/lib/llmdeploy/sim-gb300-agentic/prepared.json").read_text())
    assert rec["binding"]["prefix"] == "numactl -m 0,1"
    assert rec["image"]["serving_ref"].startswith("llmdeploy/sim-gb300-agentic:1.3.0a0.dev202610151219-wheels-")
    env = (root / "etc/llmdeploy/sim-gb300-agentic.env").read_text()
    for line in ("TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL=1", "DYN_NAMESPACE=qwen35-gb300", "ETCD_ENDPOINTS=http://198.19.30.10:2379"):
        assert line + "\n" in env
    res, doc = _prepare("--no-check")
    assert res.returncode == 0 and doc["changed"] == 0
    assert "384 GiB" not in doc["steps"]["budget"][NODE]["msg"]  # the ok line is short
    assert doc["steps"]["budget"][NODE]["msg"].startswith("ports 2379,2380,4222,8000,8081,8082,8222 free; memory 656/840 GiB")


def test_too_little_memory_names_the_numbers(node_json):
    meminfo = host_dir(SIM_CLUSTER, NODE) / "meminfo"
    saved = meminfo.read_text()
    with open(meminfo, "r+") as f:
        f.write(saved.replace(saved.splitlines()[0], f"MemTotal:       {500 * 1048576} kB"))
        f.truncate()
    try:
        res, doc = _prepare("--no-check")
    finally:
        with open(meminfo, "r+") as f:
            f.write(saved)
            f.truncate()
    assert res.returncode == 1
    assert doc["steps"]["budget"][NODE]["msg"] == (
        "host memory 500 GiB < 656 GiB needed (384 GiB host KV cache (3 ranks x 128 GiB) + "
        "208 GiB weights loading/staging + 64 GiB OS margin)"
    )


def test_ib_port_down_and_slow_are_named(node_json):
    hw = json.loads(json.dumps(node_json))
    hw["ib_ports"][2]["state"] = "Down"
    hw["ib_ports"][2]["phys"] = "Polling"
    hw["ib_ports"][3]["rate"] = 200
    hardware.save(_state(), hw)
    res, doc = _prepare("--no-check")
    assert res.returncode == 1
    assert doc["steps"]["nic"][NODE]["msg"] == (
        "IB mlx5_2 port 1: State Down, Physical state Polling; IB mlx5_3 port 1: Rate 200 (expected 400)"
    )
