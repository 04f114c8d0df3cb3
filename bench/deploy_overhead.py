"""How long deploy, rollback and stop take on sim-a3 beyond the simulated
servers' own start, per phase.

Each command runs as a user runs it (``invoke deploy --cluster sim-a3
--json``, a new process). The servers' own start is read from the simulated
vLLM servers (sim/standins/vllm.py writes, per process, when it started and
when it was ready): from the last server process's start to the API server's
"Application startup complete". Everything else is the tool's: starting
Python, the lock, the communication gate, the no-op prepare, writing the
release, stopping the previous one, launching the containers, noticing
readiness (its poll interval included), the /v1/models and chat probes, the
ledger. Rounds: deploy (release A), deploy (release B, stopping A),
rollback (to A), stop; medians over rounds.

Usage (root): .venv/bin/python bench/deploy_overhead.py [--runs 3]
Last line: one JSON object {"deploy": {"wall_s":.., "servers_s":.., "overhead_s":.., "phases": {..}}, "rollback": {...}, "stop": {...}}
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import simhosts  # noqa: E402

from llmdeploy.inventory import load_cluster  # noqa: E402
from sim import cluster as simc  # noqa: E402
from sim.paths import host_dir  # noqa: E402

CLUSTER = "sim-a3"


def last_json(text: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            return doc
    # a pretty-printed document
    start = text.find("{")
    return json.loads(text[start:]) if start >= 0 else {}


def times_files(cluster) -> list[Path]:
    return [host_dir(cluster.name, n.name) / "root/etc/llmdeploy-sim/serving-times.jsonl" for n in cluster.nodes]


def servers_start(cluster) -> float | None:
    """From the last server process's start to the API server's readiness."""
    recs = []
    for f in times_files(cluster):
        if f.exists():
            recs += [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
    api = [r["ready"] for r in recs if r["role"] == "api"]
    if not api:
        return None
    return max(api) - max(r["start"] for r in recs)


def timed(cluster, *args: str) -> tuple[float, dict, float | None]:
    for f in times_files(cluster):
        f.unlink(missing_ok=True)
    t0 = time.perf_counter()
    res = simhosts.invoke(*args, "--cluster", CLUSTER, bench=False)
    wall = time.perf_counter() - t0
    doc = last_json(res.stdout) if "--json" in args else {}
    return wall, doc, servers_start(cluster)


def main() -> int:
    ap = argparse.ArgumentParser(description="deploy/rollback/stop time beyond the simulated servers' start")
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    simhosts.need_root()
    cluster = load_cluster(CLUSTER)
    cells: dict[str, list[dict]] = {"deploy": [], "rollback": [], "stop": []}
    simc.up(cluster, echo=lambda *_: None)
    try:
        simhosts.invoke("prepare", "--cluster", CLUSTER, "--no-check", bench=False)
        simhosts.invoke("verify-comm", "--cluster", CLUSTER, bench=False)
        for r in range(args.runs):
            for verb, argv in (("deploy", ("deploy", "--json")), ("deploy", ("deploy", "--json")), ("rollback", ("rollback", "--json")), ("stop", ("stop",))):
                wall, doc, servers = timed(cluster, *argv)
                phases = {k: round(v, 3) for k, v in (doc.get("phases") or {}).items()}
                servers = servers if verb != "stop" else 0.0
                if servers is None:
                    raise SystemExit(f"{verb}: no server readiness recorded (sim/standins/vllm.py record_ready)")
                cells[verb].append({"wall_s": wall, "servers_s": servers, "overhead_s": wall - servers,
                                    "phases": {"before (start, lock, gate, prepare, plan)": round(wall - sum(phases.values()), 3), **phases}})
                print(f"  round {r + 1} {verb:8s} wall {wall:5.2f}s servers {servers:5.2f}s overhead {wall - servers:5.2f}s", file=sys.stderr)
    finally:
        simc.down(CLUSTER, echo=lambda *_: None)

    out = {}
    for verb, rows in cells.items():
        keys = list(rows[0]["phases"])
        out[verb] = {
            **{k: round(simhosts.median([x[k] for x in rows]), 3) for k in ("wall_s", "servers_s", "overhead_s")},
            "phases": {k: round(simhosts.median([x["phases"].get(k, 0.0) for x in rows]), 3) for k in keys},
            "runs": len(rows),
        }
    print(f"{'command':9} {'wall':>7} {'servers':>8} {'overhead':>9}  phases (median s)")
    for verb, c in out.items():
        ph = ", ".join(f"{k} {v:.2f}" for k, v in c["phases"].items())
        print(f"{verb:9} {c['wall_s']:>7.2f} {c['servers_s']:>8.2f} {c['overhead_s']:>9.2f}  {ph}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
