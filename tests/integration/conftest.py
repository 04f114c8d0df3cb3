import json
import subprocess
import time

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


# a streaming client run inside a node's network namespace: argv host, port, model, max_tokens, ignore_eos (1/0),
# the connection's timeout in seconds;
# prints "first" at the first chunk, "abort" for an aborted one, then "done N" or "cut N" (and "error ..." on a failure)
STREAM_CLIENT = """
import http.client, json, sys
host, port, model, tokens, ignore_eos = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
conn = http.client.HTTPConnection(host, port, timeout=float(sys.argv[6]))
body = {"model": model, "messages": [{"role": "user", "content": "count"}], "stream": True, "max_tokens": tokens}
if ignore_eos:
    body["ignore_eos"] = True
chunks, done = 0, False
try:
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    while line := resp.readline():
        if line.startswith(b"data: [DONE]"):
            done = True
        elif line.startswith(b"data:"):
            chunks += 1
            if chunks == 1:
                print("first", flush=True)
            if b'"finish_reason": "abort"' in line or b'"finish_reason":"abort"' in line:
                print("abort", flush=True)
except (OSError, http.client.HTTPException) as exc:
    print("error", type(exc).__name__, exc, flush=True)
print("done" if done else "cut", chunks, flush=True)
"""


class Stream:
    """One long streamed chat request to ``host:port``, from inside ``node``'s
    network namespace (the test reaches no other address)."""

    def __init__(self, cluster: str, node: str, host: str, port: int, model: str, tokens: int, ignore_eos: bool = True,
                 timeout: float = 60):
        import sys

        from sim.paths import netns_name

        self.proc = subprocess.Popen(["ip", "netns", "exec", netns_name(cluster, node), sys.executable, "-c", STREAM_CLIENT,
                                      host, str(port), model, str(tokens), "1" if ignore_eos else "0", str(timeout)],
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)

    def first(self) -> str:
        return self.proc.stdout.readline().strip()

    def end(self, timeout: float = 90) -> tuple[bool, int, str]:
        """(got [DONE], chunks, all it said)."""
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        last = out.strip().splitlines()[-1].split()
        return last[0] == "done", int(last[1]), out


def wheels_builds(cluster: str, nodes: list[str], since: int) -> dict[str, int]:
    """How many times each node's own dockerd created prepare's wheels
    container (``llmdeploy-wheels-<cluster>``: one pip install) since the
    Unix time ``since``, from Docker's event log."""
    from sim import hostview

    name = f"llmdeploy-wheels-{cluster}"
    got = {}
    for n in nodes:
        out = hostview.docker(cluster, n, "events", "--since", str(since), "--until", str(int(time.time()) + 1),
                              "--filter", "type=container", "--filter", "event=create", "--format", "{{.Actor.Attributes.name}}").stdout
        got[n] = out.split().count(name)
    return got


def wheels_image_ids(cluster: str, nodes: list[str]) -> dict[str, str]:
    """Each node's image ID of the image with the pinned wheels (roles.wheels.derived_ref)."""
    from llmdeploy.inventory import load_cluster
    from roles import wheels
    from sim import hostview

    ref = wheels.derived_ref(load_cluster(cluster))
    return {n: hostview.docker(cluster, n, "image", "inspect", "--format", "{{.Id}}", ref).stdout.strip() for n in nodes}
