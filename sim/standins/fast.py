"""Answers rendered ahead of time, so that a hardware stand-in costs a few
milliseconds instead of a Python start (about 80 ms, ~128 of them per A3 node
in verify-comm).

The answer of ``npu-smi``, ``hccn_tool``, ``nvidia-smi``, ``lscpu``,
``numactl -H`` and ``ibstat`` is a pure function of the
host's ``node.json`` and the arguments. :func:`render` computes every answer
the tool asks for, with the same Python code that answers a call, into
``<state>/out.<n>/`` and points the symlink ``<state>/out`` at it; its
``stamp`` file carries node.json's modification time (nanoseconds). The
host-side wrapper (:func:`wrapper`, bash) serves ``out/<key>`` when node.json's
time equals the stamp's, else runs the Python stand-in, which answers and
renders again (so editing node.json, the way tests inject faults, takes effect
on the next call). Arguments outside a plain character set, tools named in
node.json's ``hang`` and everything stateful (pings) always go to Python.
(Docker is the real Docker Engine: sim/dockerd.py.)

An entry is ``<key>`` (stdout), plus ``<key>.err`` (stderr) and ``<key>.rc``
(exit status) when they are not empty and 0. The key is
``TOOL+<argc>+ARG1+ARG2...``, as bash builds it with ``IFS=+; "$*"``.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import shlex
import time

# what a key may contain (and so what bash accepts as a cached call)
SAFE_ARG = re.compile(r"[A-Za-z0-9,._=-]*")
MAX_KEY = 200
CACHED_TOOLS = ("npu-smi", "hccn_tool", "nvidia-smi", "lscpu", "numactl", "ibstat")
HCCN_ITEMS = ["-ip", "-vnic", "-link", "-net_health", "-netdetect", "-gateway", "-lldp", "-tls", "-optical"]
NVSMI_QUERY = "--query-gpu=index,name,uuid,memory.total,pci.bus_id,ecc.errors.uncorrected.volatile.total"


def key(tool: str, argv: list[str]) -> str | None:
    """The cache key of a call, or None when the call is not cacheable by its arguments."""
    if not all(SAFE_ARG.fullmatch(a) for a in argv):
        return None
    k = "+".join([tool, str(len(argv)), *argv])
    return k if len(k) < MAX_KEY else None


def _hung(tool: str, hw: dict) -> bool:
    hang = hw.get("hang")
    return bool(hang and (not isinstance(hang, dict) or hang.get(tool)))


def gpu_denied(path: str) -> bool:
    """Whether this process may not open a GPU's device file: a Slurm step's
    device cgroup denies the GPUs it did not ask for (ConstrainDevices) with
    EPERM. Opening an allowed one fails too on these hosts (no driver: ENXIO),
    and a host outside Slurm has no such file: neither is a denial."""
    try:
        os.close(os.open(path, os.O_RDWR))
    except OSError as e:
        return e.errno == errno.EPERM
    return False


def gpus_denied(dev: str = "/dev") -> bool:
    """Whether this process may not open one of the node's GPU device files (``/dev/nvidiaN``)."""
    try:
        names = [n for n in os.listdir(dev) if n.startswith("nvidia") and n[6:].isdigit()]
    except OSError:
        return False
    return any(gpu_denied(os.path.join(dev, n)) for n in names)


def cacheable(tool: str, argv: list[str], hw: dict) -> bool:
    """Whether a call's answer is a function of node.json and its arguments only
    (nvidia-smi's is not when the caller may not open every GPU)."""
    if tool not in CACHED_TOOLS or key(tool, argv) is None or _hung(tool, hw):
        return False
    if tool == "nvidia-smi" and gpus_denied():
        return False
    if tool == "numactl":
        return argv in (["-H"], ["--hardware"])
    return True


def calls(hw: dict) -> list[tuple[str, list[str]]]:
    """The calls the tool makes (facts, prepare, verify-comm), rendered up front."""
    out: list[tuple[str, list[str]]] = [
        ("lscpu", []), ("lscpu", ["-e=CPU,NODE"]), ("numactl", ["-H"]),
    ]
    if hw.get("npus"):
        out += [("npu-smi", ["info"]), ("npu-smi", ["info", "-t", "topo"]), ("npu-smi", ["info", "-l"])]
        for n in hw["npus"]:
            out += [("hccn_tool", ["-i", str(n["id"]), item, "-g"]) for item in HCCN_ITEMS]
    if hw.get("gpus") or hw.get("platform") in ("b200", "b300", "gb200", "gb300", "h100", "h200"):
        out += [
            ("nvidia-smi", [NVSMI_QUERY, "--format=csv,noheader,nounits"]),
            # invoke top's query (platforms.nvidia.GPU_QUERY)
            ("nvidia-smi", ["--query-gpu=index,utilization.gpu,memory.used,memory.total", "--format=csv,noheader,nounits"]),
            ("nvidia-smi", ["topo", "-m"]),
            ("nvidia-smi", ["-L"]),
            ("nvidia-smi", []),
            ("ibstat", []),
        ]
    return [(t, a) for t, a in out if cacheable(t, a, hw)]


def answer(fn, argv: list[str]) -> tuple[str, str, int]:
    """Run a stand-in function, capturing what it prints."""
    o, e = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):
        rc = fn(argv)
    return o.getvalue(), e.getvalue(), int(rc or 0)


def _write_entry(d: str, k: str, out: str, err: str, rc: int) -> None:
    tmp = os.path.join(d, f".{k}.{os.getpid()}")
    for suffix, text in ((".err", err), (".rc", f"{rc}\n" if rc else "")):
        if text:
            with open(tmp + suffix, "w") as f:
                f.write(text)
            os.replace(tmp + suffix, os.path.join(d, k + suffix))
    with open(tmp, "w") as f:
        f.write(out)
    # stdout last: the wrapper looks for it first
    os.replace(tmp, os.path.join(d, k))


def _current(state: str, name: str = "out") -> tuple[str, int] | None:
    """(the directory ``state/name`` points at, the time of the node.json it was made from)."""
    d = os.path.join(state, name)
    try:
        return os.path.realpath(d), os.stat(os.path.join(d, "stamp")).st_mtime_ns
    except OSError:
        return None


def render(state: str, tools: dict) -> tuple[dict, int]:
    """Render every known call from ``state``/node.json; returns (node.json, its time)."""
    import fcntl

    path = os.path.join(state, "node.json")
    with open(os.path.join(state, "render.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        while True:
            before = os.stat(path).st_mtime_ns
            with open(path) as f:
                hw = json.load(f)
            if os.stat(path).st_mtime_ns == before:
                break
        cur = _current(state)
        if cur is not None and cur[1] == before:
            return hw, before  # rendered meanwhile by another call
        d = os.path.join(state, f"out.{time.time_ns()}")
        os.mkdir(d)
        _RENDERING["hw"] = hw
        try:
            for tool, argv in calls(hw):
                try:
                    got = answer(tools[tool], argv)
                except Exception:  # a node.json without what this call reads: the call itself will say so
                    continue
                _write_entry(d, key(tool, argv), *got)
        finally:
            _RENDERING.pop("hw", None)
        _publish(state, "out", d, before)
    return hw, before


def _publish(parent: str, name: str, d: str, stamp_ns: int) -> None:
    """Point ``parent/name`` at the directory ``d`` (``parent/name.<n>``),
    stamped with ``stamp_ns``; earlier ones are kept a while for a call that
    is reading one now."""
    stamp = os.path.join(d, "stamp")
    open(stamp, "w").close()
    os.utime(stamp, ns=(stamp_ns, stamp_ns))
    link = os.path.join(parent, f".{name}.{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(link)
    os.symlink(os.path.basename(d), link)
    os.replace(link, os.path.join(parent, name))
    now = time.time()
    for entry in os.listdir(parent):
        old = os.path.join(parent, entry)
        if entry.startswith(f"{name}.") and old != d:
            with contextlib.suppress(OSError):
                if now - os.stat(old).st_mtime > 30:
                    import shutil

                    shutil.rmtree(old)


# node.json while rendering (the stand-ins answer from it, not from the file)
_RENDERING: dict = {}


def rendering() -> dict | None:
    return _RENDERING.get("hw")


def serve(state: str, tool: str, argv: list[str], tools: dict) -> int:
    """A call the wrapper did not answer: answer it, and render again when
    node.json changed (or store this answer when it is cacheable)."""
    import sys

    path = os.path.join(state, "node.json")
    try:
        now = os.stat(path).st_mtime_ns
    except OSError:
        return tools[tool](argv)
    cur = _current(state)
    hw = None
    try:
        if cur is None or cur[1] != now:
            hw, now = render(state, tools)
            cur = _current(state)
    except (OSError, ValueError, TypeError, AttributeError):
        return tools[tool](argv)  # an unreadable node.json: the stand-in says so
    if hw is None:
        try:
            with open(path) as f:
                hw = json.load(f)
        except (OSError, ValueError):
            return tools[tool](argv)
    if not cacheable(tool, argv, hw):
        return tools[tool](argv)
    out, err, rc = answer(tools[tool], argv)
    if cur is not None and cur[1] == now and not os.path.exists(os.path.join(cur[0], key(tool, argv))):
        with contextlib.suppress(OSError):
            _write_entry(cur[0], key(tool, argv), out, err, rc)
    sys.stdout.write(out)
    sys.stderr.write(err)
    return rc


def wrapper(tool: str, python: str, repo: str, prelude: str = "") -> str:
    """The host-side stand-in: bash, the rendered answer when node.json is
    unchanged, else the Python stand-in."""
    q = shlex.quote
    return (
        "#!/bin/bash\n"
        f"# simulated {tool}: answers rendered from node.json (sim/standins/fast.py), else sim/standins\n"
        "S=${LLMDEPLOY_SIM_STATE:-/etc/llmdeploy-sim}\n"
        # an answer kept in file $f: bash builtins only (no cat); the text ends with a newline, or is empty
        "said() {\n"
        '    if [[ -f $f.err ]]; then mapfile -t e < "$f.err"; ((${#e[@]})) && printf \'%s\\n\' "${e[@]}" >&2; fi\n'
        '    mapfile -t o < "$f"; ((${#o[@]})) && printf \'%s\\n\' "${o[@]}"\n'
        '    rc=0; [[ -f $f.rc ]] && read -r rc < "$f.rc"\n'
        '    exit "$rc"\n'
        "}\n"
        "fresh() { [[ ! $S/node.json -nt $S/out/stamp && ! $S/node.json -ot $S/out/stamp ]]; }\n"
        f"{_GPUS_OPEN if tool == 'nvidia-smi' else ''}"
        f"{prelude}"
        f"IFS=+; k={q(tool)}+$#+\"$*\"; IFS=$' \\t\\n'\n"
        f'if [[ ${{#k}} -lt {MAX_KEY} && $k != *[!A-Za-z0-9,._=+-]* && -f $S/out/$k ]] && fresh{" && gpus_open" if tool == "nvidia-smi" else ""}; then\n'
        '    f=$S/out/$k\n'
        f"{_LINK_CHECK if tool == 'hccn_tool' else ''}"
        "    said\n"
        "fi\n"
        # -S: the stand-ins need only the standard library (no site, no editable finder)
        f"PYTHONPATH={q(repo)} exec {q(python)} -S -m sim.standins {q(tool)} \"$@\"\n"
    )


# nvidia-smi lists only the GPUs its caller may open (a Slurm step's device
# cgroup, ConstrainDevices): with one denied ("Operation not permitted", where
# an allowed one fails "No such device or address": no driver here), the
# rendered answer, which lists them all, is not the caller's (gpus_denied)
_GPUS_OPEN = (
    "gpus_open() {\n"
    "    local d e\n"
    "    for d in /dev/nvidia[0-9]*; do\n"
    '        [[ -c $d ]] || continue\n'
    # strerror(EPERM) in the C locale, whatever the caller's
    '        e=$(LC_ALL=C; { : <>"$d"; } 2>&1)\n'
    '        [[ $e == *"not permitted"* ]] && return 1\n'
    "    done\n"
    "    return 0\n"
    "}\n"
)


# hccn_tool -link also reads the NPU interface's state (a test takes it down
# with `ip link set npu<d> down`): the rendered answer is node.json's
_LINK_CHECK = (
    '    if [[ $3 == -link && ! -f $f.rc && -r /sys/class/net/npu$2/operstate ]]; then\n'
    '        read -r st < "/sys/class/net/npu$2/operstate"\n'
    '        [[ $st != up ]] && { echo "link status: DOWN"; exit 0; }\n'
    "    fi\n"
)
