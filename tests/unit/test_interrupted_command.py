"""An interrupt (Ctrl-C, SIGTERM: a KeyboardInterrupt in the main thread)
that lands inside paramiko while it holds a lock of the connection.

CPython raises the interrupt at the first check after the signal came: when
paramiko has just taken a lock (``lock.acquire()`` returned) and has not yet
entered the ``try`` that releases it, the lock stays held. The transport's
send lock is one (``Transport._send_user_message``: every channel open,
command, end of input and close of the connection takes it): a deploy
interrupted while it started a command on node 0 then waited forever in its
cleanup (the stop, the ledger line, the lock's release), on that lock.

Here the interrupt is raised exactly there, by a lock that raises it once
right after it is taken; the SSH server is paramiko's, in this process. The
commands after an interrupted one must get their answer on a new connection
(``Runner.abandon``), and the interrupted command must return without closing
its channel (``connect.left_open``). The threads' waits are guards only."""

from __future__ import annotations

import socket
import threading
import traceback

import paramiko
import pytest

from flows import probes
from llmdeploy import connect
from llmdeploy.inventory import load_cluster
from llmdeploy.runner import Runner

GUARD_S = 20  # a guard against a hang, never a measure


class _Host(paramiko.ServerInterface):
    """Answers every command with ``ran <command>`` once the client has sent
    its end of input (run_channel sends it right after the command's request
    is accepted); a command named ``wait ...`` never ends (a port that does
    not open)."""

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def get_allowed_auths(self, username):
        return "none"

    def check_auth_none(self, username):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_exec_request(self, channel, command):
        threading.Thread(target=self._answer, args=(channel, command.decode()), daemon=True).start()
        return True

    @staticmethod
    def _answer(chan, command):
        while chan.recv(1024):
            pass
        if command.startswith("wait"):
            return
        chan.sendall(f"ran {command}\n".encode())
        chan.send_exit_status(0)
        chan.close()


class _Conn:
    """What the runner uses of a Fabric connection, on a client transport."""

    gateway = None
    host, port, connect_kwargs = "node", 22, {}

    def __init__(self, transport: paramiko.Transport):
        self.transport = transport
        self.client = self
        self.closed = threading.Event()

    def get_transport(self):
        return self.transport

    @property
    def is_connected(self) -> bool:
        return self.transport.is_active()

    def close(self) -> None:
        self.transport.close()
        self.closed.set()


class _InterruptedOnce:
    """A lock that raises KeyboardInterrupt right after its ``at``-th acquire,
    holding it: where the signal handler raises the interrupt when SIGINT
    comes while paramiko takes the lock. (The transport's own thread takes
    this one only to exchange keys, done before it is put in.)"""

    def __init__(self, lock, at: int = 1):
        self.lock, self.at = lock, at
        self.stack: list[str] = []  # the functions the interrupt was raised in, innermost last

    def acquire(self, *args, **kwargs):
        got = self.lock.acquire(*args, **kwargs)
        if got and not self.stack:
            self.at -= 1
            if self.at == 0:
                self.stack = [f.name for f in traceback.extract_stack()]
                raise KeyboardInterrupt
        return got

    def release(self):
        self.lock.release()

    def locked(self) -> bool:
        return self.lock.locked()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


@pytest.fixture(scope="module")
def host_key():
    return paramiko.RSAKey.generate(1024)


@pytest.fixture
def sessions(host_key):
    """``new()``: a client transport authenticated to an in-process server."""
    made = []

    def new() -> paramiko.Transport:
        a, b = socket.socketpair()
        server = paramiko.Transport(b)
        server.add_server_key(host_key)
        server.start_server(event=threading.Event(), server=_Host())
        client = connect.KeepaliveTransport(a)
        client.start_client(timeout=10)
        client.auth_none("test")
        made.append((client, server))
        return client

    yield new
    for client, server in made:
        client.close()
        server.close()


def _on_thread(fn):
    """``fn()``'s result, or what it raised, from a thread of its own; a test
    failure when it has neither after GUARD_S (it waits forever)."""
    got: list = []

    def run():
        try:
            got.append(fn())
        except BaseException as exc:  # the KeyboardInterrupt under test among them
            got.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(GUARD_S)
    if not got:
        pytest.fail(f"still waiting after {GUARD_S}s (a guard): a lock the interrupt left held")
    return got[0]


def _runner_on(monkeypatch, first: paramiko.Transport, new_session):
    """A runner of one a3 node whose connection is ``first``; a connection
    made after it (connect.make_connection) is a new session, named in the
    list returned."""
    c = load_cluster("a3")
    node = c.nodes[0]
    r = Runner(c, nodes=[node], persist=False)
    r.connections[node.name] = _Conn(first)
    made: list[_Conn] = []

    def make_connection(cluster, n, shared=None):
        made.append(_Conn(new_session()))
        return made[-1]

    monkeypatch.setattr(connect, "make_connection", make_connection)
    return r, node, made


def test_commands_after_an_interrupted_one_do_not_wait_for_the_lock_it_left_held(monkeypatch, sessions):
    first = sessions()
    r, node, made = _runner_on(monkeypatch, first, sessions)
    old = r.connections[node.name]
    with r:
        # the interrupt lands as the command's channel is asked for
        first.clear_to_send_lock = lock = _InterruptedOnce(first.clear_to_send_lock)
        got = _on_thread(lambda: r.exec(node, "wait for the DP RPC port"))
        assert isinstance(got, KeyboardInterrupt)
        assert "open_session" in lock.stack and lock.locked()  # what the interrupt left: the transport's send lock held
        # the interrupted deploy's cleanup on the same node: the stop, the ledger line
        assert _on_thread(lambda: r.exec(node, "docker stop")) == ("ran docker stop\n", "", 0)
        assert _on_thread(lambda: r.exec(node, "append the ledger line")) == ("ran append the ledger line\n", "", 0)
        assert len(made) == 1 and r.connections[node.name] is made[0]  # one new connection, kept for the commands after
        assert old.closed.wait(GUARD_S)  # the old one is closed, on a thread nothing waits for


def test_an_interrupted_command_returns_without_closing_its_channel(sessions):
    """Interrupted while it sends the command (its channel open): run_channel
    raises the interrupt at once; its close would wait for the lock."""
    client = sessions()
    client.clear_to_send_lock = lock = _InterruptedOnce(client.clear_to_send_lock, at=2)  # 1: the channel's open, 2: the command
    got = _on_thread(lambda: connect.run_channel(client, "wait", 60))
    assert isinstance(got, KeyboardInterrupt)
    assert "exec_command" in lock.stack and lock.locked()


def test_an_interrupted_probe_gives_its_connection_up(monkeypatch, sessions):
    """A readiness probe's forwarded request, interrupted as its channel is
    asked for: the runner's connection to the node is given up."""
    first = sessions()
    r, node, made = _runner_on(monkeypatch, first, sessions)
    with r:
        first.clear_to_send_lock = lock = _InterruptedOnce(first.clear_to_send_lock)
        got = _on_thread(lambda: probes.http_via_ssh(r, node, 8000, "GET", "/health", None, 10))
        assert isinstance(got, KeyboardInterrupt)
        assert "open_channel" in lock.stack and lock.locked()
        assert len(made) == 1 and r.connections[node.name] is made[0]
        assert _on_thread(lambda: r.exec(node, "docker stop")) == ("ran docker stop\n", "", 0)
