"""Long steps made long on request: a simulated host's ``docker`` and
``sha256sum`` are its real ones, paced when its ``node.json`` says so, so
that the progress a long step shows (an image pull, a ``docker load``, the
model's checksums) can be seen and tested on a cluster whose images and model
are small. Every knob defaults to 0 (no delay); ``node.json``::

    "slow": {
        "pull_layer_s": 0,   # docker pull: its output paused this long after each
                             # layer that is done ("Pull complete", "Already exists")
        "load_mib_s": 0,     # docker load from its standard input: read at most
                             # this many MiB a second
        "sha256_s": 0        # sha256sum FILE...: this much longer per call (the
                             # model's checksums hash one file a call); a call
                             # on its standard input (the files role) is not paced
    }

The wrappers are bash and answer at once when the knob is 0 (the pull and
load paths look into ``node.json`` with one ``grep``); a paced pull or load
goes through this module (``python -m sim.standins docker ...``). The pull
itself is the real one, from the cluster's registry: only what the tool sees
of it, its lines, comes later.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

REAL_DOCKER = "/usr/bin/docker"  # sim.dockerd.CLI: Debian's client, the daemon's own
REAL_SHA256SUM = "/usr/bin/sha256sum"
KNOBS = {"pull_layer_s": 0, "load_mib_s": 0, "sha256_s": 0}
STATE_DIR = os.environ.get("LLMDEPLOY_SIM_STATE", "/etc/llmdeploy-sim")
LAYER_DONE = (": Pull complete", ": Already exists")


def docker_wrapper(python: str, repo: str) -> str:
    """The host's ``docker``: the real client, through :func:`docker` when
    a pull or a load is to be paced."""
    q = shlex.quote
    return (
        "#!/bin/bash\n"
        "# simulated host's docker (sim/standins/slow.py): Debian's client; node.json \"slow\" paces a pull or a load\n"
        "S=${LLMDEPLOY_SIM_STATE:-/etc/llmdeploy-sim}\n"
        "case $1 in\n"
        "pull|load)\n"
        "    if [[ -r $S/node.json ]] && grep -Eq '\"(pull_layer_s|load_mib_s)\": *[0-9.]*[1-9]' \"$S/node.json\"; then\n"
        f"        PYTHONPATH={q(repo)} exec {q(python)} -S -m sim.standins docker \"$@\"\n"
        "    fi ;;\n"
        "esac\n"
        f"exec {REAL_DOCKER} \"$@\"\n"
    )


def sha256sum_wrapper() -> str:
    """The host's ``sha256sum``: coreutils' own, ``slow.sha256_s`` later
    when it is given file names."""
    return (
        "#!/bin/bash\n"
        "# simulated host's sha256sum (sim/standins/slow.py): coreutils' own; node.json \"slow\" \"sha256_s\" paces each call with file names\n"
        "S=${LLMDEPLOY_SIM_STATE:-/etc/llmdeploy-sim}\n"
        "if (($#)) && [[ -r $S/node.json ]] && v=$(grep -Eo -m1 '\"sha256_s\": *[0-9.]+' \"$S/node.json\"); then\n"
        "    v=${v##*:}; v=${v// /}\n"
        "    [[ $v == *[1-9]* ]] && sleep \"$v\"\n"
        "fi\n"
        f"exec {REAL_SHA256SUM} \"$@\"\n"
    )


def ping_wrapper() -> str:
    """The host's ``ping``: iputils' own; a partial loss is tried once more
    before it is reported. This machine's kernel drops packets from its
    per-CPU backlog (net.core.netdev_max_backlog, counted in
    /proc/net/softnet_stat) when every simulated host pings every other at
    once on two CPUs: 64 hosts started as one Slurm step lost 1 of 3 packets
    on ~40 of 4032 pairs, a loss no link of the simulation has (the same
    reason as hccn_tool's retry, sim/cluster.py HCCN_PING); one retry at
    once still lost 2 pairs: two more, each after a random fraction of a
    second. A link that is down (100% loss) or a refused full-MTU packet
    fails every try."""
    return (
        "#!/bin/bash\n"
        "# simulated host's ping (sim/standins/slow.py): iputils' own, a partial loss tried twice more\n"
        'out=$(/usr/bin/ping "$@" 2>&1); rc=$?\n'
        # iputils' ping exits 0 on a partial loss (-c without -w): the summary says it
        'for try in 1 2; do\n'
        '    [[ $out == *" received, "* && $out != *" 0% packet loss"* && $out != *" 100% packet loss"* ]] || break\n'
        # apart from the other hosts' retries: a fraction of a second, at random
        '    sleep 0.$((RANDOM % 9 + 1))\n'
        '    again=$(/usr/bin/ping "$@" 2>&1); code=$?\n'
        '    [[ $again == *" 0% packet loss"* ]] && { out=$again; rc=$code; }\n'
        "done\n"
        "printf '%s\\n' \"$out\"\n"
        "exit $rc\n"
    )


def knob(name: str) -> float:
    try:
        with open(os.path.join(STATE_DIR, "node.json")) as f:
            value = float(((json.load(f) or {}).get("slow") or {}).get(name) or 0)
    except (OSError, ValueError, TypeError, AttributeError):
        return 0.0
    return value if value > 0 else 0.0


def docker(argv: list[str]) -> int:
    """``docker ARGS``, a pull's lines paced (``pull_layer_s``) or a load's
    input throttled (``load_mib_s``); anything else is the real client's."""
    if argv[:1] == ["pull"] and (delay := knob("pull_layer_s")):
        return paced_pull(argv, delay)
    if argv[:1] == ["load"] and not {"-i", "--input"} & set(argv) and not any(a.startswith("--input=") for a in argv) and (rate := knob("load_mib_s")):
        return throttled_load(argv, rate)
    os.execv(REAL_DOCKER, [REAL_DOCKER, *argv])
    return 127  # not reached


def paced_pull(argv: list[str], delay: float, real: str = REAL_DOCKER) -> int:
    """The real pull; each of its lines passed on as it comes, with ``delay``
    seconds after each layer that is done."""
    proc = subprocess.Popen([real, *argv], stdout=subprocess.PIPE)
    out = sys.stdout.buffer
    for line in proc.stdout:
        out.write(line)
        out.flush()
        if line.rstrip(b"\r\n").endswith(tuple(x.encode() for x in LAYER_DONE)):
            time.sleep(delay)
    return proc.wait()


def throttled_load(argv: list[str], mib_s: float, real: str = REAL_DOCKER, piece: int = 1 << 20) -> int:
    """The real load, its standard input passed on at ``mib_s`` MiB a second."""
    proc = subprocess.Popen([real, *argv], stdin=subprocess.PIPE)
    src = sys.stdin.buffer
    start, sent = time.monotonic(), 0
    try:
        while chunk := src.read(piece):
            proc.stdin.write(chunk)
            sent += len(chunk)
            ahead = sent / (mib_s * (1 << 20)) - (time.monotonic() - start)
            if ahead > 0:
                time.sleep(ahead)
        proc.stdin.close()
    except BrokenPipeError:  # the load ended early (a bad archive): its status says so
        pass
    return proc.wait()
