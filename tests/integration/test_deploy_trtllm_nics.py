"""trtllm-serve TP16 on two simulated B200 hosts whose serving NICs have
different names (inventory/sim_b200_nics.py: ens1f0 on node 0, enp65s0f1 on
node 1). Issue 19: mpirun's ``-x`` used to hand node 0's NCCL_SOCKET_IFNAME and
GLOO_SOCKET_IFNAME to every rank, and node 1's ranks failed at NCCL bootstrap.

What each rank used is read from the ranks' own log lines (the trtllm-serve
stand-in logs its interface variables; OpenMPI forwards every rank's output to
mpirun, i.e. to node 0's container log), fetched with ``docker logs`` over SSH
as an operator would, so the test reads the same with any container runtime."""

import re
import subprocess

import pytest

from llmdeploy.release import parse_ledger
from sim.paths import cluster_dir, host_dir
from tests.conftest import REPO, run_invoke

SIM_CLUSTER = "sim-b200-nics"
NODES = ["sim-b200-nics-0", "sim-b200-nics-1"]
NIC = {"sim-b200-nics-0": "ens1f0", "sim-b200-nics-1": "enp65s0f1"}
RANK_LINE = re.compile(r"\[RANK (\d+)\] \[I\] rank \1 of (\d+) on (\S+): network interfaces "
                       r"NCCL_SOCKET_IFNAME=(\S*) \(NCCL uses ([^)]*)\), GLOO_SOCKET_IFNAME=(\S*)$")


def _base(node):
    return host_dir(SIM_CLUSTER, node) / "root/var/lib/llmdeploy" / SIM_CLUSTER


def _ledger():
    return parse_ledger((_base(NODES[0]) / "ledger.jsonl").read_text())


def _docker_logs(node: str, container: str) -> str:
    res = subprocess.run(["ssh", "-F", str(cluster_dir(SIM_CLUSTER) / "ssh_config"), node, "docker", "logs", container],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    return res.stdout + res.stderr


def _rank_lines(text: str) -> dict[int, tuple[str, str, str, str]]:
    """{rank: (host, NCCL_SOCKET_IFNAME, what NCCL uses, GLOO_SOCKET_IFNAME)} of every rank that logged one."""
    out = {}
    for line in text.splitlines():
        m = RANK_LINE.search(line)
        if m:
            out[int(m.group(1))] = (m.group(3), m.group(4), m.group(5), m.group(6))
    return out


def test_tp16_across_nodes_with_different_nic_names_is_healthy_and_every_rank_uses_its_own(sim_cluster):
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "serving, release " in res.stdout and ", healthy" in res.stdout
    rec = _ledger()[-1]
    assert rec["result"] == "good"
    rid = rec["release"]
    # every node's environment file names its own NIC, and mpirun exports neither variable
    for node in NODES:
        env = dict(ln.split("=", 1) for ln in (_base(node) / "releases" / rid / "env").read_text().splitlines()
                   if ln and not ln.startswith("#"))
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == NIC[node], node
    serve = (_base(NODES[0]) / "releases" / rid / "serve.sh").read_text().splitlines()[-1]
    assert "-x NCCL_SOCKET_IFNAME" not in serve and "-x GLOO_SOCKET_IFNAME" not in serve
    # every rank's own words: ranks 0-7 on node 0 with ens1f0, 8-15 on node 1 with enp65s0f1
    ranks = _rank_lines(_docker_logs(NODES[0], f"{SIM_CLUSTER}-{rid}"))
    assert sorted(ranks) == list(range(16)), sorted(ranks)
    for rank, (host, nccl, used, gloo) in ranks.items():
        node = NODES[rank // 8]
        assert (host, nccl, used, gloo) == (node, NIC[node], NIC[node], NIC[node]), rank
    doc = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    assert doc.returncode == 0, doc.stdout + doc.stderr


@pytest.mark.slow
def test_a_rank_given_another_nodes_nic_fails_as_nccl_does_and_the_reason_names_the_nics(sim_cluster, tmp_path):
    """What the old ``-x NCCL_SOCKET_IFNAME`` did, forced through the profile's env: both nodes' environment
    files say ens1f0 (OpenMPI's own TCP still uses each node's NIC). Node 1's ranks find no such interface on
    their host, NCCL's bootstrap fails, and the deploy says which variable and lists each node's NIC."""
    inv = tmp_path / "inventory"
    inv.mkdir()
    text = (REPO / "inventory" / "sim_b200_nics.py").read_text()
    forced = text.replace('trtllm_qwen38_fp8("qwen3.8-low-latency.yaml", ',
                          'trtllm_qwen38_fp8("qwen3.8-low-latency.yaml", env={"NCCL_SOCKET_IFNAME": "ens1f0"}, ')
    assert forced != text
    (inv / "sim_b200_nics.py").write_text(forced)
    good = _ledger()[-1]["release"]
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, "--skip-prepare", "--no-rollback", timeout=400,
                     env={"LLMDEPLOY_INVENTORY": str(inv), "LLMDEPLOY_LOG_DIR": str(tmp_path / "logs")})
    assert res.returncode == 1, res.stdout + res.stderr
    out = " ".join(res.stdout.split())
    assert "no network interface of a rank's node matches NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME" in out
    assert "the inventory's NIC per node: sim-b200-nics-0 ens1f0, sim-b200-nics-1 enp65s0f1" in out
    assert "sim-b200-nics-1:" in out and "Bootstrap : no socket interface found" in out
    # the good release comes back
    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"serving, release {good}, healthy" in res.stdout
    for node in NODES:
        assert (_base(node) / "current").readlink().name == good
