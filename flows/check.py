"""``invoke check``: the node acceptance tests (``tests/node``) run with
pytest-testinfra against the cluster's hosts.

How testinfra reaches a node is the cluster's launcher's choice
(``LauncherPlugin.outside_ssh``):

- over SSH of its own (the default launcher): testinfra's ssh backend drives
  the ``ssh`` binary. It gets an ssh_config written here from the
  inventory's own SSH settings (user, port, key, known_hosts, jump host;
  values the inventory leaves unset are resolved from its ssh_config the way
  the runner resolves them), with host-key checking on and one shared master
  connection per host;
- through the tool's runner (a launcher whose nodes admit no outside SSH:
  Slurm's, whose commands are job steps from the login host; the default
  launcher's with ``ssh.become``, whose commands run under sudo): the
  ``runner://`` backend (``flows/checkhost.py``), each command
  ``Runner.exec`` on the node. What the launcher holds for the command (an
  allocation) is held here, around the whole run, and handed to the pytest
  processes in their environment (``LauncherPlugin.handoff``).

Hosts run in parallel through pytest-xdist. The result is read back from
pytest's JUnit XML, per host (the tests' ids name the scheme: ``[ssh://node]``,
``[runner://node]``).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import paramiko
from rich.console import Console
from rich.markup import escape

from flows.checkhost import CLUSTER_ENV
from flows.checkhost import SCHEME as RUNNER
from flows.plan import select_nodes
from llmdeploy import interrupt, report
from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster, Node
from llmdeploy.errors import UnreachableError
from llmdeploy.runner import Runner
from transports.ssh.sshfiles import known_hosts_files

REPO = Path(__file__).resolve().parent.parent
NODE_TESTS = REPO / "tests" / "node"
# testinfra's own ssh backend (the ``ssh`` binary)
SSH = "ssh"
# at most this many pytest-xdist workers (one per host below it)
MAX_WORKERS = 8


def scheme(dep: Deployment) -> str:
    """The testinfra connection check uses on the cluster: ``ssh`` when its
    launcher lets an SSH client of its own log in to the nodes, else the tool's runner."""
    return SSH if dep.launcher.outside_ssh(dep.cluster) else RUNNER


def _user_ssh_config(cluster: Cluster) -> paramiko.SSHConfig:
    path = cluster.ssh.config_file or os.path.expanduser("~/.ssh/config")
    return paramiko.SSHConfig.from_path(path) if os.path.exists(path) else paramiko.SSHConfig()


def ssh_config_text(cluster: Cluster, nodes: list[Node], control_dir: str) -> str:
    """An ssh_config with one ``Host <node name>`` block per node. Pure apart
    from reading the inventory's ssh_config file."""
    user_cfg = _user_ssh_config(cluster)
    ssh = cluster.ssh
    blocks = ["# written by llmdeploy check from the inventory; used with ssh -F"]
    for node in nodes:
        found = user_cfg.lookup(node.address)
        identities = [ssh.identity_file] if ssh.identity_file else list(found.get("identityfile", []))
        lines = [
            f"Host {node.name}",
            f"    HostName {found.get('hostname', node.address)}",
            f"    Port {node.ssh_port or ssh.port or found.get('port', 22)}",
            f"    User {ssh.user or found.get('user') or getpass.getuser()}",
            *[f"    IdentityFile {os.path.expanduser(i)}" for i in identities],
            *(["    IdentitiesOnly yes"] if ssh.identity_file else []),
            f"    UserKnownHostsFile {' '.join(known_hosts_files(cluster, found))}",
            "    StrictHostKeyChecking yes",
            "    BatchMode yes",
            f"    ConnectTimeout {int(max(1, ssh.connect_timeout))}",
            # ssh.keepalive_s/keepalive_count, in OpenSSH's whole seconds (0: off)
            f"    ServerAliveInterval {max(1, round(ssh.keepalive_s)) if ssh.keepalive_s > 0 else 0}",
            f"    ServerAliveCountMax {ssh.keepalive_count}",
            "    ControlMaster auto",
            f"    ControlPath {control_dir}/%C",
            "    ControlPersist 60",
        ]
        jump = ssh.jump_host or found.get("proxyjump")
        if jump:
            lines.append(f"    ProxyJump {jump}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def pytest_command(dep: Deployment, nodes: list[Node], junit: str, ssh_config: str | None = None, select: str | None = None) -> list[str]:
    """pytest over ``nodes`` with the cluster's connection (``scheme``); ``ssh_config``: the one ``ssh_config_text`` wrote, for ``ssh``."""
    connection = scheme(dep)
    cmd = [
        sys.executable, "-m", "pytest", str(NODE_TESTS),
        "-p", "no:cacheprovider", "-q", "--tb=line", "--no-header",
        f"--hosts={','.join(f'{connection}://{n.name}' for n in nodes)}",
    ]
    if connection == SSH:
        if ssh_config is None:
            raise ValueError("testinfra's ssh backend needs the ssh_config check writes")
        cmd.append(f"--ssh-config={ssh_config}")
    cmd.append(f"--junitxml={junit}")
    if len(nodes) > 1:
        cmd += ["-n", str(min(len(nodes), MAX_WORKERS))]
    if select:
        cmd += ["-k", select]
    return cmd


def parse_junit(path: str, hosts: list[str], connection: str = SSH) -> dict[str, dict]:
    """Per host: passed, failed [(test, message)], skipped; ``connection``: the
    scheme in the tests' ids (``test_x[<connection>://<host>]``)."""
    out: dict[str, dict[str, Any]] = {h: {"passed": 0, "failed": [], "skipped": 0} for h in hosts}
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = case.get("name", "")
        m = re.search(rf"\[{re.escape(connection)}://(.+?)\]$", name)
        host = m.group(1) if m else None
        if host not in out:
            host = next((h for h in hosts if f"{connection}://{h}" in name), None)
        if host is None:
            continue
        test = name.split("[", 1)[0]
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        if bad is not None:
            msg = (bad.get("message") or bad.text or "").strip().splitlines()
            out[host]["failed"].append((test, msg[0] if msg else "failed"))
        elif case.find("skipped") is not None:
            out[host]["skipped"] += 1
        else:
            out[host]["passed"] += 1
    return out


def run(dep: Deployment, limit: str | None = None, con: Console | None = None, quiet: bool = False, select: str | None = None) -> int:
    """Run the node tests; print pytest's summary per host; 0 only when all passed."""
    con = con or report.console()
    nodes = select_nodes(dep.cluster, limit)
    # what the cluster's launcher holds on the nodes while the tests run (an allocation, say), handed to pytest's processes
    try:
        with dep.launcher.handoff(dep.cluster, nodes) as handed:
            return _run(dep, nodes, con, quiet, select, handed)
    except UnreachableError as exc:
        con.print(f"[bold red]check failed to run[/]: {escape(str(exc))}")
        return 1


def run_pytest(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """pytest as a child, its output captured, waited for in slices: a
    SIGTERM sent to this process alone ends pytest too (a Ctrl-C from the
    terminal reaches both)."""
    with subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL) as p:
        while True:
            try:
                out, err = p.communicate(timeout=interrupt.SLICE_S)
                return subprocess.CompletedProcess(argv, p.returncode, out, err)
            except subprocess.TimeoutExpired:
                pass
            try:
                interrupt.check()
            except KeyboardInterrupt:
                p.terminate()
                p.communicate()
                raise


def _pytest(dep: Deployment, nodes: list[Node], tmp: str, junit: str, select: str | None, env: dict[str, str]) -> subprocess.CompletedProcess:
    """pytest in a subprocess, over the ssh_config written into ``tmp`` (its
    master connections closed after it) or through the runner."""
    cluster = dep.cluster

    def pytest(ssh_config: str | None = None) -> subprocess.CompletedProcess:
        return run_pytest(pytest_command(dep, nodes, junit, ssh_config, select), env)

    if scheme(dep) != SSH:
        return pytest()
    control = os.path.join(tmp, "cm")
    os.mkdir(control, 0o700)
    cfg = os.path.join(tmp, "ssh_config")
    Path(cfg).write_text(ssh_config_text(cluster, nodes, control))
    try:
        return pytest(cfg)
    finally:
        # close the shared master connections (ControlPersist) now
        for n in nodes:
            subprocess.run(["ssh", "-F", cfg, "-O", "exit", n.name], capture_output=True, stdin=subprocess.DEVNULL)


def _run(dep: Deployment, nodes: list[Node], con: Console, quiet: bool, select: str | None, handed: dict[str, str]) -> int:
    cluster = dep.cluster
    with tempfile.TemporaryDirectory(prefix="llmdeploy-check-") as tmp:
        junit = os.path.join(tmp, "junit.xml")
        env = dict(os.environ, **handed, **{CLUSTER_ENV: cluster.name, "PYTHONPATH": str(REPO)})
        proc = _pytest(dep, nodes, tmp, junit, select, env)
        if not os.path.exists(junit):
            con.print(f"[bold red]check failed to run[/] (pytest exit {proc.returncode}):\n{escape(proc.stdout[-2000:])}{escape(proc.stderr[-2000:])}")
            return 1
        per_host = parse_junit(junit, [n.name for n in nodes], scheme(dep))
    failed_any = proc.returncode != 0
    if not quiet:
        rows = []
        for host, r in per_host.items():
            fails = "\n".join(f"[red]{t}[/]: {escape(m)[:160]}" for t, m in r["failed"])
            state = "[bold red]FAILED[/]" if r["failed"] else ("[green]passed[/]" if r["passed"] else "[yellow]no tests ran[/]")
            rows.append([host, state, str(r["passed"]), str(len(r["failed"])), str(r["skipped"]), fails or "-"])
        con.print(report.table(f"check: {cluster.name} (pytest-testinfra, tests/node)", ["host", "result", "passed", "failed", "skipped", "failures"], rows))
        last = [ln for ln in proc.stdout.strip().splitlines() if ln.strip()]
        if last:
            con.print(escape(last[-1]))
    if any(not r["passed"] and not r["failed"] for r in per_host.values()):
        failed_any = True
    failed_any = not site(dep, nodes, con, quiet) or failed_any
    return 1 if failed_any or any(r["failed"] for r in per_host.values()) else 0


def _serving_image(cluster: Cluster, runner: Runner, node: Node) -> str | None:
    """What the units run, as ``node``'s prepare record names it (the same path on every node; None: no record)."""
    from roles.files import read_script
    from roles.record import prepared_path

    out, _, code = runner.exec(node, read_script(prepared_path(cluster)))
    try:
        doc = json.loads(out) if code == 0 and out.strip() else {}
    except ValueError:
        doc = {}
    ref = (doc.get("image") or {}).get("serving_ref") if isinstance(doc, dict) else None
    return ref if isinstance(ref, str) and ref else None


def site(dep: Deployment, nodes: list[Node], con: Console, quiet: bool) -> bool:
    """What the cluster's launcher asks of its site (``Launcher.site_checks``:
    a Slurm site's PMIx, memlock), a line each; True when nothing failed."""
    cluster = dep.cluster
    # not through a connection holder: a launcher without site checks sends nothing at all
    with dep.runner(nodes=nodes, persist=False) as runner:
        units = dep.units(runner, lambda _: None)
        try:
            # the image is read from the node only when the launcher asks for it
            found = units.site_checks(nodes, lambda: _serving_image(cluster, runner, nodes[0]) if nodes else None)
        except UnreachableError as exc:
            found = [("the site's checks", str(exc))]
    if found and not quiet:
        rows = [[what, "[bold red]FAILED[/]" if problem else "[green]ok[/]", escape(problem or "-")] for what, problem in found]
        con.print(report.table(f"site: {cluster.name} (what the units need of it)", ["check", "result", "problem"], rows))
    return not any(problem for _, problem in found)
