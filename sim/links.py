"""Physical links for the simulated hosts: a bandwidth per host (node.json
``net.mbit``), applied with a token bucket (``tc qdisc ... tbf``) on both
ends of each of its veth pairs (management and data), and on the cluster's
registry and package index (their link is the management bridge's own port).
A transfer's time is then set by the link, not by this machine's memory
bandwidth. Unshaped (None) by default."""

from __future__ import annotations

import subprocess

from .paths import netns_name

# the bucket: 10 ms at the rate, at least two 9000-byte jumbo frames and
# a 64 KiB segment (tbf cuts larger GSO segments itself)
LATENCY_MS = 100


def burst_bytes(mbit: float) -> int:
    return max(65536, int(mbit * 1e6 / 8 / 100))


def qdisc(dev: str, mbit: float | None, netns: str | None = None) -> list[str]:
    """The ``tc`` command that shapes ``dev`` to ``mbit`` (None: removes the shaping)."""
    pre = ["ip", "netns", "exec", netns] if netns else []
    if not mbit:
        return [*pre, "tc", "qdisc", "del", "dev", dev, "root"]
    return [*pre, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbit:g}mbit",
            "burst", str(burst_bytes(mbit)), "latency", f"{LATENCY_MS}ms"]


def _run(argv: list[str], removing: bool) -> None:
    res = subprocess.run(argv, capture_output=True, text=True)
    # removing a shaping that is not there is fine ("Cannot delete qdisc with handle of zero" / "No such file")
    if res.returncode != 0 and not removing:
        raise RuntimeError(f"{' '.join(argv)}: {res.stderr.strip()}")


def shape_host(cluster_name: str, node_name: str, nic: str, host_side: list[str], mbit: float | None) -> None:
    """Shape both ends of a host's veths: ``host_side`` (the bridge's ports,
    egress toward the host) and, inside its namespace, mgmt0 and its data NIC."""
    ns = netns_name(cluster_name, node_name)
    for dev in host_side:
        _run(qdisc(dev, mbit), not mbit)
    for dev in ("mgmt0", nic):
        _run(qdisc(dev, mbit, ns), not mbit)


def shape_bridge(bridge: str, mbit: float | None) -> None:
    """The registry's and package index's link: what this machine sends into the management bridge."""
    _run(qdisc(bridge, mbit), not mbit)
