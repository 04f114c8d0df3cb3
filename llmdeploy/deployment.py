"""One cluster bound to its plug-ins: a :class:`Deployment`, built once per
command (``flows.binding.bind``) and passed down.

A cluster's inventory picks one plug-in on each axis: its serving system (by
its profile's kind, ``systems/``), its platform's vendor (``platforms/``),
its launcher (``launchers/``: by the inventory section it sets) and, from the
launcher, the container runtime its units run in (Docker's, ``roles/runtime``,
or the launcher's own: pyxis steps). The flows, the engine and the roles take
the Deployment (or the one plug-in a pure builder needs, given by its caller)
instead of looking a plug-in up again at every use; the binder is the one
place that looks them up. Whether they fit together is said once, by the
inventory's validation when the cluster loads, before anything is bound
(``Cluster._derive_and_check``: the serving system's own checks of the
cluster and its platform, ``ServingProfile.problems``, and its launcher
section's rules, ``LauncherSection.settle``: the Slurm launcher's container
runtime for this platform and this system's worlds), each problem named with
its field.

Core: holds the interfaces only (imports nothing above ``llmdeploy``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:  # pragma: no cover - types only
    from .inventory import Cluster, Node
    from .launcher import Launcher, LauncherPlugin, UnitRuntime
    from .platform import Vendor
    from .runner import HostResult, Progress, Runner
    from .serving import System


@dataclass(frozen=True)
class Deployment:
    """``cluster`` with its serving ``system``, platform ``vendor``,
    ``launcher`` (the plug-in module) and unit ``runtime``, bound together."""

    cluster: Cluster
    system: System
    vendor: Vendor
    launcher: LauncherPlugin
    runtime: UnitRuntime

    def runner(
        self,
        nodes: list[Node] | None = None,
        forks: int | None = None,
        progress: Callable[[str, str, HostResult | None], None] | None = None,
        persist: bool = True,
        lines: Callable[[str, str, Progress], None] | None = None,
    ) -> Runner:
        """A runner over ``nodes`` (default: every node) through the launcher's transport."""
        from .runner import Runner

        return Runner(self.cluster, nodes=nodes, forks=forks, progress=progress, persist=persist, lines=lines,
                      transport=self.launcher.transport)

    def units(self, runner: Runner, say: Callable[[str], None]) -> Launcher:
        """The launcher's way of starting, watching and stopping the units (the engine's), over ``runner``."""
        return self.launcher.launcher(self.cluster, runner, say)
