"""testinfra's ``runner://`` backend (flows/checkhost.py): real testinfra
modules run through a runner, each command ``Runner.exec`` on the named
node, an unreachable node named. Every command runs here, under bash."""

from __future__ import annotations

import subprocess

import pytest
import testinfra
from testinfra.host import Host

from flows import checkhost
from llmdeploy.errors import UnreachableError
from llmdeploy.inventory import load_cluster


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
