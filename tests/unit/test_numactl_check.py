"""``deploy --check`` shows the exact worker command of Dynamo, ``numactl -m``
included (issue 19): the start step puts ``numactl -m 0,1`` before
``trtllm-llmapi-launch`` from prepare's record (the GB200/GB300 NUMA layout)
or from the inventory (``numa_membind``). Check mode reads no node: where the
inventory decides, the command is exact; where only prepare's record can
(``numa_membind`` auto), the check output names that record and where it is."""

from __future__ import annotations

import json
import shlex
import textwrap

import pytest

from flows import deploy as dep
from flows.binding import bind
from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import load_cluster
from llmdeploy.serving import PreparedNode
from systems.dynamo import numa
from tests.conftest import run_invoke

RECORD = "/var/lib/llmdeploy/t-numa/prepared.json"
INVENTORY = """
from llmdeploy.inventory import Budget, Cluster, Model, make_nodes
from systems.dynamo.catalogue import IMAGE_DYNAMO, dynamo_gb300, image
cluster = Cluster(name="t-numa", platform="gb300", nic="eth0", nodes=make_nodes("t-numa-", 5, "198.51.100.80"),
                  model=Model(path="/models/Qwen3.5-397B-A17B-NVFP4-V2"), image=image(IMAGE_DYNAMO), budget=Budget(weights_host_gib=208),
                  profile=dynamo_gb300("1P2D", recipes_dir="/opt/TensorRT-LLM", numa_membind="{membind}"))
"""


@pytest.fixture
def cluster_with(tmp_path, monkeypatch):
    """An inventory file for a 1P2D cluster with that numa_membind; returns (cluster, its inventory directory)."""
    def make(membind: str):
        inv = tmp_path / membind.replace(",", "_") / "inventory"
        inv.mkdir(parents=True)
        (inv / "t_numa.py").write_text(textwrap.dedent(INVENTORY.format(membind=membind)))
        monkeypatch.setenv("LLMDEPLOY_INVENTORY", str(inv))
        return load_cluster("t-numa"), inv
    return make


def _launchers(plan):
    """{worker: (its launcher unit, the exec line of its serve.sh as tokens)}."""
    out = {}
    for u in plan.units():
        if u.role in ("prefill", "decode") and "serve_command" in u.show:
            svc = plan.service_of(u).name
            script = plan.files[u.host][f"{svc}.serve.sh"][0]
            out[svc] = (u, shlex.split(script.rstrip("\n").splitlines()[-1]))
    return out


def _before_launch(tokens: list[str]) -> list[str]:
    at = tokens.index("trtllm-llmapi-launch")
    return tokens[at - 3:at]


def test_the_pure_decision(cluster_with):
    c, _ = cluster_with("auto")
    n = c.nodes[1]
    prefix, why = numa.membind(c, c.profile, n, None)
    assert prefix is None
    assert f"the binding prepare records in {RECORD} on t-numa-1 decides" in why and "Grace-Blackwell" in why
    assert numa.membind(c, c.profile, n, PreparedNode.from_record({"binding": {"kind": "numactl", "prefix": "numactl -m 0,1"}}))[0] == ["numactl", "-m", "0,1"]
    assert numa.membind(c, c.profile, n, PreparedNode.from_record({"binding": {"kind": "none", "reason": "not the Grace-Blackwell layout"}})) == (
        [], "the prepare record of t-numa-1 (binding: not the Grace-Blackwell layout)")
    c, _ = cluster_with("0,1")
    assert numa.membind(c, c.profile, n, None)[0] == ["numactl", "-m", "0,1"]
    c, _ = cluster_with("off")
    assert numa.membind(c, c.profile, n, None) == ([], "profile.numa_membind is off")


@pytest.mark.parametrize("prefix", ["rm -rf /tmp/x", "numactl -m 0,1 sh -c id", "numactl --interleave all", "numactl -m '0;id'", ["numactl"]])
def test_a_record_whose_prefix_is_not_a_membind_is_refused(cluster_with, prefix):
    # the record comes from the node: nothing but numactl -m <NUMA nodes> goes in front of the launch
    c, _ = cluster_with("auto")
    with pytest.raises(LlmdeployError, match=r"t-numa-1: .*prepared.json: binding.prefix .* is not 'numactl -m <NUMA nodes>'"):
        numa.membind(c, c.profile, c.nodes[1], PreparedNode.from_record({"binding": {"kind": "numactl", "prefix": prefix}}))
    assert numa.membind(c, c.profile, c.nodes[1], PreparedNode.from_record({"binding": {"kind": "numactl", "prefix": "numactl -m 0-1,4"}}))[0] == ["numactl", "-m", "0-1,4"]


def test_check_shows_numactl_when_the_inventory_decides(cluster_with):
    c, inv = cluster_with("0,1")
    _, _, plan = dep.plan_release(bind(c), {}, "sha256:x")  # no prepare record: what --check builds
    launchers = _launchers(plan)
    assert sorted(launchers) == ["decode0", "decode1", "prefill0"]
    for worker, (u, tokens) in launchers.items():
        # the file the node runs and the line --check shows: numactl right before trtllm-llmapi-launch
        assert _before_launch(tokens) == ["numactl", "-m", "0,1"], worker
        assert "numactl -m 0,1 trtllm-llmapi-launch python3 -m dynamo.trtllm" in u.show["serve_command"]
        assert u.show["numactl"]["prefix"] == "numactl -m 0,1" and "profile.numa_membind 0,1" in u.show["numactl"]["decided_by"]
    res = run_invoke("deploy", "--cluster", "t-numa", "--check", env={"LLMDEPLOY_INVENTORY": str(inv)})
    assert res.returncode == 0, res.stderr
    shown = [ln for ln in res.stdout.splitlines() if ln.startswith("  serve (decode0): ")]
    assert len(shown) == 1 and "numactl -m 0,1 trtllm-llmapi-launch" in shown[0]


def test_check_names_the_record_that_decides_when_only_prepare_knows(cluster_with):
    c, inv = cluster_with("auto")
    _, _, plan = dep.plan_release(bind(c), {}, "sha256:x")
    for worker, (u, tokens) in _launchers(plan).items():
        assert "numactl" not in tokens, worker
        assert u.show["numactl"]["prefix"] is None
        host = u.host
        note = f"[numactl -m 0,1 or nothing: profile.numa_membind auto: the binding prepare records in {RECORD} on {host} decides"
        assert note in u.show["serve_command"], worker
        assert u.show["serve_command"].index(note) < u.show["serve_command"].index("trtllm-llmapi-launch")
    res = run_invoke("deploy", "--cluster", "t-numa", "--check", "--json", env={"LLMDEPLOY_INVENTORY": str(inv)})
    assert res.returncode == 0, res.stderr
    units = [u for n in json.loads(res.stdout)["nodes"] for u in n["units"] if u["service"] == "decode1"]
    (launcher,) = [u for u in units if "serve_command" in u]
    assert launcher["numactl"]["prefix"] is None and RECORD in launcher["numactl"]["decided_by"]
    res = run_invoke("deploy", "--cluster", "t-numa", "--check", env={"LLMDEPLOY_INVENTORY": str(inv)})
    text = " ".join(res.stdout.split())
    assert "serve (decode1): mpirun" in text and "decides (numactl -m 0,1 where prepare finds the Grace-Blackwell NUMA layout" in text


def test_with_prepare_records_the_command_is_what_the_records_say(cluster_with):
    """The deploy itself (records read from the nodes): numactl exactly where prepare recorded it."""
    c, _ = cluster_with("auto")
    gb = {"binding": {"kind": "numactl", "prefix": "numactl -m 0,1"}}
    other = {"binding": {"kind": "none", "reason": "not the Grace-Blackwell layout"}}
    records = {n.name: (gb if i != 3 else other) for i, n in enumerate(c.nodes)}
    _, _, plan = dep.plan_release(bind(c), records, "sha256:x")
    launchers = _launchers(plan)
    for worker, (u, tokens) in launchers.items():
        bound = records[u.host] is gb
        assert (_before_launch(tokens) == ["numactl", "-m", "0,1"]) is bound, worker
        assert "or nothing" not in u.show["serve_command"]
        assert u.show["numactl"]["prefix"] == ("numactl -m 0,1" if bound else "")
    # decode1's launcher is node 3, whose record says no binding
    assert launchers["decode1"][0].host == c.nodes[3].name
