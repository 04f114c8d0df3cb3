"""Simulated NVIDIA Dynamo (the ``ai-dynamo`` wheel) inside a real
container of the simulated TensorRT-LLM image: ``python3 -m dynamo.frontend``
and ``python3 -m dynamo.trtllm`` are the ``dynamo`` package of the simulator's
``ai-dynamo`` wheel (sim/images.py), which prepare's wheels step installs
with pip from the simulated index; they run this module, with the REAL etcd
and NATS of the cluster as control plane.

Without the wheel ``python3 -m dynamo.*`` fails as Python does (No module
named dynamo); ``dynamo.trtllm`` needs TensorRT-LLM in the image too
(importlib.metadata). Paths (``--model-path``, ``--extra-engine-args``) are
the container's own: what the container mounts.

Worker (``dynamo.trtllm``), one process per MPI rank
(``mpirun ... trtllm-llmapi-launch python3 -m dynamo.trtllm --model-path M
[--served-model-name N] --disaggregation-mode prefill|decode --extra-engine-args Y
[--publish-metrics]``):
every rank checks the image, ``--gpus``, its GPU (``CUDA_VISIBLE_DEVICES``
must list exactly as many GPUs as this world has ranks on this host, each
one existing and not held by another world's rank), ``M/config.json`` and the
YAML (tensor_parallel_size * pipeline_parallel_size = MPI world size). Rank 0
finds the other ranks exactly as the trtllm-serve stand-in does (trtllm.py:
``OMPI_MCA_orte_hnp_uri``, a port derived from the job id) and:

- grants an etcd lease (``POST /v3/lease/grant`` on etcd's v3 JSON gateway,
  ``ETCD_ENDPOINTS``) and keeps it alive (``POST /v3/lease/keepalive`` every
  TTL/3); connects to NATS (``NATS_SERVER``: reads ``INFO``, sends
  ``CONNECT {...}`` and ``PING``, expects ``PONG``, answers the server's
  ``PING``s). Either unreachable for ``connect_timeout_s``: a clear error, exit 1;
- serves the system port ``DYN_SYSTEM_PORT`` (default 8081) at once:
  ``/health`` 503 ``{"status":"notready",...}`` until registered, then 200
  ``{"status":"ready",...}``; ``/live``; ``/metrics`` (Prometheus text:
  ``dynamo_component_*`` always, ``trtllm_kv_cache_utilization{...}`` and
  other ``trtllm_*`` once it has served a request with ``--publish-metrics``);
  ``POST /generate`` (what the frontend stand-in calls: one prefill or decode step);
- once every rank joined and the model "loaded", registers
  ``v1/instances/<DYN_NAMESPACE>/<prefill|decode|backend>/generate/<lease id hex>``
  with the lease; the value (JSON) names the instance, its address, the
  system port, the mode, the model and the ranks. The model is registered
  as Dynamo registers it (``registered_model_name``): ``--served-model-name``
  when given, else the ``--model``/``--model-path`` value itself (e.g.
  ``/models/qwen35``), never a name the worker was not told.

A lost rank makes the world fail like trtllm-serve's (rank 0 reports it,
marks itself not ready and exits 1 after ``abort_after_s``); a dead rank 0
no longer keeps its lease alive, so its instance disappears when the lease
expires. A lease that etcd says has expired (or an etcd unreachable for a
whole TTL) ends rank 0 (exit 1) as a lost primary lease ends a Dynamo
runtime. SIGTERM on rank 0 revokes the lease and exits 0.

Frontend (``dynamo.frontend --http-port 8000 [--router-mode kv ...]``):
checks etcd and NATS as the worker does, serves HTTP on ``--http-host:--http-port``
and reads the instance prefix every second (``POST /v3/kv/range``). ``/health``
is 200 until SIGTERM: ``{"status":"unhealthy","message":"No endpoints available"}``
until at least one prefill and one decode instance (or an aggregated one)
are registered, then ``{"status":"healthy","endpoints":[...],"instances":[...]}``
(one entry per instance); ``/live``; ``/metrics``; ``/v1/models`` lists the
models the decode instances registered; ``POST /v1/chat/completions`` (and
``/v1/completions``): 503 without both roles, 404 for another model, else a
prefill step on a prefill instance and a decode step on a decode instance
(``POST /generate`` on their system ports; ``x-dynamo-session-id`` keeps a
conversation on one decode instance for ``--router-session-affinity-ttl-secs``),
answered OpenAI-style with ``reasoning_content`` (Qwen3.5's parser) and
``content``, streaming too: the decode step returns the whole answer and its
host's node.json ``latency``; the frontend streams it one SSE chunk per token
(streaming.py), paced by the slower of that and its own host's ``latency``,
honouring ``max_tokens``, ``ignore_eos`` (also ``nvext.ignore_eos``) and
``stream_options.include_usage``. ``/metrics`` has ai-dynamo's frontend names
(lib/runtime/src/metrics/prometheus_names.rs): ``dynamo_frontend_requests_total``,
``dynamo_frontend_inflight_requests`` and ``dynamo_frontend_queued_requests``
(gauges: in flight; admitted without a first token yet),
``dynamo_frontend_output_tokens_total``, label ``model``. SIGTERM drains as
lib/llm/src/http/service/service_v2.rs and health.rs do: ``/live`` and
``/health`` answer 503 ``{"status": "shutting_down", ...}`` and new requests
503, the listener stays ``DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS`` (real
default 5; here node.json ``dynamo.http_graceful_shutdown_s``, default 0.5),
then closes; the streams in flight finish; exit 0.

Faults from the host's node.json ``dynamo`` entry:
``crash_starts`` (each worker group -- a disaggregation mode and system port
on this host -- crashes on its first N world starts with a CUDA
out-of-memory line; counted in ``<state>/dynamo-starts-<mode>-<port>``, delete
it to count again), ``crash_mode`` (only that mode crashes), ``crash_message``,
``http_graceful_shutdown_s`` (the frontend's, above),
``lease_ttl_s`` (the workers' lease TTL; else ``LLMDEPLOY_SIM_LEASE_TTL_S``
from the environment, else 10), ``slow_start_s`` (rank 0 loads that long
before registering), ``connect_timeout_s`` (default 5), ``join_timeout_s``
(default 600), ``abort_after_s`` (default 5).
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from . import streaming
from . import trtllm as trtllm_sim

STATE_DIR = os.environ.get("LLMDEPLOY_SIM_STATE", "/etc/llmdeploy-sim")
# ai-dynamo 1.6.1 dynamo/trtllm/backend_args.py: DEFAULT_MODEL, what --model
# (alias --model-path) is without the flag or DYN_TRTLLM_MODEL
DEFAULT_MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
INSTANCES = "v1/instances/"
DEFAULT_LEASE_TTL = 10
MODES = ("prefill", "decode", "prefill_and_decode")
COMPONENT = {"prefill": "prefill", "decode": "decode", "prefill_and_decode": "backend"}


# --- pure parts: etcd's v3 JSON gateway ------------------------------------------------
class EtcdError(Exception):
    pass


def b64(text: str | bytes) -> str:
    return base64.b64encode(text.encode() if isinstance(text, str) else text).decode()


def unb64(text: str) -> str:
    return base64.b64decode(text).decode(errors="replace")


def prefix_range_end(prefix: str | bytes) -> bytes:
    """etcd's GetPrefixRangeEnd: the key just past every key starting with
    ``prefix`` (the last byte below 0xff incremented, what follows it dropped)."""
    raw = bytearray(prefix.encode() if isinstance(prefix, str) else prefix)
    for i in range(len(raw) - 1, -1, -1):
        if raw[i] < 0xFF:
            raw[i] += 1
            return bytes(raw[: i + 1])
    return b"\0"  # every key


def etcd_endpoints(value: str | None) -> list[str]:
    """``ETCD_ENDPOINTS`` (comma-separated, scheme optional) -> base URLs."""
    out = []
    for item in (value or "http://localhost:2379").split(","):
        item = item.strip().rstrip("/")
        if item:
            out.append(item if "://" in item else "http://" + item)
    return out


def nats_address(value: str | None) -> tuple[str, int]:
    """``NATS_SERVER`` (``nats://host:port``, the first of a list) -> (host, port)."""
    item = (value or "nats://localhost:4222").split(",")[0].strip()
    hostport = item.split("://", 1)[-1].rsplit("@", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return hostport or "localhost", 4222
    return host.strip("[]"), int(port)


def lease_grant_request(ttl: int) -> tuple[str, dict]:
    return "/v3/lease/grant", {"TTL": int(ttl)}


def keepalive_request(lease: int) -> tuple[str, dict]:
    return "/v3/lease/keepalive", {"ID": str(lease)}


def revoke_request(lease: int) -> tuple[str, dict]:
    return "/v3/lease/revoke", {"ID": str(lease)}


def put_request(key: str, value, lease: int | None = None) -> tuple[str, dict]:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    body = {"key": b64(key), "value": b64(text)}
    if lease:
        body["lease"] = str(lease)
    return "/v3/kv/put", body


def range_request(prefix: str) -> tuple[str, dict]:
    return "/v3/kv/range", {"key": b64(prefix), "range_end": b64(prefix_range_end(prefix))}


def _check_error(resp: dict) -> dict:
    if not isinstance(resp, dict):
        raise EtcdError(f"unexpected answer from etcd: {resp!r}")
    if "error" in resp or ("code" in resp and "message" in resp):
        raise EtcdError(resp.get("message") or resp.get("error"))
    return resp


def parse_grant(resp: dict) -> tuple[int, int]:
    """(lease id, granted TTL) from a /v3/lease/grant answer."""
    resp = _check_error(resp)
    if resp.get("error") or "ID" not in resp:
        raise EtcdError(resp.get("error") or f"no lease in {resp!r}")
    return int(resp["ID"]), int(resp.get("TTL", 0))


def parse_keepalive(text: str) -> int:
    """The TTL left from a /v3/lease/keepalive answer (a stream of JSON
    objects, one per line): 0 when the lease has expired (etcd omits TTL)."""
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        obj = json.loads(line)
        if "error" in obj:
            err = obj["error"]
            raise EtcdError(err.get("message") if isinstance(err, dict) else str(err))
        result = obj.get("result", obj)
        return int(result.get("TTL", 0))
    raise EtcdError("empty keep-alive answer")


def parse_range(resp: dict) -> list[tuple[str, str, int]]:
    """[(key, value, lease)] from a /v3/kv/range answer."""
    resp = _check_error(resp)
    return [(unb64(kv["key"]), unb64(kv.get("value", "")), int(kv.get("lease", 0))) for kv in resp.get("kvs") or []]


def instance_key(namespace: str, component: str, endpoint: str, lease: int) -> str:
    return f"{INSTANCES}{namespace}/{component}/{endpoint}/{lease:x}"


def parse_instances(kvs: list[tuple[str, str, int]]) -> list[dict]:
    """The registered instances (values that are JSON objects with a mode), by key."""
    out = []
    for key, value, _lease in sorted(kvs):
        try:
            v = json.loads(value)
        except ValueError:
            continue
        if isinstance(v, dict) and v.get("mode") in MODES:
            out.append({**v, "key": key})
    return out


# --- pure parts: NATS client protocol --------------------------------------------------
class NatsError(Exception):
    pass


def parse_nats_info(line: bytes | str) -> dict:
    """The server's greeting ``INFO {json}\\r\\n`` -> its fields."""
    text = line.decode(errors="replace") if isinstance(line, bytes) else line
    text = text.strip()
    if not text.startswith("INFO "):
        raise NatsError(f"expected INFO from the NATS server, got {text[:80]!r}")
    try:
        info = json.loads(text[5:])
    except ValueError:
        raise NatsError(f"malformed INFO from the NATS server: {text[:80]!r}") from None
    if not isinstance(info, dict):
        raise NatsError(f"malformed INFO from the NATS server: {text[:80]!r}")
    return info


def nats_connect_frames(name: str, info: dict | None = None) -> bytes:
    """CONNECT (verbose off, so the server answers only PING) then PING."""
    opts = {"verbose": False, "pedantic": False, "tls_required": False, "name": name, "lang": "rust",
            "version": "0.33.0", "protocol": 1, "echo": True, "headers": bool((info or {}).get("headers", True)),
            "no_responders": bool((info or {}).get("headers", True))}
    return b"CONNECT " + json.dumps(opts, separators=(",", ":")).encode() + b"\r\nPING\r\n"


def nats_reply(line: bytes | str) -> bytes | None:
    """What the client answers to a server line: PONG to PING, nothing to
    PONG/+OK/INFO; ``-ERR`` raises."""
    text = (line.decode(errors="replace") if isinstance(line, bytes) else line).strip()
    verb = text.split(" ", 1)[0].upper()
    if verb == "PING":
        return b"PONG\r\n"
    if verb == "-ERR":
        raise NatsError(text[5:].strip().strip("'") or "-ERR")
    return None


# --- pure parts: bodies ------------------------------------------------------------------
def health_instance(inst: dict) -> dict:
    return {"namespace": inst.get("namespace"), "component": inst.get("component"), "endpoint": inst.get("endpoint"),
            "instance_id": inst.get("instance_id"), "transport": inst.get("transport")}


def roles_of(instances: list[dict]) -> set[str]:
    roles = set()
    for inst in instances:
        mode = inst.get("mode")
        roles |= {"prefill", "decode"} if mode == "prefill_and_decode" else {mode}
    return roles


def servable(instances: list[dict]) -> bool:
    return {"prefill", "decode"} <= roles_of(instances)


def frontend_health(instances: list[dict]) -> dict:
    """The frontend's /health body (always HTTP 200)."""
    if not servable(instances):
        body = {"status": "unhealthy", "message": "No endpoints available"}
        if instances:
            body["instances"] = [health_instance(i) for i in instances]
        return body
    eps = sorted({f"dyn://{i['namespace']}.{i['component']}.{i['endpoint']}" for i in instances})
    return {"status": "healthy", "endpoints": eps, "instances": [health_instance(i) for i in instances]}


def worker_health(ready: bool, endpoint: str) -> tuple[int, dict]:
    """The worker system port's /health: (HTTP status, body)."""
    state = "ready" if ready else "notready"
    return (200 if ready else 503), {"status": state, "uptime": None, "endpoints": {endpoint: state}}


def models_of(instances: list[dict]) -> list[str]:
    return sorted({i.get("model") for i in instances if i.get("mode") in ("decode", "prefill_and_decode") and i.get("model")})


def answer_fields(raw: str, thinking: bool) -> list[tuple[str, str | None]]:
    """A decode answer as the frontend returns it: Qwen3.5's template opens
    <think> in the prompt, the reasoning parser splits at </think>."""
    if not thinking:
        return [("content", raw)]
    reasoning, content = trtllm_sim.split_reasoning(raw)
    if reasoning is None:  # cut short inside the reasoning
        reasoning, content = raw, ""
    return [("reasoning_content", reasoning), ("content", content)]


def _escape_label(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def metric_line(name: str, labels: dict, value) -> str:
    """One Prometheus sample line (label values escaped)."""
    if not labels:
        return f"{name} {value}"
    lab = ",".join(f'{k}="{_escape_label(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{lab}}} {value}"


def check_visible_gpus(visible: str | None, local_ranks: int, host_gpus: int | None) -> str | None:
    """What is wrong with ``CUDA_VISIBLE_DEVICES`` for this world's ranks on this host, or None."""
    if visible is None:
        if host_gpus is not None and local_ranks > host_gpus:
            return f"{local_ranks} ranks of this world run on this host, which has {host_gpus} GPUs"
        return None
    ids = [x.strip() for x in visible.split(",") if x.strip()]
    if any(not x.isdigit() for x in ids):
        return f"CUDA_VISIBLE_DEVICES={visible!r} is not a list of GPU indices"
    if len(set(ids)) != len(ids):
        return f"CUDA_VISIBLE_DEVICES={visible} lists a GPU twice"
    if len(ids) != local_ranks:
        return (f"CUDA_VISIBLE_DEVICES={visible} makes {len(ids)} GPU(s) visible, but {local_ranks} rank(s) of this "
                "MPI world run on this host: each rank needs exactly one GPU of the mask")
    if host_gpus is not None:
        bad = [int(x) for x in ids if int(x) >= host_gpus]
        if bad:
            return f"CUDA error: invalid device ordinal: GPU {bad[0]} of CUDA_VISIBLE_DEVICES={visible} does not exist (this host has {host_gpus} GPUs)"
    return None


# --- runtime helpers ---------------------------------------------------------------------
def _ts() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t * 1e6) % 1000000:06d}Z"


def log(level: str, target: str, msg: str) -> None:
    print(f"{_ts()} {level:>5} {target}: {msg}", flush=True)


def _node() -> dict:
    try:
        return json.loads((Path(STATE_DIR) / "node.json").read_text())
    except (OSError, ValueError):
        return {}


def _faults() -> dict:
    return _node().get("dynamo") or {}


def _dist_version(prefix: str) -> str | None:
    """The installed version of a distribution (``ai_dynamo``: the wheel that
    prepare's wheels step installs into the image), as importlib.metadata says."""
    import importlib.metadata as md

    try:
        return md.version(prefix.replace("_", "-"))
    except md.PackageNotFoundError:
        return None


def _http(base: str, method: str, path: str, body=None, timeout: float = 5.0, headers: dict | None = None) -> tuple[int, str]:
    import http.client
    from urllib.parse import urlsplit

    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


class Etcd:
    """A client of etcd's v3 JSON gateway (the first endpoint that answers)."""

    def __init__(self, endpoints: list[str]):
        self.endpoints = endpoints
        self.url = endpoints[0]

    def call(self, req: tuple[str, dict], timeout: float = 5.0):
        path, body = req
        last = None
        for url in [self.url] + [u for u in self.endpoints if u != self.url]:
            try:
                status, text = _http(url, "POST", path, body, timeout)
            except OSError as exc:
                last = exc
                continue
            self.url = url
            if path == "/v3/lease/keepalive":
                return text
            try:
                resp = json.loads(text)
            except ValueError:
                raise EtcdError(f"HTTP {status} from {url}{path}: {text[:200]}") from None
            return _check_error(resp)
        raise last or OSError("no etcd endpoint")

    def wait_reachable(self, timeout: float) -> str | None:
        """None once etcd answers, else why it did not within ``timeout``."""
        end = time.monotonic() + timeout
        why = "no answer"
        while True:
            try:
                status, text = _http(self.url, "GET", "/health", None, 2.0)
                if status == 200:
                    return None
                why = f"HTTP {status}: {text[:120]}"
            except OSError as exc:
                why = _reason(exc)
                for url in self.endpoints:
                    if url != self.url:
                        try:
                            if _http(url, "GET", "/health", None, 2.0)[0] == 200:
                                self.url = url
                                return None
                        except OSError:
                            pass
            if time.monotonic() >= end:
                return why
            time.sleep(0.25)


class Nats:
    """A NATS client connection kept open (PINGs answered) by a thread."""

    def __init__(self, host: str, port: int, name: str):
        self.host, self.port, self.name = host, port, name
        self.sock: socket.socket | None = None
        self.info: dict = {}
        self.closed = threading.Event()

    def connect(self, timeout: float) -> str | None:
        end = time.monotonic() + timeout
        why = "no answer"
        while True:
            try:
                self._handshake()
                threading.Thread(target=self._loop, daemon=True).start()
                return None
            except (OSError, NatsError) as exc:
                why = _reason(exc)
            if time.monotonic() >= end:
                return why
            time.sleep(0.25)

    def _handshake(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=3)
        f = sock.makefile("rb")
        try:
            self.info = parse_nats_info(f.readline())
            sock.sendall(nats_connect_frames(self.name, self.info))
            while True:
                line = f.readline()
                if not line:
                    raise NatsError("the NATS server closed the connection during the handshake")
                if line.strip().upper() == b"PONG":
                    break
                reply = nats_reply(line)
                if reply:
                    sock.sendall(reply)
        except BaseException:
            sock.close()
            raise
        sock.settimeout(None)
        self.sock, self.file = sock, f

    def _loop(self) -> None:
        while True:
            try:
                while True:
                    line = self.file.readline()
                    if not line:
                        raise NatsError("connection closed by the server")
                    reply = nats_reply(line)
                    if reply:
                        self.sock.sendall(reply)
            except (OSError, NatsError) as exc:
                log("WARN", "async_nats", f"NATS connection to {self.host}:{self.port} lost ({_reason(exc)}): reconnecting")
            while True:
                time.sleep(1)
                try:
                    self._handshake()
                    log("INFO", "async_nats", f"reconnected to NATS at {self.host}:{self.port}")
                    break
                except (OSError, NatsError):
                    continue


def _connect_control_plane(name: str, timeout: float, target: str) -> tuple[Etcd, Nats] | None:
    etcd_env = os.environ.get("ETCD_ENDPOINTS")
    etcd = Etcd(etcd_endpoints(etcd_env))
    why = etcd.wait_reachable(timeout)
    if why is not None:
        log("ERROR", target, f"Unable to connect to etcd at {','.join(etcd.endpoints)} (ETCD_ENDPOINTS={etcd_env or 'unset'}): {why}")
        print(f"RuntimeError: Failed to connect to etcd server at {','.join(etcd.endpoints)}: {why}. "
              "Is etcd running and reachable from this host? (ETCD_ENDPOINTS)", flush=True)
        return None
    nats_env = os.environ.get("NATS_SERVER")
    host, port = nats_address(nats_env)
    nats = Nats(host, port, name)
    why = nats.connect(timeout)
    if why is not None:
        log("ERROR", target, f"Unable to connect to NATS at nats://{host}:{port} (NATS_SERVER={nats_env or 'unset'}): {why}")
        print(f"RuntimeError: Failed to connect to NATS server at nats://{host}:{port}: {why}. "
              "Is nats-server running and reachable from this host? (NATS_SERVER)", flush=True)
        return None
    log("INFO", "dynamo_runtime::distributed", f"connected to etcd at {etcd.url} and NATS at nats://{host}:{port} "
        f"(server {nats.info.get('server_name', '?')} {nats.info.get('version', '?')}, jetstream={nats.info.get('jetstream', False)})")
    return etcd, nats


def _advertise_ip(etcd_url: str) -> str:
    """The address other hosts reach this one at: the one it reaches etcd from."""
    if os.environ.get("DYN_TCP_RPC_HOST"):
        return os.environ["DYN_TCP_RPC_HOST"]
    from urllib.parse import urlsplit

    host = urlsplit(etcd_url).hostname or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((host, 9))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _no_module(module: str, missing: str) -> int:
    print(f"/usr/bin/python3: Error while finding module specification for '{module}' "
          f"(ModuleNotFoundError: No module named '{missing}')", file=sys.stderr, flush=True)
    return 1


def _on_sigterm(fn) -> None:
    signal.signal(signal.SIGTERM, lambda *_: fn())


# --- the worker --------------------------------------------------------------------------
class ArgError(Exception):
    pass


def _parser(prog_args: dict):
    import argparse

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise ArgError(f"{self.format_usage()}{self.prog}: error: {message}")

    return Parser(prog="__main__.py", **prog_args)


def registered_model_name(served_model_name: str | None, model: str) -> str:
    """The model name a TensorRT-LLM worker registers (what the frontend's
    /v1/models lists and a request's "model" must name), as ai-dynamo 1.6.1
    derives it: ``DynamoTrtllmConfig.validate`` (dynamo/trtllm/backend_args.py)
    turns an empty --served-model-name into None; ``init_llm_worker``
    (dynamo/trtllm/workers/llm_worker.py) calls
    ``register_model(..., config.model, config.served_model_name, ...)`` and
    labels its metrics ``config.served_model_name or config.model``; the
    runtime's ``register_model`` (ai-dynamo/dynamo
    lib/bindings/python/rust/lib.rs) names the model ``model_name`` or else the
    model path exactly as given (lib/llm/src/local_model.rs,
    ``LocalModelBuilder::build``: "The served model name defaults to the full
    model path"). So ``--model-path /models/qwen35`` alone registers
    "/models/qwen35", not the checkpoint's Hugging Face id."""
    return served_model_name or model


def parse_worker_args(argv: list[str], env=None):
    """``dynamo.trtllm``'s options that the stand-in acts on. ``--model`` and
    its obsolete alias ``--model-path``, ``--served-model-name`` and their
    environment defaults (``DYN_TRTLLM_MODEL``, ``DYN_TRTLLM_SERVED_MODEL_NAME``,
    read as ``env_or_default`` does: set means used) are ai-dynamo 1.6.1's
    (``DynamoTrtllmArgGroup.add_arguments`` in dynamo/trtllm/backend_args.py)."""
    env = os.environ if env is None else env
    p = _parser({"description": "Dynamo TensorRT-LLM worker"})
    p.add_argument("--endpoint", default=None)
    p.add_argument("--model", "--model-path", dest="model_path", default=env.get("DYN_TRTLLM_MODEL", DEFAULT_MODEL))
    p.add_argument("--served-model-name", default=env.get("DYN_TRTLLM_SERVED_MODEL_NAME"))
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", type=int, default=1)
    p.add_argument("--expert-parallel-size", type=int, default=None)
    p.add_argument("--enable-attention-dp", action="store_true")
    p.add_argument("--kv-block-size", type=int, default=32)
    p.add_argument("--migration-limit", type=int, default=0)
    p.add_argument("--gpus-per-node", type=int, default=None)
    p.add_argument("--max-batch-size", type=int, default=None)
    p.add_argument("--max-num-tokens", type=int, default=None)
    p.add_argument("--max-seq-len", type=int, default=None)
    p.add_argument("--max-beam-width", type=int, default=1)
    p.add_argument("--free-gpu-memory-fraction", type=float, default=None)
    p.add_argument("--extra-engine-args", default="")
    p.add_argument("--override-engine-args", default="")
    p.add_argument("--publish-events-and-metrics", action="store_true")
    p.add_argument("--publish-metrics", action="store_true")
    p.add_argument("--publish-events", action="store_true")
    p.add_argument("--disaggregation-mode", choices=MODES, default="prefill_and_decode")
    p.add_argument("--disaggregation-strategy", choices=("prefill_first", "decode_first"), default="decode_first")
    p.add_argument("--modality", default="text")
    p.add_argument("--dyn-reasoning-parser", default=None)
    p.add_argument("--dyn-tool-call-parser", default=None)
    p.add_argument("--custom-jinja-template", default=None)
    p.add_argument("--use-nixl-connect", action="store_true")
    return p.parse_args(argv)


def _yaml_config(path: str) -> tuple[dict | None, str | None]:
    """The --extra-engine-args YAML or the error."""
    if not path:
        return {}, None
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return None, f"FileNotFoundError: [Errno 2] No such file or directory: '{path}'"
    except OSError as exc:
        return None, f"OSError: [Errno {exc.errno}] {exc.strerror}: '{path}'"
    import yaml

    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        return None, f"yaml.scanner.ScannerError: {exc}"
    return ({} if cfg is None else cfg), None


_GPU_LOCKS: list = []  # open for the life of the rank: the kernel drops the lock when it dies


def claim_gpu(gpu: int, world: str) -> int | None:
    """Hold GPU ``gpu`` of this host for this rank: the pid (in its own
    container) of another world's live rank that holds it already, else None.
    A lock per GPU in the host's state directory, held while the rank lives
    (flock works across the containers of a host; their pids do not)."""
    import fcntl

    try:
        f = open(Path(STATE_DIR) / f"dynamo-gpu{gpu}.lock", "a+")
    except OSError:
        return None
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        try:
            held = json.loads(f.read() or "{}")
        except ValueError:
            held = {}
        f.close()
        if held.get("world") == world:
            return None  # a rank of this same world
        return int(held.get("pid") or 0)
    f.seek(0)
    f.truncate()
    f.write(json.dumps({"pid": os.getpid(), "world": world}))
    f.flush()
    _GPU_LOCKS.append(f)
    return None


def lease_ttl(faults: dict) -> int:
    for v in (faults.get("lease_ttl_s"), os.environ.get("LLMDEPLOY_SIM_LEASE_TTL_S")):
        if v not in (None, ""):
            return max(1, int(float(v)))
    return DEFAULT_LEASE_TTL


def main_worker(argv: list[str]) -> int:
    env = os.environ
    rank, size, local_rank, local_size = trtllm_sim.world_of(env)
    tlog = trtllm_sim.Log(rank)
    version = trtllm_sim._image_version()
    if version is None:
        return _no_module("dynamo.trtllm", "tensorrt_llm")
    try:
        a = parse_worker_args(argv)
    except ArgError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 2
    host = os.uname().nodename
    mode = a.disaggregation_mode
    namespace = env.get("DYN_NAMESPACE") or "dynamo"
    component = COMPONENT[mode]
    endpoint_name = "generate"
    if a.endpoint:
        ep = a.endpoint.split("://", 1)[-1].split(".")
        if len(ep) != 3 or not all(ep):
            print(f"ValueError: Invalid endpoint format: '{a.endpoint}'. Expected 'dyn://namespace.component.endpoint'", flush=True)
            return 1
        namespace, component, endpoint_name = ep
    system_port = int(env.get("DYN_SYSTEM_PORT") or 8081)
    served = registered_model_name(a.served_model_name, a.model_path)
    print(f"[TensorRT-LLM] TensorRT-LLM version: {version} (simulated), rank {rank} of {size} on {host}", flush=True)
    if rank == 0:
        log("INFO", "dynamo.trtllm", f"Dynamo {_dist_version('ai_dynamo')} TensorRT-LLM worker: mode={mode} "
            f"endpoint=dyn://{namespace}.{component}.{endpoint_name} model_path={a.model_path} served_model_name={served} "
            f"system_port={system_port} ranks={size}")
        forced = env.get("TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS")
        if forced not in (None, ""):
            tlog(f"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS={forced} is set: speculative decoding acceptance is forced "
                 "(synthetic, for benchmarking only); output quality and throughput do not reflect the model. "
                 "Never set it in production or accuracy runs", "W")
    if size > 1 and env.get("TLLM_SPAWN_PROXY_PROCESS") != "1":
        tlog("dynamo.trtllm runs in an MPI world of more than one rank without trtllm-llmapi-launch: start it as "
             "`mpirun ... trtllm-llmapi-launch python3 -m dynamo.trtllm ...`", "E")
        return 1
    if not trtllm_sim._container_has_gpus():
        print("RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver "
              "from http://www.nvidia.com/Download/index.aspx", flush=True)
        return 1
    host_gpus = trtllm_sim._gpus()
    visible = env.get("CUDA_VISIBLE_DEVICES")
    err = check_visible_gpus(visible, local_size, host_gpus)
    if err:
        tlog(err, "E")
        print(f"RuntimeError: {err}", flush=True)
        return 1
    if not Path(a.model_path, "config.json").is_file():
        print(f"OSError: {a.model_path} does not appear to have a file named config.json. "
              f"Checkout 'https://huggingface.co/{a.model_path.strip('/')}/tree/main' for available files.", flush=True)
        return 1
    cfg, err = _yaml_config(a.extra_engine_args)
    if err:
        print(err, flush=True)
        return 1
    if not isinstance(cfg, dict):
        print(f"ValueError: --extra-engine-args {a.extra_engine_args} must hold a mapping, not {type(cfg).__name__}", flush=True)
        return 1
    # the YAML's parallel mapping wins over the CLI's, as in dynamo.trtllm;
    # keys the stand-in does not know are not refused here
    known = {k: v for k, v in cfg.items() if k in trtllm_sim.LLM_API_KEYS}
    err = trtllm_sim.check_llm_config(known, size, a.tensor_parallel_size, a.pipeline_parallel_size)
    if err:
        print(err, flush=True)
        return 1
    err = trtllm_sim._nccl_ifname_error()
    if err:
        print(err, flush=True)
        return 1
    if size > 1:
        rdv = trtllm_sim.rendezvous_of(env, system_port)
        if rdv is None:
            tlog(f"cannot find rank 0: no OMPI_MCA_orte_hnp_uri (nor SLURM_LAUNCH_NODE_IPADDR) in the environment of a world of {size} ranks", "E")
            return 1
    else:
        rdv = trtllm_sim.one_rank_world(env)
    faults = _faults()
    gpu = int(visible.split(",")[local_rank]) if visible else local_rank
    holder = claim_gpu(gpu, rdv["world"])
    if holder is not None:
        print(f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {local_rank} has a total capacity of "
              f"278.56 GiB of which 1.06 GiB is free. Process {holder} has 277.41 GiB memory in use. (GPU {gpu} of {host} is "
              "already used by another worker: give colocated workers disjoint CUDA_VISIBLE_DEVICES)", flush=True)
        tlog(f"Failed to initialize the executor on rank {rank}", "E")
        return 1
    try:
        n = trtllm_sim.count_world_start(rdv["world"], f"dynamo-starts-{mode}-{system_port}")
    except OSError:
        n = 1 << 30  # no state directory: no faults
    if n <= int(faults.get("crash_starts", 0)) and faults.get("crash_mode") in (None, "", mode):
        time.sleep(0.5)
        msg = faults.get("crash_message") or (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU {local_rank} has a total "
            "capacity of 278.56 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 277.50 GiB memory in use.")
        print(msg, flush=True)
        tlog(f"Failed to initialize the executor on rank {rank} (simulated crash: {mode} worker start {n} on {host})", "E")
        return 1
    config_id = json.dumps({"model": a.model_path, "mode": mode, "config": cfg}, sort_keys=True, default=str)
    if rank != 0:
        return trtllm_sim.worker(rank, size, rdv, faults, tlog, config_id, host)
    tp = cfg.get("tensor_parallel_size", a.tensor_parallel_size)
    pp = cfg.get("pipeline_parallel_size", a.pipeline_parallel_size)
    info = {"namespace": namespace, "component": component, "endpoint": endpoint_name, "mode": mode, "model": served,
            "model_path": a.model_path, "tp": tp, "pp": pp, "ep": cfg.get("moe_expert_parallel_size", a.expert_parallel_size or tp),
            "publish_metrics": bool(a.publish_metrics or a.publish_events_and_metrics), "system_port": system_port}
    return WorkerRank0(info, cfg, size, rdv, faults, tlog, config_id, version).serve()


class WorkerRank0(trtllm_sim.Rank0):
    """Rank 0 of a Dynamo TensorRT-LLM worker: the trtllm-serve stand-in's
    rendezvous (accept/handshake), then the Dynamo runtime."""

    def __init__(self, info, cfg, size, rdv, faults, tlog, config_id, version):
        super().__init__({"served_model_name": info["model"], "model": info["model_path"]}, cfg, size, rdv, faults, tlog,
                         config_id, version)
        self.info = info
        self.ready = False
        self.lease = 0
        self.ttl = 0
        self.lease_lost = threading.Event()
        self.started = time.time()
        self.mlock = threading.Lock()
        self.requests = 0
        self.inflight = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.errors = 0
        self.endpoint = f"dyn://{info['namespace']}.{info['component']}.{info['endpoint']}"
        self.labels = {"dynamo_namespace": info["namespace"], "dynamo_component": info["component"],
                       "dynamo_endpoint": info["endpoint"]}

    # -- control plane
    def _keepalive(self, etcd: Etcd) -> None:
        last_ok = time.monotonic()
        while not self.lease_lost.is_set():
            time.sleep(max(0.5, self.ttl / 3))
            try:
                ttl = parse_keepalive(etcd.call(keepalive_request(self.lease), timeout=max(1.0, self.ttl / 3)))
            except (OSError, EtcdError, ValueError) as exc:
                if time.monotonic() - last_ok > self.ttl:
                    log("ERROR", "dynamo_runtime::transports::etcd",
                        f"lease {self.lease:x}: keep-alive failed for {self.ttl}s ({_reason(exc)}): the lease is lost, shutting down")
                    self.lease_lost.set()
                continue
            if ttl <= 0:
                log("ERROR", "dynamo_runtime::transports::etcd",
                    f"lease {self.lease:x} expired (etcd answered the keep-alive without a TTL): the primary lease is lost, shutting down")
                self.lease_lost.set()
                return
            last_ok = time.monotonic()

    def serve(self) -> int:
        timeout = float(self.faults.get("connect_timeout_s", 5))
        cp = _connect_control_plane(f"dynamo.trtllm.{self.info['component']}", timeout, "dynamo.trtllm")
        if cp is None:
            return 1
        etcd, _nats = cp
        try:
            self.lease, self.ttl = parse_grant(etcd.call(lease_grant_request(lease_ttl(self.faults))))
        except (OSError, EtcdError) as exc:
            print(f"RuntimeError: Failed to create a lease in etcd at {etcd.url}: {_reason(exc)}", flush=True)
            return 1
        log("INFO", "dynamo_runtime::distributed", f"primary lease {self.lease:x} granted (TTL {self.ttl}s)")
        threading.Thread(target=self._keepalive, args=(etcd,), daemon=True).start()

        def term():
            # revoke first: mpirun may be gone already, and with it our stdout
            try:
                etcd.call(revoke_request(self.lease), timeout=1.0)
                msg = f"SIGTERM: shutting down; lease {self.lease:x} revoked"
            except (OSError, EtcdError) as exc:
                msg = f"SIGTERM: shutting down; revoking lease {self.lease:x} failed: {_reason(exc)}"
            try:
                log("INFO", "dynamo.trtllm", msg)
            except OSError:
                pass
            os._exit(0)

        _on_sigterm(term)
        try:
            httpd = _system_server(self)
        except OSError as exc:
            log("ERROR", "dynamo_runtime::system_status_server",
                f"Failed to bind the system status server on 0.0.0.0:{self.info['system_port']}: {exc.strerror} (os error {exc.errno})")
            print(f"OSError: [Errno {exc.errno}] {exc.strerror}: DYN_SYSTEM_PORT={self.info['system_port']}", flush=True)
            return 1
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        log("INFO", "dynamo_runtime::system_status_server", f"System status server listening on 0.0.0.0:{self.info['system_port']} "
            "(/health, /live, /metrics); health starts as notready")
        host = os.uname().nodename
        if self.size > 1:
            srv = socket.socket()
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                srv.bind(("0.0.0.0", self.rdv["port"]))
            except OSError as exc:
                self.log(f"cannot listen for the world's ranks on port {self.rdv['port']}: {exc.strerror}", "E")
                return 1
            srv.listen(256)
            self.log(f"rank 0 of {self.size} on {host}: world {self.rdv['world']}, waiting for {self.size - 1} rank(s) on port {self.rdv['port']}")
            threading.Thread(target=self._accept, args=(srv,), daemon=True).start()
            end = time.monotonic() + float(self.faults.get("join_timeout_s", 600))
            while not self.all_joined.wait(0.5):
                if self.lease_lost.is_set():
                    return 1
                if time.monotonic() > end:
                    with self.lock:
                        missing = sorted(set(range(1, self.size)) - set(self.joined))
                    self.log(f"timed out waiting for rank(s) {missing[:16]} to join", "E")
                    print("RuntimeError: NCCL error: remote process exited or there was a network error (ncclRemoteError)", flush=True)
                    return 1
            self.log(f"all {self.size} ranks joined: " + ", ".join(f"{h} ({n} ranks)" for h, n in self._per_host()))
        else:
            self.all_joined.set()
        cfg = self.cfg
        self.log(f"Loading model {self.info['model_path']} (mode={self.info['mode']}, tp={self.info['tp']}, ep={self.info['ep']}, "
                 f"attention_dp={bool(cfg.get('enable_attention_dp', False))}, "
                 f"spec={(cfg.get('speculative_config') or {}).get('decoding_type')})")
        slow = float(self.faults.get("slow_start_s", 0))
        end = time.monotonic() + slow
        while time.monotonic() < end and not self.lost.is_set() and not self.lease_lost.is_set():
            time.sleep(0.1)
        if self.lease_lost.is_set():
            return 1
        if self.lost.is_set():
            return self._abort()
        ip = _advertise_ip(etcd.url)
        value = {
            "namespace": self.info["namespace"], "component": self.info["component"], "endpoint": self.info["endpoint"],
            "instance_id": self.lease, "transport": {"tcp": f"{ip}:{self.info['system_port']}"},
            "host": host, "ip": ip, "system_port": self.info["system_port"], "mode": self.info["mode"],
            "model": self.info["model"], "model_path": self.info["model_path"], "ranks": self.size,
            "tp": self.info["tp"], "pp": self.info["pp"], "hosts": [f"{h}:{n}" for h, n in self._per_host()], "pid": os.getpid(),
        }
        key = instance_key(self.info["namespace"], self.info["component"], self.info["endpoint"], self.lease)
        try:
            etcd.call(put_request(key, value, self.lease))
        except (OSError, EtcdError) as exc:
            print(f"RuntimeError: Failed to register {self.endpoint} in etcd at {etcd.url}: {_reason(exc)}", flush=True)
            return 1
        self.ready = True
        log("INFO", "dynamo_runtime::component::endpoint", f"Registered endpoint {self.endpoint} instance_id={self.lease:x} key={key}")
        log("INFO", "dynamo.trtllm", f"{self.info['mode']} worker ready: model {self.info['model']}, {self.size} rank(s), "
            f"system status http://{ip}:{self.info['system_port']}/health")
        while True:
            if self.lost.wait(0.5):
                self.ready = False
                return self._abort()
            if self.lease_lost.is_set():
                self.ready = False
                return 1

    # -- metrics and requests
    def metrics(self) -> str:
        with self.mlock:
            lines = [
                "# HELP dynamo_component_requests_total Total number of requests processed by the component endpoint",
                "# TYPE dynamo_component_requests_total counter",
                metric_line("dynamo_component_requests_total", self.labels, self.requests),
                "# HELP dynamo_component_errors_total Total number of errors in the component endpoint",
                "# TYPE dynamo_component_errors_total counter",
                metric_line("dynamo_component_errors_total", self.labels, self.errors),
                "# HELP dynamo_component_inflight_requests Requests being processed by the component endpoint",
                "# TYPE dynamo_component_inflight_requests gauge",
                metric_line("dynamo_component_inflight_requests", self.labels, self.inflight),
                "# HELP dynamo_component_uptime_seconds Uptime of the component",
                "# TYPE dynamo_component_uptime_seconds gauge",
                metric_line("dynamo_component_uptime_seconds", self.labels, f"{time.time() - self.started:.3f}"),
                "# HELP dynamo_component_health_status Health of the component (1 ready, 0 not ready)",
                "# TYPE dynamo_component_health_status gauge",
                metric_line("dynamo_component_health_status", self.labels, 1 if self.healthy() else 0),
            ]
            if self.info["publish_metrics"] and self.requests:
                tl = {"model_name": self.info["model"], "engine_type": "trtllm", "disaggregation_mode": self.info["mode"]}
                cap = max(1, int(self.cfg.get("max_seq_len") or 131072)) * 4
                util = min(0.95, (self.prompt_tokens + self.completion_tokens) / cap)
                lines += [
                    "# HELP trtllm_kv_cache_utilization KV cache utilization (used blocks / max blocks)",
                    "# TYPE trtllm_kv_cache_utilization gauge",
                    metric_line("trtllm_kv_cache_utilization", tl, f"{util:.6f}"),
                    "# HELP trtllm_kv_cache_hit_rate KV cache reuse hit rate",
                    "# TYPE trtllm_kv_cache_hit_rate gauge",
                    metric_line("trtllm_kv_cache_hit_rate", tl, f"{(0.5 if self.requests > 1 else 0.0):.6f}"),
                    "# HELP trtllm_request_success_total Requests completed by the engine",
                    "# TYPE trtllm_request_success_total counter",
                    metric_line("trtllm_request_success_total", tl, self.requests),
                    "# HELP trtllm_num_active_requests Requests active in the engine",
                    "# TYPE trtllm_num_active_requests gauge",
                    metric_line("trtllm_num_active_requests", tl, self.inflight),
                ]
        return "\n".join(lines) + "\n"

    def healthy(self) -> bool:
        return self.ready and not self.lost.is_set() and not self.lease_lost.is_set()

    def generate(self, req: dict) -> tuple[int, dict]:
        mode = self.info["mode"]
        phase = req.get("phase")
        if phase not in ("prefill", "decode"):
            return 400, {"error": f"phase must be prefill or decode, not {phase!r}"}
        if mode != "prefill_and_decode" and phase != mode:
            return 400, {"error": f"this is a {mode} worker: it does not run {phase} requests"}
        if phase == "decode" and mode == "decode" and not req.get("disaggregated_params"):
            return 400, {"error": "a disaggregated decode request needs the prefill worker's disaggregated_params"}
        with self.mlock:
            self.inflight += 1
        try:
            prompt = 8 + sum(len(str(m.get("content", ""))) for m in req.get("messages") or [] if isinstance(m, dict)) // 4
            rid = req.get("request_id") or os.urandom(8).hex()
            if phase == "prefill":
                body = {"request_id": rid, "prompt_tokens": prompt,
                        "disaggregated_params": {"request_type": "context_only", "ctx_request_id": int.from_bytes(os.urandom(4), "big"),
                                                 "opaque_state": b64(f"{os.uname().nodename}:{self.lease:x}:{rid}")}}
                completion = 1
            else:
                # the whole answer, and how many pieces the frontend will stream of it
                # (its max_tokens and ignore_eos, sim/standins/streaming.py); the
                # frontend paces them by the slower of its host's latency and this one's
                thinking = req.get("enable_thinking", True)
                raw = (f"{trtllm_sim.THINK}\n</think>\n\n" if thinking else "") + trtllm_sim.ANSWER
                limit = req.get("max_tokens")
                limit = limit if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0 else None
                answer = streaming.plan(answer_fields(raw, thinking), limit, req.get("ignore_eos") is True)
                completion = max(1, len(answer))
                body = {"request_id": rid, "text": raw, "prompt_tokens": prompt, "completion_tokens": completion,
                        "finish_reason": answer.finish_reason, "worker": f"{self.info['component']}/{self.lease:x}",
                        "latency": streaming.read_latency(STATE_DIR).as_dict()}
            with self.mlock:
                self.requests += 1
                self.prompt_tokens += prompt
                self.completion_tokens += completion
            return 200, body
        finally:
            with self.mlock:
                self.inflight -= 1


def _json_handler_base():
    from http.server import BaseHTTPRequestHandler

    class Base(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, code: int, body, ctype="application/json"):
            data = body if isinstance(body, bytes) else (body.encode() if isinstance(body, str) else json.dumps(body, separators=(",", ":")).encode())
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self):
            length = int(self.headers.get("Content-Length") or 0)
            try:
                return json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return None

    return Base


def _system_server(r0: WorkerRank0):

    Base = _json_handler_base()

    class Handler(Base):
        def log_message(self, fmt, *args):
            pass

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/health":
                code, body = worker_health(r0.healthy(), r0.endpoint)
                body["uptime"] = f"{time.time() - r0.started:.3f}s"
                return self._send(code, body)
            if path == "/live":
                return self._send(200, {"status": "live"})
            if path == "/metrics":
                return self._send(200, r0.metrics(), "text/plain; version=0.0.4; charset=utf-8")
            return self._send(404, {"error": "Not Found"})

        def do_POST(self):
            req = self._body()
            if self.path != "/generate":
                return self._send(404, {"error": "Not Found"})
            if req is None or not isinstance(req, dict):
                return self._send(400, {"error": "invalid JSON body"})
            if not r0.healthy():
                with r0.mlock:
                    r0.errors += 1
                return self._send(503, {"error": f"{r0.endpoint} is not ready"})
            code, body = r0.generate(req)
            if code != 200:
                with r0.mlock:
                    r0.errors += 1
            return self._send(code, body)

    httpd = streaming.http_server(("0.0.0.0", r0.info["system_port"]), Handler)
    httpd.daemon_threads = True
    return httpd


# --- the frontend ------------------------------------------------------------------------
def parse_frontend_args(argv: list[str]):
    p = _parser({"description": "Dynamo OpenAI-compatible HTTP frontend"})
    p.add_argument("-i", "--interactive", action="store_true")
    p.add_argument("--http-host", default=os.environ.get("DYN_HTTP_HOST", "0.0.0.0"))
    p.add_argument("--http-port", type=int, default=int(os.environ.get("DYN_HTTP_PORT", "8000")))
    p.add_argument("--tls-cert-path", default=None)
    p.add_argument("--tls-key-path", default=None)
    p.add_argument("--router-mode", choices=("round-robin", "random", "kv", "direct"), default="round-robin")
    p.add_argument("--kv-overlap-score-weight", type=float, default=1.0)
    p.add_argument("--router-temperature", type=float, default=0.0)
    p.add_argument("--kv-events", dest="kv_events", action="store_true", default=True)
    p.add_argument("--no-kv-events", dest="kv_events", action="store_false")
    p.add_argument("--router-replica-sync", action="store_true")
    p.add_argument("--router-reset-states", action="store_true")
    p.add_argument("--router-snapshot-threshold", type=int, default=1000000)
    p.add_argument("--router-session-affinity-ttl-secs", type=int, default=0)
    p.add_argument("--kv-cache-block-size", type=int, default=None)
    p.add_argument("--busy-threshold", type=float, default=None)
    p.add_argument("--migration-limit", type=int, default=0)
    p.add_argument("--namespace", default=None)
    p.add_argument("--model-name", default=None)
    p.add_argument("--model-path", default=None)
    p.add_argument("--metrics-prefix", default=None)
    p.add_argument("--enforce-disagg", action="store_true")
    return p.parse_args(argv)


class Frontend:
    def __init__(self, a, etcd: Etcd):
        self.a = a
        self.etcd = etcd
        self.namespace = a.namespace
        self.prefix = INSTANCES + (f"{self.namespace}/" if self.namespace else "")
        self.instances: list[dict] = []
        self.models: set[str] = set()
        self.lock = threading.Lock()
        self.sessions: dict[str, tuple[int, float]] = {}
        self.rr: dict[str, int] = {}
        self.etcd_ok = True
        self.requests: dict[tuple[str, str, str], int] = {}
        self.engines: dict[str, streaming.Engine] = {}  # per model: the requests in flight
        self.closing = threading.Event()  # SIGTERM: the service is cancelled
        self.drained = threading.Event()

    def engine(self, model: str) -> streaming.Engine:
        with self.lock:
            if model not in self.engines:
                self.engines[model] = streaming.Engine()
            return self.engines[model]

    def idle(self) -> bool:
        with self.lock:
            engines = list(self.engines.values())
        return all(e.idle() for e in engines)

    def poll_once(self) -> None:
        try:
            found = parse_instances(parse_range(self.etcd.call(range_request(self.prefix), timeout=2.0)))
        except (OSError, EtcdError, ValueError) as exc:
            if self.etcd_ok:
                log("WARN", "dynamo_llm::discovery::watcher", f"etcd at {self.etcd.url} unreachable ({_reason(exc)}): keeping the last known instances")
            self.etcd_ok = False
            return
        if not self.etcd_ok:
            log("INFO", "dynamo_llm::discovery::watcher", f"etcd at {self.etcd.url} answers again")
        self.etcd_ok = True
        with self.lock:
            old = {i["key"]: i for i in self.instances}
            new = {i["key"]: i for i in found}
            self.instances = found
        for k in sorted(set(new) - set(old)):
            i = new[k]
            log("INFO", "dynamo_llm::discovery::watcher", f"added instance component={i.get('component')} mode={i.get('mode')} "
                f"instance_id={int(i.get('instance_id') or 0):x} address={(i.get('transport') or {}).get('tcp')} ranks={i.get('ranks')}")
        for k in sorted(set(old) - set(new)):
            i = old[k]
            log("INFO", "dynamo_llm::discovery::watcher", f"removed instance component={i.get('component')} mode={i.get('mode')} "
                f"instance_id={int(i.get('instance_id') or 0):x} (lease gone)")
        models = set(models_of(found))
        for m in sorted(models - self.models):
            log("INFO", "dynamo_llm::discovery::watcher", f'added model model_name="{m}"')
        for m in sorted(self.models - models):
            log("INFO", "dynamo_llm::discovery::watcher", f'removed model model_name="{m}"')
        self.models = models

    def poll(self) -> None:
        while True:
            self.poll_once()
            time.sleep(1.0)

    def pick(self, role: str, model: str, session: str | None) -> list[dict]:
        """Instances of ``role`` serving ``model``, the preferred one first."""
        with self.lock:
            cands = [i for i in self.instances if i.get("model") == model
                     and (i.get("mode") == role or i.get("mode") == "prefill_and_decode")]
            if not cands:
                return []
            # round robin per role: new conversations spread over the instances
            n = self.rr[role] = self.rr.get(role, -1) + 1
            order = cands[n % len(cands):] + cands[: n % len(cands)]
            ttl = self.a.router_session_affinity_ttl_secs
            if role == "decode" and session and ttl > 0:
                now = time.monotonic()
                for s in [s for s, (_, t) in self.sessions.items() if now - t > ttl]:
                    del self.sessions[s]
                held = self.sessions.get(session)
                if held is not None:
                    for i in order:
                        if i.get("instance_id") == held[0]:
                            order = [i] + [x for x in order if x is not i]
                            break
                self.sessions[session] = (order[0].get("instance_id"), now)
            return order

    def count(self, model: str, kind: str, status: str) -> None:
        with self.lock:
            self.requests[(model, kind, status)] = self.requests.get((model, kind, status), 0) + 1

    def metrics(self) -> str:
        """The frontend's /metrics (ai-dynamo prometheus_names.rs frontend_service, prefix dynamo_frontend_)."""
        lines = ["# HELP dynamo_frontend_requests_total Total LLM requests processed",
                 "# TYPE dynamo_frontend_requests_total counter"]
        with self.lock:
            for (model, kind, status), n in sorted(self.requests.items()):
                lines.append(metric_line("dynamo_frontend_requests_total", {"model": model, "endpoint": kind, "status": status}, n))
            models = sorted(set(self.models) | set(self.engines))
            stats = {m: (self.engines[m].stats() if m in self.engines else None) for m in models}
            counts = {mode: sum(1 for i in self.instances if i.get("mode") == mode) for mode in MODES}
        for name, key, kind, doc in (
                ("dynamo_frontend_inflight_requests", "running", "gauge", "Number of inflight requests going to the engine"),
                ("dynamo_frontend_queued_requests", "queued", "gauge",
                 "Number of requests waiting in HTTP queue before receiving the first response"),
                ("dynamo_frontend_output_tokens_total", "generation_tokens_total", "counter", "Total number of output tokens generated")):
            lines += [f"# HELP {name} {doc}", f"# TYPE {name} {kind}"]
            lines += [metric_line(name, {"model": m}, (st or {}).get(key, 0)) for m, st in stats.items()]
        lines += ["# HELP dynamo_frontend_model_instances Registered worker instances",
                  "# TYPE dynamo_frontend_model_instances gauge"]
        lines += [metric_line("dynamo_frontend_model_instances", {"mode": mode}, counts[mode]) for mode in MODES]
        return "\n".join(lines) + "\n"

    def step(self, insts: list[dict], body: dict) -> tuple[dict | None, str, dict | None]:
        """POST /generate to the first instance that answers: (answer, error, instance)."""
        err = "no instance"
        for inst in insts:
            addr = (inst.get("transport") or {}).get("tcp") or f"{inst.get('ip')}:{inst.get('system_port')}"
            try:
                status, text = _http(f"http://{addr}", "POST", "/generate", body, timeout=30)
            except OSError as exc:
                err = f"{inst.get('component')} instance {int(inst.get('instance_id') or 0):x} at {addr}: {_reason(exc)}"
                log("WARN", "dynamo_llm::http::service::openai", f"request {body.get('request_id')}: {err}; trying another instance")
                continue
            if status == 200:
                return json.loads(text), "", inst
            err = f"{inst.get('component')} instance {int(inst.get('instance_id') or 0):x} at {addr}: HTTP {status} {text[:200]}"
            log("WARN", "dynamo_llm::http::service::openai", f"request {body.get('request_id')}: {err}")
        return None, err, None


# lib/llm/src/http/service/health.rs: /live and /health once the service is cancelled
SHUTTING_DOWN = {"status": "shutting_down", "message": "Service is shutting down"}
# lib/llm/src/http/service/service_v2.rs get_graceful_shutdown_timeout (the real default is 5 s)
GRACEFUL_SHUTDOWN_ENV = "DYN_HTTP_GRACEFUL_SHUTDOWN_TIMEOUT_SECS"
DEFAULT_GRACEFUL_SHUTDOWN_S = 0.5


def graceful_shutdown_s(env, faults: dict) -> float:
    """How long the frontend keeps its listener after SIGTERM: the real
    variable when set (seconds, an integer), else node.json
    ``dynamo.http_graceful_shutdown_s``, else 0.5 (scaled down from 5)."""
    value = env.get(GRACEFUL_SHUTDOWN_ENV)
    if value not in (None, "") and value.strip().isdigit():
        return float(int(value.strip()))
    try:
        return max(0.0, float(faults.get("http_graceful_shutdown_s", DEFAULT_GRACEFUL_SHUTDOWN_S)))
    except (TypeError, ValueError):
        return DEFAULT_GRACEFUL_SHUTDOWN_S


def _error(message: str, kind: str, code: int) -> dict:
    return {"message": message, "type": kind, "code": code}


def _frontend_server(fe: Frontend):

    Base = _json_handler_base()

    class Handler(Base):
        def log_message(self, fmt, *args):
            pass

        def do_GET(self):
            path = self.path.split("?", 1)[0]
            if path == "/health":
                with fe.lock:
                    insts = list(fe.instances)
                if fe.closing.is_set():
                    return self._send(503, {**SHUTTING_DOWN, "instances": [health_instance(i) for i in insts]})
                return self._send(200, frontend_health(insts))
            if path == "/live":
                if fe.closing.is_set():
                    return self._send(503, SHUTTING_DOWN)
                return self._send(200, {"status": "live", "message": "Service is live"})
            if path == "/metrics":
                return self._send(200, fe.metrics(), "text/plain; version=0.0.4; charset=utf-8")
            if path == "/v1/models":
                now = int(time.time())
                return self._send(200, {"object": "list", "data": [
                    {"id": m, "object": "object", "created": now, "owned_by": "nvidia"} for m in sorted(fe.models)]})
            return self._send(404, _error("Not Found", "Not Found", 404))

        def do_POST(self):
            kind = {"/v1/chat/completions": "chat_completions", "/v1/completions": "completions"}.get(self.path.split("?", 1)[0])
            req = self._body()
            if kind is None:
                return self._send(404, _error("Not Found", "Not Found", 404))
            if not isinstance(req, dict):
                return self._send(400, _error("Failed to parse the request body as JSON", "Bad Request", 400))
            model = req.get("model")
            if fe.closing.is_set():
                fe.count(str(model), kind, "error")
                return self._send(503, _error(SHUTTING_DOWN["message"], "Service Unavailable", 503))
            with fe.lock:
                insts = list(fe.instances)
            if not servable(insts):
                fe.count(str(model), kind, "error")
                missing = sorted({"prefill", "decode"} - roles_of(insts))
                return self._send(503, _error(f"Service unavailable: no {' or '.join(missing)} worker instances registered "
                                              "(No endpoints available)", "Service Unavailable", 503))
            if model not in fe.models:
                fe.count(str(model), kind, "error")
                return self._send(404, _error(f"Model not found: {model}", "Not Found", 404))
            if kind == "chat_completions" and (not isinstance(req.get("messages"), list) or not req["messages"]):
                fe.count(model, kind, "error")
                return self._send(400, _error("messages: field required and must not be empty", "Bad Request", 400))
            try:
                limit = streaming.max_tokens_of(req)
            except streaming.BadRequest as exc:
                fe.count(model, kind, "error")
                return self._send(400, _error(str(exc), "Bad Request", 400))
            ignore_eos = streaming.ignore_eos_of(req, nvext=True)
            session = self.headers.get("x-dynamo-session-id")
            rid = os.urandom(16).hex()
            messages = req.get("messages") if kind == "chat_completions" else [{"role": "user", "content": str(req.get("prompt", ""))}]
            thinking = (req.get("chat_template_kwargs") or {}).get("enable_thinking", True) if kind == "chat_completions" else False
            prefills, decodes = fe.pick("prefill", model, session), fe.pick("decode", model, session)
            if not prefills or not decodes:
                fe.count(model, kind, "error")
                return self._send(503, _error(f"Service unavailable: no prefill and decode instances for {model}", "Service Unavailable", 503))
            prompt = streaming.prompt_tokens(req)
            try:
                r = fe.engine(model).request(prompt)
            except streaming.Closed:
                fe.count(model, kind, "error")
                return self._send(503, _error(SHUTTING_DOWN["message"], "Service Unavailable", 503))
            with r:
                try:
                    return self._serve(r, req, kind, model, rid, session, messages, thinking, limit, ignore_eos, prefills, decodes)
                except streaming.DISCONNECTED:
                    streaming.gone(self)

        def _serve(self, r, req, kind, model, rid, session, messages, thinking, limit, ignore_eos, prefills, decodes):
            base = {"request_id": rid, "messages": messages, "max_tokens": limit, "ignore_eos": ignore_eos,
                    "session_id": session, "enable_thinking": thinking}
            pre, err, pinst = fe.step(prefills, {**base, "phase": "prefill"})
            if pre is None:
                fe.count(model, kind, "error")
                return self._send(503, _error(f"prefill failed: {err}", "Service Unavailable", 503))
            dec, err, dinst = fe.step(decodes, {**base, "phase": "decode", "disaggregated_params": pre.get("disaggregated_params")})
            if dec is None:
                fe.count(model, kind, "error")
                return self._send(503, _error(f"decode failed: {err}", "Service Unavailable", 503))
            log("INFO", "dynamo_llm::http::service::openai",
                f"request_id={rid} model={model} endpoint={kind} x-dynamo-session-id={session or '-'} "
                f"prefill_instance={int(pinst.get('instance_id') or 0):x} decode_instance={int(dinst.get('instance_id') or 0):x} "
                f"router_mode={fe.a.router_mode}")
            raw = dec.get("text", "")
            fields = answer_fields(raw, thinking) if kind == "chat_completions" else [("text", raw)]
            answer = streaming.plan(fields, limit, ignore_eos)
            lat = streaming.read_latency(STATE_DIR).slowest(streaming.latency_of({"latency": dec.get("latency")}))
            created = int(time.time())
            if kind == "completions" or not req.get("stream"):
                streaming.generate(r, answer, lat)
                r.finish(answer.finish_reason)
                fe.count(model, kind, "success")
                use = streaming.usage(r.prompt, r.generated)
                if kind == "completions":
                    return self._send(200, {"id": f"cmpl-{rid}", "object": "text_completion", "created": created, "model": model,
                                            "choices": [{"index": 0, "text": answer.text("text") or "", "finish_reason": answer.finish_reason,
                                                         "logprobs": None}], "usage": use})
                reasoning = answer.text("reasoning_content") if thinking else None
                if thinking and reasoning is None:
                    reasoning = ""
                return self._send(200, {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": created, "model": model,
                                        "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text("content") or "",
                                                                             "reasoning_content": reasoning},
                                                     "logprobs": None, "finish_reason": answer.finish_reason}],
                                        "usage": use})
            cid = f"chatcmpl-{rid}"
            sse = streaming.SSE(self, [("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked")])

            def event(delta, fin=None):
                sse.event({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
                           "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": fin}]})

            def emit(field, piece):
                if r.generated == 1:  # the first response: no longer queued
                    event({"role": "assistant", "content": ""})
                event({field: piece})

            streaming.generate(r, answer, lat, emit)
            r.finish(answer.finish_reason)  # out of the counts before the client sees the end
            fe.count(model, kind, "success")
            if r.generated == 0:
                event({"role": "assistant", "content": ""})
            event({}, answer.finish_reason)
            if streaming.include_usage(req):
                sse.event({"id": cid, "object": "chat.completion.chunk", "created": created, "model": model, "choices": [],
                           "usage": streaming.usage(r.prompt, r.generated)})
            sse.done()

    httpd = streaming.http_server((fe.a.http_host, fe.a.http_port), Handler)
    httpd.daemon_threads = True
    return httpd


def main_frontend(argv: list[str]) -> int:
    try:
        a = parse_frontend_args(argv)
    except ArgError as exc:
        print(str(exc), file=sys.stderr, flush=True)
        return 2
    target = "dynamo.frontend"
    log("INFO", target, f"Dynamo {_dist_version('ai_dynamo')} frontend: router_mode={a.router_mode} "
        f"session_affinity_ttl={a.router_session_affinity_ttl_secs}s namespace={a.namespace or os.environ.get('DYN_NAMESPACE') or '*'} "
        f"tokenizer={os.environ.get('DYN_TOKENIZER', 'default')}")
    if a.namespace is None and os.environ.get("DYN_NAMESPACE"):
        a.namespace = os.environ["DYN_NAMESPACE"]
    cp = _connect_control_plane("dynamo.frontend", float(_faults().get("connect_timeout_s", 5)), target)
    if cp is None:
        return 1
    etcd, _nats = cp
    fe = Frontend(a, etcd)
    try:
        httpd = _frontend_server(fe)
    except OSError as exc:
        log("ERROR", "dynamo_llm::http::service::service_v2",
            f"Failed to bind {a.http_host}:{a.http_port}: {exc.strerror} (os error {exc.errno})")
        print(f"Error: Address already in use (os error {exc.errno})" if exc.errno == 98 else f"Error: {exc}", flush=True)
        return 1
    grace = graceful_shutdown_s(os.environ, _faults())

    def drain():
        # service_v2.rs: the service is cancelled (/live and /health 503, new
        # requests refused), the listener stays for the grace period, then it
        # closes and the connections in flight drain; the process exits 0
        fe.closing.set()
        try:
            log("INFO", "dynamo_llm::http::service::service_v2", "HTTP server shutdown requested")
        except OSError:
            pass
        time.sleep(grace)
        streaming.stop_listening(httpd)
        while not fe.idle():
            time.sleep(0.05)
        try:
            log("INFO", target, "SIGTERM: shutting down")
        except OSError:
            pass
        os._exit(0)

    streaming.on_sigterm_once(drain)
    threading.Thread(target=fe.poll, daemon=True).start()
    log("INFO", "dynamo_llm::http::service::service_v2", f"Starting HTTP service on: {a.http_host}:{a.http_port} "
        f'address="{a.http_host}:{a.http_port}"')
    httpd.serve_forever()
    while not fe.drained.wait(0.2):  # stopped listening on SIGTERM: the drain ends the process
        pass
    return 0


def main(module: str, argv: list[str]) -> int:
    """``python3 -m <module> ARGS`` inside a container, for ``dynamo*`` modules."""
    if _dist_version("ai_dynamo") is None:
        return _no_module(module, "dynamo")
    if _dist_version("ai_dynamo_runtime") is None:
        print("Traceback (most recent call last):\n  ...\nModuleNotFoundError: No module named 'dynamo._core'",
              file=sys.stderr, flush=True)
        return 1
    if module == "dynamo.frontend":
        return main_frontend(argv)
    if module == "dynamo.trtllm":
        return main_worker(argv)
    print(f"/usr/bin/python3: No module named {module}", file=sys.stderr, flush=True)
    return 1
