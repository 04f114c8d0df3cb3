"""The Dynamo worker stand-in registers the model name a real Dynamo worker
registers (ai-dynamo 1.6.1): ``--served-model-name`` when given, else the
model path exactly as given; and it shows ``trtllm_kv_cache_utilization``
only once it has served a request. The registration is read from what the
worker really puts into etcd (a small etcd v3 gateway and NATS server in
this test); the plan's worker lines are parsed by the stand-in's parser."""

from __future__ import annotations

import json
import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from flows import deploy as dep
from llmdeploy.inventory import load_cluster
from roles import commenv
from systems.dynamo import workers as dynamo
from sim.standins import dynamo as dy

REPO = Path(__file__).resolve().parents[2]
SERVED = "nvidia/Qwen3.5-397B-A17B-NVFP4-V2"
MODEL = "/models/qwen35"
SITE = ["ai_dynamo-1.6.0.dev20261010", "ai_dynamo_runtime-1.6.0.dev20261010", "tensorrt_llm-1.3.0a0.dev202610151219"]


# --- the name, pure ----------------------------------------------------------------------------
def test_the_registered_name_is_the_served_name_else_the_model_path_as_given():
    assert dy.registered_model_name(SERVED, "/models/qwen35") == SERVED
    assert dy.registered_model_name(None, "/models/qwen35") == "/models/qwen35"
    # DynamoTrtllmConfig.validate: an empty --served-model-name is None
    assert dy.registered_model_name("", "/models/qwen35/") == "/models/qwen35/"
    assert dy.registered_model_name(None, "Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B"


def _name(argv, env=None):
    a = dy.parse_worker_args(argv, env=env or {})
    return dy.registered_model_name(a.served_model_name, a.model_path)


def test_the_parser_takes_model_its_old_alias_and_the_environment_defaults():
    assert _name(["--model-path", "/models/qwen35"]) == "/models/qwen35"
    assert _name(["--model", "/models/qwen35"]) == "/models/qwen35"
    assert _name(["--model-path", "/models/qwen35", "--served-model-name", SERVED]) == SERVED
    # backend_args.py's defaults and their environment variables
    assert _name([]) == "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
    assert _name([], {"DYN_TRTLLM_MODEL": "/m"}) == "/m"
    assert _name(["--model-path", "/models/qwen35"], {"DYN_TRTLLM_SERVED_MODEL_NAME": SERVED}) == SERVED
    assert _name(["--served-model-name", "a/b"], {"DYN_TRTLLM_SERVED_MODEL_NAME": SERVED}) == "a/b"


@pytest.mark.parametrize("name", ["gb300-agentic", "sim-gb300-1p2d"])
def test_the_plans_workers_register_what_readiness_asks_for(name):
    """Each worker line of the plan, as the stand-in's parser reads it (with
    the container's MODEL_PATH), registers the name /v1/models must list."""
    c = load_cluster(name)
    _, _, plan = dep.plan_release(c, {}, "sha256:x")
    (models,) = [p for p in plan.ready if p.path == "/v1/models"]
    seen = 0
    for w in dynamo.placement(c, c.profile):
        text = plan.files[w.rank0_node][f"{w.name}.serve.sh"][0]
        env = commenv.parse_env_file(plan.files[w.rank0_node][f"{w.name}.env"][0])
        exec_line = text.rstrip("\n").splitlines()[-1]
        argv = exec_line.split(" dynamo.trtllm ", 1)[1].replace('"$MODEL_PATH"', env["MODEL_PATH"]).split()
        assert _name(argv) == models.arg == SERVED, w.name
        # the seed's line alone would register the path
        at = argv.index("--served-model-name")
        assert _name(argv[:at] + argv[at + 2:]) == env["MODEL_PATH"] == "/models/qwen35"
        seen += 1
    assert seen == len(dynamo.placement(c, c.profile))


# --- the registration, for real: what the worker puts into etcd ----------------------------------
class _Etcd(ThreadingHTTPServer):
    """Just enough of etcd's v3 JSON gateway: health, leases, put, a prefix
    range (what the frontend polls), revoke; every put kept."""

    daemon_threads = True

    def __init__(self):
        self.puts: list[dict] = []
        self.kvs: dict[str, tuple[str, str | None]] = {}  # key -> (value base64, lease)
        self.put_seen = threading.Event()

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, body):
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._send({"health": "true"})

            def do_POST(inner):
                req = json.loads(inner.rfile.read(int(inner.headers.get("Content-Length") or 0)) or b"{}")
                if inner.path == "/v3/lease/grant":
                    return inner._send({"ID": "4660", "TTL": "10"})
                if inner.path == "/v3/lease/keepalive":
                    return inner._send(json.dumps({"result": {"ID": "4660", "TTL": "10"}}) + "\n")
                if inner.path == "/v3/kv/put":
                    self.puts.append({"key": dy.unb64(req["key"]), "value": json.loads(dy.unb64(req["value"])), "lease": req.get("lease")})
                    self.kvs[dy.unb64(req["key"])] = (req["value"], req.get("lease"))
                    self.put_seen.set()
                if inner.path == "/v3/kv/range":
                    prefix = dy.unb64(req["key"])
                    return inner._send({"kvs": [{"key": dy.b64(k), "value": v, "lease": lease or "0"}
                                                for k, (v, lease) in sorted(self.kvs.items()) if k.startswith(prefix)]})
                if inner.path == "/v3/lease/revoke":
                    for k in [k for k, (_, lease) in self.kvs.items() if lease == req.get("ID")]:
                        del self.kvs[k]
                return inner._send({})

        super().__init__(("127.0.0.1", 0), Handler)


class _Nats(socketserver.ThreadingTCPServer):
    """A NATS server's greeting and PONGs."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self):
        class Handler(socketserver.StreamRequestHandler):
            def handle(self):
                self.wfile.write(b'INFO {"server_name":"t","version":"2.10.24","headers":true,"jetstream":true}\r\n')
                for line in self.rfile:
                    if line.strip().upper() == b"PING":
                        self.wfile.write(b"PONG\r\n")

        super().__init__(("127.0.0.1", 0), Handler)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def control_plane():
    etcd, nats = _Etcd(), _Nats()
    for srv in (etcd, nats):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield etcd, nats
    for srv in (etcd, nats):
        srv.shutdown()
        srv.server_close()


def _register(tmp_path, control_plane, args, env=None) -> dict:
    """Start the worker stand-in (one rank, decode) with ``args`` after its
    ``--model-path``-less part, wait until it put its instance into etcd,
    stop it; the instance's value."""
    etcd, nats = control_plane
    # the container's paths: the model and the recipes checkout where its mounts put them
    model, recipes, site, state = (tmp_path / d for d in ("models/qwen35", "recipes", "site", "state"))
    for d in (model, recipes, site, state):
        d.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (recipes / "decode.yaml").write_text("tensor_parallel_size: 1\npipeline_parallel_size: 1\n")
    for name in SITE:  # what pip installed into the image
        dist, version = name.split("-", 1)
        (site / f"{name}.dist-info").mkdir()
        (site / f"{name}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
    args = [str(model) if a == MODEL else a for a in args]
    (state / "node.json").write_text(json.dumps({"gpus": [{"id": 0}]}))
    full = {"PATH": os.environ["PATH"], "PYTHONPATH": str(site), "LLMDEPLOY_SIM_STATE": str(state),
            "NVIDIA_VISIBLE_DEVICES": "all", "CUDA_VISIBLE_DEVICES": "0", "DYN_SYSTEM_PORT": str(_free_port()), "DYN_NAMESPACE": "qwen35-gb300",
            "ETCD_ENDPOINTS": f"http://127.0.0.1:{etcd.server_address[1]}", "NATS_SERVER": f"nats://127.0.0.1:{nats.server_address[1]}",
            **(env or {})}
    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from sim.standins import dynamo; "
            "sys.exit(dynamo.main('dynamo.trtllm', sys.argv[1:]))")
    argv = [*args, "--disaggregation-mode", "decode", "--extra-engine-args", str(recipes / "decode.yaml"), "--publish-metrics"]
    proc = subprocess.Popen([sys.executable, "-c", code, str(REPO), *argv], env=full, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # the event: its put, or its exit (then its output says why)
        while not etcd.put_seen.wait(0.2):
            if proc.poll() is not None:
                pytest.fail(f"the worker exited {proc.returncode} before registering:\n{proc.stdout.read()}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    (put,) = etcd.puts
    assert put["key"] == dy.instance_key("qwen35-gb300", "decode", "generate", 4660) and put["lease"] == "4660"
    assert proc.returncode == 0, out  # SIGTERM: lease revoked, exit 0
    value = put["value"]
    # the model path as the test named it (the container's /models/qwen35 is this test's directory)
    return {k: (MODEL if v == str(model) else v) for k, v in value.items()}


def test_a_worker_told_its_served_name_registers_it(tmp_path, control_plane):
    value = _register(tmp_path, control_plane, ["--model-path", MODEL, "--served-model-name", SERVED])
    assert value["model"] == SERVED and value["model_path"] == "/models/qwen35" and value["mode"] == "decode"
    # what the frontend then lists in /v1/models
    assert dy.models_of([value]) == [SERVED]


def test_a_worker_without_a_served_name_registers_its_model_path(tmp_path, control_plane):
    value = _register(tmp_path, control_plane, ["--model-path", MODEL])
    assert value["model"] == "/models/qwen35"
    assert dy.models_of([value]) == ["/models/qwen35"]


def test_the_served_name_may_come_from_the_environment(tmp_path, control_plane):
    value = _register(tmp_path, control_plane, ["--model", MODEL], env={"DYN_TRTLLM_SERVED_MODEL_NAME": "qwen35/agentic"})
    assert value["model"] == "qwen35/agentic"


# --- the KV-cache metric appears only after this worker served a request --------------------------
def _rank0(mode: str = "decode") -> dy.WorkerRank0:
    info = {"namespace": "qwen35-gb300", "component": mode, "endpoint": "generate", "mode": mode, "model": SERVED,
            "model_path": "/models/qwen35", "tp": 1, "pp": 1, "ep": 1, "publish_metrics": True, "system_port": 8082}
    r0 = dy.WorkerRank0(info, {"max_seq_len": 262148}, 1, {}, {}, lambda *a: None, "", "x")
    r0.all_joined.set()
    r0.ready = True
    return r0


def _samples(text: str, name: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.startswith(name + "{") or ln.startswith(name + " ")]


def test_no_kv_cache_sample_until_the_worker_served_a_request():
    r0 = _rank0()
    assert dy.worker_health(r0.healthy(), r0.endpoint)[0] == 200
    before = r0.metrics()
    assert _samples(before, "dynamo_component_requests_total") and not _samples(before, "trtllm_kv_cache_utilization")
    # a request that fails (no prefill state) serves nothing
    assert r0.generate({"phase": "decode", "messages": [{"role": "user", "content": "hi"}]})[0] == 400
    assert not _samples(r0.metrics(), "trtllm_kv_cache_utilization")
    code, _ = r0.generate({"phase": "decode", "messages": [{"role": "user", "content": "hi"}],
                           "disaggregated_params": {"request_type": "context_only"}})
    assert code == 200
    (line,) = _samples(r0.metrics(), "trtllm_kv_cache_utilization")
    assert f'model_name="{SERVED}"' in line


# --- the frontend: paced streams, its in-flight counts, and its graceful stop ----------------------
def _dynamo(module: str, argv: list[str], env: dict):
    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from sim.standins import dynamo; "
            f"sys.exit(dynamo.main({module!r}, sys.argv[1:]))")
    return subprocess.Popen([sys.executable, "-c", code, str(REPO), *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def test_the_frontend_streams_counts_its_requests_and_drains_on_sigterm(tmp_path, control_plane):
    from tests.unit.sse_client import Stream, finish_reasons, get, post, sample, tokens_of, usage_of, wait_until

    etcd, nats = control_plane
    model, recipes, site, wstate, fstate = (tmp_path / d for d in ("models/qwen35", "recipes", "site", "worker", "frontend"))
    for d in (model, recipes, site, wstate, fstate):
        d.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (recipes / "agg.yaml").write_text("tensor_parallel_size: 1\npipeline_parallel_size: 1\n")
    for name in SITE:
        dist, version = name.split("-", 1)
        (site / f"{name}.dist-info").mkdir()
        (site / f"{name}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
    (wstate / "node.json").write_text(json.dumps({"gpus": [{"id": 0}]}))
    (fstate / "node.json").write_text(json.dumps({}))
    port = _free_port()
    common = {"PATH": os.environ["PATH"], "PYTHONPATH": str(site), "DYN_NAMESPACE": "ns",
              "ETCD_ENDPOINTS": f"http://127.0.0.1:{etcd.server_address[1]}", "NATS_SERVER": f"nats://127.0.0.1:{nats.server_address[1]}"}
    procs = []
    try:
        procs.append(_dynamo("dynamo.trtllm", ["--model-path", str(model), "--served-model-name", SERVED,
                                               "--extra-engine-args", str(recipes / "agg.yaml")],
                             {**common, "LLMDEPLOY_SIM_STATE": str(wstate), "NVIDIA_VISIBLE_DEVICES": "all",
                              "CUDA_VISIBLE_DEVICES": "0", "DYN_SYSTEM_PORT": str(_free_port())}))
        fe = _dynamo("dynamo.frontend", ["--http-host", "127.0.0.1", "--http-port", str(port)],
                     {**common, "LLMDEPLOY_SIM_STATE": str(fstate), "DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS": "2"})
        procs.append(fe)
        url = f"http://127.0.0.1:{port}"

        def healthy():
            for p in procs:
                if p.poll() is not None:
                    pytest.fail(f"a Dynamo process exited {p.returncode}:\n{p.stdout.read()}")
            return json.loads(get(url + "/health", 2)[1]).get("status") == "healthy"

        wait_until(healthy, "the frontend to see the worker")
        chat = {"model": SERVED, "messages": [{"role": "user", "content": "merge two sorted lists"}]}
        s = Stream("127.0.0.1", port, "/v1/chat/completions",
                   {**chat, "max_tokens": 20, "nvext": {"ignore_eos": True}, "stream_options": {"include_usage": True}})
        events = s.rest()
        s.close()
        assert len(tokens_of(events)) == 20 and usage_of(events)["completion_tokens"] == 20 and finish_reasons(events) == ["length"]
        metrics = lambda name: sample(get(url + "/metrics")[1].decode(), name, model=SERVED)  # noqa: E731
        assert metrics("dynamo_frontend_inflight_requests") == 0.0 and metrics("dynamo_frontend_output_tokens_total") == 20.0
        # a slower release: the frontend's node.json edited while it runs
        (fstate / "node.json").write_text(json.dumps({"latency": {"first_token_s": 0.0, "per_token_s": 0.05}}))
        s = Stream("127.0.0.1", port, "/v1/chat/completions", {**chat, "max_tokens": 10, "ignore_eos": True})
        s.next_token()
        assert metrics("dynamo_frontend_inflight_requests") == 1.0 and metrics("dynamo_frontend_queued_requests") == 0.0
        assert len(tokens_of(s.rest())) == 9
        s.close()
        wait_until(lambda: metrics("dynamo_frontend_inflight_requests") == 0.0, "the in-flight count to drop")
        # SIGTERM with a stream open: /live and /health 503, a new request refused, the stream finishes, exit 0
        s = Stream("127.0.0.1", port, "/v1/chat/completions", {**chat, "max_tokens": 60, "ignore_eos": True})
        s.next_token()
        os.killpg(fe.pid, signal.SIGTERM)
        wait_until(lambda: get(url + "/live")[0] == 503, "/live to say 503")
        code, body = get(url + "/live")
        assert json.loads(body) == {"status": "shutting_down", "message": "Service is shutting down"}
        assert get(url + "/health")[0] == 503
        assert post(url + "/v1/chat/completions", chat)[0] == 503
        rest = s.rest()
        s.close()
        assert len(tokens_of(rest)) == 59 and finish_reasons(rest) == ["length"]
        assert fe.wait(30) == 0
        out = fe.stdout.read()
        assert "HTTP server shutdown requested" in out and "Traceback" not in out
        with pytest.raises(OSError):
            get(url + "/live", 2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.communicate(timeout=60)
