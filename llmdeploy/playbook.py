"""Playbooks: the one loader of ``playbooks/*.yaml`` and the one host selector
(``all``, ``node0``, ``workers``, narrowed by ``--limit``), used by the prepare
plays (``flows.plan``) and the serving systems' start orders (``systems``).
Core: pure, reads files only."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from .errors import InventoryError, LlmdeployError
from .inventory import Cluster, Node

PLAYBOOK_DIR = Path(__file__).resolve().parent.parent / "playbooks"
HOST_SELECTIONS = ("all", "node0", "workers")


def load(name: str, directory: Path | None = None) -> Any:
    """The YAML of ``playbooks/<name>.yaml`` (read once per process: a playbook
    is part of the tool, like its code)."""
    return _load(((directory or PLAYBOOK_DIR) / f"{name}.yaml").resolve())


@lru_cache(maxsize=None)
def _load(path: Path) -> Any:
    try:
        return yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise LlmdeployError(f"{path}: no such playbook") from None
    except yaml.YAMLError as exc:
        raise LlmdeployError(f"{path}: not valid YAML: {exc}") from None


def select_nodes(cluster: Cluster, limit: str | None = None, hosts: str = "all") -> list[Node]:
    """Nodes of ``hosts`` (all | node0 | workers), narrowed by ``--limit a,b``.
    Unknown names in --limit are an error (exit 2) before anything runs."""
    if hosts == "all":
        nodes = list(cluster.nodes)
    elif hosts == "node0":
        nodes = [cluster.node0]
    elif hosts == "workers":
        nodes = list(cluster.nodes[1:])
    else:
        raise LlmdeployError(f"unknown host selection {hosts!r} ({', '.join(HOST_SELECTIONS)})")
    if limit:
        wanted = [x.strip() for x in limit.split(",") if x.strip()]
        known = {n.name for n in cluster.nodes}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise InventoryError("--limit", [f"no node named {u!r} in cluster {cluster.name} (nodes: {', '.join(sorted(known))})" for u in unknown])
        nodes = [n for n in nodes if n.name in wanted]
    return nodes
