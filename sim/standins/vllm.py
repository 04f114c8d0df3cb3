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
- ``HCCL_SOCKET_IFNAME`` must own ``HCCL_IF_IP`` or HCCL init fails;
- the command line is parsed as vLLM 0.23.0 parses it: every option of
  ``vllm serve`` (``vllm_serve_options.txt``, generated from the vllm wheel
  by ``scripts/vllm_serve_options.py``) with its arity, vLLM's own rewriting
  of underscores and dotted options first; any other option exits 2 with
  argparse's ``vllm: error: unrecognized arguments: ...``, as the real
  ``vllm`` does, before anything starts.

Node 0's API answers as streaming.py says (shared by the serving stand-ins):
one SSE chunk per token, paced by node.json ``latency`` (``first_token_s``,
``per_token_s``, read per request), ``max_tokens``/``max_completion_tokens``,
``ignore_eos``, ``usage`` (``stream_options.include_usage`` in the last
chunk); ``--max-num-seqs`` is the batch limit beyond which requests wait;
``GET /metrics`` is Prometheus text with vLLM's names
(``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``, ``vllm:prompt_tokens_total``,
``vllm:generation_tokens_total``, ``vllm:request_success_total``; labels
``model_name`` = the first served name, ``engine``). SIGTERM once node 0
serves follows vLLM 0.23's ``--shutdown-timeout`` (vllm-project/vllm #36666):
new requests and ``/health`` get 503; with 0 (the default) the requests in
flight end at once with ``finish_reason`` ``abort``; with N they may finish
for up to N seconds; then exit 0.

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
import re
import socket
import sys
import threading
import time
from pathlib import Path

from . import streaming

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


# --- vllm serve's command line, as vLLM 0.23.0 parses it ---------------------------------------
# Every option `vllm serve` has, with its arity, generated from the vllm wheel's
# own sources by scripts/vllm_serve_options.py (header of the file: which wheel).
OPTIONS_FILE = Path(__file__).with_name("vllm_serve_options.txt")
ARITIES = {"flag", "bool", "help", "version", "1", "?", "+", "*"}


class OptionsFileError(ValueError):
    """vllm_serve_options.txt is malformed: names the file and line."""


class ServeOptions:
    """The parsed options file: the top-level parser's name, options and
    subcommands, and ``vllm serve``'s usage, positional and options."""

    def __init__(self, prog: str, subcommands: list[str], serve_usage: str, top: list[tuple[list[str], str]],
                 positional: tuple[str, str], serve: list[tuple[list[str], str]]):
        self.prog, self.subcommands, self.serve_usage = prog, subcommands, serve_usage
        self.top, self.positional, self.serve = top, positional, serve

    def option_strings(self) -> set[str]:
        return {s for strings, _ in self.serve for s in strings}


def load_options(path: Path = OPTIONS_FILE) -> ServeOptions:
    meta: dict[str, str] = {}
    top: list[tuple[list[str], str]] = []
    serve: list[tuple[list[str], str]] = []
    positional = None
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            where = f"{path}:{n}"
            if line.startswith("@"):
                key, _, rest = line[1:].partition(" ")
                if key in ("prog", "subcommands", "serve-usage"):
                    meta[key] = rest.strip()
                    continue
                fields = rest.split()
                if key not in ("top", "positional") or len(fields) < 2:
                    raise OptionsFileError(f"{where}: unknown line {line!r}")
                if key == "positional":
                    positional = (fields[0], fields[1])
                else:
                    top.append((fields[0].split(","), fields[1]))
                continue
            fields = line.split()
            if len(fields) < 3:
                raise OptionsFileError(f"{where}: expected 'options arity source', got {line!r}")
            strings, arity = fields[0].split(","), fields[1]
            if not all(s.startswith("-") and len(s) > 1 for s in strings):
                raise OptionsFileError(f"{where}: not an option string in {fields[0]!r}")
            if arity not in ARITIES and not arity.isdigit():
                raise OptionsFileError(f"{where}: unknown arity {arity!r}")
            serve.append((strings, arity))
    missing = [k for k in ("prog", "subcommands", "serve-usage") if not meta.get(k)]
    if missing or positional is None or not serve:
        raise OptionsFileError(f"{path}: incomplete: missing {', '.join(missing) or ('@positional' if positional is None else 'options')}")
    subcommands = meta["subcommands"].split(",")
    if "serve" not in subcommands:
        raise OptionsFileError(f"{path}: @subcommands has no serve")
    return ServeOptions(meta["prog"], subcommands, meta["serve-usage"], top, positional, serve)


class _BooleanOptional(argparse.Action):
    """argparse.BooleanOptionalAction with its option strings as listed
    (``--x`` sets True, ``--no-x`` False)."""

    def __init__(self, option_strings, dest, **kwargs):
        kwargs.pop("nargs", None)
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, not option_string.startswith("--no-"))


def human_readable_int(value: str) -> int:
    """vllm/utils/argparse_utils.py: 1k = 1000, 1K = 1024 (k/m/g/t, K/M/G/T)."""
    value = value.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmMgGtT])", value)
    if m:
        number, suffix = m.groups()
        if suffix in "kmgt":
            return int(float(number) * 10 ** (3 * ("kmgt".index(suffix) + 1)))
        try:
            return int(number) * 2 ** (10 * ("KMGT".index(suffix) + 1))
        except ValueError:
            raise argparse.ArgumentTypeError(f"Decimals are not allowed with binary suffixes like {suffix}. "
                                             f"Did you mean to use {number}{suffix.lower()} instead?") from None
    return int(value)


def human_readable_int_or_auto(value: str) -> int:
    value = value.strip()
    return -1 if value == "-1" or value.lower() == "auto" else human_readable_int(value)


def _json(value: str):
    return json.loads(value)


_json.__name__ = "loads"  # argparse names the type in its error: "invalid loads value"

# The options this stand-in reads, with the types vLLM gives them (vllm/engine/arg_utils.py
# _compute_kwargs and add_cli_args; vllm/entrypoints/openai/cli_args.py FrontendArgs): a
# value of the wrong type fails in the parser, as in vLLM. The others are parsed for their
# arity only.
TYPES = {
    "port": int, "api_server_count": int, "tensor_parallel_size": int, "data_parallel_size": int,
    "data_parallel_size_local": int, "data_parallel_start_rank": int, "data_parallel_rpc_port": int,
    "data_parallel_rank": int, "max_model_len": human_readable_int_or_auto, "max_num_seqs": int,
    "max_num_batched_tokens": human_readable_int, "gpu_memory_utilization": float,
    "speculative_config": _json, "compilation_config": _json, "additional_config": _json,
}
# What the stand-in assumes when an option is not given (vLLM's defaults where it
# has one; the DP RPC port and host as the simulator has always used them)
DEFAULTS = {"host": "0.0.0.0", "port": 8000, "tensor_parallel_size": 1, "data_parallel_size": 1,
            "data_parallel_rpc_port": 13345, "data_parallel_start_rank": 0, "headless": False}
# vllm/entrypoints/cli/serve.py: "Defaults to Qwen/Qwen3-0.6B if no model is specified"
DEFAULT_MODEL = "Qwen/Qwen3-0.6B"


def _dest(strings: list[str]) -> str:
    long = next((s for s in strings if s.startswith("--")), strings[0])
    return long.lstrip("-").replace("-", "_")


def build_parser(spec: ServeOptions) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The top-level parser ``vllm`` (with every subcommand, so that its usage
    line is vLLM's) and ``vllm serve``'s, with every option of ``spec``."""
    top = argparse.ArgumentParser(prog=spec.prog)
    for strings, arity in spec.top:
        if arity == "version":
            top.add_argument(*strings, action="version", version="0.23.0")
    subs = top.add_subparsers(required=False, dest="subparser")
    serve = None
    for name in spec.subcommands:
        if name == "serve":
            serve = subs.add_parser(name, usage=spec.serve_usage)
        else:
            subs.add_parser(name)
    assert serve is not None
    serve.add_argument(spec.positional[0], nargs=spec.positional[1])
    for strings, arity in spec.serve:
        if arity == "help":
            continue  # argparse's own -h/--help
        dest = _dest(strings)
        kw: dict = {"dest": dest}
        if arity == "flag":
            kw.update(action="store_true")
        elif arity == "bool":
            kw.update(action=_BooleanOptional, default=None)
        else:
            if arity != "1":
                kw["nargs"] = int(arity) if arity.isdigit() else arity
            if dest in TYPES:
                kw["type"] = TYPES[dest]
        serve.add_argument(*strings, **kw)
    serve.set_defaults(**DEFAULTS)
    return top, serve


def _flexible(args: list[str]) -> list[str]:
    """What vLLM's FlexibleArgumentParser.parse_args does before argparse
    (vllm/utils/argparse_utils.py): ``--model X`` moved to the positional,
    ``--help=X`` read as ``--help``, underscores in option names read as
    dashes, ``-O3`` as ``--optimization-level 3``, and dotted options
    (``--compilation-config.mode 3``, ``--x.y+ a,b``) merged into one JSON value."""
    if args and args[0] == "serve":
        idx = next((i for i, a in enumerate(args) if re.match(r"^--model(=.+|$)", a)), None)
        if idx is not None:
            log("With `vllm serve`, you should provide the model as a positional argument or in a config file "
                "instead of via the `--model` option.", "WARNING")
            if args[idx] == "--model":
                tag, rest = (args[idx + 1] if idx + 1 < len(args) else None), idx + 2
            else:
                tag, rest = args[idx].removeprefix("--model="), idx + 1
            args = ["serve", *([tag] if tag is not None else []), *args[1:idx], *args[rest:]]
        if (len(args) > 1 and args[1].startswith("-") and not any(re.match(r"^--config(=.+|$)", a) for a in args)
                and any(re.match(r"^--served[-_]model[-_]name(=.+|$)", a) for a in args)):
            raise ValueError("`model` should be provided as the first positional argument when using `vllm serve`. "
                             "i.e. `vllm serve <model> --<arg> <value>`.")
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg.startswith("--help="):
            out.append("--help")
        elif arg.startswith("--"):
            key, eq, value = arg.partition("=")
            head, dot, tail = key[2:].partition(".")
            out.append("--" + head.replace("_", "-") + dot + tail + eq + value)
        elif arg.startswith("-O") and arg != "-O":
            out += ["--optimization-level", arg[3:] if arg[2:3] == "=" else arg[2:]]
        elif arg == "-O" and i + 1 < len(args) and args[i + 1] in {"0", "1", "2", "3"}:
            out.append("--optimization-level")
        else:
            out.append(arg)
    merged: dict[str, dict] = {}
    kept: list[str] = []
    skip = False
    for i, arg in enumerate(out):
        if skip:
            skip = False
            continue
        if arg.startswith("-") and "." in arg:
            if "=" in arg:
                name, value = arg.split("=", 1)
                if "." not in name:  # the dot was in the value
                    kept.append(arg)
                    continue
            elif i + 1 < len(out):
                name, value, skip = arg, out[i + 1], True
            else:
                kept.append(arg)
                continue
            if name.endswith("+"):
                name, value = name[:-1], json.dumps(value.split(","))
            key, *keys = name.split(".")
            try:
                parsed = json.loads(value)
            except ValueError:
                try:
                    parsed = human_readable_int(value)
                except (ValueError, argparse.ArgumentTypeError):
                    parsed = value
            nested = parsed
            for k in reversed(keys):
                nested = {k: nested}
            _merge(merged.setdefault(key, {}), nested)
            continue
        kept.append(arg)
    for key, value in merged.items():
        kept += [key, json.dumps(value)]
    return kept


def _merge(original: dict, update: dict) -> None:
    for k, v in update.items():
        if isinstance(v, dict) and isinstance(original.get(k), dict):
            _merge(original[k], v)
        elif isinstance(v, list) and isinstance(original.get(k), list):
            original[k] += v
        else:
            original[k] = v


def parse(argv: list[str], spec: ServeOptions | None = None) -> argparse.Namespace:
    """``vllm serve ...`` (``argv`` without ``vllm``) as vLLM 0.23.0 reads it: an
    option it does not have ends the process as argparse does (exit 2, the
    top-level parser's usage, ``vllm: error: unrecognized arguments: ...``);
    a bad value of an option this stand-in reads, as the ``serve`` parser does."""
    top, _ = build_parser(spec or load_options())
    a = top.parse_args(_flexible(list(argv)))
    if getattr(a, "model_tag", None) is not None:
        a.model = a.model_tag
    elif getattr(a, "subparser", None) == "serve" and a.model is None:
        a.model = DEFAULT_MODEL
    return a


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


def _stop_on_sigterm() -> None:
    """SIGTERM ends the server, as vLLM's does (uvicorn's shutdown on the API
    server; EngineCoreProc's signal_handler in a headless engine). In a
    container the server is process 1, for which the kernel ignores a signal
    without a handler: without this, docker stop waits its whole timeout."""
    import signal

    def stop(signum, frame):
        print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [sim-vllm] Shutting down (signal {signum})", flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)


def _shutdown_timeout(a: argparse.Namespace) -> float:
    """``--shutdown-timeout`` in seconds (vLLM's default 0: abort at once)."""
    try:
        return max(0.0, float(a.shutdown_timeout or 0))
    except (TypeError, ValueError):
        return 0.0


def _drain_on_sigterm(engine: "streaming.Engine", draining: threading.Event, timeout: float) -> None:
    """Node 0's SIGTERM once it serves, as vLLM 0.23's ``--shutdown-timeout``
    (vllm-project/vllm #34730, #36666): new requests and /health get 503;
    with 0 (the default) the requests in flight are aborted at once (their
    answers end with ``finish_reason`` ``abort``), else they may finish for up
    to ``timeout`` seconds before the rest are aborted; then the process exits 0."""

    def drain():
        draining.set()
        log("Shutting down FastAPI HTTP server.")
        if timeout > 0:
            engine.close()
            if not engine.wait_idle(timeout):
                log(f"shutdown timeout ({timeout:g}s) reached: aborting the requests still in flight", "WARNING")
                engine.abort()
        else:
            engine.abort()
        engine.wait_idle(5)
        print(f"INFO {time.strftime('%m-%d %H:%M:%S')} [sim-vllm] Shutting down (signal 15)", flush=True)
        os._exit(0)

    streaming.on_sigterm_once(drain)


def main(argv: list[str]) -> int:
    """``vllm ARGV``: only ``serve`` is simulated. An option ``vllm serve``
    does not have exits 2 with argparse's message, before anything starts."""
    _stop_on_sigterm()
    try:
        spec = load_options()
    except (OSError, OptionsFileError) as exc:
        print(f"sim-vllm: cannot read the options of vllm serve: {exc}", file=sys.stderr)
        return 1
    if "--config" in argv or any(x.startswith("--config=") for x in argv):
        # vLLM reads the YAML file into options before parsing; Debian's python3 has no YAML reader
        print("sim-vllm: --config FILE is not simulated: pass the options on the command line", file=sys.stderr)
        return 2
    try:
        a = parse(argv, spec)  # argparse's refusals exit 2 from here
    except ValueError as exc:  # FlexibleArgumentParser's own (a traceback in vLLM)
        print(f"ValueError: {exc}", file=sys.stderr)
        return 1
    if a.subparser != "serve":
        if a.subparser is None:
            build_parser(spec)[0].print_help()
            return 0
        print(f"sim-vllm: `vllm {a.subparser}` is not simulated; only `vllm serve` is", file=sys.stderr)
        return 2
    # vllm/entrypoints/openai/cli_args.py validate_parsed_serve_args, then ServeSubcommand.cmd
    if a.enable_auto_tool_choice and not a.tool_call_parser:
        print("TypeError: Error: --enable-auto-tool-choice requires --tool-call-parser", file=sys.stderr)
        return 1
    if a.enable_log_outputs and not a.enable_log_requests:
        print("TypeError: Error: --enable-log-outputs requires --enable-log-requests", file=sys.stderr)
        return 1
    if a.headless and a.api_server_count is not None and a.api_server_count > 0:
        print(f"ValueError: --api-server-count={a.api_server_count} cannot be used with --headless "
              "(no API servers are started in headless mode).", file=sys.stderr)
        return 1
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
        while not front.ready.wait(0.2):  # vLLM waits for remote engines with no deadline (slices: SIGTERM's handler runs)
            pass
    else:
        front.ready.set()
    log("All DP ranks joined; starting the API server")
    # --served-model-name takes one or more names: /v1/models lists each, any of them answers
    names = list(a.served_model_name or [a.model])
    engine = streaming.Engine(max_running=a.max_num_seqs)
    draining = threading.Event()

    class Handler(streaming.json_handler()):

        def log_message(self, fmt, *args):
            log(f'{self.client_address[0]} "{self.requestline}" {args[1] if len(args) > 1 else ""}')

        def do_GET(self):
            if self.path == "/health":
                if draining.is_set():
                    return self._send(503, {"error": "server shutting down"})
                return self._send(200, b"") if front.healthy() else self._send(503, {"error": "engine dead"})
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "vllm", "root": a.model, "max_model_len": a.max_model_len} for name in names]})
            if self.path == "/metrics":
                return self._send(200, streaming.vllm_metrics(engine, names[0]), streaming.PROMETHEUS_TYPE)
            return self._send(404, {"detail": "Not Found"})

        def do_POST(self):
            try:
                req = self._json_body()
            except ValueError:
                return self._send(400, {"error": {"message": "invalid JSON"}})
            if self.path != "/v1/chat/completions":
                return self._send(404, {"detail": "Not Found"})
            if draining.is_set():
                return self._send(503, {"error": {"message": "The server is shutting down.", "type": "ServiceUnavailableError", "code": 503}})
            if not front.healthy():
                return self._send(503, {"error": {"message": "engine dead"}})
            if req.get("model") not in names:
                return self._send(404, {"error": {"message": f"The model `{req.get('model')}` does not exist.", "code": 404}})
            try:
                limit = streaming.max_tokens_of(req)
            except streaming.BadRequest as exc:
                return self._send(400, {"error": {"message": str(exc), "type": "BadRequestError", "param": None, "code": 400}})
            thinking = (req.get("chat_template_kwargs") or {}).get("enable_thinking", True)
            text = ("<think>\nThe user wants a merge of two sorted linked lists; walk both with a dummy head.\n</think>\n\n" if thinking else "") + (
                "def merge(a, b):\n    dummy = tail = ListNode()\n    ..."
            )
            answer = streaming.plan([("content", text)], limit, streaming.ignore_eos_of(req))
            prompt = streaming.prompt_tokens(req)
            lat = streaming.read_latency(STATE_DIR)
            served_as = req["model"]
            cid = f"chatcmpl-sim{int(time.time() * 1000)}"
            created = int(time.time())
            try:
                r = engine.request(prompt)
            except streaming.Closed:
                return self._send(503, {"error": {"message": "The server is shutting down.", "type": "ServiceUnavailableError", "code": 503}})
            with r:
                try:
                    if req.get("stream"):
                        return self._stream(r, answer, lat, req, cid, created, served_as)
                    ok = streaming.generate(r, answer, lat)
                    finish = answer.finish_reason if ok else "abort"
                    r.finish(finish)
                    return self._send(200, {"id": cid, "object": "chat.completion", "created": created, "model": served_as,
                                            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer.text("content", r.generated) or ""},
                                                         "finish_reason": finish}],
                                            "usage": streaming.usage(prompt, r.generated)})
                except streaming.DISCONNECTED:
                    streaming.gone(self)

        def _stream(self, r, answer, lat, req, cid, created, served_as):
            sse = streaming.SSE(self, [("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked")])

            def chunk(delta, finish=None):
                return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": served_as,
                        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

            def emit(field, piece):
                if r.generated == 1:  # vLLM's first chunk names the role
                    sse.event(chunk({"role": "assistant", "content": ""}))
                sse.event(chunk({field: piece}))

            ok = streaming.generate(r, answer, lat, emit)
            finish = answer.finish_reason if ok else "abort"
            r.finish(finish)  # out of the batch before the client sees the end
            if r.generated == 0:
                sse.event(chunk({"role": "assistant", "content": ""}))
            sse.event(chunk({}, finish))
            if streaming.include_usage(req):
                sse.event({"id": cid, "object": "chat.completion.chunk", "created": created, "model": served_as, "choices": [],
                           "usage": streaming.usage(r.prompt, r.generated)})
            sse.done()

    try:
        httpd = streaming.http_server((a.host, a.port), Handler)
    except OSError as exc:
        print(f"OSError: [Errno {exc.errno}] error while attempting to bind on address ('{a.host}', {a.port}): {exc.strerror}", flush=True)
        return 1
    _drain_on_sigterm(engine, draining, _shutdown_timeout(a))
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
