"""How a release serves, on the simulated A3 cluster: ``invoke bench``, the
quality gate (a release made SIM_SLOWER times slower per token fails it and the previous
one serves again; ``--no-gate`` and a release that cannot be replaced keep
serving and say so), and the drain before a stop (a long streaming request
during a rollback completes; with a short ``drain_s`` the tool says it was
cut).

The stand-ins' pace is node.json's ``latency``; no test here asserts a
time: the gate's decisions on recorded figures are tested in
tests/unit/test_gate.py, the stand-ins' delays only make the figures."""

from __future__ import annotations

import json

import pytest

from sim import hardware
from sim.paths import SIM_LATENCY, SIM_SLOWER, host_dir
from tests.conftest import REPO, run_invoke
from tests.integration.conftest import Stream, top_once

SIM_CLUSTER = "sim-a3"
NODES = [f"sim-a3-{i}" for i in range(4)]


def _state(node):
    return host_dir(SIM_CLUSTER, node) / "root/etc/llmdeploy-sim"


def _ledger():
    path = host_dir(SIM_CLUSTER, "sim-a3-0") / "root/var/lib/llmdeploy/sim-a3/ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _pace(per_token_s: float) -> None:
    for n in NODES:
        hw = hardware.load(_state(n))
        hw["latency"] = {**SIM_LATENCY, "per_token_s": per_token_s}
        hardware.save(_state(n), hw)


def _deploy(*extra, env=None):
    return run_invoke("deploy", "--cluster", SIM_CLUSTER, "--skip-prepare", *extra, env=env, timeout=400)


def _current() -> str:
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    return json.loads(res.stdout)["release"]


@pytest.fixture(scope="module")
def baseline(sim_cluster):
    """A first release: its gate records the baseline."""
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no earlier release to compare with (this one becomes the baseline)" in res.stdout
    good = _ledger()[-1]
    assert good["result"] == "good" and good["gate"]["verdict"] == "baseline"
    assert set(good["gate"]["figures"]) == {"ttft_p50", "ttft_p95", "tpot_p50", "tpot_p95", "output_tokens_per_s"}
    return good["release"]


@pytest.fixture
def slow(baseline):
    """The stand-ins SIM_SLOWER times slower per token while the test runs."""
    _pace(SIM_LATENCY["per_token_s"] * SIM_SLOWER)
    yield
    _pace(SIM_LATENCY["per_token_s"])


def test_bench_prints_its_table_and_json_and_keeps_them_with_the_release(baseline):
    res = run_invoke("bench", "--cluster", SIM_CLUSTER, "--concurrency", "1,2", "--requests", "4", "--output-tokens", "8")
    assert res.returncode == 0, res.stdout + res.stderr
    out = " ".join(res.stdout.split())
    for header in ("conc", "TTFT p50", "TPOT p50", "e2e p50", "tok/s", "req/s", "errors"):
        assert header in out
    assert f"kept with release {baseline} on sim-a3-0" in out
    res = run_invoke("bench", "--cluster", SIM_CLUSTER, "--concurrency", "2", "--requests", "4", "--output-tokens", "8", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["release"] == baseline and doc["recorded"] and doc["ok"]
    (lv,) = doc["levels"]
    assert lv["concurrency"] == 2 and lv["ok"] == 4 and lv["errors"] == 0 and lv["output_tokens"] == 4 * 8
    for series in ("ttft", "tpot", "itl", "e2e"):
        assert set(lv[series]) == {"mean", "p50", "p90", "p95", "p99"} and lv[series]["p50"] > 0
    assert lv["mean_prompt_tokens"] and lv["output_tokens_per_s"] > 0
    res = run_invoke("releases", "--cluster", SIM_CLUSTER, "--json")
    row = next(r for r in json.loads(res.stdout)["releases"] if r["release"] == baseline)
    assert row["bench"]["kind"] == "bench" and row["bench"]["levels"][0]["concurrency"] == 2
    assert row["gate"]["verdict"] == "baseline"


def test_top_once_json_reads_every_node_and_the_servers_load(baseline):
    doc = top_once(SIM_CLUSTER, NODES)
    assert doc["release"] == _current() and doc["system"] == "vllm-ascend"
    assert all(len(n["accelerators"]) == 16 for n in doc["nodes"])


def test_bench_names_a_bad_flag_before_connecting(baseline):
    res = run_invoke("bench", "--cluster", SIM_CLUSTER, "--concurrency", "four")
    assert res.returncode == 1 and "--concurrency 'four'" in res.stderr


def test_a_release_much_slower_per_token_fails_the_gate_and_the_previous_serves_again(baseline, slow, tmp_path):
    res = _deploy(env={"LLMDEPLOY_LOG_DIR": str(tmp_path)})
    assert res.returncode == 1, res.stdout + res.stderr
    out = " ".join(res.stdout.split())
    failed = next(r for r in reversed(_ledger()) if r["result"] == "failed")
    rid = failed["release"]
    assert failed["gate"]["verdict"] == "regressed" and failed["gate"]["against"] == baseline
    bad = {c["figure"]: c for c in failed["gate"]["checks"] if not c["ok"]}
    assert "tpot_p50" in bad
    # the figure and both values, as recorded
    said = f"TPOT p50 {bad['tpot_p50']['now']:.1f} ms against {bad['tpot_p50']['baseline']:.1f} ms in release {baseline}"
    assert said in out, out
    assert "the last good release is serving again; the deploy still failed" in out
    assert _current() == baseline
    gate_txt = (tmp_path / SIM_CLUSTER / rid / "gate.txt").read_text()
    assert "TPOT p50" in gate_txt and "regressed" in gate_txt


def test_no_gate_serves_the_slower_release_and_the_ledger_says_the_gate_was_skipped(baseline, slow):
    res = _deploy("--no-gate")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "quality gate skipped (--no-gate)" in res.stdout
    good = _ledger()[-1]
    assert good["result"] == "good" and good["gate"] == {"verdict": "skipped", "why": "--no-gate"}
    assert _current() == good["release"]
    res = run_invoke("releases", "--cluster", SIM_CLUSTER, "--events")  # the events are below the table, one a line
    assert "gate skipped: --no-gate" in " ".join(res.stdout.split())


def test_with_no_rollback_a_release_that_fails_the_gate_keeps_serving_and_says_so(baseline, slow):
    res = _deploy("--no-rollback")
    assert res.returncode == 1, res.stdout + res.stderr
    last = _ledger()[-1]
    assert last["result"] == "failed" and last["serving"] is True and last["kept"] == "--no-rollback"
    out = " ".join(res.stdout.split())
    assert f"release {last['release']} keeps serving (--no-rollback): it failed the quality gate" in out
    assert _current() == last["release"]


def test_when_the_last_good_release_cannot_come_back_the_slower_one_keeps_serving(baseline, slow):
    """A gate never makes an outage worse: the last good release lacks a file
    on one node, so it could not be started; the new one stays."""
    target = json.loads(run_invoke("releases", "--cluster", SIM_CLUSTER, "--json").stdout)["rollback_target"]
    run_sh = host_dir(SIM_CLUSTER, "sim-a3-2") / f"root/var/lib/llmdeploy/sim-a3/releases/{target}/run.sh"
    kept = run_sh.read_bytes()
    run_sh.unlink()
    try:
        res = _deploy()
    finally:
        run_sh.write_bytes(kept)
    assert res.returncode == 1, res.stdout + res.stderr
    last = _ledger()[-1]
    out = " ".join(res.stdout.split())
    assert last["result"] == "failed" and last["serving"] is True and last["gate"]["verdict"] == "regressed"
    assert f"the last good release {target} cannot come back (sim-a3-2: missing" in last["kept"]
    assert f"release {last['release']} keeps serving (the last good release {target} cannot come back" in out
    assert _current() == last["release"]


def _stream(tokens: int) -> Stream:
    """One long streamed chat request to node 0's serving address, from inside node 0."""
    return Stream(SIM_CLUSTER, "sim-a3-0", "198.19.3.10", 8000, "qwen3.8", tokens)


def test_a_long_streaming_request_completes_during_a_rollback(baseline):
    res = _deploy()  # at the baseline's pace: a release to roll back from
    assert res.returncode == 0, res.stdout + res.stderr
    stream = _stream(300)  # 3 s at 10 ms a token; deploy.drain_s is 10 s
    assert stream.first() == "first"
    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, "--to", baseline, timeout=400)
    done, chunks, said = stream.end()
    assert res.returncode == 0, res.stdout + res.stderr
    out = " ".join(res.stdout.split())
    assert "drain: 1 request in flight on sim-a3-0 (vllm:num_requests_running 1, vllm:num_requests_waiting 0); waiting up to 10s" in out, out
    assert "vLLM cannot refuse new requests while it drains" in out
    assert "drained: no request in flight on sim-a3-0 after" in out
    assert done and chunks >= 300, said


def test_a_request_longer_than_drain_s_is_reported_cut(baseline, tmp_path):
    inv = tmp_path / "inventory"
    inv.mkdir()
    text = (REPO / "inventory" / "sim_a3.py").read_text()
    assert "deploy=sim_deploy()," in text
    (inv / "sim_a3.py").write_text(text.replace("deploy=sim_deploy(),", "deploy=sim_deploy(drain_s=1),"))
    stream = _stream(3000)  # 30 s
    assert stream.first() == "first"
    res = _deploy(env={"LLMDEPLOY_INVENTORY": str(inv)})
    done, chunks, said = stream.end()
    assert res.returncode == 0, res.stdout + res.stderr
    out = " ".join(res.stdout.split())
    assert "drain: 1 request still in flight after 1s" in out and "stopping cuts them" in out, out
    # vLLM aborts what is in flight on SIGTERM (--shutdown-timeout 0): the answer ends early, finish_reason "abort"
    assert chunks < 3000 and ("abort" in said or not done), said
