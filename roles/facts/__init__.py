"""Facts: what a node is, read in one remote round trip.

``build(dep, node)`` returns one shell script that prints every section
behind a marker line; ``parse(dep, node, stdout)`` turns it into a dict
(``dep``: the cluster's :class:`~llmdeploy.deployment.Deployment`, whose
vendor and unit runtime add their sections).
Neither opens a connection: the runner executes the script.
"""

from __future__ import annotations

import importlib
import re
import shlex
from typing import Callable

from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster, Node
from llmdeploy.runner import FAILED, OK, HostResult, Step
from llmdeploy.sections import MARK, MAX_CPUS, excerpt, number, parse_topo_affinity, section, split_sections  # noqa: F401 (the roles read sections here)
from llmdeploy.sections import cpulist as _cpulist  # noqa: F401
from roles import from_facts, in_one_piece, keep_progress_fd, progress_line

def build(dep: Deployment, node: Node) -> str:
    """The facts script for one node (POSIX sh, read-only). The container
    engine and this cluster's running units are the units' runtime's to
    read (``dep.runtime``: docker, or a launcher's own)."""
    cluster, rt = dep.cluster, dep.runtime
    model = shlex.quote(cluster.model.path)
    parts = [
        section("hostname", "hostname"),
        section("os", "cat /etc/os-release"),
        section("kernel", "uname -r"),
        section("lscpu", "lscpu -e=CPU,NODE"),
        section("numactl", "numactl -H"),
        section("meminfo", "cat /proc/meminfo"),
        # free disk where the model lives (nearest existing parent)
        section("df", f"p={model}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; df -Pk \"$p\""),
        section("addr", "ip -o -4 addr show"),
        section("link", "ip -o link show"),
        # the section keeps docker's name whatever the runtime (what reads the facts knows it so)
        section("docker", rt.engine_script().rstrip()),
        # free space where the tool keeps releases and logs
        section("df_base", f"p={shlex.quote(cluster.base_dir)}; while [ ! -e \"$p\" ]; do p=$(dirname \"$p\"); done; df -Pk \"$p\""),
        # TCP listeners, and this cluster's serving containers (ports they hold are ours)
        section("listen", "ss -Htln"),
        section("ours", rt.running_script().rstrip()),
    ]
    vendor = dep.vendor
    parts += vendor.facts_lines(cluster, node)
    if vendor.IB_PORTS:
        parts.append(section("ibstat", "ibstat"))
    wanted = vendor.container_devices(cluster, node)
    if wanted:
        # the device files a serving container is given: the absent ones are listed
        files = " ".join(shlex.quote(f) for f in wanted)
        parts.append(section("device_files", f'for f in {files}; do [ -e "$f" ] || echo "$f"; done'))
    return "\n".join(parts) + "\n"


def parse_lscpu(text: str) -> dict[int, int]:
    """``lscpu -e=CPU,NODE`` → {cpu: numa node}."""
    out: dict[int, int] = {}
    for line in text.splitlines():
        f = line.split()
        cpu = number(f[0]) if len(f) >= 2 else None
        if cpu is not None:
            out[cpu] = number(f[1]) or 0
    return out


def parse_numactl(text: str) -> list[dict]:
    nodes: dict[int, dict] = {}
    for line in text.splitlines():
        m = re.match(r"node ([0-9]+) (cpus|size|free):\s*(.*)$", line)
        if not m:
            continue
        n = nodes.setdefault(int(m.group(1)), {"id": int(m.group(1)), "cpus": 0, "size_mb": 0, "free_mb": 0})
        if m.group(2) == "cpus":
            n["cpus"] = len(m.group(3).split())
        else:
            n[f"{m.group(2)}_mb"] = number((m.group(3).split() or [""])[0]) or 0
    return [nodes[k] for k in sorted(nodes)]


def parse_meminfo(text: str) -> dict[str, int]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+)", line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def parse_addrs(addr_text: str, link_text: str) -> list[dict]:
    nics: dict[str, dict] = {}
    for line in link_text.splitlines():
        m = re.match(r"^\d+:\s+([^:@]+)(?:@\S+)?:\s+<([^>]*)>.*?\bmtu (\d+).*?\bstate (\S+)", line)
        if m:
            flags = m.group(2).split(",")
            nics[m.group(1)] = {
                "name": m.group(1),
                "up": "UP" in flags and "LOWER_UP" in flags,
                "mtu": int(m.group(3)),
                "state": m.group(4),
                "ipv4": [],
            }
    for line in addr_text.splitlines():
        m = re.match(r"^\d+:\s+(\S+)\s+inet\s+(\S+)", line)
        if m:
            nics.setdefault(m.group(1), {"name": m.group(1), "up": None, "mtu": None, "state": None, "ipv4": []})
            nics[m.group(1)]["ipv4"].append(m.group(2))
    return [n for n in nics.values() if n["name"] != "lo"]


def parse_df(text: str) -> tuple[float | None, str | None]:
    """``df -Pk`` → (free GiB, mount point)."""
    lines = text.splitlines()
    if len(lines) < 2:
        return None, None
    f = lines[-1].split()
    free = number(f[3]) if len(f) > 3 else None
    if free is None:
        return None, None
    return round(free / 1048576, 1), (f[5] if len(f) > 5 else None)


def parse_listen(text: str) -> list[int]:
    """``ss -Htln`` → the TCP ports something listens on."""
    ports = set()
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0] == "LISTEN":
            port = number(f[3].rsplit(":", 1)[-1])
            if port is not None:
                ports.add(port)
    return sorted(ports)


def parse_ibstat(text: str) -> list[dict]:
    """``ibstat`` → one entry per CA port: ca, port, state, phys, rate."""
    ports: list[dict] = []
    ca = None
    for line in text.splitlines():
        m = re.match(r"^CA '([^']+)'", line)
        if m:
            ca = m.group(1)
            continue
        m = re.match(r"^\s+Port ([0-9]+):", line)
        if m and ca:
            ports.append({"ca": ca, "port": int(m.group(1)), "state": None, "phys": None, "rate": None})
            continue
        m = re.match(r"^\s+(State|Physical state|Rate):\s*(\S+)", line)
        if m and ports and ports[-1]["ca"] == ca:
            key = {"State": "state", "Physical state": "phys", "Rate": "rate"}[m.group(1)]
            rate = number(m.group(2)) if key == "rate" else None
            ports[-1][key] = rate if rate is not None else m.group(2)
    return ports


def parse(dep: Deployment, node: Node, stdout: str) -> dict:
    """Facts of one node from the script's output. Missing tools show as None."""
    s = split_sections(stdout)
    cpu_nodes = parse_lscpu(_ok_text(s, "lscpu") or "")
    facts: dict = {"host": node.name, "ip": str(node.ip), "nic_configured": node.nic}
    facts.update(_host_facts(s, node, cpu_nodes))
    cluster, vendor = dep.cluster, dep.vendor
    accel = vendor.devices(s, cpu_nodes)
    facts["accelerator"] = vendor.DEVICE
    if vendor.IB_PORTS:
        facts["ib_ports"] = parse_ibstat(_ok_text(s, "ibstat") or "") if _ok_text(s, "ibstat") is not None else None
    unreadable = _unreadable(vendor.DEVICE_TOOL, node, s, accel, facts)
    if unreadable:
        facts["unreadable"] = unreadable
    for d in accel:
        if d.get("cpu_affinity"):
            d["cpu_list"] = d["cpu_affinity"]
            d["cpu_affinity"] = _compact(d["cpu_affinity"])
    facts["devices"] = accel
    facts["devices_healthy"] = sum(1 for d in accel if d.get("health") == "OK")
    facts["devices_expected"] = node.devices
    mismatch = platform_mismatch(cluster, node, facts, s)
    if mismatch:
        facts["platform_mismatch"] = mismatch
    facts["problems"] = mismatch + _problems(cluster, node, facts, s)
    return facts


def _ok_text(s: dict[str, tuple[str, int | None]], name: str) -> str | None:
    """Section ``name``'s output if its command succeeded, else None."""
    v = s.get(name)
    return v[0] if v and v[1] == 0 else None


def _host_facts(s: dict[str, tuple[str, int | None]], node: Node, cpu_nodes: dict[int, int]) -> dict:
    """What the host says of itself apart from its accelerators: OS, CPUs and
    NUMA, memory, disks, listening ports, our containers, NICs, container
    engine (in the order the facts show them)."""

    def text(name: str) -> str | None:
        return _ok_text(s, name)

    facts: dict = {}
    facts["hostname"] = (text("hostname") or "").strip() or None
    os_text = text("os") or ""
    m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', os_text, re.M)
    facts["os"] = m.group(1) if m else None
    facts["kernel"] = (text("kernel") or "").strip() or None
    numa = parse_numactl(text("numactl") or "")
    facts["cpus"] = len(cpu_nodes) or None
    facts["numa_nodes"] = len(numa) or (len(set(cpu_nodes.values())) or None)
    facts["numa"] = numa
    mem = parse_meminfo(text("meminfo") or "")
    facts["mem_total_gib"] = round(mem["MemTotal"] / 1048576, 1) if "MemTotal" in mem else None
    facts["mem_available_gib"] = round(mem["MemAvailable"] / 1048576, 1) if "MemAvailable" in mem else None
    facts["mem_total_kib"] = mem.get("MemTotal")
    facts["model_disk_free_gib"], facts["model_disk_mount"] = parse_df(text("df") or "")
    facts["base_disk_free_gib"], facts["base_disk_mount"] = parse_df(text("df_base") or "")
    facts["listening"] = parse_listen(text("listen") or "") if text("listen") is not None else None
    facts["our_containers"] = (text("ours") or "").split()
    facts["cpu_nodes"] = {str(c): n for c, n in cpu_nodes.items()}
    facts["nics"] = parse_addrs(text("addr") or "", text("link") or "")
    serving = next((n for n in facts["nics"] if n["name"] == node.nic), None)
    facts["nic"] = serving
    facts["container_engine"] = engine(text("docker") or "")
    return facts


def engine(text: str) -> str | None:
    """The container engine from its section (``UnitRuntime.engine_script``):
    each line ``<name> version <version>[, ...]`` (docker's own: ``Docker
    version 26.1.3, build b72abbb``) as ``<name> <version>``, the parts
    joined with " + " (``-``: a version the node cannot tell, the name
    alone); None when no line says one."""
    parts = [m.group(1).lower() + ("" if m.group(2) == "-" else f" {m.group(2)}")
             for m in re.finditer(r"^(\S+) version ([^,\s]+)", text, re.M)]
    return " + ".join(parts) or None


def _unreadable(device_tool: tuple[str, str], node: Node, s: dict[str, tuple[str, int | None]], accel: list[dict], facts: dict) -> dict[str, str]:
    """What a device table or ibstat printed when it could not be read (or not all of it)
    (``device_tool``: the vendor's (section, tool) of its device table)."""
    unreadable: dict[str, str] = {}
    table, tool = device_tool
    if node.devices and len(accel) < node.devices:
        unreadable[tool] = _printed(s, table)
    if "ib_ports" in facts and not facts["ib_ports"]:
        unreadable["ibstat"] = _printed(s, "ibstat")
    return unreadable


def _printed(s: dict[str, tuple[str, int | None]], name: str) -> str:
    """What section ``name`` of the facts output says, for a problem."""
    if name not in s:
        return "gave no answer (the facts output has no such section: cut short?)"
    text, rc = s[name]
    if rc == 0:
        return f"printed {excerpt(text)}"
    return f"failed (exit {rc if rc is not None else 'unreadable'}): {excerpt(text)}"


def _compact(cpus: list[int]) -> str:
    if not cpus:
        return ""
    ranges, start, prev = [], cpus[0], cpus[0]
    for c in cpus[1:]:
        if c == prev + 1:
            prev = c
            continue
        ranges.append(f"{start}-{prev}" if start != prev else str(start))
        start = prev = c
    ranges.append(f"{start}-{prev}" if start != prev else str(start))
    return ",".join(ranges)


def nic_problems(node: Node, facts: dict) -> list[str]:
    """The serving NIC exists, is up and owns the node's IP (the seed's
    "NIC_NAME must be the interface that owns LOCAL_IP")."""
    nic = facts["nic"]
    if nic is None:
        others = [n["name"] for n in facts["nics"] if any(a.split("/")[0] == str(node.ip) for a in n["ipv4"])]
        hint = f" ({node.ip} is on {others[0]})" if others else ""
        return [f"NIC {node.nic} not found{hint}"]
    out = []
    if not nic["up"]:
        out.append(f"NIC {node.nic} is down (state {nic['state']})")
    if not any(a.split("/")[0] == str(node.ip) for a in nic["ipv4"]):
        owner = next((n["name"] for n in facts["nics"] if any(a.split("/")[0] == str(node.ip) for a in n["ipv4"])), None)
        where = f"{node.ip} is on {owner}" if owner else f"no interface has {node.ip}"
        out.append(f"NIC {node.nic} does not own {node.ip} ({where}; it has {', '.join(nic['ipv4']) or 'no IPv4 address'})")
    return out


def platform_mismatch(cluster: Cluster, node: Node, facts: dict, s: dict[str, tuple[str, int | None]]) -> list[str]:
    """Where the node is not what its platform declares (``llmdeploy.platform``):
    fewer accelerators than it should serve with, or more than the platform has
    (another machine type); one its tool names another model; one that is not
    healthy; a device file a serving container is given that is absent. Each
    names the node and both sides: "sim-a3-2 reports 8 NPUs, platform a3
    declares 16". prepare and deploy refuse the whole cluster on any of them."""
    plat = cluster.platform_info
    word = facts["accelerator"].upper()
    seen = len(facts["devices"])
    want = node.devices or plat.devices
    out = []
    if seen < want or seen > plat.devices:
        if want == plat.devices or seen > plat.devices:
            out.append(f"{node.name} reports {seen} {word}s, platform {cluster.platform} declares {plat.devices}")
        else:
            out.append(f"{node.name} reports {seen} {word}s, its inventory entry declares {want} (devices; platform {cluster.platform}: {plat.devices})")
    models: dict[str, list[str]] = {}
    for d in facts["devices"]:
        if not plat.model_matches(str(d.get("name", ""))):
            models.setdefault(str(d.get("name", "")), []).append(str(d["id"]))
    for name, ids in models.items():
        out.append(f"{node.name} reports {word} {','.join(ids)} as {name!r}, platform {cluster.platform} declares {plat.name} "
                   f"({word}s named {plat.model!r})")
    bad = [d for d in facts["devices"] if d.get("health") != "OK"]
    if bad:
        said = "; ".join(f"{word} {d['id']}: {d.get('health')}" for d in bad)
        out.append(f"{node.name} reports {len(bad)} of its {word}s not healthy ({said}), platform {cluster.platform} declares {plat.devices} healthy")
    absent = s.get("device_files")
    if absent and absent[1] == 0 and absent[0].split():
        out.append(f"{node.name} lacks {', '.join(absent[0].split())}: platform {cluster.platform} gives each serving container these device files")
    return out


def _problems(cluster: Cluster, node: Node, facts: dict, s: dict[str, tuple[str, int | None]]) -> list[str]:
    """What the facts say is wrong for serving; the facts task reports them."""
    out = []
    if node.devices and len(facts["devices"]) < node.devices:
        out.append(f"{len(facts['devices'])} of {node.devices} {facts['accelerator'].upper()}s visible")
        out += [f"{tool} {what}" for tool, what in facts.get("unreadable", {}).items() if tool != "ibstat"]
    bad = [str(d["id"]) for d in facts["devices"] if d.get("health") != "OK"]
    if bad:
        out.append(f"{facts['accelerator'].upper()} {','.join(bad)} not healthy")
        out += [f"{facts['accelerator'].upper()} {d['id']}: {d['health']}" for d in facts["devices"] if str(d.get("health")).startswith("unreadable")]
    out += nic_problems(node, facts)
    if facts["container_engine"] is None:
        # what the engine's section said last (its failure: docker missing, the runtime's reason)
        text, rc = s.get("docker", ("", None))
        said = [ln.strip() for ln in text.splitlines() if ln.strip()]
        why = said[-1][:200] if said else ("no answer" if rc is None else f"exit {rc}")
        out.append(f"no container engine ({why})")
    return out


def probes(refs: list[str]) -> dict[str, Callable[[Deployment, Node], str]]:
    """The read-only probes of the steps ``refs`` (a role's ``PROBES``:
    step -> script builder of (deployment, node)), in order."""
    out = {}
    for ref in refs:
        role, _, step = ref.partition(".")
        try:
            fn = getattr(importlib.import_module(f"roles.{role}"), "PROBES", {}).get(step)
        except ImportError:
            continue  # an unknown step is named when the playbook reaches it
        if fn is not None:
            out[ref] = fn
    return out


def inspect_build(dep: Deployment, node: Node, refs: list[str]) -> str:
    """The facts script plus, in a section each, the probes of the later
    steps: what they would read first on the node (is the image there, what is
    in the model directory, the checksum of a file they write). A step whose
    probe answers decides the host without a round trip of its own. A probe's
    progress lines (the model's checksums) go out as they are printed, on
    the command's stderr (``keep_progress_fd``)."""
    parts = [keep_progress_fd(), build(dep, node)]
    for ref, fn in probes(refs).items():
        # a subshell: a probe's exit ends only itself
        parts.append(section(f"probe {ref}", f"(\n{fn(dep, node).rstrip()}\n)") + "\n")
    return "".join(parts)


def gather_step(dep: Deployment, refs: list[str] | None = None) -> Step:
    def _parse(node: Node, out: str, err: str, code: int) -> HostResult:
        facts = parse(dep, node, out)
        if refs:
            s = split_sections(out)
            facts["probes"] = {ref: s[f"probe {ref}"] for ref in probes(refs) if f"probe {ref}" in s}
        status = OK if facts["hostname"] else FAILED
        msg = ""
        if status == FAILED:
            said = [err.strip()] if err.strip() else []
            if out.strip():  # something else answered (a shell's banner, a cut-short run): show what
                said.append(f"unreadable facts output (no hostname): {excerpt(out)}")
            msg = "; ".join(said) or "facts script printed nothing"
        return HostResult(node.name, status, msg=msg, data=facts, exit_code=code)

    if refs:
        return Step(name="facts", build=lambda node: in_one_piece(inspect_build(dep, node, refs)), parse=_parse, progress=progress_line)
    return Step(name="facts", build=lambda node: in_one_piece(build(dep, node)), parse=_parse)


def platform_check(node: Node, facts: dict) -> HostResult:
    """The node is what its platform declares (:func:`platform_mismatch`); a
    playbook runs this in a play of its own that stops every node on a failure."""
    mismatch = facts.get("platform_mismatch") or []
    if mismatch:
        return HostResult(node.name, FAILED, msg="; ".join(mismatch), data={"mismatch": mismatch})
    return HostResult(node.name, OK, msg=f"{len(facts['devices'])} {facts['accelerator'].upper()}s, as its platform declares")


def platform_step(ctx) -> Step:
    return Step(name="platform", local=from_facts(platform_check, ctx))


def refusal(cluster: Cluster, results: dict[str, HostResult]) -> str | None:
    """Why a run must not start anything (every node's mismatch from its facts), or None."""
    said = [m for r in results.values() if not r.failed for m in ((r.data or {}).get("platform_mismatch") or [])]
    if not said:
        return None
    return f"{cluster.name}: {'; '.join(said)}; nothing was started or changed on any node"


STEPS = {
    "gather": lambda ctx: gather_step(ctx.dep),
    # every node is what its platform declares (after gather or inspect)
    "platform": platform_step,
    # gather, plus the probes of the playbook's later steps (prepare)
    "inspect": lambda ctx: gather_step(ctx.dep, list(ctx.options.get("steps", []))),
}
