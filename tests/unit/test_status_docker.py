"""``invoke status`` on a node whose Docker daemon does not answer: it says
so for that node ("the Docker daemon on sim-a3-1 does not answer (Cannot
connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker
daemon running?)"), instead of reporting its containers as missing. The
status script runs here with a stand-in ``docker`` on PATH."""

import json
import os
import subprocess

import pytest

from flows import deploy as dep
from flows import status as status_flow
from llmdeploy.inventory import load_cluster
from roles.status import DOCKER_FAILED, docker_problem, parse_status, status_script
from flows.binding import bind

DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"


def run_status(tmp_path, docker_body: str) -> str:
    """``status_script``'s output on a machine whose ``docker`` is ``docker_body`` (sh)."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "docker").write_text("#!/bin/sh\n" + docker_body)
    (bindir / "docker").chmod(0o755)
    script = status_script(load_cluster("sim-a3"))
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=30).stdout


def test_a_daemon_that_does_not_answer_is_read_as_such(tmp_path):
    out = run_status(tmp_path, f'echo "{DOWN}" >&2; exit 1\n')
    st = parse_status(out)
    assert st["docker_error"] == DOWN and st["containers"] == {}


def test_a_daemon_that_answers_lists_its_containers(tmp_path):
    body = ('case "$1" in\n'
            '  ps) echo sim-a3-r1; echo sim-a3-r1-side ;;\n'
            '  inspect) printf \'{"Name": "/%s", "State": {"Running": true}}\\n\' "$4" ;;\n'
            "esac\n")
    st = parse_status(run_status(tmp_path, body))
    assert st["docker_error"] is None and sorted(st["containers"]) == ["sim-a3-r1", "sim-a3-r1-side"]
    # no container of the cluster: none listed, and no docker problem either
    st = parse_status(run_status(tmp_path, "exit 0\n"))
    assert st["docker_error"] is None and st["containers"] == {}


def test_docker_problem_names_the_host_and_what_docker_said():
    state, why = docker_problem("sim-a3-1", DOWN + "\n")
    assert state == "docker down"
    assert why == f"the Docker daemon on sim-a3-1 does not answer ({DOWN}): its containers' state is unknown"
    state, why = docker_problem("sim-a3-1", "permission denied while trying to connect to the Docker daemon socket")
    assert state == "docker failed" and why.startswith("docker ps failed on sim-a3-1 (permission denied")


@pytest.fixture
def plan():
    c = load_cluster("sim-a3")
    _, _, p = dep.plan_release(bind(c), {}, c.image.ref)
    return c, p


def _st(plan, inspect_text: str, rc: int = 0) -> dict:
    mark = "@@llmdeploy@@"
    out = f"{mark} release\n{plan.release}\n{mark}rc 0\n{mark} inspect\n{inspect_text}\n{mark}rc {rc}\n"
    return parse_status(out)


def test_status_names_the_dead_daemon_instead_of_missing_containers(plan):
    c, p = plan
    host = "sim-a3-1"
    assert p.units(host), "the plan runs something on sim-a3-1"
    rows, doc, bad = status_flow._node_view(c, p, host, _st(p, f"{DOWN}\n{DOCKER_FAILED}", 1), False)
    assert bad and doc["state"] == "docker down"
    assert doc["reason"] == f"the Docker daemon on {host} does not answer ({DOWN}): its containers' state is unknown"
    assert all(u["state"] == "docker down" for u in doc["units"].values())
    assert not any("missing" in json.dumps(r) for r in rows) and "missing" not in doc["reason"]


def test_a_container_that_is_gone_is_still_missing(plan):
    c, p = plan
    rows, doc, bad = status_flow._node_view(c, p, "sim-a3-1", _st(p, ""), False)
    assert bad and doc["state"] == "missing" and "missing" in doc["reason"]
