"""The tests' forkserver (tests/forkserver.py): a command forked from it
gives what ``python -m invoke`` gives as a fresh process (exit status,
stdout, stderr), reads the environment it is given, not the server's, is
killed at its timeout, and the server ends with the process that started it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from tests import forkserver
from tests.conftest import INVOKE, REPO, tool_env


@pytest.fixture()
def forks():
    client = forkserver.Client(REPO)
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


def test_python_variables_of_another_value_run_a_fresh_process(forks, tmp_path):
    forks.run(INVOKE + ["--list"], env=tool_env(), cwd=REPO, timeout=60)
    assert not forks.fresh(tool_env())
    assert forks.fresh(tool_env({"PYTHONHASHSEED": "7"}))
    assert forks.fresh(tool_env({forkserver.ENABLE_ENV: "0"}))


def test_a_command_past_its_timeout_is_killed_and_raises_as_subprocess_run(forks, tmp_path):
    # a node whose SSH port accepts and never answers: the command waits for its banner
    listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(4)]
    ports = [lst.getsockname()[1] for lst in listeners]
    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "hangs_fork.py").write_text(textwrap.dedent(f"""
        from llmdeploy.inventory import Cluster, Model, Node
        from systems.vllm_ascend.catalogue import IMAGE_A3, image, vllm_a3_w8a8
        nodes = [Node(name=f"n{{i}}", ip=f"192.0.2.{{10 + i}}", ssh_host="127.0.0.1", ssh_port=port) for i, port in enumerate({ports})]
        cluster = Cluster(name="hangs-fork", platform="a3", nic="eth0", nodes=nodes, model=Model(path="/models/x"),
                          image=image(IMAGE_A3), profile=vllm_a3_w8a8())
    """))
    forks.run(INVOKE + ["--list"], env=tool_env(), cwd=REPO, timeout=60)
    before = set(_children(forks))
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as err:
        forks.run(INVOKE + ["facts", "--cluster", "hangs-fork"], env=tool_env({"LLMDEPLOY_INVENTORY": str(inv)}), cwd=REPO, timeout=3)
    assert time.monotonic() - t0 < 30
    assert err.value.cmd == INVOKE + ["facts", "--cluster", "hangs-fork"] and err.value.timeout == 3
    for lst in listeners:
        lst.close()
    # the child is gone (the server reaped it)
    end = time.monotonic() + 10
    while set(_children(forks)) - before and time.monotonic() < end:
        time.sleep(0.05)
    assert not set(_children(forks)) - before


def _children(forks) -> list[int]:
    pid = forks.proc.pid
    try:
        return [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except FileNotFoundError:
        return []


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
