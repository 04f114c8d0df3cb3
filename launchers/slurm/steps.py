"""The Slurm launcher's transport (``llmdeploy.launcher.Transport``): a step
over many nodes as one ``srun`` from the login host, in the cluster's release
job or in an allocation of the command's own (``commands.py`` builds the
command lines and reads their output; this module runs them over the
runner's one SSH connection, to the login host: ``transports/ssh``, the SSH
connector the launchers share).

A ``standing`` step (status's, top's, the watcher's read) is first asked of
the release's reader (``reader.py``): one command on the login host, no
step, when the reader's latest records answer it; else it runs as a step.
A record answers only when its run started after this process's last
change on the cluster's nodes (``changed``: every step that is not a
standing read, a unit's start, a step's end), so the engine never reads
back a state from before what it just did.

A command whose runners work in child processes (``invoke check``'s pytest
workers) holds the allocation itself and hands it to them in the environment
(``HANDED_ENV``, :func:`handed_env`): a transport made in such a process
runs its steps in that job and gives back nothing of it (a nested salloc of
theirs would wait for the parent's whole, ``--exclusive`` allocation)."""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from typing import TYPE_CHECKING, Callable

from llmdeploy.errors import UnreachableError
from llmdeploy.inventory import Node
from .schema import Slurm, section
from transports.ssh.session import SshSession
from . import commands as slurm
from . import reader

if TYPE_CHECKING:
    from llmdeploy.runner import HostResult, Runner, Step


# the process's own allocation per cluster, shared by its runners (a command
# opens several: the lock's, prepare's, check's), and the token in its name
_SHARED_LOCK = threading.Lock()
_SHARED: dict[str, dict] = {}
TOKEN = secrets.token_hex(4)
# when this process last changed something on each cluster's nodes (time.monotonic()), by any of its runners
_CHANGED: dict[str, float] = {}
# a reader found not running is started again at most this often by one transport (a start that fails is not retried at every read)
RESTART_EVERY_S = 30.0
# squeue's answer read with sinfo's in one command answers the command's next
# look at the queue for this long, if nothing else was sent to the login host in between
QUEUE_FRESH_S = 2.0
# the job a parent command hands to the transports of its child processes: JSON {"cluster", "job", "release"}
HANDED_ENV = "LLMDEPLOY_SLURM_JOB"


def handed_env(cluster: str, job: str, release: str | None) -> dict[str, str]:
    """The environment that hands ``job`` (``release``'s job, or the parent's own allocation: None) to a child process's transports of ``cluster``."""
    return {HANDED_ENV: json.dumps({"cluster": cluster, "job": job, "release": release})}


def handed(cluster: str) -> tuple[str, str | None] | None:
    """(job, release) this process was handed for ``cluster`` by its parent (``handed_env``), None when none was."""
    raw = os.environ.get(HANDED_ENV)
    if not raw:
        return None
    try:
        doc = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("cluster") != cluster or not doc.get("job"):
        return None
    return str(doc["job"]), doc.get("release")


# at most this long for each node's read of its own after a read over several left it without an answer
READ_ALONE_S = 30.0


def lost_words(st: slurm.NodeState) -> str:
    """Why no step starts on a node, as status and stop name it: ``lost: ...`` where Slurm has lost it."""
    return f"lost: {st.describe()}" if st.lost else st.describe()


class SlurmSteps:
    """The runner's commands as job steps: every one goes to the login host
    over the runner's SSH connection to it (never through the connection
    holder), and a node's command is a task of an srun there."""

    holder = False

    def __init__(self, runner: "Runner"):
        self.r = runner
        self.c = runner.cluster
        self.login = self.conf.login_node()
        self.job: str | None = None  # the allocation the steps run in
        self.own = False  # the job is this command's (cancelled at close)
        self.release: str | None = None  # the release whose job it is (None: not known, or the command's own)
        # the nodes the job holds (inventory names; None: not known, a job handed by the parent) and, for
        # the nodes this command's own allocation left out, Slurm's state when it was asked for
        self.held_nodes: frozenset[str] | None = None
        self.left_out: dict[str, str] = {}
        self._restarted: float | None = None  # when this transport last started the release's reader again
        self.checked: set[str] = set()  # nodes whose Slurm state was read
        self.states: dict[str, slurm.NodeState] = {}
        self._queue: tuple[float, list[slurm.Job]] | None = None  # (when, squeue's jobs): see squeue(recent=True)
        self._lock = threading.RLock()  # one allocation, also when threads (top's refresh, a probe) ask at once
        got = handed(self.c.name)
        if got is not None:
            # the parent command's job (its allocation, or the release's): the steps run in it, and the parent gives it back
            self.job, self.release = got

    @property
    def conf(self) -> Slurm:
        """The cluster's ``slurm`` section: this launcher runs only the clusters that set it (``launcher.name_of``)."""
        return section(self.c)

    # -- the transport (llmdeploy.launcher.Transport) ----------------------------------------
    def hosts(self, nodes: list[Node]) -> list[Node]:
        return [self.login]

    def carrier(self, node: Node) -> Node:
        """The login host reaches the nodes' serving addresses: every forward goes over its connection."""
        return self.login

    def exec(self, node: Node, command: str, timeout: float | None, stdin: str | bytes | None,
             on_line: Callable[[str, str], None] | None) -> tuple[str, str, int]:
        """The login host's own command over its connection; a node's as a step."""
        if node.name == self.login.name:
            return self.r.exec_direct(node, command, timeout, stdin, on_line)
        return self.step_exec(node, command, timeout, stdin)

    def run(self, step: "Step", targets: list[Node], deadline: float | None,
            on_line: Callable[[str, str, str], None] | None) -> dict[str, "HostResult"]:
        """``step`` as one srun over the hosts not left out earlier (the srun's own deadlines bound it)."""
        return self.r.run_batched(step, targets, self.srun_step)

    def follow(self, node: Node, command: str, name: str) -> tuple[Node, str]:
        return self.login, self.one_step_command(node, command, name)

    def forward_dest(self, node: Node, dest: str) -> str:
        """The forward leaves the login host: the node's own loopback is its serving address from there."""
        return str(node.ip) if dest.startswith("127.") else dest

    def world(self, nodes: list[Node], tasks: int, argv: list[str], env: dict[str, dict[str, str]],
              timeout: float | None) -> tuple[str, str, int] | None:
        """``argv`` as one ``srun --mpi=pmix`` step of ``tasks`` tasks on each
        node, in this command's allocation (or the release's job): PMIx wires
        the ranks (srun's block distribution: the first node's are ranks 0 to
        tasks-1), each node's ``env`` set in its tasks, no SSH between nodes."""
        for n in nodes:
            self.refuse_unusable(n)
        try:
            job = self.allocation(nodes)
        except AllocationError as exc:
            raise UnreachableError(str(exc)) from exc
        outside = self.outside(job, nodes)
        if outside:
            raise UnreachableError("; ".join(outside.values()))
        command = slurm.world_command(self.c, job, [self.c.slurm_name(n) for n in nodes], tasks, argv,
                                      {self.c.slurm_name(n): env.get(n.name, {}) for n in nodes})
        return self.login_exec(command, timeout)

    # -- the login host ---------------------------------------------------------------
    def login_exec(self, command: str, timeout: float | None = None, stdin: bytes | None = None,
                   read: bool = False) -> tuple[str, str, int]:
        """``command`` on the login host. Anything but a ``read`` (sinfo,
        squeue, the reader's files) may change the queue: the queue read with
        the nodes' states is then not used again."""
        if not read:
            self._queue = None
        try:
            return self.r.exec_direct(self.login, command, timeout, stdin)
        except UnreachableError as exc:
            raise UnreachableError(f"login host {self.conf.login}: {exc}") from exc

    def squeue(self, recent: bool = False) -> list[slurm.Job]:
        """The cluster's jobs of this user. ``recent``: the answer read with
        the nodes' states (``check_nodes``) may do, when it is at most
        QUEUE_FRESH_S old and nothing else went to the login host since (a
        status reads sinfo, squeue and the job's steps once, not squeue twice)."""
        q = self._queue
        if recent and q is not None and time.monotonic() - q[0] <= QUEUE_FRESH_S:
            return q[1]
        out, err, code = self.login_exec(slurm.squeue_command(self.c.name), 60, read=True)
        if code != 0:
            raise UnreachableError(f"squeue on {self.conf.login} failed: {(err or out).strip()[-300:]}")
        jobs = slurm.parse_squeue(out, self.c.name)
        self._queue = (time.monotonic(), jobs)
        return jobs

    # -- node states -------------------------------------------------------------------
    def node_states(self, names: list[str], with_queue: bool = False) -> dict[str, slurm.NodeState]:
        """Slurm's state of the nodes (by Slurm's names), read now; ``with_queue``:
        squeue's answer too, in the same command (kept for ``squeue(recent=True)``)."""
        command = slurm.sinfo_command(names)
        if with_queue:
            command = slurm.with_squeue(command, self.c.name)
        out, err, code = self.login_exec(command, 60, read=True)
        if with_queue:
            out, queue, code = slurm.split_squeue(out, code)
            if queue is not None:
                self._queue = (time.monotonic(), slurm.parse_squeue(queue, self.c.name))
        if code != 0:
            raise UnreachableError(f"sinfo on {self.conf.login} failed: {(err or out).strip()[-300:]}")
        return slurm.parse_sinfo(out, names)

    def check_nodes(self, nodes: list[Node]) -> dict[str, str]:
        """Slurm's state of the nodes not read yet: {node: why no step can start there}."""
        todo = [n for n in nodes if n.name not in self.checked]
        if not todo:
            return {}
        names = slurm.node_names(self.c, todo)
        # without a job yet, the step will look for the release's next: both in one command
        states = self.node_states(names, with_queue=self.job is None)
        bad = {}
        for n, name in zip(todo, names):
            self.checked.add(n.name)
            st = self.states[n.name] = states[name]
            if not st.usable:
                bad[n.name] = lost_words(st)
        return bad

    def refuse_unusable(self, node: Node) -> None:
        """UnreachableError naming Slurm's state when no step can start on ``node`` (read once)."""
        bad = self.check_nodes([node])
        if bad:
            raise UnreachableError(bad[node.name])

    # -- the allocation ---------------------------------------------------------------
    def use_job(self, job_id: str | None, release: str | None = None, nodes: list[str] | None = None) -> None:
        """Run the next steps in ``job_id`` (``release``'s job, on the Slurm
        nodes ``nodes`` when known); None: find one again."""
        with self._lock:
            self.release_own()
            self.job, self.own, self.release = job_id, False, release if job_id else None
            self.held_nodes, self.left_out = (self._inventory_names(nodes) if job_id and nodes is not None else None), {}

    def release_own(self) -> None:
        """Give back this runner's share of the process's own allocation (cancelled with its last user)."""
        with self._lock:
            if not self.own:
                return
            job, self.job, self.own, self.release = self.job, None, False, None
            self.held_nodes, self.left_out = None, {}
            with _SHARED_LOCK:
                entry = _SHARED.get(self.c.name)
                if entry is None or job is None or entry["job"] != job:
                    return
                entry["users"] -= 1
                if entry["users"] > 0:
                    return
                del _SHARED[self.c.name]
            try:
                self.login_exec(slurm.scancel_job_command(job, 30), 60)
            except UnreachableError:
                pass

    def allocation(self, nodes: list[Node]) -> str:
        """The job the steps on ``nodes`` run in: the running release job of
        the cluster, else the allocation of this process's own (one for every
        runner of the command: a nested one would wait for the first)."""
        with self._lock:
            if self.job or self._find_release_job():
                assert self.job is not None  # _find_release_job set it
                return self.job
            with _SHARED_LOCK:
                entry = _SHARED.get(self.c.name)
                if entry is None:
                    job, held, left = self._salloc(nodes)
                    entry = _SHARED[self.c.name] = {"job": job, "users": 0, "nodes": held, "left": left}
                entry["users"] += 1
            self.job, self.own = entry["job"], True
            self.held_nodes, self.left_out = entry["nodes"], dict(entry["left"])
            return self.job

    def _find_release_job(self) -> bool:
        """Whether the cluster has a running release job (squeue): then the steps run in it."""
        held = slurm.release_job([j for j in self.squeue(recent=True) if j.state == "RUNNING"], self.c.name)
        if held is None:
            return False
        self.job, self.own, self.release = held.id, False, slurm.release_of_job(self.c.name, held.name)
        self.held_nodes, self.left_out = (self._inventory_names(slurm.expand_hostlist(held.nodes)) if held.nodes else None), {}
        return True

    def _inventory_names(self, slurm_names: list[str]) -> frozenset[str]:
        by_slurm = {self.c.slurm_name(n): n.name for n in self.c.nodes}
        return frozenset(by_slurm.get(s, s) for s in slurm_names)

    def outside(self, job: str, nodes: list[Node]) -> dict[str, str]:
        """The nodes of ``nodes`` that job ``job`` (the one the steps run in)
        does not hold, each with why: Slurm's state when this command's
        allocation was asked for, or the job's own node list. A step is
        never sent to them: srun would refuse the whole step ("Only
        allocated N nodes asked for M")."""
        with self._lock:
            held, left, own, release = self.held_nodes, dict(self.left_out), self.own, self.release
        if held is None:
            return {}
        whose = "this command's allocation" if own else f"release {release}'s job" if release else "the job the steps run in"
        out = {}
        for n in nodes:
            if n.name in held:
                continue
            why = left.get(n.name)
            out[n.name] = (f"{n.name} is not in Slurm job {job} ({whose}, on {', '.join(sorted(held)) or 'no node'}): "
                           + (f"it was left out when the job was allocated, as {why}" if why else "Slurm did not give it to that job"))
        return out

    def release_held(self) -> tuple[str, str] | None:
        """(job, release) of the running release job the steps run in, None
        when they run in an allocation of the command's own (or none runs)."""
        with self._lock:
            if not self.job:
                try:
                    self._find_release_job()
                except UnreachableError:
                    return None
            if self.own or not self.job or not self.release:
                return None
            return self.job, self.release

    def _salloc(self, nodes: list[Node]) -> tuple[str, frozenset[str], dict[str, str]]:
        """This command's allocation: (its job, the nodes it holds, each node
        it left out with Slurm's state then)."""
        # every node of the cluster that Slurm can give (a later step, or a nested runner, may want any)
        bad = self.check_nodes(self.c.nodes)
        for h, why in bad.items():
            self.r.unreachable.setdefault(h, why)
        usable = [n for n in self.c.nodes if self.states.get(n.name) is None or self.states[n.name].schedulable] or nodes
        left = {n.name: self.states[n.name].describe() for n in self.c.nodes if n not in usable and n.name in self.states}
        names = slurm.node_names(self.c, usable)
        name = slurm.command_job_name(self.c.name, TOKEN)
        try:
            out, err, code = self.login_exec(slurm.salloc_command(self.c, names, name), self.conf.alloc_timeout_s + 30)
        except BaseException:
            # interrupted or cut off while salloc waited: whatever it was granted goes by its name
            self._cancel_by_name(name)
            raise
        job = slurm.parse_job_id(err + out)
        if code != 0 or job is None:
            self._cancel_by_name(name)
            said = slurm.srun_problem(out, err, code).replace("srun", "salloc")
            gres = " ".join(slurm.gres_args(self.c))
            raise AllocationError(f"no allocation of {', '.join(names)} in partition {self.conf.partition}"
                                  f"{f' with {gres} on each node' if gres else ''}: {said}")
        return job, frozenset(n.name for n in usable), left

    def _cancel_by_name(self, name: str) -> None:
        try:
            self.login_exec(slurm.scancel_name_command(name), 30)
        except BaseException:  # best effort: the time limit ends it otherwise (slurm.command_time_limit)
            pass

    def forget(self, job_id: str) -> None:
        """``job_id`` ended under this runner (cancelled by another command): find an allocation again."""
        with self._lock:
            if self.job != job_id:
                return
            if self.own:
                with _SHARED_LOCK:
                    if _SHARED.get(self.c.name, {}).get("job") == job_id:
                        del _SHARED[self.c.name]
            self.job, self.own, self.release = None, False, None
            self.held_nodes, self.left_out = None, {}

    def close(self) -> None:
        self.release_own()

    def connector(self, hosts: list[Node], persist: bool) -> SshSession:
        """The login host's SSH connection (never through the connection holder: ``holder`` is False)."""
        return SshSession(self.r, hosts, persist)

    # -- steps ---------------------------------------------------------------------------
    def dispatch(self, step_name: str, per_node: dict[str, tuple[str, bytes | None]], timeout: float,
                 retry: bool = True, read: bool = False) -> dict[str, tuple[str, str, int] | str]:
        """One srun over the nodes (by name) of ``per_node``: {node name:
        (stdout, stderr, exit code) or why it has no answer}. Unless it is a
        ``read`` (a standing step's), it may have changed something on the nodes (``changed``)."""
        nodes = [self.c.node(h) for h in per_node]
        job = self.allocation(nodes)
        outside = self.outside(job, nodes)
        res: dict[str, tuple[str, str, int] | str] = dict(outside)
        nodes = [n for n in nodes if n.name not in outside]
        if not nodes:
            return res
        names = {self.c.slurm_name(n): n for n in nodes}
        data = slurm.payload({self.c.slurm_name(n): per_node[n.name] for n in nodes}, timeout)
        cmd = slurm.srun_dispatch_command(self.c, job, list(names), step_name)
        try:
            out, err, code = self.login_exec(cmd, timeout + 60, data)
        finally:
            if not read:
                self.changed()
        got = slurm.parse_dispatch(out)
        if not got and slurm.job_gone(err + out) and retry:
            # the job ended under us (a redeploy by another command cancelled it): once more in the one that holds the nodes now
            self.forget(job)
            return self.dispatch(step_name, per_node, timeout, retry=False, read=read)
        for name, n in names.items():
            o = got.get(name)
            if o is None:
                res[n.name] = f"job {job}: no answer from {name}'s task: {slurm.srun_problem(out, err, code)}"
            else:
                res[n.name] = (o.stdout, o.stderr, 124 if o.code == 124 else o.code)
        unanswered = [n.name for n in nodes if isinstance(res[n.name], str)]
        if unanswered and len(nodes) > 1 and read and code != 124 and not slurm.job_gone(err + out):
            res.update(self._each_alone(step_name, {h: per_node[h] for h in unanswered}, min(timeout, READ_ALONE_S)))
        return res

    def _each_alone(self, step_name: str, per_node: dict[str, tuple[str, bytes | None]], timeout: float) -> dict[str, tuple[str, str, int] | str]:
        """The nodes a read over several left without an answer, each in a
        read of its own: one node srun cannot reach (a node that lost power,
        its slurmd gone) aborts the whole step ("Job step aborted"), and must
        not cost the others their answer. Reads only (status's, top's, the
        watcher's: they change nothing, so running one again is safe); never
        after the step's deadline or with its job gone. A node still without
        an answer that Slurm now says is not responding or down reads as lost."""
        res: dict[str, tuple[str, str, int] | str] = {}
        for h, one in per_node.items():
            res.update(self.dispatch(step_name, {h: one}, timeout, retry=False, read=True))
        lost = [self.c.node(h) for h, ans in res.items() if isinstance(ans, str)]
        if lost:
            try:
                states = self.node_states(slurm.node_names(self.c, lost))
            except UnreachableError:
                return res
            for n in lost:
                st = states.get(self.c.slurm_name(n))
                if st is not None and not st.usable:
                    self.states[n.name] = st
                    res[n.name] = f"{lost_words(st)} ({res[n.name]})"
        return res

    def step_exec(self, node: Node, command: str, timeout: float | None, stdin: str | bytes | None) -> tuple[str, str, int]:
        """One command on one node, as a step."""
        self.refuse_unusable(node)
        data = stdin.encode() if isinstance(stdin, str) else stdin
        try:
            ans = self.dispatch("exec", {node.name: (command, data)}, timeout or self.c.ssh.command_timeout)[node.name]
        except AllocationError as exc:
            raise UnreachableError(str(exc)) from exc
        if isinstance(ans, str):
            raise UnreachableError(ans)
        return ans

    def one_step_command(self, node: Node, command: str, step_name: str) -> str:
        """The login host's command that runs ``command`` on ``node`` as one step, output as it comes."""
        self.refuse_unusable(node)
        job = self.allocation([node])
        outside = self.outside(job, [node])
        if outside:
            raise UnreachableError(outside[node.name])
        return slurm.srun_one_command(self.c, job, self.c.slurm_name(node), step_name, command)

    def srun_step(self, step: "Step", targets: list[Node]) -> dict[str, "HostResult"]:
        """``step`` on ``targets`` as one srun (local and decided hosts need none)."""
        from llmdeploy.runner import FAILED, SKIPPED, UNREACHABLE, HostResult

        results: dict[str, HostResult] = {}
        t0 = time.monotonic()
        try:
            bad = self.check_nodes(targets)
        except UnreachableError as exc:
            return {n.name: HostResult(n.name, UNREACHABLE, msg=f"unreachable at step '{step.name}': {exc}") for n in targets}
        for h, why in bad.items():
            self.r.unreachable[h] = why
            results[h] = HostResult(h, UNREACHABLE, msg=why)
        per_node: dict[str, tuple[str, bytes | None]] = {}
        for n in targets:
            if n.name in results:
                continue
            pre = self.r.before(step, n)
            if isinstance(pre, HostResult):
                results[n.name] = pre
            elif pre is None:
                results[n.name] = HostResult(n.name, SKIPPED, msg="nothing to do here")
            else:
                stdin = step.stdin(n) if step.stdin else None
                per_node[n.name] = (pre, stdin.encode() if isinstance(stdin, str) else stdin)
        if per_node and step.standing and not any(stdin for _, stdin in per_node.values()):
            # status's, top's, the watcher's read: the release's reader may have it
            for h, (o, e, code, age) in (self.from_reader(step.name, per_node) or {}).items():
                results[h] = self.r.after(step, self.c.node(h), o, e, code, None)
                results[h].age = age
                del per_node[h]
        if per_node:
            try:
                answers = self.dispatch(step.name, per_node, step.timeout or self.c.ssh.command_timeout, read=step.standing)
            except (UnreachableError, AllocationError) as exc:
                kind = UNREACHABLE if isinstance(exc, UnreachableError) else FAILED
                for h in per_node:
                    results[h] = HostResult(h, kind, msg=f"at step '{step.name}': {exc}")
                    if kind == UNREACHABLE:
                        self.r.unreachable[h] = results[h].msg
                answers = {}
            for h, ans in answers.items():
                node = self.c.node(h)
                if isinstance(ans, str):
                    results[h] = HostResult(h, UNREACHABLE, msg=f"at step '{step.name}': {ans}")
                    self.r.unreachable[h] = results[h].msg
                else:
                    results[h] = self.r.after(step, node, *ans, None)
        for r in results.values():
            r.duration = time.monotonic() - t0
        return results


    # -- the release's reader (reader.py) ----------------------------------------------
    def changed(self) -> None:
        """This process may have changed something on the cluster's nodes just
        now: no record of the reader's taken before answers a read of it."""
        with _SHARED_LOCK:
            _CHANGED[self.c.name] = time.monotonic()

    def from_reader(self, read: str, per_node: dict[str, tuple[str, bytes | None]]) -> dict[str, tuple[str, str, int, float]] | None:
        """{node: (stdout, stderr, exit code, seconds old)} of the read
        ``read`` (``per_node``: each node's command) from the release's
        reader, with one command on the login host; None when it cannot answer
        for every node (then a reader that does not run is started again)."""
        held = self.release_held()
        if held is None:
            return None
        job, release = held
        with _SHARED_LOCK:
            at = _CHANGED.get(self.c.name)
        since = None if at is None else time.monotonic() - at
        if since is not None and since <= reader.MARGIN_S:
            return None  # nothing the reader took can be newer than what this process just did
        names = {self.c.slurm_name(self.c.node(h)): h for h in per_node}
        d = reader.reader_dir(self.c, release)
        try:
            out, _, _ = self.login_exec(reader.read_command(d, list(names), read), 30, read=True)
        except UnreachableError:
            return None
        snap = reader.parse_snapshot(out)
        got, _ = reader.answers(snap, read, {s: per_node[h][0] for s, h in names.items()}, job,
                                reader.max_age(self.conf.reader_period_s), since)
        if got is None:
            if snap.state == "down":
                self.restart_reader(d, job)
            return None
        assert snap.now is not None  # answers() gives none without the login host's time
        return {names[s]: (r.stdout, r.stderr, r.code, max(0.0, r.age(snap.now) or 0.0)) for s, r in got.items()}

    def restart_reader(self, d: str, job: str) -> None:
        """Start the release's reader again (it does not run): one step, at most every RESTART_EVERY_S by this transport."""
        now = time.monotonic()
        if self._restarted is not None and now - self._restarted < RESTART_EVERY_S:
            return
        self._restarted = now
        try:
            self.login_exec(reader.restart_command(d, job), 30)
        except UnreachableError:
            pass


class AllocationError(RuntimeError):
    """No allocation could be had (the nodes are busy, the partition refuses them)."""
