"""The one runner: a Fabric connection per host, opened once, reused by every step.

A step is built by pure functions (see :class:`Step`); the runner only
executes: all selected hosts in parallel on a bounded pool, a deadline on
every remote command and on the whole step, and one :class:`HostResult` per
host. Host keys are checked against known_hosts with paramiko's RejectPolicy.

Every SSH failure reads as what happened, where and how to fix it (refused,
no banner, unknown or changed host key, authentication, connection lost,
deadline) and names the step it happened in; see ``_unreachable_reason``.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import logging
import os
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable

import paramiko
from fabric import Config, Connection
from fabric.runners import Remote

from .errors import InventoryError
from .inventory import Cluster, Node

OK, CHANGED, FAILED, UNREACHABLE, SKIPPED = "ok", "changed", "failed", "unreachable", "skipped"

# paramiko logs every refused forwarding channel (readiness polls) at ERROR;
# the runner reports failures itself
logging.getLogger("paramiko.transport").setLevel(logging.CRITICAL)


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


def default_parse(node: Node, stdout: str, stderr: str, code: int) -> HostResult:
    if code == 0:
        return HostResult(node.name, OK, stdout=stdout, stderr=stderr, exit_code=code)
    msg = (stderr.strip() or stdout.strip()).splitlines()[-1:] or [f"exit {code}"]
    return HostResult(node.name, FAILED, msg=msg[0], stdout=stdout, stderr=stderr, exit_code=code)


class UnreachableError(Exception):
    pass


class ConnectionLost(UnreachableError):
    """An open connection died under a command (the runner adds the step)."""

    def __init__(self, detail: str, elapsed: float):
        self.detail, self.elapsed = detail, elapsed
        super().__init__(f"connection lost after {elapsed:.1f}s: {detail}")


class UnknownHostKey(paramiko.SSHException):
    """RejectPolicy's refusal, with the key the server offered (for the fingerprint)."""

    def __init__(self, hostname: str, key: paramiko.PKey):
        super().__init__(f"Server {hostname!r} not found in known_hosts")
        self.hostname, self.key = hostname, key


class RejectUnknownHosts(paramiko.RejectPolicy):
    """paramiko's RejectPolicy that keeps the offered key for the message."""

    def missing_host_key(self, client, hostname, key):
        raise UnknownHostKey(hostname, key)


class StoppingRemote(Remote):
    """Fabric's Remote runner (for ``Connection.run``, which streams output:
    ``logs --follow``; the runner's own commands go through
    :func:`run_channel`); when a command is stopped it asks sshd to send
    SIGTERM to the command's process group (the SSH "signal" channel request)
    before closing the channel, so the command does not keep running on the
    host. Servers that do not support the request ignore it."""

    def kill(self) -> None:
        chan = getattr(self, "channel", None)
        if chan is not None and not chan.closed:
            _send_signal(chan, "TERM")
        super().kill()


def known_hosts_files(cluster: Cluster, ssh_config: dict) -> list[str]:
    """Where host keys are checked: the inventory's known_hosts, else the
    ssh_config's UserKnownHostsFile for the host, else ~/.ssh/known_hosts."""
    if cluster.ssh.known_hosts:
        return [cluster.ssh.known_hosts]
    files = ssh_config.get("userknownhostsfile")
    if files:
        if isinstance(files, str):
            files = files.split()
        return [os.path.expanduser(f) for f in files]
    return [os.path.expanduser("~/.ssh/known_hosts")]


def _harden(conn: Connection, known_hosts: list[str], shared: dict | None = None) -> None:
    """Check host keys: load known_hosts and reject unknown keys (also on gateways).
    A missing known_hosts file means every key is unknown, hence refused.
    ``shared``: the files read once for all of a runner's connections."""
    client = conn.client
    client.set_missing_host_key_policy(RejectUnknownHosts())
    key = ("known_hosts", *known_hosts)
    if shared is None or key not in shared:
        keys = paramiko.HostKeys()
        for path in known_hosts:
            if os.path.exists(path):
                keys.load(path)
        if shared is not None:
            shared[key] = keys
    else:
        keys = shared[key]
    # one parsed set for every connection (parsing the file per connection, or
    # copying it entry by entry through HostKeys' mapping interface, is
    # quadratic: ~1 s at 64 hosts). Read-only here: unknown keys are refused,
    # never added.
    client._host_keys = keys
    conn._llmdeploy_known_hosts = list(known_hosts)
    if isinstance(conn.gateway, Connection):
        _harden(conn.gateway, known_hosts, shared)


def make_connection(cluster: Cluster, node: Node, shared: dict | None = None) -> Connection:
    """Build (not open) the Fabric connection for one node. Call from the main
    thread: building Connections concurrently races inside Invoke's Config.
    ``shared`` (one dict per Runner): the Config and the known_hosts, built
    once for every connection (like Fabric's groups share one Config), not
    once per host (11 ms each)."""
    ssh = cluster.ssh
    if ssh.config_file and not os.path.isfile(os.path.expanduser(ssh.config_file)):
        hint = f" (is the simulated cluster up? invoke sim.up --cluster {cluster.name})" if cluster.name.startswith("sim-") else ""
        raise InventoryError(f"cluster {cluster.name}", [f"ssh.config_file: {ssh.config_file} does not exist{hint}"])
    config = (shared or {}).get("config")
    if config is None:
        overrides: dict[str, Any] = {"load_ssh_configs": True, "runners": {"remote": StoppingRemote}}
        config = Config(overrides=overrides, runtime_ssh_path=ssh.config_file) if ssh.config_file else Config(overrides=overrides)
        if shared is not None:
            shared["config"] = config
    # Every phase has a deadline: TCP connect (timeout), the server's banner and
    # key exchange (banner_timeout; Transport.start_client also waits at most
    # ``timeout``), authentication (auth_timeout) and opening a session or a
    # jump-host channel (channel_timeout; paramiko's default is an hour).
    connect_kwargs: dict[str, Any] = {
        "allow_agent": True,
        "look_for_keys": True,
        "banner_timeout": ssh.connect_timeout,
        "auth_timeout": ssh.connect_timeout,
        "channel_timeout": ssh.connect_timeout,
    }
    if ssh.identity_file:
        connect_kwargs["key_filename"] = [ssh.identity_file]
    kwargs: dict[str, Any] = dict(
        host=node.address,
        config=config,
        connect_timeout=int(max(1, ssh.connect_timeout)),
        connect_kwargs=connect_kwargs,
    )
    # Explicit inventory values win over ssh_config; unset ones fall back to it.
    if ssh.user:
        kwargs["user"] = ssh.user
    if node.ssh_port or ssh.port:
        kwargs["port"] = node.ssh_port or ssh.port
    if ssh.jump_host:
        kwargs["gateway"] = Connection(ssh.jump_host, config=config.clone(), connect_kwargs=dict(connect_kwargs))
    conn = Connection(**kwargs)
    _harden(conn, known_hosts_files(cluster, conn.ssh_config), shared)
    return conn


# -- what went wrong, in words ---------------------------------------------------
def fingerprint(key: paramiko.PKey) -> str:
    """The key's fingerprint as ssh-keygen -l shows it (SHA256:base64)."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


def _key_type(key: paramiko.PKey) -> str:
    """ssh-keyscan -t's name for the key's type."""
    name = key.get_name()
    if name.startswith("ecdsa"):
        return "ecdsa"
    if "rsa" in name:
        return "rsa"
    return name.removeprefix("ssh-")


def _known_hosts_entry(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def _secs(value: float) -> str:
    return f"{value:g}s"


def _describe_key(key: paramiko.PKey | None) -> str:
    return f"{key.get_name()} {fingerprint(key)}" if key is not None else "no key"


def _keyscan(host: str, port: int, key: paramiko.PKey, path: str) -> str:
    p = f"-p {port} " if port != 22 else ""
    return f"ssh-keyscan {p}-t {_key_type(key)} {host} >> {path}"


def _unreachable_reason(exc: BaseException, conn: Connection | None = None) -> str:
    """One sentence for why ``conn`` could not be opened: what happened, where,
    and what to do about it. ``conn`` (when given) supplies the address, user,
    keys, known_hosts and timeouts the message names."""
    host = conn.host if conn is not None else "?"
    port = int(conn.port) if conn is not None and conn.port else 22
    where = f"{host}:{port}"
    kwargs = dict(conn.connect_kwargs) if conn is not None else {}
    timeout = kwargs.get("banner_timeout") or (conn.connect_timeout if conn is not None else None)
    after = f" after {_secs(timeout)}" if timeout else ""
    known = getattr(conn, "_llmdeploy_known_hosts", None) or ["known_hosts"]
    known_text = " ".join(known)

    if isinstance(exc, UnknownHostKey):
        entry = exc.hostname
        return (
            f"host key of {entry} is not in known_hosts ({known_text}): unknown host, refused. If this is the host you mean, "
            f"add its key: {_keyscan(host, port, exc.key, known[0])} "
            f"(check the fingerprint {exc.key.get_name()} {fingerprint(exc.key)} first, e.g. ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub on its console)"
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        entry = _known_hosts_entry(exc.hostname, port)
        return (
            f"host key of {entry} CHANGED: known_hosts ({known_text}) expects {_describe_key(exc.expected_key)}, "
            f"the host offered {_describe_key(exc.key)}; refused (a reinstalled host, or someone in the middle). "
            f"If you verified the new key, remove the old one: ssh-keygen -R '{entry}' -f {known[0]}, "
            f"then add the new one: {_keyscan(exc.hostname, port, exc.key, known[0])}"
        )
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return f"{exc}: host key of {where} not known, refused (add it to {known[0]} with ssh-keyscan after checking its fingerprint)"
    keys = [k for k in (kwargs.get("key_filename") or []) if k]
    auth_missing = isinstance(exc, paramiko.SSHException) and "No authentication methods available" in str(exc)
    # paramiko gives up at the first identity file it cannot read
    key_unreadable = isinstance(exc, OSError) and getattr(exc, "filename", None) in keys
    if isinstance(exc, paramiko.AuthenticationException) or auth_missing or key_unreadable:
        user = conn.user if conn is not None else "?"
        if "timeout" in str(exc).lower():
            return f"timed out{after} during authentication as {user}@{where} (the server stopped answering)"
        shown = ", ".join(k if os.path.exists(k) else f"{k} (missing)" for k in keys) or "no identity_file set"
        others = " and ssh-agent/~/.ssh keys" if (kwargs.get("allow_agent") or kwargs.get("look_for_keys")) and not key_unreadable else ""
        if key_unreadable:
            why = f"cannot read the identity file: {exc.strerror} (check ssh.identity_file)"
        elif isinstance(exc, paramiko.PasswordRequiredException):
            why = "the key is encrypted and no passphrase was given"
        elif isinstance(exc, paramiko.BadAuthenticationType):
            why = f"the server allows only: {', '.join(exc.allowed_types) or 'nothing'}"
        else:
            why = f"the server accepted none of them: is the public key in {user}'s authorized_keys there?"
        return f"authentication failed for {user}@{where} (key {shown}{others}): {why}"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        parts = []
        for addr, err in exc.errors.items():
            a = f"{addr[0]}:{addr[1]}"
            if err.errno == errno.ECONNREFUSED:
                parts.append(f"connection refused by {a} (is sshd running there, on port {addr[1]}?)")
            elif err.errno == errno.EHOSTUNREACH:
                parts.append(f"no route to host {a} (host down, or a wrong address?)")
            else:
                parts.append(f"cannot connect to {a}: {err.strerror or err}")
        return "; ".join(parts) or f"cannot connect to {where}"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host name {host!r}: {exc.strerror or exc} (check the node's ssh_host and the ssh_config)"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"TCP connect to {where} timed out{after} (nothing answered: the host is down, the address is wrong, or a firewall drops the packets)"
    if isinstance(exc, paramiko.ChannelException):
        return f"the jump host could not open a connection to {where}: {exc.text or exc} (code {exc.code})"
    if isinstance(exc, paramiko.SSHException) and "Timeout opening channel" in str(exc) and conn is not None and conn.gateway:
        return f"the jump host did not connect to {where} within {_secs(kwargs.get('channel_timeout') or timeout)} (nothing answered behind it)"
    if isinstance(exc, OSError) and not isinstance(exc, paramiko.SSHException):
        if exc.errno == errno.ENETUNREACH:
            return f"network unreachable for {where} (no route on this machine)"
        return f"cannot connect to {where}: {exc.strerror or exc}"
    if isinstance(exc, (paramiko.SSHException, EOFError)):
        transport = conn.client.get_transport() if conn is not None else None
        version = getattr(transport, "remote_version", None)
        text = str(exc)
        cause = exc.__context__
        timed_out = "No existing session" in text or "timed out" in text.lower() or isinstance(cause, (socket.timeout, TimeoutError))
        closed = isinstance(exc, EOFError) or isinstance(cause, (EOFError, ConnectionResetError))
        if not version:
            if timed_out:
                return f"timed out{after} during the SSH handshake with {where} (the host accepted the TCP connection but sent no SSH banner)"
            if closed:
                return (
                    f"{where} accepted the TCP connection, then closed it before sending an SSH banner "
                    "(sshd refusing connections: MaxStartups, tcp wrappers, a firewall; or not an SSH server)"
                )
            return f"SSH handshake with {where} failed before the server's banner: {text}"
        if timed_out:
            return f"timed out{after} during the SSH key exchange with {where} (the server sent its banner {version!r}, then stopped answering)"
        if closed:
            return f"{where} ({version}) closed the connection during the SSH key exchange"
        return f"SSH handshake with {where} ({version}) failed: {text}"
    return f"{type(exc).__name__}: {exc}"


def _lost_detail(conn: Connection, exc: BaseException | None) -> str:
    """What ended a connection that was open: the exception, else the transport's."""
    where = f"{conn.host}:{conn.port}"
    transport = conn.client.get_transport()
    cause = exc if exc is not None else (transport.get_exception() if transport is not None else None)
    if cause is None or isinstance(cause, EOFError):
        return f"{where} closed the connection (sshd or its session killed, the host rebooting, or a network device dropping it)"
    if isinstance(cause, paramiko.SSHException) and "Timeout opening channel" in str(cause):
        timeout = conn.connect_kwargs.get("channel_timeout")
        return f"{where} did not answer a new session request within {_secs(timeout)} (host frozen or network cut)"
    if isinstance(cause, OSError) and cause.strerror:
        return f"{cause.strerror} ({where})"
    return f"{type(cause).__name__}: {cause} ({where})"


# Run on a connection whose command timed out: SIGTERM to the process group of
# every other session of the sshd process serving it (this shell's parent);
# prints how many were signalled.
REAP_SCRIPT = (
    'n=0; for c in $(pgrep -P "$PPID"); do [ "$c" = "$$" ] && continue; '
    'kill -TERM -- "-$c" 2>/dev/null && n=$((n+1)); done; echo "$n"'
)


class _NotOpened(paramiko.SSHException):
    """The session channel could not be opened: the command never started."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


class _TimedOut(Exception):
    """A command's deadline fired; the output read until then."""

    def __init__(self, stdout: str, stderr: str):
        super().__init__("command timed out")
        self.stdout, self.stderr = stdout, stderr


def _send_signal(chan: paramiko.Channel, name: str) -> None:
    """The SSH "signal" channel request (RFC 4254 6.9); servers that do not
    support it (sshd for root logins) ignore it."""
    try:
        m = paramiko.Message()
        m.add_byte(paramiko.common.cMSG_CHANNEL_REQUEST)
        m.add_int(chan.remote_chanid)
        m.add_string("signal")
        m.add_boolean(False)
        m.add_string(name)
        chan.transport._send_user_message(m)
    except Exception:  # best effort: the channel is closed anyway
        pass


def run_channel(transport: paramiko.Transport, command: str, timeout: float, stdin: bytes | None = None) -> tuple[str, str, int]:
    """Run ``command`` in a new session channel of ``transport``: its stdout
    and stderr (UTF-8, undecodable bytes replaced) and exit code (-1: the
    channel closed without one). ``stdin`` is sent, then end of file, while the
    output is read (a command that writes before it reads cannot deadlock).
    Past ``timeout``: SIGTERM is asked for, the channel closed, and
    :class:`_TimedOut` raised with what was read.

    One thread per command, the caller's, that sleeps only in paramiko's
    buffers: Fabric's ``Connection.run`` starts three more threads per command
    and polls every 10 ms (Invoke's ``input_sleep``)."""
    end = time.monotonic() + timeout
    out: list[bytes] = []
    err: list[bytes] = []
    try:
        chan = transport.open_session()
    except (paramiko.SSHException, OSError, EOFError, AttributeError) as exc:  # AttributeError: no transport
        raise _NotOpened(exc) from exc
    try:
        chan.exec_command(command)
        data = memoryview(stdin or b"")
        sent = 0
        if not data:
            chan.shutdown_write()
        while True:
            left = end - time.monotonic()
            if left <= 0:
                _send_signal(chan, "TERM")
                raise _TimedOut(b"".join(out).decode("utf-8", "replace"), b"".join(err).decode("utf-8", "replace"))
            if sent < len(data):
                while sent < len(data) and chan.send_ready():
                    if chan.closed or chan.eof_received:  # the command ended without reading it all
                        sent = len(data)
                        break
                    sent += chan.send(data[sent:sent + 32768])
                if sent >= len(data) and not chan.closed:
                    chan.shutdown_write()
                # the window is full: read what came back, look again soon
                chan.settimeout(0.005 if sent < len(data) else min(left, 1.0))
            else:
                chan.settimeout(min(left, 1.0))
            try:
                chunk = chan.recv(65536)
            except socket.timeout:
                chunk = None
            while chan.recv_stderr_ready():
                err.append(chan.recv_stderr(65536))
            if chunk:
                out.append(chunk)
            elif chunk == b"":  # end of file (or closed): stderr came before it
                break
        while chan.recv_stderr_ready():
            err.append(chan.recv_stderr(65536))
        # the exit status follows the end of file; a channel closed without one is -1
        while not chan.status_event.wait(0.05):
            if chan.closed or time.monotonic() >= end:
                break
        code = chan.exit_status if chan.status_event.is_set() else -1
        return b"".join(out).decode("utf-8", "replace"), b"".join(err).decode("utf-8", "replace"), code
    finally:
        chan.close()


def _no_delay(conn: Connection) -> None:
    """Send small packets at once. paramiko leaves Nagle's algorithm on, and
    with the server's delayed ACK every command then waited ~40 ms for its
    exit status (measured: 47 ms per `true`, 3 ms with TCP_NODELAY). Through
    a jump host the socket is an SSH channel: nothing to set."""
    transport = conn.client.get_transport()
    sock = getattr(transport, "sock", None)
    if isinstance(sock, socket.socket):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


def _close_quietly(conn: Connection) -> None:
    try:
        conn.client.close()
    except Exception:
        pass


def _dropped(conn: Connection, wait: float = 0.5) -> bool:
    """Whether the connection's transport has died. paramiko closes the
    channels before it marks the transport inactive: wait a moment for it."""
    end = time.monotonic() + wait
    while conn.is_connected:
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)
    return True


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
    ):
        """``persist=False``: never through a connection holder (the holder's own runner)."""
        self.cluster = cluster
        self.nodes = list(nodes if nodes is not None else cluster.nodes)
        self.forks = max(1, min(forks or cluster.ssh.forks, len(self.nodes) or 1))
        self.progress = progress
        # Built in the main thread (see make_connection).
        shared: dict = {}
        self.connections: dict[str, Connection] = {n.name: make_connection(cluster, n, shared) for n in self.nodes}
        self.unreachable: dict[str, str] = {}
        # hosts left out of later steps (failed earlier), with the reason
        self.excluded: dict[str, str] = {}
        self.recap: dict[str, dict[str, int]] = {n.name: {OK: 0, CHANGED: 0, FAILED: 0, UNREACHABLE: 0, SKIPPED: 0} for n in self.nodes}
        self.round_trips: dict[str, int] = {n.name: 0 for n in self.nodes}
        # commands running per host (a timed-out command is only reaped when it was alone)
        self._inflight: dict[str, int] = {n.name: 0 for n in self.nodes}
        self._lock = threading.Lock()
        self._opening = {n.name: threading.Lock() for n in self.nodes}
        self._pool = ThreadPoolExecutor(max_workers=self.forks, thread_name_prefix="llmdeploy-host")
        # ssh.persist_s: the commands go through the cluster's connection holder
        self.mux = None
        if persist and cluster.ssh.persist_s > 0:
            from . import mux

            try:
                self.mux = mux.Client(cluster)
            except OSError as exc:
                self._no_holder(exc)

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

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for conn in self.connections.values():
            try:
                conn.close()
            except Exception:
                pass

    # -- execution -------------------------------------------------------------
    def connection(self, node: Node) -> Connection:
        """The open connection to ``node`` (for port forwarding); UnreachableError if it cannot be."""
        return self._open(node)

    def _open(self, node: Node) -> Connection:
        conn = self.connections[node.name]
        if conn.is_connected:
            return conn
        # one opening at a time per host (a connection holder serves
        # several commands of a host at once)
        with self._opening[node.name]:
            return self._open_locked(node, conn)

    def _open_locked(self, node: Node, conn: Connection) -> Connection:
        if conn.is_connected:
            return conn
        gateway = conn.gateway
        if isinstance(gateway, Connection) and not gateway.is_connected:
            try:
                gateway.open()
            except Exception as exc:  # every way a connection can fail
                reason = _unreachable_reason(exc, gateway)
                _close_quietly(gateway)
                raise UnreachableError(f"jump host {gateway.user}@{gateway.host}:{gateway.port}: {reason}") from exc
            _no_delay(gateway)
        try:
            conn.open()
        except Exception as exc:  # every way a connection can fail
            reason = _unreachable_reason(exc, conn)
            # a failed connect can leave paramiko's transport thread running
            # (waiting for a banner, or after a refused host key)
            _close_quietly(conn)
            raise UnreachableError(reason) from exc
        _no_delay(conn)
        COUNTS.add(node.name, "connections")
        return conn

    def exec(self, node: Node, command: str, timeout: float | None = None, stdin: str | bytes | None = None) -> tuple[str, str, int]:
        """Run one command on one host over its reused connection; ``stdin``
        is sent to its standard input (then end of file).

        A command past its deadline gets exit code 124 and "command timed out
        after Ns" in stderr; a connection that dies under it raises
        :class:`ConnectionLost` (an UnreachableError)."""
        out, err, code, _ = self._exec(node, command, timeout, stdin)
        return out, err, code

    def _exec(
        self, node: Node, command: str, timeout: float | None, stdin: str | bytes | None = None
    ) -> tuple[str, str, int, tuple[float, str] | None]:
        """exec, plus (deadline, what became of the command) when its deadline fired."""
        deadline = timeout or self.cluster.ssh.command_timeout
        if self.mux is not None:
            held = self._exec_held(node, command, deadline, stdin)
            if held is not None:
                return held
        was_open = self.connections[node.name].is_connected
        conn = self._open(node)
        with self._lock:
            self.round_trips[node.name] += 1
            self._inflight[node.name] += 1
        COUNTS.add(node.name, "commands")
        if stdin:
            COUNTS.add(node.name, "transfers")
        start = time.monotonic()
        data = stdin.encode() if isinstance(stdin, str) else stdin
        try:
            try:
                try:
                    out, err, code = run_channel(conn.client.get_transport(), command, deadline, data)
                except _NotOpened as exc:
                    if not was_open:
                        raise exc.cause from exc
                    # a connection that died while it waited (the host
                    # rebooted; a holder's connection outlived its host): the
                    # command never started, so once more on a new connection,
                    # and a host that is down reads unreachable, as on a first one
                    _close_quietly(conn)
                    conn = self._open(node)
                    COUNTS.add(node.name, "commands")
                    start = time.monotonic()
                    out, err, code = run_channel(conn.client.get_transport(), command, deadline, data)
            except _TimedOut as exc:
                with self._lock:
                    alone = self._inflight[node.name] == 1
                if alone:
                    COUNTS.add(node.name, "commands")
                fate = self._reap(conn) if alone else "other commands run on this connection: the timed-out one was left alone"
                return exc.stdout, (exc.stderr + f"\ncommand timed out after {deadline:g}s").lstrip(), 124, (deadline, fate)
            except (paramiko.SSHException, OSError, EOFError, AttributeError) as exc:
                # AttributeError: the transport is gone (closed under us)
                exc = exc.cause if isinstance(exc, _NotOpened) else exc
                detail = _lost_detail(conn, None if isinstance(exc, AttributeError) else exc)
                _close_quietly(conn)
                raise ConnectionLost(detail, time.monotonic() - start) from exc
        finally:
            with self._lock:
                self._inflight[node.name] -= 1
        # A channel closed with no exit status (-1): the command was killed by a
        # signal, or the connection died; the transport tells which.
        if code == -1 and _dropped(conn):
            detail = _lost_detail(conn, None)
            _close_quietly(conn)
            raise ConnectionLost(detail, time.monotonic() - start)
        return out, err, code, None

    def _exec_held(
        self, node: Node, command: str, deadline: float, stdin: str | bytes | None
    ) -> tuple[str, str, int, tuple[float, str] | None] | None:
        """``_exec`` through the connection holder (llmdeploy/mux.py); None
        when there is none to be had (then this runner connects directly)."""
        from . import mux

        def count() -> None:
            with self._lock:
                self.round_trips[node.name] += 1
            COUNTS.add(node.name, "commands")
            if stdin:
                COUNTS.add(node.name, "transfers")

        start = time.monotonic()
        ssh = self.cluster.ssh
        client = self.mux
        if client is None:
            return None
        try:
            ans = client.exec(node.name, command, deadline, stdin.encode() if isinstance(stdin, str) else stdin,
                              wait=deadline + 3 * ssh.connect_timeout + 60)
        except mux.Unavailable as exc:
            self._no_holder(exc)
            return None
        except (OSError, EOFError, ValueError) as exc:
            count()
            raise ConnectionLost(f"the connection holder ended under the command ({type(exc).__name__}: {exc}); "
                                 f"see {client.path}.log", time.monotonic() - start) from exc
        count()
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
        if not conn.is_connected:
            return "the connection is gone: the command may still run on the host"
        try:
            out, _, code = run_channel(conn.client.get_transport(), REAP_SCRIPT, max(5.0, self.cluster.ssh.connect_timeout))
        except Exception as exc:  # best effort
            return f"could not stop it on the host ({type(exc).__name__}): it may still run there"
        count = out.strip().splitlines()[-1:] if code == 0 else []
        if count and count[0].isdigit() and int(count[0]) > 0:
            return "sent SIGTERM to its processes on the host"
        if count == ["0"]:
            return "it had already ended on the host"
        return f"could not stop it on the host (exit {code}): it may still run there"

    def _one(self, step: Step, node: Node) -> HostResult:
        start = time.monotonic()
        if node.name in self.unreachable:
            res = HostResult(node.name, SKIPPED, msg=f"unreachable earlier: {self.unreachable[node.name]}")
        elif node.name in self.excluded:
            res = HostResult(node.name, SKIPPED, msg=self.excluded[node.name])
        else:
            try:
                decided = step.decide(node) if step.decide and not step.local else None
                command = None if step.local or decided is not None else step.build(node)
                if step.local:
                    res = step.local(node)
                elif decided is not None:
                    res = decided
                    res.host = node.name
                elif command is None:
                    res = HostResult(node.name, SKIPPED, msg="nothing to do here")
                else:
                    out, err, code, fired = self._exec(node, command, step.timeout, step.stdin(node) if step.stdin else None)
                    if fired is not None:
                        # partial output: not for the parser
                        res = HostResult(
                            node.name,
                            FAILED,
                            msg=f"timed out after {fired[0]:g}s at step '{step.name}' (the command's deadline); {fired[1]}",
                            stdout=out,
                            stderr=err,
                            exit_code=code,
                        )
                    else:
                        res = (step.parse or default_parse)(node, out, err, code)
                        res.host = node.name
                        if res.exit_code is None:
                            res.exit_code = code
                        if not res.stdout:
                            res.stdout = out
                        if not res.stderr:
                            res.stderr = err
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

    def run(self, step: Step, nodes: list[Node] | None = None, deadline: float | None = None) -> dict[str, HostResult]:
        """Run ``step`` on ``nodes`` (default: all) in parallel; results keyed by node name.

        ``deadline`` bounds the whole step: hosts still running then are
        reported failed ("step deadline"), the others keep their results.
        """
        targets = list(nodes if nodes is not None else self.nodes)
        futures = {}
        for node in targets:
            if self.progress:
                self.progress(step.name, node.name, None)
            futures[self._pool.submit(self._one, step, node)] = node
        budget = deadline
        if budget is None:
            per_cmd = (step.timeout or self.cluster.ssh.command_timeout) + self.cluster.ssh.connect_timeout
            waves = -(-len(targets) // self.forks)
            budget = per_cmd * waves + 30
        done, not_done = wait(futures, timeout=budget)
        results: dict[str, HostResult] = {}
        for fut in done:
            node = futures[fut]
            results[node.name] = fut.result()
        for fut in not_done:
            fut.cancel()
            node = futures[fut]
            results[node.name] = HostResult(node.name, FAILED, msg=f"step '{step.name}' deadline of {budget:g}s passed (no answer from the host)")
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
