"""Budgets, from the facts: the ports the profile binds on this node are free
(or held by this cluster's own running release, which deploy stops first),
free disk under base_dir, and host memory for what the profile reserves."""

from __future__ import annotations

from llmdeploy.inventory import Cluster, Node
from llmdeploy.runner import FAILED, OK, HostResult, Step
from roles import from_facts


def ports_for(cluster: Cluster, node: Node) -> dict[int, str]:
    """The TCP ports serving binds on ``node`` -> the inventory field they come from."""
    return cluster.profile.node_ports(cluster, node)


def memory_need(cluster: Cluster, node: Node) -> dict[str, float]:
    """Host memory (GiB) serving needs on ``node``, by purpose: what the serving
    system reserves there, then the inventory's budget."""
    need: dict[str, float] = dict(cluster.profile.host_memory_gib(cluster, node))
    if cluster.budget.weights_host_gib:
        need["weights loading/staging"] = cluster.budget.weights_host_gib
    need["OS margin"] = cluster.budget.os_margin_gib
    return need


def check(node: Node, facts: dict, cluster: Cluster) -> HostResult:
    problems: list[str] = []
    ports = ports_for(cluster, node)
    listening = facts.get("listening")
    held_by_us = bool(facts.get("our_containers"))
    busy = []
    if listening is None:
        problems.append("could not list listening ports (ss -Htln failed)")
    else:
        for port, field in sorted(ports.items()):
            if port in listening and not held_by_us:
                busy.append(port)
                problems.append(f"port {port} ({field}) is already in use")
    free = facts.get("base_disk_free_gib")
    floor = cluster.budget.min_free_disk_gib
    if free is None:
        problems.append(f"could not read free disk under {cluster.base_dir}")
    elif free < floor:
        problems.append(f"{free:g} GiB free under {cluster.base_dir} < {floor:g} GiB (budget.min_free_disk_gib)")
    need = memory_need(cluster, node)
    total_kib = facts.get("mem_total_kib")
    total = round(total_kib / 1048576, 1) if total_kib else None
    needed = round(sum(need.values()), 1)
    if total is None:
        problems.append("could not read MemTotal")
    elif total < needed:
        parts = " + ".join(f"{v:g} GiB {k}" for k, v in need.items())
        problems.append(f"host memory {total:g} GiB < {needed:g} GiB needed ({parts})")
    data = {"ports": ports, "busy_ports": busy, "mem_total_gib": total, "mem_needed_gib": needed, "disk_free_gib": free}
    if problems:
        return HostResult(node.name, FAILED, msg="; ".join(problems), data=data)
    note = " (held by this cluster's running release)" if ports and held_by_us and listening and set(ports) & set(listening) else ""
    return HostResult(
        node.name, OK,
        msg=f"ports {','.join(map(str, sorted(ports))) or '-'} free{note}; memory {needed:g}/{total:g} GiB; disk {free:g} GiB free",
        data=data,
    )


def check_step(ctx) -> Step:
    return Step(name="budget", local=from_facts(lambda n, f: check(n, f, ctx.cluster), ctx))


STEPS = {"check": check_step}
