"""The one runner: a Fabric connection per host, opened once, reused by every step.

A step is built by pure functions (see :class:`Step`); the runner only
executes: all selected hosts in parallel on a bounded pool, a deadline on
every remote command and on the whole step, and one :class:`HostResult` per
host. Host keys are checked against known_hosts with paramiko's RejectPolicy.
The SSH side is ``llmdeploy/connect.py``; with ``ssh.persist_s`` the commands
go through a connection holder instead (``llmdeploy/mux.py``). Which host a
command goes to, and as what, is the cluster's transport's
(``llmdeploy/launcher.py``): the node itself over SSH, or another
launcher's way of reaching it (``launchers/``). With
``ssh.become`` every command goes on the wire under ``sudo -n`` as root
(:meth:`Runner.wire`, ``llmdeploy/become.py``), and sudo's refusal reads as
one failure naming the node (:meth:`Runner.sudo_refusal`).

Every SSH failure reads as what happened, where and how to fix it (refused,
no banner, unknown or changed host key, authentication, connection lost,
deadline) and names the step it happened in; see ``connect._unreachable_reason``.
"""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from . import become, interrupt, launcher
from .errors import ConnectionLost, UnreachableError
from .inventory import Cluster, Node
from .sshfiles import check_ssh_config

if TYPE_CHECKING:
    from fabric import Connection

OK, CHANGED, FAILED, UNREACHABLE, SKIPPED = "ok", "changed", "failed", "unreachable", "skipped"

# A line a command prints (on stderr) to say how far it got: "<mark> <done>
# <total or -> <unit> <label>" (roles.progress_echo builds it, a step's
# ``progress`` parser reads it). Never part of what the step's parser reads:
# the runner takes these lines out of stdout and stderr first.
PROGRESS_MARK = "@@llmdeploy-progress@@"

# (done, total or None, unit, label): a step's ``progress`` parser's answer
# for one line ("B": bytes; any other unit is a count of it, "s" seconds)
Progress = tuple[float, "float | None", str, str]

# the SSH side (llmdeploy/connect.py), imported when a runner connects itself;
# its names are also readable here (from llmdeploy.runner import make_connection)
_CONNECT_NAMES = {
    "UnknownHostKey", "RejectUnknownHosts", "StoppingRemote", "make_connection", "fingerprint", "run_channel",
    "REAP_SCRIPT", "_unreachable_reason", "_lost_detail", "_harden", "KeepaliveTimeout", "KeepaliveTransport", "keep_alive",
}


def __getattr__(name: str) -> Any:
    if name in _CONNECT_NAMES:
        from . import connect

        return getattr(connect, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _close_connection(conn: Connection) -> None:
    """Close a Fabric connection and its jump host's (Fabric's close leaves that one open)."""
    for c in (conn, conn.gateway):
        if c is not None and not isinstance(c, str):
            try:
                c.close()
            except Exception:
                pass


@dataclass
class HostResult:
    host: str
    status: str = OK
    msg: str = ""
    stdout: str = ""
    stderr: str = ""
    exit_code: int | None = None
    duration: float = 0.0
    data: Any = None
    # seconds between the command's run and this result: 0 unless the
    # transport answered a ``standing`` step from what it had read before
    age: float = 0.0

    @property
    def failed(self) -> bool:
        return self.status in (FAILED, UNREACHABLE)


@dataclass
class Step:
    """A pure description of one remote action on one host.

    ``build(node)`` returns the command text (or None to skip the host);
    ``parse(node, stdout, stderr, exit_code)`` turns the output into a
    HostResult (status, message, data). Neither opens a connection.
    """

    name: str
    build: Callable[[Node], str | None] | None = None
    parse: Callable[[Node, str, str, int], HostResult] | None = None
    timeout: float | None = None
    # A local step decides from what earlier steps read (no round trip).
    local: Callable[[Node], HostResult] | None = None
    # Called with every host's result once all are in, for checks that
    # compare hosts (same image digest, same MTU); it may change results.
    aggregate: Callable[[dict[str, HostResult]], None] | None = None
    # Text sent to the command's standard input (file contents, secrets among
    # them: what goes here never appears in a process command line on the node).
    stdin: Callable[[Node], str | bytes | None] | None = None
    # Decides a host from what an earlier step read (a probe in the facts
    # script): a HostResult means no round trip there; None runs the command.
    decide: Callable[[Node], HostResult | None] | None = None
    # Reads one line of the command's output, as it arrives, into how far it
    # got (``Progress``), or None for a line that says nothing of it. Pure (a
    # role's, e.g. roles.progress_line). Lines that start with PROGRESS_MARK
    # are taken out of the output the parser sees.
    progress: Callable[[str], Progress | None] | None = None
    # A read of the nodes' state that status, top or the watcher repeats
    # (flows/reads.py): the cluster's launcher may answer it from a standing
    # reader of the release (``Launcher.serve_reads``) instead of running it,
    # when that reader ran the byte-identical command a few seconds ago and
    # after this process last changed anything on the nodes (the result's
    # ``age`` says how long ago). Nothing else differs.
    standing: bool = False


def without_progress(text: str) -> str:
    """``text`` without its progress lines (``PROGRESS_MARK``)."""
    if PROGRESS_MARK not in text:
        return text
    return "".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith(PROGRESS_MARK))


def default_parse(node: Node, stdout: str, stderr: str, code: int) -> HostResult:
    if code == 0:
        return HostResult(node.name, OK, stdout=stdout, stderr=stderr, exit_code=code)
    msg = (stderr.strip() or stdout.strip()).splitlines()[-1:] or [f"exit {code}"]
    return HostResult(node.name, FAILED, msg=msg[0], stdout=stdout, stderr=stderr, exit_code=code)


class Counts:
    """What this process sent to each host, over every Runner: SSH connections
    opened, remote commands (one session channel each), file transfers (a
    command with content on its standard input) and forwarded requests
    (direct-tcpip channels). bench/roundtrips.py reads it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.by_host: dict[str, dict[str, int]] = {}

    def add(self, host: str, what: str, n: int = 1) -> None:
        with self._lock:
            per = self.by_host.setdefault(host, {"connections": 0, "commands": 0, "transfers": 0, "forwards": 0})
            per[what] += n


COUNTS = Counts()


class Runner:
    """Executes steps on a cluster's hosts. Use as a context manager."""

    def __init__(
        self,
        cluster: Cluster,
        nodes: list[Node] | None = None,
        forks: int | None = None,
        progress: Callable[[str, str, HostResult | None], None] | None = None,
        persist: bool = True,
        reconnect_idle: bool = False,
        lines: Callable[[str, str, Progress], None] | None = None,
        transport: "Callable[[Runner], launcher.Transport] | None" = None,
    ):
        """``progress(step, host, result)``: at each host's start of a step
        (result None) and with its result. ``lines(step, host, progress)``:
        how far a host got in a step whose ``progress`` parser read it from
        the command's output while it runs (None: the output is not read
        before the command ends).

        ``persist=False``: never through a connection holder. ``reconnect_idle``
        (the holder's own runner, whose connections wait between commands for
        as long as it lives): a reused connection whose session channel will
        not open is replaced once, since the command never started; a host
        that is down then reads unreachable, as on a first connection."""
        self.cluster = cluster
        self.reconnect_idle = reconnect_idle
        self.nodes = list(nodes if nodes is not None else cluster.nodes)
        # how a command reaches a node: the cluster's launcher's transport (llmdeploy/launcher.py), picked once
        self.transport = (transport or launcher.of(cluster).transport)(self)
        persist = persist and self.transport.holder
        ssh_hosts = self.transport.hosts(self.nodes)
        self.forks = max(1, min(forks or cluster.ssh.forks, len(self.nodes) or 1))
        self.progress = progress
        self.lines = lines
        check_ssh_config(cluster)
        self._conns: dict[str, Connection] | None = None
        self._shared: dict[str | tuple[str, ...], Any] = {}  # what every connection's make_connection shares (its Config, the known_hosts)
        self._build_lock = threading.Lock()
        self.unreachable: dict[str, str] = {}
        # hosts left out of later steps (failed earlier), with the reason
        self.excluded: dict[str, str] = {}
        self.recap: dict[str, dict[str, int]] = {n.name: {OK: 0, CHANGED: 0, FAILED: 0, UNREACHABLE: 0, SKIPPED: 0} for n in self.nodes}
        self.round_trips: dict[str, int] = {n.name: 0 for n in [*self.nodes, *ssh_hosts]}
        # commands running per host (a timed-out command is only reaped when it was alone)
        self._inflight: dict[str, int] = {n.name: 0 for n in ssh_hosts}
        self._lock = threading.Lock()
        self._opening = {n.name: threading.Lock() for n in ssh_hosts}
        self._ssh_hosts = ssh_hosts
        self._pool = ThreadPoolExecutor(max_workers=self.forks, thread_name_prefix="llmdeploy-host")
        # ssh.persist_s: the commands go through the cluster's connection holder
        self.mux = None
        if persist and cluster.ssh.persist_s > 0:
            from . import mux

            try:
                self.mux = mux.Client(cluster, lambda c: Runner(c, persist=False, reconnect_idle=True))
                self.mux.ensure()
            except OSError as exc:
                self._no_holder(exc)
        if self.mux is None:
            self.connections  # built here, in the main thread (see connect.make_connection)

    @property
    def connections(self) -> dict[str, Connection]:
        """One Fabric connection per node, built (not opened) on first use:
        not at all when every command goes through a connection holder."""
        with self._build_lock:
            if self._conns is None:
                from . import connect as cx

                self._conns = {n.name: cx.make_connection(self.cluster, n, self._shared) for n in self._ssh_hosts}
            return self._conns

    def abandon(self, node: Node) -> None:
        """Give ``node``'s SSH connection up after an interrupt (Ctrl-C, or
        SIGTERM: a KeyboardInterrupt) ended this thread's use of it. The
        interrupt may have landed inside paramiko right after it took a lock
        of the connection and before its ``try`` (the transport's send lock,
        say: an interrupt is raised at the first check after the lock's
        acquire returns): every later command on that connection, the
        interrupted flow's stop, ledger line and lock release among them,
        would wait for that lock forever. The commands after this get a new
        connection; the old one is closed on a thread of its own that nothing
        waits for (its close may wait for such a lock too)."""
        with self._build_lock:
            conns = self._conns
            if conns is None:
                return
            old = conns.get(node.name)
            if old is None:
                return
            try:
                from . import connect

                conns[node.name] = connect.make_connection(self.cluster, node, self._shared)
            except Exception:  # it was built before: never, but the interrupt must go on being raised
                return
        threading.Thread(target=_close_connection, args=(old,), name=f"llmdeploy-abandon-{node.name}", daemon=True).start()

    def _no_holder(self, exc: BaseException) -> None:
        """Without a holder the commands connect directly: said once."""
        with self._lock:
            if getattr(self, "_warned", False):
                return
            self._warned = True
            self.mux = None
        print(f"warning: ssh.persist_s: no connection holder ({exc}); connecting directly", file=sys.stderr)

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.transport.close()  # what the transport holds for this command (an allocation of its own, say)
        self._pool.shutdown(wait=False, cancel_futures=True)
        for conn in (self._conns or {}).values():
            _close_connection(conn)

    # -- execution -------------------------------------------------------------
    def connection_name(self, node: Node) -> str:
        """Whose SSH connection ``connection(node)`` is: the node's, or the host the transport reaches it through."""
        return self.transport.carrier(node).name

    def connection(self, node: Node) -> Connection:
        """The open connection to ``node`` (for port forwarding); UnreachableError if it cannot be.
        The transport's carrier's (a host the nodes are reached through reaches their serving addresses)."""
        return self._open(self.transport.carrier(node))

    def _open(self, node: Node) -> Connection:
        conn = self.connections[node.name]
        if conn.is_connected:
            return conn
        # one opening at a time per host (a connection holder serves
        # several commands of a host at once)
        with self._opening[node.name]:
            return self._open_locked(node, conn)

    def _open_locked(self, node: Node, conn: Connection) -> Connection:
        from fabric import Connection

        from . import connect as cx

        if conn.is_connected:
            return conn
        gateway = conn.gateway
        if isinstance(gateway, Connection) and not gateway.is_connected:
            try:
                gateway.open()
            except Exception as exc:  # every way a connection can fail
                reason = cx._unreachable_reason(exc, gateway)
                cx._close_quietly(gateway)
                raise UnreachableError(f"jump host {gateway.user}@{gateway.host}:{gateway.port}: {reason}") from exc
        try:
            conn.open()
        except Exception as exc:  # every way a connection can fail
            reason = cx._unreachable_reason(exc, conn)
            # a failed connect can leave paramiko's transport thread running
            # (waiting for a banner, or after a refused host key)
            cx._close_quietly(conn)
            raise UnreachableError(reason) from exc
        # dead-peer detection once authenticated (ssh.keepalive_s): a cut
        # network fails the command within the keepalive window
        cx.keep_alive(conn, self.cluster.ssh.keepalive_s, self.cluster.ssh.keepalive_count)
        COUNTS.add(node.name, "connections")
        return conn

    def exec(
        self, node: Node, command: str, timeout: float | None = None, stdin: str | bytes | None = None,
        on_line: Callable[[str, str], None] | None = None,
    ) -> tuple[str, str, int]:
        """Run one command on one host over its reused connection; ``stdin``
        is sent to its standard input (then end of file); ``on_line(stream,
        line)``: every line of stdout ("out") and stderr ("err") as it arrives.

        A command past its deadline gets exit code 124 and "command timed out
        after Ns" in stderr; a connection that dies under it raises
        :class:`ConnectionLost` (an UnreachableError). The transport carries it.
        With ``ssh.become``, a command sudo refused to run has the reason in
        words as its stderr (:meth:`sudo_refusal`)."""
        interrupt.check()
        out, err, code = self.transport.exec(node, command, timeout, stdin, on_line)
        refused = self.sudo_refusal(node, out, err, code)
        return (out, refused, code) if refused else (out, err, code)

    def world(self, nodes: list[Node], tasks: int, argv: list[str], env: dict[str, dict[str, str]],
              timeout: float | None = None) -> tuple[str, str, int] | None:
        """``argv`` as one MPI world of ``tasks`` processes on each of
        ``nodes``, wired up by the cluster's launcher (``Transport.world``);
        None when it has no such launch (mpirun then starts the world)."""
        return self.transport.world(nodes, tasks, argv, env, timeout)

    def stream(self, node: Node, command: str, name: str = "follow") -> int:
        """Run a command that prints until it is stopped (a log followed), its
        output straight to this terminal; its exit code."""
        node, command = self.transport.follow(node, command, name)
        conn = self._open(node)
        with interrupt.native():  # Invoke's runner ends the follow on Ctrl-C itself (its wait loop catches it)
            code: int = conn.run(self.wire(command), warn=True, pty=False, in_stream=False).exited
            return code

    def wire(self, command: str, login_args: str = "") -> str:
        """What goes on the SSH session channel for ``command``: the command
        itself, or with ``ssh.become`` the command under ``sudo -n`` as root
        (:func:`llmdeploy.become.command`; ``login_args``: its words the login
        shell expands). The one place a node's command is wrapped: every
        command this runner sends over SSH passes here (``_exec_ssh``: each
        step's and exec's, and the connection holder's, whose runner is one of
        these and is sent the command unwrapped; ``stream``; ``_reap``)."""
        if not self.cluster.ssh.become:
            return command
        return become.command(command, login_args)

    def sudo_refusal(self, node: Node, out: str, err: str, code: int) -> str | None:
        """With ``ssh.become``, why sudo did not run a command on ``node``, in
        words naming the node (:func:`llmdeploy.become.refusal`); None when it
        ran, and always without ``ssh.become``."""
        if not self.cluster.ssh.become:
            return None
        return become.refusal(node.name, self.cluster.ssh.user, out, err, code)

    def exec_direct(
        self, node: Node, command: str, timeout: float | None = None, stdin: str | bytes | None = None,
        on_line: Callable[[str, str], None] | None = None,
    ) -> tuple[str, str, int]:
        """``exec`` over ``node``'s own SSH connection (directly or through the
        connection holder): the SSH transport's, and how a transport reaches
        the host it sends the nodes' commands through."""
        out, err, code, _ = self._exec(node, command, timeout, stdin, on_line)
        return out, err, code

    def _exec(
        self, node: Node, command: str, timeout: float | None, stdin: str | bytes | None = None,
        on_line: Callable[[str, str], None] | None = None,
    ) -> tuple[str, str, int, tuple[float, str] | None]:
        """exec, plus (deadline, what became of the command) when its deadline fired."""
        deadline = timeout or self.cluster.ssh.command_timeout
        if self.mux is not None:
            held = self._exec_held(node, command, deadline, stdin, on_line)
            if held is not None:
                return held
        try:
            return self._exec_ssh(node, command, deadline, stdin, on_line)
        except interrupt.Interrupted:
            raise  # raised between two reads, where no lock is held (llmdeploy/interrupt.py)
        except KeyboardInterrupt:
            # Python's own handler's: it may have landed inside paramiko holding a lock of this connection: see abandon
            self.abandon(node)
            raise

    def _exec_ssh(
        self, node: Node, command: str, deadline: float, stdin: str | bytes | None, on_line: Callable[[str, str], None] | None,
    ) -> tuple[str, str, int, tuple[float, str] | None]:
        """``_exec`` over this runner's own SSH connection to ``node``."""
        was_open = self.connections[node.name].is_connected
        import paramiko

        from . import connect as cx

        conn = self._open(node)
        self._count(node, stdin)
        with self._lock:
            self._inflight[node.name] += 1
        start = time.monotonic()
        data = stdin.encode() if isinstance(stdin, str) else stdin
        command = self.wire(command)
        try:
            try:
                try:
                    out, err, code = cx.run_channel(conn.client.get_transport(), command, deadline, data, on_line)
                except cx._NotOpened as exc:
                    if not (was_open and self.reconnect_idle):
                        raise exc.cause from exc
                    # a holder's connection that died while it waited (the
                    # host rebooted or went silent): the command never started,
                    # so once more on a new connection, and a host that is down
                    # reads unreachable, as on a first one
                    cx._close_quietly(conn)
                    conn = self._open(node)
                    COUNTS.add(node.name, "commands")
                    start = time.monotonic()
                    out, err, code = cx.run_channel(conn.client.get_transport(), command, deadline, data, on_line)
            except cx._TimedOut as exc:
                with self._lock:
                    alone = self._inflight[node.name] == 1
                if alone:
                    COUNTS.add(node.name, "commands")
                fate = self._reap(conn) if alone else "other commands run on this connection: the timed-out one was left alone"
                return exc.stdout, (exc.stderr + f"\ncommand timed out after {deadline:g}s").lstrip(), 124, (deadline, fate)
            except (paramiko.SSHException, OSError, EOFError, AttributeError) as exc:
                # AttributeError: the transport is gone (closed under us)
                exc = exc.cause if isinstance(exc, cx._NotOpened) else exc
                detail = cx._lost_detail(conn, None if isinstance(exc, AttributeError) else exc)
                cx._close_quietly(conn)
                raise ConnectionLost(detail, time.monotonic() - start) from exc
        finally:
            with self._lock:
                self._inflight[node.name] -= 1
        # A channel closed with no exit status (-1): the command was killed by a
        # signal, or the connection died; the transport tells which.
        if code == -1 and cx._dropped(conn):
            detail = cx._lost_detail(conn, None)
            cx._close_quietly(conn)
            raise ConnectionLost(detail, time.monotonic() - start)
        return out, err, code, None

    def _count(self, node: Node, stdin: str | bytes | None) -> None:
        """One command sent to ``node`` (a transfer when it has stdin)."""
        with self._lock:
            self.round_trips[node.name] += 1
        COUNTS.add(node.name, "commands")
        if stdin:
            COUNTS.add(node.name, "transfers")

    def _exec_held(
        self, node: Node, command: str, deadline: float, stdin: str | bytes | None, on_line: Callable[[str, str], None] | None = None
    ) -> tuple[str, str, int, tuple[float, str] | None] | None:
        """``_exec`` through the connection holder (llmdeploy/mux.py); None
        when there is none to be had (then this runner connects directly).
        ``on_line``: the holder sends each line as the command prints it."""
        from . import mux

        start = time.monotonic()
        ssh = self.cluster.ssh
        client = self.mux
        if client is None:
            return None
        try:
            ans = client.exec(node.name, command, deadline, stdin.encode() if isinstance(stdin, str) else stdin,
                              wait=deadline + 3 * ssh.connect_timeout + 60, on_line=on_line)
        except mux.Unavailable as exc:
            self._no_holder(exc)
            return None
        except (OSError, EOFError, ValueError) as exc:
            self._count(node, stdin)
            raise ConnectionLost(f"the connection holder ended under the command ({type(exc).__name__}: {exc}); "
                                 f"see {client.path}.log", time.monotonic() - start) from exc
        self._count(node, stdin)
        if "unreachable" in ans:
            raise UnreachableError(ans["unreachable"])
        if "lost" in ans:
            raise ConnectionLost(ans["lost"], float(ans.get("elapsed") or 0))
        if "error" in ans:
            raise RuntimeError(f"connection holder: {ans['error']}")
        fired = tuple(ans["fired"]) if ans.get("fired") else None
        return ans["out"], ans["err"], int(ans["code"]), fired

    def _progress_lines(self, step: Step) -> Callable[[str, str, str], None] | None:
        """The per-line callback that feeds ``step``'s progress parser's
        answers to ``self.lines``; None when either is missing (then no line
        is cut or read while the commands run)."""
        parse, sink = step.progress, self.lines
        if parse is None or sink is None:
            return None

        def on_line(host: str, stream: str, line: str) -> None:
            try:
                got = parse(line)
            except Exception:  # a parser's bug costs the display, never the step
                return
            if got is not None:
                sink(step.name, host, got)

        return on_line

    def _reap(self, conn: Connection) -> str:
        """Stop what a timed-out command left on the host; say what happened.

        Closing the channel does not stop a command without a terminal, and sshd
        refuses the SSH "signal" request for root logins (no privilege-separated
        child). So: one more command on the same connection sends SIGTERM to the
        process groups of its sibling sessions (the sshd process serving this
        connection started one per command; each leads its own process group).
        Only called when no other command of ours runs on this connection."""
        from . import connect as cx

        if not conn.is_connected:
            return "the connection is gone: the command may still run on the host"
        # with ssh.become the sessions' processes are root's: the reaper runs under sudo, told by the
        # login shell which sshd process serves the connection and which session is its own
        reap = self.wire(cx.REAP_AS_ROOT, '"$PPID" "$$"') if self.cluster.ssh.become else cx.REAP_SCRIPT
        try:
            out, _, code = cx.run_channel(conn.client.get_transport(), reap, max(5.0, self.cluster.ssh.connect_timeout))
        except Exception as exc:  # best effort
            return f"could not stop it on the host ({type(exc).__name__}): it may still run there"
        count = out.strip().splitlines()[-1:] if code == 0 else []
        if count and count[0].isdigit() and int(count[0]) > 0:
            return "sent SIGTERM to its processes on the host"
        if count == ["0"]:
            return "it had already ended on the host"
        return f"could not stop it on the host (exit {code}): it may still run there"

    def before(self, step: Step, node: Node) -> "HostResult | str | None":
        """What ``step`` does on ``node`` before any round trip: a result
        (a local or decided host), the command to run, or None (nothing)."""
        decided = step.decide(node) if step.decide and not step.local else None
        if step.local:
            return step.local(node)
        if decided is not None:
            decided.host = node.name
            return decided
        assert step.build is not None  # a step that is neither local nor decided runs its command
        return step.build(node)

    def after(self, step: Step, node: Node, out: str, err: str, code: int, fired: tuple[float, str] | None) -> HostResult:
        """The host's result from its command's output (the step's parser)."""
        if step.progress:
            out, err = without_progress(out), without_progress(err)
        if fired is not None:
            # partial output: not for the parser
            return HostResult(node.name, FAILED, msg=f"timed out after {fired[0]:g}s at step '{step.name}' (the command's deadline); {fired[1]}",
                              stdout=out, stderr=err, exit_code=code)
        refused = self.sudo_refusal(node, out, err, code)
        if refused:
            # sudo's refusal (ssh.become), not the command's output: no parser reads it
            return HostResult(node.name, FAILED, msg=refused, stdout=out, stderr=err, exit_code=code)
        res = (step.parse or default_parse)(node, out, err, code)
        res.host = node.name
        if res.exit_code is None:
            res.exit_code = code
        if not res.stdout:
            res.stdout = out
        if not res.stderr:
            res.stderr = err
        return res

    def _left_out(self, node: Node) -> HostResult | None:
        """The skipped result of a host an earlier step left out (unreachable, or excluded after a failure); None: it takes part."""
        if node.name in self.unreachable:
            return HostResult(node.name, SKIPPED, msg=f"unreachable earlier: {self.unreachable[node.name]}")
        if node.name in self.excluded:
            return HostResult(node.name, SKIPPED, msg=self.excluded[node.name])
        return None

    def _one(self, step: Step, node: Node, on_line: Callable[[str, str, str], None] | None = None) -> HostResult:
        start = time.monotonic()
        res = self._left_out(node)
        if res is None:
            try:
                pre = self.before(step, node)
                if isinstance(pre, HostResult):
                    res = pre
                elif pre is None:
                    res = HostResult(node.name, SKIPPED, msg="nothing to do here")
                else:
                    host_line = (lambda stream, line: on_line(node.name, stream, line)) if on_line else None
                    out, err, code, fired = self._exec(node, pre, step.timeout, step.stdin(node) if step.stdin else None, host_line)
                    res = self.after(step, node, out, err, code, fired)
            except ConnectionLost as exc:
                msg = f"connection lost during step '{step.name}' after {exc.elapsed:.1f}s: {exc.detail}"
                with self._lock:
                    self.unreachable[node.name] = msg
                res = HostResult(node.name, UNREACHABLE, msg=msg)
            except UnreachableError as exc:
                msg = f"unreachable at step '{step.name}': {exc}"
                with self._lock:
                    self.unreachable[node.name] = msg
                res = HostResult(node.name, UNREACHABLE, msg=msg)
            except Exception as exc:  # a bug in a parser must not hide other hosts
                res = HostResult(node.name, FAILED, msg=f"{type(exc).__name__}: {exc}")
        res.duration = time.monotonic() - start
        return res

    def run(
        self, step: Step, nodes: list[Node] | None = None, deadline: float | None = None,
        on_line: Callable[[str, str, str], None] | None = None,
    ) -> dict[str, HostResult]:
        """Run ``step`` on ``nodes`` (default: all) in parallel; results keyed by node name.

        ``deadline`` bounds the whole step: hosts still running then are
        reported failed ("step deadline"), the others keep their results.
        ``on_line(host, stream, line)``: every line of every host's output as
        it arrives; by default, when the runner has ``lines`` and the step a
        ``progress`` parser, what the parser reads goes to ``lines``.
        """
        interrupt.check()  # between steps
        targets = list(nodes if nodes is not None else self.nodes)
        return self._finish(step, targets, self.transport.run(step, targets, deadline, on_line))

    def run_each(
        self, step: Step, targets: list[Node], deadline: float | None = None,
        on_line: Callable[[str, str, str], None] | None = None,
    ) -> dict[str, HostResult]:
        """``step`` as one command per host, on the runner's pool (``run``
        over SSH), before the hosts are compared and counted."""
        on_line = on_line or self._progress_lines(step)
        futures = {}
        for node in targets:
            if self.progress:
                self.progress(step.name, node.name, None)
            futures[self._pool.submit(self._one, step, node, on_line)] = node
        budget = deadline
        if budget is None:
            per_cmd = (step.timeout or self.cluster.ssh.command_timeout) + self.cluster.ssh.connect_timeout
            waves = -(-len(targets) // self.forks)
            budget = per_cmd * waves + 30
        done, not_done = interrupt.wait(futures, timeout=budget)  # in slices: a Ctrl-C is raised here, holding no lock
        results: dict[str, HostResult] = {}
        for fut in done:
            node = futures[fut]
            results[node.name] = fut.result()
        for fut in not_done:
            fut.cancel()
            node = futures[fut]
            results[node.name] = HostResult(node.name, FAILED, msg=f"step '{step.name}' deadline of {budget:g}s passed (no answer from the host)")
        return results

    def run_batched(self, step: Step, targets: list[Node], batch: Callable[[Step, list[Node]], dict[str, HostResult]]) -> dict[str, HostResult]:
        """``step`` as one ``batch`` over the hosts not left out earlier (a
        transport whose one command fans out to the nodes), before the hosts
        are compared and counted."""
        results: dict[str, HostResult] = {}
        live = []
        for n in targets:
            if self.progress:
                self.progress(step.name, n.name, None)
            skipped = self._left_out(n)
            if skipped is not None:
                results[n.name] = skipped
            else:
                live.append(n)
        if live:
            try:
                results.update(batch(step, live))
            except Exception as exc:  # a bug must not hide the hosts
                results.update({n.name: HostResult(n.name, FAILED, msg=f"{type(exc).__name__}: {exc}") for n in live if n.name not in results})
        return results

    def _finish(self, step: Step, targets: list[Node], results: dict[str, HostResult]) -> dict[str, HostResult]:
        """Compare hosts (the step's aggregate), count the recap, report each host."""
        if step.aggregate:
            try:
                step.aggregate(results)
            except Exception as exc:  # a bug in a comparison fails the step, visibly
                for r in results.values():
                    if not r.failed and r.status != SKIPPED:
                        r.status, r.msg = FAILED, f"comparing hosts: {type(exc).__name__}: {exc}"
        for node in targets:
            r = results[node.name]
            with self._lock:
                self.recap[node.name][r.status] += 1
            if self.progress:
                self.progress(step.name, node.name, r)
        return {n.name: results[n.name] for n in targets}
