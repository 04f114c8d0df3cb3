"""Flows: what the Invoke tasks run. Each loads a cluster, runs role steps or
a release plan on the nodes through the one runner, and reports:
``app`` (the task bodies), ``plan`` (playbooks of role steps: facts,
prepare), ``verify`` (verify-comm), ``check`` (node acceptance tests),
``deploy`` and ``ops`` (releases, rollback, status, stop, restart, the lock)
on the deploy ``engine`` (starter, watcher, ordered stop) with its
readiness ``probes``.

Layers, each importing only those below it: ``llmdeploy`` (the core:
inventory, runner, report, releases, lock, logs, the release-plan model) <-
``roles`` (pure builders and parsers) <- ``systems`` (one plan builder per
serving system) <- ``flows`` <- ``tasks.py``.
"""
