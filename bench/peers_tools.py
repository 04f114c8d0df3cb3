"""The two peers of ``bench/peers.py``: Ansible and pyinfra, installed and driven.

Each peer runs the same small job as our runner on N hosts: make
``<remote_dir>`` (0755), copy ``payload.bin`` (0644), render ``job.env.j2``
to ``job.env`` (0644; ``host`` = inventory name, ``index`` = 0-based position
in the host list, ``peers`` = number of hosts), then five commands, one
task/operation each: ``hostname``, ``uname -r``, ``sha256sum payload.bin``,
``grep -c = job.env``, ``df -Pk <remote_dir>``.

Installation: ``venv(tool)`` makes ``bench/.venv-<tool>`` (not tracked, never
the project's ``.venv``) with the pinned version (``ANSIBLE``, ``PYINFRA``)
and returns its bin directory; a marker file written last says it is whole.

How each peer is configured, and why (a fair comparison is each tool in its
documented fast configuration, on its own defaults otherwise):

Ansible (``ansible(...)``): the speed settings its docs recommend: ``forks``
= number of hosts (every host at once, as our runner and pyinfra do),
``pipelining = True`` (module code goes through the SSH session's stdin:
no temporary module files and their extra round trips per task), OpenSSH multiplexing with
``ControlMaster=auto``/``ControlPersist=60s`` (one TCP+SSH handshake per host
per run; ``ansible_reset`` closes the masters so each measured run is a cold
first run, like the other tools' fresh connections), and no fact gathering
(``gather_facts: false``; nothing in the job needs facts). Strategy ``linear`` (the default: every host finishes
a task before the next, as pyinfra does by default). Python on the hosts is
found by Ansible's default discovery (``interpreter_python = auto_silent``:
one extra command per host per run, as a user without an inventory-pinned
interpreter pays). The five commands are ``ansible.builtin.command`` with
``changed_when: false`` (they change nothing, so the recap's ``changed=``
counts only the directory and the two files: a second run shows
``changed=0``). Host keys: ``host_key_checking = True`` and
``StrictHostKeyChecking=yes`` against the given known_hosts only;
``BatchMode=yes`` so that nothing can ever prompt. Everything Ansible writes
locally (``HOME``, ``ANSIBLE_HOME``, ``ANSIBLE_LOCAL_TEMP``, the control
sockets) is inside ``workdir``; on the hosts its per-task temporary
directories (for the copy and the template) go beside ``remote_dir``, in
``<parent of remote_dir>/.bench-ansible-tmp`` (``remote_tmp``; private to
each simulated host), not in ``~/.ansible`` (this machine's, on the
simulated hosts).

pyinfra (``pyinfra(...)``): its defaults (paramiko, one connection per host,
the facts its operations need gathered on demand, every host done with an
operation before the next) plus ``--parallel N`` (all hosts at once) and
``--yes`` (execute without the change-detection pass and the "Press enter to
execute" prompt; without it pyinfra waits on stdin). Host keys:
``ssh_strict_host_key_checking="yes"`` (pyinfra's default is
``accept-new``) against ``ssh_known_hosts_file``.

File transfers: the simulated hosts' sshd serves SFTP (``internal-sftp``),
as a real node's does, and ``peers.py`` passes ``sftp=True``: both tools on
their defaults (Ansible ``smart``: sftp; pyinfra: SFTP). ``sftp=False`` is
for an sshd without SFTP: Ansible ``transfer_method = piped`` (``dd`` over the
multiplexed connection) and pyinfra ``ssh_file_transfer_protocol = "scp"``.
Our runner sends files on a command's stdin.

Both return ``(argv, env)``: run ``subprocess.run(argv, env=env, cwd=workdir,
stdin=subprocess.DEVNULL, capture_output=True, text=True)``. Both tools print
their per-task results to stdout and pyinfra logs to stderr, so hand
``stdout + stderr`` to ``parse_changes``.
"""

from __future__ import annotations

import fcntl
import json
import os
import posixpath
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ANSIBLE = "2.19.14"  # ansible-core
PYINFRA = "3.10.0"

BENCH = Path(__file__).resolve().parent
DEFAULT_REMOTE_DIR = "/var/lib/llmdeploy/bench-job"

_PACKAGES = {"ansible": ("ansible-core", ANSIBLE, "ansible-playbook"), "pyinfra": ("pyinfra", PYINFRA, "pyinfra")}
_MARKER = ".llmdeploy-bench-installed"

# Task/operation names, the same in both tools (parse_changes reports by them).
FILE_TASKS = ("job dir", "payload.bin", "job.env")
COMMANDS = (
    ("hostname", "hostname"),
    ("uname -r", "uname -r"),
    ("sha256sum", "sha256sum {d}/payload.bin"),
    ("grep -c", "grep -c = {d}/job.env"),
    ("df -Pk", "df -Pk {d}"),
)
COMMAND_TASKS = tuple(f"cmd {name}" for name, _ in COMMANDS)


# --------------------------------------------------------------------------- install


def venv(tool: str) -> Path:
    """``bench/.venv-<tool>`` with the pinned package; returns its bin directory.

    Idempotent: a marker file (written last) records the installed package
    and version; with it in place this returns at once. Without it (never
    made, a failed or interrupted install, another pin) the directory is
    made anew; a failed install removes it again and raises.
    """
    if tool not in _PACKAGES:
        raise ValueError(f"unknown tool {tool!r}: one of {sorted(_PACKAGES)}")
    package, version, exe = _PACKAGES[tool]
    want = f"{package}=={version}\n"
    root = BENCH / f".venv-{tool}"
    bin_dir = root / "bin"
    if _installed(root, want, exe):
        return bin_dir
    # one installer at a time (two benchmark processes, or two tools)
    lock = os.open(BENCH, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _installed(root, want, exe):
            return bin_dir
        shutil.rmtree(root, ignore_errors=True)
        try:
            _run([sys.executable, "-m", "venv", str(root)])
            _run(
                [str(bin_dir / "python"), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "-q", f"{package}=={version}"],
            )
            if not (bin_dir / exe).exists():
                raise RuntimeError(f"{package}=={version} installed no {exe} in {bin_dir}")
            tmp = root / (_MARKER + ".tmp")
            tmp.write_text(want)
            tmp.replace(root / _MARKER)
        except BaseException:
            shutil.rmtree(root, ignore_errors=True)
            raise
        return bin_dir
    finally:
        os.close(lock)


def _installed(root: Path, want: str, exe: str) -> bool:
    try:
        return (root / _MARKER).read_text() == want and (root / "bin" / exe).exists()
    except OSError:
        return False


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-20:])
        raise RuntimeError(f"{shlex.join(argv)} failed ({proc.returncode}):\n{tail}")


# --------------------------------------------------------------------------- hosts


@dataclass
class Hosts:
    """The hosts of one run, in order (``index`` is the position here)."""

    names: list[str]
    addresses: list[str]  # IP to connect to, one per name
    identity_file: str  # private key
    known_hosts: str  # OpenSSH known_hosts: ``name,ip keytype key`` (``[ip]:port`` off port 22)
    port: int | list[int] = 22  # one for all, or one per host
    user: str = "root"
    remote_dir: str = DEFAULT_REMOTE_DIR

    def __post_init__(self) -> None:
        if len(self.names) != len(self.addresses):
            raise ValueError("Hosts: names and addresses differ in length")
        if isinstance(self.port, list) and len(self.port) != len(self.names):
            raise ValueError("Hosts: one port per host, or one for all")
        if len(set(self.names)) != len(self.names):
            raise ValueError("Hosts: duplicate names")

    def ports(self) -> list[int]:
        return list(self.port) if isinstance(self.port, list) else [self.port] * len(self.names)


def _job_files(jobdir: Path) -> tuple[Path, Path]:
    jobdir = Path(jobdir).resolve()
    payload, template = jobdir / "payload.bin", jobdir / "job.env.j2"
    for f in (payload, template):
        if not f.is_file():
            raise FileNotFoundError(f)
    return payload, template


def _base_env(home: Path) -> dict[str, str]:
    """The caller's environment, for a run with no terminal and no stdin."""
    env = dict(os.environ)
    for k in list(env):
        # no agent (keys come from the inventory), no outside tool config
        if k == "SSH_AUTH_SOCK" or k.startswith(("ANSIBLE_", "PYINFRA_", "VIRTUAL_ENV", "PYTHON")):
            del env[k]
    home.mkdir(parents=True, exist_ok=True)
    env.update(HOME=str(home), LC_ALL="C.UTF-8", LANG="C.UTF-8", TERM="dumb")
    return env


# --------------------------------------------------------------------------- ansible


def ansible(workdir: Path, hosts: Hosts, jobdir: Path, *, sftp: bool = False) -> tuple[list[str], dict]:
    """Write inventory.yml, ansible.cfg and playbook.yml into ``workdir``;
    returns (argv, env) of the ``ansible-playbook`` run. ``sftp``: the hosts
    have an SFTP subsystem (then Ansible's default ``transfer_method =
    smart``; else ``piped``: files go through ``dd`` on the multiplexed
    connection)."""
    workdir = Path(workdir).resolve()
    payload, template = _job_files(jobdir)
    bin_dir = venv("ansible")
    n = len(hosts.names)
    cp_dir, local_tmp, home = workdir / "cp", workdir / "tmp", workdir / "home"
    # ssh's socket path: <dir>/<%C: 40 hex>.<16 random> must fit sun_path (108)
    if len(str(cp_dir)) > 49:
        raise ValueError(f"workdir {workdir} is too long for ssh control sockets (at most 46 characters)")
    workdir.mkdir(parents=True, exist_ok=True)
    for d in (cp_dir, local_tmp):
        d.mkdir(exist_ok=True)

    inventory = {
        "all": {
            "hosts": {
                name: {
                    "ansible_host": addr,
                    "ansible_port": port,
                    "ansible_user": hosts.user,
                    "ansible_ssh_private_key_file": str(Path(hosts.identity_file).resolve()),
                    "bench_index": i,
                }
                for i, (name, addr, port) in enumerate(zip(hosts.names, hosts.addresses, hosts.ports()))
            },
            "vars": {"bench_dir": hosts.remote_dir, "bench_peers": n},
        }
    }
    (workdir / "inventory.yml").write_text(yaml.safe_dump(inventory, sort_keys=False))

    ssh_args = shlex.join(
        [
            "-o",
            "ControlMaster=auto",
            "-o",
            "ControlPersist=60s",
            "-o",
            f"UserKnownHostsFile={Path(hosts.known_hosts).resolve()}",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            "BatchMode=yes",
        ]
    )
    # beside the job's directory (private to each simulated host), not in ~/.ansible
    remote_tmp = posixpath.join(posixpath.dirname(hosts.remote_dir.rstrip("/")) or "/", ".bench-ansible-tmp")
    cfg = f"""\
# written by bench/peers_tools.py
[defaults]
forks = {n}
host_key_checking = True
retry_files_enabled = False
gathering = explicit
interpreter_python = auto_silent
local_tmp = {local_tmp}
remote_tmp = {remote_tmp}
nocows = True

[ssh_connection]
pipelining = True
ssh_args = {ssh_args}
control_path_dir = {cp_dir}
transfer_method = {'smart' if sftp else 'piped'}
"""
    (workdir / "ansible.cfg").write_text(cfg)

    d = "{{ bench_dir }}"
    tasks: list[dict] = [
        {"name": FILE_TASKS[0], "ansible.builtin.file": {"path": d, "state": "directory", "mode": "0755"}},
        {"name": FILE_TASKS[1], "ansible.builtin.copy": {"src": str(payload), "dest": f"{d}/payload.bin", "mode": "0644"}},
        {
            "name": FILE_TASKS[2],
            "ansible.builtin.template": {"src": str(template), "dest": f"{d}/job.env", "mode": "0644"},
            "vars": {"host": "{{ inventory_hostname }}", "index": "{{ bench_index }}", "peers": "{{ bench_peers }}"},
        },
    ]
    for (name, cmd), task in zip(COMMANDS, COMMAND_TASKS):
        tasks.append({"name": task, "ansible.builtin.command": cmd.format(d=d), "changed_when": False})
    play = [{"name": "bench job", "hosts": "all", "gather_facts": False, "tasks": tasks}]
    (workdir / "playbook.yml").write_text(yaml.safe_dump(play, sort_keys=False))

    env = _base_env(home)
    env.update(
        ANSIBLE_CONFIG=str(workdir / "ansible.cfg"),
        ANSIBLE_HOME=str(home / ".ansible"),
        ANSIBLE_LOCAL_TEMP=str(local_tmp),
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
    )
    argv = [str(bin_dir / "ansible-playbook"), "-i", str(workdir / "inventory.yml"), str(workdir / "playbook.yml")]
    return argv, env


def ansible_reset(workdir: Path) -> None:
    """Close the SSH ControlPersist masters a previous ansible run left in
    ``workdir``'s control_path_dir and remove their sockets (none: no-op)."""
    cp_dir = Path(workdir).resolve() / "cp"
    if not cp_dir.is_dir():
        return
    for sock in cp_dir.iterdir():
        if not sock.is_socket():
            continue
        try:
            subprocess.run(
                ["ssh", "-O", "exit", "-o", f"ControlPath={sock}", "-F", "/dev/null", "bench-reset"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=10,
            )
        except subprocess.TimeoutExpired:
            pass
        sock.unlink(missing_ok=True)


# --------------------------------------------------------------------------- pyinfra


def pyinfra(workdir: Path, hosts: Hosts, jobdir: Path, *, sftp: bool = False) -> tuple[list[str], dict]:
    """Write inventory.py and deploy.py into ``workdir``; returns (argv, env)
    of the ``pyinfra`` run. ``sftp``: the hosts have an SFTP subsystem (then
    pyinfra's default ``ssh_file_transfer_protocol = "sftp"``; else
    ``"scp"``: its own scp client runs ``scp -t`` on the host)."""
    workdir = Path(workdir).resolve()
    payload, template = _job_files(jobdir)
    bin_dir = venv("pyinfra")
    n = len(hosts.names)
    workdir.mkdir(parents=True, exist_ok=True)
    home = workdir / "home"

    rows = []
    for i, (name, addr, port) in enumerate(zip(hosts.names, hosts.addresses, hosts.ports())):
        data = {
            # the SSH connector's data keys (pyinfra/connectors/ssh.py, ConnectorData)
            "ssh_hostname": addr,
            "ssh_port": port,
            "ssh_user": hosts.user,
            "ssh_key": str(Path(hosts.identity_file).resolve()),
            "ssh_known_hosts_file": str(Path(hosts.known_hosts).resolve()),
            "ssh_strict_host_key_checking": "yes",
            "ssh_file_transfer_protocol": "sftp" if sftp else "scp",
            "bench_index": i,
        }
        rows.append(f"    ({name!r}, {data!r}),")
    (workdir / "inventory.py").write_text("# written by bench/peers_tools.py\nhosts = [\n" + "\n".join(rows) + "\n]\n")

    commands = "\n".join(f"server.shell(name={task!r}, commands=[{cmd.format(d=hosts.remote_dir)!r}])" for (_, cmd), task in zip(COMMANDS, COMMAND_TASKS))
    deploy = f"""\
# written by bench/peers_tools.py
from pyinfra import host
from pyinfra.operations import files, server

d = {hosts.remote_dir!r}
files.directory(name={FILE_TASKS[0]!r}, path=d, mode="755")
files.put(name={FILE_TASKS[1]!r}, src={str(payload)!r}, dest=d + "/payload.bin", mode="644")
files.template(
    name={FILE_TASKS[2]!r},
    src={str(template)!r},
    dest=d + "/job.env",
    mode="644",
    host=host.name,
    index=host.data.bench_index,
    peers={n},
)
{commands}
"""
    (workdir / "deploy.py").write_text(deploy)

    env = _base_env(home)
    env["PYINFRA_PROGRESS"] = "off"
    argv = [
        str(bin_dir / "pyinfra"),
        "--yes",
        "--parallel",
        str(n),
        str(workdir / "inventory.py"),
        str(workdir / "deploy.py"),
    ]
    return argv, env


# --------------------------------------------------------------------------- results


def parse_changes(tool: str, stdout: str) -> dict:
    """What a run reported, from its output (give it stdout + stderr: pyinfra
    logs to stderr).

    Returns ``{"tasks": {name: {"changed": k, "unchanged": k, "failed": k}},
    "files_changed": changes to the directory and the two files (summed over
    hosts), "failed": host-tasks that failed, "unreachable": hosts not
    connected, "recap": {host: {ok, changed, unreachable, failed, ...}}
    (ansible's PLAY RECAP; {} for pyinfra)}``. A second run with nothing to
    do has ``files_changed == 0`` and every task counted on every host.
    The five commands count as changed in pyinfra's results whatever they do
    (each ran a command: "Success"); Ansible's are ``changed_when: false``
    ("ok"). Check the return code too: a run that dies early prints no table.
    """
    text = _strip_ansi(stdout)
    if tool == "ansible":
        tasks, recap = _parse_ansible(text)
        unreachable = sum(1 for h in recap.values() if h.get("unreachable"))
    elif tool == "pyinfra":
        tasks, recap = _parse_pyinfra(text), {}
        unreachable = len(set(re.findall(r"^\s*\[(\S+)\] (?:SSH error|Could not|Authentication error|EOF error)", text, re.M)))
    else:
        raise ValueError(f"unknown tool {tool!r}")
    return {
        "tasks": tasks,
        "files_changed": sum(tasks.get(t, {}).get("changed", 0) for t in FILE_TASKS),
        "failed": sum(t["failed"] for t in tasks.values()),
        "unreachable": unreachable,
        "recap": recap,
    }


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


def _parse_ansible(text: str) -> tuple[dict, dict]:
    tasks: dict[str, dict[str, int]] = {}
    recap: dict[str, dict[str, int]] = {}
    current = None
    in_recap = False
    for line in text.splitlines():
        if m := re.match(r"TASK \[(.*)\] \*+", line):
            current = tasks.setdefault(m.group(1), {"changed": 0, "unchanged": 0, "failed": 0})
            continue
        if line.startswith("PLAY RECAP"):
            in_recap, current = True, None
            continue
        if in_recap:
            if m := re.match(r"(\S+)\s+:\s+(.*)$", line):
                recap[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
            continue
        if current is None:
            continue
        if line.startswith("changed: ["):
            current["changed"] += 1
        elif line.startswith("ok: ["):
            current["unchanged"] += 1
        elif line.startswith(("fatal: [", "failed: [")) and "UNREACHABLE!" not in line:
            current["failed"] += 1
    return tasks, recap


def _parse_pyinfra(text: str) -> dict:
    """The results table: ``Operation  Hosts  Success  Error  No Change``
    (Success = ran commands, i.e. changed)."""
    tasks: dict[str, dict[str, int]] = {}
    names = FILE_TASKS + COMMAND_TASKS
    in_results = False
    for line in text.splitlines():
        if "--> Results:" in line:
            in_results = True
            continue
        if not in_results:
            continue
        line = line.strip()
        for name in names:
            if line.startswith(name) and (m := re.match(r"(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$", line[len(name) :].strip())):
                num = [0 if v == "-" else int(v) for v in m.groups()]
                tasks[name] = {"changed": num[1], "unchanged": num[3], "failed": num[2]}
                break
    return tasks


if __name__ == "__main__":  # install both: python bench/peers_tools.py
    for t in _PACKAGES:
        print(t, venv(t))
    print(json.dumps({"ansible-core": ANSIBLE, "pyinfra": PYINFRA}))
