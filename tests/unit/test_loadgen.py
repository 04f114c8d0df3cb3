"""The load generator (llmdeploy.loadgen): measuring a stream on a fake
clock, the figures, the request bodies, prompts files, and the bounded loop
against a real local streaming server on loopback (counts only: no figure
depends on this machine's speed)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from flows.probes import direct_sender
from llmdeploy import loadgen


class Clock:
    """A clock that moves only when told: each read returns the next value."""

    def __init__(self, times):
        self.times = list(times)

    def __call__(self):
        return self.times.pop(0)


def sse(*docs, done=True):
    out = [b"data: " + json.dumps(d).encode() + b"\n" for d in docs]
    return out + ([b"data: [DONE]\n"] if done else [])


def chunk(text, field="content"):
    return {"choices": [{"index": 0, "delta": {field: text}}]}


def test_a_stream_gives_ttft_itl_tpot_and_the_servers_token_count():
    lines = [b": keep-alive\n", *sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}, chunk("a", "reasoning_content"),
                                     chunk("b"), chunk("c"), {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 5}})]
    # reads: first text chunk at 0.30, then 0.40, 0.60, end at 0.70
    s = loadgen.measure(lines, t0=0.0, clock=Clock([0.30, 0.40, 0.60, 0.70]))
    assert s.ok and s.error == ""
    assert s.ttft == pytest.approx(0.30)
    assert s.itl == pytest.approx([0.10, 0.20])
    assert s.e2e == pytest.approx(0.70)
    assert s.output_tokens == 5 and s.prompt_tokens == 9
    assert s.tpot == pytest.approx((0.70 - 0.30) / 4)


def test_without_usage_the_text_chunks_are_the_tokens():
    s = loadgen.measure(sse(chunk("a"), chunk("b"), chunk("c")), 0.0, Clock([1, 2, 3, 4]))
    assert s.ok and s.output_tokens == 3 and s.tpot == pytest.approx((4 - 1) / 2)


@pytest.mark.parametrize("lines, said", [
    (sse(chunk("a"), done=False), "stream cut after 1 chunks"),
    (sse({"error": {"message": "KV cache is full"}}), "server error: KV cache is full"),
    (sse(), "no text in the answer"),
    ([b"data: {not json\n"], "unreadable event"),
])
def test_a_request_that_did_not_stream_an_answer_is_an_error_with_its_reason(lines, said):
    s = loadgen.measure(lines, 0.0, Clock([1, 2, 3, 4]))
    assert not s.ok and said in s.error and s.tpot is None


def test_percentiles_interpolate_between_ranks_like_numpy():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert loadgen.percentile(xs, 50) == pytest.approx(2.5)
    assert loadgen.percentile(xs, 99) == pytest.approx(3.97)
    assert loadgen.percentile([], 50) is None


def test_a_level_summary_has_the_figures_in_ms_the_rates_and_the_errors_by_reason():
    ok = [loadgen.Sample(start=0, ok=True, ttft=0.1 * i, e2e=1.0, itl=[0.01], output_tokens=11) for i in (1, 2, 3)]
    bad = [loadgen.Sample(start=0, error="HTTP 503: busy"), loadgen.Sample(start=0, error="HTTP 503: busy")]
    doc = loadgen.summarize(ok + bad, wall_s=2.0, concurrency=4)
    assert doc["requests"] == 5 and doc["ok"] == 3 and doc["errors"] == 2
    assert doc["error_reasons"] == {"HTTP 503: busy": 2}
    assert doc["ttft"]["p50"] == pytest.approx(200.0)
    assert doc["output_tokens"] == 33 and doc["output_tokens_per_s"] == pytest.approx(16.5)
    assert doc["requests_per_s"] == pytest.approx(1.5)
    assert doc["tpot"]["p50"] == pytest.approx((1.0 - 0.2) / 10 * 1000)


def test_the_request_keeps_the_releases_chat_check_and_asks_for_a_fixed_streamed_length():
    base = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": False}, "max_tokens": 8}
    load = loadgen.Load(requests=3, input_tokens=20, output_tokens=64)
    body = loadgen.request_body(base, load, 2)
    assert body["model"] == "qwen" and body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 64 and body["ignore_eos"] is True
    assert len(body["messages"][0]["content"].split()) == 20
    assert body["messages"] != loadgen.request_body(base, load, 1)["messages"]
    assert base["max_tokens"] == 8  # the plan's probe is not changed
    with_prompts = loadgen.request_body(base, loadgen.Load(prompts=("one", "two")), 3)
    assert with_prompts["messages"][0]["content"] == "two"


def test_a_prompts_file_is_lines_or_json_lines_and_a_bad_line_is_named():
    assert loadgen.read_prompts("first\n\nsecond\n", "p.txt") == ("first", "second")
    assert loadgen.read_prompts('{"prompt": "a"}\n{"text": "b"}\n', "p.jsonl") == ("a", "b")
    with pytest.raises(ValueError, match=r"p.jsonl:2: a JSON line needs"):
        loadgen.read_prompts('{"prompt": "a"}\n{"other": 1}\n', "p.jsonl")
    with pytest.raises(ValueError, match=r"p.txt: no prompts"):
        loadgen.read_prompts("\n\n", "p.txt")


def test_the_load_shape_names_what_makes_figures_comparable():
    assert loadgen.Load(requests=16, concurrency=(4,), input_tokens=128, output_tokens=64).shape() == "n16-c4-in128-out64"


# --- the loop against a real local server --------------------------------------------------------
@pytest.fixture
def server():
    """A streaming chat server on 127.0.0.1 that answers ``max_tokens`` chunks,
    records the most requests it held at once, and fails every 5th request with 503."""
    state = {"n": 0, "now": 0, "most": 0}
    lock = threading.Lock()

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                state["n"] += 1
                n = state["n"]
                state["now"] += 1
                state["most"] = max(state["most"], state["now"])
            try:
                if n % 5 == 0:
                    data = b'{"error": "busy"}'
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                for i in range(body["max_tokens"]):
                    self.wfile.write(b"data: " + json.dumps(chunk(f"t{i} ")).encode() + b"\n\n")
                    self.wfile.flush()
                usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": body["max_tokens"]}}
                self.wfile.write(b"data: " + json.dumps(usage).encode() + b"\n\ndata: [DONE]\n\n")
                self.close_connection = True
            finally:
                with lock:
                    state["now"] -= 1

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
    httpd.daemon_threads = True
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield httpd.server_address[1], state
    httpd.shutdown()
    httpd.server_close()
    t.join(5)


def test_the_loop_sends_every_request_at_most_concurrency_at_once_and_counts_failures(server):
    port, state = server
    load = loadgen.Load(requests=10, concurrency=(3,), output_tokens=6, request_timeout_s=10)
    bodies = [loadgen.request_body({"model": "m"}, load, i) for i in range(load.requests)]
    samples, wall = loadgen.run_level(direct_sender("127.0.0.1", port, "/v1/chat/completions", None), bodies, 3, load)
    assert len(samples) == 10 and state["n"] == 10 and state["most"] <= 3
    doc = loadgen.summarize(samples, wall, 3)
    assert doc["ok"] == 8 and doc["errors"] == 2
    assert list(doc["error_reasons"]) == ['HTTP 503: {"error": "busy"}']
    assert doc["output_tokens"] == 8 * 6
    assert all(s.output_tokens == 6 for s in samples if s.ok)


def test_no_request_starts_once_the_level_is_out_of_time(server):
    port, state = server
    load = loadgen.Load(requests=50, concurrency=(2,), output_tokens=3, duration_s=0.0)
    bodies = [loadgen.request_body({"model": "m"}, load, i) for i in range(load.requests)]
    samples, _ = loadgen.run_level(direct_sender("127.0.0.1", port, "/v1/chat/completions", None), bodies, 2, load)
    assert samples == [] and state["n"] == 0


def test_a_closed_port_is_an_error_per_request_not_a_crash():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    load = loadgen.Load(requests=2, concurrency=(1,), output_tokens=3, request_timeout_s=2)
    bodies = [loadgen.request_body({"model": "m"}, load, i) for i in range(2)]
    samples, _ = loadgen.run_level(direct_sender("127.0.0.1", port, "/v1/chat/completions", None), bodies, 1, load)
    assert len(samples) == 2 and all(not x.ok and "ConnectionRefusedError" in x.error for x in samples)


def test_a_chunked_stream_reads_line_by_line_through_a_channel_like_paramikos():
    """paramiko's channel file has no peek(), which http.client's readline
    needs for a chunked answer: the channel is wrapped in a buffered reader."""
    import http.client
    import socket

    from flows.probes import _ChannelSocket, stream_lines

    class Chan:  # what of paramiko.Channel the wrapper uses, on one end of a socket pair
        def __init__(self, sock):
            self.sock = sock

        def recv(self, n):
            return self.sock.recv(n)

        def sendall(self, data):
            self.sock.sendall(data)

        def settimeout(self, t):
            self.sock.settimeout(t)

        def gettimeout(self):
            return self.sock.gettimeout()

        def close(self):
            self.sock.close()

    ours, theirs = socket.socketpair()

    def serve():
        theirs.recv(65536)  # the request
        events = [b"data: " + json.dumps(chunk(f"t{i}")).encode() + b"\n\n" for i in range(3)] + [b"data: [DONE]\n\n"]
        theirs.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                       + b"".join(f"{len(e):x}\r\n".encode() + e + b"\r\n" for e in events) + b"0\r\n\r\n")

    t = threading.Thread(target=serve)
    t.start()
    hc = http.client.HTTPConnection("127.0.0.1", 1, timeout=5)
    hc.sock = _ChannelSocket(Chan(ours))
    s = loadgen.measure(stream_lines(hc, "/v1/chat/completions", {"model": "m"}, None), 0.0, Clock([1, 2, 3, 4]))
    t.join(5)
    theirs.close()
    assert s.ok and s.output_tokens == 3, s.error
