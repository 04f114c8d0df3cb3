"""Where the simulated cluster keeps its state, and the SSH settings the
sim inventories use (own key, own known_hosts, own ssh_config)."""

from __future__ import annotations

import hashlib
import ipaddress
import os
import sys
from pathlib import Path

from llmdeploy.errors import SimError
from llmdeploy.inventory import DeploySettings, GateSettings, GateTolerance, Ssh, StageSettings

from .users import OPERATOR_UID, operator_tmp

# Paths on a simulated host that are private to it (bind-mounted per host).
PRIVATE_DIRS = [
    "/var/lib/llmdeploy",
    "/etc/llmdeploy",
    "/var/log/llmdeploy",
    "/root/.cache",
    "/usr/local/Ascend",
    "/etc/llmdeploy-sim",
    # a TensorRT-LLM checkout for Dynamo, mounted at the same path in its
    # containers (a shell sources its profile .env there, as the seed does)
    "/opt/trtllm-recipes",
    # the registries' CA where docker (and the stage agent reading a registry) looks for it
    "/etc/docker/certs.d",
    # a node's own data disk (as a DGX's /raid): where a site's users keep a model each node reads locally
    "/data",
    # a Slurm node's enroot and pyxis folders (sim/slurm.py ENROOT_NODE_DIR), each user's in it (sticky, as /tmp)
    "/var/lib/enroot",
    # the operator's folder in a node's /var/tmp (sim/users.py): the tool's per-user default on a Slurm
    # cluster; this machine's /var/tmp is every simulated host's, so each host gets its own there
    operator_tmp(),
]
# private folders that are not root's: (mode, owner's uid or None)
PRIVATE_MODES = {"/data": (0o1777, None), "/var/lib/enroot": (0o1777, None), operator_tmp(): (0o700, OPERATOR_UID)}
# Inside a host, the stand-ins read their state here.
HOST_STATE_DIR = "/etc/llmdeploy-sim"
# a simulated host's PATH after its own bin directory (stand-ins, the docker wrapper)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def host_python() -> str:
    """The interpreter of the hosts' stand-in wrappers (ibstat, nvidia-smi,
    docker's pacing, ...): every user of a simulated host runs them, as any
    user runs a node's ibstat. The simulator's own when everybody may run it;
    else Debian's /usr/bin/python3 (scripts/setup.sh installs it; the
    stand-ins need only the standard library), e.g. where the simulator runs
    from a Python under /root."""
    exe, link = Path(os.path.realpath(sys.executable)), Path(sys.executable)
    if all(os.stat(p).st_mode & 0o001 for p in [exe, *exe.parents, *link.parents]):
        return sys.executable
    if os.access("/usr/bin/python3", os.X_OK):
        return "/usr/bin/python3"
    raise SimError(f"{exe} cannot be run by the simulated hosts' users and /usr/bin/python3 is missing: run scripts/setup.sh")


def node_memlock_kib() -> int | None:
    """The memlock (KiB) a simulated Slurm node's tasks can have: slurmd's,
    the lower of sim.up's soft and hard limits (None: unlimited). A real GPU node
    gives unlimited; where this machine cannot (8 MiB in a container
    without CAP_SYS_RESOURCE), the simulated inventories ask for what it gives
    (``slurm.memlock_kib``), so that the site check still tells 64 KiB apart."""
    import resource

    # slurmd keeps the limits of sim.up's process (soft and hard), and gives the tasks its soft one
    soft, hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    have = [v for v in (soft, hard) if v != resource.RLIM_INFINITY]
    return min(have) // 1024 if have else None


def sim_root() -> Path:
    return Path(os.environ.get("LLMDEPLOY_SIM_ROOT", "/var/tmp/llmdeploy-sim"))


def cluster_dir(cluster: str) -> Path:
    return sim_root() / cluster


def host_dir(cluster: str, node: str) -> Path:
    return cluster_dir(cluster) / "hosts" / node


def on_host(cluster: str, node: str, path: str) -> Path:
    """Where this machine sees ``path`` of a simulated host: a path in one of its PRIVATE_DIRS."""
    if not any(path == d or path.startswith(d + "/") for d in PRIVATE_DIRS):
        raise ValueError(f"{path} is not in a simulated host's own folders (sim/paths.py PRIVATE_DIRS)")
    return host_dir(cluster, node) / "root" / path.lstrip("/")


def short_id(cluster: str) -> str:
    return hashlib.sha1(cluster.encode()).hexdigest()[:4]


def netns_name(cluster: str, node: str) -> str:
    return f"lds-{cluster}-{node}"


def mgmt_ip(data_ip: str) -> str:
    """Simulated hosts have their serving IP in 198.19.0.0/16 and their SSH
    (management) address at the same place in 198.18.0.0/16."""
    ip = ipaddress.IPv4Address(data_ip)
    if ip not in ipaddress.IPv4Network("198.19.0.0/16"):
        raise ValueError(f"simulated node IP {ip} must be in 198.19.0.0/16")
    return str(ip - (1 << 16))


def sim_ssh(cluster: str, **overrides) -> Ssh:
    """SSH settings for a simulated cluster: its own key, known_hosts and ssh_config."""
    d = cluster_dir(cluster)
    values = dict(
        user="root",
        identity_file=str(d / "id_ed25519"),
        known_hosts=str(d / "known_hosts"),
        config_file=str(d / "ssh_config"),
        connect_timeout=5,
        command_timeout=60,
    )
    values.update(overrides)
    return Ssh(**values)


def sim_nodes(prefix: str, count: int, first_ip: str, **per_node):
    """Nodes named ``<prefix><i>`` whose SSH address is their name, resolved
    by the simulator's ssh_config (so the ssh_config path is exercised).
    ``per_node`` maps an index (as a string) to extra Node fields (e.g. **{"3": {"nic": "eth9"}})."""
    from llmdeploy.inventory import Node

    base = ipaddress.IPv4Address(first_ip)
    nodes = []
    for i in range(count):
        extra = dict(per_node.get(str(i), {}))
        nodes.append(Node(name=f"{prefix}{i}", ip=str(base + i), ssh_host=f"{prefix}{i}", **extra))
    return nodes


# the stand-ins' default pace (sim/hardware.py writes it into every host's
# node.json ``latency``): 20 ms to the first token, 10 ms a token after it
SIM_LATENCY = {"first_token_s": 0.02, "per_token_s": 0.01}
# how many times slower per token a stand-in is made to fail the simulated quality gate (sim_deploy)
SIM_SLOWER = 15


def sim_stage_uncompressed() -> StageSettings:
    """An image a node saves goes down the chain as docker save writes it
    (the GB300 Dynamo clusters' image with the wheels): the hosts' links are
    veths on one machine, where the CPU that gzip and docker load's gunzip
    take (33 s of it for five nodes) is what the chain waits for, not the
    link. The sim-a3 clusters keep the default, so the compressed stream is
    run too."""
    return StageSettings(image_compression="none")


def sim_deploy(**overrides) -> DeploySettings:
    """Deadlines in seconds, not the hours a real load takes; a smoke
    benchmark of a second or so. The gate's tolerances are far wider than a
    real cluster's: this machine runs every simulated host and the tool on
    two cores, the test suite two clusters at once, so its figures move with
    the load of the machine. Seen on healthy releases while another cluster
    ran beside them: TTFT p50 3.7x (10.9x once, 299.9 ms against 27.6 ms, in
    a full run that took 36 min: the first requests after a world's restart)
    and p95 7.8x their baseline's (8 requests:
    p95 is nearly the slowest), TPOT p50 2.0x and p95 3.4x, output tokens/s
    0.35x. The stand-ins sleep SIM_LATENCY per token, so load only adds to
    it: a stand-in made SIM_SLOWER times slower per token streams at no less
    than 150 ms a token and fails TPOT p50 (limit 3x or 50 ms over a
    baseline, whichever is more) unless the baseline itself was streamed
    more than 5x slower than the stand-ins' pace."""
    values = dict(rpc_timeout_s=60, ready_timeout_s=90, request_timeout_s=30, worker_retries=2, backoff_s=0.5, backoff_max_s=2, poll_s=0.5,
                  stop_timeout_s=5, drain_s=10,
                  gate=GateSettings(requests=8, concurrency=4, input_tokens=32, output_tokens=32, timeout_s=60, floor_ms=50,
                                    tolerance=GateTolerance(ttft_p50=15.0, ttft_p95=19.0, tpot_p50=2.0, tpot_p95=4.0, output_tokens_per_s=0.8)))
    values.update(overrides)
    return DeploySettings(**values)
