"""A runner's SSH session: a Fabric connection per host, opened once, reused
by every command (the core's :class:`llmdeploy.launcher.Connector`).

Both launchers' transports give their runner one (``Transport.connector``):
the SSH launcher's to every node, the Slurm launcher's to its login host. The
runner (``llmdeploy/runner.py``) keeps the steps (the pool, the deadlines,
one ``HostResult`` per host) and sends each command here; this session puts
it on the wire. Host keys are checked against known_hosts with paramiko's
RejectPolicy (``transports/ssh/connect.py``, loaded only when the
session connects itself); with ``ssh.persist_s`` the commands go through the
cluster's connection holder instead (``transports/ssh/mux.py``), whose own
runner's session connects. Every command goes on the wire through
``Runner.wire`` (``ssh.become``: under ``sudo -n`` as root,
``llmdeploy/become.py``).

Every SSH failure reads as what happened, where and how to fix it (refused,
no banner, unknown or changed host key, authentication, connection lost,
deadline) and names the step it happened in; see ``connect._unreachable_reason``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

from llmdeploy import interrupt
from llmdeploy.errors import ConnectionLost, UnreachableError
from llmdeploy.inventory import Cluster, Node
from llmdeploy.runner import COUNTS, HostResult, Runner, Step
from transports.ssh.sshfiles import check_ssh_config

if TYPE_CHECKING:
    from fabric import Connection

    from transports.ssh.mux import Client


def _close_connection(conn: Connection) -> None:
    """Close a Fabric connection and its jump host's (Fabric's close leaves that one open)."""
    for c in (conn, conn.gateway):
        if c is not None and not isinstance(c, str):
            try:
                c.close()
            except Exception:
                pass


def holders_runner(cluster: Cluster) -> Runner:
    """The connection holder's runner: one that connects to each node itself
    (:class:`SshTransport`, never through a holder), and replaces a reused
    connection that died while it waited."""
    return Runner(cluster, persist=False, reconnect_idle=True, transport=SshTransport)


class SshSession:
    """``runner``'s SSH connections to ``hosts`` (the hosts its transport
    sends the commands to, ``Transport.hosts``). ``persist``: through the
    cluster's connection holder when ``ssh.persist_s`` asks for one (else,
    and when none can be had, directly)."""

    def __init__(self, runner: Runner, hosts: list[Node], persist: bool):
        self.r = runner
        self.cluster = runner.cluster
        check_ssh_config(self.cluster)
        self._conns: dict[str, Connection] | None = None
        self._shared: dict[str | tuple[str, ...], Any] = {}  # what every connection's make_connection shares (its Config, the known_hosts)
        self._build_lock = threading.Lock()
        self._lock = threading.Lock()
        # commands running per host (a timed-out command is only reaped when it was alone)
        self._inflight: dict[str, int] = {n.name: 0 for n in hosts}
        self._opening = {n.name: threading.Lock() for n in hosts}
        self._hosts = hosts
        # ssh.persist_s: the commands go through the cluster's connection holder
        self.mux: Client | None = None
        if persist and self.cluster.ssh.persist_s > 0:
            from transports.ssh import mux

            try:
                self.mux = mux.Client(self.cluster, holders_runner)
                self.mux.ensure()
            except OSError as exc:
                self._no_holder(exc)
        if self.mux is None:
            self.connections  # built here, in the main thread (see connect.make_connection)

    @property
    def connections(self) -> dict[str, Connection]:
        """One Fabric connection per host, built (not opened) on first use:
        not at all when every command goes through a connection holder."""
        with self._build_lock:
            if self._conns is None:
                from transports.ssh import connect as cx

                self._conns = {n.name: cx.make_connection(self.cluster, n, self._shared) for n in self._hosts}
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
                from transports.ssh import connect

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

    def close(self) -> None:
        for conn in (self._conns or {}).values():
            _close_connection(conn)

    # -- connections -------------------------------------------------------------
    def connection_name(self, node: Node) -> str:
        """Whose SSH connection ``connection(node)`` is: the node's, or the host the transport reaches it through."""
        return self.r.transport.carrier(node).name

    def connection(self, node: Node) -> Connection:
        """The open connection to ``node`` (for port forwarding); UnreachableError if it cannot be.
        The transport's carrier's (a host the nodes are reached through reaches their serving addresses)."""
        return self._open(self.r.transport.carrier(node))

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

        from transports.ssh import connect as cx

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

    # -- commands -----------------------------------------------------------------
    def stream(self, node: Node, command: str) -> int:
        """Run a command that prints until it is stopped (a log followed), its
        output straight to this terminal; its exit code."""
        conn = self._open(node)
        with interrupt.native():  # Invoke's runner ends the follow on Ctrl-C itself (its wait loop catches it)
            code: int = conn.run(self.r.wire(command), warn=True, pty=False, in_stream=False).exited
            return code

    def exec(
        self, node: Node, command: str, timeout: float | None, stdin: str | bytes | None = None,
        on_line: Callable[[str, str], None] | None = None,
    ) -> tuple[str, str, int, tuple[float, str] | None]:
        """``Runner.exec`` over SSH, plus (deadline, what became of the command) when its deadline fired."""
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
        """``exec`` over this session's own SSH connection to ``node``."""
        was_open = self.connections[node.name].is_connected
        import paramiko

        from transports.ssh import connect as cx

        conn = self._open(node)
        self.r.count(node, stdin)
        with self._lock:
            self._inflight[node.name] += 1
        start = time.monotonic()
        data = stdin.encode() if isinstance(stdin, str) else stdin
        command = self.r.wire(command)
        try:
            try:
                try:
                    out, err, code = cx.run_channel(conn.client.get_transport(), command, deadline, data, on_line)
                except cx._NotOpened as exc:
                    if not (was_open and self.r.reconnect_idle):
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

    def _exec_held(
        self, node: Node, command: str, deadline: float, stdin: str | bytes | None, on_line: Callable[[str, str], None] | None = None
    ) -> tuple[str, str, int, tuple[float, str] | None] | None:
        """``exec`` through the connection holder (transports/ssh/mux.py); None
        when there is none to be had (then this session connects directly).
        ``on_line``: the holder sends each line as the command prints it."""
        from transports.ssh import mux

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
            self.r.count(node, stdin)
            raise ConnectionLost(f"the connection holder ended under the command ({type(exc).__name__}: {exc}); "
                                 f"see {client.path}.log", time.monotonic() - start) from exc
        self.r.count(node, stdin)
        if "unreachable" in ans:
            raise UnreachableError(ans["unreachable"])
        if "lost" in ans:
            raise ConnectionLost(ans["lost"], float(ans.get("elapsed") or 0))
        if "error" in ans:
            raise RuntimeError(f"connection holder: {ans['error']}")
        fired = tuple(ans["fired"]) if ans.get("fired") else None
        return ans["out"], ans["err"], int(ans["code"]), fired

    def _reap(self, conn: Connection) -> str:
        """Stop what a timed-out command left on the host; say what happened.

        Closing the channel does not stop a command without a terminal, and sshd
        refuses the SSH "signal" request for root logins (no privilege-separated
        child). So: one more command on the same connection sends SIGTERM to the
        process groups of its sibling sessions (the sshd process serving this
        connection started one per command; each leads its own process group).
        Only called when no other command of ours runs on this connection."""
        from transports.ssh import connect as cx

        if not conn.is_connected:
            return "the connection is gone: the command may still run on the host"
        # with ssh.become the sessions' processes are root's: the reaper runs under sudo, told by the
        # login shell which sshd process serves the connection and which session is its own
        reap = self.r.wire(cx.REAP_AS_ROOT, '"$PPID" "$$"') if self.cluster.ssh.become else cx.REAP_SCRIPT
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


class SshTransport:
    """Each node's commands over its own SSH connection (directly or through
    the holder): the SSH launcher's transport, and the connection holder's
    runner's."""

    holder = True

    def __init__(self, runner: Runner):
        self.r = runner

    def hosts(self, nodes: list[Node]) -> list[Node]:
        return nodes

    def carrier(self, node: Node) -> Node:
        return node

    def exec(self, node: Node, command: str, timeout: float | None, stdin: str | bytes | None,
             on_line: Callable[[str, str], None] | None) -> tuple[str, str, int]:
        return self.r.exec_direct(node, command, timeout, stdin, on_line)

    def run(self, step: Step, targets: list[Node], deadline: float | None,
            on_line: Callable[[str, str, str], None] | None) -> dict[str, HostResult]:
        return self.r.run_each(step, targets, deadline, on_line)

    def follow(self, node: Node, command: str, name: str) -> tuple[Node, str]:
        return node, command

    def forward_dest(self, node: Node, dest: str) -> str:
        return dest

    def world(self, nodes: list[Node], tasks: int, argv: list[str], env: dict[str, dict[str, str]],
              timeout: float | None) -> tuple[str, str, int] | None:
        """No launcher wires a world over SSH: mpirun on the first node starts it (its daemons over SSH)."""
        return None

    def close(self) -> None:
        """The runner closes its own connections; the transport holds nothing else."""

    def connector(self, hosts: list[Node], persist: bool) -> SshSession:
        """Every node's own SSH connection (or the connection holder's, ``persist``)."""
        return SshSession(self.r, hosts, persist)


# the connector's and the transport's conformance, for the type checker
if TYPE_CHECKING:  # pragma: no cover - types only
    from llmdeploy.launcher import Connector, Transport

    _conforms: Callable[[Runner, list[Node], bool], Connector] = SshSession
    _transport_conforms: Callable[[Runner], Transport] = SshTransport
