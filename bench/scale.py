"""facts, a no-op prepare and verify-comm on 4, 16 and 64 simulated nodes.

The clusters have sim-a2's shape (8 NPUs per node on their own RoCE planes;
DP = nodes, TP 8), written by bench/simhosts.py. Each command runs as a user
runs it (``invoke facts --cluster sim-a2-n64 --json``, a new process); the
prepare is timed on nodes already prepared (nothing to change). Several runs
per cell, medians. Also printed: remote commands per host of facts and the
no-op prepare, how long sim.up took, and the CPU time of the tool's own
process (on a real cluster each node runs its share on its own CPUs; here all
64 simulated nodes share this machine's, so the wall time also grows with
their work).

Usage (root): .venv/bin/python bench/scale.py [--sizes 4,16,64] [--runs 3]
Last line: one JSON object {"n": {"4": {"facts_s": .., "prepare_noop_s": .., "verify_comm_s": .., ...}, ...},
"facts_64_over_4": .., "prepare_noop_64_over_4": .., "verify_comm_64_over_4": ..}
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import simhosts  # noqa: E402


def run_json(*args: str, check: bool = True) -> tuple[float, dict, float]:
    """(wall seconds, the command's JSON, the CPU seconds the tool's own process used)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = simhosts.invoke(*args, check=check)
    took = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    start = res.stdout.find("{")
    return took, json.loads(res.stdout[start:]) if start >= 0 else {}, cpu


def measure(n: int, runs: int) -> dict:
    name = simhosts.scaled("sim-a2", n)
    t0 = time.perf_counter()
    with simhosts.cluster_up(name):
        up = time.perf_counter() - t0
        simhosts.invoke("prepare", "--cluster", name, "--no-check")
        cells: dict[str, list[float]] = {k: [] for k in ("facts_s", "prepare_noop_s", "verify_comm_s",
                                                           "facts_tool_cpu_s", "prepare_noop_tool_cpu_s", "verify_comm_tool_cpu_s")}
        trips = {}
        for r in range(runs):
            took, doc, cpu = run_json("facts", "--cluster", name, "--json")
            cells["facts_s"].append(took)
            cells["facts_tool_cpu_s"].append(cpu)
            trips["facts_commands_per_host"] = max(doc["round_trips"].values())
            took, doc, cpu = run_json("prepare", "--cluster", name, "--no-check", "--json")
            if doc.get("changed"):
                raise SystemExit(f"prepare on {name} changed {doc['changed']} (expected a no-op)")
            cells["prepare_noop_s"].append(took)
            cells["prepare_noop_tool_cpu_s"].append(cpu)
            trips["prepare_noop_commands_per_host"] = max(doc["round_trips"].values())
            took, doc, cpu = run_json("verify-comm", "--cluster", name, "--json", check=False)
            if not doc.get("ok"):
                # measured all the same, and said: a failed check is not a fast one
                failed = (doc.get("links") or {}).get("failed", []) + (doc.get("host_links") or {}).get("failed", [])
                trips["verify_comm_failed"] = f"{len(failed)} failed pairs, e.g. {failed[0].get('reason') if failed else doc}"[:300]
                print(f"  n={n}: verify-comm failed: {trips['verify_comm_failed']}", file=sys.stderr)
            cells["verify_comm_s"].append(took)
            cells["verify_comm_tool_cpu_s"].append(cpu)
            print(f"  n={n} round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in cells.items()), file=sys.stderr)
    return {**{k: round(simhosts.median(v), 3) for k, v in cells.items()}, **trips, "sim_up_s": round(up, 1)}


def main() -> int:
    ap = argparse.ArgumentParser(description="facts, no-op prepare, verify-comm at 4/16/64 simulated nodes")
    ap.add_argument("--sizes", default="4,16,64")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    simhosts.need_root()
    sizes = [int(x) for x in args.sizes.split(",")]
    cells = {str(n): measure(n, args.runs) for n in sizes}
    print(f"{'nodes':>5} {'facts':>7} {'prepare (no-op)':>16} {'verify-comm':>12} {'tool CPU facts, prepare':>24} {'cmds/host facts, prepare':>25} {'sim.up':>7}")
    for n in sizes:
        c = cells[str(n)]
        print(f"{n:>5} {c['facts_s']:>7.2f} {c['prepare_noop_s']:>16.2f} {c['verify_comm_s']:>12.2f} "
              f"{c['facts_tool_cpu_s']:>12.2f}, {c['prepare_noop_tool_cpu_s']:>9.2f} "
              f"{str(c['facts_commands_per_host']) + ', ' + str(c['prepare_noop_commands_per_host']):>25} {c['sim_up_s']:>7.1f}")

    def ratio(k):
        a, b = cells.get("64", {}).get(k), cells.get("4", {}).get(k)
        return round(a / b, 3) if a and b else None

    print(json.dumps({"n": cells, "facts_64_over_4": ratio("facts_s"), "prepare_noop_64_over_4": ratio("prepare_noop_s"),
                      "verify_comm_64_over_4": ratio("verify_comm_s"),
                      # the tool's own CPU (the invoke process): what grows on the laptop, apart from the simulated nodes' work
                      "facts_tool_cpu_64_over_4": ratio("facts_tool_cpu_s"), "prepare_noop_tool_cpu_64_over_4": ratio("prepare_noop_tool_cpu_s")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
