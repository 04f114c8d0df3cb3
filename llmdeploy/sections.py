"""The output of a script run on a node, one section per command: each
section starts with a marker line and ends with its command's exit status
(:func:`section`, :func:`split_sections`), and the small readers every
facts parser shares (numbers, CPU lists, a device topology's CPU affinity).
The roles and the platforms (``platforms/<vendor>/``) build and read their
scripts with these; and a long command's progress lines read from its own
output (:func:`counted`), for the roles' scripts and a launcher's alike.

Core: imports nothing above ``llmdeploy``.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from .runner import PROGRESS_MARK

MARK = "@@llmdeploy@@"


def section(name: str, command: str) -> str:
    # every section ends with its exit status, so a missing tool is a fact too
    return f"echo '{MARK} {name}'; {{ {command} ; }} 2>&1; echo \"{MARK}rc $?\""


def split_sections(stdout: str) -> dict[str, tuple[str, int | None]]:
    """{section: (its text, its exit status)}; the status is None when its
    line is unreadable (output cut short or garbled): never a success."""
    sections: dict[str, tuple[str, int | None]] = {}
    buf: list[str]
    name, buf = None, []
    for line in stdout.splitlines():
        head, mark, rest = line.partition(MARK + "rc ")
        if mark:
            if name is not None:
                if head:  # the last line of an output without a final newline (a file's last line, say)
                    buf.append(head)
                m = re.fullmatch(r"[0-9]{1,3}", rest.strip())
                sections[name] = ("\n".join(buf), int(m.group()) if m else None)
            name, buf = None, []
        elif line.startswith(MARK + " "):
            name, buf = line[len(MARK) + 1 :], []
        elif name is not None:
            buf.append(line)
    return sections


def number(text: str) -> int | None:
    """``text`` as a non-negative integer if it is ASCII digits only, else None
    (``str.isdigit`` is also true for '²', which ``int`` refuses)."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else None


def excerpt(text: str, limit: int = 240) -> str:
    """What a node printed, for a message: stripped, its beginning and its end
    when longer than ``limit``, quoted (control characters escaped)."""
    text = text.strip()
    if len(text) > limit:
        text = f"{text[: limit // 2]} ... {text[-(limit // 2):]}"
    return repr(text)


# no machine has more CPUs than this; a larger range in a CPU list is garbage
MAX_CPUS = 65536


def cpulist(text: str) -> list[int]:
    cpus: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        a, b = number(lo), number(hi) if sep else number(lo)
        if a is not None and b is not None and a <= b < MAX_CPUS:
            cpus.extend(range(a, b + 1))
    return cpus


def parse_topo_affinity(text: str, prefix: str) -> dict[int, list[int]]:
    """``npu-smi info -t topo`` / ``nvidia-smi topo -m`` → {device: [cpus]}."""
    lines = text.splitlines()
    header = next((ln for ln in lines if "CPU Affinity" in ln), None)
    if header is None:
        return {}
    out: dict[int, list[int]] = {}
    for ln in lines:
        m = re.match(rf"^{prefix}([0-9]+)\s", ln)
        if not m:
            continue
        cells = ln.split()
        cpu = next((c for c in cells[1:] if re.match(r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$", c)), None)
        if cpu is not None and cpulist(cpu):
            out[int(m.group(1))] = cpulist(cpu)
    return out


def numa_of(cpus: list[int] | None, cpu_nodes: dict[int, int]) -> int | None:
    """The NUMA node all of ``cpus`` are on ({cpu: node} from lscpu), else None."""
    if not cpus:
        return None
    nodes = {cpu_nodes.get(c) for c in cpus} - {None}
    return nodes.pop() if len(nodes) == 1 else None


def answered(sections: dict[str, tuple[str, int | None]], name: str) -> str:
    """A section's output when its command succeeded, else ""."""
    v = sections.get(name)
    return v[0] if v and v[1] == 0 else ""


def placed(devices: list[dict[str, Any]], topo_text: str, prefix: str, cpu_nodes: dict[int, int]) -> list[dict[str, Any]]:
    """``devices`` (each with its ``id``) given the CPU affinity the topology
    matrix (``npu-smi info -t topo`` / ``nvidia-smi topo -m``) shows for its
    ``prefix`` row, and the NUMA node those CPUs are on."""
    affinity = parse_topo_affinity(topo_text, prefix)
    for d in devices:
        d["cpu_affinity"] = affinity.get(d["id"])
        d["numa"] = numa_of(d["cpu_affinity"], cpu_nodes)
    return devices


def counted(command: str, awk: str) -> str:
    """Shell: ``command`` (stdout and stderr together) read by ``awk``, which
    passes every line on to stderr and prints progress lines (to stderr too)
    from them; the exit status is the command's (the shell hands it to awk
    in a last line of its own, which awk exits with). ``awk``: the program's
    rules, with the mark in ``m``."""
    return (
        f'{{ {command} 2>&1; echo "{_RC} $?"; }} | '
        f"awk -v m={shlex.quote(PROGRESS_MARK)} -v r={_RC} {shlex.quote(_AWK_HEAD + awk + _AWK_TAIL)} >&2"
    )


_RC = "@@llmdeploy-rc@@"
_AWK_HEAD = '$1 == r { rc = $2; next }\n{ print; fflush() }\n'
_AWK_TAIL = '\nEND { exit (rc == "" ? 1 : rc) }\n'
