"""sim.up / sim.down leave nothing behind, and a crashed run does not trip the next sim.up;
every simulated host has a real Docker Engine, reached over SSH like a real node's."""

import shutil
import subprocess

from llmdeploy.inventory import load_cluster
from sim import dockerd
from sim.cluster import cgroup_parent
from sim.paths import cluster_dir, short_id
from tests.conftest import run_invoke

from .conftest import netns_list

NAME = "sim-gb300-agentic"


def _links():
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


def _daemons() -> dict[str, int]:
    return {n: len(subprocess.run(["pgrep", "-x", n], capture_output=True, text=True).stdout.split())
            for n in ("dockerd", "containerd", "containerd-shim", "docker-registry")}


def test_down_removes_everything_and_up_survives_a_crash():
    sid = short_id(NAME)
    before = _daemons()
    try:
        assert run_invoke("sim.up", "--cluster", NAME).returncode == 0
        assert f"lds-{NAME}-" in netns_list()
        # over SSH, as the tool reaches it: a real Docker Engine (server and client), with a container running
        cfg = str(cluster_dir(NAME) / "ssh_config")
        ssh = ["ssh", "-F", cfg, "-o", "BatchMode=yes", load_cluster(NAME).nodes[0].name]
        got = subprocess.run([*ssh, "docker version --format '{{.Server.Version}} {{.Server.Os}}'; "
                              "docker run -d --network host --name lifecycle quay.io/coreos/etcd:v3.5.17 sleep 600"],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        assert got.returncode == 0, got.stderr
        assert got.stdout.splitlines()[0].split()[1] == "linux" and got.stdout.splitlines()[0][0].isdigit(), got.stdout
        # a crash: the state file is gone, namespaces and processes are not
        shutil.rmtree(cluster_dir(NAME))
        res = run_invoke("sim.up", "--cluster", NAME)
        assert res.returncode == 0, res.stderr
        res = run_invoke("facts", "--cluster", NAME, "--json")
        assert res.returncode == 0, res.stderr
    finally:
        res = run_invoke("sim.down", "--cluster", NAME)
    assert res.returncode == 0
    assert f"lds-{NAME}-" not in netns_list()
    assert f"ld{sid}" not in _links()
    assert not cluster_dir(NAME).exists()
    ps = subprocess.run(["pgrep", "-af", f"llmdeploy-sim/{NAME}/"], capture_output=True, text=True).stdout
    assert ps.strip() == ""
    # no daemon, container or cgroup of its hosts is left (containerd's command line names /run/docker,
    # not the cluster: there are as many as before)
    assert not dockerd.cgroup_dirs(cgroup_parent(NAME, "")), "containers' cgroups are left"
    assert _daemons() == before


def test_sim_up_refuses_a_real_cluster():
    res = run_invoke("sim.up", "--cluster", "a3")
    assert res.returncode != 0 and "not a simulated cluster" in res.stderr
