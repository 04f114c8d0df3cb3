"""The engine's data and builders, no connection: the release plan and its
JSON (plan.json), release files and ids, the start order and stop phases,
the container lifecycle scripts (run against a stand-in ``docker`` on PATH)
and the readiness body checks."""

import base64
import dataclasses
import functools
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import textwrap
import time

import pytest

import systems
from flows import deploy as dep
from flows.probes import CHECKS, chat_message
from llmdeploy import lock, release
from llmdeploy import playbook
from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import DeploySettings, load_cluster
from systems.trtllm.catalogue import trtllm_qwen38_fp8
from llmdeploy.releaseplan import Probe, ReleasePlan, Service, Unit, order_services
from llmdeploy.runner import UnreachableError
from roles import containers as ctr
from flows.binding import bind

CLUSTERS = ["a3", "b200"]


def planned(name: str, image_key: str = "sha256:x", cluster=None):
    return dep.plan_release(bind(cluster or load_cluster(name)), {}, image_key)


def _labels(command: str) -> dict[str, str]:
    args = shlex.split(command)
    return dict(args[i + 1].split("=", 1) for i, a in enumerate(args[:-1]) if a == "--label")


# --- ReleasePlan <-> plan.json -----------------------------------------------------------
@pytest.mark.parametrize("name", CLUSTERS)
def test_plan_json_round_trip(name):
    rid, chash, plan = planned(name)
    text = plan.to_json()
    back = ReleasePlan.from_json(text)
    # everything but the files (which plan.json leaves out) survives, nested dataclasses included
    assert back == dataclasses.replace(plan, files={})
    assert back.to_json() == text
    assert "files" not in json.loads(text)
    assert back.release == rid and back.cluster == name
    assert all(isinstance(u, Unit) for u in back.units()) and all(isinstance(p, Probe) for p in back.ready)
    # the plan.json every node gets is that same text
    for host, files in plan.files.items():
        assert files["plan.json"] == (text, 0o644)
        assert ReleasePlan.from_json(files["plan.json"][0]) == back


def test_plan_json_keeps_probes_gates_and_bodies():
    _, _, a3 = planned("a3")
    back = ReleasePlan.from_json(a3.to_json())
    started = back.service("node0").started
    assert (started.kind, started.port, started.ip) == ("port", 13389, str(load_cluster("a3").node0.ip))
    assert back.service("workers").after == ["node0"]
    assert back.service("node0").restart == "none" and back.service("workers").restart == "each"
    chat = back.ready[-1]
    assert chat.method == "POST" and chat.check == "think" and chat.body["stream"] is True
    _, _, b200 = planned("b200")
    back = ReleasePlan.from_json(b200.to_json())
    assert back.service("world").started is None and back.service("world").restart == "group"
    assert back.ready[-1].check == "reasoning" and back.ready[-1].body["chat_template_kwargs"] == {"enable_thinking": True}
    assert back.units("b200-node-0")[0].show["serve_command"].startswith("mpirun ")


def test_from_json_defaults_for_an_older_plan():
    _, _, plan = planned("a3")
    doc = json.loads(plan.to_json())
    for key in ("ready", "stop_cleanup", "drift_env_prefixes"):
        doc.pop(key)
    for s in doc["services"]:
        s.pop("after"), s.pop("restart")
    back = ReleasePlan.from_json(json.dumps(doc))
    assert back.ready == [] and back.stop_cleanup == "" and back.drift_env_prefixes == []
    assert [s.restart for s in back.services] == ["each", "each"] and [s.after for s in back.services] == [[], []]


@pytest.mark.parametrize("name", CLUSTERS)
def test_every_host_has_plan_json_and_release_json_lists_its_files(name):
    rid, _, plan = planned(name)
    c = load_cluster(name)
    assert sorted(plan.files) == sorted(n.name for n in c.nodes) == sorted(plan.hosts())
    for host, files in plan.files.items():
        assert "plan.json" in files and "release.json" in files
        meta = json.loads(files["release.json"][0])
        assert meta["files"] == sorted(files)
        assert (meta["release"], meta["host"], meta["cluster"]) == (rid, host, name)
        # and every file named is in what the staging script unpacks, with its mode
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode(release.write_payload(files)))) as tar:
            members = {m.name: m.mode for m in tar.getmembers()}
        assert sorted(members) == meta["files"]
        assert all(members[f] == files[f][1] for f in members)


def _write_locally(tmp_path, files, payload=None):
    c = load_cluster("sim-a3").model_copy(update={"base_dir": str(tmp_path)})
    rid = "20261203T000000Z-0123abcd"
    res = subprocess.run(["bash", "-c", release.write_script(c, rid, files)], input=release.write_payload(files) if payload is None else payload,
                         capture_output=True, text=True)
    return res, tmp_path / "sim-a3" / "releases", rid


def test_release_files_arrive_on_stdin_complete_with_modes_or_not_at_all(tmp_path):
    files = {"env": ("HF_TOKEN=s3cret\n", 0o600), "run.sh": ("#!/bin/sh\necho hi\n", 0o755)}
    script = release.write_script(load_cluster("sim-a3"), "20261203T000000Z-0123abcd", files)
    assert "s3cret" not in script and base64.b64encode(b"s3cret").decode()[:6] not in script
    res, rels, rid = _write_locally(tmp_path, files)
    assert res.returncode == 0 and res.stdout.strip() == "written", res.stderr
    assert (rels / rid / "env").read_text() == "HF_TOKEN=s3cret\n"
    assert oct((rels / rid / "env").stat().st_mode & 0o777) == oct(0o600)
    assert oct((rels / rid / "run.sh").stat().st_mode & 0o777) == oct(0o755)
    assert (rels / rid / "logs").is_dir()
    # written once: a second write changes nothing
    res, _, _ = _write_locally(tmp_path, {"env": ("other\n", 0o600)})
    assert res.stdout.strip() == "exists" and (rels / rid / "env").read_text() == "HF_TOKEN=s3cret\n"


def test_a_torn_release_payload_leaves_no_directory_behind(tmp_path):
    files = {"env": ("A=1\n", 0o600)}
    good = release.write_payload(files)
    res, rels, rid = _write_locally(tmp_path, files, payload=good[: len(good) // 3])
    assert res.returncode != 0
    assert not (rels / rid).exists() and not list(rels.glob(".stage-*"))


# --- release ids ------------------------------------------------------------------------------
T = 1764000000.0  # 2025-11-24T16:00:00Z


@pytest.fixture
def fixed_time(monkeypatch):
    monkeypatch.setattr(dep, "new_id", functools.partial(release.new_id, now=T))
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(T))


def test_new_id_is_the_time_and_the_hash():
    assert release.new_id("abcdef0123456789", now=T) == time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(T)) + "-abcdef01"
    assert release.RELEASE_RE.match(release.new_id("0" * 64, now=T))


@pytest.mark.parametrize("name", CLUSTERS)
def test_same_inputs_same_time_same_release(name, fixed_time):
    rid1, h1, p1 = planned(name)
    rid2, h2, p2 = planned(name)
    assert (rid1, h1) == (rid2, h2)
    assert rid1 == f"{fixed_time}-{h1[:8]}"
    assert p1.files == p2.files
    # the deploy settings are not in what a node runs: same hash
    c = load_cluster(name)
    c2 = c.model_copy(update={"deploy": DeploySettings(ready_timeout_s=60, worker_retries=1)})
    assert planned(name, cluster=c2)[:2] == (rid1, h1)


def test_a_profile_value_changes_the_hash_and_the_release(fixed_time):
    a3 = load_cluster("a3")
    rid, h, _ = planned("a3", cluster=a3)
    prof = a3.profile.model_copy(update={"max_num_seqs": a3.profile.max_num_seqs * 2})
    rid2, h2, p2 = planned("a3", cluster=a3.model_copy(update={"profile": prof}))
    assert h2 != h and rid2 != rid and rid2.startswith(fixed_time)
    assert f"--max-num-seqs {prof.max_num_seqs}" in p2.units("a3-node-0")[0].show["serve_command"]

    b200 = load_cluster("b200")
    rid, h, _ = planned("b200", cluster=b200)
    over = b200.model_copy(update={"profile": trtllm_qwen38_fp8("qwen3.8-low-latency.yaml", overrides={"max_batch_size": 4})})
    rid2, h2, p2 = planned("b200", cluster=over)
    assert h2 != h and rid2 != rid
    assert "max_batch_size: 4" in p2.files["b200-node-0"]["trtllm-overrides.yaml"][0]
    # the image is part of the hash too
    assert planned("b200", "sha256:y", cluster=b200)[1] != h


# --- start order and stop phases ----------------------------------------------------------------
def test_order_services_refuses_a_service_that_starts_after_a_later_one():
    a, b = Service("a", units=[], after=["b"]), Service("b", units=[])
    with pytest.raises(ValueError, match=r"service 'a' starts after 'b', which is not started before it"):
        order_services([a, b])
    with pytest.raises(ValueError, match="'c'"):
        order_services([Service("b", units=[]), Service("c", units=[], after=["nope"])])
    ok = [Service("b", units=[]), Service("a", units=[], after=["b"])]
    assert order_services(ok) is ok


def test_a_misordered_playbook_is_refused(tmp_path, monkeypatch):
    (tmp_path / "serve-vllm-ascend.yaml").write_text(textwrap.dedent("""
        services:
          - name: workers
            hosts: workers
            after: [node0]
          - name: node0
            hosts: node0
            started: rpc_port
            restart: none
        ready: [health]
    """))
    monkeypatch.setattr(playbook, "PLAYBOOK_DIR", tmp_path)
    with pytest.raises(LlmdeployError, match="'workers' starts after 'node0'"):
        systems.build(bind(load_cluster("a3")), {}, dep.DRAFT_ID, None)


@pytest.mark.parametrize("name,phases", [("a3", {"node0": 1, "workers": 0}), ("b200", {"world": 0})])
def test_stop_phases_are_the_reverse_start_order_in_the_labels(name, phases):
    rid, _, plan = planned(name)
    assert {s.name: plan.stop_phase(s) for s in plan.services} == phases
    for s in plan.services:
        for u in s.units:
            lab = _labels(u.show["container_command"])
            assert lab["llmdeploy.stop_phase"] == str(phases[s.name]), (u.host, s.name)
            assert (lab["llmdeploy.cluster"], lab["llmdeploy.release"], lab["llmdeploy.service"]) == (name, rid, s.name)
            assert lab["llmdeploy.role"] == u.role


def test_single_node_vllm_plan_has_no_workers_service():
    # a3 with one node: the workers entry has no hosts and is left out; node 0 is then the only phase
    a3 = load_cluster("a3")
    one = a3.model_copy(update={"nodes": a3.nodes[:1]})
    plan = systems.build(bind(one), {}, dep.DRAFT_ID, None)
    assert [s.name for s in plan.services] == ["node0"] and plan.stop_phase(plan.services[0]) == 0
    assert _labels(plan.units()[0].show["container_command"])["llmdeploy.stop_phase"] == "0"


class _Unreachable:
    def exec(self, node, script, **kw):
        raise UnreachableError("connection refused: [Errno None] Unable to connect to port 22 on 192.0.2.10")


def test_an_unreachable_node0_is_a_clear_lock_error():
    with pytest.raises(LlmdeployError, match="a3-node-0"):
        with lock.held(_Unreachable(), load_cluster("a3"), "deploy"):
            pass


# --- container scripts, against a stand-in docker ------------------------------------------------
FAKE_DOCKER = r'''
import json, os, sys
state_file = os.environ["FAKE_DOCKER_STATE"]
st = json.load(open(state_file))
args = sys.argv[1:]
with open(os.environ["FAKE_DOCKER_CALLS"], "a") as f:
    f.write(json.dumps(args) + "\n")
cmd = args[0]
if cmd == "inspect":
    name = args[-1]
    c = st["containers"].get(name)
    if c is None:
        sys.stderr.write(f"Error: No such object: {name}\n"); sys.exit(1)
    fmt = args[args.index("--format") + 1] if "--format" in args else ""
    print(fmt.replace("{{.State.Status}}", c["status"]).replace("{{.State.ExitCode}}", str(c["code"])).strip("'"))
elif cmd == "ps":
    filt = args[args.index("--filter") + 1]
    fmt = args[args.index("--format") + 1]
    k, v = filt[len("label="):].split("=", 1)
    for name, c in st["containers"].items():
        if c["labels"].get(k) != v:
            continue
        out = fmt.replace("{{.Names}}", name)
        import re
        # docker prints "" for a label a container does not have
        out = re.sub(r'\{\{\.Label "([^"]+)"\}\}', lambda m: c["labels"].get(m.group(1), ""), out)
        print(out)
elif cmd == "logs":
    print(f"log of {args[-1]}")
elif cmd in ("stop", "rm"):
    name = args[-1]
    if name in st["containers"]:
        if cmd == "rm":
            del st["containers"][name]
        json.dump(st, open(state_file, "w"))
    else:
        sys.exit(1)
else:
    sys.exit(2)
'''


@pytest.fixture
def docker(tmp_path):
    """A ``docker`` on PATH that serves containers from a JSON file and records its calls."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "docker"
    exe.write_text(f"#!{sys.executable}\n" + FAKE_DOCKER)
    exe.chmod(0o755)
    state, calls = tmp_path / "state.json", tmp_path / "calls.jsonl"
    calls.write_text("")

    def run(script: str, containers: dict):
        state.write_text(json.dumps({"containers": containers}))
        calls.write_text("")
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FAKE_DOCKER_STATE=str(state), FAKE_DOCKER_CALLS=str(calls))
        res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path / "cwd", timeout=30)
        left = json.loads(state.read_text())["containers"]
        return res, left, [json.loads(ln) for ln in calls.read_text().splitlines()]

    (tmp_path / "cwd").mkdir()
    run.cwd = tmp_path / "cwd"
    return run


def test_parse_states():
    out = "a running 0\nb exited 137\nc missing -\n\nlonely\nd created\n"
    assert ctr.parse_states(out) == {"a": ("running", "0"), "b": ("exited", "137"), "c": ("missing", "-"), "d": ("created", "")}
    assert ctr.parse_states("") == {}


def test_states_script_quotes_odd_names(docker):
    odd = ["plain-1", "it's", "a;touch PWNED1", "$(touch PWNED2)", "`touch PWNED3`", 'q"uote', "semi;colon"]
    containers = {n: {"status": "running", "code": 0, "labels": {}} for n in odd[:3]}
    containers[odd[3]] = {"status": "exited", "code": 137, "labels": {}}
    res, _, calls = docker(ctr.states_script(odd), containers)
    assert res.returncode == 0, res.stderr
    # no name was run as shell; each reached docker as one argument, literally
    assert sorted(p.name for p in docker.cwd.iterdir()) == []
    assert [c[-1] for c in calls] == odd
    lines = res.stdout.splitlines()
    assert lines == ["plain-1 running 0", "it's running 0", "a;touch PWNED1 running 0", "$(touch PWNED2) exited 137",
                     "`touch PWNED3` missing -", 'q"uote missing -', "semi;colon missing -"]
    # names without blanks (docker's own names never have any) parse back
    got = ctr.parse_states(res.stdout)
    assert {n: got[n] for n in ("plain-1", "it's", 'q"uote', "semi;colon")} == {
        "plain-1": ("running", "0"), "it's": ("running", "0"), 'q"uote': ("missing", "-"), "semi;colon": ("missing", "-")}


def _fleet():
    """Containers of cluster k: release OLD (worker phase 0, node 0 phase 1), release KEEP, and another cluster's."""
    def lab(cluster, rel, phase, role):
        d = {"llmdeploy.cluster": cluster, "llmdeploy.release": rel, "llmdeploy.role": role}
        if phase is not None:
            d["llmdeploy.stop_phase"] = str(phase)
        return {"status": "running", "code": 0, "labels": d}

    return {
        "k-old-w": lab("k", "OLD", 0, "worker"),
        "k-old-n0": lab("k", "OLD", 1, "node0"),
        "k-keep": lab("k", "KEEP", 0, "worker"),
        "other": lab("z", "OLD", 0, "worker"),
    }


def test_stop_script_stops_one_phase_keeps_the_kept_release_and_saves_logs(docker, tmp_path):
    rels = str(tmp_path / "releases")
    res, left, calls = docker(ctr.stop_script("k", rels, "KEEP", 7, phase=0), _fleet())
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["stopped k-old-w"]
    assert sorted(left) == ["k-keep", "k-old-n0", "other"]
    assert (tmp_path / "releases" / "OLD" / "logs" / "k-old-w.final.log").read_text() == "log of k-old-w\n"
    assert ["stop", "-t", "7", "k-old-w"] in calls
    assert calls[0][:4] == ["ps", "-a", "--filter", "label=llmdeploy.cluster=k"]
    # phase 1 then takes node 0
    res, left, _ = docker(ctr.stop_script("k", rels, "KEEP", 7, phase=1), _fleet())
    assert res.stdout.splitlines() == ["stopped k-old-n0"] and sorted(left) == ["k-keep", "k-old-w", "other"]
    # no phase: every container of the cluster but the kept release's
    res, left, _ = docker(ctr.stop_script("k", rels, "KEEP", 7), _fleet())
    assert sorted(res.stdout.splitlines()) == ["stopped k-old-n0", "stopped k-old-w"] and sorted(left) == ["k-keep", "other"]
    # nothing kept: the kept release goes too; the other cluster never
    res, left, _ = docker(ctr.stop_script("k", rels, None, 7, phase=0), _fleet())
    assert sorted(res.stdout.splitlines()) == ["stopped k-keep", "stopped k-old-w"] and sorted(left) == ["k-old-n0", "other"]


def test_phases_script_lists_the_phases_present(docker):
    res, left, _ = docker(ctr.phases_script("k", "KEEP"), _fleet())
    assert res.returncode == 0 and res.stdout.split() == ["0", "1"] and len(left) == 4
    only_keep = {k: v for k, v in _fleet().items() if k in ("k-keep", "other")}
    assert docker(ctr.phases_script("k", "KEEP"), only_keep)[0].stdout.split() == []


def test_legacy_worker_without_a_phase_label_stops_in_phase_0(docker, tmp_path):
    fleet = _fleet()
    del fleet["k-old-w"]["labels"]["llmdeploy.stop_phase"]
    res, left, _ = docker(ctr.stop_script("k", str(tmp_path / "r"), "KEEP", 7, phase=0), fleet)
    assert res.stdout.splitlines() == ["stopped k-old-w"]


def test_legacy_node0_without_a_phase_label_stops_last(docker, tmp_path):
    fleet = _fleet()
    for c in fleet.values():
        c["labels"].pop("llmdeploy.stop_phase", None)
    res, _, _ = docker(ctr.phases_script("k", "KEEP"), fleet)
    assert res.stdout.split() == ["0", "1"]
    res, left, _ = docker(ctr.stop_script("k", str(tmp_path / "r"), "KEEP", 7, phase=0), fleet)
    assert res.stdout.splitlines() == ["stopped k-old-w"] and "k-old-n0" in left


def test_start_script_keeps_the_previous_attempts_log(docker, tmp_path):
    rd = tmp_path / "rel"
    (rd / "logs").mkdir(parents=True)
    (rd / "run.sh").write_text("echo started >> \"$(dirname \"$0\")/ran\"\n")
    res, left, calls = docker(ctr.start_script(str(rd), "c1", "run.sh", 3), {"c1": {"status": "exited", "code": 1, "labels": {}}})
    assert res.returncode == 0, res.stderr
    assert (rd / "logs" / "c1.attempt-2.log").read_text() == "log of c1\n"
    assert "c1" not in left and ["rm", "-f", "c1"] in calls
    assert (rd / "ran").read_text() == "started\n"
    # first start: nothing to keep
    res, _, calls = docker(ctr.start_script(str(rd), "c2", "run.sh", 1), {})
    assert res.returncode == 0 and not (rd / "logs" / "c2.attempt-0.log").exists()
    assert [c[0] for c in calls] == ["inspect"]


def test_labels_are_the_units_label_values_in_order():
    assert list(ctr.label_values("k", "R", "world", "launcher", 2, ranks="0-7")) == [
        ("llmdeploy.cluster", "k"), ("llmdeploy.release", "R"), ("llmdeploy.service", "world"),
        ("llmdeploy.role", "launcher"), ("llmdeploy.stop_phase", "2"), ("llmdeploy.ranks", "0-7")]


# --- readiness bodies --------------------------------------------------------------------------
def _sse(*deltas) -> bytes:
    chunks = [f"data: {json.dumps({'choices': [{'index': 0, 'delta': d}]})}\n\n" for d in deltas]
    return ("".join(chunks) + "data: [DONE]\n\n").encode()


def _full(message: dict) -> bytes:
    return json.dumps({"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", **message}}]}).encode()


def test_chat_message_non_streamed():
    assert chat_message(_full({"reasoning_content": "Think.", "content": "New York is in the US."})) == ("Think.", "New York is in the US.")
    assert chat_message(_full({"reasoning": "via reasoning", "content": "a"})) == ("via reasoning", "a")
    assert chat_message(_full({"content": None, "reasoning_content": None})) == ("", "")
    assert chat_message(b"  \n" + _full({"content": "<think>x</think>y"})) == ("", "<think>x</think>y")


def test_chat_message_streamed():
    body = _sse({"role": "assistant"}, {"reasoning_content": "Where "}, {"reasoning_content": "is it?"},
                {"content": "New "}, {"content": "York."}, {"content": None})
    assert chat_message(body) == ("Where is it?", "New York.")
    assert chat_message(_sse({"content": "<thi"}, {"content": "nk>hm</think>ok"})) == ("", "<think>hm</think>ok")
    # "data:" without a blank, and keep-alive lines, are read too
    assert chat_message(b': keep-alive\ndata:{"choices":[{"delta":{"content":"z"}}]}\n\ndata: [DONE]\n') == ("", "z")


def test_reasoning_check_wants_reasoning_and_content():
    check = CHECKS["reasoning"]
    assert check(_full({"reasoning_content": "Think.", "content": "Answer."}), "") is None
    assert check(_sse({"reasoning_content": "T"}, {"content": "A"}), "") is None
    # no reasoning parser: <think> in the content, nothing split out
    problem = check(_full({"content": "<think>Think.</think>Answer."}), "")
    assert problem and "expected both" in problem
    assert check(_sse({"reasoning_content": "only thinking"}), "") is not None
    assert check(_full({"reasoning_content": "T", "content": "   "}), "") is not None


def test_think_check_wants_a_think_block_in_the_content():
    check = CHECKS["think"]
    assert check(_sse({"content": "<think>"}, {"content": "plan</think>"}, {"content": "def merge(): ..."}), "") is None
    assert check(_full({"content": "\n<think>a</think>b"}), "") is None
    # reasoning split out by a parser is not what vLLM-Ascend's seed expects
    problem = check(_full({"reasoning_content": "a", "content": "b"}), "")
    assert problem and "expected content that begins with <think>" in problem and "'b'" in problem
    assert check(_full({"content": "<think>never closed"}), "") is not None
    assert check(_full({"content": "answer <think>late</think>"}), "") is not None


def test_models_and_any_checks():
    body = json.dumps({"object": "list", "data": [{"id": "qwen3.8"}, {"id": "other"}]}).encode()
    assert CHECKS["models"](body, "qwen3.8") is None
    problem = CHECKS["models"](body, "/root/.cache/m")
    assert problem == "does not list '/root/.cache/m' (has ['qwen3.8', 'other'])"
    assert CHECKS[""](b"not even json", "") is None


class _LocalShell:
    """A runner that runs each script under a local sh and counts the commands."""

    def __init__(self):
        self.scripts = []

    def exec(self, node, script, **kw):
        self.scripts.append(script)
        res = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
        return res.stdout, res.stderr, res.returncode


def test_an_audit_line_at_release_is_written_by_the_release_command(tmp_path):
    cluster = load_cluster("sim-a3").model_copy(update={"base_dir": str(tmp_path / "base")})
    sh = _LocalShell()
    with lock.held(sh, cluster, "prepare") as holder:
        assert os.path.isdir(lock.lock_dir(cluster))
        lock.audit(sh, cluster, "prepare", "good", None, held=holder, message="m")
        assert not os.path.exists(lock.audit_path(cluster))  # not yet: with the release
    assert len(sh.scripts) == 2  # acquire, then audit + release in one command
    assert not os.path.exists(lock.lock_dir(cluster))
    lines = [json.loads(x) for x in open(lock.audit_path(cluster)).read().splitlines()]
    assert [(x["command"], x["result"], x["message"]) for x in lines] == [("prepare", "good", "m")]


def test_a_failed_audit_line_still_releases_the_lock(tmp_path, capsys):
    cluster = load_cluster("sim-a3").model_copy(update={"base_dir": str(tmp_path / "base")})
    sh = _LocalShell()
    with lock.held(sh, cluster, "stop") as holder:
        os.makedirs(lock.audit_path(cluster))  # a directory where the log should be: the append fails
        lock.audit(sh, cluster, "stop", "stopped", None, held=holder)
    assert not os.path.exists(lock.lock_dir(cluster))
    assert "could not write the audit log" in capsys.readouterr().err


def test_not_yet_is_a_closed_port_or_a_try_again_status():
    from flows.engine import not_yet, poll_delay

    assert not_yet("GET /health on sim-gb300-0:8082: ChannelException: ChannelException(2, 'Connect failed')")
    assert not_yet("[Errno 111] Connection refused")
    assert not_yet("GET /health on sim-gb300-0:8082 answered 503: b'{\"status\":\"notready\"}'")
    assert not not_yet("GET /health on sim-gb300-0:8082 answered 500: b'boom'")
    assert not not_yet("POST /v1/chat/completions: the answer has no content")
    assert [poll_delay(n, 0.5) for n in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]


def _watch(answers: dict[str, list], states=None):
    """Engine.watch with the node side replaced: ``answers`` are each probe's
    problems in turn (None: passes; the last repeats), ``states`` each poll's
    unit states."""
    from flows.engine import Engine, Outcome

    cluster = load_cluster("a3")
    units = [Unit(host=cluster.node0.name, container="c-a"), Unit(host=cluster.node0.name, container="c-b")]
    plan = ReleasePlan(system="x", cluster=cluster.name, release="r", services=[Service("s", units=units, restart="each")],
                       entry_host=cluster.node0.name, entry_port=1,
                       ready=[Probe(name=n, kind="http", host=cluster.node0.name, port=1) for n in answers])
    seen, started = [], []
    states = list(states or [])

    class Fake(Engine):
        def probe(self, p):
            seen.append(p.name)
            left = answers[p.name]
            return left.pop(0) if len(left) > 1 else left[0]

        def states(self, plan, units=None):
            st = states.pop(0) if len(states) > 1 else (states[0] if states else {})
            return {f"{u.host}/{u.container}": st.get(u.container, ("running", "")) for u in plan.units()}

        def exit_reason(self, u):
            return ""

        def start_units(self, plan, units, out):
            started.append([u.container for u in units])
            return True

    eng = Fake(bind(cluster), None, None, quiet=True)
    eng.d = cluster.deploy.model_copy(update={"poll_s": 0.01, "ready_timeout_s": 2, "backoff_s": 0})
    out = Outcome(ok=True, release="r")
    return eng.watch(plan, out), out, seen, started


def test_watch_polls_a_later_probe_while_it_is_not_serving_yet():
    notready = "GET /health answered 503: b'notready'"
    ok, out, seen, _ = _watch({"health": [None], "decode /health": ["Connect failed", notready, None], "chat": [None]})
    assert ok, out.reason
    assert seen == ["health"] + ["decode /health"] * 3 + ["chat"]
    assert set(out.phases) == {"health", "decode /health + chat"}


def test_watch_fails_at_once_on_a_wrong_answer_from_a_later_probe():
    ok, out, seen, _ = _watch({"health": [None], "chat": ["POST /v1/chat/completions the answer has no content", None]})
    assert not ok and out.reason == "chat: POST /v1/chat/completions the answer has no content"
    assert seen == ["health", "chat"]


def test_watch_gives_up_on_a_later_probe_at_the_deadline_and_names_it():
    ok, out, seen, _ = _watch({"health": [None], "decode /health": ["GET /health answered 503: b'notready'"]})
    assert not ok
    assert out.reason.startswith("not ready within 2s (decode /health: GET /health answered 503")
    assert seen.count("health") == 1 and seen.count("decode /health") > 2


def test_watch_starts_the_probes_again_after_a_restart():
    # c-b exits while a later probe is not ready yet: it is restarted, and the
    # first probe must pass again before the later ones count
    exited = {"c-b": ("exited", "1")}
    ok, out, seen, started = _watch({"health": [None], "decode /health": ["Connect failed", None]},
                                    states=[{}, exited, {}])
    assert ok, out.reason
    assert started == [["c-b"]]
    assert seen == ["health", "decode /health", "health", "decode /health"]
