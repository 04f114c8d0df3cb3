"""The one runner: every step on a cluster's hosts, each command over the host's reused connection.

A step is built by pure functions (see :class:`Step`); the runner only
executes: all selected hosts in parallel on a bounded pool, a deadline on
every remote command and on the whole step, and one :class:`HostResult` per
host. Which host a command goes to, and as what, is the cluster's transport's
(``llmdeploy/launcher.py``): the node itself over SSH, or another
launcher's way of reaching it (``launchers/``). The SSH connections are the
transport's connector's (``Transport.connector``, a :class:`~llmdeploy.launcher.Connector`:
``transports/ssh``, one Fabric connection per host, opened once, host keys
checked against known_hosts with paramiko's RejectPolicy; with
``ssh.persist_s`` the commands go through a connection holder instead); the
runner talks to it through that interface only and never imports it. With
``ssh.become`` every command goes on the wire under ``sudo -n`` as root
(:meth:`Runner.wire`, ``llmdeploy/become.py``), and sudo's refusal reads as
one failure naming the node (:meth:`Runner.sudo_refusal`).

Every SSH failure reads as what happened, where and how to fix it (refused,
no banner, unknown or changed host key, authentication, connection lost,
deadline) and names the step it happened in; see
``transports/ssh/connect.py``'s ``_unreachable_reason``.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from . import become, interrupt
from .errors import ConnectionLost, UnreachableError
from .inventory import Cluster, Node

if TYPE_CHECKING:
    from fabric import Connection

    from .launcher import Connector, Transport

OK, CHANGED, FAILED, UNREACHABLE, SKIPPED = "ok", "changed", "failed", "unreachable", "skipped"

# A line a command prints (on stderr) to say how far it got: "<mark> <done>
# <total or -> <unit> <label>" (roles.progress_echo builds it, a step's
# ``progress`` parser reads it). Never part of what the step's parser reads:
# the runner takes these lines out of stdout and stderr first.
PROGRESS_MARK = "@@llmdeploy-progress@@"

# (done, total or None, unit, label): a step's ``progress`` parser's answer
# for one line ("B": bytes; any other unit is a count of it, "s" seconds)
Progress = tuple[float, "float | None", str, str]

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
        *,
        transport: Callable[[Runner], Transport],
    ):
        """``progress(step, host, result)``: at each host's start of a step
        (result None) and with its result. ``lines(step, host, progress)``:
        how far a host got in a step whose ``progress`` parser read it from
        the command's output while it runs (None: the output is not read
        before the command ends).

        ``transport(runner)``: how its commands reach a node, the cluster's
        launcher's (``Deployment.runner`` gives it; ``LauncherPlugin.transport``).

        ``persist=False``: never through a connection holder. ``reconnect_idle``
        (the holder's own runner, whose connections wait between commands for
        as long as it lives): a reused connection whose session channel will
        not open is replaced once, since the command never started; a host
        that is down then reads unreachable, as on a first connection."""
        self.cluster = cluster
        self.reconnect_idle = reconnect_idle
        self.nodes = list(nodes if nodes is not None else cluster.nodes)
        # how a command reaches a node: the cluster's launcher's transport (llmdeploy/launcher.py), given by the binding
        self.transport = transport(self)
        persist = persist and self.transport.holder
        ssh_hosts = self.transport.hosts(self.nodes)
        self.forks = max(1, min(forks or cluster.ssh.forks, len(self.nodes) or 1))
        self.progress = progress
        self.lines = lines
        self.unreachable: dict[str, str] = {}
        # hosts left out of later steps (failed earlier), with the reason
        self.excluded: dict[str, str] = {}
        self.recap: dict[str, dict[str, int]] = {n.name: {OK: 0, CHANGED: 0, FAILED: 0, UNREACHABLE: 0, SKIPPED: 0} for n in self.nodes}
        self.round_trips: dict[str, int] = {n.name: 0 for n in [*self.nodes, *ssh_hosts]}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=self.forks, thread_name_prefix="llmdeploy-host")
        # the SSH connections to ssh_hosts (or the cluster's connection holder, ssh.persist_s): the transport's connector
        self.ssh: Connector = self.transport.connector(ssh_hosts, persist)

    def __enter__(self) -> "Runner":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.transport.close()  # what the transport holds for this command (an allocation of its own, say)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.ssh.close()

    # -- execution -------------------------------------------------------------
    def connection_name(self, node: Node) -> str:
        """Whose SSH connection ``connection(node)`` is: the node's, or the host the transport reaches it through."""
        return self.ssh.connection_name(node)

    def connection(self, node: Node) -> Connection:
        """The open connection to ``node`` (for port forwarding); UnreachableError if it cannot be.
        The transport's carrier's (a host the nodes are reached through reaches their serving addresses)."""
        return self.ssh.connection(node)

    def abandon(self, node: Node) -> None:
        """Give ``node``'s SSH connection up after an interrupt ended this
        thread's use of it: the commands after this get a new one
        (``Connector.abandon``)."""
        self.ssh.abandon(node)

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
        return self.ssh.stream(node, command)

    def wire(self, command: str, login_args: str = "") -> str:
        """What goes on the SSH session channel for ``command``: the command
        itself, or with ``ssh.become`` the command under ``sudo -n`` as root
        (:func:`llmdeploy.become.command`; ``login_args``: its words the login
        shell expands). The one place a node's command is wrapped: every
        command this runner sends over SSH passes here (its connector's, the SSH
        session's ``_exec_ssh``: each step's and exec's, and the connection
        holder's, whose runner is one of these and is sent the command
        unwrapped; ``stream``; ``_reap``)."""
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
        """exec, plus (deadline, what became of the command) when its deadline fired:
        over the transport's SSH connector (directly or through the connection holder)."""
        return self.ssh.exec(node, command, timeout, stdin, on_line)

    def count(self, node: Node, stdin: str | bytes | None) -> None:
        """One command sent to ``node`` (a transfer when it has stdin): the SSH connector says so."""
        with self._lock:
            self.round_trips[node.name] += 1
        COUNTS.add(node.name, "commands")
        if stdin:
            COUNTS.add(node.name, "transfers")

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
