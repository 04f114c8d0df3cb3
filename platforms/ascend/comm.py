"""verify-comm on Ascend (shared/DOMAIN.md): per node and NPU, ``hccn_tool
-i N`` link, net_health, netdetect, gateway, lldp, tls, optical, and the
NPU's own IP (A2 ``-ip``, A3 ``-vnic``), plus ``/etc/hccn.conf``; across
nodes, NPU pings (A2 ``-ping``, A3 ``-hccs_ping``), planned and run in
parallel lanes by ``roles.comm``. Pure builders and parsers."""

from __future__ import annotations

import re
import shlex

from llmdeploy.inventory import Cluster, Node
from llmdeploy.sections import excerpt, section, split_sections

# where hccn_tool is when it is not on PATH (the driver's tools)
HCCN = "HCCN=$(command -v hccn_tool || echo /usr/local/Ascend/driver/tools/hccn_tool)"
# the tool the per-NPU checks run (the runner's step is named for it)
LINK_TOOL = "hccn_tool"
# the lines every ping lane runs first
PING_PRELUDE = [HCCN]
# every node's per-NPU checks, in the table's order
LINK_CHECKS = ["link", "health", "netdetect", "gateway", "lldp", "optical", "tls", "npu_ip"]


def _devices(cluster: Cluster, node: Node) -> int:
    from . import PLATFORMS

    return node.devices or PLATFORMS[cluster.platform].devices


def link_script(cluster: Cluster, node: Node) -> str:
    """Every per-NPU query of one node, one round trip."""
    from . import row

    query = "-vnic" if row(cluster).npu_ip_query == "vnic" else "-ip"
    items = [("link", "-link"), ("health", "-net_health"), ("netdetect", "-netdetect"), ("gateway", "-gateway"),
             ("lldp", "-lldp"), ("tls", "-tls"), ("optical", "-optical"), ("npu_ip", query)]
    parts = [HCCN, section("hccn.conf", "cat /etc/hccn.conf")]
    for d in range(_devices(cluster, node)):
        for name, flag in items:
            parts.append(section(f"{name} {d}", f'"$HCCN" -i {d} {flag} -g'))
    return "\n".join(parts) + "\n"


def ping_job(cluster: Cluster, device: int, ip: str) -> str:
    """NPU ``device`` pings ``ip`` (another node's NPU)."""
    from . import row

    return f'"$HCCN" -i {int(device)} {row(cluster).ping_flag} -g address {shlex.quote(ip)}'


def _unread(t: str, known: str | None = None, unset: str = "") -> str:
    """The detail of a check whose answer did not match: ``unset`` when hccn_tool
    said so in its own words (``known``), else what it printed (or "no answer")."""
    if known and re.search(known, t, re.IGNORECASE):
        return unset
    return f"unreadable: {excerpt(t)}" if t else "no answer"


def parse_links(cluster: Cluster, node: Node, out: str) -> dict:
    """{"devices": {npu: {check: (ok, detail)}}, "ips": {npu: ip}, "conf": the
    node's hccn.conf (None: unreadable), "conf_name": its path}. A detail that
    is not one of hccn_tool's answers shows what it printed."""
    s = split_sections(out)
    npus: dict[int, dict[str, tuple[bool, str]]] = {}
    ips: dict[int, str] = {}
    for d in range(_devices(cluster, node)):
        r: dict[str, tuple[bool, str]] = {}

        def text(name):
            v = s.get(f"{name} {d}")
            return (v[0].strip(), v[1]) if v else ("", None)

        t, _ = text("link")
        m = re.search(r"link status:\s*(\S+)", t)
        r["link"] = (bool(m and m.group(1) == "UP"), m.group(1) if m else (t or "no answer"))
        t, _ = text("health")
        m = re.search(r"net health status:\s*(.+)", t)
        val = m.group(1).strip() if m else (t or "no answer")
        r["health"] = (val == "Success", val)
        t, _ = text("netdetect")
        m = re.search(r"netdetect address:\s*(\S+)", t)
        r["netdetect"] = (bool(m), m.group(1) if m else _unread(t, r"netdetect address\s*:", "not set"))
        t, _ = text("gateway")
        m = re.search(r"default gateway:\s*([0-9.]+)", t)
        r["gateway"] = (bool(m), m.group(1) if m else _unread(t, r"default gateway\s*:", "not set"))
        t, _ = text("lldp")
        m = re.search(r"Ifname:\s*(\S+)", t)
        r["lldp"] = (bool(m), m.group(1) if m else _unread(t, r"lldp", "no switch port (LLDP)"))
        t, _ = text("optical")
        m = re.search(r"present\s*:\s*(.+)", t)
        r["optical"] = (bool(m and m.group(1).strip() == "present"), m.group(1).strip() if m else _unread(t))
        t, _ = text("tls")
        m = re.search(r"tls switch\[([0-9]+)\]", t)
        r["tls"] = (bool(m), m.group(1) if m else _unread(t))
        t, code = text("npu_ip")
        m = re.search(r"ipaddr:\s*(\S+)", t)
        if m:
            ips[d] = m.group(1)
        r["npu_ip"] = (bool(m), m.group(1) if m else (t.splitlines()[0] if t else "no answer"))
        npus[d] = r
    conf = s.get("hccn.conf")
    return {"devices": npus, "ips": ips, "conf": conf[0] if conf and conf[1] == 0 else None, "conf_name": "hccn.conf",
            "conf_path": "/etc/hccn.conf"}
