"""``ssh.become`` (llmdeploy/become.py): the wrapper every node command of an
SSH cluster goes through (``Runner.wire``), sudo's refusals read into one
sentence naming the node, the inventory's refusal on Slurm, and, with
become off, commands on the wire byte for byte what they were (an
in-process SSH server that answers each command with ``ran <command>``:
tests/unit/test_interrupted_command.py's)."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
import textwrap
import threading

import pytest

from flows import check
from llmdeploy import become
from llmdeploy.errors import InventoryError
from llmdeploy.inventory import Cluster, load_cluster, load_cluster_file
from llmdeploy.runner import FAILED, OK, HostResult, Runner, Step
from roles import facts
from tests.unit.test_interrupted_command import _Conn, host_key, sessions  # noqa: F401 (the fixtures)
from tests.unit.test_inventory import _module
from flows.binding import bind
from transports.ssh import connect, mux

# a command with what quoting must carry through: quotes of both kinds, $, a backslash, a newline
TRICKY = "printf '%s\\n' \"$HOME\" 'it'\"'\"'s' `true` $((1+1)) \\\\ ; echo done\nexit 3"


def becoming(c: Cluster, on: bool = True, **ssh) -> Cluster:
    return c.model_copy(update={"ssh": c.ssh.model_copy(update={"become": on, "user": "alice", **ssh})})


# --- the wrapper ----------------------------------------------------------------------------
def test_the_wrapper_is_sudo_n_as_root_running_bash_with_the_command_as_one_argument():
    line = become.command(TRICKY)
    assert line.startswith("sudo -n -H -u root -- /bin/bash -c '")
    argv = shlex.split(line)
    assert argv == ["sudo", "-n", "-H", "-u", "root", "--", "/bin/bash", "-c", become.PATH_LINE + TRICKY]
    assert become.PATH_LINE == "PATH=/usr/local/sbin:/usr/local/bin:$PATH; export PATH\n"
    # words the login shell expands come after the command, as its $1 $2 ($0: bash)
    assert shlex.split(become.command("x", '"$PPID" "$$"'))[-4:] == [become.PATH_LINE + "x", "bash", "$PPID", "$$"]
    assert become.command("x", '"$PPID"').endswith(" bash \"$PPID\"")


@pytest.fixture
def fake_sudo(tmp_path):
    """A ``sudo`` on PATH that drops its options and runs the rest (as sudo -n does for a NOPASSWD user)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sudo").write_text('#!/bin/sh\nwhile [ "$1" != "--" ]; do shift; done\nshift\nexec "$@"\n')
    (bin_dir / "sudo").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/nowhere"}


def test_the_wrapped_command_keeps_its_words_its_standard_input_and_its_exit_status(fake_sudo):
    """Run by a login shell as sshd runs it (``sh -c <line>``): the command
    sees what it would see unwrapped, reads its own stdin, and its exit
    status is the line's."""
    data = b"secret=\x00'\"$x\n" * 5000
    got = subprocess.run(["sh", "-c", become.command('wc -c; ' + TRICKY)], input=data, capture_output=True, env=fake_sudo)
    plain = subprocess.run(["sh", "-c", "wc -c; " + TRICKY], input=data, capture_output=True, env=fake_sudo)
    assert got.returncode == plain.returncode == 3
    assert got.stdout == plain.stdout and got.stdout.split()[0] == str(len(data)).encode()
    assert b"it's" in got.stdout and b"done" in got.stdout and got.stderr == plain.stderr == b""


def test_the_reaper_under_sudo_stops_the_other_sessions_of_its_connection_and_not_its_own(fake_sudo):
    """REAP_AS_ROOT as the runner sends it (``SshSession._reap``): a stand-in
    sshd with two sessions, a command that runs on and the reaper, each the
    leader of its own process group as sshd makes them."""
    reap = become.command(connect.REAP_AS_ROOT, '"$PPID" "$$"')
    sshd = textwrap.dedent(f"""
        import subprocess, sys
        env = {fake_sudo!r}
        left = subprocess.Popen(["sh", "-c", "sleep 60; echo survived"], start_new_session=True, env=env, stdout=subprocess.PIPE)
        reaper = subprocess.run(["sh", "-c", {reap!r}], start_new_session=True, env=env, capture_output=True, text=True, timeout=20)
        print(reaper.stdout.strip(), reaper.returncode, left.wait(timeout=10), left.stdout.read().decode().strip() or "-")
    """)
    out = subprocess.run([sys.executable, "-c", sshd], capture_output=True, text=True, timeout=40)
    assert out.stdout.split() == ["1", "0", "-15", "-"], out.stderr


# --- sudo's refusals ------------------------------------------------------------------------
WARNING = "sudo: unable to resolve host n0: Name or service not known\n"


@pytest.mark.parametrize("err,code,words", [
    ("sudo: a password is required\n", 1,
     "sudo asks for a password on node n0: ssh.become needs NOPASSWD sudo for alice there (sudoers(5): alice ALL=(root) NOPASSWD: ALL)"),
    (WARNING + "sudo: a password is required\n", 1, "sudo asks for a password on node n0: ssh.become needs NOPASSWD sudo for alice"),
    ("bob is not in the sudoers file.\n", 1,
     "sudo refuses bob on node n0 (bob is not in the sudoers file): ssh.become needs NOPASSWD sudo for bob there "
     "(sudoers(5): bob ALL=(root) NOPASSWD: ALL)"),
    ("bob is not in the sudoers file.  This incident will be reported.\n", 1, "(bob is not in the sudoers file)"),
    ("bob is not allowed to run sudo on n0.\n", 1, "sudo refuses bob on node n0 (bob may not run sudo on it)"),
    ("Sorry, user bob may not run sudo on n0.\n", 1, "sudo refuses bob on node n0 (bob may not run sudo on it)"),
    ("Sorry, user bob is not allowed to execute '/bin/bash -c PATH=/usr/local/sbin:$PATH; export PATH\ndocker ps' as root on n0.\n", 1,
     "sudo refuses bob on node n0 (bob may not run /bin/bash as root there)"),
    # sudo-rs
    ("sudo: interactive authentication is required\n", 1, "sudo asks for a password on node n0: ssh.become needs NOPASSWD sudo for alice"),
    ("sudo: I'm sorry bob. I'm afraid I can't do that\n", 1, "sudo refuses bob on node n0 (the sudoers do not let bob run it)"),
    ("sudo: Sorry, user bob is not allowed to execute '/bin/bash -c PATH=x\nsudo: ls' as root on n0.\n", 1,
     "sudo refuses bob on node n0 (bob may not run /bin/bash as root there)"),
    ("sudo: sorry, you must have a tty to run sudo\n", 1,
     "sudo on node n0 wants a terminal (sudoers' requiretty) and ssh.become runs without one: set Defaults:alice !requiretty"),
    ("bash: line 1: sudo: command not found\n", 127, "no sudo on node n0 (bash: line 1: sudo: command not found): ssh.become runs every command"),
    ("sh: 1: sudo: not found\n", 127, "no sudo on node n0 (sh: 1: sudo: not found)"),
    ("zsh:1: command not found: sudo\n", 127, "no sudo on node n0"),
])
def test_sudos_own_refusal_reads_as_the_node_and_the_fix(err, code, words):
    said = become.refusal("n0", "alice", "", err, code)
    assert said is not None and words in said
    assert "\n" not in said and "docker ps" not in said  # one sentence, never the command sudo quoted


def test_the_user_is_left_unnamed_when_neither_sudo_nor_the_inventory_names_one():
    said = become.refusal("n0", None, "", "sudo: a password is required\n", 1)
    assert said == ("sudo asks for a password on node n0: ssh.become needs NOPASSWD sudo for the user SSH logs in as there "
                    "(sudoers(5): USER ALL=(root) NOPASSWD: ALL)")


@pytest.mark.parametrize("out,err,code", [
    ("", "", 1),                                         # grep -q found nothing
    ("", WARNING, 1),                                    # sudo only warned, the command failed silently
    ("", "grep: /x: No such file or directory\n", 2),
    ("", "docker: permission denied\nsudo: a password is required\n", 1),  # the command spoke first
    ("some output\n", "sudo: a password is required\n", 1),               # the command ran
    ("", "sudo: a password is required\n", 0),
    ("", "sudo: a password is required\n", 127),
    ("", "bash: line 1: sudo: command not found\n", 1),
    ("", "bash: line 1: docker: command not found\n", 127),
])
def test_anything_but_sudos_own_refusal_is_the_commands_own_result(out, err, code):
    assert become.refusal("n0", "alice", out, err, code) is None


# --- the runner: one wrapping point, one reading of refusals --------------------------------
def _runner(c: Cluster, session) -> Runner:
    """A runner of ``c``'s first node over ``session`` (an in-process SSH server that answers ``ran <command>``)."""
    r = bind(c).runner(nodes=c.nodes[:1], persist=False)
    r.ssh.connections[c.nodes[0].name] = _Conn(session)
    return r


def test_without_become_the_commands_on_the_wire_are_byte_for_byte_the_builders(sessions):
    c = load_cluster("a3")
    assert c.ssh.become is False
    node = c.nodes[0]
    built = facts.gather_step(bind(c)).build(node)
    with _runner(c, sessions()) as r:
        assert r.wire(built) is built and r.wire(TRICKY, '"$PPID"') is TRICKY
        assert r.exec(node, built) == (f"ran {built}\n", "", 0)
        seen = {}
        r.run(Step(name="s", build=lambda n: TRICKY, parse=lambda n, o, e, code: seen.setdefault("out", o) and HostResult(n.name)))
        assert seen["out"] == f"ran {TRICKY}\n"


def test_with_become_every_command_goes_on_the_wire_under_sudo_once(sessions):
    c = becoming(load_cluster("a3"))
    node = c.nodes[0]
    with _runner(c, sessions()) as r:
        out, err, code = r.exec(node, TRICKY, stdin=b"data")
        assert (out, code) == (f"ran {become.command(TRICKY)}\n", 0)
        res = r.run(Step(name="s", build=lambda n: "docker ps"))[node.name]
        assert res.status == OK and res.stdout == f"ran {become.command('docker ps')}\n"


def test_through_the_connection_holder_the_command_is_wrapped_once_by_the_holders_runner(sessions, short_tmp, monkeypatch):
    """The client sends the command as built; the holder's runner (a Runner
    that connects itself) puts it on the wire under sudo."""
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp))
    c = becoming(load_cluster("a3"), persist_s=60)
    path = mux.socket_path(c)
    h = mux.Holder(c, path, 60, runner=_runner(c, sessions()))
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)
    t = threading.Thread(target=h.serve, args=(server,), daemon=True)
    t.start()
    try:
        with bind(c).runner(nodes=c.nodes[:1]) as r:
            assert r.ssh.mux is not None
            assert r.exec(c.nodes[0], "docker ps") == (f"ran {become.command('docker ps')}\n", "", 0)
    finally:
        mux._request(path, "exit")
        t.join(5)
        server.close()


def test_a_followed_log_and_the_reaper_are_wrapped_too(monkeypatch):
    c = becoming(load_cluster("a3"))
    node = c.nodes[0]

    class Conn:
        is_connected, gateway = True, None
        ran: list[str] = []

        def run(self, command, **kw):
            self.ran.append(command)
            return type("Result", (), {"exited": 0})()

    sent = []
    monkeypatch.setattr(connect, "run_channel", lambda transport, command, timeout, *a: sent.append(command) or ("1\n", "", 0))
    with bind(c).runner(nodes=[node], persist=False) as r:
        conn = Conn()
        r.ssh.connections[node.name] = conn
        assert r.stream(node, "docker logs -f x") == 0
        assert conn.ran == [become.command("docker logs -f x")]
        conn.client = type("Client", (), {"get_transport": lambda self: None})()
        assert r.ssh._reap(conn) == "sent SIGTERM to its processes on the host"
        assert sent == [become.command(connect.REAP_AS_ROOT, '"$PPID" "$$"')]
    with bind(becoming(c, on=False)).runner(nodes=[node], persist=False) as r:
        r.ssh.connections[node.name] = conn
        r.ssh._reap(conn)
        assert sent[-1] == connect.REAP_SCRIPT


def test_a_refusal_fails_the_step_in_words_before_its_parser_and_exec_says_it_as_stderr(monkeypatch):
    c = becoming(load_cluster("a3"), user=None)
    node = c.nodes[1]
    parsed = []
    with bind(c).runner(nodes=c.nodes[:2], persist=False) as r:
        monkeypatch.setattr(r, "_exec", lambda n, *a, **k: ("", "sudo: a password is required\n", 1, None) if n is node else ("x", "", 0, None))
        res = r.run(Step(name="facts", build=lambda n: "x", parse=lambda n, o, e, code: parsed.append(n.name) or HostResult(n.name)))
        assert res[node.name].status == FAILED and res[node.name].exit_code == 1
        assert res[node.name].msg.startswith(f"sudo asks for a password on node {node.name}: ssh.become needs NOPASSWD sudo")
        assert parsed == [c.nodes[0].name]  # the parser read the node where the command ran, and only it
        assert r.exec(node, "x") == ("", res[node.name].msg, 1)
    # without become the same output is the command's own, read by the step's parser
    with bind(becoming(c, on=False)).runner(nodes=[node], persist=False) as r:
        monkeypatch.setattr(r, "_exec", lambda n, *a, **k: ("", "sudo: a password is required\n", 1, None))
        assert r.run(Step(name="s", build=lambda n: "x"))[node.name].msg == "sudo: a password is required"
        assert r.exec(node, "x") == ("", "sudo: a password is required\n", 1)


def test_invoke_check_goes_through_the_runner_under_become():
    c = load_cluster("a3")
    assert bind(c).launcher.outside_ssh(c) is True and check.scheme(bind(c)) == "ssh"
    b = becoming(c)
    assert bind(b).launcher.outside_ssh(b) is False and check.scheme(bind(b)) == "runner"


# --- the inventory --------------------------------------------------------------------------
def test_become_is_off_by_default_and_survives_the_holders_round_trip():
    c = load_cluster("a3")
    assert c.ssh.become is False
    b = becoming(c)
    assert Cluster.model_validate_json(b.model_dump_json()).ssh.become is True


def test_a_slurm_cluster_with_become_is_refused_naming_the_field(tmp_path):
    code = ('from launchers.slurm.schema import Slurm\n'
            'extra = {"ssh": Ssh(user="alice", become=True), "slurm": Slurm(login="login0", partition="npu")}')
    with pytest.raises(InventoryError) as exc:
        load_cluster_file(_module(tmp_path, "slurm_become", code))
    text = str(exc.value)
    assert "ssh.become" in text and "not with slurm" in text and "srun would run every step as root" in text
    # the same cluster without become loads; an SSH cluster with it loads
    load_cluster_file(_module(tmp_path, "slurm_plain", code.replace("become=True", "become=False")))
    ok = load_cluster_file(_module(tmp_path, "ssh_become", 'extra = {"ssh": Ssh(user="alice", become=True)}'))
    assert ok.ssh.become is True and json.loads(ok.model_dump_json())["ssh"]["become"] is True
