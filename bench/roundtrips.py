"""Remote commands and file transfers per host, for each operation on sim-a3.

Counted by the runner (llmdeploy.runner.COUNTS) over every connection the
operation opens, its deploy lock's included: SSH connections, remote commands
(one session channel each), transfers (a command with file content on its
standard input) and forwarded HTTP requests (readiness and smoke probes,
direct-tcpip channels). The operations run in this process, in order, on a
freshly brought-up sim-a3: facts, prepare (fresh: the image is pulled, the
files written), prepare again (already prepared: nothing to change),
verify-comm, deploy.

Usage (root): .venv/bin/python bench/roundtrips.py
Last line: one JSON object keyed by operation:
{"facts": {"commands_per_host": {"max": .., "node0": .., "workers_max": ..}, "transfers_per_host": {...}, ...}, ...}
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import simhosts  # noqa: E402

from flows import app, lifecycle  # noqa: E402
from llmdeploy import report  # noqa: E402
from llmdeploy.inventory import load_cluster  # noqa: E402
from llmdeploy.runner import COUNTS  # noqa: E402
from sim import cluster as simc  # noqa: E402
from flows.binding import bind  # noqa: E402

CLUSTER = "sim-a3"
KINDS = ["commands", "transfers", "connections", "forwards"]


def counted(fn) -> dict:
    COUNTS.reset()
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.redirect_stderr(io.StringIO()):
        status = fn()
    if status != 0:
        raise SystemExit(f"failed ({status}):\n{out.getvalue()[-3000:]}")
    return {h: dict(v) for h, v in COUNTS.by_host.items()}


def summary(cluster, per_host: dict) -> dict:
    node0 = cluster.nodes[0].name
    out = {}
    for kind in KINDS:
        vals = {h: per_host.get(h, {}).get(kind, 0) for h in (n.name for n in cluster.nodes)}
        workers = [v for h, v in vals.items() if h != node0]
        out[f"{kind}_per_host"] = {"max": max(vals.values()), "node0": vals[node0], "workers_max": max(workers) if workers else 0}
    return out


def main() -> int:
    simhosts.need_root()
    cluster = load_cluster(CLUSTER)
    ops = [
        ("facts", lambda: app.facts(CLUSTER, json_out=True)),
        ("prepare_fresh", lambda: app.prepare(CLUSTER, json_out=True, run_checks=False)),
        ("prepare_prepared", lambda: app.prepare(CLUSTER, json_out=True, run_checks=False)),
        ("verify_comm", lambda: app.verify_comm(CLUSTER, json_out=True)),
        ("deploy", lambda: app.deploy(CLUSTER, json_out=True)),
    ]
    results = {}
    simc.up(cluster, echo=lambda *_: None)
    try:
        for name, fn in ops:
            results[name] = summary(cluster, counted(fn))
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            lifecycle.stop(bind(cluster), report.console(False), None, 0)
    finally:
        simc.down(CLUSTER, echo=lambda *_: None)
    print(f"{'operation':18} " + " ".join(f"{k + ' (node0/workers)':>26}" for k in KINDS))
    for name, r in results.items():
        print(f"{name:18} " + " ".join(f"{str(r[k + '_per_host']['node0']) + ' / ' + str(r[k + '_per_host']['workers_max']):>26}" for k in KINDS))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
