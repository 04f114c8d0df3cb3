"""The facts role: the script it builds, and its parsers fed with the
stand-ins' output (which follows the real tools' formats)."""

import os
import shlex
import subprocess
import sys

import pytest

import roles.facts as facts
from llmdeploy.sections import numa_of
from platforms import ascend, nvidia
from llmdeploy.inventory import load_cluster
from sim import hardware
from flows.binding import bind

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def standin(state_dir, tool, *args):
    env = dict(os.environ, LLMDEPLOY_SIM_STATE=str(state_dir), PYTHONPATH=REPO)
    res = subprocess.run([sys.executable, "-m", "sim.standins", tool, *args], capture_output=True, text=True, env=env)
    return res


@pytest.fixture
def a3_host(tmp_path):
    c = load_cluster("sim-a3")
    hardware.save(tmp_path, hardware.node_hardware(c, 1, c.nodes[1]))
    return c, c.nodes[1], tmp_path


def test_script_is_one_round_trip_and_quotes_the_model_path():
    c = load_cluster("a3")
    c.model.path = "/models/with space"  # not valid in an inventory; the builder still quotes
    script = facts.build(bind(c), c.nodes[0])
    assert shlex.quote("/models/with space") in script
    # A3 reads NPU addresses with -vnic, for all 16 devices
    assert script.count("-vnic -g") == 16 and "-ip -g" not in script


@pytest.mark.parametrize("shell", ["bash", "sh"])
@pytest.mark.parametrize(
    "script,out,code",
    [
        ("echo a; echo b", "a\nb\n", 0),
        ("exit 3", "", 3),
        ("printf x; exit 2", "x\n", 2),  # a last line without its newline gets one
        ("echo a; echo oops >&2", "a\n", 0),  # stderr is not held back
        ("printf 'q\\n\\n\\n'", "q\n", 0),
        ("echo \"it's $((1 + 1))\"; echo '$(not run)'", "it's 2\n$(not run)\n", 0),
    ],
)
def test_in_one_piece_prints_the_output_once_the_script_ends(shell, script, out, code):
    res = subprocess.run([shell, "-c", facts.in_one_piece(script)], capture_output=True, text=True)
    assert (res.stdout, res.returncode) == (out, code)
    assert res.stderr == ("oops\n" if "oops" in script else "")


def test_the_facts_step_sends_its_script_in_one_piece(a3_host):
    c, node, _ = a3_host
    for step in (facts.gather_step(bind(c)), facts.gather_step(bind(c), ["image.ensure"])):
        command = step.build(node)
        assert command.startswith("__llmdeploy_out=$(\n") and facts.build(bind(c), node).rstrip() in command


def test_a2_reads_npu_ip_with_ip_query():
    c = load_cluster("a2")
    script = facts.build(bind(c), c.nodes[0])
    assert script.count(" -ip -g") == 8


def test_nvidia_script_queries_gpus_not_npus():
    c = load_cluster("b200")
    script = facts.build(bind(c), c.nodes[0])
    assert "nvidia-smi --query-gpu=" in script and "npu-smi" not in script


def test_npu_smi_parser_reads_all_16_a3_devices(a3_host):
    _, _, d = a3_host
    devs = ascend.parse_npu_smi(standin(d, "npu-smi", "info").stdout)
    assert len(devs) == 16
    assert [x["npu"] for x in devs[:4]] == [0, 0, 1, 1] and [x["chip"] for x in devs[:4]] == [0, 1, 0, 1]
    assert all(x["health"] == "OK" for x in devs)


def test_npu_smi_parser_sees_a_sick_device(a3_host):
    _, _, d = a3_host
    hw = hardware.load(d)
    hw["npus"][5]["health"] = "Critical"
    hardware.save(d, hw)
    devs = ascend.parse_npu_smi(standin(d, "npu-smi", "info").stdout)
    assert [x["id"] for x in devs if x["health"] != "OK"] == [5]


def test_topology_gives_numa_affinity(a3_host):
    _, _, d = a3_host
    aff = facts.parse_topo_affinity(standin(d, "npu-smi", "info", "-t", "topo").stdout, "NPU")
    cpu_nodes = facts.parse_lscpu(standin(d, "lscpu", "-e=CPU,NODE").stdout)
    assert len(cpu_nodes) == 320
    assert numa_of(aff[0], cpu_nodes) == 0 and numa_of(aff[15], cpu_nodes) == 3


def test_numactl_parser(a3_host):
    _, _, d = a3_host
    nodes = facts.parse_numactl(standin(d, "numactl", "-H").stdout)
    assert [n["id"] for n in nodes] == [0, 1, 2, 3] and nodes[0]["cpus"] == 80


def test_gb300_numa_shows_gpu_memory_nodes(tmp_path):
    c = load_cluster("sim-gb300-agentic")
    hardware.save(tmp_path, hardware.node_hardware(c, 0, c.nodes[0]))
    nodes = facts.parse_numactl(standin(tmp_path, "numactl", "-H").stdout)
    assert len(nodes) == 6 and [n["cpus"] for n in nodes[2:]] == [0, 0, 0, 0]


def test_nvidia_parsers(tmp_path):
    c = load_cluster("sim-b200")
    hardware.save(tmp_path, hardware.node_hardware(c, 0, c.nodes[0]))
    q = standin(tmp_path, "nvidia-smi", "--query-gpu=index,name,uuid,memory.total,pci.bus_id,ecc.errors.uncorrected.volatile.total", "--format=csv,noheader,nounits")
    gpus = nvidia.parse_nvsmi(q.stdout)
    assert len(gpus) == 8 and gpus[0]["name"] == "NVIDIA B200" and all(g["health"] == "OK" for g in gpus)
    aff = facts.parse_topo_affinity(standin(tmp_path, "nvidia-smi", "topo", "-m").stdout, "GPU")
    assert aff[0] == list(range(0, 112)) and aff[7] == list(range(112, 224))


def test_hccn_tool_missing_ip_is_reported_like_the_real_tool(a3_host):
    _, _, d = a3_host
    hw = hardware.load(d)
    hw["npus"][2]["ip"] = None
    hardware.save(d, hw)
    res = standin(d, "hccn_tool", "-i", "2", "-ip", "-g")
    assert res.returncode != 0 and "no ip was preset" in res.stdout


def test_parse_marks_problems():
    c = load_cluster("a3")
    node = c.nodes[0]
    out = "\n".join(
        [
            f"{facts.MARK} hostname", "a3-node-0", f"{facts.MARK}rc 0",
            f"{facts.MARK} addr", "3: enp189s0f0    inet 192.0.2.99/24 scope global enp189s0f0", f"{facts.MARK}rc 0",
            f"{facts.MARK} link", "3: enp189s0f0: <BROADCAST,MULTICAST> mtu 1500 qdisc noop state DOWN mode DEFAULT", f"{facts.MARK}rc 0",
            f"{facts.MARK} docker", "sh: docker: not found", f"{facts.MARK}rc 127",
        ]
    )
    f = facts.parse(bind(c), node, out)
    assert "NIC enp189s0f0 is down (state DOWN)" in f["problems"]
    assert "NIC enp189s0f0 does not own 192.0.2.10 (no interface has 192.0.2.10; it has 192.0.2.99/24)" in f["problems"]
    assert "no container engine (sh: docker: not found)" in f["problems"]
    assert "0 of 16 NPUs visible" in f["problems"]


def test_nic_problem_names_the_interface_that_owns_the_ip():
    c = load_cluster("a3")
    node = c.nodes[0]
    out = "\n".join(
        [
            f"{facts.MARK} hostname", "a3-node-0", f"{facts.MARK}rc 0",
            f"{facts.MARK} addr", "3: enp189s0f0    inet 192.0.2.99/24 scope global enp189s0f0",
            "4: eth7    inet 192.0.2.10/24 scope global eth7", f"{facts.MARK}rc 0",
            f"{facts.MARK} link", "3: enp189s0f0: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT",
            "4: eth7: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc mq state UP mode DEFAULT", f"{facts.MARK}rc 0",
        ]
    )
    f = facts.parse(bind(c), node, out)
    assert facts.nic_problems(node, f) == ["NIC enp189s0f0 does not own 192.0.2.10 (192.0.2.10 is on eth7; it has 192.0.2.99/24)"]


def test_parse_ibstat_listen_df():
    ib = facts.parse_ibstat(
        "CA 'mlx5_0'\n\tCA type: MT4129\n\tPort 1:\n\t\tState: Active\n\t\tPhysical state: LinkUp\n\t\tRate: 400\n"
        "CA 'mlx5_1'\n\tPort 1:\n\t\tState: Down\n\t\tPhysical state: Polling\n\t\tRate: 10\n"
    )
    assert ib == [
        {"ca": "mlx5_0", "port": 1, "state": "Active", "phys": "LinkUp", "rate": 400},
        {"ca": "mlx5_1", "port": 1, "state": "Down", "phys": "Polling", "rate": 10},
    ]
    assert facts.parse_listen("LISTEN 0 128 0.0.0.0:22 0.0.0.0:*\nLISTEN 0 4096 [::]:8000 [::]:*\n") == [22, 8000]
    assert facts.parse_df("Filesystem 1024-blocks Used Available Capacity Mounted on\n/dev/sda1 100 50 2097152 50% /var\n") == (2.0, "/var")
