"""The simulator's knobs for long steps (node.json "slow",
sim/standins/slow.py): a host's docker and sha256sum are the real ones,
paced only when asked, and every knob is 0 by default."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

from llmdeploy.inventory import load_cluster
from sim.standins import slow


def _state(tmp_path: Path, **knobs) -> dict:
    import json

    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "node.json").write_text(json.dumps({"hostname": "h", "slow": {**slow.KNOBS, **knobs}}, indent=1))
    return {**os.environ, "LLMDEPLOY_SIM_STATE": str(state)}


def _exe(path: Path, text: str) -> str:
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def test_the_hosts_docker_is_the_real_one_unless_a_pull_or_load_is_paced(tmp_path):
    real = _exe(tmp_path / "real-docker", '#!/bin/sh\necho "real $*"\n')
    python = _exe(tmp_path / "python", '#!/bin/sh\necho "paced $*"\n')
    wrapper = _exe(tmp_path / "docker", slow.docker_wrapper(python, "/repo").replace(slow.REAL_DOCKER, real))
    run = lambda env, *args: subprocess.run([wrapper, *args], capture_output=True, text=True, env=env).stdout  # noqa: E731
    assert run(_state(tmp_path), "pull", "x") == "real pull x\n"
    env = _state(tmp_path, pull_layer_s=0.5)
    assert run(env, "pull", "x") == "paced -S -m sim.standins docker pull x\n"
    assert run(env, "image", "inspect", "x") == "real image inspect x\n"
    assert run(_state(tmp_path, load_mib_s=20), "load") == "paced -S -m sim.standins docker load\n"
    # no node.json (or one without the knob): the real client
    assert run({**os.environ, "LLMDEPLOY_SIM_STATE": str(tmp_path / "none")}, "pull", "y") == "real pull y\n"


def test_a_paced_pull_passes_every_line_and_the_status(tmp_path, capfdbinary):
    real = _exe(tmp_path / "real", "#!/bin/sh\nprintf 'a: Pulling fs layer\\na: Pull complete\\nDigest: x\\n'\nexit 3\n")
    assert slow.paced_pull(["pull", "x"], 0.001, real=real) == 3
    assert capfdbinary.readouterr().out == b"a: Pulling fs layer\na: Pull complete\nDigest: x\n"


def test_a_throttled_load_passes_its_input_whole(tmp_path, monkeypatch):
    got = tmp_path / "got"
    real = _exe(tmp_path / "real", f"#!/bin/sh\ncat > {got}\n")
    data = os.urandom(3000)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert slow.throttled_load(["load"], 1000, real=real, piece=1024) == 0
    assert got.read_bytes() == data


def test_sha256sum_is_paced_per_call_with_file_names_only(tmp_path):
    real = _exe(tmp_path / "real", '#!/bin/sh\necho "real $*"\n')
    bindir = tmp_path / "bin"
    bindir.mkdir()
    _exe(bindir / "sleep", '#!/bin/sh\necho "slept $1" >&2\n')
    wrapper = _exe(tmp_path / "sha256sum", slow.sha256sum_wrapper().replace(slow.REAL_SHA256SUM, real))
    env = _state(tmp_path, sha256_s=1.5)
    env["PATH"] = f"{bindir}:{env['PATH']}"
    res = subprocess.run([wrapper, "config.json"], capture_output=True, text=True, env=env)
    assert (res.stdout, res.stderr) == ("real config.json\n", "slept 1.5\n")
    res = subprocess.run([wrapper], capture_output=True, text=True, env=env, input="")
    assert (res.stdout, res.stderr) == ("real \n", "")
    env = _state(tmp_path) | {"PATH": env["PATH"]}
    res = subprocess.run([wrapper, "config.json"], capture_output=True, text=True, env=env)
    assert (res.stdout, res.stderr) == ("real config.json\n", "")


def test_the_simulated_hosts_knobs_default_to_no_delay():
    from sim import hardware

    c = load_cluster("sim-a3")
    assert hardware.node_hardware(c, 1, c.nodes[1])["slow"] == {"pull_layer_s": 0, "load_mib_s": 0, "sha256_s": 0}
