"""Which files an inventory's SSH settings point at (no SSH library needed):
the known_hosts that host keys are checked against, and the ssh_config."""

from __future__ import annotations

import os
from typing import Any

from llmdeploy.errors import InventoryError
from llmdeploy.inventory import Cluster


def known_hosts_files(cluster: Cluster, ssh_config: dict[str, Any]) -> list[str]:
    """Where host keys are checked: the inventory's known_hosts, else the
    ssh_config's UserKnownHostsFile for the host, else ~/.ssh/known_hosts."""
    if cluster.ssh.known_hosts:
        return [cluster.ssh.known_hosts]
    files = ssh_config.get("userknownhostsfile")
    if files:
        if isinstance(files, str):
            files = files.split()
        return [os.path.expanduser(f) for f in files]
    return [os.path.expanduser("~/.ssh/known_hosts")]


def check_ssh_config(cluster: Cluster) -> None:
    """An inventory's ssh_config file must exist (a clear error before any connection)."""
    ssh = cluster.ssh
    if ssh.config_file and not os.path.isfile(os.path.expanduser(ssh.config_file)):
        hint = f" (is the simulated cluster up? invoke sim.up --cluster {cluster.name})" if cluster.name.startswith("sim-") else ""
        raise InventoryError(f"cluster {cluster.name}", [f"ssh.config_file: {ssh.config_file} does not exist{hint}"])
