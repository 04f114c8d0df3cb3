"""Pyxis units on their node (launchers/slurm/units.py), run here:
a release directory in tmp_path, units that are real processes started
through the step's wrapper (each in a session of its own, killed at the
end), and the node's scripts run under sh and bash. They print what the
Docker scripts print, read by the same parsers (parse_states, parse_status,
parse_top, parse_logs) and the status flow's readers."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from flows import status as status_flow
from llmdeploy.container import ContainerSpec, Mount, read_docker_run
from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import load_cluster
from launchers.slurm import units
from launchers.slurm.commands import STARTED_MARK
from llmdeploy.release import releases_dir
from roles import containers as ctr
from roles.status import parse_logs, parse_status, parse_top
from flows.binding import bind

RID = "20260101T000000Z-abcdef01"
OLD = "20251231T000000Z-0badf00d"
CLUSTER = "sim-b200"
SHELLS = ["sh", "bash"]


def until(check, timeout: float = 10.0, what: str = "the condition"):
    """``check()``'s first true value within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"{what}: not within {timeout:g}s")


def start_time(pid: int) -> str:
    """/proc/<pid>/stat field 22 (the comm field may hold spaces and parentheses)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


class Node:
    """One node's releases directory and the units started on it."""

    def __init__(self, tmp_path: Path):
        self.tmp = tmp_path
        self.cluster = load_cluster(CLUSTER).model_copy(update={"base_dir": str(tmp_path / "base dir")})
        self.releases = releases_dir(self.cluster)
        self.procs: list[subprocess.Popen] = []

    def release(self, rid: str = RID) -> str:
        d = Path(self.releases) / rid
        (d / "logs").mkdir(parents=True, exist_ok=True)
        (d / "env").write_text("FROM_FILE=b c\nQUOTED=\"x\" 'y' \\z\n")
        return str(d)

    def spec(self, container: str, command: list[str], rid: str = RID, service: str = "svc", role: str = "worker",
             phase: int = 0, labels: dict[str, str] | None = None) -> ContainerSpec:
        """A unit's container, as the systems build it."""
        rd = self.release(rid)
        return ContainerSpec(name=container, image="nvcr.io/nvidia/x:1", command=tuple(command), network="host",
                             labels=ctr.label_values(CLUSTER, rid, service, role, phase) + tuple((labels or {}).items()),
                             mounts=(Mount(rd, rd),), env_files=(f"{rd}/env",))

    def start(self, container: str, command: list[str], attempt: int = 1, localid: int | None = None, env: dict | None = None,
              wait: bool = True, rid: str = RID, **kw) -> subprocess.Popen:
        """Start a unit's task through the step's wrapper, as its step would
        (its output, srun's on the login host: ``step_output``)."""
        run = self.spec(container, command, rid, **kw)
        argv = units.unit_command(run, self.release(rid), container, attempt)
        environ = {"PATH": os.environ["PATH"], **(env or {})}
        if localid is not None:
            environ["SLURM_LOCALID"] = str(localid)
        out = open(self._out(container, localid or 0, attempt), "wb")
        p = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=environ,
                             cwd=self.tmp, start_new_session=True)
        out.close()
        self.procs.append(p)
        if wait:
            task = Path(self.release(rid)) / "units" / container / f"task.{localid or 0}"
            until(lambda: task.exists() and STARTED_MARK in self.step_output(container, localid or 0, attempt), what=f"{container} started")
        return p

    def _out(self, container: str, localid: int, attempt: int) -> Path:
        return self.tmp / f"{container}.attempt-{attempt}.{localid}.step.log"

    def step_output(self, container: str, localid: int = 0, attempt: int = 1) -> str:
        p = self._out(container, localid, attempt)
        return p.read_text(errors="replace") if p.exists() else ""

    def record(self, container: str, rid: str = RID) -> Path:
        return Path(self.releases) / rid / "units" / container

    def task_pid(self, container: str, i: int = 0, rid: str = RID) -> int:
        return int((self.record(container, rid) / f"task.{i}").read_text().split()[0])

    def sh(self, script: str, shell: str = "sh", timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([shell, "-c", script], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)

    def states(self, names: list[str], shell: str = "sh") -> dict[str, tuple[str, str]]:
        res = self.sh(units.states_script(self.releases, names), shell)
        assert res.returncode == 0 and res.stderr == "", res
        return ctr.parse_states(res.stdout)

    def close(self) -> None:
        for p in self.procs:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(10)


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    try:
        yield n
    finally:
        n.close()


# a unit that ends when its test says so (the file "go" in its working directory), with the code it holds
ENDS_ON_GO = ["sh", "-c", 'echo "up $1"; while [ ! -f go ]; do sleep 0.05; done; echo bye >&2; exit "$(cat go)"', "unit", "arg"]


def go(node: "Node", code: str) -> None:
    """Let ENDS_ON_GO's unit end with ``code``: the file appears whole (written
    beside it, then renamed), so the unit never reads it empty (an ``exit ""``
    is sh's own error, status 2)."""
    tmp = node.tmp / "go.tmp"
    tmp.write_text(code)
    tmp.rename(node.tmp / "go")


# a unit that says which signals it got and ends on SIGTERM with 7
TRAPS = ["sh", "-c", 'trap "echo got USR1" USR1; trap "echo got TERM; exit 7" TERM; echo up; while :; do sleep 0.05; done']


@pytest.mark.parametrize("shell", SHELLS)
def test_a_unit_runs_then_exits_with_its_code(node, shell):
    p = node.start("u-1", ENDS_ON_GO)
    assert node.states(["u-1", "nope"], shell) == {"u-1": ("running", "0"), "nope": ("missing", "-")}
    rec = node.record("u-1")
    assert sorted(f.name for f in rec.iterdir()) == ["attempt", "cmd", "image", "labels", "started", "task.0"]
    assert (rec / "labels").read_text().splitlines() == [
        f"llmdeploy.cluster={CLUSTER}", f"llmdeploy.release={RID}", "llmdeploy.service=svc", "llmdeploy.role=worker", "llmdeploy.stop_phase=0"]
    assert (rec / "image").read_text() == "nvcr.io#nvidia/x:1\n"
    assert (rec / "cmd").read_bytes().split(b"\0")[:-1] == [w.encode() for w in ENDS_ON_GO]
    # the recorded pid is the command's own (the wrapper's child, which exec'd it), with its start time
    pid, start, wpid, wstart = (rec / "task.0").read_text().split()
    assert int(wpid) == p.pid and start == start_time(int(pid)) and wstart == start_time(p.pid)
    assert Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2] == [b"sh", b"-c"]
    go(node, "3")
    assert p.wait(10) == 3
    assert node.states(["u-1"], shell) == {"u-1": ("exited", "3")}
    assert (rec / "exit.0").read_text() == "3\n" and (rec / "finished").exists()
    # the unit's output in its log; the step's own (srun's, on the login host) has the marks and the log's end
    assert (Path(node.release()) / "logs" / "u-1.log").read_text() == "up arg\nbye\n"
    assert (Path(node.release()) / "logs" / "u-1.attempt").read_text() == "1\n"
    assert node.step_output("u-1").splitlines() == [f"{STARTED_MARK} u-1", "up arg", "bye", "@@llmdeploy-exit 3"]


def test_the_command_can_take_sigint_and_sigquit(node):
    """A background command of POSIX sh starts with SIGINT and SIGQUIT ignored
    (and cannot restore them): the wrapper runs its command in the foreground.
    (The command is not a shell: BusyBox's ash ignores SIGQUIT itself.)"""
    node.start("u-1", ["sleep", "300"])
    status = Path(f"/proc/{node.task_pid('u-1')}/status").read_text()
    ignored = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    assert ignored & (1 << (signal.SIGINT - 1) | 1 << (signal.SIGQUIT - 1)) == 0


@pytest.mark.parametrize("shell", SHELLS)
def test_a_signal_reaches_the_command(node, shell):
    p = node.start("u-1", TRAPS)
    log = Path(node.release()) / "logs" / "u-1.log"
    res = node.sh(units.signal_script(node.releases, ["u-1", "nope"], "USR1"), shell)
    assert res.returncode == 0 and res.stdout == "signalled u-1\n"
    until(lambda: "got USR1" in log.read_text(), what="USR1 seen")
    assert node.states(["u-1"], shell)["u-1"] == ("running", "0")
    assert node.sh(units.signal_script(node.releases, ["u-1"], "TERM"), shell).stdout == "signalled u-1\n"
    assert p.wait(10) == 7
    assert node.states(["u-1"], shell)["u-1"] == ("exited", "7") and "got TERM" in log.read_text()
    # an exited unit is not signalled (docker kill of a stopped container fails)
    assert node.sh(units.signal_script(node.releases, ["u-1"], "TERM"), shell).stdout == ""
    with pytest.raises(ValueError):
        units.signal_script(node.releases, ["u-1"], "KILL; rm -rf /")


@pytest.mark.parametrize("shell", SHELLS)
def test_stop_ends_the_units_keeps_their_final_logs_and_removes_them(node, shell):
    old = node.start("old-1", TRAPS, rid=OLD, role="node0", phase=1)
    cur = node.start("cur-1", TRAPS)
    assert node.sh(units.phases_script(CLUSTER, node.releases, None), shell).stdout.split() == ["0", "1"]
    assert node.sh(units.phases_script(CLUSTER, node.releases, RID), shell).stdout.split() == ["1"]
    # phase 1 of every release but the kept one: the old release's unit only
    res = node.sh(units.stop_script(CLUSTER, node.releases, RID, 5, phase=1), shell)
    assert res.returncode == 0 and res.stdout == "stopped old-1\n", res
    assert old.wait(5) == 7  # its own exit on SIGTERM, not the SIGKILL after the timeout
    assert (Path(node.release(OLD)) / "logs" / "old-1.final.log").read_text() == "up\ngot TERM\n"
    assert not (Path(node.release(OLD)) / "logs" / "old-1.log").exists()
    # removed, as docker rm: missing, and no longer listed
    assert node.states(["old-1", "cur-1"], shell) == {"old-1": ("missing", "-"), "cur-1": ("running", "0")}
    assert node.sh(units.phases_script(CLUSTER, node.releases, RID), shell).stdout.split() == []
    # another cluster's units are not this one's to stop
    assert node.sh(units.stop_script("other", node.releases, None, 5), shell).stdout == ""
    assert node.sh(units.stop_script(CLUSTER, node.releases, None, 5), shell).stdout == "stopped cur-1\n"
    assert cur.wait(5) == 7 and node.states(["cur-1"], shell) == {"cur-1": ("missing", "-")}
    assert list((Path(node.releases) / RID / "units").iterdir()) == []


def test_stop_kills_what_ignores_sigterm_and_what_the_unit_started(node):
    """A command that does not end on SIGTERM is SIGKILLed after the timeout,
    and the processes it started go with it (docker stop ends the whole
    container): its log shows the SIGTERM came first, its exit the SIGKILL."""
    stubborn = ["sh", "-c", 'trap "echo got TERM" TERM; sleep 300 & echo $! > child; echo up; while :; do sleep 0.1; done']
    p = node.start("u-1", stubborn)
    child = int(until(lambda: (node.tmp / "child").exists() and (node.tmp / "child").read_text().strip(), what="child"))
    pid = node.task_pid("u-1")
    res = node.sh(units.stop_units_script(CLUSTER, node.releases, node.release(), ["u-1", "nope"], 1, "attempt-1"))
    assert res.stdout == "stopped u-1\n", res
    assert not alive(pid) and not alive(child)
    assert p.wait(5) == 137
    assert (Path(node.release()) / "logs" / "u-1.attempt-1.log").read_text() == "up\ngot TERM\n"
    assert node.states(["u-1"]) == {"u-1": ("missing", "-")}


def test_a_command_shell_that_dies_on_sigterm_leaves_nothing_behind(node):
    """The command a shell that did not exec its server: SIGTERM ends the
    shell, and its child (orphaned) is SIGKILLed as the rest of a container."""
    p = node.start("u-1", ["sh", "-c", 'sleep 300 & echo $! > child; echo up; wait'])
    child = int(until(lambda: (node.tmp / "child").exists() and (node.tmp / "child").read_text().strip(), what="child"))
    assert node.sh(units.stop_script(CLUSTER, node.releases, None, 30)).stdout == "stopped u-1\n"
    assert not alive(child) and p.wait(5) == 143


@pytest.mark.parametrize("shell", SHELLS)
def test_a_sigkilled_step_reads_exited_137(node, shell):
    """scancel (SIGKILL to the step's processes): no exit code was written; Docker says 137."""
    p = node.start("u-1", TRAPS)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait(5)
    assert node.states(["u-1"], shell) == {"u-1": ("exited", "137")}
    assert not (node.record("u-1") / "exit.0").exists()


def test_a_reused_pid_or_a_zombie_is_not_the_unit(node):
    rec = node.record("u-1")
    rec.mkdir(parents=True)
    (rec / "labels").write_text(f"llmdeploy.cluster={CLUSTER}\n")
    me = os.getpid()
    # this process, alive, but not the one that started at the recorded time
    (rec / "task.0").write_text(f"{me} 12345 {me} 12345\n")
    assert node.states(["u-1"]) == {"u-1": ("exited", "137")}
    # the same pid with its own start time is running: the start time is what tells them apart
    (rec / "task.0").write_text(f"{me} {start_time(me)} {me} 1\n")
    assert node.states(["u-1"]) == {"u-1": ("running", "0")}
    # a zombie (ended, not reaped yet) is not running
    z = subprocess.Popen(["true"])
    try:
        until(lambda: not alive(z.pid), what="a zombie")
        (rec / "task.0").write_text(f"{z.pid} {start_time(z.pid)} {me} 1\n")
        assert node.states(["u-1"]) == {"u-1": ("exited", "137")}
    finally:
        z.wait()
    # a record whose tasks have not started their command yet
    (rec / "task.0").unlink()
    assert node.states(["u-1"]) == {"u-1": ("created", "0")}


def test_every_task_must_run_and_the_highest_code_is_the_units(node):
    """A step of two tasks: task 1 waits for task 0's record; the unit runs
    while both do, and exits with the highest code when one ended."""
    cmd = ["sh", "-c", 'echo "task $SLURM_LOCALID"; while [ ! -f "go.$SLURM_LOCALID" ]; do sleep 0.05; done; exit "$(cat go.$SLURM_LOCALID)"']
    t1 = node.start("u-1", cmd, localid=1, wait=False)
    time.sleep(0.3)
    assert t1.poll() is None and not node.record("u-1").exists()
    t0 = node.start("u-1", cmd, localid=0)
    until(lambda: (node.record("u-1") / "task.1").exists(), what="task 1's record")
    assert node.states(["u-1"]) == {"u-1": ("running", "0")}
    (node.tmp / "go.1").write_text("5")
    assert t1.wait(10) == 5
    assert node.states(["u-1"]) == {"u-1": ("exited", "5")}
    (node.tmp / "go.0").write_text("2")
    assert t0.wait(10) == 2
    assert node.states(["u-1"]) == {"u-1": ("exited", "5")}
    log = (Path(node.release()) / "logs" / "u-1.log").read_text()
    assert sorted(log.splitlines()) == ["task 0", "task 1"]
    assert STARTED_MARK not in node.step_output("u-1", 1)  # task 0 says the unit started, once


def test_a_restart_keeps_the_previous_attempts_log_and_ends_what_still_ran(node):
    first = node.start("u-1", ENDS_ON_GO)
    go(node, "1")
    assert first.wait(10) == 1
    (node.tmp / "go").unlink()
    second = node.start("u-1", TRAPS, attempt=2)
    logs = Path(node.release()) / "logs"
    assert (logs / "u-1.attempt-1.log").read_text() == "up arg\nbye\n"
    assert (logs / "u-1.log").read_text() == "up\n" and (logs / "u-1.attempt").read_text() == "2\n"
    assert (node.record("u-1") / "attempt").read_text() == "2\n" and not (node.record("u-1") / "exit.0").exists()
    assert node.states(["u-1"]) == {"u-1": ("running", "0")}
    # a start over a unit that still runs ends it first (docker rm -f)
    node.start("u-1", ENDS_ON_GO, attempt=3)
    assert second.wait(10) == 137
    assert (logs / "u-1.attempt-2.log").read_text() == "up\n"
    # the replaced start's wrapper did not write into the new record
    assert node.states(["u-1"]) == {"u-1": ("running", "0")} and not (node.record("u-1") / "exit.0").exists()


def test_an_environment_file_that_cannot_be_read_is_a_failed_start(node):
    run = read_docker_run(f"docker run -d --env-file {node.release()}/missing.env img sh -c 'echo never'")
    p = subprocess.Popen(units.unit_command(run, node.release(), "u-1", 1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    node.procs.append(p)
    out = p.communicate(timeout=10)[0].decode()
    assert p.returncode == 125
    # no start mark: the login host's check reads the failure and why
    assert STARTED_MARK not in out and "cannot read the environment file" in out and out.endswith("@@llmdeploy-exit 125\n")
    assert node.states(["u-1"]) == {"u-1": ("exited", "125")}


@pytest.mark.parametrize("shell", SHELLS)
def test_wait_port_answers_as_dockers(node, shell):
    p = node.start("u-1", ENDS_ON_GO)
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        res = node.sh(units.wait_port_script(node.releases, "u-1", "127.0.0.1", port, 10), shell)
        assert (res.returncode, res.stdout) == (0, "open\n")
    res = node.sh(units.wait_port_script(node.releases, "u-1", "127.0.0.1", port, 1), shell)
    assert (res.returncode, res.stdout) == (4, "timeout\n")
    go(node, "3")
    p.wait(10)
    res = node.sh(units.wait_port_script(node.releases, "u-1", "127.0.0.1", port, 30), shell)
    assert (res.returncode, res.stdout) == (3, "container exited 3\n")
    res = node.sh(units.wait_port_script(node.releases, "nope", "127.0.0.1", port, 30), shell)
    assert res.returncode == 3


# values a JSON writer in shell gets wrong: quotes, backslashes, newlines, tabs, control bytes, unicode
ODD = 'a "quoted" \\back\\slash\\ \t tab\nnew line é ✓ 𝄞 \x01 end'


@pytest.mark.parametrize("shell", SHELLS)
def test_status_reads_the_units_as_docker_inspect(node, shell):
    odd_label = 'q"u\\o\tté ✓ $(x) `y`'
    node.start("u-1", ["sh", "-c", "echo up; exec sleep 300", ODD], labels={"odd": odd_label}, service="decode0",
               env={"ODD_ENV": ODD, "EMPTY": ""})
    p2 = node.start("u-2", ENDS_ON_GO, rid=OLD, role="node0", phase=1)
    go(node, "4")
    p2.wait(10)
    Path(node.cluster.base_dir, CLUSTER, "current").symlink_to(f"releases/{RID}")
    res = node.sh(units.status_script(node.cluster), shell)
    assert res.returncode == 0, res
    st = parse_status(res.stdout)
    assert st["release"] == RID and st["docker_error"] is None and st["env"]["FROM_FILE"] == "b c"
    assert sorted(st["containers"]) == ["u-1", "u-2"]
    c = st["containers"]["u-1"]
    assert c["Name"] == "/u-1" and c["Image"] == c["Config"]["Image"] == "nvcr.io#nvidia/x:1"
    s = c["State"]
    assert (s["Status"], s["Running"], s["ExitCode"], s["Pid"]) == ("running", True, 0, node.task_pid("u-1"))
    assert s["StartedAt"] == (node.record("u-1") / "started").read_text().strip() and s["FinishedAt"].startswith("0001-")
    assert c["Config"]["Labels"] == {"llmdeploy.cluster": CLUSTER, "llmdeploy.release": RID, "llmdeploy.service": "decode0",
                                     "llmdeploy.role": "worker", "llmdeploy.stop_phase": "0", "odd": odd_label}
    env = dict(e.split("=", 1) for e in c["Config"]["Env"])
    assert env["ODD_ENV"] == ODD and env["EMPTY"] == "" and env["FROM_FILE"] == "b c" and env["QUOTED"] == "\"x\" 'y' \\z"
    assert "LLMDEPLOY_ENV_FILES" not in env
    assert c["Config"]["Cmd"] == ["sh", "-c", "echo up; exec sleep 300", ODD]
    gone = st["containers"]["u-2"]
    assert (gone["State"]["Status"], gone["State"]["Running"], gone["State"]["ExitCode"], gone["Config"]["Env"]) == ("exited", False, 4, [])
    assert gone["State"]["FinishedAt"] == (node.record("u-2", OLD) / "finished").read_text().strip()
    # what the status flow reads of them
    assert status_flow._state(c) == "running" and status_flow._state(gone) == "exited (4)"
    assert status_flow._uptime(c).endswith("s") and status_flow._uptime(gone) == "-"
    # inspect of named units (a failure bundle's): one line each, exit 1 for one that has none
    res = node.sh(units.inspect_script(node.releases, ["u-2", "nope"]), shell)
    assert res.returncode == 1 and json.loads(res.stdout)["State"]["ExitCode"] == 4


def test_top_reads_the_units_as_docker_inspect(node):
    node.start("u-1", TRAPS, service="decode0")
    node.start("u-2", ENDS_ON_GO, attempt=3, service="prefill0", role="node0", phase=1)
    go(node, "1")
    until(lambda: (node.record("u-2") / "exit.0").exists(), what="u-2 ended")
    Path(node.cluster.base_dir, CLUSTER, "current").symlink_to(f"releases/{RID}")
    res = node.sh(units.top_script(node.cluster, bind(node.cluster).vendor.TOP_QUERY))
    got = parse_top(res.stdout, bind(node.cluster).vendor)
    assert got["release"] == RID and got["attempts"] == {"u-1": 1, "u-2": 3}
    by = {u["name"]: u for u in got["units"]}
    assert by["u-1"] == {"name": "u-1", "state": "running", "started": (node.record("u-1") / "started").read_text().strip(),
                         "service": "decode0", "release": RID}
    assert by["u-2"]["state"] == "exited" and by["u-2"]["service"] == "prefill0"


@pytest.mark.parametrize("shell", SHELLS)
def test_logs_lists_the_units_in_start_order_with_their_logs(node, shell):
    node.start("a-worker", ["sh", "-c", 'printf "w1\\nw2\\nw3\\n"; exec sleep 300'], service="workers")
    node.start("z-head", ["sh", "-c", 'printf "h1\\nh2\\n"; exec sleep 300'], service="head", role="node0", phase=1)
    res = node.sh(units.logs_script(node.cluster, None, []), shell)
    assert res.returncode == 0, res
    found, logs = parse_logs(res.stdout)
    assert found == [("z-head", "head"), ("a-worker", "workers")]
    assert logs == {"z-head": ["h1", "h2"], "a-worker": ["w1", "w2", "w3"]}
    found, logs = parse_logs(node.sh(units.logs_script(node.cluster, "workers", ["--tail", "1"]), shell).stdout)
    assert logs == {"a-worker": ["w3"]}
    assert parse_logs(node.sh(units.logs_script(node.cluster, None, [], with_logs=False), shell).stdout)[1] == {}
    with pytest.raises(LlmdeployError, match="--since"):
        units.logs_script(node.cluster, None, ["--since", "10m"])
    follow = subprocess.Popen([shell, "-c", units.follow_command(node.cluster, "a-worker", ["--tail", "2"])], stdout=subprocess.PIPE,
                              start_new_session=True)
    node.procs.append(follow)
    assert [follow.stdout.readline() for _ in range(2)] == [b"w2\n", b"w3\n"]


def test_the_step_mounts_its_release_directory_and_runs_the_wrapper():
    rd = "/var/lib/llmdeploy/h/releases/" + RID
    # SGLang's line mounts only the model cache; its environment file is in the release directory
    line = f"docker run -d --name h-1 --label llmdeploy.cluster=h --net=host -v /root/.cache:/root/.cache --env-file {rd}/env img python3 -m x"
    run = read_docker_run(line)
    args = units.unit_step_args(run, rd, "h-1", 2, f"{RID}.h-1")
    assert f"--container-mounts=/root/.cache:/root/.cache,{rd}:{rd}" in args and f"--container-name={RID}.h-1" in args
    assert args[-3:] == ["python3", "-m", "x"] and args[args.index("env") + 1] == f"LLMDEPLOY_ENV_FILES={rd}/env"
    # a line that mounts it (or a directory above it) read-write is left as it is
    for mount in (f"{rd}:{rd}", "/var/lib/llmdeploy:/var/lib/llmdeploy"):
        run = read_docker_run(line.replace("/root/.cache:/root/.cache", mount))
        assert f"--container-mounts={mount}" in units.unit_step_args(run, rd, "h-1", 1, "x")
    run = read_docker_run(line.replace("/root/.cache:/root/.cache", f"{rd}:{rd}:ro"))
    assert f"--container-mounts={rd}:{rd}:ro,{rd}:{rd}" in units.unit_step_args(run, rd, "h-1", 1, "x")
    with pytest.raises(ValueError):
        units.unit_command(run, rd, "../escape", 1)
    with pytest.raises(ValueError):
        units.states_script("/r", ["a/b"])


def test_a_failure_bundle_runs_the_pyxis_units_scripts(tmp_path):
    """The bundle's sections are scripts of many lines on pyxis: the node's
    part of the bundle is one script bash runs (a section's group closes on
    a line of its own), and a unit without a record still gives the others."""
    from llmdeploy import logs

    c = load_cluster("sim-b200-slurm")
    sections = units.PyxisUnits(c).bundle_sections(["a-1", "b-2"], 1000) + [("extra.txt", "echo one\necho two\n")]
    script = logs.bundle_script(c, c.nodes[0], str(tmp_path / "rel"), sections, bind(c).vendor.LOG_FILES)
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    files = logs.split_bundle(res.stdout)
    assert {"a-1.log", "a-1.inspect.json", "b-2.log", "b-2.inspect.json", "extra.txt", "kernel.log", "node.txt"} <= set(files), (res.stderr, files)
    assert files["extra.txt"].split() == ["one", "two"]


@pytest.mark.parametrize("plain", [True, False])
def test_a_unit_that_is_no_world_sees_no_step_variables(tmp_path, plain):
    """A pyxis unit that is not a launched world starts with the environment
    Docker would give it: no SLURM_*, PMIX_*, PMI_* or OMPI_* (an mpirun in it,
    Dynamo's worker group on one node, would take the step for its allocation
    and find one slot); Slurm's CUDA_VISIBLE_DEVICES stays. A world keeps them (PMIx)."""
    rd = str(tmp_path / "rel")
    run = read_docker_run("docker run -d --name c img env")
    argv = units.unit_command(run, rd, "c", 1, plain=plain)
    step_env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_LOCALID": "0", "SLURMD_NODENAME": "n0", "PMIX_RANK": "0",
                "OMPI_MCA_x": "1", "CUDA_VISIBLE_DEVICES": "0,1"}
    res = subprocess.run(argv, capture_output=True, text=True, env=step_env, timeout=60)
    assert res.returncode == 0, res.stderr
    seen = dict(line.split("=", 1) for line in (tmp_path / "rel" / "logs" / "c.log").read_text().splitlines() if "=" in line)
    assert seen["CUDA_VISIBLE_DEVICES"] == "0,1"
    gone = {"SLURM_JOB_ID", "SLURM_LOCALID", "SLURMD_NODENAME", "PMIX_RANK", "OMPI_MCA_x"}
    assert (gone & set(seen)) == (set() if plain else gone), seen


def test_the_stop_removes_the_enroot_containers_of_units_that_no_longer_run(node, tmp_path):
    """Under pyxis's default global scope a step's named container outlives
    its job (pyxis config.c): a node's stop scripts remove every one of this
    cluster's (pyxis_[<job>_]<release>.<unit>.<attempt>) but the running
    start's of each unit, and leave other clusters' and other names alone.
    ``enroot`` here is a stand-in that lists and removes names in a file."""
    rid = RID
    node.start(f"{CLUSTER}-w", ["sleep", "300"], attempt=2)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    names = tmp_path / "enroot-names"
    kept = [f"pyxis_{rid}.{CLUSTER}-w.2", f"pyxis_20260101T000000Z-00000000.{CLUSTER}-w.1", f"pyxis_{rid}.other-u.1", "pyxis_other", "mine"]
    names.write_text("\n".join([f"pyxis_{rid}.{CLUSTER}-w.1", f"pyxis_77_{rid}.{CLUSTER}-v.3", *kept]) + "\n")
    (bin_dir / "enroot").write_text(
        "#!/bin/sh\n"
        f'f={shlex.quote(str(names))}\n'
        'case $1 in list) cat "$f" ;; remove) [ "$2" = -f ] && grep -vxF "$3" "$f" > "$f.new"; mv "$f.new" "$f" ;; *) exit 2 ;; esac\n')
    (bin_dir / "enroot").chmod(0o755)
    res = subprocess.run(["sh", "-c", units.FUNCS + f"llu_enroot_gc {shlex.quote(CLUSTER)} {shlex.quote(node.releases)}\n"],
                         capture_output=True, text=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin"}, timeout=60)
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.split("\n")) == sorted(["", f"removed enroot container pyxis_{rid}.{CLUSTER}-w.1",
                                                     f"removed enroot container pyxis_77_{rid}.{CLUSTER}-v.3"])
    # the running start (attempt 2) stays; so do a release this cluster does not have, another cluster's unit, other names
    assert names.read_text().split() == kept
