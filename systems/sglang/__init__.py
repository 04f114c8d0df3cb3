"""SGLang multi-node serving as a release plan: every node runs
``python3 -m sglang.launch_server`` in its own container, with the same
``--tp``, ``--nnodes`` and ``--dist-init-addr <node 0's serving IP>:<dist_port>``
and its own ``--node-rank`` (the inventory's node order: node 0 is rank 0,
as SGLang's multi-node docs give it). Node rank 0 hosts torch.distributed's
store and, once every node joined and loaded, the HTTP API; the others serve
SGLang's health endpoint on their own port.

Where the runtime starts a world itself (Slurm on pyxis, ``UnitRuntime.worlds``)
the world is one launch instead: one task per node, the same line on every
node (``sh <release>/task.sh``), the ranks meeting at the store, not through
MPI (``Service.mpi``). Each node's ``task.sh`` holds that node's server line:
its node rank is the inventory's, checked against the node Slurm ran the
task on (SLURMD_NODENAME), not SGLang's Slurm example's ``$SLURM_NODEID``:
Slurm numbers a step's nodes in its own order (srun(1) ``--nodelist``: "the
node names will be sorted by Slurm"), which need not be the inventory's, and
node rank 0 must be node 0, where ``--dist-init-addr`` points.

One world: a lost node ends it on every node, so the service's restart
policy is ``group`` (every unit stopped and the world started again, with
backoff). Node 0's container starts first (it hosts the store), then the
others at once. Ready: ``/health`` 200 on node 0, ``/v1/models`` lists the
served name, and a chat answers with its reasoning part
(``--reasoning-parser``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import shlex

from llmdeploy.container import ContainerSpec, Mount
from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster, Node
from llmdeploy.release import release_dir
from llmdeploy.releaseplan import Drain, Metrics, Probe, ReleasePlan, Service, Unit
from llmdeploy.serving import PlaybookEntry, Prepared, ReleaseFile, ReleaseFiles, ServingProfile
from roles import containers
from systems.common import container_check_node, container_files, container_meta, nic_signature, openai_probe, render, serving_image

from .profile import KIND, SglangProfile

PROFILE: type[ServingProfile] = SglangProfile
TASK_FILE = "task.sh"
LABELS = {"node_rank": "node rank"}
# how messages name a unit of node 0's role
ROLE_LABELS = {"node0": "node 0"}
CHAT_PROMPT = "Write a Python function that reverses a string."
STOP_CLEANUP = ""
DRIFT_ENV_PREFIXES = ["NCCL_", "GLOO_", "SGLANG_", "CUDA_"]
# SGLang's and torch.distributed's words when a world does not form or ends
# (server_args.py, torch's TCPStore, NCCL's bootstrap; sglang#3685, #3932)
SIGNATURES: list[tuple[str, str]] = [
    nic_signature(),
    (r"DistStoreError: Timed out after \d+ seconds waiting for clients",
     "not every node joined node 0's store within --dist-timeout (is every node's container running, same --nnodes and --tp, "
     "node 0's dist port reachable on its serving IP?)"),
    (r"The client socket has timed out after \d+ms while trying to connect to",
     "this node never reached node 0's store at --dist-init-addr (node 0 down, or its serving IP/dist port unreachable)"),
    (r"has already checked in|mismatch in info from procs",
     "two nodes claim one node rank, or the nodes disagree on the world size (--node-rank, --nnodes, --tp)"),
    (r"tp_size must be divisible by number of nodes", "--tp is not divisible by --nnodes"),
    (r"CUDA out of memory|OutOfMemoryError", "CUDA out of memory on a node (lower mem_fraction_static)"),
    (r"invalid device ordinal", "more ranks on a node than GPUs in its container (--gpus, --tp over --nnodes)"),
    (r"Connection closed by peer|remote process exited or there was a network error|failed to recv, got 0 bytes",
     "a node of the world went away, which ends the world on every node"),
    (r"Scheduler hit an exception|Received sigquit from a child process", "a scheduler died and SGLang ended the server"),
    (r"sglang serve: error:", "SGLang refused its command line"),
]


def container_name(cluster: Cluster, rid: str) -> str:
    return f"{cluster.name}-{rid}"


def env_file(cluster: Cluster, rid: str) -> str:
    return f"{release_dir(cluster, rid)}/env"


def server_args(cluster: Cluster, prof: SglangProfile, node: Node) -> list[str]:
    """``python3 -m sglang.launch_server`` and its flags for ``node`` (SGLang's
    multi-node docs; ``prof``: the cluster's profile, as the hook that builds
    the plan received it)."""
    rank = cluster.nodes.index(node)
    args = ["python3", "-m", "sglang.launch_server", "--model-path", cluster.model.path, "--served-model-name", prof.served_model_name,
            "--tp", str(prof.tp), "--dist-init-addr", f"{cluster.node0.ip}:{prof.dist_port}", "--nnodes", str(len(cluster.nodes)),
            "--node-rank", str(rank), "--host", prof.host, "--port", str(prof.port)]
    if prof.ep is not None:
        args += ["--ep", str(prof.ep)]
    if prof.enable_dp_attention:
        args += ["--enable-dp-attention", "--dp", str(prof.dp)]
    if prof.trust_remote_code:
        args.append("--trust-remote-code")
    if prof.reasoning_parser:
        args += ["--reasoning-parser", prof.reasoning_parser]
    if prof.enable_metrics:
        args.append("--enable-metrics")
    if prof.dist_timeout_s is not None:
        args += ["--dist-timeout", str(prof.dist_timeout_s)]
    if prof.mem_fraction_static is not None:
        args += ["--mem-fraction-static", f"{prof.mem_fraction_static:g}"]
    return args


# SGLang's docker run options, in its order and spelling
SEED_FLAGS = ("--gpus", "--network", "--ipc=", "--shm-size", "--privileged")


def container_spec(cluster: Cluster, prof: SglangProfile, node: Node, rid: str, image: str, stop_phase: int, one: bool) -> ContainerSpec:
    """SGLang's multi-node container (``--gpus all --network host --ipc=host
    --shm-size 32g -v ~/.cache/huggingface:...``), named for the cluster and
    release, with the release's environment file. In one launch the spec is
    every node's (``one``: the runtime starts the world in one launch,
    ``UnitRuntime.worlds``): its labels say the world, the command is ``task.sh``."""
    rank = f"0-{len(cluster.nodes) - 1}" if one else cluster.nodes.index(node)
    mounts = [Mount(cluster.cache_dir, cluster.cache_dir)]
    assert cluster.model.tokenizer_path is not None  # Model._default_tokenizer: path unless set
    for path in sorted({cluster.model.path, cluster.model.tokenizer_path}):
        if not path.startswith(cluster.cache_dir + "/"):
            mounts.append(Mount(path, path, readonly=True))
    command = ["sh", f"{release_dir(cluster, rid)}/{TASK_FILE}"] if one else server_args(cluster, prof, node)
    return ContainerSpec(
        name=container_name(cluster, rid), image=image, command=tuple(command),
        labels=containers.label_values(cluster.name, rid, "world", "world" if one else cluster.role_of(node), stop_phase, node_rank=rank),
        gpus="all", network="host", ipc="host", shm_size=prof.shm_size, privileged=prof.privileged,
        mounts=tuple(mounts), env_files=(env_file(cluster, rid),), docker_flags=SEED_FLAGS)


def services(dep: Deployment, profile: SglangProfile, entry: PlaybookEntry, nodes: list[Node], prepared: Prepared, rid: str) -> list[Service]:
    """One world over ``nodes``: node 0's container first (it hosts the store), then the others;
    or, where the runtime starts a world itself (pyxis), one launch of a task per node."""
    cluster, one = dep.cluster, dep.runtime.worlds
    units = []
    for n in nodes:
        # one launch: one line for every node, node 0's image (which prepare made every node's)
        image = serving_image(cluster, cluster.node0 if one else n, prepared)
        units.append(Unit(host=n.name, container=container_name(cluster, rid), role=cluster.role_of(n),
                          order=0 if n is cluster.node0 or one else 1,
                          spec=container_spec(cluster, profile, n, rid, image, entry.stop_phase, one),
                          show={"node_rank": cluster.nodes.index(n), "image": image,
                                "serve_command": shlex.join(server_args(cluster, profile, n))}))
    # its ranks meet at node 0's torch.distributed store, not through MPI
    return [Service(name=entry.name, units=units, restart="group", world=one, mpi=False)]


def entry_port(cluster: Cluster, profile: SglangProfile) -> int:
    return profile.port


def metrics(cluster: Cluster, profile: SglangProfile) -> Metrics:
    """Node rank 0's /metrics with --enable-metrics (SGLang docs, "Production
    Metrics"; sglang/srt/metrics/collector.py)."""
    return Metrics(probe=Probe(name="SGLang /metrics", kind="http", host=cluster.node0.name, port=profile.port, path="/metrics"),
                   running=["sglang:num_running_reqs"], waiting=["sglang:num_queue_reqs"], kv_cache=["sglang:token_usage"],
                   generated_tokens=["sglang:generation_tokens_total"])


def drain(cluster: Cluster, profile: SglangProfile) -> Drain:
    """SGLang has no call that stops admission: the wait counts new requests too."""
    note = "SGLang cannot refuse new requests while it drains; clients still reaching it are counted and cut at the end of the wait"
    if not profile.enable_metrics:
        note += "; enable_metrics is off, so /metrics is not served and nothing is waited for"
    return Drain(note=note)


def chat_request(model: str) -> dict:
    """A chat with thinking on: the reasoning parser returns its reasoning part."""
    return {"model": model, "messages": [{"role": "user", "content": CHAT_PROMPT}], "max_tokens": 1024,
            "chat_template_kwargs": {"enable_thinking": True}}


def probe(cluster: Cluster, profile: SglangProfile, name: str) -> list[Probe]:
    served = profile.served_model_name
    return [openai_probe(KIND, cluster.node0.name, profile.port, name, served, chat_request(served),
                         "reasoning" if profile.reasoning_parser else "think")]


def files(cluster: Cluster, profile: SglangProfile, plan: ReleasePlan, prepared: Prepared, image_id: str | None) -> ReleaseFiles:
    """Per host: env, serve.sh (the server's command, for people), run.sh, release.json."""
    out = {}
    for n in cluster.nodes:
        u = plan.units(n.name)[0]
        meta = container_meta(cluster, plan.release, plan.system, n, u, image_id, {"node_rank": u.show["node_rank"]})
        if plan.service_of(u).world:
            # what the one launch runs on every node (status --diff compares it with the running command)
            meta["command"] = list(u.spec.command) if u.spec else []
        out[n.name] = container_files(cluster, plan.release, n, u.show, "this node's SGLang container", meta)
        if plan.service_of(u).world:
            # this node's task of the one launch: this node's own server line, once Slurm's node name agrees
            out[n.name][TASK_FILE] = ReleaseFile(render("sglang/task.sh.j2", release=plan.release, cluster=cluster.name, host=n.name,
                                                        rank=u.show["node_rank"], slurm_name=cluster.slurm_name(n),
                                                        command=u.show["serve_command"]), 0o755)
    return out


def check_doc(cluster: Cluster, profile: SglangProfile, plan: ReleasePlan, secrets: list[str]) -> dict:
    units = [(n, plan.units(n.name)[0]) for n in cluster.nodes]
    return {"nodes": [container_check_node(cluster, n, u, secrets, {"node_rank": u.show["node_rank"]}) for n, u in units]}


# this plug-in's conformance, for the type checker (the registry checks it again when it loads)
if TYPE_CHECKING:  # pragma: no cover - types only
    import systems.sglang as _this
    from llmdeploy.serving import ServingSystem

    _conforms: ServingSystem = _this
