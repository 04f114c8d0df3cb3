"""invoke stage and image distribution against the link's physical limit, on
N simulated hosts whose links are shaped (tc token buckets, ``invoke
sim.shape``: every host's management and data veths, and the registry's).

For each N it measures, in one run:
- one copy: S bytes over one pair (node 0 to node 1, a plain TCP stream), S / B;
- ``invoke stage``: the model from node 0 to the N - 1 others, and its ratio to one copy;
- a star copy: node 0 sends to every node at once (one TCP stream each), and its ratio;
- rsync from node 0 to every node in parallel (over SSH), and its ratio;
- the tool's CPU seconds during stage;
- the image: one ``docker pull`` on one node; N pulls at once; prepare's
  distribution (one pull, then docker save down the chain into docker load), ratios to one pull.

Usage (root): .venv/bin/python bench/stage.py [--sizes 4,8,16] [--mbit 200] [--mib 512] [--no-image]
Last line: one JSON object {"n": {"4": {...}}, "mbit": ..., "mib": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import simhosts  # noqa: E402

BASE = "sim-a2"
SHARDS = 8
PORT = 29899
SINK = "import socket,sys\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind((sys.argv[1],int(sys.argv[2])));s.listen(1)\n" \
       "c,_=s.accept();n=0\nwhile True:\n b=c.recv(1<<20)\n if not b: break\n n+=len(b)\nprint(n)"
SEND = "import socket,sys,time\nfor i in range(200):\n try:\n  s=socket.create_connection((sys.argv[1],int(sys.argv[2])));break\n except OSError: time.sleep(0.05)\n" \
       "for p in sys.argv[3:]:\n f=open(p,'rb')\n while True:\n  b=f.read(1<<20)\n  if not b: break\n  s.sendall(b)\ns.close()"


def ns(cluster, node) -> list[str]:
    """Run in the host's own mount and network namespaces (its private /root/.cache)."""
    from sim import hostview

    return ["nsenter", "-t", str(hostview._host_pid(cluster.name, node.name)), "-m", "-n"]


def model_dir(cluster, node) -> Path:
    from sim.paths import host_dir

    return host_dir(cluster.name, node.name) / "root" / cluster.model.path.lstrip("/")


def write_checkpoint(cluster, mib: int) -> list[Path]:
    """SHARDS shards of random bytes on node 0; every other node's model directory emptied."""
    src = model_dir(cluster, cluster.node0)
    rnd = random.Random(5)
    paths = []
    for i in range(SHARDS):
        p = src / f"bench-{i:05d}-of-{SHARDS:05d}.safetensors"
        p.write_bytes(rnd.randbytes(mib * (1 << 20) // SHARDS))
        paths.append(p)
    return paths


def clear_targets(cluster) -> None:
    for n in cluster.nodes[1:]:
        d = model_dir(cluster, n)
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)


def streams(cluster, pairs: list[tuple[object, object]], files: list[str]) -> float:
    """Seconds for every (sender, receiver) pair to carry ``files`` at once, over the data network."""
    sinks = [subprocess.Popen([*ns(cluster, r), sys.executable, "-c", SINK, str(r.ip), str(PORT + i)], stdout=subprocess.PIPE, text=True)
             for i, (_, r) in enumerate(pairs)]
    time.sleep(0.3)
    t0 = time.perf_counter()
    senders = [subprocess.Popen([*ns(cluster, s), sys.executable, "-c", SEND, str(r.ip), str(PORT + i), *files])
               for i, (s, r) in enumerate(pairs)]
    for p in senders + sinks:
        if p.wait() != 0:
            raise SystemExit("a bench stream failed")
    return time.perf_counter() - t0


def rsync_all(cluster, src_dir: str) -> float:
    from sim.paths import cluster_dir

    cfg = cluster_dir(cluster.name) / "ssh_config"
    t0 = time.perf_counter()
    procs = [subprocess.Popen([*ns(cluster, cluster.node0), "rsync", "-a", "--whole-file", "-e", f"ssh -F {cfg}", f"{src_dir}/",
                               f"{n.name}:{src_dir}/"]) for n in cluster.nodes[1:]]
    for p in procs:
        if p.wait() != 0:
            raise SystemExit("rsync failed")
    return time.perf_counter() - t0


def timed_tool(*args: str) -> tuple[float, float, dict]:
    """Wall and CPU seconds of one command of the tool, and its JSON document."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    res = simhosts.invoke(*args)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(res.stdout)


def image_bench(cluster, name: str) -> dict:
    from sim import dockerd, hostview

    ref = cluster.image.ref

    def rmi(nodes):
        for n in nodes:
            hostview.docker(cluster.name, n.name, "rmi", "-f", ref, check=False)

    def pull(nodes) -> float:
        t0 = time.perf_counter()
        procs = [subprocess.Popen([*ns(cluster, n), dockerd.CLI, "pull", "-q", ref], stdout=subprocess.DEVNULL) for n in nodes]
        for p in procs:
            if p.wait() != 0:
                raise SystemExit("docker pull failed")
        return time.perf_counter() - t0

    rmi(cluster.nodes)
    one = pull([cluster.node0])
    rmi(cluster.nodes)
    n_pulls = pull(cluster.nodes)
    rmi(cluster.nodes)
    code = ("import sys; from llmdeploy.inventory import load_cluster; from llmdeploy import report; from flows.stage import distribute_image; "
            f"o = distribute_image(load_cluster({name!r}), report.console(True), quiet=True); print(o.as_json(), file=sys.stderr); "
            f"sys.exit(1 if o.failed or o.pulled or len(o.got) != {len(cluster.nodes)} else 0)")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=simhosts.REPO, env=simhosts.env(), check=True)
    dist = time.perf_counter() - t0
    return {"one_pull_s": round(one, 2), "n_pulls_s": round(n_pulls, 2), "distribute_s": round(dist, 2),
            "n_pulls_over_one": round(n_pulls / one, 2), "distribute_over_one": round(dist / one, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,8,16")
    ap.add_argument("--mbit", type=float, default=200)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--no-image", action="store_true")
    a = ap.parse_args()
    simhosts.need_root()
    from sim import cluster as simc

    out: dict = {"n": {}, "mbit": a.mbit, "mib": a.mib}
    print(f"{'N':>3} {'one copy':>9} {'stage':>8} {'ratio':>6} {'star':>8} {'ratio':>6} {'rsync':>8} {'ratio':>6} {'tool CPU':>9}"
          f"{'' if a.no_image else '   1 pull  N pulls  ratio  distrib  ratio'}", flush=True)
    for n in [int(x) for x in a.sizes.split(",")]:
        name = simhosts.scaled(BASE, n)
        with simhosts.cluster_up(name) as cluster:
            simc.shape(cluster, a.mbit)
            files = write_checkpoint(cluster, a.mib)
            clear_targets(cluster)
            inside = [str(Path(cluster.model.path) / p.name) for p in files]
            one = streams(cluster, [(cluster.node0, cluster.nodes[1])], inside)
            clear_targets(cluster)
            wall, cpu, doc = timed_tool("stage", "--cluster", name, "--json")
            if not doc["ok"]:
                raise SystemExit(f"stage failed: {doc['failed']}")
            star = streams(cluster, [(cluster.node0, t) for t in cluster.nodes[1:]], inside)
            clear_targets(cluster)
            rs = rsync_all(cluster, cluster.model.path)
            row = {"one_copy_s": round(one, 2), "stage_s": round(wall, 2), "stage_over_one": round(wall / one, 2),
                   "star_s": round(star, 2), "star_over_one": round(star / one, 2), "rsync_s": round(rs, 2),
                   "rsync_over_one": round(rs / one, 2), "tool_cpu_s": round(cpu, 2)}
            line = (f"{n:>3} {one:>8.1f}s {wall:>7.1f}s {wall / one:>5.2f}x {star:>7.1f}s {star / one:>5.2f}x {rs:>7.1f}s "
                    f"{rs / one:>5.2f}x {cpu:>8.2f}s")
            if not a.no_image:
                img = image_bench(cluster, name)
                row.update(img)
                line += (f" {img['one_pull_s']:>7.1f}s {img['n_pulls_s']:>7.1f}s {img['n_pulls_over_one']:>5.2f}x "
                         f"{img['distribute_s']:>7.1f}s {img['distribute_over_one']:>5.2f}x")
            out["n"][str(n)] = row
            print(line, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    os.umask(0o022)
    main()
