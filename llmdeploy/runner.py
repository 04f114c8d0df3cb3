"""The one runner: a Fabric connection per host, opened once, reused by every step.

A step is built by pure functions (see :class:`Step`); the runner only
executes: all selected hosts in parallel on a bounded pool, a deadline on
every remote command and on the whole step, and one :class:`HostResult` per
host. Host keys are checked against known_hosts with paramiko's RejectPolicy.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Callable

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut

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


def default_parse(node: Node, stdout: str, stderr: str, code: int) -> HostResult:
    if code == 0:
        return HostResult(node.name, OK, stdout=stdout, stderr=stderr, exit_code=code)
    msg = (stderr.strip() or stdout.strip()).splitlines()[-1:] or [f"exit {code}"]
    return HostResult(node.name, FAILED, msg=msg[0], stdout=stdout, stderr=stderr, exit_code=code)


class UnreachableError(Exception):
    pass


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


def _harden(conn: Connection, known_hosts: list[str]) -> None:
    """Check host keys: load known_hosts and reject unknown keys (also on gateways)."""
    client = conn.client
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    for path in known_hosts:
        if os.path.exists(path):
            client.load_host_keys(path)
    if isinstance(conn.gateway, Connection):
        _harden(conn.gateway, known_hosts)


def make_connection(cluster: Cluster, node: Node) -> Connection:
    """Build (not open) the Fabric connection for one node. Call from the main
    thread: building Connections concurrently races inside Invoke's Config."""
    ssh = cluster.ssh
    overrides: dict[str, Any] = {"load_ssh_configs": True}
    config = Config(overrides=overrides, runtime_ssh_path=ssh.config_file) if ssh.config_file else Config(overrides=overrides)
    connect_kwargs: dict[str, Any] = {"allow_agent": True, "look_for_keys": True, "banner_timeout": ssh.connect_timeout, "auth_timeout": ssh.connect_timeout}
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
    _harden(conn, known_hosts_files(cluster, conn.ssh_config))
    return conn


def _unreachable_reason(exc: BaseException) -> str:
    if isinstance(exc, paramiko.BadHostKeyException):
        return f"host key mismatch for {exc.hostname}: refusing to connect"
    if isinstance(exc, paramiko.SSHException) and "not found in known_hosts" in str(exc):
        return f"{exc} (host key not known: add it to known_hosts)"
    if isinstance(exc, paramiko.AuthenticationException):
        return f"authentication failed: {exc}"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "connection timed out"
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return f"connection refused: {exc}"
    return f"{type(exc).__name__}: {exc}"


class Runner:
    """Executes steps on a cluster's hosts. Use as a context manager."""

    def __init__(
        self,
        cluster: Cluster,
        nodes: list[Node] | None = None,
        forks: int | None = None,
        progress: Callable[[str, str, HostResult | None], None] | None = None,
    ):
        self.cluster = cluster
        self.nodes = list(nodes if nodes is not None else cluster.nodes)
        self.forks = max(1, min(forks or cluster.ssh.forks, len(self.nodes) or 1))
        self.progress = progress
        # Built in the main thread (see make_connection).
        self.connections: dict[str, Connection] = {n.name: make_connection(cluster, n) for n in self.nodes}
        self.unreachable: dict[str, str] = {}
        # hosts left out of later steps (failed earlier), with the reason
        self.excluded: dict[str, str] = {}
        self.recap: dict[str, dict[str, int]] = {n.name: {OK: 0, CHANGED: 0, FAILED: 0, UNREACHABLE: 0, SKIPPED: 0} for n in self.nodes}
        self.round_trips: dict[str, int] = {n.name: 0 for n in self.nodes}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=self.forks, thread_name_prefix="llmdeploy-host")

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
        if not conn.is_connected:
            try:
                conn.open()
            except Exception as exc:  # every way a connection can fail
                raise UnreachableError(_unreachable_reason(exc)) from exc
        return conn

    def exec(self, node: Node, command: str, timeout: float | None = None) -> tuple[str, str, int]:
        """Run one command on one host over its reused connection."""
        conn = self._open(node)
        deadline = timeout or self.cluster.ssh.command_timeout
        with self._lock:
            self.round_trips[node.name] += 1
        try:
            res = conn.run(command, hide=True, warn=True, timeout=deadline, in_stream=False)
        except CommandTimedOut as exc:
            r = exc.result
            return r.stdout, (r.stderr + f"\ncommand timed out after {deadline:g}s").lstrip(), 124
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise UnreachableError(f"connection lost: {exc}") from exc
        return res.stdout, res.stderr, res.exited

    def _one(self, step: Step, node: Node) -> HostResult:
        start = time.monotonic()
        if node.name in self.unreachable:
            res = HostResult(node.name, SKIPPED, msg=f"unreachable earlier: {self.unreachable[node.name]}")
        elif node.name in self.excluded:
            res = HostResult(node.name, SKIPPED, msg=self.excluded[node.name])
        else:
            try:
                command = None if step.local else step.build(node)
                if step.local:
                    res = step.local(node)
                elif command is None:
                    res = HostResult(node.name, SKIPPED, msg="nothing to do here")
                else:
                    out, err, code = self.exec(node, command, step.timeout)
                    res = (step.parse or default_parse)(node, out, err, code)
                    res.host = node.name
                    if res.exit_code is None:
                        res.exit_code = code
                    if not res.stdout:
                        res.stdout = out
                    if not res.stderr:
                        res.stderr = err
            except UnreachableError as exc:
                with self._lock:
                    self.unreachable[node.name] = str(exc)
                res = HostResult(node.name, UNREACHABLE, msg=str(exc))
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
            results[node.name] = HostResult(node.name, FAILED, msg=f"step deadline of {budget:g}s passed")
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
