"""Dynamo readiness passes whichever prefill and decode worker the router
picks. The engine's watch runs the release plan's real probes and body
checks (flows.probes) against a release whose answers have the shapes NVIDIA's
ai-dynamo 1.6 gives (seen with the real frontend and dynamo.mocker workers on
the simulated hosts, ../shared/recipes/dynamo-real.md): the frontend's /health
is 200 "healthy" even with no worker and lists every endpoint of every
instance (generate, router-discovery, the KV query source), prefill workers
under component "prefill" and decode workers under "backend"; a worker's
system port /health says "ready" once its generate endpoint serves (with
DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS) and its /metrics counts requests in
dynamo_component_requests_total. Only the HTTP transport and the container
states are replaced."""

from __future__ import annotations

import itertools
import json

import pytest
from rich.console import Console

from flows import deploy as dep
from flows import engine as engine_mod
from flows import probes
from llmdeploy.inventory import Budget, Cluster, Model, make_nodes
from systems.dynamo import ROLE_COMPONENT
from systems.dynamo.catalogue import IMAGE_DYNAMO, dynamo_gb300, image
from systems.dynamo import workers as dynamo
from flows.binding import bind

TOPOLOGIES = list(dynamo.TOPOLOGIES)  # every topology of the seed


def cluster_of(topology: str) -> Cluster:
    return Cluster(name=f"t-{topology.lower()}", platform="gb300", nic="eth0",
                   nodes=make_nodes("n", dynamo.TOPOLOGIES[topology].nodes, "198.51.100.10"),
                   model=Model(path="/models/Qwen3.5-397B-A17B-NVFP4-V2"), image=image(IMAGE_DYNAMO), budget=Budget(weights_host_gib=208),
                   profile=dynamo_gb300(topology, recipes_dir="/opt/TensorRT-LLM"))


class FakeDynamo:
    """A release's frontend and workers with ai-dynamo's answers. ``pick``
    chooses (prefill index, decode index) for each chat request, as the
    router would; ``registered`` says which workers' instances etcd holds."""

    def __init__(self, c: Cluster, pick, registered=None):
        self.c, self.pick = c, pick
        self.workers = dynamo.placement(c, c.profile)
        self.ready = {w.name: registered is None or w.name in registered for w in self.workers}
        self.requests = {w.name: 0 for w in self.workers}
        self.chats: list[tuple[str, str]] = []

    def instances(self) -> list[dict]:
        out = []
        for i, w in enumerate(self.workers):
            if not self.ready[w.name]:
                continue
            comp = ROLE_COMPONENT[w.role]
            for ep in ("generate", "router-discovery") + (("worker_kv_query_source_1560946b90c818",) if w.role == "prefill" else ()):
                out.append({"component": comp, "endpoint": ep, "namespace": self.c.profile.namespace, "instance_id": 7587899357996777700 + i,
                            "transport": {"tcp": f"{w.rank0_node}:36811/694da24380d0010d/{self.c.profile.namespace}/{comp}/{ep}"}})
        return out

    def models(self) -> list[str]:
        roles = {w.role for w in self.workers if self.ready[w.name]}
        return [self.c.profile.served_model_name] if roles == {"prefill", "decode"} else []

    def answer(self, host: str, port: int, method: str, path: str, body) -> tuple[int, bytes]:
        prof = self.c.profile
        if host == self.c.node0.name and port == prof.frontend_port:
            if path == "/health":
                inst = self.instances()
                return 200, json.dumps({"status": "healthy", "endpoints": sorted({f"dyn://{prof.namespace}.{i['component']}.{i['endpoint']}" for i in inst}),
                                        "instances": inst}).encode()
            if path == "/v1/models":
                return 200, json.dumps({"object": "list", "data": [{"id": m, "object": "model", "owned_by": "nvidia"} for m in self.models()]}).encode()
            if method == "POST" and path == "/v1/chat/completions":
                return self.chat(body)
        for w in self.workers:
            if (host, port) == (w.rank0_node, w.system_port):
                if path == "/health":
                    ok = self.ready[w.name]
                    return (200 if ok else 503), json.dumps({"status": "ready" if ok else "notready", "uptime": {"secs": 3, "nanos": 0},
                                                               "endpoints": {"generate": "ready"} if ok else {}}).encode()
                if path == "/metrics":
                    comp = ROLE_COMPONENT[w.role]
                    labels = f'dynamo_component="{comp}",dynamo_endpoint="generate",dynamo_namespace="{prof.namespace.replace("-", "_")}"'
                    return 200, ("# HELP dynamo_component_requests_total Total number of requests processed by work handler\n"
                                 "# TYPE dynamo_component_requests_total counter\n"
                                 f"dynamo_component_requests_total{{{labels}}} {self.requests[w.name]}\n").encode()
        raise ConnectionRefusedError(f"nothing listens on {host}:{port}")

    def chat(self, req: dict) -> tuple[int, bytes]:
        if req.get("model") not in self.models():
            return 404, b'{"message":"Model not found","type":"Not Found","code":404}'
        assert isinstance(req.get("max_tokens"), int), "the mock engine answers only requests with max_tokens"
        prefills = [w for w in self.workers if w.role == "prefill"]
        decodes = [w for w in self.workers if w.role == "decode"]
        i, j = self.pick(len(self.chats), len(prefills), len(decodes))
        p, d = prefills[i], decodes[j]
        self.requests[p.name] += 1
        self.requests[d.name] += 1
        self.chats.append((p.name, d.name))
        return 200, json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": " def add(a, b): return a + b"},
                                             "finish_reason": "length"}], "model": req["model"], "object": "chat.completion"}).encode()


def watch(fake: FakeDynamo, monkeypatch, ready_timeout_s: float = 30) -> tuple[bool, engine_mod.Outcome, object]:
    """Engine.watch over the plan of ``fake.c`` with the HTTP answered by ``fake``
    (through flows.probes.http_probe and its checks) and every container running."""
    c = fake.c
    _, _, plan = dep.plan_release(bind(c), {}, "sha256:x")

    def http_via_ssh(runner, node, port, method, path, body, timeout, headers=None, dest="127.0.0.1"):
        return fake.answer(node.name, port, method, path, body)

    monkeypatch.setattr(probes, "http_via_ssh", http_via_ssh)

    class Engine(engine_mod.Engine):
        def states(self, plan, units=None):
            return {engine_mod.unit_key(u): ("running", "") for u in (units or plan.units())}

    eng = Engine(bind(c), None, Console(quiet=True), quiet=True)
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
        # the workers the router did not pick have served nothing
        picked = set(fake.chats[0])
        for w in dynamo.placement(c, c.profile):
            assert (fake.requests[w.name] > 0) == (w.name in picked), (topology, w.name)
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
    assert out.reason.startswith("not ready within 0.3s (") and "missing 1 of " in out.reason and missing in out.reason, out.reason
    assert fake.chats == []


def test_the_plan_waits_for_no_traffic_dependent_metric():
    for topology in dynamo.TOPOLOGIES:
        c = cluster_of(topology)
        _, _, plan = dep.plan_release(bind(c), {}, "sha256:x")
        assert not [p.name for p in plan.ready if p.check == "metric"], topology
        metrics = [p for p in plan.ready if p.path == "/metrics"]
        assert sorted((p.host, p.port) for p in metrics) == sorted((w.rank0_node, w.system_port) for w in dynamo.placement(c, c.profile))
        assert all(p.check == "prometheus" for p in metrics)
        assert len([p for p in plan.ready if p.path == "/v1/chat/completions"]) == 1


def test_the_prometheus_check():
    check = probes.CHECKS["prometheus"]
    fake = FakeDynamo(cluster_of("1P1D-B8"), lambda *a: (0, 0))
    w = fake.workers[1]
    assert check(fake.answer(w.rank0_node, w.system_port, "GET", "/metrics", None)[1], "") is None  # a worker before any traffic
    assert check(b"", "") is None
    assert check(b'# HELP x y\n# TYPE x gauge\nx{a="b"} 1\n', "") is None
    assert "is not Prometheus text" in check(b"<html>502 Bad Gateway</html>", "")
    assert "is not Prometheus text" in check(b'{"status":"ready"}', "")


def test_a_dead_workers_instance_keeps_readiness_waiting():
    """After a SIGKILLed decode group is started again, the frontend lists its
    old instance beside the new one until the old lease expires, and routes
    requests to it: the release is not ready until it lists one per worker."""
    from systems.dynamo import frontend_health

    want = json.dumps([{"name": "prefill0", "role": "prefill"}, {"name": "decode0", "role": "decode"}])

    def body(*decode_ids):
        inst = [{"component": "prefill", "endpoint": "generate", "instance_id": 1},
                {"component": "prefill", "endpoint": "router-discovery", "instance_id": 1}]
        inst += [{"component": "backend", "endpoint": e, "instance_id": i} for i in decode_ids for e in ("generate", "router-discovery")]
        return json.dumps({"status": "healthy", "instances": inst}).encode()

    assert frontend_health(body(7), want) is None
    assert frontend_health(body(7, 8), want) == ("lists 2 decode instances for 1 decode worker(s) (decode0): the others are of "
                                                  "workers that are gone, listed until their etcd leases expire")
    assert frontend_health(body(), want) == "lists 1 of 2 workers; missing 1 of 1 decode (decode0)"
    # healthy with no worker at all, as the real frontend says
    assert "1 of 1 prefill (prefill0)" in frontend_health(json.dumps({"status": "healthy", "instances": []}).encode(), want)


def test_the_chat_waits_out_the_frontends_500_after_a_worker_registered():
    c = cluster_of("1P1D-B8")
    _, _, plan = dep.plan_release(bind(c), {}, "sha256:x")
    (chat,) = [p for p in plan.ready if p.path == "/v1/chat/completions"]
    assert chat.not_yet == [500]
    problem = f"{chat.describe()} answered 500: b'{{\"message\":\"Failed to generate completions\"}}'"
    assert engine_mod.not_yet(problem, chat.not_yet) and not engine_mod.not_yet(problem)
    assert not engine_mod.not_yet(problem.replace("500", "404"), chat.not_yet)


def test_the_model_list_may_lag_the_workers(monkeypatch):
    c = cluster_of("1P1D-B8")
    _, _, plan = dep.plan_release(bind(c), {}, "sha256:x")
    (models,) = [p for p in plan.ready if p.path == "/v1/models"]
    # the only other probe that waits on its body: the frontend's list again, last (test_a_restarted_group_...)
    assert models.wait_body and [p.name for p in plan.ready if p.wait_body and p is not models] == ["frontend /health lists exactly the workers"]
    # a release whose frontend lists the workers but no model yet keeps waiting, then fails by its deadline
    fake = FakeDynamo(c, lambda *a: (0, 0))
    fake.models = lambda: []
    ok, out, _ = watch(fake, monkeypatch, ready_timeout_s=0.3)
    assert not ok and out.reason.startswith("not ready within 0.3s (") and "does not list" in out.reason, out.reason


def test_a_restarted_group_is_ready_only_once_its_old_instance_is_gone(monkeypatch):
    """A decode group SIGKILLed and started again: its old instance is still
    listed (its lease) while the new one is not yet, so the frontend's count
    is right before the new worker has registered. Readiness then waits, at
    its end, until the frontend lists exactly one instance per worker: the
    release is not called ready while status would list a gone instance."""
    c = cluster_of("1P1D-B8")
    calls = {"frontend": 0}

    class Restarted(FakeDynamo):
        def instances(self):
            calls["frontend"] += 1
            out = [i for i in super().instances() if i["component"] != "backend"]
            stale = {"component": "backend", "endpoint": "generate", "namespace": self.c.profile.namespace, "instance_id": 1}
            new = [i for i in super().instances() if i["component"] == "backend"]
            # the first answer: the old instance only; then old and new; from the sixth on the lease has expired
            return out + ([stale] if calls["frontend"] < 6 else []) + (new if calls["frontend"] > 1 else [])

    fake = Restarted(c, lambda n, p, d: (0, 0))
    ok, out, plan = watch(fake, monkeypatch)
    assert ok, out.reason
    assert calls["frontend"] >= 6  # it waited for the lease, not failed on the extra instance
    assert probes.body_problem(plan.ready[-1], fake.answer(c.node0.name, c.profile.frontend_port, "GET", "/health", None)[1]) is None
