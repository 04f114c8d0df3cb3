"""facts, verify-comm, prepare, deploy and stop over 64 simulated A3 nodes
(vLLM-Ascend DP64), reached two ways: the tool's own SSH fan-out (one
connection per node) and a Slurm controller (one SSH connection, to the
login host; every step one srun over the nodes, the release a job whose
units are its steps).

Prints, for each way and each command, measured in one run on this machine:
the tool's own CPU time (this process, every thread), the wall time, what
went over SSH (connections opened, remote commands) and, through Slurm, the
job steps Slurm launched (each slurmd's log has a line per task it launched,
with the step's id: the distinct ids); then the ratios Slurm / SSH. The
simulated nodes share this machine's CPUs with the tool, slurmd and
slurmctld, so compare ratios, not seconds. deploy runs after prepare
(--skip-prepare) and without the quality gate (there is no release to
compare with).

Needs root (simulated clusters). Usage: .venv/bin/python bench/slurm_vs_ssh.py [NODES] [--only=ssh|--only=slurm] [--no-deploy]
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

INVENTORY = '''from llmdeploy.inventory import Cluster, Model
from launchers.slurm.schema import Slurm
from systems.vllm_ascend.catalogue import IMAGE_A3, image, vllm_a3_w8a8
from sim.paths import sim_nodes, sim_ssh

cluster = Cluster(
    name="{name}",
    platform="a3",
    nic="enp189s0f0",
    ssh=sim_ssh("{name}", command_timeout=900, connect_timeout=30),
    nodes=sim_nodes("{prefix}", {n}, "198.19.{octet}.10"),
    model=Model(path="/root/.cache/models/Qwen3.8-2.4T-A95B-w8a8"),
    image=image(IMAGE_A3),
    profile=vllm_a3_w8a8(dp={n}, ep={n} * 16),
    {slurm}
)
'''


# slurmd's line per task it launches (22.05: "launch task StepId=12.3 request from UID:0 ...")
LAUNCH = re.compile(r"launch task (?:StepId=)?(\d+)\.(\d+)")


def _slurmd_logs(cluster) -> list[Path]:
    from sim.paths import cluster_dir
    from sim.slurm import slurm_dir

    return sorted((slurm_dir(cluster_dir(cluster.name)) / "nodes").glob("*/slurmd.log")) if cluster.slurm else []


def _log_ends(cluster) -> dict[Path, int]:
    return {p: p.stat().st_size for p in _slurmd_logs(cluster)}


def _steps_since(cluster, ends: dict[Path, int]) -> int | None:
    """The distinct job steps whose tasks slurmd launched since ``ends`` (None: not a Slurm cluster)."""
    if not cluster.slurm:
        return None
    found = set()
    for p in _slurmd_logs(cluster):
        with p.open("rb") as f:
            f.seek(ends.get(p, 0))
            found |= set(LAUNCH.findall(f.read().decode(errors="replace")))
    return len(found)


def measure(cluster, fn) -> dict:
    from llmdeploy.runner import COUNTS

    COUNTS.reset()
    ends = _log_ends(cluster)
    c0, t0 = time.process_time(), time.perf_counter()
    code = fn()
    cpu, wall = time.process_time() - c0, time.perf_counter() - t0
    per = COUNTS.by_host
    return {"exit": code, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
            "ssh_connections": sum(v["connections"] for v in per.values()),
            "ssh_commands": sum(v["commands"] for v in per.values()), "hosts_talked_to": len(per),
            "job_steps": _steps_since(cluster, ends)}


def run_both(cluster, deploy: bool = True) -> dict:
    from rich.console import Console

    from flows import app, lifecycle, verify
    from flows.binding import bind
    from flows.app import run_playbook

    out = io.StringIO()
    con = Console(file=out, width=200)

    def facts():
        recap, _, _ = run_playbook(bind(cluster), "facts", None, con, show_progress=False)
        return 1 if any(c["failed"] or c["unreachable"] for c in recap.values()) else 0

    def quiet(fn):
        """A flow that prints on its own console (stdout): into ``out``."""
        def run():
            with contextlib.redirect_stdout(out):
                return fn()
        return run

    cmds = [("facts", facts), ("verify-comm", lambda: verify.run(bind(cluster), con, json_out=False, full=False))]
    if deploy:
        cmds += [("prepare", quiet(lambda: app.prepare(cluster.name))),
                 ("deploy", quiet(lambda: app.deploy(cluster.name, skip_prepare=True, gate=False, rollback_on_failure=False))),
                 ("stop", lambda: lifecycle.stop(bind(cluster), con, None, 0))]
    res = {}
    for cmd, fn in cmds:
        out.seek(0)
        out.truncate()
        res[cmd] = measure(cluster, fn)
        if res[cmd]["exit"] != 0:  # what failed, in the tool's words
            print(f"{cluster.name} {cmd} failed:\n" + "\n".join(out.getvalue().splitlines()[-25:]), file=sys.stderr)
            break
    return res


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    only = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--only=")]
    deploy = "--no-deploy" not in sys.argv[1:]
    n = int(args[0]) if args else 64
    if os.geteuid() != 0:
        raise SystemExit("the benchmark brings up simulated clusters: run as root")
    results = {}
    with tempfile.TemporaryDirectory() as inv:
        os.environ["LLMDEPLOY_INVENTORY"] = inv
        ways = {"ssh": (f"sim-ssh{n}", f"bs{n}-", 60, ""),
                "slurm": (f"sim-slurm{n}", f"bl{n}-", 61, f'slurm=Slurm(login="sim-slurm{n}-login", partition="npu"),')}
        for way, (name, prefix, octet, slurm) in ways.items():
            Path(inv, f"{name.replace('-', '_')}.py").write_text(INVENTORY.format(name=name, prefix=prefix, n=n, octet=octet, slurm=slurm))
        from llmdeploy.inventory import load_cluster
        from sim import cluster as simc

        for way, (name, *_rest) in ways.items():
            if only and way not in only:
                continue
            c = load_cluster(name)
            t0 = time.perf_counter()
            simc.up(c, echo=lambda *_: None)
            print(f"{way}: {n} simulated nodes up in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
            try:
                results[way] = run_both(c, deploy)
            finally:
                simc.down(c.name, echo=lambda *_: None)
            for cmd, r in results[way].items():
                steps = f", job steps {r['job_steps']}" if r["job_steps"] is not None else ""
                print(f"{way:5s} {cmd:11s}: exit {r['exit']}, tool CPU {r['cpu_s']:6.2f}s, wall {r['wall_s']:6.2f}s, "
                      f"SSH connections {r['ssh_connections']:3d}, SSH commands {r['ssh_commands']:4d} (to {r['hosts_talked_to']} hosts){steps}",
                      flush=True)
    for cmd in (c for c in results.get("slurm", {}) if c in results.get("ssh", {})):
        s, h = results["slurm"][cmd], results["ssh"][cmd]
        print(f"{cmd}: Slurm/SSH tool CPU {s['cpu_s'] / max(h['cpu_s'], 1e-9):.2f}x, wall {s['wall_s'] / max(h['wall_s'], 1e-9):.2f}x, "
              f"SSH connections {s['ssh_connections']} vs {h['ssh_connections']}, SSH commands {s['ssh_commands']} vs {h['ssh_commands']}, "
              f"job steps {s['job_steps']}")
    print(json.dumps({"nodes": n, **results}))
    return 0 if all(r["exit"] == 0 for w in results.values() for r in w.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
