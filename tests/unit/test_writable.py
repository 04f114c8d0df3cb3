"""prepare's check that the user the tool runs as can write where it writes (roles/files writable_step)."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from llmdeploy.inventory import Node
from roles import files


def _as_a_user(script: str) -> subprocess.CompletedProcess:
    """``script`` as an ordinary user (uid 2300: this suite may run as root, whom every folder lets write)."""
    argv = ["sh", "-c", script]
    if os.getuid() == 0:
        argv = ["setpriv", "--reuid", "2300", "--regid", "2300", "--clear-groups", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


@pytest.fixture
def tmp_path():
    """A folder the other user can reach (pytest's own is under a 0700 /tmp/pytest-of-<user>)."""
    d = Path(tempfile.mkdtemp(prefix="llmdeploy-writable-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _cluster(tmp_path, **dirs):
    base = dict(base_dir=str(tmp_path / "mine/lib"), etc_dir=str(tmp_path / "mine/etc"), log_dir=str(tmp_path / "mine/log"))
    return SimpleNamespace(**{**base, **dirs})


def test_folders_the_user_can_make_pass_and_nothing_is_made(tmp_path):
    (tmp_path / "mine").mkdir(mode=0o700)
    os.chown(tmp_path / "mine", 2300, 2300) if os.getuid() == 0 else None
    res = _as_a_user(files.writable_script(_cluster(tmp_path)))
    assert res.returncode == 0 and res.stdout == "", res.stdout + res.stderr
    assert list((tmp_path / "mine").iterdir()) == []  # a check: nothing made


def test_each_folder_the_user_cannot_write_is_named_with_its_field(tmp_path):
    (tmp_path / "root-only").mkdir(mode=0o755)
    (tmp_path / "afile").write_text("")
    c = _cluster(tmp_path, base_dir=str(tmp_path / "root-only/lib"), etc_dir=str(tmp_path / "root-only"), log_dir=str(tmp_path / "afile"))
    if os.getuid() != 0:
        os.chmod(tmp_path / "root-only", 0o555)
    res = _as_a_user(files.writable_script(c))
    assert res.returncode == 0  # the facts script's probe too: the lines say it
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"base_dir: {tmp_path}/root-only/lib cannot be made by ") and f"({tmp_path}/root-only is not writable by them)" in lines[0]
    assert lines[1].startswith(f"etc_dir: {tmp_path}/root-only is not writable by ")
    assert lines[2] == f"log_dir: {tmp_path}/afile is not a folder"
    step = files.writable_step(SimpleNamespace(cluster=c))
    r = step.parse(Node(name="n0", ip="10.0.0.1"), res.stdout, res.stderr, res.returncode)
    assert r.failed and step.decide is not None and r.msg.startswith("base_dir: ") and "; etc_dir: " in r.msg and r.msg.endswith("to folders this user can write, or run as one who can")


def test_a_path_with_shell_syntax_is_quoted():
    c = SimpleNamespace(base_dir="/var/lib/llm deploy", etc_dir="/etc/x", log_dir="/var/log/x")
    assert "llw base_dir '/var/lib/llm deploy'; llo base_dir '/var/lib/llm deploy'\n" in files.writable_script(c)


def test_a_folder_another_user_made_first_is_named(tmp_path):
    """In a folder every user can write (/var/tmp), another user may make the tool's folder first: refused."""
    if os.getuid() != 0:
        pytest.skip("needs root to make a folder of another user")
    theirs = tmp_path / "llmdeploy-ops"
    theirs.mkdir(mode=0o777)
    os.chmod(theirs, 0o777)
    os.chown(theirs, 2301, 2301)
    res = _as_a_user(files.writable_script(_cluster(tmp_path, base_dir=str(theirs / "lib"), etc_dir=str(theirs / "etc"), log_dir=str(theirs / "log"))))
    lines = res.stdout.splitlines()
    assert len(lines) == 3 and all(f"{theirs} belongs to uid 2301, not to 2300: another user made it" in line for line in lines), lines
    os.chown(theirs, 2300, 2300)
    res = _as_a_user(files.writable_script(_cluster(tmp_path, base_dir=str(theirs / "lib"), etc_dir=str(theirs / "etc"), log_dir=str(theirs / "log"))))
    assert res.stdout.splitlines() == [f"{f}: {theirs} can be written by every user (mode 777): chmod o-w it" for f in ("base_dir", "etc_dir", "log_dir")]
    os.chmod(theirs, 0o700)
    res = _as_a_user(files.writable_script(_cluster(tmp_path, base_dir=str(theirs / "lib"), etc_dir=str(theirs / "etc"), log_dir=str(theirs / "log"))))
    assert res.stdout == ""
