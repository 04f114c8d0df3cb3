"""The connection holder (transports/ssh/mux.py) without a node: its wire format,
its identity, and how a Runner reads its answers (a holder whose runner is a
stand-in serves a Unix socket in this process)."""

import os
import socket
import threading
import time

import pytest

from llmdeploy.inventory import load_cluster
from llmdeploy.runner import ConnectionLost, Step, UnreachableError
from transports.ssh import mux
from flows.binding import bind


def test_a_socket_path_longer_than_a_unix_socket_takes_is_refused_at_once(short_tmp, monkeypatch):
    long = short_tmp / ("d" * 90)
    long.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(long))
    client = mux.Client(load_cluster("a3"), None)
    client.ensure()  # forks no holder that could never listen
    with pytest.raises(OSError, match=r"longer than the 107 bytes a Unix socket's path holds.*XDG_RUNTIME_DIR"):
        client.connect()
    assert not list((long / "llmdeploy-mux").glob("*.log"))  # no holder was started, none is waited for


def test_frames_carry_json_and_bytes():
    a, b = socket.socketpair()
    with a, b:
        mux.send_frame(a, {"op": "exec", "command": "é", "stdin": 3}, b"\x00\xffz")
        assert mux.recv_frame(b) == {"op": "exec", "command": "é", "stdin": 3}
        assert mux._recv_exact(b, 3) == b"\x00\xffz"
        a.close()
        with pytest.raises(EOFError):
            mux.recv_frame(b)


def test_identity_follows_the_inventory_and_the_trusted_keys(short_tmp, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp))
    kh = short_tmp / "known_hosts"
    kh.write_text("h1 ssh-ed25519 AAAA\n")
    c = load_cluster("a3")
    c = c.model_copy(update={"ssh": c.ssh.model_copy(update={"known_hosts": str(kh), "persist_s": 60})})
    one = mux.identity(c)
    assert mux.identity(c) == one
    kh.write_text("h1 ssh-ed25519 BBBB\n")
    assert mux.identity(c) != one
    other = c.model_copy(update={"nodes": c.nodes[:-1]})
    assert mux.identity(other) not in (one, mux.identity(c))
    path = mux.socket_path(c)
    assert path.parent == short_tmp / "llmdeploy-mux" and path.parent.stat().st_mode & 0o777 == 0o700
    assert path.name.startswith("a3-") and len(str(path)) < 108
    # holders() of a3 are a3's, not those of a cluster whose name starts with a3-
    for name in (path.name, "a3-x-0123456789abcdef.sock", "a3-0123456789abcdef.sock.log"):
        (path.parent / name).touch()
    assert [p.name for p in mux.holders("a3")] == sorted([path.name])


class _Stand:
    """The holder's runner: answers by command."""

    def __init__(self, cluster):
        self.cluster = cluster

    def _exec(self, node, command, timeout, stdin, on_line=None):
        if command == "talk":  # a command that prints as it runs (progress)
            assert on_line is not None, "the holder was not asked for the lines"
            on_line("err", "@@llmdeploy-progress@@ 1 2 files first")
            on_line("out", "some output")
            on_line("err", "@@llmdeploy-progress@@ 2 2 files second")
            return "some output\n", "@@llmdeploy-progress@@ 2 2 files second\nwarning\n", 0, None
        if command == "quiet":
            assert on_line is None, "lines sent that nobody asked for"
            return "", "", 0, None
        if command == "unreachable":
            raise UnreachableError("connection refused by 10.0.0.1:22 (is sshd running?)")
        if command == "lost":
            raise ConnectionLost("the server closed the connection", 2.5)
        if command == "bug":
            raise KeyError("x")
        if command == "late":
            return "part", "", 124, (timeout, "sent SIGTERM to its processes on the host")
        return f"{node.name} {command} {len(stdin or b'')}", "err", 3, None

    def close(self):
        pass


@pytest.fixture
def holder(short_tmp, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp))
    c = load_cluster("a3")
    c = c.model_copy(update={"ssh": c.ssh.model_copy(update={"persist_s": 60})})
    path = mux.socket_path(c)
    h = mux.Holder(c, path, 60, runner=_Stand(c))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    t = threading.Thread(target=h.serve, args=(server,), daemon=True)
    t.start()
    yield c
    assert mux._request(path, "exit") is not None
    t.join(5)
    server.close()
    assert not t.is_alive() and not path.exists()  # its socket's path went with it


def test_a_runner_reads_the_holders_answers_as_its_own(holder):
    c = holder
    with bind(c).runner() as r:
        assert r.exec(c.nodes[1], "cmd", stdin=b"abc") == (f"{c.nodes[1].name} cmd 3", "err", 3)
        assert r.round_trips[c.nodes[1].name] == 1
        with pytest.raises(UnreachableError, match="connection refused by 10.0.0.1:22"):
            r.exec(c.nodes[0], "unreachable")
        with pytest.raises(ConnectionLost, match="the server closed the connection"):
            r.exec(c.nodes[0], "lost")
        res = r.run(Step(name="s", build=lambda n: "late"), [c.nodes[0]])[c.nodes[0].name]
        assert res.status == "failed" and "timed out after 120s at step 's'" in res.msg and "sent SIGTERM" in res.msg
        res = r.run(Step(name="s", build=lambda n: "bug"), [c.nodes[2]])[c.nodes[2].name]
        assert res.status == "failed" and "connection holder: KeyError" in res.msg
    assert mux._request(mux.socket_path(c), "ping")["pid"] == os.getpid()


def test_a_command_s_lines_come_through_the_holder_as_it_prints_them(holder):
    def progress_line(line):  # a step's progress parser (the roles' one: tests/unit/test_progress.py)
        parts = line.split(" ")
        return (float(parts[1]), float(parts[2]), parts[3], parts[4]) if parts[0] == "@@llmdeploy-progress@@" else None

    c = holder
    got, lines = [], []
    with bind(c).runner(lines=lambda step, host, p: got.append((step, host, p))) as r:
        assert r.ssh.mux is not None
        res = r.run(Step(name="pull", build=lambda n: "talk", progress=progress_line), c.nodes[:1])[c.nodes[0].name]
        assert got == [("pull", c.nodes[0].name, (1.0, 2.0, "files", "first")), ("pull", c.nodes[0].name, (2.0, 2.0, "files", "second"))]
        # the step's parser reads no progress line
        assert (res.status, res.stdout, res.stderr) == ("ok", "some output\n", "warning\n")
        # every line, with its stream, for a caller that asks
        assert r.exec(c.nodes[1], "talk", on_line=lambda *a: lines.append(a))[0] == "some output\n"
        assert lines[1] == ("out", "some output") and len(lines) == 3
        # nobody asks: no line is sent
        assert r.run(Step(name="s", build=lambda n: "quiet"), c.nodes[:1])[c.nodes[0].name].status == "ok"
        # a display that breaks costs the display, never the command
        assert r.exec(c.nodes[1], "talk", on_line=lambda *a: 1 / 0)[2] == 0


def test_no_holder_to_be_had_means_direct_connections_said_once(short_tmp, monkeypatch, capsys):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp))
    c = load_cluster("a3")
    c = c.model_copy(update={"ssh": c.ssh.model_copy(update={"persist_s": 60})})
    with bind(c).runner() as r:
        assert r.ssh.mux is not None

        def unavailable(*a, **k):
            raise mux.Unavailable("the connection holder did not start within 15s")

        r.ssh.mux.exec = unavailable
        direct = []
        r.ssh._open = lambda node: direct.append(node.name) or (_ for _ in ()).throw(UnreachableError("no route"))
        for n in c.nodes[:2]:
            with pytest.raises(UnreachableError):
                r.exec(n, "true")
        assert r.ssh.mux is None and direct == [n.name for n in c.nodes[:2]]
    assert capsys.readouterr().err.count("no connection holder") == 1
    # the Runner forked a holder at its start when this process had no other
    # thread (alone, yes; in the whole suite, not always): end it
    mux.stop("a3")
    # until it stops answering (the event); the deadline is only a guard: on 2
    # loaded CPUs (the whole suite, with the simulated hosts' daemons) 5 s were too short
    end = time.monotonic() + 60
    while time.monotonic() < end and any(mux._request(p, "ping", timeout=1) for p in mux.holders("a3")):
        time.sleep(0.05)
    assert not any(mux._request(p, "ping", timeout=1) for p in mux.holders("a3"))


def test_a_holder_that_cannot_start_says_why_at_once(short_tmp, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp))
    c = load_cluster("b200")
    # not a valid cluster any more (TP 16 on one node of 8 GPUs): the holder validates it again
    bad = c.model_copy(update={"nodes": c.nodes[:1], "ssh": c.ssh.model_copy(update={"persist_s": 60})})
    # its own message, not the start deadline's
    with pytest.raises(OSError, match=r"ended at its start \(exit 2\): transports.ssh.mux: not a valid cluster: .*TP 16 x PP 1 = 16"):
        mux.Client(bad, None).connect()
    assert not mux.holders("b200")


def test_a_process_without_threads_forks_its_holder_and_starts_no_other(short_tmp):
    """In a fresh process (no thread yet), ensure() forks the holder; the
    first command waits for that one and spawns no second."""
    import subprocess
    import sys

    code = """
import sys
from llmdeploy.inventory import load_cluster
from transports.ssh import mux

class Stand:
    def _exec(self, node, command, timeout, stdin):
        return "ran " + command, "", 0, None
    def close(self):
        pass

c = load_cluster("a3")
c = c.model_copy(update={"ssh": c.ssh.model_copy(update={"persist_s": 30})})
client = mux.Client(c, lambda cluster: Stand())
client._spawn = lambda: sys.exit("spawned a second holder")
client.ensure()
print(client.exec(c.nodes[0].name, "x", 5, None, 10)["out"])
print(mux.stop("a3"))
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "XDG_RUNTIME_DIR": str(short_tmp)}, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert res.returncode == 0, res.stderr
    assert res.stdout == "ran x\n1\n"
