"""The accounts of a simulated cluster's hosts: root and an ordinary
operator, as a site has them.

Every host (the nodes and a Slurm cluster's login host) sees the cluster's
own /etc/passwd, /etc/group, /etc/shadow and /etc/sudoers, bound over this
machine's in the host's mount namespace (this machine's own /etc is never
changed), and one /home shared by all of them, as a site's NFS home is:

- ``ops`` (uid 2300 on every host, as a directory service gives it): the
  operator who runs the tool on the Slurm sites (jobs, steps and pyxis
  containers run as this user) and logs in as themselves on an SSH cluster,
  where sudoers lets them become root without a password (``ssh.become``);
  a member of the ``docker`` group (a Docker cluster's units);
- ``opspw``: the same, but sudoers asks for their password (sudo -n then
  refuses: "a password is required").

Their shadow entries hold ``*``: no password can log in, and sshd (without
PAM) does not take the account for a locked one (a ``!`` would be;
sshd's auth.c allowed_user)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

OPERATOR = "ops"
# a node's own data disk (sim/paths.py PRIVATE_DIRS), where the operator keeps a model each node has a copy of
DATA = "/data"
OPERATOR_UID = 2300
# sudo asks this one for a password
PASSWORD_USER = "opspw"
PASSWORD_UID = 2301
USERS = ((OPERATOR, OPERATOR_UID), (PASSWORD_USER, PASSWORD_UID))
# the variables the simulated hosts' stand-ins read, kept by sudo's env_reset (sudoers(5) env_keep)
KEPT = ("LLMDEPLOY_SIM_HOST", "LLMDEPLOY_SIM_HOSTDIR", "SLURM_CONF")


def etc_dir(cdir: Path) -> Path:
    return cdir / "etc"


def home_dir(cdir: Path) -> Path:
    """The cluster's /home, shared by every host."""
    return cdir / "home"


def _read(path: str) -> str:
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return ""
    return text if text.endswith("\n") or not text else text + "\n"


def _others(base: str) -> list[str]:
    """The lines of an account file (passwd, group, shadow: ``name:...``) that are not the cluster's users'."""
    return [line + "\n" for line in base.splitlines() if line.split(":", 1)[0] not in dict(USERS)]


def passwd(base: str) -> str:
    """This machine's passwd (its system accounts) and the cluster's users."""
    return "".join(_others(base)) + "".join(f"{u}:x:{uid}:{uid}:llmdeploy simulated operator:/home/{u}:/bin/bash\n" for u, uid in USERS)


def group(base: str) -> str:
    """This machine's groups, the users' own, and both users in ``docker`` (the hosts' dockerd gives its socket to it)."""
    out = []
    for line in _others(base):
        parts = line.rstrip("\n").split(":")
        if parts[0] == "docker" and len(parts) == 4:
            members = [m for m in parts[3].split(",") if m and m not in dict(USERS)] + [u for u, _ in USERS]
            line = ":".join(parts[:3] + [",".join(members)]) + "\n"
        out.append(line)
    if not any(line.startswith("docker:") for line in out):
        out.append(f"docker:x:2399:{','.join(u for u, _ in USERS)}\n")
    return "".join(out) + "".join(f"{u}:x:{uid}:\n" for u, uid in USERS)


def shadow(base: str) -> str:
    return "".join(_others(base)) + "".join(f"{u}:*:20000:0:99999:7:::\n" for u, _ in USERS)


def sudoers() -> str:
    """sudoers(5): the operator becomes anyone without a password; the other one is asked for theirs."""
    return "\n".join([
        "# /etc/sudoers of a simulated host (sim/users.py)",
        "Defaults env_reset",
        # the host's PATH (its bin directory first: the stand-ins) and what its stand-ins read
        'Defaults env_keep += "PATH ' + " ".join(KEPT) + '"',
        "Defaults !lecture",
        "root ALL=(ALL:ALL) ALL",
        f"{OPERATOR} ALL=(ALL:ALL) NOPASSWD: ALL",
        f"{PASSWORD_USER} ALL=(ALL:ALL) ALL",
        "",
    ])


FILES = {"passwd": (passwd, "/etc/passwd", 0o644), "group": (group, "/etc/group", 0o644), "shadow": (shadow, "/etc/shadow", 0o640)}


def prepare(cdir: Path) -> None:
    """The cluster's account files and its shared /home (each user's folder theirs)."""
    etc = etc_dir(cdir)
    etc.mkdir(parents=True, exist_ok=True)
    for name, (render, path, mode) in FILES.items():
        _write(etc / name, render(_read(path)), mode)
    _write(etc / "sudoers", sudoers(), 0o440)
    for u, uid in USERS:
        home = home_dir(cdir) / u
        home.mkdir(parents=True, exist_ok=True)
        os.chown(home, uid, uid)
        os.chmod(home, 0o755)
    os.chmod(home_dir(cdir), 0o755)


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    tmp.replace(path)


def bind_lines(cdir: Path) -> list[str]:
    """Shell lines of a host's script (in its own mount namespace): the cluster's account files over this
    machine's, and the shared /home. /etc/sudoers only where sudo is installed (scripts/setup.sh)."""
    q = lambda p: shlex.quote(str(p))  # noqa: E731
    etc = etc_dir(cdir)
    lines = [f"if [ -e {path} ]; then mount --bind {q(etc / name)} {path}; fi" for name, (_, path, _) in FILES.items()]
    lines.append(f"if [ -f /etc/sudoers ]; then mount --bind {q(etc / 'sudoers')} /etc/sudoers; fi")
    lines.append(f"mount --bind {q(home_dir(cdir))} /home")
    return lines


def operator_tmp() -> str:
    """The operator's folder in a host's /var/tmp (the tool's per-user default on a Slurm cluster)."""
    return f"/var/tmp/llmdeploy-{OPERATOR}"


def private_dir(path: Path) -> None:
    """A folder that is the operator's alone, as ``mkdir`` by them makes it under their umask 077."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, OPERATOR_UID, OPERATOR_UID)
    os.chmod(path, 0o700)


def home_of(path: str | None) -> str | None:
    """The simulated user's home ``path`` is in (``/home/<user>``), or None."""
    for u, _ in USERS:
        if path and path.startswith(f"/home/{u}/"):
            return f"/home/{u}"
    return None


def give(top: Path, path: Path, uid: int) -> None:
    """``path``, what is in it and the folders between it and ``top`` belong to ``uid`` (as they would had they made them)."""
    for p in [path, *path.parents]:
        if p == top or top not in p.parents:
            break
        os.chown(p, uid, uid)
    for root, dirs, files in os.walk(path):
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, uid)


def open_to_all(path: Path) -> None:
    """``path`` and everything in it readable and writable by every user: the simulated hardware's state,
    which the stand-ins of root's and the operators' commands all write (not sticky: a stand-in replaces
    the files and links another user's made, fast.render's ``out``)."""
    os.chmod(path, 0o777)
    for root, dirs, files in os.walk(path):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o777)
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                os.chmod(p, os.stat(p).st_mode | 0o666)
