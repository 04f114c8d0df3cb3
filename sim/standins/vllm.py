"""A simulated ``vllm serve`` that follows vLLM's data-parallel launch
semantics (shared/DOMAIN.md) over real TCP:

- node 0 (no ``--headless``) binds ``--data-parallel-address:--data-parallel-rpc-port``
  and waits for the other DP ranks' HELLO; only when all have joined does it
  start the HTTP API (``/health``, ``/v1/models``, ``/v1/chat/completions``
  answering with a ``<think>`` block) and log ``Application startup complete.``
- a headless worker connects (retrying: a connect does not fail when node 0
  is absent) and dies after the front-end wait with vLLM's message;
- a rank that is duplicated or out of range, or a configuration that differs
  from node 0's, is refused the way vLLM refuses it;
- ``HCCL_SOCKET_IFNAME`` must own ``HCCL_IF_IP`` or HCCL init fails.

Faults come from the host's node.json ``vllm`` entry: ``crash_first`` (the
first N starts on this host crash), ``always_crash``, ``node0_delay_s``
(a slow node 0 binds its RPC port late), ``die_after_ready_s``,
``frontend_wait_s`` (the 5-minute wait, scaled down for tests).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

STATE_DIR = os.environ.get("LLMDEPLOY_SIM_STATE", "/etc/llmdeploy-sim")


def log(msg: str, level: str = "INFO") -> None:
    ts = time.strftime("%m-%d %H:%M:%S")
    print(f"{level} {ts} [sim-vllm] {msg}", flush=True)


def _process_start() -> float:
    """When this process started (epoch seconds), from /proc."""
    with open("/proc/self/stat") as f:
        ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as f:
        btime = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    return btime + ticks / os.sysconf("SC_CLK_TCK")


def record_ready(role: str) -> None:
    """Simulator bookkeeping (not vLLM's): when this server process started and
    when it became ready, in the host's state directory (serving-times.jsonl,
    mounted into containers by the simulator's runtime, sim/dockerd.py), so that
    bench/deploy_overhead.py can tell the servers' own start from the tool's time."""
    try:
        line = json.dumps({"host": os.uname().nodename, "role": role, "start": _process_start(), "ready": time.time()})
        with open(os.path.join(STATE_DIR, "serving-times.jsonl"), "a") as f:
            f.write(line + "\n")
    except (OSError, ValueError, IndexError, StopIteration):
        pass


def _faults() -> dict:
    try:
        return json.loads((Path(STATE_DIR) / "node.json").read_text()).get("vllm") or {}
    except (OSError, ValueError):
        return {}


def _count_start() -> int:
    """How many times vllm serve has started on this host (this one included)."""
    p = Path(STATE_DIR) / "vllm-starts"
    n = int(p.read_text()) + 1 if p.exists() else 1
    p.write_text(str(n))
    return n


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="vllm serve")
    p.add_argument("model")
    p.add_argument("--headless", action="store_true")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name")
    p.add_argument("--tokenizer")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--quantization")
    p.add_argument("--safetensors-load-strategy")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--data-parallel-size", type=int, default=1)
    p.add_argument("--data-parallel-size-local", type=int)
    p.add_argument("--data-parallel-start-rank", type=int, default=0)
    p.add_argument("--data-parallel-address")
    p.add_argument("--data-parallel-rpc-port", type=int, default=13345)
    p.add_argument("--enable-prefix-caching", action="store_true")
    p.add_argument("--enable-expert-parallel", action="store_true")
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--gpu-memory-utilization", type=float)
    p.add_argument("--speculative-config", type=json.loads)
    p.add_argument("--compilation-config", type=json.loads)
    p.add_argument("--additional-config", type=json.loads)
    return p.parse_args(argv)


def config_hash(a: argparse.Namespace) -> str:
    """What every DP rank must agree on (vLLM compares its parallel and model config)."""
    keys = ("model", "tensor_parallel_size", "data_parallel_size", "quantization", "max_model_len",
            "enable_expert_parallel", "speculative_config", "compilation_config")
    return hashlib.sha256(json.dumps({k: getattr(a, k) for k in keys}, sort_keys=True, default=str).encode()).hexdigest()[:16]


def if_ipv4(ifname: str) -> str | None:
    """The IPv4 address of interface ``ifname`` in this network namespace
    (the SIOCGIFADDR ioctl, as HCCL's socket manager reads it), or None."""
    import fcntl
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            got = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", ifname.encode()[:15]))  # SIOCGIFADDR
    except OSError:
        return None
    return socket.inet_ntoa(got[20:24])


def hccl_check() -> str | None:
    """HCCL binds its socket to HCCL_SOCKET_IFNAME; that NIC must own HCCL_IF_IP."""
    ip, ifname = os.environ.get("HCCL_IF_IP"), os.environ.get("HCCL_SOCKET_IFNAME")
    if not ip or not ifname:
        return None
    if if_ipv4(ifname) != ip:
        pid = os.getpid()
        return (
            f"[ERROR] HCCL({pid},python):{time.strftime('%Y-%m-%d-%H:%M:%S')} [hccl_socket_manager.cc:214][{pid}]"
            f"[Init][Socket]socket ifname {ifname} has no ip {ip} (HCCL_SOCKET_IFNAME / HCCL_IF_IP)\n"
            f"[ERROR] HCCL({pid},python):{time.strftime('%Y-%m-%d-%H:%M:%S')} [op_base.cc:974][{pid}]"
            "[Init][CommRootInfoConfig]errNo[0x0000000005000002]HcclCommInitRootInfo failed."
        )
    return None


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "serve":
        print("usage: vllm serve MODEL [options]", file=sys.stderr)
        return 2
    a = parse(argv[1:])
    faults = _faults()
    n = _count_start()
    log(f"vLLM API server version 0.23.0 (simulated); start {n} on {os.uname().nodename}")
    log(f"non-default args: model={a.model!r}, tensor_parallel_size={a.tensor_parallel_size}, data_parallel_size={a.data_parallel_size}")
    if not Path(a.model, "config.json").exists():
        print(f"OSError: {a.model} does not appear to have a file named config.json.", flush=True)
        return 1
    if faults.get("always_crash") or n <= int(faults.get("crash_first", 0)):
        time.sleep(0.3)
        print("RuntimeError: NPU out of memory. Tried to allocate 2.00 GiB (simulated crash)", flush=True)
        print("Engine core initialization failed. See root cause above.", flush=True)
        return 1
    if a.headless and (a.data_parallel_size_local or 0) <= 0:
        print("ValueError: data_parallel_size_local must be > 0 in headless mode", flush=True)
        return 1
    err = hccl_check()
    if err:
        print(err, flush=True)
        print("Engine core initialization failed. See root cause above.", flush=True)
        return 1
    if a.headless:
        return worker(a, faults)
    return node0(a, faults)


# --- headless worker -------------------------------------------------------------------
def worker(a: argparse.Namespace, faults: dict) -> int:
    addr = (a.data_parallel_address, a.data_parallel_rpc_port)
    log(f"Launching {a.data_parallel_size_local} data parallel engine(s) in headless mode, with head node address tcp://{addr[0]}:{addr[1]}.")
    wait = float(faults.get("frontend_wait_s", 300))
    end = time.monotonic() + wait
    sock = None
    while time.monotonic() < end:
        try:
            sock = socket.create_connection(addr, timeout=2)
            break
        except OSError:
            time.sleep(0.2)
    if sock is None:
        print("RuntimeError: Did not receive response from front-end process within 5 minutes", flush=True)
        print("EngineCore failed to start.", flush=True)
        return 1
    hello = {"rank": a.data_parallel_start_rank, "headless": True, "config": config_hash(a), "host": os.uname().nodename}
    sock.sendall((json.dumps(hello) + "\n").encode())
    f = sock.makefile("r")
    line = f.readline()
    if not line:
        print("RuntimeError: front-end closed the connection during the handshake", flush=True)
        print("Engine core initialization failed. See root cause above.", flush=True)
        return 1
    reply = json.loads(line)
    if not reply.get("ok"):
        print(f"RuntimeError: {reply.get('error')}", flush=True)
        print("Engine core initialization failed. See root cause above.", flush=True)
        return 1
    log(f"DP rank {a.data_parallel_start_rank} joined the front-end at tcp://{addr[0]}:{addr[1]}; engine core ready")
    record_ready("headless")
    sock.settimeout(None)
    # serve until node 0 goes away
    while f.readline():
        pass
    print("RuntimeError: lost the connection to the front-end process (DP coordinator)", flush=True)
    return 1


# --- node 0 -------------------------------------------------------------------------------
class Front:
    def __init__(self, a: argparse.Namespace):
        self.a = a
        self.joined: dict[int, socket.socket] = {}
        self.lock = threading.Lock()
        self.ready = threading.Event()
        self.mine = config_hash(a)

    def healthy(self) -> bool:
        with self.lock:
            return self.ready.is_set() and len(self.joined) == self.a.data_parallel_size - 1

    def serve_rpc(self, srv: socket.socket) -> None:
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=self.handshake, args=(conn,), daemon=True).start()

    def handshake(self, conn: socket.socket) -> None:
        f = conn.makefile("r")
        try:
            hello = json.loads(f.readline() or "{}")
        except ValueError:
            conn.close()
            return
        rank = hello.get("rank")
        dp = self.a.data_parallel_size
        error = None
        if not hello.get("headless"):
            error = f"Remote engine {rank} must use --headless"
        elif not isinstance(rank, int) or not 1 <= rank < dp:
            error = f"Message from engine with unexpected data parallel rank: {rank}"
        elif hello.get("config") != self.mine:
            error = f"Configuration mismatch detected for engine {rank}"
        with self.lock:
            if error is None and rank in self.joined and _alive(self.joined[rank]):
                error = f"Message from engine with unexpected data parallel rank: {rank} (already joined from another engine)"
            if error is None:
                self.joined[rank] = conn
        if error:
            log(error, "ERROR")
            conn.sendall((json.dumps({"ok": False, "error": error}) + "\n").encode())
            conn.close()
            return
        conn.sendall(b'{"ok": true}\n')
        log(f"DP rank {rank} joined from {hello.get('host')} ({len(self.joined) + 1}/{dp} ranks)")
        if len(self.joined) == dp - 1 and not self.ready.is_set():
            self.ready.set()
        # watch the connection: a dead remote engine makes the group unhealthy
        try:
            while f.readline():
                pass
        except OSError:
            pass
        with self.lock:
            if self.joined.get(rank) is conn:
                del self.joined[rank]
        log(f"remote engine of DP rank {rank} disconnected", "ERROR")


def _alive(conn: socket.socket) -> bool:
    try:
        conn.setblocking(False)
        data = conn.recv(1, socket.MSG_PEEK)
        return data != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        try:
            conn.setblocking(True)
        except OSError:
            pass


def node0(a: argparse.Namespace, faults: dict) -> int:
    delay = float(faults.get("node0_delay_s", 0))
    if delay:
        log(f"loading weights ({delay:g}s)")
        time.sleep(delay)
    front = Front(a)
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        srv.bind((a.data_parallel_address or "0.0.0.0", a.data_parallel_rpc_port))
    except OSError as exc:
        print(f"OSError: [Errno {exc.errno}] {exc.strerror}: tcp://{a.data_parallel_address}:{a.data_parallel_rpc_port}", flush=True)
        return 1
    srv.listen(64)
    log(f"DP coordinator listening on tcp://{a.data_parallel_address}:{a.data_parallel_rpc_port}; waiting for {a.data_parallel_size - 1} remote engine(s)")
    threading.Thread(target=front.serve_rpc, args=(srv,), daemon=True).start()
    if a.data_parallel_size > 1:
        front.ready.wait()  # vLLM waits for remote engines with no deadline
    else:
        front.ready.set()
    log("All DP ranks joined; starting the API server")
    served = a.served_model_name or a.model

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):
            log(f'{self.client_address[0]} "{self.requestline}" {args[1] if len(args) > 1 else ""}')

        def _send(self, code: int, body, ctype="application/json"):
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                return self._send(200, b"") if front.healthy() else self._send(503, {"error": "engine dead"})
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": served, "object": "model", "owned_by": "vllm", "root": a.model, "max_model_len": a.max_model_len}]})
            return self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return self._send(400, {"error": {"message": "invalid JSON"}})
            if self.path != "/v1/chat/completions":
                return self._send(404, {"detail": "Not Found"})
            if not front.healthy():
                return self._send(503, {"error": {"message": "engine dead"}})
            if req.get("model") != served:
                return self._send(404, {"error": {"message": f"The model `{req.get('model')}` does not exist.", "code": 404}})
            thinking = (req.get("chat_template_kwargs") or {}).get("enable_thinking", True)
            text = ("<think>\nThe user wants a merge of two sorted linked lists; walk both with a dummy head.\n</think>\n\n" if thinking else "") + (
                "def merge(a, b):\n    dummy = tail = ListNode()\n    ..."
            )
            cid = f"chatcmpl-sim{int(time.time() * 1000)}"
            if req.get("stream"):
                chunks = [text[i : i + 16] for i in range(0, len(text), 16)]
                body = b""
                for c in chunks:
                    body += b"data: " + json.dumps({"id": cid, "object": "chat.completion.chunk", "model": served, "choices": [{"index": 0, "delta": {"content": c}}]}).encode() + b"\n\n"
                body += b"data: [DONE]\n\n"
                return self._send(200, body, "text/event-stream")
            return self._send(200, {"id": cid, "object": "chat.completion", "model": served, "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}]})

    try:
        httpd = ThreadingHTTPServer((a.host, a.port), Handler)
    except OSError as exc:
        print(f"OSError: [Errno {exc.errno}] error while attempting to bind on address ('{a.host}', {a.port}): {exc.strerror}", flush=True)
        return 1
    log(f"Starting vLLM API server on http://{a.host}:{a.port}")
    log("Application startup complete.")
    record_ready("api")
    die = faults.get("die_after_ready_s")
    if die is not None:
        def _die():
            time.sleep(float(die))
            print("EngineCore encountered a fatal error (simulated)", flush=True)
            os._exit(1)

        threading.Thread(target=_die, daemon=True).start()
    httpd.serve_forever()
    return 0
