"""Bad input, part 2: malformed remote output never crashes a parser (issue 12).

Every parser of what a node prints is fed its real output (the simulator's
stand-ins, which follow the real tools' formats: shared/DOMAIN.md) cut short at
every position, and garbage (hypothesis). It must never raise: the result is a
failure (or a problem) that keeps what the node printed, or a recognisable
prefix of it, so that a person can see it. The runner turning a parser's
exception into "FAILED TypeError: ..." is a safety net, not a pass: these call
the parsers directly, not through the runner.

The flows' own readers (status, the deploy gate, the lock holder) are fed
the same way at the end.
"""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
from functools import cache
from pathlib import Path
from types import SimpleNamespace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import roles.facts as facts
from flows import probes
from llmdeploy.inventory import load_cluster
from llmdeploy.releaseplan import Probe
from llmdeploy.runner import CHANGED, FAILED, OK
from platforms import ascend, nvidia
from roles import comm, containers, image, model, nic, wheels
from sim import hardware
from flows.binding import bind

REPO = Path(__file__).resolve().parents[2]
MARK = facts.MARK
FAST = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

# garbage: any text (hypothesis), and what nodes really print instead of an answer
REAL_GARBAGE = [
    "", "\n", "   ", "\x00\x01\x02", "\x1b[31mERROR\x1b[0m", "Segmentation fault (core dumped)",
    "sh: 1: npu-smi: not found", "dcmi module initialize failed. ret is -8005", "bash: line 1: hccn_tool: command not found",
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", "Error response from daemon: No such object: x",
    "<html><body><h1>502 Bad Gateway</h1></body></html>", "Internal Server Error", "null", "[]", "{}", "{", '{"choices": 5}',
    "²³", "１２３", "٣", "0-99999999999", "9" * 40, "nan", "-1", "..", "1.2.3", "Last login: Mon Jan  1 00:00:00 2026 from 198.51.100.1",
]
garbage = st.one_of(st.sampled_from(REAL_GARBAGE), st.text(max_size=300), st.binary(max_size=200).map(lambda b: b.decode("latin-1")))


def cuts(text: str, step: int = 1) -> list[str]:
    """``text`` cut short at every position (every ``step``-th)."""
    return [text[:i] for i in range(0, len(text), step)]


def shown(msg: str, raw: str) -> bool:
    """Does ``msg`` show ``raw`` (as roles.facts.excerpt quotes it)?"""
    return facts.excerpt(raw) in msg


def held(text: str) -> str:
    """``text`` as a section of the facts output holds it: its lines joined by a newline."""
    return facts.split_sections(section("x", text))["x"][0]


# --- the real outputs, from the stand-ins ------------------------------------------------------------
def _standin(state: Path, tool: str, *args: str, **env: str) -> str:
    full = dict(os.environ, LLMDEPLOY_SIM_STATE=str(state), PYTHONPATH=str(REPO), **env)
    res = subprocess.run([sys.executable, "-m", "sim.standins", tool, *args], capture_output=True, text=True, env=full, timeout=60)
    assert res.returncode == 0, (tool, args, res.stderr)
    return res.stdout


@cache
def good() -> dict:
    """What a healthy simulated A3 and B200 node print, tool by tool."""
    import atexit
    import shutil
    import tempfile

    out: dict = {}
    base = Path(tempfile.mkdtemp(prefix="llmdeploy-malformed-"))
    atexit.register(shutil.rmtree, base, True)
    for name in ("sim-a3", "sim-b200"):
        c = load_cluster(name)
        state = base / name
        state.mkdir()
        hw = hardware.node_hardware(c, 0, c.nodes[0])
        hardware.save(state, hw)
        o = out[name] = {"cluster": c, "node": c.nodes[0], "hw": hw}
        o["lscpu"] = _standin(state, "lscpu", "-e=CPU,NODE")
        o["numactl"] = _standin(state, "numactl", "-H")
        o["meminfo"] = hardware.meminfo(hw)
        if name == "sim-a3":
            o["npusmi"] = _standin(state, "npu-smi", "info")
            o["npusmi_topo"] = _standin(state, "npu-smi", "info", "-t", "topo")
            o["hccn"] = {flag: _standin(state, "hccn_tool", "-i", "0", f"-{flag}", "-g")
                         for flag in ("link", "net_health", "netdetect", "gateway", "lldp", "tls", "optical", "vnic")}
        else:
            o["nvsmi"] = _standin(state, "nvidia-smi", "--query-gpu=index,name,uuid,memory.total,pci.bus_id,ecc.errors.uncorrected.volatile.total",
                                  "--format=csv,noheader,nounits")
            o["nvtopo"] = _standin(state, "nvidia-smi", "topo", "-m")
            o["ibstat"] = _standin(state, "ibstat")
            o["all_reduce"] = _all_reduce_world(c, hw)
    return out


def _all_reduce_world(c, hw: dict) -> str:
    """What the simulated all_reduce_perf's rank 0 prints for a healthy world
    of 16 ranks on the cluster's two nodes (sim/standins/nccl_tests.py; one
    rank alone would move nothing between ranks: busbw 0)."""
    from sim.standins import nccl_tests

    o = nccl_tests.parse_args(["-b", "8", "-e", "8G", "-f", "2", "-g", "1"])
    devices = "".join(nccl_tests.device_lines(r, 1000 + r, c.nodes[r // 8].name, [r % 8], hw["gpus"]) for r in range(16))
    return nccl_tests.header(o) + devices + nccl_tests.result(o, 16, 370.0, [0] * 16, None)[0]


def section(name: str, text: str, rc: int | str = 0) -> str:
    """One section as the facts script prints it (``echo`` mark, output, ``echo`` rc)."""
    return f"{MARK} {name}\n{text}{'' if text.endswith(chr(10)) or not text else chr(10)}{MARK}rc {rc}\n"


def facts_sections(name: str) -> dict[str, tuple[str, int]]:
    """Every section of a healthy node's facts output, in the script's order."""
    o = good()[name]
    n = o["node"]
    s = {
        "hostname": (n.name, 0),
        "os": ('PRETTY_NAME="Ubuntu 22.04.4 LTS"\nNAME="Ubuntu"', 0),
        "kernel": ("5.15.0-105-generic", 0),
        "lscpu": (o["lscpu"], 0),
        "numactl": (o["numactl"], 0),
        "meminfo": (o["meminfo"], 0),
        "df": ("Filesystem     1024-blocks      Used  Available Capacity Mounted on\n/dev/nvme0n1p2 3750000000 1000000000 2750000000      27% /", 0),
        "addr": (f"1: lo    inet 127.0.0.1/8 scope host lo\n3: {n.nic}    inet {n.ip}/24 brd 198.19.255.255 scope global {n.nic}", 0),
        "link": (f"1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT\n"
                 f"3: {n.nic}: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT", 0),
        "docker": ("Docker version 26.1.3, build b72abbb", 0),
        "df_base": ("Filesystem     1024-blocks      Used  Available Capacity Mounted on\n/dev/nvme0n1p2 3750000000 1000000000 2750000000      27% /", 0),
        "listen": ("LISTEN 0      128          0.0.0.0:22        0.0.0.0:*", 0),
        "ours": ("", 0),
    }
    if name == "sim-a3":
        s["npusmi"] = (o["npusmi"], 0)
        s["npusmi_topo"] = (o["npusmi_topo"], 0)
        for d in o["hw"]["npus"]:
            s[f"npu_ip {d['id']}"] = (f"vnic ipaddr:{d['ip']}\nvnic netmask:{d['netmask']}", 0)
    else:
        s["nvsmi"] = (o["nvsmi"], 0)
        s["nvtopo"] = (o["nvtopo"], 0)
        s["ibstat"] = (o["ibstat"], 0)
    return s


def facts_output(sections: dict[str, tuple[str, int | str]]) -> str:
    return "".join(section(k, text, rc) for k, (text, rc) in sections.items())


def parse_facts(name: str, **replace: tuple[str, int | str] | None) -> dict:
    """The facts of a healthy node with some sections replaced (None: left out)."""
    s = facts_sections(name)
    for k, v in replace.items():
        if v is None:
            s.pop(k)
        else:
            s[k] = v
    o = good()[name]
    return facts.parse(bind(o["cluster"]), o["node"], facts_output(s))


def test_the_real_outputs_are_read_in_full():
    """The base every garbling starts from parses with no problem at all."""
    for name, devices in (("sim-a3", 16), ("sim-b200", 8)):
        f = parse_facts(name)
        assert f["problems"] == [] and f["devices_healthy"] == devices and "unreadable" not in f, f["problems"]
        assert f["cpus"] and f["numa_nodes"] and f["mem_total_gib"] and f["model_disk_free_gib"] == 2622.6
        assert all(d["cpu_affinity"] for d in f["devices"])
    assert len(facts.parse_ibstat(good()["sim-b200"]["ibstat"])) == 8
    perf = comm.parse_all_reduce(good()["sim-b200"]["all_reduce"])
    assert perf["max_busbw"] > 300 and perf["oob_ok"] and perf["sizes"] == 31


# --- the excerpt every parser shows ---------------------------------------------------------------
@FAST
@given(garbage)
def test_an_excerpt_keeps_the_beginning_and_is_one_line(text):
    ex = facts.excerpt(text)
    shown_text = ast.literal_eval(ex)
    assert shown_text.startswith(text.strip()[:120])
    assert len(ex) < 4 * 260 and "\n" not in ex and "\x1b" not in ex  # control characters are escaped


# --- facts -------------------------------------------------------------------------------------------
SECTION_PARSERS = [
    facts.parse_lscpu, facts.parse_numactl, facts.parse_meminfo, ascend.parse_npu_smi, nvidia.parse_nvsmi,
    facts.parse_df, facts.parse_listen, facts.parse_ibstat, facts.split_sections,
    lambda t: facts.parse_topo_affinity(t, "NPU"), lambda t: facts.parse_topo_affinity(t, "GPU"), lambda t: facts.parse_addrs(t, t),
    lambda t: facts._cpulist(t),
]


@FAST
@given(garbage)
def test_no_facts_parser_raises_on_garbage(text):
    for parse in SECTION_PARSERS:
        parse(text)
    # also after a real line, and with the facts script's marks in odd places
    for parse in SECTION_PARSERS:
        parse("CPU NODE\n  0    0\n" + text)
    s = facts.split_sections(f"{MARK} x\n{text}\n{MARK}rc {text}\n{MARK} y\n{text}")
    assert set(s) <= {"x"} and all(rc is None or isinstance(rc, int) for _, rc in s.values())


def test_what_used_to_crash_the_facts_parsers():
    """Found by the garbage above: each raised ValueError/IndexError (or hung)."""
    assert facts.split_sections(f"{MARK} hostname\nh\n{MARK}rc \n") == {"hostname": ("h", None)}
    assert facts.split_sections(f"{MARK} hostname\nh\n{MARK}rc garbage\n") == {"hostname": ("h", None)}
    assert facts.parse_lscpu("CPU NODE\n  ²   0\n  1 ²\n") == {1: 0}
    assert facts.parse_numactl("node 0 cpus: 0 1\nnode 0 size:\nnode 0 free: x MB\n") == [{"id": 0, "cpus": 2, "size_mb": 0, "free_mb": 0}]
    assert [d["chip"] for d in ascend.parse_npu_smi("| 0 910 | OK | x |\n| 0² 0 | 0000:C1:00.0 | y |\n")] == [0]
    assert nvidia.parse_nvsmi("0², B200, GPU-1, 1, 0000:18:00.0, 0\n0, B200, GPU-1, 1²,0000:18:00.0, 0\n")[0]["mem_mib"] is None
    assert facts.parse_df("Filesystem\n/dev/x 1\n") == (None, None) and facts.parse_df("F\n/dev/x 1 2 x 4 /\n") == (None, None)
    assert facts.parse_listen("LISTEN 0 1 0.0.0.0:²² x\n") == []
    assert facts.parse_ibstat("CA 'a'\n\tPort 1:\n\t\tRate: 4²\n")[0]["rate"] == "4²"
    assert facts._cpulist("0-99999999999999,3") == [3]  # a range no machine has: not a list of 10^14 CPUs
    assert facts.parse_topo_affinity("x CPU Affinity\nNPU0 X 0-99999999999\n", "NPU") == {}


def test_a_section_without_a_final_newline_is_kept():
    """``cat`` of a file whose last line has no newline glues the rc mark to it."""
    out = f"{MARK} hccn.conf\naddress_0=10.0.0.1{MARK}rc 0\n{MARK} kernel\n5.15\n{MARK}rc 0\n"
    assert facts.split_sections(out) == {"hccn.conf": ("address_0=10.0.0.1", 0), "kernel": ("5.15", 0)}


def test_npu_smi_cut_short_at_every_position():
    """A truncated ``npu-smi info`` table: never an exception, never an invented
    device; fewer devices than the node has is a problem that shows the table."""
    full = good()["sim-a3"]["npusmi"]
    want = ascend.parse_npu_smi(full)
    assert len(want) == 16
    for cut in cuts(full):
        got = ascend.parse_npu_smi(cut)
        assert len(got) <= 16
        for g, w in zip(got, want):
            assert (g["npu"], g["chip"], g["name"], g["health"]) == (w["npu"], w["chip"], w["name"], w["health"])
            assert w["bus_id"].startswith(g["bus_id"])
    for cut in cuts(full, 37):
        f = parse_facts("sim-a3", npusmi=(cut, 0))
        seen = len(f["devices"])
        if seen < 16:
            assert f"{seen} of 16 NPUs visible" in f["problems"]
            assert f"npu-smi info printed {facts.excerpt(cut)}" in f["problems"], f["problems"]
        else:
            assert f["problems"] == []


@FAST
@given(garbage, st.sampled_from([0, 1, 127, "", "x"]))
def test_garbage_from_npu_smi_is_shown(text, rc):
    f = parse_facts("sim-a3", npusmi=(text, rc))
    assert f["devices"] == [] or text.count("|") >= 4
    if len(f["devices"]) < 16:
        assert "unreadable" in f
        what = f["unreadable"]["npu-smi info"]
        assert shown(what, held(text)) and (what.startswith("printed ") if rc == 0 else "failed (exit " in what)
        assert f"npu-smi info {what}" in f["problems"]


def test_npu_smi_that_gave_no_answer_says_so():
    f = parse_facts("sim-a3", npusmi=None)
    assert "0 of 16 NPUs visible" in f["problems"]
    assert any(p.startswith("npu-smi info gave no answer") for p in f["problems"]), f["problems"]


def test_nvidia_smi_csv_cut_short_at_every_position():
    full = good()["sim-b200"]["nvsmi"]
    for cut in cuts(full):
        f = parse_facts("sim-b200", nvsmi=(cut, 0))
        complete = cut.rstrip("\n") == full.rstrip("\n")
        assert (f["problems"] == []) == complete, (cut[-60:], f["problems"])
        if not complete:
            # the cut line is shown: as an unreadable line of its GPU, or as what nvidia-smi printed
            text = "\n".join(f["problems"] + [d["health"] for d in f["devices"]])
            assert shown(text, cut) or shown(text, cut.splitlines()[-1]), f["problems"]


@FAST
@given(garbage)
def test_garbage_from_nvidia_smi_is_shown(text):
    f = parse_facts("sim-b200", nvsmi=(text, 0))
    if len(f["devices"]) < 8:
        assert f"nvidia-smi printed {facts.excerpt(held(text))}" in f["problems"]


def test_ibstat_cut_short_or_garbled_fails_the_nic_check_showing_it():
    c = good()["sim-b200"]["cluster"]
    full = good()["sim-b200"]["ibstat"]
    want = facts.parse_ibstat(full)
    for cut in cuts(full, 3):
        f = parse_facts("sim-b200", ibstat=(cut, 0))
        problems = nic.ib_problems(bind(c), f)
        ports = f["ib_ports"]
        if not ports:
            assert problems == [f"ibstat shows no InfiniBand port: ibstat printed {facts.excerpt(cut)}"]
        else:  # the ports before the cut, as they are; a port cut short fails (its rate or state missing or cut)
            assert ports[:-1] == want[: len(ports) - 1]
            assert not problems or any(p.startswith(f"IB {ports[-1]['ca']} port 1: ") for p in problems)
            assert problems or ports[-1] == want[len(ports) - 1]
    for text in REAL_GARBAGE + ["ibpanic: [12] main: stat of IB device 'mthca0' failed: No such file or directory"]:
        for rc in (0, 255):
            f = parse_facts("sim-b200", ibstat=(text, rc))
            problems = nic.ib_problems(bind(c), f)
            assert len(problems) == 1 and shown(problems[0], text), problems


@FAST
@given(garbage, st.sampled_from(["sim-a3", "sim-b200"]), st.data(), st.sampled_from([0, 1, ""]))
def test_garbage_in_any_facts_section_is_never_fatal(text, name, data, rc):
    key = data.draw(st.sampled_from(sorted(facts_sections(name))))
    f = parse_facts(name, **{key: (text, rc)})
    assert isinstance(f["problems"], list) and all(isinstance(p, str) for p in f["problems"])
    json.dumps(f)  # facts go out as JSON (invoke facts --json)


def test_the_whole_facts_output_cut_short():
    """The SSH stream cut anywhere: the sections before the cut are read, the
    rest is missing; facts never raise and the step fails without a hostname."""
    for name in ("sim-a3", "sim-b200"):
        o = good()[name]
        full = facts_output(facts_sections(name))
        step = facts.gather_step(bind(o["cluster"]))
        for cut in cuts(full, 97) + [full[: full.index(MARK + "rc")], full[: full.index(MARK + "rc") + len(MARK) + 3]]:
            res = step.parse(o["node"], cut, "", 0)
            assert res.status in (OK, FAILED)
            if res.status == FAILED:
                assert res.data["hostname"] is None and (not cut.strip() or shown(res.msg, cut)), res.msg
            else:
                assert res.data["hostname"] == o["node"].name


@FAST
@given(garbage, garbage)
def test_facts_step_on_garbage_fails_showing_what_the_node_printed(out, err):
    o = good()["sim-a3"]
    res = facts.gather_step(bind(o["cluster"])).parse(o["node"], out, err, 0)
    assert res.status == FAILED
    if out.strip():
        assert f"unreadable facts output (no hostname): {facts.excerpt(out)}" in res.msg
    elif not err.strip():
        assert res.msg == "facts script printed nothing"
    if err.strip():
        assert err.strip() in res.msg


# --- hccn_tool (verify-comm, Ascend) ------------------------------------------------------------------
ITEMS = {"link": "link", "health": "net_health", "netdetect": "netdetect", "gateway": "gateway", "lldp": "lldp",
         "tls": "tls", "optical": "optical", "npu_ip": "vnic"}


def ascend_output(devices: int, replace: dict[str, tuple[str, int]] | None = None) -> str:
    h = good()["sim-a3"]["hccn"]
    parts = [section("hccn.conf", "address_0=198.19.128.10\nnetmask_0=255.255.255.0")]
    for d in range(devices):
        for check, flag in ITEMS.items():
            text, rc = (replace or {}).get(check, (h[flag], 0))
            parts.append(section(f"{check} {d}", text, rc))
    return "".join(parts)


def two_npu_node():
    o = good()["sim-a3"]
    return o["cluster"], o["node"].model_copy(update={"devices": 2})


def test_hccn_tool_answers_are_read():
    c, n = two_npu_node()
    p = comm.parse_links(bind(c), n, ascend_output(2))
    assert all(ok for d in p["devices"].values() for ok, _ in d.values()), p["devices"]
    assert p["ips"] == {0: "198.19.128.10", 1: "198.19.128.10"} and p["conf"]


@FAST
@given(garbage.filter(lambda t: ":" not in t and "[" not in t and "lldp" not in t.lower() and t.strip() != "Success"))
def test_garbage_from_hccn_tool_fails_each_check_showing_it(text):
    c, n = two_npu_node()
    p = comm.parse_links(bind(c), n, ascend_output(2, {k: (text, 0) for k in ITEMS}))
    t = held(text).strip()
    for d in (0, 1):
        for check, (ok, detail) in p["devices"][d].items():
            assert not ok, (check, detail)
            if not t:
                assert detail == "no answer", (check, detail)
            elif check == "npu_ip":
                assert detail == t.splitlines()[0]  # the tool's first line, as for "no ip was preset there!"
            elif check in ("link", "health"):
                assert detail == t
            else:
                assert detail == f"unreadable: {facts.excerpt(t)}", (check, detail)
    assert p["ips"] == {}


def test_hccn_tool_in_its_own_words_keeps_its_details():
    c, n = two_npu_node()
    p = comm.parse_links(bind(c), n, ascend_output(2, {
        "netdetect": ("netdetect address:", 0), "gateway": ("default gateway:, Iface:", 0), "lldp": ("Get lldp information failed", 1),
        "optical": ("present: not present", 0), "tls": ("dev_id:0, tls switch[1](0:disable, 1:enable)", 0),
    }))
    d = p["devices"][0]
    assert d["netdetect"] == (False, "not set") and d["gateway"] == (False, "not set") and d["lldp"] == (False, "no switch port (LLDP)")
    assert d["optical"] == (False, "not present") and d["tls"] == (True, "1")


def test_hccn_tool_output_cut_short_at_every_position():
    """The stream cut anywhere: a check reads its full answer or says "no
    answer", never a value cut short (an NPU IP of 198.19.1 is worse than none)."""
    c, n = two_npu_node()
    full = ascend_output(2)
    want = comm.parse_links(bind(c), n, full)
    for cut in cuts(full):
        got = comm.parse_links(bind(c), n, cut)
        for d in (0, 1):
            for check, value in got["devices"][d].items():
                assert value in (want["devices"][d][check], (False, "no answer")), (check, value, cut[-80:])
        assert set(got["ips"].items()) <= set(want["ips"].items())


# --- NPU pings and host pings --------------------------------------------------------------------------
PINGS = [(0, "b", 0, "10.0.0.2"), (1, "b", 1, "10.0.1.2")]


@FAST
@given(garbage)
def test_garbage_ping_answers_fail_showing_the_last_line(text):
    out = f"{comm.PING_MARK} 0\n{text}\n{comm.PING_MARK} 1\n"
    r = comm.parse_pings(out, PINGS)
    assert len(r) == 2 and r[1] == {**r[1], "ok": False, "reason": "no answer"}
    t = comm.split_marked(out).get("0", "")
    if "% packet loss" not in t:  # ping's last line, as it printed it
        assert not r[0]["ok"] and r[0]["reason"] == (t.strip().splitlines()[-1] if t.strip() else "no answer")
    ok, reason, got = comm.ping_verdict(text)
    assert isinstance(reason, str) and (ok or reason)


def test_what_used_to_crash_the_ping_parsers():
    assert comm.parse_pings(f"{comm.PING_MARK} 0\n3 packets transmitted, 1 received, ..% packet loss\n", PINGS[:1])[0]["ok"] is False
    assert comm.ping_verdict("3 packets transmitted, 1 received, ..% packet loss")[0] is False
    c = good()["sim-a3"]["cluster"]
    assert comm.parse_host_pings(c, c.nodes[0], f"{comm.PING_MARK} nic\noperstate up\nmtu ²\n")["mtu"] is None


@FAST
@given(garbage)
def test_garbage_host_ping_output_is_never_fatal(text):
    c = good()["sim-a3"]["cluster"]
    for out in (text, f"{comm.PING_MARK} nic\n{text}\n{comm.PING_MARK} 0\n{text}\n{comm.PING_MARK} 0.df\n{text}\n"):
        p = comm.parse_host_pings(c, c.nodes[0], out, text)
        assert not all(x["ok"] for x in p["pairs"]) or "packets transmitted" in text


# --- all_reduce_perf (verify-comm, NVIDIA) ----------------------------------------------------------------
def passes(perf: dict) -> bool:
    """What flows.verify.collective accepts (without a busbw floor)."""
    return perf["max_busbw"] is not None and perf["oob_ok"] and not perf["wrong_ranks"]


def test_all_reduce_perf_cut_short_at_every_position():
    full = good()["sim-b200"]["all_reduce"]
    want = comm.parse_all_reduce(full)
    footer = full.index("# Out of bounds values")
    for cut in cuts(full):
        perf = comm.parse_all_reduce(cut)
        assert perf["max_busbw"] is None or math.isfinite(perf["max_busbw"])
        if passes(perf):  # only once the footer's verdict is there, and then the largest size's busbw is the real one
            assert len(cut) > footer and perf["max_busbw"] == want["max_busbw"]


@FAST
@given(garbage)
def test_garbage_from_all_reduce_perf_never_passes(text):
    perf = comm.parse_all_reduce(text)
    assert perf["max_busbw"] is None or math.isfinite(perf["max_busbw"])
    assert perf["avg_busbw"] is None or math.isfinite(perf["avg_busbw"])
    assert not passes(perf) or "# Out of bounds values" in text


def test_what_used_to_crash_or_pass_all_reduce_perf():
    assert comm.parse_all_reduce("# Avg bus bandwidth    : .. \n")["avg_busbw"] is None
    row = "8589934592 2147483648 float sum -1 40000 214.7 nan 0 40000 214.7 nan 0"
    assert comm.parse_all_reduce(row + "\n# Out of bounds values : 0 OK\n")["max_busbw"] is None  # nan GB/s is no measurement


# --- docker: container states (deploy's watcher), images, wheels ----------------------------------------------
@FAST
@given(garbage)
def test_container_states_from_garbage(text):
    st_ = containers.parse_states(text)
    for status, code in st_.values():
        assert status in containers.STATES | {"unreadable"}
        if status == "unreadable":
            assert code.startswith("'") or code.startswith('"')


def test_container_states_cut_short_or_empty():
    full = "sim-a3-r1 running 0\nsim-a3-r2 exited 137\nsim-a3-r3 missing -\n"
    assert containers.parse_states("") == {}  # empty docker inspect: every unit reads as missing
    assert containers.parse_states(full) == {"sim-a3-r1": ("running", "0"), "sim-a3-r2": ("exited", "137"), "sim-a3-r3": ("missing", "-")}
    for cut in cuts(full):
        for name, (status, code) in containers.parse_states(cut).items():
            if status == "unreadable":
                assert code == repr(cut.splitlines()[-1].strip())  # a status cut short ("runn") shows the line
            else:
                assert f"{name} {status}" in full


IMAGE_ID = "sha256:" + "ab" * 32


def test_image_output_cut_short_or_garbled():
    c = good()["sim-a3"]["cluster"]
    n = c.nodes[0]
    full = f"{image.MARK} present {IMAGE_ID} [\"quay.io/ascend/vllm-ascend@sha256:{'cd' * 32}\"]\n"
    for cut in cuts(full):
        r = image.parse(c, n, cut, "", 0)
        if r.status in (OK, CHANGED):
            assert r.data["id"] == IMAGE_ID  # never an image ID cut short
        else:
            assert r.status == FAILED and (not cut.strip() or shown(r.msg, cut) or shown(r.msg, cut.strip())), r.msg
    for text in REAL_GARBAGE:
        r = image.parse(c, n, text, "", 0)
        assert r.status == FAILED and (not text.strip() or shown(r.msg, text)), r.msg


def test_accessory_images_answer_for_every_image():
    c = load_cluster("gb300-agentic")
    n = c.nodes[0]
    refs = image.accessories(c)
    full = "".join(f"{image.MARK} present {ref}\n" for ref in refs)
    assert image.accessories_parse(bind(c), n, full, "", 0).status == OK
    for cut in cuts(full):
        r = image.accessories_parse(bind(c), n, cut, "", 0)
        complete = all(f"{image.MARK} present {ref}\n" in cut or cut.endswith(f"{image.MARK} present {ref}") for ref in refs)
        assert (r.status == OK) == complete, (cut, r.msg)
        if not complete:
            assert shown(r.msg, cut), r.msg


@FAST
@given(garbage, st.sampled_from([0, 1, 5]))
def test_wheels_output_garbled(text, code):
    c = load_cluster("gb300-agentic")
    n = c.nodes[0]
    r = wheels.parse(c, n, text, "", code)
    assert r.status == FAILED and (shown(r.msg, text) or not text.strip()), r.msg
    for out in (f"{wheels.MARK} versions {text}\n", f"{wheels.MARK} versions {text}\n{wheels.MARK} state present\n"):
        r = wheels.parse(c, n, out, "", code)
        assert r.status in (OK, CHANGED, FAILED) and isinstance(r.data["versions"], dict)
        try:  # the versions line is the text up to its first newline
            readable = isinstance(json.loads(text.split("\n", 1)[0]), dict)
        except (ValueError, RecursionError):
            readable = False
        if r.status == FAILED and not readable:
            assert r.msg.startswith("wheels: unreadable versions "), r.msg


def test_wheels_versions_that_are_not_json_say_so():
    c = load_cluster("gb300-agentic")
    r = wheels.parse(c, c.nodes[0], wheels.MARK + ' versions {"ai-dynamo": \n', "", 1)
    assert r.status == FAILED and r.msg == "wheels: unreadable versions '{\"ai-dynamo\":'"


# --- the model listing -----------------------------------------------------------------------------------
def test_model_listing_garbled_is_not_called_missing():
    c = good()["sim-a3"]["cluster"]
    n = c.nodes[0]
    parse = model.check_step(SimpleNamespace(cluster=c)).parse
    path = c.model.path
    full = (f"{model.MARK} dir {path}\nconfig.json\t1234\nmodel.safetensors.index.json\t99\ntokenizer_config.json\t10\n"
            f"{model.MARK} sums\n{'a' * 64}  config.json\n")
    assert parse(n, full, "", 0).status == OK
    for text in REAL_GARBAGE + [full[:10], f"{model.MARK} di"]:
        r = parse(n, text, "", 0)
        assert r.status == FAILED and "does not exist" not in r.msg and shown(r.msg, text), r.msg
    r = parse(n, f"{model.MARK} dir {path}\n{model.MARK} missing\n", "", 0)
    assert r.status == FAILED and r.msg == f"{path} does not exist"  # what the node said, as before
    assert model.parse_manifest(f"{model.MARK} dir /m\nconfig.json\t1²\n") == {"/m": {"files": {"config.json": "1²"}, "sums": {}}}


@FAST
@given(garbage)
def test_model_listing_from_garbage(text):
    c = good()["sim-a3"]["cluster"]
    r = model.check_step(SimpleNamespace(cluster=c)).parse(c.nodes[0], f"{model.MARK} dir {c.model.path}\n{text}\n", "", 0)
    assert r.status in (OK, FAILED)
    json.dumps(r.data)


# --- HTTP answers (readiness probes, status) ----------------------------------------------------------------
GOOD_BODIES = {
    "models": (b'{"object":"list","data":[{"id":"qwen3.8","object":"model","owned_by":"vllm"}]}', "qwen3.8"),
    "think": (b'{"choices":[{"index":0,"message":{"role":"assistant","content":"<think>2+2</think>4"}}]}', ""),
    "reasoning": (b'{"choices":[{"message":{"reasoning_content":"2+2","content":"4"}}]}', ""),
    "answer": (b'data: {"choices":[{"delta":{"content":"4"}}]}\n\ndata: [DONE]\n\n', ""),
    "json": (b'{"health":"true","reason":""}', "health=true"),
    "metric": (b"# HELP trtllm_kv_cache_utilization x\n# TYPE trtllm_kv_cache_utilization gauge\ntrtllm_kv_cache_utilization{rank=\"0\"} 0.1\n",
               "trtllm_kv_cache_utilization"),
    "prometheus": (b"# HELP dynamo_component_uptime_seconds x\n# TYPE dynamo_component_uptime_seconds gauge\n"
                   b"dynamo_component_uptime_seconds{dynamo_component=\"decode\"} 12.5\n", ""),
    # ai-dynamo 1.6's shape: decode workers register under component "backend"; every endpoint is listed
    "dynamo_health": (b'{"status":"healthy","instances":[{"component":"prefill","endpoint":"generate","instance_id":1},'
                      b'{"component":"backend","endpoint":"generate","instance_id":2},{"component":"backend","endpoint":"router-discovery","instance_id":2}]}',
                      json.dumps([{"name": "prefill0", "role": "prefill"}, {"name": "decode0", "role": "decode"}])),
}


def probe_result(monkeypatch, check: str, body: bytes, arg: str) -> str | None:
    monkeypatch.setattr(probes, "http_via_ssh", lambda *a, **k: (200, body))
    p = Probe(name=check, kind="http", host="sim-a3-0", port=8000, path="/x", check=check, arg=arg)
    return probes.http_probe(None, None, p, 1.0)


def test_good_answers_pass(monkeypatch):
    for check, (body, arg) in GOOD_BODIES.items():
        assert probe_result(monkeypatch, check, body, arg) is None, check


def test_answers_cut_short_fail_showing_the_body(monkeypatch):
    for check, (body, arg) in GOOD_BODIES.items():
        for cut in cuts(body.rstrip()):
            problem = probe_result(monkeypatch, check, cut, arg)
            if check in ("answer", "metric", "prometheus") and problem is None:
                continue  # an event stream (or metrics page) cut after its data is whole
            assert problem is not None and problem.startswith("GET /x on sim-a3-0:8000"), (check, cut)
            assert repr(cut[:200]) in problem, (check, cut, problem)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode), st.sampled_from([g.encode() for g in REAL_GARBAGE])),
       st.sampled_from(sorted(GOOD_BODIES)))
def test_any_answer_is_a_result_never_an_exception(monkeypatch, body, check):
    problem = probe_result(monkeypatch, check, body, GOOD_BODIES[check][1])
    assert problem is None or isinstance(problem, str)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=("Cc", "Zl", "Zp", "Cs")), max_size=200), st.sampled_from(sorted(GOOD_BODIES)))
def test_an_unreadable_answer_is_shown(monkeypatch, text, check):
    """Not JSON, not an event stream, not Prometheus text (one line after a
    '<', like a proxy's HTML page): every check fails, showing the body."""
    body = ("<" + text).encode()
    problem = probe_result(monkeypatch, check, body, GOOD_BODIES[check][1])
    assert problem is not None and repr(body[:200]) in problem, problem


def test_json_nested_too_deep_is_an_unreadable_answer(monkeypatch):
    deep = b"[" * 100000
    for check in ("models", "json", "dynamo_health", "think", "reasoning"):
        body = b'{"choices": ' + deep if check in ("think", "reasoning") else deep
        problem = probe_result(monkeypatch, check, body, GOOD_BODIES[check][1])
        assert problem is not None and "unreadable answer (RecursionError" in problem and repr(body[:200]) in problem


# --- what the flows parse: status, the deploy gate, the lock holder ----------------------------------------------
def test_status_with_garbage_docker_inspect():
    from roles.status import parse_status

    st_ = parse_status(section("release", "r1") + section("inspect", 'null\n{"Name": "/x", "State": {"Running": true}}\n'))
    assert list(st_["containers"]) == ["x"]


def test_status_with_empty_or_unparsable_docker_inspect():
    from roles.status import parse_status

    for text in ("", "{", "garbage", '{"Name": "/x"'):
        assert parse_status(section("release", "r1") + section("inspect", text))["containers"] == {}


def test_status_state_of_an_odd_inspect_document():
    from flows.status import _state, _uptime

    assert _state({"Name": "/x"}).startswith("exited") and _uptime({"State": "x"}) == "-"


def test_deploy_gate_with_an_odd_report():
    from flows.verify import gate

    for text in ("[1, 2]", '{"ok": true, "epoch": "x"}'):
        ok, said = gate(good()["sim-a3"]["cluster"], text, False)
        assert isinstance(said, str)


def test_lock_holder_that_is_not_an_object():
    from llmdeploy import lock

    for line in ("5", '{"since_epoch": "yesterday"}'):
        assert isinstance(lock.describe(lock.parse_holder("held\n" + line)), str)
