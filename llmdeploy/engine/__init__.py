"""The deploy engine: one way to start, watch, restart and stop every serving system.

- :mod:`.model`: a release plan as data (services, units, probes), pure and
  serialisable: it is written into every release (``plan.json``) so that
  rollback, status, stop and restart read it back from the nodes;
- :mod:`.probes`: readiness probes (port open; HTTP status and body) through
  the SSH connection;
- :mod:`.run`: the starter, the watcher and the ordered stop.

A serving system (``llmdeploy.systems``) is a pure function from the
inventory (and prepare's records) to a plan; the engine knows no system by name.
"""
