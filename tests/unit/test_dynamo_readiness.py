"""Dynamo readiness passes whichever prefill and decode worker the router
picks. The engine's watch runs the release plan's real probes and body
checks (flows.probes) against a cluster made of the Dynamo stand-in's own
parts (sim/standins/dynamo.py: the frontend's /health body, each worker
rank 0's /health, /metrics and request handling); only the HTTP transport
and the container states are replaced. A worker shows
trtllm_kv_cache_utilization only after it served a request, as a real one does."""

from __future__ import annotations

import itertools
import json

import pytest
from rich.console import Console

from flows import deploy as dep
from flows import engine as engine_mod
from flows import probes
from llmdeploy.inventory import Budget, Cluster, Model, make_nodes
from systems.dynamo.catalogue import IMAGE_DYNAMO, dynamo_gb300, image
from systems.dynamo import workers as dynamo
from sim.standins import dynamo as dy

TOPOLOGIES = list(dynamo.TOPOLOGIES)  # every topology of the seed


def cluster_of(topology: str) -> Cluster:
    return Cluster(name=f"t-{topology.lower()}", platform="gb300", nic="eth0",
                   nodes=make_nodes("n", dynamo.TOPOLOGIES[topology].nodes, "198.51.100.10"),
                   model=Model(path="/models/Qwen3.5-397B-A17B-NVFP4-V2"), image=image(IMAGE_DYNAMO), budget=Budget(weights_host_gib=208),
                   profile=dynamo_gb300(topology, recipes_dir="/opt/TensorRT-LLM"))


class FakeDynamo:
    """A release's frontend and workers from the stand-in's parts. ``pick``
    chooses (prefill index, decode index) for each chat request, as the
    router would; ``registered`` says which workers' instances etcd holds."""

    def __init__(self, c: Cluster, pick, registered=None):
        self.c, self.pick = c, pick
        self.workers = dynamo.placement(c, c.profile)
        self.rank0 = {}
        self.instances = []
        served = c.profile.served_model_name
        for i, w in enumerate(self.workers):
            info = {"namespace": c.profile.namespace, "component": w.role, "endpoint": "generate", "mode": w.role,
                    "model": dy.registered_model_name(served, c.profile.model_mount), "model_path": c.profile.model_mount,
                    "tp": w.tp, "pp": 1, "ep": w.ep, "publish_metrics": True, "system_port": w.system_port}
            r0 = dy.WorkerRank0(info, {}, w.ranks, {}, {}, lambda *a: None, "", "x")
            r0.all_joined.set()
            r0.ready = registered is None or w.name in registered
            self.rank0[w.name] = r0
            if r0.ready:
                self.instances.append({**{k: info[k] for k in ("namespace", "component", "endpoint", "mode", "model")},
                                       "instance_id": i + 1, "transport": {"tcp": f"{w.rank0_node}:{w.system_port}"}})
        self.chats: list[tuple[str, str]] = []

    def answer(self, host: str, port: int, method: str, path: str, body) -> tuple[int, bytes]:
        prof = self.c.profile
        if host == self.c.node0.name and port == prof.frontend_port:
            if path == "/health":
                return 200, json.dumps(dy.frontend_health(self.instances)).encode()
            if path == "/v1/models":
                return 200, json.dumps({"object": "list", "data": [{"id": m} for m in dy.models_of(self.instances)]}).encode()
            if method == "POST" and path == "/v1/chat/completions":
                return self.chat(body)
        for w in self.workers:
            if (host, port) == (w.rank0_node, w.system_port):
                r0 = self.rank0[w.name]
                if path == "/health":
                    code, doc = dy.worker_health(r0.healthy(), r0.endpoint)
                    return code, json.dumps(doc).encode()
                if path == "/metrics":
                    return 200, r0.metrics().encode()
        raise ConnectionRefusedError(f"nothing listens on {host}:{port}")

    def chat(self, req: dict) -> tuple[int, bytes]:
        if req.get("model") not in dy.models_of(self.instances):
            return 404, b'{"message":"Model not found"}'
        prefills = [w for w in self.workers if w.role == "prefill"]
        decodes = [w for w in self.workers if w.role == "decode"]
        i, j = self.pick(len(self.chats), len(prefills), len(decodes))
        p, d = prefills[i], decodes[j]
        base = {"messages": req["messages"], "max_tokens": req.get("max_tokens")}
        code, pre = self.rank0[p.name].generate({**base, "phase": "prefill"})
        assert code == 200, pre
        code, dec = self.rank0[d.name].generate({**base, "phase": "decode", "disaggregated_params": pre["disaggregated_params"]})
        assert code == 200, dec
        self.chats.append((p.name, d.name))
        return 200, json.dumps({"choices": [{"message": {"role": "assistant", "content": dec["text"]}}]}).encode()


def watch(fake: FakeDynamo, monkeypatch, ready_timeout_s: float = 30) -> tuple[bool, engine_mod.Outcome, object]:
    """Engine.watch over the plan of ``fake.c`` with the HTTP answered by ``fake``
    (through flows.probes.http_probe and its checks) and every container running."""
    c = fake.c
    _, _, plan = dep.plan_release(c, {}, "sha256:x")

    def http_via_ssh(runner, node, port, method, path, body, timeout, headers=None, dest="127.0.0.1"):
        return fake.answer(node.name, port, method, path, body)

    monkeypatch.setattr(probes, "http_via_ssh", http_via_ssh)

    class Engine(engine_mod.Engine):
        def states(self, plan, units=None):
            return {engine_mod.unit_key(u): ("running", "") for u in (units or plan.units())}

    eng = Engine(c, None, Console(quiet=True), quiet=True)
    eng.d = c.deploy.model_copy(update={"poll_s": 0.01, "ready_timeout_s": ready_timeout_s})
    out = engine_mod.Outcome(ok=False, release=plan.release)
    return eng.watch(plan, out), out, plan


def _picks(c: Cluster):
    roles = [w.role for w in dynamo.placement(c, c.profile)]
    return list(itertools.product(range(roles.count("prefill")), range(roles.count("decode"))))


@pytest.mark.parametrize("topology", TOPOLOGIES)
def test_readiness_passes_whichever_workers_the_router_picks(topology, monkeypatch):
    c = cluster_of(topology)
    for i, j in _picks(c):
        # a router that sends every request to the same pair (session affinity, KV reuse)
        fake = FakeDynamo(c, lambda n, np_, nd, i=i, j=j: (i, j))
        ok, out, plan = watch(fake, monkeypatch)
        assert ok, (topology, i, j, out.reason)
        assert fake.chats, "the chat went through the router"
        # the workers the router did not pick have served nothing and show no KV-cache sample
        picked = set(fake.chats[0])
        for w in dynamo.placement(c, c.profile):
            kv = probes.CHECKS["metric"](fake.rank0[w.name].metrics().encode(), "trtllm_kv_cache_utilization")
            assert (kv is None) == (w.name in picked), (topology, w.name, kv)
        assert any(w.name not in picked for w in dynamo.placement(c, c.profile)) == (len(dynamo.placement(c, c.profile)) > 2)


@pytest.mark.parametrize("topology", ["3P2D", "1P1D-B8"])
def test_readiness_still_waits_for_every_worker(topology, monkeypatch):
    """A worker that has not registered (its own /health says notready, the
    frontend lists one fewer of its role) keeps the release from being ready,
    whichever worker the router would pick."""
    c = cluster_of(topology)
    missing = dynamo.placement(c, c.profile)[-1].name
    fake = FakeDynamo(c, lambda n, np_, nd: (0, 0), registered={w.name for w in dynamo.placement(c, c.profile)} - {missing})
    ok, out, _ = watch(fake, monkeypatch, ready_timeout_s=0.3)
    assert not ok
    assert out.reason.startswith("not ready within 0.3s (") and f"missing 1 of " in out.reason and missing in out.reason, out.reason
    assert fake.chats == []


def test_the_plan_waits_for_no_traffic_dependent_metric():
    for topology in dynamo.TOPOLOGIES:
        c = cluster_of(topology)
        _, _, plan = dep.plan_release(c, {}, "sha256:x")
        assert not [p.name for p in plan.ready if p.check == "metric"], topology
        metrics = [p for p in plan.ready if p.path == "/metrics"]
        assert sorted((p.host, p.port) for p in metrics) == sorted((w.rank0_node, w.system_port) for w in dynamo.placement(c, c.profile))
        assert all(p.check == "prometheus" for p in metrics)
        assert len([p for p in plan.ready if p.path == "/v1/chat/completions"]) == 1


def test_the_prometheus_check():
    check = probes.CHECKS["prometheus"]
    r0 = FakeDynamo(cluster_of("1P1D-B8"), lambda *a: (0, 0)).rank0["decode0"]
    assert check(r0.metrics().encode(), "") is None  # a worker before any traffic
    assert check(b"", "") is None
    assert check(b'# HELP x y\n# TYPE x gauge\nx{a="b"} 1\n', "") is None
    assert "is not Prometheus text" in check(b"<html>502 Bad Gateway</html>", "")
    assert "is not Prometheus text" in check(b'{"status":"ready"}', "")
