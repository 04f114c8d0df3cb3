"""Hardware stand-ins for simulated hosts: ``python -m sim.standins TOOL ARGS``.

Each prints the real tool's output format (shared/DOMAIN.md) from the host's
``node.json``. Unknown arguments fail the way a real tool does: a usage
message on stderr and a non-zero exit.
"""

from __future__ import annotations

import json
import os
import sys

from . import fast

STATE_DIR = os.environ.get("LLMDEPLOY_SIM_STATE", "/etc/llmdeploy-sim")


def _hw() -> dict:
    if fast.rendering() is not None:
        return fast.rendering()
    with open(os.path.join(STATE_DIR, "node.json")) as f:
        return json.load(f)


def _fail(msg: str, code: int = 1) -> int:
    print(msg, file=sys.stderr)
    return code


def _cpulist(lo: int, hi: int) -> str:
    return f"{lo}-{hi}"


# --- npu-smi ------------------------------------------------------------------------
def npu_smi(argv: list[str]) -> int:
    hw = _hw()
    if not hw["npus"]:
        return _fail("npu-smi: command not found", 127)
    if argv == ["info"]:
        print("+" + "-" * 94 + "+")
        print(f"| npu-smi 25.2.0                   Version: 25.2.0{' ' * 46}|")
        print("+---------------------------+---------------+" + "-" * 50 + "+")
        print("| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|")
        print("| Chip  Phy-ID              | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |")
        print("+===========================+===============+" + "=" * 50 + "+")
        for n in hw["npus"]:
            print(f"| {n['npu']:<5} {n['name']:<19} | {n['health']:<13} | {'92.5':<11} {'38':<17} {'0    / 0':<21}|")
            hbm = f"{n.get('hbm_used_mib', 3390)} / {n['hbm_mib']}"
            print(f"| {n['chip']:<5} {n['id']:<19} | {n['bus_id']:<13} | {str(n.get('aicore_pct', 0)):<11} {'0    / 0':<17} {hbm:<21}|")
            print("+===========================+===============+" + "=" * 50 + "+")
        print("| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |")
        print("+===========================+===============+" + "=" * 50 + "+")
        for n in hw["npus"]:
            print(f"| No running processes found in NPU {n['npu']}{' ' * 58}|")
        print("+===========================+===============+" + "=" * 50 + "+")
        return 0
    if argv[:3] == ["info", "-t", "topo"]:
        ids = [n["id"] for n in hw["npus"]]
        print("       " + "".join(f"NPU{i:<7}" for i in ids) + "CPU Affinity")
        numa = {x["id"]: x for x in hw["numa_nodes"]}
        for n in hw["npus"]:
            cells = "".join(f"{('X' if m == n['id'] else 'HCCS'):<10}" for m in ids)
            lo, hi = numa[n["numa"]]["cpus"]
            print(f"NPU{n['id']:<4}{cells}{_cpulist(lo, hi)}")
        print("\nLegend:\n\n  X    = Self\n  SYS  = Path traversing PCIe and NUMA nodes.\n  HCCS = Connection traversing HCCS.")
        return 0
    if argv[:1] == ["info"] and "-l" in argv:
        print(f"        Total Count                    : {len({n['npu'] for n in hw['npus']})}")
        return 0
    return _fail(f"npu-smi: invalid arguments: {' '.join(argv)}\nUsage: npu-smi info [-t TYPE] [-i ID] [-c CHIP]", 2)


# --- hccn_tool -------------------------------------------------------------------------
def hccn_tool(argv: list[str]) -> int:
    hw = _hw()
    if len(argv) < 4 or argv[0] != "-i" or argv[-1] != "-g":
        return _fail("hccn_tool: usage: hccn_tool -i <device_id> -<item> -g", 2)
    try:
        dev = int(argv[1])
    except ValueError:
        return _fail(f"hccn_tool: invalid device id {argv[1]!r}", 2)
    npus = {n["id"]: n for n in hw["npus"]}
    if dev not in npus:
        return _fail(f"Device id {dev} is invalid.", 1)
    n = npus[dev]
    item = argv[2]
    if item == "-ip":
        if not n.get("ip"):
            print("Get ipconf failed, because no ip was preset there!")
            return 1
        print(f"ipaddr:{n['ip']}\nnetmask:{n['netmask']}")
        return 0
    if item == "-vnic":
        if not n.get("ip"):
            print("Get vnic ip failed, because no ip was preset there!")
            return 1
        print(f"vnic ipaddr:{n['ip']}\nvnic netmask:{n['netmask']}")
        return 0
    if item == "-link":
        # the real interface's state when the host has one (sim.up makes npu<d>)
        state = n["link"]
        try:
            if fast.rendering() is not None:
                raise OSError("rendering: node.json's state (the wrapper reads the interface)")
            with open(f"/sys/class/net/npu{dev}/operstate") as f:
                if f.read().strip() != "up":
                    state = "DOWN"
        except OSError:
            pass
        print(f"link status: {state}")
        return 0
    if item == "-net_health":
        print(f"net health status: {n['net_health']}")
        return 0
    if item == "-netdetect":
        print(f"netdetect address: {n.get('netdetect') or ''}".rstrip())
        return 0
    if item == "-gateway":
        if n.get("gateway"):
            print(f"default gateway:{n['gateway']}, Iface:eth{dev}")
        else:
            print("default gateway:, Iface:")
        return 0
    if item == "-lldp":
        if not n.get("lldp_ifname"):
            print("Get lldp information failed")
            return 1
        print("Chassis ID TLV\n\tMAC: 70:d0:0b:1c:2a:01\nPort ID TLV\n\tIfname: " + n["lldp_ifname"]
              + "\nTime to Live TLV\n\t121\nSystem Name TLV\n\tleaf-01")
        return 0
    if item == "-tls":
        print(f"dev_id:{dev}, tls switch[{n.get('tls', 0)}](0:disable, 1:enable), tls preconfigured[1](0:non-preset, 1:preset), tls alarm time threshold[60]days")
        return 0
    if item == "-optical":
        if n.get("optical") != "present":
            print("present: not present")
            return 0
        print("present: present\nTemperature: 45 C\nTx Power: 1.2 mW\nRx Power: 1.1 mW")
        return 0
    return _fail(f"hccn_tool: unsupported item {item}", 2)


# --- nvidia-smi -------------------------------------------------------------------------
_QUERY = {
    "index": lambda g: str(g["id"]),
    "name": lambda g: g["name"],
    "uuid": lambda g: g["uuid"],
    "memory.total": lambda g: str(g["mem_mib"]),
    # what the GPU is doing: node.json's values (a test sets them), idle by default
    "memory.used": lambda g: str(g.get("mem_used_mib", 0)),
    "utilization.gpu": lambda g: str(g.get("util_pct", 0)),
    "pci.bus_id": lambda g: g["bus_id"],
    "ecc.errors.uncorrected.volatile.total": lambda g: str(g["ecc_uncorrected"]),
    "driver_version": lambda g: "580.95.05",
}


def _visible_gpus(gpus: list[dict], dev: str = "/dev") -> list[dict]:
    """The GPUs this process may open, numbered from 0 in the order of the
    rest, as NVML enumerates them under a device cgroup (a Slurm step sees only
    the GPUs it asked for, ConstrainDevices). A GPU without a device file here
    (a host outside Slurm) counts as open."""
    mine = [g for g in gpus if not fast.gpu_denied(os.path.join(dev, f"nvidia{g['id']}"))]
    # "phys": the GPU's own index, for what follows the hardware (its NUMA node)
    return [dict(g, id=i, phys=g["id"]) for i, g in enumerate(mine)]


def nvidia_smi(argv: list[str]) -> int:
    hw = _hw()
    if not hw["gpus"]:
        return _fail("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.", 9)
    gpus = _visible_gpus(hw["gpus"])
    if not gpus:
        # NVML finds none it may open (NVML_ERROR_NOT_FOUND is 6)
        print("No devices were found")
        return 6
    query = next((a.split("=", 1)[1] for a in argv if a.startswith("--query-gpu=")), None)
    if query is not None:
        fields = [f.strip() for f in query.split(",")]
        bad = [f for f in fields if f not in _QUERY]
        if bad:
            return _fail(f'Field "{bad[0]}" is not a valid field to query.', 2)
        header = "noheader" not in " ".join(argv)
        units = "nounits" not in " ".join(argv)
        if header:
            print(", ".join(fields))
        for g in gpus:
            unit = {"memory.total": " MiB", "memory.used": " MiB", "utilization.gpu": " %"}
            vals = [_QUERY[f](g) + (unit.get(f, "") if units else "") for f in fields]
            print(", ".join(vals))
        return 0
    if argv[:2] == ["topo", "-m"]:
        ids = [g["id"] for g in gpus]
        gb = hw["platform"] in ("gb200", "gb300")
        head = "\t" + "\t".join(f"GPU{i}" for i in ids) + "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"
        print(head)
        numa = {x["id"]: x for x in hw["numa_nodes"]}
        cpu_numa = [x for x in hw["numa_nodes"] if x["cpus"]]
        for g in gpus:
            cells = "\t".join(" X " if i == g["id"] else "NV18" for i in ids)
            lo, hi = numa[g["numa"]]["cpus"]
            gpu_numa = str(len(cpu_numa) + g["phys"]) if gb else "N/A"
            print(f"GPU{g['id']}\t{cells}\t{lo}-{hi}\t{g['numa']}\t\t{gpu_numa}")
        print("\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes\n  NV#  = Connection traversing a bonded set of # NVLinks")
        return 0
    if argv == ["-L"]:
        for g in gpus:
            print(f"GPU {g['id']}: {g['name']} (UUID: {g['uuid']})")
        return 0
    if not argv:
        print("NVIDIA-SMI 580.95.05   Driver Version: 580.95.05   CUDA Version: 13.0")
        for g in gpus:
            print(f"|   {g['id']}  {g['name']:<28} On  |   {g['bus_id']} Off |   0 |")
        return 0
    return _fail(f"Invalid combination of input arguments: {' '.join(argv)}", 2)


# --- lscpu / numactl ------------------------------------------------------------------------
def lscpu(argv: list[str]) -> int:
    hw = _hw()
    cpu_nodes = [x for x in hw["numa_nodes"] if x["cpus"]]
    if any(a.startswith("-e=") or a.startswith("--extended=") for a in argv) or argv == ["-e"]:
        print("CPU NODE")
        for x in cpu_nodes:
            lo, hi = x["cpus"]
            for c in range(lo, hi + 1):
                print(f"{c:>3} {x['id']:>4}")
        return 0
    if not argv:
        print("Architecture:            " + ("aarch64" if hw["platform"] in ("a3", "a2", "gb200", "gb300") else "x86_64"))
        print(f"CPU(s):                  {hw['cpus']}")
        print(f"NUMA node(s):            {len(hw['numa_nodes'])}")
        for x in hw["numa_nodes"]:
            cpus = f"{x['cpus'][0]}-{x['cpus'][1]}" if x["cpus"] else ""
            print(f"NUMA node{x['id']} CPU(s):{' ' * 6}{cpus}")
        return 0
    return _fail(f"lscpu: unsupported option {' '.join(argv)}", 1)


def numactl(argv: list[str]) -> int:
    hw = _hw()
    if argv in (["-H"], ["--hardware"]):
        nodes = hw["numa_nodes"]
        print(f"available: {len(nodes)} nodes (0-{len(nodes) - 1})")
        for x in nodes:
            cpus = " ".join(str(c) for c in range(x["cpus"][0], x["cpus"][1] + 1)) if x["cpus"] else ""
            print(f"node {x['id']} cpus: {cpus}".rstrip() if not cpus else f"node {x['id']} cpus: {cpus}")
            print(f"node {x['id']} size: {x['mem_mib']} MB")
            print(f"node {x['id']} free: {int(x['mem_mib'] * 0.93)} MB")
        print("node distances:")
        print("node " + "".join(f"{x['id']:>4}" for x in nodes))
        for x in nodes:
            print(f"{x['id']:>3}: " + "".join(f"{(10 if x is y else 20):>4}" for y in nodes))
        return 0
    # numactl [options] command ...: run the command (binding is simulated);
    # a node list naming a NUMA node the host does not have fails like numactl
    rest = list(argv)
    node_opts = {"-m": "membind", "--membind": "membind", "-N": "cpunodebind", "--cpunodebind": "cpunodebind",
                 "-i": "interleave", "--interleave": "interleave", "-p": "preferred", "--preferred": "preferred"}
    ids = {x["id"] for x in hw.get("numa_nodes") or []}
    while rest and rest[0].startswith("-"):
        opt = rest.pop(0)
        name, eq, value = opt.partition("=")
        if name in node_opts or opt in ("-C", "--physcpubind"):
            if not eq:
                if not rest:
                    break
                value = rest.pop(0)
            if name in node_opts and ids:
                bad = _bad_numa_node(value, ids)
                if bad is not None:
                    return _fail(f"libnuma: Warning: node argument {bad} is out of range\n\n<{value}> is invalid\n"
                                 "usage: numactl [--all | -a] [--interleave= | -i <nodes>] [--preferred= | -p <node>]\n"
                                 "               [--physcpubind= | -C <cpus>] [--cpunodebind= | -N <nodes>]\n"
                                 "               [--membind= | -m <nodes>] [--localalloc | -l] command args ...", 1)
    if rest:
        os.execvp(rest[0], rest)
    return _fail("usage: numactl [--hardware] [-m nodes] command", 1)


def _bad_numa_node(spec: str, ids: set[int]) -> int | str | None:
    """The first node of a numactl node list (``0,1``, ``0-3``, ``all``) the host lacks."""
    if spec in ("all", ""):
        return None
    for part in spec.lstrip("!+").split(","):
        lo, sep, hi = part.partition("-")
        try:
            rng = range(int(lo), int(hi) + 1) if sep else [int(lo)]
        except ValueError:
            return part
        for n in rng:
            if n not in ids:
                return n
    return None


# --- ibstat ------------------------------------------------------------------------------
def ibstat(argv: list[str]) -> int:
    hw = _hw()
    ports = hw.get("ib_ports") or []
    if not ports:
        return _fail("ibpanic: [12] main: stat of IB device 'mthca0' failed: No such file or directory", 255)
    for p in ports:
        if argv and argv[0] != p["ca"]:
            continue
        print(f"CA '{p['ca']}'")
        print("\tCA type: MT4129\n\tNumber of ports: 1\n\tFirmware version: 28.43.1014\n\tHardware version: 0")
        print(f"\tNode GUID: 0x{p['guid']}\n\tSystem image GUID: 0x{p['guid']}")
        print("\tPort 1:")
        print(f"\t\tState: {p['state']}\n\t\tPhysical state: {p['phys']}\n\t\tRate: {p['rate']}")
        print(f"\t\tBase lid: {p['lid']}\n\t\tLMC: 0\n\t\tSM lid: 1\n\t\tCapability mask: 0xa751e848")
        print(f"\t\tPort GUID: 0x{p['guid']}\n\t\tLink layer: InfiniBand")
    return 0


def _lazy(module: str, attr: str):
    """A tool from a module imported only when it runs (vllm's imports http.server: ~25 ms)."""
    def run(argv: list[str]) -> int:
        import importlib

        return getattr(importlib.import_module(f"sim.standins.{module}"), attr)(argv)

    return run


TOOLS = {
    "npu-smi": npu_smi,
    "hccn_tool": hccn_tool,
    "nvidia-smi": nvidia_smi,
    "lscpu": lscpu,
    "numactl": numactl,
    "ibstat": ibstat,
    # inside the simulated images (sim/images.py)
    "vllm": _lazy("vllm", "main"),
    "trtllm-serve": _lazy("trtllm", "main"),
    # one rank of an MPI job under the real mpirun (sim/standins/nccl_tests.py)
    "all_reduce_perf": _lazy("nccl_tests", "main"),
    # the host's docker when node.json "slow" paces a pull or a load (sim/standins/slow.py)
    "docker": _lazy("slow", "docker"),
}


def _hang(tool: str) -> None:
    """Fault injection: ``node.json`` ``{"hang": {"npu-smi": 30}}`` makes the
    tool sleep that long before answering (a wedged driver, a hung command)."""
    try:
        seconds = float((_hw().get("hang") or {}).get(tool, 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return
    if seconds > 0:
        import time

        time.sleep(seconds)


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] not in TOOLS:
        return _fail(f"usage: python -m sim.standins {{{','.join(TOOLS)}}} ...", 2)
    tool = sys.argv[1]
    _hang(tool)
    if tool in fast.CACHED_TOOLS:
        return fast.serve(STATE_DIR, tool, sys.argv[2:], TOOLS)
    return TOOLS[tool](sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
