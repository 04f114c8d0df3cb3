"""invoke stage on the simulated A3 cluster: a generated multi-file
checkpoint from node 0 to the three other nodes over their data network,
verified; a second run moves nothing; a killed run resumes without sending
again what is done; a node without room is refused before anything moves; a
node killed mid-stage is named while the others finish; prepare with
model.stage_from stages, and image.distribute spreads the image from one pull."""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sim import hostview, netns
from sim.paths import host_dir, netns_name
from tests.conftest import INVOKE, REPO, run_invoke, tool_env

SIM_CLUSTER = "sim-a3"
NODES = [f"sim-a3-{i}" for i in range(4)]
MODEL = "root/.cache/models/Qwen3.8-2.4T-A95B-w8a8"
MARK = "llmdeploy-stage-agent:sim-a3"
SHARDS = 4


def _model(node: str) -> Path:
    return host_dir(SIM_CLUSTER, node) / "root" / MODEL


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".")}


def _stage(*args, env=None, timeout=300):
    res = run_invoke("stage", "--cluster", SIM_CLUSTER, "--json", *args, env=env, timeout=timeout)
    doc = json.loads(res.stdout) if res.stdout.strip().startswith("{") else None
    return res, doc


@pytest.fixture(scope="module")
def checkpoint(sim_cluster):
    """A checkpoint on node 0 that the others lack (their stand-in model is
    replaced by an empty directory); put back as sim.up made it afterwards."""
    saved = {n: _digest(_model(n)) for n in NODES}
    keep = Path(str(_model(NODES[0])) + ".sim-saved")
    shutil.copytree(_model(NODES[0]), keep)
    rnd = random.Random(31)
    for i in range(1, SHARDS + 1):
        (_model(NODES[0]) / f"model-{i:05d}-of-{SHARDS:05d}.safetensors").write_bytes(rnd.randbytes(12 << 20))
    (_model(NODES[0]) / "extra" / "tok").mkdir(parents=True, exist_ok=True)
    (_model(NODES[0]) / "extra" / "tok" / "vocab.txt").write_text("a\nb\n")
    for n in NODES[1:]:
        shutil.rmtree(_model(n))
        _model(n).mkdir()
    yield _digest(_model(NODES[0]))
    run_invoke("sim.shape", "--cluster", SIM_CLUSTER, "--mbit", "0")
    for n in NODES:
        shutil.rmtree(_model(n))
        shutil.copytree(keep, _model(n))
        assert _digest(_model(n)) == saved[n]
    shutil.rmtree(keep)


def _agents(node: str) -> list[int]:
    out = []
    for pid in netns.pids(netns_name(SIM_CLUSTER, node)):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if MARK.encode() in cmd:
            out.append(pid)
    return out


def _wait(cond, what: str, limit: float = 120) -> None:
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, f"never: {what}"
        time.sleep(0.05)


def _partial_bytes(node: str) -> int:
    return sum(p.stat().st_size for p in _model(node).rglob("*.llmdeploy-partial"))


def test_check_prints_the_plan_and_moves_nothing(checkpoint):
    res, doc = _stage("--check")
    assert res.returncode == 0, res.stdout + res.stderr
    plan = doc["plan"]
    assert plan["order"] == NODES and plan["source"] == NODES[0]
    assert plan["total_bytes"] == plan["stream_bytes"] > SHARDS * (12 << 20)
    for n in NODES[1:]:
        assert plan["nodes"][n]["write_bytes"] == plan["stream_bytes"] and plan["nodes"][n]["skip_files"] == 0
        assert _digest(_model(n)) == {}
    human = run_invoke("stage", "--cluster", SIM_CLUSTER, "--check")
    assert human.returncode == 0 and "chain: sim-a3-0 -> sim-a3-1 -> sim-a3-2 -> sim-a3-3" in human.stdout


def test_a_node_without_room_is_refused_before_anything_moves(checkpoint):
    pid = hostview._host_pid(SIM_CLUSTER, NODES[2])
    mount = ["nsenter", "-t", str(pid), "-m", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", f"/{MODEL}"]
    subprocess.run(mount, check=True)
    try:
        res, doc = _stage()
        assert res.returncode == 1, res.stdout + res.stderr
        assert doc["plan"]["nodes"][NODES[2]]["problems"][0].startswith(f"{NODES[2]}: needs ")
        assert "1.0 MiB free there" in doc["plan"]["nodes"][NODES[2]]["problems"][0]
        for n in (NODES[1], NODES[3]):
            assert _digest(_model(n)) == {} and _partial_bytes(n) == 0
        assert doc["sent_bytes"] == 0
    finally:
        subprocess.run(["nsenter", "-t", str(pid), "-m", "umount", f"/{MODEL}"], check=True)


def test_an_interrupted_stage_resumes_without_sending_again_what_is_done(checkpoint):
    # a link of 200 Mbit/s (25 MB/s): about 2 s for the 48 MiB, time to stop it halfway
    assert run_invoke("sim.shape", "--cluster", SIM_CLUSTER, "--mbit", "200").returncode == 0
    total = sum((_model(NODES[0]) / f).stat().st_size for f in checkpoint)
    proc = subprocess.Popen([*INVOKE, "stage", "--cluster", SIM_CLUSTER], cwd=REPO, env=tool_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait(lambda: _partial_bytes(NODES[3]) + sum(p.stat().st_size for p in _model(NODES[3]).glob("*.safetensors")) > total // 3,
              "node 3 a third of the way")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # the agents end with their reader (or at the next stage, which ends a stale one)
    run_invoke("lock.break", "--cluster", SIM_CLUSTER, "--reason", "test killed a stage")
    have = {n: _partial_bytes(n) + sum((_model(n) / f).stat().st_size for f in checkpoint if (_model(n) / f).exists())
            for n in NODES[1:]}
    assert all(h > 0 for h in have.values()), have
    res, doc = _stage()
    assert res.returncode == 0, res.stdout + res.stderr
    assert 0 < doc["sent_bytes"] <= total - min(have.values())
    assert doc["plan"]["nodes"][NODES[1]]["kept_bytes"] + doc["plan"]["nodes"][NODES[1]]["write_bytes"] <= total
    for n in NODES[1:]:
        assert _digest(_model(n)) == checkpoint, n
        assert not _partial_bytes(n)


def test_every_node_has_it_verified_a_second_run_moves_nothing_and_the_manifest_is_recorded(checkpoint):
    res, doc = _stage()
    assert res.returncode == 0, res.stdout + res.stderr
    for n in NODES[1:]:
        assert _digest(_model(n)) == checkpoint
    assert doc["sent_bytes"] == 0 and doc["plan"]["stream_bytes"] == 0
    assert all(doc["plan"]["nodes"][n]["skip_files"] == len(checkpoint) for n in NODES[1:])
    for n in NODES[1:]:
        m = json.loads((host_dir(SIM_CLUSTER, n) / "root/var/lib/llmdeploy/sim-a3/stage/manifest.json").read_text())
        files = m["files"][f"/{MODEL}"]
        assert {k: v[1] for k, v in files.items()} == checkpoint and m["source"] == NODES[0]


def test_a_node_killed_mid_stage_is_named_and_the_others_finish(checkpoint):
    for n in NODES[1:]:  # everything to send again
        shutil.rmtree(_model(n))
        _model(n).mkdir()
    assert run_invoke("sim.shape", "--cluster", SIM_CLUSTER, "--mbit", "200").returncode == 0
    proc = subprocess.Popen([*INVOKE, "stage", "--cluster", SIM_CLUSTER, "--json"], cwd=REPO, env=tool_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    _wait(lambda: _partial_bytes(NODES[1]) > (4 << 20), "node 1 receiving")
    for pid in _agents(NODES[1]):
        os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, out + err
    doc = json.loads(out)
    assert list(doc["failed"]) == [NODES[1]]
    assert doc["passes"] == 2  # the chain went again, around node 1
    for n in NODES[2:]:
        assert _digest(_model(n)) == checkpoint, n
        assert doc["nodes"][n]["recorded"]
    assert not doc["nodes"][NODES[1]]["recorded"]
    # what stays on node 1 is a partial file, never taken for a whole one
    assert set(_digest(_model(NODES[1]))) < set(checkpoint)
    assert run_invoke("sim.shape", "--cluster", SIM_CLUSTER, "--mbit", "0").returncode == 0
    res, doc = _stage()
    assert res.returncode == 0 and _digest(_model(NODES[1])) == checkpoint


def _inventory(tmp_path: Path, model_extra: str = "", image_extra: str = "") -> dict:
    inv = tmp_path / "inventory"
    inv.mkdir(exist_ok=True)
    text = (REPO / "inventory" / "sim_a3.py").read_text()
    old = 'tokenizer_path="/root/.cache/models/Qwen3.8-2.4T-A95B-w8a8",'
    assert old in text and "image=image(IMAGE_A3)," in text
    text = text.replace(old, old + model_extra).replace("image=image(IMAGE_A3),", f"image=image(IMAGE_A3){image_extra},")
    (inv / "sim_a3.py").write_text(text)
    return {"LLMDEPLOY_INVENTORY": str(inv)}


def test_prepare_stages_what_is_missing_then_its_model_check_passes(checkpoint, tmp_path):
    shutil.rmtree(_model(NODES[2]))
    (_model(NODES[3]) / "model-00002-of-00004.safetensors").write_bytes(b"not the weights")
    env = _inventory(tmp_path, ' stage_from="sim-a3-0",')
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--json", "--no-check", env=env, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert doc["stage"]["ok"] and doc["stage"]["plan"]["nodes"][NODES[3]]["write_files"] == 1
    assert doc["steps"]["model"][NODES[2]]["status"] == "ok"
    for n in NODES[1:]:
        assert _digest(_model(n)) == checkpoint


def test_deploy_with_stage_from_stages_what_is_missing_and_serves(checkpoint, tmp_path):
    shutil.rmtree(_model(NODES[1]))
    env = _inventory(tmp_path, ' stage_from="sim-a3-0",')
    try:
        res = run_invoke("deploy", "--cluster", SIM_CLUSTER, "--no-gate", env=env, timeout=900)
        assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
        assert _digest(_model(NODES[1])) == checkpoint
        res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json", env=env)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    finally:
        run_invoke("stop", "--cluster", SIM_CLUSTER, env=env, timeout=300)


def test_prepare_distributes_the_image_from_one_pull(checkpoint, tmp_path):
    from llmdeploy.inventory import load_cluster

    ref = load_cluster(SIM_CLUSTER).image.ref
    for n in NODES:
        hostview.docker(SIM_CLUSTER, n, "rmi", "-f", ref, check=False)
    env = _inventory(tmp_path, image_extra=".model_copy(update={'distribute': True})")
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--json", "--no-check", env=env, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    d = json.loads(res.stdout)["image_distribution"]
    # node 0 read it from the registry once (one pull's bytes) and loaded it while it sent it on
    assert d["via"] == "registry" and not d["pulled"] and d["source"] == NODES[0] and sorted(d["got"]) == NODES and not d["failed"]
    ids = {hostview.docker(SIM_CLUSTER, n, "image", "inspect", "--format", "{{.Id}}", ref).stdout.strip() for n in NODES}
    assert len(ids) == 1 and ids.pop().startswith("sha256:")
