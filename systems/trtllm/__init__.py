"""TensorRT-LLM ``trtllm-serve`` (seed 000) as a release plan: one MPI world
across the nodes, one rank per GPU, the HTTP server on rank 0's node.

Every node runs the seed's container, long-lived and detached. The launch
node's (node 0's) runs ``serve.sh``: it layers the release's overrides on
the curated profile inside the container (``merge-config.py``), then
``exec mpirun ... trtllm-llmapi-launch trtllm-serve ...``. The other nodes'
containers hold the ranks: mpirun's launch agent (``mpi-agent.sh``, its
``plm_rsh_agent``) reaches each host over SSH and starts OpenMPI's daemon
inside that host's container with ``docker exec``, so every rank runs with
the same image, mounts and environment, and mpirun, orted and the ranks are
the container's own OpenMPI. One rank's death ends the MPI job: the service's
restart policy is ``group``: the world is stopped everywhere and started
again, with backoff.

Ready: ``/health`` 200 on node 0, ``/v1/models`` lists the model (trtllm-serve
names it by its model argument), and a chat request with thinking on answers
200 with reasoning content (the ``qwen3_5`` reasoning parser splits it out).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import json
import posixpath
import shlex

from llmdeploy.container import ContainerSpec, Mount
from llmdeploy.errors import LlmdeployError
from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster, Node
from llmdeploy.release import release_dir
from llmdeploy.releaseplan import Drain, Metrics, Probe, ReleasePlan, Service, Unit
from llmdeploy.serving import PlaybookEntry, Prepared, ReleaseFile, ReleaseFiles, ServingProfile
from roles import commenv, containers
from roles.mpi import launch_agent_args, tcp_if_args
from systems.common import check_files, hostfile, launch_agent, mpi_exports, nic_signature, nics, openai_probe, render, serving_image

from . import config as trtllm
from . import eplb
from .profile import KIND, TrtllmProfile  # noqa: F401 (KIND: the registry reads it here)

PROFILE: type[ServingProfile] = TrtllmProfile
LABELS: dict[str, str] = {"ranks": "ranks"}

CHAT_PROMPT = "Where is New York?"
STOP_CLEANUP = ""
DRIFT_ENV_PREFIXES = ["NCCL_", "GLOO_", "UCX_", "TLLM_", "TRTLLM_"]
SIGNATURES: list[tuple[str, str]] = [
    nic_signature(),  # first: the rank's own words, before what mpirun and NCCL say after it
    (r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError",
     "CUDA out of memory on a rank (lower kv_cache_config.free_gpu_memory_fraction, max_batch_size or max_num_tokens)"),
    (r"mpirun noticed that process rank \d+ .*exited on signal",
     "a rank was killed (mpirun ended the world; the rank's node and signal are in this line)"),
    (r"NCCL error|ncclSystemError|ncclInternalError|ncclRemoteError|NCCL WARN .*(failed|error)",
     "NCCL error between ranks (check NCCL_SOCKET_IFNAME and the fabric: invoke verify-comm)"),
    (r"There are not enough slots available",
     "more ranks than slots in the hostfile"),
    (r"ORTE was unable to reliably start one or more daemons|ORTE does not know how to route|An ORTE daemon has unexpectedly failed|PRRTE has lost communication|ssh: connect to host|Host key verification failed",
     "MPI could not start its daemons on every node (the launch agent's SSH from node 0, launch_ssh_config, and every node's container running)"),
    (r"mpirun noticed that process rank \d+ .*exited|mpirun detected that one or more processes exited with non-zero status|Primary job +terminated normally, but 1 process returned",
     "a rank exited and mpirun ended the world"),
    (r"LLM is unavailable", "the executor died (/health answers 503)"),
]
SERVE_FILES = {"hostfile": "hostfile", "agent": "mpi-agent.sh", "serve": "serve.sh", "hold": "hold.sh", "config": "config.yaml",
               "task": "task.sh"}
EPLB_NAME = "eplb.yaml"


def container_name(cluster: Cluster, rid: str) -> str:
    return f"{cluster.name}-{rid}"



def placement(cluster: Cluster, prof: TrtllmProfile) -> list[tuple[Node, int, range]]:
    """(node, slots, its global ranks) in rank order, node 0 first (``prof``:
    the cluster's profile, as the hook that builds the plan received it)."""
    out, first = [], 0
    for name, slots in prof.ranks(cluster.nodes):
        out.append((cluster.node(name), slots, range(first, first + slots)))
        first += slots
    return out


def _ranks_text(r: range) -> str:
    return f"{r.start}" if len(r) == 1 else f"{r.start}-{r.stop - 1}"


def world_envs(cluster: Cluster, prof: TrtllmProfile) -> tuple[list[str], list[str]]:
    """(the variables mpirun exports to every rank, those each node keeps from
    its own environment file): ``systems.mpi_exports`` over the environment
    files of the world's nodes, the node's NIC variables always per node."""
    envs = [commenv.env_vars(cluster, node) for node, _, _ in placement(cluster, prof)]
    return mpi_exports(envs, commenv.node_specific(cluster))


def world_env(cluster: Cluster, prof: TrtllmProfile) -> list[str]:
    """The variables mpirun exports to every rank (``-x NAME``: the value
    comes from the launch container's environment file, so no value, secrets
    included, is on the command line); not the per-node ones (``world_envs``)."""
    return world_envs(cluster, prof)[0]


def mpirun_args(cluster: Cluster, prof: TrtllmProfile, rid: str) -> list[str]:
    rd = release_dir(cluster, rid)
    world = prof.tp * prof.pp
    args = ["mpirun", "--allow-run-as-root", "-np", str(world), "--hostfile", f"{rd}/{SERVE_FILES['hostfile']}"]
    if len(placement(cluster, prof)) > 1:
        args += launch_agent_args(f"{rd}/{SERVE_FILES['agent']}")
    args += tcp_if_args(nics(cluster, [n.name for n in cluster.nodes]))
    for name in world_env(cluster, prof):
        args += ["-x", name]
    args += ["trtllm-llmapi-launch", "trtllm-serve", cluster.model.path, "--host", "0.0.0.0", "--port", str(prof.port),
             "--reasoning_parser", prof.reasoning_parser, "--tool_parser", prof.tool_parser,
             "--config", f"{rd}/{SERVE_FILES['config']}"]
    return args


def task_args(cluster: Cluster, prof: TrtllmProfile, rid: str) -> list[str]:
    """What every rank of a PMIx world runs (``task.sh`` execs it after the node's config merge)."""
    rd = release_dir(cluster, rid)
    return ["trtllm-llmapi-launch", "trtllm-serve", cluster.model.path, "--host", "0.0.0.0", "--port", str(prof.port),
            "--reasoning_parser", prof.reasoning_parser, "--tool_parser", prof.tool_parser,
            "--config", f"{rd}/{SERVE_FILES['config']}"]


def ssh_mounts_for(launch_ssh_config: str | None) -> list[Mount]:
    """What the launch agent needs inside the launch container: root's SSH
    files, and the directory of ``launch_ssh_config`` when it lives elsewhere."""
    out = [Mount("/root/.ssh", "/root/.ssh", readonly=True)]
    if launch_ssh_config:
        d = posixpath.dirname(launch_ssh_config)
        if not (d + "/").startswith("/root/.ssh/"):
            out.append(Mount(d, d, readonly=True))
    return out


# the seed's docker run options, in its order and spelling (``--ipc=host --gpus all -p 8000:8000``)
SEED_FLAGS = ("--ipc=", "--gpus", "-p", "--network", "--ulimit", "--hostname")


def container_spec(cluster: Cluster, prof: TrtllmProfile, node: Node, rid: str, image: str, launcher: bool, stop_phase: int,
                   ranks: range, pmix: bool) -> ContainerSpec:
    """The seed's container (``--ipc=host --gpus all -p 8000:8000 -v
    ~/.cache:/root/.cache:rw``), long-lived, named for the cluster and
    release. Across nodes it also gets the host network (MPI's and NCCL's
    connections between nodes; docker then ignores ``-p``) and the launch
    agent's SSH files; the release directory is mounted so the container
    reads its files and writes the merged config. ``pmix``: the runtime
    starts the world in one launch (``UnitRuntime.worlds``)."""
    rd = release_dir(cluster, rid)
    multi = len(placement(cluster, prof)) > 1
    # a PMIx world is one launch of the same line on every node: its labels say the world, not the node's part
    role, shown = ("world", _ranks_text(range(prof.tp * prof.pp))) if pmix else ("launcher" if launcher else "ranks", _ranks_text(ranks))
    mounts = [Mount(cluster.cache_dir, cluster.cache_dir, form="volume-mode")]
    if not cluster.model.path.startswith(cluster.cache_dir + "/"):
        mounts.append(Mount(cluster.model.path, cluster.model.path, readonly=True))
    mounts.append(Mount(rd, rd))
    if multi and launcher and not pmix:
        mounts += ssh_mounts_for(prof.launch_ssh_config)
    # mpirun takes a hostfile entry that is not its own host name for a remote host (ssh): one node's world is named for it
    between = pmix or multi
    return ContainerSpec(
        name=container_name(cluster, rid), image=image,
        command=("sh", f"{rd}/{SERVE_FILES['task' if pmix else 'serve' if launcher else 'hold']}"),
        labels=containers.label_values(cluster.name, rid, "world", role, stop_phase, ranks=shown),
        ipc="host", gpus="all", ports=(f"{prof.port}:{prof.port}",),
        network="host" if between else None, ulimits=("memlock=-1",) if between else (), hostname=None if between else node.name,
        mounts=tuple(mounts), env_files=(f"{rd}/env",), docker_flags=SEED_FLAGS)


def units(cluster: Cluster, prof: TrtllmProfile, service: str, nodes: list[Node], prepared: Prepared, rid: str, entry: PlaybookEntry,
          pmix: bool):
    if service != "world":
        raise LlmdeployError(f"playbooks/serve-trtllm-serve.yaml: trtllm-serve has one service, 'world', not {service!r}")
    rd = release_dir(cluster, rid)
    out = []
    for node, slots, ranks in placement(cluster, prof):
        if node not in nodes:
            continue
        launcher = node is cluster.node0
        # a PMIx world's line is the same on every node (one launch): node 0's image, which prepare made every node's
        image = serving_image(cluster, cluster.node0 if pmix else node, prepared)
        show = {
            "ranks": _ranks_text(ranks),
            "slots": slots,
            "image": image,
        }
        if launcher:
            show["serve_command"] = shlex.join(task_args(cluster, prof, rid) if pmix else mpirun_args(cluster, prof, rid))
            show["config"] = f"{rd}/{SERVE_FILES['config']}"
        # a PMIx world starts at once (one launch, ``slots`` tasks here); mpirun's starts the rank holders first
        out.append(Unit(host=node.name, container=container_name(cluster, rid), order=0 if pmix else 1 if launcher else 0,
                        role="launcher" if launcher else "ranks", show=show,
                        spec=container_spec(cluster, prof, node, rid, image, launcher, entry.stop_phase, ranks, pmix), tasks=slots if pmix else 1))
    return out, None


def services(dep: Deployment, profile: TrtllmProfile, entry: PlaybookEntry, nodes: list[Node], prepared: Prepared,
             rid: str) -> list[Service]:
    pmix = dep.runtime.worlds
    made, started = units(dep.cluster, profile, entry.name, nodes, prepared, rid, entry, pmix)
    return [Service(name=entry.name, units=made, started=started, world=pmix)]


def entry_port(cluster: Cluster, profile: TrtllmProfile) -> int:
    return profile.port


def metrics(cluster: Cluster, profile: TrtllmProfile) -> Metrics:
    """trtllm-serve's /metrics: the executor's iteration statistics as JSON
    (numActiveRequests, numQueuedRequests, kvCacheStats; trtllm-serve docs, "Metrics")."""
    return Metrics(probe=Probe(name="trtllm-serve /metrics", kind="http", host=cluster.node0.name, port=profile.port, path="/metrics"),
                   running=["numActiveRequests"], waiting=["numQueuedRequests"])


def drain(cluster: Cluster, profile: TrtllmProfile) -> Drain:
    """trtllm-serve has no call that stops admission: the wait counts new requests too."""
    return Drain(note="trtllm-serve cannot refuse new requests while it drains; clients still reaching it are counted and cut at the end of the wait")


def chat_request(model: str) -> dict:
    """The seed's test request, with thinking on (the reasoning parser splits it out)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": CHAT_PROMPT}],
        "max_tokens": 1024,
        "top_p": 1.0,
        "chat_template_kwargs": {"enable_thinking": True},
    }


def probe(cluster: Cluster, profile: TrtllmProfile, name: str) -> list[Probe]:
    model = cluster.model.path  # trtllm-serve serves the model under its argument
    return [openai_probe(KIND, cluster.node0.name, profile.port, name, model, chat_request(model), "reasoning")]


def eplb_map(prof: TrtllmProfile) -> eplb.EplbMap | None:
    """The inventory's static EPLB map, checked; LlmdeployError naming what is wrong."""
    path = prof.eplb_map_file()
    if path is None:
        return None
    try:
        return eplb.load_map(path, prof.config)
    except (ValueError, OSError) as exc:
        raise LlmdeployError(f"profile.eplb_map: {exc}") from None


def files(cluster: Cluster, profile: TrtllmProfile, plan: ReleasePlan, prepared: Prepared, image_id: str | None) -> ReleaseFiles:
    prof = profile
    rd = release_dir(cluster, plan.release)
    emap = eplb_map(prof)
    out = {}
    for n in cluster.nodes:
        us = plan.units(n.name)
        if not us:
            continue
        u = us[0]
        config = f"{rd}/{SERVE_FILES['config']}"
        pmix = plan.service_of(u).world
        files: dict[str, ReleaseFile] = {
            "env": ReleaseFile(commenv.render(cluster, n), commenv.env_mode(cluster)),
            "run.sh": ReleaseFile(render("run.sh.j2", what="this node's trtllm-serve container", release=plan.release, host=n.name,
                              command=u.show["container_command"], wait_for_file="" if u.role == "launcher" or pmix else shlex.quote(config),
                              container=shlex.quote(u.container)), 0o755),
        }
        # every node merges the same config (the curated file is inside the image)
        eplb_path = f"{rd}/{EPLB_NAME}" if emap else None
        files[trtllm.OVERRIDES_NAME] = ReleaseFile(trtllm.overrides_yaml(cluster, prof, eplb_path), 0o644)
        files[trtllm.MERGE_SCRIPT_NAME] = ReleaseFile(trtllm.merge_script(), 0o644)
        if emap:
            files[EPLB_NAME] = ReleaseFile(emap.text, 0o644)
        merge = dict(release=plan.release, cluster=cluster.name, merge=shlex.quote(f"{rd}/{trtllm.MERGE_SCRIPT_NAME}"),
                     curated=shlex.quote(trtllm.curated_path(prof)), overrides=shlex.quote(f"{rd}/{trtllm.OVERRIDES_NAME}"),
                     config=shlex.quote(config))
        meta = {"release": plan.release, "cluster": cluster.name, "host": n.name, "role": u.role, "ranks": u.show["ranks"],
                "container": u.container, "image": u.show["image"], "image_id": image_id, "system": plan.system,
                "command": list(u.spec.command) if u.spec else []}
        if pmix:
            # every rank runs it: its node's merge (once per node, atomically), then trtllm-llmapi-launch trtllm-serve
            files[SERVE_FILES["task"]] = ReleaseFile(render("trtllm/task.sh.j2", command=shlex.join(task_args(cluster, prof, plan.release)),
                                                            rank0_host=cluster.node0.name, rank0_slurm=cluster.slurm_name(cluster.node0),
                                                            **merge), 0o755)
        elif len(placement(cluster, prof)) > 1:
            files[SERVE_FILES["agent"]] = ReleaseFile(launch_agent(cluster, plan.release, u.container, [node.name for node, _, _ in placement(cluster, prof)],
                                                        prof.launch_ssh_config), 0o755)
        if emap:
            meta["eplb_map"] = {"source": str(emap.path), "sha256": emap.sha256, "num_slots": emap.num_slots, "layers": emap.layers}
        if pmix:
            pass
        elif u.role != "launcher":
            files[SERVE_FILES["hold"]] = ReleaseFile(render("trtllm/hold.sh.j2", **merge), 0o755)
        else:
            files[SERVE_FILES["hostfile"]] = ReleaseFile(hostfile(cluster, plan.release, [(node.name, slots) for node, slots, _ in placement(cluster, prof)]), 0o644)
            files[SERVE_FILES["serve"]] = ReleaseFile(render("trtllm/serve.sh.j2", command=u.show["serve_command"],
                                                  per_node=" ".join(world_envs(cluster, prof)[1]), **merge), 0o755)
        meta["curated"] = trtllm.curated_path(prof)
        files["release.json"] = ReleaseFile(json.dumps(meta, indent=1, sort_keys=True) + "\n", 0o644)
        out[n.name] = files
    return out


def check_doc(cluster: Cluster, profile: TrtllmProfile, plan: ReleasePlan, secrets: list[str]) -> dict:
    from llmdeploy.errors import mask
    from llmdeploy.report import mask_env

    nodes = []
    for n in cluster.nodes:
        us = plan.units(n.name)
        if not us:
            continue
        u = us[0]
        env = commenv.env_vars(cluster, n)
        doc = {"host": n.name, "role": u.role, "ranks": u.show["ranks"], "slots": u.show["slots"],
               "env": mask_env(env, secrets),
               "container": u.container, "image": u.show["image"],
               "container_command": mask(u.show["container_command"], secrets)}
        if u.role == "launcher":
            doc["serve_command"] = mask(u.show["serve_command"], secrets)
            doc["files"] = check_files(plan, n.name, secrets,
                                       lambda name: name in (trtllm.OVERRIDES_NAME, SERVE_FILES["hostfile"], SERVE_FILES["agent"], SERVE_FILES["serve"]))
        nodes.append(doc)
    exported, per_node = world_envs(cluster, profile)
    return {"nodes": nodes, "launch": {"host": cluster.node0.name, "mpirun": nodes[0].get("serve_command"),
                                       "exported_env": exported, "per_node_env": per_node,
                                       "curated": trtllm.curated_path(profile), "config": f"{release_dir(cluster, plan.release)}/{SERVE_FILES['config']}",
                                       "overrides_yaml": plan.files[cluster.node0.name][trtllm.OVERRIDES_NAME][0]}}


# this plug-in's conformance, for the type checker (the registry checks it again when it loads)
if TYPE_CHECKING:  # pragma: no cover - types only
    import systems.trtllm as _this
    from llmdeploy.serving import ServingSystem

    _conforms: ServingSystem = _this
