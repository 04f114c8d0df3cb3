"""The ledger records attempts: nothing is rewritten, a release that was good
stays known as such, the rollback target follows from the attempts, and a
torn or edited line is reported and skipped."""

import json
import subprocess

import pytest

from llmdeploy.release import latest_attempt, on_cluster, release_table, rollback_target
from llmdeploy.errors import LlmdeployError
from llmdeploy.release import append_script, line_sum, parse_ledger_checked, parse_lines

A, B, C = "20261201T000000Z-aaaaaaaa", "20261202T000000Z-bbbbbbbb", "20261203T000000Z-cccccccc"


def ev(rid, result, action=None, **extra):
    rec = {"release": rid, "result": result, "time": f"t-{rid[:8]}-{result}", "who": "op@laptop", **extra}
    if action:
        rec["action"] = action
    return rec


def test_append_writes_one_checksummed_line_each_and_they_parse(tmp_path):
    path = tmp_path / "d" / "ledger.jsonl"
    for rec in (ev(A, "started"), ev(A, "good"), ev(B, "failed", reason="worker exited 3 times")):
        subprocess.run(["sh", "-c", append_script(str(path), rec)], check=True)
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    recs, problems = parse_ledger_checked(path.read_text())
    assert problems == [] and [r["result"] for r in recs] == ["started", "good", "failed"]
    assert all(r["sum"] == line_sum(r) for r in recs)


def test_an_edited_a_torn_and_a_foreign_line_are_named_and_skipped():
    good = json.dumps({**ev(A, "good"), "sum": line_sum(ev(A, "good"))})
    edited = json.loads(good)
    edited["result"] = "failed"  # someone "fixed" the record by hand
    text = "\n".join([good, json.dumps(edited), good[: len(good) // 2], '["not", "a", "record"]',
                      json.dumps({"release": "../../etc", "result": "good"}), json.dumps(ev(B, "good"))]) + "\n"
    recs, problems = parse_ledger_checked(text)
    # the first line, and the last (written before lines had a sum) are kept
    assert [(r["release"], r["result"]) for r in recs] == [(A, "good"), (B, "good")]
    assert len(problems) == 4
    assert "line 2 does not match its checksum" in problems[0]
    assert "line 3 is not JSON" in problems[1] and "line 4 is not a record" in problems[2]
    assert "'../../etc'" in problems[3]


def test_audit_lines_are_checked_the_same_way():
    rec = {"command": "deploy", "result": "good"}
    line = json.dumps({**rec, "sum": line_sum(rec)})
    recs, problems = parse_lines(line + "\n" + line.replace("good", "fine") + "\n", "audit log")
    assert len(recs) == 1 and problems and problems[0].startswith("audit log line 2")


def test_a_release_that_was_good_stays_good_after_a_failed_rollback_to_it():
    recs = [ev(A, "started"), ev(A, "good"), ev(B, "started"), ev(B, "failed", reason="worker exited"),
            ev(A, "started", "rollback", **{"from": B}), ev(A, "failed", "rollback", reason="node down", **{"from": B})]
    rows = {r["release"]: r for r in release_table(recs)}
    assert rows[A]["was_good"] and rows[A]["latest"]["result"] == "failed" and rows[A]["latest"]["action"] == "rollback"
    assert not rows[B]["was_good"]
    assert len(rows[A]["events"]) == 4 and "rollback failed (from " + B + ")" in rows[A]["events"][-1]
    # still offered, and still the default target: B is the release currently failing
    assert rollback_target(recs, A, None) == A
    assert on_cluster(recs, A) == A and latest_attempt(recs)["action"] == "rollback"
    with pytest.raises(LlmdeployError, match="was never good"):
        rollback_target(recs, A, B)


@pytest.mark.parametrize("events, current, target", [
    # B deployed fine: back to A
    ([(A, "good", None), (B, "good", None)], B, A),
    # B failed (the cluster stopped, current still A): A is brought back, not something older
    ([(C, "good", None), (A, "good", None), (B, "failed", None)], A, A),
    # A, B good, rolled back to A, then C failed: A served last, so A (not B)
    ([(A, "good", None), (B, "good", None), (A, "good", "rollback"), (C, "failed", None)], A, A),
    # after a rollback to A: the release that served before it
    ([(A, "good", None), (B, "good", None), (A, "good", "rollback")], A, B),
    # a release that failed once and was good later is a target like any
    ([(A, "good", None), (B, "failed", None), (B, "good", None), (C, "good", None)], C, B),
])
def test_the_default_target_is_the_newest_good_that_is_neither_running_nor_failing(events, current, target):
    recs = [ev(r, res, act) for r, res, act in events]
    assert rollback_target(recs, current, None) == target


def test_nothing_ever_good_means_no_target_and_says_so():
    with pytest.raises(LlmdeployError, match="no release that was ever good"):
        rollback_target([ev(A, "started"), ev(A, "failed")], None, None)
    with pytest.raises(LlmdeployError, match="no such release"):
        rollback_target([ev(A, "good")], A, C)


def test_rolled_back_notes_are_events_not_attempts():
    recs = [ev(A, "good"), ev(B, "good"), ev(A, "started", "rollback"), ev(A, "good", "rollback"), ev(B, "rolled back", to=A)]
    rows = {r["release"]: r for r in release_table(recs)}
    assert rows[B]["latest"]["result"] == "good" and rows[B]["events"][-1].startswith(f"rolled back to {A}")
    assert latest_attempt(recs)["release"] == A
