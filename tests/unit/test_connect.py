"""llmdeploy.connect: IndexedSSHConfig gives paramiko's SSHConfig.lookup
answers from the blocks that can apply only; the transport's TCP socket sends
and acknowledges small packets at once."""

from __future__ import annotations

import contextlib
import io
import socket

import paramiko
import pytest

from llmdeploy.connect import IndexedSSHConfig, _nodelay_transport

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
