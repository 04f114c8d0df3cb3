"""Test helpers around the binding (``flows.binding``): a flow asks its
cluster's :class:`~llmdeploy.deployment.Deployment` for a runner
(``dep.runner(...)``); these give it a stand-in instead, called as the flows
used to call ``Runner`` (the cluster, then what the flow passed)."""

from __future__ import annotations

from typing import Any, Callable
from unittest import mock

from llmdeploy.deployment import Deployment


def runner_method(factory: Callable[..., Any]) -> Callable[..., Any]:
    """A ``Deployment.runner`` that returns ``factory(cluster, **what the flow passed)``."""

    def runner(self: Deployment, nodes=None, **kw: Any) -> Any:
        return factory(self.cluster, **({"nodes": nodes} if nodes is not None else {}), **kw)

    return runner


def runners(factory: Callable[..., Any]):
    """``mock.patch`` of ``Deployment.runner`` with :func:`runner_method` (a context manager)."""
    return mock.patch.object(Deployment, "runner", runner_method(factory))
