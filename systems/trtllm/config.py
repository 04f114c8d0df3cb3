"""trtllm-serve's configuration, as pure builders: which curated profile a
cluster runs (``<config_dir>/<config>`` inside the container), the overrides
the inventory layers on it (TP, PP and EP from the profile, ``profile.overrides``,
the static EPLB map), rendered as a reviewable YAML file, and the small
program that merges the two inside the container::

    python3 merge-config.py <curated.yaml> <overrides.yaml> <out.yaml>

Nothing here opens a connection. EPLB maps are checked in ``systems.trtllm.eplb``.
"""

from __future__ import annotations

import copy
import posixpath
from pathlib import Path

import yaml

from llmdeploy.inventory import Cluster
from llmdeploy.schema import safe_path
from roles import render as render_template

from .profile import TrtllmProfile, nest_overrides

MERGE_SCRIPT_NAME = "merge-config.py"
OVERRIDES_NAME = "trtllm-overrides.yaml"


def curated_path(profile: TrtllmProfile) -> str:
    """The curated profile inside the container, e.g.
    /app/tensorrt_llm/examples/configs/curated/qwen3.8-low-latency.yaml."""
    assert profile.config_dir is not None  # TrtllmProfile._check_profile fills it in
    return posixpath.join(profile.config_dir, profile.config)


def _deep_merge(base: dict, over: dict, prefix: str = "") -> None:
    for key, value in over.items():
        if isinstance(base.get(key), dict) and isinstance(value, dict):
            _deep_merge(base[key], value, f"{prefix}{key}.")
        elif key in base:
            raise ValueError(f"{prefix}{key} is set twice")
        else:
            base[key] = value


def overrides_doc(cluster: Cluster, prof: TrtllmProfile, eplb_path_on_node: str | None = None) -> dict:
    """The nested overrides: ``tensor_parallel_size`` and
    ``pipeline_parallel_size`` from profile.tp/pp, ``moe_expert_parallel_size``
    from profile.ep (where the guide gives the profile's EP, or the inventory
    sets it), then ``profile.overrides``
    in their order, then ``moe_config.load_balancer: <eplb_path_on_node>``
    when the profile has an EPLB map (the path is where the caller puts the
    map on the node; it must be given exactly when ``profile.eplb_map`` is).
    ``prof``: the cluster's profile, as the hook that builds the plan received it."""
    if prof.eplb_map is not None and not eplb_path_on_node:
        raise ValueError(f"{cluster.name}: profile.eplb_map is set: give the map's path on the node")
    if prof.eplb_map is None and eplb_path_on_node:
        raise ValueError(f"{cluster.name}: {eplb_path_on_node} given but the profile has no eplb_map")
    doc: dict = {"tensor_parallel_size": prof.tp, "pipeline_parallel_size": prof.pp}
    if prof.ep is not None:
        doc["moe_expert_parallel_size"] = prof.ep
    # trtllm-serve's /metrics lists iteration statistics (numActiveRequests,
    # numQueuedRequests) only with this on: the drain before a stop and
    # invoke top count requests in flight there (profile.overrides may turn it off)
    if "enable_iter_perf_stats" not in prof.flat_overrides():
        doc["enable_iter_perf_stats"] = True
    _deep_merge(doc, copy.deepcopy(nest_overrides(prof.flat_overrides())))
    if eplb_path_on_node:
        safe_path(eplb_path_on_node)
        moe = doc.setdefault("moe_config", {})
        if not isinstance(moe, dict):
            raise ValueError(f"{cluster.name}: profile.overrides sets moe_config to {moe!r}; the EPLB map needs a mapping")
        moe["load_balancer"] = eplb_path_on_node
    return doc


def dotted_keys(doc: dict, prefix: str = "") -> list[str]:
    """Every leaf of ``doc`` as a dotted key, in document order."""
    out: list[str] = []
    for key, value in doc.items():
        if isinstance(value, dict) and value:
            out += dotted_keys(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def overrides_yaml(cluster: Cluster, prof: TrtllmProfile, eplb_path_on_node: str | None = None) -> str:
    """The overrides file: a header naming the curated profile it layers on and
    where each value comes from, every key, then the YAML (given order)."""
    doc = overrides_doc(cluster, prof, eplb_path_on_node)
    sources = [f"tensor_parallel_size {prof.tp}, pipeline_parallel_size {prof.pp}: profile.tp, profile.pp"]
    if prof.ep is not None:
        sources.append(f"moe_expert_parallel_size {prof.ep}: profile.ep (the guide's EP for {prof.config} unless set)")
    sources.append("enable_iter_perf_stats true: /metrics counts the requests in flight (the drain before a stop, invoke top)")
    if prof.overrides:
        sources.append(f"profile.overrides: {len(prof.flat_overrides())} key(s)")
    if eplb_path_on_node:
        assert prof.eplb_map is not None  # overrides_doc refuses a path without a map
        sources.append(f"moe_config.load_balancer: the static EPLB map of profile.eplb_map ({Path(prof.eplb_map).name})")
    body = yaml.safe_dump(doc, sort_keys=False, default_flow_style=False, allow_unicode=False, width=100)
    return render_template("trtllm/overrides.yaml.j2",
        cluster=cluster.name, curated=curated_path(prof), sources=sources, keys=dotted_keys(doc), body=body.rstrip("\n")
    )


def merge_script() -> str:
    """merge-config.py: a standalone Python 3 program (PyYAML) run inside the
    container; see the template for its contract."""
    return render_template("trtllm/merge-config.py.j2")
