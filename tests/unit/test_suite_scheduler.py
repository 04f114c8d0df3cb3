"""The suite's own xdist scheduler (tests/conftest.py ClusterScheduling),
driven with fake workers that run their tests the way an xdist worker does:
the next queued test only once it knows the one after it, or was told to
shut down. Every test runs once; a cluster's tests all on one worker; never
more than two workers on a cluster at once; the non-cluster tests fill a
third worker; nobody waits forever."""

from __future__ import annotations

import json
import random
import types

import pytest

from tests.conftest import CLUSTER_SCOPE, CLUSTERS_ENV, GROUPS_ENV, ClusterScheduling

CLUSTERS = {"sim-a": 6, "sim-b": 3, "sim-c": 1, "sim-d": 1, "sim-e": 2}


class Worker:
    def __init__(self, name: str):
        self.gateway = types.SimpleNamespace(id=name)
        self.queue: list[int] = []
        self.shutting_down = False

    def send_runtest_some(self, indices):
        assert not self.shutting_down, f"{self.gateway.id} was given tests after its shutdown"
        self.queue.extend(indices)

    def shutdown(self):
        self.shutting_down = True

    def runnable(self) -> bool:
        # xdist's worker runs a test once it has the next one, or at shutdown
        return len(self.queue) >= 2 or (self.shutting_down and bool(self.queue))


def _collection() -> tuple[list[str], dict[str, str]]:
    items, groups = [], {}
    for name, n in CLUSTERS.items():
        for i in range(n):
            nodeid = f"tests/integration/test_{name.replace('-', '_')}.py::test_{i}"
            items.append(nodeid)
            groups[nodeid] = name
    items += [f"tests/unit/test_u{i // 5}.py::test_{i}" for i in range(40)]
    return items, groups


@pytest.mark.parametrize("workers, clusters, seed", [(3, 2, 0), (3, 2, 1), (3, 2, 2), (2, 2, 3), (4, 2, 4), (3, 1, 5), (1, 2, 6)])
def test_every_test_runs_once_and_no_more_workers_than_allowed_are_on_a_cluster(tmp_path, monkeypatch, workers, clusters, seed):
    items, groups = _collection()
    (tmp_path / "gw0.json").write_text(json.dumps(groups))
    monkeypatch.setenv(GROUPS_ENV, str(tmp_path))
    monkeypatch.setenv(CLUSTERS_ENV, str(clusters))
    config = types.SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"], option=types.SimpleNamespace(loadscopereorder=True))
    sched = ClusterScheduling(config)
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    for node in nodes:
        sched.add_node(node)
        sched.add_node_collection(node, items)
    sched.schedule()

    rnd = random.Random(seed)
    ran: dict[str, str] = {}
    most = 0
    while True:
        ready = [n for n in nodes if n.runnable()]
        if not ready:
            break
        on_cluster = [n for n in nodes if n.queue and items[n.queue[0]] in groups]
        most = max(most, len(on_cluster))
        node = rnd.choice(ready)
        index = node.queue.pop(0)
        assert items[index] not in ran, f"{items[index]} ran twice"
        ran[items[index]] = node.gateway.id
        sched.mark_test_complete(node, index)

    assert sorted(ran) == sorted(items), f"never ran: {sorted(set(items) - set(ran))}"
    assert all(n.shutting_down and not n.queue for n in nodes), [(n.gateway.id, n.shutting_down, n.queue) for n in nodes]
    assert sched.tests_finished and not sched.has_pending
    for name in CLUSTERS:
        assert len({w for nodeid, w in ran.items() if groups.get(nodeid) == name}) == 1, name
    assert most <= clusters
    assert all(scope.startswith(CLUSTER_SCOPE) or "::" in scope for work in sched.assigned_work.values() for scope in work)
    if workers > clusters:
        # the workers not on a cluster ran tests that need none while the clusters ran
        assert len(set(ran.values())) == workers
