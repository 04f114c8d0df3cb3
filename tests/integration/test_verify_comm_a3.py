"""invoke verify-comm on the simulated A3 cluster: healthy, then with one
fault of each kind on its own NPU or node, each named exactly and nothing
else; deploy refuses the failed verification unless --force."""

import json
import subprocess

import pytest

from sim import hardware
from sim.paths import host_dir, netns_name
from tests.conftest import run_invoke

SIM_CLUSTER = "sim-a3"


def _verify(*extra):
    res = run_invoke("verify-comm", "--cluster", SIM_CLUSTER, "--json", *extra, timeout=600)
    assert res.stdout.startswith("{"), res.stderr
    return res, json.loads(res.stdout)


def _failures(doc):
    """{(host, check): [failure texts]} of every failed cell."""
    out = {}
    for host, v in doc["nodes"].items():
        for check, c in v["checks"].items():
            if not c["ok"]:
                out[(host, check)] = c["failures"]
    return out


def _state(node):
    return host_dir(SIM_CLUSTER, node) / "root/etc/llmdeploy-sim"


def test_healthy_cluster_passes_with_the_full_matrix(sim_cluster):
    res = run_invoke("verify-comm", "--cluster", SIM_CLUSTER, timeout=600)
    assert res.returncode == 0, res.stdout
    assert "communication healthy" in res.stdout and "192/192 without loss" in res.stdout
    # the same as data, kept on node 0 with its time
    doc = json.loads((host_dir(SIM_CLUSTER, "sim-a3-0") / "root/var/lib/llmdeploy/sim-a3/verify-comm.json").read_text())
    assert doc["ok"] and doc["plan"] == "full" and doc["links"]["planned"] == 4 * 3 * 16 and doc["links"]["failed"] == []
    assert _failures(doc) == {} and doc["time"].endswith("Z")


@pytest.mark.slow
def test_each_fault_is_named_exactly(sim_cluster):
    saved = {n: hardware.load(_state(n)) for n in ("sim-a3-0", "sim-a3-2", "sim-a3-3")}
    ns1, ns0 = netns_name(SIM_CLUSTER, "sim-a3-1"), netns_name(SIM_CLUSTER, "sim-a3-0")
    try:
        # sim-a3-1/npu3: link down (its interface, so its pings break for real)
        subprocess.run(["ip", "-n", ns1, "link", "set", "npu3", "down"], check=True)
        # sim-a3-0/npu5: net health Fault
        hw = hardware.load(_state("sim-a3-0"))
        hw["npus"][5]["net_health"] = "Fault"
        hardware.save(_state("sim-a3-0"), hw)
        # sim-a3-3/npu2: another TLS switch value
        hw = hardware.load(_state("sim-a3-3"))
        hw["npus"][2]["tls"] = 1
        hardware.save(_state("sim-a3-3"), hw)
        # sim-a3-2/npu7: no NPU IP
        hw = hardware.load(_state("sim-a3-2"))
        hw["npus"][7]["ip"] = None
        hardware.save(_state("sim-a3-2"), hw)
        # sim-a3-0/npu9 <-> sim-a3-2/npu9 unreachable (a bad neighbour entry on sim-a3-0)
        ip2 = hardware.npu_ip(9, 2)
        subprocess.run(["ip", "-n", ns0, "neigh", "replace", ip2, "lladdr", "02:00:00:00:00:09", "dev", "npu9", "nud", "permanent"], check=True)
        res, doc = _verify()
    finally:
        subprocess.run(["ip", "-n", ns1, "link", "set", "npu3", "up"], check=True)
        subprocess.run(["ip", "-n", ns0, "neigh", "del", hardware.npu_ip(9, 2), "dev", "npu9"], check=False)
        for n, hw in saved.items():
            hardware.save(_state(n), hw)
    assert res.returncode == 1 and not doc["ok"]
    f = _failures(doc)
    assert f.pop(("sim-a3-1", "link")) == ["npu3: DOWN"]
    assert f.pop(("sim-a3-0", "health")) == ["npu5: Fault"]
    assert f.pop(("sim-a3-3", "tls")) == ["npu2: TLS switch 1, the other NPUs have 0"]
    assert f.pop(("sim-a3-2", "npu_ip")) == ["npu7: Get vnic ip failed, because no ip was preset there!"]
    assert set(f.pop(("sim-a3-2", "pings"))) == {
        "npu9 -> sim-a3-0/npu9: 100.00% loss", "npu3 -> sim-a3-1/npu3: 100.00% loss", "npu7: no NPU IP, not pinged"}
    assert set(f.pop(("sim-a3-1", "pings"))) == {f"npu3 -> sim-a3-{i}/npu3: 100.00% loss" for i in (0, 2, 3)}
    assert set(f.pop(("sim-a3-0", "pings"))) == {"npu3 -> sim-a3-1/npu3: 100.00% loss", "npu9 -> sim-a3-2/npu9: 100.00% loss"}
    assert f.pop(("sim-a3-3", "pings")) == ["npu3 -> sim-a3-1/npu3: 100.00% loss"]
    assert f == {}, f"failures beyond the injected faults: {f}"
    failed_links = {(x["from"], x["npu"], x["to"]) for x in doc["links"]["failed"]}
    assert ("sim-a3-0", 9, "sim-a3-2") in failed_links and ("sim-a3-2", 9, "sim-a3-0") in failed_links
    table = run_invoke("deploy", "--cluster", SIM_CLUSTER, "--check").stdout  # check mode never reads nodes
    assert "check mode" in table
    # deploy refuses the failed verification, before touching anything
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER)
    assert res.returncode == 1 and "deploy refused: the last verify-comm" in res.stderr and "FAILED" in res.stderr
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, "--force", timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "FAILED: deploying anyway (--force)" in res.stdout
