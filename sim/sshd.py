"""The real sshd of a simulated host (and of a Slurm cluster's login host),
and the client side the tool uses: one ``Host`` block of the cluster's
ssh_config and one known_hosts line per host."""

from __future__ import annotations

from pathlib import Path

SSHD = "/usr/sbin/sshd"


def sshd_config(listen: list[str], hdir: Path, cdir: Path, env: dict[str, str], deny_from: list[str] = ()) -> str:
    """sshd's configuration: listening on ``listen`` (addresses, port 22),
    its host key and pid file in the host's directory ``hdir``, the cluster's
    one client key; ``env`` is set for every session (SetEnv). ``deny_from``:
    addresses no one logs in from (``DenyUsers *@ADDR``, sshd_config(5):
    USER@HOST patterns match the client's address): a Slurm compute node
    refuses the other compute nodes, as a site without pam_slurm_adopt does
    (its clients see "Permission denied (publickey)")."""
    return "\n".join(
        [
            *([f"DenyUsers {' '.join('*@' + ip for ip in deny_from)}"] if deny_from else []),
            *[f"ListenAddress {ip}:22" for ip in listen],
            f"HostKey {hdir / 'ssh_host_ed25519_key'}",
            f"PidFile {hdir / 'sshd.pid'}",
            f"AuthorizedKeysFile {cdir / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "MaxStartups 200:30:400",
            "MaxSessions 200",
            "UseDNS no",
            "PrintMotd no",
            # as on a real node (Ansible's and pyinfra's file transfers use it; this tool does not)
            "Subsystem sftp internal-sftp",
            "SetEnv " + " ".join(f"{k}={v}" for k, v in env.items()),
            "",
        ]
    )


def client_entry(name: str, ip: str, cdir: Path) -> str:
    """The ssh_config block that names a simulated host (the cluster's key and known_hosts)."""
    return "\n".join(
        [
            f"Host {name}",
            f"    HostName {ip}",
            "    User root",
            f"    IdentityFile {cdir / 'id_ed25519'}",
            f"    UserKnownHostsFile {cdir / 'known_hosts'}",
            "    StrictHostKeyChecking yes",
            "",
        ]
    )


def known_host(name: str, ip: str, hdir: Path) -> str:
    """The known_hosts line of a host whose key is in ``hdir``."""
    pub = (hdir / "ssh_host_ed25519_key.pub").read_text().split()
    return f"{name},{ip} {pub[0]} {pub[1]}"
