"""verify-comm's pure parts: the ping plan, the hccn_tool and nccl-tests
parsers, the deploy gate."""

import json
import subprocess
import sys

from flows import verify
from llmdeploy.inventory import load_cluster
from roles import comm
from roles.facts import MARK


def _ips(cluster):
    return {n.name: {d: f"10.{d}.0.{i}" for d in range(n.devices)} for i, n in enumerate(cluster.nodes)}


def test_small_clusters_get_the_full_matrix():
    c = load_cluster("a3")
    mode, plan = comm.ping_plan(c, _ips(c), full=False, full_max=2048)
    assert mode == "full"
    assert sum(len(p) for p in plan.values()) == 4 * 3 * 16
    assert (3, "a3-node-2", 3, "10.3.0.2") in plan["a3-node-0"]


def test_large_clusters_are_sampled_covering_every_pair_and_npu_index():
    c = load_cluster("a3")
    nodes = [c.nodes[0].model_copy(update={"name": f"n{i}", "ip": f"192.0.2.{10 + i}", "start_rank": i}) for i in range(32)]
    big = c.model_copy(update={"nodes": nodes})
    mode, plan = comm.ping_plan(big, _ips(big), full=False, full_max=2048)
    assert mode == "sampled"
    pairs = {(a, b) for a, ps in plan.items() for _, b, _, _ in ps}
    assert len(pairs) == 32 * 31  # every ordered node pair
    for a, ps in plan.items():
        assert {d for d, *_ in ps} == set(range(16))  # every NPU index of every node sends
    got = {(b, d) for ps in plan.values() for d, b, _, _ in ps}
    assert got == {(n.name, d) for n in nodes for d in range(16)}  # and every one is pinged
    assert sum(len(p) for p in plan.values()) < 32 * 31 * 16 / 10
    mode, plan = comm.ping_plan(big, _ips(big), full=True, full_max=2048)
    assert mode == "full" and sum(len(p) for p in plan.values()) == 32 * 31 * 16


def test_parse_hccn_tool_answers():
    c = load_cluster("a2")
    n = c.nodes[0]
    sec = lambda name, text, rc=0: f"{MARK} {name}\n{text}\n{MARK}rc {rc}"  # noqa: E731
    parts = [sec("hccn.conf", "address_0=10.0.0.1")]
    for d in range(8):
        parts += [
            sec(f"link {d}", "link status: DOWN" if d == 3 else "link status: UP"),
            sec(f"health {d}", "net health status: Fault" if d == 5 else "net health status: Success"),
            sec(f"netdetect {d}", "netdetect address: 10.0.0.254"),
            sec(f"gateway {d}", "default gateway:10.0.0.254, Iface:eth0"),
            sec(f"lldp {d}", "Port ID TLV\n\tIfname: 400GE1/0/1"),
            sec(f"tls {d}", f"dev_id:{d}, tls switch[{1 if d == 6 else 0}](0:disable, 1:enable), tls preconfigured[1]"),
            sec(f"optical {d}", "present: present"),
            sec(f"npu_ip {d}", "Get ipconf failed, because no ip was preset there!" if d == 7 else f"ipaddr:10.0.{d}.1\nnetmask:255.255.255.0", 1 if d == 7 else 0),
        ]
    p = comm.parse_ascend(c, n, "\n".join(parts))
    assert p["npus"][3]["link"] == (False, "DOWN") and p["npus"][5]["health"] == (False, "Fault")
    assert p["npus"][6]["tls"] == (True, "1") and p["npus"][0]["tls"] == (True, "0")
    assert p["npus"][7]["npu_ip"] == (False, "Get ipconf failed, because no ip was preset there!")
    assert p["ips"] == {d: f"10.0.{d}.1" for d in range(7)} and p["hccn_conf"] == "address_0=10.0.0.1"


def test_parse_pings():
    pings = [(0, "b", 0, "10.0.0.2"), (1, "b", 1, "10.0.1.2"), (2, "c", 2, "10.0.2.3")]
    out = (f"{comm.PING_MARK} 0\ndevice 0 PING 10.0.0.2\n2 packets transmitted, 2 received, 0.00% packet loss\n"
           f"{comm.PING_MARK} 1\ndevice 1 PING 10.0.1.2\n2 packets transmitted, 0 received, 100.00% packet loss\n"
           f"{comm.PING_MARK} 2\n")
    r = comm.parse_pings(out, pings)
    assert [x["ok"] for x in r] == [True, False, False]
    assert r[1]["reason"] == "100.00% loss" and r[2]["reason"] == "no answer"


def test_all_reduce_command_and_parse():
    c = load_cluster("b200")
    cmd = comm.all_reduce_command(c, "-b 8 -e 8G -f 2 -g 1", 300)
    assert cmd.startswith("mpirun --allow-run-as-root -np 16 -H 192.0.2.")
    assert "-x NCCL_SOCKET_IFNAME=" in cmd and "-x NCCL_TESTS_MIN_BW=300" in cmd and cmd.endswith("all_reduce_perf -b 8 -e 8G -f 2 -g 1")
    out = subprocess.run([sys.executable, "-m", "sim.standins", "all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "1"],
                         capture_output=True, text=True, env={"LLMDEPLOY_SIM_STATE": "/nonexistent", "PATH": "/usr/bin:/bin", "LLMDEPLOY_SIM_RANKS": "16"})
    # no node.json here: the stand-in fails like a missing tool; the parser copes
    assert comm.parse_all_reduce(out.stdout)["max_busbw"] is None
    text = ("#       size  count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
            "        1024    256 float sum -1 10.0 0.10 0.19 0 10.0 0.10 0.19 0\n"
            "  8589934592 2147483648 float sum -1 40000 214.7 402.6 0 40000 214.7 402.6 0\n"
            "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 201.395 \n")
    p = comm.parse_all_reduce(text)
    assert p["max_busbw"] == 402.6 and p["avg_busbw"] == 201.395 and p["oob_ok"] and p["wrong_ranks"] == []


def test_deploy_gate():
    c = load_cluster("a3")
    ok = json.dumps({"ok": True, "epoch": 1000, "time": "t0"})
    assert verify.gate(c, ok, False, now=2000) == (True, "communication verified at t0")
    go, said = verify.gate(c, json.dumps({"ok": False, "epoch": 1000, "time": "t0"}), False, now=2000)
    assert not go and "FAILED" in said and "--force" in said
    go, said = verify.gate(c, json.dumps({"ok": False, "epoch": 1000, "time": "t0"}), True, now=2000)
    assert go and "deploying anyway (--force)" in said
    go, said = verify.gate(c, ok, False, now=1000 + 8 * 86400)
    assert not go and "old" in said
    go, said = verify.gate(c, "", False)
    assert go and "not verified" in said
