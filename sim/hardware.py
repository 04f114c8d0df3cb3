"""Per-node hardware descriptions for the simulated hosts.

Every simulated node shares this machine's kernel, so /proc, lscpu and numactl
would look the same everywhere. Each host instead gets a ``node.json`` that
the stand-ins read (and a private /proc/meminfo bind-mounted over the real
one). Tests change a host's hardware by editing its ``node.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from llmdeploy.inventory import Cluster, Node
from sim.paths import SIM_LATENCY
from sim.standins.slow import KNOBS as SLOW_KNOBS

GIB_KIB = 1024 * 1024

# cpus, NUMA nodes with CPUs, host memory (GiB), accelerator model
_SHAPES = {
    "a3": dict(cpus=320, cpu_numa=4, mem_gib=1536, model="Ascend910", chips_per_npu=2),
    "a2": dict(cpus=192, cpu_numa=4, mem_gib=1024, model="910B3", chips_per_npu=1),
    "b200": dict(cpus=224, cpu_numa=2, mem_gib=2048, model="NVIDIA B200", gpu_mem_mib=183359),
    "b300": dict(cpus=224, cpu_numa=2, mem_gib=2048, model="NVIDIA B300 SXM6 AC", gpu_mem_mib=275040),
    "gb200": dict(cpus=144, cpu_numa=2, mem_gib=840, model="NVIDIA GB200", gpu_mem_mib=189471),
    "gb300": dict(cpus=144, cpu_numa=2, mem_gib=840, model="NVIDIA GB300", gpu_mem_mib=284208),
    # Hopper HGX (8 SXM GPUs, two x86 sockets): what nvidia-smi names them and the MiB it reports
    "h100": dict(cpus=224, cpu_numa=2, mem_gib=2048, model="NVIDIA H100 80GB HBM3", gpu_mem_mib=81559),
    "h200": dict(cpus=224, cpu_numa=2, mem_gib=2048, model="NVIDIA H200", gpu_mem_mib=143771),
}


def node_hardware(cluster: Cluster, index: int, node: Node) -> dict:
    """The description of one simulated host's hardware (node.json)."""
    shape = _SHAPES[cluster.platform]
    plat = cluster.platform_info
    cpus, numa = shape["cpus"], shape["cpu_numa"]
    per_numa = cpus // numa
    numa_nodes = [
        {"id": i, "cpus": [i * per_numa, (i + 1) * per_numa - 1], "mem_mib": shape["mem_gib"] * 1024 // numa}
        for i in range(numa)
    ]
    hw: dict = {
        "platform": cluster.platform,
        "hostname": node.name,
        "cpus": cpus,
        "numa_nodes": numa_nodes,
        "mem_total_kib": shape["mem_gib"] * GIB_KIB,
        "npus": [],
        "gpus": [],
        # the serving stand-ins' pace (sim/standins/streaming.py); a test makes a release slower here
        "latency": dict(SIM_LATENCY),
        # long steps made long (sim/standins/slow.py): a paced image pull or load, slower checksums; 0: none
        "slow": dict(SLOW_KNOBS),
        # the host's links (sim/links.py): Mbit/s on its management and data veths; None: unshaped
        "net": {"mbit": None},
    }
    if plat.vendor == "ascend":
        hw["devices"] = [f"/dev/davinci{d}" for d in range(plat.devices)] + ["/dev/davinci_manager", "/dev/devmm_svm", "/dev/hisi_hdc"]
        chips = shape["chips_per_npu"]
        for d in range(plat.devices):
            hw["npus"].append(
                {
                    "id": d,
                    "npu": d // chips,
                    "chip": d % chips,
                    "name": shape["model"],
                    "health": "OK",
                    "bus_id": f"0000:{0x9D + 2 * d:02X}:00.0",
                    "numa": d * numa // plat.devices,
                    "hbm_mib": 65536,
                    # NPU-side RoCE / vNIC address (hccn_tool -ip -g / -vnic -g):
                    # NPU d of every node in its own /24 (test range), on a
                    # real interface npu<d> of the host (see sim.cluster)
                    "ip": npu_ip(d, index),
                    "netmask": "255.255.255.0",
                    "link": "UP",
                    "net_health": "Success",
                    "netdetect": npu_gateway(d),
                    "gateway": npu_gateway(d),
                    "lldp_ifname": f"400GE1/{index // 8}/{(index % 8) * 16 + d + 1}",
                    "tls": 0,
                    "optical": "present",
                }
            )
    else:
        for d in range(plat.devices):
            hw["gpus"].append(
                {
                    "id": d,
                    "name": shape["model"],
                    "uuid": f"GPU-{index:04x}{d:04x}-5e1d-4a0c-9b1c-{cluster.name.encode().hex()[:12]:0<12}",
                    "bus_id": f"00000000:{0x18 + 0x10 * d:02X}:00.0",
                    "mem_mib": shape["gpu_mem_mib"],
                    "numa": d * numa // plat.devices,
                    "ecc_uncorrected": 0,
                }
            )
        hw["ib_ports"] = [
            {"ca": f"mlx5_{d}", "state": "Active", "phys": "LinkUp", "rate": 400, "lid": 100 * (index + 1) + d,
             "guid": f"{0xb83fd20300000000 + (index << 8) + d:016x}"}
            for d in range(plat.devices)
        ]
        if cluster.platform in ("gb200", "gb300"):
            # Grace-Blackwell: each GPU's memory shows as a CPU-less NUMA node.
            for d in range(plat.devices):
                hw["numa_nodes"].append({"id": numa + d, "cpus": None, "mem_mib": shape["gpu_mem_mib"]})
    return hw


def npu_ip(device: int, index: int) -> str:
    return f"198.19.{128 + device}.{10 + index}"


def npu_gateway(device: int) -> str:
    return f"198.19.{128 + device}.1"


def hccn_conf(hw: dict) -> str:
    """/etc/hccn.conf as hccn_tool writes it."""
    lines = []
    for n in hw["npus"]:
        lines += [f"address_{n['id']}={n['ip']}", f"netmask_{n['id']}={n['netmask']}",
                  f"netdetect_{n['id']}={n['netdetect']}", f"gateway_{n['id']}={n['gateway']}"]
    return "\n".join(lines) + "\n"


def meminfo(hw: dict) -> str:
    total = hw["mem_total_kib"]
    free = int(total * 0.93)
    return (
        f"MemTotal:       {total} kB\n"
        f"MemFree:        {free} kB\n"
        f"MemAvailable:   {int(total * 0.95)} kB\n"
        f"Buffers:        {int(total * 0.001)} kB\n"
        f"Cached:         {int(total * 0.01)} kB\n"
        f"SwapTotal:      0 kB\n"
        f"SwapFree:       0 kB\n"
    )


def load(state_dir: str | Path) -> dict:
    return json.loads((Path(state_dir) / "node.json").read_text())


def save(state_dir: str | Path, hw: dict) -> None:
    path = Path(state_dir) / "node.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(hw, indent=1))
    tmp.replace(path)
