"""``ssh.become``: every command the tool runs on an SSH node, run as root through sudo.

An operator who logs in as themselves (``ssh.user``) gets each node command
run by ``sudo -n -H -u root -- /bin/bash -c '<command>'`` (:func:`command`):
``-n`` never prompts (sudo fails at once where it would want a password),
``-H`` gives the command root's HOME, ``-u root`` names the target whatever
the sudoers' ``runas_default``, and the command reaches bash as one quoted
argument, so its standard input (a file's content, a secret) is the
command's own and its exit status is sudo's. bash, not ``/bin/sh``: a root
login runs the commands with root's shell, bash, and so does Slurm's
transport; Debian's ``/bin/sh`` (dash) reads some of them otherwise (its
``kill`` takes no ``--``, which the runner's clean-up after a deadline
uses). Before the command, ``PATH`` gets the ``/usr/local`` directories a
root login over SSH has and sudo's ``secure_path`` may lack (RHEL and
openEuler leave them out; Ascend's ``npu-smi`` lives there).

The runner wraps in one place, ``Runner.wire``: every command it puts on an
SSH session channel goes through it (each step's and ``exec``'s, on the
runner's own connection or the connection holder's, whose runner is one too;
a followed log; the clean-up after a command's deadline: the runner's SSH
session, ``transports/ssh/session.py``, calls it for each). ``invoke check``'s
node tests then go through the runner as well (``launchers/ssh.outside_ssh``):
testinfra's own SSH client would log in and run them as the user.

When sudo refuses, its own words (sudo 1.9, ``plugins/sudoers/logging.c`` and
``sudoers.c``: ``sudo: a password is required`` under ``-n``, ``<user> is
not in the sudoers file.``, ``Sorry, user <user> may not run sudo on
<host>.``, ...; sudo-rs's ``sudo: interactive authentication is
required``, ...) are all the command printed: :func:`refusal` reads them
into one sentence that names the node and what its sudoers lacks, for every
step (``Runner.after``) and every ``Runner.exec``.

MPI worlds across nodes (trtllm-serve, Dynamo's workers, verify-comm's
all_reduce_perf): mpirun starts on node 0 as root (inside node 0's
container, which root's dockerd runs; or, for verify-comm, on the host
under sudo like every command) and reaches the other nodes over SSH
itself (``roles/mpi``). That hop is root's own: node 0's ``/root/.ssh``
(or ``profile.launch_ssh_config``) logs in to the others, as root unless
that ssh_config names another user, who then runs ``docker exec`` (or the
daemon) there. It is the same hop as with ``ssh.user="root"``; become does
not enter it (the operator's key and sudo are not on node 0), so the nodes
need root's key between them, as they do today.

Pure: values in, text out.

Why it is the core's and not the SSH transport's (``transports/ssh``): it
says what a node's command runs as and how sudo's refusal reads, not how a
command reaches the node. The runner reads sudo's refusal in every step's
result and every ``exec`` (``Runner.after``, ``Runner.exec``), whatever
carried the command, and the core imports no transport (import-linter's
layers); the SSH session, above the core, wraps what it puts on the wire
through the runner's one place for it, ``Runner.wire``, which calls this
module.
"""

from __future__ import annotations

import re
import shlex

# whom the commands run as
TARGET = "root"

# sudo's options: never prompt, the target's HOME, the target named, end of sudo's options
SUDO = ("sudo", "-n", "-H", "-u", TARGET, "--")
# what runs the command under sudo (root's login shell, which runs it on a root login)
SHELL = "/bin/bash"

# what a root login over SSH has on PATH and sudo's secure_path may not (RHEL, openEuler: /sbin:/bin:/usr/sbin:/usr/bin)
PATH_LINE = "PATH=/usr/local/sbin:/usr/local/bin:$PATH; export PATH\n"


def command(text: str, login_args: str = "") -> str:
    """What the node's login shell runs for ``text`` under ``ssh.become``:
    ``sudo -n -H -u root -- /bin/bash -c '<PATH_LINE><text>'``. ``login_args``:
    shell words the login shell expands before sudo runs (what only it knows:
    ``"$PPID"``, the sshd process that serves the connection), given to
    ``text`` as ``$1``, ``$2``, ... (``$0`` is ``bash``)."""
    line = f"{shlex.join(SUDO)} {SHELL} -c {shlex.quote(PATH_LINE + text)}"
    return f"{line} bash {login_args}" if login_args else line


# -- sudo's own refusals -----------------------------------------------------------------
# sudo's words (sudo 1.9.x, plugins/sudoers/logging.c, log_denial and log_auth_failure;
# sudoers.c for requiretty); "sudo: " is sudo_warnx's prefix. Before 1.9.10 the two
# "not ..." lines end in "  This incident will be reported." sudo-rs (Ubuntu's sudo since
# 25.10; src/common/error.rs) puts "sudo: " before each of its lines and words two its own way.
_PASSWORD = ("sudo: a password is required", "sudo: interactive authentication is required")
_TTY = "sudo: sorry, you must have a tty to run sudo"
_DENIED = (
    (re.compile(r"^(?P<user>\S+) is not in the sudoers file\."), "{user} is not in the sudoers file"),
    (re.compile(r"^(?P<user>\S+) is not allowed to run sudo on "), "{user} may not run sudo on it"),
    (re.compile(r"^(?:sudo: )?Sorry, user (?P<user>\S+) may not run sudo on "), "{user} may not run sudo on it"),
    (re.compile(r"^(?:sudo: )?Sorry, user (?P<user>\S+) is not allowed to execute "), f"{{user}} may not run {SHELL} as {TARGET} there"),
    (re.compile(r"^sudo: I'm sorry (?P<user>\S+)\. I'm afraid I can't do that"), "the sudoers do not let {user} run it"),
)
# the login shell's words for a missing sudo (bash, dash, zsh), exit 127
_MISSING = re.compile(r"(?:\bsudo: (?:command )?not found|command not found: sudo)$")


def _sudo_line(err: str) -> str | None:
    """sudo's first line that is not one of its warnings (``sudo: unable to
    resolve host ...``); None when something else spoke first (the command ran)."""
    for line in err.splitlines():
        line = line.strip()
        if not line:
            continue
        if line in (*_PASSWORD, _TTY) or any(rx.match(line) for rx, _ in _DENIED) or _MISSING.search(line):
            return line
        if not line.startswith("sudo: "):
            return None
    return None


def _needs(who: str | None) -> str:
    """What ssh.become needs of the node's sudoers, for ``who`` (None: the user SSH logs in as, unnamed)."""
    name = who or "USER"
    return f"ssh.become needs NOPASSWD sudo for {who or 'the user SSH logs in as'} there (sudoers(5): {name} ALL=({TARGET}) NOPASSWD: ALL)"


def refusal(node: str, user: str | None, out: str, err: str, code: int) -> str | None:
    """Why sudo did not run the command on ``node``, in one sentence with the
    fix (``user``: whom SSH logs in as, for when sudo does not name them;
    None: not known here); None when the command ran, whatever became of it.
    Only sudo's own refusal counts: exit 1 (127: no sudo at all), nothing on
    stdout, and sudo's words as the first line of stderr that is not one of
    sudo's warnings."""
    if code not in (1, 127) or out.strip():
        return None
    line = _sudo_line(err)
    if line is None:
        return None
    if code == 127:
        return f"no sudo on node {node} ({line}): ssh.become runs every command through sudo -n; install sudo there" if _MISSING.search(line) else None
    if line in _PASSWORD:
        return f"sudo asks for a password on node {node}: " + _needs(user)
    if line == _TTY:
        return (f"sudo on node {node} wants a terminal (sudoers' requiretty) and ssh.become runs without one: "
                f"set Defaults:{user or 'USER'} !requiretty in its sudoers (sudoers(5))")
    for rx, why in _DENIED:
        m = rx.match(line)
        if m:
            who = m.group("user")
            return f"sudo refuses {who} on node {node} ({why.format(user=who)}): " + _needs(who)
    return None
