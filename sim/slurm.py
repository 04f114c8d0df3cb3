"""A simulated cluster run by Slurm (an inventory with ``slurm:``).

Besides what every simulated host has (sim/cluster.py), each host runs
munged and slurmd in its own network, mount and UTS namespaces (started by
the host's script before sshd), so a job step on node X has hostname X, X's
private directories and X's Docker Engine (/run/docker.sock of X's /run).
A login host (its own network namespace, on the management network at the
data /24's .250 mapped to 198.18, and on the data network at .250) runs
munged, slurmctld and sshd; the Slurm client commands work there for root
over SSH (sshd's SetEnv gives SLURM_CONF: Slurm's commands read the file it
names, slurm.conf(5) "SLURM_CONF"). No slurmdbd: ``sacct`` does not work.

Everything Slurm and munge write is under the cluster's directory (slurm/),
except their sockets, which are in each host's own /run (a tmpfs).

An NVIDIA cluster is a GPU site as NVIDIA's run Slurm: slurmd and srun load
pyxis (plugstack.conf), which runs enroot (sim/gpusite.py builds both from
their release tarballs), so ``srun --container-image=REGISTRY#IMAGE`` runs a
step in an enroot container on its node. enroot's configuration is the
cluster's (slurm/enroot/, bound over the build's etc/enroot in every host):
its folders (and pyxis's) in each host's private /root/.cache, the simulator's CA
for the registry, and the simulated hardware's state mounted into every
container (enroot's mounts.d), as the Docker hosts' runtime does.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import subprocess
import time
from pathlib import Path

from llmdeploy.errors import SimError
from llmdeploy.inventory import Cluster

from . import gpusite, hardware, images, sshd, users
from .paths import HOST_STATE_DIR, SYSTEM_PATH, host_dir, mgmt_ip, netns_name

LOGIN_HOST = 250  # the login host's address in the data /24 (and, mapped, the management one)
MUNGE_SOCKET = "/run/munge/munge.socket.2"  # munged's default (munged(8)), in each host's own /run
LOGIN_NIC = "data0"
DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmd", "/usr/sbin/slurmctld", "/usr/bin/srun")


def slurm_dir(cdir: Path) -> Path:
    return cdir / "slurm"


def pyxis(cluster: Cluster) -> bool:
    """Whether the simulated Slurm site has pyxis and enroot: NVIDIA GPU sites do
    (NVIDIA's own Slurm clusters and its reference recipes run pyxis); the
    Ascend ones here run Docker only."""
    return bool(cluster.slurm) and cluster.platform_info.vendor != "ascend"


# NVIDIA sites that stay on Debian 12's Slurm 22.05, as an older site does: one pyxis cluster with a multi-node world
OLDER_SITES = ("sim-h200-sglang-slurm",)
# sites that keep pyxis's default container_scope, global (pyxis config.c): a named container outlives its job;
# the others set job, so that pyxis's job epilog removes them
GLOBAL_SCOPE_SITES = ("sim-b200-slurm",)


# sites that keep slurm.conf's PropagateResourceLimits=ALL (the default): a task gets the login shell's
# 64 KiB memlock (LOGIN_MEMLOCK_KIB) unless srun --propagate=NONE (the inventory's slurm.propagate_limits);
# the others set PropagateResourceLimitsExcept=MEMLOCK, as sites that run RDMA do
PROPAGATE_ALL_SITES = ("sim-b200-slurm",)
# the login host's memlock limit (soft and hard, KiB): a login shell's, as pam_limits' defaults give it
LOGIN_MEMLOCK_KIB = 64


def current(cluster: Cluster) -> bool:
    """Whether the simulated site runs Slurm 25.11 (``gpusite.ensure_slurm``):
    the NVIDIA sites do (GPU sites run 23.11 to 26.05 today), but for the
    older one; the Ascend ones run Debian's 22.05."""
    return pyxis(cluster) and cluster.name not in OLDER_SITES


def slurm_lines(cluster: Cluster) -> list[str]:
    """Shell lines of a host's script, first: on a current site, the 25.11
    build's programs over Debian's in /usr/bin and /usr/sbin, in the host's
    own mount namespace (read-only overlays: both folders' files, the
    build's first), as where a site's packages put them; slurmd then runs
    its own slurmstepd and plug-ins from the build's prefix."""
    if not current(cluster):
        return []
    b = gpusite.ensure_slurm()
    return [f"mount -t overlay overlay -o {shlex.quote(f'lowerdir={b.bin}:/usr/bin')} /usr/bin",
            f"mount -t overlay overlay -o {shlex.quote(f'lowerdir={b.sbin}:/usr/sbin')} /usr/sbin"]


def pyxis_build(cluster: Cluster) -> gpusite.Build:
    """pyxis and enroot as the site's Slurm loads them (pyxis compiled against that Slurm's spank.h)."""
    return gpusite.ensure(against=gpusite.ensure_slurm() if current(cluster) else None)


# enroot's folders on a node: each user's under <this>/enroot (sim/paths.py PRIVATE_DIRS: every host its own)
ENROOT_NODE_DIR = Path("/var/lib")
# pyxis's runtime_path (default /run/pyxis): it writes each image's squashfs
# there, too large for the hosts' 64 MiB /run ("No space left on device"), in
# a folder per uid (pyxis_slurmstepd.c: "%s/%u")
PYXIS_RUNTIME = ENROOT_NODE_DIR / "enroot" / "pyxis"


def enroot_etc(cdir: Path) -> Path:
    """The cluster's enroot configuration folder (bound over the build's etc/enroot in each host)."""
    return slurm_dir(cdir) / "enroot"


def enroot_fstab(cdir: Path) -> str:
    """enroot's mounts.d entries (fstab(5) fields, enroot's x-create option as
    in its own 10-system.fstab): the simulated hardware's state in every
    container at the same path, as llmdeploy-sim-runc does for Docker; and the
    TaskProlog, which slurmstepd runs after pyxis's task_init has put the
    task in its container (slurmstepd's exec_task: spank task_init, then
    the task prolog): without it every containerized task fails "slurm
    task_prolog can not be executed"."""
    prolog = slurm_dir(cdir) / "task_prolog"
    return (f"# the simulated node's hardware state (sim/slurm.py), as the Docker hosts' runtime mounts it\n"
            f"{HOST_STATE_DIR} {HOST_STATE_DIR} none x-create=dir,rbind,rw,nosuid,nodev,private 0 -1\n"
            f"# the simulator's TaskProlog, run inside the container\n"
            f"{prolog} {prolog} none x-create=file,bind,ro,nosuid,nodev,private 0 -1\n")


def conf_path(cdir: Path) -> Path:
    return slurm_dir(cdir) / "slurm.conf"


def node_env(cluster: Cluster, cdir: Path) -> dict[str, str]:
    """What a host's SSH sessions get besides PATH: SLURM_CONF on a Slurm cluster (so scontrol, sinfo work there too)."""
    return {"SLURM_CONF": str(conf_path(cdir))} if cluster.slurm else {}


def login_ips(cluster: Cluster) -> tuple[str, str]:
    """(data, management) address of the login host."""
    net = ipaddress.IPv4Network(f"{cluster.nodes[0].ip}/24", strict=False)
    data = str(net.network_address + LOGIN_HOST)
    return data, mgmt_ip(data)


def login_name(cluster: Cluster) -> str:
    return cluster.slurm.login_node().name


def slurm_conf(cluster: Cluster, cdir: Path) -> str:
    """slurm.conf of the simulated cluster (slurm.conf(5) of Slurm 22.05 and of 25.11)."""
    _, ctl_ip = login_ips(cluster)
    lines = [
        "# slurm.conf of a simulated cluster (sim/slurm.py); slurm.conf(5)",
        f"ClusterName={cluster.name}",
        f"SlurmctldHost={login_name(cluster)}({ctl_ip})",
        *_settings(slurm_dir(cdir), constrained(cluster)),
    ]
    if cluster.name not in PROPAGATE_ALL_SITES:
        # the tasks keep slurmd's memlock, not the login shell's (slurm.conf(5) PropagateResourceLimitsExcept)
        lines.append("PropagateResourceLimitsExcept=MEMLOCK")
    if pyxis(cluster):
        # SPANK plug-ins of slurmd and of srun on the login host (spank(8)): pyxis
        lines.append(f"PlugStackConfig={slurm_dir(cdir) / 'plugstack.conf'}")
    gres = gres_of(cluster)
    if gres:
        # the accelerators as generic resources (gres.conf beside slurm.conf names their device files)
        lines.append(f"GresTypes={gres}")
    for i, node in enumerate(cluster.nodes):
        hw = hardware.node_hardware(cluster, i, node)
        sockets = len(hw["numa_nodes"])
        count = node_gres(hw)[0] if gres else 0
        lines.append(
            f"NodeName={cluster.slurm_name(node)} NodeAddr={mgmt_ip(str(node.ip))} CPUs={hw['cpus']} Sockets={sockets} "
            f"CoresPerSocket={hw['cpus'] // sockets} ThreadsPerCore=1 RealMemory={hw['mem_total_kib'] // 1024}"
            + (f" Gres={gres}:{count}" if count else "") + " State=UNKNOWN"
        )
    names = ",".join(cluster.slurm_name(n) for n in cluster.nodes)
    lines.append(f"PartitionName={cluster.slurm.partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def gres_of(cluster: Cluster) -> str | None:
    """The name the simulated site declares its accelerators under as GRES:
    the inventory's ``slurm.gres`` (a site's own name) or the vendor's word
    for one (gpu, npu); None when the inventory says the site has none
    (``gres_per_node = 0``). How many: each node's simulated hardware
    (:func:`node_gres`), whatever the tool asks for."""
    if not cluster.slurm or cluster.slurm.gres_per_node == 0:
        return None
    return cluster.slurm.gres  # the vendor's word unless the inventory names it (Slurm.settle)


def node_gres(hw: dict) -> tuple[int, str]:
    """(how many, their device files as gres.conf takes them) of one node's
    accelerators, from its simulated hardware (node.json): /dev/nvidiaN or /dev/davinciN."""
    ids = [d["id"] for d in hw.get("gpus") or hw.get("npus") or []]
    dev = "nvidia" if hw.get("gpus") else "davinci"
    files = f"/dev/{dev}[{min(ids)}-{max(ids)}]" if len(ids) > 1 else f"/dev/{dev}{ids[0]}" if ids else ""
    return len(ids), files


def constrained(cluster: Cluster, mountinfo: str | None = None) -> bool:
    """Whether the simulated site constrains each step's devices to its GRES
    (task/cgroup, cgroup.conf ConstrainDevices=yes): an NVIDIA Slurm site with
    GRES (the Ascend ones keep tracking by parentage), on a machine whose
    cgroup v1 hierarchies include the devices and freezer controllers (the
    cgroup/v1 plug-in; the recipe checked it on v1)."""
    if not pyxis(cluster) or gres_of(cluster) is None:
        return False
    from .dockerd import _cgroup_fs

    v1 = {c for _, fstype, opts in _cgroup_fs(mountinfo) if fstype == "cgroup" for c in opts.split(",")}
    # devices: ConstrainDevices; freezer: proctrack/cgroup
    return {"devices", "freezer"} <= v1


def cgroup_conf(automount_option: bool = True) -> str:
    """cgroup.conf (cgroup.conf(5)): the v1 plug-in on the hierarchies each host
    mounts itself (no automount), devices constrained to the step's GRES.
    ``automount_option``: Slurm 22.05's CgroupAutomount=no, which 25.11 no
    longer has (src/interfaces/cgroup.c lists it as defunct)."""
    return ("# cgroup.conf of a simulated cluster (sim/slurm.py); cgroup.conf(5)\n"
            "CgroupPlugin=cgroup/v1\n" + ("CgroupAutomount=no\n" if automount_option else "") + "ConstrainDevices=yes\n")


def host_cgroup_lines(folder: str, mountinfo: str | None = None) -> list[str]:
    """Shell lines, run on this machine before a host's namespaces are made,
    that put the shell in the cgroup ``/<folder>`` of every hierarchy (a cpuset
    gets its parent's CPUs and memory nodes first: an empty one takes no
    process). Then ``unshare --cgroup`` makes that folder the host's cgroup
    root, so that each host's slurmd has a hierarchy of its own: two slurmd
    sharing one would make the same job's folders (slurm/uid_0/job_N) and
    remove each other's."""
    from .dockerd import _cgroup_fs

    q = shlex.quote
    lines = []
    for point, fstype, opts in _cgroup_fs(mountinfo):
        d = f"{point}/{folder}"
        lines.append(f"mkdir -p {q(d)}")
        if fstype == "cgroup" and "cpuset" in opts.split(","):
            lines += [f"cat {q(point + '/cpuset.cpus')} > {q(d + '/cpuset.cpus')}",
                      f"cat {q(point + '/cpuset.mems')} > {q(d + '/cpuset.mems')}"]
        lines.append(f"echo $$ > {q(d + '/cgroup.procs')}")
    return lines


def gres_conf(cluster: Cluster) -> str:
    """gres.conf (gres.conf(5)): each node's accelerators by their device files in its own /dev."""
    name = gres_of(cluster)
    lines = ["# gres.conf of a simulated cluster (sim/slurm.py); gres.conf(5)"]
    for i, node in enumerate(cluster.nodes):
        count, files = node_gres(hardware.node_hardware(cluster, i, node))
        if name and count:
            lines.append(f"NodeName={cluster.slurm_name(node)} Name={name} File={files}")
    return "\n".join(lines) + "\n"


def _settings(sdir: Path, cgroups: bool = False) -> list[str]:
    """slurm.conf's lines that do not depend on the inventory but for where
    the daemons write (``sdir``) and whether devices are constrained (``cgroups``)."""
    return [
        "AuthType=auth/munge",
        "CredType=cred/munge",
        # every daemon runs as root here (the simulator is root); a real site has a slurm user
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={sdir / 'ctld'}",
        f"SlurmctldPidFile={sdir / 'slurmctld.pid'}",
        f"SlurmctldLogFile={sdir / 'slurmctld.log'}",
        # "%n" is the node's Slurm name (slurm.conf(5) SlurmdSpoolDir, SlurmdPidFile,
        # SlurmdLogFile): every slurmd its own spool and pid file (slurmd kills
        # the process its pid file names when it starts)
        f"SlurmdPidFile={sdir / 'nodes' / '%n' / 'slurmd.pid'}",
        f"SlurmdLogFile={sdir / 'nodes' / '%n' / 'slurmd.log'}",
        # the spool and the TmpFS (where mpi/pmix makes its per-step directories,
        # spmix_appdir_<uid>_<job>.<step> and pmix.<job>.<step>; on a shared /tmp
        # the second node's "File exists" fails the step) are one path, as on a
        # site where every node has its own disk: each host binds its own folder
        # over it (host_lines). Not "%n": slurmd expands it, but enroot's PMIx
        # hook reads the paths from `scontrol show config` and mounts them
        # into the container as written (hooks.d/50-slurm-pmi.sh)
        f"SlurmdSpoolDir={node_path(sdir, 'spool')}",
        f"TmpFS={node_path(sdir, 'tmp')}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # with GRES on a machine with cgroup v1: steps tracked in cgroups and
        # each step's devices constrained to its GRES (cgroup.conf
        # ConstrainDevices), every host in a cgroup namespace of its own
        # (host_cgroup_lines); else processes tracked by parentage
        *(["ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup"] if cgroups
          else ["ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none"]),
        # cores are the consumable resource, so that steps of one job share a node with srun --overlap
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        # the nodes' CPUs as declared below, not this machine's two (slurm.conf(5) config_overrides: "for testing")
        "SlurmdParameters=config_overrides",
        "MpiDefault=none",
        # what each task's environment gets on its node: the host's PATH and simulator variables, as SSH gives them
        f"TaskProlog={sdir / 'task_prolog'}",
        # sim only: SIGTERM to SIGKILL in 5 s (the default is 30)
        "KillWait=5",
        # a DOWN node that registers again is back in service
        "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "InactiveLimit=0",
        "MinJobAge=300",
        "SchedulerType=sched/backfill",
        # no mail here (the default, /bin/mail, is not installed: slurmctld logs an error)
        "MailProg=/bin/true",
    ]


def task_prolog(cdir: Path) -> str:
    """The TaskProlog: what it prints as ``export NAME=value`` is set in the
    task's environment (slurm.conf(5) TaskProlog). A task's environment is
    srun's (the login host's); on its node it gets the PATH and the variables
    an SSH session there gets (the host's bin directory first)."""
    hosts = shlex.quote(str(cdir / "hosts"))
    return (
        "#!/bin/sh\n# TaskProlog of a simulated cluster (sim/slurm.py)\n"
        # the node's hostname is its inventory name (its own UTS namespace)
        f"h=$(uname -n); d={hosts}/$h\n"
        'echo "export LLMDEPLOY_SIM_HOST=$h"\n'
        # in a pyxis container the host's folders are not there: the image's PATH stays
        f'[ -d "$d" ] || exit 0\n'
        f'echo "export PATH=$d/bin:{SYSTEM_PATH}"\n'
        'echo "export LLMDEPLOY_SIM_HOSTDIR=$d"\n'
    )


def munged_lines(cdir: Path, ddir: Path) -> list[str]:
    """Shell lines that start munged in a host (after its own /run is mounted):
    the cluster's one key, the socket at its default path in the host's /run,
    pid, log and seed in ``ddir``. --force: munged refuses root and
    directories writable by others without it (munged(8))."""
    q = lambda p: shlex.quote(str(p))  # noqa: E731
    return [
        f"mkdir -p -m 755 {os.path.dirname(MUNGE_SOCKET)}",
        # munged forks and returns once it serves (munged(8) without --foreground)
        f"munged --force --key-file={q(slurm_dir(cdir) / 'munge.key')} --socket={MUNGE_SOCKET} --pid-file={q(ddir / 'munged.pid')} "
        f"--log-file={q(ddir / 'munged.log')} --seed-file={q(ddir / 'munged.seed')}",
    ]


NODE_DIRS = ("spool", "tmp")


def node_path(sdir: Path, sub: str) -> Path:
    """The path every node sees its own ``sub`` folder at (SlurmdSpoolDir, TmpFS): ``<sdir>/node/<sub>``."""
    return sdir / "node" / sub


def host_lines(cluster: Cluster, cdir: Path, node_name: str, env: dict[str, str]) -> list[str]:
    """Shell lines of a host's script (inside its namespaces, after its /run
    and dockerd, before sshd): munged, then slurmd with the host's Slurm name
    (slurmd(8) -N), the environment of the host's SSH sessions."""
    if not cluster.slurm:
        return []
    node = next(n for n in cluster.nodes if n.name == node_name)
    lines = slurm_lines(cluster) + munged_lines(cdir, host_dir(cluster.name, node_name))
    sdir = slurm_dir(cdir)
    lines += [f"mount --bind {shlex.quote(str(sdir / 'nodes' / cluster.slurm_name(node) / sub))} {shlex.quote(str(node_path(sdir, sub)))}"
              for sub in NODE_DIRS]
    if pyxis(cluster):
        built = pyxis_build(cluster)
        # enroot where a site's package puts it, on the PATH of slurmd (pyxis runs
        # "enroot" from it), of tasks and SSH sessions, and of the job epilog, where
        # pyxis sets PATH=/usr/local/bin:/usr/bin:/bin (pyxis_slurmd.c job_epilog_fixup):
        # the build's bin folder over this machine's /usr/local/bin, in the host's
        # own mount namespace (a read-only overlay: both folders' files)
        lines.append(f"mount -t overlay overlay -o {shlex.quote(f'lowerdir={built.enroot_bin}:/usr/local/bin')} /usr/local/bin")
        lines.append(f"mount --bind {shlex.quote(str(enroot_etc(cdir)))} {shlex.quote(str(built.enroot_sysconf))}")
        # enroot makes none of its folders (mktemp in ENROOT_TEMP_PATH fails "No such file or directory")
        tmp = gpusite.enroot_dirs(ENROOT_NODE_DIR)["ENROOT_TEMP_PATH"]
        lines.append(f"mkdir -p -m 1777 {shlex.quote(str(tmp))}")
    assign = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    # slurmd forks into the background (slurmd(8) without -D)
    return [*lines, f"env {assign} slurmd -f {shlex.quote(str(conf_path(cdir)))} -N {shlex.quote(cluster.slurm_name(node))}"]


def prepare(cluster: Cluster, cdir: Path) -> None:
    """The files every Slurm daemon reads: munge key, slurm.conf, TaskProlog, the nodes' directories."""
    for tool in DAEMONS:
        if not os.path.exists(tool):
            raise SimError(f"{tool} is missing: run scripts/setup.sh (Debian's slurm-wlm and munge)")
    sdir = slurm_dir(cdir)
    (sdir / "ctld").mkdir(parents=True, exist_ok=True)
    for sub in NODE_DIRS:
        node_path(sdir, sub).mkdir(parents=True, exist_ok=True)  # where each host binds its own
        for node in cluster.nodes:
            (sdir / "nodes" / cluster.slurm_name(node) / sub).mkdir(parents=True, exist_ok=True)
    key = sdir / "munge.key"
    # a random key of 1024 bytes, readable by its owner only (mungekey(8) makes the same)
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(os.urandom(1024))
    conf_path(cdir).write_text(slurm_conf(cluster, cdir))
    # slurmd reads gres.conf and cgroup.conf from slurm.conf's folder (gres.conf(5), cgroup.conf(5))
    (sdir / "gres.conf").write_text(gres_conf(cluster))
    if constrained(cluster):
        (sdir / "cgroup.conf").write_text(cgroup_conf(automount_option=not current(cluster)))
    (sdir / "task_prolog").write_text(task_prolog(cdir))
    os.chmod(sdir / "task_prolog", 0o755)
    if pyxis(cluster):
        prepare_pyxis(cluster, cdir)


def prepare_pyxis(cluster: Cluster, cdir: Path) -> None:
    """plugstack.conf, and the cluster's enroot configuration: a copy of the
    build's etc/enroot (its hooks, mounts, environment) with the cluster's
    enroot.conf and the hardware state's mount."""
    built = pyxis_build(cluster)
    sdir = slurm_dir(cdir)
    scope = "global" if cluster.name in GLOBAL_SCOPE_SITES else "job"
    (sdir / "plugstack.conf").write_text(gpusite.plugstack_conf(built.pyxis_so, PYXIS_RUNTIME, scope))
    etc = enroot_etc(cdir)
    if etc.exists():
        shutil.rmtree(etc)
    shutil.copytree(built.enroot_sysconf, etc, symlinks=True)
    (etc / "enroot.conf").write_text(gpusite.enroot_conf(ENROOT_NODE_DIR, ssl_cert_file=images.trust_bundle()))
    (etc / "mounts.d" / "90-llmdeploy-sim.fstab").write_text(enroot_fstab(cdir))


def _run(*args: str) -> None:
    res = subprocess.run(list(args), capture_output=True, text=True)
    if res.returncode != 0:
        raise SimError(f"{shlex.join(args)} failed: {res.stderr.strip() or res.stdout.strip()}")


def _login_network(cluster: Cluster, ns: str, links: dict) -> None:
    """The login host's namespace: on the management bridge (mgmt0) and the data bridge (data0)."""
    data_ip, m_ip = login_ips(cluster)
    mv, dv = f"{links['mgmt_bridge']}L", f"{links['data_bridge']}L"
    _run("ip", "netns", "add", ns)
    _run("ip", "-n", ns, "link", "set", "lo", "up")
    for host_side, bridge, inside, ip in ((mv, links["mgmt_bridge"], "mgmt0", m_ip), (dv, links["data_bridge"], LOGIN_NIC, data_ip)):
        _run("ip", "link", "add", host_side, "type", "veth", "peer", "name", inside, "netns", ns)
        _run("ip", "link", "set", host_side, "master", bridge, "up")
        _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", inside)
        if inside == LOGIN_NIC:  # jumbo frames like the nodes' data NICs
            _run("ip", "-n", ns, "link", "set", inside, "mtu", "9000")
            _run("ip", "link", "set", host_side, "mtu", "9000")
        _run("ip", "-n", ns, "link", "set", inside, "up")


def start_login(cluster: Cluster, cdir: Path, state: dict, links: dict, hosts: str, save) -> dict:
    """Make the login host and start its munged, slurmctld and sshd (the
    slurm files first: prepare). Recorded in ``state["login"]`` (``save()``
    writes the state) before anything runs, so that down finds it."""
    prepare(cluster, cdir)
    name = login_name(cluster)
    ns, ldir = netns_name(cluster.name, name), cdir / "login"
    data_ip, m_ip = login_ips(cluster)
    ldir.mkdir(parents=True, exist_ok=True)
    state["login"] = {"name": name, "netns": ns, "dir": str(ldir), "mgmt_ip": m_ip, "data_ip": data_ip}
    save()
    _login_network(cluster, ns, links)
    _run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(ldir / "ssh_host_ed25519_key"))
    env = {"PATH": SYSTEM_PATH, "SLURM_CONF": str(conf_path(cdir))}
    (ldir / "sshd_config").write_text(sshd.sshd_config([m_ip, data_ip], ldir, cdir, env))
    (ldir / "hosts").write_text(hosts + f"{data_ip} {name}\n")
    (ldir / "bashrc").write_text("# ~/.bashrc of a simulated login host (sim/slurm.py)\n")
    users.private_dir(ldir / "operator-tmp")
    q = lambda p: shlex.quote(str(p))  # noqa: E731
    script = "\n".join([
        "set -e",
        f"hostname {shlex.quote(name)}",
        f"mount --bind {q(ldir / 'hosts')} /etc/hosts",
        *users.bind_lines(cdir),
        # the operator's folder in the login host's /var/tmp (the tool's per-user default there too)
        f"mount --bind {q(ldir / 'operator-tmp')} {q(users.operator_tmp())}",
        # bash sources ~/.bashrc for every SSH command: the login host's own,
        # as a node's (sim/cluster.py), not this machine's (a pyenv init there
        # made every command on the login host 100 ms longer: 105 ms against a
        # node's 8 ms for ``ssh login true`` over an open connection)
        f"if [ -f /root/.bashrc ]; then mount --bind {q(ldir / 'bashrc')} /root/.bashrc; fi",
        "mount -t tmpfs -o mode=755,size=64m tmpfs /run",
        "mkdir -p /run/sshd",
        *slurm_lines(cluster),
        *munged_lines(cdir, ldir),
        # slurmctld forks into the background (slurmctld(8) without -D)
        f"env SLURM_CONF={q(conf_path(cdir))} slurmctld -f {q(conf_path(cdir))}",
        # a login shell's memlock: every SSH session's, and so srun's (which Slurm gives the tasks unless told not to)
        f"ulimit -l {LOGIN_MEMLOCK_KIB}",
        f"exec {sshd.SSHD} -D -r -f {q(ldir / 'sshd_config')} -E {q(ldir / 'sshd.log')}",
    ])
    proc = subprocess.Popen(
        ["ip", "netns", "exec", ns, "unshare", "--mount", "--uts", "--propagation", "private", "--", "/bin/sh", "-c", script],
        stdin=subprocess.DEVNULL, stdout=open(ldir / "start.log", "w"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    state["login"]["pid"] = proc.pid
    save()
    return {"name": name, "mgmt_ip": m_ip, "proc": proc, "dir": ldir}


def login_exec(cdir: Path, pid: int, *cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """A command in the login host's namespaces (its /run: munge's socket), with SLURM_CONF."""
    return subprocess.run(["nsenter", "-t", str(pid), "-m", "-u", "-n", "env", f"SLURM_CONF={conf_path(cdir)}", *cmd],
                          capture_output=True, text=True, timeout=timeout)


def _tail(path: Path, n: int = 600) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "(no log)"


def wait_idle(cluster: Cluster, cdir: Path, pid: int, timeout: float = 60) -> None:
    """Until ``sinfo`` on the login host shows every node idle; a SimError with
    the daemons' logs if not within ``timeout`` seconds."""
    want = {cluster.slurm_name(n) for n in cluster.nodes}
    end = time.monotonic() + timeout
    out = ""
    while True:
        res = login_exec(cdir, pid, "sinfo", "-N", "-h", "-o", "%N %T")
        out = (res.stdout + res.stderr).strip()
        states = dict(line.split(None, 1) for line in res.stdout.splitlines() if len(line.split()) == 2)
        if res.returncode == 0 and all(states.get(n) == "idle" for n in want):
            return
        if time.monotonic() > end:
            break
        time.sleep(0.3)
    sdir = slurm_dir(cdir)
    bad = sorted(n for n in want if states.get(n) != "idle") if res.returncode == 0 else sorted(want)
    logs = "\n".join(f"--- slurmd {n}:\n{_tail(sdir / 'nodes' / n / 'slurmd.log')}" for n in bad[:2])
    raise SimError(f"Slurm on {cluster.name}: nodes not idle within {timeout:g}s (sinfo: {out or 'nothing'})\n"
                   f"--- slurmctld:\n{_tail(sdir / 'slurmctld.log')}\n--- login start:\n{_tail(cdir / 'login' / 'start.log', 300)}\n{logs}")
