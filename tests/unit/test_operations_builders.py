"""What the operations on a running cluster build and parse, no connection:
the plan built once per command (and byte-identical to building it with its
id), attempt numbers that continue a release's across commands, every unit's
log of a node (``logs --service``), and the readiness checks a system adds."""

import json
import shlex
from unittest import mock

import pytest
from rich.console import Console

import systems
from flows import deploy as dep
from flows import probes
from flows.engine import Engine, Outcome, unit_key
from llmdeploy.inventory import list_clusters, load_cluster
from llmdeploy.release import new_id
from llmdeploy.releaseplan import Probe, ReleasePlan, Service, Unit
from roles import containers as ctr
from roles import release as rel
from roles import status as st
from tests.unit.test_engine import docker  # noqa: F401 (the stand-in docker fixture)
from flows.binding import bind
from tests.binding import runners

T = 1764000000.0


# --- one build per plan ------------------------------------------------------------------------
@pytest.mark.parametrize("name", list_clusters())
def test_the_plan_built_once_is_the_plan_built_with_its_id(name, monkeypatch):
    """The placeholder id the hash is computed with, then replaced: every
    file, unit, probe and plan.json byte-identical to a build with the real id."""
    cluster = load_cluster(name)
    monkeypatch.setattr(dep, "new_id", lambda chash: new_id(chash, now=T))
    builds = []
    real_build = systems.build
    monkeypatch.setattr(systems, "build", lambda *a: builds.append(a[2]) or real_build(*a))
    rid, _, plan = dep.plan_release(bind(cluster), {}, "sha256:x", "sha256:x")
    assert builds == [dep.DRAFT_ID]
    direct = real_build(bind(cluster), {}, rid, "sha256:x")
    assert plan.to_json() == direct.to_json()
    for host, files in direct.files.items():
        mine = {k: v for k, v in plan.files[host].items() if k not in ("plan.json", "release.json")}
        assert mine == {k: v for k, v in files.items() if k != "release.json"}
        meta = json.loads(plan.files[host]["release.json"][0])
        assert {k: v for k, v in meta.items() if k not in ("files", "secret_keys")} == json.loads(files["release.json"][0])


def test_a_system_that_derives_something_from_the_id_is_refused(monkeypatch):
    real_build = systems.build

    def build(cluster, prepared, rid, image_id):
        plan = real_build(cluster, prepared, rid, image_id)
        host = next(iter(plan.files))
        plan.files[host]["odd"] = (f"date {rid.split('-')[0]}\n", 0o644)
        return plan

    monkeypatch.setattr(systems, "build", build)
    with pytest.raises(ValueError, match="other than the id itself"):
        dep.plan_release(bind(load_cluster("a3")), {}, "sha256:x")


def test_deploy_check_builds_the_plan_once(monkeypatch, capsys):
    builds = []
    real_build = systems.build
    monkeypatch.setattr(systems, "build", lambda *a: builds.append(a[2]) or real_build(*a))
    assert dep.deploy(bind(load_cluster("gb300-agentic")), Console(quiet=True), True, True, False, False, None, 0, True, None, None) == 0
    assert len(builds) == 1 and json.loads(capsys.readouterr().out)["system"] == "dynamo"


# --- attempt numbers ---------------------------------------------------------------------------
def test_start_script_records_the_attempt_number(docker, tmp_path):  # noqa: F811
    rd = tmp_path / "rel"
    (rd / "logs").mkdir(parents=True)
    (rd / "run.sh").write_text("true\n")
    res, _, _ = docker(ctr.start_script(str(rd), "c1", "run.sh", 7), {"c1": {"status": "exited", "code": 1, "labels": {}}})
    assert res.returncode == 0, res.stderr
    assert (rd / "logs" / "c1.attempt").read_text() == "7\n" and (rd / "logs" / "c1.attempt-6.log").exists()


def test_parse_attempts_prefers_the_record_and_falls_back_on_the_kept_logs():
    out = ("recorded a.x.attempt 4\nlog a.x.attempt-2.log\nlog b.attempt-1.log\nlog b.attempt-3.log\n"
           "recorded c.attempt 2\nrecorded d.attempt junk\nlog e.attempt-x.log\nnoise\n")
    assert rel.parse_attempts(out) == {"a.x": 4, "b": 4, "c": 2}
    # a stopped start's log is named for its own number: the record says which start was the last
    assert rel.parse_attempts("log w.attempt-3.log\nlog w.attempt-4.log\nrecorded w.attempt 4\n") == {"w": 4}


def test_release_script_reads_the_attempts_of_a_release_directory(tmp_path):
    import subprocess

    cluster = load_cluster("sim-a3").model_copy(update={"base_dir": str(tmp_path)})
    rid = "20261101T000000Z-0123abcd"
    logs = tmp_path / "sim-a3" / "releases" / rid / "logs"
    logs.mkdir(parents=True)
    (logs / "w1.attempt").write_text("3\n")
    (logs / "w1.attempt-2.log").write_text("")
    (logs / "w2.attempt-1.log").write_text("")
    (logs / "w2.final.log").write_text("")
    out = subprocess.run(["sh", "-c", rel.release_script(cluster, rid, bind(cluster).runtime.image_id_script())], capture_output=True, text=True).stdout
    doc = rel.parse_release(out)
    assert doc["attempts"] == {"w1": 3, "w2": 2} and doc["meta"] is None and doc["plan"] == ""
    assert any(p.endswith("/release.json") for p in doc["problems"])


class _Sent:
    """A runner that records each step's script per host and succeeds."""

    def __init__(self):
        self.scripts = []

    def run(self, step, nodes=None, **_):
        from llmdeploy.runner import HostResult

        out = {}
        for n in nodes:
            self.scripts.append((step.name, n.name, step.build(n)))
            out[n.name] = HostResult(n.name)
        return out


def _plan(cluster):
    n0, n1 = cluster.nodes[0].name, cluster.nodes[1].name
    units = [Unit(host=n0, container="c0", role="head", show={"rank": 0}), Unit(host=n1, container="c1", role="w", show={"rank": 1})]
    return ReleasePlan(system="x", cluster=cluster.name, release="20261101T000000Z-0123abcd", services=[Service("s", units=units)],
                       entry_host=n0, entry_port=1, show_labels={"rank": "the rank"}, role_labels={"head": "the head"})


def test_starts_continue_the_release_attempt_numbers_and_stops_name_logs_for_them():
    cluster = load_cluster("sim-a3")
    plan, sent = _plan(cluster), _Sent()
    eng = Engine(bind(cluster), sent, Console(quiet=True), quiet=True)
    out = Outcome(ok=False, release=plan.release, earlier={unit_key(u): 4 for u in plan.units()})
    assert eng.start_units(plan, plan.units()[1:], out)
    (name, host, script), = sent.scripts
    assert "c1.attempt-4.log" in script and "printf '%s\\n' 5 >" in script and out.attempts == {unit_key(plan.units()[1]): 1}
    assert out.number(unit_key(plan.units()[1])) == 5 and out.number(unit_key(plan.units()[0])) == 4
    eng.stop_units(plan, plan.units(), lambda u: f"attempt-{out.number(unit_key(u))}")
    stops = {h: s for _, h, s in sent.scripts[1:]}
    assert "c0.attempt-4.log" in stops[cluster.nodes[0].name] and "c1.attempt-5.log" in stops[cluster.nodes[1].name]


def test_units_are_named_and_shown_by_the_plans_labels():
    plan = _plan(load_cluster("sim-a3"))
    head, w = plan.units()
    assert plan.name_of(head) == "the head" and plan.name_of(w) == "w"
    assert plan.shown_text(w) == "the rank 1" and plan.shown(head) == [("the rank", 0)]


def test_the_release_id_is_set_in_every_string_of_a_plan():
    plan = _plan(load_cluster("sim-a3"))
    plan.files = {"h": {"run.sh": ("docker run --name x-OLD\n", 0o755)}}
    plan.units()[0].show["cmd"] = ["OLD", {"OLD": "a OLD b"}]
    back = plan.with_release("OLD", "NEW")
    assert back.files["h"]["run.sh"] == ("docker run --name x-NEW\n", 0o755)
    assert back.units()[0].show["cmd"] == ["NEW", {"NEW": "a NEW b"}]
    assert plan.units()[0].show["cmd"] == ["OLD", {"OLD": "a OLD b"}]  # the draft is unchanged


# --- every unit's log of a node --------------------------------------------------------------------
def _labelled(cluster, rel_, phase, service):
    return {"status": "running", "code": 0, "labels": {"llmdeploy.cluster": cluster, "llmdeploy.release": rel_,
                                                       "llmdeploy.stop_phase": str(phase), "llmdeploy.service": service}}


def test_logs_script_prints_every_unit_of_the_node_in_start_order(docker):  # noqa: F811
    cluster = load_cluster("sim-gb300-agentic")
    fleet = {"k-decode0": _labelled(cluster.name, "R", 0, "decode0"), "k-frontend": _labelled(cluster.name, "R", 2, "frontend"),
             "k-etcd": _labelled(cluster.name, "R", 4, "etcd"), "other": _labelled("z", "R", 0, "decode0")}
    res, _, calls = docker(st.logs_script(cluster, None, ["--tail", "5"]), fleet)
    units, logs = st.parse_logs(res.stdout)
    assert units == [("k-etcd", "etcd"), ("k-frontend", "frontend"), ("k-decode0", "decode0")]
    assert logs == {"k-etcd": ["log of k-etcd"], "k-frontend": ["log of k-frontend"], "k-decode0": ["log of k-decode0"]}
    assert ["logs", "--tail", "5", "k-etcd"] in calls
    res, _, calls = docker(st.logs_script(cluster, "decode0", []), fleet)
    units, logs = st.parse_logs(res.stdout)
    assert len(units) == 3 and logs == {"k-decode0": ["log of k-decode0"]}
    odd = "x'; touch PWNED; '"
    res, _, _ = docker(st.logs_script(cluster, odd, []), fleet)
    assert res.returncode == 0 and st.parse_logs(res.stdout)[1] == {} and not list(docker.cwd.iterdir())


def test_logs_prefixes_each_line_with_its_host_and_service_and_picks_one_service(capsys):
    from flows import serving_logs
    from llmdeploy.errors import InventoryError, LlmdeployError
    from llmdeploy.runner import HostResult

    cluster = load_cluster("sim-gb300-1p2d")
    out = {n.name: "" for n in cluster.nodes}
    out[cluster.nodes[0].name] = "\n".join([f"{st.UNIT_MARK} c-fe frontend", f"{st.UNIT_MARK} c-p0 prefill0", f"{st.LOG_MARK} c-fe", "ready",
                                             f"{st.LOG_MARK} c-p0", "loaded", "two"]) + "\n"
    out[cluster.nodes[1].name] = f"{st.UNIT_MARK} c-d0 decode0\n{st.LOG_MARK} c-d0\nup\n"

    class Nodes:
        def __init__(self, *a, **k):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def run(self, step, nodes=None, **_):
            return {n.name: HostResult(n.name, stdout=out[n.name]) for n in cluster.nodes[:2]}

    with runners(Nodes):
        assert serving_logs.serving_logs(bind(cluster), host=f"{cluster.nodes[0].name},{cluster.nodes[1].name}") == 0
        printed = capsys.readouterr().out.splitlines()
        n0, n1 = cluster.nodes[0].name, cluster.nodes[1].name
        assert printed == [f"{n0}/frontend | ready", f"{n0}/prefill0 | loaded", f"{n0}/prefill0 | two", f"{n1} | up"]
        with pytest.raises(LlmdeployError, match=r"--service decode7: no container of that service .* \(services there: decode0, frontend, prefill0\)"):
            serving_logs.serving_logs(bind(cluster), host=f"{n0},{n1}", service="decode7")
    with pytest.raises(InventoryError, match="--service"):
        serving_logs.serving_logs(bind(cluster), service="a b; reboot")


# --- readiness checks a system adds ------------------------------------------------------------------
def test_a_system_check_resolves_by_the_name_plan_json_files_use():
    body = b'{"status":"healthy","instances":[{"component":"prefill","endpoint":"generate"},{"component":"backend","endpoint":"generate"}]}'
    arg = json.dumps([{"name": "prefill0", "role": "prefill"}, {"name": "decode0", "role": "decode"}])
    check = probes.check_named("dynamo_health")
    assert check is not None and check(body, arg) is None
    assert "dynamo_health" not in probes.CHECKS  # the generic checks name no system
    p = Probe(name="x", kind="http", host="h", port=1, check="nope")
    assert "names the readiness check 'nope'" in probes.body_problem(p, b"{}")
    with mock.patch.object(probes, "http_via_ssh", lambda *a, **k: (200, b"{}")):
        assert "names the readiness check 'nope'" in probes.http_probe(None, None, p, 1.0)


# --- one request over SSH, its status checked (flows.probes.fetch) --------------------------------------
def _answering(result):
    """http_via_ssh that answers ``result`` (status, body), or raises it, and records what it was asked."""
    asked = []

    def http_via_ssh(runner, node, port, method, path, body, timeout, headers=None, dest="127.0.0.1"):
        asked.append((node, port, method, path, body, timeout, headers, dest))
        if isinstance(result, BaseException):
            raise result
        return result

    return http_via_ssh, asked


HEALTH = Probe(name="frontend /health", kind="http", host="n0", port=8000, path="/health", check="json", arg="status=healthy")


def test_fetch_gives_the_status_and_body_it_answered(monkeypatch):
    fake, asked = _answering((200, b'{"status":"healthy"}'))
    monkeypatch.setattr(probes, "http_via_ssh", fake)
    got = probes.fetch("runner", "node", HEALTH, 7.0)
    assert got == probes.Fetched(status=200, body=b'{"status":"healthy"}') and got.ok
    assert asked == [("node", 8000, "GET", "/health", None, 7.0, {}, "127.0.0.1")]


def test_fetch_keeps_another_status_and_its_body_and_names_the_probe(monkeypatch):
    monkeypatch.setattr(probes, "http_via_ssh", _answering((503, b"x" * 300))[0])
    got = probes.fetch("runner", "node", HEALTH, 7.0, shown=10)
    assert (got.status, got.body, got.error, got.ok) == (503, b"x" * 300, None, False)
    assert got.problem == "GET /health on n0:8000 answered 503: " + repr(b"x" * 10)


def test_fetch_says_what_kept_it_from_an_answer(monkeypatch):
    import paramiko

    refused = paramiko.ChannelException(2, "Connect failed")
    monkeypatch.setattr(probes, "http_via_ssh", _answering(refused)[0])
    got = probes.fetch("runner", "node", HEALTH, 7.0)
    assert (got.status, got.body, got.error, got.ok) == (None, b"", refused, False)
    assert got.problem == "GET /health on n0:8000: ChannelException: ChannelException(2, 'Connect failed')"
    # readiness reads a refused forward as "not yet"
    from flows.engine import not_yet
    assert not_yet(got.problem)


def test_fetch_does_not_take_a_bug_for_a_failed_request(monkeypatch):
    monkeypatch.setattr(probes, "http_via_ssh", _answering(KeyError("a bug"))[0])
    with pytest.raises(KeyError):
        probes.fetch("runner", "node", HEALTH, 7.0)


@pytest.mark.parametrize("result, health", [
    ((200, b'{"status":"healthy"}'), (200, None)),
    ((200, b'{"status":"starting"}'), (200, "says status='starting' (expected healthy)")),
    ((503, b'{"status":"starting"}'), (503, None)),  # status() says it answered 503, not 200
    (OSError("Socket is closed"), ("unreachable (OSError)", None)),
])
def test_status_reads_the_endpoint_through_fetch(monkeypatch, result, health):
    from flows import status

    cluster = load_cluster("sim-a3")
    fake, asked = _answering(result)
    monkeypatch.setattr(probes, "http_via_ssh", fake)
    plan = ReleasePlan(system="vllm-ascend", cluster=cluster.name, release="r", services=[], entry_host=cluster.node0.name,
                       entry_port=8000, ready=[Probe(**{**HEALTH.__dict__, "host": cluster.node0.name})])
    assert status.endpoint_health("runner", cluster, plan) == health
    assert [(node.name, timeout) for node, _, _, _, _, timeout, _, _ in asked] == [(cluster.node0.name, 10)]


def test_follow_command_quotes_the_container():
    assert shlex.split(st.follow_command("a b", ["--tail", "3"])) == ["docker", "logs", "--tail", "3", "-f", "a b", "2>&1"]
