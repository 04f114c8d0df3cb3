"""sim.up / sim.down leave nothing behind, and a crashed run does not trip the next sim.up;
every simulated host has a real Docker Engine, reached over SSH like a real node's."""

import shutil
import subprocess
from pathlib import Path

from llmdeploy.inventory import load_cluster
from sim import dockerd, netns
from sim.cluster import cgroup_parent
from sim.paths import cluster_dir, short_id
from tests.conftest import run_invoke

from .conftest import netns_list

SIM_CLUSTER = "sim-gb300-agentic"


def _links():
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


def _cluster_pids() -> dict[int, str]:
    """pid -> command name of every process in the cluster's hosts' namespaces
    (sshd, dockerd, containerd, the shims, the containers: they use the host network)."""
    out = {}
    for ns in (line.split()[0] for line in netns_list().splitlines() if line.startswith(f"lds-{SIM_CLUSTER}-")):
        for pid in netns.pids(ns):
            try:
                out[int(pid)] = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                pass
    return out


def _alive(pids: dict[int, str]) -> dict[int, str]:
    """Those of ``pids`` that still run the same command (a pid may have been
    reused); a zombie is dead (its new parent, this machine's pid 1, reaps it when it will)."""
    out = {}
    for pid, comm in pids.items():
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            if stat.split("(", 1)[1].rsplit(")", 1)[0] == comm and stat.rsplit(")", 1)[1].split()[0] != "Z":
                out[pid] = comm
        except (OSError, IndexError):
            pass
    return out


def test_down_removes_everything_and_up_survives_a_crash():
    sid = short_id(SIM_CLUSTER)
    try:
        assert run_invoke("sim.up", "--cluster", SIM_CLUSTER).returncode == 0
        assert f"lds-{SIM_CLUSTER}-" in netns_list()
        # over SSH, as the tool reaches it: a real Docker Engine (server and client), with a container running
        cfg = str(cluster_dir(SIM_CLUSTER) / "ssh_config")
        ssh = ["ssh", "-F", cfg, "-o", "BatchMode=yes", load_cluster(SIM_CLUSTER).nodes[0].name]
        got = subprocess.run([*ssh, "docker version --format '{{.Server.Version}} {{.Server.Os}}'; "
                              "docker run -d --network host --name lifecycle quay.io/coreos/etcd:v3.5.17 sleep 600"],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert got.returncode == 0, got.stderr
        assert got.stdout.splitlines()[0].split()[1] == "linux" and got.stdout.splitlines()[0][0].isdigit(), got.stdout
        first = _cluster_pids()
        assert {"sshd", "dockerd", "containerd", "sleep"} <= set(first.values()), first
        # a crash: the state file is gone, namespaces and processes are not
        shutil.rmtree(cluster_dir(SIM_CLUSTER))
        res = run_invoke("sim.up", "--cluster", SIM_CLUSTER)
        assert res.returncode == 0, res.stderr
        assert _alive(first) == {}, "the crashed run's processes are left"
        second = _cluster_pids()
        res = run_invoke("facts", "--cluster", SIM_CLUSTER, "--json")
        assert res.returncode == 0, res.stderr
    finally:
        res = run_invoke("sim.down", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0
    assert f"lds-{SIM_CLUSTER}-" not in netns_list()
    assert f"ld{sid}" not in _links()
    assert not cluster_dir(SIM_CLUSTER).exists()
    ps = subprocess.run(["pgrep", "-af", f"llmdeploy-sim/{SIM_CLUSTER}/"], capture_output=True, text=True).stdout
    assert ps.strip() == ""
    # no daemon, container or cgroup of its hosts is left
    assert not dockerd.cgroup_dirs(cgroup_parent(SIM_CLUSTER, "")), "containers' cgroups are left"
    assert _alive(second) == {}


def test_sim_up_refuses_a_real_cluster():
    res = run_invoke("sim.up", "--cluster", "a3")
    assert res.returncode != 0 and "not a simulated cluster" in res.stderr
