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

Of the distribution it also prints when the stream's last byte reached the
last node (the link's part) and the longest ``docker load`` after it: dockerd
registers the layers only once it has the whole archive, and here every
simulated node's dockerd shares this machine's CPUs (on a cluster each node
loads on its own). ``--image-mbit`` shapes the links differently for the
image part (slower: the link, not this machine's CPUs, sets the time).

With ``--slurm`` the cluster is run by a Slurm controller: stage's agents
are tasks of a step of an allocation, and Slurm's own ``sbcast`` (from node
0 to an allocation of the others) is measured against it instead of the
star copy and rsync (the links are the same as without Slurm).

Usage (root): .venv/bin/python bench/stage.py [--sizes 4,8,16] [--mbit 200] [--mib 512]
                  [--no-image | --no-stage] [--image-mbit M] [--no-n-pulls] [--slurm]
Last line: one JSON object {"n": {"4": {...}}, "mbit": ..., "mib": ..., "image_mbit": ..., "cpus": ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
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


def machine_cpu() -> float:
    """CPU seconds this machine spent so far, every process (/proc/stat: all but idle and iowait)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK")


def stage_bench(cluster, name: str, mib: int) -> dict:
    """One copy, invoke stage, a star copy and rsync (on a Slurm cluster also
    sbcast), with their ratios to one copy."""
    files = write_checkpoint(cluster, mib)
    clear_targets(cluster)
    inside = [str(Path(cluster.model.path) / p.name) for p in files]
    one = streams(cluster, [(cluster.node0, cluster.nodes[1])], inside)
    clear_targets(cluster)
    wall, cpu, doc = timed_tool("stage", "--cluster", name, "--json")
    if not doc["ok"]:
        raise SystemExit(f"stage failed: {doc['failed']}")
    row = {"one_copy_s": round(one, 2), "stage_s": round(wall, 2), "stage_over_one": round(wall / one, 2), "tool_cpu_s": round(cpu, 2)}
    if cluster.slurm:
        # the star copy and rsync are the SSH cluster's (the same links): here Slurm's own broadcast
        clear_targets(cluster)
        sb = sbcast_all(cluster, inside)
        return {**row, "sbcast_s": round(sb, 2), "sbcast_over_one": round(sb / one, 2)}
    star = streams(cluster, [(cluster.node0, t) for t in cluster.nodes[1:]], inside)
    clear_targets(cluster)
    rs = rsync_all(cluster, cluster.model.path)
    return {**row, "star_s": round(star, 2), "star_over_one": round(star / one, 2), "rsync_s": round(rs, 2),
            "rsync_over_one": round(rs / one, 2)}


def sbcast_all(cluster, files: list[str]) -> float:
    """Slurm's own broadcast of the checkpoint: an allocation of every node
    but node 0 (salloc from the login host; sbcast writes to every node of the
    job, and node 0 has the files at the same path), then ``sbcast`` of each
    file from node 0 at sbcast's default fanout (sbcast(1)). Seconds."""
    from sim import slurm as simslurm
    from sim.paths import cluster_dir

    cdir = cluster_dir(cluster.name)
    login = json.loads((cdir / "state.json").read_text())["login"]["pid"]
    targets = [cluster.slurm_name(n) for n in cluster.nodes[1:]]
    res = simslurm.login_exec(cdir, login, "salloc", "--no-shell", "--job-name=bench-sbcast", f"--nodes={len(targets)}",
                              f"--nodelist={','.join(targets)}", "--immediate=120", f"--partition={cluster.slurm.partition}", timeout=180)
    m = re.search(r"Granted job allocation (\d+)", res.stderr)
    if not m:
        raise SystemExit(f"salloc for sbcast failed: {res.stderr.strip()}")
    job = m.group(1)
    try:
        t0 = time.perf_counter()
        for f in files:
            r = subprocess.run([*ns(cluster, cluster.node0), "env", f"SLURM_CONF={simslurm.conf_path(cdir)}", "sbcast", f"--jobid={job}", f, f],
                               capture_output=True, text=True)
            if r.returncode != 0:
                raise SystemExit(f"sbcast {f} failed: {(r.stderr or r.stdout).strip()}")
        wall = time.perf_counter() - t0
    finally:
        simslurm.login_exec(cdir, login, "scancel", job)
    want = {Path(f).name: (model_dir(cluster, cluster.node0) / Path(f).name).stat().st_size for f in files}
    for n in cluster.nodes[1:]:
        got = {p.name: p.stat().st_size for p in model_dir(cluster, n).iterdir()}
        if any(got.get(k) != v for k, v in want.items()):
            raise SystemExit(f"sbcast left {n.name} without the whole checkpoint: {got}")
    return wall


def image_bench(cluster, name: str, n_pulls: bool = True) -> dict:
    """One pull, N pulls at once (unless ``n_pulls`` is false), and prepare's
    distribution; of the distribution also when the stream's last byte reached
    the last node (``stream_s``: the link's part) and the longest ``docker
    load`` after it (``load_s``: dockerd registers the layers only once it has
    the whole archive, and here every node's dockerd shares this machine's CPUs)."""
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
    row = {"one_pull_s": round(one, 2)}
    if n_pulls:
        rmi(cluster.nodes)
        many = pull(cluster.nodes)
        row.update(n_pulls_s=round(many, 2), n_pulls_over_one=round(many / one, 2))
    rmi(cluster.nodes)
    code = ("import json, sys; from flows.binding import load; from llmdeploy import report; from flows.stage import distribute_image; "
            f"o = distribute_image(load({name!r}), report.console(True), quiet=True); print(json.dumps(o.as_json())); "
            f"sys.exit(1 if o.failed or o.pulled or len(o.got) != {len(cluster.nodes)} else 0)")
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", code], cwd=simhosts.REPO, env=simhosts.env(), stdout=subprocess.PIPE, text=True)
    dist = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"image distribution failed: {res.stdout.strip()}")
    timings = json.loads(res.stdout.strip().splitlines()[-1])["timings"]
    stream = max(t["stream_s"] for t in timings.values())
    load = max(t.get("sink_s", 0.0) for t in timings.values())
    row.update(distribute_s=round(dist, 2), distribute_over_one=round(dist / one, 2), stream_s=round(stream, 2),
               stream_over_one=round(stream / one, 2), load_s=round(load, 2))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,8,16")
    ap.add_argument("--mbit", type=float, default=200)
    ap.add_argument("--mib", type=int, default=512)
    ap.add_argument("--no-image", action="store_true")
    ap.add_argument("--no-stage", action="store_true", help="the image only")
    ap.add_argument("--slurm", action="store_true", help="the cluster run by Slurm: stage as steps of an allocation, and sbcast")
    ap.add_argument("--image-mbit", type=float, help="the links' speed for the image part (default: --mbit)")
    ap.add_argument("--no-n-pulls", action="store_true", help="skip the N pulls at once (at a slow --image-mbit they take N x one)")
    a = ap.parse_args()
    if a.no_image and a.no_stage:
        ap.error("--no-image and --no-stage leave nothing to measure")
    simhosts.need_root()
    from sim import cluster as simc

    image_mbit = a.image_mbit or a.mbit
    out: dict = {"n": {}, "mbit": a.mbit, "mib": a.mib, "image_mbit": image_mbit, "cpus": os.cpu_count(), "slurm": a.slurm}
    for n in [int(x) for x in a.sizes.split(",")]:
        name = simhosts.scaled(BASE, n, slurm=a.slurm)
        row: dict = {}
        with simhosts.cluster_up(name) as cluster:
            if not a.no_stage:
                simc.shape(cluster, a.mbit)
                row.update(stage_bench(cluster, name, a.mib))
                others = "; ".join(f"{k} {row[k + '_s']:.1f} s ({row[k + '_over_one']:.2f} x)" for k in ("star", "rsync", "sbcast") if k + "_s" in row)
                print(f"N={n} stage at {a.mbit:g} Mbit/s, {a.mib} MiB: one copy {row['one_copy_s']:.1f} s; stage {row['stage_s']:.1f} s "
                      f"({row['stage_over_one']:.2f} x); {others}; tool CPU {row['tool_cpu_s']:.2f} s", flush=True)
            if not a.no_image:
                simc.shape(cluster, image_mbit)
                c0 = machine_cpu()
                img = image_bench(cluster, name, n_pulls=not a.no_n_pulls)
                img["machine_cpu_s"] = round(machine_cpu() - c0, 1)
                row.update(img)
                pulls = (f"N pulls {img['n_pulls_s']:.1f} s ({img['n_pulls_over_one']:.2f} x); " if "n_pulls_s" in img else "")
                print(f"N={n} image at {image_mbit:g} Mbit/s: one pull {img['one_pull_s']:.1f} s; {pulls}distribution {img['distribute_s']:.1f} s "
                      f"({img['distribute_over_one']:.2f} x), the stream at the last node after {img['stream_s']:.1f} s "
                      f"({img['stream_over_one']:.2f} x), docker load after it up to {img['load_s']:.1f} s "
                      f"(the whole image part: {img['machine_cpu_s']:.1f} CPU-s on {os.cpu_count()} CPUs)", flush=True)
        out["n"][str(n)] = row
    print(json.dumps(out))


if __name__ == "__main__":
    os.umask(0o022)
    main()
