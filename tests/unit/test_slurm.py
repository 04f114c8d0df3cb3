"""The Slurm launcher's text: inventory checks, the dispatch (run here by bash
as each task of a step would run it), sinfo and squeue readers, the command
lines (launchers/slurm/commands.py)."""

import contextlib
import dataclasses
import json
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from llmdeploy.container import ContainerSpec
from llmdeploy.errors import InventoryError, LlmdeployError
from llmdeploy.inventory import Cluster, load_cluster
from launchers.slurm import commands as slurm
from flows.binding import bind
from tests.unit.test_pyxis_units import until


@pytest.fixture(scope="module")
def b200():
    return load_cluster("sim-b200-slurm")


def _with(cluster, **slurm_fields):
    d = cluster.model_dump()
    d["slurm"] = {**d["slurm"], **slurm_fields}
    return Cluster.model_validate(d)


def test_inventory_names_what_contradicts(b200):
    with pytest.raises(ValueError) as err:
        _with(b200, nodelist=["n1"])
    assert "slurm.nodelist" in str(err.value) and "2" in str(err.value)
    with pytest.raises(ValueError) as err:
        _with(b200, login="sim-b200-slurm-0")
    assert "slurm.login" in str(err.value)
    d = b200.model_dump()
    d["image"]["tarball"] = "/srv/images/trtllm.tar"
    d["slurm"]["container"] = "pyxis"
    with pytest.raises(ValueError) as err:
        Cluster.model_validate(d)
    assert "slurm.container" in str(err.value)
    # NVIDIA's default is pyxis, Docker stays possible; Ascend's units run with Docker only
    assert _with(b200, container=None).slurm.container == "pyxis" and _with(b200, container="docker").slurm.container == "docker"
    a3 = load_cluster("sim-a3-slurm")
    assert a3.slurm.container == "docker"
    with pytest.raises(ValueError) as err:
        _with(a3, container="pyxis")
    assert "slurm.container" in str(err.value) and "'pyxis': a3's units run under Slurm with 'docker'" in str(err.value)
    for field, value in (("partition", "gpu;rm -rf /"), ("time_limit", "two days"), ("account", "a b")):
        with pytest.raises(ValueError) as err:
            _with(b200, **{field: value})
        assert field in str(err.value)
    ok = _with(b200, nodelist=["gpu-a", "gpu-b"], account="llm", reservation="maint-1", time_limit="2-00:00:00")
    assert ok.slurm_name(ok.nodes[1]) == "gpu-b"


def test_inventory_file_problem_names_the_field(tmp_path):
    (tmp_path / "bad.py").write_text(
        "from inventory.sim_b200_slurm import cluster as base\n"
        "from llmdeploy.inventory import Cluster\n"
        "d = base.model_dump(); d['name'] = 'bad'; d['slurm'].pop('partition')\n"
        "cluster = Cluster.model_validate(d)\n")
    from llmdeploy.inventory import load_cluster_file

    with pytest.raises(InventoryError) as err:
        load_cluster_file(tmp_path / "bad.py")
    assert "slurm.partition" in str(err.value)


def _task(node: str, data: bytes) -> str:
    """DISPATCH as srun runs it in one task on ``node`` (srun --label adds "N: ")."""
    res = subprocess.run(["bash", "-c", slurm.DISPATCH], input=data, capture_output=True, env={"SLURMD_NODENAME": node, "PATH": "/usr/bin:/bin"})
    assert res.returncode == 0, res.stderr
    return "".join(f"{i}: {line}\n" for i, line in enumerate(res.stdout.decode().splitlines()))


def test_dispatch_runs_each_nodes_own_command_with_its_stdin():
    per_node = {
        "n0": ("echo out-$(hostname -s >/dev/null; echo n0); echo err >&2; exit 3", None),
        "n1": ("cat; printf 'no newline'", b"file content\n\x00binary\xff"),
        "n2": ("echo out-$(hostname -s >/dev/null; echo n0); echo err >&2; exit 3", None),
    }
    data = slurm.payload(per_node, 30)
    # the same command for n0 and n2 travels once
    assert data.count(b"#blob ") == 3 + 1
    out = "".join(_task(n, data) for n in ("n1", "n0", "n2", "n9"))
    got = slurm.parse_dispatch(out)
    assert got["n0"].code == 3 and got["n0"].stdout == "out-n0\n" and got["n0"].stderr == "err\n"
    assert got["n1"].code == 0 and got["n1"].stdout.startswith("file content\n") and got["n1"].stdout.endswith("no newline")
    assert got["n2"] == got["n0"]
    # a node the payload does not name answers nothing to do
    assert got["n9"].code == 0 and got["n9"].stdout == ""


def test_dispatch_deadline_is_exit_124():
    data = slurm.payload({"n0": ("sleep 5", None)}, 1)
    got = slurm.parse_dispatch(_task("n0", data))
    assert got["n0"].code == 124


def test_a_task_without_record_reads_as_srun_said():
    out = "0: @@lds-rc n0 0\n0: @@lds-end n0\n"
    err = ("srun: error: sim-b200-slurm-1: task 1: Exited with exit code 1\n"
           "srun: error: Unable to create step for job 12: Requested node configuration is not available\n")
    got = slurm.parse_dispatch(out)
    assert set(got) == {"n0"}
    assert "Requested node configuration is not available" in slurm.srun_problem(out, err, 1)


def test_sinfo_states_name_drained_and_not_responding_nodes():
    out = ("a|idle|none\n"
           "b|drained|bad fan\n"
           "c|mixed|none\n"
           "d|idle*|Not responding\n"
           "e|allocated|none\n"
           "f|draining|kernel upgrade\n"
           "g|down*|Node unexpectedly rebooted\n")
    st = slurm.parse_sinfo(out, list("abcdefgh"))
    usable = {n for n, s in st.items() if s.usable}
    # a draining node still runs its job's steps, but no new job gets it
    assert usable == {"a", "c", "e", "f"}
    assert {n for n, s in st.items() if s.schedulable} == {"a", "c", "e"}
    assert st["b"].describe() == "Slurm reports b drained (reason: bad fan)"
    assert "not responding" in st["d"].describe()
    assert "kernel upgrade" in st["f"].describe()
    assert "no such node" in st["h"].describe()


def test_squeue_finds_the_release_job_and_its_steps():
    out = ("41|llmdeploy.sim-a3.cmd-1a2b|RUNNING|None|x|4:00:00|2026-12-04T19:00:00\n"
           "42|llmdeploy.sim-b200-slurm.r20261204-1|RUNNING|None|sim-b200-slurm-[0-1]|1-00:00:00|2026-12-05T15:00:00\n"
           "43|llmdeploy.sim-b200-slurm.cmd-9f8e|PENDING|Resources||4:00:00|N/A\n"
           "44|someone-else|RUNNING|None|n9\n"
           "step 42.0|trtllm-worker|sim-b200-slurm-1\n"
           "step 42.1|trtllm-serve|sim-b200-slurm-0\n"
           "step 44.0|x|n9\n")
    jobs = slurm.parse_squeue(out, "sim-b200-slurm")
    assert [j.id for j in jobs] == ["42", "43"]
    job = slurm.release_job(jobs, "sim-b200-slurm")
    assert job.id == "42" and slurm.release_of_job("sim-b200-slurm", job.name) == "r20261204-1"
    assert job.step_named("trtllm-serve") == "42.1" and job.step_named("trtllm-serve", "sim-b200-slurm-1") is None
    assert job.time_limit == "1-00:00:00" and job.end == "2026-12-05T15:00:00" and job.time_left == ""
    (left,) = slurm.parse_squeue("42|llmdeploy.c.r1|RUNNING|None|n1|1-00:00:00|2026-12-05T15:00:00|23:59:12\n", "c")
    assert left.time_left == "23:59:12" and slurm.slurm_seconds(left.time_left) == 86352
    assert slurm.release_of_job("sim-b200-slurm", "llmdeploy.sim-b200-slurm.cmd-9f8e") is None
    assert slurm.release_job(jobs, "sim-b200-slurm", "r-other") is None


def test_command_lines_quote_and_carry_the_sites_choices(b200):
    c = _with(b200, account="llm", reservation="maint-1")
    line = slurm.salloc_command(c, ["sim-b200-slurm-0", "sim-b200-slurm-1"], slurm.command_job_name(c.name, "1a2b"))
    args = shlex.split(line)
    assert args[:2] == ["salloc", "--no-shell"]
    assert {"--partition=gpu", "--account=llm", "--reservation=maint-1", "--time=4:00:00",
            "--nodelist=sim-b200-slurm-0,sim-b200-slurm-1", "--nodes=2"} <= set(args)
    sb = shlex.split(slurm.sbatch_command(c, ["sim-b200-slurm-0", "sim-b200-slurm-1"], "r1"))
    assert "--job-name=llmdeploy.sim-b200-slurm.r1" in sb and sb[-1] == f"--wrap={slurm.batch_script(c, 'r1')}"
    # nodes whole, with all their memory: a site that counts memory gives --exclusive only what is asked for
    for allocation in (args, sb):
        assert "--exclusive" in allocation and "--mem=0" in allocation, allocation
        assert not [a for a in allocation if a.startswith(("--mem-per", "--mem=")) and a != "--mem=0"], allocation
    srun = shlex.split(slurm.srun_dispatch_command(c, "42", ["a", "b"], "prepare: image; digest"))
    assert srun[:4] == ["srun", "--jobid=42", "--overlap", "--nodes=2"] and "--ntasks-per-node=1" in srun and "--label" in srun
    assert "--job-name=prepare-image-digest" in srun and srun[-3:-1] == ["bash", "-c"]


def test_every_job_and_step_asks_for_the_nodes_accelerators_as_gres(b200):
    names = ["sim-b200-slurm-0", "sim-b200-slurm-1"]
    units = [slurm.UnitStep(node=n, name="u", script="true", log=f"/l/{n}") for n in names]

    def lines(c):
        return {"salloc": shlex.split(slurm.salloc_command(c, names, "j")), "sbatch": shlex.split(slurm.sbatch_command(c, names, "r1")),
                "dispatch": shlex.split(slurm.srun_dispatch_command(c, "42", names, "facts")),
                "one": shlex.split(slurm.srun_one_command(c, "42", names[0], "logs", "true")),
                "units": shlex.split(slurm.start_units_script(c, "42", units, 30).split("setsid nohup ", 1)[1].split(" >", 1)[0])}

    # the platform's 8 GPUs per node, by the vendor's word for them; steps too (srun(1): a step does
    # not inherit the GRES an exclusive job got)
    for what, args in lines(b200).items():
        assert "--gres=gpu:8" in args, (what, args)
    a3 = load_cluster("sim-a3-slurm")
    assert "--gres=npu:16" in shlex.split(slurm.salloc_command(a3, ["sim-a3-slurm-0"], "j"))
    # a site that names them otherwise, or asks for fewer, or has no GRES for them
    assert "--gres=h100:4" in lines(_with(b200, gres="h100", gres_per_node=4))["dispatch"]
    assert all(not any(a.startswith("--gres") for a in args) for args in lines(_with(b200, gres_per_node=0)).values())
    # nodes with fewer devices (the inventory's node.devices): one count for every step, the fewest
    # (model_copy: the profile's TP would not validate against 12 GPUs; only the count matters here)
    mixed = b200.model_copy(update={"nodes": [b200.nodes[0], b200.nodes[1].model_copy(update={"devices": 4})]})
    assert slurm.gres_args(mixed) == ["--gres=gpu:4"]
    with pytest.raises(ValueError) as err:
        _with(b200, gres="gpu:8")
    assert "gres" in str(err.value)


def test_unit_step_holds_its_container_and_reports_its_exit(tmp_path):
    """The step body with a fake docker: it starts, says so, and ends with the container's exit code."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "docker").write_text("#!/bin/bash\ncase $1 in wait) sleep 0.2; echo 7 ;; stop) echo stopped >> %s/stops ;; esac\n" % tmp_path)
    (bin_ / "docker").chmod(0o755)
    body = slurm.unit_step_body("echo starting\n", "unit-a", 5)
    res = subprocess.run(["bash", "-c", body], capture_output=True, text=True, env={"PATH": f"{bin_}:/usr/bin:/bin"})
    assert res.returncode == 7
    assert f"{slurm.STARTED_MARK} unit-a" in res.stdout and "@@llmdeploy-exit 7" in res.stdout
    # SIGTERM (scancel of the step) stops the container first
    p = subprocess.Popen(["bash", "-c", body.replace("sleep 0.2", "sleep 30")], stdout=subprocess.PIPE, text=True,
                         env={"PATH": f"{bin_}:/usr/bin:/bin"})
    assert slurm.STARTED_MARK in p.stdout.readline() + p.stdout.readline()
    p.terminate()
    assert p.wait(10) == 143
    assert (tmp_path / "stops").read_text() == "stopped\n"


def test_steps_end_last_started_first_with_sigterm_then_scancel():
    text = slurm.scancel_steps_command(["42.3", "42.1"], 65)
    assert text.index("--signal=TERM 42.3") < text.index("scancel 42.3") < text.index("--signal=TERM 42.1")
    assert "end=$((SECONDS + 65))" in text


def test_start_units_script_reports_each_node_of_one_worlds_same_named_units(b200):
    units = [slurm.UnitStep(node=n, name="sim-b200-slurm-r1", script="true", log=f"/var/log/x/{n}.sim-b200-slurm-r1.attempt-1.step.log")
             for n in ("sim-b200-slurm-0", "sim-b200-slurm-1")]
    text = slurm.start_units_script(b200, "42", units, 30)
    # one log per node, a result line keyed by node and unit
    assert text.count("setsid nohup srun --jobid=42 --overlap") == 2 and len({u.log for u in units}) == 2
    got = slurm.parse_started("started sim-b200-slurm-0/sim-b200-slurm-r1\nfailed sim-b200-slurm-1/sim-b200-slurm-r1 srun: error: x\n")
    assert got == {"sim-b200-slurm-0/sim-b200-slurm-r1": "", "sim-b200-slurm-1/sim-b200-slurm-r1": "srun: error: x"}


RID = "20261205T101010Z-0123abcd"


def _pyxis_plan(cluster):
    import systems

    return systems.build(bind(cluster), {}, RID, None)


@pytest.mark.parametrize("name", ["sim-b200-slurm", "sim-gb300-1p2d-slurm", "sim-h200-sglang-slurm"])
def test_a_pyxis_release_recorded_before_specs_starts_the_same_steps(name):
    """A release whose plan.json was written before units carried container
    specs (each unit's docker run line only) still restarts and rolls back on
    pyxis: its lines read back into the specs a plan of today has, so its
    steps are the ones a fresh plan's are. A line this tool never wrote
    leaves the unit without a spec, and the launcher names it and what to do."""
    from llmdeploy.container import docker_run
    from launchers.slurm.jobs import plan_steps
    from llmdeploy.releaseplan import ReleasePlan

    c = load_cluster(name)
    plan = _pyxis_plan(c)
    doc = json.loads(plan.to_json())
    for svc in doc["services"]:
        for u in svc["units"]:
            # what the plan.json of a release before the change had: the unit's docker run line, no spec
            u["show"]["container_command"] = shlex.join(docker_run(ContainerSpec.from_dict(u.pop("spec"))))
    old = ReleasePlan.from_json(json.dumps(doc))

    def steps(p):
        return [(s, [u.host for u in us]) for s, us in plan_steps(c, p, p.units(), lambda u: "", lambda u: 1)]

    assert steps(old) == steps(plan) and steps(plan)
    doc["services"][0]["units"][0]["show"]["container_command"] = "docker run --entrypoint /x img"
    unreadable = ReleasePlan.from_json(json.dumps(doc))
    with pytest.raises(LlmdeployError, match=f"release {plan.release}'s plan has no container spec for it \\(its recorded command: "
                                             f"docker run option --entrypoint is not one this tool writes\\): deploy it again"):
        plan_steps(c, unreadable, unreadable.units(), lambda u: "", lambda u: 1)


def test_a_pyxis_trtllm_world_is_one_pmix_step_of_every_rank(b200):
    """On pyxis (the NVIDIA default), trtllm-serve's world is planned as one
    launch: both nodes' units the same container line, 8 tasks each, every
    task running task.sh (the node's merge, then trtllm-llmapi-launch
    trtllm-serve); the launcher makes that one ``srun --mpi=pmix`` step of
    16 tasks in pyxis containers, no mpirun, no SSH files mounted."""
    from launchers.slurm.jobs import SlurmJobs

    assert b200.slurm.container == "pyxis"
    plan = _pyxis_plan(b200)
    (svc,) = plan.services
    assert svc.world and svc.restart == "group" and [u.tasks for u in svc.units] == [8, 8] and {u.order for u in svc.units} == {0}
    lines = {u.show["container_command"] for u in svc.units}
    assert len(lines) == 1 and "/root/.ssh" not in lines.pop()
    rd = f"/var/tmp/llmdeploy-ops/lib/sim-b200-slurm/releases/{RID}"
    task = plan.files["sim-b200-slurm-1"]["task.sh"][0]
    assert "exec trtllm-llmapi-launch trtllm-serve /home/ops/.cache/huggingface/hub/Qwen3.8-2.4T-A95B-FP8 --host 0.0.0.0 --port 8000" in task
    assert f'mv -f "$tmp" {rd}/config.yaml' in task and "mpirun" not in task
    assert "serve.sh" not in plan.files["sim-b200-slurm-0"] and "mpi-agent.sh" not in plan.files["sim-b200-slurm-0"]
    steps = SlurmJobs(b200, type("R", (), {"transport": None})(), print).unit_steps(plan, plan.units(), lambda u: "", lambda u: 1)
    assert len(steps) == 1 and len(steps[0][1]) == 2
    text = slurm.start_units_script(b200, "42", [steps[0][0]], 30)
    srun = shlex.split(text.split("setsid nohup ", 1)[1].split(f" > {shlex.quote(steps[0][0].log)} 2>&1", 1)[0])
    # the inventory's slurm.propagate_limits = False: the tasks get slurmd's limits, not the login shell's
    assert srun[:9] == ["srun", "--jobid=42", "--overlap", "--ntasks=16", "--distribution=arbitrary",
                        "--nodelist=" + ",".join(["sim-b200-slurm-0"] * 8 + ["sim-b200-slurm-1"] * 8), "--gres=gpu:8",
                        "--propagate=NONE", f"--job-name=sim-b200-slurm-{RID}"]
    assert "--mpi=pmix" in srun and "--container-image=nvcr.io#nvidia/tensorrt-llm/release:1.4.0rc1" in srun
    # named for its start (attempt 1): a later start never reuses this one's writable root
    assert f"--container-name={RID}.sim-b200-slurm-{RID}.1" in srun and srun[-2:] == ["sh", f"{rd}/task.sh"]
    again = SlurmJobs(b200, type("R", (), {"transport": None})(), print).unit_steps(plan, plan.units(), lambda u: "", lambda u: 2)
    assert f"--container-name={RID}.sim-b200-slurm-{RID}.2" in again[0][0].args
    # the world has started when both nodes' first tasks said so
    assert f"2:sim-b200-slurm-0/sim-b200-slurm-{RID}=" in text


def test_a_docker_trtllm_world_stays_mpirun_from_node_0(b200):
    docker = _with(b200, container="docker")
    plan = _pyxis_plan(docker)
    (svc,) = plan.services
    assert not svc.world and [u.tasks for u in svc.units] == [1, 1] and [u.order for u in svc.units] == [1, 0]
    assert svc.units[0].show["serve_command"].startswith("mpirun ") and "serve.sh" in plan.files["sim-b200-slurm-0"]


def test_step_shapes_and_host_lists():
    one = slurm.UnitStep(node="n0", name="u", script="true", log="/l")
    assert slurm.step_shape_args(one) == ["--nodes=1", "--ntasks=1", "--nodelist=n0"]
    # a world's tasks in the plan's node order, a name per task (srun would sort a plain list into Slurm's order)
    world = slurm.UnitStep(node="n2", name="u", script="", log="/l", nodes=["n2", "n0", "n1"], tasks=2)
    # no --nodes beside it: Slurm 23.11 and later refuse the pair, and srun counts the list's distinct names
    assert slurm.step_shape_args(world) == ["--ntasks=6", "--distribution=arbitrary", "--nodelist=n2,n2,n0,n0,n1,n1"]
    group = slurm.UnitStep(node="n0", name="u", script="", log="/l", nodes=["n0"], tasks=4)
    assert slurm.step_shape_args(group) == ["--nodes=1", "--ntasks=4", "--ntasks-per-node=4", "--nodelist=n0"]
    assert slurm.expand_hostlist("gpu-[00-02,5],login") == ["gpu-00", "gpu-01", "gpu-02", "gpu-5", "login"]
    job = slurm.Job(id="3", name="j", state="RUNNING", reason="", nodes="n-[0-1]", steps={"3.5": ("w", "n-[0-1]")})
    assert job.step_named("w", "n-1") == "3.5" and job.step_named("w", "n-2") is None


def test_the_end_of_a_step_is_srun_s_own_words(tmp_path):
    log = tmp_path / "n0.w.attempt-2.step.log"
    (tmp_path / "n0.w.attempt-1.step.log").write_text("srun: error: n0: task 1: Killed\n")
    log.write_text("@@llmdeploy-started w\nsrun: error: n0: task 0: Exited with exit code 137\nsrun: error: n1: tasks 8-15: Killed\n")
    import os
    os.utime(tmp_path / "n0.w.attempt-1.step.log", (1, 1))
    out = subprocess.run(["sh", "-c", slurm.step_end_command(str(tmp_path), "w")], capture_output=True, text=True).stdout
    assert out.splitlines() == ["srun: error: n0: task 0: Exited with exit code 137", "srun: error: n1: tasks 8-15: Killed"]
    assert subprocess.run(["sh", "-c", slurm.step_end_command(str(tmp_path), "other")], capture_output=True, text=True).stdout == ""


def test_a_world_is_one_pmix_step_with_each_nodes_variables(b200, tmp_path):
    """Transport.world on Slurm: one srun --mpi=pmix over the nodes, tasks per
    node, GRES; each task sets its node's variables (by SLURMD_NODENAME), run
    here by bash as a task would run it."""
    text = slurm.world_command(b200, "42", ["sim-b200-slurm-0", "sim-b200-slurm-1"], 8, ["all_reduce_perf", "-b", "8"],
                               {"sim-b200-slurm-0": {"NCCL_SOCKET_IFNAME": "ens1f0"}, "sim-b200-slurm-1": {"NCCL_SOCKET_IFNAME": "a b;$(x)"}})
    args = shlex.split(text.removesuffix(" < /dev/null"))
    assert args[:7] == ["srun", "--jobid=42", "--overlap", "--ntasks=16", "--distribution=arbitrary",
                        "--nodelist=" + ",".join(["sim-b200-slurm-0"] * 8 + ["sim-b200-slurm-1"] * 8), "--gres=gpu:8"]
    assert "--mpi=pmix" in args and "--kill-on-bad-exit=1" in args and args[-3:] == ["all_reduce_perf", "-b", "8"]
    i = args.index("bash")
    script, argv = args[i + 2], args[i + 3:]
    for node, want in (("sim-b200-slurm-0", "ens1f0"), ("sim-b200-slurm-1", "a b;$(x)")):
        res = subprocess.run(["bash", "-c", script, *argv[:1], "printenv", "NCCL_SOCKET_IFNAME"], capture_output=True, text=True,
                             env={"SLURMD_NODENAME": node, "PATH": "/usr/bin:/bin"})
        assert res.stdout == want + "\n", res
    with pytest.raises(ValueError):
        slurm.world_command(b200, "42", ["n0"], 1, ["x"], {"n0": {"A;B": "1"}})


def test_deploy_check_prints_each_steps_srun_line(b200):
    """deploy --check on a pyxis cluster: the world's one step, its exact
    srun line (the release's job as JOB), read from no node; SSH clusters have none."""
    from flows import deploy

    _, chash, plan = deploy.plan_release(bind(b200), {}, b200.image.ref)
    doc = deploy.check_doc(bind(b200), plan, chash, [])
    (step,) = doc["launch_steps"]
    assert step["what"] == f"world: sim-b200-slurm-{plan.release} on sim-b200-slurm-0, sim-b200-slurm-1"
    assert step["command"].startswith("srun --jobid=JOB --overlap --ntasks=16 --distribution=arbitrary ") and "--mpi=pmix" in step["command"]
    ssh = load_cluster("sim-b200")
    _, chash, plan = deploy.plan_release(bind(ssh), {}, ssh.image.ref)
    assert "launch_steps" not in deploy.check_doc(bind(ssh), plan, chash, [])


def test_each_unit_asks_for_the_accelerators_it_uses():
    """Per-unit GRES: Dynamo's etcd, NATS and frontend use no GPU and ask for
    none (under ConstrainDevices their steps see none); its workers ask for
    the node's 4, on pyxis and on docker alike."""
    from launchers.slurm.jobs import plan_steps

    pyxis = load_cluster("sim-gb300-1p2d-slurm")
    for c in (pyxis, _with(pyxis, container="docker")):
        plan = _pyxis_plan(c)
        gres = {}
        for svc in plan.services:
            for step, _ in plan_steps(c, plan, svc.units, lambda u: "true\n", lambda u: 1):
                gres.setdefault(svc.name, []).append([a for a in slurm.unit_srun_args(c, "42", step) if a.startswith("--gres")])
        assert gres["etcd"] == gres["nats"] == gres["frontend"] == [[]], (c.slurm.container, gres)
        # pyxis: decode0 one step over its two nodes; docker: a step per node's container
        assert gres["prefill0"] == [["--gres=gpu:4"]], gres
        assert gres["decode0"] == [["--gres=gpu:4"]] * (1 if c.slurm.container == "pyxis" else 2), (c.slurm.container, gres)
    assert slurm.gres_args(pyxis, 2) == ["--gres=gpu:2"] and slurm.gres_args(pyxis, 9) == ["--gres=gpu:4"]


def test_dynamo_worker_groups_on_pyxis_are_one_pmix_step_each():
    """Dynamo on pyxis (sim-gb300-1p2d-slurm, NVIDIA's default): every worker
    group is one ``srun --mpi=pmix`` step over its nodes, a task per GPU,
    each running its node's task.sh (the seed's setup, the per-task merge,
    then ``trtllm-llmapi-launch python3 -m dynamo.trtllm``), as Dynamo
    documents for multi-node TensorRT-LLM workers on Slurm: no mpirun, no
    hostfile, no launch agent, no SSH files. On docker the same cluster keeps
    mpirun from the group's first container."""
    from launchers.slurm.jobs import plan_steps

    c = load_cluster("sim-gb300-1p2d-slurm")
    assert c.slurm.container == "pyxis"
    plan = _pyxis_plan(c)
    rd = f"/var/tmp/llmdeploy-ops/lib/sim-gb300-1p2d-slurm/releases/{RID}"
    decode0 = plan.service("decode0")
    assert decode0.world and decode0.restart == "group" and [u.tasks for u in decode0.units] == [4, 4]
    assert {u.order for u in decode0.units} == {0} and len({u.show["container_command"] for u in decode0.units}) == 1
    (step, units), = plan_steps(c, plan, decode0.units, lambda u: "", lambda u: 1)
    assert [u.host for u in units] == ["sim-gb300-1p2d-slurm-1", "sim-gb300-1p2d-slurm-2"]
    args = slurm.unit_srun_args(c, "42", step)
    assert args[:7] == ["srun", "--jobid=42", "--overlap", "--ntasks=8", "--distribution=arbitrary",
                        "--nodelist=" + ",".join(["sim-gb300-1p2d-slurm-1"] * 4 + ["sim-gb300-1p2d-slurm-2"] * 4), "--gres=gpu:4"]
    assert "--mpi=pmix" in args and args[-2:] == ["sh", f"{rd}/decode0.task.sh"] and not any("/root/.ssh" in a for a in args)
    for node in ("sim-gb300-1p2d-slurm-1", "sim-gb300-1p2d-slurm-2"):
        files = plan.files[node]
        assert not {"decode0.serve.sh", "decode0.hold.sh", "decode0.hostfile", "decode0.mpi-agent.sh"} & set(files), sorted(files)
        task = files["decode0.task.sh"][0]
        assert task.index(". \"$CONFIG_DIR/qwen3.5-gb300-agentic.env\"") < task.index("unset TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL")
        assert "export DYN_SYSTEM_PORT=8082" in task and "mpirun" not in task
        assert f'tmp={rd}/decode0.config.yaml.task-${{SLURM_PROCID:-$$}}' in task and f'mv -f "$tmp" {rd}/decode0.config.yaml' in task
        # no prepare record here: no numactl (a prepared node's record decides it, per node)
        assert task.rstrip().endswith("\nexec trtllm-llmapi-launch python3 -m dynamo.trtllm --model-path \"$MODEL_PATH\" "
                                      "--served-model-name nvidia/Qwen3.5-397B-A17B-NVFP4-V2 --disaggregation-mode decode "
                                      f"--extra-engine-args {rd}/decode0.config.yaml --publish-metrics"), task
    # the prefill group on one node is a world of its 4 ranks too; the control plane and frontend are plain steps
    prefill0 = plan.service("prefill0")
    assert prefill0.world and [u.tasks for u in prefill0.units] == [4]
    assert not plan.service("frontend").world and not plan.service("etcd").world
    docker = _pyxis_plan(_with(c, container="docker"))
    d0 = docker.service("decode0")
    assert not d0.world and [u.order for u in d0.units] == [1, 0] and d0.units[0].show["serve_command"].startswith("mpirun ")
    assert "decode0.mpi-agent.sh" in docker.files["sim-gb300-1p2d-slurm-1"]


def test_sglang_on_pyxis_is_one_step_a_task_per_node():
    """SGLang on pyxis: the world is one step over the nodes, one task per
    node, ``--mpi=none`` (its ranks meet at node 0's torch.distributed
    store); each node's task.sh holds its own node rank, checked against
    the node Slurm ran it on (Slurm numbers a step's nodes in its own
    order); the plan keeps that through its JSON; release.json records
    what runs, so status --diff finds no drift. On docker each node's
    container keeps its rank written in its line."""
    from flows.status import _command_drift
    from launchers.slurm.jobs import plan_steps
    from llmdeploy.releaseplan import ReleasePlan

    d = load_cluster("sim-h200-sglang").model_dump()
    d["slurm"] = {"login": "login01", "partition": "gpu", "nodelist": ["gpu-b", "gpu-a"]}
    c = Cluster.model_validate(d)
    assert c.slurm.container == "pyxis"
    plan = _pyxis_plan(c)
    (svc,) = plan.services
    assert svc.world and not svc.mpi and [u.tasks for u in svc.units] == [1, 1] and {u.order for u in svc.units} == {0}
    assert len({u.show["container_command"] for u in svc.units}) == 1
    again = ReleasePlan.from_json(plan.to_json()).services[0]
    assert again.world and not again.mpi
    (step, units), = plan_steps(c, plan, svc.units, lambda u: "", lambda u: 1)
    args = slurm.unit_srun_args(c, "42", step)
    # node rank 0 (gpu-b) is task 0, though Slurm would put gpu-a first
    assert args[3:6] == ["--ntasks=2", "--distribution=arbitrary", "--nodelist=gpu-b,gpu-a"]
    task_sh = f"/var/lib/llmdeploy/sim-h200-sglang/releases/{RID}/task.sh"
    assert "--mpi=none" in args and args[-2:] == ["sh", task_sh]
    for i, node in enumerate(["sim-h200-sglang-0", "sim-h200-sglang-1"]):
        task = plan.files[node]["task.sh"][0]
        assert task.rstrip().splitlines()[-1] == "exec " + plan.units(node)[0].show["serve_command"]
        assert f" --nnodes 2 --node-rank {i} --host 0.0.0.0 --port 30000 " in task
        # run as a task would: on its own Slurm node it execs the server (here: a stand-in that prints its argv)
        fake = 'python3() { echo "ran $*"; }; '
        ok = subprocess.run(["sh", "-c", fake + task.replace("exec python3", "python3")], capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": ["gpu-b", "gpu-a"][i]})
        assert ok.returncode == 0 and f"--node-rank {i} " in ok.stdout, ok
        # on another node (or outside Slurm) it refuses, naming both
        res = subprocess.run(["sh", "-c", task], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "SLURMD_NODENAME": "gpu-z"})
        assert res.returncode == 2 and f"runs on gpu-z, not on {['gpu-b', 'gpu-a'][i]}: node rank {i} is {node}'s" in res.stderr, res
        # release.json: what the step runs, as status --diff reads a unit's command
        meta = json.loads(plan.files[node]["release.json"][0])
        assert meta["command"] == ["sh", task_sh] and _command_drift(meta, {"Config": {"Cmd": ["sh", task_sh]}}) == []
    docker = _pyxis_plan(_with(c, container="docker"))
    (dsvc,) = docker.services
    assert not dsvc.world and [u.order for u in dsvc.units] == [0, 1] and "task.sh" not in docker.files["sim-h200-sglang-1"]
    assert "--node-rank 1 " in dsvc.units[1].show["container_command"]


def test_an_mpi_worlds_rank_0_must_be_node_0():
    """The step lays its tasks out in the plan's order (--distribution=arbitrary),
    and the probes ask node 0: a task.sh whose rank 0 lands elsewhere all the same says so."""
    plan = _pyxis_plan(load_cluster("sim-b200-slurm"))
    task = plan.files["sim-b200-slurm-1"]["task.sh"][0]
    res = subprocess.run(["sh", "-c", task], capture_output=True, text=True,
                         env={"PATH": "/usr/bin:/bin", "SLURM_PROCID": "0", "SLURMD_NODENAME": "sim-b200-slurm-1"})
    assert res.returncode == 2 and "rank 0 runs on sim-b200-slurm-1, not on sim-b200-slurm-0" in res.stderr, res
    dplan = _pyxis_plan(load_cluster("sim-gb300-1p2d-slurm"))
    dtask = dplan.files["sim-gb300-1p2d-slurm-1"]["decode0.task.sh"][0]
    assert "!= sim-gb300-1p2d-slurm-1 ]" in dtask  # decode0's rank 0: its first node


def test_a_world_pyxis_cannot_launch_keeps_docker_and_is_found_before_anything_stops():
    """A Dynamo group with unequal GPUs on its nodes cannot be one step (the
    same tasks on every node): left to the platform such a cluster runs
    Docker, asked for pyxis it is refused by field. And whatever else a
    pyxis plan cannot start as is found by the launcher's preflight, before
    the serving release is stopped."""
    from launchers.slurm.jobs import SlurmJobs

    d = load_cluster("sim-gb300-1p2d-slurm").model_dump()
    n = [f"sim-gb300-1p2d-slurm-{i}" for i in range(5)]
    # decode0 on 4 + 2 + 2 GPUs, decode1 on 2 + 2 + 4 (the inventory's masks)
    d["profile"]["workers"] = [{"gpus": {n[0]: [0, 1, 2, 3]}}, {"gpus": {n[1]: [0, 1, 2, 3], n[2]: [0, 1], n[3]: [0, 1]}},
                               {"gpus": {n[2]: [2, 3], n[3]: [2, 3], n[4]: [0, 1, 2, 3]}}]
    uneven = Cluster.model_validate({**d, "slurm": {**d["slurm"], "container": None}})
    assert uneven.slurm.container == "docker"
    with pytest.raises(ValueError) as err:
        Cluster.model_validate({**d, "slurm": {**d["slurm"], "container": "pyxis"}})
    assert "slurm.container" in str(err.value) and "decode0 (4 on sim-gb300-1p2d-slurm-1, 2 on sim-gb300-1p2d-slurm-2, 2 on" in str(err.value), err.value

    c = load_cluster("sim-gb300-1p2d-slurm")
    plan = _pyxis_plan(c)
    odd = plan.service("decode0").units[1]
    odd.spec = dataclasses.replace(odd.spec, command=(*odd.spec.command, "x"))

    class NoSlurm:
        def node_states(self, names):
            raise AssertionError("preflight read Slurm although the plan cannot start")

    jobs = SlurmJobs(c, type("R", (), {"transport": NoSlurm()})(), print)
    where, why = jobs.preflight(plan)
    assert where == c.slurm.login and "world" in why and "nothing was stopped" in why, why


def test_status_diff_leaves_slurms_gpu_mask_to_slurm():
    """On pyxis Slurm sets CUDA_VISIBLE_DEVICES for a step's GRES: status
    --diff does not call it drift where the release does not set it, and
    compares it where the release does (a Dynamo worker's mask)."""
    from flows.status import drift
    from launchers.slurm.units import PyxisUnits

    d = load_cluster("sim-h200-sglang").model_dump()
    d["slurm"] = {"login": "login01", "partition": "gpu"}
    c = Cluster.model_validate(d)
    plan = _pyxis_plan(c)
    own = PyxisUnits(c).own_env
    assert own == ("CUDA_VISIBLE_DEVICES",)
    st = {"meta": {}, "release": plan.release, "env": {"NCCL_SOCKET_IFNAME": "ens1f0"}}
    c_ = {"Config": {"Labels": {"llmdeploy.release": plan.release}, "Env": ["NCCL_SOCKET_IFNAME=ens1f0", "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7"]}}
    assert drift(plan, st, c_, True, set(), own) == []
    assert drift(plan, st, c_, True, set(), ()) == ["environment CUDA_VISIBLE_DEVICES: running '0,1,2,3,4,5,6,7', release None"]
    st["env"]["CUDA_VISIBLE_DEVICES"] = "0,1"
    assert drift(plan, st, c_, True, set(), own) == ["environment CUDA_VISIBLE_DEVICES: running '0,1,2,3,4,5,6,7', release '0,1'"]


def test_a_start_after_the_jobs_step_found_it_gone_holds_the_job_again(b200):
    """A step's retry found the release's job ended and dropped it
    (``SlurmSteps.forget``): the next start holds the release's job again
    (here the running one of that name) instead of sending its steps to
    ``--jobid=None``; with no job to be had, every unit says why."""
    from launchers.slurm.jobs import SlurmJobs

    plan = _pyxis_plan(b200)
    running = slurm.Job("77", slurm.release_job_name(b200.name, plan.release), "RUNNING", "None", "n[0-1]", {})

    class Steps:
        job, release, sent = None, None, []
        jobs = [running]

        def squeue(self):
            return self.jobs

        def use_job(self, job_id, release=None, nodes=None):
            self.job, self.release = job_id, release if job_id else None

        def login_exec(self, cmd, timeout):
            self.sent.append(cmd)
            if cmd.startswith("sbatch"):
                return "", "sbatch: error: Batch job submission failed: Requested node configuration is not available", 1
            return "", "", 0

        def changed(self):
            pass

    steps = Steps()
    jobs = SlurmJobs(b200, type("R", (), {"transport": steps})(), print)
    jobs.held = plan.release  # held once; then a step's retry dropped the job: steps.job is None
    jobs.start_units(plan, plan.units(), lambda u: "", lambda u: 1)
    assert steps.job == "77" and jobs.held == plan.release
    assert all("--jobid=None" not in c for c in steps.sent) and any("--jobid=77" in c for c in steps.sent), steps.sent
    # the job is gone for good: the new batch job is refused, and each unit says so
    steps.jobs, steps.job, steps.sent = [], None, []
    failed = jobs.start_units(plan, plan.units(), lambda u: "", lambda u: 1)
    assert failed is not None and "sbatch refused release" in failed[1] and "Requested node configuration" in failed[1], failed
    assert not [c for c in steps.sent if "srun" in c and not c.startswith("sbatch ")], steps.sent  # no step (the batch script's own is the job's)


def test_sruns_only_allocated_is_said_in_words():
    said = slurm.srun_problem("", "srun: error: Only allocated 1 nodes asked for 2\n", 1)
    assert said.startswith("the job does not hold every node the step asked for, and Slurm ran none of it (srun: error: Only allocated")
    assert slurm.srun_problem("", "srun: error: Unable to create step\n", 1) == "srun: error: Unable to create step"


def test_a_node_plainly_a_jobs_and_one_status_names():
    plain = [slurm.NodeState("n", s, "none") for s in ("allocated", "mixed", "completing")]
    odd = [slurm.NodeState("n", s, r) for s, r in (("draining", "fan swap"), ("allocated*", "none"), ("reserved", "maint"), ("down", "x"),
                                                   ("idle", "none"))]
    assert all(st.plain for st in plain) and not any(st.plain for st in odd)
    assert odd[0].describe() == "Slurm reports n draining (reason: fan swap)"
    assert odd[1].describe() == "Slurm reports n allocated, not responding"
    # where no step can go, a node Slurm has lost is said to be lost (its slurmd does not answer, or it is down)
    from launchers.slurm.steps import lost_words

    assert not odd[0].lost and odd[1].lost and odd[3].lost
    assert lost_words(odd[1]) == "lost: Slurm reports n allocated, not responding" and lost_words(odd[2]) == "Slurm reports n reserved (reason: maint)"


def _batch(c, tmp_path, env: dict[str, str]) -> subprocess.Popen:
    """The release's batch script run here as sh would run it, ``srun`` a stand-in that runs its command (its options dropped)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    (bin_dir / "squeue").write_text("#!/bin/sh\necho N/A\n")  # an unlimited job's end (squeue(1) %e)
    (bin_dir / "squeue").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "42", **env}
    return subprocess.Popen(["sh", "-c", slurm.batch_script(c, "20261207T000000Z-abcdef12")], env=env, start_new_session=True)


def _ended_by_sigterm(p: subprocess.Popen) -> int:
    """SIGTERM to the batch script (as scancel sends it), its exit status; then whatever it left (its sleep) killed."""
    p.terminate()
    try:
        return p.wait(timeout=10)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def test_the_release_job_warns_in_node0s_audit_log_before_its_time_limit(b200, tmp_path):
    """sbatch(1) --time: at the limit each step gets SIGTERM. The batch step writes one audit line
    (with the sum the audit log's reader checks) end_warning_s before SLURM_JOB_END_TIME, then holds the
    job until scancel's SIGTERM ends it at once."""
    from llmdeploy import lock, release

    c = b200.model_copy(update={"base_dir": str(tmp_path / "base"), "slurm": b200.slurm.model_copy(update={"end_warning_s": 2})})
    end = int(time.time()) + 4
    p = _batch(c, tmp_path, {"SLURM_JOB_END_TIME": str(end)})
    audit = Path(lock.audit_path(c))
    try:
        until(lambda: audit.exists() and audit.read_text().strip(), what="the warning in the audit log", timeout=20)
    finally:
        code = _ended_by_sigterm(p)
    assert code == 0
    recs, problems = release.parse_lines(audit.read_text(), "audit log")
    assert problems == [] and len(recs) == 1, (recs, problems)
    r = recs[0]
    assert (r["command"], r["result"], r["release"], r["job"], r["who"]) == ("slurm.time-limit", "warning", "20261207T000000Z-abcdef12", "42",
                                                                               "slurm job 42")
    assert 0 <= r["time_left_s"] <= 3 and r["ends"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end))


def test_a_release_job_without_a_known_limit_only_holds(b200, tmp_path):
    """An unlimited job: Slurm's end a year after its start (slurmctld's job_end_time_reset), or, without
    SLURM_JOB_END_TIME, squeue's N/A: nothing is written; SIGTERM ends it."""
    from llmdeploy import lock

    c = b200.model_copy(update={"base_dir": str(tmp_path / "base")})
    now = int(time.time())
    for env in ({}, {"SLURM_JOB_START_TIME": str(now), "SLURM_JOB_END_TIME": str(now + 365 * 86400)}):
        p = _batch(c, tmp_path, env)
        time.sleep(1)
        assert p.poll() is None and _ended_by_sigterm(p) == 0
        assert not Path(lock.audit_path(c)).exists()
    off = b200.model_copy(update={"slurm": b200.slurm.model_copy(update={"end_warning_s": None})})
    assert slurm.batch_script(off, "r1") == "trap 'exit 0' TERM; sleep infinity & wait $!"


@pytest.mark.parametrize("text,seconds", [("10", 600), ("10:30", 630), ("1:00:00", 3600), ("1-0", 86400), ("1-2:03", 93780),
                                          ("1-02:03:04", 93784), ("59:12", 3552), ("UNLIMITED", None), ("infinite", None),
                                          ("NOT_SET", None), ("INVALID", None), ("", None)])
def test_slurm_times_in_seconds(text, seconds):
    """sbatch(1) --time's forms, and squeue's %L and sinfo's %l (days-hours:minutes:seconds, UNLIMITED, infinite)."""
    assert slurm.slurm_seconds(text) == seconds


class _Partition:
    """A login host whose sinfo says the partition's limit; it records what it was asked."""

    def __init__(self, limit: str):
        self.limit, self.sent = limit, []

    def node_states(self, names):
        return {}

    def login_exec(self, command, timeout=None):
        self.sent.append(command)
        return (f"{self.limit}\n{self.limit}\n", "", 0) if command.startswith("sinfo") else ("", "", 0)


def test_deploy_refuses_a_time_limit_longer_than_the_partitions_before_anything_stops(b200):
    """sbatch(1) --time: a limit over the partition's leaves the job pending (possibly indefinitely): the
    preflight (before the serving release stops) names both limits; within it, or unlimited, it passes."""
    from launchers.slurm.jobs import SlurmJobs

    plan = _pyxis_plan(b200)

    def preflight(time_limit, partition):
        c = b200.model_copy(update={"slurm": b200.slurm.model_copy(update={"time_limit": time_limit})})
        steps = _Partition(partition)
        return SlurmJobs(c, type("R", (), {"transport": steps})(), print).preflight(plan), steps.sent

    (where, why), sent = preflight("7-00:00:00", "2-00:00:00")
    assert where == b200.slurm.login and "slurm.time_limit 7-00:00:00 is longer than partition gpu's time limit 2-00:00:00" in why
    assert "nothing was stopped" in why and sent == [slurm.partition_limit_command("gpu")]
    assert preflight("1-00:00:00", "2-00:00:00")[0] is None and preflight("1-00:00:00", "infinite")[0] is None
    # no limit asked for (UNLIMITED, 0: sbatch(1)) is longer than any finite one
    for unlimited in ("UNLIMITED", "0"):
        (_, why), _ = preflight(unlimited, "2-00:00:00")
        assert f"slurm.time_limit {unlimited} is longer than partition gpu's time limit 2-00:00:00" in why
    assert preflight("UNLIMITED", "infinite")[0] is None
    # the partition's default (no --time): nothing to compare, nothing read
    assert preflight(None, "1:00:00") == (None, [])


def test_status_and_top_have_the_jobs_time_left(b200):
    """squeue's %L in status (line and JSON) and, as the launcher's ends, counted down by top."""
    from launchers.slurm.jobs import SlurmJobs
    from rich.console import Console

    plan = _pyxis_plan(b200)

    class Queue:
        states: dict = {}

        def squeue(self, recent=False):
            return slurm.parse_squeue(f"42|{slurm.release_job_name(b200.name, plan.release)}|RUNNING|None|sim-b200-slurm-[0-1]|"
                                      "1-00:00:00|2026-12-05T15:00:00|2:03:04\n", b200.name)

    view = SlurmJobs(b200, type("R", (), {"transport": Queue()})(), print).view(plan)
    assert view.ends == ("Slurm job 42's time limit", 7384.0) and view.doc["slurm"]["time_left_s"] == 7384
    con = Console(record=True, width=200)
    view.show(con)
    assert "time left 2:03:04" in con.export_text()


def _record(node: str, out: str) -> str:
    """One task's record as DISPATCH prints it (srun --label)."""
    import base64

    return (f"0: @@lds-rc {node} 0\n0: @@lds-o {node} {base64.b64encode(out.encode()).decode()}\n0: @@lds-end {node}\n")


class _LostNode1:
    """A login host whose srun cannot launch on node 1 (its slurmd gone): a step over both nodes aborts
    whole ("Job step aborted"), one on node 0 alone answers; sinfo then says node 1 is not responding."""

    def __init__(self):
        self.sent: list[str] = []

    def __call__(self, command, timeout=None, data=None, read=False):
        self.sent.append(command)
        if command.startswith("sinfo"):
            return "sim-b200-slurm-1|allocated*|none\n", "", 0
        if "--nodes=2" in command:
            return "", "srun: error: Application launch failed: Communication connection failure\nsrun: Job step aborted\n", 1
        if "sim-b200-slurm-0" in command:
            return _record("sim-b200-slurm-0", "read on node 0"), "", 0
        return "", "srun: error: Application launch failed: Communication connection failure\n", 1


def _steps_on(b200, login):
    from launchers.slurm.steps import SlurmSteps

    runner = type("R", (), {"cluster": b200, "unreachable": {}})()
    steps = SlurmSteps(runner)
    steps.allocation = lambda nodes: "7"
    steps.outside = lambda job, nodes: {}
    steps.login_exec = login
    return steps


def test_a_read_that_one_lost_node_aborted_reads_the_others_alone_and_names_it_lost(b200):
    """srun aborts a step over several nodes when it cannot launch on one: a read (status's, top's: nothing
    changes) runs again on each node alone, so node 0 still answers; node 1, still without one, is named lost
    as Slurm now says. A step that changes something is never run twice."""
    login = _LostNode1()
    got = _steps_on(b200, login).dispatch("status", {n.name: ("read", None) for n in b200.nodes}, 30, read=True)
    assert got["sim-b200-slurm-0"] == ("read on node 0", "", 0)
    assert got["sim-b200-slurm-1"].startswith("lost: Slurm reports sim-b200-slurm-1 allocated, not responding (job 7: no answer"), got
    assert [c.split()[0] for c in login.sent] == ["srun", "srun", "srun", "sinfo"], login.sent
    login = _LostNode1()
    got = _steps_on(b200, login).dispatch("stop", {n.name: ("change", None) for n in b200.nodes}, 30)
    assert all(isinstance(v, str) and "no answer" in v for v in got.values()) and len(login.sent) == 1, login.sent
