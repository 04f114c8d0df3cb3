"""The SSH transport under the runner's connections: a TCP socket that
sends and acknowledges small packets at once, and paramiko's Transport with
dead-peer detection (keepalives that want an answer, as OpenSSH's
ServerAliveInterval/ServerAliveCountMax).

:func:`transports.ssh.connect.make_connection` hands :func:`_nodelay_transport` to
paramiko as its ``transport_factory``; the runner's SSH session turns the
keepalives on with :func:`keep_alive` once a connection is open. Its names are
also readable from :mod:`transports.ssh.connect`.
"""

from __future__ import annotations

import collections
import select
import socket
import threading
import time
import weakref
from typing import Any

import paramiko
from fabric import Connection


class _QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges what it has read at once (TCP_QUICKACK
    after each recv; Linux). Right after authentication OpenSSH's sshd sends
    its host keys (hostkeys-00@openssh.com, no reply wanted) while the client
    already asks for its first channel; the client's kernel delays the ACK of
    that message, and the server's answer to the channel waits behind it
    (Nagle's algorithm on the server's side): the first command of every
    connection started ~40 ms late. Measured on a simulated host: opening
    the first channel took 43-49 ms, 2-5 ms with this."""

    def recv(self, *args: int) -> bytes:
        data = super().recv(*args)
        assert _QUICKACK is not None  # made only where the platform has it (_nodelay_transport)
        try:
            self.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
        except OSError:
            pass
        return data


_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)


class KeepaliveTimeout(paramiko.SSHException):  # type: ignore[misc]  # paramiko has no type hints
    """Raised in a transport's own thread when keepalives went unanswered:
    paramiko then closes every channel and keeps this as the transport's
    exception (what ended the connection)."""

    def __init__(self, silent: float, missed: int, interval: float):
        super().__init__(f"no answer to keepalives for {silent:.1f}s ({missed} intervals of {interval:g}s without a packet)")
        self.silent, self.missed, self.interval = silent, missed, interval


class KeepaliveTransport(paramiko.Transport):  # type: ignore[misc]  # paramiko has no type hints
    """paramiko's Transport with dead-peer detection, as OpenSSH's
    ServerAliveInterval/ServerAliveCountMax do it.

    paramiko's own ``set_keepalive`` only sends (``keepalive@lag.net``, no
    reply wanted): a peer behind a cut network is never noticed. Here the
    transport's thread, after ``interval`` seconds in which this side sent
    nothing (paramiko's keepalive timer, checked every 0.1 s while it waits
    for packets), sends ``keepalive@openssh.com`` wanting a reply (servers
    answer it with success or failure, OpenSSH with failure) and counts the
    intervals in a row in which no packet came from the peer; at ``count``
    it raises :class:`KeepaliveTimeout`, which ends the transport
    like a reset would: the channels close, a command's reader returns, and
    the transport's exception says why.

    The transport's thread never waits for the network here: a keepalive is
    skipped (and the interval still counted) when a user thread is sending
    (paramiko's ``clear_to_send_lock`` held, possibly stuck on a full socket
    buffer), during key exchange, while the socket is not writable, or while
    a global request of our own waits for its reply (replies come in request
    order, RFC 4254 section 4: one outstanding kind at a time keeps them
    apart)."""

    KEEPALIVE_REQUEST = "keepalive@openssh.com"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ka_interval = 0.0
        self._ka_count = 0
        self._ka_rx_at = time.monotonic()  # the last packet from the peer
        self._ka_tick_at = self._ka_rx_at  # the last keepalive interval's end
        self._ka_missed = 0
        self._ka_order = threading.Lock()  # held while a request wanting a reply is sent (and, ours, answered)
        self._ka_pending: collections.deque[str] = collections.deque()  # "keepalive" / "user", in request order
        self.keepalives_sent = self.keepalives_answered = 0
        reader = self.packetizer.read_message
        me = weakref.ref(self)

        def read_message() -> paramiko.Message:
            msg = reader()
            t = me()
            if t is not None:
                t._ka_rx_at = time.monotonic()
            return msg

        self.packetizer.read_message = read_message

    def start_keepalive(self, interval: float, count: int) -> None:
        """Probe the peer after ``interval`` s without sending; give up after
        ``count`` unanswered probes in a row. ``interval`` 0: off."""
        self._ka_interval, self._ka_count = float(interval), int(count)
        self._ka_rx_at = self._ka_tick_at = time.monotonic()
        self._ka_missed = 0
        if interval <= 0:
            self.packetizer.set_keepalive(0, None)
            return
        me = weakref.ref(self)

        def tick() -> None:
            t = me()
            if t is not None:
                t._keepalive_tick()

        self.packetizer.set_keepalive(interval, tick)

    def _keepalive_tick(self) -> None:
        """One keepalive interval passed without sending (the transport's thread):
        an interval in which nothing came from the peer is a miss, whether or
        not a keepalive could go out in it (as OpenSSH counts them)."""
        now = time.monotonic()
        if self._ka_rx_at >= self._ka_tick_at:
            self._ka_missed = 0  # heard from the peer in the last interval
        else:
            self._ka_missed += 1
        self._ka_tick_at = now
        if self._ka_missed >= self._ka_count:
            raise KeepaliveTimeout(now - self._ka_rx_at, self._ka_missed, self._ka_interval)
        self._send_keepalive()

    def _send_keepalive(self) -> bool:
        if not self.clear_to_send.is_set() or not self._writable():
            return False
        if not self._ka_order.acquire(blocking=False):
            return False  # our own global request waits for its reply
        try:
            if not self.clear_to_send_lock.acquire(blocking=False):
                return False  # a user thread is sending
            try:
                m = paramiko.Message()
                m.add_byte(paramiko.common.cMSG_GLOBAL_REQUEST)
                m.add_string(self.KEEPALIVE_REQUEST)
                m.add_boolean(True)
                self._ka_pending.append("keepalive")
                self._send_message(m)
                self.keepalives_sent += 1
                return True
            finally:
                self.clear_to_send_lock.release()
        finally:
            self._ka_order.release()

    def _writable(self) -> bool:
        """The socket takes a small packet now (a jump host's channel: assume
        so). poll, not select: a runner of hundreds of hosts has descriptors
        past select's 1024."""
        sock = self.sock
        if not isinstance(sock, socket.socket):
            return True
        try:
            poller = select.poll()
            poller.register(sock, select.POLLOUT)
            return any(ev & select.POLLOUT for _, ev in poller.poll(0))
        except (OSError, ValueError):
            return False

    def global_request(self, kind: str, data: tuple[Any, ...] | None = None, wait: bool = True) -> paramiko.Message | None:
        if not wait:
            return super().global_request(kind, data, wait)
        with self._ka_order:  # no keepalive in between: its reply would answer this
            self._ka_pending.append("user")
            return super().global_request(kind, data, wait)

    def _reply_is_ours(self) -> bool:
        try:
            ours = self._ka_pending.popleft() == "keepalive"
        except IndexError:
            return False
        self.keepalives_answered += ours
        return ours

    def _parse_request_success(self, m: paramiko.Message) -> None:
        if not self._reply_is_ours():
            super()._parse_request_success(m)

    def _parse_request_failure(self, m: paramiko.Message) -> None:
        if not self._reply_is_ours():
            super()._parse_request_failure(m)


def keep_alive(conn: Connection, interval: float, count: int) -> None:
    """Turn on dead-peer detection on an open connection (and its jump host's)."""
    for c in (conn, conn.gateway):
        if isinstance(c, Connection) and c.is_connected:
            transport = c.client.get_transport()
            if isinstance(transport, KeepaliveTransport):
                transport.start_keepalive(interval, count)


def _nodelay_transport(sock: socket.socket | paramiko.Channel, **kwargs: Any) -> paramiko.Transport:
    """paramiko's Transport on a TCP socket that sends and acknowledges small
    packets at once (SSHClient.connect's ``transport_factory``, called once
    the TCP connection is up, before the SSH handshake): paramiko leaves
    Nagle's algorithm on, and small packets then wait for the other side's
    delayed ACK (~40 ms). Measured on a simulated host: each command waited
    for its exit status (47 ms per `true`, 3 ms without Nagle); set only after
    the handshake, the handshake itself still waited (68-112 ms per
    connection, 29-34 ms from the start). Through a jump host the socket is
    an SSH channel: nothing to set."""
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if _QUICKACK is not None:
                sock = _QuickAckSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
        except OSError:
            pass
    return KeepaliveTransport(sock, **kwargs)

