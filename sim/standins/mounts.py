"""Bind mounts of simulated containers.

A simulated container's processes run in the host's own filesystem, so a
``--mount type=bind,src=S,dst=D`` or ``-v S:D`` is not applied: the simulated
docker records it (``Mounts`` in ``docker inspect``) and exports the map to
every process of the container (its command, ``docker exec``'d ones and
their descendants) as ``LLMDEPLOY_SIM_MOUNTS``, a JSON object
``{"<dst>": "<src>", ...}``. Stand-ins that open files at container paths
(the Dynamo ones) translate a path with :func:`host_path`; the older
stand-ins do not.
"""

from __future__ import annotations

import json
import os
import posixpath

ENV = "LLMDEPLOY_SIM_MOUNTS"


class MountError(ValueError):
    """A ``--mount``/``-v`` the docker CLI refuses (the message is the CLI's)."""


def parse_mount(spec: str) -> dict:
    """``--mount type=bind,src=S,dst=D[,readonly]`` -> a ``docker inspect``
    ``Mounts`` entry: {"Type", "Source", "Destination", "Mode", "RW", "Propagation"}."""
    fields: dict[str, str] = {}
    for part in spec.split(","):
        if not part:
            continue
        k, eq, v = part.partition("=")
        k = k.strip().lower()
        if k in ("readonly", "ro"):
            if eq and v.lower() not in ("1", "true", "0", "false"):
                raise MountError(f'invalid argument "{spec}" for "--mount" flag: invalid value for {k}: {v}')
            fields["readonly"] = "true" if not eq or v.lower() in ("1", "true") else "false"
            continue
        if not eq:
            raise MountError(f'invalid argument "{spec}" for "--mount" flag: invalid field \'{part}\' must be a key=value pair')
        fields[k] = v
    typ = fields.get("type", "volume")
    src = fields.get("source", fields.get("src", ""))
    dst = fields.get("destination", fields.get("dst", fields.get("target", "")))
    if not dst:
        raise MountError(f'invalid argument "{spec}" for "--mount" flag: target is required')
    if typ not in ("bind", "volume", "tmpfs", "npipe", "cluster", "image"):
        raise MountError(f'invalid argument "{spec}" for "--mount" flag: invalid type "{typ}"')
    if typ == "bind" and not src:
        raise MountError(f'invalid argument "{spec}" for "--mount" flag: source is required when type is bind')
    return {"Type": typ, "Source": src, "Destination": dst, "Mode": "",
            "RW": fields.get("readonly") != "true", "Propagation": "rprivate" if typ == "bind" else ""}


def parse_volume(spec: str) -> dict:
    """``-v S:D[:opts]`` -> a ``Mounts`` entry (a source that is not an
    absolute path is a named volume)."""
    parts = spec.split(":")
    if len(parts) == 1:
        return {"Type": "volume", "Source": "", "Destination": parts[0], "Mode": "", "RW": True, "Propagation": ""}
    if len(parts) > 3 or not parts[1]:
        raise MountError(f"invalid spec: {spec}: too many colons" if len(parts) > 3 else f"invalid spec: {spec}: empty section between colons")
    src, dst = parts[0], parts[1]
    opts = parts[2].split(",") if len(parts) == 3 else []
    bind = src.startswith("/")
    return {"Type": "bind" if bind else "volume", "Source": src, "Destination": dst, "Mode": ",".join(opts),
            "RW": "ro" not in opts, "Propagation": "rprivate" if bind else ""}


def mount_map(mounts: list[dict]) -> dict[str, str]:
    """Destination -> host source for the bind mounts (a later mount at the
    same destination wins, as docker refuses duplicates anyway)."""
    return {posixpath.normpath(m["Destination"]): m["Source"] for m in mounts if m.get("Type") == "bind" and m.get("Source")}


def encode(mapping: dict[str, str]) -> str:
    return json.dumps(mapping, sort_keys=True, separators=(",", ":"))


def decode(value: str | None) -> dict[str, str]:
    if not value:
        return {}
    try:
        data = json.loads(value)
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def host_path(path: str, env=None) -> str:
    """Where a container path lives on the (simulated) host: the longest
    mount destination that is ``path`` or one of its parents, replaced by its
    source; a path under no mount is returned unchanged."""
    mapping = decode((os.environ if env is None else env).get(ENV))
    if not mapping or not path.startswith("/"):
        return path
    norm = posixpath.normpath(path)
    best = None
    for dst in mapping:
        if norm == dst or dst == "/" or norm.startswith(dst.rstrip("/") + "/"):
            if best is None or len(dst) > len(best):
                best = dst
    if best is None:
        return path
    rest = norm[len(best):].lstrip("/") if best != "/" else norm.lstrip("/")
    src = mapping[best]
    return posixpath.join(src, rest) if rest else src


# The simulated host's own directories (sim/paths.py PRIVATE_DIRS, the
# image's curated directory excepted): a real container does not see them
# unless they are mounted, so inside a simulated container a path there that
# no mount covers is missing (a release file passed by its host path, say).
HOST_ONLY = ("/var/lib/llmdeploy", "/etc/llmdeploy", "/var/log/llmdeploy", "/root/.cache", "/usr/local/Ascend", "/etc/llmdeploy-sim",
             "/opt/trtllm-recipes")


def container_path(path: str, env=None) -> str | None:
    """Where the file a container process opens at ``path`` is on the
    simulated host, or None when it would not exist in the container: inside
    a simulated container (``LLMDEPLOY_SIM_CONTAINER`` set), a path under one
    of the host's own directories that no mount covers."""
    env = os.environ if env is None else env
    if not path.startswith("/"):
        return path
    norm = posixpath.normpath(path)
    if any(norm == dst or dst == "/" or norm.startswith(dst.rstrip("/") + "/") for dst in decode(env.get(ENV))):
        return host_path(path, env)
    if env.get("LLMDEPLOY_SIM_CONTAINER") and any(norm == d or norm.startswith(d + "/") for d in HOST_ONLY):
        return None
    return path
