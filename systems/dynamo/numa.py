"""Dynamo on Grace-Blackwell: ``numactl -m 0,1`` before ``trtllm-llmapi-launch``
only where CPU NUMA nodes 0 and 1 exist and GPU memory shows as CPU-less NUMA
nodes (the seed's layout), or as the inventory demands (``numa_membind``)."""

from __future__ import annotations

import re
import shlex

from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import Cluster, Node
from llmdeploy.serving import PreparedNode
from roles.record import prepared_path

from .profile import DynamoProfile


def plan(prof: DynamoProfile, node: Node, facts: dict) -> tuple[dict, list[str]]:
    """(binding to record, problems). Pure: facts in, decision out."""
    numa = facts.get("numa") or []
    cpu_nodes = sorted({int(n) for n in (facts.get("cpu_nodes") or {}).values()})
    gpu_mem_nodes = sorted(n["id"] for n in numa if not n.get("cpus"))
    gb_layout = cpu_nodes[:2] == [0, 1] and bool(gpu_mem_nodes)
    if prof.numa_membind == "off":
        return {"kind": "none", "reason": "numa_membind is off"}, []
    if prof.numa_membind == "auto":
        if gb_layout:
            return {"kind": "numactl", "prefix": "numactl -m 0,1", "cpu_nodes": cpu_nodes, "gpu_memory_nodes": gpu_mem_nodes}, []
        return {"kind": "none", "reason": f"not the Grace-Blackwell layout (CPU NUMA nodes {cpu_nodes}, CPU-less nodes {gpu_mem_nodes})"}, []
    want = [int(x) for x in prof.numa_membind.split(",")]
    have = {n["id"]: n for n in numa}
    lacking = [str(x) for x in want if x not in have or not have[x].get("size_mb")]
    if lacking:
        return {}, [f"profile.numa_membind {prof.numa_membind}: NUMA node {','.join(lacking)} does not exist or has no memory here (numactl -H shows {sorted(have)})"]
    return {"kind": "numactl", "prefix": f"numactl -m {prof.numa_membind}", "cpu_nodes": cpu_nodes, "gpu_memory_nodes": gpu_mem_nodes}, []


def membind(cluster: Cluster, prof: DynamoProfile, node: Node, record: PreparedNode | None) -> tuple[list[str] | None, str]:
    """The ``numactl -m`` prefix before ``trtllm-llmapi-launch`` of a Dynamo
    worker whose launcher runs on ``node``, and what decides it. ``record`` is
    what the node's prepare record (``prepared.json``) says, None when no node was read
    (``deploy --check``). With a record: its ``binding``, what prepare found.
    Without one, what the inventory alone decides: ``numa_membind`` "off" (no
    prefix) or a list (``numactl -m <list>``: prepare refuses a node that
    cannot give it); for "auto" the prefix is None: not known without the
    node, and the second value says which recorded fact decides it and where.
    ``prof``: the cluster's profile, as the hook that builds the plan received it."""
    if record is not None:
        binding = record.binding
        if binding.get("kind") == "numactl" and binding.get("prefix"):
            words = shlex.split(binding["prefix"]) if isinstance(binding["prefix"], str) else []
            # the record is read from the node: only a numactl memory binding goes in front of the launch
            if len(words) != 3 or words[:2] != ["numactl", "-m"] or not re.fullmatch(r"\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*", words[2]):
                raise LlmdeployError(f"{node.name}: {prepared_path(cluster)}: binding.prefix {binding['prefix']!r} is not "
                                     "'numactl -m <NUMA nodes>': run invoke prepare again")
            return words, f"the prepare record of {node.name} (binding: {binding['prefix']})"
        return [], f"the prepare record of {node.name} (binding: {binding.get('reason') or binding.get('kind') or 'none'})"
    if prof.numa_membind == "off":
        return [], "profile.numa_membind is off"
    if prof.numa_membind != "auto":
        return ["numactl", "-m", prof.numa_membind], (f"profile.numa_membind {prof.numa_membind} (prepare refuses a node "
                                                      "without those NUMA nodes)")
    return None, (f"profile.numa_membind auto: the binding prepare records in {prepared_path(cluster)} on {node.name} decides "
                  "(numactl -m 0,1 where prepare finds the Grace-Blackwell NUMA layout there: CPU NUMA nodes 0 and 1, "
                  "GPU memory as CPU-less nodes, read with numactl -H and lscpu)")


