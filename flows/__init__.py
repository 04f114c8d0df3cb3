"""Flows: what the Invoke tasks run. Each loads a cluster, runs role steps or
a release plan on the nodes through the one runner, and reports:
``app`` (facts, prepare, check, deploy, verify-comm), ``plan`` (playbooks
of role steps: facts, prepare), ``verify`` (verify-comm), ``check`` (node
acceptance tests), ``deploy``; on a running cluster ``releases`` (the
ledger, a release's plan read back from the nodes, audit, the lock),
``status``, ``lifecycle`` (stop, restart, rollback) and ``serving_logs``;
all on the deploy ``engine`` (starter, watcher, ordered stop) with its
readiness ``probes``; ``demo`` runs the main job end to end. No flow
imports the simulator: tasks.py calls it.

Layers, each importing only those below it: ``llmdeploy`` (the core:
inventory, runner, report, releases, lock, logs, the release-plan model) <-
``roles`` (pure builders and parsers) <- ``systems`` (one plan builder per
serving system) <- ``flows`` <- ``tasks.py``.
"""
