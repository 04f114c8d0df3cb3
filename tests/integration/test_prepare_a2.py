"""invoke prepare on the simulated 8-node A2 cluster, node 5 with its own NIC name."""

import json

from sim.paths import host_dir
from tests.conftest import run_invoke

SIM_CLUSTER = "sim-a2"


def test_prepare_a2_each_node_gets_its_own_ip_and_nic(sim_cluster):
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "24 changed" in res.stdout and "FAILED" not in res.stdout
    for i in range(8):
        root = host_dir(SIM_CLUSTER, f"sim-a2-{i}") / "root"
        env = (root / "etc/llmdeploy/sim-a2.env").read_text()
        nic = "enp61s0f1" if i == 5 else "enp189s0f0"
        for key in ("HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "TP_SOCKET_IFNAME"):
            assert f"{key}={nic}\n" in env
        assert f"HCCL_IF_IP=198.19.2.{10 + i}\n" in env
        rec = json.loads((root / "var/lib/llmdeploy/sim-a2/prepared.json").read_text())
        assert rec["start_rank"] == i and rec["binding"]["mode"] == "topo-affinity"
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--json", "--no-check")
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["changed"] == 0
    # nothing to change: one round trip per node (the facts script with the later steps' probes), whatever the node count
    assert set(doc["round_trips"].values()) == {1}


def test_deploy_a2_ends_healthy_and_logs_reads_them(sim_cluster):
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, "--skip-prepare", timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert ", healthy" in res.stdout
    res = run_invoke("logs", "--cluster", SIM_CLUSTER, "--host", "sim-a2-5", "--tail", "50")
    assert res.returncode == 0, res.stderr
    assert "sim-a2-5 | " in res.stdout and "Launching 1 data parallel engine(s) in headless mode, with head node address tcp://198.19.2.10:13389." in res.stdout
    res = run_invoke("logs", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0 and "sim-a2-0 | " in res.stdout and "Application startup complete." in res.stdout
    bad = run_invoke("logs", "--cluster", SIM_CLUSTER, "--since", "1h; reboot")
    assert bad.returncode == 2 and "--since" in bad.stderr


def test_verify_comm_a2_passes(sim_cluster):
    res = run_invoke("verify-comm", "--cluster", SIM_CLUSTER, "--json", timeout=600)
    doc = json.loads(res.stdout)
    assert res.returncode == 0 and doc["ok"], res.stdout[-2000:]
    assert doc["plan"] == "full" and doc["links"]["planned"] == 8 * 7 * 8
    # A2 reads the NPU IP with -ip (A3: -vnic) and pings with -ping
    assert all(v["checks"]["npu_ip"]["summary"] == "8/8" for v in doc["nodes"].values())


def test_top_shows_all_8_nodes_live_in_80_columns_and_quits_on_q(sim_cluster):
    """invoke top in a pseudo-terminal of 80 x 30, as a person runs it: every
    node appears, the server's load is read, and q ends it with status 0."""
    import fcntl
    import os
    import pty
    import select
    import struct
    import subprocess
    import termios
    import time

    from tests.conftest import INVOKE, REPO, tool_env

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 80, 0, 0))
    env = tool_env({"TERM": "xterm-256color"})  # the size is the pseudo-terminal's (80 x 30), not COLUMNS
    proc = subprocess.Popen(INVOKE + ["top", "--cluster", SIM_CLUSTER, "--interval", "1"], cwd=REPO, stdin=slave, stdout=slave, stderr=slave,
                            env=env, start_new_session=True)
    os.close(slave)
    seen, end = b"", time.monotonic() + 60
    try:
        while time.monotonic() < end and not all(f"sim-a2-{i} ".encode() in seen for i in range(8)):
            if select.select([master], [], [], 1)[0]:
                seen += os.read(master, 65536)
        text = seen.decode(errors="replace")
        assert all(f"sim-a2-{i} " in text for i in range(8)), text[-3000:]
        assert "8/8 up" not in text and "1/1 up" in text and "q quits" in text
        os.write(master, b"q")
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(master)
