"""facts, a no-op prepare and verify-comm on 4, 16 and 64 simulated nodes.

The clusters have sim-a2's shape (8 NPUs per node on their own RoCE planes;
DP = nodes, TP 8), written by bench/simhosts.py. Each command runs as a user
runs it (``invoke facts --cluster sim-a2-n64 --json``, a new process); the
prepare is timed on nodes already prepared (nothing to change). Several runs
per cell, medians. Also printed: remote commands per host of facts and the
no-op prepare, how long sim.up took, the CPU time of the tool's own process,
and the CPU time everything else on the machine used meanwhile (the simulated
hosts' sshd sessions and scripts, from /proc/stat). On a real cluster each
node does its share on its own CPUs; here all 64 simulated nodes share this
machine's, so the wall time also grows with their work: the ``*_hosts_floor``
figures say how long that work alone takes on every CPU of this machine, over
the whole 4-node run (a 64/4 ratio cannot go below it here).

Usage (root): .venv/bin/python bench/scale.py [--sizes 4,16,64] [--runs 3]
Last line: one JSON object {"n": {"4": {"facts_s": .., "prepare_noop_s": .., "verify_comm_s": .., ...}, ...},
"facts_64_over_4": .., "prepare_noop_64_over_4": .., "verify_comm_64_over_4": ..,
"facts_tool_cpu_64_over_4": .., ..., "facts_hosts_floor_64_over_4": .., ...}
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import simhosts  # noqa: E402


def machine_busy() -> float:
    """CPU seconds this machine has been busy (every CPU, every process: /proc/stat)."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    # user nice system idle iowait irq softirq steal (guest is counted in user)
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def run_json(*args: str, check: bool = True) -> tuple[float, dict, float, float]:
    """(wall seconds, the command's JSON, the CPU seconds the tool's own process
    used, the CPU seconds everything else used meanwhile: the simulated hosts'
    sshd sessions and scripts, on an otherwise idle machine)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy = machine_busy()
    t0 = time.perf_counter()
    res = simhosts.invoke(*args, check=check)
    took = time.perf_counter() - t0
    busy = machine_busy() - busy
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    start = res.stdout.find("{")
    return took, json.loads(res.stdout[start:]) if start >= 0 else {}, cpu, max(0.0, busy - cpu)


def measure(n: int, runs: int) -> dict:
    name = simhosts.scaled("sim-a2", n)
    t0 = time.perf_counter()
    with simhosts.cluster_up(name):
        up = time.perf_counter() - t0
        simhosts.invoke("prepare", "--cluster", name, "--no-check")
        cells: dict[str, list[float]] = {k: [] for k in ("facts_s", "prepare_noop_s", "verify_comm_s",
                                                           "facts_tool_cpu_s", "prepare_noop_tool_cpu_s", "verify_comm_tool_cpu_s",
                                                           "facts_hosts_cpu_s", "prepare_noop_hosts_cpu_s", "verify_comm_hosts_cpu_s")}
        trips = {}
        for r in range(runs):
            took, doc, cpu, hosts = run_json("facts", "--cluster", name, "--json")
            cells["facts_s"].append(took)
            cells["facts_tool_cpu_s"].append(cpu)
            cells["facts_hosts_cpu_s"].append(hosts)
            trips["facts_commands_per_host"] = max(doc["round_trips"].values())
            took, doc, cpu, hosts = run_json("prepare", "--cluster", name, "--no-check", "--json")
            if doc.get("changed"):
                raise SystemExit(f"prepare on {name} changed {doc['changed']} (expected a no-op)")
            cells["prepare_noop_s"].append(took)
            cells["prepare_noop_tool_cpu_s"].append(cpu)
            cells["prepare_noop_hosts_cpu_s"].append(hosts)
            trips["prepare_noop_commands_per_host"] = max(doc["round_trips"].values())
            took, doc, cpu, hosts = run_json("verify-comm", "--cluster", name, "--json", check=False)
            if not doc.get("ok"):
                # measured all the same, and said: a failed check is not a fast one
                failed = (doc.get("links") or {}).get("failed", []) + (doc.get("host_links") or {}).get("failed", [])
                trips["verify_comm_failed"] = f"{len(failed)} failed pairs, e.g. {failed[0].get('reason') if failed else doc}"[:300]
                print(f"  n={n}: verify-comm failed: {trips['verify_comm_failed']}", file=sys.stderr)
            cells["verify_comm_s"].append(took)
            cells["verify_comm_tool_cpu_s"].append(cpu)
            cells["verify_comm_hosts_cpu_s"].append(hosts)
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
    cpus = os.cpu_count() or 1
    print(f"{'nodes':>5} {'facts':>7} {'prepare (no-op)':>16} {'verify-comm':>12} {'tool CPU facts, prepare':>24} "
          f"{'hosts CPU facts, prepare':>25} {'cmds/host facts, prepare':>25} {'sim.up':>7}")
    for n in sizes:
        c = cells[str(n)]
        print(f"{n:>5} {c['facts_s']:>7.2f} {c['prepare_noop_s']:>16.2f} {c['verify_comm_s']:>12.2f} "
              f"{c['facts_tool_cpu_s']:>12.2f}, {c['prepare_noop_tool_cpu_s']:>9.2f} "
              f"{c['facts_hosts_cpu_s']:>13.2f}, {c['prepare_noop_hosts_cpu_s']:>9.2f} "
              f"{str(c['facts_commands_per_host']) + ', ' + str(c['prepare_noop_commands_per_host']):>25} {c['sim_up_s']:>7.1f}")

    def ratio(k):
        a, b = cells.get("64", {}).get(k), cells.get("4", {}).get(k)
        return round(a / b, 3) if a and b else None

    def floor(k):
        # the least time the 64 simulated hosts' own work (their sshd sessions
        # and scripts, every CPU of this machine busy with nothing else) takes,
        # over the whole 4-node run: what 64/4 cannot go below here, even if
        # the tool cost nothing
        a, b = cells.get("64", {}).get(f"{k}_hosts_cpu_s"), cells.get("4", {}).get(f"{k}_s")
        return round(a / cpus / b, 3) if a and b else None

    print(f"on {cpus} CPUs: the 64 hosts' own work alone is {floor('facts')} x the 4-node facts run, "
          f"{floor('prepare_noop')} x the no-op prepare, {floor('verify_comm')} x verify-comm", file=sys.stderr)
    print(json.dumps({"n": cells, "cpus": cpus,
                      "facts_64_over_4": ratio("facts_s"), "prepare_noop_64_over_4": ratio("prepare_noop_s"),
                      "verify_comm_64_over_4": ratio("verify_comm_s"),
                      # the tool's own CPU (the invoke process): what grows on the laptop, apart from the simulated nodes' work
                      "facts_tool_cpu_64_over_4": ratio("facts_tool_cpu_s"), "prepare_noop_tool_cpu_64_over_4": ratio("prepare_noop_tool_cpu_s"),
                      "facts_hosts_floor_64_over_4": floor("facts"), "prepare_noop_hosts_floor_64_over_4": floor("prepare_noop"),
                      "verify_comm_hosts_floor_64_over_4": floor("verify_comm")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
