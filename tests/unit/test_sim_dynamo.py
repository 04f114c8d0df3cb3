"""The Dynamo stand-ins' pure parts (etcd's v3 JSON gateway requests and
answers, the NATS handshake, the health bodies, the GPU mask check), the
simulated docker's mount map, and the container python3's dispatch (no etcd,
NATS or simulated host needed)."""

import base64
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sim.standins import __main__ as standins
from sim.standins import docker as d
from sim.standins import dynamo as dy
from sim.standins import mounts as m

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


# --- the mount map ------------------------------------------------------------------------
def test_parse_mount():
    got = m.parse_mount("type=bind,src=/root/.cache/models/Q,dst=/models/qwen35,readonly")
    assert got == {"Type": "bind", "Source": "/root/.cache/models/Q", "Destination": "/models/qwen35", "Mode": "",
                   "RW": False, "Propagation": "rprivate"}
    assert m.parse_mount("type=bind,source=/a,target=/b")["RW"] is True
    assert m.parse_mount("type=bind,source=/a,destination=/b,readonly=false")["RW"] is True
    assert m.parse_mount("type=bind,src=/a,dst=/b,ro=true")["RW"] is False
    assert m.parse_mount("type=tmpfs,dst=/t")["Type"] == "tmpfs"
    for bad, msg in (("type=bind,src=/a", "target is required"), ("type=bind,dst=/b", "source is required"),
                     ("type=bind,src=/a,dst=/b,bogus", "must be a key=value pair"), ("type=nfs,dst=/b", 'invalid type "nfs"')):
        with pytest.raises(m.MountError, match=msg):
            m.parse_mount(bad)


def test_parse_volume():
    assert m.parse_volume("/root/.cache:/root/.cache:rw") == {"Type": "bind", "Source": "/root/.cache", "Destination": "/root/.cache",
                                                             "Mode": "rw", "RW": True, "Propagation": "rprivate"}
    assert m.parse_volume("/w:/wheels:ro")["RW"] is False
    assert m.parse_volume("data:/data")["Type"] == "volume"
    assert m.parse_volume("/anon")["Type"] == "volume"
    with pytest.raises(m.MountError):
        m.parse_volume("/a:/b:ro:x")


def test_host_path_translates_through_the_longest_mount():
    mounts = [m.parse_mount("type=bind,src=/srv/model,dst=/models/qwen35,readonly"),
              m.parse_mount("type=bind,src=/srv/recipes,dst=/opt/trtllm-recipes,readonly"),
              m.parse_mount("type=bind,src=/srv/curated2,dst=/opt/trtllm-recipes/examples/configs/curated"),
              m.parse_volume("named:/data"),
              m.parse_mount("type=tmpfs,dst=/tmpfs")]
    mapping = m.mount_map(mounts)
    assert mapping == {"/models/qwen35": "/srv/model", "/opt/trtllm-recipes": "/srv/recipes",
                       "/opt/trtllm-recipes/examples/configs/curated": "/srv/curated2"}
    env = {m.ENV: m.encode(mapping)}
    assert m.host_path("/models/qwen35", env) == "/srv/model"
    assert m.host_path("/models/qwen35/", env) == "/srv/model"
    assert m.host_path("/models/qwen35/config.json", env) == "/srv/model/config.json"
    assert m.host_path("/models/qwen35x/config.json", env) == "/models/qwen35x/config.json"
    assert m.host_path("/opt/trtllm-recipes/README.md", env) == "/srv/recipes/README.md"
    assert m.host_path("/opt/trtllm-recipes/examples/configs/curated/a.yaml", env) == "/srv/curated2/a.yaml"
    assert m.host_path("/etc/hosts", env) == "/etc/hosts"
    assert m.host_path("relative/path", env) == "relative/path"
    assert m.host_path("/models/qwen35/config.json", {}) == "/models/qwen35/config.json"
    assert m.host_path("/models/qwen35", {m.ENV: "not json"}) == "/models/qwen35"
    assert m.decode(m.encode(mapping)) == mapping


def test_docker_run_records_mounts_and_exports_the_map(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    r = d.parse_run(["-d", "--mount", f"type=bind,src={model},dst=/models/qwen35,readonly",
                     "-v", "/root/.cache:/root/.cache:rw", "img", "true"])
    mounts = d.mounts_of(r)
    assert [(x["Source"], x["Destination"], x["RW"], x["From"]) for x in mounts] == [
        (str(model), "/models/qwen35", False, "--mount"), ("/root/.cache", "/root/.cache", True, "-v")]
    c = {"Name": "srv", "Config": {"Env": ["A=1"]}, "SimHostDir": "/h",
         "Mounts": [{k: v for k, v in x.items() if k != "From"} for x in mounts]}
    env = d.process_env(c)
    assert json.loads(env[m.ENV]) == {"/models/qwen35": str(model), "/root/.cache": "/root/.cache"}
    assert env["A"] == "1"
    # a container without bind mounts gets no map (what the older stand-ins saw)
    assert m.ENV not in d.process_env({"Name": "srv", "Config": {"Env": []}, "SimHostDir": "/h"})
    with pytest.raises(ValueError, match='invalid mount config for type "bind": bind source path does not exist: /nonexistent/x'):
        d.mounts_of(d.parse_run(["--mount", "type=bind,src=/nonexistent/x,dst=/m", "img"]))


def test_numactl_node_lists():
    ids = {0, 1, 2, 3, 4, 5}
    assert standins._bad_numa_node("0,1", ids) is None
    assert standins._bad_numa_node("0-5", ids) is None
    assert standins._bad_numa_node("all", ids) is None
    assert standins._bad_numa_node("0,7", ids) == 7
    assert standins._bad_numa_node("x", ids) == "x"


# --- python3 -m dynamo.* inside a container ---------------------------------------------------
def _container_python(tmp_path, *argv, site_pkgs=(), node=None, env=None):
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    for name in site_pkgs:
        (site / f"{name}.dist-info").mkdir(exist_ok=True)
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    (state / "node.json").write_text(json.dumps(node or {}))
    full = {"PATH": os.environ["PATH"], "PYTHONPATH": f"{site}", "LLMDEPLOY_SIM_STATE": str(state), **(env or {})}
    code = ("import sys; sys.path.insert(0, sys.argv.pop(1)); from sim.standins.__main__ import main; "
            "sys.argv[0] = 'sim'; sys.exit(main())")
    return subprocess.run([sys.executable, "-c", code, str(REPO), "container-python3", *argv], env=full,
                          capture_output=True, text=True, timeout=60)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dynamo_needs_the_wheels_in_the_container(tmp_path):
    res = _container_python(tmp_path, "-m", "dynamo.frontend", "--http-port", "8000")
    assert res.returncode == 1
    assert "No module named 'dynamo'" in res.stderr
    res = _container_python(tmp_path, "-m", "dynamo.trtllm", site_pkgs=["ai_dynamo-1.6.0.dev20261010",
                                                                       "ai_dynamo_runtime-1.6.0.dev20261010"])
    assert res.returncode == 1 and "No module named 'tensorrt_llm'" in res.stderr


def test_frontend_without_etcd_says_so(tmp_path):
    port = _closed_port()
    res = _container_python(tmp_path, "-m", "dynamo.frontend", "--http-port", str(_closed_port()),
                            site_pkgs=["ai_dynamo-1.6.0.dev20261010", "ai_dynamo_runtime-1.6.0.dev20261010"],
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
    mounts = m.encode({"/models/qwen35": str(model), "/opt/trtllm-recipes": str(recipes)})
    res = _container_python(tmp_path, "-m", "dynamo.trtllm", "--model-path", "/models/qwen35", "--disaggregation-mode",
                            "decode", "--extra-engine-args", "/opt/trtllm-recipes/decode.yaml",
                            site_pkgs=["ai_dynamo-1.6.0.dev20261010", "ai_dynamo_runtime-1.6.0.dev20261010",
                                       "tensorrt_llm-1.3.0a0.dev202610151219"],
                            node={"gpus": [{"id": i} for i in range(4)]},
                            env={m.ENV: mounts, "CUDA_VISIBLE_DEVICES": "1"})
    assert res.returncode == 1
    assert "tp_size * pp_size = 2 * 1 = 2 does not match the MPI world size 1" in res.stdout
    # without the mount map the model path does not exist in the "container"
    res = _container_python(tmp_path, "-m", "dynamo.trtllm", "--model-path", "/models/qwen35",
                            site_pkgs=["tensorrt_llm-1.3.0a0.dev202610151219"], node={"gpus": [{"id": 0}]},
                            env={"CUDA_VISIBLE_DEVICES": "0"})
    assert res.returncode == 1 and "/models/qwen35 does not appear to have a file named config.json" in res.stdout


def test_container_path_hides_the_hosts_own_directories():
    mapping = {"/models/qwen35": "/root/.cache/models/Q", "/root/.cache/x": "/root/.cache/x"}
    inside = {m.ENV: m.encode(mapping), "LLMDEPLOY_SIM_CONTAINER": "dynamo-decode0"}
    assert m.container_path("/models/qwen35/config.json", inside) == "/root/.cache/models/Q/config.json"
    # a release file passed by its host path: not in the container
    assert m.container_path("/var/lib/llmdeploy/c/releases/r/decode0.yaml", inside) is None
    assert m.container_path("/root/.cache/models/Q/config.json", inside) is None
    # unless a mount covers it (here one with the same source and destination)
    assert m.container_path("/root/.cache/x/a.yaml", inside) == "/root/.cache/x/a.yaml"
    # the image's own paths and anything else: as on the host
    assert m.container_path("/app/tensorrt_llm/examples/configs/curated/qwen3.5.yaml", inside) == \
        "/app/tensorrt_llm/examples/configs/curated/qwen3.5.yaml"
    # outside a simulated container nothing is hidden
    assert m.container_path("/var/lib/llmdeploy/x", {}) == "/var/lib/llmdeploy/x"


def test_host_only_matches_the_simulated_hosts_private_dirs():
    from sim import curated
    from sim.paths import PRIVATE_DIRS

    assert set(m.HOST_ONLY) == set(PRIVATE_DIRS) - {curated.CURATED_DIR}


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


def test_container_python_opens_scripts_arguments_through_the_mounts():
    env = {m.ENV: m.encode({"/opt/trtllm-recipes": "/root/.cache/trtllm-recipes", "/r": "/r"})}
    argv = ["/r/merge-config.py", "/opt/trtllm-recipes/examples/configs/curated/a.yaml", "/r/over.yaml", "/r/out.yaml"]
    assert d.python_argv(argv, env) == ["/r/merge-config.py", "/root/.cache/trtllm-recipes/examples/configs/curated/a.yaml",
                                        "/r/over.yaml", "/r/out.yaml"]
    assert d.python_argv(["-c", "/opt/trtllm-recipes", "/opt/trtllm-recipes"], env) == \
        ["-c", "/opt/trtllm-recipes", "/root/.cache/trtllm-recipes"]
    assert d.python_argv(argv, {}) == argv
