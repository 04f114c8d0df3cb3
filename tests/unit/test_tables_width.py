"""Every table at 80 columns (and at 200): each host name and each release id
appears whole on one line; the less important columns are left out first and
named; a pipe honours COLUMNS."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from rich.console import Console

from flows import verify
from flows.app import facts_table
from flows.deploy import summary
from flows.releases import bench_summary, print_releases, serving_text
from flows.status import status_table
from llmdeploy import report
from llmdeploy.release import release_table
from llmdeploy.releaseplan import ReleasePlan, Service, Unit
from llmdeploy.runner import FAILED, OK, UNREACHABLE, HostResult
from tests.conftest import INVOKE, tool_env

REPO = Path(__file__).resolve().parents[2]
HOSTS = [f"sim-gb300-1p2d-{i}" for i in range(16)]
RIDS = ["20261204T074256Z-b5104990", "20261204T081512Z-0c9e77a1", "20261204T090001Z-4f2d8e13", "20261204T093347Z-77aa01fe"]
CLUSTER = NS(name="sim-gb300-1p2d", node0=NS(name=HOSTS[0]), platform_info=NS(name="GB300"), base_dir="/var/lib/llmdeploy",
             nodes=[NS(name=h, ip=f"198.19.7.{i + 10}") for i, h in enumerate(HOSTS)])
LABELS = {"ranks": "ranks"}
WIDTHS = (80, 200)


def _text(width: int, draw) -> str:
    con = Console(width=width, record=True, file=open(os.devnull, "w"))
    draw(con)
    return con.export_text()


def _whole(text: str, word: str) -> bool:
    """``word`` on a line of its own, not cut nor run into another word."""
    return any(re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", ln) for ln in text.splitlines())


def _fits(text: str, width: int) -> None:
    too_long = [ln for ln in text.splitlines() if len(ln.rstrip()) > width]
    assert not too_long, too_long


def _status_rows(releases: list[str], drift: bool = False) -> list[list[str]]:
    rows = []
    for i, h in enumerate(HOSTS):
        rid = releases[i % len(releases)]
        d = "[red]environment NCCL_IB_HCA: running 'mlx5_0', release 'mlx5_1'[/]" if drift and i == 3 else ""
        rows.append([h, rid, "decode0" if i % 2 else "prefill0", f"{i * 4}-{i * 4 + 3}", "running", "sha256:4f2d8e13aa77",
                     f"{3600 + i}s", d])
    rows.append(["sim-gb300-1p2d-16", "-", "-", "-", "[red]unreachable: ssh: connect to host 198.19.7.26 port 22: No route to host[/]",
                 "-", "-", ""])
    return rows


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("releases,drift", [(RIDS[2:3], False), (RIDS[2:3], True), (RIDS[1:3], True)])
def test_status_keeps_host_names_and_release_ids_whole(width, releases, drift):
    plan = NS(show_labels=LABELS)
    text = _text(width, lambda con: con.print(status_table(CLUSTER, con, plan, _status_rows(releases, drift), drift)))
    _fits(text, width)
    for word in HOSTS + ["sim-gb300-1p2d-16"] + releases:
        assert _whole(text, word), (word, text)
    # the plan's unit values stay on their host's line
    assert "0-3" in text.split("sim-gb300-1p2d-0 ")[1].split("\n")[0]
    assert "ranks" in text and (drift or "drift" not in text)


def test_status_leaves_out_image_first_and_wide_keeps_everything():
    plan = NS(show_labels=LABELS)
    narrow = _text(80, lambda con: con.print(status_table(CLUSTER, con, plan, _status_rows(RIDS[2:3]), False)))
    assert "left out at 80 columns: image" in narrow and "sha256:" not in narrow and "ranks" in narrow
    assert f"release {RIDS[2]}" in narrow  # one release on every node: said once, in the title
    wide = _text(80, lambda con: report.print_table(con, status_table(CLUSTER, con, plan, _status_rows(RIDS[2:3]), False, True), True))
    assert "sha256:4f2d8e13aa77" in wide and "left out" not in wide and _whole(wide, RIDS[2]) and _whole(wide, HOSTS[15])
    full = _text(200, lambda con: con.print(status_table(CLUSTER, con, plan, _status_rows(RIDS[2:3]), False)))
    header = next(ln for ln in full.splitlines() if "host" in ln)
    assert "release" in header and "image" in header and "left out" not in full


GATES = [{"verdict": "baseline", "key": "k", "figures": {"tpot_p50": 20.3}}, {"verdict": "skipped", "why": "--no-gate"},
         {"verdict": "pass", "key": "k", "figures": {"tpot_p50": 21.0}}, {"verdict": "regressed", "key": "k", "figures": {"tpot_p50": 61.4}}]
BENCH = {"time": "2026-12-04T02:10:00Z", "kind": "smoke", "levels": [
    {"concurrency": 1, "ttft": {"p50": 41.0}, "tpot": {"p50": 20.3}, "output_tokens_per_s": 190.0, "errors": 0},
    {"concurrency": 4, "ttft": {"p50": 60.2}, "tpot": {"p50": 22.0}, "output_tokens_per_s": 702.5, "errors": 2}]}


def _ledger() -> list[dict]:
    recs, prev = [], None
    for k, rid in enumerate(RIDS):
        base = {"release": rid, "who": "alice@laptop", "image_id": "sha256:4f2d8e13aa77bb01", "config_hash": "abcdef0123456789"}
        recs.append({**base, "time": f"2026-12-04T0{k}:00:00Z", "result": "started"})
        recs.append({**base, "time": f"2026-12-04T0{k}:05:00Z", "result": "good" if k != 3 else "failed", "gate": GATES[k],
                     "reason": "worker exited 3 times; last reason: out of device memory"})
        if prev:
            recs.append({"release": prev, "time": f"2026-12-04T0{k}:09:00Z", "who": "bob@ops", "result": "good", "action": "rollback",
                         "from": rid})
        prev = rid
    return recs


def _rows() -> list[dict]:
    """What ``invoke releases`` shows: the ledger's rows with each release's last benchmark."""
    rows = release_table(_ledger())
    for r in rows:
        r["bench"] = bench_summary(BENCH if r["release"] != RIDS[3] else None)
    return rows


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("events", [False, True])
def test_releases_keep_every_id_whole(width, events):
    rows = _rows()
    text = _text(width, lambda con: print_releases(CLUSTER, con, rows, RIDS[2], RIDS[1], events))
    _fits(text, width)
    for rid in RIDS:
        assert _whole(text, rid), (rid, text)
    assert "current" in text and "rollback target" in text and "never" in text
    # the gate's verdict on every release, in a column of its own or in "gate / bench"
    for v in ("baseline", "skipped", "pass", "regressed"):
        assert _whole(text, v), (v, text)
    table = text.split("every release's events")[0] if not events else text.split(f"\n{RIDS[0]}\n")[0]
    assert "rollback good (from" not in table  # the events are not in one wrapped cell
    if events:
        for r in rows:
            after = " ".join(text.split(f"\n{r['release']}\n", 1)[1].split())
            for e in r["events"] + serving_text(r).splitlines():
                # every event, the gate's figure and the benchmark on their own line(s), after the release's id
                assert " ".join(e.split()) in after, (e, text)
        for rid in RIDS[1:]:
            assert _whole(text, f"(from {rid})")
        assert "gate skipped: --no-gate" in text and "smoke c4: TTFT 60.2 ms, 702.5 tok/s, 2 errors" in text


def test_releases_at_80_columns_take_a_line_per_release_and_name_what_they_leave_out():
    text = _text(80, lambda con: print_releases(CLUSTER, con, _rows(), RIDS[2], RIDS[1]))
    lines = [ln for ln in text.splitlines() if ln.startswith("│")]
    assert len(lines) == len(RIDS), text  # a line per release
    assert "left out at 80 columns: gate / bench, image" in text and "--events" in text
    # the gate's verdict alone, on its release's line
    assert [ln.split("│")[4].strip() for ln in lines] == ["baseline", "skipped", "pass", "regressed"], text
    # no room for a column of marks: they are said, with the whole ids, in the title
    said = [ln.strip() for ln in text.splitlines()[:4]]
    assert f"current {RIDS[2]}" in said and f"rollback target {RIDS[1]}" in said, text


@pytest.mark.parametrize("width", [100, 120, 160])
def test_releases_between_80_and_200_columns_keep_the_marks_and_a_line_per_release(width):
    text = _text(width, lambda con: print_releases(CLUSTER, con, _rows(), RIDS[2], RIDS[1]))
    _fits(text, width)
    lines = [ln for ln in text.splitlines() if ln.startswith("│")]
    assert len(lines) == len(RIDS), text
    assert "current" in lines[2] and "rollback target" in lines[1] and "pass" in lines[2]


def test_releases_at_200_columns_show_the_gate_and_the_benchmark_and_wide_everything():
    full = _text(200, lambda con: print_releases(CLUSTER, con, _rows(), RIDS[2], RIDS[1]))
    assert "left out" not in full and "gate / bench" in full and "sha256:4f2d8e13aa7" in full
    assert "702.5" in full and "61.4" in full  # the last benchmark, the TPOT the gate judged
    wide = _text(80, lambda con: print_releases(CLUSTER, con, _rows(), RIDS[2], RIDS[1], wide=True))
    assert "left out" not in wide and "smoke c4: TTFT 60.2 ms, 702.5 tok/s, 2 errors" in wide and "abcdef0123456789" in wide
    for rid in RIDS:
        assert _whole(wide, rid)


def test_releases_json_is_the_same_whatever_the_width(monkeypatch, capsys):
    from flows import releases as history

    class FakeRunner:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    def read_ledger(runner, cluster, problems, benches):
        benches.update({rid: BENCH for rid in RIDS[:3]})
        return _ledger(), RIDS[2]

    # the stand-in cluster's binding: only its runner is asked for
    dep = NS(cluster=CLUSTER, runner=lambda **kw: FakeRunner(CLUSTER, **kw))
    monkeypatch.setattr(history, "read_ledger", read_ledger)
    docs = []
    for width in WIDTHS:
        assert history.releases(dep, Console(width=width, file=open(os.devnull, "w")), True) == 0
        docs.append(capsys.readouterr().out)
    doc = json.loads(docs[0])
    assert docs[0] == docs[1] and [r["release"] for r in doc["releases"]] == RIDS
    row = doc["releases"][2]
    assert set(row) == {"release", "time", "who", "image_id", "config_hash", "was_good", "last_good", "latest", "result", "gate", "events", "bench"}
    assert row["gate"] == GATES[2] and row["bench"]["levels"][1]["output_tokens_per_s"] == 702.5
    assert doc["current"] == RIDS[2] and doc["rollback_target"] == RIDS[1]


def _facts(i: int) -> HostResult:
    h = HOSTS[i]
    if i == 5:
        return HostResult(h, UNREACHABLE, "ssh: connect to host 198.19.7.15 port 22: Connection timed out")
    f = {"hostname": h, "os": "Debian GNU/Linux 12 (bookworm)", "kernel": "6.1.0-28-arm64", "cpus": 144, "numa_nodes": 2,
         "mem_total_gib": 884.5, "model_disk_free_gib": 3120.7, "accelerator": "gpu", "devices_healthy": 4,
         "devices": [{"numa": d // 2} for d in range(4)], "container_engine": "docker 26.1.5",
         "nic": {"name": "enP6p3s0f0np0", "ipv4": [f"198.19.7.{i + 10}/24"], "mtu": 9000, "up": True},
         "problems": ["ib port mlx5_1/1 is Down, want Active/LinkUp at 400"] if i == 7 else []}
    return HostResult(h, OK, "", data=f)


@pytest.mark.parametrize("width", WIDTHS)
def test_facts_and_recap_keep_host_names_whole(width):
    per_host = {h: _facts(i) for i, h in enumerate(HOSTS)}
    recap = {h: {OK: 1} if i not in (5, 9) else {UNREACHABLE: 1} if i == 5 else {FAILED: 1, OK: 3} for i, h in enumerate(HOSTS)}
    text = _text(width, lambda con: (con.print(facts_table(CLUSTER, con, per_host)), con.print(report.recap_table(recap))))
    _fits(text, width)
    for h in HOSTS:
        assert sum(1 for ln in text.splitlines() if _whole(ln, h)) >= 2, (h, text)  # in the facts table and the recap
    assert "4/4 GPU" in text and _whole(text, "198.19.7.10/24")
    assert ("left out" in text) == (width == 80)


def _verify_doc() -> dict:
    nodes = {}
    for i, h in enumerate(HOSTS):
        bad = i == 3
        other = HOSTS[(i + 1) % 16]
        nodes[h] = {"reachable": True, "checks": {
            "gpus": {"ok": True, "summary": "4/4", "failures": []},
            "topology": {"ok": True, "summary": "read", "failures": []},
            "ibstat": {"ok": not bad, "summary": "3/4" if bad else "4/4", "failures": ["mlx5_1 port 1 Down (want Active/LinkUp 400)"] if bad else []},
            "nic": {"ok": True, "summary": "up, mtu 9000", "failures": []},
            "host_net": {"ok": not bad, "summary": "14/15" if bad else "15/15",
                         "failures": [f"{h} -> {other}: full-MTU ping lost (message too long)"] if bad else []},
        }}
    nodes["sim-gb300-1p2d-16"] = {"reachable": False, "error": "ssh: connect to host 198.19.7.26 port 22: No route to host", "checks": {}}
    return {"nodes": nodes, "ok": False}


@pytest.mark.parametrize("width", WIDTHS)
def test_verify_comm_keeps_host_names_whole(width):
    doc = _verify_doc()
    text = _text(width, lambda con: verify._print(con, CLUSTER, doc))
    for h in HOSTS + ["sim-gb300-1p2d-16"]:
        assert _whole(text, h), (h, text)
    table = text.split("communication FAILED")[0]
    _fits(table, width)
    # the failure names both hosts whole, in its cell or on a line below the table
    flat = " ".join(text.split())
    assert _whole(text, "sim-gb300-1p2d-4:") and "full-MTU ping lost" in flat and "mlx5_1 port 1 Down" in flat


def test_deploy_summary_keeps_host_names_whole():
    units = [Unit(host=h, container=f"sim-gb300-1p2d-{RIDS[2]}-{'decode0' if i % 2 else 'prefill0'}", role="decode0" if i % 2 else "prefill0",
                  show={"ranks": f"{i * 4}-{i * 4 + 3}"}) for i, h in enumerate(HOSTS)]
    plan = ReleasePlan(system="x", cluster=CLUSTER.name, release=RIDS[2], services=[Service(name="prefill0", units=units)],
                       entry_host=HOSTS[0], entry_port=8000, show_labels=LABELS)
    states = {f"{u.host}/{u.container}": ("running", "") for u in units}
    for width in WIDTHS:
        text = _text(width, lambda con: con.print(summary(CLUSTER, plan, states, {}, con)))
        _fits(text, width)
        for h in HOSTS:
            assert _whole(text, h), (h, text)
        for u in units if width == 200 else ():
            assert _whole(text, u.container)
        assert "12-15" in text.split("sim-gb300-1p2d-3 ")[1].split("\n")[0]


ROWS = "[[h, %r, 'decode0', '0-3', 'running', 'sha256:4f2d8e13aa77', '3600s', ''] for h in %r]" % (RIDS[2], HOSTS)
SCRIPT = f"""
from types import SimpleNamespace as NS
from llmdeploy import report
from flows.status import status_table
con = report.console()
cl = NS(name="sim-gb300-1p2d")
print("width", con.width)
con.print(status_table(cl, con, NS(show_labels={{"ranks": "ranks"}}), {ROWS}, False))
"""


@pytest.mark.parametrize("columns,want", [("80", 80), ("120", 120), (None, 200), ("", 200), ("x", 200)])
def test_a_pipe_honours_columns(columns, want):
    env = tool_env({"PYTHONPATH": str(REPO), **({"COLUMNS": columns} if columns is not None else {})})
    res = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines()[0] == f"width {want}"
    _fits(res.stdout, want)
    for h in HOSTS:
        assert _whole(res.stdout, h)
    assert _whole(res.stdout, RIDS[2]) and ("left out" in res.stdout) == (want == 80)


def test_releases_task_has_events_and_wide_flags():
    res = subprocess.run(INVOKE + ["releases", "--help"], cwd=REPO, capture_output=True, text=True,
                         stdin=subprocess.DEVNULL, env=tool_env({"PYTHONPATH": str(REPO)}))
    assert res.returncode == 0 and "--events" in res.stdout and "--wide" in res.stdout, res.stdout + res.stderr
