"""A node that is not what its platform declares, on the simulated A3 (issue
32): sim-a3-2's node.json edited to report 8 of its 16 NPUs (its npu-smi then
prints 8, as a real node with half its NPUs lost would). facts names the node
and both counts; prepare and deploy --skip-prepare refuse before anything
starts or changes on any node. The node is restored in ``finally``."""

import json

from llmdeploy.release import parse_ledger_checked
from sim import hardware, hostview
from sim.paths import host_dir
from tests.conftest import run_invoke

from .conftest import facts_json

SIM_CLUSTER = "sim-a3"
NODES = [f"sim-a3-{i}" for i in range(4)]
ODD = "sim-a3-2"
SAID = f"{ODD} reports 8 NPUs, platform a3 declares 16"


class _HalfTheNpus:
    """``ODD`` reports the first 8 of its NPUs for the duration of a with-block."""

    path = host_dir(SIM_CLUSTER, ODD) / "root/etc/llmdeploy-sim"

    def __enter__(self):
        self.saved = hardware.load(self.path)
        hardware.save(self.path, dict(self.saved, npus=self.saved["npus"][:8]))
        return self

    def __exit__(self, *exc):
        hardware.save(self.path, self.saved)


def _ledger() -> list[dict]:
    path = host_dir(SIM_CLUSTER, "sim-a3-0") / "root/var/lib/llmdeploy/sim-a3/ledger.jsonl"
    if not path.exists():
        return []
    records, bad = parse_ledger_checked(path.read_text())
    assert bad == []
    return records


def _containers() -> dict[str, list[str]]:
    return {n: sorted(hostview.docker(SIM_CLUSTER, n, "ps", "-a", "--format", "{{.Names}}").stdout.split()) for n in NODES}


def test_a_node_reporting_half_its_npus_is_named_and_nothing_starts(sim_cluster):
    with _HalfTheNpus():
        res, doc = facts_json(sim_cluster)
        assert doc is not None, res.stdout + res.stderr
        f = doc["hosts"][ODD]["facts"]
        assert len(f["devices"]) == 8 and f["platform_mismatch"] == [SAID], f.get("platform_mismatch")
        assert f["problems"][0] == SAID
        assert all("platform_mismatch" not in doc["hosts"][n]["facts"] for n in NODES if n != ODD)

        ledger, containers = _ledger(), _containers()
        res = run_invoke("prepare", "--cluster", sim_cluster, "--json", "--no-check", timeout=400)
        assert res.returncode != 0, res.stdout + res.stderr
        doc = json.loads(res.stdout)
        assert doc["steps"]["platform"][ODD] == {"status": "failed", "msg": SAID}
        # the playbook stopped at the platform play: no later check, no change on any node
        assert list(doc["steps"]) == ["facts", "platform"], list(doc["steps"])
        assert doc["changed"] == 0

        res = run_invoke("deploy", "--cluster", sim_cluster, "--skip-prepare", "--force", timeout=400)
        assert res.returncode != 0
        assert f"deploy refused: {sim_cluster}: {SAID}; nothing was started or changed on any node" in res.stdout + res.stderr
        assert _ledger() == ledger and _containers() == containers
