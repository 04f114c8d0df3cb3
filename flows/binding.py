"""The binder: a cluster's inventory -> its :class:`~llmdeploy.deployment.Deployment`,
once per command. The one place that looks a cluster's plug-ins up (its
serving system, its platform's vendor, its launcher and the launcher's unit
runtime, else Docker's). Whether they fit together the inventory's
validation has said already (``llmdeploy.deployment``). Everything below
takes the Deployment it builds.
"""

from __future__ import annotations

from pathlib import Path

from llmdeploy import launcher, platform
from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster, load_cluster
from roles.runtime import Docker
import systems


def bind(cluster: Cluster) -> Deployment:
    """``cluster`` bound to its plug-ins; LlmdeployError naming the axis when one is not registered."""
    system = systems.system(cluster.profile.kind)
    vendor = platform.vendor(platform.vendor_name(cluster.platform))
    plugin = launcher.plugin(launcher.name_of(cluster))
    return Deployment(cluster=cluster, system=system, vendor=vendor, launcher=plugin,
                      runtime=plugin.runtime(cluster) or Docker(cluster))


def load(name: str, directory: Path | None = None) -> Deployment:
    """``inventory/<name>.py`` loaded, validated and bound (InventoryError, LlmdeployError)."""
    return bind(load_cluster(name, directory))

