"""NIC checks from the facts (no round trip of their own): the serving NIC
exists, is up and owns the node's IP; its MTU agrees across nodes; where the
platform reads InfiniBand ports (NVIDIA), every one is Active/LinkUp at the
expected rate."""

from __future__ import annotations

from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Node
from llmdeploy.runner import FAILED, OK, HostResult, Step
from roles import fail_odd_ones, from_facts, hosts_text
from roles.facts import nic_problems


def ib_problems(dep: Deployment, facts: dict) -> list[str]:
    cluster = dep.cluster
    if not dep.vendor.IB_PORTS or cluster.ib_rate is None:
        return []
    ports = facts.get("ib_ports")
    # what ibstat printed, when it failed or listed no port (roles.facts keeps it)
    said = (facts.get("unreadable") or {}).get("ibstat")
    said = f": ibstat {said}" if said else ""
    if ports is None:
        return ["ibstat failed or is not installed (install infiniband-diags, or set ib_rate=None for clusters without InfiniBand)" + said]
    if not ports:
        return ["ibstat shows no InfiniBand port" + said]
    out = []
    for p in ports:
        bad = []
        if p["state"] != "Active":
            bad.append(f"State {p['state']}")
        if p["phys"] != "LinkUp":
            bad.append(f"Physical state {p['phys']}")
        if p["rate"] != cluster.ib_rate:
            bad.append(f"Rate {p['rate']} (expected {cluster.ib_rate})")
        if bad:
            out.append(f"IB {p['ca']} port {p['port']}: {', '.join(bad)}")
    return out


def check(node: Node, facts: dict, dep: Deployment) -> HostResult:
    problems = nic_problems(node, facts) + ib_problems(dep, facts)
    nic = facts.get("nic") or {}
    data = {"nic": node.nic, "mtu": nic.get("mtu"), "problems": problems}
    if problems:
        return HostResult(node.name, FAILED, msg="; ".join(problems), data=data)
    ib = facts.get("ib_ports") or []
    rate = dep.cluster.ib_rate
    extra = f", {len(ib)} IB ports Active at {rate}" if ib and rate else ""
    return HostResult(node.name, OK, msg=f"{node.nic} up, owns {node.ip}, MTU {nic.get('mtu')}{extra}", data=data)


def check_step(ctx) -> Step:
    cluster = ctx.cluster

    def same_mtu(results):
        fail_odd_ones(
            results,
            key=lambda r: (r.data or {}).get("mtu"),
            describe=lambda h, mine, ref, agreeing: f"MTU {mine} on {cluster.node(h).nic}, but {ref} on {hosts_text(agreeing)}: the MTU must agree across nodes",
        )

    return Step(name="nic", local=from_facts(lambda n, f: check(n, f, ctx.dep), ctx), aggregate=same_mtu)


STEPS = {"check": check_step}
