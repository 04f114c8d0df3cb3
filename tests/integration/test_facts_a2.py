"""invoke facts on the simulated 8-node A2 cluster."""

from .conftest import facts_json

SIM_CLUSTER = "sim-a2"


def test_facts_for_all_8_nodes(sim_cluster):
    res, doc = facts_json(sim_cluster)
    assert res.returncode == 0, res.stderr
    assert len(doc["hosts"]) == 8
    for i in range(8):
        f = doc["hosts"][f"sim-a2-{i}"]["facts"]
        nic = "enp61s0f1" if i == 5 else "enp189s0f0"  # node 5 overrides its NIC
        assert f["nic"]["name"] == nic and f["nic"]["ipv4"] == [f"198.19.2.{10 + i}/24"]
        assert len(f["devices"]) == 8 and all(d["ip"] for d in f["devices"])
        assert f["problems"] == []
