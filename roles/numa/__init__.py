"""NUMA binding: computed per node from its topology (the facts read
``lscpu -e=CPU,NODE``, ``numactl -H``, ``npu-smi info -t topo`` /
``nvidia-smi topo -m``), recorded for the start step, refused where the
profile asks for a binding the node cannot give. What a binding is, is the
serving system's (``ServingProfile.numa``); this role runs and reports it.
"""

from __future__ import annotations

from llmdeploy.inventory import Cluster, Node
from llmdeploy.runner import FAILED, OK, HostResult, Step
from roles import from_facts


def plan(cluster: Cluster, node: Node, facts: dict) -> tuple[dict, list[str]]:
    """(binding to record, problems): what the serving system asks of this
    node's NUMA layout (``profile.numa``). Pure: facts in, decision out."""
    return cluster.profile.numa(cluster, node, facts)


def plan_step(ctx) -> Step:
    cluster = ctx.cluster

    def body(node: Node, facts: dict) -> HostResult:
        binding, problems = plan(cluster, node, facts)
        if problems:
            return HostResult(node.name, FAILED, msg="; ".join(problems), data=binding)
        desc = binding.get("prefix") or (f"{binding['kind']} ({binding.get('mode')}, {binding.get('cpus_per_npu')} CPUs/NPU)" if binding["kind"] != "none" else f"none: {binding['reason']}")
        return HostResult(node.name, OK, msg=desc, data=binding)

    return Step(name="numa", local=from_facts(body, ctx))


STEPS = {"plan": plan_step}
