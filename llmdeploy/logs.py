"""Log collection and the known failure signatures (shared/DOMAIN.md).

``match`` names the first known reason found in a log; ``bundle_script``
collects, on one node, everything an engineer needs after a failed start;
``save_bundle`` writes what the nodes sent into ``logs/<cluster>/<release>/<host>/``
and a ``.tar.gz`` of it.
"""

from __future__ import annotations

import os
import re
import shlex
import tarfile
from pathlib import Path

from .inventory import Cluster, Node

# (pattern, reason), most specific first
SIGNATURES: list[tuple[str, str]] = [
    (r"HcclCommInitRootInfo failed|socket ifname \S+ has no ip",
     "HCCL init failed: HCCL_SOCKET_IFNAME must be the NIC that owns HCCL_IF_IP on this node"),
    (r"Did not receive response from front-end process within 5 minutes",
     "node 0 absent: the worker never reached node 0's DP RPC port (is node 0 running? same --data-parallel-address and --data-parallel-rpc-port everywhere?)"),
    (r"Message from engine with unexpected data parallel rank",
     "wrong DP rank: every worker needs a unique --data-parallel-start-rank in 1..DP-1"),
    (r"Configuration mismatch detected for engine",
     "configuration mismatch: this worker's model, image or flags differ from node 0's"),
    (r"must use --headless", "a worker was started without --headless"),
    (r"data_parallel_size_local must be > 0 in headless mode", "--data-parallel-size-local must be > 0 on headless workers"),
    (r"Insufficient CPUs for binding|NPU topo affinity not found|Bind cpus failed", "CPU binding failed (enable_cpu_binding)"),
    (r"[Oo]ut of memory", "out of device memory"),
    (r"Address already in use", "a port it binds is already in use"),
    (r"does not appear to have a file named config\.json|is not a valid model", "the model is not at the configured path"),
    (r"lost the connection to the front-end process", "node 0 went away after the group formed"),
    (r"EngineCore encountered a fatal error", "the engine core died"),
]


def match(text: str) -> tuple[str, str] | None:
    """(reason, the log line that shows it), or None."""
    for pattern, reason in SIGNATURES:
        m = re.search(pattern, text)
        if m:
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            return reason, text[start : end if end >= 0 else len(text)].strip()
    return None


MARK = "@@llmdeploy-bundle@@"


def bundle_script(cluster: Cluster, node: Node, release_dir: str, container: str, max_bytes: int = 5 * 1024 * 1024) -> str:
    """One node's part of the bundle: every section behind a marker line."""
    d = shlex.quote(release_dir)
    sections = [
        ("container.log", f"docker logs {shlex.quote(container)} 2>&1 | tail -c {max_bytes}"),
        ("container.inspect.json", f"docker inspect {shlex.quote(container)} 2>&1"),
        ("kernel.log", "dmesg 2>&1 | tail -n 200"),
        ("node.txt", "hostname; uptime; free -g 2>&1; df -h 2>&1 | head -20"),
    ]
    if cluster.platform_info.vendor == "ascend":
        sections.append(("npu-smi.txt", "npu-smi info 2>&1"))
    else:
        sections.append(("nvidia-smi.txt", "nvidia-smi 2>&1"))
    out = []
    for name, cmd in sections:
        out.append(f"echo '{MARK} {name}'; {{ {cmd} ; }} 2>&1")
    # earlier attempts and the rendered files of the release (env values are
    # masked locally before anything is written)
    out.append(
        f"for f in {d}/logs/* {d}/serve.sh {d}/run.sh {d}/release.json {d}/env; do "
        f"[ -f \"$f\" ] || continue; echo \"{MARK} release/$(basename \"$f\")\"; tail -c {max_bytes} \"$f\"; done"
    )
    return "\n".join(out) + "\n"


def split_bundle(out: str) -> dict[str, str]:
    files: dict[str, list[str]] = {}
    cur = None
    for line in out.splitlines():
        if line.startswith(MARK + " "):
            cur = line[len(MARK) + 1 :]
            files[cur] = []
        elif cur is not None:
            files[cur].append(line)
    return {k: "\n".join(v) + "\n" for k, v in files.items()}


def bundle_root(cluster: Cluster, rid: str) -> Path:
    base = Path(os.environ.get("LLMDEPLOY_LOG_DIR", "logs"))
    return base / cluster.name / rid


def save_bundle(cluster: Cluster, rid: str, per_host: dict[str, dict[str, str]], secrets: list[str]) -> tuple[Path, Path]:
    """Write each host's files, masking secrets; returns (directory, .tar.gz)."""
    from roles.files import mask

    root = bundle_root(cluster, rid)
    for host, files in per_host.items():
        for name, text in files.items():
            p = root / host / name
            if ".." in Path(name).parts:
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(mask(text, secrets))
    tgz = root.parent / f"{rid}.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(root, arcname=f"{cluster.name}/{rid}")
    return root, tgz
