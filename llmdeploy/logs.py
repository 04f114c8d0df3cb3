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

# (pattern, reason), most specific first. Each serving system has its own
# (``systems.<system>.SIGNATURES``); these apply to every system.
COMMON: list[tuple[str, str]] = [
    (r"[Oo]ut of memory", "out of device memory"),
    (r"Address already in use", "a port it binds is already in use"),
    (r"does not appear to have a file named config\.json|is not a valid model", "the model is not at the configured path"),
]


def match(text: str, signatures: list[tuple[str, str]] | None = None) -> tuple[str, str] | None:
    """(reason, the log line that shows it), or None. ``signatures``: the
    serving system's own, tried before the common ones."""
    for pattern, reason in list(signatures or []) + COMMON:
        m = re.search(pattern, text)
        if m:
            start = text.rfind("\n", 0, m.start()) + 1
            end = text.find("\n", m.end())
            return reason, text[start : end if end >= 0 else len(text)].strip()
    return None


MARK = "@@llmdeploy-bundle@@"


# how much of each log a bundle keeps (its end)
BUNDLE_BYTES = 5 * 1024 * 1024


def bundle_script(cluster: Cluster, node: Node, release_dir: str, units: list[tuple[str, str]], device_files: dict[str, str],
                  max_bytes: int = BUNDLE_BYTES) -> str:
    """One node's part of the bundle: every section behind a marker line.
    ``units``: the units' files, (name, command), from their runtime
    (``UnitRuntime.bundle_sections``: one unit's are ``container.log`` and
    ``container.inspect.json``; with several, each is named for its unit).
    ``device_files``: the platform's own view of its devices, file -> command (``Vendor.LOG_FILES``)."""
    d = shlex.quote(release_dir)
    sections = list(units)
    sections += [
        ("kernel.log", "dmesg 2>&1 | tail -n 200"),
        ("node.txt", "hostname; uptime; free -g 2>&1; df -h 2>&1 | head -20"),
    ]
    # the platform's own view of its devices (npu-smi, nvidia-smi, ...)
    sections += list(device_files.items())
    out = []
    for name, cmd in sections:
        # the command may be a script of many lines (a runtime's own, which may exit): a subshell of its own,
        # closed on a line of its own
        out.append(f"echo '{MARK} {name}'; (\n{cmd.rstrip()}\n) 2>&1")
    # earlier attempts and the rendered files of the release (env values are
    # masked locally before anything is written)
    out.append(
        f"for f in {d}/logs/* {d}/*.sh {d}/*.json {d}/*.yaml {d}/*hostfile {d}/env {d}/*.env; do "
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


def local_root(cluster: Cluster) -> Path:
    """The cluster's folder on this machine for what runs bring back:
    ``logs/<cluster>`` (``LLMDEPLOY_LOG_DIR``: another base)."""
    return Path(os.environ.get("LLMDEPLOY_LOG_DIR", "logs")) / cluster.name


def bundle_root(cluster: Cluster, rid: str) -> Path:
    return local_root(cluster) / rid


def bundle_secrets(per_host: dict[str, dict[str, str]], keys: set[str]) -> list[str]:
    """The secret values a bundle carries: those of ``keys`` (and of the keys
    each release.json lists as secret) in the release's env files the bundle
    holds. So a bundle is masked from the nodes' own files, whoever runs the
    tool and whatever their environment holds."""
    import json

    values = []
    for files in per_host.values():
        names = set(keys)
        try:
            names |= set(json.loads(files.get("release/release.json", "{}")).get("secret_keys") or [])
        except (ValueError, AttributeError, TypeError):
            pass
        for name, text in files.items():
            if name == "release/env" or name.endswith(".env"):
                for line in text.splitlines():
                    k, sep, v = line.strip().removeprefix("export ").partition("=")
                    if sep and k in names and v.strip("'\""):
                        values += [v, v.strip("'\"")]
    return values


def save_bundle(cluster: Cluster, rid: str, per_host: dict[str, dict[str, str]], secrets: list[str],
                extra: dict[str, str] | None = None) -> tuple[Path, Path]:
    """Write each host's files, masking secrets (``secrets`` and those the
    bundle's own env files hold, see ``bundle_secrets``), and ``extra`` files
    (the tool's own findings, e.g. the gate's comparison) at the top; returns (directory, .tar.gz).
    A bundle of the same release collected earlier is kept: this one goes
    beside it with a numbered suffix."""
    from .errors import mask

    secrets = list(secrets) + bundle_secrets(per_host, set(cluster.secret_env))
    root = bundle_root(cluster, rid)
    n = 1
    while root.exists() or root.parent.joinpath(f"{root.name}.tar.gz").exists():
        n += 1
        root = bundle_root(cluster, rid).with_name(f"{rid}.{n}")
    for host, files in per_host.items():
        for name, text in files.items():
            p = root / host / name
            if ".." in Path(name).parts:
                continue
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(mask(text, secrets))
    for name, text in (extra or {}).items():
        if "/" in name or name.startswith("."):
            continue
        root.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(mask(text, secrets))
    tgz = root.parent / f"{root.name}.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(root, arcname=f"{cluster.name}/{root.name}")
    return root, tgz
