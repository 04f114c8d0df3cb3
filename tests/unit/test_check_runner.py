"""``invoke check`` without SSH to the nodes (flows/checkhost.py,
flows/check.py, ``LauncherPlugin.outside_ssh`` and ``handoff``): testinfra's
``runner://`` backend runs real testinfra modules through a runner, each
launcher picks its connection, the pytest command line and the JUnit
reading follow it, and on Slurm the parent's one job is what every worker's
steps run in, given back when check is done.

Every command runs here: a runner that runs it under bash, or the Slurm
transport over a login host whose Slurm commands are answered as Slurm would
and whose srun runs each task's dispatch here (one bash per node)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from pathlib import Path

import pytest
import testinfra
from testinfra.host import Host

from flows import check, checkhost
from llmdeploy.errors import UnreachableError
from llmdeploy.inventory import load_cluster
from launchers.slurm import commands as slurm
from launchers.slurm import steps
from launchers.slurm.steps import SlurmSteps
from llmdeploy.runner import Runner
from flows.binding import bind

REPO = Path(__file__).resolve().parent.parent.parent
PATH = "/usr/bin:/bin"


@pytest.fixture(scope="module")
def b200():
    return load_cluster("sim-b200-slurm")


@pytest.fixture(scope="module")
def a3():
    return load_cluster("a3")


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


# -- the choice per launcher, and check's command line -------------------------------------------
def test_each_launcher_says_whether_an_outside_ssh_client_may_log_in(a3, b200):
    assert bind(a3).launcher.outside_ssh(a3) is True and check.scheme(bind(a3)) == "ssh"
    assert bind(b200).launcher.outside_ssh(b200) is False and check.scheme(bind(b200)) == "runner" == checkhost.SCHEME
    with bind(a3).launcher.handoff(a3, a3.nodes) as env:
        assert env == {}


def test_check_runs_testinfra_over_ssh_or_through_the_runner(a3, b200):
    cmd = check.pytest_command(bind(a3), a3.nodes[:2], "/tmp/j.xml", "/tmp/cfg", select="nic")
    assert f"--hosts=ssh://{a3.nodes[0].name},ssh://{a3.nodes[1].name}" in cmd and "--ssh-config=/tmp/cfg" in cmd
    assert cmd[-4:] == ["-n", "2", "-k", "nic"]
    with pytest.raises(ValueError):
        check.pytest_command(bind(a3), a3.nodes, "/tmp/j.xml")
    cmd = check.pytest_command(bind(b200), b200.nodes, "/tmp/j.xml")
    assert f"--hosts=runner://{b200.nodes[0].name},runner://{b200.nodes[1].name}" in cmd
    assert not any(a.startswith("--ssh-config") for a in cmd) and "--junitxml=/tmp/j.xml" in cmd and cmd[-2:] == ["-n", "2"]
    assert "-n" not in check.pytest_command(bind(b200), b200.nodes[:1], "/tmp/j.xml")


def test_the_ssh_config_has_only_the_nodes(b200):
    # the login host is no SSH hop of check's any more
    text = check.ssh_config_text(b200, b200.nodes, "/tmp/cm")
    assert [b.splitlines()[0] for b in text.split("\n\n")[1:]] == [f"Host {n.name}" for n in b200.nodes]
    assert "ProxyJump" not in text


def _junit(path: Path, cases: list[tuple[str, str | None]]) -> str:
    suite = ET.Element("testsuite")
    for name, fail in cases:
        case = ET.SubElement(suite, "testcase", name=name)
        if fail == "skip":
            ET.SubElement(case, "skipped")
        elif fail:
            ET.SubElement(case, "error" if fail.startswith("RuntimeError") else "failure", message=fail)
    ET.ElementTree(suite).write(path)
    return str(path)


@pytest.mark.parametrize("scheme", ["ssh", "runner"])
def test_junit_is_read_per_host_in_the_runs_scheme(tmp_path, scheme):
    p = _junit(tmp_path / "j.xml", [(f"test_a[{scheme}://n-0]", None), (f"test_a[{scheme}://n-1]", "AssertionError: x"),
                                    (f"test_b[{scheme}://n-1]", "skip"), (f"test_c[{scheme}://n-1]", "RuntimeError: n-1: unreachable"),
                                    # another scheme's ids are none of this run's hosts
                                    (f"test_d[{'runner' if scheme == 'ssh' else 'ssh'}://n-0]", None)])
    assert check.parse_junit(p, ["n-0", "n-1"], scheme) == {
        "n-0": {"passed": 1, "failed": [], "skipped": 0},
        "n-1": {"passed": 0, "failed": [("test_a", "AssertionError: x"), ("test_c", "RuntimeError: n-1: unreachable")], "skipped": 1},
    }


def test_check_holds_the_launchers_handoff_around_pytest_and_hands_it_on(b200, monkeypatch, tmp_path):
    """check.run: the handoff entered before pytest starts and left after it
    ended; pytest gets its environment, the cluster, and runner:// hosts."""
    events, seen = [], {}

    @contextmanager
    def handoff(cluster, nodes):
        events.append("held")
        yield {"HANDED": "job 5"}
        events.append("given back")

    def fake_run(cmd, env):
        events.append("pytest")
        seen.update(cmd=cmd, env=env)
        junit = next(a.split("=", 1)[1] for a in cmd if a.startswith("--junitxml="))
        _junit(Path(junit), [(f"test_a[runner://{n.name}]", None) for n in b200.nodes])
        return subprocess.CompletedProcess(cmd, 0, "2 passed\n", "")

    plug = bind(b200).launcher
    monkeypatch.setattr(plug, "handoff", handoff)
    monkeypatch.setattr(check, "run_pytest", fake_run)
    # the site's checks (Launcher.site_checks) run in this process while the handoff is held
    monkeypatch.setattr(check, "site", lambda cluster, nodes, con, quiet: events.append("site") or True)
    assert check.run(bind(b200), quiet=True) == 0
    assert events == ["held", "pytest", "site", "given back"]
    assert seen["env"]["HANDED"] == "job 5" and seen["env"][checkhost.CLUSTER_ENV] == b200.name
    assert any(a.startswith("--hosts=runner://") for a in seen["cmd"])


def test_check_names_why_the_nodes_could_not_be_had(b200, monkeypatch):
    @contextmanager
    def handoff(cluster, nodes):
        raise UnreachableError("no allocation of sim-b200-slurm-0, sim-b200-slurm-1 in partition gpu: busy")
        yield {}

    monkeypatch.setattr(bind(b200).launcher, "handoff", handoff)
    from rich.console import Console

    con = Console(record=True, width=200)
    assert check.run(bind(b200), con=con) == 1
    assert "no allocation of sim-b200-slurm-0, sim-b200-slurm-1" in con.export_text()


# -- Slurm: one job for check and every worker ------------------------------------------------------
class _Login(Runner):
    """A runner whose one host, the login host, answers Slurm's commands as
    Slurm would (a release job 42 of release r1 running when ``release``),
    grants salloc job 91 (or refuses it), and runs each srun's tasks here,
    one bash per node of --nodelist."""

    def __init__(self, cluster, release: bool = False, salloc_ok: bool = True, sinfo: dict[str, list[str]] | None = None):
        self.cluster = cluster
        # what each sinfo that asks for a node says of it, in turn ("<state>|<reason>"; after those, and for the others: idle)
        self.sinfo = {k: list(v) for k, v in (sinfo or {}).items()}
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
            asked = slurm.expand_hostlist(shlex.split(command)[3].split("=", 1)[1])
            said = {n: self.sinfo[n].pop(0) for n in asked if self.sinfo.get(n)}
            return ("".join(f"{n}|{said.get(n, 'idle|none')}\n" for n in names)
                    + (f"{slurm.SQUEUE_MARK} 0\n{queue}" if slurm.SQUEUE_MARK in command else "")), "", 0
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


def _handed(monkeypatch, b200, login: _Login) -> dict[str, str]:
    """What the Slurm launcher's handoff yields, its runner ``login``; the login host's commands after it was given back."""
    from launchers import slurm as plugin

    monkeypatch.setattr(plugin, "Runner", lambda cluster, nodes, transport: login)
    with plugin.handoff(b200, b200.nodes) as env:
        # held while the tests run: nothing cancelled yet
        assert not any(s.startswith("scancel") for s in login.sent)
    return env


def test_check_makes_one_allocation_and_cancels_it_after_the_tests(monkeypatch, b200, no_handed):
    login = _Login(b200)
    env = _handed(monkeypatch, b200, login)
    assert json.loads(env[steps.HANDED_ENV]) == {"cluster": b200.name, "job": "91", "release": None}
    assert login.sent.count("salloc") == 1 and login.sent[-1] == "scancel 91 2>&1 || true"
    assert b200.name not in steps._SHARED


def test_check_hands_the_release_job_on_and_leaves_it_running(monkeypatch, b200, no_handed):
    login = _Login(b200, release=True)
    env = _handed(monkeypatch, b200, login)
    assert json.loads(env[steps.HANDED_ENV]) == {"cluster": b200.name, "job": "42", "release": "r1"}
    assert "salloc" not in login.sent and not any(s.startswith("scancel") for s in login.sent)


def test_no_allocation_for_check_names_the_nodes(monkeypatch, b200, no_handed):
    with pytest.raises(UnreachableError, match=r"no allocation of sim-b200-slurm-0, sim-b200-slurm-1 in partition gpu.*busy"):
        _handed(monkeypatch, b200, _Login(b200, salloc_ok=False))


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


def test_pytest_workers_run_real_testinfra_through_the_runner(tmp_path, b200):
    """pytest with testinfra and two xdist workers over ``runner://`` hosts,
    tests/node's conftest loaded (its scheme registered, ``node0`` reached
    the way ``host`` is), each process's runner one that runs here; the
    JUnit XML read back per host."""
    (tmp_path / "conftest.py").write_text(
        "import subprocess\n"
        "from flows import checkhost\n"
        "from llmdeploy.inventory import load_cluster\n"
        "class Here:\n"
        "    def __init__(self, c): self.cluster = c\n"
        "    def exec(self, node, command, timeout=None, stdin=None, on_line=None):\n"
        "        r = subprocess.run(['bash', '-c', command], capture_output=True, env={'NODE': node.name, 'PATH': '/usr/bin:/bin'})\n"
        "        return r.stdout.decode(), r.stderr.decode(), r.returncode\n"
        "checkhost.runner_of = lambda name: Here(load_cluster(name))\n")
    (tmp_path / "test_here.py").write_text(
        "def test_reaches_its_node(host, node):\n"
        "    assert host.check_output('echo $NODE') == node.name\n"
        "    assert host.file('/etc/passwd').exists\n"
        "def test_node0_the_same_way(host, node0, cluster):\n"
        "    assert node0.backend.get_connection_type() == 'runner'\n"
        "    assert node0.check_output('echo $NODE') == cluster.node0.name\n"
        "def test_fails_on_node_1(host, node, cluster):\n"
        "    assert node is cluster.node0, 'not node 0'\n")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    junit = tmp_path / "j.xml"
    hosts = ",".join(f"runner://{n.name}" for n in b200.nodes)
    res = subprocess.run([sys.executable, "-m", "pytest", str(tmp_path), "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path),
                          "-p", "no:cacheprovider", "-p", "tests.node.conftest", "-q", f"--hosts={hosts}", f"--junitxml={junit}", "-n", "2"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO), checkhost.CLUSTER_ENV: b200.name})
    assert junit.exists(), res.stdout + res.stderr
    n0, n1 = (n.name for n in b200.nodes)
    got = check.parse_junit(str(junit), [n0, n1], "runner")
    assert got[n0] == {"passed": 3, "failed": [], "skipped": 0}, res.stdout
    assert got[n1]["passed"] == 2 and [t for t, _ in got[n1]["failed"]] == ["test_fails_on_node_1"], res.stdout
    assert "not node 0" in got[n1]["failed"][0][1]


def test_a_node_slurm_left_out_of_the_allocation_is_named_and_no_step_asks_for_it(b200, no_handed):
    """The race seen in test_slurm_b200 (issue 45): Slurm's first answer says
    node 1 drains, so the command's allocation leaves it out; its next says
    node 1 is idle. A step on node 1 is then never sent (srun would refuse
    the whole step: "Only allocated 1 nodes asked for 2"): it is named, with
    the job and the state it was left out in, by this runner and by a second
    one that shares the allocation and was told node 1 is idle; node 0's
    steps run in the allocation."""
    n0, n1 = b200.nodes
    s1 = b200.slurm_name(n1)
    login = _Login(b200, sinfo={s1: ["draining|maintenance window"]})
    out, _, code = login.transport.step_exec(n0, "echo on node 0", 30, None)
    assert (out, code) == ("on node 0\n", 0) and login.jobs == ["91"]
    want = (f"{n1.name} is not in Slurm job 91 (this command's allocation, on {n0.name}): it was left out when the job was "
            f"allocated, as Slurm reports {s1} draining (reason: maintenance window)")
    with pytest.raises(UnreachableError) as exc:
        login.transport.step_exec(n1, "echo on node 1", 30, None)
    assert str(exc.value) == want
    # a nested runner of the same command, whose own sinfo says node 1 is idle now: the same allocation, the same answer
    nested = _Login(b200)
    with pytest.raises(UnreachableError) as exc:
        nested.transport.step_exec(n1, "echo on node 1", 30, None)
    assert str(exc.value) == want and "salloc" not in nested.sent
    # a step over both nodes: node 0 answers, node 1 is named; no srun ever asked for node 1
    got = nested.transport.dispatch("both", {n0.name: ("echo hi", None), n1.name: ("echo hi", None)}, 30)
    assert got[n0.name] == ("hi\n", "", 0) and got[n1.name] == want
    assert all(j == "91" for j in login.jobs + nested.jobs)
    assert not any("Only allocated" in str(v) for v in got.values())
    nested.close()
    login.close()
