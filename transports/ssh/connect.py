"""The SSH side of the runner: Fabric/paramiko connections with host keys
checked, one command on its own channel, and every failure in words.

Imported by the runner's SSH session (:class:`transports.ssh.session.SshSession`)
when it connects itself (not when its commands go through a connection holder,
``ssh.persist_s``): a command that only talks to a holder does not load
paramiko. The transport under the connections (no Nagle, keepalives that
notice a dead peer) is :mod:`transports.ssh.sshtransport`; its names are
readable here too.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import logging
import os
import socket
import time
from typing import Any, Callable, NamedTuple

import paramiko
from fabric import Config, Connection
from fabric.runners import Remote

from llmdeploy import interrupt
from llmdeploy.errors import ConnectionLost, UnreachableError  # noqa: F401 (read by the runner's callers)
from llmdeploy.inventory import Cluster, Node
from transports.ssh.sshfiles import check_ssh_config, known_hosts_files
from transports.ssh.sshtransport import (  # noqa: F401 (keep_alive, KeepaliveTransport: read by the runner and the tests)
    KeepaliveTimeout, KeepaliveTransport as KeepaliveTransport, _nodelay_transport, keep_alive as keep_alive,
)

# paramiko logs every refused forwarding channel (readiness polls) at ERROR;
# the runner reports failures itself
logging.getLogger("paramiko.transport").setLevel(logging.CRITICAL)


class UnknownHostKey(paramiko.SSHException):  # type: ignore[misc]  # paramiko has no type hints
    """RejectPolicy's refusal, with the key the server offered (for the fingerprint)."""

    def __init__(self, hostname: str, key: paramiko.PKey):
        super().__init__(f"Server {hostname!r} not found in known_hosts")
        self.hostname, self.key = hostname, key


class RejectUnknownHosts(paramiko.RejectPolicy):  # type: ignore[misc]  # paramiko has no type hints
    """paramiko's RejectPolicy that keeps the offered key for the message."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise UnknownHostKey(hostname, key)


class StoppingRemote(Remote):  # type: ignore[misc]  # fabric has no type hints
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


def _harden(conn: Connection, known_hosts: list[str], shared: dict[str | tuple[str, ...], Any] | None = None) -> None:
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


class IndexedSSHConfig(paramiko.SSHConfig):  # type: ignore[misc]  # paramiko has no type hints
    """paramiko's SSHConfig whose ``lookup`` only walks the blocks that can
    apply to the host: ``Match`` blocks, ``Host`` blocks with a wildcard or a
    negation, and the ``Host`` blocks that name it, in file order. paramiko's
    own lookup walks every block, twice, and asks the password database for
    the local user name at each one: with one ``Host`` block per node (an
    ssh_config for a whole cluster) building the connections grew with the
    square of the node count (0.45 s of 0.65 s at 64 nodes). The answer is
    paramiko's own: the kept blocks go through its lookup unchanged. With
    ``CanonicalizeHostname`` anywhere, the name can change between the two
    passes, so that file gets paramiko's full walk."""

    _WILD = frozenset("*?[!")

    def __init__(self) -> None:
        super().__init__()
        self._index: tuple[int, list[int], dict[str, list[int]], bool] | None = None

    @classmethod
    def of(cls, parsed: paramiko.SSHConfig) -> "IndexedSSHConfig":
        """The same blocks as ``parsed`` (already read from its files)."""
        new = cls()
        new._config = parsed._config
        return new

    def _blocks(self) -> tuple[list[int], dict[str, list[int]], bool]:
        index = self._index
        if index is None or index[0] != len(self._config):
            always: list[int] = []
            named: dict[str, list[int]] = {}
            canonical = False
            for i, block in enumerate(self._config):
                hosts = block.get("host") or []
                canonical = canonical or "canonicalizehostname" in block.get("config", {})
                if block.get("matches") or any(self._WILD & set(p) for p in hosts):
                    always.append(i)
                else:
                    for p in set(hosts):
                        named.setdefault(p, []).append(i)
            index = self._index = (len(self._config), always, named, canonical)
        return index[1], index[2], index[3]

    def lookup(self, hostname: str) -> paramiko.SSHConfigDict:
        always, named, canonical = self._blocks()
        if canonical:
            return super().lookup(hostname)
        some = paramiko.SSHConfig()
        some._config = [self._config[i] for i in sorted(always + named.get(hostname, []))]
        return some.lookup(hostname)


def make_connection(cluster: Cluster, node: Node, shared: dict[str | tuple[str, ...], Any] | None = None) -> Connection:
    """Build (not open) the Fabric connection for one node. Call from the main
    thread: building Connections concurrently races inside Invoke's Config.
    ``shared`` (one dict per Runner): the Config and the known_hosts, built
    once for every connection (like Fabric's groups share one Config), not
    once per host (11 ms each)."""
    ssh = cluster.ssh
    check_ssh_config(cluster)
    config = (shared or {}).get("config")
    if config is None:
        overrides: dict[str, Any] = {"load_ssh_configs": True, "runners": {"remote": StoppingRemote}}
        config = Config(overrides=overrides, runtime_ssh_path=ssh.config_file) if ssh.config_file else Config(overrides=overrides)
        # Fabric read the files; every Connection looks its host up in them
        config._set(base_ssh_config=IndexedSSHConfig.of(config.base_ssh_config))
        if shared is not None:
            shared["config"] = config
    # Every phase has a deadline: TCP connect (timeout), the server's banner and
    # key exchange (banner_timeout; Transport.start_client also waits at most
    # ``timeout``), authentication (auth_timeout) and opening a session or a
    # jump-host channel (channel_timeout; paramiko's default is an hour).
    connect_kwargs: dict[str, Any] = {
        "transport_factory": _nodelay_transport,
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
    name: str = key.get_name()
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


class _Target(NamedTuple):
    """What the messages of :func:`_unreachable_reason` name of the connection
    that could not be opened (placeholders when there is none)."""

    conn: Connection | None
    host: str
    port: int
    where: str
    kwargs: dict[str, Any]
    timeout: Any
    after: str
    known: list[str]

    @classmethod
    def of(cls, conn: Connection | None) -> "_Target":
        host = conn.host if conn is not None else "?"
        port = int(conn.port) if conn is not None and conn.port else 22
        kwargs = dict(conn.connect_kwargs) if conn is not None else {}
        timeout = kwargs.get("banner_timeout") or (conn.connect_timeout if conn is not None else None)
        after = f" after {_secs(timeout)}" if timeout else ""
        known = getattr(conn, "_llmdeploy_known_hosts", None) or ["known_hosts"]
        return cls(conn, host, port, f"{host}:{port}", kwargs, timeout, after, known)


def _unreachable_reason(exc: BaseException, conn: Connection | None = None) -> str:
    """One sentence for why ``conn`` could not be opened: what happened, where,
    and what to do about it. ``conn`` (when given) supplies the address, user,
    keys, known_hosts and timeouts the message names.

    The kinds of failure are asked in this order, the first that recognises
    ``exc`` words it: host keys, authentication, reaching the host, the SSH
    handshake; anything else is named by its type."""
    target = _Target.of(conn)
    for reason in (_host_key_reason, _auth_reason, _network_reason, _handshake_reason):
        text = reason(exc, target)
        if text is not None:
            return text
    return f"{type(exc).__name__}: {exc}"


def _host_key_reason(exc: BaseException, t: _Target) -> str | None:
    """An unknown or a changed host key, with the commands that fix it."""
    known_text = " ".join(t.known)
    if isinstance(exc, UnknownHostKey):
        entry = exc.hostname
        return (
            f"host key of {entry} is not in known_hosts ({known_text}): unknown host, refused. If this is the host you mean, "
            f"add its key: {_keyscan(t.host, t.port, exc.key, t.known[0])} "
            f"(check the fingerprint {exc.key.get_name()} {fingerprint(exc.key)} first, e.g. ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub on its console)"
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        entry = _known_hosts_entry(exc.hostname, t.port)
        return (
            f"host key of {entry} CHANGED: known_hosts ({known_text}) expects {_describe_key(exc.expected_key)}, "
            f"the host offered {_describe_key(exc.key)}; refused (a reinstalled host, or someone in the middle). "
            f"If you verified the new key, remove the old one: ssh-keygen -R '{entry}' -f {t.known[0]}, "
            f"then add the new one: {_keyscan(exc.hostname, t.port, exc.key, t.known[0])}"
        )
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return f"{exc}: host key of {t.where} not known, refused (add it to {t.known[0]} with ssh-keyscan after checking its fingerprint)"
    return None


def _auth_reason(exc: BaseException, t: _Target) -> str | None:
    """Authentication refused or timed out, or an identity file that cannot be
    read (paramiko gives up at the first one): the keys tried, and why."""
    keys = [k for k in (t.kwargs.get("key_filename") or []) if k]
    auth_missing = isinstance(exc, paramiko.SSHException) and "No authentication methods available" in str(exc)
    # paramiko gives up at the first identity file it cannot read
    key_unreadable = isinstance(exc, OSError) and getattr(exc, "filename", None) in keys
    if not (isinstance(exc, paramiko.AuthenticationException) or auth_missing or key_unreadable):
        return None
    user = t.conn.user if t.conn is not None else "?"
    if "timeout" in str(exc).lower():
        return f"timed out{t.after} during authentication as {user}@{t.where} (the server stopped answering)"
    shown = ", ".join(k if os.path.exists(k) else f"{k} (missing)" for k in keys) or "no identity_file set"
    others = " and ssh-agent/~/.ssh keys" if (t.kwargs.get("allow_agent") or t.kwargs.get("look_for_keys")) and not key_unreadable else ""
    return f"authentication failed for {user}@{t.where} (key {shown}{others}): {_auth_why(exc, user, key_unreadable)}"


def _auth_why(exc: BaseException, user: str, key_unreadable: bool) -> str:
    """The end of the authentication message: why no key was accepted."""
    if key_unreadable:
        assert isinstance(exc, OSError)  # key_unreadable: an OSError naming an identity file
        return f"cannot read the identity file: {exc.strerror} (check ssh.identity_file)"
    if isinstance(exc, paramiko.PasswordRequiredException):
        return "the key is encrypted and no passphrase was given"
    if isinstance(exc, paramiko.BadAuthenticationType):
        return f"the server allows only: {', '.join(exc.allowed_types) or 'nothing'}"
    return f"the server accepted none of them: is the public key in {user}'s authorized_keys there?"


def _network_reason(exc: BaseException, t: _Target) -> str | None:
    """No SSH server reached: refused, no route, a name that does not
    resolve, a TCP timeout, or a jump host that could not get through."""
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return "; ".join(_refused_addresses(exc)) or f"cannot connect to {t.where}"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host name {t.host!r}: {exc.strerror or exc} (check the node's ssh_host and the ssh_config)"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return f"TCP connect to {t.where} timed out{t.after} (nothing answered: the host is down, the address is wrong, or a firewall drops the packets)"
    if isinstance(exc, paramiko.ChannelException):
        return f"the jump host could not open a connection to {t.where}: {exc.text or exc} (code {exc.code})"
    if isinstance(exc, paramiko.SSHException) and "Timeout opening channel" in str(exc) and t.conn is not None and t.conn.gateway:
        return f"the jump host did not connect to {t.where} within {_secs(t.kwargs.get('channel_timeout') or t.timeout)} (nothing answered behind it)"
    if isinstance(exc, OSError) and not isinstance(exc, paramiko.SSHException):
        if exc.errno == errno.ENETUNREACH:
            return f"network unreachable for {t.where} (no route on this machine)"
        return f"cannot connect to {t.where}: {exc.strerror or exc}"
    return None


def _refused_addresses(exc: paramiko.ssh_exception.NoValidConnectionsError) -> list[str]:
    """One phrase per address paramiko tried and could not connect to."""
    parts = []
    for addr, err in exc.errors.items():
        a = f"{addr[0]}:{addr[1]}"
        if err.errno == errno.ECONNREFUSED:
            parts.append(f"connection refused by {a} (is sshd running there, on port {addr[1]}?)")
        elif err.errno == errno.EHOSTUNREACH:
            parts.append(f"no route to host {a} (host down, or a wrong address?)")
        else:
            parts.append(f"cannot connect to {a}: {err.strerror or err}")
    return parts


def _handshake_reason(exc: BaseException, t: _Target) -> str | None:
    """The TCP connection was up but the SSH handshake failed: before the
    server's banner (timed out, closed) or during the key exchange after it."""
    if not isinstance(exc, (paramiko.SSHException, EOFError)):
        return None
    transport = t.conn.client.get_transport() if t.conn is not None else None
    version = getattr(transport, "remote_version", None)
    text = str(exc)
    cause = exc.__context__
    timed_out = "No existing session" in text or "timed out" in text.lower() or isinstance(cause, (socket.timeout, TimeoutError))
    closed = isinstance(exc, EOFError) or isinstance(cause, (EOFError, ConnectionResetError))
    where, after = t.where, t.after
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


def _lost_detail(conn: Connection, exc: BaseException | None) -> str:
    """What ended a connection that was open: unanswered keepalives (whatever
    the command's side saw then), else the exception, else the transport's."""
    where = f"{conn.host}:{conn.port}"
    transport = conn.client.get_transport()
    saved = transport.get_exception() if transport is not None else None
    gateway = conn.gateway if isinstance(conn.gateway, Connection) else None
    hops = [(saved, where, "the host")]
    if gateway is not None and gateway.client.get_transport() is not None:
        # through a jump host: its connection may be the one that went silent
        hops.append((gateway.client.get_transport().get_exception(), f"the jump host {gateway.host}:{gateway.port}", "the jump host"))
    for lost, name, what in hops:
        if isinstance(lost, KeepaliveTimeout):
            return (
                f"no answer to keepalives for {lost.silent:.1f}s from {name} ({lost.missed} intervals of {lost.interval:g}s "
                f"without a packet: ssh.keepalive_s, ssh.keepalive_count): the network to {what} or {what} itself went silent"
            )
    cause = exc if exc is not None else saved
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
# The same under ``ssh.become`` (``Runner.wire``: under sudo, as root): the other
# sessions' processes are root's, which the login user may not signal, and under
# sudo $PPID is sudo, not sshd; the login shell passes its $PPID (the sshd process
# serving the connection) as $1 and its $$ (this session) as $2.
REAP_AS_ROOT = (
    'n=0; for c in $(pgrep -P "$1"); do [ "$c" = "$2" ] && continue; '
    'kill -TERM -- "-$c" 2>/dev/null && n=$((n+1)); done; echo "$n"'
)


class _NotOpened(paramiko.SSHException):  # type: ignore[misc]  # paramiko has no type hints
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


def run_channel(
    transport: paramiko.Transport, command: str, timeout: float, stdin: bytes | None = None, on_line: LineCallback | None = None
) -> tuple[str, str, int]:
    """Run ``command`` in a new session channel of ``transport``: its stdout
    and stderr (UTF-8, undecodable bytes replaced) and exit code (-1: the
    channel closed without one). ``stdin`` is sent, then end of file, while the
    output is read (a command that writes before it reads cannot deadlock).
    Past ``timeout``: SIGTERM is asked for, the channel closed, and
    :class:`_TimedOut` raised with what was read.

    ``on_line(stream, line)`` (``stream``: "out" or "err"), when given, is
    called with every line of either stream as it arrives (while the command
    runs: progress), without its end of line; the returned text is the same
    either way. A callback that raises is not called again, and the command
    goes on (a display that broke, or a client of the connection holder that
    went away, never fails a command).

    One thread per command, the caller's, that sleeps only in paramiko's
    buffers: Fabric's ``Connection.run`` starts three more threads per command
    and polls every 10 ms (Invoke's ``input_sleep``).

    A Ctrl-C or SIGTERM that came after the command started (and outside a
    cleanup) raises :class:`interrupt.Interrupted` between two reads, where
    no lock is held: the channel is closed as after an error. Any other
    ``KeyboardInterrupt`` may have landed inside paramiko: see
    :func:`left_open`."""
    cut = interrupt.Command()
    end = time.monotonic() + timeout
    try:
        chan = transport.open_session()
    except (paramiko.SSHException, OSError, EOFError, AttributeError) as exc:  # AttributeError: no transport
        raise _NotOpened(exc) from exc
    try:
        chan.exec_command(command)
        out, err = _read_to_eof(chan, memoryview(stdin or b""), end, _Lines.pair(on_line), cut)
        code = _exit_status(chan, end, cut)
    except (Exception, interrupt.Interrupted):
        chan.close()
        raise
    except BaseException:
        left_open(chan)
        raise
    chan.close()
    return _decoded(out), _decoded(err), code


def left_open(chan: paramiko.Channel) -> None:
    """A channel whose command was interrupted (KeyboardInterrupt: Ctrl-C,
    SIGTERM) is never closed by this process: the interrupt may have landed
    inside paramiko right after it took a lock of the channel or of its
    transport and before its ``try`` (it is raised at the first check after
    the lock's acquire returns), and a close would wait for that lock
    forever, here or when the channel is collected (paramiko's ``__del__``
    closes it). The caller gives the whole connection up instead
    (``SshSession.abandon``)."""
    chan.close = lambda: None


def _decoded(chunks: list[bytes]) -> str:
    return b"".join(chunks).decode("utf-8", "replace")


LineCallback = Callable[[str, str], None]


class _Lines:
    """One stream's bytes cut into lines for an ``on_line`` callback; a line
    longer than ``LIMIT`` (a file's content, not a progress line) is skipped.
    Carriage returns end a line too (a progress bar redrawn in place)."""

    LIMIT = 65536

    def __init__(self, stream: str, sink: "_Sink"):
        self.stream, self.sink = stream, sink
        self.buf = b""
        self.skipping = False

    @staticmethod
    def pair(on_line: LineCallback | None) -> "tuple[_Lines, _Lines] | None":
        if on_line is None:
            return None
        sink = _Sink(on_line)
        return _Lines("out", sink), _Lines("err", sink)

    def feed(self, chunk: bytes) -> None:
        if not self.sink.alive:
            return
        *whole, rest = (self.buf + chunk).replace(b"\r", b"\n").split(b"\n")
        for i, line in enumerate(whole):
            if self.skipping and i == 0:
                self.skipping = False
                continue
            self.sink.emit(self.stream, line)
        if whole:
            self.skipping = False
        if len(rest) > self.LIMIT:
            rest, self.skipping = b"", True
        self.buf = rest

    def end(self) -> None:
        if self.buf and not self.skipping:
            self.sink.emit(self.stream, self.buf)
        self.buf = b""


class _Sink:
    """Calls ``on_line`` until it raises once."""

    def __init__(self, on_line: LineCallback):
        self.on_line, self.alive = on_line, True

    def emit(self, stream: str, line: bytes) -> None:
        if not self.alive or not line:
            return
        try:
            self.on_line(stream, line.decode("utf-8", "replace"))
        except Exception:  # a broken display or a client gone: the command goes on
            self.alive = False


def _read_to_eof(
    chan: paramiko.Channel, data: memoryview, end: float, lines: "tuple[_Lines, _Lines] | None" = None,
    cut: interrupt.Command | None = None,
) -> tuple[list[bytes], list[bytes]]:
    """Send ``data`` (then end of file) while reading stdout and stderr, until
    the command's end of file; past ``end``: SIGTERM and :class:`_TimedOut`.
    ``lines``: stdout's and stderr's line cutters, fed as the bytes arrive
    (then a read waits at most 0.1 s, so that a line on stderr is seen while
    stdout is silent). ``cut``: looked at between two reads (a read waits at
    most 1 s)."""
    out: list[bytes] = []
    err: list[bytes] = []
    sent = 0
    tick = 0.1 if lines else 1.0
    if not data:
        chan.shutdown_write()
    while True:
        if cut is not None:
            cut.check()
        left = end - time.monotonic()
        if left <= 0:
            _send_signal(chan, "TERM")
            raise _TimedOut(_decoded(out), _decoded(err))
        sent = _send_some(chan, data, sent, left, tick)
        try:
            chunk = chan.recv(65536)
        except socket.timeout:
            chunk = None
        _drain_stderr(chan, err, lines)
        if chunk:
            out.append(chunk)
            if lines:
                lines[0].feed(chunk)
        elif chunk == b"":  # end of file (or closed): stderr came before it
            break
    _drain_stderr(chan, err, lines)
    if lines:
        lines[0].end()
        lines[1].end()
    return out, err


def _drain_stderr(chan: paramiko.Channel, err: list[bytes], lines: "tuple[_Lines, _Lines] | None") -> None:
    while chan.recv_stderr_ready():
        piece = chan.recv_stderr(65536)
        err.append(piece)
        if lines:
            lines[1].feed(piece)


def _send_some(chan: paramiko.Channel, data: memoryview, sent: int, left: float, tick: float = 1.0) -> int:
    """Send what of ``data`` (from ``sent`` on) the channel takes now, end of
    file after the last byte; set how long the next read may wait (at most
    ``tick``). Returns how much is sent by now."""
    if sent < len(data):
        while sent < len(data) and chan.send_ready():
            if chan.closed or chan.eof_received:  # the command ended without reading it all
                sent = len(data)
                break
            sent += chan.send(data[sent:sent + 32768])
        if sent >= len(data) and not chan.closed:
            chan.shutdown_write()
        # the window is full: read what came back, look again soon
        chan.settimeout(0.005 if sent < len(data) else min(left, tick))
    else:
        chan.settimeout(min(left, tick))
    return sent


def _exit_status(chan: paramiko.Channel, end: float, cut: interrupt.Command | None = None) -> int:
    """The exit status, which follows the end of file; a channel closed
    without one (or ``end`` passed while waiting) is -1."""
    while not chan.status_event.wait(0.05):
        if cut is not None:
            cut.check()
        if chan.closed or time.monotonic() >= end:
            break
    return chan.exit_status if chan.status_event.is_set() else -1


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
