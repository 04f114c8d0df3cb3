"""Huawei Ascend NPUs (Atlas 800 A2, A3): what the vendor means to the tool.

The facts read the NPUs from ``npu-smi info`` (one device per chip), their
CPU affinity from ``npu-smi info -t topo`` and each NPU's own address from
``hccn_tool -i N -ip -g`` (A2) or ``-vnic -g`` (A3); a serving container
gets every ``/dev/davinciN`` of the node and the three control devices;
verify-comm runs hccn_tool's link checks and the NPU ping matrix
(:mod:`platforms.ascend.comm`); a log bundle adds ``npu-smi info``.

The communication library is HCCL (its variables come from the serving
system's profile, ``systems/vllm_ascend``). Imports only ``llmdeploy``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Literal

from llmdeploy.inventory import Cluster, Node
from llmdeploy.platform import Platform
from llmdeploy.sections import answered, placed, section

# re-exported: the device_pings method's members (llmdeploy.platform.Vendor), from .comm
from .comm import HCCN as HCCN, LINK_CHECKS as LINK_CHECKS, LINK_TOOL as LINK_TOOL, PING_PRELUDE as PING_PRELUDE
from .comm import link_script as link_script, parse_links as parse_links, ping_job as ping_job

VENDOR = "ascend"


class AscendPlatform(Platform):
    # how an NPU's own address is read: A2 ``hccn_tool -ip -g``, A3 ``-vnic -g``
    npu_ip_query: Literal["ip", "vnic"]
    # hccn_tool's NPU-to-NPU ping across nodes: A2 ``-ping``, A3 ``-hccs_ping``
    ping_flag: Literal["-ping", "-hccs_ping"]


PLATFORMS: dict[str, Platform] = {
    # npu-smi names an A3 chip "Ascend910" (the 910C's two dies: 16 chips on 8 NPUs), an A2 one "910B1".."910B4"
    "a3": AscendPlatform(name="Atlas 800 A3", vendor=VENDOR, devices=16, model=r"Ascend910\S*", npu_ip_query="vnic", ping_flag="-hccs_ping"),
    "a2": AscendPlatform(name="Atlas 800 A2", vendor=VENDOR, devices=8, model=r"(Ascend)?910B\S*", npu_ip_query="ip", ping_flag="-ping"),
}

DEVICE = "npu"
# the facts section with the device table, and the command people know it by
DEVICE_TOOL = ("npusmi", "npu-smi info")
IB_PORTS = False
# Ascend's units run with Docker under Slurm too: the NPUs reach a container through docker's
# --device list and the driver's mounts (the seed's docker run), which a pyxis step does not make
SCHEDULED_CONTAINERS: tuple[str, ...] = ("docker",)
COMM_METHOD: Literal["device_pings", "collective"] = "device_pings"
LOG_FILES = {"npu-smi.txt": "npu-smi info 2>&1"}
TOP_QUERY = "if command -v npu-smi >/dev/null; then npu-smi info; fi"
# seed 001, "Docker Image Installation": every container gets these beside its /dev/davinciN
CONTROL_DEVICES = ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]


def row(cluster: Cluster) -> AscendPlatform:
    return PLATFORMS[cluster.platform]  # type: ignore[return-value]


def facts_lines(cluster: Cluster, node: Node) -> list[str]:
    """The device table, its topology, and every NPU's own address."""
    plat = row(cluster)
    query = "-vnic" if plat.npu_ip_query == "vnic" else "-ip"
    lines = [section("npusmi", "npu-smi info"), section("npusmi_topo", "npu-smi info -t topo"), HCCN]
    for i in range(node.devices or plat.devices):
        lines.append(section(f"npu_ip {i}", f'"$HCCN" -i {i} {query} -g'))
    return lines


def parse_npu_smi(text: str) -> list[dict]:
    """``npu-smi info`` device table → one entry per logical device (chip).

    Each device takes two rows: ``| NPU Name | Health | ...`` and
    ``| Chip [Phy-ID] | Bus-Id | ...``.
    """
    devices: list[dict] = []
    rows = [ln for ln in text.splitlines() if ln.startswith("|")]
    i = 0
    while i < len(rows) - 1:
        a = [c.strip() for c in rows[i].strip("|").split("|")]
        b = [c.strip() for c in rows[i + 1].strip("|").split("|")]
        ma, mb = re.match(r"^([0-9]+)\s+(\S.*)$", a[0]), re.match(r"^([0-9]+)", b[0])
        if len(a) >= 2 and len(b) >= 2 and ma and mb and re.match(r"^[0-9A-Fa-f]{4}:", b[1]):
            name = ma.group(2)
            devices.append(
                {
                    "id": len(devices),
                    "npu": int(ma.group(1)),
                    "chip": int(mb.group(1)),
                    "name": name.strip(),
                    "health": a[1],
                    "bus_id": b[1],
                }
            )
            i += 2
        else:
            i += 1
    return devices


def devices(sections: dict[str, tuple[str, int | None]], cpu_nodes: dict[int, int]) -> list[dict]:
    """The NPUs from ``npu-smi info``, each with its CPU affinity, NUMA node and ``hccn_tool`` IP."""
    accel = placed(parse_npu_smi(answered(sections, "npusmi")), answered(sections, "npusmi_topo"), "NPU", cpu_nodes)
    for d in accel:
        ip_out = sections.get(f"npu_ip {d['id']}")
        m = re.search(r"ipaddr:\s*(\S+)", ip_out[0]) if ip_out and ip_out[1] == 0 else None
        d["ip"] = m.group(1) if m else None
    return accel


def container_devices(cluster: Cluster, node: Node) -> list[str]:
    """Every NPU of the node (``/dev/davinciN``), then the control devices."""
    return [f"/dev/davinci{d}" for d in range(node.devices or row(cluster).devices)] + list(CONTROL_DEVICES)


# npu-smi info: the second line of each NPU's block, "| chip phy-id | bus-id | AICore(%) Memory-Usage(MB) HBM-Usage(MB) |"
_NPU_LINE = re.compile(r"^\|\s*(\d+)\s+(\d+)\s*\|\s*[0-9A-Fa-f:.]+\s*\|\s*(\d+(?:\.\d+)?)\s+\d+\s*/\s*\d+\s+(\d+)\s*/\s*(\d+)\s*\|")


def parse_top(text: str) -> list[dict]:
    """``npu-smi info`` → per NPU its AICore use and HBM."""
    out = []
    for line in text.splitlines():
        m = _NPU_LINE.match(line)
        if m:
            out.append({"id": int(m.group(2)), "util_pct": float(m.group(3)), "mem_used_mib": float(m.group(4)), "mem_total_mib": float(m.group(5))})
    return out


# this plug-in's conformance, for the type checker (the registry checks it again when it loads)
if TYPE_CHECKING:  # pragma: no cover - types only
    import platforms.ascend as _this
    from llmdeploy.platform import Vendor

    _conforms: Vendor = _this
