"""A simulated ``all_reduce_perf`` (NVIDIA/nccl-tests), one rank of a real MPI job.

There is no GPU here, so no all-reduce is computed; everything around it is
what the real program does, so that a launch that would break a real cluster
breaks here too. The references are nccl-tests 2.19.6 (``src/common.cu``
``run()``, ``src/util.cu``, ``src/common.h``, ``src/all_reduce.cu``) and
NCCL (``src/bootstrap.cc``, ``src/misc/socket.cc``, ``src/os/linux.cc``,
``src/debug.cc``, ``src/init.cc``), both on github.com/NVIDIA.

One process is one rank: its rank and the world's size come from the
launcher (``OMPI_COMM_WORLD_RANK``/``_SIZE``, else ``PMI_RANK``/``PMI_SIZE``),
its GPU from its local rank (common.cu: ``localRank * nThreads * nGpus``).
The ranks meet over TCP in the two steps nccl-tests takes:

1. MPI (``MPI_Gather`` of the device lines, ``MPI_Bcast`` of the NCCL unique
   id): rank 0 listens on mpirun's host at a port derived from the job id,
   the other ranks find it at the addresses of ``OMPI_MCA_orte_hnp_uri``
   (mpirun's own daemon, on the interfaces ``oob_tcp_if_include`` allows;
   sim.standins.trtllm explains the derivation). A world launched by another
   mpirun, or with rank 0 elsewhere, never meets.
2. NCCL's bootstrap (``ncclGetUniqueId`` on rank 0, ``ncclCommInitRank`` on
   every rank): each rank picks its interface from its own
   ``NCCL_SOCKET_IFNAME`` as NCCL does (prefix match, ``=`` exact, ``^``
   excluded; only interfaces that are running and have an address; unset:
   ``ib``, then anything but ``docker``/``lo``/``virbr``, then those). None
   found fails that rank with NCCL's ``Bootstrap : no socket interface
   found`` (bootstrap.cc ``bootstrapNetInit``, run first by every NCCL call;
   NCCL's socket transport says ``NET/Socket : no interface found`` when it
   gets that far). Rank 0 listens on its interface's address; every other
   rank connects to it from its own interface's address.

Over that connection each rank tells rank 0 what its node's ``node.json``
says of the fabric (``nccl``: ``busbw``, the node's bus bandwidth in GB/s,
default 370; ``wrong``, wrong elements per rank of this node; ``join_timeout_s``,
default 120), and gets the world's result back: the busbw of the slowest
node, the wrong elements summed over the ranks (common.cu's ``Allreduce`` of
``wrongElts``), the error count (one per rank, size and in/out-of-place
with wrong data). Only rank 0 prints the table and its footer, in
nccl-tests' format; every rank exits as the real one does: 0, or 7
(``testNumResults``) when there were wrong values or the average busbw is
below 0.9 x ``NCCL_TESTS_MIN_BW``, or 3 (``testNcclError``) when NCCL failed.
A rank whose peer is gone waits for mpirun to end the job, as a real rank
blocked in MPI does. Standard library only.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import struct
import sys
import time

from .nccl import NCCL_INVALID_USAGE, find_interfaces, local_interfaces  # noqa: F401 (NCCL's rules, shared)
from .trtllm import rendezvous_of, world_of

STATE_DIR = os.environ.get("LLMDEPLOY_SIM_STATE", "/etc/llmdeploy-sim")
VERSION = "2.19.6"
NCCL_VERSION_CODE = 22803  # NCCL 2.28.3, as nccl-tests prints it (nccl-headers=, nccl-library=)
PROGRAM = "all_reduce_perf"

# nccl-tests src/common.h testResult_t
TEST_SUCCESS, TEST_NCCL_ERROR, TEST_NOT_IMPLEMENTED, TEST_NUM_RESULTS = 0, 3, 5, 7
# nccl-tests src/common.cu: where the failures below are reported (line numbers of 2.19.6)
LINE_GET_UNIQUE_ID, LINE_COMM_INIT, LINE_INIT_COMMS, LINE_MAIN = 1550, 217, 1620, 1454
# NCCL src/init.cc ncclGetErrorString
NCCL_REMOTE_ERROR = "remote process exited or there was a network error"

# nccl-tests src/common.cu: getopt_long's short options (every one takes a value but -h)
OPTIONS = "t:g:b:e:i:f:n:m:w:N:p:I:K:c:o:d:r:z:y:T:hG:C:a:R:x:D:V:J:S:M:u:"
LONG = {"nthreads": "t", "ngpus": "g", "minbytes": "b", "maxbytes": "e", "stepbytes": "i", "stepfactor": "f",
        "iters": "n", "agg_iters": "m", "warmup_iters": "w", "run_cycles": "N", "parallel_init": "p", "check": "c",
        "op": "o", "datatype": "d", "root": "r", "blocking": "z", "stream_null": "y", "timeout": "T", "cudagraph": "G",
        "report_cputime": "C", "report_timestamps": "S", "output_file": "J", "average": "a", "local_register": "R",
        "cta_policy": "x", "device_implementation": "D", "device_cta_count": "V", "memory": "M", "unalign": "u",
        "per_iter_timing": "I", "per_iter_skip": "K", "help": "h"}
# its usage text, abridged to the options above that verify-comm's arguments use
USAGE = ("USAGE: all_reduce_perf \n\t[-t,--nthreads <num threads>] \n\t[-g,--ngpus <gpus per thread>] \n\t"
         "[-b,--minbytes <min size in bytes>] \n\t[-e,--maxbytes <max size in bytes>] \n\t[-i,--stepbytes <increment size>] \n\t"
         "[-f,--stepfactor <increment factor>] \n\t[-n,--iters <iteration count>] \n\t[-m,--agg_iters <aggregated iteration count>] \n\t"
         "[-w,--warmup_iters <warmup iteration count>] \n\t[-c,--check <check iteration count>] \n\t[-h,--help]\n")
MIB = 1024 * 1024


class Usage(Exception):
    """A command line all_reduce_perf does not run with: what it prints on
    stderr (getopt's complaint) and stdout (nccl-tests' usage), its exit status."""

    def __init__(self, err: str, out: str, code: int):
        super().__init__(err or out)
        self.err, self.out, self.code = err, out, code


def _bad_option(getopt_says: str) -> Usage:
    # getopt_long complains on stderr and returns '?'; nccl-tests then prints
    # "invalid option '?'" and its usage, and returns 0 (common.cu main)
    return Usage(f"all_reduce_perf: {getopt_says}\n", "invalid option '?'\n" + USAGE, 0)


# --- the command line (nccl-tests src/common.cu main, parsesize) ------------------------------
def parse_size(text: str) -> float:
    """parsesize(): a number with an optional K/M/G (binary) suffix; -1 when unreadable."""
    t = text.strip()
    units = {"k": 1024, "m": MIB, "g": 1024 * MIB}
    try:
        if t[-1:].lower() in units:
            return float(t[:-1]) * units[t[-1].lower()]
        return float(t)
    except ValueError:
        return -1.0


def parse_args(argv: list[str]) -> dict:
    """The options nccl-tests reads (defaults from common.cu); Usage when refused."""
    o = {"t": 1, "g": 1, "b": 32 * MIB, "e": 32 * MIB, "i": MIB, "f": 1, "n": 20, "m": 1, "w": 1, "c": 1, "G": 0}
    takes = {c for i, c in enumerate(OPTIONS) if c != ":" and OPTIONS[i + 1:i + 2] == ":"}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and len(a) > 2:
            name, eq, value = a[2:].partition("=")
            c = LONG.get(name)
            if c is None:
                raise _bad_option(f"unrecognized option '{a}'")
        elif a.startswith("-") and len(a) > 1:
            c, value = a[1], a[2:]
            eq = "=" if value else ""
            if c not in takes and c != "h":
                raise _bad_option(f"invalid option -- '{c}'")
        else:
            i += 1  # GNU getopt moves operands to the end; nccl-tests ignores them
            continue
        if c == "h":
            raise Usage("", USAGE, 0)
        if not eq:
            if i + 1 >= len(argv):
                raise _bad_option(f"option requires an argument -- '{c}'")
            value = argv[i + 1]
            i += 1
        i += 1
        if c in "bei":
            size = parse_size(value)
            if size < 0:
                name = {"b": "minbytes", "e": "maxbytes", "i": "stepBytes"}[c]
                raise Usage(f"invalid size specified for '{name}'\n", "", 255)
            o[c] = int(size)
        elif c in "tgfnmwcG":
            try:
                o[c] = int(value, 0)
            except ValueError:
                o[c] = 0  # strtol: no digits is 0
    if o["b"] > o["e"]:
        raise Usage(f"invalid sizes for 'minbytes' and 'maxbytes': {o['b']} > {o['e']}\n", "", 255)
    return o


def sizes(o: dict) -> list[int]:
    """The message sizes of the table, smallest first (common.cu TimeTest)."""
    out, size = [], o["b"]
    while size <= o["e"]:
        out.append(size)
        if o["f"] > 1:
            size *= o["f"]
        elif o["i"] > 0:
            size += o["i"]
        else:
            break
    return out


# --- what nccl-tests prints (src/util.cu) ------------------------------------------------------
def float_str(value: float, width: int) -> str:
    """getFloatStr(): %.2f, else %.1f, %.0f, %.1e (%.0e below width 7), whatever fits ``width``."""
    for fmt in ("%*.2f", "%*.1f", "%*.0f"):
        s = fmt % (width, value)
        if len(s) <= width:
            return s
    return ("%*.1e" if width >= 7 else "%*.0e") % (width, value)


def header(o: dict) -> str:
    """writeDeviceReport()'s first lines."""
    step = f"{o['f']}(factor)" if o["f"] > 1 else f"{o['i']}(bytes)"
    return (f"# nccl-tests version {VERSION} nccl-headers={NCCL_VERSION_CODE} nccl-library={NCCL_VERSION_CODE}\n"
            f"# Collective test starting: {PROGRAM}\n"
            f"# nThread {o['t']} nGpus {o['g']} minBytes {o['b']} maxBytes {o['e']} step: {step} warmup iters: {o['w']} "
            f"iters: {o['n']} agg iters: {o['m']} validation: {o['c']} graph: {o['G']} unalign: 0\n#\n# Using devices\n")


def device_lines(rank0: int, pid: int, host: str, devices: list[int], gpus: list[dict]) -> str:
    """One ``#  Rank`` line per GPU of a process (writeDeviceReport)."""
    out = []
    for k, d in enumerate(devices):
        g = gpus[d]
        bus = g.get("bus_id", "0000:00:00.0").split(":")
        domain, busno, dev = int(bus[-3], 16) & 0xFFFF, int(bus[-2], 16), int(bus[-1].split(".")[0], 16)
        out.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%04x:%02x:%02x] %s\n"
                   % (rank0 + k, 0, pid, host, d, domain, busno, dev, g.get("name", "NVIDIA GPU")))
    return "".join(out)


def table_header() -> str:
    """writeResultHeader() without per-iteration timing or timestamps."""
    return ("#\n"
            + "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          \n" % ("", "", "", "", "")
            + "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s\n"
            % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong", "")
            + "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %s\n"
            % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "", ""))


def busbw_at(peak: float, size: int) -> float:
    """The simulated bus bandwidth at one message size: small messages are
    latency-bound, large ones approach the fabric's ``peak``."""
    return peak * size / (size + 64 * MIB)


def table(o: dict, nranks: int, peak: float, wrong: int) -> tuple[str, float]:
    """The rows (writeBenchmarkLinePreamble/-Body/-Terminator: out-of-place,
    then in-place) and the average busbw the footer reports. busbw = algbw x
    2(n-1)/n (all_reduce.cu AllReduceGetBw): 0 in a world of one rank."""
    factor = 2.0 * (nranks - 1) / nranks
    rows, total = [], 0.0
    for size in sizes(o):
        count = size // 4  # float
        bus = busbw_at(peak, size)
        alg = bus / factor if factor else bus
        bus = alg * factor
        usec = (count * 4) / 1e9 / alg * 1e6 if alg > 0 else 0.0
        body = "  %7s  %6s  %6s  %6g" % (float_str(usec, 7), float_str(alg, 6), float_str(bus, 6), wrong)
        rows.append("%12d  %12d  %8s  %6s  %6s" % (count * 4, count, "float", "sum", "%6i" % -1) + body + body + "\n")
        total += 2 * bus
    return "".join(rows), total / (2 * len(rows)) if rows else 0.0


def footer(errors: int, avg: float, floor: float | None) -> str:
    """writeResultFooter(), finalizeFooter() and writeErrors() without an NCCL error."""
    verdict = "" if floor is None else ("FAILED" if avg < floor * 0.9 else "OK")
    return ("# %-20s : %d %s\n" % ("Out of bounds values", errors, "FAILED" if errors else "OK")
            + "# %-20s : %g %s\n" % ("Avg bus bandwidth", avg, verdict)
            + f"#\n# Collective test concluded: {PROGRAM}\n#\n\n")


def result(o: dict, nranks: int, peak: float, wrong_per_rank: list[int], floor: float | None) -> tuple[str, int]:
    """Rank 0's table and footer for a world, and the exit status of every rank."""
    wrong = sum(wrong_per_rank)
    rows, avg = table(o, nranks, peak, wrong)
    # CheckData: one error per rank with wrong data, per size, out-of-place and in-place; summed over the ranks
    errors = sum(1 for w in wrong_per_rank if w) * 2 * len(sizes(o))
    failed = bool(errors) or (floor is not None and avg < floor * 0.9)
    return table_header() + rows + footer(errors, avg, floor), TEST_NUM_RESULTS if failed else TEST_SUCCESS


# --- NCCL's and nccl-tests' failure lines ------------------------------------------------------
def warn(host: str, where: str, func: str, msg: str, dev: int = 0) -> str:
    """NCCL's WARN line (src/debug.cc): ``host:pid:tid [dev] file:line (func) NCCL WARN msg``."""
    pid = os.getpid()
    return f"{host}:{pid}:{pid} [{dev}] {where} ({func}) NCCL WARN {msg}\n"


def nccl_failure(host: str, line: int, error: str, last: str) -> str:
    """NCCLCHECK's line (nccl-tests src/common.h, NCCL >= 2.13)."""
    return f"{host}: Test NCCL failure common.cu:{line} '{error} / {last}'\n"


def test_failure(host: str, line: int) -> str:
    """TESTCHECK's line (nccl-tests src/common.h)."""
    return f" .. {host} pid {os.getpid()}: Test failure common.cu:{line}\n"


def no_interface(host: str, dev: int, line: int) -> str:
    msg = "Bootstrap : no socket interface found"
    out = warn(host, "bootstrap.cc:126", "bootstrapNetInit", msg, dev) + nccl_failure(host, line, NCCL_INVALID_USAGE, msg)
    if line == LINE_COMM_INIT:
        out += test_failure(host, LINE_INIT_COMMS)
    return out + test_failure(host, LINE_MAIN)


# --- the world --------------------------------------------------------------------------------
def _node() -> dict | None:
    try:
        with open(os.path.join(STATE_DIR, "node.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as exc:
        print(f"sim all_reduce_perf: this host's node.json cannot be read: {exc}", file=sys.stderr, flush=True)
        return None


def _atof(text: str) -> float:
    """C's atof(): the leading number, 0 without one."""
    m = re.match(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text)
    return float(m.group(0)) if m else 0.0


def _send(sock: socket.socket, msg: dict) -> None:
    sock.sendall((json.dumps(msg) + "\n").encode())


# connect() errors NCCL retries (src/os/linux.cc socketConnectCheck); any other fails at once
RETRIED = {errno.EINTR, errno.EWOULDBLOCK, errno.EAGAIN, errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ECONNREFUSED}


def _connect(addrs: list[str], port: int, deadline: float, source: str | None = None) -> tuple[socket.socket | None, str]:
    """A connection to the first of ``addrs`` that answers, from ``source``
    when given; refused or unreachable peers are tried again until
    ``deadline``. (None, the last error) when none answered."""
    last, pause = "no address", 0.05
    while True:
        for a in addrs:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                if source:
                    s.bind((source, 0))
                s.settimeout(5)
                s.connect((a, port))
                s.settimeout(None)
                return s, ""
            except socket.timeout:
                s.close()
                last = os.strerror(errno.ETIMEDOUT)
            except OSError as exc:
                s.close()
                last = exc.strerror or str(exc)
                if exc.errno not in RETRIED:
                    return None, last
        if time.monotonic() > deadline:
            return None, last
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def _accept(srv: socket.socket, want: int, deadline: float, world: str) -> dict[int, tuple[socket.socket, dict]]:
    """Until ``want`` ranks of ``world`` have said hello: {rank: (connection, hello)}."""
    got: dict[int, tuple[socket.socket, dict]] = {}
    while len(got) < want:
        srv.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            break
        conn.settimeout(30)
        try:
            line = conn.makefile("r").readline()
            hello = json.loads(line) if line else {}
        except (OSError, ValueError):
            hello = {}
        if hello.get("world") != world or not isinstance(hello.get("rank"), int) or hello["rank"] in got:
            conn.close()  # another world's, or garbage
            continue
        conn.settimeout(None)
        got[hello["rank"]] = (conn, hello)
    return got


def _wait_to_be_ended(seconds: float) -> int:
    """A rank whose peer is gone blocks, as one in MPI does, until mpirun ends the job."""
    time.sleep(seconds)
    print("sim all_reduce_perf: the world's other ranks are gone and mpirun did not end this rank", file=sys.stderr, flush=True)
    return 1


def _read(conn: socket.socket) -> dict | None:
    try:
        line = conn.makefile("r").readline()
        return json.loads(line) if line else None
    except (OSError, ValueError):
        return None


def main(argv: list[str]) -> int:
    try:
        o = parse_args(argv)
    except Usage as u:
        print(u.err, end="", file=sys.stderr, flush=True)
        print(u.out, end="", flush=True)
        return u.code
    env = os.environ
    rank, size, local_rank, _ = world_of(env)
    host = os.uname().nodename
    hw = _node()
    if hw is None:
        return 1
    nccl = hw.get("nccl") or {}
    peak, wrong = float(nccl.get("busbw", 370.0)), int(nccl.get("wrong", 0))
    timeout = float(nccl.get("join_timeout_s", 120))
    deadline = time.monotonic() + timeout
    gpus = hw.get("gpus") or []
    per = o["t"] * o["g"]
    if per < 1:
        print(f"sim all_reduce_perf: -t {o['t']} -g {o['g']}: no GPU for this process", file=sys.stderr, flush=True)
        return 1
    devices = [local_rank * per + k for k in range(per)]
    if devices[-1] >= len(gpus):
        print(f"Invalid number of GPUs: {devices[-1] + 1} requested but only {len(gpus)} were found.\n"
              "Please check the number of processes and GPUs per process.", file=sys.stderr, flush=True)
        print(test_failure(host, LINE_MAIN), end="", flush=True)
        return TEST_NOT_IMPLEMENTED
    mine = device_lines(rank * per, os.getpid(), host, devices, gpus)
    floor_text = env.get("NCCL_TESTS_MIN_BW")  # common.cu: atof(), unset is -1 (no floor)
    floor = _atof(floor_text) if floor_text is not None else None
    ifname = env.get("NCCL_SOCKET_IFNAME")

    if size == 1:
        print(header(o) + mine, end="", flush=True)
        if not find_interfaces(ifname, local_interfaces()):
            print(no_interface(host, devices[0], LINE_GET_UNIQUE_ID), end="", flush=True)
            return TEST_NCCL_ERROR
        text, code = result(o, per, peak, [wrong] * per, floor)
        print(text, end="", flush=True)
        if code:
            print(test_failure(host, LINE_MAIN), end="", flush=True)
        return code

    rdv = rendezvous_of(env)
    if rdv is None:
        print(f"sim all_reduce_perf: rank {rank} of {size} cannot find rank 0: no OMPI_MCA_orte_hnp_uri in its environment",
              file=sys.stderr, flush=True)
        return 1
    if rank == 0:
        return _rank0(o, rdv, size, per, host, devices, mine, ifname, peak, wrong, floor, deadline, timeout)
    return _rank(rdv, rank, host, devices, mine, ifname, peak, wrong, deadline, timeout)


def _rank0(o, rdv, size, per, host, devices, mine, ifname, peak, wrong, floor, deadline, timeout) -> int:
    world = rdv["world"]
    mpi = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    mpi.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        mpi.bind(("0.0.0.0", rdv["port"]))
    except OSError as exc:
        print(f"sim all_reduce_perf: rank 0 on {host} cannot listen on port {rdv['port']} for world {world}: {exc.strerror}",
              file=sys.stderr, flush=True)
        return 1
    mpi.listen(512)
    # MPI_Gather of the device lines, in rank order
    peers = _accept(mpi, size - 1, deadline, world)
    if len(peers) < size - 1:
        missing = sorted(set(range(1, size)) - set(peers))
        print(f"sim all_reduce_perf: ranks {missing} of world {world} never reached rank 0 on {host}", file=sys.stderr, flush=True)
        return _wait_to_be_ended(timeout)
    lines = [mine] + [peers[r][1].get("devices", "") for r in range(1, size)]
    print(header(o) + "".join(lines), end="", flush=True)
    # ncclGetUniqueId: rank 0's interface, where the bootstrap root listens
    found = find_interfaces(ifname, local_interfaces())
    if not found:
        print(no_interface(host, devices[0], LINE_GET_UNIQUE_ID), end="", flush=True)
        return TEST_NCCL_ERROR  # the other ranks wait in MPI_Bcast until mpirun ends them
    root = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    root.bind((found[0][1], 0))
    root.listen(512)
    addr = root.getsockname()
    for conn, _ in peers.values():  # MPI_Bcast of the unique id
        _send(conn, {"root": [addr[0], addr[1]]})
    # ncclCommInitRank: rank 0 joins its own root; every other rank connects from its interface
    joined = _accept(root, size - 1, deadline, world)
    if len(joined) < size - 1:
        missing = sorted(set(range(1, size)) - set(joined))
        print(warn(host, "bootstrap.cc:360", "bootstrapRoot", f"Bootstrap Root : ranks {missing} of {size} never checked in", devices[0]),
              end="", flush=True)
        return _wait_to_be_ended(timeout)
    hellos = [{"busbw": peak, "wrong": wrong, "host": host}] + [joined[r][1] for r in range(1, size)]
    world_peak = min(float(h["busbw"]) for h in hellos)
    wrong_per_rank = [int(h["wrong"]) for h in hellos for _ in range(per)]
    text, code = result(o, size * per, world_peak, wrong_per_rank, floor)
    print(text, end="", flush=True)
    # the others end only now (MPI_Finalize): rank 0's table is out before mpirun sees any rank's exit
    for conn, _ in joined.values():
        _send(conn, {"code": code})
    if code:
        print(test_failure(host, LINE_MAIN), end="", flush=True)
    return code


def _rank(rdv, rank, host, devices, mine, ifname, peak, wrong, deadline, timeout) -> int:
    world = rdv["world"]
    mpi, why = _connect(rdv["addrs"], rdv["port"], deadline)
    if mpi is None:
        print(f"sim all_reduce_perf: rank {rank} on {host} could not reach rank 0 at "
              + ",".join(f"{a}:{rdv['port']}" for a in rdv["addrs"]) + f" (mpirun's host): {why}", file=sys.stderr, flush=True)
        return 1
    _send(mpi, {"world": world, "rank": rank, "devices": mine})
    got = _read(mpi)  # MPI_Bcast of the unique id
    if not got or "root" not in got:
        return _wait_to_be_ended(timeout)
    found = find_interfaces(ifname, local_interfaces())
    if not found:
        print(no_interface(host, devices[0], LINE_COMM_INIT), end="", flush=True)
        return TEST_NCCL_ERROR
    (ip, port) = got["root"]
    conn, why = _connect([ip], port, deadline, source=found[0][1])
    if conn is None:
        print(warn(host, "socket.cc:302", "socketConnectCheck",
                   f"ncclSocketConnect: connect to {ip}<{port}> failed : {why}", devices[0])
              + nccl_failure(host, LINE_COMM_INIT, NCCL_REMOTE_ERROR, "ncclSocketConnect: connect failed")
              + test_failure(host, LINE_INIT_COMMS) + test_failure(host, LINE_MAIN), end="", flush=True)
        return TEST_NCCL_ERROR
    _send(conn, {"world": world, "rank": rank, "busbw": peak, "wrong": wrong, "host": host})
    done = _read(conn)
    if done is None:
        return _wait_to_be_ended(timeout)
    code = int(done.get("code", 1))
    if code:
        print(test_failure(host, LINE_MAIN), end="", flush=True)
    return code
