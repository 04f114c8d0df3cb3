"""Multi-node communication checks (shared/DOMAIN.md), as builders and parsers.

Ascend, per node and NPU: ``hccn_tool -i N`` link, net_health, netdetect,
gateway, lldp, tls, optical, and the NPU's own IP (A2 ``-ip``, A3 ``-vnic``),
plus ``/etc/hccn.conf``; across nodes, NPU pings (A2 ``-ping``, A3
``-hccs_ping``) run in parallel on every node.

The ping plan: NPU ``d`` of a node pings NPU ``d`` of every other node (the
cross-node links HCCL's rings use). That full matrix is
``nodes x (nodes - 1) x NPUs`` pings; above ``full_max`` it is sampled: each
ordered node pair gets one ping, from NPU ``(i + j) mod NPUs``, which covers
every node pair, and every NPU index on every node once there are at least
as many peers as NPUs; indices a node would miss are added with one ping to
the next peer. ``--full`` forces the full matrix.

NVIDIA: the facts script's GPU, topology and ibstat sections, the NCCL
interface, and an ``all_reduce_perf`` run under ``mpirun`` from node 0.
"""

from __future__ import annotations

import re
import shlex

from llmdeploy.inventory import Cluster, Node
from roles.facts import section, split_sections

CHECKS = ["link", "health", "netdetect", "gateway", "lldp", "optical", "tls", "npu_ip"]
PING_MARK = "@@llmdeploy-ping@@"


def hccn(cluster: Cluster) -> str:
    return "HCCN=$(command -v hccn_tool || echo /usr/local/Ascend/driver/tools/hccn_tool)"


def ascend_script(cluster: Cluster, node: Node) -> str:
    """Every per-NPU query of one node, one round trip."""
    query = "-vnic" if cluster.platform_info.npu_ip_query == "vnic" else "-ip"
    items = [("link", "-link"), ("health", "-net_health"), ("netdetect", "-netdetect"), ("gateway", "-gateway"),
             ("lldp", "-lldp"), ("tls", "-tls"), ("optical", "-optical"), ("npu_ip", query)]
    parts = [hccn(cluster), section("hccn.conf", "cat /etc/hccn.conf")]
    for d in range(node.devices or cluster.platform_info.devices):
        for name, flag in items:
            parts.append(section(f"{name} {d}", f'"$HCCN" -i {d} {flag} -g'))
    return "\n".join(parts) + "\n"


def parse_ascend(cluster: Cluster, node: Node, out: str) -> dict:
    """{npu: {check: (ok, detail)}}, the NPU IPs, and hccn.conf."""
    s = split_sections(out)
    npus: dict[int, dict[str, tuple[bool, str]]] = {}
    ips: dict[int, str] = {}
    for d in range(node.devices or cluster.platform_info.devices):
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
        r["netdetect"] = (bool(m), m.group(1) if m else "not set")
        t, _ = text("gateway")
        m = re.search(r"default gateway:\s*([0-9.]+)", t)
        r["gateway"] = (bool(m), m.group(1) if m else "not set")
        t, _ = text("lldp")
        m = re.search(r"Ifname:\s*(\S+)", t)
        r["lldp"] = (bool(m), m.group(1) if m else "no switch port (LLDP)")
        t, _ = text("optical")
        m = re.search(r"present\s*:\s*(.+)", t)
        r["optical"] = (bool(m and m.group(1).strip() == "present"), m.group(1).strip() if m else "no answer")
        t, _ = text("tls")
        m = re.search(r"tls switch\[(\d+)\]", t)
        r["tls"] = (bool(m), m.group(1) if m else "no answer")
        t, code = text("npu_ip")
        m = re.search(r"ipaddr:\s*(\S+)", t)
        if m:
            ips[d] = m.group(1)
        r["npu_ip"] = (bool(m), m.group(1) if m else (t.splitlines()[0] if t else "no answer"))
        npus[d] = r
    conf = s.get("hccn.conf")
    return {"npus": npus, "ips": ips, "hccn_conf": conf[0] if conf and conf[1] == 0 else None}


def ping_plan(cluster: Cluster, ips: dict[str, dict[int, str]], full: bool, full_max: int) -> tuple[str, dict[str, list[tuple[int, str, int, str]]]]:
    """('full'|'sampled', {host: [(local npu, remote host, remote npu, remote ip)]})."""
    names = [n.name for n in cluster.nodes]
    devices = {n.name: n.devices or cluster.platform_info.devices for n in cluster.nodes}
    size = sum(devices[a] * (len(names) - 1) for a in names)
    plan: dict[str, list[tuple[int, str, int, str]]] = {a: [] for a in names}
    mode = "full" if full or size <= full_max else "sampled"
    for i, a in enumerate(names):
        for j, b in enumerate(names):
            if a == b:
                continue
            if mode == "full":
                pairs = [d for d in range(min(devices[a], devices[b]))]
            else:
                pairs = [(i + j) % min(devices[a], devices[b])]
            for d in pairs:
                if d in ips.get(b, {}):
                    plan[a].append((d, b, d, ips[b][d]))
        if mode == "sampled":
            used = {p[0] for p in plan[a]}
            k = 1
            for d in range(devices[a]):
                if d in used:
                    continue
                b = names[(i + k) % len(names)]
                k = k % (len(names) - 1) + 1 if len(names) > 1 else 1
                if b != a and d in ips.get(b, {}):
                    plan[a].append((d, b, d, ips[b][d]))
    return mode, plan


def ping_script(cluster: Cluster, pings: list[tuple[int, str, int, str]], lanes: int = 4) -> str | None:
    """All of a node's pings, in ``lanes`` parallel lanes (each lane runs its
    pings one after another, one NPU's pings in one lane). Bounded: a 32-node
    cluster pinging with every NPU at once starves the hosts' CPUs and the
    late replies read as loss."""
    if not pings:
        return None
    flag = "-hccs_ping" if cluster.platform == "a3" else "-ping"
    lines = [hccn(cluster), 't=$(mktemp -d "${TMPDIR:-/tmp}/llmdeploy-ping.XXXXXX")', "trap 'rm -rf \"$t\"' EXIT"]
    by_lane: dict[int, list[str]] = {}
    for k, (d, _, _, ip) in enumerate(pings):
        by_lane.setdefault(d % max(1, lanes), []).append(f'"$HCCN" -i {d} {flag} -g address {shlex.quote(ip)} > "$t/{k}" 2>&1')
    for _, cmds in sorted(by_lane.items()):
        lines.append(f"( {'; '.join(cmds)} ) &")
    lines.append("wait")
    for k in range(len(pings)):
        lines.append(f'echo "{PING_MARK} {k}"; cat "$t/{k}"')
    return "\n".join(lines) + "\n"


def parse_pings(out: str, pings: list[tuple[int, str, int, str]]) -> list[dict]:
    results: dict[int, str] = {}
    cur, buf = None, []
    for line in out.splitlines():
        if line.startswith(PING_MARK + " "):
            if cur is not None:
                results[cur] = "\n".join(buf)
            cur, buf = int(line.split()[-1]), []
        else:
            buf.append(line)
    if cur is not None:
        results[cur] = "\n".join(buf)
    out_list = []
    for k, (d, b, bd, ip) in enumerate(pings):
        text = results.get(k, "")
        m = re.search(r"([0-9.]+)% packet loss", text)
        loss = float(m.group(1)) if m else 100.0
        reason = f"{m.group(1)}% loss" if m else (text.strip().splitlines()[-1] if text.strip() else "no answer")
        out_list.append({"npu": d, "to": b, "to_npu": bd, "ip": ip, "loss": loss, "ok": loss == 0.0, "reason": reason})
    return out_list


# --- NVIDIA ---------------------------------------------------------------------------------------
def all_reduce_command(cluster: Cluster, args: str, min_busbw: float | None) -> str:
    """``mpirun`` over the cluster's nodes, one rank per GPU (nccl-tests README)."""
    per = {n.name: n.devices or cluster.platform_info.devices for n in cluster.nodes}
    hosts = ",".join(f"{n.ip}:{per[n.name]}" for n in cluster.nodes)
    env = [f"NCCL_SOCKET_IFNAME={cluster.node0.nic}", "NCCL_DEBUG=WARN"]
    if min_busbw:
        env.append(f"NCCL_TESTS_MIN_BW={min_busbw:g}")
    cmd = ["mpirun", "--allow-run-as-root", "-np", str(sum(per.values())), "-H", hosts, "--bind-to", "none"]
    for e in env:
        cmd += ["-x", e]
    cmd += ["all_reduce_perf", *shlex.split(args)]
    return shlex.join(cmd)


def parse_all_reduce(out: str) -> dict:
    """busbw of the largest size, the footer's average, out-of-bounds, per-rank errors."""
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 12 and f[0].isdigit():
            try:
                rows.append({"size": int(f[0]), "busbw": float(f[7]), "wrong": f[8]})
            except ValueError:
                continue
    avg = re.search(r"# Avg bus bandwidth\s*:\s*([0-9.]+)", out)
    oob = re.search(r"# Out of bounds values\s*:\s*(\d+)\s+(OK|FAILED)", out)
    wrong = re.findall(r"rank=(\d+) #wrong=(\d+)", out)
    return {
        "max_busbw": rows[-1]["busbw"] if rows else None,
        "avg_busbw": float(avg.group(1)) if avg else None,
        "out_of_bounds": int(oob.group(1)) if oob else None,
        "oob_ok": bool(oob and oob.group(2) == "OK"),
        "wrong_ranks": [int(r) for r, n in wrong if int(n)],
        "sizes": len(rows),
    }
