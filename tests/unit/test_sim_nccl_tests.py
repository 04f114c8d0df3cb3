"""The simulated all_reduce_perf (sim/standins/nccl_tests.py): its pieces
against nccl-tests' and NCCL's sources, what verify-comm reads from its
table, and whole worlds under the real OpenMPI mpirun on this machine's
loopback: one app context per "node", each with its own node.json and
NCCL_SOCKET_IFNAME, as verify-comm launches them."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from llmdeploy.inventory import load_cluster
from roles import comm
from sim import hardware
from sim.standins import nccl_tests as nt

REPO = Path(__file__).resolve().parents[2]
ARGS = ["-b", "8", "-e", "8G", "-f", "2", "-g", "1"]


# --- the command line ---------------------------------------------------------------------------
def test_options_are_nccl_tests_own():
    o = nt.parse_args(ARGS)
    assert (o["b"], o["e"], o["f"], o["g"], o["t"], o["n"], o["w"], o["c"]) == (8, 8 * 1024**3, 2, 1, 1, 20, 1, 1)
    assert len(nt.sizes(o)) == 31 and nt.sizes(o)[-1] == 8 * 1024**3
    assert nt.parse_args([])["b"] == nt.parse_args([])["e"] == 32 * 1024**2  # common.cu's defaults
    assert nt.parse_args(["--minbytes=1K", "--maxbytes", "1M", "-i", "256K"])["i"] == 256 * 1024
    assert nt.sizes(nt.parse_args(["-b", "1K", "-e", "2K", "-i", "512"])) == [1024, 1536, 2048]  # stepbytes without a factor
    assert nt.parse_size("0.5G") == 512 * 1024**2 and nt.parse_size("8x") == -1.0 and nt.parse_size("") == -1.0


@pytest.mark.parametrize("argv, err, out, code", [
    (["-q", "1"], "all_reduce_perf: invalid option -- 'q'\n", "invalid option '?'\n", 0),
    (["--bogus=1"], "all_reduce_perf: unrecognized option '--bogus=1'\n", "invalid option '?'\n", 0),
    (["-b"], "all_reduce_perf: option requires an argument -- 'b'\n", "invalid option '?'\n", 0),
    (["-b", "8Q"], "invalid size specified for 'minbytes'\n", "", 255),
    (["-b", "2G", "-e", "1G"], "invalid sizes for 'minbytes' and 'maxbytes': 2147483648 > 1073741824\n", "", 255),
    (["-h"], "", "USAGE: all_reduce_perf", 0),
])
def test_what_the_real_one_refuses(argv, err, out, code):
    with pytest.raises(nt.Usage) as got:
        nt.parse_args(argv)
    assert got.value.err == err and got.value.out.startswith(out) and got.value.code == code


# --- NCCL's choice of interface -------------------------------------------------------------------
IFACES = [("lo", "127.0.0.1"), ("docker0", "172.17.0.1"), ("ens1f0", "198.19.20.10"), ("ens1f0v1", "10.0.0.1"), ("ib0", "10.9.0.1")]


@pytest.mark.parametrize("spec, want", [
    ("ens1f0", ["ens1f0", "ens1f0v1"]),      # a prefix
    ("=ens1f0", ["ens1f0"]),                 # exact
    ("ens2f0", []),                          # the node has no such interface
    ("^docker,lo", ["ens1f0", "ens1f0v1", "ib0"]),
    ("^=ens1f0", ["lo", "docker0", "ens1f0v1", "ib0"]),
    ("ens1f0:4,ib", ["ens1f0", "ens1f0v1", "ib0"]),  # name:port reads the name
    (None, ["ib0"]),                         # unset: InfiniBand first
    ("x", ["ib0"]),                          # one character counts as unset (socket.cc: strlen(env) > 1)
])
def test_interfaces_as_nccl_matches_them(spec, want):
    assert [n for n, _ in nt.find_interfaces(spec, IFACES)] == want


def test_interfaces_unset_without_ib_skip_docker_and_lo_until_nothing_else_is_left():
    assert nt.find_interfaces(None, IFACES[:4]) == [("ens1f0", "198.19.20.10"), ("ens1f0v1", "10.0.0.1")]
    assert nt.find_interfaces(None, IFACES[:2]) == [("docker0", "172.17.0.1")]
    assert nt.find_interfaces(None, IFACES[:1]) == [("lo", "127.0.0.1")]
    assert ("lo", "127.0.0.1") in nt.local_interfaces()  # running, with an address


# --- the output -------------------------------------------------------------------------------------
def test_numbers_as_get_float_str_prints_them():
    assert nt.float_str(0.004, 6) == "  0.00" and nt.float_str(367.126, 6) == "367.13"
    assert nt.float_str(17684.14, 7) == "17684.1" and nt.float_str(123456.7, 7) == " 123457"
    assert nt.float_str(12345678.0, 7) == "1.2e+07" and nt.float_str(1234567.0, 6) == " 1e+06"


def test_rank_0s_table_is_what_verify_comm_reads():
    o = nt.parse_args(ARGS)
    text, code = nt.result(o, 16, 370.0, [0] * 16, None)
    perf = comm.parse_all_reduce(text)
    assert code == nt.TEST_SUCCESS and perf["sizes"] == 31 and perf["oob_ok"] and perf["out_of_bounds"] == 0
    assert 360 < perf["max_busbw"] < 370 and perf["avg_busbw"] < perf["max_busbw"]
    # busbw = algbw x 2(n-1)/n: the 8 GiB row of 16 ranks
    row = next(line.split() for line in text.splitlines() if line.strip().startswith("8589934592"))
    assert row[:5] == ["8589934592", "2147483648", "float", "sum", "-1"]
    assert float(row[7]) == pytest.approx(float(row[6]) * 2 * 15 / 16, abs=0.01) and row[7] == row[11]
    assert text.splitlines()[-5:] == ["# Avg bus bandwidth    : %g " % perf["avg_busbw"], "#",
                                      "# Collective test concluded: all_reduce_perf", "#", ""]
    # a world of one rank moves nothing between ranks
    assert comm.parse_all_reduce(nt.result(o, 1, 370.0, [0], None)[0])["max_busbw"] == 0.0


def test_wrong_values_and_the_average_floor_fail_as_nccl_tests_does():
    o = nt.parse_args(ARGS)
    text, code = nt.result(o, 16, 370.0, [0] * 8 + [3] * 8, None)
    # one error per wrong rank, size and place; #wrong sums the ranks' wrong elements
    assert code == nt.TEST_NUM_RESULTS and "# Out of bounds values : 496 FAILED" in text
    assert comm.parse_all_reduce(text)["oob_ok"] is False and text.splitlines()[4].split()[8] == "24"
    avg = comm.parse_all_reduce(nt.result(o, 16, 370.0, [0] * 16, None)[0])["avg_busbw"]
    text, code = nt.result(o, 16, 370.0, [0] * 16, avg / 0.9 + 1)
    assert code == nt.TEST_NUM_RESULTS and re.search(r"# Avg bus bandwidth    : [0-9.]+ FAILED", text)
    text, code = nt.result(o, 16, 370.0, [0] * 16, avg / 0.9 - 1)
    assert code == nt.TEST_SUCCESS and re.search(r"# Avg bus bandwidth    : [0-9.]+ OK", text)
    # NCCL_TESTS_MIN_BW is read with atof()
    assert (nt._atof("300"), nt._atof(" 2.5e2x"), nt._atof("abc")) == (300.0, 250.0, 0.0)


def test_failure_lines_are_ncls_and_nccl_tests():
    said = nt.no_interface("sim-b200-1", 3, nt.LINE_COMM_INIT).splitlines()
    assert re.fullmatch(r"sim-b200-1:\d+:\d+ \[3\] bootstrap\.cc:126 \(bootstrapNetInit\) NCCL WARN Bootstrap : no socket interface found", said[0])
    assert said[1] == ("sim-b200-1: Test NCCL failure common.cu:217 'invalid usage (run with NCCL_DEBUG=WARN for details) / "
                       "Bootstrap : no socket interface found'")
    assert [re.sub(r"pid \d+", "pid N", x) for x in said[2:]] == [" .. sim-b200-1 pid N: Test failure common.cu:1620",
                                                                  " .. sim-b200-1 pid N: Test failure common.cu:1454"]
    # rank 0 fails in ncclGetUniqueId, before any communicator
    assert "common.cu:1550" in nt.no_interface("sim-b200-0", 0, nt.LINE_GET_UNIQUE_ID) and "1620" not in nt.no_interface("h", 0, nt.LINE_GET_UNIQUE_ID)


# --- whole worlds under the real mpirun -------------------------------------------------------------
MPIRUN = shutil.which("mpirun")
needs_mpirun = pytest.mark.skipif(MPIRUN is None, reason="OpenMPI's mpirun is not installed (scripts/setup.sh installs openmpi-bin)")


def _nodes(tmp_path, **nccl):
    """Two simulated B200 nodes' node.json under ``tmp_path``; ``nccl``: node index -> its nccl entry."""
    c = load_cluster("sim-b200")
    states = []
    for i, n in enumerate(c.nodes):
        hw = hardware.node_hardware(c, i, n)
        if str(i) in nccl:
            hw["nccl"] = nccl[str(i)]
        d = tmp_path / f"node{i}"
        d.mkdir()
        hardware.save(d, hw)
        states.append(d)
    return states


def _world(states, ranks_per_node=2, ifnames=("lo", "lo"), args=ARGS):
    """mpirun on loopback: one app context per node, its ranks with that
    node's state and NCCL_SOCKET_IFNAME (as all_reduce_command gives them)."""
    cmd = [MPIRUN, "--allow-run-as-root", "--bind-to", "none", "--mca", "oob_tcp_if_include", "lo", "--mca", "btl_tcp_if_include", "lo",
           "-H", f"localhost:{ranks_per_node * len(states)}"]
    for i, (state, ifname) in enumerate(zip(states, ifnames)):
        if i:
            cmd.append(":")
        cmd += ["-np", str(ranks_per_node), "-x", f"LLMDEPLOY_SIM_STATE={state}", "-x", f"NCCL_SOCKET_IFNAME={ifname}",
                "-x", "NCCL_DEBUG=WARN", "-x", f"PYTHONPATH={REPO}", sys.executable, "-S", "-m", "sim.standins", "all_reduce_perf", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "NCCL_"))}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)


@needs_mpirun
def test_a_world_meets_and_only_rank_0_reports_the_slowest_nodes_bandwidth(tmp_path):
    res = _world(_nodes(tmp_path, **{"1": {"busbw": 180.0}}))
    assert res.returncode == 0, res.stdout + res.stderr
    out = res.stdout
    assert out.count("# Out of bounds values") == 1 and out.count("# nccl-tests version") == 1  # rank 0 alone prints
    devices = re.findall(r"^#  Rank +(\d+) Group +0 Pid +\d+ on +\S+ device +(\d+) \[0000:(\w\w):00\] NVIDIA B200$", out, re.M)
    # a rank's GPU is its local rank's (here every "node" is this one machine: local ranks 0-3)
    assert devices == [("0", "0", "18"), ("1", "1", "28"), ("2", "2", "38"), ("3", "3", "48")]
    perf = comm.parse_all_reduce(out)
    # the world is as fast as node 1 (180 GB/s), which only node 1's ranks know: it travelled to rank 0
    assert perf["sizes"] == 31 and perf["oob_ok"] and 170 < perf["max_busbw"] < 180


@needs_mpirun
def test_a_node_without_the_nccl_interface_fails_its_ranks_in_ncclcomminitrank(tmp_path):
    res = _world(_nodes(tmp_path), ifnames=("lo", "ens2f0"))
    assert res.returncode == nt.TEST_NCCL_ERROR, res.stdout + res.stderr
    assert "# Out of bounds values" not in res.stdout  # no table: the world never formed
    assert re.search(r"^\S+:\d+:\d+ \[[23]\] bootstrap\.cc:126 \(bootstrapNetInit\) NCCL WARN Bootstrap : no socket interface found$", res.stdout, re.M)
    assert "Test NCCL failure common.cu:217 'invalid usage (run with NCCL_DEBUG=WARN for details) / Bootstrap : no socket interface found'" in res.stdout
    # mpirun names one of node 1's ranks (2 or 3) as the first to fail
    assert re.search(r"Process name: \[\[\d+,1\],[23]\]\s+Exit code:\s+3", res.stderr), res.stderr
    # ... and verify-comm's reading of it names node 1 (ranks 2-3 of a two-node world of 2 GPUs each)
    c = load_cluster("sim-b200")
    small = c.model_copy(update={"nodes": [n.model_copy(update={"devices": 2, "nic": nic}) for n, nic in zip(c.nodes, ("lo", "ens2f0"))]})
    host = os.uname().nodename
    said = comm.all_reduce_failure(small, " ".join(ARGS), {"sim-b200-0": "elsewhere", "sim-b200-1": host}, res.stdout, res.stderr)
    assert said[0] == "sim-b200-1: NCCL WARN Bootstrap : no socket interface found (NCCL_SOCKET_IFNAME=ens2f0)", said


@needs_mpirun
def test_rank_0_without_its_interface_fails_in_nccl_get_unique_id(tmp_path):
    res = _world(_nodes(tmp_path), ifnames=("ens9f9", "lo"))
    assert res.returncode == nt.TEST_NCCL_ERROR, res.stdout + res.stderr
    assert "Test NCCL failure common.cu:1550" in res.stdout and "common.cu:217" not in res.stdout
    assert re.search(r"Process name: \[\[\d+,1\],0\]\s+Exit code:\s+3", res.stderr), res.stderr


@needs_mpirun
def test_wrong_values_on_one_node_fail_every_rank_with_nccl_tests_status(tmp_path):
    res = _world(_nodes(tmp_path, **{"1": {"wrong": 5}}))
    assert res.returncode == nt.TEST_NUM_RESULTS, res.stdout + res.stderr
    assert "# Out of bounds values : 124 FAILED" in res.stdout  # 2 wrong ranks x 31 sizes x 2 places
    # every rank fails main()'s TESTCHECK; mpirun ends the others once the first has exited
    assert re.search(r"^ \.\. \S+ pid \d+: Test failure common\.cu:1454$", res.stdout, re.M)
    assert re.search(r"Process name: \[\[\d+,1\],[0-3]\]\s+Exit code:\s+7", res.stderr), res.stderr


@needs_mpirun
def test_too_many_ranks_for_a_nodes_gpus(tmp_path):
    states = _nodes(tmp_path)
    hw = json.loads((states[1] / "node.json").read_text())
    hw["gpus"] = hw["gpus"][:1]
    hardware.save(states[1], hw)
    res = _world(states)
    assert res.returncode == nt.TEST_NOT_IMPLEMENTED, res.stdout + res.stderr
    # node 1's ranks are local ranks 2 and 3 of this one machine: GPU 2 or 3 of a node that has one
    assert re.search(r"Invalid number of GPUs: [34] requested but only 1 were found\.", res.stderr), res.stderr


def test_without_a_launcher_it_is_a_world_of_one(tmp_path):
    (state,) = _nodes(tmp_path)[:1]
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "LLMDEPLOY_SIM_STATE": str(state), "NCCL_SOCKET_IFNAME": "lo"}
    res = subprocess.run([sys.executable, "-S", "-m", "sim.standins", "all_reduce_perf", *ARGS], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    perf = comm.parse_all_reduce(res.stdout)
    assert perf["sizes"] == 31 and perf["max_busbw"] == 0.0 and res.stdout.count("#  Rank") == 1
    env["NCCL_SOCKET_IFNAME"] = "ens2f0"
    res = subprocess.run([sys.executable, "-S", "-m", "sim.standins", "all_reduce_perf", *ARGS], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == nt.TEST_NCCL_ERROR and "NCCL WARN Bootstrap : no socket interface found" in res.stdout
