"""SSH connections kept open between commands (``ssh.persist_s``, off by default).

OpenSSH's ControlPersist for this tool: the first command of a cluster starts
a *holder*, a background process of the same user (``transports.ssh.hold``) that opens the SSH
connections (the same code, the same host key checks) and keeps them; the
commands after it send their remote commands to it over a Unix socket and get
stdout, stderr and the exit code back, with no key exchange, no
authentication and no new sshd session per host. The holder ends after
``persist_s`` seconds without a request.

- Where: ``$XDG_RUNTIME_DIR/llmdeploy-mux`` or ``~/.cache/llmdeploy/mux``
  (0700, owned by this user); one socket (0600) per cluster and *identity*:
  a hash of the cluster's inventory, the known_hosts and ssh_config files'
  content and the inventory directory. Change a host key, a node or a
  setting, and the next command gets a new holder that connects (and checks)
  again; the old one idles out. Only this user's processes are served
  (SO_PEERCRED), as only they can reach the socket anyway.
- What goes through it: the runner's commands (``Runner.exec`` and every
  step), and the lines they print while they run when the client asks for
  them (progress on a terminal): each as a frame of its own before the
  answer. Forwarded HTTP requests (readiness) and ``logs --follow`` use a
  connection of the command's own.
- Failures read the same: a host the holder cannot reach is unreachable with
  the same reason, a connection lost under a command is lost, a deadline is
  124 with what became of the command. A holder that dies takes nothing with
  it: the next command starts another.
- ``invoke sim.down`` and ``stop(cluster)`` end a cluster's holders.

Wire format, both ways: a 4-byte big-endian length and a JSON object; a
request is followed by its standard input (``"stdin"`` bytes). A request
with ``"lines": true`` gets ``{"line": text, "stream": "out"|"err"}`` frames
while its command runs, then the answer (a holder that predates them sends
the answer alone).
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import hashlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, TextIO

from llmdeploy import interrupt
from llmdeploy.errors import ConnectionLost, UnreachableError
from llmdeploy.inventory import Cluster
from transports.ssh.sshfiles import known_hosts_files

if TYPE_CHECKING:
    from llmdeploy.runner import Runner

MAX_FRAME = 1 << 30


def state_dir() -> Path:
    run = os.environ.get("XDG_RUNTIME_DIR")
    d = Path(run) / "llmdeploy-mux" if run else Path("~/.cache/llmdeploy/mux").expanduser()
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = d.stat()
    if st.st_uid != os.getuid():
        raise OSError(f"{d} belongs to uid {st.st_uid}, not to this user: not keeping connections there")
    if st.st_mode & 0o077:
        os.chmod(d, 0o700)
    return d


def _file_state(path: str | None) -> str:
    if not path:
        return ""
    p = os.path.expanduser(path)
    try:
        with open(p, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as exc:
        return f"unreadable {exc.errno}"


def identity(cluster: Cluster) -> str:
    """What a holder's connections depend on: the inventory, the files that
    decide which keys are trusted and where hosts are, and which inventory
    directory the holder loads the cluster from."""
    ssh = cluster.ssh
    doc = {
        "cluster": cluster.model_dump(mode="json"),
        "known_hosts": [_file_state(p) for p in known_hosts_files(cluster, {})],
        "ssh_config": _file_state(ssh.config_file or "~/.ssh/config"),
        "identity": _file_state(ssh.identity_file),
        "inventory": os.environ.get("LLMDEPLOY_INVENTORY", ""),
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def socket_path(cluster: Cluster) -> Path:
    return state_dir() / f"{cluster.name}-{identity(cluster)}.sock"


# a Unix socket's path: sun_path holds 108 bytes with the closing NUL (unix(7))
SOCKET_PATH_MAX = 107


def path_problem(path: Path) -> str | None:
    """Why no holder can listen at ``path`` (too long a path for a Unix socket), or None."""
    n = len(os.fsencode(str(path)))
    if n > SOCKET_PATH_MAX:
        return (f"{path}: {n} bytes, longer than the {SOCKET_PATH_MAX} bytes a Unix socket's path holds "
                "(set XDG_RUNTIME_DIR to a shorter directory)")
    return None


# -- framing ------------------------------------------------------------------------
def _recv_exact(sock: socket.socket, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        b = sock.recv(min(n - got, 1 << 20))
        if not b:
            raise EOFError("the other end closed the socket")
        parts.append(b)
        got += len(b)
    return b"".join(parts)


def send_frame(sock: socket.socket, doc: dict[str, Any], payload: bytes = b"") -> None:
    body = json.dumps(doc).encode()
    sock.sendall(struct.pack(">I", len(body)) + body + payload)


def recv_frame(sock: socket.socket) -> dict[str, Any]:
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    if n > MAX_FRAME:
        raise ValueError(f"frame of {n} bytes")
    doc: dict[str, Any] = json.loads(_recv_exact(sock, n))  # every frame is a JSON object (send_frame)
    return doc


# -- the holder ---------------------------------------------------------------------
class Holder:
    def __init__(self, cluster: Cluster, path: Path, idle_s: float, runner: Runner):
        """``runner``: a llmdeploy.runner.Runner that connects itself."""
        self.cluster, self.path, self.idle_s = cluster, path, idle_s
        self.runner = runner
        self.last = time.monotonic()
        self.active = 0
        self.lock = threading.Lock()
        self.lockfile: TextIO | None = None  # the open lock file (serve_cluster)
        self.released = False

    def release(self) -> None:
        """Give up the socket's path and lock (once): the files go, another holder may start."""
        if self.released:
            return
        self.released = True
        for p in (self.path, Path(str(self.path) + ".lock")):
            with contextlib.suppress(OSError):
                p.unlink()
        if self.lockfile is not None:
            self.lockfile.close()
        with contextlib.suppress(OSError):
            if os.path.getsize(str(self.path) + ".log") == 0:
                os.unlink(str(self.path) + ".log")

    def handle(self, conn: socket.socket) -> None:
        with self.lock:
            self.active += 1
        try:
            uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
            if uid != os.getuid():
                return
            req = recv_frame(conn)
            op = req.get("op")
            if op == "ping":
                send_frame(conn, {"pid": os.getpid(), "identity": self.path.name})
                return
            if op == "exit":
                send_frame(conn, {"pid": os.getpid()})
                self.idle_s = 0
                return
            if op != "exec":
                send_frame(conn, {"error": f"unknown request {op!r}"})
                return
            stdin = _recv_exact(conn, int(req.get("stdin", 0))) if req.get("stdin") else None
            # the command's lines as it prints them (a client that went away
            # raises here: run_channel stops calling, the command goes on)
            lines = {"on_line": lambda stream, line: send_frame(conn, {"line": line, "stream": stream})} if req.get("lines") else {}
            try:
                node = self.cluster.node(req["host"])
                out, err, code, fired = self.runner._exec(node, req["command"], req.get("timeout"), stdin, **lines)
                send_frame(conn, {"out": out, "err": err, "code": code, "fired": list(fired) if fired else None})
            except ConnectionLost as exc:
                send_frame(conn, {"lost": exc.detail, "elapsed": exc.elapsed})
            except UnreachableError as exc:
                send_frame(conn, {"unreachable": str(exc)})
            except Exception as exc:  # a bug here must not end the holder
                send_frame(conn, {"error": f"{type(exc).__name__}: {exc}"})
        except (OSError, EOFError, ValueError):  # the client went away
            pass
        finally:
            conn.close()
            with self.lock:
                self.active -= 1
                self.last = time.monotonic()

    def serve(self, server: socket.socket) -> None:
        server.settimeout(0.5)
        threads: list[threading.Thread] = []
        while True:
            with self.lock:
                idle = self.active == 0 and time.monotonic() - self.last >= self.idle_s
            if idle:
                # no new client finds this socket, and a new holder may start
                # at once; the clients already queued here are still served
                # (their requests would be lost otherwise)
                self.release()
                server.setblocking(False)
                while True:
                    try:
                        conn, _ = server.accept()
                    except OSError:
                        break
                    conn.setblocking(True)
                    threads.append(threading.Thread(target=self.handle, args=(conn,), daemon=True))
                    threads[-1].start()
                for t in threads:
                    t.join()
                return
            try:
                conn, _ = server.accept()
            except socket.timeout:
                continue
            conn.settimeout(None)
            with self.lock:
                self.last = time.monotonic()
            threads = [t for t in threads if t.is_alive()]
            threads.append(threading.Thread(target=self.handle, args=(conn,), daemon=True))
            threads[-1].start()


def hold(cluster_json: str, path: Path, idle_s: float, make_runner: Callable[[Cluster], Runner]) -> int:
    """``python -m transports.ssh.hold``: ``cluster_json`` is the cluster as the
    starting command has it (the inventory, with whatever it changed),
    validated again here."""
    try:
        cluster = Cluster.model_validate_json(cluster_json)
    except ValueError as exc:  # pydantic's ValidationError: the last line is what the client shows
        errors = exc.errors() if hasattr(exc, "errors") else [{"msg": str(exc)}]
        print("transports.ssh.mux: not a valid cluster: " + "; ".join(str(e.get("msg")) for e in errors), file=sys.stderr)
        return 2
    return serve_cluster(cluster, path, idle_s, make_runner)


def serve_cluster(cluster: Cluster, path: Path, idle_s: float, make_runner: Callable[[Cluster], Runner]) -> int:
    """The holder's main: one per socket (a lock file), else exit at once.
    ``make_runner(cluster)``: the runner that connects (llmdeploy.runner)."""
    lockf = open(str(path) + ".lock", "a")
    try:
        fcntl.flock(lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return 0  # another holder serves this socket
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a holder that died left it
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        server.bind(str(path))
    finally:
        os.umask(old)
    server.listen(256)
    holder = Holder(cluster, path, idle_s, make_runner(cluster))
    holder.lockfile = lockf
    try:
        holder.serve(server)
    finally:
        holder.release()
        server.close()
        holder.runner.close()
    return 0


# -- the client side -----------------------------------------------------------------
class Unavailable(Exception):
    """No holder could be reached or started: nothing was sent."""


class Client:
    """How a Runner sends its commands to the cluster's holder (started on first use)."""

    def __init__(self, cluster: Cluster, make_runner: Callable[[Cluster], Runner]):
        """``make_runner(cluster)``: the holder's runner (one that connects itself)."""
        self.make_runner = make_runner
        self.cluster = cluster
        self.path = socket_path(cluster)
        self._started = threading.Lock()
        self._spawned: subprocess.Popen[bytes] | None = None
        self._forked = False  # a holder was forked by ensure(): wait for it, start no other

    def ensure(self) -> None:
        """A holder answers on the socket; when none does, one is forked now
        from this process if it has no other thread yet (it has every module
        loaded and the cluster validated: no start-up to wait for), else one
        is spawned at the first command (``connect``)."""
        if path_problem(self.path):
            return  # connect() says why
        try:
            self._connect().close()
            return
        except OSError:
            pass
        if threading.active_count() == 1:
            self._fork()
            self._forked = True

    def _fork(self) -> None:
        for f in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                f.flush()
        log = str(self.path) + ".log"
        # the objects of now are never collected in either process: the
        # holder's collections would otherwise write to (and so copy) every
        # page it shares with this one
        gc.freeze()
        pid = os.fork()
        if pid:
            os.waitpid(pid, 0)  # the first child ends at once: the holder is not ours to reap
            return
        code = 1
        try:
            os.setsid()
            null = os.open(os.devnull, os.O_RDWR)
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            os.dup2(null, 0)
            os.dup2(out, 1)
            os.dup2(out, 2)
            # nothing of the command's: its pipes (a caller waiting for their end), sockets, files
            os.closerange(3, 1 << 16)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            interrupt.reset()  # a Ctrl-C the command counted before the fork is not the holder's: its commands are never cut
            if os.fork():
                os._exit(0)
            code = serve_cluster(self.cluster, self.path, self.cluster.ssh.persist_s, self.make_runner)
        except BaseException:
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            os._exit(code)

    def _connect(self) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(self.path))
        except OSError:
            s.close()
            raise
        return s

    def _spawn(self) -> subprocess.Popen[bytes]:
        log = open(str(self.path) + ".log", "ab")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "transports.ssh.hold", "--socket", str(self.path), "--idle", f"{self.cluster.ssh.persist_s:g}",
             # the serving system's profile class, to validate the cluster again there
             "--profile-module", type(self.cluster.profile).__module__],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True, close_fds=True,
        )
        log.close()
        assert proc.stdin is not None  # stdin=PIPE
        try:
            proc.stdin.write(self.cluster.model_dump_json().encode())
        except OSError:  # it ended already: its log says why
            pass
        finally:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        return proc

    def connect(self) -> socket.socket:
        """A socket to the holder; the holder is started when there is none."""
        if problem := path_problem(self.path):
            raise OSError(problem)
        try:
            return self._connect()
        except OSError:
            pass
        with self._started:
            try:
                return self._connect()
            except OSError:
                pass
            if self._spawned is None and not self._forked:
                self._spawned = self._spawn()
            end = time.monotonic() + 15
            delay = 0.005
            while True:
                try:
                    return self._connect()
                except OSError as exc:
                    code = self._spawned.poll() if self._spawned is not None else None
                    if code is not None and code != 0:
                        raise OSError(f"the connection holder ended at its start (exit {code}): {self._log_tail()}") from exc
                    if time.monotonic() >= end:
                        raise OSError(f"the connection holder did not start within 15s ({exc}); see {self.path}.log") from exc
                    interrupt.sleep(delay)
                    delay = min(delay * 2, 0.1)

    def _log_tail(self) -> str:
        try:
            lines = Path(str(self.path) + ".log").read_text(errors="replace").strip().splitlines()
        except OSError:
            return f"see {self.path}.log"
        return (lines[-1] if lines else "no message") + f" (in {self.path}.log)"

    def exec(
        self, host: str, command: str, timeout: float, stdin: bytes | None, wait: float, on_line: Callable[[str, str], None] | None = None
    ) -> dict[str, Any]:
        """The holder's answer to one command (see Holder.handle).
        :class:`Unavailable` when there is no holder to send it to (nothing was
        sent); OSError or EOFError when the holder ended under it.
        ``on_line(stream, line)``: the command's lines as the holder sends them."""
        try:
            s = self.connect()
        except OSError as exc:
            raise Unavailable(str(exc)) from exc
        try:
            s.settimeout(wait)
            req = {"op": "exec", "host": host, "command": command, "timeout": timeout, "stdin": len(stdin or b"")}
            if on_line is not None:
                req["lines"] = True
            send_frame(s, req, stdin or b"")
            end = time.monotonic() + wait
            cut = interrupt.Command()
            while True:
                _readable(s, end, cut)
                ans = recv_frame(s)
                if "line" not in ans:
                    return ans
                if on_line is not None:
                    try:
                        on_line(str(ans.get("stream")), str(ans["line"]))
                    except Exception:  # the display broke: the answer still comes
                        on_line = None
                s.settimeout(max(0.1, end - time.monotonic()))
        finally:
            s.close()


def _readable(s: socket.socket, end: float, cut: interrupt.Command) -> None:
    """Wait until ``s`` has something to read (then a whole frame follows at
    once), looking at the interrupt flag in slices; ``socket.timeout`` past ``end``."""
    for left in interrupt.slices(end, cut.check):
        if select.select([s], [], [], left)[0]:
            return
    raise socket.timeout("timed out")


def _request(path: Path, op: str, timeout: float = 5) -> dict[str, Any] | None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(str(path))
        send_frame(s, {"op": op})
        return recv_frame(s)
    except (OSError, EOFError, ValueError):
        return None
    finally:
        s.close()


def holders(cluster_name: str) -> list[Path]:
    """The sockets of a cluster's holders (every identity)."""
    try:
        d = state_dir()
    except OSError:
        return []
    return sorted(p for p in d.glob(f"{cluster_name}-*.sock") if p.name[len(cluster_name) + 1 : -5].isalnum())


def stop(cluster_name: str) -> int:
    """End every holder of ``cluster_name``; how many were asked."""
    n = 0
    for p in holders(cluster_name):
        if _request(p, "exit") is not None:
            n += 1
    return n
