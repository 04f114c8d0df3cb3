"""verify-comm's host network check (every platform): the per-node ping
script, ping's real outputs read back, the host_net cells and pairs, and the
flow with a stand-in runner that runs the real script on this machine's
loopback."""

import shutil
import subprocess

import pytest
from rich.console import Console

from flows import verify
from llmdeploy.inventory import load_cluster
from llmdeploy.runner import FAILED, OK, SKIPPED, HostResult
from roles import comm
from flows.binding import bind

M = comm.PING_MARK

# ping's own words (iputils 20221126, captured on loopback, a veth pair and a bridge)
OK_OUT = """PING 198.19.3.12 (198.19.3.12) from 198.19.3.10 enp189s0f0: 56(84) bytes of data.
64 bytes from 198.19.3.12: icmp_seq=1 ttl=64 time=0.154 ms
64 bytes from 198.19.3.12: icmp_seq=2 ttl=64 time=0.080 ms
64 bytes from 198.19.3.12: icmp_seq=3 ttl=64 time=0.076 ms

--- 198.19.3.12 ping statistics ---
3 packets transmitted, 3 received, 0% packet loss, time 405ms
rtt min/avg/max/mdev = 0.076/0.103/0.154/0.035 ms"""
DF_OK = """PING 198.19.3.12 (198.19.3.12) from 198.19.3.10 enp189s0f0: 8972(9000) bytes of data.
8980 bytes from 198.19.3.12: icmp_seq=1 ttl=64 time=0.049 ms
8980 bytes from 198.19.3.12: icmp_seq=2 ttl=64 time=0.082 ms
8980 bytes from 198.19.3.12: icmp_seq=3 ttl=64 time=0.090 ms

--- 198.19.3.12 ping statistics ---
3 packets transmitted, 3 received, 0% packet loss, time 404ms
rtt min/avg/max/mdev = 0.049/0.073/0.090/0.017 ms"""
# the peer's side of the path at MTU 1500: the big packets vanish
DF_LOST = """PING 198.19.3.12 (198.19.3.12) from 198.19.3.10 enp189s0f0: 8972(9000) bytes of data.

--- 198.19.3.12 ping statistics ---
3 packets transmitted, 0 received, 100% packet loss, time 408ms
"""
# this host's own side of the path at 1500 (veth peer): the kernel drops them on send
DF_NOBUFS = """PING 198.19.3.10 (198.19.3.10) from 198.19.3.12 enp189s0f0: 8972(9000) bytes of data.
ping: sendmsg: No buffer space available
ping: sendmsg: No buffer space available
ping: sendmsg: No buffer space available

--- 198.19.3.10 ping statistics ---
3 packets transmitted, 0 received, 100% packet loss, time 4220ms
"""
# the NIC's MTU is smaller than the packet
DF_TOO_LONG = """PING 198.19.3.12 (198.19.3.12) from 198.19.3.10 enp189s0f0: 8972(9000) bytes of data.
ping: local error: message too long, mtu=1500
ping: local error: message too long, mtu=1500
ping: local error: message too long, mtu=1500

--- 198.19.3.12 ping statistics ---
3 packets transmitted, 0 received, +3 errors, 100% packet loss, time 407ms
"""
# older iputils (20190709) for the same
DF_TOO_LONG_OLD = """PING 198.19.3.12 (198.19.3.12) from 198.19.3.10 enp189s0f0: 8972(9000) bytes of data.
ping: sendmsg: Message too long
ping: sendmsg: Message too long
ping: sendmsg: Message too long

--- 198.19.3.12 ping statistics ---
3 packets transmitted, 0 received, +3 errors, 100% packet loss, time 2041ms
"""
LOST = """PING 198.19.3.12 (198.19.3.12) from 198.19.3.10 enp189s0f0: 56(84) bytes of data.

--- 198.19.3.12 ping statistics ---
3 packets transmitted, 0 received, 100% packet loss, time 204ms
"""
PARTIAL = """PING 198.19.3.12 (198.19.3.12) from 198.19.3.10 enp189s0f0: 56(84) bytes of data.
64 bytes from 198.19.3.12: icmp_seq=1 ttl=64 time=0.154 ms

--- 198.19.3.12 ping statistics ---
3 packets transmitted, 1 received, 66.6667% packet loss, time 405ms
rtt min/avg/max/mdev = 0.154/0.154/0.154/0.000 ms"""
HOST_UNREACHABLE = """PING 198.19.3.50 (198.19.3.50) from 198.19.3.10 enp189s0f0: 56(84) bytes of data.
From 198.19.3.10 icmp_seq=1 Destination Host Unreachable
From 198.19.3.10 icmp_seq=2 Destination Host Unreachable
From 198.19.3.10 icmp_seq=3 Destination Host Unreachable

--- 198.19.3.50 ping statistics ---
3 packets transmitted, 0 received, +3 errors, 100% packet loss, time 2046ms
"""
NO_DEVICE = "ping: SO_BINDTODEVICE enp189s0f0: No such device"
UNREACHABLE = "ping: connect: Network is unreachable"
NO_ADDRESS = "ping: bind: Cannot assign requested address"


def _sec(name, text):
    return f"\n{M} {name}\n{text}"


def _nic(state="up", mtu="9000", extra=""):
    return _sec("nic", f"operstate {state}\nmtu {mtu}" + (f"\n{extra}" if extra else ""))


def test_the_script_pings_every_other_node_from_the_nic_plain_then_full_mtu():
    c = load_cluster("sim-a3")
    n = c.nodes[0]
    s = comm.host_ping_script(c, n)
    assert s == comm.host_ping_script(c, n)  # pure
    assert "nic=enp189s0f0" in s and 'cat "/sys/class/net/$nic/mtu"' in s and 'cat "/sys/class/net/$nic/operstate"' in s
    assert 'ping -n -c 3 -i 0.2 -W 2 -I "$nic" "$1"' in s
    assert 'ping -n -c 3 -i 0.2 -W 2 -M do -s "$size" -I "$nic" "$1"' in s and "size=$(( ${mtu:-28} - 28 ))" in s
    jobs = [ln for ln in s.splitlines() if ln.startswith("( { hp ")]
    assert jobs == [f'( {{ hp 198.19.3.1{i} "$t/{k}.df" ; }} > "$t/{k}" 2>&1 ) &' for k, i in enumerate((1, 2, 3))]
    assert "198.19.3.10" not in s  # not itself
    assert comm.host_ping_plan(c, c.nodes[2]) == [("sim-a3-0", "198.19.3.10"), ("sim-a3-1", "198.19.3.11"), ("sim-a3-3", "198.19.3.13")]
    # one round trip, pings in bounded parallel lanes: 31 peers in 8 lanes
    big = c.model_copy(update={"nodes": [c.nodes[0].model_copy(update={"name": f"n{i}", "ip": f"198.19.3.{10 + i}"}) for i in range(32)]})
    s = comm.host_ping_script(big, big.nodes[0])
    assert s.count(" ) &\n") == 8 and s.count("hp 198.19.3.") == 31 and s.count("\nwait\n") == 1
    if shutil.which("sh"):
        assert subprocess.run(["sh", "-n", "-c", s]).returncode == 0
    # one node: nothing to ping
    one = c.model_copy(update={"nodes": c.nodes[:1]})
    assert comm.host_ping_script(one, one.nodes[0]) is None


def test_nothing_unvalidated_reaches_the_shell():
    c = load_cluster("sim-a3")
    evil = c.nodes[0].model_copy(update={"nic": "eth0;reboot"})  # model_copy skips validation
    with pytest.raises(ValueError, match="not an interface name"):
        comm.host_ping_script(c, evil)
    # IPs come from the inventory (IPv4Address): printed as such, quoted all the same
    assert all(ip == str(n.ip) for n, (_, ip) in zip(c.nodes[1:], comm.host_ping_plan(c, c.nodes[0])))


@pytest.mark.parametrize("text, ok, reason, replies", [
    (OK_OUT, True, "ok", 3),
    (DF_OK, True, "ok", 3),
    (LOST, False, "no reply", 0),
    (DF_LOST, False, "no reply", 0),
    (DF_NOBUFS, False, "no reply (sendmsg: no buffer space available)", 0),
    (DF_TOO_LONG, False, "message too long, mtu=1500", 0),
    (DF_TOO_LONG_OLD, False, "message too long", 0),
    (PARTIAL, False, "66.6667% loss (1/3 replies)", 1),
    (HOST_UNREACHABLE, False, "no reply (destination host unreachable)", 0),
    (NO_DEVICE, False, "no such device", 0),
    ("ping: unknown iface enp189s0f0", False, "no such device", 0),
    (UNREACHABLE, False, "network is unreachable", 0),
    (NO_ADDRESS, False, "cannot assign requested address", 0),
    ("From 10.0.0.1 icmp_seq=1 Frag needed and DF set (mtu = 1500)\n\n--- x ping statistics ---\n"
     "3 packets transmitted, 0 received, +3 errors, 100% packet loss, time 2003ms", False, "fragmentation needed, mtu=1500", 0),
    ("sh: 1: ping: not found", False, "ping not found", 0),
    ("PING 198.19.3.12 (198.19.3.12)\nsomething else entirely", False, "unexpected ping output: something else entirely", 0),
    ("", False, "no answer", 0),
])
def test_ping_verdict_reads_pings_own_words(text, ok, reason, replies):
    assert comm.ping_verdict(text) == (ok, reason, replies)


def test_parse_healthy_and_broken_pairs():
    c = load_cluster("sim-a3")
    n = c.nodes[0]
    out = (_sec("0", OK_OUT) + _sec("0.df", DF_OK) + _sec("1", OK_OUT) + _sec("1.df", DF_LOST)
           + _sec("2", LOST) + _nic())
    p = comm.parse_host_pings(c, n, out)
    assert p["nic"] == "enp189s0f0" and p["state"] == "up" and p["mtu"] == 9000 and p["problems"] == []
    a, b, d = p["pairs"]
    assert a == {"from": "sim-a3-0", "nic": "enp189s0f0", "to": "sim-a3-1", "ip": "198.19.3.11", "mtu": 9000,
                 "reply": True, "full_mtu": True, "ok": True, "reason": "ok", "raw": ""}
    assert not b["ok"] and b["reply"] and b["full_mtu"] is False
    assert b["reason"] == "full-MTU (9000) DF ping fails: no reply" and b["raw"] == DF_LOST.strip()
    assert not d["ok"] and not d["reply"] and d["full_mtu"] is None and d["reason"] == "no reply" and d["raw"] == LOST.strip()
    assert comm.pair_name(b) == "sim-a3-0 enp189s0f0 -> sim-a3-2 198.19.3.12"
    # the full-MTU ping said "message too long"
    p = comm.parse_host_pings(c, n, _sec("0", OK_OUT) + _sec("0.df", DF_TOO_LONG) + _nic())
    assert p["pairs"][0]["reason"] == "full-MTU (9000) DF ping fails: message too long, mtu=1500"


def test_parse_a_nic_that_is_down_or_missing_and_malformed_output():
    c = load_cluster("sim-a3")
    n = c.nodes[1]
    down = "".join(_sec(str(k), UNREACHABLE) for k in range(3)) + _nic("down")
    p = comm.parse_host_pings(c, n, down)
    assert p["problems"] == ["enp189s0f0 is down"]
    assert [x["reason"] for x in p["pairs"]] == ["network is unreachable (enp189s0f0 is down)"] * 3
    assert [x["to"] for x in p["pairs"]] == ["sim-a3-0", "sim-a3-2", "sim-a3-3"]
    missing = "".join(_sec(str(k), NO_DEVICE) for k in range(3)) + _nic("missing", "unknown")
    p = comm.parse_host_pings(c, n, missing)
    assert p["problems"] == ["enp189s0f0 missing (no such device)"] and p["mtu"] is None
    assert p["pairs"][0]["reason"] == "no such device (enp189s0f0 missing)" and p["pairs"][0]["raw"] == NO_DEVICE
    # garbage keeps its raw text; a pair without output is "no answer"; a reply
    # but no full-MTU output (the MTU could not be read) says so
    p = comm.parse_host_pings(c, n, _sec("0", "ping: weird\nnothing like ping") + _sec("1", OK_OUT) + _nic("up", "unknown"))
    x, y, z = p["pairs"]
    assert not x["ok"] and x["reason"] == "unexpected ping output: nothing like ping" and x["raw"] == "ping: weird\nnothing like ping"
    assert y["reason"] == "full-MTU (?) DF ping fails: not run: the MTU of enp189s0f0 could not be read"
    assert z["reason"] == "no answer" and z["raw"] == ""
    # no ping at all on the host
    p = comm.parse_host_pings(c, n, _sec("0", "sh: 1: ping: not found") + _nic(extra="ping missing"))
    assert p["problems"] == ["ping is not installed (iputils-ping)"] and p["pairs"][0]["reason"] == "ping not found"
    # nothing came back
    p = comm.parse_host_pings(c, n, "", "mktemp: failed to create directory via template")
    assert p["problems"] == ["the host network script gave no answer: mktemp: failed to create directory via template"]


def test_host_net_cells_and_pairs():
    c = load_cluster("sim-a3")
    healthy = lambda k: _sec(str(k), OK_OUT) + _sec(f"{k}.df", DF_OK)  # noqa: E731
    answers = {}
    for n in c.nodes[:3]:
        answers[n.name] = comm.parse_host_pings(c, n, "".join(healthy(k) for k in range(3)) + _nic())
    # sim-a3-1: MTU 1500 configured, and its big packets go nowhere
    answers["sim-a3-1"] = comm.parse_host_pings(c, c.nodes[1], healthy(0) + _sec("1", OK_OUT) + _sec("1.df", DF_TOO_LONG) + healthy(2) + _nic(mtu="1500"))
    # sim-a3-3's script timed out
    answers["sim-a3-3"] = "the ping script failed: command timed out after 120s"
    cells, pairs = comm.host_net_report(c, answers)
    assert cells["sim-a3-0"] == {"ok": True, "summary": "3/3 (MTU 9000)", "failures": []}
    assert cells["sim-a3-1"] == {"ok": False, "summary": "2/3 (MTU 1500)", "failures": [
        "MTU 1500 on enp189s0f0, the other nodes have 9000",
        "enp189s0f0 -> sim-a3-2 198.19.3.12: full-MTU (1500) DF ping fails: message too long, mtu=1500"]}
    assert cells["sim-a3-3"]["summary"] == "0/3" and not cells["sim-a3-3"]["ok"]
    assert cells["sim-a3-3"]["failures"][0] == "enp189s0f0 -> sim-a3-0 198.19.3.10: the ping script failed: command timed out after 120s"
    assert len(pairs) == 12 and sum(not x["ok"] for x in pairs) == 4
    # a tie: both are told
    two = c.model_copy(update={"nodes": c.nodes[:2]})
    cells, _ = comm.host_net_report(two, {"sim-a3-0": comm.parse_host_pings(two, two.nodes[0], healthy(0) + _nic(mtu="9000")),
                                          "sim-a3-1": comm.parse_host_pings(two, two.nodes[1], healthy(0) + _nic(mtu="1500"))})
    assert cells["sim-a3-0"]["failures"] == ["MTU 9000 on enp189s0f0, the other nodes have 1500"]
    assert cells["sim-a3-1"]["failures"] == ["MTU 1500 on enp189s0f0, the other nodes have 9000"]
    one = c.model_copy(update={"nodes": c.nodes[:1]})
    cells, pairs = comm.host_net_report(one, {"sim-a3-0": {"nic": "enp189s0f0", "state": "", "mtu": None, "problems": [], "pairs": []}})
    assert cells == {"sim-a3-0": {"ok": True, "summary": "no peers", "failures": []}} and pairs == []


def test_npu_pings_still_run_through_the_shared_lanes(tmp_path):
    """The NPU ping script and the host one share lanes_script/split_marked: run it with a stand-in hccn_tool."""
    c = load_cluster("a3")
    tool = tmp_path / "hccn_tool"
    tool.write_text('#!/bin/sh\n[ "$6" = 10.0.1.2 ] && { echo "2 packets transmitted, 0 received, 100.00% packet loss"; exit 0; }\n'
                    'printf "device %s PING %s\\n2 packets transmitted, 2 received, 0.00%% packet loss" "$2" "$6"\n')
    tool.chmod(0o755)
    pings = [(0, "b", 0, "10.0.0.2"), (1, "b", 1, "10.0.1.2"), (5, "c", 5, "10.0.5.3")]
    s = comm.ping_script(bind(c), pings)
    out = subprocess.run(["sh", "-c", s], capture_output=True, text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).stdout
    r = comm.parse_pings(out, pings)
    assert [(x["ok"], x["reason"]) for x in r] == [(True, "0.00% loss"), (False, "100.00% loss"), (True, "0.00% loss")]


def _loopback(cluster, n=3, nic="lo"):
    nodes = [cluster.nodes[0].model_copy(update={"name": f"lo-{i}", "ip": f"127.0.0.{i + 1}", "nic": nic, "start_rank": i}) for i in range(n)]
    return cluster.model_copy(update={"nodes": nodes, "name": "lo"})


def _ping_usable():
    if not shutil.which("ping"):
        return False
    r = subprocess.run(["ping", "-n", "-c", "1", "-W", "1", "-I", "lo", "127.0.0.1"], capture_output=True, text=True)
    return r.returncode == 0


class LocalRunner:
    """Runs each node's script with sh on this machine (every "node" is this loopback)."""

    def __init__(self, down=()):
        self.down = set(down)

    def run(self, step, nodes):
        out = {}
        for n in nodes:
            if n.name in self.down:
                out[n.name] = HostResult(n.name, FAILED, msg="connection lost: EOF")
                continue
            script = step.build(n)
            if script is None:
                out[n.name] = HostResult(n.name, SKIPPED)
                continue
            r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=step.timeout)
            out[n.name] = HostResult(n.name, OK, stdout=r.stdout, stderr=r.stderr, exit_code=r.returncode)
        return out


@pytest.mark.skipif(not _ping_usable(), reason="ping on loopback is not allowed here")
def test_the_real_script_on_loopback_passes_and_reports():
    """Three "nodes" on 127.0.0.1-3 with NIC lo: real pings, real full-MTU (65507 bytes) DF pings."""
    c = _loopback(load_cluster("sim-a3"))
    nodes = {n.name: {"reachable": True, "checks": {}} for n in c.nodes}
    nodes["lo-2"] = {"reachable": False, "error": "connection refused", "checks": {}}
    host_links = verify.host_network(c, LocalRunner(), nodes)
    assert host_links == {"planned": 4, "failed": []}
    assert nodes["lo-0"]["checks"]["host_net"] == {"ok": True, "summary": "2/2 (MTU 65536)", "failures": []}
    assert nodes["lo-2"]["checks"] == {}  # unreachable over SSH: said on its row, not pinged from
    # a NIC that is not there: named on its node, every pair of it fails, no crash
    c = _loopback(load_cluster("sim-a3"), nic="nosuchnic0")
    nodes = {n.name: {"reachable": True, "checks": {}} for n in c.nodes}
    host_links = verify.host_network(c, LocalRunner(down={"lo-1"}), nodes)
    cell = nodes["lo-0"]["checks"]["host_net"]
    assert not cell["ok"] and cell["failures"][0] == "nosuchnic0 missing (no such device)"
    assert "nosuchnic0 -> lo-1 127.0.0.2: no such device (nosuchnic0 missing)" in cell["failures"]
    assert nodes["lo-1"]["checks"]["host_net"]["failures"][0] == "nosuchnic0 -> lo-0 127.0.0.1: the ping script failed: connection lost: EOF"
    assert host_links["planned"] == 6 and len(host_links["failed"]) == 6
    assert "SO_BINDTODEVICE nosuchnic0: No such device" in host_links["failed"][0]["raw"]


def test_the_table_and_json_carry_the_host_network():
    c = load_cluster("sim-a3")
    bad = {"from": "sim-a3-0", "nic": "enp189s0f0", "to": "sim-a3-2", "ip": "198.19.3.12", "mtu": 9000, "reply": True, "full_mtu": False,
           "ok": False, "reason": "full-MTU (9000) DF ping fails: no reply", "raw": DF_LOST}
    cell = {"ok": False, "summary": "2/3 (MTU 9000)", "failures": ["enp189s0f0 -> sim-a3-2 198.19.3.12: full-MTU (9000) DF ping fails: no reply"]}
    doc = {"cluster": "sim-a3", "ok": False, "plan": "full", "links": {"planned": 0, "failed": []}, "host_links": {"planned": 12, "failed": [bad]},
           "nodes": {"sim-a3-0": {"reachable": True, "checks": {"host_net": cell}},
                     "sim-a3-1": {"reachable": False, "error": "connection timed out", "checks": {}}}}
    con = Console(record=True, width=250)
    verify._print(con, c, doc)
    text = con.export_text()
    assert "host_net" in text and "2/3 (MTU 9000)" in text and "connection timed out" in text
    assert "host network (serving NIC, ping + full-MTU don't-fragment ping): 11/12 pairs pass" in text
    assert "sim-a3-0 enp189s0f0 -> sim-a3-2 198.19.3.12: full-MTU (9000) DF ping fails: no reply" in text
    assert "communication FAILED" in text


@pytest.mark.parametrize("flaky,ok", [("once", True), ("always", False), ("dead", False)])
def test_a_partial_loss_is_tried_once_more_a_dead_pair_is_not(tmp_path, flaky, ok):
    """Many nodes pinging at once can drop a packet: a pair that lost some
    replies is pinged once more (plain and full-MTU); a pair with no reply is not."""
    c = _loopback(load_cluster("sim-a3"), n=2)
    calls = tmp_path / "calls"
    tool = tmp_path / "ping"
    tool.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {calls}\n'
        f'n=$(grep -c . {calls})\n'
        f'case {flaky} in\n'
        '  dead) echo "3 packets transmitted, 0 received, 100% packet loss"; exit 1;;\n'
        '  once) [ "$n" -eq 1 ] && { echo "3 packets transmitted, 2 received, 33.3333% packet loss"; exit 0; };;\n'
        '  always) echo "3 packets transmitted, 2 received, 33.3333% packet loss"; exit 0;;\n'
        "esac\n"
        'echo "3 packets transmitted, 3 received, 0% packet loss"\n'
    )
    tool.chmod(0o755)
    script = comm.host_ping_script(c, c.nodes[0])
    out = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env={"PATH": f"{tmp_path}:/usr/bin:/bin"}).stdout
    pairs = comm.parse_host_pings(c, c.nodes[0], out)["pairs"]
    assert [p["ok"] for p in pairs] == [ok], pairs
    tries = calls.read_text().splitlines()
    assert len(tries) == {"once": 3, "always": 4, "dead": 1}[flaky], tries  # plain (twice when flaky), then full-MTU
