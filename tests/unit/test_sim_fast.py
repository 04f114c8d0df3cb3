"""The simulator's rendered stand-in answers (sim/standins/fast.py): the bash
wrapper answers exactly what the Python stand-in does, and a changed
node.json (how tests inject faults) takes effect on the next call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmdeploy.inventory import load_cluster
from sim import hardware
from sim.standins import __main__ as standins
from sim.standins import fast

REPO = Path(__file__).resolve().parents[2]


def _python(state: Path, tool: str, argv: list[str]) -> tuple[str, str, int]:
    env = {**os.environ, "LLMDEPLOY_SIM_STATE": str(state), "PYTHONPATH": str(REPO)}
    res = subprocess.run(
        [sys.executable, "-c", "import sys; from sim.standins import __main__ as m; sys.exit(m.TOOLS[sys.argv[1]](sys.argv[2:]))", tool, *argv],
        env=env, capture_output=True, text=True,
    )
    return res.stdout, res.stderr, res.returncode


@pytest.fixture(params=["sim-a3", "sim-b200"])
def host(request, tmp_path):
    cluster = load_cluster(request.param)
    state = tmp_path / "state"
    state.mkdir()
    hardware.save(state, hardware.node_hardware(cluster, 1, cluster.nodes[1]))
    fast.render(str(state), standins.TOOLS)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in fast.CACHED_TOOLS:
        (bindir / tool).write_text(fast.wrapper(tool, sys.executable, str(REPO)))
        (bindir / tool).chmod(0o755)

    def run(tool: str, *argv: str) -> tuple[str, str, int]:
        env = {**os.environ, "LLMDEPLOY_SIM_STATE": str(state)}
        res = subprocess.run([str(bindir / tool), *argv], env=env, capture_output=True, text=True)
        return res.stdout, res.stderr, res.returncode

    return state, run


def _python_started(state: Path) -> int:
    """How many renders there have been (a Python stand-in renders on a changed node.json)."""
    return len([p for p in state.iterdir() if p.name.startswith("out.")])


def test_every_rendered_answer_is_the_python_answer(host):
    state, run = host
    hw = hardware.load(state)
    calls = fast.calls(hw)
    assert len(calls) >= 8
    for tool, argv in calls:
        assert (state / "out" / fast.key(tool, argv)).is_file(), (tool, argv)
        assert run(tool, *argv) == _python(state, tool, argv), (tool, argv)


def test_an_unknown_call_is_answered_by_python_and_kept(host):
    state, run = host
    argv = ["info", "-t", "board"] if hardware.load(state)["npus"] else ["--query-gpu=bogus"]
    tool = "npu-smi" if hardware.load(state)["npus"] else "nvidia-smi"
    want = _python(state, tool, argv)
    assert want[2] != 0 and want[1]  # a usage error, on stderr
    assert run(tool, *argv) == want
    assert (state / "out" / fast.key(tool, argv)).is_file()  # kept
    assert run(tool, *argv) == want  # and served again, stderr and status too


def test_arguments_outside_the_plain_set_are_never_cached(host):
    state, run = host
    argv = ["--query-gpu=index name"] if not hardware.load(state)["npus"] else ["info", "a b"]
    tool = "nvidia-smi" if not hardware.load(state)["npus"] else "npu-smi"
    assert fast.key(tool, argv) is None
    assert run(tool, *argv) == _python(state, tool, argv)
    assert not any(" " in p.name for p in (state / "out").iterdir())


def test_an_edited_node_json_is_answered_from_the_next_call_on(host):
    state, run = host
    hw = hardware.load(state)
    renders = _python_started(state)
    if hw["npus"]:
        tool, argv = "hccn_tool", ["-i", "3", "-net_health", "-g"]
        assert run(tool, *argv)[0] == "net health status: Success\n"
        hw["npus"][3]["net_health"] = "Fault"
        want = "net health status: Fault\n"
    else:
        tool, argv = "ibstat", []
        assert "State: Active" in run(tool, *argv)[0]
        hw["ib_ports"][0]["state"] = "Down"
        want = None
    # written in place (not replaced), within the same second as the render
    (state / "node.json").write_text(json.dumps(hw))
    out = run(tool, *argv)
    assert out == _python(state, tool, argv)
    if want:
        assert out[0] == want
    else:
        assert "State: Down" in out[0]
    assert _python_started(state) == renders + 1  # rendered again, once
    assert run(tool, *argv) == out
    assert _python_started(state) == renders + 1


def test_a_hung_tool_is_not_served_from_the_cache(host):
    state, run = host
    hw = hardware.load(state)
    tool, argv = ("npu-smi", ["info"]) if hw["npus"] else ("nvidia-smi", ["-L"])
    hw["hang"] = {tool: 0.5}
    hardware.save(state, hw)
    t0 = time.monotonic()
    out = run(tool, *argv)
    assert time.monotonic() - t0 >= 0.5 and out[2] == 0  # the injected hang happened
    assert not (state / "out" / fast.key(tool, argv)).exists()
    other = ("lscpu", ["-e=CPU,NODE"])
    assert (state / "out" / fast.key(*other)).exists()  # the other tools still are
    del hw["hang"]
    hardware.save(state, hw)
    run(tool, *argv)
    assert (state / "out" / fast.key(tool, argv)).exists()


def test_a_missing_node_json_fails_like_before(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "npu-smi").write_text(fast.wrapper("npu-smi", sys.executable, str(REPO)))
    (bindir / "npu-smi").chmod(0o755)
    res = subprocess.run([str(bindir / "npu-smi"), "info"], env={**os.environ, "LLMDEPLOY_SIM_STATE": str(tmp_path / "none")},
                         capture_output=True, text=True)
    assert res.returncode != 0 and "node.json" in res.stderr


@pytest.mark.parametrize("argv,cached", [(["-H"], True), (["--hardware"], True), (["-m", "0", "true"], False)])
def test_numactl_runs_commands_and_caches_only_its_table(argv, cached):
    hw = {"numa_nodes": [{"id": 0, "cpus": [0, 3], "mem_mib": 1024}]}
    assert fast.cacheable("numactl", argv, hw) is cached
    # docker is the real Docker Engine: never a rendered answer
    assert fast.cacheable("docker", ["--version"], hw) is False


