"""Bring a simulated cluster up and down.

One network namespace per host, joined by veth pairs to two bridges in the
root namespace: a management network (SSH; the root namespace has an address
on it) and a data network whose interface inside each host carries the
inventory's NIC name and serving IP. Both use 198.18.0.0/15 and have no
route out. Inside each namespace, ``unshare --mount --uts`` gives the host its
own hostname and a private view of the paths the tool writes, and a real
``sshd`` serves it. Everything made is recorded in ``state.json`` and removed
by ``down``; ``up`` first removes what a crashed earlier run left.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from llmdeploy.errors import SimError
from llmdeploy.inventory import Cluster, list_clusters

from . import curated, dockerd, gpusite, hardware, images, model, netns, slurm, sshd, users
from . import links as links_
from .standins import __main__ as standins
from .standins import fast, slow
from .paths import (
    HOST_STATE_DIR,
    PRIVATE_DIRS,
    PRIVATE_MODES,
    host_python,
    SYSTEM_PATH,
    cluster_dir,
    host_dir,
    mgmt_ip,
    netns_name,
    short_id,
    sim_root,
)

SSHD = sshd.SSHD
HCCN_CONF = "/etc/hccn.conf"
REPO = Path(__file__).resolve().parent.parent
STANDINS_ASCEND = ["npu-smi", "hccn_tool", "lscpu", "numactl"]
STANDINS_NVIDIA = ["nvidia-smi", "lscpu", "numactl", "ibstat", "all_reduce_perf"]
# the Ascend driver's character devices that the seed's docker run passes
# with --device (real majors are assigned by the driver at load time; these
# come from the range Linux keeps for local use, Documentation/admin-guide/devices.txt 240-254)
ASCEND_DEVICES = {"davinci_manager": (241, 0), "devmm_svm": (242, 0), "hisi_hdc": (243, 0)}
DAVINCI_MAJOR = 240
# NVIDIA's nvidiaN (Documentation/admin-guide/devices.txt: 195 "Nvidia graphics devices"),
# on a Slurm site's hosts, whose gres.conf names them
NVIDIA_MAJOR = 195
# what the seed's docker run bind-mounts from an Ascend host besides
# /usr/local/Ascend (host path -> the file in the host's directory); docker
# would make a missing source a directory on the machine
ASCEND_HOST_FILES = {"/usr/local/bin/npu-smi": "npu-smi", "/etc/ascend_install.info": "ascend_install.info"}
ASCEND_HOST_DIRS = {"/usr/local/dcmi": "dcmi"}
ASCEND_INSTALL_INFO = "UserName=HwHiAiUser\nUserGroup=HwHiAiUser\nDriver_Install_Type=full\nDriver_Install_Path_Param=/usr/local/Ascend\n"
ASCEND_DRIVER_VERSION = "Version=25.2.0\nascendhal_version=7.35.23\n"
# the usual nodes of /dev (a host gets its own /dev when it has simulated devices)
DEV_NODES = {"null": (1, 3), "zero": (1, 5), "full": (1, 7), "random": (1, 8), "urandom": (1, 9), "kmsg": (1, 11), "tty": (5, 0)}


def _sh(*args: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    res = subprocess.run(list(args), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise SimError(f"{' '.join(shlex.quote(a) for a in args)} failed: {res.stderr.strip() or res.stdout.strip()}")
    return res


def preflight() -> None:
    if os.geteuid() != 0:
        raise SimError(
            "the simulated cluster needs root (network namespaces, bind mounts); run as root"
        )
    for tool in (SSHD, "/usr/bin/unshare", shutil.which("ip") or "/usr/sbin/ip", "/usr/bin/ssh-keygen",
                 "/usr/sbin/dockerd", "/usr/bin/docker", "/usr/bin/docker-registry", "/usr/sbin/debootstrap"):
        if not os.path.exists(tool):
            raise SimError(f"{tool} is missing: run scripts/setup.sh")
    probe = f"lds-probe-{os.getpid()}"
    res = _sh("ip", "netns", "add", probe, check=False)
    if res.returncode != 0:
        raise SimError(f"cannot create network namespaces here ({res.stderr.strip()})")
    _sh("ip", "netns", "del", probe, check=False)


def _links(name: str) -> dict:
    sid = short_id(name)
    return {"mgmt_bridge": f"ld{sid}m", "data_bridge": f"ld{sid}d", "npu_bridge": f"ld{sid}n"}


def _mgmt_gateway(cluster: Cluster) -> ipaddress.IPv4Interface:
    first = ipaddress.IPv4Address(mgmt_ip(str(cluster.nodes[0].ip)))
    net = ipaddress.IPv4Network(f"{first}/24", strict=False)
    return ipaddress.IPv4Interface(f"{net.network_address + 1}/24")


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.chmod(path, mode)


def _standin_wrapper(tool: str) -> str:
    return fast.wrapper(tool, host_python(), str(REPO))


def write_model(model_dir: Path) -> None:
    """A stand-in checkpoint: the files a real one has, tiny (sim/model.py)."""
    model.write(model_dir, _write)


DATA_NIC = 0xD0  # the data NIC's "device" byte in its MAC (NPUs are 0..15)


def _npu_mac(cluster: str, index: int, device: int) -> str:
    sid = short_id(cluster)
    return f"02:{sid[:2]}:{sid[2:4]}:{index // 256:02x}:{index % 256:02x}:{device:02x}"


def _batch(commands: list[str], netns: str | None = None, tool: str = "ip") -> None:
    """Many ``ip`` (or ``bridge``) commands in one process (sim.up of 32 hosts makes ~1000 links)."""
    if not commands:
        return
    args = [tool] + (["-n", netns] if netns else []) + ["-batch", "-"]
    res = subprocess.run(args, input="\n".join(commands) + "\n", capture_output=True, text=True)
    if res.returncode != 0:
        raise SimError(f"{' '.join(args)} failed: {res.stderr.strip()}")


def _hccn_wrapper() -> str:
    """hccn_tool: pings go over the simulated NPU network for real (ping
    from interface npu<d>), in the tool's output format; the rest is answered
    from node.json (rendered, see sim/standins/fast.py)."""
    return fast.wrapper("hccn_tool", host_python(), str(REPO), prelude=HCCN_PING)


# hccn_tool -i D -ping|-hccs_ping -g address IP: a real ping from npu<D>, its
# answer in hccn_tool's words. Bash builtins read ping's output (a pipeline
# of grep, sed and awk per ping was ~20 ms of CPU, ~1900 of them in a 16-node
# verify-comm); sed's and awk's rules are kept: the "bytes from" lines
# rewritten (what follows the last " ms" kept), the first "N packets
# transmitted" and " N received" (defaults 3 and 0), the loss with two
# decimals (awk itself when nothing was sent: its division error).
HCCN_PING = (
    'if [[ $1 == -i && ( $3 == -ping || $3 == -hccs_ping ) && $4 == -g && $5 == address && -n $6 ]]; then\n'
    '    dev=$2; addr=$6\n'
    '    [ -e /sys/class/net/npu$dev ] || { echo "Device id $dev is invalid."; exit 1; }\n'
    '    echo "device $dev PING $addr"\n'
    '    out=$(ping -n -c 3 -i 0.2 -W 2 -I npu$dev "$addr" 2>&1)\n'
    # this machine's kernel drops a few packets when a 32-host simulation
    # pings all at once on 2 CPUs (veth backlog): one more try before a
    # loss is reported; a broken link or pair loses both tries
    '    [[ $out == *" 0% packet loss"* ]] || out=$(ping -n -c 3 -i 0.2 -W 2 -I npu$dev "$addr" 2>&1)\n'
    '    sent=; recv=; st=; rt=\n'
    '    while IFS= read -r line; do\n'
    '        if [[ $line == *"bytes from"* ]]; then\n'
    '            if [[ $line =~ ^.*icmp_seq=([0-9]*).*time=(.*)\\ ms ]]; then\n'
    '                printf \'recv seq=%s,time=%sms%s\\n\' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${line:${#BASH_REMATCH[0]}}"\n'
    '            else printf \'%s\\n\' "$line"; fi\n'
    '        fi\n'
    '        if [[ -z $st && $line =~ ^([0-9]*)\\ packets\\ transmitted ]]; then st=1; sent=${BASH_REMATCH[1]}; fi\n'
    '        if [[ -z $rt && $line =~ ^.*\\ ([0-9]*)\\ received ]]; then rt=1; recv=${BASH_REMATCH[1]}; fi\n'
    '    done <<< "$out"\n'
    '    sent=${sent:-3}; recv=${recv:-0}\n'
    '    if (( 10#$sent > 0 )); then\n'
    '        m=$(( (10#$sent - 10#$recv) * 1000000 / 10#$sent )); sign=\n'
    '        (( m < 0 )) && { sign=-; m=$(( -m )); }\n'
    '        printf -v frac %04d $(( m % 10000 ))\n'
    '        LC_ALL=C printf \'%d packets transmitted, %d received, %.2f%% packet loss\\n\' "$((10#$sent))" "$((10#$recv))" "$sign$(( m / 10000 )).$frac"\n'
    '    else\n'
    '        awk -v s="$sent" -v r="$recv" \'BEGIN { printf "%d packets transmitted, %d received, %.2f%% packet loss\\n", s, r, (s - r) * 100 / s }\'\n'
    '    fi\n'
    "    exit 0\n"
    "fi\n"
)


def _wait_port(host: str, port: int, timeout: float, proc: subprocess.Popen, log: Path, what: str = "sshd") -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SimError(f"{what} for {host} exited with {proc.returncode}: {log.read_text()[-500:] if log.exists() else ''}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise SimError(f"{what} on {host}:{port} did not start within {timeout:g}s")


# LLMDEPLOY_SIM_DOCKER_TMPFS=<size> (e.g. 2g; the tests' clusters set it):
# each host's Docker data root on a tmpfs of at most that size, mounted in
# the host's own mount namespace. It goes with the host's last process: down
# has nothing to delete (the pulled images' ~35k files took 6-100 s to unlink
# from disk at every sim.down), and a pull writes to memory. Off by default:
# a 64-host cluster that pulls its image would hold 64 copies in RAM.
DOCKER_TMPFS_ENV = "LLMDEPLOY_SIM_DOCKER_TMPFS"


def docker_tmpfs_lines(data_root: Path) -> list[str]:
    size = os.environ.get(DOCKER_TMPFS_ENV, "").strip()
    if not size:
        return []
    if not size[:-1].isdigit() or size[-1].lower() not in "kmg":
        raise SimError(f"{DOCKER_TMPFS_ENV}={size!r}: give a size such as 2g")
    return [f"mkdir -p {shlex.quote(str(data_root))}",
            f"mount -t tmpfs -o mode=710,size={size} lds-docker {shlex.quote(str(data_root))}"]


def cgroup_parent(cluster: str, node: str) -> str:
    """The cgroup under which a host's dockerd puts its containers (found and emptied by down)."""
    return f"/lds-{short_id(cluster)}-{node}"


def service_ips(cluster: Cluster) -> dict[str, str]:
    """Where the cluster's registry and package index listen: the management
    bridge's address and one more on it (the nodes use .10 and up)."""
    gw = _mgmt_gateway(cluster)
    return {"registry": str(gw.ip), "index": str(gw.network.network_address + 254)}


def hosts_file(cluster: Cluster, services: dict[str, str]) -> str:
    """A node's /etc/hosts: every node's name at its serving IP (as a
    cluster's DNS or hosts file has them), and the registries and the
    package index at the simulator's services."""
    lines = ["# /etc/hosts of a simulated host (sim/cluster.py)", "127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
    lines += [f"{n.ip} {n.name}" for n in cluster.nodes]
    lines += images.hosts_lines(services["registry"], services["index"])
    return "\n".join(lines) + "\n"


def dev_lines(hw: dict) -> list[str]:
    """The host's own /dev: the usual nodes, and the Ascend driver's character
    devices the seed's docker run passes (``--device /dev/davinciN`` ...), or
    an NVIDIA node's /dev/nvidiaN (a Slurm site's gres.conf names them)."""
    nodes = dict(DEV_NODES)
    if hw.get("npus"):
        nodes.update(ASCEND_DEVICES)
    for npu in hw.get("npus", []):
        nodes[f"davinci{npu['id']}"] = (DAVINCI_MAJOR, npu["id"])
    for gpu in hw.get("gpus", []):
        nodes[f"nvidia{gpu['id']}"] = (NVIDIA_MAJOR, gpu["id"])
    out = ["mount -t tmpfs -o mode=755,size=1m dev /dev"]
    out += [f"mknod -m 666 /dev/{name} c {major} {minor}" for name, (major, minor) in nodes.items()]
    out += ["mkdir -p /dev/pts /dev/shm /dev/mqueue",
            "mount -t devpts -o newinstance,ptmxmode=0666,mode=620 devpts /dev/pts",
            "ln -s pts/ptmx /dev/ptmx", "ln -s /proc/self/fd /dev/fd", "ln -s /proc/self/fd/0 /dev/stdin",
            "ln -s /proc/self/fd/1 /dev/stdout", "ln -s /proc/self/fd/2 /dev/stderr"]
    return out


def _start_services(cluster: Cluster, cdir: Path, state: dict, registry: str) -> dict[str, str]:
    """The cluster's registry (read-only over the image cache) and package index, on the management bridge."""
    ips = service_ips(cluster)
    tls = images.tls()
    mb = _links(cluster.name)["mgmt_bridge"]
    _sh("ip", "addr", "add", f"{ips['index']}/24", "dev", mb)
    (cdir / "registry.yml").write_text(images.registry_config(Path(registry), f"{ips['registry']}:443", tls, True))
    procs = {
        "registry": subprocess.Popen(["docker-registry", "serve", str(cdir / "registry.yml")], stdin=subprocess.DEVNULL,
                                     stdout=open(cdir / "registry.log", "w"), stderr=subprocess.STDOUT, start_new_session=True),
        "index": subprocess.Popen([sys.executable, "-m", "sim.pypi", "--bind", ips["index"], "--port", "443",
                                   "--pidfile", str(cdir / "index.pid"),
                                   "--dir", str(images.wheels_dir()), "--cert", str(tls["cert"]), "--key", str(tls["key"]),
                                   *[a for h in images.NVIDIA_INDEX_NAMES for a in ("--empty-host", h)]],
                                  cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdin=subprocess.DEVNULL,
                                  stdout=open(cdir / "index.log", "w"), stderr=subprocess.STDOUT, start_new_session=True),
    }
    state["services"] = {name: p.pid for name, p in procs.items()}
    _save_state(cdir, state)
    for name, p in procs.items():
        _wait_port(ips[name], 443, 15, p, cdir / f"{name}.log", what=name)
    return ips


def _wait_dockerd(hosts: list[tuple[str, int, Path]], timeout: float = 90) -> None:
    """Every host's dockerd answers (``docker version`` in the host's own namespaces)."""
    pending = list(hosts)
    end = time.monotonic() + timeout
    while pending:
        left = []
        for name, pid, hdir in pending:
            res = subprocess.run(["nsenter", "-t", str(pid), "-m", "-n", dockerd.CLI, "version", "--format", "{{.Server.Version}}"],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                left.append((name, pid, hdir))
        pending = left
        if not pending:
            return
        if time.monotonic() > end:
            name, _, hdir = pending[0]
            log = (hdir / "dockerd.log").read_text()[-800:] if (hdir / "dockerd.log").exists() else ""
            raise SimError(f"dockerd on {name} did not answer within {timeout:g}s: {log}")
        time.sleep(0.2)


def up(cluster: Cluster, echo=print) -> dict:
    """Create the simulated hosts of ``cluster``; returns the recorded state.
    When anything fails, what was made is removed again before the error goes on."""
    try:
        return _up(cluster, echo)
    except BaseException:
        down(cluster.name, echo=lambda *_: None)
        raise


def _up(cluster: Cluster, echo) -> dict:
    preflight()
    down(cluster.name, echo=lambda *_: None)
    built = images.ensure(echo)
    cdir = cluster_dir(cluster.name)
    cdir.mkdir(parents=True, exist_ok=True)
    links = _links(cluster.name)
    state: dict = {"cluster": cluster.name, "mode": "netns", "links": list(links.values()), "hosts": {}}
    _save_state(cdir, state)

    # client key, the tool's known_hosts and ssh_config
    key = cdir / "id_ed25519"
    _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"llmdeploy-sim-{cluster.name}", "-f", str(key))
    _write(cdir / "authorized_keys", (cdir / "id_ed25519.pub").read_text(), 0o644)  # read by sshd as the user logging in (root or an operator)
    # every host's accounts (root and the operators) and the shared /home
    users.prepare(cdir)
    # a stand-in checkpoint in an operator's home: once, every host sees it (an NFS home)
    for path in {cluster.model.path, cluster.model.tokenizer_path}:
        home = users.home_of(path)
        if home is not None:
            write_model(cdir / path.lstrip("/"))
            users.give(cdir / home.lstrip("/"), cdir / path.lstrip("/"), dict(users.USERS)[Path(home).name])
    # mount points on this machine: remembered across clusters, removed (if
    # still empty) when the last simulated cluster goes down
    with _mount_points_lock():
        made_file = sim_root() / "created_dirs.json"
        made = json.loads(made_file.read_text()) if made_file.exists() else []
        for d in PRIVATE_DIRS:
            # every directory made (parents too), so that down removes them all
            parts = Path(d).parts
            for k in range(2, len(parts) + 1):
                p = str(Path(*parts[:k]))
                if not os.path.isdir(p):
                    os.mkdir(p)
                    made.append(p)
        ascend = cluster.platform_info.vendor == "ascend"
        # mount points for each Ascend host's own files (empty files and
        # directories here): /etc/hccn.conf and what the seed's docker run bind-mounts
        for point in ([HCCN_CONF, *ASCEND_HOST_FILES] if ascend else []):
            if not os.path.exists(point):
                Path(point).touch()
                made.append(point)
        for point in (ASCEND_HOST_DIRS if ascend else []):
            if not os.path.exists(point):
                os.mkdir(point)
                made.append(point)
        made_file.write_text(json.dumps(sorted(set(made))))

    gw = _mgmt_gateway(cluster)
    mb, db = links["mgmt_bridge"], links["data_bridge"]
    _sh("ip", "link", "add", mb, "type", "bridge")
    _sh("ip", "addr", "add", str(gw), "dev", mb)
    _sh("ip", "link", "set", mb, "up")
    _sh("ip", "link", "add", db, "type", "bridge")
    _sh("ip", "link", "set", db, "up")
    nb = links["npu_bridge"]
    if ascend:
        # the NPUs' RoCE network: NPU d of every host on its own plane (a
        # bridge per NPU index, like one switch plane and subnet per index),
        # through an interface npu<d> in each host
        _batch([c for d in range(cluster.platform_info.devices) for c in (f"link add {nb}{d} type bridge", f"link set {nb}{d} up")])

    services = _start_services(cluster, cdir, state, built["registry"])
    known_hosts, ssh_config = [], []
    # a Slurm cluster's login host (slurmctld) first: the nodes' slurmd register as they start
    login = slurm.start_login(cluster, cdir, state, links, hosts_file(cluster, services), lambda: _save_state(cdir, state)) if cluster.slurm else None
    if login:
        known_hosts.append(sshd.known_host(login["name"], login["mgmt_ip"], login["dir"]))
        ssh_config.append(sshd.client_entry(login["name"], login["mgmt_ip"], cdir))
    procs = []
    for i, node in enumerate(cluster.nodes):
        ns = netns_name(cluster.name, node.name)
        hdir = host_dir(cluster.name, node.name)
        hdir.mkdir(parents=True, exist_ok=True)
        state["hosts"][node.name] = {"netns": ns, "dir": str(hdir)}
        _save_state(cdir, state)
        m_ip = mgmt_ip(str(node.ip))
        data_net = ipaddress.IPv4Network(f"{node.ip}/24", strict=False)

        # network
        _sh("ip", "netns", "add", ns)
        _sh("ip", "-n", ns, "link", "set", "lo", "up")
        mv, dv = f"{mb}{i}", f"{db}{i}"  # host-side veths: bridge name + index
        _sh("ip", "link", "add", mv, "type", "veth", "peer", "name", "mgmt0", "netns", ns)
        _sh("ip", "link", "set", mv, "master", mb, "up")
        _sh("ip", "-n", ns, "addr", "add", f"{m_ip}/24", "dev", "mgmt0")
        _sh("ip", "-n", ns, "link", "set", "mgmt0", "up")
        _sh("ip", "link", "add", dv, "type", "veth", "peer", "name", node.nic, "address", _npu_mac(cluster.name, i, DATA_NIC), "netns", ns)
        _sh("ip", "link", "set", dv, "master", db, "up")
        _sh("ip", "-n", ns, "addr", "add", f"{node.ip}/{data_net.prefixlen}", "dev", node.nic)
        _sh("ip", "-n", ns, "link", "set", node.nic, "mtu", "9000")
        _sh("ip", "link", "set", dv, "mtu", "9000")
        _sh("ip", "-n", ns, "link", "set", node.nic, "up")
        # the data network's neighbours are known too (static ARP): at 64 nodes
        # their 4032 learned entries overflowed the kernel's neighbour table,
        # which all namespaces share (gc_thresh3 1024): "ping: sendmsg: No buffer space available"
        _batch([f"neigh replace {other.ip} lladdr {_npu_mac(cluster.name, j, DATA_NIC)} dev {node.nic} nud permanent"
                for j, other in enumerate(cluster.nodes) if j != i], ns)

        hw = hardware.node_hardware(cluster, i, node)
        if hw["net"]["mbit"]:
            links_.shape_host(cluster.name, node.name, node.nic, [mv, dv], hw["net"]["mbit"])
        if ascend:
            root_cmds, ns_cmds, fdb = [], [], []
            for npu in hw["npus"]:
                d = npu["id"]
                host_side = f"{nb}{d}x{i}"
                mac = _npu_mac(cluster.name, i, d)
                root_cmds.append(f"link add {host_side} type veth peer name npu{d} address {mac} netns {ns}")
                root_cmds.append(f"link set {host_side} master {nb}{d} up")
                fdb.append(f"fdb add {mac} dev {host_side} master static")
                ns_cmds.append(f"addr add {npu['ip']}/24 dev npu{d}")
                ns_cmds.append(f"link set npu{d} up")
                # the RoCE plane's neighbours are known (like a fabric with
                # static ARP): no broadcast storm when 512 NPUs ping at once
                for j, _ in enumerate(cluster.nodes):
                    if j != i:
                        ns_cmds.append(f"neigh replace {hardware.npu_ip(d, j)} lladdr {_npu_mac(cluster.name, j, d)} dev npu{d} nud permanent")
            _batch(root_cmds)
            _batch(fdb, tool="bridge")
            _batch(ns_cmds, ns)

        # private filesystem view
        root = hdir / "root"
        for d in PRIVATE_DIRS:
            (root / d.lstrip("/")).mkdir(parents=True, exist_ok=True)
        for d, (mode, uid) in PRIVATE_MODES.items():
            os.chmod(root / d.lstrip("/"), mode)
            if uid is not None:
                os.chown(root / d.lstrip("/"), uid, uid)
        hardware.save(root / HOST_STATE_DIR.lstrip("/"), hw)
        # the simulator's CA for each registry name, as a site gives docker a private registry's CA
        ca = images.tls()["ca"].read_text()
        for reg in images.REGISTRY_NAMES:
            _write(root / "etc/docker/certs.d" / reg / "ca.crt", ca)
        fast.render(str(root / HOST_STATE_DIR.lstrip("/")), standins.TOOLS)
        # the simulated hardware's state is written by whoever runs a stand-in (a Slurm site's user too)
        users.open_to_all(root / HOST_STATE_DIR.lstrip("/"))
        _write(hdir / "meminfo", hardware.meminfo(hw))
        _write(hdir / "bashrc", "# ~/.bashrc of a simulated host (sim/cluster.py)\n")
        bindir = hdir / "bin"
        tools = STANDINS_ASCEND if cluster.platform_info.vendor == "ascend" else STANDINS_NVIDIA
        for tool in tools:
            _write(bindir / tool, _standin_wrapper(tool), 0o755)
        # the host's docker is Debian's client, whatever this machine has in /usr/local/bin
        # (paced on request, as its sha256sum: node.json "slow", sim/standins/slow.py)
        _write(bindir / "docker", slow.docker_wrapper(host_python(), str(REPO)), 0o755)
        _write(bindir / "sha256sum", slow.sha256sum_wrapper(), 0o755)
        _write(bindir / "ping", slow.ping_wrapper(), 0o755)
        if ascend:
            _write(bindir / "hccn_tool", _hccn_wrapper(), 0o755)
            _write(hdir / "hccn.conf", hardware.hccn_conf(hw))
            # the driver's files where the seed's docker run mounts them from
            driver = root / "usr/local/Ascend/driver"
            _write(driver / "tools/hccn_tool", _hccn_wrapper(), 0o755)
            _write(driver / "version.info", ASCEND_DRIVER_VERSION)
            (driver / "lib64").mkdir(parents=True, exist_ok=True)
            _write(hdir / "npu-smi", _standin_wrapper("npu-smi"), 0o755)
            _write(hdir / "ascend_install.info", ASCEND_INSTALL_INFO)
            (hdir / "dcmi").mkdir(exist_ok=True)
        if not ascend:
            _write(bindir / dockerd.HOOK, dockerd.hook_script(), 0o755)
            _write(bindir / "nvidia-container-cli", gpusite.container_cli_script(), 0o755)
        _write(bindir / dockerd.RUNTIME, dockerd.runtime_script(HOST_STATE_DIR), 0o755)
        _write(hdir / "hosts", hosts_file(cluster, services))
        # a small stand-in checkpoint at the model (and tokenizer) path
        for path in {cluster.model.path, cluster.model.tokenizer_path}:
            if path.startswith("/root/.cache/"):
                write_model(root / path.lstrip("/"))
            elif path.startswith(users.DATA + "/"):
                # on the node's data disk, put there by the site's user
                write_model(root / path.lstrip("/"))
                users.give(root / users.DATA.lstrip("/"), root / path.lstrip("/"), users.OPERATOR_UID)
        # a Dynamo profile's TensorRT-LLM checkout (the agentic base role files)
        recipes = getattr(cluster.profile, "recipes_dir", None)
        if not ascend and recipes and recipes.startswith(("/root/.cache/", "/opt/trtllm-recipes")):
            curated.write_recipes(root / recipes.lstrip("/"))

        # sshd
        hostkey = hdir / "ssh_host_ed25519_key"
        _sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", node.name, "-f", str(hostkey))
        path = f"{bindir}:{SYSTEM_PATH}"
        env = {"PATH": path, "LLMDEPLOY_SIM_HOST": node.name, "LLMDEPLOY_SIM_HOSTDIR": str(hdir), **slurm.node_env(cluster, cdir)}
        # also on the data network, reachable only from the other simulated hosts (jump-host paths)
        # a Slurm cluster's compute nodes refuse SSH from one another and from the login host (a site
        # without pam_slurm_adopt): worlds start by srun --mpi=pmix, invoke check's commands are job steps
        others = ([a for n in cluster.nodes if n is not node for a in (mgmt_ip(str(n.ip)), str(n.ip))] + list(slurm.login_ips(cluster))
                  if cluster.slurm else [])
        _write(hdir / "sshd_config", sshd.sshd_config([m_ip, str(node.ip)], hdir, cdir, env, deny_from=others))
        binds = [f"mount --bind {shlex.quote(str(root / d.lstrip('/')))} {shlex.quote(d)}" for d in PRIVATE_DIRS]
        q = lambda p: shlex.quote(str(p))  # noqa: E731
        script = "\n".join(
            [
                "set -e",
                f"hostname {shlex.quote(node.name)}",
                *binds,
                f"mount --bind {q(hdir / 'meminfo')} /proc/meminfo",
                *([f"mount --bind {q(hdir / 'hccn.conf')} {HCCN_CONF}"] if ascend else []),
                *([f"mount --bind {q(hdir / src)} {dst}" for dst, src in {**ASCEND_HOST_FILES, **ASCEND_HOST_DIRS}.items()]
                  if ascend else []),
                f"mount --bind {q(hdir / 'hosts')} /etc/hosts",
                *users.bind_lines(cdir),
                # the host's own /dev when it has devices of its own (Ascend's davinci nodes)
                # (an NVIDIA Slurm site's too: its gres.conf names the GPUs' device files)
                *(dev_lines(hw) if ascend or cluster.slurm else []),
                "mount -t tmpfs -o size=256m,mode=1777 tmpfs /dev/shm",
                # bash sources ~/.bashrc for every SSH command: a node's own,
                # not this machine's (a pyenv init there cost 130 ms per command)
                f"if [ -f /root/.bashrc ]; then mount --bind {q(hdir / 'bashrc')} /root/.bashrc; fi",
                # the host's Docker Engine: cgroups, its own /run (docker.sock, containerd, runc state)
                *dockerd.cgroup_mounts(),
                "mount -t tmpfs -o mode=755,size=64m tmpfs /run",
                "mkdir -p /run/sshd",
                *docker_tmpfs_lines(hdir / "docker"),
                *dockerd.start_lines(hdir / "docker", Path(dockerd.EXEC_ROOT), hdir / "dockerd.pid", hdir / "dockerd.log",
                                     path, runtime=bindir / dockerd.RUNTIME,
                                     env={"SSL_CERT_FILE": str(images.trust_bundle())},
                                     cgroup_parent=cgroup_parent(cluster.name, node.name)),
                # a Slurm cluster's munged and slurmd (sim/slurm.py)
                *slurm.host_lines(cluster, cdir, node.name, env),
                f"exec {SSHD} -D -r -f {q(hdir / 'sshd_config')} -E {q(hdir / 'sshd.log')}",
            ]
        )
        log = hdir / "sshd.log"
        argv = ["ip", "netns", "exec", ns, "unshare", "--mount", "--uts", "--propagation", "private", "--", "/bin/sh", "-c", script]
        if slurm.constrained(cluster):
            # a cgroup namespace of its own, rooted in the host's folder of every
            # hierarchy (its slurmd's cgroups; its dockerd's containers under it)
            argv[5:5] = ["--cgroup"]
            folder = cgroup_parent(cluster.name, node.name).strip("/") + ".host"
            argv = ["/bin/sh", "-c", "\n".join(["set -e", *slurm.host_cgroup_lines(folder), "exec " + shlex.join(argv)])]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=open(hdir / "start.log", "w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        state["hosts"][node.name]["pid"] = proc.pid
        state["hosts"][node.name]["mgmt_ip"] = m_ip
        _save_state(cdir, state)
        procs.append((node, m_ip, proc, log))

        known_hosts.append(sshd.known_host(node.name, m_ip, hdir))
        ssh_config.append(sshd.client_entry(node.name, m_ip, cdir))

    _write(cdir / "known_hosts", "\n".join(known_hosts) + "\n")
    _write(cdir / "ssh_config", "# written by llmdeploy sim.up; use with ssh -F\n" + "\n".join(ssh_config))
    for node, m_ip, proc, log in procs:
        _wait_port(m_ip, 22, 15, proc, log)
    _wait_dockerd([(node.name, proc.pid, host_dir(cluster.name, node.name)) for node, _, proc, _ in procs])
    if login:
        _wait_port(login["mgmt_ip"], 22, 15, login["proc"], login["dir"] / "sshd.log")
        slurm.wait_idle(cluster, cdir, login["proc"].pid)
    state["ready"] = True
    _save_state(cdir, state)
    echo(f"sim {cluster.name}: {len(cluster.nodes)} hosts up (network namespaces, real sshd and dockerd); ssh -F {cdir / 'ssh_config'} {cluster.nodes[0].name}")
    return state


def _save_state(cdir: Path, state: dict) -> None:
    tmp = cdir / "state.json.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(cdir / "state.json")


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def _services_of(cdir: Path) -> list[int]:
    """The cluster's registry and package index: processes whose command line
    is the one _start_services gave them (a recorded pid is not trusted alone:
    after a reboot it may be anybody's)."""
    registry = ["docker-registry", "serve", str(cdir / "registry.yml")]
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        argv = _cmdline(int(p.name))
        if argv[:3] == registry or ("sim.pypi" in argv and str(cdir / "index.pid") in argv):
            out.append(int(p.name))
    return out


def _stop_dockerds(pidfiles: list[Path], timeout: float = 20) -> None:
    pids = []
    for f in pidfiles:
        try:
            pid = int(f.read_text().strip())
            argv = _cmdline(pid)
            if argv[:1] != ["dockerd"] or str(f) not in argv:
                continue  # not the daemon that wrote this file (a reboot, a reused pid)
            os.kill(pid, signal.SIGTERM)
            pids.append(pid)
        except (OSError, ValueError):
            pass
    end = time.monotonic() + timeout
    while pids and time.monotonic() < end:
        pids = [p for p in pids if Path(f"/proc/{p}").exists() and "Z" not in _proc_state(p)]
        time.sleep(0.1)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "Z"


def down(name: str, echo=print) -> bool:
    """Remove everything the simulated cluster ``name`` made. Safe to call
    on a cluster that is not up or only half made. Returns True if anything was removed."""
    cdir = cluster_dir(name)
    removed = False
    # the connection holders of this cluster (ssh.persist_s): their hosts go away
    from transports.ssh import mux

    removed = mux.stop(name) > 0
    state = {}
    if (cdir / "state.json").exists():
        try:
            state = json.loads((cdir / "state.json").read_text())
        except ValueError:
            state = {}
    # namespaces: from the state, and any left with our prefix (crashed runs),
    # except those of another cluster whose name begins with ours (sim-a3's
    # prefix lds-sim-a3- is also the start of every sim-a3-slurm host's)
    listed = _sh("ip", "netns", "list", check=False).stdout
    namespaces = namespaces_of(name, listed, _cluster_names())
    # the hosts and a Slurm cluster's login host
    recorded = [*state.get("hosts", {}).values(), *([state["login"]] if state.get("login") else [])]
    namespaces |= {h["netns"] for h in recorded}
    # each host's dockerd first: it stops its containers (SIGTERM, then
    # SIGKILL after --shutdown-timeout) and its containerd
    hosts = state.get("hosts", {})
    _stop_dockerds([Path(h["dir"]) / "dockerd.pid" for h in hosts.values() if h.get("dir")])
    for ns in sorted(namespaces):
        netns.kill(ns)
        if _sh("ip", "netns", "del", ns, check=False).returncode == 0:
            removed = True
    # whatever a daemon left in its containers' cgroups (a container with a
    # network of its own), of every host, recorded or not (a crashed run)
    if dockerd.kill_cgroups(cgroup_parent(name, "")):
        removed = True
    # the registry and the index (their command lines name the cluster's directory)
    for pid in _services_of(cdir):
        try:
            os.kill(pid, signal.SIGKILL)
            removed = True
        except ProcessLookupError:
            pass
    for h in recorded:
        pid = h.get("pid")
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    bridges = tuple(_links(name).values())
    for link in bridges:
        if _sh("ip", "link", "del", link, check=False).returncode == 0:
            removed = True
    # host-side veths (bridge name + node index) vanish with their namespace;
    # remove any stragglers
    out = _sh("ip", "-o", "link", "show", check=False).stdout
    for line in out.splitlines():
        ifname = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if ifname.startswith(bridges):
            _sh("ip", "link", "del", ifname, check=False)
    if cdir.exists():
        shutil.rmtree(cdir, ignore_errors=True)
        removed = True
    # mount points made on this machine, once no simulated cluster is left:
    # none recorded and no simulated host's namespace (a crashed run's hosts
    # still use them; removing an empty directory that is a mount point in
    # another mount namespace unmounts it there)
    root = sim_root()
    made_file = root / "created_dirs.json"
    with _mount_points_lock():
        if made_file.exists() and not running() and not _host_namespaces():
            _remove_mount_points(made_file)
    if removed:
        echo(f"sim {name}: removed")
    return removed


def namespaces_of(name: str, listed: str, clusters: list[str]) -> set[str]:
    """The namespaces in ``ip netns list``'s output ``listed`` that carry the
    cluster ``name``'s prefix (``lds-<name>-``), but not those of another of
    ``clusters`` whose own prefix begins with it: sim-a3-slurm's hosts are
    lds-sim-a3-slurm-..., and sim.down of sim-a3 must leave them running."""
    prefix = f"lds-{name}-"
    longer = tuple(f"lds-{o}-" for o in clusters if o != name and f"lds-{o}-".startswith(prefix))
    names = (line.split()[0] for line in listed.splitlines() if line.strip())
    return {ns for ns in names if ns.startswith(prefix) and not (longer and ns.startswith(longer))}


def _remove_mount_points(made_file: Path) -> None:
    # deepest first: a parent made for a mount point goes after its children
    for d in sorted(json.loads(made_file.read_text()), key=lambda p: (-p.count("/"), p)):
        try:
            if os.path.isfile(d):
                if os.path.getsize(d) == 0:
                    os.remove(d)
            else:
                os.rmdir(d)
        except OSError:
            pass
    made_file.unlink()


@contextlib.contextmanager
def _mount_points_lock():
    """The machine's mount points (created_dirs.json) are shared by every
    simulated cluster: one sim.up adds to them while another's sim.down may
    remove them, so both hold this lock."""
    root = sim_root()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / "created_dirs.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _host_namespaces() -> list[str]:
    """Every simulated host's network namespace on this machine, of any cluster."""
    listed = _sh("ip", "netns", "list", check=False).stdout.splitlines()
    return [line.split()[0] for line in listed if line.startswith("lds-") and line.split()[0] != images.BUILDER_NS]


def _cluster_names() -> list[str]:
    """Every cluster the inventory names, and every simulated cluster with a
    directory here (made before its hosts, removed after them)."""
    root = sim_root()
    here = {p.name for p in root.iterdir() if p.is_dir()} if root.exists() else set()
    return sorted(here | set(list_clusters()))


def shape(cluster: Cluster, mbit: float | None, registry: bool = True) -> None:
    """Give every host of a cluster that is up a link of ``mbit`` Mbit/s (None:
    unshaped), on both ends of its management and data veths, and the same to
    its registry and package index; kept in each node.json (``net.mbit``)."""
    state_file = cluster_dir(cluster.name) / "state.json"
    if not state_file.exists():
        raise SimError(f"{cluster.name} is not up (invoke sim.up --cluster {cluster.name})")
    links = _links(cluster.name)
    for i, node in enumerate(cluster.nodes):
        sdir = host_dir(cluster.name, node.name) / "root" / HOST_STATE_DIR.lstrip("/")
        hw = hardware.load(sdir)
        hw.setdefault("net", {})["mbit"] = mbit
        hardware.save(sdir, hw)
        links_.shape_host(cluster.name, node.name, node.nic, [f"{links['mgmt_bridge']}{i}", f"{links['data_bridge']}{i}"], mbit)
    if registry:
        links_.shape_bridge(links["mgmt_bridge"], mbit)


def running() -> list[str]:
    root = sim_root()
    if not root.exists():
        return []
    return sorted(p.name for p in root.iterdir() if (p / "state.json").exists())
