"""A node that is not what its platform declares is caught (issue 32): the
facts name the node and both sides ("sim-a3-1 reports 8 NPUs, platform a3
declares 16"), and prepare's and deploy's preflights refuse the whole cluster
before anything starts on any node. Fed with what the simulator's stand-ins
print (they print what the real npu-smi and nvidia-smi print)."""

import os
import subprocess
import sys

import pytest

import roles.facts as facts
from flows import app, deploy
from flows.plan import Context, load_playbook
from llmdeploy.inventory import load_cluster
from llmdeploy.runner import FAILED, OK, SKIPPED, HostResult
from sim import hardware
from flows.binding import bind

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def standin(state_dir, tool, *args) -> str:
    env = dict(os.environ, LLMDEPLOY_SIM_STATE=str(state_dir), PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-m", "sim.standins", tool, *args], capture_output=True, text=True, env=env).stdout


def sec(name: str, text: str, rc: int = 0) -> str:
    return f"{facts.MARK} {name}\n{text}\n{facts.MARK}rc {rc}\n"


def node_output(cluster, node, state, device_files: str | None = "") -> str:
    """The facts output of a simulated node whose hardware is ``state``'s node.json."""
    out = sec("hostname", node.name)
    out += sec("lscpu", standin(state, "lscpu", "-e=CPU,NODE"))
    out += sec("addr", f"3: {node.nic}    inet {node.ip}/24 scope global {node.nic}")
    out += sec("link", f"3: {node.nic}: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 9000 qdisc mq state UP mode DEFAULT")
    out += sec("docker", "Docker version 26.1.3, build b72abbb")
    if cluster.platform_info.vendor == "ascend":
        out += sec("npusmi", standin(state, "npu-smi", "info"))
        out += sec("npusmi_topo", standin(state, "npu-smi", "info", "-t", "topo"))
    else:
        out += sec("nvsmi", standin(state, "nvidia-smi", "--query-gpu=index,name,uuid,memory.total,pci.bus_id,ecc.errors.uncorrected.volatile.total",
                                    "--format=csv,noheader,nounits"))
        out += sec("nvtopo", standin(state, "nvidia-smi", "topo", "-m"))
    if device_files is not None:
        out += sec("device_files", device_files)
    return out


@pytest.fixture
def a3(tmp_path):
    c = load_cluster("sim-a3")
    node = c.nodes[1]
    state = tmp_path / "a3"
    state.mkdir()
    hardware.save(state, hardware.node_hardware(c, 1, node))
    return c, node, state


@pytest.fixture
def b200(tmp_path):
    c = load_cluster("sim-b200")
    node = c.nodes[0]
    state = tmp_path / "b200"
    state.mkdir()
    hardware.save(state, hardware.node_hardware(c, 0, node))
    return c, node, state


def edit(state, change) -> None:
    hw = hardware.load(state)
    change(hw)
    hardware.save(state, hw)


def test_a_node_as_its_platform_declares_passes(a3, b200):
    for c, node, state in (a3, b200):
        f = facts.parse(bind(c), node, node_output(c, node, state))
        assert "platform_mismatch" not in f and f["problems"] == [], f["problems"]
        assert facts.platform_check(node, f).status == OK


def test_an_a3_node_reporting_half_its_npus_is_named_with_both_counts(a3):
    c, node, state = a3
    edit(state, lambda hw: hw.update(npus=hw["npus"][:8]))
    f = facts.parse(bind(c), node, node_output(c, node, state))
    assert f["platform_mismatch"] == ["sim-a3-1 reports 8 NPUs, platform a3 declares 16"]
    assert f["problems"][0] == "sim-a3-1 reports 8 NPUs, platform a3 declares 16"
    res = facts.platform_check(node, f)
    assert res.status == FAILED and res.msg == "sim-a3-1 reports 8 NPUs, platform a3 declares 16"


def test_a_gpu_missing_from_nvidia_smi_is_named(b200):
    c, node, state = b200
    edit(state, lambda hw: hw["gpus"].pop(3))
    f = facts.parse(bind(c), node, node_output(c, node, state))
    assert f["platform_mismatch"] == ["sim-b200-0 reports 7 GPUs, platform b200 declares 8"]


def test_another_model_is_named(b200):
    c, node, state = b200
    edit(state, lambda hw: [g.update(name="NVIDIA H100 80GB HBM3") for g in hw["gpus"]])
    f = facts.parse(bind(c), node, node_output(c, node, state))
    assert f["platform_mismatch"] == ["sim-b200-0 reports GPU 0,1,2,3,4,5,6,7 as 'NVIDIA H100 80GB HBM3', platform b200 declares B200 "
                                      "(GPUs named 'NVIDIA B200.*')"]


def test_a_sick_device_is_named(a3):
    c, node, state = a3
    edit(state, lambda hw: hw["npus"][5].update(health="Critical"))
    f = facts.parse(bind(c), node, node_output(c, node, state))
    assert f["platform_mismatch"] == ["sim-a3-1 reports 1 of its NPUs not healthy (NPU 5: Critical), platform a3 declares 16 healthy"]


def test_an_absent_device_file_is_named(a3):
    c, node, state = a3
    f = facts.parse(bind(c), node, node_output(c, node, state, device_files="/dev/davinci3\n/dev/hisi_hdc"))
    assert f["platform_mismatch"] == ["sim-a3-1 lacks /dev/davinci3, /dev/hisi_hdc: platform a3 gives each serving container these device files"]


def test_more_devices_than_the_platform_has_is_another_machine(tmp_path):
    # an A3 node (16 chips) in an inventory that says a2 (8 NPUs)
    a3c, a2c = load_cluster("sim-a3"), load_cluster("sim-a2")
    hardware.save(tmp_path, hardware.node_hardware(a3c, 0, a3c.nodes[0]))
    node = a2c.nodes[0]
    f = facts.parse(bind(a2c), node, node_output(a2c, node, tmp_path))
    assert f["platform_mismatch"][0] == f"{node.name} reports 16 NPUs, platform a2 declares 8"


def test_an_inventory_that_serves_with_fewer_devices_is_named_as_such(a3):
    c, node, state = a3
    node.devices = 12
    edit(state, lambda hw: hw.update(npus=hw["npus"][:8]))
    f = facts.parse(bind(c), node, node_output(c, node, state))
    assert f["platform_mismatch"] == ["sim-a3-1 reports 8 NPUs, its inventory entry declares 12 (devices; platform a3: 16)"]
    edit(state, lambda hw: hw.update(npus=hw["npus"][:8]))
    node.devices = 8
    assert "platform_mismatch" not in facts.parse(bind(c), node, node_output(c, node, state))


def test_the_facts_script_lists_the_absent_device_files_a_container_needs():
    c = load_cluster("a3")
    script = facts.build(bind(c), c.nodes[0])
    line = next(ln for ln in script.splitlines() if "device_files" in ln)
    assert "/dev/davinci0 " in line and "/dev/davinci15 " in line and "/dev/davinci_manager /dev/devmm_svm /dev/hisi_hdc;" in line
    out = subprocess.run(["sh", "-c", line.replace("/dev/davinci_manager", "/dev/null")], capture_output=True, text=True).stdout
    sections = facts.split_sections(out)
    assert sections["device_files"][1] == 0 and "/dev/null" not in sections["device_files"][0]
    # NVIDIA: the container runtime passes the GPUs, no device file is checked one by one
    b = load_cluster("b200")
    assert "device_files" not in facts.build(bind(b), b.nodes[0])


def test_refusal_names_every_mismatched_node_and_that_nothing_started():
    c = load_cluster("sim-a3")
    results = {
        "sim-a3-0": HostResult("sim-a3-0", OK, data={"platform_mismatch": []}),
        "sim-a3-1": HostResult("sim-a3-1", OK, data={"platform_mismatch": ["sim-a3-1 reports 8 NPUs, platform a3 declares 16"]}),
        "sim-a3-2": HostResult("sim-a3-2", FAILED, msg="unreachable"),
    }
    assert facts.refusal(c, results) == "sim-a3: sim-a3-1 reports 8 NPUs, platform a3 declares 16; nothing was started or changed on any node"
    assert facts.refusal(c, {"sim-a3-0": results["sim-a3-0"]}) is None


def test_prepare_checks_the_platform_in_a_fatal_play_before_any_change():
    plays = load_playbook("prepare")
    at = next(i for i, p in enumerate(plays) if "facts.platform" in p.steps)
    assert plays[at].any_errors_fatal and plays[at].steps == ["facts.platform"]
    assert any("facts.inspect" in p.steps for p in plays[:at])
    changes = {"image.ensure", "image.accessories", "wheels.install", "commenv.render", "record.write"}
    assert all(not changes & set(p.steps) for p in plays[: at + 1])


class FakeRunner:
    """The runner's surface a play uses: run a step on nodes, hosts left out."""

    def __init__(self):
        self.excluded: dict[str, str] = {}
        self.ran: list[str] = []

    def run(self, step, nodes=None):
        self.ran.append(step.name)
        return {n.name: (HostResult(n.name, SKIPPED, msg=self.excluded[n.name]) if n.name in self.excluded else step.local(n)) for n in nodes}


def test_a_mismatched_node_stops_prepare_on_every_node():
    c = load_cluster("sim-a3")
    ctx = Context(bind(c))
    ctx.results["facts"] = {n.name: HostResult(n.name, OK, data={"hostname": n.name, "devices": [{}] * 16, "accelerator": "npu"}) for n in c.nodes}
    ctx.results["facts"]["sim-a3-2"].data.update(devices=[{}] * 8, platform_mismatch=["sim-a3-2 reports 8 NPUs, platform a3 declares 16"])
    runner = FakeRunner()
    play = next(p for p in load_playbook("prepare") if "facts.platform" in p.steps)
    assert app._run_play(runner, ctx, play, None) is False  # the playbook stops: no later play runs
    assert ctx.results["platform"]["sim-a3-2"].msg == "sim-a3-2 reports 8 NPUs, platform a3 declares 16"
    assert ctx.results["platform"]["sim-a3-0"].status == OK


def test_deploy_without_prepare_reads_the_facts_and_refuses(monkeypatch):
    c = load_cluster("sim-a3")

    class Runner:
        def run(self, step, nodes=None):
            assert step.name == "facts"
            return {n.name: HostResult(n.name, OK, data={"platform_mismatch": [f"{n.name} reports 8 NPUs, platform a3 declares 16"]
                                                         if n.name == "sim-a3-3" else []}) for n in c.nodes}

    assert deploy.platform_refusal(Runner(), bind(c)) == ("sim-a3: sim-a3-3 reports 8 NPUs, platform a3 declares 16; "
                                                   "nothing was started or changed on any node")


def test_deploy_skip_prepare_refuses_before_running_anything_else():
    from rich.console import Console

    from llmdeploy.errors import LlmdeployError

    c = load_cluster("sim-a3")
    steps: list[str] = []

    class Runner:
        def exec(self, node, cmd, timeout=None):
            return "", "", 0  # no verification record: --force lets the deploy go on

        def run(self, step, nodes=None):
            steps.append(step.name)
            return {n.name: HostResult(n.name, OK, data={"platform_mismatch": [f"{n.name} reports 8 NPUs, platform a3 declares 16"]
                                                         if n.name == "sim-a3-1" else []}) for n in c.nodes}

    def no_prepare(name, quiet):
        raise AssertionError("prepare must not run with --skip-prepare")

    where = {"phase": "before anything was stopped"}
    with pytest.raises(LlmdeployError) as exc:
        deploy._deploy_locked(bind(c), Runner(), Console(file=open(os.devnull, "w")), False, True, [], True, no_prepare, where)
    assert str(exc.value) == "deploy refused: sim-a3: sim-a3-1 reports 8 NPUs, platform a3 declares 16; nothing was started or changed on any node"
    assert steps == ["facts"] and where["phase"] == "before anything was stopped"
