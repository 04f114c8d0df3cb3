"""Transports: how the tool's commands reach a host, shared by the launchers
(issue 44). ``transports/ssh``: the SSH connector, as pyinfra keeps SSH in a
connector of its own; the SSH launcher reaches every node with it and the
Slurm launcher its login host, so SSH is a transport the launchers share and
no part of one of them.

Layer: between the launchers and the core (import-linter's layers:
``platforms | launchers`` > ``transports`` > ``llmdeploy``). A transport
implements an interface the core declares (``llmdeploy.launcher.Connector``)
and imports only ``llmdeploy``; the core never imports it: a launcher's
transport makes the runner's (``Transport.connector``). Only the launchers
import a transport, and the flows that need an SSH function of their own
(import-linter's ``transports`` contract).
"""
