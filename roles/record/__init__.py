"""What prepare decided for each node, written on the node for the start step
and for ``invoke check``: the image ID and the image to run (what the
wheels step says the units run, the runtime's file with the wheels on a
pyxis cluster; else what the image step says, an imported file on a pyxis
cluster; else the image with its wheels), the NUMA
binding, the environment file, the NIC; on a pyxis cluster's node 0, the
file each accessory image (Dynamo's etcd and NATS) was imported as, which
its unit runs (``image.accessories``; nothing on a Docker cluster, whose
units run the references). Deterministic content (no time stamps), so an
unchanged cluster is an unchanged file."""

from __future__ import annotations

import json
from typing import Any

from llmdeploy.inventory import Cluster, Node
from roles import commenv, image as image_role, wheels
from roles.files import put_step, sum_probe


def prepared_path(cluster: Cluster) -> str:
    return f"{cluster.base_dir}/{cluster.name}/prepared.json"


def content(cluster: Cluster, node: Node, image: dict | None, binding: dict | None, built: dict | None = None,
            accessories: dict[str, str] | None = None) -> str:
    """The node's record: ``image``, ``binding`` and ``built`` are the
    image, numa and wheels steps' data on the node (None: not run);
    ``accessories``: {accessory image reference: the file it was imported
    as} (``image.accessory_files``; none: no key)."""
    doc: dict[str, Any] = {
        "cluster": cluster.name,
        "node": node.name,
        "role": cluster.role_of(node),
        "start_rank": node.start_rank,
        "image": {
            "ref": cluster.image.ref,
            "id": (image or {}).get("id"),
            # what the units run: what the wheels step says they run (the
            # runtime's file with the wheels), else what the image step says
            # (the runtime's imported file), else the image with its wheels
            "serving_ref": (built or {}).get("serving_ref") or (image or {}).get("serving_ref") or wheels.serving_ref(cluster),
        },
        "binding": binding or {},
        "env_file": commenv.env_path(cluster, node),
        "env_mode": f"{commenv.env_mode(cluster):o}",
        "nic": node.nic,
        "ip": str(node.ip),
    }
    if accessories:
        doc["image"]["accessories"] = dict(accessories)
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def write_step(ctx):
    cluster = ctx.cluster
    return put_step(
        "record",
        lambda node: (
            prepared_path(cluster),
            content(cluster, node, ctx.data("image", node.name), ctx.data("numa", node.name), ctx.data("wheels", node.name),
                    image_role.accessory_files(ctx.data(image_role.ACCESSORIES_STEP, node.name))),
            0o644,
        ),
        check=ctx.check,
        diff=ctx.diff,
        known=lambda node: ctx.probe("record.write", node.name),
    )


STEPS = {"write": write_step}
PROBES = {"write": lambda dep, node: sum_probe(prepared_path(dep.cluster))}
