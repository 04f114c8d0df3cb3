"""A simulated Slurm cluster (sim-b200-slurm): munged and slurmd on every host,
slurmctld on a login host reached over SSH; job steps run on their node (its
hostname, its Docker Engine), steps of a held job overlap, a drained node
shows its reason, GPUs are generic resources, pyxis runs steps in enroot
containers, and sim.down leaves nothing."""

import contextlib
import os
import json
import shlex
import shutil
import subprocess
import time
from pathlib import Path


import pytest

from transports.ssh.connect import make_connection
from llmdeploy.inventory import load_cluster
from launchers.slurm import pyxis
from sim import slurm as sim_slurm
from sim.paths import cluster_dir, netns_name
from tests.conftest import run_invoke, sim_pids

from .conftest import netns_list

SIM_CLUSTER = "sim-b200-slurm"
LOGIN = "sim-b200-slurm-login"
NODES = ["sim-b200-slurm-0", "sim-b200-slurm-1"]


def login(cmd: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """``cmd`` on the login host over SSH, with the cluster's ssh_config."""
    cfg = str(cluster_dir(SIM_CLUSTER) / "ssh_config")
    return subprocess.run(["ssh", "-F", cfg, "-o", "BatchMode=yes", LOGIN, cmd], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def ok(cmd: str, timeout: float = 60) -> str:
    res = login(cmd, timeout)
    assert res.returncode == 0, f"{cmd}: {res.stdout}{res.stderr}"
    return res.stdout


def sinfo() -> dict[str, str]:
    return dict(line.split(None, 1) for line in ok("sinfo -N -h -o '%N %T'").splitlines())


def _slurm_processes() -> list[str]:
    out = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if not line.startswith("Z")
            and any(w in line.split(None, 1)[-1].split()[0] for w in ("slurmd", "slurmctld", "slurmstepd", "munged"))
            and str(cluster_dir(SIM_CLUSTER)) in line]


def test_sim_slurm_cluster(sim_cluster):
    cdir = cluster_dir(SIM_CLUSTER)
    state = json.loads((cdir / "state.json").read_text())
    assert state["login"]["netns"] == f"lds-{SIM_CLUSTER}-{LOGIN}" and state["login"]["mgmt_ip"] == "198.18.25.250"
    assert sinfo() == {n: "idle" for n in NODES}
    # the project's own SSH runner reaches the login host with the inventory's settings; SLURM_CONF is sshd's
    cluster = load_cluster(SIM_CLUSTER)
    conn = make_connection(cluster, cluster.slurm.login_node())
    try:
        res = conn.run("hostname; echo $SLURM_CONF; srun --mpi=list", hide=True, in_stream=False)
    finally:
        conn.close()
    assert res.stdout.splitlines()[:2] == [LOGIN, str(cdir / "slurm" / "slurm.conf")]
    assert "pmix" in res.stdout
    # one task per node, each with its node's hostname
    assert sorted(ok("srun -N2 --ntasks-per-node=1 hostname").split()) == NODES
    # a step runs on its host: that host's dockerd, the PATH and variables SSH gives there
    assert ok(f"srun -w {NODES[1]} -N1 docker version --format '{{{{.Server.Version}}}}'").strip()
    env = ok(f"srun -w {NODES[1]} -N1 sh -c 'echo $LLMDEPLOY_SIM_HOST; command -v docker'").split()
    assert env == [NODES[1], str(cdir / "hosts" / NODES[1] / "bin" / "docker")]


@contextlib.contextmanager
def held_job(*options: str):
    """A batch job on both nodes that sleeps (``options``: sbatch's), running; cancelled afterwards."""
    job = ok(f"sbatch --parsable -N2 {' '.join(options)} --output=/dev/null --chdir=/ --wrap 'sleep 300'").strip()
    try:
        end = time.monotonic() + 30
        while ok(f"squeue -h -j {job} -o %T").strip() != "RUNNING":
            assert time.monotonic() < end, ok("squeue")
            time.sleep(0.3)
        yield job
    finally:
        login(f"scancel {job}")


def test_steps_overlap_in_a_held_job(sim_cluster):
    with held_job() as job:
        assert ok(f"srun --jobid={job} --overlap -w {NODES[1]} -N1 hostname").strip() == NODES[1]
        # two steps at once on the same node, while the batch step holds it:
        # each waits for the other's mark (one after the other, both would wait out their 20 s)
        mark = f"/tmp/lds-overlap-{os.getpid()}"
        step = ("srun --jobid={job} --overlap -w {node} -N1 sh -c 'touch {mark}.{me}; i=0; "
                "while [ ! -e {mark}.{other} ] && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done; "
                "[ -e {mark}.{other} ] && hostname'")
        a = step.format(job=job, node=NODES[0], mark=mark, me="a", other="b")
        b = step.format(job=job, node=NODES[0], mark=mark, me="b", other="a")
        try:
            out = ok(f"{a} & {b} & wait")
        finally:
            for f in (f"{mark}.a", f"{mark}.b"):
                if os.path.exists(f):
                    os.remove(f)
        assert out.split() == [NODES[0], NODES[0]]


def test_the_release_job_warns_in_node0s_audit_log_before_its_time_limit(sim_cluster):
    """The release's job as the tool submits it (sbatch_command), with a 3-minute limit: its batch step
    writes the warning into node 0's audit log end_warning_s (170 s) before the job's end (Slurm 25.11 sets
    SLURM_JOB_END_TIME, sbatch(1)), as a step of the job there; scancel ends it at once."""
    from launchers.slurm import commands as slurm
    from llmdeploy import lock, release
    from sim.paths import on_host

    c = load_cluster(SIM_CLUSTER)
    c = c.model_copy(update={"base_dir": f"/var/lib/llmdeploy/lds-warn-{os.getpid()}",
                             "slurm": c.slurm.model_copy(update={"time_limit": "3", "end_warning_s": 170})})
    rid = "20261207T000000Z-abcdef12"
    job = ok(slurm.sbatch_command(c, NODES, rid)).strip().split(";")[0]
    audit = on_host(SIM_CLUSTER, NODES[0], lock.audit_path(c))
    try:
        end = time.monotonic() + 60
        while not (audit.exists() and audit.read_text().strip()):
            assert time.monotonic() < end, ok("squeue --steps")
            time.sleep(0.5)
        ends = ok(f"squeue -h -j {job} -o %e").strip()
    finally:
        ok(slurm.scancel_job_command(job, 30), timeout=90)
    (rec,), problems = release.parse_lines(audit.read_text(), "audit log")
    assert problems == [] and (rec["command"], rec["result"], rec["job"], rec["release"]) == ("slurm.time-limit", "warning", job, rid), rec
    # the job's own end (squeue %e, local time here) and the line's, 170 s before it
    assert rec["ends"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.mktime(time.strptime(ends, "%Y-%m-%dT%H:%M:%S"))))
    assert 165 <= rec["time_left_s"] <= 171, rec
    assert ok(f"squeue -h -j {job} -o %T").strip() == ""
    shutil.rmtree(audit.parent.parent)


def test_a_world_s_tasks_follow_the_plan_s_node_order(sim_cluster):
    """srun sorts a plain --nodelist into Slurm's node order: a world over
    [node 1, node 0] would have rank 0 on node 0. The tool's world step
    (commands.step_shape_args: --distribution=arbitrary, a name per task)
    puts rank 0 on the plan's first node, here under PMIx as a world runs."""
    from launchers.slurm.commands import UnitStep, step_shape_args

    # the whole nodes, as a release's job holds them (a job's default is one CPU per node)
    with held_job("--exclusive") as job:
        show = "sh -c 'echo ${PMIX_RANK:-$SLURM_PROCID} $SLURMD_NODENAME'"
        plain = ok(f"srun --jobid={job} --overlap --nodes=2 --ntasks=4 --ntasks-per-node=2 --nodelist={NODES[1]},{NODES[0]} {show}")
        assert sorted(tuple(line.split()) for line in plain.splitlines())[0] == ("0", NODES[0]), plain
        world = UnitStep(node=NODES[1], name="w", script="", log="", nodes=[NODES[1], NODES[0]], tasks=2)
        out = ok(f"srun --jobid={job} --overlap {shlex.join(step_shape_args(world))} --mpi=pmix {show}")
        assert sorted(tuple(line.split()) for line in out.splitlines()) == [
            ("0", NODES[1]), ("1", NODES[1]), ("2", NODES[0]), ("3", NODES[0])], out


def test_drain_shows_the_reason(sim_cluster):
    ok(f"scontrol update nodename={NODES[1]} state=drain reason={shlex.quote('bad fan')}")
    try:
        out = ok(f"sinfo -N -h -n {NODES[1]} -o '%N %T %E'")
        assert out.split(None, 2) == [NODES[1], "drained", "bad fan\n"] or out.strip() == f"{NODES[1]} draining bad fan"
    finally:
        ok(f"scontrol update nodename={NODES[1]} state=resume")


def test_gpus_are_generic_resources_on_their_device_files(sim_cluster):
    """Each node declares its 8 GPUs as GRES on its own /dev/nvidiaN (gres.conf);
    a step that asks for two gets CUDA_VISIBLE_DEVICES for two, one that asks
    for all gets all, and one that asks for more than a node has is refused."""
    assert "Gres=gpu:8" in ok(f"scontrol show node {NODES[0]}")
    out = ok(f"srun -w {NODES[0]} -N1 --gres=gpu:2 sh -c 'echo $CUDA_VISIBLE_DEVICES; ls /dev | grep -c ^nvidia'")
    assert out.split() == ["0,1", "8"], out
    assert ok(f"srun -w {NODES[1]} -N1 --gres=gpu:8 sh -c 'echo $CUDA_VISIBLE_DEVICES'").strip() == "0,1,2,3,4,5,6,7"
    res = login(f"srun -w {NODES[1]} -N1 --gres=gpu:9 true")
    assert res.returncode != 0 and "Requested node configuration is not available" in res.stderr, res.stderr


@pytest.mark.skipif(not sim_slurm.constrained(load_cluster(SIM_CLUSTER)),
                    reason="this machine has no cgroup v1 devices and freezer hierarchies: the simulated site does not constrain devices")
def test_a_step_sees_only_the_gpus_it_asked_for(sim_cluster):
    """ConstrainDevices (task/cgroup, each host in its own cgroup namespace):
    a step's device cgroup denies the GPUs it did not ask for, and nvidia-smi,
    which lists the GPUs it can open, shows its own, numbered from 0; a step
    that asked for none sees none."""
    res = login(f"srun -w {NODES[0]} -N1 nvidia-smi -L")
    assert res.returncode != 0 and "No devices were found" in res.stdout, res.stdout + res.stderr
    out = ok(f"srun -w {NODES[0]} -N1 --gres=gpu:2 sh -c 'nvidia-smi --query-gpu=index,pci.bus_id --format=csv,noheader; "
             "(: <>/dev/nvidia5) 2>&1 || true'")
    lines = out.strip().splitlines()
    assert lines[:2] == ["0, 00000000:18:00.0", "1, 00000000:28:00.0"], out
    assert "Operation not permitted" in lines[2], out
    # the tool's steps ask for all of them: facts sees the node's eight
    assert len(ok(f"srun -w {NODES[0]} -N1 --gres=gpu:8 nvidia-smi -L").strip().splitlines()) == 8


def test_pyxis_runs_steps_in_enroot_containers(sim_cluster):
    """The simulated GPU site has pyxis and enroot: a step with
    --container-image runs in the image's container on its node (imported
    from the cluster's registry), with its node's simulated hardware, and a named
    container keeps its files between the steps of one job. This site keeps
    pyxis's default container_scope, global: the container outlives the
    job (what the tool's stop scripts remove for its own units)."""
    cluster = load_cluster(SIM_CLUSTER)
    image = shlex.quote(pyxis.image_uri(cluster.image.ref))
    assert "--container-image" in ok("srun --help")
    # the image's own files, the node's simulated hardware (what the serving stand-ins read), the image's PATH
    out = ok(f"srun -w {NODES[1]} -N1 --container-image={image} sh -c 'hostname; ls /opt/llmdeploy-sim >/dev/null && echo image; "
             "test -f /etc/llmdeploy-sim/node.json && echo hardware; echo $PATH'", timeout=600)
    assert out.split()[-4:] == [NODES[1], "image", "hardware", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"], out
    job = ok("salloc --no-shell -N1 -w {} 2>&1 | sed -n 's/.*Granted job allocation //p'".format(NODES[0])).strip()
    assert job.isdigit()
    try:
        named = f"srun --jobid={job} --overlap -w {NODES[0]} -N1 --container-image={image} --container-name=kept --container-writable"
        ok(f"{named} sh -c 'echo kept > /root/mark'", timeout=600)
        assert ok(f"srun --jobid={job} --overlap -w {NODES[0]} -N1 --container-name=kept cat /root/mark").strip() == "kept"
        listed = ok(f"srun --jobid={job} --overlap -w {NODES[0]} -N1 enroot list").split()
        # container_scope=global (pyxis's default, config.c; this site's plugstack.conf): the name is the container's own
        assert "pyxis_kept" in listed, listed
    finally:
        login(f"scancel {job}")
    # the job's end leaves it (pyxis's epilog removes only a job-scope container), until someone removes it
    assert "pyxis_kept" in ok(f"srun -w {NODES[0]} -N1 enroot list").split()
    ok(f"srun -w {NODES[0]} -N1 enroot remove -f pyxis_kept")
    assert "pyxis_kept" not in ok(f"srun -w {NODES[0]} -N1 enroot list").split()


def _ranks_of(job: str) -> dict[int, dict[str, str]]:
    """{PMIX_RANK: environment} of the trtllm-serve ranks of ``job`` on this
    machine (the simulated hosts share its process table; enroot makes no pid namespace)."""
    return {int(env["PMIX_RANK"]): env for env in _rank_pids(job).values()}


def _rank_pids(job: str) -> dict[str, dict[str, str]]:
    """{pid: environment} of the trtllm-serve processes of ``job``'s ranks (in this cluster's hosts:
    another simulated Slurm cluster numbers its jobs from 1 too)."""
    out = {}
    for pid in map(str, sorted(sim_pids(SIM_CLUSTER))):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            env = dict(v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace").split("\0") if "=" in v)
        except OSError:
            continue
        if b"trtllm-serve" in cmd[:6] and env.get("SLURM_JOB_ID") == job and "PMIX_RANK" in env:
            out[pid] = env
    return out


def test_trtllm_world_is_one_pmix_step_in_pyxis_containers(sim_cluster):
    """trtllm-serve TP16 as TensorRT-LLM documents it for Slurm: one ``srun
    --mpi=pmix`` step of 16 tasks over both nodes, each running
    ``trtllm-llmapi-launch trtllm-serve`` in the node's enroot container:
    the world forms through Slurm alone (no mpirun, no SSH between nodes),
    each rank sees its node's 8 GPUs (CUDA_VISIBLE_DEVICES from Slurm), and
    killing one node's tasks ends the step and leaves no rank anywhere."""
    cluster = load_cluster(SIM_CLUSTER)
    image = shlex.quote(pyxis.image_uri(cluster.image.ref))
    job = ok("sbatch --parsable -N2 --exclusive --gres=gpu:8 --output=/dev/null --wrap='exec sleep infinity'").strip()
    assert job.isdigit()
    try:
        ok(f"for i in $(seq 100); do [ \"$(squeue -h -j {job} -o %T)\" = RUNNING ] && exit 0; sleep 0.2; done; exit 1")
        world = (f"srun --jobid={job} --overlap -N2 --ntasks-per-node=8 --gres=gpu:8 --mpi=pmix --kill-on-bad-exit=1 "
                 f"--container-image={image} --container-mounts={cluster.cache_dir}:{cluster.cache_dir} --container-name=world --job-name=world "
                 f"trtllm-llmapi-launch trtllm-serve {shlex.quote(cluster.model.path)} --host 0.0.0.0 --port 8000 --tp_size 16")
        ok(f"setsid nohup {world} > /tmp/world-{job}.log 2>&1 < /dev/null &")
        health = (f"for i in $(seq 300); do c=$(curl -s -o /dev/null -w '%{{http_code}}' http://{NODES[0]}:8000/health); "
                  "[ \"$c\" = 200 ] && exit 0; sleep 0.5; done; exit 1")
        assert login(health, timeout=200).returncode == 0, ok(f"tail -n 30 /tmp/world-{job}.log")
        steps = ok(f"squeue -h --steps -j {job} -o '%i|%j|%N'").split()
        assert f"{job}.0|world|sim-b200-slurm-[0-1]" in steps, steps
        assert " Tasks=16 " in ok(f"scontrol show step {job}.0")
        ranks = _ranks_of(job)
        assert sorted(ranks) == list(range(16)), sorted(ranks)
        for rank, env in ranks.items():
            # block distribution: ranks 0-7 on node 0, 8-15 on node 1, each with its node's 8 GPUs
            assert env["SLURMD_NODENAME"] == NODES[rank // 8] and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7", (rank, env)
        # node 1's slurmstepd children (its 8 tasks) killed: --kill-on-bad-exit ends the world's other ranks
        # the slurmstepd of node 1's part of the step: the ancestor of rank 8's process
        pid = next(p for p, env in _rank_pids(job).items() if env["PMIX_RANK"] == "8")
        while not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(f"slurmstepd: [{job}.0]".encode()):
            pid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            assert pid != "1", "rank 8 has no slurmstepd above it"
        children = subprocess.run(["pgrep", "-P", pid], capture_output=True, text=True).stdout.split()
        assert children
        subprocess.run(["kill", "-9", *children])
        end = time.monotonic() + 60
        while (_ranks_of(job) or f"{job}.0" in ok(f"squeue -h --steps -j {job} -o %i")) and time.monotonic() < end:
            time.sleep(0.5)
        assert _ranks_of(job) == {}, sorted(_ranks_of(job))
        assert f"{job}.0" not in ok(f"squeue -h --steps -j {job} -o %i")
    finally:
        login(f"scancel {job}; rm -f /tmp/world-{job}.log")
    # this site keeps pyxis's global scope: the named container outlives the job on both nodes, until it is removed
    # (as the tool's stop scripts remove its own units')
    for n in NODES:
        assert "pyxis_world" in ok(f"srun -w {n} -N1 enroot list").split()
        ok(f"srun -w {n} -N1 enroot remove -f pyxis_world")
        assert "pyxis_world" not in ok(f"srun -w {n} -N1 enroot list").split()


def _ssh_from(host: str, to: str, address: str | None = None) -> subprocess.CompletedProcess:
    """``ssh <to> true`` run on simulated host ``host`` (its network namespace), with the cluster's key and ssh_config
    (``address``: the address to connect to instead of ``to``'s in the ssh_config, its host key still ``to``'s)."""
    state = json.loads((cluster_dir(SIM_CLUSTER) / "state.json").read_text())
    netns = state["login"]["netns"] if host == LOGIN else netns_name(SIM_CLUSTER, host)
    cfg = str(cluster_dir(SIM_CLUSTER) / "ssh_config")
    where = ["-o", f"HostName={address}", "-o", f"HostKeyAlias={to}"] if address else []
    return subprocess.run(["ip", "netns", "exec", netns, "ssh", "-F", cfg, "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", *where, to, "true"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_compute_nodes_refuse_ssh_from_one_another(sim_cluster):
    """As on a site without pam_slurm_adopt: a compute node's sshd refuses the
    other compute nodes (by the management and the data address) and the
    login host, while its steps still run (invoke check's commands are steps
    too: test_slurm_b200)."""
    cluster = load_cluster(SIM_CLUSTER)
    refused = _ssh_from(NODES[0], NODES[1])
    assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused
    refused = _ssh_from(NODES[1], NODES[0], str(cluster.nodes[0].ip))  # the data network too
    assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused
    refused = _ssh_from(LOGIN, NODES[1])
    assert refused.returncode == 255 and "Permission denied" in refused.stderr, refused
    assert ok(f"srun -N1 -w {NODES[1]} hostname").strip() == NODES[1]


def test_down_leaves_nothing(sim_cluster):
    assert run_invoke("sim.down", "--cluster", SIM_CLUSTER).returncode == 0
    assert f"lds-{SIM_CLUSTER}-" not in netns_list()
    assert not cluster_dir(SIM_CLUSTER).exists()
    end = time.monotonic() + 5
    while _slurm_processes() and time.monotonic() < end:
        time.sleep(0.1)
    assert _slurm_processes() == []
    assert not list(Path("/root").glob("slurm-*.out"))
