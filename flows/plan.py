"""Plays: which role steps run on which hosts, in what order.

A playbook (``playbooks/<name>.yaml``) is a list of plays::

    - name: gather facts
      hosts: all            # all | node0 | workers
      steps: [facts.gather] # <role>.<step>; the role module's STEPS maps step -> factory
      any_errors_fatal: false        # a failure on any host stops the playbook
      continue_after_failure: false  # true: a host that fails a step still runs
                                     # the play's other steps (checks: report
                                     # every problem); it leaves after the play

A host that failed is left out of every later play (and, unless the play
continues after failures, of the play's later steps): nothing is changed on
a node whose checks failed. A step factory takes the :class:`Context` and
returns a runner Step; steps read what earlier steps found through it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmdeploy import playbook
from llmdeploy.errors import LlmdeployError
from llmdeploy.playbook import PLAYBOOK_DIR, select_nodes  # noqa: F401 (the flows select hosts here)
from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster
from llmdeploy.runner import HostResult, Step



@dataclass
class Play:
    name: str
    hosts: str
    steps: list[str]
    any_errors_fatal: bool = False
    continue_after_failure: bool = False


@dataclass
class Context:
    """What a step factory gets: the cluster's deployment (the cluster and its
    plug-ins), the run's options, and the results of the steps that ran
    before it (by step name, then host)."""

    dep: Deployment
    check: bool = False
    diff: bool = False
    results: dict[str, dict[str, HostResult]] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def cluster(self) -> Cluster:
        return self.dep.cluster

    def probe(self, ref: str, host: str) -> str | None:
        """What step ``ref``'s probe printed on ``host`` in the facts script
        (``facts.inspect``), when it ran and exited 0; else None."""
        probes = (self.data("facts", host) or {}).get("probes") or {}
        text, rc = probes.get(ref, (None, None))
        return text if rc == 0 else None

    def data(self, step: str, host: str) -> Any:
        """``data`` of an earlier step's result on ``host`` (None if it did not run)."""
        r = self.results.get(step, {}).get(host)
        return r.data if r is not None else None


def load_playbook(name: str, directory: Path | None = None) -> list[Play]:
    path = (directory or PLAYBOOK_DIR) / f"{name}.yaml"
    data = playbook.load(name, directory)
    plays = []
    for i, p in enumerate(data or []):
        try:
            plays.append(
                Play(
                    name=p["name"],
                    hosts=p.get("hosts", "all"),
                    steps=list(p["steps"]),
                    any_errors_fatal=bool(p.get("any_errors_fatal", False)),
                    continue_after_failure=bool(p.get("continue_after_failure", False)),
                )
            )
        except (KeyError, TypeError) as exc:
            raise LlmdeployError(f"{path}: play {i}: missing or bad {exc}") from None
    return plays


def resolve_step(ref: str, ctx: Context) -> Step:
    role, _, step = ref.partition(".")
    try:
        module = importlib.import_module(f"roles.{role}")
        factory = module.STEPS[step]
    except (ImportError, KeyError, AttributeError):
        raise LlmdeployError(f"unknown step {ref!r} (expected <role>.<step> from roles/)") from None
    return factory(ctx)
