"""sim/standins/streaming.py, what the serving stand-ins share: token pieces,
max_tokens and ignore_eos, the node.json latency and its pacing (computed
with an injected wait, not timed), the requests in flight (batch limit,
waiting queue, aborts, clients that go away), the metric texts; then the
vLLM and trtllm-serve stand-ins as real local processes (each in its own
session and temporary state directory, killed by its id at the end): a
streamed answer of exactly max_tokens pieces, the live running count on their
metrics endpoint, and what SIGTERM does to a stream in flight."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sim.standins import streaming as st
from tests.unit.sse_client import Stream, finish_reasons, get, post, sample, tokens_of, usage_of, wait_until

REPO = Path(__file__).resolve().parents[2]


# --- pieces ------------------------------------------------------------------------------------------
def test_pieces_are_short_and_give_the_text_back():
    text = "def merge(a, b):\n    dummy = tail = ListNode()\n    ..."
    pieces = st.tokenize(text)
    assert "".join(pieces) == text
    assert all(len(p.strip()) <= 4 for p in pieces)
    assert pieces[:3] == ["def", " merg", "e(a,"]
    assert st.tokenize("") == [] and st.tokenize(None) == []
    assert st.tokenize("a  \n") == ["a", "  \n"]


def test_a_plan_keeps_the_fields_in_order():
    p = st.plan([("reasoning_content", "think hard"), ("content", "the answer")])
    assert p.finish_reason == "stop"
    assert p.text("reasoning_content") == "think hard" and p.text("content") == "the answer"
    assert [f for f, _ in p.tokens] == ["reasoning_content"] * 3 + ["content"] * 3
    # a field without text has no pieces
    q = st.plan([("reasoning_content", None), ("content", "x")])
    assert q.text("reasoning_content") is None and len(q) == 1


def test_max_tokens_caps_and_ignore_eos_makes_exactly_that_many():
    fields = [("reasoning_content", "think hard"), ("content", "the answer")]
    capped = st.plan(fields, max_tokens=4)
    assert len(capped) == 4 and capped.finish_reason == "length"
    assert capped.text("reasoning_content") == "think hard" and capped.text("content") == "the"
    assert st.plan(fields, max_tokens=100).finish_reason == "stop" and len(st.plan(fields, max_tokens=100)) == 6
    longer = st.plan(fields, max_tokens=11, ignore_eos=True)
    assert len(longer) == 11 and longer.finish_reason == "length"
    # the answer (the last field: "the", " answ", "er") repeats after the whole
    assert longer.text("reasoning_content") == "think hard"
    assert longer.text("content") == "the answer" + "the answer" + "the answ"
    exact = st.plan(fields, max_tokens=6, ignore_eos=True)
    assert len(exact) == 6 and exact.finish_reason == "length"
    # ignore_eos without max_tokens: the answer as it is
    assert len(st.plan(fields, ignore_eos=True)) == 6
    # what was sent of a plan
    assert longer.text("content", upto=4) == "the" and longer.text("content", upto=3) is None


def test_request_parameters():
    assert st.max_tokens_of({}) is None
    assert st.max_tokens_of({"max_tokens": 7}) == 7
    assert st.max_tokens_of({"max_tokens": 7, "max_completion_tokens": 3}) == 3
    for bad in (0, -1, "8", True, 1.5):
        with pytest.raises(st.BadRequest, match="max_tokens must be at least 1"):
            st.max_tokens_of({"max_tokens": bad})
    assert st.ignore_eos_of({"ignore_eos": True}) and not st.ignore_eos_of({"ignore_eos": "yes"})
    assert not st.ignore_eos_of({"nvext": {"ignore_eos": True}})
    assert st.ignore_eos_of({"nvext": {"ignore_eos": True}}, nvext=True)
    assert st.include_usage({"stream_options": {"include_usage": True}}) and not st.include_usage({})
    assert st.prompt_tokens({"messages": [{"role": "user", "content": "merge two sorted lists"},
                                          {"role": "user", "content": [{"type": "text", "text": "now"}]}]}) == 5
    assert st.prompt_tokens({"prompt": "a b c"}) == 3 and st.prompt_tokens({}) == 1
    assert st.usage(5, 7) == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}


# --- latency ------------------------------------------------------------------------------------------
def test_latency_comes_from_node_json_read_when_asked(tmp_path):
    assert st.read_latency(str(tmp_path)) == st.Latency(0.0, 0.0)  # no node.json
    (tmp_path / "node.json").write_text(json.dumps({"gpus": [], "latency": {"first_token_s": 0.5, "per_token_s": 0.02}}))
    assert st.read_latency(str(tmp_path)) == st.Latency(0.5, 0.02)
    (tmp_path / "node.json").write_text(json.dumps({"latency": {"first_token_s": "slow", "per_token_s": -1}}))
    assert st.read_latency(str(tmp_path)) == st.Latency(0.0, 0.0)
    assert st.latency_of({"latency": {"per_token_s": 0.1}}) == st.Latency(0.0, 0.1)
    assert st.Latency(0.5, 0.01).slowest(st.Latency(0.1, 0.02)) == st.Latency(0.5, 0.02)


def test_the_first_token_waits_first_token_s_and_each_next_per_token_s():
    lat = st.Latency(0.5, 0.02)
    assert st.delays(3, lat) == [0.5, 0.02, 0.02] and st.delays(0, lat) == []
    assert lat.total(3) == pytest.approx(0.54)
    waits: list[float] = []
    engine = st.Engine(wait=lambda s: waits.append(s) or True)
    sent: list[tuple[str, str]] = []
    answer = st.plan([("content", "one two three")])
    with engine.request(3) as r:
        assert st.generate(r, answer, lat, lambda f, p: sent.append((f, p)))
        r.finish(answer.finish_reason)
    assert sent == [("content", "one"), ("content", " two"), ("content", " thre"), ("content", "e")]
    assert waits == [0.5, 0.02, 0.02, 0.02] and r.generated == len(answer) == 4
    # a non-streamed answer waits the same
    waits.clear()
    with engine.request(3) as r:
        assert st.generate(r, answer, lat)
    assert waits == st.delays(len(answer), lat)


# --- requests in flight ----------------------------------------------------------------------------------
def test_counts_of_a_request_from_admission_to_its_end():
    engine = st.Engine(kv_capacity_tokens=100)
    assert engine.stats()["running"] == 0
    with engine.request(10) as r:
        s = engine.stats()
        assert (s["running"], s["waiting"], s["queued"], s["kv_tokens"], s["prompt_tokens_total"]) == (1, 0, 1, 10, 10)
        r.token()
        r.token()
        s = engine.stats()
        assert (s["queued"], s["kv_tokens"], s["generation_tokens_total"], s["kv_usage"]) == (0, 12, 2, 0.12)
        r.finish("length")
        assert engine.stats()["running"] == 0 and engine.stats()["kv_tokens"] == 0
    s = engine.stats()
    assert s["finished"] == {"length": 1} and s["completed"] == 1 and engine.idle()


def test_a_client_that_goes_away_leaves_no_request_behind():
    engine = st.Engine()
    with pytest.raises(BrokenPipeError):
        with engine.request(4) as r:
            r.token()
            raise BrokenPipeError(32, "Broken pipe")
    s = engine.stats()
    assert (s["running"], s["queued"], s["kv_tokens"], s["finished"]) == (0, 0, 0, {"abort": 1})


def test_beyond_the_batch_limit_requests_wait_in_arrival_order():
    engine = st.Engine(max_running=1)
    first = engine.request(1)
    order: list[int] = []
    release = {i: threading.Event() for i in (2, 3)}

    def client(i):
        with engine.request(1) as r:
            order.append(i)
            release[i].wait(10)
            r.finish("stop")

    t2 = threading.Thread(target=client, args=(2,))
    t2.start()
    wait_until(lambda: engine.stats()["waiting"] == 1, "the second request to wait")
    t3 = threading.Thread(target=client, args=(3,))
    t3.start()
    wait_until(lambda: engine.stats()["waiting"] == 2, "the third request to wait")
    assert engine.stats()["running"] == 1 and engine.stats()["queued"] == 3
    first.finish("stop")
    wait_until(lambda: order == [2], "the second request to run")
    assert engine.stats()["waiting"] == 1 and engine.stats()["running"] == 1
    release[2].set()
    wait_until(lambda: order == [2, 3], "the third request to run")
    release[3].set()
    t2.join(10)
    t3.join(10)
    s = engine.stats()
    assert (s["running"], s["waiting"], s["finished"]) == (0, 0, {"stop": 3})


def test_a_closed_engine_admits_nothing_and_an_abort_ends_a_stream_at_its_next_token():
    engine = st.Engine()
    r = engine.request(2)
    engine.close()
    with pytest.raises(st.Closed):
        engine.request(2)
    r.finish("stop")
    engine2 = st.Engine()
    sent = []
    answer = st.plan([("content", "one two three four")])
    with engine2.request(1) as r2:
        def emit(f, p):
            sent.append(p)
            if len(sent) == 2:
                engine2.abort()
        assert st.generate(r2, answer, st.Latency(0, 0), emit) is False
        r2.finish("abort")
    assert len(sent) == 2 and engine2.stats()["finished"] == {"abort": 1}
    assert engine2.wait_idle(1)


def test_throughput_counts_the_tokens_of_the_last_seconds():
    now = [100.0]
    engine = st.Engine(clock=lambda: now[0])
    with engine.request(1) as r:
        for _ in range(10):
            r.token()
        assert engine.throughput(window=5.0) == 2.0
        now[0] += 6
        assert engine.throughput(window=5.0) == 0.0


# --- metric texts ----------------------------------------------------------------------------------------
def test_vllm_metrics_text():
    engine = st.Engine()
    r = engine.request(12)
    r.token()
    text = st.vllm_metrics(engine, "Qwen/Qwen3-8B")
    for name, kind in (("vllm:num_requests_running", "gauge"), ("vllm:num_requests_waiting", "gauge"),
                       ("vllm:kv_cache_usage_perc", "gauge"), ("vllm:prompt_tokens_total", "counter"),
                       ("vllm:generation_tokens_total", "counter"), ("vllm:request_success_total", "counter")):
        assert f"# TYPE {name} {kind}\n" in text
    assert 'vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 1.0' in text
    assert sample(text, "vllm:prompt_tokens_total", model_name="Qwen/Qwen3-8B") == 12.0
    assert 0 < sample(text, "vllm:kv_cache_usage_perc") < 1
    assert "gpu_cache_usage_perc" not in text
    r.finish("stop")
    text = st.vllm_metrics(engine, "Qwen/Qwen3-8B")
    assert sample(text, "vllm:num_requests_running") == 0.0
    assert sample(text, "vllm:request_success_total", finished_reason="stop") == 1.0


def test_trtllm_metrics():
    engine = st.Engine(max_running=1)
    r = engine.request(40)
    stats = st.trtllm_iteration_stats(engine, 7, 1)
    assert (stats["iter"], stats["numActiveRequests"], stats["numQueuedRequests"], stats["maxNumActiveRequests"]) == (7, 1, 0, 1)
    kv = stats["kvCacheStats"]
    assert kv["usedNumBlocks"] == 2 and kv["usedNumBlocks"] + kv["freeNumBlocks"] == kv["maxNumBlocks"]
    assert kv["tokensPerBlock"] == 32 and "numScheduledRequests" in stats["inflightBatchingStats"]
    text = st.trtllm_prometheus(engine, iteration_stats=True)
    assert 'trtllm_num_requests_running{engine_type="undefined",model_name="undefined"} 1.0' in text
    assert sample(text, "trtllm_num_requests_waiting") == 0.0 and sample(text, "trtllm_kv_cache_utilization") > 0
    r.finish("stop")
    text = st.trtllm_prometheus(engine, iteration_stats=False)
    assert "trtllm_num_requests_running" not in text
    assert sample(text, "trtllm_request_success_total", finished_reason="stop") == 1.0
    assert sample(text, "trtllm_prompt_tokens_total") == 40.0


def test_the_module_loads_with_the_standard_library_only():
    import ast

    tree = ast.parse(open(st.__file__).read())
    top = {a.name.split(".")[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    top |= {n.module.split(".")[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module and not n.level}
    assert top - {"__future__"} <= set(sys.stdlib_module_names), top


# --- the stand-ins as real processes ------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One stand-in process in its own session, its output read as it comes."""

    def __init__(self, code: str, argv: list[str], env: dict):
        self.p = subprocess.Popen([sys.executable, "-c", code, *argv], env=env, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.p.stdout), daemon=True)
        self.reader.start()

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def signal(self, sig) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, sig)  # its own session: this process and nothing else

    def wait(self, timeout: float) -> int:
        rc = self.p.wait(timeout)
        self.reader.join(10)
        return rc


@pytest.fixture
def servers():
    started: list[Server] = []
    yield started
    for s in started:
        s.signal(signal.SIGKILL)
        s.wait(30)


def _node(state: Path, **extra) -> None:
    (state / "node.json").write_text(json.dumps({"gpus": [{"id": 0}], **extra}))


def _ready(srv: Server, url: str) -> None:
    def up():
        if srv.p.poll() is not None:
            pytest.fail(f"the server exited {srv.p.returncode}:\n{srv.out}")
        return get(url, 2)[0] == 200
    wait_until(up, f"{url} to answer 200")


CHAT = {"messages": [{"role": "user", "content": "merge two sorted lists"}]}


def _vllm(tmp_path: Path, servers, *args: str) -> tuple[Server, int, Path]:
    model, state = tmp_path / "model", tmp_path / "state"
    model.mkdir()
    state.mkdir()
    (model / "config.json").write_text("{}")
    _node(state)
    port = _free_port()
    code = "import sys; sys.path.insert(0, sys.argv.pop(1)); from sim.standins import vllm; sys.exit(vllm.main(sys.argv[1:]))"
    argv = [str(REPO), "serve", str(model), "--served-model-name", "qwen", "--host", "127.0.0.1", "--port", str(port),
            "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", str(_free_port()), *args]
    srv = Server(code, argv, {"PATH": os.environ["PATH"], "LLMDEPLOY_SIM_STATE": str(state)})
    servers.append(srv)
    _ready(srv, f"http://127.0.0.1:{port}/health")
    return srv, port, state


def test_vllm_streams_max_tokens_pieces_and_shows_its_running_requests(tmp_path, servers):
    srv, port, state = _vllm(tmp_path, servers, "--max-num-seqs", "4", "--shutdown-timeout", "30")
    s = Stream("127.0.0.1", port, "/v1/chat/completions",
               {**CHAT, "model": "qwen", "max_tokens": 40, "ignore_eos": True, "stream_options": {"include_usage": True}})
    events = s.rest()
    s.close()
    assert len(tokens_of(events)) == 40 and finish_reasons(events) == ["length"]
    assert usage_of(events)["completion_tokens"] == 40 and usage_of(events)["prompt_tokens"] == 4
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    # non-streamed: capped, with usage
    code, body = post(f"http://127.0.0.1:{port}/v1/chat/completions", {**CHAT, "model": "qwen", "max_tokens": 3})
    answer = json.loads(body)
    assert code == 200 and answer["usage"]["completion_tokens"] == 3 and answer["choices"][0]["finish_reason"] == "length"
    assert post(f"http://127.0.0.1:{port}/v1/chat/completions", {**CHAT, "model": "qwen", "max_tokens": 0})[0] == 400
    metrics = f"http://127.0.0.1:{port}/metrics"
    # the server counts a request out once its handler has returned, which may be just after the client read the end
    wait_until(lambda: sample(get(metrics)[1].decode(), "vllm:num_requests_running", model_name="qwen") == 0.0, "no request running")
    # a slower release: node.json edited while the server runs
    _node(state, latency={"first_token_s": 0.0, "per_token_s": 0.05})
    s = Stream("127.0.0.1", port, "/v1/chat/completions", {**CHAT, "model": "qwen", "max_tokens": 30, "ignore_eos": True})
    s.next_token()
    assert sample(get(metrics)[1].decode(), "vllm:num_requests_running", model_name="qwen") == 1.0
    # SIGTERM with --shutdown-timeout 30: the stream in flight finishes, a new request gets 503
    srv.signal(signal.SIGTERM)
    wait_until(lambda: get(f"http://127.0.0.1:{port}/health")[0] == 503, "/health to say 503")
    assert post(f"http://127.0.0.1:{port}/v1/chat/completions", {**CHAT, "model": "qwen"})[0] == 503
    rest = s.rest()
    s.close()
    assert len(tokens_of(rest)) == 29 and finish_reasons(rest) == ["length"]
    assert srv.wait(30) == 0
    assert "Traceback" not in srv.out


def test_vllm_sigterm_without_a_shutdown_timeout_aborts_the_stream_in_flight(tmp_path, servers):
    srv, port, state = _vllm(tmp_path, servers)
    _node(state, latency={"first_token_s": 0.0, "per_token_s": 0.05})
    s = Stream("127.0.0.1", port, "/v1/chat/completions", {**CHAT, "model": "qwen", "max_tokens": 200, "ignore_eos": True})
    s.next_token()
    srv.signal(signal.SIGTERM)
    rest = s.rest()
    s.close()
    assert finish_reasons(rest) == ["abort"] and len(tokens_of(rest)) < 199
    assert srv.wait(30) == 0
    assert "Shutting down FastAPI HTTP server." in srv.out


def test_a_client_that_goes_away_mid_stream_leaves_no_running_request(tmp_path, servers):
    srv, port, state = _vllm(tmp_path, servers)
    _node(state, latency={"first_token_s": 0.0, "per_token_s": 0.05})
    s = Stream("127.0.0.1", port, "/v1/chat/completions", {**CHAT, "model": "qwen", "max_tokens": 200, "ignore_eos": True})
    s.next_token()
    metrics = f"http://127.0.0.1:{port}/metrics"
    assert sample(get(metrics)[1].decode(), "vllm:num_requests_running") == 1.0
    s.resp.close()
    s.close()
    wait_until(lambda: sample(get(metrics)[1].decode(), "vllm:num_requests_running") == 0.0, "the running count to drop")
    assert sample(get(metrics)[1].decode(), "vllm:request_success_total", finished_reason="abort") == 1.0
    assert "Traceback" not in srv.out


def _trtllm(tmp_path: Path, servers, config: str) -> tuple[Server, int, Path]:
    from sim import images

    model, state, site = tmp_path / "model", tmp_path / "state", tmp_path / "site"
    for d in (model, state, site):
        d.mkdir()
    (model / "config.json").write_text("{}")
    for rel, text in images._dist_info("tensorrt-llm", "1.3.0a0.dev202610151219").items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    (tmp_path / "config.yaml").write_text(config)
    _node(state)
    port = _free_port()
    code = "import sys; sys.path.insert(0, sys.argv.pop(1)); from sim.standins import trtllm; sys.exit(trtllm.main(sys.argv[1:]))"
    argv = [str(REPO), str(model), "--host", "127.0.0.1", "--port", str(port), "--reasoning_parser", "qwen3",
            "--config", str(tmp_path / "config.yaml")]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(site), "LLMDEPLOY_SIM_STATE": str(state), "NVIDIA_VISIBLE_DEVICES": "all"}
    srv = Server(code, argv, env)
    servers.append(srv)
    _ready(srv, f"http://127.0.0.1:{port}/health")
    return srv, port, state


def test_trtllm_serve_streams_max_tokens_pieces_and_shows_its_running_requests(tmp_path, servers):
    srv, port, state = _trtllm(tmp_path, servers, "tensor_parallel_size: 1\nenable_iter_perf_stats: true\n"
                                                  "return_perf_metrics: true\nmax_batch_size: 8\n")
    s = Stream("127.0.0.1", port, "/v1/chat/completions",
               {**CHAT, "model": "m", "max_tokens": 25, "ignore_eos": True, "stream_options": {"include_usage": True}})
    events = s.rest()
    s.close()
    got = tokens_of(events)
    assert len(got) == 25 and usage_of(events)["completion_tokens"] == 25 and finish_reasons(events) == ["length"]
    assert got[0][0] == "reasoning_content"  # the reasoning parser's split
    prom = f"http://127.0.0.1:{port}/prometheus/metrics"
    assert sample(get(prom)[1].decode(), "trtllm_num_requests_running") == 0.0
    assert sample(get(prom)[1].decode(), "trtllm_generation_tokens_total") == 25.0
    get(f"http://127.0.0.1:{port}/metrics")  # the stats of those iterations
    assert json.loads(get(f"http://127.0.0.1:{port}/metrics")[1]) == []  # idle: no iteration since
    _node(state, latency={"first_token_s": 0.0, "per_token_s": 0.05})
    s = Stream("127.0.0.1", port, "/v1/chat/completions", {**CHAT, "model": "m", "max_tokens": 30, "ignore_eos": True})
    s.next_token()
    assert sample(get(prom)[1].decode(), "trtllm_num_requests_running") == 1.0
    (stats,) = json.loads(get(f"http://127.0.0.1:{port}/metrics")[1])
    assert stats["numActiveRequests"] == 1 and stats["numQueuedRequests"] == 0 and stats["maxNumActiveRequests"] == 8
    # SIGTERM: uvicorn's graceful shutdown lets the stream finish, then the process ends by SIGTERM
    srv.signal(signal.SIGTERM)
    rest = s.rest()
    s.close()
    assert len(tokens_of(rest)) == 29 and finish_reasons(rest) == ["length"]
    assert srv.wait(30) == -signal.SIGTERM
    assert "Waiting for connections to close." in srv.out and "Application shutdown complete." in srv.out
    assert "Traceback" not in srv.out, srv.out
    with pytest.raises(OSError):
        get(f"http://127.0.0.1:{port}/health", 2)


def test_trtllm_serve_metrics_without_the_llm_api_options(tmp_path, servers):
    """Without enable_iter_perf_stats /metrics is [] (no iteration stats); without return_perf_metrics there is no /prometheus/metrics."""
    srv, port, _ = _trtllm(tmp_path, servers, "tensor_parallel_size: 1\n")
    s = Stream("127.0.0.1", port, "/v1/chat/completions", {**CHAT, "model": "m", "max_tokens": 2})
    assert len(tokens_of(s.rest())) == 2
    s.close()
    assert json.loads(get(f"http://127.0.0.1:{port}/metrics")[1]) == []
    assert get(f"http://127.0.0.1:{port}/prometheus/metrics")[0] == 404
