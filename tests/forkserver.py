"""The tool's commands for the tests, started from a process that has
imported the tool already: ``run_invoke`` (tests/conftest.py) sends each
command here, and this server forks a child that runs it as ``python -m
invoke`` does (the same argv, environment, working directory, stdin, stdout
and stderr, Invoke's ``program.run()``, an ordinary exit with its atexit
handlers and threads joined) and reports its exit status as subprocess does
(-N: killed by signal N).

Why: the suite runs the tool about 1,800 times, and each fresh ``python -m
invoke`` spent 0.3 to 0.45 s of CPU importing it (Invoke, pydantic and the
models, paramiko and OpenSSL, rich, the flows: ``python -X importtime``) on
a machine whose two cores the simulated clusters keep busy. A fork of a
process that imported it all costs a few milliseconds.

What a child shares with a fresh process and what it does not:
- modules are imported before the command's environment is set. The tool
  reads its environment when a command runs, not at import (no module of
  llmdeploy, flows, roles, systems, platforms or tasks.py reads os.environ at
  module level); the interpreter's own variables (PYTHON*) are read at start:
  a command whose PYTHON* variables differ from this server's runs as a
  fresh process (``Client.run``'s ``fresh``), and so does every command when
  LLMDEPLOY_TEST_FORKSERVER=0;
- nothing is loaded from an inventory, a playbook or a plug-in directory
  before the fork: those are read by the command (inventory files are
  executed afresh by ``load_cluster``; playbooks are cached per process,
  which is then the child);
- signals are as a fresh Python leaves them (SIGINT raises
  KeyboardInterrupt, SIGTERM and SIGCHLD default, SIGPIPE ignored); the
  child is in the client's process group (a Ctrl-C at the terminal reaches
  it, as it reaches a subprocess of pytest).

The protocol, over a Unix socket pair made by the client: the client sends
one JSON line (argv, env, cwd) with its stdin, stdout and stderr as file
descriptors (SCM_RIGHTS); the server answers ``pid N`` when the child runs
and ``exit S`` (its wait status) when it has ended. The server ends when the
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
import tempfile
import threading
import time
from pathlib import Path

# what a command imports, done once here; never an inventory, a playbook or the simulator
PRELOAD = ("invoke.main", "tasks", "llmdeploy.connect", "paramiko", "rich.console", "rich.progress", "rich.table")
PRELOAD_PACKAGES = ("flows",)


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    for pkg in PRELOAD_PACKAGES:
        mod = importlib.import_module(pkg)
        for info in pkgutil.iter_modules(mod.__path__, f"{pkg}."):
            importlib.import_module(info.name)


def _child(request: dict, fds: list[int]) -> None:
    """Run the command in this forked process; never returns."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGCHLD, signal.SIGQUIT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        from invoke.main import program

        program.run()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, (int, type(None))):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        # as an uncaught KeyboardInterrupt ends Python: the signal's own status
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except BaseException:  # as Python prints an uncaught exception, exit 1
        import traceback

        traceback.print_exc()
        code = 1
    # an ordinary end: atexit handlers, non-daemon threads joined, streams flushed
    raise SystemExit(code)


def serve(control: socket.socket) -> None:
    """Serve commands until ``control`` (the client's end) closes."""
    sel = selectors.DefaultSelector()
    sel.register(control, selectors.EVENT_READ, "control")
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, its request's socket)
    try:
        while True:
            for key, _ in sel.select():
                if key.data == "control":
                    try:
                        msg, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
                    except OSError:
                        msg, fds = b"", []
                    if not msg:
                        return  # the client is gone
                    # one request: its socket (for pid and exit), then stdin, stdout, stderr
                    conn = socket.socket(fileno=fds[0])
                    request = json.loads(msg)
                    pid = os.fork()
                    if pid == 0:  # the child: nothing of the server's goes with it
                        sel.close()
                        control.close()
                        conn.close()
                        for pidfd, (_, c) in children.items():
                            c.close()
                            os.close(pidfd)
                        children.clear()
                        _child(request, fds[1:])
                    for fd in fds[1:]:
                        os.close(fd)
                    conn.sendall(f"pid {pid}\n".encode())
                    pidfd = os.pidfd_open(pid)
                    children[pidfd] = (pid, conn)
                    sel.register(pidfd, selectors.EVENT_READ, "child")
                else:
                    pidfd = key.fd
                    pid, conn = children.pop(pidfd)
                    sel.unregister(pidfd)
                    _, status = os.waitpid(pid, 0)
                    os.close(pidfd)
                    try:
                        conn.sendall(f"exit {status}\n".encode())
                    except OSError:
                        pass
                    conn.close()
    finally:
        for pidfd, (pid, conn) in children.items():
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
            os.close(pidfd)
            conn.close()


# --- the client: tests/conftest.py's run_invoke --------------------------------------
ENABLE_ENV = "LLMDEPLOY_TEST_FORKSERVER"


class Client:
    """This process's forkserver, started at its first command and ended
    with this process (its control socket closes). Thread-safe."""

    def __init__(self, repo: Path):
        self.repo = repo
        self.lock = threading.Lock()
        self.proc: subprocess.Popen | None = None
        self.control: socket.socket | None = None
        self.python_env: dict[str, str] = {}

    def close(self) -> None:
        """End the server (it kills and reaps any command still running) and wait for it."""
        with self.lock:
            if self.control is not None:
                self.control.close()
                self.control = None
            if self.proc is not None:
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                self.proc = None

    def fresh(self, env: dict[str, str]) -> bool:
        """Whether a command in ``env`` runs as a fresh process: the server is
        off, or the interpreter's own variables differ from the server's."""
        if os.environ.get(ENABLE_ENV, "1") == "0" or env.get(ENABLE_ENV) == "0":
            return True
        if self.proc is None:
            return False
        return {k: v for k, v in env.items() if k.startswith("PYTHON")} != self.python_env

    def _started(self, env: dict[str, str]) -> socket.socket:
        if self.proc is not None and self.proc.poll() is None and self.control is not None:
            return self.control
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        log = tempfile.TemporaryFile()
        self.python_env = {k: v for k, v in env.items() if k.startswith("PYTHON")}
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.forkserver", str(theirs.fileno())], cwd=self.repo, env=env,
                                     pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        theirs.close()
        ours.settimeout(120)
        try:
            ready = ours.recv(64)
        except OSError:
            ready = b""
        if ready != b"ready\n":
            self.proc.kill()
            self.proc.wait()
            log.seek(0)
            raise RuntimeError(f"the tests' forkserver did not start (exit {self.proc.returncode}): {log.read().decode(errors='replace')}")
        ours.settimeout(None)
        self.control = ours
        return ours

    def run(self, argv: list[str], env: dict[str, str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
        """``subprocess.run(argv, cwd=cwd, env=env, capture_output=True,
        text=True, timeout=timeout, stdin=DEVNULL)`` for ``argv`` = python -m
        invoke ARGS, run by a fork of the server: the same CompletedProcess,
        the same TimeoutExpired (the child killed first)."""
        if self.fresh(env):
            return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        req, req_theirs = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        devnull = os.open(os.devnull, os.O_RDONLY)
        main = importlib.util.find_spec("invoke.__main__").origin
        msg = json.dumps({"argv": [main, *argv[3:]], "env": env, "cwd": str(cwd)}).encode()
        try:
            with self.lock:
                socket.send_fds(self._started(env), [msg], [req_theirs.fileno(), devnull, out_w, err_w])
        finally:
            for fd in (devnull, out_w, err_w):
                os.close(fd)
            req_theirs.close()
        with req, os.fdopen(out_r, "rb") as out, os.fdopen(err_r, "rb") as err:
            lines = req.makefile("r")
            pid = int(lines.readline().split()[1])
            got = {out.fileno(): bytearray(), err.fileno(): bytearray()}
            timed_out = _read_until(got, deadline)
            if timed_out:  # as subprocess.run: kill the child, then what it wrote
                os.kill(pid, signal.SIGKILL)
                _read_until(got, time.monotonic() + 5)
            status = int(lines.readline().split()[1])
            stdout, stderr = (_text(bytes(got[f.fileno()])) for f in (out, err))
        if timed_out:
            raise subprocess.TimeoutExpired(argv, timeout, output=stdout, stderr=stderr)
        return subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(status), stdout, stderr)


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


def main() -> None:
    control = socket.socket(fileno=int(sys.argv[1]))
    preload()
    # what was imported stays out of every collection: a child's garbage
    # collector would otherwise walk (and so copy, page by page) the whole heap
    gc.freeze()
    control.sendall(b"ready\n")
    serve(control)


if __name__ == "__main__":
    main()
