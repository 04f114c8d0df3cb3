"""Multi-node communication checks (shared/DOMAIN.md), as builders and parsers.

A platform whose verify-comm method is ``device_pings`` (Ascend), per node
and device: its NIC tool's checks (``link_script``/``parse_links``: on
Ascend ``hccn_tool -i N`` link, net_health, ..., platforms/ascend/comm.py);
across nodes, device pings (the platform's ``ping_job``) run in parallel on
every node.

The ping plan: NPU ``d`` of a node pings NPU ``d`` of every other node (the
cross-node links HCCL's rings use). That full matrix is
``nodes x (nodes - 1) x NPUs`` pings; above ``full_max`` it is sampled: each
ordered node pair gets one ping, from NPU ``(i + j) mod NPUs``, which covers
every node pair, and every NPU index on every node once there are at least
as many peers as NPUs; indices a node would miss are added with one ping to
the next peer. ``--full`` forces the full matrix.

A platform whose method is ``collective`` (NVIDIA): the facts script's
device, topology and ibstat sections, the NCCL interface, and an
``all_reduce_perf`` run under ``mpirun`` from node 0.

Every platform, the host network HCCL/Gloo/NCCL bootstrap over
(``HCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``, the
node's serving NIC): every node pings every other node's serving IP from its
NIC (``ping -I <nic>``), then, when it got a reply, sends full-MTU packets
with don't-fragment (``ping -M do -s <MTU - 28>``, MTU read from
``/sys/class/net/<nic>/mtu`` on the node), which proves the path carries the
MTU, not only the config. One script per node, its pings in parallel lanes,
the same mechanism (:func:`lanes_script`, :func:`split_marked`) as the NPU
pings; :func:`ping_verdict` reads ping's own words (no reply, message too
long, no such device, network is unreachable, ...).
"""

from __future__ import annotations

import math
import re
import shlex
from collections import Counter
from typing import Any, Callable, Protocol, cast

from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster, Node
from llmdeploy.schema import NIC_RE
from roles import in_one_piece, mpi
from llmdeploy.sections import excerpt, number, section, split_sections

PING_MARK = "@@llmdeploy-ping@@"


class _DevicePingsVendor(Protocol):
    """A vendor whose verify-comm method is ``device_pings``: the plug-in check
    (platform.REQUIRED_BY_METHOD) makes sure it has these members."""

    LINK_CHECKS: list[str]
    LINK_TOOL: str
    PING_PRELUDE: list[str]

    def link_script(self, cluster: Cluster, node: Node) -> str: ...

    def parse_links(self, cluster: Cluster, node: Node, out: str) -> dict: ...

    def ping_job(self, cluster: Cluster, device: int, ip: str) -> str: ...


def _pings_vendor(dep: Deployment) -> _DevicePingsVendor:
    """The cluster's vendor, whose method these checks are (``device_pings``)."""
    return cast(_DevicePingsVendor, dep.vendor)


def link_checks(dep: Deployment) -> list[str]:
    """The per-device checks of the platform's ``device_pings`` method, in the table's order."""
    return list(_pings_vendor(dep).LINK_CHECKS)


def link_step_name(dep: Deployment) -> str:
    """How the runner names the per-device checks' step (``hccn_tool checks``)."""
    return f"{_pings_vendor(dep).LINK_TOOL} checks"


def link_script(dep: Deployment, node: Node) -> str:
    """Every per-device query of one node (the platform's NIC tool), one round trip."""
    return _pings_vendor(dep).link_script(dep.cluster, node)


def parse_links(dep: Deployment, node: Node, out: str) -> dict:
    """``link_script``'s output: {"devices": {device: {check: (ok, detail)}},
    "ips": {device: its IP}, "conf": the node's device network configuration
    file (None: unreadable), "conf_name", "conf_path"}."""
    return _pings_vendor(dep).parse_links(dep.cluster, node, out)


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


def lanes_script(prelude: list[str], jobs: list[tuple[int, str]], lanes: int) -> str:
    """Run ``jobs`` (lane key, shell command) in ``lanes`` parallel lanes, the
    jobs of a lane one after another. Job ``k``'s output goes to ``"$t/k"``
    (a job may write more files ``"$t/k.<what>"``; the ``prelude`` may write
    others); at the end every file is printed behind ``PING_MARK <name>``
    (:func:`split_marked` reads them back) with shell builtins (no process
    per file: at 64 A2 nodes a node has 504 of them), and the whole output
    goes back in one piece (:func:`roles.in_one_piece`). Commands must be
    quoted already."""
    lines = ['t=$(mktemp -d "${TMPDIR:-/tmp}/llmdeploy-ping.XXXXXX")', "trap 'rm -rf \"$t\"' EXIT", *prelude]
    by_lane: dict[int, list[str]] = {}
    for k, (lane, cmd) in enumerate(jobs):
        by_lane.setdefault(lane % max(1, lanes), []).append(f'{{ {cmd} ; }} > "$t/{k}" 2>&1')
    for _, cmds in sorted(by_lane.items()):
        lines.append(f"( {'; '.join(cmds)} ) &")
    lines.append("wait")
    # a newline before each mark: a file without a final newline cannot hide the next mark
    lines.append(f'for f in "$t"/*; do [ -f "$f" ] || continue; printf \'\\n{PING_MARK} %s\\n\' "${{f##*/}}"; '
                 'while IFS= read -r l || [ -n "$l" ]; do printf \'%s\\n\' "$l"; done < "$f"; done; true')
    return in_one_piece("\n".join(lines) + "\n")


def split_marked(out: str) -> dict[str, str]:
    """{file name: its text} from :func:`lanes_script`'s output."""
    results: dict[str, str] = {}
    cur: str | None = None
    buf: list[str] = []
    for line in out.splitlines():
        if line.startswith(PING_MARK + " "):
            if cur is not None:
                results[cur] = "\n".join(buf).strip("\n")
            cur, buf = line[len(PING_MARK) + 1:].strip(), []
        elif cur is not None:
            buf.append(line)
    if cur is not None:
        results[cur] = "\n".join(buf).strip("\n")
    return results


def ping_script(dep: Deployment, pings: list[tuple[int, str, int, str]], lanes: int = 4) -> str | None:
    """All of a node's pings, in ``lanes`` parallel lanes (each lane runs its
    pings one after another, one NPU's pings in one lane). Bounded: a 32-node
    cluster pinging with every NPU at once starves the hosts' CPUs and the
    late replies read as loss."""
    if not pings:
        return None
    vendor = _pings_vendor(dep)
    jobs = [(d, vendor.ping_job(dep.cluster, d, ip)) for d, _, _, ip in pings]
    return lanes_script(list(vendor.PING_PRELUDE), jobs, lanes)


# hccn_tool's reply lines: ``recv seq=0,time=0.054000ms``
_PING_TIME = re.compile(r"\btime=([0-9]+(?:\.[0-9]+)?)\s*ms")


def parse_pings(out: str, pings: list[tuple[int, str, int, str]]) -> list[dict]:
    """Each planned ping's result: loss, ok, the reason, and ``rtt_ms`` (the
    mean of the replies' times, None without a reply: the report's shade)."""
    results = split_marked(out)
    out_list = []
    for k, (d, b, bd, ip) in enumerate(pings):
        text = results.get(str(k), "")
        m = re.search(r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)% packet loss", text)
        loss = float(m.group(1)) if m else 100.0
        reason = f"{m.group(1)}% loss" if m else (text.strip().splitlines()[-1] if text.strip() else "no answer")
        times = [float(t) for t in _PING_TIME.findall(text)]
        rtt = round(sum(times) / len(times), 4) if times else None
        out_list.append({"npu": d, "to": b, "to_npu": bd, "ip": ip, "loss": loss, "ok": loss == 0.0, "reason": reason, "rtt_ms": rtt})
    return out_list


# --- the host network (every platform) ------------------------------------------------------------
# three echo requests 0.2 s apart, 2 s for the last reply (ping(8): -i 0.2 is
# the smallest interval a user without privileges may ask for)
HOST_PING = "ping -n -c 3 -i 0.2 -W 2"
HOST_LANES = 8
# IPv4 (20) + ICMP (8) headers: -s <MTU - 28> fills the MTU exactly
ICMP_IPV4_OVERHEAD = 28
MAX_ICMP_PAYLOAD = 65535 - ICMP_IPV4_OVERHEAD
# ping's own words (iputils; older versions and routers on the path): (pattern, reason, a "no reply" kind)
PING_ERRORS: list[tuple[str, str, bool]] = [
    (r"SO_BINDTODEVICE \S+: No such device|unknown iface", "no such device", False),
    (r"local error: message too long, mtu=(\d+)", "message too long, mtu={0}", False),
    (r"Message too long", "message too long", False),
    (r"Frag needed and DF set \(mtu = (\d+)\)", "fragmentation needed, mtu={0}", False),
    (r"Network is unreachable", "network is unreachable", False),
    (r"Cannot assign requested address", "cannot assign requested address", False),
    (r"Operation not permitted", "operation not permitted", False),
    (r"ping: (?:command )?not found", "ping not found", False),
    (r"No buffer space available", "sendmsg: no buffer space available", True),
    (r"Destination Host Unreachable", "destination host unreachable", True),
]
_STATS = re.compile(r"([0-9]+) packets transmitted, ([0-9]+) (?:packets )?received.*?(?<![0-9.])([0-9]+(?:\.[0-9]+)?)% packet loss")


def host_ping_plan(cluster: Cluster, node: Node) -> list[tuple[str, str]]:
    """[(peer, peer's serving IP)]: every other node of the cluster."""
    return [(n.name, str(n.ip)) for n in cluster.nodes if n.name != node.name]


def _nic(cluster: Cluster, node: Node) -> str:
    nic = node.nic or cluster.nic or ""
    if not NIC_RE.fullmatch(nic):
        raise ValueError(f"{node.name}: NIC {nic!r} is not an interface name")
    return nic


def host_ping_script(cluster: Cluster, node: Node, lanes: int = HOST_LANES) -> str | None:
    """One node's share of the host network pings, one round trip: the NIC's
    state and MTU (file ``nic``), then per peer ``k`` a ping from the NIC
    (``k``) and, when it got a reply, the full-MTU don't-fragment ping
    (``k.df``), in ``lanes`` parallel lanes."""
    peers = host_ping_plan(cluster, node)
    if not peers:
        return None
    nic = _nic(cluster, node)
    prelude = [
        f"nic={shlex.quote(nic)}",
        'mtu=$(cat "/sys/class/net/$nic/mtu" 2>/dev/null || ip -o link show dev "$nic" 2>/dev/null | sed -n "s/.* mtu \\([0-9]*\\) .*/\\1/p")',
        'case "$mtu" in ""|*[!0-9]*) mtu= ;; esac',
        # the payload that fills the MTU; at most an IPv4 packet's 65535 bytes (loopback's MTU is 65536)
        f'size=$(( ${{mtu:-{ICMP_IPV4_OVERHEAD}}} - {ICMP_IPV4_OVERHEAD} )); [ "$size" -gt {MAX_ICMP_PAYLOAD} ] && size={MAX_ICMP_PAYLOAD}',
        'state=$(cat "/sys/class/net/$nic/operstate" 2>/dev/null || echo missing)',
        '{ echo "operstate $state"; echo "mtu ${mtu:-unknown}"; command -v ping >/dev/null 2>&1 || echo "ping missing"; } > "$t/nic"',
        # one peer: $1 its IP, $2 the file for the full-MTU ping (tried only after a reply)
        "hp() {",
        f'    p=$({HOST_PING} -I "$nic" "$1" 2>&1)',
        # some replies but not all: one more try (many nodes pinging at once can drop a packet);
        # a dead pair (no reply) or a real MTU problem loses both tries
        f'    case "$p" in *" 0% packet loss"*|*" 0 received"*|*" 0 packets received"*) ;; *" received"*) p=$({HOST_PING} -I "$nic" "$1" 2>&1) ;; esac',
        "    printf '%s\\n' \"$p\"",
        '    case "$p" in *" 0 received"*|*" 0 packets received"*) return 0 ;; *" received"*) ;; *) return 0 ;; esac',
        '    [ -n "$mtu" ] || return 0',
        f'    df=$({HOST_PING} -M do -s "$size" -I "$nic" "$1" 2>&1)',
        f'    case "$df" in *" 0% packet loss"*|*" 0 received"*|*" 0 packets received"*) ;; *" received"*) df=$({HOST_PING} -M do -s "$size" -I "$nic" "$1" 2>&1) ;; esac',
        "    printf '%s\\n' \"$df\" > \"$2\"",
        "    return 0",
        "}",
    ]
    jobs = [(k, f'hp {shlex.quote(ip)} "$t/{k}.df"') for k, (_, ip) in enumerate(peers)]
    return lanes_script(prelude, jobs, lanes)


def ping_verdict(text: str) -> tuple[bool, str, int]:
    """(ok, reason, replies) from one ping's output: ok only without loss."""
    stats = _STATS.search(text)
    sent, got = (int(stats.group(1)), int(stats.group(2))) if stats else (0, 0)
    err = None
    for pattern, reason, no_reply in PING_ERRORS:
        m = re.search(pattern, text)
        if m:
            err = (reason.format(*m.groups()), no_reply)
            break
    if stats and sent and got >= sent:
        return True, "ok", got
    if stats and got:
        loss = f"{float(stats.group(3)):g}% loss ({got}/{sent} replies)"
        return False, loss + (f", {err[0]}" if err else ""), got
    if err:
        return False, f"no reply ({err[0]})" if err[1] and stats else err[0], 0
    if stats:
        return False, "no reply", 0
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return False, f"unexpected ping output: {lines[-1]}" if lines else "no answer", 0


def parse_host_pings(cluster: Cluster, node: Node, out: str, err: str = "") -> dict:
    """The NIC (name, operstate, MTU, problems) and one record per peer:
    ``{from, nic, to, ip, mtu, reply, full_mtu, ok, reason, raw}`` (``raw``:
    ping's own output when the pair fails). ``err``: the script's stderr."""
    nic = _nic(cluster, node)
    s = split_marked(out)
    info = dict(ln.split(" ", 1) for ln in s.get("nic", "").splitlines() if " " in ln)
    state = info.get("operstate", "").strip()
    mtu_text = info.get("mtu", "").strip()
    mtu = number(mtu_text)
    problems = []
    down = ""
    if "nic" not in s:
        last = [ln.strip() for ln in (err + "\n" + out).splitlines() if ln.strip()][-1:]
        problems.append("the host network script gave no answer" + (f": {last[0]}" if last else ""))
    elif state == "missing":
        problems.append(f"{nic} missing (no such device)")
        down = f" ({nic} missing)"
    elif state not in ("up", "unknown"):
        problems.append(f"{nic} is {state}")
        down = f" ({nic} is {state})"
    if "ping" in info:
        problems.append("ping is not installed (iputils-ping)")
    pairs = []
    for k, (peer, ip) in enumerate(host_ping_plan(cluster, node)):
        text = s.get(str(k), "")
        reply_ok, reason, got = ping_verdict(text)
        full = None
        raw = text
        if got:
            df = s.get(f"{k}.df")
            if df is None:
                full, df_reason = False, "not run" + (f": the MTU of {nic} could not be read" if mtu is None else "")
            else:
                full, df_reason, _ = ping_verdict(df)
            if not full:
                raw = df or ""
                reason = f"full-MTU ({mtu if mtu is not None else '?'}) DF ping fails: {df_reason}" if reply_ok else f"{reason}; full-MTU DF ping: {df_reason}"
        ok = reply_ok and bool(full)
        pairs.append({"from": node.name, "nic": nic, "to": peer, "ip": ip, "mtu": mtu, "reply": got > 0, "full_mtu": full, "ok": ok,
                      "reason": "ok" if ok else reason + down, "raw": "" if ok else raw[-2000:]})
    return {"nic": nic, "state": state, "mtu": mtu, "problems": problems, "pairs": pairs}


def host_net_report(cluster: Cluster, answers: dict[str, dict | str]) -> tuple[dict[str, dict], list[dict]]:
    """The ``host_net`` check of every node that ran its pings, and every pair.

    ``answers``: per host, :func:`parse_host_pings`'s dict, or the reason its
    script did not run through (every pair of it fails with that reason).
    MTUs must also agree across nodes (the odd ones out are named; on a tie, all)."""
    parsed = {h: a for h, a in answers.items() if isinstance(a, dict)}
    mtus = {h: p["mtu"] for h, p in parsed.items() if p["mtu"] is not None}
    counts = Counter(mtus.values())
    # the odd ones out; on a tie every node is told
    leaders = {m for m, c in counts.items() if c == max(counts.values())} if counts else set()
    cells: dict[str, dict] = {}
    pairs: list[dict] = []
    for host, a in answers.items():
        node = next(n for n in cluster.nodes if n.name == host)
        if isinstance(a, dict):
            problems = list(a["problems"])
            if len(counts) > 1 and a["mtu"] is not None and (a["mtu"] not in leaders or len(leaders) > 1):
                others = sorted({m for h, m in mtus.items() if h != host and m != a["mtu"]})
                problems.append(f"MTU {a['mtu']} on {a['nic']}, the other nodes have {', '.join(map(str, others))}")
            mine = a["pairs"]
            mtu = a["mtu"]
        else:
            nic = node.nic or cluster.nic or "?"
            problems, mtu = [], None
            mine = [{"from": host, "nic": nic, "to": peer, "ip": ip, "mtu": None, "reply": False, "full_mtu": None, "ok": False,
                     "reason": a, "raw": ""} for peer, ip in host_ping_plan(cluster, node)]
        pairs += mine
        bad = [x for x in mine if not x["ok"]]
        summary = f"{len(mine) - len(bad)}/{len(mine)}" if mine else "no peers"
        cells[host] = {"ok": not bad and not problems, "summary": summary + (f" (MTU {mtu})" if mtu is not None else ""),
                       "failures": problems + [f"{x['nic']} -> {x['to']} {x['ip']}: {x['reason']}" for x in bad]}
    return cells, pairs


def pair_name(x: dict) -> str:
    """``sim-a3-0 enp189s0f0 -> sim-a3-2 198.19.3.12``"""
    return f"{x['from']} {x['nic']} -> {x['to']} {x['ip']}"


# --- NVIDIA ---------------------------------------------------------------------------------------
# all_reduce_perf (NVIDIA/nccl-tests) as one MPI world from node 0: the real
# OpenMPI ``mpirun`` reaches the other nodes the way serving's worlds do
# (roles.mpi: ssh from node 0 with the launch ssh_config, BatchMode, host keys
# checked, every daemon from node 0, OpenMPI's TCP on the serving NICs).
#
# One app context per node (OpenMPI's ``mpirun ... : ...`` form), node 0
# first, so the ranks are numbered node by node and rank 0 is on node 0:
# ``-np <ranks of the node> -H <node>:<ranks>``, and ``-x`` with that node's
# own NCCL_SOCKET_IFNAME. ``-x`` belongs to its app context (OpenMPI 4.1:
# a variable given in the first context does not reach the ranks of the
# second), so every context carries every variable; one ``-x`` for all would
# give every node node 0's NIC name.
#
# Hosts are the nodes' serving IPs, as in serving's hostfiles: OpenMPI takes
# the one that is its own address for node 0, and reaches the others through
# the same launch agent as the serving worlds (roles.mpi.launch_agent: IP ->
# the node's SSH host), written to a temporary file on node 0 for the run.
ALL_REDUCE_ENV = {"NCCL_DEBUG": "WARN"}
AGENT_END = "LLMDEPLOY_MPI_AGENT"


def nccl_ifname(cluster: Cluster, node: Node) -> str:
    """NCCL_SOCKET_IFNAME as the node's own communication environment has it
    (roles.commenv: the node's serving NIC, unless the profile's ``env``
    sets it)."""
    value = cluster.profile.operator_env().get("NCCL_SOCKET_IFNAME") or _nic(cluster, node)
    if not value or "\n" in value:
        raise ValueError(f"{node.name}: NCCL_SOCKET_IFNAME {value!r} is not an interface list")
    return value


def _gpus_per_rank(args: list[str]) -> int:
    """GPUs one all_reduce_perf process drives: ``-g`` (``--ngpus``) x ``-t``
    (``--nthreads``), 1 x 1 unless given (nccl-tests src/common.cu)."""
    got = {"g": 1, "t": 1}
    names = {"-g": "g", "--ngpus": "g", "-t": "t", "--nthreads": "t"}
    for i, a in enumerate(args):
        key, eq, value = a.partition("=")
        if not eq and a[:2] in ("-g", "-t") and len(a) > 2:  # -g8: the value attached (getopt)
            key, eq, value = a[:2], "=", a[2:]
        if key in names and (eq or i + 1 < len(args)):
            text = value if eq else args[i + 1]
            if not text.isdigit() or int(text) < 1:
                raise ValueError(f"verify.all_reduce_args: {key} {text!r} is not a positive number")
            got[names[key]] = int(text)
    return got["g"] * got["t"]


def all_reduce_ranks(cluster: Cluster, args: str) -> list[tuple[Node, int, range]]:
    """(node, processes on it, their global ranks), node 0 first: every GPU
    of every node in one world (``-g 1``: one rank per GPU)."""
    per = _gpus_per_rank(shlex.split(args))
    out, first = [], 0
    for n in cluster.nodes:
        devices = n.devices or cluster.platform_info.devices
        if devices % per:
            raise ValueError(f"{n.name}: {devices} GPUs cannot be split into processes of {per} GPUs (verify.all_reduce_args)")
        k = devices // per
        out.append((n, k, range(first, first + k)))
        first += k
    return out


def all_reduce_command(dep: Deployment, args: str) -> str:
    """``mpirun`` on node 0 over every node, one rank per GPU (nccl-tests
    README: ``mpirun -np <ranks> -N <per node> ./build/all_reduce_perf -b 8 -e 8G -f 2 -g 1``),
    each node's ranks with that node's NCCL_SOCKET_IFNAME.

    No ``NCCL_TESTS_MIN_BW``: nccl-tests holds it against the average busbw
    over every size of the run (src/common.cu ``bw[0] /= bw_count[0]``),
    which from 8 bytes up is far below what the fabric carries; the floor
    (``verify.nccl_min_busbw``) is held against the largest size's busbw,
    where the bandwidth is what counts (doc/PERFORMANCE.md)."""
    cluster = dep.cluster
    ranks = all_reduce_ranks(cluster, args)
    program = ["all_reduce_perf", *shlex.split(args)]
    multi = len(ranks) > 1
    cmd = ["mpirun", "--allow-run-as-root", "--bind-to", "none"]
    # what mpirun needs when it runs through the cluster's launcher (inside a job step, say)
    cmd += list(dep.launcher.MPIRUN_ARGS)
    cmd += mpi.tcp_if_args(mpi.nics(cluster, [n.name for n in cluster.nodes]))
    for i, (n, k, _) in enumerate(ranks):
        if i:
            cmd.append(":")
        cmd += ["-np", str(k), "-H", f"{n.ip if multi else n.name}:{k}", "-x", f"NCCL_SOCKET_IFNAME={nccl_ifname(cluster, n)}"]
        for key, value in ALL_REDUCE_ENV.items():
            cmd += ["-x", f"{key}={value}"]
        cmd += program
    if not multi:
        return shlex.join(cmd)
    agent = mpi.launch_agent(cluster, [n.name for n, _, _ in ranks], cluster.profile.launch_ssh())
    if AGENT_END in agent:
        raise ValueError(f"the launch agent of {cluster.name} holds {AGENT_END}")
    # mpirun's launch options with the agent's path, which only the shell knows
    launch = " ".join(shlex.quote(a) for a in mpi.launch_agent_args("AGENT")).replace("AGENT", '"$agent"')
    return "\n".join([
        'agent=$(mktemp "${TMPDIR:-/tmp}/llmdeploy-mpi-agent.XXXXXX") || exit 1',
        "trap 'rm -f \"$agent\"' EXIT",
        f"cat > \"$agent\" <<'{AGENT_END}'",
        agent.rstrip("\n"),
        AGENT_END,
        'chmod 700 "$agent"',
        f"{shlex.join(cmd[:4])} {launch} {shlex.join(cmd[4:])}",
    ]) + "\n"


def all_reduce_world(cluster: Cluster, args: str) -> tuple[list[Node], int, list[str], dict[str, dict[str, str]]] | None:
    """``all_reduce_perf`` as a world the cluster's launcher starts itself
    (``Runner.world``): (the nodes, processes per node, the program's
    arguments, each node's variables: its NCCL_SOCKET_IFNAME and
    ALL_REDUCE_ENV), one rank per GPU as :func:`all_reduce_command` places
    them. None for one node, or nodes with different numbers of processes
    (a launch of the same count on every node cannot place them): mpirun."""
    ranks = all_reduce_ranks(cluster, args)
    if len(ranks) < 2 or len({k for _, k, _ in ranks}) != 1:
        return None
    env = {n.name: {"NCCL_SOCKET_IFNAME": nccl_ifname(cluster, n), **ALL_REDUCE_ENV} for n, _, _ in ranks}
    return [n for n, _, _ in ranks], ranks[0][1], ["all_reduce_perf", *shlex.split(args)], env


def world_text(world: tuple[list[Node], int, list[str], dict[str, dict[str, str]]]) -> str:
    """How the verify report shows a launched world (``all_reduce_world``): its command and where its ranks ran."""
    nodes, tasks, argv, _ = world
    return f"{shlex.join(argv)} ({tasks} ranks on each of {', '.join(n.name for n in nodes)}, started by the cluster's launcher)"


# nccl-tests' and NCCL's own lines (nccl-tests src/common.h NCCLCHECK/TESTCHECK;
# NCCL src/debug.cc "host:pid:tid [dev] file:line (func) NCCL WARN msg")
_NCCL_WARN = re.compile(r"^(?P<host>[^\s:]+):\d+:\d+ \[\d+\] (?:\S+:\d+ )?(?:\(\S+\) )?NCCL WARN (?P<msg>.+)$", re.M)
_TEST_NCCL = re.compile(r"^(?P<host>[^\s:]+): Test NCCL failure \S+ '(?P<msg>[^']*)'", re.M)
_TEST_CUDA = re.compile(r"^(?P<host>[^\s:]+): Test CUDA failure \S+ '(?P<msg>[^']*)'", re.M)
# OpenMPI 4.1's mpirun: the first process that failed, and ssh's own words when a daemon did not start
_MPI_PROC = re.compile(r"Process name: \[\[\d+,\d+\],(?P<rank>\d+)\]\s*\n\s*Exit code:\s*(?P<code>-?\d+)")
_MPI_SIGNAL = re.compile(r"mpirun noticed that process rank (?P<rank>\d+) with PID \d+ on node (?P<host>\S+) exited on signal (?P<sig>\d+)")
_SSH = re.compile(r"^(?:ssh: (?:Could not resolve hostname (?P<host>[^:\s]+)|connect to host (?P<chost>\S+) port \d+)[^\n]*"
                  r"|Host key verification failed\.|[^\n]*Permission denied \(publickey[^\n]*|[^\n]*REMOTE HOST IDENTIFICATION HAS CHANGED[^\n]*)$", re.M)
# a world the launcher started itself: its own line for each node's tasks that ended badly
# ("<launcher>: error: <node>: task 9: Exited with exit code 137", "...: tasks 8-15: Killed")
_LAUNCHED_TASKS = re.compile(r"^\S+: error: (?P<host>[^\s:]+): (?P<tasks>tasks? [0-9,-]+): (?P<what>.+)$", re.M)
_ORTE_DAEMONS = ("ORTE was unable to reliably start one or more daemons", "An ORTE daemon has unexpectedly failed",
                 "ORTE has lost communication with a remote daemon", "ORTE does not know how to route")


def all_reduce_failure(cluster: Cluster, args: str, hostnames: dict[str, str | None], out: str, err: str) -> list[str]:
    """Why an all_reduce_perf world failed, each reason naming its node:
    NCCL's WARN lines and nccl-tests' failure lines (by the hostname they
    print; ``hostnames``: node -> its hostname from the facts), the rank
    mpirun says failed first or was killed (MPI ranks go node by node, as
    :func:`all_reduce_command` places them), ssh's own words when mpirun
    could not start its daemon on a node. Empty when the output says none
    of these."""
    ranks = all_reduce_ranks(cluster, args)
    node_of_host = _node_finder(cluster, hostnames)

    def node_of_rank(r: int) -> str:
        return next((n.name for n, _, rs in ranks if r in rs), f"rank {r}")

    text = out + "\n" + err
    problems: list[str] = []

    def add(msg: str) -> None:
        if msg not in problems:
            problems.append(msg)

    def named(node: str) -> bool:
        return any(p.startswith(f"{node}: ") for p in problems)

    for m in _NCCL_WARN.finditer(text):
        node = node_of_host(m.group("host"))
        said = m.group("msg").strip()
        if "interface" in said and node:
            said += f" (NCCL_SOCKET_IFNAME={nccl_ifname(cluster, cluster.node(node))})"
        add(f"{node or 'host ' + m.group('host')}: NCCL WARN {said}")
    for pattern, what in ((_TEST_NCCL, "NCCL failure"), (_TEST_CUDA, "CUDA failure")):
        for m in pattern.finditer(text):
            node = node_of_host(m.group("host")) or f"host {m.group('host')}"
            if what == "CUDA failure" or not named(node):  # NCCL's own WARN line says more
                add(f"{node}: all_reduce_perf: {what} '{m.group('msg')}'")
    for m in _MPI_SIGNAL.finditer(text):
        add(f"{node_of_rank(int(m.group('rank')))}: rank {m.group('rank')} was killed by signal {m.group('sig')}")
    for m in _LAUNCHED_TASKS.finditer(text):
        node = node_of_host(m.group("host")) or f"host {m.group('host')}"
        if not named(node):
            add(f"{node}: {m.group('tasks')} (ranks): {m.group('what').strip()}")
    proc = _MPI_PROC.search(text)
    if proc and not named(node_of_rank(int(proc.group("rank")))):
        add(f"{node_of_rank(int(proc.group('rank')))}: rank {proc.group('rank')} exited with status {proc.group('code')}")
    for msg in _daemon_failures(cluster, text, node_of_host):
        add(msg)
    return problems


def _node_finder(cluster: Cluster, hostnames: dict[str, str | None]) -> Callable[[str], str | None]:
    """The node a host name in mpirun's or NCCL's output stands for: its -H
    entry (the inventory's name or IP), or its hostname from the facts, with
    or without the domain."""
    by_host: dict[str, str] = {}
    for n in cluster.nodes:
        by_host[n.name] = by_host[str(n.ip)] = n.name  # mpirun names a node by its -H entry
        h = (hostnames.get(n.name) or "").strip()
        if h:
            by_host[h] = by_host[h.split(".")[0]] = n.name
    return lambda h: by_host.get(h) or by_host.get(h.split(".")[0])


def _daemon_failures(cluster: Cluster, text: str, node_of_host: Callable[[str], str | None]) -> list[str]:
    """mpirun could not start its daemon on a node over SSH: the node ssh's
    own words name (else every node but node 0), with what to check."""
    if not any(s in text for s in _ORTE_DAEMONS):
        return []
    others = [n.name for n in cluster.nodes[1:]]
    anywhere = others[0] if len(others) == 1 else "one of " + ", ".join(others)
    out = []
    said: list[re.Match[str] | None] = [*_SSH.finditer(text)] or [None]
    for s in said:
        host = (s.group("host") or s.group("chost")) if s else None
        words = f" ({s.group(0).strip()})" if s else ""
        out.append(f"{(node_of_host(host) if host else None) or anywhere}: mpirun on {cluster.node0.name} could not start its daemon there "
                   f"over SSH{words}; check node 0's ssh_config (profile.launch_ssh_config), its key and known_hosts for that node")
    return out


def all_reduce_table(out: str) -> list[dict]:
    """all_reduce_perf's table, one row per size: bytes, the out-of-place
    time (us), algbw and busbw (GB/s) and #wrong, and the in-place busbw.
    A row whose out-of-place busbw is no number ('nan', 'inf') is no
    measurement and left out."""
    rows = []
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 12 and f[0].isdigit():
            try:
                row: dict[str, Any] = {"size": int(f[0]), "busbw": float(f[7]), "wrong": f[8]}
            except ValueError:
                continue
            if math.isfinite(row["busbw"]):
                row.update(time_us=_finite(f[5]), algbw=_finite(f[6]), busbw_in_place=_finite(f[11]))
                rows.append(row)
    return rows


def _finite(text: str) -> float | None:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def parse_all_reduce(out: str) -> dict:
    """busbw of the largest size, the footer's average, out-of-bounds, per-rank errors."""
    rows = all_reduce_table(out)
    avg = re.search(r"# Avg bus bandwidth\s*:\s*([0-9]+(?:\.[0-9]*)?)", out)
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
