"""How `facts` time grows with the number of hosts, on the simulated A2 cluster.

Prints ratios measured in one run (this machine is noisy; compare ratios,
not seconds): time for all 8 hosts over time for 1 host, and remote round
trips per host. With the hosts in parallel the ratio stays well below 8.
Needs root (the simulated cluster). Usage: .venv/bin/python bench/facts_scaling.py
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402

from flows.app import run_playbook  # noqa: E402
from llmdeploy.inventory import load_cluster  # noqa: E402
from sim import cluster as simc  # noqa: E402
from flows.binding import bind  # noqa: E402


def timed(cluster, limit, con, repeat=3):
    best = None
    trips = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        recap, _, trips = run_playbook(bind(cluster), "facts", limit, con, show_progress=False)
        dt = time.perf_counter() - t0
        assert not any(c["failed"] or c["unreachable"] for c in recap.values()), recap
        best = dt if best is None else min(best, dt)
    return best, trips


def main() -> int:
    cluster = load_cluster("sim-a2")
    con = Console(stderr=True)
    simc.up(cluster, echo=lambda *_: None)
    try:
        one, _ = timed(cluster, cluster.nodes[0].name, con)
        all_, trips = timed(cluster, None, con)
    finally:
        simc.down(cluster.name, echo=lambda *_: None)
    n = len(cluster.nodes)
    print(f"facts, {n} hosts vs 1 host: {all_ / one:.2f}x the time (serial would be {n}x)")
    print(f"remote round trips per host: {max(trips.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
