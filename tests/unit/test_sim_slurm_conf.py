"""The simulated Slurm cluster's slurm.conf (sim/slurm.py, a pure function of the inventory)."""

from pathlib import Path
from types import SimpleNamespace

from llmdeploy.inventory import load_cluster
from sim import slurm


def _conf(name: str) -> dict[str, list[str]]:
    """slurm.conf's lines by key (NodeName and PartitionName repeat)."""
    out: dict[str, list[str]] = {}
    for line in slurm.slurm_conf(load_cluster(name), Path("/sim/c")).splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def test_b200_controller_nodes_and_partition():
    conf = _conf("sim-b200-slurm")
    assert conf["ClusterName"] == ["sim-b200-slurm"]
    # the login host at the data /24's .250, on the management network
    assert conf["SlurmctldHost"] == ["sim-b200-slurm-login(198.18.25.250)"]
    assert slurm.login_ips(load_cluster("sim-b200-slurm")) == ("198.19.25.250", "198.18.25.250")
    nodes = [v.split()[0] for v in conf["NodeName"]]
    assert nodes == ["sim-b200-slurm-0", "sim-b200-slurm-1"]
    assert "NodeAddr=198.18.25.10" in conf["NodeName"][0] and "NodeAddr=198.18.25.11" in conf["NodeName"][1]
    # the simulated hardware's CPUs (lscpu's), not this machine's: slurmd believes the file
    assert "CPUs=224" in conf["NodeName"][0] and conf["SlurmdParameters"] == ["config_overrides"]
    assert conf["PartitionName"] == ["gpu Nodes=sim-b200-slurm-0,sim-b200-slurm-1 Default=YES MaxTime=INFINITE State=UP"]


def test_daemons_settings():
    conf = _conf("sim-b200-slurm")
    assert conf["AuthType"] == ["auth/munge"] and conf["SlurmUser"] == ["root"]
    assert conf["SelectType"] == ["select/cons_tres"] and conf["SelectTypeParameters"] == ["CR_Core"]
    # cgroups or parentage, by this machine's hierarchies (test_devices_are_constrained_... holds both)
    assert (conf["ProctrackType"], conf["TaskPlugin"]) in ((["proctrack/cgroup"], ["task/cgroup"]),
                                                           (["proctrack/linuxproc"], ["task/none"]))
    assert conf["MpiDefault"] == ["none"] and conf["AccountingStorageType"] == ["accounting_storage/none"]
    assert conf["KillWait"] == ["5"] and conf["ReturnToService"] == ["2"]
    # everything the daemons write is in the cluster's directory; each slurmd its own (%n: its Slurm name)
    assert conf["StateSaveLocation"] == ["/sim/c/slurm/ctld"]
    for key in ("SlurmdPidFile", "SlurmdLogFile"):
        assert conf[key][0].startswith("/sim/c/slurm/nodes/%n/"), key
    # one path, each host's own folder bound over it (enroot's PMIx hook mounts it as scontrol prints it)
    assert conf["SlurmdSpoolDir"] == ["/sim/c/slurm/node/spool"] and conf["TmpFS"] == ["/sim/c/slurm/node/tmp"]
    assert conf["TaskProlog"] == ["/sim/c/slurm/task_prolog"]


def test_a3_four_nodes_in_the_npu_partition():
    conf = _conf("sim-a3-slurm")
    assert conf["SlurmctldHost"] == ["sim-a3-slurm-login(198.18.5.250)"]
    assert [v.split()[0] for v in conf["NodeName"]] == [f"sim-a3-slurm-{i}" for i in range(4)]
    assert "NodeAddr=198.18.5.13" in conf["NodeName"][3]
    assert conf["PartitionName"][0].startswith("npu Nodes=sim-a3-slurm-0,sim-a3-slurm-1,sim-a3-slurm-2,sim-a3-slurm-3 ")


def test_slurm_names_from_the_inventory_nodelist(monkeypatch):
    built = SimpleNamespace(enroot_bin=Path("/cache/gs/enroot/bin"), enroot_sysconf=Path("/cache/gs/enroot/etc/enroot"))
    monkeypatch.setattr(slurm.gpusite, "ensure", lambda against=None: built)
    monkeypatch.setattr(slurm.gpusite, "ensure_slurm", lambda echo=None: slurm.gpusite.SlurmBuild(Path("/cache/slurm-1")))
    cluster = load_cluster("sim-b200-slurm")
    cluster = cluster.model_copy(update={"slurm": cluster.slurm.model_copy(update={"nodelist": ["gpu-a", "gpu-b"]})})
    text = slurm.slurm_conf(cluster, Path("/sim/c"))
    assert "NodeName=gpu-a NodeAddr=198.18.25.10 " in text and "Nodes=gpu-a,gpu-b " in text
    # slurmd is started with the Slurm name, munged first, in the host's script
    lines = slurm.host_lines(cluster, Path("/sim/c"), "sim-b200-slurm-1", {"PATH": "/x"})
    assert lines[-1].endswith("slurmd -f /sim/c/slurm/slurm.conf -N gpu-b") and "munged --force" in lines[3]
    assert lines[0].endswith(" /usr/bin") and lines[1].endswith(" /usr/sbin")  # Slurm 25.11's programs first
    # its own spool and TmpFS at the one path slurm.conf names
    assert "mount --bind /sim/c/slurm/nodes/gpu-b/spool /sim/c/slurm/node/spool" in lines
    assert "mount --bind /sim/c/slurm/nodes/gpu-b/tmp /sim/c/slurm/node/tmp" in lines


def test_task_prolog_gives_the_hosts_path():
    text = slurm.task_prolog(Path("/sim/c"))
    assert text.startswith("#!/bin/sh\n")
    assert 'd=/sim/c/hosts/$h' in text and 'echo "export PATH=$d/bin:/usr/local/sbin:' in text
    assert "LLMDEPLOY_SIM_HOSTDIR=$d" in text
    # inside a pyxis container (no host folders there) the image's PATH stays
    assert text.index('[ -d "$d" ] || exit 0') < text.index("export PATH")


def test_not_a_slurm_cluster_gets_nothing():
    cluster = load_cluster("sim-b200")
    assert slurm.host_lines(cluster, Path("/sim/c"), cluster.nodes[0].name, {}) == []
    assert slurm.node_env(cluster, Path("/sim/c")) == {}


def test_nvidia_sites_load_pyxis_and_ascend_ones_do_not(monkeypatch, tmp_path):
    assert _conf("sim-b200-slurm")["PlugStackConfig"] == ["/sim/c/slurm/plugstack.conf"]
    assert "PlugStackConfig" not in _conf("sim-a3-slurm")
    assert slurm.pyxis(load_cluster("sim-gb300-1p2d")) is False  # not run by Slurm

    class Built:
        enroot_bin = Path("/cache/gs/enroot/bin")
        enroot_sysconf = Path("/cache/gs/enroot/etc/enroot")

    monkeypatch.setattr(slurm.gpusite, "ensure", lambda against=None: Built())
    monkeypatch.setattr(slurm.gpusite, "ensure_slurm", lambda echo=None: slurm.gpusite.SlurmBuild(Path("/cache/slurm-1")))
    b200 = load_cluster("sim-b200-slurm")
    lines = slurm.host_lines(b200, Path("/sim/c"), "sim-b200-slurm-1", {"PATH": "/h/bin:/usr/bin"})
    # enroot in /usr/local/bin (slurmd, tasks and pyxis's job epilog find it there), the cluster's enroot configuration
    assert "mount -t overlay overlay -o lowerdir=/cache/gs/enroot/bin:/usr/local/bin /usr/local/bin" in lines
    assert "mount --bind /sim/c/slurm/enroot /cache/gs/enroot/etc/enroot" in lines
    assert lines[-1].startswith("env PATH=/h/bin:/usr/bin slurmd ")
    a3 = slurm.host_lines(load_cluster("sim-a3-slurm"), Path("/sim/c"), "sim-a3-slurm-1", {"PATH": "/h/bin"})
    assert not any("enroot" in line for line in a3)
    # the simulated hardware's state in every enroot container, at the path the stand-ins read
    # and the TaskProlog, which slurmstepd runs once pyxis has put the task in its container
    fields = [line.split() for line in slurm.enroot_fstab(Path("/sim/c")).splitlines() if not line.startswith("#")]
    assert fields == [["/etc/llmdeploy-sim", "/etc/llmdeploy-sim", "none", "x-create=dir,rbind,rw,nosuid,nodev,private", "0", "-1"],
                      ["/sim/c/slurm/task_prolog", "/sim/c/slurm/task_prolog", "none", "x-create=file,bind,ro,nosuid,nodev,private", "0", "-1"]]


def test_the_site_declares_the_gres_the_tool_asks_for():
    b200 = load_cluster("sim-b200-slurm")
    conf = _conf("sim-b200-slurm")
    assert conf["GresTypes"] == ["gpu"] and all(" Gres=gpu:8 " in v for v in conf["NodeName"])
    assert slurm.gres_conf(b200).splitlines()[1:] == ["NodeName=sim-b200-slurm-0 Name=gpu File=/dev/nvidia[0-7]",
                                                      "NodeName=sim-b200-slurm-1 Name=gpu File=/dev/nvidia[0-7]"]
    assert "Name=npu File=/dev/davinci[0-15]" in slurm.gres_conf(load_cluster("sim-a3-slurm"))
    # the GPUs' device files in the node's own /dev (major 195, one minor per GPU)
    hw = {"gpus": [{"id": 0}, {"id": 1}]}
    from sim.cluster import dev_lines
    assert [line for line in dev_lines(hw) if "nvidia" in line] == ["mknod -m 666 /dev/nvidia0 c 195 0", "mknod -m 666 /dev/nvidia1 c 195 1"]
    assert not any("davinci" in line for line in dev_lines(hw))
    assert slurm.node_gres(hw) == (2, "/dev/nvidia[0-1]")
    # the site's count is its hardware's, whatever the tool asks for (asking for more is Slurm's refusal to make)
    fewer = b200.model_copy(update={"slurm": b200.slurm.model_copy(update={"gres_per_node": 4, "gres": "b200"})})
    assert "Name=b200 File=/dev/nvidia[0-7]" in slurm.gres_conf(fewer) and " Gres=b200:8 " in slurm.slurm_conf(fewer, Path("/c"))
    # a site without GRES for them declares none
    none = b200.model_copy(update={"slurm": b200.slurm.model_copy(update={"gres_per_node": 0})})
    assert "GresTypes" not in slurm.slurm_conf(none, Path("/c")) and "Name=" not in slurm.gres_conf(none)


MOUNTINFO_V1 = """\
30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755
31 30 0:27 / /sys/fs/cgroup/cpuset rw - cgroup cgroup rw,cpuset
32 30 0:28 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices
33 30 0:29 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
34 30 0:30 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
"""
MOUNTINFO_V2 = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"


def test_devices_are_constrained_where_the_machine_has_cgroup_v1_devices():
    b200 = load_cluster("sim-b200-slurm")
    assert slurm.constrained(b200, MOUNTINFO_V1) and not slurm.constrained(b200, MOUNTINFO_V2)
    # proctrack/cgroup needs the freezer too; the Ascend sites keep Docker's way (parentage)
    assert not slurm.constrained(b200, MOUNTINFO_V1.replace("rw,freezer", "rw,pids"))
    assert not slurm.constrained(load_cluster("sim-a3-slurm"), MOUNTINFO_V1)
    none = b200.model_copy(update={"slurm": b200.slurm.model_copy(update={"gres_per_node": 0})})
    assert not slurm.constrained(none, MOUNTINFO_V1)
    assert "ConstrainDevices=yes" in slurm.cgroup_conf() and "CgroupPlugin=cgroup/v1" in slurm.cgroup_conf()
    on = slurm._settings(Path("/s"), cgroups=True)
    off = slurm._settings(Path("/s"))
    assert {"ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup"} <= set(on)
    assert {"ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none"} <= set(off)
    # each host in a folder of every hierarchy, a cpuset with its parent's CPUs first
    lines = slurm.host_cgroup_lines("lds-x-n0.host", MOUNTINFO_V1)
    assert lines == ["mkdir -p /sys/fs/cgroup/cpuset/lds-x-n0.host",
                     "cat /sys/fs/cgroup/cpuset/cpuset.cpus > /sys/fs/cgroup/cpuset/lds-x-n0.host/cpuset.cpus",
                     "cat /sys/fs/cgroup/cpuset/cpuset.mems > /sys/fs/cgroup/cpuset/lds-x-n0.host/cpuset.mems",
                     "echo $$ > /sys/fs/cgroup/cpuset/lds-x-n0.host/cgroup.procs",
                     "mkdir -p /sys/fs/cgroup/devices/lds-x-n0.host",
                     "echo $$ > /sys/fs/cgroup/devices/lds-x-n0.host/cgroup.procs",
                     "mkdir -p /sys/fs/cgroup/unified/lds-x-n0.host",
                     "echo $$ > /sys/fs/cgroup/unified/lds-x-n0.host/cgroup.procs",
                     "mkdir -p /sys/fs/cgroup/freezer/lds-x-n0.host",
                     "echo $$ > /sys/fs/cgroup/freezer/lds-x-n0.host/cgroup.procs"]


def test_the_nvidia_sites_run_slurm_25_11_but_one_older_pyxis_site(monkeypatch):
    """The NVIDIA sites run the 25.11 build's programs, laid over Debian's in
    each host's own mount namespace; sim-h200-sglang-slurm (a pyxis world of
    two nodes) stays on Debian's 22.05 as the older site, and so do the
    Ascend sites (Docker only). 25.11's cgroup.conf has no CgroupAutomount."""
    from sim import gpusite

    monkeypatch.setattr(gpusite, "ensure_slurm", lambda echo=None: gpusite.SlurmBuild(Path("/cache/slurm-1")))
    b200, gb300, sglang, a3 = (load_cluster(n) for n in ("sim-b200-slurm", "sim-gb300-1p2d-slurm", "sim-h200-sglang-slurm", "sim-a3-slurm"))
    assert slurm.current(b200) and slurm.current(gb300) and not slurm.current(sglang) and not slurm.current(a3)
    assert slurm.pyxis(sglang) and "sim-h200-sglang-slurm" in slurm.OLDER_SITES
    assert slurm.slurm_lines(b200) == ["mount -t overlay overlay -o lowerdir=/cache/slurm-1/bin:/usr/bin /usr/bin",
                                       "mount -t overlay overlay -o lowerdir=/cache/slurm-1/sbin:/usr/sbin /usr/sbin"]
    assert slurm.slurm_lines(sglang) == [] and slurm.slurm_lines(a3) == []
    assert "CgroupAutomount" not in slurm.cgroup_conf(automount_option=False)
    assert "CgroupAutomount=no" in slurm.cgroup_conf()
