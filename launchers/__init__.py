"""Launchers as plug-ins: each is a module or package ``launchers/<name>``
behind the interface ``llmdeploy.launcher`` declares (the runner's transport:
how a command reaches a node; the engine's launcher: how a release's units
start, are watched and stop; see docs/launchers.md).

Registering one is one line in ``LAUNCHERS`` below: the launcher and the
inventory section that picks it (a cluster that sets the section runs on
it); the one with no section is the default. The core reads this registry to
pick a cluster's launcher and loads that launcher only; nothing here imports
one, and nothing outside this package does (import-linter's ``launchers``
contract).

Layer: beside ``platforms/`` (import-linter's layers: ``platforms | launchers``), above the core;
a launcher imports only ``llmdeploy``.
"""

# launcher -> the inventory section (a field of ``Cluster``) that picks it; None: the default
LAUNCHERS: dict[str, str | None] = {
    "ssh": None,
    "slurm": "slurm",
}
