"""How `verify-comm` time grows from 4 to 32 simulated A3 nodes (64 to 512 NPUs).

Prints ratios measured in one run (compare ratios, not seconds): the 32-node
run's time over the 4-node run's, next to the growth of the work (nodes and
pings: the 4-node cluster gets the full matrix, 32 nodes the sampled plan).
Needs root (the simulated cluster). Usage: .venv/bin/python bench/verify_comm_scaling.py [NODES ...]
"""

import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rich.console import Console  # noqa: E402

INVENTORY = '''from llmdeploy.inventory import Cluster, Model
from systems.vllm_ascend.catalogue import IMAGE_A3, image, vllm_a3_w8a8
from sim.paths import sim_nodes, sim_ssh

cluster = Cluster(
    name="sim-bench{n}",
    platform="a3",
    nic="enp189s0f0",
    ssh=sim_ssh("sim-bench{n}", command_timeout=900),
    nodes=sim_nodes("sb{n}-", {n}, "198.19.{octet}.10"),
    model=Model(path="/root/.cache/models/Qwen3.8-2.4T-A95B-w8a8"),
    image=image(IMAGE_A3),
    profile=vllm_a3_w8a8(dp={n}, ep={n} * 16),
)
'''


def main() -> int:
    sizes = [int(x) for x in sys.argv[1:]] or [4, 32]
    with tempfile.TemporaryDirectory() as inv:
        os.environ["LLMDEPLOY_INVENTORY"] = inv
        for i, n in enumerate(sizes):
            Path(inv, f"sim_bench{n}.py").write_text(INVENTORY.format(n=n, octet=40 + i))
        from flows import verify
        from flows.binding import bind
        from llmdeploy.inventory import load_cluster
        from sim import cluster as simc

        con = Console(stderr=True, quiet=True)
        results = {}
        for n in sizes:
            c = load_cluster(f"sim-bench{n}")
            simc.up(c, echo=lambda *_: None)
            try:
                t0 = time.perf_counter()
                code = verify.run(bind(c), con, json_out=False, full=False)
                dt = time.perf_counter() - t0
                import json

                doc = json.loads(Path(f"/var/tmp/llmdeploy-sim/sim-bench{n}/hosts/sb{n}-0/root/var/lib/llmdeploy/sim-bench{n}/verify-comm.json").read_text())
                results[n] = (dt, doc["links"]["planned"], doc["plan"], code)
                print(f"{n:3d} nodes, {16 * n:4d} NPUs: {doc['plan']} plan, {doc['links']['planned']} pings, exit {code}", flush=True)
                if code:
                    for host, v in doc["nodes"].items():
                        bad = {k: c["failures"][:3] for k, c in v.get("checks", {}).items() if not c["ok"]}
                        if bad or not v.get("reachable"):
                            print(f"    {host}: {v.get('error') or bad}", flush=True)
            finally:
                simc.down(c.name, echo=lambda *_: None)
    base = sizes[0]
    for n in sizes[1:]:
        t, p = results[n][0] / results[base][0], results[n][1] / results[base][1]
        print(f"{n} vs {base} nodes: {t:.2f}x the time for {n / base:.0f}x the nodes and {p:.2f}x the pings")
    return 0 if all(r[3] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
