"""The reads of a release's nodes that commands repeat: status's, top's and
the engine's watcher's, each a :class:`~llmdeploy.runner.Step` built here
and only here, so that the command each one sends to a node is the same
text wherever it is made.

They are ``standing`` steps: once a release is held, the engine hands them
to the cluster's launcher (``Launcher.serve_reads``), which may keep one
long-lived reader of them running and answer a later read of the same name
and byte-identical command from what that reader read a few seconds before,
instead of a command per read (on Slurm, a job step each: Slurm ends a job
at MaxStepCount). A launcher that keeps none runs them as any step.
"""

from __future__ import annotations

from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster
from llmdeploy.releaseplan import ReleasePlan, Unit
from llmdeploy.runner import Step
from roles.status import current_script


def current_read(cluster: Cluster) -> Step:
    """The current release of a node, its record and plan (``roles.status.current_script``): what top and deploy read of node 0 first."""
    return Step(name="current", build=lambda n: current_script(cluster), standing=True)


def status_read(dep: Deployment) -> Step:
    """``invoke status``'s read of each node (the runtime's ``status_script``, ``roles/runtime``)."""
    rt = dep.runtime
    return Step(name="status", build=lambda n: rt.status_script(), standing=True)


def top_read(dep: Deployment, plan: ReleasePlan | None, timeout: float | None = None) -> Step:
    """``invoke top``'s read of each node (the runtime's ``top_script``, with the
    platform's query of its devices); the node of the plan's metrics page reads it too."""
    m = plan.metrics if plan else None
    target = (m.probe.ip, m.probe.port, m.probe.path) if m else None
    rt, accel = dep.runtime, dep.vendor.TOP_QUERY
    return Step(name="top", build=lambda n: rt.top_script(accel, target if m and n.name == m.probe.host else None),
                timeout=timeout, standing=True)


def watch_read(dep: Deployment, units: list[Unit]) -> Step:
    """The watcher's read of its units' states on each of their nodes (the runtime's ``states_script``)."""
    by_host: dict[str, list[str]] = {}
    for u in units:
        by_host.setdefault(u.host, []).append(u.container)
    rt = dep.runtime
    return Step(name="watch", build=lambda n: rt.states_script(by_host[n.name]) if n.name in by_host else None, standing=True)


def standing(dep: Deployment, plan: ReleasePlan) -> list[Step]:
    """What a release's reader reads: the current release, status's, top's and the watcher's reads of every unit."""
    return [current_read(dep.cluster), status_read(dep), top_read(dep, plan), watch_read(dep, plan.units())]
