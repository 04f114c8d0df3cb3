"""The SSH connector (``llmdeploy.launcher.Connector``), shared by the launchers.

- ``session.py``: a runner's SSH session (``SshSession``): a Fabric
  connection per host, opened once and reused, each command on its own
  channel with a deadline, the clean-up after a deadline, or the commands
  through the connection holder;
- ``connect.py``: the connections (host keys checked, the inventory's
  ssh_config and jump host), one command on a channel, every failure in words;
- ``sshtransport.py``: the transport under them (no Nagle, quick ACKs,
  keepalives that notice a dead peer);
- ``mux.py`` and ``hold.py``: ``ssh.persist_s``, the connection holder that
  keeps a cluster's connections between commands (``python -m
  transports.ssh.hold``);
- ``sshfiles.py``: which known_hosts and ssh_config an inventory's SSH
  settings point at (no SSH library needed).

Importing this package or its session loads no SSH library: paramiko and
Fabric are loaded when a session connects itself (not when its commands go
through a holder).
"""
