"""Dynamo 3P2D on five simulated GB300 nodes (issue 19): three P4-DEP prefill
workers and two D4-B32 decode workers behind one KV-aware router. One decode
worker dies after the release was healthy; `status` names it; a whole-release
`restart` brings it back healthy, although the router sends the readiness
check's one request to one prefill and one decode worker only (the others
have served nothing).
Every worker registers the served model name, and none of them keeps the
weight-loading variable (a non-colocated topology).

Waits are on events: a process's exit (pidfd), a container's state as
`status` reports it; never on a sleep or a time bound."""

import json
import os
import select
import signal
import subprocess
import sys
import time

import pytest

from llmdeploy.release import parse_ledger
from sim import hostview
from sim.paths import host_dir, netns_name
from tests.conftest import run_invoke
from tests.integration.conftest import wheels_builds, wheels_image_ids
from tests.integration.test_deploy_trtllm import _procs

SIM_CLUSTER = "sim-gb300-3p2d"
NODES = [f"sim-gb300-3p2d-{i}" for i in range(5)]
# worker -> (node of its ranks, DYN_SYSTEM_PORT): the placement of inventory/sim_gb300_3p2d.py
WORKERS = {"prefill0": (NODES[0], 8081), "prefill1": (NODES[1], 8082), "prefill2": (NODES[2], 8083),
           "decode0": (NODES[3], 8084), "decode1": (NODES[4], 8085)}
SERVED = "nvidia/Qwen3.5-397B-A17B-NVFP4-V2"
WEIGHTS = "TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL"


def _base():
    return host_dir(SIM_CLUSTER, NODES[0]) / f"root/var/lib/llmdeploy/{SIM_CLUSTER}"


def _get(node: str, port: int, path: str) -> str:
    """GET http://127.0.0.1:port/path inside the simulated host ``node``."""
    code = ("import sys, urllib.request; "
            "sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())")
    res = subprocess.run(["ip", "netns", "exec", netns_name(SIM_CLUSTER, node), sys.executable, "-c", code,
                          f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _worker_procs(worker: str) -> dict[int, tuple[dict, str]]:
    """The processes of ``worker``'s container on its node: those whose
    environment (from the container's env file) has its DYN_SYSTEM_PORT."""
    node, port = WORKERS[worker]
    return {pid: (env, cmd) for pid, (env, cmd, _) in _procs(node, SIM_CLUSTER).items() if env.get("DYN_SYSTEM_PORT") == str(port)}


def _ranks(worker: str) -> dict[int, tuple[dict, str]]:
    return {int(env["OMPI_COMM_WORLD_RANK"]): (env, cmd) for env, cmd in _worker_procs(worker).values()
            if "OMPI_COMM_WORLD_RANK" in env and "dynamo.trtllm" in cmd}


def _wait_gone(pids) -> None:
    """Until every one of ``pids`` has exited (a pidfd turns readable when its process ends)."""
    fds = []
    for pid in pids:
        try:
            fds.append(os.pidfd_open(pid))
        except ProcessLookupError:
            continue
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    left = set(fds)
    while left:
        for fd, _ in poller.poll():
            poller.unregister(fd)
            left.discard(fd)
            os.close(fd)


def _status() -> tuple[int, dict]:
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    return res.returncode, json.loads(res.stdout)


def _served() -> dict[str, bool]:
    """worker -> whether its system port's /metrics counts a request on its
    generate endpoint (Dynamo's dynamo_component_requests_total)."""
    out = {}
    for w, (node, port) in WORKERS.items():
        total = 0.0
        for ln in _get(node, port, "/metrics").splitlines():
            if ln.startswith("dynamo_component_requests_total{") and 'dynamo_endpoint="generate"' in ln:
                total += float(ln.rsplit(" ", 1)[1])
        out[w] = total > 0
    return out


@pytest.mark.slow
def test_3p2d_restarts_whole_after_a_decode_worker_died(sim_cluster):
    since = int(time.time()) - 1
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    # one pip install for the cluster (node 0's), the same image ID on every node
    assert wheels_builds(SIM_CLUSTER, NODES, since) == {n: int(n == NODES[0]) for n in NODES}
    assert len(set(wheels_image_ids(SIM_CLUSTER, NODES).values())) == 1
    assert "(dynamo: etcd -> nats -> frontend -> prefill0 -> prefill1 -> prefill2 -> decode0 -> decode1)" in res.stdout
    rid = parse_ledger((_base() / "ledger.jsonl").read_text())[-1]["release"]

    # every worker registered the served name: the frontend lists it and nothing else
    models = json.loads(_get(NODES[0], 8000, "/v1/models"))
    assert [m["id"] for m in models["data"]] == [SERVED]
    for w, (node, _) in WORKERS.items():
        ranks = _ranks(w)
        assert sorted(ranks) == [0, 1, 2, 3], (w, sorted(ranks))
        for env, cmd in ranks.values():
            assert f"--served-model-name {SERVED} " in cmd, (w, cmd)
            assert WEIGHTS not in env, (w, env.get(WEIGHTS))  # 3P2D is not the colocated 1P1D
        serve = host_dir(SIM_CLUSTER, node) / f"root/var/lib/llmdeploy/{SIM_CLUSTER}/releases/{rid}/{w}.serve.sh"
        assert f"unset {WEIGHTS}" in serve.read_text().splitlines(), w

    code, doc = _status()
    assert code == 0 and doc["healthy"], doc

    # decode1's rank 0 dies; its MPI group, and so its container, end with it
    procs = _worker_procs("decode1")
    rank0 = [pid for pid, (env, cmd) in procs.items() if env.get("OMPI_COMM_WORLD_RANK") == "0" and "dynamo.trtllm" in cmd]
    assert len(rank0) == 1, procs
    os.kill(rank0[0], signal.SIGKILL)
    _wait_gone(procs)
    decode1 = f"{SIM_CLUSTER}-{rid}-decode1"
    hostview.docker(SIM_CLUSTER, NODES[4], "wait", decode1)  # until its daemon has recorded the container's exit
    code, doc = _status()
    assert code == 1 and not doc["healthy"]
    assert doc["nodes"][NODES[4]]["units"][decode1]["state"].startswith("exited")
    assert f"decode container {decode1} exited" in doc["nodes"][NODES[4]]["reason"]

    # the whole release, in order: healthy, whichever workers the router sent the readiness request to
    res = run_invoke("restart", "--cluster", SIM_CLUSTER, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{SIM_CLUSTER} healthy" in res.stdout and f"release {rid} restarted" in res.stdout
    assert "has no trtllm_kv_cache_utilization sample" not in res.stdout + res.stderr
    code, doc = _status()
    assert code == 0 and doc["healthy"], doc
    assert sorted(_ranks("decode1")) == [0, 1, 2, 3]
    # readiness sent the seed's one request (again after any restart of a unit): it reached one
    # prefill and one decode worker; the others served nothing
    served = _served()
    assert any(served.values()) and not all(served.values()), served
    assert {w.rstrip("0123456789") for w, yes in served.items() if yes} == {"prefill", "decode"}, served
    # the frontend names the prefill and the decode worker it sent to, by worker id (its per-worker gauges)
    routed: dict[str, set[str]] = {}
    for ln in _get(NODES[0], 8000, "/metrics").splitlines():
        if ln.startswith("dynamo_frontend_worker_last_") and "worker_id=" in ln:
            labels = dict(kv.split("=", 1) for kv in ln[ln.index("{") + 1:ln.rindex("}")].split(","))
            routed.setdefault(labels["worker_type"].strip('"'), set()).add(labels["worker_id"].strip('"'))
    assert set(routed) == {"prefill", "decode"} and all(routed.values()), routed

    res = run_invoke("stop", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0, res.stdout + res.stderr
    for node in NODES:
        assert _procs(node, SIM_CLUSTER) == {}, node
