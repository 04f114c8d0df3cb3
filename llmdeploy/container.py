"""A unit's container as data (``ContainerSpec``), which each container
runtime renders: Docker as ``docker run`` (``docker_run``, here: the plans'
own form since the seeds), pyxis as ``srun --container-*`` options
(``launchers/slurm/pyxis.py``), and later a Kubernetes pod spec.
No runtime reads another runtime's output.

The serving systems build one spec per unit (``Unit.spec``), and the plan
keeps it in ``plan.json``. A plan recorded before units carried a spec has
its units' ``docker run`` lines only: ``read_docker_run`` turns such a line
back into a spec (``ReleasePlan.from_json``), so that an old release still
restarts and rolls back on any runtime.

The seeds' ``docker run`` lines are requirements flag for flag, and an
operator holds the plan against the guide: ``docker_flags`` and
``Mount.form`` keep the order and the spelling each seed gives its options
(``--net=host`` in the Ascend guide, ``--network host`` in NVIDIA's). They
change nothing a runtime does: pyxis and every later runtime ignore them.

Pure: nothing here runs a command.
"""

from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass
from typing import Any, Literal

MountForm = Literal["volume", "volume-mode", "bind"]
MOUNT_FORMS: tuple[MountForm, ...] = ("volume", "volume-mode", "bind")


@dataclass(frozen=True)
class Mount:
    """A host path seen in the container at ``target``. ``form``: how
    ``docker run`` writes it (``volume``: ``-v SRC:DST[:ro]``;
    ``volume-mode``: ``-v SRC:DST:rw`` or ``:ro``, the mode always said;
    ``bind``: ``--mount type=bind,src=SRC,dst=DST[,readonly]``)."""

    source: str
    target: str
    readonly: bool = False
    form: MountForm = "volume"

    def __post_init__(self) -> None:
        if self.form not in MOUNT_FORMS:
            raise ValueError(f"mount {self.source}: form {self.form!r} (one of {', '.join(MOUNT_FORMS)})")
        for what, path in (("source", self.source), ("target", self.target)):
            if not path.startswith("/"):
                raise ValueError(f"mount {self.source}:{self.target}: its {what} is not an absolute path")

    @property
    def text(self) -> str:
        """``SRC:DST`` or ``SRC:DST:ro`` (what pyxis's ``--container-mounts`` takes, comma-separated)."""
        return f"{self.source}:{self.target}" + (":ro" if self.readonly else "")


# the host options of a container, by the docker run flag that sets each; a flag in ``docker_flags``
# ending in "=" is written joined to its value (--net=host), else as two words (--network host)
HOST_FLAGS: dict[str, str] = {
    "--gpus": "gpus", "--network": "network", "--net": "network", "--ipc": "ipc", "-p": "ports", "--publish": "ports",
    "--ulimit": "ulimits", "--hostname": "hostname", "-h": "hostname", "--shm-size": "shm_size", "--privileged": "privileged",
    "--device": "devices",
}
# the order and spelling of a spec that does not say its own
DEFAULT_FLAGS = ("--gpus", "--network", "--ipc", "-p", "--ulimit", "--hostname", "--shm-size", "--privileged", "--device")


@dataclass(frozen=True)
class ContainerSpec:
    """One unit's container. ``name``: the container's (Docker's ``--name``);
    ``command``: what it runs (the image's entrypoint is not used);
    ``env_files``: files of ``NAME=value`` lines (Docker's ``--env-file``
    rules), read on the node; ``labels``: what the unit is to the tool
    (``roles.containers.label_values``); ``gpus``: Docker's ``--gpus``
    (``all``), where a scheduler's runtime gives the step its GRES instead;
    ``devices``: device nodes given to the container; ``network``, ``ipc``:
    ``host`` or None (the runtime's own namespace); ``ports``:
    ``HOST:CONTAINER``; ``ulimits``: ``name=soft[:hard]``; ``shm_size``:
    ``/dev/shm``'s size (``32g``); ``writable``: the container's own
    filesystem takes writes (Docker's always does); ``docker_flags``: the
    order and spelling of the host options in ``docker run`` (module
    docstring)."""

    name: str
    image: str
    command: tuple[str, ...]
    # (key, value) in order: plan.json keeps them as a list of pairs (it sorts an object's keys)
    labels: tuple[tuple[str, str], ...] = ()
    env_files: tuple[str, ...] = ()
    mounts: tuple[Mount, ...] = ()
    devices: tuple[str, ...] = ()
    gpus: str | None = None
    network: str | None = None
    ipc: str | None = None
    hostname: str | None = None
    ports: tuple[str, ...] = ()
    shm_size: str | None = None
    ulimits: tuple[str, ...] = ()
    privileged: bool = False
    writable: bool = True
    workdir: str | None = None
    docker_flags: tuple[str, ...] = DEFAULT_FLAGS

    def __post_init__(self) -> None:
        if not self.image:
            raise ValueError(f"container {self.name}: no image")
        for name in ("command", "env_files", "devices", "ports", "ulimits", "docker_flags", "mounts", "labels"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                raise TypeError(f"container {self.name}: {name} is a {type(value).__name__}, expected a sequence")
            # a list given is kept as a tuple: the spec stays hashable and equal to itself read back from plan.json
            object.__setattr__(self, name, tuple(tuple(v) if name == "labels" else v for v in value))
        fields: dict[str, str] = {}
        for flag in self.docker_flags:
            what = HOST_FLAGS.get(flag.rstrip("="))
            if what is None:
                raise ValueError(f"container {self.name}: docker_flags: {flag!r} is not a host option's flag ({', '.join(HOST_FLAGS)})")
            if what in fields:
                raise ValueError(f"container {self.name}: docker_flags: {fields[what]!r} and {flag!r} both write {what}")
            fields[what] = flag
        # only the options it sets, so that a spec read back from its docker run line equals the one that wrote it
        object.__setattr__(self, "docker_flags", tuple(f for f in self.docker_flags if getattr(self, HOST_FLAGS[f.rstrip("=")]) not in (None, (), False)))

    # -- plan.json ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "ContainerSpec":
        """A spec as ``to_dict`` (and plan.json) writes it; KeyError, TypeError or ValueError for anything else."""
        tuples: dict[str, Any] = {k: tuple(str(x) for x in doc.get(k) or ()) for k in ("command", "env_files", "devices", "ports", "ulimits", "docker_flags")
                  if k in doc}
        mounts = tuple(Mount(**m) for m in doc.get("mounts") or ())
        rest = {k: v for k, v in doc.items() if k not in tuples and k not in ("mounts", "labels")}
        labels = tuple((str(k), str(v)) for k, v in doc.get("labels") or ())
        return cls(**rest, **tuples, mounts=mounts, labels=labels)


# -- Docker ---------------------------------------------------------------------------------------
def _host_option(spec: ContainerSpec, flag: str) -> list[str]:
    joined = flag.endswith("=")
    flag = flag.rstrip("=")
    what = HOST_FLAGS[flag]
    value = getattr(spec, what)
    if what == "privileged":
        return [flag] if value else []
    values = value if isinstance(value, tuple) else (value,) if value is not None else ()
    out: list[str] = []
    for v in values:
        out += [f"{flag}={v}"] if joined else [flag, v]
    return out


def _mount_args(m: Mount) -> list[str]:
    if m.form == "bind":
        return ["--mount", f"type=bind,src={m.source},dst={m.target}" + (",readonly" if m.readonly else "")]
    if m.form == "volume-mode":
        return ["-v", f"{m.source}:{m.target}:{'ro' if m.readonly else 'rw'}"]
    return ["-v", m.text]


def docker_run(spec: ContainerSpec) -> list[str]:
    """``docker run -d`` of ``spec``: named, labelled, its host options
    (``docker_flags``' order, then any other it sets), mounts, environment
    files, workdir, image and command. Logs are kept: no ``--rm``."""
    args = ["docker", "run", "-d", "--name", spec.name]
    for k, v in spec.labels:
        args += ["--label", f"{k}={v}"]
    said = {HOST_FLAGS[f.rstrip("=")] for f in spec.docker_flags}
    for flag in spec.docker_flags + tuple(f for f in DEFAULT_FLAGS if HOST_FLAGS[f] not in said):
        args += _host_option(spec, flag)
    for m in spec.mounts:
        args += _mount_args(m)
    for f in spec.env_files:
        args += ["--env-file", f]
    if spec.workdir:
        args += ["--workdir", spec.workdir]
    return args + [spec.image, *spec.command]


# -- docker run lines of plans recorded before specs ----------------------------------------------
# what docker run does that a spec says by itself (a unit's container is detached and kept)
_IGNORED = {"-d", "--detach"}
_VALUED = {"--name", "--label", "-l", "-v", "--volume", "--mount", "--env-file", "-w", "--workdir", *HOST_FLAGS}


def read_docker_run(line: str) -> ContainerSpec:
    """The spec of a ``docker run`` line as this tool wrote them before units
    carried specs (``docker_run`` writes it back byte for byte). ValueError
    names an option a unit's line never had (``--entrypoint``, ``-e``, ...)."""
    words = shlex.split(line)
    if words[:2] != ["docker", "run"]:
        raise ValueError(f"not a docker run line: {line[:80]!r}")
    spec: dict[str, Any] = {"name": "", "labels": [], "mounts": [], "env_files": [], "devices": [], "ports": [], "ulimits": []}
    flags: list[str] = []
    i = 2
    while i < len(words):
        w = words[i]
        if not w.startswith("-") or w == "-":
            return ContainerSpec(**{**spec, **{k: tuple(v) for k, v in spec.items() if isinstance(v, list)}},
                                 image=w, command=tuple(words[i + 1:]), docker_flags=tuple(flags))
        opt, eq, val = w.partition("=")
        i += 1
        if opt in _IGNORED and not eq:
            continue
        if opt == "--privileged":
            if eq and val not in ("true", "false"):
                raise ValueError(f"docker run option --privileged={val}: not true or false")
            spec["privileged"] = not eq or val == "true"
            if spec["privileged"] and opt not in flags:
                flags.append(opt)
            continue
        if opt not in _VALUED:
            raise ValueError(f"docker run option {opt} is not one this tool writes")
        if not eq:
            if i >= len(words):
                raise ValueError(f"docker run option {opt} has no value")
            val = words[i]
            i += 1
        _read_option(spec, flags, opt, eq, val)
    raise ValueError(f"docker run line has no image: {line[:80]!r}")


def _read_option(spec: dict[str, Any], flags: list[str], opt: str, eq: str, val: str) -> None:
    if opt == "--name":
        spec["name"] = val
    elif opt in ("--label", "-l"):
        if "=" not in val:
            raise ValueError(f"docker run option {opt} {val}: not KEY=VALUE (this tool writes every label with a value)")
        k, _, v = val.partition("=")
        spec["labels"].append((k, v))
    elif opt in ("-v", "--volume"):
        spec["mounts"].append(_volume(val))
    elif opt == "--mount":
        spec["mounts"].append(_bind(val))
    elif opt == "--env-file":
        spec["env_files"].append(val)
    elif opt in ("-w", "--workdir"):
        spec["workdir"] = val
    else:
        what = HOST_FLAGS[opt]
        if isinstance(spec.get(what), list):
            spec[what].append(val)
        else:
            spec[what] = val
        if opt + eq not in flags:
            if any(HOST_FLAGS[f.rstrip("=")] == what for f in flags):
                raise ValueError(f"docker run option {opt}: {what} is set twice")
            flags.append(opt + eq)


def _volume(text: str) -> Mount:
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[2:] not in ([], ["ro"], ["rw"]):
        raise ValueError(f"-v {text}: not SRC:DST[:ro|rw]")
    return Mount(parts[0], parts[1], readonly=parts[2:] == ["ro"], form="volume-mode" if len(parts) == 3 and parts[2] == "rw" else "volume")


def _bind(text: str) -> Mount:
    kv = {k: v for k, v in (p.split("=", 1) if "=" in p else (p, "true") for p in text.split(","))}
    if kv.get("type", "volume") != "bind":
        raise ValueError(f"--mount {text}: not a bind mount")
    src, dst = kv.get("source") or kv.get("src"), kv.get("target") or kv.get("destination") or kv.get("dst")
    if not src or not dst:
        raise ValueError(f"--mount {text}: no source or target")
    return Mount(src, dst, readonly=kv.get("readonly", kv.get("ro", "false")) in ("true", "1"), form="bind")
