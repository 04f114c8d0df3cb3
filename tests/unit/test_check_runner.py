"""testinfra's ``runner://`` backend (flows/checkhost.py): real testinfra
modules run through a runner, each command ``Runner.exec`` on the named
node, an unreachable node named; on Slurm a pytest worker's steps run in
the job its parent handed it. Every command runs here: under bash, or
through the Slurm transport over a login host whose Slurm commands are
answered as Slurm would and whose srun runs each task's dispatch here."""

from __future__ import annotations

import shlex
import subprocess

import pytest
import testinfra
from testinfra.host import Host

from flows import checkhost
from llmdeploy.errors import UnreachableError
from llmdeploy.inventory import load_cluster
from llmdeploy.launchers.slurm import commands as slurm
from llmdeploy.launchers.slurm import steps
from llmdeploy.launchers.slurm.steps import SlurmSteps
from llmdeploy.runner import Runner

PATH = "/usr/bin:/bin"


@pytest.fixture(scope="module")
def b200():
    return load_cluster("sim-b200-slurm")


class _Here:
    """A runner whose every node is this machine: a command runs under bash here."""

    def __init__(self, cluster, down: str | None = None):
        self.cluster = cluster
        self.down = down  # a node whose commands cannot reach it
        self.sent: list[tuple[str, str]] = []

    def exec(self, node, command, timeout=None, stdin=None, on_line=None):
        self.sent.append((node.name, command))
        if node.name == self.down:
            raise UnreachableError("10.0.0.9:22: connection refused")
        res = subprocess.run(["bash", "-c", command], capture_output=True, timeout=60)
        return res.stdout.decode(errors="replace"), res.stderr.decode(errors="replace"), res.returncode


def _host(runner, name: str) -> Host:
    backend = checkhost.RunnerBackend(name, runner=runner)
    h = Host(backend)
    backend.set_host(h)
    return h


# -- the backend ------------------------------------------------------------------------------
def test_testinfra_modules_run_through_the_runner_on_the_named_node(b200, tmp_path):
    r = _Here(b200)
    node = b200.nodes[1].name
    h = _host(r, node)
    (tmp_path / "env").write_text("A=1\nB=two words\n")
    (tmp_path / "env").chmod(0o640)
    f = h.file(str(tmp_path / "env"))
    assert f.exists and f.is_file and f.mode == 0o640 and f.content_string == "A=1\nB=two words\n"
    assert h.file(str(tmp_path)).is_directory and not h.file(str(tmp_path / "nothing")).exists
    cmd = h.run("echo out; echo err >&2; exit 3")
    assert (cmd.rc, cmd.stdout, cmd.stderr) == (3, "out\n", "err\n") and cmd.stdout_bytes == b"out\n"
    # testinfra's quoting: an argument with spaces and quotes arrives whole
    assert h.check_output("printf '%%s|' %s %s", "a b", "it's") == "a b|it's|"
    with pytest.raises(AssertionError):
        h.check_output("false")
    assert h.backend.get_pytest_id() == f"runner://{node}" and h.backend.hostname == node
    # every command went to that node, none asked the node for its encoding
    assert r.sent and {n for n, _ in r.sent} == {node}
    assert not any("getpreferredencoding" in c for _, c in r.sent)


def test_a_node_the_runner_cannot_reach_is_named(b200):
    node = b200.nodes[0].name
    h = _host(_Here(b200, down=node), node)
    with pytest.raises(checkhost.NodeUnreachable, match=rf"^{node}: 10.0.0.9:22: connection refused"):
        h.run("true")
    with pytest.raises(checkhost.NodeUnreachable, match=r"^elsewhere-7: not a node of cluster sim-b200-slurm"):
        _host(_Here(b200), "elsewhere-7").run("true")


def test_the_scheme_is_a_testinfra_connection_once_registered(b200):
    checkhost.register()
    r = _Here(b200)
    h = testinfra.get_host(f"runner://{b200.node0.name}", runner=r, ssh_config=None)
    assert type(h.backend) is checkhost.RunnerBackend and h.backend.hostname == b200.node0.name
    assert h.check_output("echo %s", "x") == "x"


# -- Slurm: one job for check and every worker ------------------------------------------------------
class _Login(Runner):
    """A runner whose one host, the login host, answers Slurm's commands as
    Slurm would (a release job 42 of release r1 running when ``release``),
    grants salloc job 91 (or refuses it), and runs each srun's tasks here,
    one bash per node of --nodelist."""

    def __init__(self, cluster, release: bool = False, salloc_ok: bool = True):
        self.cluster = cluster
        self.progress, self.lines = None, None
        self.unreachable, self.excluded = {}, {}
        self.release, self.salloc_ok = release, salloc_ok
        self.sent: list[str] = []  # the first word of every command the login host got
        self.jobs: list[str] = []  # the --jobid of every srun
        self.transport = SlurmSteps(self)

    def exec_direct(self, node, command, timeout=None, stdin=None, on_line=None):
        names = [self.cluster.slurm_name(n) for n in self.cluster.nodes]
        queue = f"42|{slurm.release_job_name(self.cluster.name, 'r1')}|RUNNING|None|{','.join(names)}|1-00:00:00|N/A\n" if self.release else ""
        self.sent.append(command.split()[0])
        if command.startswith("squeue"):
            return queue, "", 0
        if command.startswith("sinfo"):
            return "".join(f"{n}|idle|none\n" for n in names) + (f"{slurm.SQUEUE_MARK} 0\n{queue}" if slurm.SQUEUE_MARK in command else ""), "", 0
        if command.startswith("salloc"):
            return ("", "salloc: Granted job allocation 91\n", 0) if self.salloc_ok else ("", "salloc: error: Unable to allocate resources: busy\n", 1)
        if command.startswith("scancel"):
            self.sent[-1] = command.split("\n")[0]
            return "", "", 0
        if command.startswith("srun "):
            args = shlex.split(command)
            self.jobs.append(next(a for a in args if a.startswith("--jobid=")).split("=", 1)[1])
            nodes = next(a for a in args if a.startswith("--nodelist=")).split("=", 1)[1].split(",")
            out = ""
            for i, n in enumerate(nodes):
                res = subprocess.run(["bash", "-c", args[-1]], input=stdin, capture_output=True, env={"SLURMD_NODENAME": n, "PATH": PATH})
                out += "".join(f"{i}: {ln}\n" for ln in res.stdout.decode().splitlines())
            return out, "", 0
        raise AssertionError(f"the login host got {command!r}")

    def close(self):
        self.transport.close()


@pytest.fixture
def no_handed(monkeypatch, b200):
    monkeypatch.delenv(steps.HANDED_ENV, raising=False)
    steps._SHARED.pop(b200.name, None)
    yield
    steps._SHARED.pop(b200.name, None)


def test_a_workers_testinfra_commands_are_steps_in_the_handed_job(monkeypatch, b200, no_handed, tmp_path):
    """A pytest worker's runner (its environment from check): testinfra's
    commands are sruns in job 91, with no squeue, salloc or scancel of its
    own; closing it gives back nothing. Another cluster's hand-off is not taken."""
    monkeypatch.setenv(steps.HANDED_ENV, steps.handed_env("another", "7", None)[steps.HANDED_ENV])
    assert SlurmSteps(_Login(b200)).job is None
    monkeypatch.setenv(steps.HANDED_ENV, steps.handed_env(b200.name, "91", None)[steps.HANDED_ENV])
    worker = _Login(b200)
    (tmp_path / "f").write_text("x=1\n")
    for n in b200.nodes:
        h = _host(worker, n.name)
        assert h.file(str(tmp_path / "f")).content_string == "x=1\n"
        # the command ran as the node's task: its SLURMD_NODENAME
        assert h.check_output("echo $SLURMD_NODENAME") == b200.slurm_name(n)
        assert h.run("echo no >&2; exit 4").rc == 4 and h.run("echo no >&2; exit 4").stderr == "no\n"
    worker.close()
    assert worker.jobs and set(worker.jobs) == {"91"}
    assert set(worker.sent) == {"sinfo", "srun"}, worker.sent
