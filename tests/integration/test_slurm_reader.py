"""The release's reader on the simulated B200 pair run by a real Slurm
controller (issue 29, item 6): status, top and the watcher read the nodes
through one long-lived step of the release's job, not a step per read.

200 status calls on a serving release create at most a handful of job
steps (counted where Slurm counts them: each slurmd's log has a line per
task it launched, with the step's id); the reader is one step of the job
that squeue lists; a stopped container shows in status within the reader's
age limit; a cancelled reader is started again by the reads that find it
gone, once, and status says nothing wrong meanwhile; stop ends it and
removes its files from the login host.

The 200 calls run the status flow in this process, as bench/roundtrips.py
runs the flows (a fresh runner, SSH connection and transport each, as a new
``invoke status`` process has); 20 more are ``invoke status`` processes."""

import contextlib
import io
import json
import os
import re
import signal
import time

import pytest
from rich.console import Console

from flows import status as status_flow
from llmdeploy.inventory import load_cluster
from llmdeploy.launchers.slurm import commands as slurm
from llmdeploy.launchers.slurm import reader
from sim.paths import cluster_dir
from sim.slurm import slurm_dir
from tests.conftest import run_invoke
from tests.integration import test_slurm_b200 as b200

SIM_CLUSTER = "sim-b200-slurm"
NODES = b200.NODES
# slurmd's line per task it launches (22.05: "launch task StepId=12.3 request from UID:0 ...")
LAUNCH = re.compile(r"launch task (?:StepId=)?(\d+)\.(\d+)")


def _logs() -> dict[str, str]:
    return {n: (slurm_dir(cluster_dir(SIM_CLUSTER)) / "nodes" / n / "slurmd.log").read_text(errors="replace") for n in NODES}


def _marks() -> dict[str, int]:
    """Where each slurmd's log ends now."""
    return {n: len(text) for n, text in _logs().items()}


def steps_since(marks: dict[str, int], job: str) -> set[str]:
    """The steps of ``job`` whose tasks a slurmd launched since ``marks`` (slurmd logs "launch task StepId=J.S" per task)."""
    found = set()
    for n, text in _logs().items():
        found |= {f"{j}.{s}" for j, s in LAUNCH.findall(text[marks[n]:]) if j == job}
    return found


def status_in_process() -> dict:
    """``invoke status --json`` as its flow, in this process (its own runner, connection and transport)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = status_flow.status(load_cluster(SIM_CLUSTER), Console(file=io.StringIO(), width=200), False, True)
    doc = json.loads(out.getvalue())
    assert code == 0 and doc["healthy"], doc
    return doc


def reader_steps(job: slurm.Job) -> list[str]:
    return [sid for sid, (name, _) in job.steps.items() if name == reader.STEP_NAME]


@pytest.mark.slow
def test_200_status_calls_create_a_handful_of_steps(sim_cluster):
    res = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--no-check", timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, timeout=500)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "slurm: a reader step in job" in res.stdout, res.stdout
    (job,) = b200.jobs()
    rid = slurm.release_of_job(SIM_CLUSTER, job.name)
    # one reader step beside the units' steps, a task on each node
    (first_reader,) = reader_steps(job)
    assert job.steps[first_reader][1] in ("sim-b200-slurm-[0-1]", ",".join(NODES)), job.steps
    assert len(b200.unit_steps(job)) == 1  # the world: one pmix step over both nodes (pyxis)

    # the watcher's last reads and deploy's own are over: from here on only status reads
    time.sleep(3)
    marks = _marks()
    t0 = time.monotonic()
    for _ in range(200):
        status_in_process()
    in_process = time.monotonic() - t0
    for _ in range(20):
        res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
        assert res.returncode == 0 and json.loads(res.stdout)["healthy"], res.stdout + res.stderr
    made = steps_since(marks, job.id)
    print(f"\n200 in-process status calls ({in_process:.1f}s) and 20 invoke status: {len(made)} new job steps {sorted(made)}")
    assert len(made) <= 5, (sorted(made), f"200 in-process status calls took {in_process:.0f}s")
    (job_now,) = b200.jobs()
    assert reader_steps(job_now) == [first_reader], job_now.steps  # the same reader all along

    # a rank killed behind the tool's back (the world's step ends): once the reader's age limit has
    # passed since, no record from before it may answer, so the next status shows it
    # (the unit's step ends with its world: status names that too; the state is the read's)
    container = f"{SIM_CLUSTER}-{rid}"
    limit = reader.max_age(load_cluster(SIM_CLUSTER).slurm.reader_period_s)
    pid, _ = b200._ranks(job.id)[8]
    os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + 60
    while b200._ranks(job.id) and time.monotonic() < end:
        time.sleep(0.2)
    time.sleep(limit + 0.5)
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    state = json.loads(res.stdout)["nodes"][NODES[1]]["units"][container]["state"]
    assert state != "running", res.stdout

    res = run_invoke("restart", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    # a whole restart stops the release, job and reader with it, and holds a new job with a reader of its own
    (job,) = b200.jobs()
    assert slurm.release_of_job(SIM_CLUSTER, job.name) == rid and len(reader_steps(job)) == 1, job.steps

    # the reader's step cancelled: status stays healthy, and the reads that find it gone start one new reader
    (second,) = reader_steps(job)
    b200.login(f"scancel {second}")
    end = time.monotonic() + 30
    while reader_steps(b200.jobs()[0]) and time.monotonic() < end:
        time.sleep(0.3)
    assert not reader_steps(b200.jobs()[0])
    marks = _marks()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not reader_steps(b200.jobs()[0]):
        status_in_process()
    for _ in range(20):
        status_in_process()
    (job_again,) = b200.jobs()
    assert len(reader_steps(job_again)) == 1, job_again.steps
    made = steps_since(marks, job.id)
    # the new reader, and the status reads made as steps while no fresh record was there
    assert len(made) <= 10 and reader_steps(job_again)[0] in made, sorted(made)

    # stop ends the reader with its job, and its files on the login host go
    d = reader.reader_dir(load_cluster(SIM_CLUSTER), rid)
    assert b200.login(f"test -d {d} && echo there || echo gone").strip() == "there"
    res = run_invoke("stop", "--cluster", SIM_CLUSTER, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    b200.nothing_left_pyxis()
    assert b200.login(f"test -d {d} && echo there || echo gone").strip() == "gone"
