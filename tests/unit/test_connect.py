"""transports.ssh.connect: IndexedSSHConfig gives paramiko's SSHConfig.lookup
answers from the blocks that can apply only; the transport's TCP socket sends
and acknowledges small packets at once; its keepalives count the intervals
without a packet from the peer and route the replies (the whole path over a
cut network: tests/reliability/test_ssh_faults.py)."""

from __future__ import annotations

import contextlib
import io
import socket

import paramiko
import pytest

from llmdeploy.inventory import Ssh
from transports.ssh.connect import IndexedSSHConfig, KeepaliveTimeout, KeepaliveTransport, _lost_detail, _nodelay_transport

CONFIG = """\
IdentityFile ~/.ssh/first
Host node-0
    HostName 10.0.0.10
    User root
    IdentityFile /keys/node0
Host node-1 node-1b
    HostName 10.0.0.11
    Port 2222
Host node-*
    User deploy
    IdentityFile /keys/all
    ServerAliveInterval 30
Host * !node-1
    ConnectTimeout 7
Match host 10.0.0.11
    User matched
Match user deploy
    ForwardAgent yes
Host node-0
    Port 2200
    ProxyJump gw
Host gw
    HostName 10.0.0.1
Host *
    Port 22
    User nobody
"""


def parsed(text: str, cls=paramiko.SSHConfig) -> paramiko.SSHConfig:
    cfg = cls()
    cfg.parse(io.StringIO(text))
    return cfg


@pytest.mark.parametrize("host", ["node-0", "node-1", "node-1b", "node-7", "gw", "10.0.0.11", "elsewhere", "node-1,node-0"])
def test_lookup_is_paramikos(host):
    plain = parsed(CONFIG)
    indexed = IndexedSSHConfig.of(parsed(CONFIG))
    assert indexed.lookup(host) == plain.lookup(host)
    # and a config parsed into the indexed class directly
    assert parsed(CONFIG, IndexedSSHConfig).lookup(host) == plain.lookup(host)


def test_lookup_walks_only_the_blocks_that_can_apply(monkeypatch):
    """A cluster's ssh_config (one Host block per node): a lookup reads its own
    block and the wildcard ones, not all of them."""
    text = "".join(f"Host n{i}\n    HostName 10.1.{i // 250}.{i % 250}\n    User root\n" for i in range(200))
    text += "Host *\n    ConnectTimeout 5\n"
    cfg = IndexedSSHConfig.of(parsed(text))
    seen: list[object] = []
    real = paramiko.SSHConfig._pattern_matches

    def counting(self, patterns, target):
        seen.append(patterns)
        return real(self, patterns, target)

    monkeypatch.setattr(paramiko.SSHConfig, "_pattern_matches", counting)
    got = cfg.lookup("n123")
    assert got["hostname"] == "10.1.0.123" and got["user"] == "root" and got["connecttimeout"] == "5"
    # implicit global block, n123's block, Host *; two passes
    assert len(seen) <= 6, seen
    assert cfg.lookup("n124")["hostname"] == "10.1.0.124"


def test_blocks_added_after_a_lookup_are_seen():
    cfg = IndexedSSHConfig.of(parsed("Host a\n    User one\n"))
    assert cfg.lookup("b")["hostname"] == "b"
    cfg.parse(io.StringIO("Host b\n    HostName 10.9.9.9\n"))
    assert cfg.lookup("b")["hostname"] == "10.9.9.9"


def test_canonicalization_gets_paramikos_full_walk(monkeypatch):
    text = "Host short\n    CanonicalizeHostname yes\n    CanonicalDomains example.invalid\nHost short.example.invalid\n    User canon\n"
    calls: list[str] = []
    real = paramiko.SSHConfig.lookup

    def spy(self, hostname):
        calls.append(type(self).__name__)
        return real(self, hostname)

    monkeypatch.setattr(paramiko.SSHConfig, "lookup", spy)

    def no_resolver(name):  # the test reaches no name server
        raise paramiko.config.socket.gaierror(f"not resolved here: {name}")

    monkeypatch.setattr(paramiko.config.socket, "gethostbyname", no_resolver)
    cfg = IndexedSSHConfig.of(parsed(text))
    # not resolved: the short name, as paramiko falls back to it
    assert cfg.lookup("short") == real(parsed(text), "short")
    assert calls[-1] == "IndexedSSHConfig"  # super().lookup on the whole file, not a subset


@contextlib.contextmanager
def _loopback_pair():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    try:
        yield client, server
    finally:
        client.close()
        server.close()


@pytest.mark.skipif(not hasattr(socket, "TCP_QUICKACK"), reason="TCP_QUICKACK is Linux's")
def test_the_transport_socket_sends_and_acknowledges_at_once():
    with _loopback_pair() as (client, server):
        transport = _nodelay_transport(client)  # not started: no handshake
        sock = transport.sock
        try:
            assert isinstance(sock, socket.socket) and sock.fileno() >= 0
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
            server.sendall(b"SSH-2.0-test\r\n")
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
            assert sock.recv(64) == b"SSH-2.0-test\r\n"
            # quick ACK mode again after the read
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1
        finally:
            sock.close()


def test_a_socket_that_is_not_tcp_is_left_as_it_is():
    a, b = socket.socketpair()
    with a, b:
        transport = _nodelay_transport(a)
        assert transport.sock is a


# --- keepalives: the counting, on a transport that is not started ---------------------------------
@contextlib.contextmanager
def _idle_transport():
    a, b = socket.socketpair()
    t = _nodelay_transport(a)
    try:
        yield t
    finally:
        a.close()
        b.close()


def test_the_transport_is_the_keepalive_one_and_is_off_until_started():
    with _idle_transport() as t:
        assert isinstance(t, KeepaliveTransport)
        assert t._ka_interval == 0


def test_intervals_without_a_packet_end_the_connection_at_the_count():
    with _idle_transport() as t:
        t.start_keepalive(15, 3)
        t._ka_rx_at = t._ka_tick_at - 1  # nothing from the peer since before the first interval
        t._keepalive_tick()
        t._keepalive_tick()
        assert t._ka_missed == 2
        with pytest.raises(KeepaliveTimeout) as err:
            t._keepalive_tick()
        assert err.value.missed == 3 and err.value.interval == 15
        assert str(err.value).startswith("no answer to keepalives for ")


def test_a_packet_from_the_peer_resets_the_count():
    with _idle_transport() as t:
        t.start_keepalive(15, 3)
        t._ka_rx_at = t._ka_tick_at - 1
        t._keepalive_tick()
        t._keepalive_tick()
        t._ka_rx_at = t._ka_tick_at  # an answer, or any packet, in the last interval
        t._keepalive_tick()
        assert t._ka_missed == 0
        t._ka_rx_at = t._ka_tick_at - 1  # then silence again
        t._keepalive_tick()
        t._keepalive_tick()  # two silent intervals again: still under the count
        assert t._ka_missed == 2


def test_no_keepalive_is_sent_before_the_key_exchange_nor_while_a_user_thread_sends():
    with _idle_transport() as t:
        t.start_keepalive(15, 3)
        assert not t.clear_to_send.is_set()
        assert t._send_keepalive() is False and t.keepalives_sent == 0
        t.clear_to_send.set()
        with t.clear_to_send_lock:  # a user thread in the middle of a send
            assert t._send_keepalive() is False
        with t._ka_order:  # our own global request waits for its reply
            assert t._send_keepalive() is False
        assert list(t._ka_pending) == []


def test_a_keepalive_goes_out_once_keys_are_exchanged_and_wants_an_answer():
    a, b = socket.socketpair()
    with a, b:
        t = _nodelay_transport(a)
        t.start_keepalive(15, 3)
        t.clear_to_send.set()
        sent = []
        t._send_message = sent.append  # the packetizer would encrypt it; the message is what matters
        assert t._send_keepalive() is True and t.keepalives_sent == 1
        m = paramiko.Message(sent[0].asbytes())
        assert m.get_byte() == paramiko.common.cMSG_GLOBAL_REQUEST
        assert m.get_text() == "keepalive@openssh.com" and m.get_boolean() is True
        assert list(t._ka_pending) == ["keepalive"]


def test_replies_go_to_whoever_asked_in_request_order(monkeypatch):
    with _idle_transport() as t:
        seen = []
        monkeypatch.setattr(paramiko.Transport, "_parse_request_failure", lambda self, m: seen.append("user"))
        t._ka_pending.extend(["keepalive", "user", "keepalive"])
        for _ in range(3):
            t._parse_request_failure(paramiko.Message())
        assert seen == ["user"] and t.keepalives_answered == 2 and not t._ka_pending


def test_the_lost_connection_names_the_keepalives_and_the_settings():
    class Conn:  # what _lost_detail reads of a Fabric Connection
        host, port, gateway = "192.0.2.7", 22, None

    with _idle_transport() as t:
        t.saved_exception = KeepaliveTimeout(46.2, 3, 15)
        Conn.client = type("C", (), {"get_transport": lambda self: t})()
        assert _lost_detail(Conn(), EOFError()) == (
            "no answer to keepalives for 46.2s from 192.0.2.7:22 (3 intervals of 15s without a packet: "
            "ssh.keepalive_s, ssh.keepalive_count): the network to the host or the host itself went silent"
        )


def test_keepalive_settings_default_like_openssh_practice_and_are_checked():
    ssh = Ssh()
    assert (ssh.keepalive_s, ssh.keepalive_count) == (15.0, 3)
    assert Ssh(keepalive_s=0).keepalive_s == 0  # off
    for bad in ({"keepalive_s": -1}, {"keepalive_count": 0}, {"keepalive_s": "often"}):
        with pytest.raises(ValueError) as err:
            Ssh(**bad)
        assert next(iter(bad)) in str(err.value)
