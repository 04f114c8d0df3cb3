"""The release's reader on Slurm (launchers/slurm/reader.py and its
wiring in steps.py and jobs.py): status's, top's and the watcher's reads
answered by one long-lived step instead of a step each.

Everything runs here under bash: each node's task as srun would run it
(``NODE_LOOP``), the login host's writer and reader commands in a directory
of the test's, and, for the transport and the launcher, a login host whose
``srun`` is a stand-in that runs the task once per node of ``--nodelist``
(every other Slurm command is answered as Slurm would)."""

from __future__ import annotations

import hashlib
import os
import shlex
import signal
import stat
import subprocess
import threading
import time
from pathlib import Path

import pytest

from llmdeploy.inventory import load_cluster
from launchers.slurm import commands as slurm
from launchers.slurm import reader, steps
from launchers.slurm.jobs import SlurmJobs
from launchers.slurm.steps import SlurmSteps
from llmdeploy.releaseplan import ReleasePlan, Service, Unit
from llmdeploy.runner import Runner, Step
from flows.binding import bind

PATH = "/usr/bin:/bin"
JOB = "42"

# srun as the reader needs it: `bash -c PROG` once per node of --nodelist,
# each task's lines labelled "<task>: ", the same standard input to every task
FAKE_SRUN = r"""#!/bin/bash
job=; nodes=; prog=
while [ $# -gt 0 ]; do
  case $1 in --jobid=*) job=${1#--jobid=} ;; --nodelist=*) nodes=${1#--nodelist=} ;; bash) prog=$3; break ;; esac
  shift
done
echo "$job $nodes" >> "$FAKE_SRUN_LOG"
# the standard input to every task as it comes (srun --input=all)
fifos=(); i=0
for n in ${nodes//,/ }; do
  f=$(mktemp -u); mkfifo "$f"; fifos+=("$f")
  SLURMD_NODENAME=$n SLURM_JOB_ID=$job bash -c "$prog" < "$f" | sed -u "s/^/$i: /" &
  i=$((i + 1))
done
tee "${fifos[@]}" > /dev/null
wait
rm -f "${fifos[@]}"
"""

ODD = r"""printf '\x00\xff\xfe\r\n@@lds-end n0 status 1\n@@lds-rc n0 0 x\n\x1b[31mno newline'; printf 'err\x00\xc3\n' >&2; exit 3"""


@pytest.fixture(scope="module")
def b200():
    return load_cluster("sim-b200-slurm")


def _with_period(cluster, period: float, log_dir: Path):
    return cluster.model_copy(update={"log_dir": str(log_dir), "slurm": cluster.slurm.model_copy(update={"reader_period_s": period})})


class _Groups:
    """Process groups a test started (its node tasks, its readers): ended at its end, by id."""

    def __init__(self):
        self.pgids: set[int] = set()

    def add_running(self, d: Path) -> None:
        try:
            self.pgids.add(int((d / "running").read_text().split()[1]))
        except (OSError, IndexError, ValueError):
            pass

    def end(self) -> None:
        for pgid in self.pgids:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def groups():
    g = _Groups()
    yield g
    g.end()


def _tasks(per_node: dict[str, dict[str, str]], rounds: int, tmp: Path, groups: _Groups, period: float = 0.05) -> dict[str, list[str]]:
    """Each node's task (NODE_LOOP) run here until it printed ``rounds`` rounds; {node: its lines}."""
    data = reader.spec(per_node, period, 10)
    (tmp / "node-tmp").mkdir(exist_ok=True)
    out = {}
    for node, reads in per_node.items():
        env = {"SLURMD_NODENAME": node, "SLURM_JOB_ID": JOB, "PATH": PATH, "TMPDIR": str(tmp / "node-tmp")}
        p = subprocess.Popen(["bash", "-c", reader.NODE_LOOP], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True)
        groups.pgids.add(p.pid)
        p.stdin.write(data)
        lines = []
        for _ in range(rounds):  # a tick, a round
            p.stdin.write(b"tick\n")
            p.stdin.flush()
            ends = 0
            while ends < len(reads):
                line = p.stdout.readline().decode()
                assert line, f"{node}'s task ended"
                lines.append(line.rstrip("\n"))
                ends += line.startswith("@@lds-end ")
        p.terminate()  # scancel's SIGTERM: the task ends, its files go
        try:
            code = p.wait(60)  # a deadline against a hang only: the suite may run this beside two clusters
        except subprocess.TimeoutExpired:
            # NODE_LOOP's read once slept through a TERM (its trap only marked pending): say what the shell was doing
            status = Path(f"/proc/{p.pid}/status").read_text(errors="replace")
            kids = subprocess.run(["ps", "-o", "pid,stat,wchan:20,args", "--ppid", str(p.pid)], capture_output=True, text=True).stdout
            raise AssertionError(f"{node}'s task did not end on SIGTERM:\n{status}\n{kids}") from None
        assert code == 143
        out[node] = lines
    assert os.listdir(tmp / "node-tmp") == []
    return out


def _interleaved(lines: dict[str, list[str]]) -> str:
    """The tasks' lines as srun prints them: labelled, the nodes' lines mixed (never within a line)."""
    labelled = [[f"{i}: {ln}" for ln in ls] for i, ls in enumerate(lines.values())]
    out = []
    while any(labelled):
        for ls in labelled:
            out += ls[:3]
            del ls[:3]
    return "\n".join(out) + "\n"


def _write(d: Path, text: str) -> None:
    """The login host's writer (run.sh's awk) over ``text``, in ``d``."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "run.sh").touch()
    res = subprocess.run(["bash", "-c", f"{reader.AWK_LINES}; $aw {shlex.quote(reader.WRITER)}"], input=text.encode(), cwd=d,
                         capture_output=True, env={"PATH": PATH})
    assert res.returncode == 0, res.stderr


def _read(d: Path, names: list[str], read: str) -> reader.Snapshot:
    res = subprocess.run(["bash", "-c", reader.read_command(str(d), names, read)], capture_output=True, text=True, env={"PATH": PATH})
    assert res.returncode == 0, res.stderr
    return reader.parse_snapshot(res.stdout)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# -- the node's task, the writer, the read: as a step would answer --------------------------
def test_the_reader_answers_what_a_step_would_odd_bytes_and_all(tmp_path, groups):
    per_node = {"n0": {"status": ODD, "top": "echo top-$SLURMD_NODENAME"}, "n1": {"status": "true"}}
    d = tmp_path / "reader"
    _write(d, _interleaved(_tasks(per_node, 2, tmp_path, groups)))
    snap = _read(d, ["n0", "n1"], "status")
    assert snap.state == "down"  # nobody holds its lock: no reader runs
    got, why = reader.answers(snap, "status", {"n0": ODD, "n1": "true"}, JOB, 60, None)
    assert got is not None, why
    # the same commands as a step (DISPATCH), read back by parse_dispatch
    payload = slurm.payload({"n0": (ODD, None), "n1": ("true", None)}, 10)
    steps_out = ""
    for i, node in enumerate(("n0", "n1")):
        res = subprocess.run(["bash", "-c", slurm.DISPATCH], input=payload, capture_output=True, env={"SLURMD_NODENAME": node, "PATH": PATH})
        steps_out += "".join(f"{i}: {ln}\n" for ln in res.stdout.decode().splitlines())
    step = slurm.parse_dispatch(steps_out)
    for node in ("n0", "n1"):
        assert (got[node].code, got[node].stdout, got[node].stderr) == (step[node].code, step[node].stdout, step[node].stderr)
    assert got["n0"].code == 3 and got["n0"].stdout.startswith("\x00\ufffd\ufffd\r\n@@lds-end n0 status 1\n") and got["n0"].stdout.endswith("no newline")
    # the record says what ran: the script's own sha256, the job, two rounds
    assert got["n0"].sha256 == _sha(ODD) and got["n0"].job == JOB and got["n0"].seq == 2
    # top's records are apart, and only asked-for reads come back
    assert set(snap.records) == {("n0", "status"), ("n1", "status")}
    top = _read(d, ["n0"], "top")
    assert top.records[("n0", "top")].stdout == "top-n0\n"


def test_the_writer_keeps_the_latest_record_of_each_node_and_read_in_two_files(tmp_path, groups):
    per_node = {"n0": {"status": "echo $RANDOM"}, "n1": {"status": "echo one"}}
    lines = _tasks(per_node, 5, tmp_path, groups)
    d = tmp_path / "reader"
    # a round cut short on n0 (its task killed while it printed): the complete one before it answers
    cut = lines["n0"] + ["@@lds-rc n0 0 status 6 1.0 1.1 " + _sha("echo $RANDOM") + f" {JOB}", "@@lds-o n0 b25l"]
    _write(d, _interleaved({"n0": cut, "n1": lines["n1"]}) + "srun: error: a line of srun's own\n")
    assert sorted(p.name for p in d.iterdir()) == ["n0.status.0", "n0.status.1", "n1.status.0", "n1.status.1", "run.sh"]
    for p in d.glob("n*.status.*"):
        assert p.read_text().count("@@lds-rc ") == 1  # one record a file, whatever ran before
    snap = _read(d, ["n0", "n1"], "status")
    assert snap.records[("n0", "status")].seq == 5 and snap.records[("n1", "status")].seq == 5
    assert snap.records[("n1", "status")].stdout == "one\n"


# -- when a record answers, and when not ------------------------------------------------------------
def _record(node: str, read: str, seq: int, command: str, stdout: bytes, job: str = JOB, code: int = 0, t0: float = 100.0, t1: float = 100.5) -> str:
    import base64

    lines = [f"@@lds-rc {node} {code} {read} {seq} {t0} {t1} {_sha(command)} {job}"]
    lines += [f"@@lds-o {node} {chunk}" for chunk in base64.encodebytes(stdout).decode().split()]
    return "\n".join(lines + [f"@@lds-end {node} {read} {seq}"]) + "\n"


def _snapshot(now: float, mtime: float, records: str, state: str = "up", files: tuple[str, ...] = ("n0.status.1", "n1.status.1")) -> reader.Snapshot:
    head = f"@@lds-reader {state}\n" + "".join(f"@@lds-mtime {f} {mtime}\n" for f in files) + f"@@lds-now {now}\n"
    return reader.parse_snapshot(head + records)


BOTH = {"n0": "cmd", "n1": "cmd"}
RECORDS = _record("n0", "status", 7, "cmd", b"a\n") + _record("n1", "status", 7, "cmd", b"b\n")


def test_a_fresh_complete_record_of_the_same_command_answers():
    got, why = reader.answers(_snapshot(1000.0, 999.0, RECORDS), "status", BOTH, JOB, 5, None)
    assert got is not None, why
    assert got["n1"].stdout == "b\n"
    # 999 written, its run took 0.5 s: it started 1.5 s before "now" on the login host's clock (the node's clock says 100: not used)
    assert got["n0"].age(1000.0) == pytest.approx(1.5)


def test_a_record_older_than_the_limit_is_refused():
    got, why = reader.answers(_snapshot(1000.0, 994.0, RECORDS), "status", BOTH, JOB, 5, None)
    assert got is None and "6.5s old" in why
    assert reader.max_age(1.0) == 5.0


def test_a_record_from_before_this_commands_last_change_is_refused():
    snap = _snapshot(1000.0, 999.0, RECORDS)  # 1.5 s old
    assert reader.answers(snap, "status", BOTH, JOB, 5, since_change=2.0)[0] is None  # within the margin of the change
    assert reader.answers(snap, "status", BOTH, JOB, 5, since_change=2.6)[0] is not None


def test_a_node_missing_from_the_snapshot_falls_back():
    only_n0 = _record("n0", "status", 7, "cmd", b"a\n")
    got, why = reader.answers(_snapshot(1000.0, 999.0, only_n0), "status", BOTH, JOB, 5, None)
    assert got is None and "n1" in why
    # a record whose file time the login host did not give: not answered either
    got, why = reader.answers(_snapshot(1000.0, 999.0, RECORDS, files=("n0.status.1",)), "status", BOTH, JOB, 5, None)
    assert got is None and "n1" in why


def test_a_command_not_byte_identical_to_the_readers_is_never_answered():
    snap = _snapshot(1000.0, 999.0, RECORDS)
    for other in ("cmd\n", "cmd ", "Cmd", ""):
        got, why = reader.answers(snap, "status", {"n0": "cmd", "n1": other}, JOB, 5, None)
        assert got is None and "another status command" in why
    # a read by another name is never taken for it
    assert reader.answers(snap, "watch", BOTH, JOB, 5, None)[0] is None


def test_records_of_another_job_a_deadline_or_no_reader_are_refused():
    other_job = _record("n0", "status", 7, "cmd", b"a\n", job="41") + _record("n1", "status", 7, "cmd", b"b\n")
    assert "job 41" in reader.answers(_snapshot(1000.0, 999.0, other_job), "status", BOTH, JOB, 5, None)[1]
    timed_out = _record("n0", "status", 7, "cmd", b"", code=124) + _record("n1", "status", 7, "cmd", b"b\n")
    assert "deadline" in reader.answers(_snapshot(1000.0, 999.0, timed_out), "status", BOTH, JOB, 5, None)[1]
    assert reader.answers(_snapshot(1000.0, 999.0, RECORDS, state="none"), "status", BOTH, JOB, 5, None)[0] is None
    assert reader.parse_snapshot("").state is None


def test_a_file_rewritten_while_it_was_read_is_not_a_record():
    good = _record("n0", "status", 7, "cmd", b"a\n")
    head = good.splitlines()[0]
    mixed = head + "\n" + _record("n0", "status", 9, "cmd", b"a longer answer\n" * 4).split("\n", 2)[2]  # seq 7's start, seq 9's end
    assert _snapshot(1000.0, 999.0, mixed).records == {}
    two_heads = head + "\n" + good
    assert _snapshot(1000.0, 999.0, two_heads).records[("n0", "status")].seq == 7  # the second, whole one
    foreign = good.replace("@@lds-o n0 ", "@@lds-o n1 ", 1)
    assert _snapshot(1000.0, 999.0, foreign).records == {}
    not_base64 = good.replace("@@lds-o n0 ", "@@lds-o n0 *", 1)
    assert _snapshot(1000.0, 999.0, not_base64).records == {}
    assert _snapshot(1000.0, 999.0, good.replace(_sha("cmd"), "beef")).records == {}


def test_the_builders_refuse_names_that_are_not_file_names():
    with pytest.raises(ValueError):
        reader.spec({"n0": {"Status": "x"}}, 1, 10)
    with pytest.raises(ValueError):
        reader.spec({"../n0": {"status": "x"}}, 1, 10)
    with pytest.raises(ValueError):
        reader.read_command("/tmp/x", ["n0;rm"], "status")
    # each distinct command travels once
    data = reader.spec({"n0": {"status": "a", "top": "b"}, "n1": {"status": "a"}}, 0.5, 120)
    assert data.startswith(b"#reader 0.5 120\n") and data.count(b"#blob ") == 2 + 1


def test_the_readers_step_asks_what_every_step_asks(b200):
    text = reader.run_script(b200, ["sim-b200-slurm-0", "sim-b200-slurm-1"])
    srun = next(ln for ln in text.splitlines() if ln.startswith("feed | srun ")).removeprefix("feed | ")
    assert srun.startswith('srun --jobid="$job" --overlap --nodes=2 --nodelist=sim-b200-slurm-0,sim-b200-slurm-1 --ntasks=2')
    assert "--gres=gpu:8" in srun and f"--job-name={reader.STEP_NAME}" in srun and "--chdir=/" in srun
    assert "umask 077" in text and "flock -w 2 9 || exit 0" in text


def _feed_lines(d: Path, within: float) -> list[str]:
    """What the feed (run in ``d``) prints in ``within`` seconds; then it and its children are ended."""
    import select

    feed = "\n".join(reader.feed_lines(0.05)) + "\nfeed\n"
    p = subprocess.Popen(["bash", "-c", feed], cwd=d, stdout=subprocess.PIPE, start_new_session=True)
    out, end = b"", time.monotonic() + within
    try:
        while (left := end - time.monotonic()) > 0:
            if select.select([p.stdout], [], [], left)[0]:
                out += os.read(p.stdout.fileno(), 4096)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        p.stdout.close()
    return out.decode().splitlines()


def test_the_feed_ticks_only_while_reads_come(tmp_path):
    """The login host's feed: the spec, then a tick a period while ``wanted``
    is at most IDLE_S old; none once it is older (the nodes' tasks then wait
    and read nothing)."""
    (tmp_path / "spec").write_text("#reader 0.05 10\n#blob end\n")
    (tmp_path / "wanted").touch()
    busy = _feed_lines(tmp_path, 1.0)
    assert busy[:2] == ["#reader 0.05 10", "#blob end"] and set(busy[2:]) == {"tick"} and len(busy) >= 5
    old = time.time() - reader.IDLE_S - 5
    os.utime(tmp_path / "wanted", (old, old))
    assert _feed_lines(tmp_path, 0.5) == ["#reader 0.05 10", "#blob end"]
    (tmp_path / "wanted").unlink()  # never read: no tick either
    assert _feed_lines(tmp_path, 0.3) == ["#reader 0.05 10", "#blob end"]


def test_a_read_keeps_the_reader_reading():
    assert "touch wanted" in reader.read_command("/d", ["n0"], "status")


# -- on a login host: start, a second start, death, restart, stop --------------------------------------
def _login_env(tmp_path: Path) -> dict[str, str]:
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    (bin_ / "srun").write_text(FAKE_SRUN)
    (bin_ / "srun").chmod(0o755)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return {"PATH": f"{bin_}:{PATH}", "FAKE_SRUN_LOG": str(tmp_path / "srun.log"), "TMPDIR": str(tmp_path / "tmp")}


def _sh(command: str, env: dict, stdin: bytes | None = None) -> tuple[str, int]:
    res = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, env=env, timeout=60)
    return res.stdout.decode() + res.stderr.decode(), res.returncode


def _sruns(tmp_path: Path) -> int:
    p = tmp_path / "srun.log"
    return len(p.read_text().splitlines()) if p.exists() else 0


def _gone(pgid: int, within: float = 10) -> bool:
    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_the_reader_starts_restarts_once_and_stops_on_the_login_host(tmp_path, b200, groups):
    env = _login_env(tmp_path)
    c = _with_period(b200, 0.2, tmp_path / "log")
    d = Path(reader.reader_dir(c, "r1"))
    names = ["n0", "n1"]
    data = reader.spec({n: {"status": f"echo {n}"} for n in names}, 0.2, 10)
    out, code = _sh(reader.start_command(c, d.as_posix(), names, JOB), env, data)
    groups.add_running(d)
    assert code == 0 and out.startswith("started"), out
    # the directory is the user's alone, every file in it too (the status read carries the env file)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    time.sleep(0.5)
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in d.iterdir()), {p.name: oct(p.stat().st_mode) for p in d.iterdir()}
    snap = _read(d, names, "status")
    assert snap.state == "up" and snap.records[("n1", "status")].stdout == "n1\n"
    first = int((d / "running").read_text().split()[1])
    assert _sruns(tmp_path) == 1

    # a second start (a restart's deploy) replaces it: the first one ends, one reader runs
    out, code = _sh(reader.start_command(c, d.as_posix(), names, JOB), env, data)
    groups.add_running(d)
    assert code == 0 and out.startswith("started"), out
    assert _gone(first) and _sruns(tmp_path) == 2
    # a restart while it runs starts nothing
    assert _sh(reader.restart_command(d.as_posix(), JOB), env)[0].strip() == "running"

    # the reader dies (its srun killed): the lock is free, five reads that find it so each restart it; one step starts
    os.killpg(int((d / "running").read_text().split()[1]), signal.SIGKILL)
    end = time.monotonic() + 10
    while _read(d, names, "status").state != "down" and time.monotonic() < end:
        time.sleep(0.05)
    outs = []
    threads = [threading.Thread(target=lambda: outs.append(_sh(reader.restart_command(d.as_posix(), JOB), env)[0].strip())) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert "restarted" in outs
    time.sleep(2.5)  # the others' wait for the lock (run.sh: flock -w 2) is over: they ended without a step
    groups.add_running(d)
    assert _sruns(tmp_path) == 3
    assert _read(d, names, "status").state == "up"

    # stopped with its release: no process of it is left, nor its directory
    last = int((d / "running").read_text().split()[1])
    assert _sh(reader.stop_command(d.as_posix()), env)[1] == 0
    assert _gone(last) and not d.exists()
    # a restart of a release that has no reader starts none
    assert _sh(reader.restart_command(d.as_posix(), JOB), env)[0].strip() == "none"


# -- the transport and the launcher: 200 reads, no step ---------------------------------------------
class _Login(Runner):
    """A runner whose one host, the login host, is this machine: every command
    runs under bash here (``srun`` the stand-in), except Slurm's squeue, sinfo
    and scancel, answered as Slurm would, and the steps' srun, whose tasks
    (DISPATCH) run here and are counted."""

    def __init__(self, cluster, env: dict[str, str]):
        self.cluster = cluster
        self.progress, self.lines = None, None
        self.unreachable, self.excluded = {}, {}
        self.env = env
        self.steps: list[str] = []  # the names of the steps run as sruns
        self.login_commands: list[str] = []  # the first word of every command sent to the login host
        self.transport = SlurmSteps(self)

    def exec_direct(self, node, command, timeout=None, stdin=None, on_line=None):
        names = [self.cluster.slurm_name(n) for n in self.cluster.nodes]
        queue = (f"{JOB}|{slurm.release_job_name(self.cluster.name, 'r1')}|RUNNING|None|{','.join(names)}|1-00:00:00|N/A\n"
                 f"step {JOB}.0|{reader.STEP_NAME}|{','.join(names)}\n")
        self.login_commands.append(command.split()[0])
        if command.startswith("squeue"):
            return queue, "", 0
        if command.startswith("sinfo"):  # with squeue's answer after the mark when asked (commands.with_squeue)
            return "".join(f"{n}|idle|none\n" for n in names) + (f"{slurm.SQUEUE_MARK} 0\n{queue}" if slurm.SQUEUE_MARK in command else ""), "", 0
        if command.startswith("scancel"):
            return "", "", 0
        if command.startswith("srun "):  # a step: its tasks here
            args = shlex.split(command)
            self.steps.append(next(a for a in args if a.startswith("--job-name=")).split("=", 1)[1])
            nodes = next(a for a in args if a.startswith("--nodelist=")).split("=", 1)[1].split(",")
            out = ""
            for i, n in enumerate(nodes):
                res = subprocess.run(["bash", "-c", args[-1]], input=stdin, capture_output=True, env={"SLURMD_NODENAME": n, "PATH": PATH})
                out += "".join(f"{i}: {ln}\n" for ln in res.stdout.decode().splitlines())
            return out, "", 0
        res = subprocess.run(["bash", "-c", command], input=stdin, capture_output=True, env=self.env, timeout=60)
        return res.stdout.decode(errors="replace"), res.stderr.decode(errors="replace"), res.returncode


def _release(cluster) -> ReleasePlan:
    units = [Unit(host=n.name, container=f"c-{i}") for i, n in enumerate(cluster.nodes)]
    return ReleasePlan(system="x", cluster=cluster.name, release="r1", services=[Service("s", units=units)], entry_host=units[0].host, entry_port=1)


def _reads(cluster) -> list[Step]:
    return [Step(name="status", build=lambda n: f"echo status of {n.name}; date +%s%N", standing=True),
            Step(name="top", build=lambda n: f"echo top of {n.name}", standing=True)]


@pytest.fixture
def serving(tmp_path, b200, groups):
    """A release held by job 42 whose reader (started by the launcher, period 0.3 s) runs here."""
    c = _with_period(b200, 0.3, tmp_path / "log")
    runner = _Login(c, _login_env(tmp_path))
    said = []
    jobs = SlurmJobs(c, runner, said.append)
    runner.transport.use_job(JOB, "r1")
    jobs.held = "r1"
    steps._CHANGED.pop(c.name, None)
    jobs.serve_reads(_release(c), _reads(c))
    d = Path(reader.reader_dir(c, "r1"))
    groups.add_running(d)
    assert said and said[-1].startswith(f"slurm: a reader step in job {JOB} reads status, top on 2 nodes every 0.3s"), said
    yield c, runner, jobs, d
    steps._CHANGED.pop(c.name, None)
    groups.add_running(d)


def _status(c, runner):
    """A status command's read, as a fresh process's transport makes it."""
    t = SlurmSteps(runner)
    runner.transport = t
    return t.run(_reads(c)[0], c.nodes, None, None)


def test_200_status_reads_of_a_serving_release_start_no_step(tmp_path, serving):
    c, runner, jobs, d = serving
    assert _sruns(tmp_path) == 1  # the reader
    oldest = reader.max_age(c.slurm.reader_period_s)
    for _ in range(200):
        res = _status(c, runner)
        assert [r.status for r in res.values()] == ["ok", "ok"], res
        for n in c.nodes:
            assert res[n.name].stdout.startswith(f"status of {n.name}\n") and 0 <= res[n.name].age <= oldest
    assert runner.steps == [] and _sruns(tmp_path) == 1
    # a read that is not standing, or whose command differs by a byte, is a step as before
    t = SlurmSteps(runner)
    t.run(Step(name="status", build=lambda n: f"echo status of {n.name}; date +%s%N"), c.nodes, None, None)
    t.run(Step(name="status", build=lambda n: f"echo status of {n.name};  date +%s%N", standing=True), c.nodes, None, None)
    t.run(Step(name="watch", build=lambda n: "echo w", standing=True), c.nodes, None, None)
    assert runner.steps == ["status", "status", "watch"]


def test_a_status_asks_the_login_host_twice_and_its_view_reuses_the_queue(serving):
    """A fresh transport's status: sinfo and squeue in one command, then the
    reader's files; the launcher's view of the job takes that queue again
    (QUEUE_FRESH_S) instead of a third command. A command that may change
    the queue (anything not a read) or time makes it ask again."""
    c, runner, jobs, d = serving
    runner.login_commands.clear()
    res = _status(c, runner)
    assert [r.status for r in res.values()] == ["ok", "ok"] and runner.steps == []
    assert runner.login_commands == ["sinfo", "umask"], runner.login_commands  # sinfo+squeue, the reader's read
    view = SlurmJobs(c, runner, lambda m: None)
    view.s = runner.transport
    job, problem = view.release_job(_release(c))
    assert job.id == JOB and problem is None and runner.login_commands == ["sinfo", "umask"]
    runner.transport.login_exec("true")  # not a read: the queue may have changed
    view.release_job(_release(c))
    assert runner.login_commands[-1] == "squeue"
    runner.transport._queue = (time.monotonic() - steps.QUEUE_FRESH_S - 1, runner.transport._queue[1])
    view.release_job(_release(c))
    assert runner.login_commands[-2:] == ["squeue", "squeue"]


def test_the_nodes_states_and_the_queue_in_one_command():
    out = "n0|idle|none\n@@llmdeploy-squeue 0\n42|llmdeploy.c.r1|RUNNING|None|n0|UNLIMITED|N/A\n"
    assert slurm.split_squeue(out, 0) == ("n0|idle|none\n", "42|llmdeploy.c.r1|RUNNING|None|n0|UNLIMITED|N/A\n", 0)
    # sinfo failed: its exit code, squeue's answer still read; no mark (cut off): failed, no queue
    assert slurm.split_squeue("sinfo: error\n@@llmdeploy-squeue 1\n", 0) == ("sinfo: error\n", "", 1)
    assert slurm.split_squeue("n0|idle|none\n", 0) == ("n0|idle|none\n", None, 1)
    text = slurm.with_squeue(slurm.sinfo_command(["n0"]), "c")
    assert text.startswith("sinfo ") and '\necho "@@llmdeploy-squeue $?"\nsqueue --me ' in text


def test_after_a_change_only_a_newer_record_answers(serving):
    c, runner, jobs, d = serving
    t = runner.transport
    t.changed()  # a unit started by this process, say
    changed_at = time.monotonic()
    served = None
    end = time.monotonic() + 20
    while served is None and time.monotonic() < end:
        sent = time.monotonic()
        res = t.run(_reads(c)[0], c.nodes, None, None)
        if all(r.age > 0 for r in res.values()):
            served = (sent, res)
    assert served is not None, "no record newer than the change within 20 s"
    sent, res = served
    # what answered started after the change (and the margin): never a state from before it
    assert all(r.age + reader.MARGIN_S <= sent - changed_at for r in res.values())
    assert runner.steps and set(runner.steps) == {"status"}  # until then, steps


def test_a_reader_that_died_is_started_again_by_one_read(tmp_path, serving):
    c, runner, jobs, d = serving
    os.killpg(int((d / "running").read_text().split()[1]), signal.SIGKILL)
    oldest = reader.max_age(c.slurm.reader_period_s)
    end = time.monotonic() + 30
    answered_again = False
    while time.monotonic() < end and not answered_again:
        res = _status(c, runner)
        assert [r.status for r in res.values()] == ["ok", "ok"], res  # never a wrong answer meanwhile
        assert all(r.age <= oldest for r in res.values())
        answered_again = bool(runner.steps) and all(r.age > 0 for r in res.values())
        time.sleep(0.1)
    assert answered_again, runner.steps
    # one new reader step for the death, whatever number of reads found it gone
    assert _sruns(tmp_path) == 2


def test_the_end_of_the_release_ends_its_reader_and_its_files(serving):
    c, runner, jobs, d = serving
    pgid = int((d / "running").read_text().split()[1])
    job = slurm.parse_squeue(runner.exec_direct(None, "squeue")[0], c.name)[0]
    assert jobs._end(job, "r1", sorted(job.steps)) == []
    assert _gone(pgid) and not d.exists()


def test_a_reader_that_cannot_start_is_a_warning(tmp_path, b200):
    c = _with_period(b200, 1.0, tmp_path / "log")
    env = _login_env(tmp_path)
    (tmp_path / "bin" / "srun").write_text("#!/bin/bash\necho 'srun: error: Unable to create step for job 42: Job/step already completing or completed' >&2\nexit 1\n")
    runner = _Login(c, env)
    said = []
    jobs = SlurmJobs(c, runner, said.append)
    runner.transport.use_job(JOB, "r1")
    jobs.held = "r1"
    jobs.serve_reads(_release(c), _reads(c))
    assert "no reader step in job 42" in said[-1] and "already completing" in said[-1], said
    # the reads are steps then
    res = SlurmSteps(runner).run(_reads(c)[0], c.nodes, None, None)
    assert [r.status for r in res.values()] == ["ok", "ok"] and runner.steps == ["status"]


def test_the_flows_reads_are_the_readers(b200):
    """status, top, deploy's first read and the watcher build their reads in one place (flows/reads.py), each a standing step the reader runs as is."""
    from flows.reads import standing, status_read, top_read, watch_read
    from llmdeploy.releaseplan import Metrics, Probe
    from roles.status import current_script

    plan = _release(b200)
    plan.metrics = Metrics(probe=Probe(name="m", kind="http", host=b200.nodes[1].name, port=8000, ip="10.0.0.2", path="/metrics"))
    reads = {s.name: s for s in standing(bind(b200), plan)}
    assert list(reads) == ["current", "status", "top", "watch"] and all(s.standing for s in reads.values())
    n0, n1 = b200.nodes
    assert reads["current"].build(n0) == current_script(b200)
    rt = bind(b200).runtime
    assert reads["status"].build(n0) == status_read(bind(b200)).build(n0) == rt.status_script()
    assert reads["top"].build(n1) == top_read(bind(b200), plan, 5).build(n1) == rt.top_script(bind(b200).vendor.TOP_QUERY, ("10.0.0.2", 8000, "/metrics"))
    assert reads["top"].build(n0) == rt.top_script(bind(b200).vendor.TOP_QUERY, None)
    assert reads["watch"].build(n1) == watch_read(bind(b200), plan.units()).build(n1) == rt.states_script(["c-1"])
    assert all(reader.READ_RE.match(name) for name in reads)
