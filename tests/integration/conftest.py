import json
import subprocess

import pytest

from sim.cluster import DOCKER_TMPFS_ENV
from tests.conftest import run_invoke, sim_possible

# how the tests bring up a simulated cluster: each host's Docker data root on
# a tmpfs in its own mount namespace (sim/cluster.py), so that sim.down
# deletes no pulled image from disk (6 s at least for sim-a3, up to 100 s
# while the machine was busy: a third of the sim-a3 modules' time went there)
SIM_ENV = {DOCKER_TMPFS_ENV: "4g"}


def pytest_collection_modifyitems(config, items):
    reason = sim_possible()
    if reason:
        # CI runs as root; a laptop without root sees why these are skipped
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


def _sim(name):
    res = run_invoke("sim.up", "--cluster", name, env=SIM_ENV)
    if res.returncode != 0:
        run_invoke("sim.down", "--cluster", name)
        raise RuntimeError(f"sim.up {name} failed: {res.stderr}{res.stdout}")
    return name


@pytest.fixture(scope="module")
def sim_cluster(request):
    """Bring up the simulated cluster named by the test module's SIM_CLUSTER;
    always taken down again, also when a test fails.

    One cluster per module, not one shared by the modules that name the same
    cluster: with the Docker data roots on tmpfs (SIM_ENV), sim.up of sim-a3
    takes ~1.5 s and sim.down ~2.5 s, which is all a shared cluster could
    save per module, and what a module leaves (releases, ledger and lock
    under /var/lib/llmdeploy, pulled and loaded images, containers, node.json
    faults, links set down, mounts and processes inside a host) would need a
    reset at least as long; a fresh cluster is the complete reset."""
    name = request.module.SIM_CLUSTER
    try:
        yield _sim(name)
    finally:
        run_invoke("sim.down", "--cluster", name)


def facts_json(cluster, *extra):
    res = run_invoke("facts", "--cluster", cluster, "--json", *extra)
    return res, (json.loads(res.stdout) if res.stdout.strip().startswith("{") else None)


def netns_list():
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def top_once(cluster: str, nodes: list[str]) -> dict:
    """``invoke top --once --json`` on a serving cluster: every node reachable
    with its units running, the server's metrics page read."""
    res = run_invoke("top", "--cluster", cluster, "--once", "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    doc = json.loads(res.stdout)
    assert [n["host"] for n in doc["nodes"]] == nodes
    for n in doc["nodes"]:
        assert n["reachable"] and n["units"] and all(u["state"] == "running" for u in n["units"]), n
        assert n["accelerators"] and all(a["mem_total_mib"] for a in n["accelerators"]), n
    s = doc["server"]
    assert s["answers"] and s["status"] == 200 and s["running"] is not None and s["waiting"] is not None, s
    return doc
