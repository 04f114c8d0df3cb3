"""NVIDIA GPUs (B200, B300, GB200, GB300, H200): what the vendor means to the tool.

The facts read the GPUs from ``nvidia-smi --query-gpu`` (an uncorrected
ECC count is a GPU's health), their CPU affinity from ``nvidia-smi topo
-m`` and the InfiniBand ports from ``ibstat`` (``cluster.ib_rate``); a
serving container reaches the GPUs through the NVIDIA container runtime
(``--gpus``, the serving systems' ``docker run``), so no device file is
passed one by one; verify-comm reads the GPUs and their topology from the
facts and runs ``all_reduce_perf`` over every GPU (NCCL; Gloo bootstraps
over the serving NIC); a log bundle adds ``nvidia-smi``.

Imports only ``llmdeploy``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import re

from llmdeploy.inventory import Cluster, Node
from llmdeploy.platform import Platform
from llmdeploy.sections import answered, excerpt, number, placed, section

VENDOR = "nvidia"

PLATFORMS: dict[str, Platform] = {
    "b200": Platform(name="B200", vendor=VENDOR, devices=8, model=r"NVIDIA B200.*"),
    "b300": Platform(name="B300", vendor=VENDOR, devices=8, model=r"NVIDIA B300.*"),
    "gb200": Platform(name="GB200", vendor=VENDOR, devices=4, model=r"NVIDIA GB200.*"),
    "gb300": Platform(name="GB300", vendor=VENDOR, devices=4, model=r"NVIDIA GB300.*"),
    # Hopper: named by the TensorRT-LLM guide (seed 000) and SGLang's multi-node docs
    "h200": Platform(name="H200", vendor=VENDOR, devices=8, model=r"NVIDIA H200.*"),
}

DEVICE = "gpu"
DEVICE_TOOL = ("nvsmi", "nvidia-smi")
IB_PORTS = True
# NVIDIA's GPU Slurm sites run containers as pyxis + enroot steps (srt-slurm, Dynamo's and TensorRT-LLM's
# Slurm examples: srun --container-image ... --mpi pmix); Docker on the node stays possible
SCHEDULED_CONTAINERS: tuple[str, ...] = ("pyxis", "docker")
COMM_METHOD: Literal["device_pings", "collective"] = "collective"
LOG_FILES = {"nvidia-smi.txt": "nvidia-smi 2>&1"}
GPU_QUERY = "index,utilization.gpu,memory.used,memory.total"
TOP_QUERY = f"if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu={GPU_QUERY} --format=csv,noheader,nounits; fi"


def facts_lines(cluster: Cluster, node: Node) -> list[str]:
    """The GPU table (health: the uncorrected ECC count) and the topology."""
    return [
        section(
            "nvsmi",
            "nvidia-smi --query-gpu=index,name,uuid,memory.total,pci.bus_id,"
            "ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits",
        ),
        section("nvtopo", "nvidia-smi topo -m"),
    ]


def parse_nvsmi(text: str) -> list[dict]:
    gpus = []
    for line in text.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) >= 6 and number(f[0]) is not None:
            ecc = f[5]
            if ecc in ("0", "[N/A]", "N/A"):
                health = "OK"
            elif number(ecc) is not None or re.fullmatch(r"\[[^\]]+\]", ecc):  # a count, or nvidia-smi's [Not Supported]
                health = f"ECC errors: {ecc}"
            else:  # cut short or garbled: show the line
                health = f"unreadable nvidia-smi line: {excerpt(line)}"
            gpus.append(
                {
                    "id": number(f[0]),
                    "name": f[1],
                    "uuid": f[2],
                    "mem_mib": number(f[3]),
                    "bus_id": f[4],
                    "health": health,
                }
            )
    return gpus


def devices(sections: dict[str, tuple[str, int | None]], cpu_nodes: dict[int, int]) -> list[dict]:
    """The GPUs from ``nvidia-smi``, each with its CPU affinity and NUMA node."""

    return placed(parse_nvsmi(answered(sections, "nvsmi")), answered(sections, "nvtopo"), "GPU", cpu_nodes)


def container_devices(cluster: Cluster, node: Node) -> list[str]:
    """None one by one: the container runtime passes the GPUs (``--gpus``)."""
    return []


def parse_top(text: str) -> list[dict]:
    """``nvidia-smi --query-gpu=GPU_QUERY`` → per GPU its use and memory."""
    out = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == 4 and cells[0].isdigit():
            def num(v):
                try:
                    return float(v)
                except ValueError:  # [N/A], [Not Supported]
                    return None
            out.append({"id": int(cells[0]), "util_pct": num(cells[1]), "mem_used_mib": num(cells[2]), "mem_total_mib": num(cells[3])})
    return out


def comm_device_checks(cluster: Cluster, node: Node, facts: dict) -> dict[str, dict]:
    """verify-comm's checks of a node's GPUs from its facts: every GPU the
    node should have is visible and healthy, and each has a CPU affinity."""
    want = node.devices or PLATFORMS[cluster.platform].devices
    gpus = facts["devices"]
    unhealthy = [f"gpu{g['id']}: {g['health']}" for g in gpus if g.get("health") != "OK"]
    return {
        "gpus": {"ok": len(gpus) == want and not unhealthy, "summary": f"{len(gpus) - len(unhealthy)}/{want}",
                 "failures": unhealthy + ([f"{len(gpus)} of {want} GPUs visible"] if len(gpus) != want else [])},
        "topology": {"ok": all(g.get("cpu_affinity") for g in gpus) and bool(gpus), "summary": "read" if gpus else "-",
                     "failures": [f"gpu{g['id']}: no CPU affinity in nvidia-smi topo -m" for g in gpus if not g.get("cpu_affinity")]},
    }


# this plug-in's conformance, for the type checker (the registry checks it again when it loads)
if TYPE_CHECKING:  # pragma: no cover - types only
    import platforms.nvidia as _this
    from llmdeploy.platform import Vendor

    _conforms: Vendor = _this
