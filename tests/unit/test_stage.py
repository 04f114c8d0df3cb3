"""invoke stage's pieces without a cluster: the plan (roles.stage.plan) and
the agent (roles/stage/agent.py) run as real processes on loopback, one
address per "node" (127.0.0.x, the same port), the way the nodes run it on
their data addresses."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import roles.stage as st
from roles import progress_line
from llmdeploy.errors import InventoryError
from llmdeploy.inventory import load_cluster_file

MARK = "llmdeploy-stage-agent:test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _checkpoint(root: Path, sizes: dict[str, int], seed: int = 0) -> dict[str, bytes]:
    rnd = random.Random(seed)
    out = {}
    for name, size in sizes.items():
        data = rnd.randbytes(size)
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
        out[name] = data
    return out


def _agent(mode: str, orders: dict) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", st.AGENT, mode, MARK], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    p.stdin.write(json.dumps(orders))
    p.stdin.close()
    return p


def _finish(p: subprocess.Popen, timeout: float = 60) -> tuple[int, dict, str]:
    out = p.stdout.read()
    err = p.stderr.read()
    code = p.wait(timeout=timeout)
    return code, st.parse_answer(out) or {}, err


def _files(data: dict[str, bytes], offsets: dict[str, int] | None = None) -> list[dict]:
    offsets = offsets or {}
    return [{"dir": 0, "name": n, "size": len(b), "sha256": _sha(b), "offset": offsets.get(n, 0)} for n, b in data.items()]


def _chain(tmp_path: Path, files: list[dict], roots: list[Path], need: list[list[str]], port: int, token="t0k3n") -> list[subprocess.Popen]:
    """Source roots[0], then one receiver per further root on 127.0.0.(i+1); the receivers start first."""
    procs = []
    n = len(roots)
    for i in range(n - 1, -1, -1):
        orders = {
            "token": token,
            "listen": None if i == 0 else [f"127.0.0.{i + 1}", port],
            "next": [f"127.0.0.{i + 2}", port] if i + 1 < n else None,
            "files": files,
            "roots": [str(roots[i])],
            "need": need[i],
            "cache": str(tmp_path / f"cache{i}.json"),
            "pidfile": str(tmp_path / f"agent{i}.pid"),
            "mark": MARK,
            "connect_timeout": 20,
            "idle_timeout": 20,
        }
        procs.insert(0, _agent("relay", orders))
    return procs


def test_chain_writes_every_file_on_every_node_and_verifies_it(tmp_path):
    src = tmp_path / "src"
    data = _checkpoint(src, {"config.json": 300, "model-00001-of-00002.safetensors": 3 << 20, "sub/dir/tok.json": 5000})
    roots = [src] + [tmp_path / f"n{i}" for i in range(1, 4)]
    files = _files(data)
    keys = [f"0/{f['name']}" for f in files]
    procs = _chain(tmp_path, files, roots, [[], keys, keys, keys], _free_port())
    results = [_finish(p) for p in procs]
    assert [c for c, _, _ in results] == [0, 0, 0, 0], results
    assert results[0][1]["forwarded"] == sum(len(b) for b in data.values())
    for i, root in enumerate(roots[1:], 1):
        assert sorted(results[i][1]["verified"]) == sorted(keys)
        for name, b in data.items():
            assert (root / name).read_bytes() == b
        assert not list(root.rglob("*.llmdeploy-partial"))
        # the agent's cache vouches for what it verified
        cache = json.loads((tmp_path / f"cache{i}.json").read_text())
        assert cache[str(root / "config.json")][2] == _sha(data["config.json"])
    # the last node forwards nothing; the middle ones forward everything
    assert results[3][1]["forwarded"] == 0 and results[2][1]["forwarded"] == results[0][1]["forwarded"]
    # progress lines went to stderr, in the runner's format
    read = [progress_line(line) for line in results[1][2].splitlines()]
    assert read and read[-1] == (float(sum(len(b) for b in data.values())), float(sum(len(b) for b in data.values())), "B", "stage")


def test_a_partial_file_resumes_from_the_stream_offset_and_only_the_rest_is_sent(tmp_path):
    src = tmp_path / "src"
    data = _checkpoint(src, {"w.safetensors": 2 << 20})
    node = tmp_path / "n1"
    node.mkdir()
    done = 1_500_000
    (node / ".w.safetensors.llmdeploy-partial").write_bytes(data["w.safetensors"][:done])
    files = _files(data, {"w.safetensors": done})
    procs = _chain(tmp_path, files, [src, node], [[], ["0/w.safetensors"]], _free_port())
    (c0, a0, _), (c1, a1, _) = [_finish(p) for p in procs]
    assert (c0, c1) == (0, 0), (a0, a1)
    assert a0["forwarded"] == len(data["w.safetensors"]) - done
    assert a1["written"] == len(data["w.safetensors"]) - done
    assert (node / "w.safetensors").read_bytes() == data["w.safetensors"]


def test_a_corrupt_partial_is_caught_by_its_sha256_and_removed_never_renamed(tmp_path):
    src = tmp_path / "src"
    data = _checkpoint(src, {"w.safetensors": 1 << 20})
    node = tmp_path / "n1"
    node.mkdir()
    (node / ".w.safetensors.llmdeploy-partial").write_bytes(b"\0" * 1000)  # not the source's first bytes
    files = _files(data, {"w.safetensors": 1000})
    procs = _chain(tmp_path, files, [src, node], [[], ["0/w.safetensors"]], _free_port())
    (c0, _, _), (c1, a1, _) = [_finish(p) for p in procs]
    assert c0 == 0 and c1 == 1
    assert "sha256" in a1["failed"]["0/w.safetensors"]
    assert not (node / "w.safetensors").exists() and not (node / ".w.safetensors.llmdeploy-partial").exists()


def test_a_node_that_has_a_file_forwards_it_without_writing(tmp_path):
    src = tmp_path / "src"
    data = _checkpoint(src, {"a.bin": 100_000, "b.bin": 200_000})
    n1, n2 = tmp_path / "n1", tmp_path / "n2"
    _checkpoint(n1, {"a.bin": 100_000})  # same seed: the same bytes
    files = _files(data)
    procs = _chain(tmp_path, files, [src, n1, n2], [[], ["0/b.bin"], ["0/a.bin", "0/b.bin"]], _free_port())
    res = [_finish(p) for p in procs]
    assert [c for c, _, _ in res] == [0, 0, 0]
    assert res[1][1]["written"] == 200_000 and res[2][1]["written"] == 300_000
    assert (n2 / "a.bin").read_bytes() == data["a.bin"]


def test_a_node_killed_mid_stream_its_upstream_finishes_and_the_one_behind_says_upstream(tmp_path):
    src = tmp_path / "src"
    data = _checkpoint(src, {"w.safetensors": 64 << 20})
    roots = [src, tmp_path / "n1", tmp_path / "n2", tmp_path / "n3"]
    files = _files(data)
    keys = ["0/w.safetensors"]
    procs = _chain(tmp_path, files, roots, [[], keys, keys, keys], _free_port())
    # n2 dies once bytes flow (its partial file grows)
    part = roots[2] / ".w.safetensors.llmdeploy-partial"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (part.exists() and part.stat().st_size > 0):
        time.sleep(0.01)
    procs[2].send_signal(signal.SIGKILL)
    res = [_finish(p) for p in procs]
    assert res[2][0] == -signal.SIGKILL
    assert res[1][0] == 0 and "went away" in res[1][1]["downstream"]
    assert (roots[1] / "w.safetensors").read_bytes() == data["w.safetensors"]
    assert res[3][0] == st.EXIT_UPSTREAM and "ended" in res[3][1]["upstream"]
    # the node behind kept its partial file for the next pass
    assert (roots[3] / ".w.safetensors.llmdeploy-partial").exists()


def test_a_stray_connection_without_the_token_is_turned_away(tmp_path):
    src = tmp_path / "src"
    data = _checkpoint(src, {"a.bin": 10_000})
    node = tmp_path / "n1"
    port = _free_port()
    files = _files(data)
    common = {"files": files, "need": ["0/a.bin"], "mark": MARK, "connect_timeout": 20, "idle_timeout": 20, "token": "t0k3n"}
    receiver = _agent("relay", {**common, "listen": ["127.0.0.2", port], "next": None, "roots": [str(node)],
                                "cache": str(tmp_path / "c1.json"), "pidfile": str(tmp_path / "p1")})
    deadline = time.monotonic() + 20
    while True:  # a stranger, before the sender: its bytes must not land anywhere
        try:
            s = socket.create_connection(("127.0.0.2", port), timeout=5)
            break
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, "the receiver never listened"
            time.sleep(0.02)
    with s:
        s.sendall(b"not-the-token\n" + b"x" * 10_000)
        s.settimeout(10)
        try:
            closed = s.recv(1) == b""
        except ConnectionResetError:
            closed = True
    assert closed
    sender = _agent("relay", {**common, "listen": None, "next": ["127.0.0.2", port], "roots": [str(src)], "need": [],
                              "cache": str(tmp_path / "c0.json"), "pidfile": str(tmp_path / "p0")})
    res = [_finish(p) for p in (sender, receiver)]
    assert [c for c, _, _ in res] == [0, 0], res
    assert (node / "a.bin").read_bytes() == data["a.bin"]


def test_scan_lists_files_partials_free_space_and_cached_sums(tmp_path):
    root = tmp_path / "m"
    data = _checkpoint(root, {"config.json": 10, "w.bin": 1000})
    (root / ".w2.bin.llmdeploy-partial").write_bytes(b"x" * 7)
    (root / ".hidden").write_text("x")
    cache = tmp_path / "cache.json"
    code, ans, _ = _finish(_agent("hash", {"files": [str(root / "w.bin")], "cache": str(cache)}))
    assert code == 0 and ans["sums"][str(root / "w.bin")] == _sha(data["w.bin"])
    code, ans, _ = _finish(_agent("scan", {"dirs": [str(root), str(tmp_path / "absent/x")], "cache": str(cache)}))
    assert code == 0
    d = ans["dirs"][str(root)]
    assert set(d["files"]) == {"config.json", "w.bin"} and d["partials"] == {"w2.bin": 7} and d["free"] > 0
    assert ans["dirs"][str(tmp_path / "absent/x")]["exists"] is False
    assert ans["sums"] == {str(root / "w.bin"): _sha(data["w.bin"])}
    # a changed file is no longer vouched for
    (root / "w.bin").write_bytes(b"y" * 1000)
    os.utime(root / "w.bin", ns=(1, 1))
    code, ans, _ = _finish(_agent("scan", {"dirs": [str(root)], "cache": str(cache)}))
    assert ans["sums"] == {}


# --- the plan ---------------------------------------------------------------
def _scan(files: dict[str, int], partials: dict[str, int] | None = None, free: int = 10**12, dev: int = 1, path="/m") -> dict:
    return {"dirs": {path: {"exists": True, "files": {k: [v, 0] for k, v in files.items()}, "partials": partials or {},
                            "free": free, "dev": dev}}, "sums": {}}


DIRS = [("/m", "/m")]
SRC = {"config.json": 10, "a.safetensors": 1000, "b.safetensors": 2000}
SUMS = {f"/m/{k}": _sha(k.encode()) for k in SRC}


def test_plan_skips_what_a_node_has_and_resumes_from_the_shortest_partial():
    scans = {
        "n1": _scan(SRC),  # everything, same sums
        "n2": _scan({"config.json": 10}, partials={"a.safetensors": 400}),
        "n3": _scan({}, partials={"a.safetensors": 700, "b.safetensors": 5000}),  # a partial longer than the file: from 0
    }
    sums = {"n1": dict(SUMS), "n2": {"/m/config.json": SUMS["/m/config.json"]}, "n3": {}}
    p = st.plan(DIRS, "n0", _scan(SRC), SUMS, scans, sums, ["n1", "n2", "n3"])
    assert p.order == ["n2", "n3"]
    assert p.nodes["n1"].skip == 3 and not p.nodes["n1"].need
    assert sorted(p.nodes["n2"].need) == ["0/a.safetensors", "0/b.safetensors"]
    stream = {f["name"]: f for f in p.files}
    assert list(stream) == ["config.json", "a.safetensors", "b.safetensors"]  # the source's order
    assert stream["a.safetensors"]["offset"] == 400 and stream["b.safetensors"]["offset"] == 0
    assert p.stream_bytes == 10 + 600 + 2000
    assert p.nodes["n2"].write_bytes == 600 + 2000
    assert p.nodes["n3"].write_bytes == 10 + 600 + 2000 and p.nodes["n3"].kept_bytes == 700
    assert p.manifest["/m"]["a.safetensors"] == [1000, SUMS["/m/a.safetensors"]]
    assert not p.problems()


def test_plan_sends_again_a_file_of_the_same_size_and_another_sum():
    scans = {"n1": _scan(SRC)}
    sums = {"n1": {**SUMS, "/m/a.safetensors": "0" * 64}}
    p = st.plan(DIRS, "n0", _scan(SRC), SUMS, scans, sums, ["n1"])
    assert p.nodes["n1"].need == ["0/a.safetensors"] and p.nodes["n1"].skip == 2


def test_plan_names_a_node_without_room_before_anything_moves():
    scans = {"n1": _scan({}), "n2": _scan({}, free=1500)}
    p = st.plan(DIRS, "n0", _scan(SRC), SUMS, scans, {}, ["n1", "n2"])
    assert p.problems() == ["n2: needs 2.9 KiB under /m, 1.5 KiB free there"]


def test_plan_names_extra_files_and_the_expected_time():
    scans = {"n1": _scan({"old.bin": 5}), "n2": _scan({})}
    p = st.plan(DIRS, "n0", _scan(SRC), SUMS, scans, {}, ["n1", "n2"])
    assert p.nodes["n1"].extra == ["/m/old.bin"]
    # S / B plus one chunk per hop after the first
    assert p.expected_s(8.0) == pytest.approx((3010 + st.CHUNK) / 1e6)
    assert p.expected_s(None) is None
    doc = p.as_json(8.0)
    assert doc["order"] == ["n0", "n1", "n2"] and doc["total_bytes"] == 3010


def test_to_hash_asks_the_source_for_all_and_a_node_only_for_files_of_the_same_size():
    src = _scan(SRC)
    src["sums"] = {"/m/config.json": "x"}
    sizes, problems = st.source_files(DIRS, src)
    assert not problems
    assert st.to_hash(DIRS, sizes, src, on_source=True) == ["/m/a.safetensors", "/m/b.safetensors"]
    node = _scan({"config.json": 10, "a.safetensors": 999})
    assert st.to_hash(DIRS, sizes, node, on_source=False) == ["/m/config.json"]


def test_a_source_without_the_model_is_named():
    _, problems = st.source_files(DIRS, {"dirs": {"/m": {"exists": False}}})
    assert problems == ["/m does not exist"]


# --- the inventory ----------------------------------------------------------
def _inventory(tmp_path: Path, extra_model: str = "", extra_cluster: str = "") -> Path:
    text = (Path(__file__).resolve().parents[2] / "inventory" / "sim_a3.py").read_text()
    text = text.replace('tokenizer_path="/root/.cache/models/Qwen3.8-2.4T-A95B-w8a8",',
                        f'tokenizer_path="/root/.cache/models/Qwen3.8-2.4T-A95B-w8a8",{extra_model}')
    text = text.replace("    deploy=sim_deploy(),", f"    deploy=sim_deploy(),{extra_cluster}")
    p = tmp_path / "sim_a3.py"
    p.write_text(text)
    return p


def test_stage_from_must_name_a_node_or_the_declared_source(tmp_path):
    c = load_cluster_file(_inventory(tmp_path, ' stage_from="sim-a3-0",'))
    assert c.model.stage_from == "sim-a3-0"
    with pytest.raises(InventoryError) as e:
        load_cluster_file(_inventory(tmp_path, ' stage_from="sim-a3-9",'))
    assert "model.stage_from" in str(e.value) and "sim-a3-9" in str(e.value)
    with pytest.raises(InventoryError) as e:
        load_cluster_file(_inventory(tmp_path, ' stage_from="source",'))
    assert "stage.source" in str(e.value)


def test_agent_command_quotes_the_program_and_sends_orders_on_stdin():
    cmd = st.agent_command("relay", "llmdeploy-stage-agent:sim-a3")
    assert cmd.startswith("python3 -c '") and cmd.endswith(" relay llmdeploy-stage-agent:sim-a3")
    # the token never reaches a command line
    assert "token" not in cmd.split("relay llmdeploy")[-1]


# --- pipe: a command's output down the chain (the image) --------------------
def _pipe_chain(tmp_path: Path, n: int, command: list[str], sinks: list[list[str] | None], port: int) -> list[subprocess.Popen]:
    procs = []
    for i in range(n - 1, -1, -1):
        orders = {"token": "tok", "listen": None if i == 0 else [f"127.0.0.{i + 1}", port],
                  "next": [f"127.0.0.{i + 2}", port] if i + 1 < n else None, "command": command if i == 0 else None,
                  "sink": sinks[i], "size_hint": 0, "pidfile": str(tmp_path / f"pipe{i}.pid"), "mark": MARK,
                  "connect_timeout": 20, "idle_timeout": 20}
        procs.insert(0, _agent("pipe", orders))
    return procs


def test_pipe_feeds_the_source_commands_output_to_every_nodes_sink(tmp_path):
    blob = random.Random(1).randbytes(3 << 20)
    (tmp_path / "image.tar").write_bytes(blob)
    sinks = [None] + [["sh", "-c", f"cat > {tmp_path}/got{i}.tar && echo Loaded image: x"] for i in (1, 2, 3)]
    procs = _pipe_chain(tmp_path, 4, ["cat", str(tmp_path / "image.tar")], sinks, _free_port())
    res = [_finish(p) for p in procs]
    assert [c for c, _, _ in res] == [0, 0, 0, 0], res
    for i in (1, 2, 3):
        assert (tmp_path / f"got{i}.tar").read_bytes() == blob
        assert res[i][1]["said"] == "Loaded image: x"
    assert res[1][1]["received"] == len(blob)


def test_pipe_times_the_stream_apart_from_what_the_sink_does_after_it(tmp_path):
    # docker load registers the layers only once it has the whole archive:
    # the stream's end and the sink's work after it are reported apart
    (tmp_path / "image.tar").write_bytes(b"x" * 4096)
    sinks = [None, ["sh", "-c", "cat >/dev/null; sleep 1.5; echo Loaded image: x"]]
    res = [_finish(p) for p in _pipe_chain(tmp_path, 2, ["cat", str(tmp_path / "image.tar")], sinks, _free_port())]
    assert [c for c, _, _ in res] == [0, 0], res
    node = res[1][1]
    # the sink's sleep after the stream's end is counted as the sink's, not the stream's
    assert node["sink_s"] >= 1.5 and node["stream_s"] >= 0
    assert set(res[0][1]) >= {"stream_s", "sink_s"}


def test_pipe_names_a_sink_that_fails_and_the_source_that_fails(tmp_path):
    (tmp_path / "image.tar").write_bytes(b"x" * 1000)
    sinks = [None, ["sh", "-c", "cat >/dev/null; echo 'Error processing tar file(exit status 1): unexpected EOF'; exit 1"],
             ["sh", "-c", "cat >/dev/null"]]
    res = [_finish(p) for p in _pipe_chain(tmp_path, 3, ["cat", str(tmp_path / "image.tar")], sinks, _free_port())]
    assert [c for c, _, _ in res] == [0, 1, 0]
    assert "unexpected EOF" in res[1][1]["sink"]
    # the source's command fails: every node behind it is told the stream ended early
    res = [_finish(p) for p in _pipe_chain(tmp_path, 2, ["sh", "-c", "echo partial; exit 3"], [None, ["sh", "-c", "cat >/dev/null"]],
                                           _free_port())]
    assert res[0][0] == 1 and "exited 3" in res[0][1]["sink"]
    assert res[1][0] == st.EXIT_UPSTREAM


def test_the_image_stream_is_compressed_and_a_failed_save_fails_the_source(tmp_path):
    from llmdeploy.inventory import load_cluster

    cluster = load_cluster("sim-a3")
    command = st.save_source(cluster).command
    assert st.LOAD == ["docker", "load"] and command[-2:] == [cluster.image.ref, ""]  # the links' speed not known
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text('#!/bin/sh\n[ "$1" = save ] && [ "$2" = "$IMAGE" ] || exit 9\nhead -c 300000 /dev/zero\n')
    (bindir / "docker").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "IMAGE": cluster.image.ref}
    out = subprocess.run(command, capture_output=True, env=env, check=True).stdout
    assert 0 < len(out) < 300000 // 10  # zeros compress: the stream is not the raw tar
    (bindir / "docker").write_text("#!/bin/sh\necho 'Error response from daemon: reference does not exist' >&2; exit 1\n")
    res = subprocess.run(command, capture_output=True, env=env)
    assert res.returncode == 1 and b"reference does not exist" in res.stderr

    # image_compression "none": docker save's tar as it is, its failure still the source's
    (bindir / "docker").write_text('#!/bin/sh\n[ "$1" = save ] && [ "$2" = "$IMAGE" ] || exit 9\nhead -c 300000 /dev/zero\n')
    raw = cluster.model_copy(update={"stage": cluster.stage.model_copy(update={"image_compression": "none"})})
    assert subprocess.run(st.save_source(raw).command, capture_output=True, env=env, check=True).stdout == bytes(300000)
    (bindir / "docker").write_text("#!/bin/sh\necho 'Error response from daemon: reference does not exist' >&2; exit 1\n")
    res = subprocess.run(st.save_source(raw).command, capture_output=True, env=env)
    assert res.returncode == 1 and b"reference does not exist" in res.stderr


@pytest.mark.parametrize("stage, pigz_cores, compressed", [
    ({}, None, True),  # links of unknown speed: compressed, as before
    ({"link_mbit": 300}, None, True),  # slower than gzip on one core
    ({"link_mbit": 1000}, None, False),  # gzip -1 on one core (about 400 Mbit/s) would slow a 1 Gbit/s chain
    ({"link_mbit": 1000}, 8, True),  # pigz on 8 cores: about 3200 Mbit/s
    ({"link_mbit": 25000}, 8, False),
    ({"link_mbit": 25000}, 64, True),
    ({"link_mbit": 400000, "image_compression": "gzip"}, None, True),
    ({"image_compression": "none"}, 64, False),
])
def test_a_saved_image_is_compressed_where_the_links_are_slower_than_the_nodes_compression(tmp_path, stage, pigz_cores, compressed):
    from llmdeploy.inventory import load_cluster

    cluster = load_cluster("sim-a3")
    cluster = cluster.model_copy(update={"stage": cluster.stage.model_copy(update=stage)})
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text('#!/bin/sh\n[ "$1" = save ] || exit 9\nhead -c 300000 /dev/zero\n')
    if pigz_cores:  # a node with pigz (gzip's stream) on that many cores
        (bindir / "pigz").write_text('#!/bin/sh\nexec gzip "$@"\n')
        (bindir / "nproc").write_text(f"#!/bin/sh\necho {pigz_cores}\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    path = f"{bindir}:" + ":".join(d for d in os.environ["PATH"].split(":") if not (Path(d) / "pigz").exists())
    out = subprocess.run(st.save_source(cluster).command, capture_output=True, env={**os.environ, "PATH": path}, check=True).stdout
    assert (out[:2] == b"\x1f\x8b" and len(out) < 300000 // 10) if compressed else out == bytes(300000), (stage, pigz_cores)


def test_image_compression_names_the_field_when_it_is_wrong():
    from pydantic import ValidationError

    from llmdeploy.inventory import StageSettings

    with pytest.raises(ValidationError, match="image_compression"):
        StageSettings(image_compression="zstd")


# --- export: the image read from its registry -------------------------------
@pytest.mark.parametrize("ref, want", [
    ("quay.io/ascend/vllm-ascend:v0.23.0", ("quay.io", "ascend/vllm-ascend", "v0.23.0")),
    ("nvcr.io/nvidia/tensorrt-llm/release:1.2.1", ("nvcr.io", "nvidia/tensorrt-llm/release", "1.2.1")),
    ("lmsysorg/sglang:v0.5.23", ("registry-1.docker.io", "lmsysorg/sglang", "v0.5.23")),
    ("nginx", ("registry-1.docker.io", "library/nginx", "latest")),
    ("localhost:5000/x/y@sha256:" + "a" * 64, ("localhost:5000", "x/y", "sha256:" + "a" * 64)),
])
def test_refs_are_read_as_docker_reads_them(ref, want):
    assert _agent_module().parse_ref(ref) == want


def _agent_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("stage_agent", Path(st.__file__).parent / "agent.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """A registry on loopback over TLS (its CA in SSL_CERT_FILE, as the system's roots are read), one image
    behind a Bearer-token challenge, as Docker Hub and quay.io answer; ``blobs`` may be spoiled by a test."""
    import datetime
    import http.server
    import ssl
    import threading

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key()).serial_number(1)
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption()))
    layer, config = random.Random(7).randbytes(300_000), b'{"architecture":"amd64","os":"linux","rootfs":{}}'
    blobs = {"sha256:" + _sha(b): b for b in (layer, config)}
    manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                           "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "size": len(config),
                                      "digest": "sha256:" + _sha(config)},
                           "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip", "size": len(layer),
                                       "digest": "sha256:" + _sha(layer)}]}).encode()
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(self.path)
            if self.path.startswith("/token?"):
                return self._send(200, json.dumps({"token": "t0"}).encode(), "application/json")
            if self.headers.get("Authorization") != "Bearer t0":
                self.send_response(401)
                self.send_header("WWW-Authenticate", f'Bearer realm="https://localhost:{port}/token",service="test",scope="repository:a/b:pull"')
                self.send_header("Content-Length", "0")
                return self.end_headers()
            if self.path == "/v2/a/b/manifests/v1":
                return self._send(200, manifest, "application/vnd.docker.distribution.manifest.v2+json")
            digest = self.path.rsplit("/", 1)[-1]
            if self.path.startswith("/v2/a/b/blobs/") and digest in blobs:
                return self._send(200, blobs[digest], "application/octet-stream")
            self._send(404, b"{}", "application/json")

        def _send(self, code, body, ctype):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    port = srv.server_address[1]
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "cert.pem"))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
    yield {"ref": f"localhost:{port}/a/b:v1", "blobs": blobs, "layer": layer, "config": config, "seen": seen}
    srv.shutdown()
    srv.server_close()


def test_export_writes_what_docker_load_reads_with_the_registrys_own_layers(registry):
    import io
    import tarfile

    agent = _agent_module()
    buf = io.BytesIO()
    info = agent.export({"ref": registry["ref"]}, buf)
    assert info["config"] == "sha256:" + _sha(registry["config"])
    assert info["bytes"] == len(registry["layer"]) + len(registry["config"])  # one pull's bytes, no more
    buf.seek(0)
    with tarfile.open(fileobj=buf) as t:
        names = t.getnames()
        manifest = json.loads(t.extractfile("manifest.json").read())
        layer = t.extractfile("blobs/sha256/" + _sha(registry["layer"])).read()
    assert {"oci-layout", "index.json", "manifest.json"} <= set(names)
    assert manifest == [{"Config": "blobs/sha256/" + _sha(registry["config"]), "RepoTags": [registry["ref"]],
                         "Layers": ["blobs/sha256/" + _sha(registry["layer"])]}]
    assert layer == registry["layer"]  # as the registry keeps it (compressed), not unpacked
    assert registry["seen"][0] == "/v2/a/b/manifests/v1" and any(p.startswith("/token?") for p in registry["seen"])


def test_export_refuses_a_blob_that_is_not_its_digest(registry):
    import io

    agent = _agent_module()
    d = "sha256:" + _sha(registry["layer"])
    registry["blobs"][d] = b"x" * len(registry["layer"])
    with pytest.raises(OSError, match="arrived as"):
        agent.export({"ref": registry["ref"]}, io.BytesIO())


def test_export_says_unsupported_when_docker_keeps_the_password_in_a_helper(registry, tmp_path):
    (tmp_path / "docker").mkdir()
    (tmp_path / "docker" / "config.json").write_text(json.dumps({"credsStore": "desktop"}))
    agent = _agent_module()
    import io

    with pytest.raises(agent.Unsupported, match="helper"):
        agent.export({"ref": registry["ref"]}, io.BytesIO())


def test_the_registrys_image_goes_down_the_chain_and_into_the_head_nodes_own_load(registry, tmp_path):
    port = _free_port()
    procs = []
    for i in (2, 1, 0):
        orders = {"token": "tok", "listen": None if i == 0 else [f"127.0.0.{i + 1}", port],
                  "next": [f"127.0.0.{i + 2}", port] if i < 2 else None, "command": None,
                  "export": {"ref": registry["ref"]} if i == 0 else None,
                  "sink": ["sh", "-c", f"cat > {tmp_path}/load{i}.tar && echo Loaded image: {registry['ref']}"],
                  "size_hint": 0, "pidfile": str(tmp_path / f"x{i}.pid"), "mark": MARK, "connect_timeout": 20, "idle_timeout": 20}
        procs.insert(0, _agent("pipe", orders))
    res = [_finish(p) for p in procs]
    assert [c for c, _, _ in res] == [0, 0, 0], res
    assert res[0][1]["export"]["config"] == "sha256:" + _sha(registry["config"])
    tars = {(tmp_path / f"load{i}.tar").read_bytes() for i in range(3)}
    assert len(tars) == 1 and all(r[1]["said"] == f"Loaded image: {registry['ref']}" for r in res)


def _wheels_like(d: Path, seed: int) -> dict[str, bytes]:
    d.mkdir(parents=True, exist_ok=True)
    data = {"a-wheels-1.versions": b"llmdeploy-wheels versions {}\n", "a-wheels-1.sqsh": b"hsqs" + random.Random(seed).randbytes(2 << 20)}
    for name, b in data.items():
        (d / name).write_bytes(b)
    return data


def test_files_go_down_the_chain_whole_and_in_place(tmp_path):
    """A runtime's own image with the wheels (pyxis's squashfs and its
    versions) sent as files: every node has the same bytes under the same
    names, the versions put in place before the file, nothing else left."""
    data = _wheels_like(tmp_path / "n0", 1)
    names = list(data)
    source = st.files_source([f"{tmp_path}/n0/{n}" for n in names])
    assert source.what == "files" and source.command[:4] == ["tar", "-C", f"{tmp_path}/n0", "-cf"]
    sinks = [None] + [st.files_sink([f"{tmp_path}/n{i}/{n}" for n in names]) for i in (1, 2)]
    (tmp_path / "n2").mkdir()
    (tmp_path / "n2" / names[1]).write_bytes(b"an old file of that name")
    res = [_finish(p) for p in _pipe_chain(tmp_path, 3, source.command, sinks, _free_port())]
    assert [c for c, _, _ in res] == [0, 0, 0], res
    for i in (1, 2):
        assert {p.name: p.read_bytes() for p in (tmp_path / f"n{i}").iterdir()} == data
        assert oct((tmp_path / f"n{i}" / names[1]).stat().st_mode & 0o777) == "0o644"
        assert res[i][1]["said"] == f"wrote 2 file(s) in {tmp_path}/n{i}"


def test_files_from_a_stream_that_was_not_whole_are_never_put_in_place(tmp_path):
    """The source's command sends the whole archive and then fails: tar on
    each node has read it all, but the agent aborts the sink before the
    input ends, so nothing is renamed and nothing temporary is left. A file
    missing from the stream is named."""
    data = _wheels_like(tmp_path / "n0", 2)
    names = list(data)
    failing = ["sh", "-c", f"tar -C {tmp_path}/n0 -cf - {' '.join(names)}; exit 3"]
    sinks = [None, st.files_sink([f"{tmp_path}/n1/{n}" for n in names])]
    res = [_finish(p) for p in _pipe_chain(tmp_path, 2, failing, sinks, _free_port())]
    assert res[0][0] == 1 and res[1][0] == st.EXIT_UPSTREAM, res
    assert not (tmp_path / "n1").exists() or list((tmp_path / "n1").iterdir()) == []
    # an archive without one of the files: named, nothing put in place
    only = ["tar", "-C", f"{tmp_path}/n0", "-cf", "-", names[1]]
    res = [_finish(p) for p in _pipe_chain(tmp_path, 2, only, sinks, _free_port())]
    assert res[1][0] == 1 and "the stream held no a-wheels-1.versions" in res[1][1]["sink"], res
    assert list((tmp_path / "n1").iterdir()) == []


def test_files_to_send_are_absolute_paths_in_one_directory():
    for bad in ([], ["rel/a"], ["/x/a", "/y/b"], ["/x/"]):
        with pytest.raises(ValueError):
            st.files_source(bad)
