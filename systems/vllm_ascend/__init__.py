"""vLLM-Ascend (seed 001) as a release plan: one container per node running
``vllm serve``; node 0 first (its DP RPC port gates the workers), then the
headless workers, each with its own ``--data-parallel-start-rank``. A worker
that exits is retried alone; node 0 leaving fails the release. Ready: ``/health``
200 on node 0 (every DP rank joined), ``/v1/models`` lists the served name, and
the seed's chat request answers with a ``<think>`` block.

The command lines come from ``serve`` (the seed's ``docker run`` and
``vllm serve``), the environment file from ``roles/commenv``; the profile, its
checks and the seed's catalogue are ``profile`` and ``catalogue``."""

from __future__ import annotations

from typing import TYPE_CHECKING


from llmdeploy.errors import LlmdeployError
from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster, Node
from llmdeploy.release import release_dir
from llmdeploy.releaseplan import Drain, Metrics, Probe, ReleasePlan, Service, Unit
from llmdeploy.serving import PlaybookEntry, Prepared, ReleaseFiles, ServingProfile
from systems.common import container_check_node, container_files, container_meta, openai_probe, serving_image

from . import serve
from .profile import KIND, VllmAscendProfile

PROFILE: type[ServingProfile] = VllmAscendProfile
# what the tables call the values a unit shows
LABELS = {"start_rank": "start rank"}

CHAT_PROMPT = "Write a Python function to merge two sorted linked lists."
STOP_CLEANUP = "rm -f /dev/shm/moe_* 2>/dev/null; true\n"
DRIFT_ENV_PREFIXES = ["HCCL_", "GLOO_", "TP_", "VLLM_", "ASCEND_"]
# how messages name a unit of node 0's role
ROLE_LABELS = {"node0": "node 0"}
# vLLM's DP handshake and vllm-ascend failures (shared/DOMAIN.md), most specific first
SIGNATURES: list[tuple[str, str]] = [
    (r"HcclCommInitRootInfo failed|socket ifname \S+ has no ip",
     "HCCL init failed: HCCL_SOCKET_IFNAME must be the NIC that owns HCCL_IF_IP on this node"),
    (r"Did not receive response from front-end process within 5 minutes",
     "node 0 absent: the worker never reached node 0's DP RPC port (is node 0 running? same --data-parallel-address and --data-parallel-rpc-port everywhere?)"),
    (r"Message from engine with unexpected data parallel rank",
     "wrong DP rank: every worker needs a unique --data-parallel-start-rank in 1..DP-1"),
    (r"Configuration mismatch detected for engine",
     "configuration mismatch: this worker's model, image or flags differ from node 0's"),
    (r"must use --headless", "a worker was started without --headless"),
    (r"data_parallel_size_local must be > 0 in headless mode", "--data-parallel-size-local must be > 0 on headless workers"),
    (r"Insufficient CPUs for binding|NPU topo affinity not found|Bind cpus failed", "CPU binding failed (enable_cpu_binding)"),
    (r"lost the connection to the front-end process", "node 0 went away after the group formed"),
    (r"EngineCore encountered a fatal error", "the engine core died"),
]


def env_file(cluster: Cluster, rid: str) -> str:
    return f"{release_dir(cluster, rid)}/env"


def units(dep: Deployment, prof: VllmAscendProfile, service: str, nodes: list[Node], prepared: Prepared, rid: str, entry: PlaybookEntry):
    cluster = dep.cluster
    out = []
    for n in nodes:
        image = serving_image(cluster, n, prepared)
        out.append(Unit(
            host=n.name,
            container=serve.container_name(cluster, rid),
            role=cluster.role_of(n),
            spec=serve.container_spec(cluster, prof, n, rid, env_file(cluster, rid), image, dep.vendor.container_devices(cluster, n),
                                      service, entry.stop_phase),
            show={
                "start_rank": n.start_rank,
                "serve_command": serve.serve_command(cluster, prof, n),
                "image": image,
            },
        ))
    started = None
    if entry.started == "rpc_port":
        started = Probe(name="the DP RPC port", kind="port", host=cluster.node0.name, ip=str(cluster.node0.ip), port=prof.rpc_port)
    return out, started


def services(dep: Deployment, profile: VllmAscendProfile, entry: PlaybookEntry, nodes: list[Node], prepared: Prepared,
             rid: str) -> list[Service]:
    made, started = units(dep, profile, entry.name, nodes, prepared, rid, entry)
    return [Service(name=entry.name, units=made, started=started)]


def entry_port(cluster: Cluster, profile: VllmAscendProfile) -> int:
    return profile.port


def metrics(cluster: Cluster, profile: VllmAscendProfile) -> Metrics:
    """The API server's /metrics on node 0 (vLLM docs, "Production Metrics";
    summed over its engines' labels)."""
    port = profile.port
    return Metrics(probe=Probe(name="vLLM /metrics", kind="http", host=cluster.node0.name, port=port, path="/metrics"),
                   running=["vllm:num_requests_running"], waiting=["vllm:num_requests_waiting"],
                   kv_cache=["vllm:kv_cache_usage_perc"], generated_tokens=["vllm:generation_tokens_total"])


def drain(cluster: Cluster, profile: VllmAscendProfile) -> Drain:
    """vLLM has no call that stops admission while it keeps serving: requests
    that arrive during the wait are counted too."""
    return Drain(note="vLLM cannot refuse new requests while it drains; clients still reaching it are counted and cut at the end of the wait")


def chat_request(served: str) -> dict:
    """The seed's functional check (stream, thinking on)."""
    return {
        "model": served,
        "messages": [{"role": "user", "content": CHAT_PROMPT}],
        "temperature": 1.0,
        "top_p": 0.95,
        "stream": True,
        "chat_template_kwargs": {"enable_thinking": True, "preserve_thinking": True},
    }


def probe(cluster: Cluster, profile: VllmAscendProfile, name: str) -> list[Probe]:
    return [openai_probe(KIND, cluster.node0.name, profile.port, name, profile.served_model_name, chat_request(profile.served_model_name), "think")]


def files(cluster: Cluster, profile: VllmAscendProfile, plan: ReleasePlan, prepared: Prepared, image_id: str | None) -> ReleaseFiles:
    """Per host: env, serve.sh, run.sh, release.json (and plan.json, added by the flow)."""
    out = {}
    for n in cluster.nodes:
        u = plan.units(n.name)[0]
        meta = container_meta(cluster, plan.release, plan.system, n, u, image_id, {"start_rank": n.start_rank})
        out[n.name] = container_files(cluster, plan.release, n, u.show, "this node's serving container", meta)
    return out


def check_doc(cluster: Cluster, profile: VllmAscendProfile, plan: ReleasePlan, secrets: list[str]) -> dict:
    return {"nodes": [container_check_node(cluster, n, plan.units(n.name)[0], secrets, {"start_rank": n.start_rank}) for n in cluster.nodes]}


def old_release_plan(cluster: Cluster, rid: str, metas: dict[str, dict]) -> ReleasePlan | None:
    """The plan of a release written before plans were recorded (only this
    system existed then; its release.json files name no other): one container
    per node, node 0 first (its DP RPC port gates the workers), then the
    workers; ready as today. None for a release of another system."""
    if not metas or any(m.get("system", KIND) != KIND for m in metas.values()):
        return None
    lacking = [n.name for n in cluster.nodes if not isinstance(metas.get(n.name, {}).get("container"), str)]
    if lacking:
        raise LlmdeployError(f"release {rid} (written before plans were recorded): no container named in the release.json "
                             f"of {', '.join(lacking)}")
    prof, node0 = cluster.profile, cluster.node0

    def unit(n: Node, role: str) -> Unit:
        return Unit(host=n.name, container=metas[n.name]["container"], role=role, show={"start_rank": metas[n.name].get("start_rank")})

    gate = Probe(name="the DP RPC port", kind="port", host=node0.name, ip=str(node0.ip), port=getattr(prof, "rpc_port", 13389))
    services = [Service(name="node0", units=[unit(node0, "node0")], started=gate, restart="none")]
    if len(cluster.nodes) > 1:
        services.append(Service(name="workers", units=[unit(n, "worker") for n in cluster.nodes[1:]], after=["node0"], restart="each"))
    port, served = getattr(prof, "port", 8000), getattr(prof, "served_model_name", "")
    plan = ReleasePlan(system=KIND, cluster=cluster.name, release=rid, services=services, entry_host=node0.name, entry_port=port)
    plan.ready = [openai_probe(KIND, node0.name, port, name, served, chat_request(served), "think") for name in ("health", "models", "chat")]
    return plan


# this plug-in's conformance, for the type checker (the registry checks it again when it loads)
if TYPE_CHECKING:  # pragma: no cover - types only
    import systems.vllm_ascend as _this
    from llmdeploy.serving import ServingSystem

    _conforms: ServingSystem = _this
