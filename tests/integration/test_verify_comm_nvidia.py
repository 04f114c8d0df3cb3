"""invoke verify-comm on a simulated B200 pair: GPUs, topology, ibstat, the
NCCL interface, and all_reduce_perf as one MPI world: Debian's real OpenMPI
mpirun on node 0 reaching node 1 over SSH (the simulator's ssh_config, host
keys checked), 16 ranks of the simulated all_reduce_perf that meet over TCP
on each node's own NCCL interface, the busbw of the slowest node against the
floor."""

import json
import shlex
import subprocess
from contextlib import contextmanager

from llmdeploy.inventory import load_cluster
from roles import comm
from sim import hardware
from sim.paths import cluster_dir, host_dir, netns_name
from tests.conftest import REPO, run_invoke
from flows.binding import bind

SIM_CLUSTER = "sim-b200"


def _state(node):
    return host_dir(SIM_CLUSTER, node) / "root/etc/llmdeploy-sim"


def _ssh(node, command):
    return subprocess.run(["ssh", "-F", str(cluster_dir(SIM_CLUSTER) / "ssh_config"), node, command],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


@contextmanager
def _node_json(node, change):
    """The node's node.json changed by ``change`` (the stand-ins read it at once), then restored."""
    saved = hardware.load(_state(node))
    hw = json.loads(json.dumps(saved))
    change(hw)
    hardware.save(_state(node), hw)
    try:
        yield
    finally:
        hardware.save(_state(node), saved)


def _slow_fabric_and_a_dead_ib_port(hw):
    hw["nccl"] = {"busbw": 180.0}
    hw["ib_ports"][5]["state"] = "Down"


def test_b200_pair_passes_under_the_real_mpirun_then_a_slow_node_and_a_dead_port_fail(sim_cluster):
    # the hosts have no mpirun of the simulator's: node 0's is Debian's OpenMPI
    res = _ssh("sim-b200-0", "command -v mpirun && mpirun --version")
    assert res.returncode == 0 and res.stdout.splitlines()[0] == "/usr/bin/mpirun" and "(Open MPI)" in res.stdout, res.stdout + res.stderr

    res = run_invoke("verify-comm", "--cluster", SIM_CLUSTER, "--json", timeout=300)
    doc = json.loads(res.stdout)
    assert res.returncode == 0, doc
    perf = doc["all_reduce"]
    assert perf["ok"] and perf["exit"] == 0 and perf["max_busbw"] > 300 and perf["oob_ok"] and perf["sizes"] == 31, perf
    c = load_cluster(SIM_CLUSTER)
    assert perf["command"] == comm.all_reduce_command(bind(c), c.verify.all_reduce_args)
    words = shlex.split(perf["command"].strip().splitlines()[-1])  # the mpirun line, after the launch agent's
    assert words[:4] == ["mpirun", "--allow-run-as-root", "--bind-to", "none"]
    assert "-H 198.19.20.10:8 -x NCCL_SOCKET_IFNAME=ens1f0" in perf["command"] and "-H 198.19.20.11:8 -x NCCL_SOCKET_IFNAME=ens1f0" in perf["command"]
    for host in ("sim-b200-0", "sim-b200-1"):
        assert all(c["ok"] for c in doc["nodes"][host]["checks"].values())

    # node 1's fabric is slow (its node.json: only node 1's ranks know it) and one of its IB ports is down
    with _node_json("sim-b200-1", _slow_fabric_and_a_dead_ib_port):
        res = run_invoke("verify-comm", "--cluster", SIM_CLUSTER, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "busbw 17" in res.stdout and "< floor 300 GB/s (verify.nccl_min_busbw)" in res.stdout
    assert "IB mlx5_5 port 1: State Down" in res.stdout
    assert "communication FAILED" in res.stdout


def _inventory_with_node1_nic(tmp_path, nic):
    """sim_b200.py with node 1's serving NIC named ``nic`` (the inventory allows per-node NICs)."""
    inv = tmp_path / "inventory"
    inv.mkdir()
    text = (REPO / "inventory" / "sim_b200.py").read_text()
    old = 'nodes=sim_nodes("sim-b200-", 2, "198.19.20.10"),'
    assert old in text
    (inv / "sim_b200.py").write_text(text.replace(old, f'nodes=sim_nodes("sim-b200-", 2, "198.19.20.10", **{{"1": {{"nic": "{nic}"}}}}),'))
    return {"LLMDEPLOY_INVENTORY": str(inv)}


def _rename_nic(node, old, new):
    ns = netns_name(SIM_CLUSTER, node)
    for args in (["link", "set", "dev", old, "down"], ["link", "set", "dev", old, "name", new], ["link", "set", "dev", new, "up"]):
        subprocess.run(["ip", "-n", ns, *args], check=True)


def test_each_nodes_ranks_use_their_own_nodes_nic(sim_cluster, tmp_path):
    """The inventory says node 1's NIC is ens2f0: while node 1 has no such
    interface, its ranks fail as NCCL does and the report names node 1; once
    node 1's NIC is ens2f0, the world forms, node 0's ranks on ens1f0 and
    node 1's on ens2f0."""
    env = _inventory_with_node1_nic(tmp_path, "ens2f0")
    res = run_invoke("verify-comm", "--cluster", SIM_CLUSTER, "--json", env=env, timeout=300)
    doc = json.loads(res.stdout)
    assert res.returncode == 1, doc
    perf = doc["all_reduce"]
    assert not perf["ok"] and perf["max_busbw"] is None and perf["exit"] != 0, perf
    assert "sim-b200-1: NCCL WARN Bootstrap : no socket interface found (NCCL_SOCKET_IFNAME=ens2f0)" in perf["failures"][0], perf
    assert "NIC ens2f0 not found" in " ".join(doc["nodes"]["sim-b200-1"]["checks"]["nccl_if"]["failures"])

    _rename_nic("sim-b200-1", "ens1f0", "ens2f0")
    try:
        res = run_invoke("verify-comm", "--cluster", SIM_CLUSTER, "--json", env=env, timeout=300)
    finally:
        _rename_nic("sim-b200-1", "ens2f0", "ens1f0")
    doc = json.loads(res.stdout)
    assert res.returncode == 0, doc
    perf = doc["all_reduce"]
    assert perf["ok"] and perf["max_busbw"] > 300, perf
    assert "-H 198.19.20.10:8 -x NCCL_SOCKET_IFNAME=ens1f0" in perf["command"] and "-H 198.19.20.11:8 -x NCCL_SOCKET_IFNAME=ens2f0" in perf["command"]
    assert "--mca oob_tcp_if_include ens1f0,ens2f0" in perf["command"]
