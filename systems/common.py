"""What several serving systems share: the serving image prepare recorded,
the NIC failure signature, which variables an MPI world exports, OpenMPI's
hostfile and launch agent, the readiness probes of an OpenAI-compatible
server. A system imports these; nothing here knows a system. (A system's
own profile is resolved once per call into it, by the registry:
``llmdeploy.serving.System.profile``; every builder takes it as ``prof``.)"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Callable

from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import Cluster, Node
from llmdeploy.releaseplan import Probe, ReleasePlan
from llmdeploy.serving import Prepared, ReleaseFile
from roles import mpi
from roles import render  # noqa: F401 (the systems render their files with it)
from roles.mpi import nics  # noqa: F401 (the systems' OpenMPI *_if_include lists)


def nccl_node_env(node: Node) -> dict[str, str]:
    """NCCL's and Gloo's socket interface: each node's own serving NIC."""
    assert node.nic is not None  # the cluster's validation gives every node one (Cluster._derive_nodes)
    return {"NCCL_SOCKET_IFNAME": node.nic, "GLOO_SOCKET_IFNAME": node.nic}


class NcclEnvironment:
    """The environment hooks of a profile whose ranks talk NCCL and Gloo over
    each node's serving NIC: those two variables per node, then the
    profile's ``env`` (a mixin before ``ServingProfile``)."""

    if TYPE_CHECKING:  # the profile's field (not declared here: pydantic would collect it)
        env: dict[str, str]

    def node_env(self, cluster: Cluster, node: Node) -> dict[str, str]:
        return nccl_node_env(node)

    def environment(self, cluster: Cluster, node: Node) -> dict[str, str]:
        return {**self.node_env(cluster, node), **self.env}


def container_files(cluster: Cluster, release: str, node: Node, show: dict, what: str, meta: dict) -> dict[str, ReleaseFile]:
    """The files of a node that runs one serving container: its environment
    file, ``serve.sh`` (the server's command, for people), ``run.sh`` (what
    starts the container) and ``release.json`` (``meta``)."""
    from roles import commenv

    return {
        "env": ReleaseFile(commenv.render(cluster, node), commenv.env_mode(cluster)),
        "serve.sh": ReleaseFile(render("serve.sh.j2", command=show["serve_command"]), 0o755),
        "run.sh": ReleaseFile(render("run.sh.j2", what=what, release=release, host=node.name, command=show["container_command"]), 0o755),
        "release.json": ReleaseFile(json.dumps(meta, indent=1, sort_keys=True) + "\n", 0o644),
    }


def serving_image(cluster: Cluster, node, prepared: Prepared) -> str:
    """The image a node's serving containers run: what prepare recorded (the
    image with its wheels, if any), else what the inventory implies."""
    from roles import wheels

    rec = prepared.of(node.name)
    return (rec.serving_ref if rec else None) or wheels.serving_ref(cluster)


def accessory_image(node, prepared: Prepared, ref: str) -> str:
    """What a node's unit of accessory image ``ref`` (Dynamo's etcd, NATS)
    runs: the file prepare imported it as (a pyxis node's record), else the
    reference (Docker; a node not read, as in ``deploy --check``; a record
    of before, or of another reference)."""
    rec = prepared.of(node.name)
    return (rec.accessories.get(ref) if rec else None) or ref


def openai_probe(kind: str, host: str, port: int, name: str, served: str, chat_body: dict, chat_check: str) -> Probe:
    """The readiness probe ``name`` of an OpenAI-compatible server on ``host:port``
    that serves the model as ``served``: ``health`` (``/health`` 200), ``models``
    (``/v1/models`` lists ``served``) or ``chat`` (``chat_body`` answers and
    passes the body check ``chat_check``). Any other name is an error naming
    the system's playbook."""
    if name == "health":
        return Probe(name="/health 200", kind="http", host=host, port=port, path="/health")
    if name == "models":
        return Probe(name="/v1/models", kind="http", host=host, port=port, path="/v1/models", check="models", arg=served)
    if name == "chat":
        return Probe(name="chat check", kind="http", host=host, port=port, method="POST", path="/v1/chat/completions",
                     body=chat_body, check=chat_check)
    raise LlmdeployError(f"playbooks/serve-{kind}.yaml: {kind} has no readiness probe {name!r} (health, models, chat)")


# A rank whose NCCL_SOCKET_IFNAME or GLOO_SOCKET_IFNAME names no interface of its node: NCCL's
# (src/bootstrap.cc, src/transport/net_socket.cc) and Gloo's (gloo/transport/tcp/device.cc) own words.
NIC_PATTERN = r"Bootstrap : no socket interface found|NET/Socket : no interface found|Unable to find address for: \S+"
NIC_REASON = ("no network interface of a rank's node matches NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME (the NIC of that "
              "node's environment file; the node is named in this line; invoke prepare checks each node's NIC)")


def nic_signature() -> tuple[str, str]:
    """The failure signature of a NIC variable that names no interface of a rank's node."""
    return NIC_PATTERN, NIC_REASON


def nic_reason(cluster: Cluster) -> str:
    """NIC_REASON with the NIC the inventory gives each node (what each node's environment file names)."""
    return f"{NIC_REASON}; the inventory's NIC per node: " + ", ".join(f"{n.name} {n.nic}" for n in cluster.nodes)


def mpi_exports(envs: list[dict[str, str]], node_specific: list[str] | tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """Which variables of one MPI world mpirun exports with ``-x NAME``, and
    which each node keeps from its own environment: (exported, per node).

    ``envs`` is the environment file of every node of the world, the launch
    node's first. ``-x NAME`` gives every rank, on every node, the launch
    node's value. A rank needs its own node's value of a per-node variable
    (the NIC in NCCL_SOCKET_IFNAME, a GPU mask), and it has it already: the
    launch agent starts each node's ORTE daemon with ``docker exec`` in that
    node's serving container, whose ``--env-file`` is the node's own file, and
    the ranks inherit the daemon's environment (on the launch node, mpirun's).
    So a variable is per node, and never exported, when it is declared so
    (``node_specific``) or its value differs between the nodes or some node
    lacks it; the rest is the same everywhere and is exported. Pure."""
    if not envs:
        return [], []
    first, others = envs[0], envs[1:]
    declared = set(node_specific)
    per_node = [k for k in first if k in declared or any(e.get(k) != first[k] for e in others)]
    for e in others:
        per_node += [k for k in e if k not in first and k not in per_node]
    return [k for k in first if k not in per_node], per_node


def hostfile(cluster: Cluster, release: str, ranks: list[tuple[str, int]]) -> str:
    """An OpenMPI hostfile for the nodes ``ranks`` names, in rank order
    [(node name, slots)]. Across nodes each entry is the node's serving IP:
    mpirun takes the entry that is one of its own interfaces' addresses for
    the launch node (checked with OpenMPI 4.1) and hands the others to the
    launch agent, so no node name has to resolve on node 0 or in its
    container. One node alone keeps its name (its container's hostname)."""
    by_ip = len(ranks) > 1
    entries = [(str(cluster.node(name).ip) if by_ip else name, slots, name) for name, slots in ranks]
    return render("hostfile.j2", release=release, cluster=cluster.name, by_ip=by_ip, entries=entries)


def launch_agent(cluster: Cluster, release: str, container: str, names: list[str], ssh_config: str | None) -> str:
    """The launch agent (``mpi-agent.sh``) of an MPI world over ``names``:
    each node's serving IP (its hostfile entry) to its SSH host, the node's
    name (a Host the launch ssh_config knows), over ssh with the launch
    settings every MPI launch from node 0 uses (``roles.mpi``), then ``docker
    exec`` into ``container`` there. Every value is quoted."""
    return mpi.launch_agent(cluster, names, ssh_config, release, container)




def container_meta(cluster: Cluster, release: str, system: str, node: Node, unit, image_id: str | None, rank: dict) -> dict:
    """``release.json`` of a node that runs one serving container; ``rank``: the
    system's own rank entry ({"start_rank": 3}, {"node_rank": 1})."""
    import shlex

    return {"release": release, "cluster": cluster.name, "host": node.name, "role": unit.role, **rank,
            "container": unit.container, "image": unit.show["image"], "image_id": image_id, "system": system,
            "command": shlex.split(unit.show["serve_command"])}


def check_files(plan: ReleasePlan, host: str, secrets: list[str], shown: Callable[[str], bool]) -> dict[str, str]:
    """The files of ``host``'s release that ``deploy --check`` shows (``shown(name)``), by name, secrets masked."""
    from llmdeploy.errors import mask

    return {name: mask(text, secrets) for name, (text, _) in sorted(plan.files[host].items()) if shown(name)}


def container_check_node(cluster: Cluster, node: Node, unit, secrets: list[str], rank: dict) -> dict:
    """What ``deploy --check`` shows of a node that runs one serving container, secrets masked."""
    from llmdeploy.errors import mask
    from llmdeploy.report import mask_env
    from roles import commenv

    return {"host": node.name, "role": unit.role, **rank, "env": mask_env(commenv.env_vars(cluster, node), secrets),
            "container": unit.container, "image": unit.show["image"],
            "container_command": mask(unit.show["container_command"], secrets), "serve_command": mask(unit.show["serve_command"], secrets)}


