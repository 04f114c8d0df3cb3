"""How OpenMPI's ``mpirun`` on node 0 reaches the other nodes, in one place
for every MPI world the tool starts: the serving worlds (trtllm-serve,
Dynamo's workers, through the release's launch agent ``mpi-agent.sh``) and
verify-comm's ``all_reduce_perf`` (straight onto the hosts).

- Every daemon (``orted``) is started from node 0 over SSH
  (``plm_rsh_no_tree_spawn``): only node 0 needs SSH to the others.
- SSH runs with the cluster's launch settings as node 0 sees them: the
  ssh_config named by ``profile.launch_ssh_config`` (a path on node 0; else
  root's own), ``BatchMode`` (no prompt can hang a launch) and
  ``StrictHostKeyChecking=yes`` (an unknown or changed host key fails the
  launch instead of being accepted).
- OpenMPI's own TCP (its out-of-band channel and the byte-transfer layer) is
  kept on the serving NICs.
- ``ssh.become`` changes nothing here: mpirun runs as root on node 0 (in
  node 0's container, which root's dockerd runs; verify-comm's under sudo,
  as every node command), so this SSH is root's own, node 0's ``/root/.ssh``
  or ``launch_ssh_config``, as with ``ssh.user="root"``. The operator's key
  and sudo stay on the operator's side of node 0: the nodes need root's key
  between them, and the user the launch logs in as (root unless the
  ssh_config names another) runs ``docker exec`` or the daemon there
  (``llmdeploy/become.py``).

Pure: values in, argument lists out.
"""

from __future__ import annotations

import shlex

from llmdeploy.inventory import Cluster
from roles import render

# ssh's options for every launch from node 0 (after -F <ssh_config>)
LAUNCH_SSH_OPTIONS = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes"]


def launch_ssh_args(ssh_config: str | None, keepalive_s: float = 0, keepalive_count: int = 3) -> list[str]:
    """ssh's arguments (before the host) for a launch from node 0; with
    ``keepalive_s`` (the inventory's ``ssh.keepalive_s``/``keepalive_count``)
    OpenSSH's ServerAlive*: a node cut off without a FIN ends its session
    (and mpirun's world) within that window instead of hanging."""
    alive = ["-o", f"ServerAliveInterval={keepalive_s:g}", "-o", f"ServerAliveCountMax={keepalive_count}"] if keepalive_s else []
    return (["-F", ssh_config] if ssh_config else []) + LAUNCH_SSH_OPTIONS + alive


def launch_agent_args(agent: str) -> list[str]:
    """mpirun reaches the other nodes through ``agent`` (a program called as
    ``agent <host> <orted command ...>``: ``ssh``, or a launch agent script);
    every daemon is started from the launch node (only it needs SSH to the
    others). OpenMPI's daemons check the agent's path too: it is on every node."""
    return ["--mca", "plm_rsh_agent", agent, "--mca", "plm_rsh_no_tree_spawn", "1"]


def launch_agent(cluster: Cluster, names: list[str], ssh_config: str | None, release: str = "", container: str | None = None) -> str:
    """The launch agent of an MPI world over the nodes ``names``: mpirun
    gives it a node's serving IP (its hostfile or ``-H`` entry), it maps the
    IP to the node's SSH host (the node's name, a Host the launch ssh_config
    knows) and runs the command there over ssh with :func:`launch_ssh_args`:
    inside that node's ``container`` (the serving worlds), or on the host
    (verify-comm). So no node name has to resolve for OpenMPI, and OpenMPI
    takes the entry that is one of its own addresses for the launch node
    (checked with OpenMPI 4.1). Every value is quoted."""
    targets = [(str(cluster.node(name).ip), name) for name in names]
    return render("mpi-agent.sh.j2", release=release, cluster=cluster.name, container=container or "", targets=targets,
                  ssh_args=shlex.join(launch_ssh_args(ssh_config, cluster.ssh.keepalive_s, cluster.ssh.keepalive_count)))


def tcp_if_args(nic_list: str) -> list[str]:
    """OpenMPI's own TCP traffic (daemons, byte transfer) on the serving NICs only."""
    return ["--mca", "oob_tcp_if_include", nic_list, "--mca", "btl_tcp_if_include", nic_list]


def nics(cluster: Cluster, names: list[str]) -> str:
    """The serving NICs of these nodes, each once (OpenMPI's *_if_include: a
    node uses the ones it has)."""
    out: list[str] = []
    for name in names:
        nic = cluster.node(name).nic
        assert nic is not None  # the inventory's validation gives every node one
        if nic not in out:
            out.append(nic)
    return ",".join(out)
