"""Dynamo 1P2D on five simulated GB300 nodes: prefill P4-TEP on node 0 with
the control plane and the frontend, two decode D8-B4 workers each one TP8
MPI group across two nodes (the launch agent enters the second node's container).
The frontend is NVIDIA's (the pinned ai-dynamo wheel, installed by prepare),
the workers run Dynamo's engine simulator behind the plan's command line: the
live view, the benchmark and the drain before a stop read the real frontend."""

import json
import time

import pytest

from llmdeploy.release import parse_ledger
from sim import hostview, images
from sim.paths import host_dir
from tests.integration.conftest import Stream, top_once, wheels_builds, wheels_image_ids
from tests.conftest import run_invoke
from tests.integration.test_deploy_trtllm import _procs

SERVED = "nvidia/Qwen3.5-397B-A17B-NVFP4-V2"

SIM_CLUSTER = "sim-gb300-1p2d"
NODES = [f"sim-gb300-1p2d-{i}" for i in range(5)]


@pytest.mark.slow
def test_1p2d_decode_groups_span_two_nodes(sim_cluster):
    since = int(time.time()) - 1
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    # prepare built the image with the wheels once (one pip install, on node 0) and sent it down the chain: one image ID
    assert wheels_builds(SIM_CLUSTER, NODES, since) == {n: int(n == NODES[0]) for n in NODES}
    ids = wheels_image_ids(SIM_CLUSTER, NODES)
    assert len(set(ids.values())) == 1 and next(iter(ids.values())).startswith("sha256:"), ids
    # nodes that hold it already: no build at all
    since = int(time.time()) - 1
    again = run_invoke("prepare", "--cluster", SIM_CLUSTER, "--no-check", "--json", timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    doc = json.loads(again.stdout)
    assert doc["wheels_distribution"]["built"] is None and sorted(doc["wheels_distribution"]["had"]) == NODES, doc["wheels_distribution"]
    assert all(r["status"] == "ok" for r in doc["steps"]["wheels"].values()), doc["steps"]["wheels"]
    assert sum(wheels_builds(SIM_CLUSTER, NODES, since).values()) == 0
    assert "(dynamo: etcd -> nats -> frontend -> prefill0 -> decode0 -> decode1)" in res.stdout
    base = host_dir(SIM_CLUSTER, NODES[0]) / "root/var/lib/llmdeploy/sim-gb300-1p2d"
    rid = parse_ledger((base / "ledger.jsonl").read_text())[-1]["release"]
    # decode0: ranks 0-3 on node 1 and 4-7 on node 2, in one MPI world of 8, each in its node's decode0 container
    for node, ranks, worker in ((NODES[1], range(0, 4), "decode0"), (NODES[2], range(4, 8), "decode0"),
                                (NODES[3], range(0, 4), "decode1"), (NODES[4], range(4, 8), "decode1")):
        found = sorted(int(env["OMPI_COMM_WORLD_RANK"]) for env, cmd, name in _procs(node, SIM_CLUSTER).values()
                       if name == f"{SIM_CLUSTER}-{rid}-{worker}" and "OMPI_COMM_WORLD_RANK" in env)
        assert found == list(ranks), (node, found)
        assert all(env.get("OMPI_COMM_WORLD_SIZE") == "8" for env, _, _ in _procs(node, SIM_CLUSTER).values() if "OMPI_COMM_WORLD_RANK" in env)
    assert (base / "releases" / rid / "decode0.hostfile").exists() is False  # decode0's launcher is node 1
    hostfile = host_dir(SIM_CLUSTER, NODES[1]) / f"root/var/lib/llmdeploy/sim-gb300-1p2d/releases/{rid}/decode0.hostfile"
    # each node by its serving IP (inventory/sim_gb300_1p2d.py: 198.19.31.10 + index)
    assert hostfile.read_text().splitlines()[-2:] == ["198.19.31.11 slots=4", "198.19.31.12 slots=4"]
    doc = json.loads(run_invoke("status", "--cluster", SIM_CLUSTER, "--json").stdout)
    assert doc["healthy"]
    assert sorted(u["service"] for n in NODES for u in doc["nodes"][n]["units"].values()) == sorted(
        ["etcd", "nats", "frontend", "prefill0", "decode0", "decode0", "decode1", "decode1"])
    # NVIDIA's frontend: the pinned wheel in the container, python3 -m dynamo.frontend from it
    frontend = f"{SIM_CLUSTER}-{rid}-frontend"
    show = hostview.docker(SIM_CLUSTER, NODES[0], "exec", frontend, "python3", "-m", "pip", "show", "ai-dynamo").stdout
    assert f"Version: {images.DYNAMO_VERSION}" in show.splitlines(), show
    where = hostview.docker(SIM_CLUSTER, NODES[0], "exec", frontend, "python3", "-c",
                            "import dynamo.frontend as f, importlib.metadata as m; print(f.__file__); "
                            "print(m.distribution('ai-dynamo').locate_file('dynamo/frontend/__init__.py'))").stdout.split()
    assert where[0] == where[1] and where[0].endswith("dist-packages/dynamo/frontend/__init__.py"), where
    assert any(name == frontend and cmd.startswith("python3 -m dynamo.frontend --http-port 8000 --router-mode kv")
               for env, cmd, name in _procs(NODES[0], SIM_CLUSTER).values())
    # the workers' lines are parsed by ai-dynamo's own parser: an option Dynamo does not know fails as Dynamo fails
    bad = hostview.docker(SIM_CLUSTER, NODES[0], "exec", frontend, "python3", "-m", "dynamo.trtllm", "--model-path", "/models/qwen35",
                          "--no-such-option", "1", check=False)
    assert bad.returncode != 0 and "--no-such-option" in bad.stderr, (bad.returncode, bad.stderr[-2000:])

    # the live view's snapshot: every node, the frontend's /metrics read
    snap = top_once(SIM_CLUSTER, NODES)
    assert snap["server"]["host"] == NODES[0] and snap["system"] == "dynamo"
    # the benchmark through the frontend: every request answered, tokens counted
    res = run_invoke("bench", "--cluster", SIM_CLUSTER, "--concurrency", "2", "--requests", "4", "--output-tokens", "32",
                     "--input-tokens", "16", "--json", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    bench = json.loads(res.stdout)
    assert bench["ok"] and [(lv["concurrency"], lv["ok"], lv["errors"]) for lv in bench["levels"]] == [(2, 4, 0)], bench
    # ignore_eos asks for exactly --output-tokens: the mock engine stops there
    assert bench["levels"][0]["output_tokens"] == 4 * 32, bench["levels"][0]

    # a stop drains: the frontend, told to stop, finishes the stream it holds (the real in-flight gauge)
    stream = Stream(SIM_CLUSTER, NODES[0], "127.0.0.1", 8000, SERVED, 500, ignore_eos=False, timeout=120)
    assert stream.first() == "first"
    res = run_invoke("stop", "--cluster", SIM_CLUSTER)
    done, _, out = stream.end(timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    # the stop waited until the stream was done (deploy.drain_s is 10 s; 500 tokens take the mock engine about 3 s).
    # The frontend is told first (SIGTERM) and closes its listener: when the drain's first /metrics read comes
    # after that (seen under load), the real frontend's gauge cannot be read and the drain waits for the frontend
    # to exit with what it holds; else the gauge counts the stream. Either way the stream ends whole.
    gauge = f"drain: 1 request in flight on {NODES[0]} (dynamo_frontend_inflight_requests 1" in res.stdout
    exited = "drained: frontend finished what it held and exited" in res.stdout
    assert gauge or exited, res.stdout
    assert exited or f"drained: no request in flight on {NODES[0]}" in res.stdout, res.stdout
    assert done, out
    for node in NODES:
        assert _procs(node, SIM_CLUSTER) == {}, node
