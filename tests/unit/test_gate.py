"""The quality gate's decision on recorded numbers (llmdeploy.gate), the
drain's reading of metrics pages (flows.probes.inflight), the bench flags,
the bench records on node 0 and the plan's drain in plan.json."""

from __future__ import annotations

import json

import pytest

from flows import bench
from flows.probes import inflight
from llmdeploy import gate
from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import GateSettings, load_cluster
from llmdeploy.releaseplan import ReleasePlan
from roles.release import bench_append_script, ledger_script, parse_benches
from flows.binding import bind

TOL = GateSettings().tolerance.model_dump()


def level(ttft50, ttft95, tpot50, tpot95, tps, errors=0, ok=16):
    return {"concurrency": 4, "requests": ok + errors, "ok": ok, "errors": errors, "error_reasons": {"HTTP 503: busy": errors} if errors else {},
            "ttft": {"p50": ttft50, "p95": ttft95}, "tpot": {"p50": tpot50, "p95": tpot95}, "output_tokens_per_s": tps}


# recorded figures of a release whose stand-ins streamed at 20 ms a token, then at 60 ms (3x slower)
BASE = level(41.0, 55.0, 20.3, 22.8, 190.0)
SLOW = level(43.0, 60.0, 60.6, 64.1, 64.5)


def test_the_first_release_records_the_baseline():
    v = gate.judge(BASE, "k", None, TOL, 5.0, 0)
    assert v.verdict == "baseline" and v.ok and v.figures["tpot_p50"] == 20.3


def test_three_times_slower_per_token_fails_naming_the_figure_and_both_values():
    v = gate.judge(SLOW, "k", ("20261204T100000Z-aaaaaaaa", gate.figures(BASE)), TOL, 5.0, 0)
    assert v.verdict == "regressed" and not v.ok
    bad = {c.figure for c in v.checks if not c.ok}
    assert bad == {"tpot_p50", "tpot_p95", "output_tokens_per_s"}
    reason = v.reason()
    assert "TPOT p50 60.6 ms against 20.3 ms in release 20261204T100000Z-aaaaaaaa" in reason
    assert "output tokens/s 64.5 tok/s against 190.0 tok/s" in reason


def test_within_tolerance_passes_and_a_change_below_the_floor_is_noise():
    v = gate.judge(level(50.0, 60.0, 24.0, 30.0, 170.0), "k", ("r", gate.figures(BASE)), TOL, 5.0, 0)
    assert v.verdict == "pass", v.reason()
    # 1 ms -> 4 ms is 4x, but under the 5 ms floor: noise, not a regression
    tiny = level(1.0, 1.2, 0.2, 0.3, 900.0)
    assert gate.judge(level(4.0, 4.5, 0.8, 1.0, 880.0), "k", ("r", gate.figures(tiny)), TOL, 5.0, 0).verdict == "pass"
    assert gate.judge(level(4.0, 4.5, 0.8, 1.0, 880.0), "k", ("r", gate.figures(tiny)), TOL, 0.0, 0).verdict == "regressed"


def test_errors_in_the_smoke_benchmark_fail_the_gate_with_their_reasons():
    v = gate.judge(level(41.0, 55.0, 20.3, 22.8, 190.0, errors=2, ok=14), "k", None, TOL, 5.0, 0)
    assert v.verdict == "failed" and "2x HTTP 503: busy" in v.reason()
    assert gate.judge(level(41.0, 55.0, 20.3, 22.8, 190.0, errors=2, ok=14), "k", None, TOL, 5.0, 2).verdict == "baseline"


def test_the_baseline_is_the_newest_good_release_with_figures_under_the_same_key():
    def rec(rid, result, verdict, key="sys/m/n16", figures=None):
        return {"release": rid, "result": result, "gate": {"verdict": verdict, "key": key, "figures": figures or {"tpot_p50": 1.0}}}
    records = [rec("r1", "good", "baseline"), rec("r2", "good", "pass", figures={"tpot_p50": 2.0}), rec("r3", "failed", "regressed"),
               rec("r4", "good", "skipped"), rec("r5", "good", "pass", key="sys/m/n32")]
    assert gate.baseline(records, "sys/m/n16") == ("r2", {"tpot_p50": 2.0})
    assert gate.baseline(records, "sys/m/n16", exclude="r2") == ("r1", {"tpot_p50": 1.0})
    assert gate.baseline(records, "other") is None


def test_the_ledger_keeps_a_small_record_of_the_verdict():
    v = gate.judge(SLOW, "k", ("r1", gate.figures(BASE)), TOL, 5.0, 0)
    v.levels = [SLOW]
    doc = v.record()
    assert set(doc) == {"verdict", "key", "figures", "against", "checks"} and doc["against"] == "r1"
    files = bench.verdict_files(v)
    assert "TPOT p50" in files["gate.txt"] and "regressed" in files["gate.txt"]
    assert json.loads(files["gate.json"])["levels"] == [SLOW]


# --- in-flight requests from each server's metrics page ---------------------------------------------
def test_inflight_adds_the_named_prometheus_samples_over_their_labels():
    page = (b'# HELP vllm:num_requests_running Number of requests in model execution batches.\n'
            b'# TYPE vllm:num_requests_running gauge\n'
            b'vllm:num_requests_running{engine="0",model_name="q"} 2.0\n'
            b'vllm:num_requests_running{engine="1",model_name="q"} 1.0\n'
            b'vllm:num_requests_waiting{engine="0",model_name="q"} 1.0\n'
            b'vllm:num_requests_running_total 99\n')
    n, said = inflight(page, ["vllm:num_requests_running", "vllm:num_requests_waiting"])
    assert n == 4 and said == "vllm:num_requests_running 3, vllm:num_requests_waiting 1"
    with pytest.raises(ValueError, match="no sample of sglang:num_running_reqs"):
        inflight(page, ["sglang:num_running_reqs"])


def test_inflight_reads_trtllm_iteration_statistics():
    assert inflight(b'[{"numActiveRequests": 3, "numQueuedRequests": 1, "iter": 7}]', ["numActiveRequests", "numQueuedRequests"])[0] == 4
    assert inflight(b"[]", ["numActiveRequests"]) == (0, "no iteration since the last read")


# --- flags and records -----------------------------------------------------------------------------
@pytest.mark.parametrize("kw, said", [
    ({"concurrency": "1,x"}, "--concurrency '1,x'"),
    ({"concurrency": "0"}, "each level is 1 to 4096"),
    ({"requests": "many"}, "--requests 'many': not a whole number"),
    ({"output_tokens": 1}, "--output-tokens 1: expected 2 to"),
    ({"duration": "-1"}, "--duration -1"),
    ({"prompts": "/nonexistent/prompts.txt"}, "--prompts /nonexistent/prompts.txt"),
])
def test_a_bad_bench_flag_is_named(kw, said):
    args = {"concurrency": "1,4", "requests": 32, "input_tokens": 128, "output_tokens": 128, "prompts": None, "duration": "300"} | kw
    with pytest.raises(LlmdeployError, match=__import__("re").escape(said)):
        bench.load_from_flags(**args)


def test_bench_records_are_kept_in_the_releases_directory_and_read_back_with_the_ledger():
    c = load_cluster("sim-a3")
    rid = "20261204T100000Z-abcdef12"
    script = bench_append_script(c, rid, {"release": rid, "kind": "bench", "levels": []})
    assert f"{c.base_dir}/{c.name}/releases/{rid}/bench.jsonl" in script and "flock" in script
    assert "bench.jsonl" in ledger_script(c, benches=True) and "bench.jsonl" not in ledger_script(c)
    from llmdeploy.release import line_sum

    good = {"release": rid, "kind": "gate", "levels": []}
    good["sum"] = line_sum(good)
    edited = dict(good, kind="bench")
    import shlex
    import subprocess

    from roles.facts import section

    lines = f"{json.dumps(good)}\n{json.dumps(edited)}\n"
    out = subprocess.run(["sh", "-c", section("bench", f"printf %s {shlex.quote(lines)}")], capture_output=True, text=True).stdout
    recs, problems = parse_benches(out)
    assert recs == {rid: good} and len(problems) == 1 and "checksum" in problems[0]


def test_every_system_plans_a_drain_and_plan_json_keeps_it():
    from flows.deploy import plan_release

    for name, refuse in (("sim-a3", []), ("sim-b200", []), ("sim-gb300-1p2d", ["frontend"]), ("sim-h200-sglang", [])):
        c = load_cluster(name)
        _, _, plan = plan_release(bind(c), {}, c.image.ref)
        assert plan.metrics is not None and plan.metrics.probe.path == "/metrics" and plan.metrics.running and plan.metrics.waiting
        assert plan.drain is not None and plan.drain.refuse_first == refuse
        assert plan.drain.note or refuse  # what cannot be drained is said
        back = ReleasePlan.from_json(plan.to_json())
        assert back.drain == plan.drain and back.metrics == plan.metrics
    old = json.loads(plan.to_json())
    old.pop("drain")
    old.pop("metrics")
    back = ReleasePlan.from_json(json.dumps(old))
    assert back.drain is None and back.metrics is None


# --- the drain's decisions (flows.engine.Engine.drain), on a fake clock ---------------------------
class FakeTime:
    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now

    def sleep(self, s):
        self.now += s


def draining(monkeypatch, readings, drain_s=10.0, refused=False, cluster="sim-gb300-1p2d"):
    """An engine whose metrics read ``readings`` in turn (the last one for ever); (engine, what it said, the signals sent)."""
    import flows.engine as engine
    from flows.deploy import plan_release
    from rich.console import Console

    clock = FakeTime()
    monkeypatch.setattr(engine, "time", clock)
    monkeypatch.setattr(engine.interrupt, "sleep", clock.sleep)  # the engine sleeps in slices that look at the Ctrl-C flag
    c = load_cluster(cluster)
    c = c.model_copy(update={"deploy": c.deploy.model_copy(update={"drain_s": drain_s})})
    _, _, plan = plan_release(bind(c), {}, c.image.ref)
    said, signals = [], []
    eng = engine.Engine(bind(c), None, Console(), quiet=False)
    eng.say = said.append
    seq = list(readings)
    eng._inflight = lambda d: seq.pop(0) if len(seq) > 1 else seq[0]
    eng._refuse = lambda p, services: signals.append(list(services)) or refused
    return eng, plan, said, signals, clock


def test_the_drain_waits_until_nothing_is_in_flight(monkeypatch):
    eng, plan, said, signals, _ = draining(monkeypatch, [(2, "dynamo_frontend_inflight_requests 2"), (1, "x 1"), (0, "x 0")])
    assert eng.drain(plan, refuse=False) == 0
    assert signals == []
    assert said[0].startswith("drain: 2 requests in flight on sim-gb300-1p2d-0 (dynamo_frontend_inflight_requests 2); waiting up to 10s")
    assert said[-1].startswith("drained: no request in flight on sim-gb300-1p2d-0 after")


def test_the_drain_ends_at_drain_s_and_says_how_many_are_cut(monkeypatch):
    eng, plan, said, _, clock = draining(monkeypatch, [(3, "vllm:num_requests_running 3")], drain_s=5, cluster="sim-a3")
    assert eng.drain(plan) == 3
    assert clock.now >= 5
    assert "3 requests still in flight after 5s (vllm:num_requests_running 3): stopping cuts them" in said[-1]
    assert "vLLM cannot refuse new requests" in said[0]


def test_dynamo_refuses_new_work_first_and_a_frontend_that_exited_has_drained(monkeypatch):
    eng, plan, said, signals, _ = draining(monkeypatch, [(1, "x 1"), (None, "GET /metrics on h:8000: ChannelException: Connect failed")], refused=True)
    running = iter([True, True, False])  # its listener closed, it still finishes its streams, then exits
    eng._still_running = lambda p, services: next(running)
    assert eng.drain(plan) == 0
    assert signals == [["frontend"]]
    assert said[-1].startswith("drained: frontend finished what it held and exited")


def test_a_frontend_that_closed_its_listener_but_still_runs_at_drain_s_is_said_to_be_cut(monkeypatch):
    eng, plan, said, _, clock = draining(monkeypatch, [(None, "GET /metrics on h:8000: ChannelException: Connect failed")], drain_s=3,
                                         refused=True)
    eng._still_running = lambda p, services: True
    assert eng.drain(plan) is None and clock.now >= 3
    assert "frontend still finishing its requests after 3s: stopping cuts them" in said[-1]


def test_nothing_to_drain_and_unknown_drains_are_said(monkeypatch):
    eng, plan, said, _, _ = draining(monkeypatch, [(None, "GET /metrics on h:8000: ChannelException: Connect failed")])
    assert eng.drain(plan, refuse=False) is None and "nothing answers" in said[-1]
    eng, plan, said, _, _ = draining(monkeypatch, [(0, "")], drain_s=0)
    assert eng.drain(plan) is None and "drain_s is 0" in said[-1]
    eng, plan, said, _, _ = draining(monkeypatch, [(0, "")])
    plan.metrics = None
    assert eng.drain(plan) is None and "does not say how to drain it" in said[-1]
