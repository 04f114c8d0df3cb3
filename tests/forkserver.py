"""The tool's commands for the tests, started from a process that has
imported the tool already: ``run_invoke`` (tests/conftest.py) sends each
command here, and this server forks a child that runs it as ``python -m
invoke`` does (the same argv, environment, working directory, stdin, stdout
and stderr, Invoke's ``program.run()``, and Python's own end: SystemExit,
KeyboardInterrupt and an uncaught exception as the interpreter handles them,
atexit handlers run, threads joined) and reports its exit status as
subprocess does (-N: killed by signal N).

Why: the suite runs the tool about 1,800 times, and each fresh ``python -m
invoke`` spent 0.3 to 0.45 s of CPU importing it (Invoke, pydantic and the
models, paramiko and OpenSSL, rich, the flows: ``python -X importtime``) on
a machine whose two cores the simulated clusters keep busy. A fork of a
process that imported it all costs a few milliseconds.

What a child shares with a fresh process and what it does not:
- modules are imported before the command's environment is set. The tool
  reads its environment when a command runs, not at import (no module of
  llmdeploy, flows, roles, systems, platforms or tasks.py reads os.environ at
  module level). What is read when the interpreter starts or a module is
  imported (``PYTHON*``, the locale's ``LANG``/``LC_*``, ``TZ``,
  Invoke's ``INVOKE_*``) is the server's: a command whose values of those
  differ runs as a fresh process (``Client.fresh``), and so does every
  command under LLMDEPLOY_TEST_FORKSERVER=0. The server starts with the
  suite's environment, never a test's extras (a test's secret stays out of
  it);
- the string hash seed is the server's, one for all its children;
  ``/proc/<pid>/environ`` and ``cmdline`` of a child show the server's;
- nothing is loaded from an inventory, a playbook or a plug-in directory
  before the fork: those are read by the command (inventory files are
  executed afresh by ``load_cluster``; playbooks are cached per process,
  which is then the child);
- the signals' dispositions are those the server was started with, given
  back in the child (the server itself ignores SIGINT, so that a Ctrl-C at
  the terminal reaches the commands, in the client's process group, and
  not the server); the standard streams are Python's for pipes, as the
  server's are.

The protocol, over a Unix socket pair made by the client: the client sends
one JSON line (argv, env, cwd) with its stdin, stdout and stderr as file
descriptors (SCM_RIGHTS) and a socket of the request's own; the server
answers ``pid N`` on it when the child runs and ``exit S`` (its wait status)
when it has ended, and kills the child (through its pidfd: never another
process) when the client writes ``kill`` there. The server ends when the
client's end of its control socket closes (the pytest process ended), after
killing the children still running."""

from __future__ import annotations

import gc
import importlib
import importlib.util
import json
import locale
import os
import pkgutil
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

# what a command imports, done once here; never an inventory, a playbook or the simulator
PRELOAD = ("invoke.main", "tasks", "transports.ssh.connect", "paramiko", "rich.console", "rich.progress", "rich.table")
PRELOAD_PACKAGES = ("flows",)
SIGNALS = (signal.SIGINT, signal.SIGQUIT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE, signal.SIGCHLD)


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    for pkg in PRELOAD_PACKAGES:
        mod = importlib.import_module(pkg)
        for info in pkgutil.iter_modules(mod.__path__, f"{pkg}."):
            importlib.import_module(info.name)


def _child(request: dict, fds: list[int], dispositions: dict) -> None:
    """Run the command in this forked process; never returns: its end is
    the interpreter's (SystemExit, KeyboardInterrupt and any other exception
    leave through the server's frames, which hold nothing of it)."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    for sig, handler in dispositions.items():
        signal.signal(sig, handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    from invoke.main import program

    program.run()
    sys.exit(0)


def serve(control: socket.socket, dispositions: dict) -> None:
    """Serve commands until ``control`` (the client's end) closes."""
    sel = selectors.DefaultSelector()
    sel.register(control, selectors.EVENT_READ, ("control", None))
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its request's socket)

    def finish(pidfd: int) -> None:
        pid, conn = children.pop(pidfd)
        sel.unregister(pidfd)
        try:
            sel.unregister(conn)
        except KeyError:  # a "kill" took it out already
            pass
        _, status = os.waitpid(pid, 0)
        os.close(pidfd)
        try:
            conn.sendall(f"exit {status}\n".encode())
        except OSError:
            pass
        conn.close()

    try:
        while True:
            for key, _ in sel.select():
                kind, pidfd = key.data
                if kind == "control":
                    try:
                        msg, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
                    except OSError:
                        msg, fds = b"", []
                    if not msg:
                        return  # the client is gone
                    # one request: its socket (for pid, exit and kill), then stdin, stdout, stderr
                    conn = socket.socket(fileno=fds[0])
                    try:
                        request = json.loads(msg)
                        pid = os.fork()
                    except (ValueError, OSError) as exc:  # this request fails, not the server
                        for fd in fds[1:]:
                            os.close(fd)
                        with conn:
                            conn.sendall(f"error {exc}\n".encode())
                        continue
                    if pid == 0:  # the child: nothing of the server's goes with it
                        sel.close()
                        control.close()
                        conn.close()
                        for fd, (_, c) in children.items():
                            c.close()
                            os.close(fd)
                        children.clear()
                        _child(request, fds[1:], dispositions)
                    for fd in fds[1:]:
                        os.close(fd)
                    pidfd = os.pidfd_open(pid)
                    children[pidfd] = (pid, conn)
                    sel.register(pidfd, selectors.EVENT_READ, ("child", pidfd))
                    sel.register(conn, selectors.EVENT_READ, ("request", pidfd))
                    try:
                        conn.sendall(f"pid {pid}\n".encode())
                    except OSError:  # the client went away: the command goes too
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                elif kind == "request":  # "kill", or the client closed its end: the command goes
                    if children.get(pidfd, (None, None))[1] is not key.fileobj:
                        continue  # its child ended in this same round
                    try:
                        key.fileobj.recv(64)
                    except OSError:
                        pass
                    try:
                        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    sel.unregister(key.fileobj)  # its exit is still told there, if the client listens
                elif pidfd in children:
                    finish(pidfd)
    finally:
        for pidfd, (pid, conn) in children.items():
            try:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            os.close(pidfd)
            conn.close()


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    # what the commands get back in the child: the dispositions this process started with
    dispositions = {sig: signal.getsignal(sig) for sig in SIGNALS}
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    preload()
    # what was imported stays out of every collection: a child's garbage
    # collector would otherwise walk (and so copy, page by page) the whole heap
    gc.freeze()
    control.sendall(b"ready\n")
    serve(control, dispositions)


# --- the client: tests/conftest.py's run_invoke --------------------------------------
ENABLE_ENV = "LLMDEPLOY_TEST_FORKSERVER"
# read when the interpreter starts or a preloaded module is imported: a command
# that sets any of these otherwise than the server runs as a fresh process
STARTUP_VARS = ("PYTHON", "LANG", "LC_", "TZ", "INVOKE_")


def startup_env(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(STARTUP_VARS)}


class ServerGone(RuntimeError):
    """The forkserver ended or failed a request: what it said."""


class Client:
    """This process's forkserver, started at its first command and ended
    with this process (its control socket closes) or ``close``. Thread-safe."""

    def __init__(self, repo: Path, base_env: dict[str, str] | None = None):
        self.repo = repo
        # the server's environment (None: this process's now), and what of it is read at start
        self.env = dict(os.environ if base_env is None else base_env)
        self.server_env = startup_env(self.env)
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.control: socket.socket | None = None
        self.main = importlib.util.find_spec("invoke.__main__").origin  # argv[0] of python -m invoke

    def close(self) -> None:
        """End the server (it kills and reaps any command still running) and wait for it."""
        with self.lock:
            self._stop()

    def _stop(self) -> None:
        if self.control is not None:
            self.control.close()
            self.control = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            for f in (self.proc.stdout, self.proc.stderr):
                if f:
                    f.close()
            self.proc = None

    def _server(self) -> socket.socket:
        """The running server's control socket (started, or started again, here; under the lock)."""
        if self.proc is not None and self.proc.poll() is None and self.control is not None:
            return self.control
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # its standard streams are pipes, as a command's are (Python builds sys.stdout and sys.stderr for them)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.forkserver", str(theirs.fileno())], cwd=self.repo, env=self.env,
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        theirs.close()
        ours.settimeout(120)
        try:
            ready = ours.recv(64)
        except OSError:
            ready = b""
        if ready != b"ready\n":
            ours.close()
            self.proc.kill()
            _, err = self.proc.communicate()
            code = self.proc.returncode
            self.proc = None
            raise ServerGone(f"the tests' forkserver did not start (exit {code}): {err.decode(errors='replace')}")
        ours.settimeout(None)
        self.control = ours
        return ours

    def fresh(self, env: dict[str, str]) -> bool:
        """Whether a command in ``env`` runs as a fresh process: the server is
        off, or what is read at start differs from the server's (STARTUP_VARS)."""
        if os.environ.get(ENABLE_ENV, "1") == "0" or env.get(ENABLE_ENV) == "0":
            return True
        return startup_env(env) != self.server_env

    def run(self, argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        """``subprocess.run(argv, cwd=cwd, env=env, capture_output=True,
        text=True, timeout=timeout, stdin=DEVNULL)`` for ``argv`` = python -m
        invoke ARGS, run by a fork of the server: the same CompletedProcess,
        the same TimeoutExpired (the child killed first), the child killed
        when anything else interrupts the wait (pytest's timeout, Ctrl-C)."""
        deadline = time.monotonic() + timeout
        msg = json.dumps({"argv": [self.main, *argv[3:]], "env": env, "cwd": str(cwd)}).encode()
        with self.lock:
            fresh = self.fresh(env)
            if not fresh:
                req, req_theirs = socket.socketpair()
                out_r, out_w = os.pipe()
                err_r, err_w = os.pipe()
                devnull = os.open(os.devnull, os.O_RDONLY)
                try:
                    socket.send_fds(self._server(), [msg], [req_theirs.fileno(), devnull, out_w, err_w])
                except BaseException:
                    for fd in (out_r, err_r):
                        os.close(fd)
                    req.close()
                    raise
                finally:
                    for fd in (devnull, out_w, err_w):
                        os.close(fd)
                    req_theirs.close()
        if fresh:
            return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
        got = {out_r: bytearray(), err_r: bytearray()}
        try:
            said = _said(req, deadline + 30)
            if not said.startswith("pid "):
                raise ServerGone(f"the tests' forkserver did not run {argv[3:]}: {said or 'it ended'}")
            timed_out, status = _read_until(got, deadline), 0
            if not timed_out:  # its output ended: its exit, by the deadline
                said = _said(req, deadline)
                if said.startswith("exit "):
                    status = int(said.split()[1])
                elif time.monotonic() >= deadline:
                    timed_out = True
                else:
                    raise ServerGone(f"the tests' forkserver lost {argv[3:]}: {said or 'it ended'}")
            if timed_out:  # as subprocess.run: kill the child, wait for it, raise with what it wrote by then
                _kill(req)
                _said(req, time.monotonic() + 30)
        except BaseException:
            _kill(req)  # whatever interrupted the wait, the command does not go on
            raise
        finally:
            req.close()
            for fd in got:
                os.close(fd)
        stdout, stderr = _text(bytes(got[out_r])), _text(bytes(got[err_r]))
        if timed_out:
            raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(status), stdout, stderr)


def _kill(req: socket.socket) -> None:
    """Ask the server to kill the request's child (through its pidfd; a child that has ended is left alone)."""
    try:
        req.sendall(b"kill\n")
    except OSError:
        pass


def _said(req: socket.socket, deadline: float) -> str:
    """The server's next line on the request's socket ("" at its end or past ``deadline``)."""
    buf = b""
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            return ""
        req.settimeout(left)
        try:
            chunk = req.recv(1)
        except OSError:  # socket.timeout too
            return ""
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace").strip()


def _read_until(got: dict[int, bytearray], deadline: float) -> bool:
    """Read the pipes in ``got`` until both end (False) or ``deadline`` (True)."""
    sel = selectors.DefaultSelector()
    for fd in got:
        sel.register(fd, selectors.EVENT_READ)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 1 << 16)
                if chunk:
                    got[key.fd] += chunk
                else:
                    sel.unregister(key.fd)
        return False
    finally:
        sel.close()


def _text(data: bytes) -> str:
    """As subprocess's text mode decodes: the locale's encoding, universal newlines."""
    return data.decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


if __name__ == "__main__":
    main()
