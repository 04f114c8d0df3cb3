"""The tests' forkserver (tests/forkserver.py): a command forked from it
gives what ``python -m invoke`` gives as a fresh process (exit status,
stdout, stderr), reads the environment it is given, not the server's, is
killed at its timeout, and the server ends with the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests import forkserver
from tests.conftest import INVOKE, REPO, tool_env


@pytest.fixture()
def forks():
    client = forkserver.Client(REPO, base_env=tool_env())
    yield client
    client.close()


def fresh(*args, env=None):
    return subprocess.run(INVOKE + list(args), cwd=REPO, capture_output=True, text=True, env=tool_env(env), stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("args", [
    ["--list"],
    ["-h"],
    ["--help", "deploy"],
    ["status"],  # no --cluster: exit 1, the inventories named
    ["status", "--cluster", "no-such-cluster"],  # exit 2
    ["no-such-task"],
])
def test_a_forked_command_says_and_exits_as_a_fresh_process(forks, args):
    got = forks.run(INVOKE + args, env=tool_env(), cwd=REPO, timeout=60)
    want = fresh(*args)
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr)
    assert got.args == INVOKE + args
    assert forks.proc is not None and forks.proc.poll() is None  # forked, not run fresh


def _broken(tmp_path):
    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "broken_fork.py").write_text("raise RuntimeError('read at run time')\n")
    return inv


def test_each_command_reads_its_own_environment(forks, tmp_path):
    forks.run(INVOKE + ["--list"], env=tool_env(), cwd=REPO, timeout=60)  # the server runs, started without it
    inv = _broken(tmp_path)
    got = forks.run(INVOKE + ["facts", "--cluster", "broken-fork"], env=tool_env({"LLMDEPLOY_INVENTORY": str(inv)}), cwd=REPO, timeout=60)
    assert got.returncode == 2 and "broken_fork.py" in got.stderr and "read at run time" in got.stderr, got.stderr
    # and the next command, without it, does not see it
    got = forks.run(INVOKE + ["facts", "--cluster", "broken-fork"], env=tool_env(), cwd=REPO, timeout=60)
    assert got.returncode == 2 and "read at run time" not in got.stderr and "no such inventory file" in got.stderr, got.stderr


def test_what_is_read_at_start_of_another_value_runs_a_fresh_process(forks, tmp_path):
    forks.run(INVOKE + ["--list"], env=tool_env(), cwd=REPO, timeout=60)
    assert not forks.fresh(tool_env())
    for extra in ({"PYTHONHASHSEED": "7"}, {"LANG": "C"}, {"LC_ALL": "C"}, {"TZ": "Asia/Tokyo"}, {"INVOKE_DEBUG": "1"},
                  {forkserver.ENABLE_ENV: "0"}):
        assert forks.fresh(tool_env(extra)), extra


# inventory files the command executes: each ends the command otherwise (they run in the child, at run time)
ENDINGS = {
    "killed by a signal": "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n",
    "atexit and a thread": ("import atexit, sys, threading, time\natexit.register(lambda: print('atexit ran', flush=True))\n"
                            "threading.Thread(target=lambda: (time.sleep(0.3), print('thread joined', flush=True))).start()\n"
                            "print('out ' * 50000)\nsys.stderr.write('err ' * 30000)\nraise SystemExit('bye from the inventory')\n"),
    "KeyboardInterrupt": "raise KeyboardInterrupt\n",
}


@pytest.mark.parametrize("ending", sorted(ENDINGS))
def test_a_command_ends_as_a_fresh_process_ends(forks, tmp_path, ending):
    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "ends_fork.py").write_text(ENDINGS[ending])
    env = tool_env({"LLMDEPLOY_INVENTORY": str(inv)})
    got = forks.run(INVOKE + ["facts", "--cluster", "ends-fork"], env=env, cwd=REPO, timeout=60)
    want = subprocess.run(INVOKE + ["facts", "--cluster", "ends-fork"], cwd=REPO, capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=60)
    assert (got.returncode, got.stdout, got.stderr) == (want.returncode, want.stdout, want.stderr), ending
    assert forks.proc is not None and forks.proc.poll() is None


def _hanging(tmp_path):
    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "hangs_fork.py").write_text("import time\ntime.sleep(3600)\n")
    return tool_env({"LLMDEPLOY_INVENTORY": str(inv)})


def test_a_command_past_its_timeout_is_killed_and_raises_as_subprocess_run(forks, tmp_path):
    env = _hanging(tmp_path)
    forks.run(INVOKE + ["--list"], env=tool_env(), cwd=REPO, timeout=60)
    before = set(_children(forks))
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as err:
        forks.run(INVOKE + ["facts", "--cluster", "hangs-fork"], env=env, cwd=REPO, timeout=2)
    assert time.monotonic() - t0 < 2 + 5
    assert err.value.cmd == INVOKE + ["facts", "--cluster", "hangs-fork"] and err.value.timeout == 2
    # the child is gone: killed, and reaped by the server, before run() raised
    assert set(_children(forks)) - before == set()


def test_a_wait_interrupted_otherwise_kills_the_command(forks, tmp_path):
    """pytest-timeout's alarm or a Ctrl-C in the test: the command does not go on behind it."""
    env = _hanging(tmp_path)
    forks.run(INVOKE + ["--list"], env=tool_env(), cwd=REPO, timeout=60)
    before = set(_children(forks))

    class Alarm(Exception):
        pass

    def ring(signum, frame):
        raise Alarm()

    old = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, 1.5)
    try:
        with pytest.raises(Alarm):
            forks.run(INVOKE + ["facts", "--cluster", "hangs-fork"], env=env, cwd=REPO, timeout=600)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    end = time.monotonic() + 5
    while set(_children(forks)) - before and time.monotonic() < end:
        time.sleep(0.05)
    assert set(_children(forks)) - before == set()
    # and the server still serves
    assert forks.run(INVOKE + ["--list"], env=tool_env(), cwd=REPO, timeout=60).returncode == 0


def _children(forks) -> list[int]:
    pid = forks.proc.pid
    return [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]


def test_the_server_ends_with_the_process_that_started_it():
    code = textwrap.dedent("""
        import sys
        from tests import forkserver
        from tests.conftest import INVOKE, REPO, tool_env
        c = forkserver.Client(REPO)
        assert c.run(INVOKE + ["--list"], env=tool_env(), cwd=REPO, timeout=60).returncode == 0
        print(c.proc.pid, flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, env=tool_env(), timeout=120)
    assert out.returncode == 0, out.stderr
    pid = int(out.stdout.split()[0])
    end = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.05)
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
    finally:
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
