"""The same job with this project's runner, Ansible and pyinfra, on N simulated hosts.

Job, per host: copy a 1 MiB file, render a small Jinja2 environment file, run
five shell commands (bench/job_ours.py, and bench/peers_tools.py for the two
peers). Each tool: a first run (the remote directory removed before it, Ansible's
ControlPersist masters closed) and a second run with nothing to change (which
must report no change). The tools run interleaved, in a rotating order, several
rounds per host count; the median of each cell is reported. Every run is a new
process, as a user runs it.

Ansible (ansible-core) and pyinfra are installed from PyPI into their own
virtualenvs under bench/ on the first run (never into the project's).
Hosts: the simulated cluster (network namespaces, real sshd), sim-a2's shape.

Usage (root): .venv/bin/python bench/peers.py [--sizes 4,16,64] [--runs 3]
Last line: one JSON object {"n": {"4": {...}, ...}, "ratio_ansible_16": ...,
"ratio_pyinfra_16": ..., "rerun_over_first_16": ..., "scale_64_over_4": ...}
(ours divided by theirs, first runs; ours 64 hosts over ours 4 hosts).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers_tools  # noqa: E402
import simhosts  # noqa: E402
from flows.binding import bind  # noqa: E402

WORK = simhosts.REPO / "bench" / "work"
# the peers' working directories: short (ssh's ControlPath must fit 108 bytes)
PEER_WORK = Path("/tmp/llmdeploy-bench")
REMOTE_DIR = "/var/lib/llmdeploy/bench-job"
TOOLS = ["ours", "ansible", "pyinfra"]
TEMPLATE = """# bench job environment for {{ host }} (rendered)
JOB_HOST={{ host }}
JOB_INDEX={{ index }}
JOB_PEERS={{ peers }}
JOB_DIR=/var/lib/llmdeploy/bench-job
"""


def jobdir() -> Path:
    d = WORK / "job"
    d.mkdir(parents=True, exist_ok=True)
    payload = random.Random(0).randbytes(1 << 20)
    if not (d / "payload.bin").exists() or (d / "payload.bin").read_bytes() != payload:
        (d / "payload.bin").write_bytes(payload)
    (d / "job.env.j2").write_text(TEMPLATE)
    return d


def clean(cluster) -> None:
    """Remove the job's directory on every host (between rounds, not timed)."""
    from llmdeploy.runner import Step

    with bind(cluster).runner() as r:
        res = r.run(Step(name="clean", build=lambda node: f"rm -rf {REMOTE_DIR}"))
    bad = {h: x.msg for h, x in res.items() if x.failed}
    if bad:
        raise SystemExit(f"could not clean the job directory: {bad}")


def run(argv: list[str], env: dict, what: str, cwd: Path) -> tuple[float, str]:
    t0 = time.perf_counter()
    res = subprocess.run(argv, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, cwd=cwd)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{what} failed ({res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return took, res.stdout + "\n" + res.stderr


def ours_reset(name: str) -> None:
    """End our connection holders (ssh.persist_s), as Ansible's masters are
    closed before its first run; wait until none answers."""
    from transports.ssh import mux

    mux.stop(name)
    end = time.monotonic() + 10
    while any(mux._request(p, "ping", timeout=1) for p in mux.holders(name)) and time.monotonic() < end:
        time.sleep(0.05)


def ours_changes(out: str) -> int:
    m = re.search(r"changed=(\d+)", out)
    if not m:
        raise SystemExit(f"job_ours printed no summary: {out[-500:]}")
    return int(m.group(1))


def measure(n: int, runs: int, jd: Path) -> dict:
    name = simhosts.scaled("sim-a2", n)
    with simhosts.cluster_up(name) as cluster:
        from sim.paths import mgmt_ip

        hosts = peers_tools.Hosts(
            names=[x.name for x in cluster.nodes],
            addresses=[mgmt_ip(str(x.ip)) for x in cluster.nodes],
            identity_file=cluster.ssh.identity_file,
            known_hosts=cluster.ssh.known_hosts,
            remote_dir=REMOTE_DIR,
        )
        cmds = {}
        for tool in ("ansible", "pyinfra"):
            wd = PEER_WORK / f"{tool}{n}"
            shutil.rmtree(wd, ignore_errors=True)
            wd.mkdir(parents=True)
            # the simulated sshd serves SFTP (internal-sftp), as a real node's does: the peers' defaults
            cmds[tool] = (getattr(peers_tools, tool)(wd, hosts, jd, sftp=True), wd)
        # connections kept 60 s between runs, as Ansible's ControlPersist here (ssh.persist_s)
        ours_argv = [sys.executable, str(simhosts.REPO / "bench" / "job_ours.py"), "--cluster", name, "--jobdir", str(jd), "--remote-dir", REMOTE_DIR,
                     "--persist", "60"]
        cmds["ours"] = ((ours_argv, simhosts.env()), None)
        times: dict[str, dict[str, list[float]]] = {t: {"first": [], "rerun": []} for t in TOOLS}
        for r in range(runs):
            order = TOOLS[r % len(TOOLS):] + TOOLS[: r % len(TOOLS)]
            for tool in order:
                (argv, env), wd = cmds[tool]
                clean(cluster)
                if tool == "ansible":
                    peers_tools.ansible_reset(wd)
                if tool == "ours":
                    ours_reset(name)
                cwd = wd or simhosts.REPO
                first, out1 = run(argv, env, f"{tool} (first run, {n} hosts)", cwd)
                rerun, out2 = run(argv, env, f"{tool} (second run, {n} hosts)", cwd)
                if tool == "ours":
                    changed1, changed2 = ours_changes(out1), ours_changes(out2)
                else:
                    # the files (their shell tasks count as changes in pyinfra's table)
                    changed1 = peers_tools.parse_changes(tool, out1)["files_changed"]
                    changed2 = peers_tools.parse_changes(tool, out2)["files_changed"]
                if changed1 == 0 or changed2 != 0:
                    raise SystemExit(f"{tool} at {n} hosts: first run changed {changed1}, second {changed2} (expected >0, then 0)")
                times[tool]["first"].append(first)
                times[tool]["rerun"].append(rerun)
                print(f"  n={n} round {r + 1} {tool:8s} first {first:6.2f}s  rerun {rerun:6.2f}s", file=sys.stderr)
        if "ansible" in cmds:
            peers_tools.ansible_reset(cmds["ansible"][1])
        ours_reset(name)
    return {t: {k: round(simhosts.median(v), 3) for k, v in times[t].items()} for t in TOOLS}


def main() -> int:
    ap = argparse.ArgumentParser(description="ours vs Ansible vs pyinfra on N simulated hosts")
    ap.add_argument("--sizes", default="4,16,64", help="host counts (comma-separated)")
    ap.add_argument("--runs", type=int, default=3, help="rounds per host count (median reported)")
    args = ap.parse_args()
    simhosts.need_root()
    sizes = [int(x) for x in args.sizes.split(",")]
    for tool in ("ansible", "pyinfra"):
        print(f"{tool}: {peers_tools.venv(tool)}", file=sys.stderr)
    jd = jobdir()
    cells = {}
    for n in sizes:
        cells[str(n)] = measure(n, args.runs, jd)

    def ratio(a, b):
        return round(a / b, 4) if a is not None and b else None

    def cell(n, tool, k):
        return cells.get(str(n), {}).get(tool, {}).get(k)

    print(f"{'hosts':>5} {'tool':8} {'first (s)':>10} {'rerun (s)':>10} {'ours/first':>11}")
    for n in sizes:
        for tool in TOOLS:
            c = cells[str(n)][tool]
            print(f"{n:>5} {tool:8} {c['first']:>10.2f} {c['rerun']:>10.2f} {ratio(cell(n, 'ours', 'first'), c['first']):>11}")
    summary = {
        "n": cells,
        "ratio_ansible_16": ratio(cell(16, "ours", "first"), cell(16, "ansible", "first")),
        "ratio_pyinfra_16": ratio(cell(16, "ours", "first"), cell(16, "pyinfra", "first")),
        "rerun_over_first_16": ratio(cell(16, "ours", "rerun"), cell(16, "ours", "first")),
        "scale_64_over_4": ratio(cell(64, "ours", "first"), cell(4, "ours", "first")),
    }
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
