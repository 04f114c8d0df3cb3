"""invoke verify-comm checks the host network that HCCL/Gloo/NCCL bootstrap
over (the serving NIC) between every pair of nodes, on the simulated A3
cluster: healthy; one node's path MTU broken below its NIC (the host-side
veth at 1500, the NIC still 9000); one node's NIC down; one node unreachable
over SSH. Each is named by its pairs, fails the run (exit 1, the report on
node 0 says so) and is undone. Then a simulated NVIDIA pair has the same
rows, passing.

Needs root (network namespaces); brings up sim-a3, then sim-b200 (one after
the other: class-scoped fixtures).
"""

import json
import re
import subprocess

from sim.paths import host_dir, netns_name, short_id
from tests.conftest import run_invoke

NIC = "enp189s0f0"  # inventory/sim_a3.py
A3 = ["sim-a3-0", "sim-a3-1", "sim-a3-2", "sim-a3-3"]
IP = {h: f"198.19.3.1{i}" for i, h in enumerate(A3)}


def _verify(cluster, *extra, timeout=600):
    res = run_invoke("verify-comm", "--cluster", cluster, "--json", *extra, timeout=timeout)
    assert res.stdout.startswith("{"), res.stderr
    return res, json.loads(res.stdout)


def _failures(doc):
    """{(host, check): [failure texts]} of every failed cell."""
    return {(h, k): c["failures"] for h, v in doc["nodes"].items() for k, c in v["checks"].items() if not c["ok"]}


def _saved(cluster):
    """The report verify-comm keeps on node 0 (what deploy's gate reads)."""
    return json.loads((host_dir(cluster, f"{cluster}-0") / f"root/var/lib/llmdeploy/{cluster}/verify-comm.json").read_text())


def _ip(*args):
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def _host_peer(cluster, node, nic):
    """The root-namespace end of ``node``'s NIC veth (sim/cluster.py: the data
    bridge's name + the node's index), found from the NIC's peer ifindex."""
    line = _ip("-n", netns_name(cluster, node), "-o", "link", "show", "dev", nic)
    index = re.search(r"@if(\d+):", line).group(1)
    for ln in _ip("-o", "link", "show").splitlines():
        if ln.split(":")[0].strip() == index:
            name = ln.split(":")[1].strip().split("@")[0]
            assert name.startswith(f"ld{short_id(cluster)}d"), name
            return name
    raise AssertionError(f"no host-side peer of {node}'s {nic} (ifindex {index})")


def _mtu(line):
    return int(re.search(r" mtu (\d+) ", line).group(1))


class TestA3:
    SIM_CLUSTER = "sim-a3"

    def test_healthy_host_network_rows_pass(self, sim_class_cluster):
        res, doc = _verify(self.SIM_CLUSTER)
        assert res.returncode == 0 and doc["ok"], _failures(doc)
        assert doc["host_links"] == {"planned": 12, "failed": []}
        for h in A3:
            assert doc["nodes"][h]["checks"]["host_net"] == {"ok": True, "summary": "3/3 (MTU 9000)", "failures": []}
        # the table for people: a host_net column and the pairs line
        table = run_invoke("verify-comm", "--cluster", self.SIM_CLUSTER, timeout=600)
        assert table.returncode == 0, table.stdout
        assert "host_net" in table.stdout and "3/3 (MTU 9000)" in table.stdout
        assert "host network (serving NIC, ping + full-MTU don't-fragment ping): 12/12 pairs pass" in table.stdout

    def test_a_path_mtu_below_the_nic_is_named_by_its_pairs(self, sim_class_cluster):
        bad = "sim-a3-2"
        ns = netns_name(self.SIM_CLUSTER, bad)
        peer = _host_peer(self.SIM_CLUSTER, bad, NIC)
        assert _mtu(_ip("-o", "link", "show", "dev", peer)) == 9000
        try:
            # the node's own NIC keeps 9000 (its config is right); the path is not
            _ip("link", "set", "dev", peer, "mtu", "1500")
            assert _mtu(_ip("-n", ns, "-o", "link", "show", "dev", NIC)) == 9000
            res, doc = _verify(self.SIM_CLUSTER)
        finally:
            _ip("link", "set", "dev", peer, "mtu", "9000")
        assert res.returncode == 1 and not doc["ok"]
        failed = doc["host_links"]["failed"]
        others = [h for h in A3 if h != bad]
        assert {(x["from"], x["to"]) for x in failed} == {(bad, h) for h in others} | {(h, bad) for h in others}
        for x in failed:
            # small packets pass, full-MTU ones with don't-fragment do not
            assert x["reply"] and x["full_mtu"] is False and x["mtu"] == 9000, x
            assert x["reason"].startswith("full-MTU (9000) DF ping fails: no reply"), x
            assert x["nic"] == NIC and x["ip"] == IP[x["to"]] and x["raw"]
        f = _failures(doc)
        assert set(f) == {(h, "host_net") for h in A3}, f  # nothing else breaks
        assert len(f.pop((bad, "host_net"))) == 3
        for h in others:
            assert f[(h, "host_net")] == [f"{NIC} -> {bad} {IP[bad]}: full-MTU (9000) DF ping fails: no reply"]
        # node 0 keeps the failed verification for deploy's gate
        saved = _saved(self.SIM_CLUSTER)
        assert not saved["ok"] and len(saved["host_links"]["failed"]) == 6

    def test_a_nic_down_is_named_on_its_node_and_by_its_pairs(self, sim_class_cluster):
        bad = "sim-a3-1"
        ns = netns_name(self.SIM_CLUSTER, bad)
        try:
            _ip("-n", ns, "link", "set", "dev", NIC, "down")
            res, doc = _verify(self.SIM_CLUSTER)
        finally:
            _ip("-n", ns, "link", "set", "dev", NIC, "up")
        assert res.returncode == 1 and not doc["ok"]
        others = [h for h in A3 if h != bad]
        failed = doc["host_links"]["failed"]
        assert {(x["from"], x["to"]) for x in failed} == {(bad, h) for h in others} | {(h, bad) for h in others}
        f = _failures(doc)
        assert set(f) == {(h, "host_net") for h in A3}, f
        mine = f[(bad, "host_net")]
        assert mine[0] == f"{NIC} is down"
        assert {ln.split(":")[0] for ln in mine[1:]} == {f"{NIC} -> {h} {IP[h]}" for h in others}
        assert all(ln.endswith(f"({NIC} is down)") for ln in mine[1:]), mine
        for h in others:
            (line,) = f[(h, "host_net")]
            assert line.startswith(f"{NIC} -> {bad} {IP[bad]}: no reply"), line
        assert not _saved(self.SIM_CLUSTER)["ok"]

    def test_a_node_unreachable_over_ssh_is_said_and_its_serving_ip_still_answers(self, sim_class_cluster):
        bad = "sim-a3-3"
        ns = netns_name(self.SIM_CLUSTER, bad)
        try:
            _ip("-n", ns, "link", "set", "dev", "mgmt0", "down")  # SSH only; the serving NIC stays up
            res, doc = _verify(self.SIM_CLUSTER)
        finally:
            _ip("-n", ns, "link", "set", "dev", "mgmt0", "up")
        assert res.returncode == 1 and not doc["ok"]
        assert doc["nodes"][bad]["reachable"] is False and doc["nodes"][bad]["error"] and doc["nodes"][bad]["checks"] == {}
        # the others ping it (and each other): 3 nodes x 3 peers, all pass
        assert doc["host_links"] == {"planned": 9, "failed": []}
        for h in A3[:3]:
            assert doc["nodes"][h]["checks"]["host_net"]["ok"]

    def test_restored_cluster_passes_again(self, sim_class_cluster):
        res, doc = _verify(self.SIM_CLUSTER)
        assert res.returncode == 0 and doc["ok"], _failures(doc)
        assert doc["host_links"] == {"planned": 12, "failed": []} and _saved(self.SIM_CLUSTER)["ok"]


class TestB200:
    SIM_CLUSTER = "sim-b200"

    def test_nvidia_pair_has_passing_host_network_rows(self, sim_class_cluster):
        res, doc = _verify(self.SIM_CLUSTER, timeout=300)
        assert res.returncode == 0 and doc["ok"], _failures(doc)
        assert doc["host_links"] == {"planned": 2, "failed": []}
        for h in ("sim-b200-0", "sim-b200-1"):
            assert doc["nodes"][h]["checks"]["host_net"] == {"ok": True, "summary": "1/1 (MTU 9000)", "failures": []}
