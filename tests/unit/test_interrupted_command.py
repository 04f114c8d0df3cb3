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
import time
import threading
import traceback

import paramiko
import pytest

from flows import probes
from llmdeploy.inventory import load_cluster
from transports.ssh import connect
from flows.binding import bind

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
        try:
            chan.sendall(f"ran {command}\n".encode())
            chan.send_exit_status(0)
            chan.close()
        except (EOFError, OSError):  # the client closed the connection first: nobody left to answer
            pass


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
    r = bind(c).runner(nodes=[node], persist=False)
    r.ssh.connections[node.name] = _Conn(first)
    made: list[_Conn] = []

    def make_connection(cluster, n, shared=None):
        made.append(_Conn(new_session()))
        return made[-1]

    monkeypatch.setattr(connect, "make_connection", make_connection)
    return r, node, made


def test_commands_after_an_interrupted_one_do_not_wait_for_the_lock_it_left_held(monkeypatch, sessions):
    first = sessions()
    r, node, made = _runner_on(monkeypatch, first, sessions)
    old = r.ssh.connections[node.name]
    with r:
        # the interrupt lands as the command's channel is asked for
        first.clear_to_send_lock = lock = _InterruptedOnce(first.clear_to_send_lock)
        got = _on_thread(lambda: r.exec(node, "wait for the DP RPC port"))
        assert isinstance(got, KeyboardInterrupt)
        assert "open_session" in lock.stack and lock.locked()  # what the interrupt left: the transport's send lock held
        # the interrupted deploy's cleanup on the same node: the stop, the ledger line
        assert _on_thread(lambda: r.exec(node, "docker stop")) == ("ran docker stop\n", "", 0)
        assert _on_thread(lambda: r.exec(node, "append the ledger line")) == ("ran append the ledger line\n", "", 0)
        assert len(made) == 1 and r.ssh.connections[node.name] is made[0]  # one new connection, kept for the commands after
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
        assert len(made) == 1 and r.ssh.connections[node.name] is made[0]
        assert _on_thread(lambda: r.exec(node, "docker stop")) == ("ran docker stop\n", "", 0)


# --- the handlers only count: the interrupt is raised where no lock is held ---------------------
# llmdeploy/interrupt.py. Here the signal comes while a lock that Python code
# takes is held (logging's module lock, a pool's shutdown lock, a future's
# condition): with Python's own handler the KeyboardInterrupt is raised right
# there and the lock stays held, so the cleanup after it (the stop, the
# ledger line) waits forever; with the tool's, the command raises at its
# next look at the flag and the cleanup ends within its deadline.

import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from concurrent.futures import _base as futures_base  # noqa: E402

from llmdeploy import interrupt, report  # noqa: E402
from llmdeploy.runner import Step  # noqa: E402


class _SignalsOnce:
    """A lock that sends this process SIGINT right after its first acquire in
    the main thread, while it is held: where a Ctrl-C lands when it comes as
    the lock is taken. Condition-compatible over an RLock."""

    def __init__(self, lock):
        self.lock = lock
        self.sent = 0

    def acquire(self, *args, **kwargs):
        got = self.lock.acquire(*args, **kwargs)
        if got and not self.sent and threading.current_thread() is threading.main_thread():
            self.sent = 1
            os.kill(os.getpid(), signal.SIGINT)  # its handler runs at the next bytecode: this lock held
        return got

    def release(self):
        self.lock.release()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()

    def __bool__(self):
        return True

    # what threading.Condition asks of an RLock
    def _is_owned(self):
        return self.lock._is_owned()

    def _release_save(self):
        return self.lock._release_save()

    def _acquire_restore(self, state):
        self.lock._acquire_restore(state)


@pytest.fixture
def counting():
    """The tool's handlers (tasks.py installs them for every command), Python's again after."""
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)  # not ignored, whoever started pytest (see install)
    interrupt.install()
    yield
    interrupt.reset()
    for s, h in old.items():
        signal.signal(s, h)


def _cleanup_runs(r, node):
    """The interrupted command's cleanup on the same runner, within its
    deadline: the stop as a step on the runner's pool, the ledger line as one
    command (each on a guard thread: a lock left held fails the test)."""
    with report.shielded():
        res = _on_thread(lambda: r.run(Step(name="stop", build=lambda n: "docker stop"), [node]))
        assert res[node.name].stdout == "ran docker stop\n", res[node.name]
        assert _on_thread(lambda: r.exec(node, "append the ledger line")) == ("ran append the ledger line\n", "", 0)


def _interrupted(fn):
    """``fn()`` in the main thread must raise the tool's interrupt (not at a random bytecode)."""
    with pytest.raises(interrupt.Interrupted):
        fn()
    assert interrupt.unwinding()


def test_a_ctrl_c_while_logging_s_module_lock_is_held_leaves_it_free_and_the_cleanup_runs(monkeypatch, sessions, counting):
    """paramiko's Channel() calls logging.getLogger, which takes logging's
    module lock before its try (3.11: _acquireLock(); try ... finally
    _releaseLock()): the SIGINT comes right there, in the main thread."""
    first = sessions()
    r, node, made = _runner_on(monkeypatch, first, sessions)
    with r:
        wrapped = _SignalsOnce(logging._lock)
        monkeypatch.setattr(logging, "_lock", wrapped)
        _interrupted(lambda: r.exec(node, "wait for the DP RPC port"))
        assert wrapped.sent == 1 and not wrapped.lock._is_owned()
        _cleanup_runs(r, node)
        assert made == []  # no connection given up: the interrupt was raised between two reads, the channel closed


def test_a_ctrl_c_while_the_pool_s_shutdown_lock_is_held_leaves_it_free_and_the_cleanup_runs(monkeypatch, sessions, counting):
    """ThreadPoolExecutor.submit takes its shutdown lock in a with statement:
    the SIGINT comes as the step's command is handed to the pool."""
    first = sessions()
    r, node, made = _runner_on(monkeypatch, first, sessions)
    with r:
        wrapped = _SignalsOnce(r._pool._shutdown_lock)
        r._pool._shutdown_lock = wrapped
        _interrupted(lambda: r.run(Step(name="wait", build=lambda n: "wait for the DP RPC port"), [node]))
        assert wrapped.sent == 1 and not wrapped.lock.locked()
        _cleanup_runs(r, node)


def test_a_ctrl_c_while_a_future_s_condition_is_held_leaves_it_free_and_the_cleanup_runs(monkeypatch, sessions, counting):
    """concurrent.futures.wait takes every future's condition
    (_AcquireFutures): the SIGINT comes as the runner waits for the step's
    hosts. Left held, the worker could never set the result, and the pool's
    one thread (one node) would never run the cleanup's stop."""
    first = sessions()
    r, node, made = _runner_on(monkeypatch, first, sessions)
    wrapped: list[_SignalsOnce] = []
    init = futures_base.Future.__init__

    def future_init(self):
        init(self)
        if not wrapped:  # the step's future: the first made from here on
            wrapped.append(_SignalsOnce(threading.RLock()))
            self._condition = threading.Condition(wrapped[0])

    with r:
        monkeypatch.setattr(futures_base.Future, "__init__", future_init)
        _interrupted(lambda: r.run(Step(name="wait", build=lambda n: "wait for the DP RPC port"), [node]))
        assert wrapped[0].sent == 1 and not wrapped[0].lock._is_owned()
        _cleanup_runs(r, node)


def test_a_further_signal_during_the_cleanup_is_only_counted(monkeypatch, sessions, counting):
    """Under the shield a second Ctrl-C (and a SIGTERM) cuts nothing: the
    cleanup's commands end whole, and the command still says it was interrupted."""
    first = sessions()
    r, node, made = _runner_on(monkeypatch, first, sessions)
    with r:
        os.kill(os.getpid(), signal.SIGINT)
        _interrupted(lambda: r.exec(node, "wait for the DP RPC port"))
        with report.shielded():
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGTERM)
            interrupt.check()  # raises nothing now
            assert r.exec(node, "append the ledger line") == ("ran append the ledger line\n", "", 0)
        interrupt.check()  # nor after: the command is already on its way out


def test_a_cleanup_action_that_overruns_its_deadline_is_said_and_the_command_goes_on(capsys):
    """interrupt.bounded: the action's thread is left behind; a failure is
    said, never raised (an interruption's exit status stays 130)."""
    block = threading.Event()
    assert interrupt.bounded("the ledger's last line on n0", 0.2, block.wait) is None
    block.set()
    assert interrupt.bounded("the audit log's last line on n0", 5, lambda: 1 / 0) is None
    err = capsys.readouterr().err
    assert "the ledger's last line on n0 did not finish within 0.2s" in err
    assert "the audit log's last line on n0 failed: ZeroDivisionError" in err


def test_a_sigint_the_command_was_started_with_ignored_stays_ignored():
    """A shell starts a background job with SIGINT ignored; the tool keeps it
    so, as Python does (SIGTERM is still counted), and puts it back after."""
    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        interrupt.install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        interrupt.check()  # nothing counted
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(interrupt.Interrupted, match="SIGTERM"):
            interrupt.sleep(GUARD_S)
        interrupt.uninstall()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN and signal.getsignal(signal.SIGTERM) == old[signal.SIGTERM]
    finally:
        interrupt.reset()
        for s, h in old.items():
            signal.signal(s, h)


def test_a_sleep_and_a_join_end_at_the_first_look_after_a_signal(counting):
    os.kill(os.getpid(), signal.SIGTERM)
    with pytest.raises(interrupt.Interrupted, match="SIGTERM"):  # not the 30 s it was asked for
        interrupt.sleep(30)
    interrupt.reset()
    t = threading.Thread(target=threading.Event().wait, args=(GUARD_S,), daemon=True)
    t.start()
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGINT)).start()
    with pytest.raises(interrupt.Interrupted, match="SIGINT"):
        interrupt.join(t)


def test_a_task_exits_130_on_sigterm_with_either_kind_of_handler():
    """tasks._guard: a flow's task counts the signal and raises at its next
    look (here its sleep); a simulator task (counting=False), which never
    looks, is interrupted where it is, as Python does. Python's handlers are
    back after either."""
    import invoke

    import tasks

    def flow(c):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # counted, not raised here
        interrupt.sleep(GUARD_S)

    def simulator(c):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(GUARD_S)  # raised here

    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # not ignored, whoever started pytest
    try:
        for fn, counting in ((flow, True), (simulator, False)):
            with pytest.raises(invoke.Exit) as got:
                tasks._guard(fn, counting=counting)(invoke.Context())
            assert got.value.code == 130
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, before)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
