"""verify-comm's pure parts: the ping plan, the hccn_tool and nccl-tests
parsers, the all_reduce_perf world's mpirun line and the reading of its
failures, the deploy gate."""

import json
import shlex

import pytest

from flows import verify
from llmdeploy.inventory import load_cluster
from roles import comm, commenv, mpi
from roles.facts import MARK
from flows.binding import bind


def _ips(cluster):
    return {n.name: {d: f"10.{d}.0.{i}" for d in range(n.devices)} for i, n in enumerate(cluster.nodes)}


def test_small_clusters_get_the_full_matrix():
    c = load_cluster("a3")
    mode, plan = comm.ping_plan(c, _ips(c), full=False, full_max=2048)
    assert mode == "full"
    assert sum(len(p) for p in plan.values()) == 4 * 3 * 16
    assert (3, "a3-node-2", 3, "10.3.0.2") in plan["a3-node-0"]


def test_large_clusters_are_sampled_covering_every_pair_and_npu_index():
    c = load_cluster("a3")
    nodes = [c.nodes[0].model_copy(update={"name": f"n{i}", "ip": f"192.0.2.{10 + i}", "start_rank": i}) for i in range(32)]
    big = c.model_copy(update={"nodes": nodes})
    mode, plan = comm.ping_plan(big, _ips(big), full=False, full_max=2048)
    assert mode == "sampled"
    pairs = {(a, b) for a, ps in plan.items() for _, b, _, _ in ps}
    assert len(pairs) == 32 * 31  # every ordered node pair
    for a, ps in plan.items():
        assert {d for d, *_ in ps} == set(range(16))  # every NPU index of every node sends
    got = {(b, d) for ps in plan.values() for d, b, _, _ in ps}
    assert got == {(n.name, d) for n in nodes for d in range(16)}  # and every one is pinged
    assert sum(len(p) for p in plan.values()) < 32 * 31 * 16 / 10
    mode, plan = comm.ping_plan(big, _ips(big), full=True, full_max=2048)
    assert mode == "full" and sum(len(p) for p in plan.values()) == 32 * 31 * 16


def test_parse_hccn_tool_answers():
    c = load_cluster("a2")
    n = c.nodes[0]
    sec = lambda name, text, rc=0: f"{MARK} {name}\n{text}\n{MARK}rc {rc}"  # noqa: E731
    parts = [sec("hccn.conf", "address_0=10.0.0.1")]
    for d in range(8):
        parts += [
            sec(f"link {d}", "link status: DOWN" if d == 3 else "link status: UP"),
            sec(f"health {d}", "net health status: Fault" if d == 5 else "net health status: Success"),
            sec(f"netdetect {d}", "netdetect address: 10.0.0.254"),
            sec(f"gateway {d}", "default gateway:10.0.0.254, Iface:eth0"),
            sec(f"lldp {d}", "Port ID TLV\n\tIfname: 400GE1/0/1"),
            sec(f"tls {d}", f"dev_id:{d}, tls switch[{1 if d == 6 else 0}](0:disable, 1:enable), tls preconfigured[1]"),
            sec(f"optical {d}", "present: present"),
            sec(f"npu_ip {d}", "Get ipconf failed, because no ip was preset there!" if d == 7 else f"ipaddr:10.0.{d}.1\nnetmask:255.255.255.0", 1 if d == 7 else 0),
        ]
    p = comm.parse_links(bind(c), n, "\n".join(parts))
    assert p["devices"][3]["link"] == (False, "DOWN") and p["devices"][5]["health"] == (False, "Fault")
    assert p["devices"][6]["tls"] == (True, "1") and p["devices"][0]["tls"] == (True, "0")
    assert p["devices"][7]["npu_ip"] == (False, "Get ipconf failed, because no ip was preset there!")
    assert p["ips"] == {d: f"10.0.{d}.1" for d in range(7)} and p["conf"] == "address_0=10.0.0.1"
    assert (p["conf_name"], p["conf_path"]) == ("hccn.conf", "/etc/hccn.conf")


def test_parse_pings():
    pings = [(0, "b", 0, "10.0.0.2"), (1, "b", 1, "10.0.1.2"), (2, "c", 2, "10.0.2.3")]
    out = (f"{comm.PING_MARK} 0\ndevice 0 PING 10.0.0.2\n2 packets transmitted, 2 received, 0.00% packet loss\n"
           f"{comm.PING_MARK} 1\ndevice 1 PING 10.0.1.2\n2 packets transmitted, 0 received, 100.00% packet loss\n"
           f"{comm.PING_MARK} 2\n")
    r = comm.parse_pings(out, pings)
    assert [x["ok"] for x in r] == [True, False, False]
    assert r[1]["reason"] == "100.00% loss" and r[2]["reason"] == "no answer"


# --- all_reduce_perf under the real mpirun (roles.comm, roles.mpi) ---------------------------------
ARGS = "-b 8 -e 8G -f 2 -g 1"
RANKS = "all_reduce_perf -b 8 -e 8G -f 2 -g 1"


def _with_nics(cluster, nics: dict[str, str]):
    """``cluster`` with some nodes' serving NIC renamed (an inventory's per-node ``nic``)."""
    nodes = [n.model_copy(update={"nic": nics.get(n.name, n.nic)}) for n in cluster.nodes]
    return cluster.model_copy(update={"nodes": nodes})


def _mpirun_line(cmd: str) -> str:
    return cmd.strip().splitlines()[-1]


def test_all_reduce_is_one_world_over_ssh_from_node_0_each_node_with_its_own_nic():
    c = load_cluster("b200")
    cmd = comm.all_reduce_command(bind(c), ARGS)
    assert _mpirun_line(cmd) == (
        'mpirun --allow-run-as-root --bind-to none --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1'
        " --mca oob_tcp_if_include ens1f0 --mca btl_tcp_if_include ens1f0"
        f" -np 8 -H 192.0.2.40:8 -x NCCL_SOCKET_IFNAME=ens1f0 -x NCCL_DEBUG=WARN {RANKS}"
        f" : -np 8 -H 192.0.2.41:8 -x NCCL_SOCKET_IFNAME=ens1f0 -x NCCL_DEBUG=WARN {RANKS}")
    # the launch agent, written for the run and removed after it: IP -> the node's SSH host, as serving's
    assert cmd.startswith('agent=$(mktemp "${TMPDIR:-/tmp}/llmdeploy-mpi-agent.XXXXXX") || exit 1\ntrap \'rm -f "$agent"\' EXIT\n')
    assert mpi.launch_agent(c, [n.name for n in c.nodes], None) in cmd
    assert "    192.0.2.41) target=b200-node-1 ;;" in cmd and 'exec ssh -o BatchMode=yes -o StrictHostKeyChecking=yes -o ServerAliveInterval=15 -o ServerAliveCountMax=3 "$target" "$@"' in cmd
    # the second node's NIC has another name: its ranks get it, OpenMPI may use either
    mixed = _with_nics(load_cluster("sim-b200"), {"sim-b200-1": "ens2f0"})
    cmd = comm.all_reduce_command(bind(mixed), ARGS)
    assert _mpirun_line(cmd) == (
        'mpirun --allow-run-as-root --bind-to none --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1'
        " --mca oob_tcp_if_include ens1f0,ens2f0 --mca btl_tcp_if_include ens1f0,ens2f0"
        f" -np 8 -H 198.19.20.10:8 -x NCCL_SOCKET_IFNAME=ens1f0 -x NCCL_DEBUG=WARN {RANKS}"
        f" : -np 8 -H 198.19.20.11:8 -x NCCL_SOCKET_IFNAME=ens2f0 -x NCCL_DEBUG=WARN {RANKS}")
    assert "exec ssh -F /var/tmp/llmdeploy-sim/sim-b200/ssh_config -o BatchMode=yes -o StrictHostKeyChecking=yes" in cmd
    # one node: no launch over SSH at all
    one = load_cluster("qwen35-b200")
    assert comm.all_reduce_command(bind(one), ARGS) == (
        "mpirun --allow-run-as-root --bind-to none --mca oob_tcp_if_include ens1f0 --mca btl_tcp_if_include ens1f0"
        f" -np 4 -H b200-node-0:4 -x NCCL_SOCKET_IFNAME=ens1f0 -x NCCL_DEBUG=WARN {RANKS}")


def test_every_app_context_carries_every_variable_and_gb200s_four_nodes_get_16_ranks():
    # OpenMPI 4.1: -x belongs to its app context, so each context repeats them all
    c = load_cluster("gb200")
    argv = shlex.split(_mpirun_line(comm.all_reduce_command(bind(c), ARGS)))
    contexts = " ".join(argv).split(" : ")
    assert len(contexts) == 4
    for i, ctx in enumerate(contexts):
        words = ctx.split()
        assert words[words.index("-H") + 1] == f"{c.nodes[i].ip}:4" and words[words.index("-np") + 1] == "4"
        assert [words[k + 1] for k, w in enumerate(words) if w == "-x"] == [f"NCCL_SOCKET_IFNAME={c.nodes[i].nic}", "NCCL_DEBUG=WARN"]
        assert ctx.endswith(RANKS)
    assert "NCCL_TESTS_MIN_BW" not in " ".join(argv)  # the floor is ours, on the largest size (see all_reduce_command)
    # two GPUs per process: half the processes, the MPI ranks still node by node
    two = comm.all_reduce_ranks(c, "-b 8 -e 8G -f 2 -g 2")
    assert [(n.name, k, list(r)) for n, k, r in two] == [(f"gb200-node-{i}", 2, [2 * i, 2 * i + 1]) for i in range(4)]
    with pytest.raises(ValueError, match=r"gb200-node-0: 4 GPUs cannot be split into processes of 3 GPUs"):
        comm.all_reduce_command(bind(c), "-b 8 -e 8G -f 2 -g 3")
    with pytest.raises(ValueError, match=r"-g '0' is not a positive number"):
        comm.all_reduce_command(bind(c), "-g 0")
    assert comm.all_reduce_command(bind(c), "-b 8 -g2").count("-np 2 -H") == 4 and comm.all_reduce_command(bind(c), "--ngpus=4").count("-np 1 -H") == 4


def test_remote_values_are_quoted_and_the_nccl_interface_is_the_nodes_environment_files():
    c = load_cluster("b200")
    odd = c.model_copy(update={"profile": c.profile.model_copy(update={"env": {"NCCL_SOCKET_IFNAME": "^docker,lo"}})})
    cmd = _mpirun_line(comm.all_reduce_command(bind(odd), ARGS))
    assert "-x 'NCCL_SOCKET_IFNAME=^docker,lo'" in cmd and shlex.split(cmd).count("NCCL_SOCKET_IFNAME=^docker,lo") == 2
    mixed = _with_nics(load_cluster("sim-b200"), {"sim-b200-1": "ens2f0"})
    for cluster in (c, odd, mixed):
        for n in cluster.nodes:
            assert comm.nccl_ifname(cluster, n) == commenv.env_vars(cluster, n)["NCCL_SOCKET_IFNAME"]


def test_mpi_hosts_are_serving_ips_whatever_the_hostnames():
    # no node name has to be its hostname or resolve on node 0: -H has the IPs, the agent the SSH hosts
    c = load_cluster("sim-b200")
    cmd = comm.all_reduce_command(bind(c), ARGS)
    assert [w for w in shlex.split(_mpirun_line(cmd)) if w.endswith(":8")] == ["198.19.20.10:8", "198.19.20.11:8"]
    # mpirun names a node by its -H entry: read back as the node
    said = _failure(c, "", "mpirun noticed that process rank 9 with PID 77 on node 198.19.20.11 exited on signal 9 (Killed).\n",
                    hostnames={"sim-b200-0": "gpu-a17", "sim-b200-1": "gpu-a18"})
    assert said == ["sim-b200-1: rank 9 was killed by signal 9"]


def _failure(cluster, out="", err="", hostnames=None):
    return comm.all_reduce_failure(cluster, ARGS, hostnames or {n.name: n.name for n in cluster.nodes}, out, err)


MPI_FIRST = ("--------------------------------------------------------------------------\n"
             "mpirun detected that one or more processes exited with non-zero status, thus causing\n"
             "the job to be terminated. The first process to do so was:\n\n  Process name: [[21057,1],{rank}]\n  Exit code:    {code}\n"
             "--------------------------------------------------------------------------\n")
ORTE = ("--------------------------------------------------------------------------\n"
        "ORTE was unable to reliably start one or more daemons.\nThis usually is caused by:\n")


def test_a_failed_world_is_told_by_node():
    mixed = _with_nics(load_cluster("sim-b200"), {"sim-b200-1": "ens2f0"})
    # NCCL's own words on the node that lacks the interface (the hostname it prints is the node's)
    out = ("sim-b200-1:4242:4242 [3] bootstrap.cc:126 (bootstrapNetInit) NCCL WARN Bootstrap : no socket interface found\n"
           "sim-b200-1: Test NCCL failure common.cu:217 'invalid usage (run with NCCL_DEBUG=WARN for details) / Bootstrap : no socket interface found'\n"
           " .. sim-b200-1 pid 4242: Test failure common.cu:1620\n")
    assert _failure(mixed, out, MPI_FIRST.format(rank=11, code=3)) == [
        "sim-b200-1: NCCL WARN Bootstrap : no socket interface found (NCCL_SOCKET_IFNAME=ens2f0)"]
    # hostnames that are FQDNs map back to the nodes
    fq = {"sim-b200-0": "sim-b200-0.example", "sim-b200-1": "sim-b200-1.example"}
    assert _failure(mixed, out.replace("sim-b200-1", "sim-b200-1.example"), hostnames=fq)[0].startswith("sim-b200-1: NCCL WARN Bootstrap")
    # no line of NCCL's: mpirun's first failed process, ranks 8-15 are node 1's
    assert _failure(mixed, "", MPI_FIRST.format(rank=8, code=5)) == ["sim-b200-1: rank 8 exited with status 5"]
    assert _failure(mixed, "", MPI_FIRST.format(rank=7, code=7)) == ["sim-b200-0: rank 7 exited with status 7"]
    # a nccl-tests failure without NCCL's WARN line
    assert _failure(mixed, "sim-b200-0: Test NCCL failure common.cu:1550 'unhandled system error (run with NCCL_DEBUG=INFO for details) / '\n") == [
        "sim-b200-0: all_reduce_perf: NCCL failure 'unhandled system error (run with NCCL_DEBUG=INFO for details) / '"]
    # a killed rank
    assert _failure(mixed, "", "mpirun noticed that process rank 9 with PID 77 on node sim-b200-1 exited on signal 9 (Killed).\n") == [
        "sim-b200-1: rank 9 was killed by signal 9"]
    # mpirun could not start its daemon: ssh's words, the node they name, or the only other node
    said = _failure(mixed, "", "ssh: Could not resolve hostname sim-b200-1: Name or service not known\n" + ORTE)
    assert said == ["sim-b200-1: mpirun on sim-b200-0 could not start its daemon there over SSH (ssh: Could not resolve hostname sim-b200-1: "
                    "Name or service not known); check node 0's ssh_config (profile.launch_ssh_config), its key and known_hosts for that node"]
    said = _failure(mixed, "", "No ED25519 host key is known for 198.18.20.11 and you have requested strict checking.\nHost key verification failed.\n" + ORTE)
    assert said[0].startswith("sim-b200-1: mpirun on sim-b200-0 could not start its daemon there over SSH (Host key verification failed.)")
    # ssh names the address it resolved, not the node: with one other node, that one
    said = _failure(mixed, "", "ssh: connect to host 198.18.20.11 port 22: Connection refused\n" + ORTE)
    assert said[0].startswith("sim-b200-1: mpirun on sim-b200-0 could not start its daemon there over SSH (ssh: connect to host 198.18.20.11 port 22")
    four = load_cluster("gb200")
    assert _failure(four, "", "Permission denied (publickey).\n" + ORTE)[0].startswith(
        "one of gb200-node-1, gb200-node-2, gb200-node-3: mpirun on gb200-node-0 could not start its daemon there over SSH (Permission denied (publickey).)")
    # nothing recognisable: nothing made up
    assert _failure(mixed, "garbage\n", "more garbage\n") == []


def test_parse_all_reduce():
    text = ("#       size  count type redop root time algbw busbw #wrong time algbw busbw #wrong\n"
            "        1024    256 float sum -1 10.0 0.10 0.19 0 10.0 0.10 0.19 0\n"
            "  8589934592 2147483648 float sum -1 40000 214.7 402.6 0 40000 214.7 402.6 0\n"
            "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 201.395 \n")
    p = comm.parse_all_reduce(text)
    assert p["max_busbw"] == 402.6 and p["avg_busbw"] == 201.395 and p["oob_ok"] and p["wrong_ranks"] == []
    assert comm.parse_all_reduce(text.replace("0 OK", "62 FAILED"))["oob_ok"] is False


def test_deploy_gate():
    c = load_cluster("a3")
    ok = json.dumps({"ok": True, "epoch": 1000, "time": "t0"})
    assert verify.gate(c, ok, False, now=2000) == (True, "communication verified at t0")
    go, said = verify.gate(c, json.dumps({"ok": False, "epoch": 1000, "time": "t0"}), False, now=2000)
    assert not go and "FAILED" in said and "--force" in said
    go, said = verify.gate(c, json.dumps({"ok": False, "epoch": 1000, "time": "t0"}), True, now=2000)
    assert go and "deploying anyway (--force)" in said
    go, said = verify.gate(c, ok, False, now=1000 + 8 * 86400)
    assert not go and "old" in said
    go, said = verify.gate(c, "", False)
    assert go and "not verified" in said


class _Node0:
    """Answers verify-comm's one command on node 0 with what the world printed."""

    def __init__(self, out="", err="", code=0):
        self.answer, self.sent = (out, err, code), []

    def exec(self, node, command, timeout=None):
        self.sent.append((node.name, command))
        return self.answer

    def world(self, nodes, tasks, argv, env, timeout=None):
        """Over SSH no launcher wires a world: mpirun on node 0 does (Transport.world)."""
        return None


class _Launched(_Node0):
    """A launcher that starts the world itself (Slurm's srun --mpi=pmix): what it ran, what it printed."""

    def world(self, nodes, tasks, argv, env, timeout=None):
        self.sent.append(([n.name for n in nodes], tasks, argv, env))
        return self.answer


def test_verify_comm_judges_the_world_and_names_the_node():
    from sim.standins import nccl_tests as nt

    c = load_cluster("sim-b200")
    names = {n.name: n.name for n in c.nodes}
    o = nt.parse_args(shlex.split(ARGS))
    good = nt.header(o) + nt.result(o, 16, 370.0, [0] * 16, None)[0]
    run = _Node0(good)
    perf = verify.all_reduce(bind(c), run, names)
    assert run.sent == [("sim-b200-0", comm.all_reduce_command(bind(c), ARGS))]
    assert perf["ok"] and perf["failures"] == [] and perf["max_busbw"] > 300 and "raw" not in perf
    # the slowest node's busbw under the floor
    perf = verify.all_reduce(bind(c), _Node0(nt.header(o) + nt.result(o, 16, 180.0, [0] * 16, None)[0]), names)
    assert not perf["ok"] and perf["failures"] == ["busbw 178.6 GB/s < floor 300 GB/s (verify.nccl_min_busbw)"]
    # NCCL failed on node 1: no table, node 1 named with its interface
    out = (nt.header(o) + "sim-b200-1:77:77 [0] bootstrap.cc:126 (bootstrapNetInit) NCCL WARN Bootstrap : no socket interface found\n"
           "sim-b200-1: Test NCCL failure common.cu:217 'invalid usage (run with NCCL_DEBUG=WARN for details) / Bootstrap : no socket interface found'\n")
    perf = verify.all_reduce(bind(c), _Node0(out, MPI_FIRST.format(rank=8, code=3), 3), names)
    assert not perf["ok"] and perf["failures"] == [
        "all_reduce_perf did not run (exit 3): sim-b200-1: NCCL WARN Bootstrap : no socket interface found (NCCL_SOCKET_IFNAME=ens1f0)"]
    assert "Bootstrap : no socket interface found" in perf["raw"]
    # a world that says nothing we know: its last words
    perf = verify.all_reduce(bind(c), _Node0("", "bash: mpirun: command not found\n", 127), names)
    assert perf["failures"] == ["all_reduce_perf did not run (exit 127): bash: mpirun: command not found"]
    # a table, but a rank failed after it (nccl-tests' status): said, with the node
    perf = verify.all_reduce(bind(c), _Node0(good, MPI_FIRST.format(rank=12, code=7), 7), names)
    assert perf["failures"] == ["all_reduce_perf exited with status 7: sim-b200-1: rank 12 exited with status 7"]
    # a node whose hostname is not its inventory name: no matter (-H has IPs)
    run = _Node0(good)
    perf = verify.all_reduce(bind(c), run, {"sim-b200-0": "sim-b200-0", "sim-b200-1": "gpu-b17"})
    assert run.sent == [("sim-b200-0", comm.all_reduce_command(bind(c), ARGS))] and perf["ok"]


def test_a_world_the_launcher_starts_runs_without_mpirun_and_names_the_failed_tasks():
    """Where the transport launches worlds (Runner.world), all_reduce_perf is
    one, a rank per GPU on each node with that node's NCCL_SOCKET_IFNAME, no
    mpirun and no launch agent; the tasks the launcher says ended are named
    by their node."""
    c = load_cluster("sim-b200-slurm")
    said = ("srun: error: sim-b200-slurm-1: task 9: Exited with exit code 137\n"
            "srun: error: sim-b200-slurm-1: tasks 8,10-15: Killed\n")
    r = _Launched("", said, 137)
    perf = verify.all_reduce(bind(c), r, {n.name: n.name for n in c.nodes})
    ((nodes, tasks, argv, env),) = r.sent
    assert nodes == ["sim-b200-slurm-0", "sim-b200-slurm-1"] and tasks == 8 and argv[0] == "all_reduce_perf"
    assert env["sim-b200-slurm-1"]["NCCL_SOCKET_IFNAME"] == "ens1f0" and "mpirun" not in " ".join(argv)
    assert not perf["ok"] and "sim-b200-slurm-1: task 9 (ranks): Exited with exit code 137" in perf["failures"][0], perf["failures"]
    assert perf["command"].startswith("all_reduce_perf ") and "started by the cluster's launcher" in perf["command"]
