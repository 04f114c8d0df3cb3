"""invoke facts on the simulated A3 cluster: 4 real sshd, one namespace each."""

from sim import hostview
from tests.conftest import run_invoke

from .conftest import facts_json

SIM_CLUSTER = "sim-a3"


def test_facts_json_has_every_node_with_its_own_ip_and_nic(sim_cluster):
    res, doc = facts_json(sim_cluster)
    assert res.returncode == 0, res.stderr
    assert doc["ok"] is True and sorted(doc["hosts"]) == [f"sim-a3-{i}" for i in range(4)]
    for i in range(4):
        f = doc["hosts"][f"sim-a3-{i}"]["facts"]
        assert f["hostname"] == f"sim-a3-{i}"  # each host its own UTS namespace
        assert f["nic"]["name"] == "enp189s0f0"
        assert f["nic"]["ipv4"] == [f"198.19.3.{10 + i}/24"]
        assert f["nic"]["up"] and f["nic"]["mtu"] == 9000
        assert len(f["devices"]) == 16 and f["devices_healthy"] == 16
        assert {d["numa"] for d in f["devices"]} == {0, 1, 2, 3}
        assert f["cpus"] == 320 and f["numa_nodes"] == 4 and f["mem_total_gib"] == 1536.0
        # the host's own Docker Engine (Debian's docker.io): what its client says of itself
        client = hostview.docker(SIM_CLUSTER, f"sim-a3-{i}", "version", "--format", "{{.Client.Version}}").stdout.strip()
        assert client and f["container_engine"] == f"docker {client}"
        assert f["model_disk_free_gib"] > 0 and f["model_disk_mount"] == "/root/.cache"
        assert f["problems"] == []
    # NPU addresses differ per node
    ips = {doc["hosts"][h]["facts"]["devices"][0]["ip"] for h in doc["hosts"]}
    assert len(ips) == 4
    # all of it in one remote command per host
    assert doc["round_trips"] == {f"sim-a3-{i}": 1 for i in range(4)}
    assert doc["recap"]["sim-a3-0"] == {"ok": 1, "changed": 0, "failed": 0, "unreachable": 0, "skipped": 0}


def test_table_and_recap_for_people(sim_cluster):
    res = run_invoke("facts", "--cluster", sim_cluster)
    assert res.returncode == 0, res.stderr
    assert "facts: sim-a3" in res.stdout and "RECAP" in res.stdout
    assert "16/16 NPU OK" in res.stdout and "198.19.3.13/24" in res.stdout


def test_limit_narrows_the_hosts(sim_cluster):
    res, doc = facts_json(sim_cluster, "--limit", "sim-a3-1,sim-a3-3")
    assert res.returncode == 0
    assert sorted(doc["hosts"]) == ["sim-a3-1", "sim-a3-3"]


def test_a_sick_npu_is_a_problem_of_that_node_only(sim_cluster):
    from sim import hardware
    from sim.paths import HOST_STATE_DIR, host_dir

    state = host_dir(sim_cluster, "sim-a3-2") / "root" / HOST_STATE_DIR.lstrip("/")
    hw = hardware.load(state)
    saved = [dict(n) for n in hw["npus"]]
    hw["npus"][7]["health"] = "Critical"
    hardware.save(state, hw)
    try:
        res, doc = facts_json(sim_cluster)
    finally:
        hw["npus"] = saved
        hardware.save(state, hw)
    problems = {h: doc["hosts"][h]["facts"]["problems"] for h in doc["hosts"]}
    # named with its node against its platform (prepare and deploy refuse on it), then as before
    assert problems["sim-a3-2"] == ["sim-a3-2 reports 1 of its NPUs not healthy (NPU 7: Critical), platform a3 declares 16 healthy",
                                    "NPU 7 not healthy"]
    assert doc["hosts"]["sim-a3-2"]["facts"]["platform_mismatch"] == problems["sim-a3-2"][:1]
    assert all(p == [] for h, p in problems.items() if h != "sim-a3-2")
