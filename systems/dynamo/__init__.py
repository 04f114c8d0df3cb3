"""NVIDIA Dynamo disaggregated serving on TensorRT-LLM (seed 000, "Qwen3.5 GB300
NVL72 Agentic Disaggregated Serving") as a release plan.

Services, in the playbook's order (``playbooks/serve-dynamo.yaml``):

- ``etcd`` and ``nats``: the control plane on node 0, each in a container of
  its own image (like Kamal's accessories: prepare pulls them on node 0, or
  on pyxis imports each into a file that its unit runs, recorded in node
  0's prepare record), their state in the container, not the release
  directory (``ETCD_DATA``, ``NATS_DATA``);
  when the inventory names existing endpoints they are not started, only
  their health is checked (from node 0) before anything else starts;
- ``frontend``: ``python3 -m dynamo.frontend --http-port 8000 --router-mode kv
  --router-session-affinity-ttl-secs 14400`` in a container of the TensorRT-LLM
  image on node 0;
- one service per worker (``prefill0``, ``decode0``, ...): its own MPI group
  (replicas never share one): a container per node it spans; the container
  on its first node merges the worker's role settings onto the base file of
  the recipes checkout and runs ``mpirun ... [numactl -m 0,1]
  trtllm-llmapi-launch python3 -m dynamo.trtllm --model-path "$MODEL_PATH"
  --served-model-name <profile.served_model_name> ... --publish-metrics``; the
  others hold its ranks (entered by mpirun's launch agent, as for
  trtllm-serve). A group that dies is restarted as a group. Where the
  runtime starts a world itself (Slurm on pyxis) a group is instead one
  ``srun --mpi=pmix`` launch over its nodes, a task per GPU, each running
  its node's ``<worker>.task.sh`` (the setup, a per-task merge, then
  ``[numactl -m 0,1] trtllm-llmapi-launch python3 -m dynamo.trtllm ...``),
  as Dynamo documents for multi-node TensorRT-LLM workers on Slurm: no
  mpirun, no launch agent, no hostfile.

Every container of the TensorRT-LLM image gets the seed's ``docker run``
flags and mounts, an environment file with the seed's setup block, sources
the profile's ``qwen3.5-gb300-agentic.env`` and unsets
``TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS``; a worker of any topology but
the colocated 1P1D also unsets ``TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL``
(the seed's "unset the weight-loading variable"), and its ranks get neither.

Ready: the frontend's ``/health`` body lists one ``generate`` instance per
worker (it answers 200 "healthy" even with none), every worker's system port
``/health`` (ready with DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS, which the plan
sets), ``/v1/models`` lists the served model, the seed's chat request with an
``x-dynamo-session-id`` answers, every worker's ``/metrics`` answers
Prometheus text, and last the frontend's ``/health`` again, waited for until
it lists exactly one instance per worker (``frontend_settled``). None of it depends on which workers the router picked:
``trtllm_kv_cache_utilization`` is not waited for (see ``probe``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import json
import shlex
from urllib.parse import urlparse

from llmdeploy.container import ContainerSpec, Mount
from llmdeploy.errors import LlmdeployError
from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster, Node
from llmdeploy.release import release_dir
from llmdeploy.releaseplan import Drain, Metrics, Probe, ReleasePlan, Service, Unit
from llmdeploy.serving import PlaybookEntry, Prepared, ReleaseFile, ReleaseFiles, ServingProfile
from roles import commenv, containers
from roles.mpi import launch_agent_args, tcp_if_args
from systems.common import accessory_image, check_files, hostfile, launch_agent, mpi_exports, nic_signature, nics, render, serving_image
# the workers are TensorRT-LLM engines: its configuration merge and launch mounts
from systems.trtllm import config as trtllm
from systems.trtllm import ssh_mounts_for

from . import numa
from . import workers as dynamo
from .profile import KIND, DynamoProfile  # noqa: F401 (KIND: the registry reads it here)

PROFILE: type[ServingProfile] = DynamoProfile
LABELS: dict[str, str] = {"ranks": "ranks"}

PROFILE_ENV = "qwen3.5-gb300-agentic.env"
SESSION_ID = "qwen35-example-session"
CHAT_PROMPT = "Write a Python function that adds two integers."
STOP_CLEANUP = "rm -f /dev/shm/moe_* 2>/dev/null; true\n"
DRIFT_ENV_PREFIXES = ["DYN_", "ETCD_", "NATS_", "NCCL_", "TRTLLM_", "TLLM_", "CUDA_"]
SIGNATURES: list[tuple[str, str]] = [
    nic_signature(),  # first: the rank's own words, before what mpirun and NCCL say after it
    (r"Failed to connect to etcd server|etcd.*connection refused",
     "the worker cannot reach etcd (ETCD_ENDPOINTS; is the control plane up?)"),
    (r"Failed to connect to NATS server|nats: no servers available",
     "the worker cannot reach NATS (NATS_SERVER; is the control plane up?)"),
    (r"primary lease is lost", "the worker lost its etcd lease (etcd unreachable or too slow)"),
    (r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError",
     "CUDA out of memory on a rank (lower free_gpu_memory_fraction, max_batch_size or max_num_tokens; no other worker on these GPUs?)"),
    (r"invalid device ordinal", "CUDA_VISIBLE_DEVICES names a GPU this node does not have"),
    (r"does not match the MPI world size", "the MPI group's ranks do not match TP x PP of its role settings"),
    (r"is missing: is the recipes checkout mounted|merge-config: .*(missing|not a mapping|not valid|cannot)",
     "the recipes checkout or a base role file is missing (profile.recipes_dir)"),
    (r"There are not enough slots available", "more ranks than slots for an MPI group"),
    (r"No module named 'dynamo'", "the image lacks the ai-dynamo wheels (invoke prepare installs them)"),
    (r"mpirun noticed that process rank \d+ .*exited on signal",
     "a rank was killed (mpirun ended the group; the rank's node and signal are in this line)"),
    (r"NCCL error|ncclSystemError|ncclInternalError|ncclRemoteError",
     "NCCL error between ranks (check NCCL_SOCKET_IFNAME and the fabric: invoke verify-comm)"),
    (r"ORTE was unable to reliably start one or more daemons|An ORTE daemon has unexpectedly failed|Host key verification failed",
     "MPI could not start its daemons on every node of the group (the launch agent's SSH from the group's first node)"),
    (r"mpirun detected that one or more processes exited with non-zero status|Primary job +terminated normally, but 1 process returned",
     "a rank exited and mpirun ended the group"),
]
# The control plane's state lives in its container, not in the release
# directory: it is discovery state of the processes that run now. A release
# started again (rollback, a whole-release restart) with its old etcd data
# gets back every dead instance's key, and etcd restores their leases with a
# full TTL: the frontend then routes to instances that are gone and, seen with
# ai-dynamo 1.6, lists no model at all until those leases expire. Every
# worker registers again when it starts, so nothing is lost.
ETCD_DATA = "/etcd-data"
NATS_DATA = "/nats-data"


def container(cluster: Cluster, rid: str, service: str) -> str:
    return f"{cluster.name}-{rid}-{service}"



def membind(cluster: Cluster, prof: DynamoProfile, node: Node, prepared: Prepared) -> list[str]:
    """``numactl -m 0,1`` where prepare found that layout (its record) or the
    inventory demands it, else nothing (numa.membind)."""
    return numa.membind(cluster, prof, node, prepared.of(node.name))[0] or []


def membind_shown(cluster: Cluster, prof: DynamoProfile, node: Node, prepared: Prepared) -> tuple[str, dict]:
    """What ``deploy --check`` shows before ``trtllm-llmapi-launch``: the prefix
    when it is known, else which recorded fact decides it; and the same as data."""
    prefix, why = numa.membind(cluster, prof, node, prepared.of(node.name))
    data = {"prefix": shlex.join(prefix) if prefix is not None else None, "decided_by": why}
    return ("" if prefix is not None else f"[numactl -m 0,1 or nothing: {why}] "), data


# --- command lines -------------------------------------------------------------------------------
# ``prof`` in each builder: the cluster's profile, as the hook that builds the plan received it
# the seed's docker run options, in its order and spelling
SEED_FLAGS = ("--gpus", "--network", "--ipc", "--ulimit")
CONTROL_FLAGS = ("--network",)


def trtllm_spec(cluster: Cluster, prof: DynamoProfile, rid: str, name: str, service: str, role: str, stop_phase: int, image: str,
                env_file: str, command: list[str], ssh: bool = False, **labels) -> ContainerSpec:
    """The seed's TensorRT-LLM container, long-lived, named for the
    cluster, release and service; the model and the recipes mounted
    read-only where the seed mounts them, the release directory at its own
    path (scripts, role settings, merged YAML)."""
    rd = release_dir(cluster, rid)
    mounts = [Mount(cluster.model.path, prof.model_mount, readonly=True, form="bind"),
              Mount(prof.recipes_dir, prof.recipes_mount, readonly=True, form="bind"), Mount(rd, rd)]
    if ssh:
        mounts += ssh_mounts_for(prof.launch_ssh_config)
    return ContainerSpec(name=name, image=image, command=tuple(command),
                         labels=containers.label_values(cluster.name, rid, service, role, stop_phase, **labels),
                         gpus="all", network="host", ipc="host", ulimits=("memlock=-1",), mounts=tuple(mounts),
                         env_files=(env_file,), docker_flags=SEED_FLAGS)


def etcd_spec(cluster: Cluster, prof: DynamoProfile, rid: str, stop_phase: int, image: str | None = None) -> ContainerSpec:
    """etcd's container on node 0; ``image``: what it runs (the file
    prepare imported ``prof.etcd_image`` as, ``accessory_image``), else the reference."""
    n0 = cluster.node0
    rd = release_dir(cluster, rid)
    peer = f"http://127.0.0.1:{prof.etcd_peer_port}"
    return ContainerSpec(
        name=container(cluster, rid, "etcd"), image=image or prof.etcd_image,
        command=("etcd", "--name", f"{cluster.name}-etcd", "--data-dir", ETCD_DATA,
                 "--listen-client-urls", f"http://0.0.0.0:{prof.etcd_port}",
                 "--advertise-client-urls", f"http://{n0.ip}:{prof.etcd_port}",
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"{cluster.name}-etcd={peer}"),
        labels=containers.label_values(cluster.name, rid, "etcd", "control-plane", stop_phase),
        network="host", mounts=(Mount(rd, rd),), docker_flags=CONTROL_FLAGS)


def nats_spec(cluster: Cluster, prof: DynamoProfile, rid: str, stop_phase: int, image: str | None = None) -> ContainerSpec:
    """NATS's container on node 0; ``image`` as for ``etcd_spec``."""
    rd = release_dir(cluster, rid)
    return ContainerSpec(
        name=container(cluster, rid, "nats"), image=image or prof.nats_image,
        command=("nats-server", "-js", "-p", str(prof.nats_port), "-m", str(prof.nats_monitor_port), "-sd", NATS_DATA),
        labels=containers.label_values(cluster.name, rid, "nats", "control-plane", stop_phase),
        network="host", mounts=(Mount(rd, rd),), docker_flags=CONTROL_FLAGS)


def mpirun_args(cluster: Cluster, prof: DynamoProfile, rid: str, w: dynamo.Worker, prepared: Prepared) -> tuple[list[str], str]:
    """(mpirun and its options, the command after the profile's -x list)."""
    rd = release_dir(cluster, rid)
    args = ["mpirun", "--allow-run-as-root", "-np", str(w.ranks), "--bind-to", "none"]
    if len(w.nodes) == 1:
        # its slots said outright: OpenMPI's default is the node's core count
        args += ["--host", f"localhost:{w.ranks}"]
    else:
        args += ["--hostfile", f"{rd}/{w.name}.hostfile", *launch_agent_args(f"{rd}/{w.name}.mpi-agent.sh"),
                 *tcp_if_args(nics(cluster, w.node_names))]
    first = cluster.node(w.rank0_node)
    # every variable of the environment file but the per-node ones (the GPU mask, the NIC, any value that differs
    # between the group's nodes): each node's container has its own (systems.mpi_exports)
    exported, _ = mpi_exports([env_of(cluster, prof, cluster.node(h), w) for h in w.node_names],
                              commenv.node_specific(cluster) + ["CUDA_VISIBLE_DEVICES"])
    for name in exported:
        args += ["-x", name]
    return args, task_command(cluster, prof, rid, w, first, prepared)


def task_command(cluster: Cluster, prof: DynamoProfile, rid: str, w: dynamo.Worker, node: Node, prepared: Prepared) -> str:
    """What each rank of ``w`` on ``node`` runs: ``[numactl -m 0,1]
    trtllm-llmapi-launch python3 -m dynamo.trtllm --model-path "$MODEL_PATH" ...``
    (after mpirun's options, or as a task of the group's one PMIx launch)."""
    # --model-path is the seed's spelling; ai-dynamo 1.6.1 still takes it, as
    # the obsolete alias of --model (dynamo/trtllm/backend_args.py), so the seed's line stays
    return shlex.join(membind(cluster, prof, node, prepared) + [
        "trtllm-llmapi-launch", "python3", "-m", "dynamo.trtllm"]) + ' --model-path "$MODEL_PATH" ' + shlex.join(worker_args(cluster, prof, rid, w))


def worker_args(cluster: Cluster, prof: DynamoProfile, rid: str, w: dynamo.Worker) -> list[str]:
    """``dynamo.trtllm``'s arguments after the seed's ``--model-path "$MODEL_PATH"``.

    ``--served-model-name`` is ours, not the seed's: without it a worker
    registers the name Dynamo derives from the model path (``/models/qwen35``;
    ai-dynamo 1.6.1 ``dynamo/trtllm/backend_args.py``: "Defaults to deriving
    it from model path"), while the seed's own chat request, every client and
    the ``/v1/models`` readiness probe ask for the served name
    (nvidia/Qwen3.5-397B-A17B-NVFP4-V2). Every replica passes the same one
    ("Replicas share ... served model name")."""
    return ["--served-model-name", prof.served_model_name, "--disaggregation-mode", w.role,
            "--extra-engine-args", f"{release_dir(cluster, rid)}/{w.name}.config.yaml", "--publish-metrics"]


def env_of(cluster: Cluster, prof: DynamoProfile, node: Node, w: dynamo.Worker | None = None, frontend: bool = False) -> dict[str, str]:
    """A container's environment file: the node's communication environment
    (NCCL/GLOO interface, the seed's setup block), then the frontend's or the
    worker's own variables (its GPU mask on this node first)."""
    env = commenv.env_vars(cluster, node)
    if frontend:
        for k in dynamo.node_env(cluster, prof, node):  # the workers' variables (weight loading), not the frontend's
            env.pop(k, None)
        env.update(dynamo.frontend_env(prof))
    if w is not None:
        env.update(dynamo.worker_env(cluster, w, node.name))
    return env


def env_text(cluster: Cluster, node: Node, env: dict[str, str], what: str) -> str:
    lines = [f"# environment of {what} on {node.name} ({cluster.name}), rendered by llmdeploy", "# docker --env-file format"]
    return "\n".join(lines + [f"{k}={v}" for k, v in env.items()]) + "\n"


# --- the plan ------------------------------------------------------------------------------------
def services(dep: Deployment, profile: DynamoProfile, entry: PlaybookEntry, nodes: list[Node], prepared: Prepared,
             rid: str) -> list[Service]:
    cluster, name = dep.cluster, entry.name
    if name == "etcd":
        return [_etcd(cluster, profile, rid, entry.stop_phase, prepared)]
    if name == "nats":
        return [_nats(cluster, profile, rid, entry.stop_phase, prepared)]
    if name == "frontend":
        return [_frontend(cluster, profile, rid, entry.stop_phase, prepared)]
    if name in ("prefill", "decode"):
        return [_worker_group(cluster, profile, rid, entry.stop_phase, prepared, w, dep.runtime.worlds)
                for w in dynamo.placement(cluster, profile) if w.role == name]
    raise LlmdeployError(f"playbooks/serve-dynamo.yaml: dynamo has no service {name!r} (etcd, nats, frontend, prefill, decode)")


def _etcd(cluster: Cluster, prof: DynamoProfile, rid: str, phase: int, prepared: Prepared) -> Service:
    """etcd on node 0, or the inventory's own (its /health, nothing started)."""
    n0 = cluster.node0
    if prof.etcd_endpoints:
        url = urlparse(prof.etcd_endpoints.split(",")[0])
        assert url.hostname is not None  # DynamoProfile's pattern: every endpoint names a host
        return Service(name="etcd", units=[], started=Probe(name="external etcd /health", kind="http", host=n0.name, ip=url.hostname,
                                                            port=url.port or 2379, path="/health", check="json", arg="health=true"))
    image = accessory_image(n0, prepared, prof.etcd_image)
    return _on_node0(cluster, rid, "etcd", image, etcd_spec(cluster, prof, rid, phase, image),
                     Probe(name="etcd /health", kind="http", host=n0.name, port=prof.etcd_port, path="/health", check="json", arg="health=true"))


def _nats(cluster: Cluster, prof: DynamoProfile, rid: str, phase: int, prepared: Prepared) -> Service:
    """NATS on node 0, or the inventory's own (its client port, nothing started)."""
    n0 = cluster.node0
    if prof.nats_server:
        url = urlparse(prof.nats_server)
        assert url.hostname is not None  # DynamoProfile's pattern: the server names a host
        # the monitoring port of an external NATS is not known: its client port must accept a connection
        return Service(name="nats", units=[], started=Probe(name="external NATS client port", kind="port", host=n0.name,
                                                            ip=url.hostname, port=url.port or 4222))
    image = accessory_image(n0, prepared, prof.nats_image)
    return _on_node0(cluster, rid, "nats", image, nats_spec(cluster, prof, rid, phase, image),
                     Probe(name="NATS /healthz", kind="http", host=n0.name, port=prof.nats_monitor_port, path="/healthz", check="json",
                           arg="status=ok"))


def _on_node0(cluster: Cluster, rid: str, name: str, image: str, spec: ContainerSpec, started: Probe) -> Service:
    """A control-plane service: one container on node 0, no accelerator, ``started`` when it answers."""
    unit = Unit(host=cluster.node0.name, container=container(cluster, rid, name), prefix=f"{name}.", role="control-plane", devices=0,
                spec=spec, show={"image": image})
    return Service(name=name, units=[unit], started=started)


def _frontend(cluster: Cluster, prof: DynamoProfile, rid: str, phase: int, prepared: Prepared) -> Service:
    n0 = cluster.node0
    rd = release_dir(cluster, rid)
    image = serving_image(cluster, n0, prepared)
    spec = trtllm_spec(cluster, prof, rid, container(cluster, rid, "frontend"), "frontend", "frontend", phase, image,
                       f"{rd}/frontend.env", ["sh", f"{rd}/frontend.sh"])
    unit = Unit(host=n0.name, container=container(cluster, rid, "frontend"), prefix="frontend.", role="frontend", devices=0, spec=spec,
                show={"image": image,
                      "serve_command": f"python3 -m dynamo.frontend --http-port {prof.frontend_port} --router-mode kv --router-session-affinity-ttl-secs 14400"})
    return Service(name="frontend", units=[unit])


def _worker_group(cluster: Cluster, prof: DynamoProfile, rid: str, phase: int, prepared: Prepared, w: dynamo.Worker, pmix: bool) -> Service:
    """One prefill or decode group: a unit per node it spans, one MPI world
    (``pmix``: which the runtime starts in one launch, ``UnitRuntime.worlds``)."""
    rd = release_dir(cluster, rid)
    units = []
    # mpirun's line only where mpirun starts the group
    mpirun, tail = mpirun_args(cluster, prof, rid, w, prepared) if not pmix else ([], "")
    for i, (host, gpus) in enumerate(w.nodes):
        node = cluster.node(host)
        launcher = i == 0
        # a PMIx group's line is the same on every node (one launch): its first node's image, which prepare made every node's
        image = serving_image(cluster, cluster.node(w.rank0_node) if pmix else node, prepared)
        script = f"{w.name}.{'task' if pmix else 'serve' if launcher else 'hold'}.sh"
        spec = trtllm_spec(cluster, prof, rid, container(cluster, rid, w.name), w.name, w.role, phase, image,
                           f"{rd}/{w.name}.env", ["sh", f"{rd}/{script}"], ssh=launcher and len(w.nodes) > 1 and not pmix,
                           ranks=f"0-{w.ranks - 1}" if pmix else ",".join(map(str, gpus)))
        show = {"image": image, "ranks": f"{w.ranks} ({len(gpus)} here)",
                "cuda_visible_devices": w.cuda_visible_devices(host), "system_port": w.system_port}
        if pmix or launcher:
            note, show["numactl"] = membind_shown(cluster, prof, node, prepared)
            # pmix: every task of the group's one launch runs its node's task.sh (the setup, the merge, then this)
            show["serve_command"] = (note + task_command(cluster, prof, rid, w, node, prepared) if pmix
                                     else f"{shlex.join(mpirun)} <-x every variable of {PROFILE_ENV}> {note}{tail}")
        # a PMIx group starts at once (one launch, a task per GPU here); mpirun's starts its holders first
        units.append(Unit(host=host, container=container(cluster, rid, w.name), prefix=f"{w.name}.", spec=spec,
                          order=0 if pmix or not launcher else 1, role=w.role, show=show, tasks=len(gpus) if pmix else 1))
    return Service(name=w.name, units=units, restart="group", world=pmix)


def entry_port(cluster: Cluster, profile: DynamoProfile) -> int:
    return profile.frontend_port


def metrics(cluster: Cluster, profile: DynamoProfile) -> Metrics:
    """The frontend's /metrics (Dynamo docs, "Metrics"): requests in flight
    and queued (awaiting their first token), output tokens counted."""
    return Metrics(probe=Probe(name="frontend /metrics", kind="http", host=cluster.node0.name, port=profile.frontend_port, path="/metrics"),
                   running=["dynamo_frontend_inflight_requests"], waiting=["dynamo_frontend_queued_requests"],
                   generated_tokens=["dynamo_frontend_output_tokens_total"])


def drain(cluster: Cluster, profile: DynamoProfile) -> Drain:
    """The frontend first: on SIGTERM it stops taking requests and finishes
    those in flight (graceful shutdown); the workers stop after it."""
    return Drain(refuse_first=["frontend"])


def chat_request(prof: DynamoProfile) -> dict:
    """The seed's request through Dynamo."""
    return {"model": prof.served_model_name, "messages": [{"role": "user", "content": CHAT_PROMPT}], "max_tokens": 256}


# Why readiness does not wait for trtllm_kv_cache_utilization. The seed checks
# it "after traffic", and a worker only has it once its own engine ran
# iterations: ai-dynamo 1.6.1 dynamo/trtllm/publisher.py sets the gauge from
# the engine's iteration stats (_publish_stats_task; "the engine only
# produces iteration stats under enable_iter_perf_stats"), and with the
# profile's iter_perf_stats_interval: 40 TensorRT-LLM builds a stats record
# only on every 40th executor iteration (NVIDIA/TensorRT-LLM #19717; under
# attention DP an unsampled batch that drains the executor emits no record
# either). Which prefill and decode worker a request reaches is the router's
# choice (KV-aware, with session affinity), so a probe of every worker's
# sample after a chat or a few passes or fails by where the router sent them
# (a whole-release restart after one decode died failed on "prefill2
# /metrics: ... has no trtllm_kv_cache_utilization sample"). What Dynamo
# itself offers to tell a worker is up does not depend on traffic (docs
# "Health Check Reference"): the frontend's /health lists the discovered
# instances, and each worker's system port (DYN_SYSTEM_PORT) /health turns
# 200 "ready" once its endpoints are registered. So readiness is: the
# frontend lists every worker by role, every worker's own /health is ready,
# /v1/models has the served name, the seed's chat answers (through whichever
# workers the router picks), and every worker's /metrics answers Prometheus
# text (the seed's curl --fail).


def probe(cluster: Cluster, profile: DynamoProfile, name: str) -> list[Probe]:
    prof = profile
    n0 = cluster.node0.name
    workers = dynamo.placement(cluster, prof)
    if name in ("frontend_health", "frontend_settled"):
        want = [{"name": w.name, "role": w.role, "host": w.rank0_node, "port": w.system_port} for w in workers]
        if name == "frontend_settled":
            # the first check again, once every worker says it is ready: a worker group started again after a
            # SIGKILL left its old instance listed until that etcd lease expires, and while the new one was not
            # listed yet the count was already right (seen on a restart --service of a killed decode group:
            # healthy, then status listed 2 decode instances for 1 worker); by now the new one is listed, so
            # the count holds only once the old is gone. It waits for that (wait_body), it does not fail on it
            return [Probe(name="frontend /health lists exactly the workers", kind="http", host=n0, port=prof.frontend_port,
                          path="/health", check="dynamo_health", arg=json.dumps(want), wait_body=True)]
        return [Probe(name="frontend /health lists every worker", kind="http", host=n0, port=prof.frontend_port, path="/health",
                      check="dynamo_health", arg=json.dumps(want))]
    if name == "worker_health":
        return [Probe(name=f"{w.name} /health", kind="http", host=w.rank0_node, port=w.system_port, path="/health", check="json", arg="status=ready")
                for w in workers]
    if name == "models":
        # wait_body: the real frontend lists a (re)started worker in /health a moment before its model is in
        # /v1/models (seen with ai-dynamo 1.6 on a rollback: /health listed both workers, /v1/models had [])
        return [Probe(name="/v1/models", kind="http", host=n0, port=prof.frontend_port, path="/v1/models", check="models", arg=prof.served_model_name,
                      wait_body=True)]
    if name == "chat":
        # the seed's request, once: whichever prefill and decode worker the router picks for it
        # not_yet 500: for a moment after a worker (re)registers the real frontend answers 500 "Failed to generate
        # completions" (its log: "no endpoints available to route work") before the router has taken it in
        # (seen with ai-dynamo 1.6 when a killed decode group was started again)
        return [Probe(name="chat check", kind="http", host=n0, port=prof.frontend_port, method="POST", path="/v1/chat/completions",
                      body=chat_request(prof), headers={"x-dynamo-session-id": SESSION_ID}, check="answer", not_yet=[500])]
    if name == "worker_metrics":
        # the seed's `curl --fail` of every worker's /metrics; not its trtllm_kv_cache_utilization
        # sample, which shows only after that worker's engine ran (and sampled) iterations (see above)
        return [Probe(name=f"{w.name} /metrics", kind="http", host=w.rank0_node, port=w.system_port, path="/metrics", check="prometheus")
                for w in workers]
    raise LlmdeployError(f"playbooks/serve-{KIND}.yaml: {KIND} has no readiness probe {name!r} "
                         "(frontend_health, worker_health, models, chat, worker_metrics, frontend_settled)")


# The component each role's workers register under when the plan passes no
# --endpoint: ai-dynamo dynamo/trtllm/args.py ``_default_endpoint``, "prefill"
# for prefill workers and DEFAULT_ENDPOINT_COMPONENT "backend" for the others.
ROLE_COMPONENT = {"prefill": "prefill", "decode": "backend"}


def frontend_health(body: bytes, arg: str) -> str | None:
    """The frontend answers 200 "healthy" even with no worker at all (seen
    with ai-dynamo 1.6): the body must list, per role, exactly as many
    ``generate`` instances as the plan has workers of that role. Its
    ``instances`` also hold every worker's other endpoints (router-discovery,
    the KV query source...): only ``generate`` counts. A SIGKILLed worker
    stays listed until its etcd lease expires, and the router still sends it
    requests (they fail: 500 "Failed to generate completions", seen after a
    restart of a killed decode group): more instances than workers is not
    ready yet. ``arg``: JSON list of the expected workers, each {"name",
    "role", "host", "port"}."""
    doc = json.loads(body)
    want = json.loads(arg) if arg else []
    have = [i for i in (doc.get("instances") or []) if isinstance(i, dict) and i.get("endpoint", "generate") == "generate"]
    missing, extra = [], []
    for role in sorted({w.get("role", "") for w in want} - {""}):
        expected = [w["name"] for w in want if w.get("role") == role]
        component = ROLE_COMPONENT.get(role, role)
        found = len({i.get("instance_id", id(i)) for i in have if i.get("component") == component})
        if found < len(expected):
            missing.append(f"{len(expected) - found} of {len(expected)} {role} ({', '.join(expected)})")
        elif found > len(expected):
            extra.append(f"{found} {role} instances for {len(expected)} {role} worker(s) ({', '.join(expected)}): "
                         "the others are of workers that are gone, listed until their etcd leases expire")
    gone = f"; missing {'; '.join(missing)}" if missing else ""
    if doc.get("status") != "healthy":
        return f"says {doc.get('status')!r}: {doc.get('message') or ''} ({len(have)} of {len(want)} workers registered{gone})"
    if missing:
        return f"lists {len(have)} of {len(want)} workers{gone}"
    if extra:
        return f"lists {'; '.join(extra)}"
    return None


# the readiness body checks this system adds (systems.probe_checks); plan.json files name them
PROBE_CHECKS = {"dynamo_health": frontend_health}


def files(cluster: Cluster, profile: DynamoProfile, plan: ReleasePlan, prepared: Prepared, image_id: str | None) -> ReleaseFiles:
    prof = profile
    rd = release_dir(cluster, plan.release)
    def setup(exports: dict[str, str], unsets: Sequence[tuple[str, str]] = ()) -> str:
        return render("dynamo/setup.sh.j2", profile_env=PROFILE_ENV, recipes_mount=prof.recipes_mount, exports=exports, unsets=list(unsets))

    out: ReleaseFiles = {}
    for n in cluster.nodes:
        units = plan.units(n.name)
        f: dict[str, ReleaseFile] = {"env": ReleaseFile(commenv.render(cluster, n), commenv.env_mode(cluster))}
        for u in units:
            svc = plan.service_of(u)
            # a worker's holder merges its config first: the group's mpirun may enter as soon as run.sh returns
            holder = u.role in ("prefill", "decode") and u.order == 0 and len(svc.units) > 1 and not svc.world
            f[u.run_file] = ReleaseFile(render("run.sh.j2", what=f"{u.container} ({svc.name})", release=plan.release, host=n.name,
                                    command=u.show["container_command"], container=shlex.quote(u.container),
                                    wait_for_file=shlex.quote(f"{rd}/{svc.name}.config.yaml") if holder else ""), 0o755)
        if any(u.container == container(cluster, plan.release, "frontend") for u in units):
            f["frontend.env"] = ReleaseFile(env_text(cluster, n, env_of(cluster, prof, n, frontend=True), "the frontend"), commenv.env_mode(cluster))
            f["frontend.sh"] = ReleaseFile(render("dynamo/frontend.sh.j2", release=plan.release, cluster=cluster.name, setup=setup(dynamo.frontend_env(prof)),
                                       port=prof.frontend_port), 0o755)
        workers_here = [w for w in dynamo.placement(cluster, prof) if n.name in w.node_names]
        if workers_here:
            f[trtllm.MERGE_SCRIPT_NAME] = ReleaseFile(trtllm.merge_script(), 0o644)
        for w in workers_here:
            launcher = w.rank0_node == n.name
            pmix = plan.service(w.name).world
            f[f"{w.name}.env"] = ReleaseFile(env_text(cluster, n, env_of(cluster, prof, n, w), w.name), commenv.env_mode(cluster))
            f[f"{w.name}.overrides.yaml"] = ReleaseFile(dynamo.role_yaml(cluster, prof, w), 0o644)
            # pmix: this node's command for each of its tasks; else mpirun's line and the ranks' command after it
            mpirun, tail = mpirun_args(cluster, prof, plan.release, w, prepared) if not pmix else ([], task_command(cluster, prof, plan.release, w, n, prepared))
            # pmix: every rank runs it (its node's setup and merge, then its command); else the group's first node's runs
            # mpirun, the others' hold the ranks mpirun's launch agent brings
            mode = "task" if pmix else "serve" if launcher else "hold"
            f[f"{w.name}.{mode}.sh"] = ReleaseFile(render(
                "dynamo/worker.sh.j2", worker=w.name, role=w.role, profile=w.profile, ranks=w.ranks, release=plan.release, cluster=cluster.name,
                mode=mode, setup=setup(dynamo.worker_env(cluster, w, n.name), dynamo.worker_unsets(prof)), merge=shlex.quote(f"{rd}/{trtllm.MERGE_SCRIPT_NAME}"), base=dynamo.base_yaml_name(prof, w),
                overrides=shlex.quote(f"{rd}/{w.name}.overrides.yaml"), config=shlex.quote(f"{rd}/{w.name}.config.yaml"),
                profile_env=PROFILE_ENV, mpirun=shlex.join(mpirun), tail=tail,
                rank0_host=w.rank0_node, rank0_slurm=cluster.slurm_name(cluster.node(w.rank0_node))), 0o755)
            if len(w.nodes) > 1 and not pmix:
                f[f"{w.name}.mpi-agent.sh"] = ReleaseFile(launch_agent(cluster, plan.release, container(cluster, plan.release, w.name), w.node_names,
                                                            prof.launch_ssh_config), 0o755)
                if launcher:
                    f[f"{w.name}.hostfile"] = ReleaseFile(hostfile(cluster, plan.release, [(host, len(gpus)) for host, gpus in w.nodes]), 0o644)
        main = units[0] if units else None
        meta = {"release": plan.release, "cluster": cluster.name, "host": n.name, "system": plan.system, "topology": prof.topology,
                # the image prepare pulled (its ID is image_id) and the one the containers run (with the wheels)
                "image": cluster.image.ref, "image_id": image_id, "serving_image": serving_image(cluster, n, prepared),
                "units": [{"service": plan.service_of(u).name, "container": u.container, "role": u.role} for u in units],
                "container": main.container if main else None, "role": main.role if main else None,
                "command": list(main.spec.command[-2:]) if main and main.spec else []}
        f["release.json"] = ReleaseFile(json.dumps(meta, indent=1, sort_keys=True) + "\n", 0o644)
        out[n.name] = f
    return out


def _shown_file(name: str) -> bool:
    """What ``deploy --check`` shows of a node's files: its scripts, role settings, environments and hostfiles."""
    return name.endswith((".sh", ".yaml", ".env", "hostfile")) and not name.endswith("run.sh") and name != trtllm.MERGE_SCRIPT_NAME


def check_doc(cluster: Cluster, profile: DynamoProfile, plan: ReleasePlan, secrets: list[str]) -> dict:
    from llmdeploy.errors import mask
    from llmdeploy.report import mask_env

    nodes = []
    for n in cluster.nodes:
        units = plan.units(n.name)
        env = commenv.env_vars(cluster, n)
        doc = {"host": n.name, "role": ", ".join(u.role for u in units) or "-", "env": mask_env(env, secrets),
               "units": [{"service": plan.service_of(u).name, "container": u.container, **{k: (mask(v, secrets) if isinstance(v, str) else v)
                                                                                            for k, v in u.show.items()}} for u in units],
               "container_command": "\n  ".join(mask(u.show["container_command"], secrets) for u in units),
               "files": check_files(plan, n.name, secrets, _shown_file)}
        nodes.append(doc)
    return {"nodes": nodes, "topology": profile.topology,
            "workers": [w.as_dict() for w in dynamo.placement(cluster, profile)]}


# this plug-in's conformance, for the type checker (the registry checks it again when it loads)
if TYPE_CHECKING:  # pragma: no cover - types only
    import systems.dynamo as _this
    from llmdeploy.serving import ServingSystem

    _conforms: ServingSystem = _this
