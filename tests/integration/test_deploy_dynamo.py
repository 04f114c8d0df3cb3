"""invoke deploy of Dynamo disaggregated serving on a simulated GB300 node
(1P1D decode batch 8): real etcd and NATS in their containers, the frontend,
prefill and decode MPI groups; a SIGKILLed decode worker named by status at
once, while NVIDIA's frontend still lists it (until its etcd lease expires);
status, logs of every unit (and of one service), restart of one service,
rollback and stop."""

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from llmdeploy.release import parse_ledger
from sim import hostview
from sim.paths import host_dir, netns_name
from tests.conftest import REPO, run_invoke
from tests.integration.test_deploy_trtllm import _procs

SIM_CLUSTER = "sim-gb300-agentic"
NODE = "sim-gb300-0"


def _base():
    return host_dir(SIM_CLUSTER, NODE) / "root/var/lib/llmdeploy/sim-gb300-agentic"


def _state():
    return host_dir(SIM_CLUSTER, NODE) / "root/etc/llmdeploy-sim"


def _ledger():
    return parse_ledger((_base() / "ledger.jsonl").read_text())


def _containers():
    return hostview.containers(SIM_CLUSTER, NODE)


def _cmds():
    return [cmd for env, cmd, _ in _procs(NODE, SIM_CLUSTER).values()]


def _get(port: int, path: str) -> str:
    """GET http://127.0.0.1:port/path inside the simulated host."""
    code = "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=30).read().decode())"
    res = subprocess.run(["ip", "netns", "exec", netns_name(SIM_CLUSTER, NODE), sys.executable, "-c", code,
                          f"http://127.0.0.1:{port}{path}"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return res.stdout


@pytest.mark.slow
def test_dynamo_end_to_end(sim_cluster, tmp_path):
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "(dynamo: etcd -> nats -> frontend -> prefill0 -> decode0)" in res.stdout
    a = _ledger()[-1]["release"]
    assert _ledger()[-1]["result"] == "good"
    services = ["etcd", "nats", "frontend", "prefill0", "decode0"]
    assert _containers() == {f"{SIM_CLUSTER}-{a}-{s}": "running" for s in services}
    # the real control plane, with its data in the release
    cmds = _cmds()
    # (their state in the container: discovery state of the processes that run now)
    assert any(c.startswith("etcd ") and "--data-dir /etcd-data" in c for c in cmds)
    assert any(c.startswith("nats-server -js -p 4222 -m 8222 -sd /nats-data") for c in cmds)
    rel = _base() / "releases" / a
    decode = yaml.safe_load((rel / "decode0.config.yaml").read_text())
    assert decode["max_batch_size"] == 8 and decode["speculative_config"]["max_draft_len"] == 6
    assert decode["cache_transceiver_config"]["kv_cache_bounce_size_mb"] == 2048  # colocated 1P1D keeps it
    assert "ETCD_LEASE_TTL=120" in (rel / "frontend.env").read_text()
    assert "CUDA_VISIBLE_DEVICES=1,2" in (rel / "decode0.env").read_text()

    doc = json.loads(run_invoke("status", "--cluster", SIM_CLUSTER, "--json").stdout)
    assert doc["healthy"] and doc["system"] == "dynamo"
    assert sorted(u["service"] for u in doc["nodes"][NODE]["units"].values()) == sorted(services)

    # logs: every unit of the node, in start order, each line prefixed with its service; --service picks one
    res = run_invoke("logs", "--cluster", SIM_CLUSTER, "--tail", "3")
    assert res.returncode == 0, res.stderr
    seen = list(dict.fromkeys(ln.split(" | ", 1)[0] for ln in res.stdout.splitlines()))
    assert seen == [f"{NODE}/{s}" for s in services], res.stdout
    res = run_invoke("logs", "--cluster", SIM_CLUSTER, "--service", "decode0", "--tail", "20")
    assert res.returncode == 0 and {ln.split(" | ", 1)[0] for ln in res.stdout.splitlines()} == {f"{NODE}/decode0"}, res.stdout
    bad = run_invoke("logs", "--cluster", SIM_CLUSTER, "--service", "decode9")
    assert bad.returncode == 1 and "services there: decode0, etcd, frontend, nats, prefill0" in bad.stderr, bad.stderr

    # one decode worker dies after healthy: status names it, restart brings the instance back
    pids = [pid for pid, (env, cmd, name) in _procs(NODE, SIM_CLUSTER).items()
            if (name or "").endswith("-decode0") and env.get("OMPI_COMM_WORLD_RANK") == "0" and "dynamo" in cmd]
    assert pids, "no decode rank 0"
    os.kill(pids[0], signal.SIGKILL)
    decode0 = f"{SIM_CLUSTER}-{a}-decode0"
    hostview.docker(SIM_CLUSTER, NODE, "wait", decode0)  # mpirun ended the group, and with it the container
    res = run_invoke("status", "--cluster", SIM_CLUSTER, "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 1 and not doc["healthy"]
    assert doc["nodes"][NODE]["units"][decode0]["state"].startswith("exited")
    assert f"decode container {decode0} exited" in doc["nodes"][NODE]["reason"], doc["nodes"][NODE]
    # ... while the real frontend still lists the dead worker and its model: its etcd lease has not expired yet
    models = json.loads(_get(8000, "/v1/models"))
    assert [m["id"] for m in models["data"]] == ["nvidia/Qwen3.5-397B-A17B-NVFP4-V2"], models
    res = run_invoke("restart", "--cluster", SIM_CLUSTER, "--service", "decode0", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "decode0 is back" in res.stdout
    assert run_invoke("status", "--cluster", SIM_CLUSTER).returncode == 0
    # the control plane is not restarted alone
    assert run_invoke("restart", "--cluster", SIM_CLUSTER, "--service", "etcd").returncode == 1

    # a second release, then rollback to the first from its own files
    inv = tmp_path / "inventory"
    inv.mkdir()
    text = (REPO / "inventory" / "sim_gb300_agentic.py").read_text()
    assert 'dynamo_gb300("1P1D-B8", ' in text
    (inv / "sim_gb300_agentic.py").write_text(text.replace('dynamo_gb300("1P1D-B8", ', 'dynamo_gb300("1P1D-B4", '))
    res = run_invoke("deploy", "--cluster", SIM_CLUSTER, "--skip-prepare", env={"LLMDEPLOY_INVENTORY": str(inv)}, timeout=400)
    assert res.returncode == 0, res.stdout + res.stderr
    b = _ledger()[-1]["release"]
    assert yaml.safe_load((_base() / "releases" / b / "decode0.config.yaml").read_text())["max_batch_size"] == 4
    res = run_invoke("rollback", "--cluster", SIM_CLUSTER, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{b} -> {a}" in res.stdout and f"serving, release {a}, healthy" in res.stdout
    assert _containers() == {f"{SIM_CLUSTER}-{a}-{s}": "running" for s in services}

    # stop: workers first, the control plane last, nothing left running
    res = run_invoke("stop", "--cluster", SIM_CLUSTER)
    assert res.returncode == 0, res.stdout + res.stderr
    order = [line.split("stopped ")[1].rsplit("-", 1)[1] for line in res.stdout.splitlines() if f"stopped {SIM_CLUSTER}-" in line]
    assert order == ["decode0", "prefill0", "frontend", "nats", "etcd"]
    assert _containers() == {} and _procs(NODE, SIM_CLUSTER) == {}
