"""The Dynamo stand-ins' pure parts (etcd's v3 JSON gateway requests and
answers, the NATS handshake, the health bodies, the GPU mask check), and
``python3 -m dynamo.*`` from the simulator's ai-dynamo wheel (no etcd, NATS
or simulated host needed)."""

import base64
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sim.standins import __main__ as standins
from sim.standins import dynamo as dy

REPO = Path(__file__).resolve().parents[2]


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


# --- etcd's JSON gateway ---------------------------------------------------------------
def test_prefix_range_end_like_etcd():
    assert dy.prefix_range_end("v1/instances/ns/") == b"v1/instances/ns0"
    assert dy.prefix_range_end("a") == b"b"
    assert dy.prefix_range_end(b"a\xff") == b"b"  # a trailing 0xff is dropped, the byte before it incremented
    assert dy.prefix_range_end(b"\xff\xff") == b"\0"
    assert dy.prefix_range_end("") == b"\0"


def test_requests_are_what_the_gateway_takes():
    assert dy.lease_grant_request(3) == ("/v3/lease/grant", {"TTL": 3})
    lease = 7587899318286590743
    # int64 ids travel as JSON strings (grpc-gateway)
    assert dy.keepalive_request(lease) == ("/v3/lease/keepalive", {"ID": "7587899318286590743"})
    assert dy.revoke_request(lease) == ("/v3/lease/revoke", {"ID": "7587899318286590743"})
    path, body = dy.put_request("v1/instances/ns/decode/generate/694d", {"b": 1, "a": 2}, lease)
    assert path == "/v3/kv/put"
    assert body == {"key": _b64("v1/instances/ns/decode/generate/694d"), "value": _b64('{"a": 2, "b": 1}'), "lease": str(lease)}
    assert "lease" not in dy.put_request("k", "v")[1]
    path, body = dy.range_request("v1/instances/qwen35-gb300/")
    assert path == "/v3/kv/range"
    assert body == {"key": _b64("v1/instances/qwen35-gb300/"), "range_end": _b64("v1/instances/qwen35-gb3000")}


def test_instance_key_names_the_lease_in_hex():
    key = dy.instance_key("qwen35-gb300", "decode", "generate", 7587899318286590743)
    assert key == "v1/instances/qwen35-gb300/decode/generate/694da23a41e6a317"


def test_parse_answers():
    # as etcd 3.4.23 answers (seen on this machine)
    grant = {"header": {"cluster_id": "1", "revision": "1"}, "ID": "2324035778726171397", "TTL": "3"}
    assert dy.parse_grant(grant) == (2324035778726171397, 3)
    alive = '{"result":{"header":{"revision":"2"},"ID":"2324035778726171400","TTL":"3"}}\n'
    assert dy.parse_keepalive(alive) == 3
    expired = '{"result":{"header":{"revision":"3"},"ID":"2324035778726171400"}}\n'
    assert dy.parse_keepalive(expired) == 0
    with pytest.raises(dy.EtcdError, match="lease not found"):
        dy.parse_keepalive('{"error":{"grpc_code":5,"message":"etcdserver: requested lease not found"}}')
    with pytest.raises(dy.EtcdError, match="requested lease not found"):
        dy.parse_grant({"error": "etcdserver: requested lease not found", "message": "etcdserver: requested lease not found", "code": 5})
    value = json.dumps({"mode": "decode", "model": "m"})
    rng = {"header": {}, "kvs": [{"key": _b64("v1/instances/ns/decode/generate/1f"), "value": _b64(value), "lease": "31"}], "count": "1"}
    assert dy.parse_range(rng) == [("v1/instances/ns/decode/generate/1f", value, 31)]
    assert dy.parse_range({"header": {}}) == []


def test_parse_instances_keeps_worker_registrations():
    kvs = [("v1/instances/ns/decode/generate/2", json.dumps({"mode": "decode", "model": "m"}), 2),
           ("v1/instances/ns/prefill/generate/1", json.dumps({"mode": "prefill", "model": "m"}), 1),
           ("v1/instances/ns/x/y/3", "not json", 3),
           ("v1/instances/ns/x/y/4", json.dumps({"mode": "other"}), 4)]
    found = dy.parse_instances(kvs)
    assert [i["mode"] for i in found] == ["decode", "prefill"]
    assert found[0]["key"] == "v1/instances/ns/decode/generate/2"


@pytest.mark.parametrize(
    "value, urls",
    [
        ("http://198.19.30.10:2379", ["http://198.19.30.10:2379"]),
        ("198.19.30.10:2379", ["http://198.19.30.10:2379"]),
        ("http://a:2379, http://b:2379/", ["http://a:2379", "http://b:2379"]),
        (None, ["http://localhost:2379"]),
    ],
)
def test_etcd_endpoints(value, urls):
    assert dy.etcd_endpoints(value) == urls


@pytest.mark.parametrize(
    "value, addr",
    [
        ("nats://198.19.30.10:4222", ("198.19.30.10", 4222)),
        ("nats://user:pw@h:4333,nats://other:4222", ("h", 4333)),
        ("nats://h", ("h", 4222)),
        (None, ("localhost", 4222)),
    ],
)
def test_nats_address(value, addr):
    assert dy.nats_address(value) == addr


# --- NATS -----------------------------------------------------------------------------------
INFO = (b'INFO {"server_id":"ND7Z","server_name":"ND7Z","version":"2.9.10","proto":1,"go":"go1.19.8",'
        b'"host":"0.0.0.0","port":4222,"headers":true,"max_payload":1048576,"jetstream":true,"client_id":4} \r\n')


def test_nats_handshake():
    info = dy.parse_nats_info(INFO)
    assert (info["version"], info["jetstream"]) == ("2.9.10", True)
    frames = dy.nats_connect_frames("dynamo.trtllm.decode", info)
    assert frames.startswith(b"CONNECT {") and frames.endswith(b"}\r\nPING\r\n")
    opts = json.loads(frames[len(b"CONNECT "):-len(b"\r\nPING\r\n")])
    assert opts["verbose"] is False and opts["name"] == "dynamo.trtllm.decode" and opts["protocol"] == 1
    for bad in (b"-ERR 'Authorization Violation'\r\n", b"HTTP/1.1 400 Bad Request\r\n", b"INFO {nope\r\n", b""):
        with pytest.raises(dy.NatsError):
            dy.parse_nats_info(bad)


def test_nats_replies():
    assert dy.nats_reply(b"PING\r\n") == b"PONG\r\n"
    assert dy.nats_reply("ping") == b"PONG\r\n"
    assert dy.nats_reply(b"PONG\r\n") is None
    assert dy.nats_reply(b"+OK\r\n") is None
    assert dy.nats_reply(INFO) is None
    with pytest.raises(dy.NatsError, match="Stale Connection"):
        dy.nats_reply(b"-ERR 'Stale Connection'\r\n")


# --- health bodies ------------------------------------------------------------------------
def _inst(mode, lease, component=None, model="nvidia/Qwen3.5-397B-A17B-NVFP4-V2"):
    comp = component or dy.COMPONENT[mode]
    return {"namespace": "qwen35-gb300", "component": comp, "endpoint": "generate", "instance_id": lease,
            "transport": {"tcp": f"198.19.30.10:{8080 + lease}"}, "mode": mode, "model": model, "host": "h", "ranks": 1}


def test_frontend_health_needs_prefill_and_decode():
    assert dy.frontend_health([]) == {"status": "unhealthy", "message": "No endpoints available"}
    # exactly the documented body when nothing is registered
    assert json.dumps(dy.frontend_health([]), separators=(",", ":")) == '{"status":"unhealthy","message":"No endpoints available"}'
    only_decode = dy.frontend_health([_inst("decode", 2)])
    assert only_decode["status"] == "unhealthy" and len(only_decode["instances"]) == 1
    both = dy.frontend_health([_inst("decode", 2), _inst("prefill", 1)])
    assert both["status"] == "healthy"
    assert both["endpoints"] == ["dyn://qwen35-gb300.decode.generate", "dyn://qwen35-gb300.prefill.generate"]
    assert both["instances"][0] == {"namespace": "qwen35-gb300", "component": "decode", "endpoint": "generate",
                                    "instance_id": 2, "transport": {"tcp": "198.19.30.10:8082"}}
    assert len(dy.frontend_health([_inst("decode", 2), _inst("decode", 3), _inst("prefill", 1)])["instances"]) == 3
    assert dy.frontend_health([_inst("prefill_and_decode", 5)])["status"] == "healthy"


def test_worker_health_and_models():
    assert dy.worker_health(False, "dyn://ns.decode.generate") == (503, {"status": "notready", "uptime": None,
                                                                           "endpoints": {"dyn://ns.decode.generate": "notready"}})
    assert dy.worker_health(True, "e")[0] == 200 and dy.worker_health(True, "e")[1]["status"] == "ready"
    # the models the frontend lists: those of the decode (or aggregated) instances
    assert dy.models_of([_inst("prefill", 1, model="p"), _inst("decode", 2, model="m")]) == ["m"]


def test_metric_line():
    assert dy.metric_line("trtllm_kv_cache_utilization", {"model_name": "a/b", "engine_type": "trtllm"}, "0.5") == \
        'trtllm_kv_cache_utilization{engine_type="trtllm",model_name="a/b"} 0.5'
    assert dy.metric_line("x", {}, 1) == "x 1"
    assert dy.metric_line("x", {"l": 'a"b'}, 1) == 'x{l="a\\"b"} 1'


@pytest.mark.parametrize(
    "visible, local, gpus, problem",
    [
        ("1,2", 2, 4, None),
        ("0", 1, 4, None),
        (None, 2, 4, None),
        (None, 5, 4, "5 ranks of this world run on this host, which has 4 GPUs"),
        ("1,2,3", 2, 4, "makes 3 GPU(s) visible, but 2 rank(s)"),
        ("1", 2, 4, "makes 1 GPU(s) visible, but 2 rank(s)"),
        ("", 1, 4, "makes 0 GPU(s) visible"),
        ("3,4", 2, 4, "invalid device ordinal: GPU 4"),
        ("1,1", 2, 4, "lists a GPU twice"),
        ("GPU-abc", 1, 4, "is not a list of GPU indices"),
        ("7", 1, None, None),
    ],
)
def test_check_visible_gpus(visible, local, gpus, problem):
    got = dy.check_visible_gpus(visible, local, gpus)
    assert (got is None) if problem is None else (problem in got)


def test_lease_ttl(monkeypatch):
    monkeypatch.delenv("LLMDEPLOY_SIM_LEASE_TTL_S", raising=False)
    assert dy.lease_ttl({}) == 10
    monkeypatch.setenv("LLMDEPLOY_SIM_LEASE_TTL_S", "3")
    assert dy.lease_ttl({}) == 3
    assert dy.lease_ttl({"lease_ttl_s": 5}) == 5  # node.json wins


def test_worker_args():
    a = dy.parse_worker_args(["--model-path", "/models/qwen35", "--disaggregation-mode", "decode", "--extra-engine-args",
                              "/opt/trtllm-recipes/x.yaml", "--publish-metrics"])
    assert (a.model_path, a.disaggregation_mode, a.publish_metrics, a.served_model_name) == ("/models/qwen35", "decode", True, None)
    with pytest.raises(dy.ArgError, match="unrecognized arguments: --bogus"):
        dy.parse_worker_args(["--bogus"])
    with pytest.raises(dy.ArgError, match="invalid choice: 'both'"):
        dy.parse_worker_args(["--disaggregation-mode", "both"])
    f = dy.parse_frontend_args(["--http-port", "8000", "--router-mode", "kv", "--router-session-affinity-ttl-secs", "14400"])
    assert (f.http_host, f.http_port, f.router_mode, f.router_session_affinity_ttl_secs) == ("0.0.0.0", 8000, "kv", 14400)


def test_numactl_node_lists():
    ids = {0, 1, 2, 3, 4, 5}
    assert standins._bad_numa_node("0,1", ids) is None
    assert standins._bad_numa_node("0-5", ids) is None
    assert standins._bad_numa_node("all", ids) is None
    assert standins._bad_numa_node("0,7", ids) == 7
    assert standins._bad_numa_node("x", ids) == "x"


# --- python3 -m dynamo.* from the simulator's ai-dynamo wheel --------------------------------
def _python_m(tmp_path, *argv, wheels=(), packages=(), node=None, env=None):
    """``python3 ARGV`` as in a container of the simulated image: the wheels
    (sim/images.py) unpacked into a site directory, as pip installs them."""
    import zipfile

    from sim import images

    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    for name in wheels:
        _, data = images._wheel(name, "1.6.0.dev20261010")
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            z.extractall(site)
    for name, version in packages:
        for rel, text in images._dist_info(name, version).items():
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / rel).write_text(text)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "node.json").write_text(json.dumps(node or {}))
    full = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{site}:{REPO}", "LLMDEPLOY_SIM_STATE": str(state), **(env or {})}
    return subprocess.run([sys.executable, *argv], env=full, capture_output=True, text=True, timeout=60)


DYNAMO_WHEELS = ("ai-dynamo", "ai-dynamo-runtime")
TRTLLM = (("tensorrt-llm", "1.3.0a0.dev202610151219"),)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dynamo_needs_the_wheels_in_the_container(tmp_path):
    res = _python_m(tmp_path, "-m", "dynamo.frontend", "--http-port", "8000")
    assert res.returncode == 1
    assert "No module named 'dynamo'" in res.stderr
    res = _python_m(tmp_path, "-m", "dynamo.trtllm", wheels=DYNAMO_WHEELS)
    assert res.returncode == 1 and "No module named 'tensorrt_llm'" in res.stderr


def test_frontend_without_etcd_says_so(tmp_path):
    port = _closed_port()
    res = _python_m(tmp_path, "-m", "dynamo.frontend", "--http-port", str(_closed_port()), wheels=DYNAMO_WHEELS,
                    node={"dynamo": {"connect_timeout_s": 0.3}},
                    env={"ETCD_ENDPOINTS": f"http://127.0.0.1:{port}", "NATS_SERVER": "nats://127.0.0.1:1"})
    assert res.returncode == 1
    assert f"Failed to connect to etcd server at http://127.0.0.1:{port}" in res.stdout
    assert "ETCD_ENDPOINTS" in res.stdout


def test_worker_refuses_a_world_that_does_not_match_tp(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "decode.yaml").write_text("tensor_parallel_size: 2\npipeline_parallel_size: 1\nsome_newer_key: 1\n")
    gpus = {"NVIDIA_VISIBLE_DEVICES": "all"}  # what docker run --gpus gives the container
    res = _python_m(tmp_path, "-m", "dynamo.trtllm", "--model-path", str(model), "--disaggregation-mode",
                    "decode", "--extra-engine-args", str(recipes / "decode.yaml"), wheels=DYNAMO_WHEELS, packages=TRTLLM,
                    node={"gpus": [{"id": i} for i in range(4)]}, env={"CUDA_VISIBLE_DEVICES": "1", **gpus})
    assert res.returncode == 1
    assert "tp_size * pp_size = 2 * 1 = 2 does not match the MPI world size 1" in res.stdout
    # a model path the container does not have
    res = _python_m(tmp_path, "-m", "dynamo.trtllm", "--model-path", "/models/qwen35", wheels=DYNAMO_WHEELS, packages=TRTLLM,
                    node={"gpus": [{"id": 0}]}, env={"CUDA_VISIBLE_DEVICES": "0", **gpus})
    assert res.returncode == 1 and "/models/qwen35 does not appear to have a file named config.json" in res.stdout


def test_recipes_checkout_fits_the_worker():
    import yaml

    from sim import curated
    from sim.standins import trtllm as t

    files = curated.recipes_files()
    for role, ranks in (("prefill", 1), ("decode", 2)):
        cfg = yaml.safe_load(files[f"examples/configs/curated/qwen3.5-gb300-agentic-{role}.yaml"])
        assert cfg["tensor_parallel_size"] * cfg["pipeline_parallel_size"] == ranks
        assert t.check_llm_config({k: v for k, v in cfg.items() if k in t.LLM_API_KEYS}, ranks) is None
        assert cfg["cache_transceiver_config"]["kv_cache_bounce_size_mb"] == 2048
