"""The communication environment of a node: HCCL (Ascend) or NCCL (NVIDIA)
variables, with this node's own IP and NIC, rendered as an env file.

Pure: (cluster, node) -> variables -> file content. The files role writes it.
"""

from __future__ import annotations



from llmdeploy.inventory import Cluster, Node
from roles.files import put_step, sum_probe
from roles import render as render_template



class EnvValueError(ValueError):
    pass


def node_values(cluster: Cluster, node: Node) -> dict[str, str]:
    """The variables whose value is the node's own (its serving NIC or IP),
    as the serving system names them (``profile.node_env``: HCCL/Gloo/TP
    interface and address on Ascend, NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME
    on NVIDIA). Each node's environment file holds its own; nothing may carry
    one node's value to another (``node_specific``)."""
    return cluster.profile.node_env(cluster, node)


def node_specific(cluster: Cluster) -> list[str]:
    """The names of ``node_values``: node-specific whatever their values
    happen to be (two nodes may share a NIC name today and not tomorrow)."""
    return list(node_values(cluster, cluster.node0))


def env_vars(cluster: Cluster, node: Node) -> dict[str, str]:
    """Every variable the node's serving processes need, in a stable order:
    the serving system's (``profile.environment``), then the secrets, last so
    that no profile value can shadow them."""
    out = dict(cluster.profile.environment(cluster, node))
    out.update(cluster.secret_values())
    for key, value in out.items():
        if "\n" in value or "\r" in value:
            raise EnvValueError(f"{key}: a value must be one line")
    return out


def env_path(cluster: Cluster, node: Node) -> str:
    return f"{cluster.etc_dir}/{cluster.name}.env"


def render(cluster: Cluster, node: Node) -> str:
    return render_template("comm.env.j2",
        cluster=cluster.name, node=node.name, role=cluster.role_of(node), env=env_vars(cluster, node)
    )


def parse_env_file(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            out[k] = v
    return out


def env_mode(cluster: Cluster) -> int:
    """0600 when the file holds a secret, else 0644."""
    return 0o600 if cluster.secret_env else 0o644


def render_step(cluster: Cluster, check: bool = False, diff: bool = False, ctx=None):
    secrets = list(cluster.secret_values().values())
    return put_step(
        "communication environment",
        lambda node: (env_path(cluster, node), render(cluster, node), env_mode(cluster)),
        check=check,
        diff=diff,
        secrets=secrets,
        known=(lambda node: ctx.probe("commenv.render", node.name)) if ctx is not None else None,
    )


STEPS = {"render": lambda ctx: render_step(ctx.cluster, check=ctx.check, diff=ctx.diff, ctx=ctx)}
PROBES = {"render": lambda dep, node: sum_probe(env_path(dep.cluster, node))}
