"""The SGLang stand-in (sim/standins/sglang.py): its pure parts, and
``python3 -m sglang.launch_server`` from the simulated image's ``sglang``
package run as real local processes, one per "node" (its own state directory
and node.json), meeting on loopback: node rank 0's store at
``--dist-init-addr``, its HTTP on 127.0.0.1, node rank 1's dummy health server
on 127.0.0.2. Every process is started in its own session and killed by its
id at the end; every file lives in a temporary directory removed at the end."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from sim import hardware, images
from sim.standins import sglang as sg

REPO = Path(__file__).resolve().parents[2]
IMAGE = "lmsysorg/sglang:v0.5.21"
GPUS8 = {"gpus": [{"id": i, "mem_mib": 143771} for i in range(8)]}


# --- the command line ------------------------------------------------------------------------------
def test_the_documented_multi_node_command_parses():
    """SGLang's multi-node docs' line, with the short spellings argparse's prefix matching accepts."""
    a = sg.parse_args(["--model-path", "/models/qwen35", "--tp", "16", "--dist-init-addr", "198.19.20.10:20000",
                       "--nnodes", "2", "--node-rank", "1", "--host", "0.0.0.0", "--port", "30000",
                       "--ep", "16", "--enable-dp-attention", "--dp", "2", "--trust-remote-code", "--reasoning-parser", "qwen3"])
    assert (a.model_path, a.tp_size, a.dist_init_addr, a.nnodes, a.node_rank, a.host, a.port) == (
        "/models/qwen35", 16, "198.19.20.10:20000", 2, 1, "0.0.0.0", 30000)
    assert (a.ep_size, a.enable_dp_attention, a.dp_size, a.trust_remote_code, a.reasoning_parser) == (16, True, 2, True, "qwen3")
    # the aliases ServerArgs declares
    a = sg.parse_args(["--model", "m", "--tensor-parallel-size", "8", "--expert-parallel-size", "4",
                       "--data-parallel-size", "2", "--nccl-init-addr", "10.0.0.1:5000"])
    assert (a.model_path, a.tp_size, a.ep_size, a.dp_size, a.dist_init_addr) == ("m", 8, 4, 2, "10.0.0.1:5000")
    # SGLang's defaults
    a = sg.parse_args(["--model-path", "m"])
    assert (a.host, a.port, a.tp_size, a.nnodes, a.node_rank, a.dist_timeout, a.served_model_name) == (
        "127.0.0.1", 30000, 1, 1, 0, None, None)


@pytest.mark.parametrize("argv, message", [
    (["--model-path", "m", "--bogus", "1"], "unrecognized arguments: --bogus 1"),
    (["--tp", "16"], "the following arguments are required: --model-path/--model"),
    (["--model-path", "m", "--tp", "x"], "argument --tp-size/--tensor-parallel-size: invalid int value: 'x'"),
    (["--model-path", "m", "--reasoning-parser", "qwen9"], "argument --reasoning-parser: invalid choice: 'qwen9'"),
    (["--model-path", "m", "--enable-dp"], "ambiguous option: --enable-dp could match"),
])
def test_options_sglang_does_not_have_are_refused_as_argparse_refuses_them(argv, message):
    with pytest.raises(sg.ArgError) as exc:
        sg.parse_args(argv)
    assert str(exc.value).startswith(message)


@pytest.mark.parametrize("argv, said", [
    (["--tp", "3", "--nnodes", "2"], "AssertionError: tp_size must be divisible by number of nodes"),
    (["--tp", "16", "--pp-size", "2", "--nnodes", "4"], None),
    (["--tp", "16", "--dp", "2", "--nnodes", "2"], "AssertionError: multi-node data parallel is not supported unless dp attention!"),
    (["--tp", "16", "--dp", "2", "--nnodes", "2", "--enable-dp-attention"], None),
    (["--tp", "16", "--dp", "3", "--nnodes", "2", "--enable-dp-attention"], "AssertionError"),
    (["--tp", "8", "--base-gpu-id", "-1"], "AssertionError: base_gpu_id must be non-negative"),
    (["--tp", "8", "--gpu-id-step", "0"], "AssertionError: gpu_id_step must be positive"),
    (["--tp", "16", "--ep", "16"], None),
])
def test_server_args_checks(argv, said):
    assert sg.check_server_args(sg.parse_args(["--model-path", "m", *argv])) == said


def test_dist_init_addr_and_the_world():
    a = sg.parse_args(["--model-path", "m", "--tp", "16", "--nnodes", "2", "--node-rank", "1",
                       "--dist-init-addr", "198.19.20.10:20000"])
    assert sg.dist_init_addr(a) == ("198.19.20.10", 20000)
    assert sg.world_of(a) == (16, 8, range(8, 16))
    assert sg.gpu_ids(a, 8) == list(range(8))
    a.dist_init_addr = "[fd00::1]:5000"
    assert sg.dist_init_addr(a) == ("fd00::1", 5000)
    a.dist_init_addr = "198.19.20.10"
    assert sg.dist_init_addr(a) == "AssertionError: please provide --dist-init-addr as host:port of head node"
    b = sg.parse_args(["--model-path", "m", "--tp", "4", "--base-gpu-id", "4", "--gpu-id-step", "1"])
    assert sg.gpu_ids(b, 4) == [4, 5, 6, 7]
    assert sg.visible_gpus(GPUS8, {}) == 8 and sg.visible_gpus(GPUS8, {"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert sg.visible_gpus({}, {}) is None


# --- answers -------------------------------------------------------------------------------------------
def test_the_qwen3_reasoning_parser_splits_the_think_block():
    assert sg.split_reasoning("<think>\nhmm\n</think>\n\nanswer") == ("hmm\n", "answer")
    assert sg.split_reasoning("just an answer") == (None, "just an answer")
    assert sg.split_reasoning("still thinking", force=True) == ("still thinking", "")
    # Qwen3.5's template opens <think> in the prompt: the output has only the closing tag
    assert sg.split_reasoning("hmm\n</think>\n\nanswer", force=True) == ("hmm\n", "answer")


def _api(*argv):
    return sg.Api(sg.parse_args(["--model-path", "/models/qwen35", *argv]), {}, None)


def test_chat_answers_carry_the_reasoning_part_only_with_a_parser():
    msg = {"messages": [{"role": "user", "content": "merge two sorted lists"}]}
    reasoning, content, usage = _api("--reasoning-parser", "qwen3").chat(msg)
    assert reasoning.startswith("The user wants") and content.startswith("def merge") and "<think>" not in content
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    reasoning, content, _ = _api().chat(msg)
    assert reasoning is None and content.startswith("<think>\n") and "</think>" in content
    reasoning, content, _ = _api("--reasoning-parser", "qwen3").chat({**msg, "separate_reasoning": False})
    assert reasoning is None and content.startswith("<think>")
    reasoning, content, _ = _api("--reasoning-parser", "qwen3").chat({**msg, "chat_template_kwargs": {"enable_thinking": False}})
    assert reasoning is None and content.startswith("def merge")


def test_metrics_have_sglangs_names_and_labels():
    m = sg.Metrics("nvidia/Qwen3.5")
    m.request(24, 100, 0.5)
    text = m.render()
    for name in ("num_running_reqs", "num_queue_reqs", "num_used_tokens", "token_usage", "gen_throughput",
                 "cache_hit_rate", "prompt_tokens_total", "generation_tokens_total", "num_requests_total"):
        assert f"# TYPE sglang:{name} " in text
    assert 'sglang:generation_tokens_total{engine_type="unified",model_name="nvidia/Qwen3.5",pp_rank="0",tp_rank="0"} 100.0' in text
    assert 'sglang:e2e_request_latency_seconds_bucket{engine_type="unified",model_name="nvidia/Qwen3.5",pp_rank="0",tp_rank="0",le="+Inf"} 1.0' in text


def test_interface_variables_fail_in_gloos_then_nccls_words():
    names = ["enp65s0f1", "eth0", "lo"]
    assert sg.nic_error({"NCCL_SOCKET_IFNAME": "enp65s0f1", "GLOO_SOCKET_IFNAME": "enp65s0f1"}, "h", 7, 0, names, names) is None
    assert sg.nic_error({}, "h", 7, 0, names, names) is None
    said = sg.nic_error({"NCCL_SOCKET_IFNAME": "ens1f0", "GLOO_SOCKET_IFNAME": "ens1f0"}, "h", 7, 0, names, names)
    assert said == "RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/device.cc:83] ifa != nullptr. Unable to find address for: ens1f0"
    said = sg.nic_error({"NCCL_SOCKET_IFNAME": "ens1f0"}, "sim-h200-1", 7, 0, names, names).splitlines()
    assert said[0] == "sim-h200-1:7:7 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to ens1f0"
    assert said[1].endswith("NCCL WARN Bootstrap : no socket interface found")
    assert said[2] == "RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)"


def test_the_stand_in_loads_with_the_standard_library_only():
    import ast

    tree = ast.parse(open(sg.__file__).read())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    assert top - {"__future__"} <= set(sys.stdlib_module_names), top


# --- the image ----------------------------------------------------------------------------------------
def test_the_image_runs_the_stand_in_as_python3_m_sglang_launch_server():
    spec = images.IMAGES[IMAGE]
    assert spec["kind"] == "sglang" and spec["packages"] == {"sglang": "0.5.21"}
    assert images.split_ref(IMAGE) == ("docker.io", "lmsysorg/sglang", "v0.5.21")
    ctx = images._context(IMAGE, spec, "base")
    assert {"site/sglang/__init__.py", "site/sglang/launch_server.py", "site/sglang-0.5.21.dist-info/METADATA",
            "standins/sim/standins/sglang.py", "bin/numactl"} <= set(ctx)
    assert f"COPY site/ {images.SITE}/" in ctx["Dockerfile"][0].decode()


def test_an_h200_node_as_nvidia_smi_shows_it():
    cluster = SimpleNamespace(platform="h200", platform_info=SimpleNamespace(vendor="nvidia", devices=8), name="sim-h200")
    hw = hardware.node_hardware(cluster, 1, SimpleNamespace(name="sim-h200-1"))
    assert len(hw["gpus"]) == 8 and len(hw["ib_ports"]) == 8
    with tempfile.TemporaryDirectory() as state:
        hardware.save(state, hw)
        env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "LLMDEPLOY_SIM_STATE": state}
        res = subprocess.run([sys.executable, "-S", "-m", "sim.standins", "nvidia-smi",
                              "--query-gpu=index,name,memory.total", "--format=csv,noheader"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"{i}, NVIDIA H200, 143771 MiB" for i in range(8)]


# --- real processes, one per node -----------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One ``python3 -m sglang.launch_server`` process; its output read as it comes."""

    def __init__(self, argv: list[str], env: dict):
        self.p = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *argv], env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float) -> int:
        rc = self.p.wait(timeout)
        self.reader.join(10)
        return rc

    def kill(self, sig=signal.SIGKILL) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, sig)  # its own session: this process and nothing else


class World:
    """Temporary nodes (state directory, node.json) sharing one model directory and the image's site-packages."""

    def __init__(self, root: Path):
        self.root = root
        self.site = root / "site"
        for rel, (data, _) in images._context(IMAGE, images.IMAGES[IMAGE], "base").items():
            if rel.startswith("site/"):
                (self.site / rel[5:]).parent.mkdir(parents=True, exist_ok=True)
                (self.site / rel[5:]).write_bytes(data)
        self.model = root / "models" / "qwen35"
        self.model.mkdir(parents=True)
        (self.model / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5MoeForCausalLM"], "model_type": "qwen3_5_moe_text"}))
        self.store, self.http = _free_port(), _free_port()
        self.nodes: list[Node] = []

    def start(self, rank: int, *args: str, nnodes: int = 2, tp: int = 16, node: dict | None = None,
              env: dict | None = None, name: str | None = None) -> Node:
        state = self.root / (name or f"node{rank}")
        state.mkdir(exist_ok=True)
        (state / "node.json").write_text(json.dumps(node if node is not None else GPUS8))
        full = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{self.site}:{REPO}", "LLMDEPLOY_SIM_STATE": str(state),
                "NVIDIA_VISIBLE_DEVICES": "all", **(env or {})}
        argv = ["--model-path", str(self.model), "--tp", str(tp), "--dist-init-addr", f"127.0.0.1:{self.store}",
                "--nnodes", str(nnodes), "--node-rank", str(rank), "--host", f"127.0.0.{rank + 1}",
                "--port", str(self.http), *args]
        n = Node(argv, full)
        self.nodes.append(n)
        return n

    def url(self, path: str, rank: int = 0) -> str:
        return f"http://127.0.0.{rank + 1}:{self.http}{path}"


@pytest.fixture
def world():
    with tempfile.TemporaryDirectory(prefix="sim-sglang-") as d:
        w = World(Path(d))
        try:
            yield w
        finally:
            for n in w.nodes:
                n.kill()
                n.wait(30)


def _get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _post(url: str, body: dict) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _healthy(w: World, nodes: list[Node], rank: int = 0, within: float = 30.0) -> None:
    end = time.monotonic() + within
    while time.monotonic() < end:
        for n in nodes:
            if n.p.poll() is not None:
                pytest.fail(f"a node exited {n.p.returncode}:\n{n.out}")
        try:
            if _get(w.url("/health", rank), 2)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    pytest.fail("no healthy /health:\n" + "\n----\n".join(n.out for n in nodes))


def _store_answers(w: World, n0: Node, within: float = 30.0) -> None:
    """Node rank 0's store is listening and answers a probe, as node rank 0's
    own store client does (sim/standins/sglang.py Store.self_probe): node
    rank 0 is then in the store, waiting for the other nodes."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        if n0.p.poll() is not None:
            pytest.fail(f"node rank 0 exited {n0.p.returncode}:\n{n0.out}")
        try:
            with socket.create_connection(("127.0.0.1", w.store), timeout=2) as s:
                s.sendall(b'{"t": "probe"}\n')
                if json.loads(s.makefile("r").readline() or "{}").get("t") == "probe":
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    pytest.fail("node rank 0's store never answered:\n" + n0.out)


def test_all_nodes_join_then_node_rank_0_serves_and_a_lost_node_ends_the_world(world):
    n0 = world.start(0, "--reasoning-parser", "qwen3", "--enable-metrics", "--served-model-name", "nvidia/Qwen3.5",
                     "--trust-remote-code", "--ep", "16")
    _store_answers(world, n0)
    # alone, node rank 0 waits in the store: no HTTP yet
    assert n0.p.poll() is None
    with pytest.raises(OSError):
        _get(world.url("/health"), 1)
    n1 = world.start(1, "--trust-remote-code", "--ep", "16")
    _healthy(world, [n0, n1])
    assert "The server is fired up and ready to roll!" in n0.out
    assert _get(world.url("/health_generate"))[0] == 200
    code, body = _get(world.url("/v1/models"))
    assert code == 200 and [m["id"] for m in json.loads(body)["data"]] == ["nvidia/Qwen3.5"]
    code, body = _get(world.url("/get_model_info"))
    assert json.loads(body)["model_path"] == str(world.model)
    code, body = _post(world.url("/v1/chat/completions"),
                       {"model": "nvidia/Qwen3.5", "messages": [{"role": "user", "content": "merge two sorted lists"}]})
    assert code == 200
    msg = json.loads(body)["choices"][0]["message"]
    assert msg["reasoning_content"].startswith("The user wants") and msg["content"].startswith("def merge")
    # streaming: reasoning first, then the answer
    code, body = _post(world.url("/v1/chat/completions"),
                       {"model": "nvidia/Qwen3.5", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
    events = [line[6:] for line in body.decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    deltas = [json.loads(e)["choices"][0]["delta"] for e in events[:-1]]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == msg["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == msg["content"]
    code, body = _get(world.url("/metrics"))
    assert code == 200 and re.search(r'^sglang:num_requests_total\{.*model_name="nvidia/Qwen3.5".*\} 2\.0$', body.decode(), re.M)
    # node rank 1: SGLang's dummy health server on its own --host/--port
    assert _get(world.url("/health", 1))[0] == 200 and _get(world.url("/v1/models", 1))[0] == 404
    # node rank 1 goes: its connection drops, node rank 0 ends the world
    n1.kill()
    assert n0.wait(15) == 1
    assert re.search(r"Connection closed by peer \[127\.0\.0\.1\]:\d+", n0.out)
    assert "Scheduler hit an exception" in n0.out and sg.SIGQUIT_LINE in n0.out


def test_a_node_that_never_comes_fails_the_world_within_the_timeout(world):
    n0 = world.start(0, "--dist-timeout", "2", nnodes=3, tp=6)
    n1 = world.start(1, "--dist-timeout", "2", nnodes=3, tp=6)
    # the world ends (the 20 s of wait() only guard against a hang: torch's default timeout is 600 s)
    assert n0.wait(20) == 1 and n1.wait(20) == 1
    m = re.search(r"torch\.distributed\.DistStoreError: Timed out after (\d+) seconds waiting for clients\. 4/6 clients joined\.", n0.out)
    # node rank 0 waited out --dist-timeout (not the default) before it gave up
    assert m and int(m.group(1)) >= 2, n0.out
    assert "torch.distributed.DistNetworkError: failed to recv, got 0 bytes" in n1.out
    assert sg.SIGQUIT_LINE in n1.out and "fired up" not in n0.out


def test_without_node_rank_0_a_node_times_out_connecting(world):
    n1 = world.start(1, node={**GPUS8, "sglang": {"default_dist_timeout_s": 1}})
    assert n1.wait(20) == 1
    assert f"The client socket has failed to connect to [127.0.0.1]:{world.store}" in n1.out
    assert (f"torch.distributed.DistNetworkError: The client socket has timed out after 1000ms while trying to connect "
            f"to (127.0.0.1, {world.store}).") in n1.out


def test_a_nic_variable_naming_no_interface_fails_that_node_and_the_world(world):
    n0 = world.start(0)
    n1 = world.start(1, env={"NCCL_SOCKET_IFNAME": "nosuchnic0"})
    assert n1.wait(20) == 1 and n0.wait(20) == 1, n0.out + n1.out
    assert "NCCL WARN Bootstrap : no socket interface found" in n1.out, n0.out + "\n----\n" + n1.out
    assert "RuntimeError: NCCL error: invalid usage (run with NCCL_DEBUG=WARN for details)" in n1.out
    assert "RuntimeError: NCCL error: remote process exited or there was a network error" in n0.out


def test_a_second_node_with_a_rank_of_a_running_world_is_refused(world):
    n0 = world.start(0)
    n1 = world.start(1)
    _healthy(world, [n0, n1])
    # a second node rank 1 against a formed world is refused; the world goes on
    dup = world.start(1, name="dup")
    assert dup.wait(20) == 1 and n0.p.poll() is None
    assert "node rank 1 came to a world that has already formed" in dup.out
    assert _get(world.url("/health"))[0] == 200


def test_a_duplicate_node_rank_while_the_world_forms_ends_it(world):
    n0 = world.start(0, "--dist-timeout", "5", nnodes=3, tp=6)
    n1 = world.start(1, "--dist-timeout", "5", nnodes=3, tp=6)
    time.sleep(1.0)
    dup = world.start(1, "--dist-timeout", "5", nnodes=3, tp=6, name="dup")
    assert n0.wait(20) == 1 and n1.wait(20) == 1 and dup.wait(20) == 1
    assert "NCCL WARN Bootstrap Root : rank 2 of 6 ranks has already checked in" in n0.out
    assert sg.NCCL_ROOT_FAILED in n0.out
    assert sg.NCCL_REMOTE in n1.out and sg.NCCL_REMOTE in dup.out


def test_a_node_with_another_nnodes_brings_other_ranks_to_the_store(world):
    n0 = world.start(0, "--dist-timeout", "2", nnodes=2, tp=16)
    n1 = world.start(1, "--dist-timeout", "2", nnodes=4, tp=16)  # 4 ranks, ranks 4..7 of 16
    assert n0.wait(20) == 1 and n1.wait(20) == 1
    assert re.search(r"Timed out after \d+ seconds waiting for clients\. 12/16 clients joined\.", n0.out), n0.out
    assert "failed to recv, got 0 bytes" in n1.out


def test_a_world_size_that_differs_fails_at_nccls_bootstrap_root(world):
    n0 = world.start(0, "--dist-timeout", "5", tp=16)
    n1 = world.start(1, "--dist-timeout", "5", nnodes=2, tp=32, node={"gpus": [{"id": i} for i in range(16)]})
    assert n0.wait(20) == 1 and n1.wait(20) == 1
    assert "NCCL WARN Bootstrap Root : mismatch in info from procs, nranks 16 vs 32" in n0.out


@pytest.mark.parametrize("args, node, said", [
    (["--tp", "3"], GPUS8, "AssertionError: tp_size must be divisible by number of nodes"),
    ([], {"gpus": [{"id": 0}, {"id": 1}]}, "CUDA error: invalid device ordinal"),
    (["--bogus"], GPUS8, "sglang serve: error: unrecognized arguments: --bogus"),
])
def test_a_node_that_cannot_start_says_why(world, args, node, said):
    argv = ["--model-path", str(world.model), "--tp", "16", "--nnodes", "2", "--node-rank", "1",
            "--dist-init-addr", f"127.0.0.1:{world.store}", *args]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{world.site}:{REPO}", "NVIDIA_VISIBLE_DEVICES": "all",
           "LLMDEPLOY_SIM_STATE": str(world.root)}
    (world.root / "node.json").write_text(json.dumps(node))
    n = Node(argv, env)
    world.nodes.append(n)
    rc = n.wait(20)
    assert said in n.out
    assert rc == (2 if "--bogus" in args else 1)
    if "--bogus" in args:
        assert n.out.startswith("usage: sglang serve [-h] --model-path MODEL_PATH")


def test_a_node_that_crashes_on_its_first_start_ends_the_world_and_the_next_start_serves(world):
    faulty = {**GPUS8, "sglang": {"crash_starts": 1}}
    n0 = world.start(0)
    n1 = world.start(1, node=faulty)
    assert n1.wait(20) == 1 and n0.wait(20) == 1
    assert "torch.OutOfMemoryError: CUDA out of memory" in n1.out
    assert "remote process exited or there was a network error" in n0.out
    assert (world.root / "node1" / "sglang-starts").read_text() == "1"
    n0, n1 = world.start(0), world.start(1, node=faulty)
    _healthy(world, [n0, n1])


def test_sigterm_ends_the_server_with_0(world):
    n0 = world.start(0, nnodes=1, tp=8)
    _healthy(world, [n0])
    n0.kill(signal.SIGTERM)
    assert n0.wait(20) == 0
    assert "Application shutdown complete." in n0.out


def test_node_rank_0_streams_max_tokens_pieces_counts_its_requests_and_drains_on_sigterm(world):
    from tests.unit.sse_client import Stream, finish_reasons, get, post, sample, tokens_of, usage_of, wait_until

    n0 = world.start(0, "--enable-metrics", "--served-model-name", "q", "--reasoning-parser", "qwen3",
                     "--max-running-requests", "4", nnodes=1, tp=8)
    _healthy(world, [n0])
    chat = {"model": "q", "messages": [{"role": "user", "content": "merge two sorted lists"}]}
    s = Stream("127.0.0.1", world.http, "/v1/chat/completions",
               {**chat, "max_tokens": 30, "ignore_eos": True, "stream_options": {"include_usage": True}})
    events = s.rest()
    s.close()
    assert len(tokens_of(events)) == 30 and usage_of(events)["completion_tokens"] == 30 and finish_reasons(events) == ["length"]
    running = lambda: sample(get(world.url("/metrics"))[1].decode(), "sglang:num_running_reqs", model_name="q")  # noqa: E731
    assert running() == 0.0
    # a slower release: node.json edited while the server runs
    (world.root / "node0" / "node.json").write_text(json.dumps({**GPUS8, "latency": {"first_token_s": 0.0, "per_token_s": 0.05}}))
    s = Stream("127.0.0.1", world.http, "/v1/chat/completions", {**chat, "max_tokens": 40, "ignore_eos": True})
    s.next_token()
    assert running() == 1.0
    assert sample(get(world.url("/metrics"))[1].decode(), "sglang:token_usage", model_name="q") > 0
    # SIGTERM: /health says 503, a new request is still served, the stream finishes, then exit 0
    n0.kill(signal.SIGTERM)
    wait_until(lambda: get(world.url("/health"))[0] == 503, "/health to say 503")
    code, body = post(world.url("/v1/chat/completions"), {**chat, "max_tokens": 2})
    assert code == 200 and json.loads(body)["usage"]["completion_tokens"] == 2
    rest = s.rest()
    s.close()
    assert len(tokens_of(rest)) == 39 and finish_reasons(rest) == ["length"]
    assert n0.wait(30) == 0
    assert "Draining requests and shutting down..." in n0.out
    assert "Gracefully exiting... Remaining number of requests 0." in n0.out and "Application shutdown complete." in n0.out
