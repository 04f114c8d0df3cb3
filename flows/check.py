"""``invoke check``: the node acceptance tests (``tests/node``) run with
pytest-testinfra against the cluster's hosts.

testinfra's ssh backend drives the ``ssh`` binary. It gets an ssh_config
written here from the inventory's own SSH settings (user, port, key,
known_hosts, jump host; values the inventory leaves unset are resolved from
its ssh_config the way the runner resolves them), with host-key checking on
and one shared master connection per host. Hosts run in parallel through
pytest-xdist. The result is read back from pytest's JUnit XML, per host.
"""

from __future__ import annotations

import getpass
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import paramiko
from rich.console import Console
from rich.markup import escape

from flows.plan import select_nodes
from llmdeploy import launcher, report
from llmdeploy.inventory import Cluster, Node
from llmdeploy.sshfiles import known_hosts_files

REPO = Path(__file__).resolve().parent.parent
NODE_TESTS = REPO / "tests" / "node"


def _user_ssh_config(cluster: Cluster) -> paramiko.SSHConfig:
    path = cluster.ssh.config_file or os.path.expanduser("~/.ssh/config")
    return paramiko.SSHConfig.from_path(path) if os.path.exists(path) else paramiko.SSHConfig()


def ssh_config_text(cluster: Cluster, nodes: list[Node], control_dir: str) -> str:
    """An ssh_config with one ``Host <node name>`` block per node. Pure apart
    from reading the inventory's ssh_config file."""
    user_cfg = _user_ssh_config(cluster)
    ssh = cluster.ssh
    blocks = ["# written by llmdeploy check from the inventory; used with ssh -F"]
    # the nodes through the host the cluster's launcher reaches them through, if any
    # (a login host that admits the owner of a job on the node: check holds one meanwhile)
    login = launcher.of(cluster).gateway(cluster)
    for node in ([login] if login is not None else []) + list(nodes):
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
        if login is not None and node is not login:
            jump = login.name
        if jump:
            lines.append(f"    ProxyJump {jump}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def pytest_command(cluster: Cluster, nodes: list[Node], ssh_config: str, junit: str, select: str | None = None) -> list[str]:
    cmd = [
        sys.executable, "-m", "pytest", str(NODE_TESTS),
        "-p", "no:cacheprovider", "-q", "--tb=line", "--no-header",
        f"--hosts={','.join('ssh://' + n.name for n in nodes)}",
        f"--ssh-config={ssh_config}",
        f"--junitxml={junit}",
    ]
    if len(nodes) > 1:
        cmd += ["-n", str(min(len(nodes), 8))]
    if select:
        cmd += ["-k", select]
    return cmd


def parse_junit(path: str, hosts: list[str]) -> dict[str, dict]:
    """Per host: passed, failed [(test, message)], skipped."""
    out = {h: {"passed": 0, "failed": [], "skipped": 0} for h in hosts}
    root = ET.parse(path).getroot()
    for case in root.iter("testcase"):
        name = case.get("name", "")
        m = re.search(r"\[ssh://(.+?)\]$", name)
        host = m.group(1) if m else None
        if host not in out:
            host = next((h for h in hosts if f"ssh://{h}" in name), None)
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


def run(cluster: Cluster, limit: str | None = None, con: Console | None = None, quiet: bool = False, select: str | None = None) -> int:
    """Run the node tests; print pytest's summary per host; 0 only when all passed."""
    con = con or report.console()
    nodes = select_nodes(cluster, limit)
    # what the cluster's launcher holds while the tests log in (an allocation of the nodes, say)
    with launcher.of(cluster).admitted(cluster, nodes):
        return _run(cluster, nodes, con, quiet, select)


def _run(cluster: Cluster, nodes: list[Node], con: Console, quiet: bool, select: str | None) -> int:
    with tempfile.TemporaryDirectory(prefix="llmdeploy-check-") as tmp:
        control = os.path.join(tmp, "cm")
        os.mkdir(control, 0o700)
        cfg = os.path.join(tmp, "ssh_config")
        Path(cfg).write_text(ssh_config_text(cluster, nodes, control))
        junit = os.path.join(tmp, "junit.xml")
        env = dict(os.environ, LLMDEPLOY_NODE_TESTS=cluster.name, PYTHONPATH=str(REPO))
        try:
            proc = subprocess.run(
                pytest_command(cluster, nodes, cfg, junit, select),
                cwd=REPO, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
            )
        finally:
            # close the shared master connections (ControlPersist) now
            gateway = launcher.of(cluster).gateway(cluster)
            for n in nodes + ([gateway] if gateway is not None else []):
                subprocess.run(["ssh", "-F", cfg, "-O", "exit", n.name], capture_output=True, stdin=subprocess.DEVNULL)
        if not os.path.exists(junit):
            con.print(f"[bold red]check failed to run[/] (pytest exit {proc.returncode}):\n{escape(proc.stdout[-2000:])}{escape(proc.stderr[-2000:])}")
            return 1
        per_host = parse_junit(junit, [n.name for n in nodes])
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
    return 1 if failed_any or any(r["failed"] for r in per_host.values()) else 0
