"""Look into a simulated host from this machine (for tests and benchmarks):
run ``docker`` against the host's own daemon, and tell which container a
process belongs to. The tool itself never uses this: it goes over SSH."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from llmdeploy.errors import SimError

from . import dockerd, netns
from .paths import cluster_dir, netns_name

_CGROUP_ID = re.compile(r"/([0-9a-f]{64})(?:/|$)")


def _host_pid(cluster: str, node: str) -> int:
    try:
        state = json.loads((cluster_dir(cluster) / "state.json").read_text())
        return int(state["hosts"][node]["pid"])
    except (OSError, ValueError, KeyError) as exc:
        raise SimError(f"simulated host {node} of {cluster} is not up ({exc})") from exc


def docker(cluster: str, node: str, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
    """``docker ARGS`` on ``node`` (its mount and network namespaces: its own daemon)."""
    res = subprocess.run(["nsenter", "-t", str(_host_pid(cluster, node)), "-m", "-n", dockerd.CLI, *args],
                         capture_output=True, text=True, input=input, timeout=120)
    if check and res.returncode != 0:
        raise SimError(f"docker {' '.join(args)} on {node}: {res.stderr.strip()}")
    return res


def containers(cluster: str, node: str) -> dict[str, str]:
    """{container name: state} of every container on ``node`` (docker ps -a)."""
    out = docker(cluster, node, "ps", "-a", "--format", "{{.Names}} {{.State}}").stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def container_ids(cluster: str, node: str) -> dict[str, str]:
    """{container id: name} on ``node``."""
    out = docker(cluster, node, "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Names}}").stdout
    return dict(line.split(" ", 1) for line in out.splitlines() if " " in line)


def container_of(pid: int) -> str | None:
    """The id of the container process ``pid`` runs in (its cgroup), or None."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    m = _CGROUP_ID.search(text)
    return m.group(1) if m else None


def processes(cluster: str, node: str) -> dict[int, tuple[dict[str, str], str, str | None]]:
    """{pid: (environment, command line, container name or None)} of every
    process in ``node``'s network namespace (its containers' included: they
    use the host network)."""
    pids = netns.pids(netns_name(cluster, node))
    names = container_ids(cluster, node)
    out = {}
    for pid in pids:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        cid = container_of(int(pid))
        out[int(pid)] = ({k: v for k, _, v in (e.decode(errors="replace").partition("=") for e in env if e)}, cmd,
                         names.get(cid) if cid else None)
    return out


def rewrite(path: Path, text: str) -> str:
    """Write ``text`` into ``path`` in place (a file bind-mounted into a host,
    e.g. its /etc/hosts, keeps its inode); returns what it held."""
    with open(path, "r+") as f:
        old = f.read()
        f.seek(0)
        f.write(text)
        f.truncate()
    return old


def unreachable(cluster: str, node: str, name: str) -> str:
    """Make ``name`` (pypi.org, quay.io, ...) resolve to an address nothing
    listens on, in ``node``'s /etc/hosts (as on an air-gapped node); returns
    the file's text before, for ``rewrite`` to put back."""
    path = cluster_dir(cluster) / "hosts" / node / "hosts"
    lines = path.read_text().splitlines()
    out = [line for line in lines if name not in line.split()[1:]]
    out.append(f"127.0.0.1 {name}")
    return rewrite(path, "\n".join(out) + "\n")
