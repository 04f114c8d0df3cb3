"""The MPI launch files across nodes (issue 19, "Hostfile names"): the
hostfile names every node by its serving IP, so nothing has to resolve a node
name on node 0 or inside its container; the launch agent maps each IP back to
that node's SSH host and quotes what it passes on. The premise, that OpenMPI
takes a hostfile entry that is one of its own addresses for its own node and
hands every other entry to the launch agent, is checked with the real
``mpirun`` of this machine (Debian's openmpi-bin, as in the images)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

import systems
import systems.common
from flows import deploy as dep
from llmdeploy.inventory import Cluster, Model, Node, load_cluster
from systems.trtllm.catalogue import IMAGE_TRTLLM, image, trtllm_qwen38_fp8
from roles import comm, mpi
from sim.paths import cluster_dir
from tests.conftest import run_invoke
from flows.binding import bind


def b200(ips=("192.0.2.40", "192.0.2.41"), launch_ssh_config=None) -> Cluster:
    return Cluster(
        name="hf", platform="b200", nic="ens1f0",
        nodes=[Node(name=f"hf-node-{i}", ip=ip) for i, ip in enumerate(ips)],
        model=Model(path="/root/.cache/huggingface/hub/Qwen3.8-2.4T-A95B-FP8"), image=image(IMAGE_TRTLLM),
        profile=trtllm_qwen38_fp8("qwen3.8-low-latency.yaml", launch_ssh_config=launch_ssh_config),
    )


def entries(text: str) -> list[list[str]]:
    return [ln.split() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def test_the_hostfile_names_each_node_by_its_serving_ip():
    c = b200()
    _, _, plan = dep.plan_release(bind(c), {}, "sha256:x")
    text = plan.files["hf-node-0"]["hostfile"][0]
    assert entries(text) == [["192.0.2.40", "slots=8"], ["192.0.2.41", "slots=8"]]
    # which node each IP is, for the person reading it
    assert "#   192.0.2.41 = hf-node-1\n" in text
    # one node alone keeps its name: its container's --hostname
    assert entries(systems.common.hostfile(c, "r", [("hf-node-0", 4)])) == [["hf-node-0", "slots=4"]]


def _fake_bin(tmp: Path, log: Path) -> Path:
    """``ssh`` that logs its argv and runs the remote command with sh (as a node's sshd would), and
    ``docker`` that logs its argv and, for ``exec -i NAME CMD...``, runs CMD with the container's
    environment: ``<tmp>/<ssh host>.env`` when there is one (what docker's --env-file gave it)."""
    d = tmp / "bin"
    d.mkdir()
    py = shutil.which("python3")
    (d / "ssh").write_text(textwrap.dedent(f"""\
        #!{py}
        import json, os, sys
        with open({str(log)!r}, "a") as f:
            f.write(json.dumps(["ssh"] + sys.argv[1:]) + "\\n")
        os.environ["FAKE_NODE"] = sys.argv[-2]  # the host the command runs on
        os.execvp("sh", ["sh", "-c", sys.argv[-1]])
    """))
    # docker exec: the container's environment is its --env-file (here <tmp>/<node>.env, when there is one)
    (d / "docker").write_text(textwrap.dedent(f"""\
        #!{py}
        import json, os, sys
        with open({str(log)!r}, "a") as f:
            f.write(json.dumps(["docker"] + sys.argv[1:]) + "\\n")
        assert sys.argv[1:3] == ["exec", "-i"], sys.argv
        env_file = os.path.join({str(tmp)!r}, os.environ.get("FAKE_NODE", "") + ".env")
        if os.path.exists(env_file):
            for line in open(env_file).read().splitlines():
                k, _, v = line.partition("=")
                os.environ[k] = v
        os.execvp(sys.argv[4], sys.argv[4:])
    """))
    for f in d.iterdir():
        f.chmod(0o755)
    return d


def _calls(log: Path) -> list[list[str]]:
    return [json.loads(ln) for ln in log.read_text().splitlines()] if log.exists() else []


def test_the_launch_agent_maps_each_ip_to_its_node_and_quotes_the_command(tmp_path):
    c = b200(launch_ssh_config="/root/.ssh/cluster_config")
    agent = tmp_path / "mpi-agent.sh"
    agent.write_text(systems.common.launch_agent(c, "r1", "hf-r1", [n.name for n in c.nodes], c.profile.launch_ssh_config))
    log = tmp_path / "calls.jsonl"
    env = {**os.environ, "PATH": f"{_fake_bin(tmp_path, log)}:{os.environ['PATH']}"}
    # what mpirun passes: the hostfile entry, then orted's command for a remote shell (as to ssh: words that
    # the shell in the container parses once; OpenMPI quotes its own values, e.g. -mca ess "env")
    words = ["printf", "'%s|'", '"a b"', '"it\'s"', "'$HOME'", '";"']
    res = subprocess.run(["sh", str(agent), "192.0.2.41", *words], capture_output=True, text=True, env=env, timeout=30)
    assert res.returncode == 0, res.stderr
    ssh, docker = _calls(log)
    assert ssh[:-2] == ["ssh", "-F", "/root/.ssh/cluster_config", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                        "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3"]
    assert ssh[-2] == "hf-node-1"  # the node's SSH host, not its IP
    # the container's shell gets exactly the command mpirun gave, through the node's login shell unchanged
    assert docker[:6] == ["docker", "exec", "-i", "hf-r1", "/bin/sh", "-c"] and docker[6] == " ".join(words) + " "
    assert res.stdout == "a b|it's|$HOME|;|"
    # an IP that is no node of this world: refused before any SSH
    log.unlink()
    res = subprocess.run(["sh", str(agent), "192.0.2.99", "orted"], capture_output=True, text=True, env=env, timeout=30)
    assert res.returncode == 255 and "192.0.2.99 is not a node of this MPI world (192.0.2.40 192.0.2.41)" in res.stderr
    assert _calls(log) == []


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed (scripts/setup.sh installs openmpi-bin)")
def test_real_openmpi_takes_its_own_address_as_local_and_launches_the_other_through_the_agent(tmp_path):
    """127.0.0.1 is an address of this machine (lo), 127.0.0.2 is not one of
    its interfaces' addresses: OpenMPI starts the first node's rank itself and
    calls the agent for the second only; the agent's ssh and docker stand-ins
    run orted here, so the rank on the "other node" really starts."""
    c = b200(ips=("127.0.0.1", "127.0.0.2"))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(systems.common.hostfile(c, "r1", [("hf-node-0", 1), ("hf-node-1", 1)]))
    assert entries(hostfile.read_text()) == [["127.0.0.1", "slots=1"], ["127.0.0.2", "slots=1"]]
    agent = tmp_path / "mpi-agent.sh"
    agent.write_text(systems.common.launch_agent(c, "r1", "hf-r1", [n.name for n in c.nodes], None))
    agent.chmod(0o755)
    log = tmp_path / "calls.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    env["PATH"] = f"{_fake_bin(tmp_path, log)}:{env['PATH']}"
    res = subprocess.run(["mpirun", "--allow-run-as-root", "-np", "2", "--hostfile", str(hostfile),
                          "--mca", "plm_rsh_agent", str(agent), "--mca", "plm_rsh_no_tree_spawn", "1",
                          "sh", "-c", 'echo "rank=$OMPI_COMM_WORLD_RANK local=$OMPI_COMM_WORLD_LOCAL_RANK"'],
                         capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted(ln for ln in res.stdout.splitlines() if ln.startswith("rank=")) == ["rank=0 local=0", "rank=1 local=0"]
    calls = _calls(log)
    ssh = [call for call in calls if call[0] == "ssh"]
    # one daemon to start, on the second node, reached by its SSH host; the first node's entry was taken as local
    assert len(ssh) == 1 and ssh[0][-2] == "hf-node-1" and "orted" in ssh[0][-1]
    assert [call[:4] for call in calls if call[0] == "docker"] == [["docker", "exec", "-i", "hf-r1"]]


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="OpenMPI's mpirun is not installed (scripts/setup.sh installs openmpi-bin)")
def test_real_openmpi_ranks_keep_their_nodes_environment_unless_mpirun_exports_it(tmp_path):
    """The premise of systems.mpi_exports: a rank on another node inherits the environment of the daemon
    the agent started there (docker exec: that node's --env-file), unless ``-x NAME`` overrides it with the
    launch node's value, which is what gave node 1's ranks node 0's NIC."""
    c = b200(ips=("127.0.0.1", "127.0.0.2"))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(systems.common.hostfile(c, "r1", [("hf-node-0", 1), ("hf-node-1", 1)]))
    agent = tmp_path / "mpi-agent.sh"
    agent.write_text(systems.common.launch_agent(c, "r1", "hf-r1", [n.name for n in c.nodes], None))
    agent.chmod(0o755)
    (tmp_path / "hf-node-1.env").write_text("NCCL_SOCKET_IFNAME=enp65s0f1\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    env["PATH"] = f"{_fake_bin(tmp_path, tmp_path / 'calls.jsonl')}:{env['PATH']}"
    env["NCCL_SOCKET_IFNAME"] = "ens1f0"  # node 0's container

    def ranks(*exports: str) -> list[str]:
        res = subprocess.run(["mpirun", "--allow-run-as-root", "-np", "2", "--hostfile", str(hostfile),
                              "--mca", "plm_rsh_agent", str(agent), "--mca", "plm_rsh_no_tree_spawn", "1", *exports,
                              "sh", "-c", 'echo "rank=$OMPI_COMM_WORLD_RANK nic=$NCCL_SOCKET_IFNAME"'],
                             capture_output=True, text=True, env=env, timeout=120, stdin=subprocess.DEVNULL)
        assert res.returncode == 0, res.stdout + res.stderr
        return sorted(ln for ln in res.stdout.splitlines() if ln.startswith("rank="))

    assert ranks() == ["rank=0 nic=ens1f0", "rank=1 nic=enp65s0f1"]
    assert ranks("-x", "NCCL_SOCKET_IFNAME") == ["rank=0 nic=ens1f0", "rank=1 nic=ens1f0"]


# --- one ssh for every launch from node 0 (roles.mpi) -----------------------------------
def test_ssh_from_node_0_checks_host_keys_and_never_prompts():
    assert mpi.launch_ssh_args(None) == ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    assert mpi.launch_ssh_args("/root/.ssh/cluster_config") == ["-F", "/root/.ssh/cluster_config", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]
    assert mpi.launch_ssh_args(None, 15, 3) == ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                                                "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3"]
    c = load_cluster("gb200")
    mixed = c.model_copy(update={"nodes": [n.model_copy(update={"nic": "ens2f0" if i == 2 else n.nic}) for i, n in enumerate(c.nodes)]})
    assert mpi.nics(mixed, [n.name for n in mixed.nodes]) == "enP6p3s0f0np0,ens2f0"
    assert mpi.tcp_if_args("a,b") == ["--mca", "oob_tcp_if_include", "a,b", "--mca", "btl_tcp_if_include", "a,b"]


def test_serving_and_verify_comm_reach_the_nodes_with_the_same_agent():
    c = load_cluster("sim-b200")
    want = mpi.launch_ssh_args(c.profile.launch_ssh_config, c.ssh.keepalive_s, c.ssh.keepalive_count)
    assert "ServerAliveInterval=15" in want  # the inventory's keepalives reach the launch's ssh too
    assert want[:2] == ["-F", str(cluster_dir("sim-b200") / "ssh_config")]
    res = run_invoke("deploy", "--cluster", "sim-b200", "--check", "--json")
    assert res.returncode == 0, res.stderr
    agent = json.loads(res.stdout)["nodes"][0]["files"]["mpi-agent.sh"]
    assert f'exec ssh {shlex.join(want)} "$target" "docker exec -i ' in agent
    # verify-comm: the same IP -> SSH host table and ssh, on the hosts (no container)
    cmd = comm.all_reduce_command(bind(c), "-b 8 -e 8G -f 2 -g 1")
    table = [ln for ln in agent.splitlines() if ") target=" in ln]
    assert table and all(ln in cmd.splitlines() for ln in table)
    assert f'exec ssh {shlex.join(want)} "$target" "$@"' in cmd
    argv = shlex.split(cmd.strip().splitlines()[-1])
    assert argv[argv.index("plm_rsh_agent") + 1] == "$agent" and argv[argv.index("plm_rsh_no_tree_spawn") + 1] == "1"
