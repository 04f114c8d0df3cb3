"""A command's lines as it prints them: ``connect.run_channel`` hands each
line of stdout and stderr to a callback while the command runs (over a real
paramiko session in this process), and the Runner feeds what a step's
progress parser reads to its sink, taking progress lines out of what the
step's own parser sees. (Through the connection holder: tests/unit/test_mux.py;
on a real sshd: tests/integration/test_runner_failures.py.)"""

from __future__ import annotations

import socket
import threading

import paramiko
import pytest

from llmdeploy.inventory import load_cluster
from llmdeploy.runner import PROGRESS_MARK, HostResult, Step, without_progress
from transports.ssh import connect
from flows.binding import bind

M = PROGRESS_MARK


def progress_line(line: str):
    """A step's progress parser (the roles' one is tested in test_progress.py)."""
    if not line.startswith(M + " "):
        return None
    done, total, unit, label = line.split(" ", 4)[1:]
    return float(done), float(total), unit, label


def test_the_runner_takes_progress_lines_out_of_what_parsers_read():
    text = f"one\n{M} 1 2 B x\ntwo\n{M} 2 2 B x"
    assert without_progress(text) == "one\ntwo\n"
    assert without_progress("no marks\n") == "no marks\n"


# --- lines read while the command runs: run_channel over a real SSH session -------------------
class _Server(paramiko.ServerInterface):
    def __init__(self):
        self.exec = threading.Event()

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def get_allowed_auths(self, username):
        return "none"

    def check_auth_none(self, username):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_exec_request(self, channel, command):
        self.exec.set()
        return True


@pytest.fixture(scope="module")
def host_key():
    return paramiko.RSAKey.generate(1024)


@pytest.fixture
def session(host_key):
    """(client transport, a function that runs ``body(channel)`` as the
    remote command once the client asks for it)."""
    a, b = socket.socketpair()
    server, iface = paramiko.Transport(b), _Server()
    server.add_server_key(host_key)
    server.start_server(event=threading.Event(), server=iface)  # returns at once: the client's handshake below
    client = paramiko.Transport(a)
    client.start_client(timeout=10)
    client.auth_none("test")
    threads = []

    def serve(body):
        def run():
            chan = server.accept(10)
            iface.exec.wait(10)
            try:
                body(chan)
            finally:
                chan.close()

        threads.append(threading.Thread(target=run, daemon=True))
        threads[-1].start()

    yield client, serve
    client.close()
    server.close()
    for t in threads:
        t.join(5)


def test_run_channel_hands_each_line_over_while_the_command_runs(session):
    client, serve = session
    seen, heard = [], threading.Event()
    waited = {}

    def command(chan):
        chan.sendall(b"out 1\npart")
        chan.sendall_stderr(f"{M} 1 2 files first\n".encode())
        # the rest only once the caller has the progress line: it came while the command ran
        waited["in time"] = heard.wait(10)
        chan.sendall(b"ial\r\nlast without newline")
        chan.sendall_stderr(b"\xff bad utf-8\n")
        chan.send_exit_status(3)

    def on_line(stream, line):
        seen.append((stream, line))
        if line.startswith(M):
            heard.set()

    serve(command)
    out, err, code = connect.run_channel(client, "cmd", 20, on_line=on_line)
    assert waited["in time"] is True
    assert (out, code) == ("out 1\npartial\r\nlast without newline", 3)
    assert err == f"{M} 1 2 files first\n\ufffd bad utf-8\n"
    assert sorted(seen) == sorted([("out", "out 1"), ("err", f"{M} 1 2 files first"), ("out", "partial"),
                                   ("out", "last without newline"), ("err", "\ufffd bad utf-8")])


def test_a_callback_that_raises_is_dropped_and_the_command_goes_on(session):
    client, serve = session
    calls = []

    def command(chan):
        chan.sendall(b"a\nb\nc\n")
        chan.send_exit_status(0)

    def broken(stream, line):
        calls.append(line)
        raise BrokenPipeError("the client went away")

    serve(command)
    assert connect.run_channel(client, "cmd", 20, on_line=broken) == ("a\nb\nc\n", "", 0)
    assert calls == ["a"]


def test_lines_too_long_for_progress_are_skipped_whole():
    got = []
    lines = connect._Lines("out", connect._Sink(lambda s, ln: got.append(ln)))
    lines.LIMIT = 10
    for piece in (b"short\nxxxxxxxx", b"xxxxxxxxxx", b"xxxx\nnext\n", b"tail"):
        lines.feed(piece)
    lines.end()
    assert got == ["short", "next", "tail"]


# --- the Runner: parser, sink, and what the step's parser sees --------------------------------
def test_the_runner_feeds_a_steps_progress_to_its_sink_and_its_parser_sees_no_progress_line(monkeypatch):
    c = load_cluster("a3")
    got, parsed = [], {}
    with bind(c).runner(nodes=c.nodes[:2], persist=False, lines=lambda step, host, p: got.append((step, host, p))) as r:
        def fake_exec(node, command, timeout, stdin=None, on_line=None):
            assert on_line is not None
            on_line("err", f"{M} 1 2 files {node.name}")
            on_line("out", "not progress")
            on_line("err", f"{M} broken line")
            return f"data\n{M} 2 2 files x\n", f"{M} 2 2 files x\nwarning\n", 0, None
        monkeypatch.setattr(r, "_exec", fake_exec)

        def parse(node, out, err, code):
            parsed[node.name] = (out, err)
            return HostResult(node.name)

        r.run(Step(name="pull", build=lambda n: "x", parse=parse, progress=progress_line))
        assert sorted(got) == [("pull", n.name, (1.0, 2.0, "files", n.name)) for n in c.nodes[:2]]
        assert parsed == {n.name: ("data\n", "warning\n") for n in c.nodes[:2]}
        # a step without a parser: no line is read while it runs
        seen = []

        def plain_exec(node, command, timeout, stdin=None, on_line=None):
            seen.append(on_line)
            return "o", "", 0, None
        monkeypatch.setattr(r, "_exec", plain_exec)
        r.run(Step(name="plain", build=lambda n: "x"))
        assert seen == [None, None]
        # an explicit callback gets every line with its host
        lines = []

        def talking_exec(node, command, timeout, stdin=None, on_line=None):
            on_line("out", "hello")
            return "hello\n", "", 0, None
        monkeypatch.setattr(r, "_exec", talking_exec)
        r.run(Step(name="plain", build=lambda n: "x"), c.nodes[:1], on_line=lambda *a: lines.append(a))
        assert lines == [(c.nodes[0].name, "out", "hello")]
