"""verify-comm as a picture (roles.comm.picture): the page and the PNG drawn
from recorded verification documents.

The A3 document is made by the flow itself (flows.verify.collect) from
hccn_tool's and ping's own words, answered by a stand-in runner for two
sim-a3 nodes x 16 NPUs with npu5 of sim-a3-1 down (its link DOWN, every ping
from and to it lost, as on the simulated cluster). The NVIDIA one carries
the simulated all_reduce_perf's table of sim-b200 under its floor."""

from __future__ import annotations

import base64
import io
import json
import re
import shlex
import subprocess
import time

import pytest

from flows import verify
from llmdeploy.inventory import load_cluster
from llmdeploy.runner import OK, SKIPPED, HostResult
from roles import comm
from roles.comm import picture
from roles.facts import MARK
from tests.unit.test_hostnet import DF_OK, OK_OUT
from flows.binding import bind
from llmdeploy.deployment import Deployment
from tests.binding import runner_method

BROKEN = ("sim-a3-1", 5)
LABEL = "sim-a3-1 npu5"


def _a3(nodes=2):
    c = load_cluster("sim-a3")
    return c.model_copy(update={"nodes": c.nodes[:nodes]})


def _npu_ip(node_index: int, d: int) -> str:
    return f"198.19.{128 + d}.{10 + node_index}"


class StandInRunner:
    """Answers verify-comm's steps on Ascend as the simulated nodes do:
    hccn_tool's checks per NPU, the NPU pings (``down``: NPUs whose link is
    down: every ping from or to them is lost), the host network's pings."""

    def __init__(self, cluster, down=(BROKEN,), rtt=lambda a, d, b: 0.05 + 0.002 * d + 0.01 * a + 0.007 * b):
        self.c, self.down, self.rtt = cluster, set(down), rtt
        self.index = {n.name: i for i, n in enumerate(cluster.nodes)}
        self.by_ip = {_npu_ip(i, d): (n.name, d) for i, n in enumerate(cluster.nodes) for d in range(n.devices)}

    def run(self, step, nodes=None):
        out = {}
        for n in nodes if nodes is not None else self.c.nodes:
            script = step.build(n)
            if script is None:
                out[n.name] = HostResult(n.name, SKIPPED)
                continue
            if step.name == "hccn_tool checks":
                text = self._hccn(n)
            elif step.name.startswith("NPU pings"):
                text = self._pings(n, script)
            elif step.name == "host network pings":
                text = self._hosts(n)
            elif step.name == "save the verification":
                # the real script, run here: the cluster's base_dir is a temporary folder
                r = subprocess.run(["sh", "-c", script], input=step.stdin(n), capture_output=True, timeout=60)
                out[n.name] = step.parse(n, r.stdout.decode(), r.stderr.decode(), r.returncode)
                self.saved = True
                continue
            else:
                raise AssertionError(f"unexpected step {step.name}")
            out[n.name] = HostResult(n.name, OK, stdout=text, exit_code=0)
        return out

    def exec(self, node, command, timeout=None, stdin=None):
        return "", "", 0  # the audit line

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def _hccn(self, n):
        i = self.index[n.name]
        parts = [f"{MARK} hccn.conf\naddress_0={_npu_ip(i, 0)}\n{MARK}rc 0"]
        for d in range(n.devices):
            answers = {
                "link": f"link status: {'DOWN' if (n.name, d) in self.down else 'UP'}",
                "health": "net health status: Success",
                "netdetect": f"netdetect address: 198.19.{128 + d}.1",
                "gateway": f"default gateway:198.19.{128 + d}.1, Iface:eth{d}",
                "lldp": f"Chassis ID TLV\n\tMAC: 70:d0:0b:1c:2a:01\nPort ID TLV\n\tIfname: 400GE1/0/{d + 1}",
                "optical": "present: present\nTemperature: 45 C",
                "tls": f"dev_id:{d}, tls switch[0](0:disable, 1:enable)",
                "npu_ip": f"vnic ipaddr:{_npu_ip(i, d)}\nvnic netmask:255.255.255.0",
            }
            parts += [f"{MARK} {name} {d}\n{text}\n{MARK}rc 0" for name, text in answers.items()]
        return "\n".join(parts) + "\n"

    def _pings(self, n, script):
        out = []
        i = self.index[n.name]
        for d, ip, k in re.findall(r'-i (\d+) -hccs_ping -g address (\S+) ; \} > "\$t/(\d+)"', script):
            d = int(d)
            peer = self.by_ip[shlex.split(ip)[0]]
            lost = (n.name, d) in self.down or peer in self.down
            out.append(f"\n{comm.PING_MARK} {k}\ndevice {d} PING {ip}")
            if lost:
                out.append("3 packets transmitted, 0 received, 100.00% packet loss")
            else:
                t = self.rtt(i, d, self.index[peer[0]])
                out += [f"recv seq={s},time={t:.6f}ms" for s in range(3)] + ["3 packets transmitted, 3 received, 0.00% packet loss"]
        return "\n".join(out) + "\n"

    def _hosts(self, n):
        out = [f"\n{comm.PING_MARK} nic\noperstate up\nmtu 9000"]
        for k, _ in enumerate(comm.host_ping_plan(self.c, n)):
            out += [f"\n{comm.PING_MARK} {k}\n{OK_OUT}", f"\n{comm.PING_MARK} {k}.df\n{DF_OK}"]
        return "\n".join(out) + "\n"


def a3_record(nodes=2, down=(BROKEN,)):
    """What verify-comm records on two sim-a3 nodes with npu5 of sim-a3-1 down (the document and its detail)."""
    c = _a3(nodes)
    doc, detail = verify.collect(bind(c), StandInRunner(c, down), full=False, started=time.time())
    return {**doc, "detail": detail}


def nvidia_record(busbw=180.0):
    """sim-b200 (2 nodes x 8 GPUs, floor 300 GB/s) whose all_reduce_perf stays under its floor."""
    from sim.standins import nccl_tests as nt

    c = load_cluster("sim-b200")
    args = nt.parse_args(shlex.split(c.verify.all_reduce_args))
    out = nt.header(args) + nt.result(args, 16, busbw, [0] * 16, None)[0]

    class Node0:
        def exec(self, node, command, timeout=None):
            return out, "", 0

        def world(self, nodes, tasks, argv, env, timeout=None):
            return None  # mpirun on node 0, as over SSH

    detail = {"vendor": "nvidia", "platform": c.platform_info.name, "device": "gpu", "devices": {n.name: n.devices for n in c.nodes}}
    perf = verify.all_reduce(bind(c), Node0(), {n.name: n.name for n in c.nodes}, detail)
    pairs = [{"from": a.name, "nic": a.nic or c.nic, "to": b.name, "ip": str(b.ip), "mtu": 9000, "reply": True, "full_mtu": True, "ok": True,
              "reason": "ok"} for a in c.nodes for b in c.nodes if a is not b]
    detail["host_pairs"] = pairs
    cell = {"ok": True, "summary": "8/8", "failures": []}
    nodes = {n.name: {"reachable": True, "checks": {"gpus": cell, "topology": {"ok": True, "summary": "read", "failures": []},
                                                    "host_net": {"ok": True, "summary": "1/1 (MTU 9000)", "failures": []}}} for n in c.nodes}
    doc = {"cluster": c.name, "ok": perf["ok"], "time": "2026-06-01T10:00:00Z", "epoch": 1_780_000_000, "duration_s": 41.2,
           "nodes": nodes, "all_reduce": perf, "host_links": {"planned": len(pairs), "failed": []}}
    return {**doc, "detail": detail}, c


# --- the recorded document ---------------------------------------------------------------------------


def test_the_flow_records_every_ping_with_its_round_trip_and_keeps_the_json_as_it_was():
    rec = a3_record()
    assert not rec["ok"] and rec["plan"] == "full"
    assert rec["nodes"]["sim-a3-1"]["checks"]["link"]["failures"] == ["npu5: DOWN"]
    assert rec["links"]["planned"] == 2 * 16 and len(rec["links"]["failed"]) == 2
    # the JSON's lost pings keep their keys (no round trip: the picture's only)
    assert list(rec["links"]["failed"][0]) == ["npu", "to", "to_npu", "ip", "loss", "ok", "reason", "from"]
    pings = rec["detail"]["pings"]
    assert len(pings) == 32 and all(p["rtt_ms"] is not None for p in pings if p["ok"])
    assert {(p["from"], p["npu"]) for p in pings if not p["ok"]} == {("sim-a3-0", 5), ("sim-a3-1", 5)}
    assert [p["mtu"] for p in rec["detail"]["host_pairs"]] == [9000, 9000] and "raw" not in rec["detail"]["host_pairs"][0]
    json.dumps(rec)  # the local copy is JSON


def test_round_trip_times_are_read_from_hccn_tools_replies():
    pings = [(0, "b", 0, "10.0.0.2"), (1, "b", 1, "10.0.1.2")]
    out = (f"{comm.PING_MARK} 0\ndevice 0 PING 10.0.0.2\nrecv seq=0,time=0.054000ms\nrecv seq=1,time=0.040000ms\n"
           "2 packets transmitted, 2 received, 0.00% packet loss\n"
           f"{comm.PING_MARK} 1\ndevice 1 PING 10.0.1.2\n2 packets transmitted, 0 received, 100.00% packet loss\n")
    r = comm.parse_pings(out, pings)
    assert r[0]["rtt_ms"] == 0.047 and r[1]["rtt_ms"] is None


def test_all_reduce_perfs_table_is_kept_size_by_size():
    rec, c = nvidia_record()
    rows = rec["detail"]["all_reduce"]["rows"]
    assert len(rows) == 31 and rows[0]["size"] == 8 and rows[-1]["size"] == 8 << 30
    assert rows[-1]["busbw"] == rec["all_reduce"]["max_busbw"] < 300 and rec["detail"]["all_reduce"]["floor"] == c.verify.nccl_min_busbw == 300


# --- what the page and the picture show ----------------------------------------------------------------


def test_the_failed_npu_is_named_and_only_it():
    rec = a3_record()
    failed = picture.failed_devices(rec)
    assert [f["label"] for f in failed] == [LABEL]
    assert failed[0]["reasons"] == ["link: DOWN", "pings: every ping lost (1 from it, 1 to it)"]
    assert picture.device_faults(a3_record(down=()))  == {}


def _text(page: str) -> str:
    """The page's text as a person reads it (tags out, entities back)."""
    import html

    body = re.sub(r"<style>.*?</style>", "", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


def test_the_page_names_the_failed_device_lists_the_pairs_and_holds_the_picture():
    rec = a3_record()
    png = picture.render_png(rec)
    page = picture.render_html(rec, png)
    text = _text(page)
    assert LABEL in text and "link: DOWN" in text and "communication FAILED" in text
    assert "sim-a3-0 npu5" in text and "100.00% loss" in text  # the lost pings, both ways
    assert "NPU pings (full plan): 30/32 without loss" in text
    # the host network pairs with their MTU results
    assert "Host network pairs" in text and "2/2 pass" in text
    rows = re.findall(r"<tr><td>(sim-a3-\d)</td><td>enp189s0f0</td><td>(sim-a3-\d)</td><td>([0-9.]+)</td><td>(\d+)</td><td>yes</td><td>ok</td>", page)
    assert rows == [("sim-a3-0", "sim-a3-1", "198.19.3.11", "9000"), ("sim-a3-1", "sim-a3-0", "198.19.3.10", "9000")]
    # self-contained: the picture inside, no script, nothing fetched from elsewhere
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert m and base64.b64decode(m.group(1)) == png
    rest = re.sub(r"src=\"data:image/png;base64,[A-Za-z0-9+/=]+\"", "", page)  # the one source: the picture itself
    assert "<script" not in rest.lower() and not re.search(r"<[^>]*\son[a-z]+\s*=", rest, re.I)  # no script, no handler
    assert not re.search(r"(?:https?:|src=\"|href=\"|url\()", rest, re.I)
    assert 'alt="verify-comm picture: failed devices sim-a3-1 npu5"' in page


def test_the_nvidia_page_shows_the_table_and_the_floor():
    rec, _ = nvidia_record()
    png = picture.render_png(rec)
    page = picture.render_html(rec, png)
    text = _text(page)
    assert "floor 300 GB/s (verify.nccl_min_busbw)" in text
    assert re.search(r"busbw 17\d\.\d GB/s < floor 300 GB/s", text)
    assert "8 GiB" in text and "(< floor)" in text and re.search(r"all_reduce_perf:\s+FAILED", text)
    assert text.count(" GiB ") + text.count(" MiB ") + text.count(" KiB ") >= 20  # every size's row
    assert "GPU pings" not in text  # no NPU matrix on NVIDIA
    assert "Host network pairs" in text and "2/2 pass" in text


def _pixels(png: bytes):
    from PIL import Image

    img = Image.open(io.BytesIO(png))
    img.load()
    return img


@pytest.mark.parametrize("make", ["a3", "nvidia", "a2-16-nodes", "64-nodes-sampled"])
def test_the_png_decodes_at_its_size(make):
    if make == "a3":
        rec = a3_record()
    elif make == "nvidia":
        rec = nvidia_record()[0]
    else:
        rec = _large(16 if make == "a2-16-nodes" else 64)
    png = picture.render_png(rec)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    img = _pixels(png)
    assert img.format == "PNG" and img.size == (picture.PNG_WIDTH, picture.PNG_HEIGHT)
    # matplotlib reads it back too
    import matplotlib.image

    assert matplotlib.image.imread(io.BytesIO(png), format="png").shape[:2] == (picture.PNG_HEIGHT, picture.PNG_WIDTH)


def _large(nodes: int) -> dict:
    """A2-like: ``nodes`` x 8 NPUs (16: the full 128 x 128 matrix; 64: the sampled plan), npu3 of node 1 down."""
    c = load_cluster("sim-a2")
    base = c.nodes[0]
    ns = [base.model_copy(update={"name": f"a2-{i:02d}", "ip": f"198.19.2.{10 + i}", "start_rank": i * 8}) for i in range(nodes)]
    c = c.model_copy(update={"nodes": ns})
    ips = {n.name: {d: _npu_ip(i, d) for d in range(8)} for i, n in enumerate(ns)}
    mode, plan = comm.ping_plan(c, ips, False, c.verify.ping_full_max)
    assert mode == ("full" if nodes == 16 else "sampled")
    pings = [{"from": a, "npu": d, "to": b, "to_npu": bd, "loss": 100.0 if "a2-01" in (a, b) and d == 3 else 0.0,
              "ok": not ("a2-01" in (a, b) and d == 3), "reason": "x", "rtt_ms": 0.05 + d * 0.01} for a, ps in plan.items() for d, b, bd, _ in ps]
    checks = {n.name: {"reachable": True, "checks": {"link": {"ok": n.name != "a2-01", "summary": "", "failures": ["npu3: DOWN"] if n.name == "a2-01" else []}}}
              for n in ns}
    # the host network: every pair passes but a2-05 -> a2-09, whose path carries no 9000-byte packet
    pairs = [{"from": a.name, "nic": "enp189s0f0", "to": b.name, "ip": str(b.ip), "mtu": 9000, "reply": True, "full_mtu": True, "ok": True,
              "reason": "ok"} for a in ns for b in ns if a is not b]
    for p in pairs:
        if (p["from"], p["to"]) == ("a2-05", "a2-09"):
            p.update(full_mtu=False, ok=False, reason="full-MTU (9000) DF ping fails: message too long, mtu=1500")
    return {"cluster": "a2-big", "ok": False, "plan": mode, "time": "2026-06-01T10:00:00Z", "nodes": checks,
            "links": {"planned": len(pings), "failed": [p for p in pings if not p["ok"]]},
            "host_links": {"planned": len(pairs), "failed": [p for p in pairs if not p["ok"]]},
            "detail": {"vendor": "ascend", "platform": "Atlas 800 A2", "device": "npu", "devices": {n.name: 8 for n in ns}, "pings": pings,
                       "host_pairs": pairs}}


def test_a_large_matrix_names_the_failed_device_and_labels_nodes_not_every_npu():
    rec = _large(16)
    assert [f["label"] for f in picture.failed_devices(rec)] == ["a2-01 npu3"]
    assert len(picture.axis(rec)) == 128 and len(picture.ping_cells(rec)) == 16 * 15 * 8


def test_the_picture_is_drawn_without_pyplot():
    """The Agg canvas on a Figure of its own: drawing leaves no pyplot state behind (and needs no display)."""
    import sys

    picture.render_png(a3_record())
    assert "matplotlib.pyplot" not in sys.modules or not sys.modules["matplotlib.pyplot"].get_fignums()


def test_matplotlib_is_imported_only_to_draw():
    """Other commands do not pay for matplotlib: the module, the flows and tasks.py load without it."""
    import subprocess
    import sys

    code = ("import sys, tasks, flows.verify, flows.deploy, roles.comm.picture; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'numpy', 'PIL')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=verify.Path(verify.__file__).parent.parent, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


# --- the run: where the files go, what it prints -------------------------------------------------


def _run(tmp_path, monkeypatch, json_out, report_dir=None, draw=None):
    from rich.console import Console

    c = _a3().model_copy(update={"base_dir": str(tmp_path / "node0")})
    monkeypatch.setattr(Deployment, "runner", runner_method(lambda cluster: StandInRunner(cluster)))
    monkeypatch.setenv("LLMDEPLOY_LOG_DIR", str(tmp_path / "logs"))
    if draw is not None:
        monkeypatch.setattr(picture, "render_png", draw)
    con = Console(record=True, width=250)
    code = verify.run(bind(c), con, json_out, False, report_dir)
    return c, code, con.export_text()


def test_a_run_saves_the_page_and_picture_on_node0_and_locally(tmp_path, monkeypatch, capsys):
    c, code, _ = _run(tmp_path, monkeypatch, True, str(tmp_path / "mine"))
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and not doc["ok"]
    # the JSON as it was, and the report's paths as one new key
    assert list(doc) == ["cluster", "ok", "time", "epoch", "duration_s", "nodes", "plan", "links", "host_links", "report"]
    rep = doc["report"]
    local = {k: verify.Path(v) for k, v in rep["local"].items()}
    assert {p.parent for p in local.values()} == {tmp_path / "mine"} and local["html"].name.startswith("verify-comm-sim-a3-")
    assert LABEL in local["html"].read_text() and _pixels(local["png"].read_bytes()).size == (picture.PNG_WIDTH, picture.PNG_HEIGHT)
    # the local document is the one the picture was drawn from: it draws the same page again
    record = json.loads(local["json"].read_text())
    assert record["detail"]["pings"] and picture.render_html(record, local["png"].read_bytes()) == local["html"].read_text()
    # node 0: the record (= the JSON, without the detail) and beside it the page and the picture
    base = tmp_path / "node0" / "sim-a3"
    assert rep["node0"] == {"host": "sim-a3-0", "html": f"{base}/verify-comm.html", "png": f"{base}/verify-comm.png"}
    assert json.loads((base / "verify-comm.json").read_text()) == doc
    assert (base / "verify-comm.html").read_text() == local["html"].read_text()
    assert (base / "verify-comm.png").read_bytes() == local["png"].read_bytes()


def test_by_default_the_report_goes_beside_the_log_bundles_and_the_output_says_where(tmp_path, monkeypatch):
    c, code, text = _run(tmp_path, monkeypatch, False)
    folder = tmp_path / "logs" / "sim-a3" / "verify-comm"
    (html,) = folder.glob("verify-comm-sim-a3-*.html")
    assert f"report: {html} (picture: {html.with_suffix('.png')})" in text
    assert f"on sim-a3-0: {tmp_path}/node0/sim-a3/verify-comm.html, {tmp_path}/node0/sim-a3/verify-comm.png" in text
    assert "communication FAILED" in text and "sim-a3-1/npu5 → sim-a3-0/npu5: 100.00% loss" in text  # the console says what it said
    # a second run in the same second does not overwrite the first
    _run(tmp_path, monkeypatch, False)
    assert len(list(folder.glob("*.html"))) == 2


def test_without_its_picture_the_verification_is_saved_all_the_same(tmp_path, monkeypatch, capsys):
    def broken(record):
        raise ImportError("No module named 'matplotlib'")

    c, code, _ = _run(tmp_path, monkeypatch, True, str(tmp_path / "mine"), draw=broken)
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and doc["report"]["local"]["png"] is None and doc["report"]["node0"]["png"] is None
    assert doc["report"]["problems"] == ["the picture could not be drawn: ImportError: No module named 'matplotlib'"]
    page = verify.Path(doc["report"]["local"]["html"]).read_text()
    assert LABEL in page and "the picture could not be drawn" in page
    assert json.loads((tmp_path / "node0" / "sim-a3" / "verify-comm.json").read_text())["ok"] is False
