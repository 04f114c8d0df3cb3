"""A unit's Docker plan as a pyxis job step: the same image, command,
environment file and mounts, run by ``srun --container-image`` in an enroot
container that lives and ends with its step (pyxis 0.24, enroot 4.1).

Every serving system writes its units as ``docker run`` lines (the seed's
form, ``Unit.show["container_command"]``). On a Slurm site with pyxis the
same line becomes a step: ``docker_run`` reads the options the systems use
(docker run's own grammar: options, then the image, then the command) and
``step_args`` writes the srun line. What Docker does that a pyxis step does
by itself is dropped, and each is named here:

- ``-d``, ``--rm``: the step is the container (it ends with it, scancel ends it);
- ``--gpus``, ``--device``: the step's GRES give it its devices (Slurm sets
  CUDA_VISIBLE_DEVICES, ConstrainDevices keeps the others out);
- ``--network host``, ``-p``, ``--hostname``, ``--ipc=host``: an enroot
  container has the node's network, host name and IPC (no such namespaces);
- ``--ulimit``: Slurm gives the tasks the limits of srun's environment
  (slurm.conf PropagateResourceLimits);
- ``--shm-size``: the node's /dev/shm is the container's (enroot's mounts.d);
- a Docker container's own filesystem is writable: the step's is too
  (``--container-writable``; pyxis's containers are read-only otherwise);
- ``--label``, ``--name``: the step's name and ``--container-name`` say
  which unit it is (the labels are kept, ``DockerRun.labels``: what the
  unit is to the tool, its cluster, release, service, role and stop phase,
  which Docker's labels told the node's scripts).

Anything else (another network, ``--entrypoint``, ``--privileged``, an
option this module does not know) is refused with the option and the unit
named: a pyxis step cannot do what Docker would, and a unit must not start
different from its plan.

The environment file is read inside the container before the command
starts, with Docker's ``--env-file`` rules (``NAME=value`` lines taken
verbatim, ``#`` comments and blank lines skipped, a bare ``NAME`` taken from
the environment), so its values win over the image's as with Docker, and no
value is on the srun line.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from ...errors import LlmdeployError

# docker run options whose value is the next word (or after "="), and flags
_VALUED = {"--name", "--label", "-l", "--ipc", "--gpus", "-p", "--publish", "--network", "--net", "--ulimit", "--hostname", "-h",
           "-v", "--volume", "--mount", "--env-file", "-e", "--env", "--shm-size", "--device", "-w", "--workdir"}
_FLAGS = {"-d", "--detach", "--rm", "-t", "--tty", "-i", "--interactive", "--init"}
_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# what Slurm sets for a step's GRES and the image must not override (pyxis
# keeps the image's value of a variable unless --container-env names it)
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES",)


@dataclass
class DockerRun:
    """What a ``docker run`` line asks for, as far as a pyxis step can give it."""

    image: str
    command: list[str]
    mounts: list[str] = field(default_factory=list)  # SRC:DST[:ro]
    env_files: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)  # NAME=value or NAME (-e)
    workdir: str | None = None
    name: str | None = None
    labels: list[str] = field(default_factory=list)  # k=v (--label), in the line's order


def docker_run(line: str, unit: str) -> DockerRun:
    """Read a unit's ``docker run`` line (``unit``: named in every refusal)."""
    words = shlex.split(line)
    if words[:2] != ["docker", "run"]:
        raise LlmdeployError(f"{unit}: not a docker run line: {line[:80]!r}")
    out = DockerRun(image="", command=[])
    i = 2
    while i < len(words):
        w = words[i]
        if not w.startswith("-") or w == "-":
            out.image, out.command = w, words[i + 1:]
            break
        opt, eq, val = w.partition("=")
        if opt in _FLAGS and not eq:
            i += 1
            continue
        if opt not in _VALUED:
            raise LlmdeployError(f"{unit}: docker run option {opt} has no pyxis equivalent (its step would not start as planned)")
        if not eq:
            if i + 1 >= len(words):
                raise LlmdeployError(f"{unit}: docker run option {opt} has no value")
            val = words[i + 1]
            i += 1
        i += 1
        _take(out, opt, val, unit)
    if not out.image:
        raise LlmdeployError(f"{unit}: docker run line has no image")
    return out


def _take(out: DockerRun, opt: str, val: str, unit: str) -> None:
    if opt in ("-v", "--volume"):
        out.mounts.append(_volume(val, unit))
    elif opt == "--mount":
        out.mounts.append(_mount(val, unit))
    elif opt == "--env-file":
        if "\n" in val:
            raise LlmdeployError(f"{unit}: --env-file {val.splitlines()[0]!r}...: a path with a newline")
        out.env_files.append(val)
    elif opt in ("-e", "--env"):
        if not _NAME_RE.fullmatch(val.split("=", 1)[0]):
            raise LlmdeployError(f"{unit}: -e {val.split('=', 1)[0]!r} is not a variable name")
        out.env.append(val)
    elif opt in ("-w", "--workdir"):
        out.workdir = val
    elif opt == "--name":
        out.name = val
    elif opt in ("--label", "-l"):
        if "\n" in val:
            raise LlmdeployError(f"{unit}: --label {val.splitlines()[0]!r}...: a pyxis unit's label is one line (its record keeps one a line)")
        out.labels.append(val)
    elif opt in ("--network", "--net") and val != "host":
        raise LlmdeployError(f"{unit}: --network {val}: a pyxis container has its node's network only")
    elif opt == "--ipc" and val != "host":
        raise LlmdeployError(f"{unit}: --ipc={val}: a pyxis container has its node's IPC only")
    # --gpus, --device, -p, --hostname, --ulimit, --shm-size: what the step has by itself (module docstring)


def _volume(spec: str, unit: str) -> str:
    parts = spec.split(":")
    if "," in spec:
        raise LlmdeployError(f"{unit}: -v {spec}: a path with a comma cannot be a pyxis mount (--container-mounts is comma-separated)")
    if len(parts) not in (2, 3) or not parts[0].startswith("/") or not parts[1].startswith("/"):
        raise LlmdeployError(f"{unit}: -v {spec}: pyxis mounts host paths only (SRC:DST[:ro])")
    mode = parts[2] if len(parts) == 3 else "rw"
    if mode not in ("ro", "rw"):
        raise LlmdeployError(f"{unit}: -v {spec}: mode {mode!r} (ro or rw)")
    return f"{parts[0]}:{parts[1]}" + (":ro" if mode == "ro" else "")


def _mount(spec: str, unit: str) -> str:
    kv = dict(p.split("=", 1) if "=" in p else (p, "true") for p in spec.split(","))
    if kv.get("type", "volume") != "bind":
        raise LlmdeployError(f"{unit}: --mount {spec}: pyxis mounts host paths only (type=bind)")
    src, dst = kv.get("source") or kv.get("src"), kv.get("target") or kv.get("destination") or kv.get("dst")
    if not src or not dst:
        raise LlmdeployError(f"{unit}: --mount {spec}: no source or target")
    ro = kv.get("readonly", kv.get("ro", "false")) in ("true", "1")
    return _volume(f"{src}:{dst}" + (":ro" if ro else ""), unit)


def image_uri(ref: str) -> str:
    """An image reference as pyxis and enroot take it: ``REGISTRY#REPOSITORY:TAG``
    (``enroot import docker://``); a path (an imported squashfs) as it is."""
    if ref.startswith("/"):
        return ref
    first, sep, rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return f"{first}#{rest}"
    return ref  # Docker Hub: enroot's default registry


# Docker's --env-file, inside the container: NAME=value verbatim, NAME alone
# from the environment; the files one a line in $LLMDEPLOY_ENV_FILES (split
# at newlines only, no globbing: a path is taken as it is)
ENV_FILE_LOADER = (
    "IFS='\n'; set -f\n"
    'for f in $LLMDEPLOY_ENV_FILES; do\n'
    '  while IFS= read -r line || [ -n "$line" ]; do\n'
    '    case $line in \'\'|\'#\'*) continue ;; *=*) export "$line" ;; *) ;; esac\n'
    '  done < "$f" || { echo "llmdeploy: cannot read the environment file $f in the container" >&2; exit 125; }\n'
    'done\n'
    'unset IFS LLMDEPLOY_ENV_FILES; set +f\n'
)


def environment(run: DockerRun) -> str:
    """Shell text, in the container: the environment files (``$LLMDEPLOY_ENV_FILES``), then the ``-e`` values, exported."""
    return ENV_FILE_LOADER + "".join(f"export {shlex.quote(kv)}\n" for kv in run.env if "=" in kv)


def env_files_arg(run: DockerRun) -> str:
    """``LLMDEPLOY_ENV_FILES=...``: the environment files the container reads
    (``environment``), one a line, for ``env`` before its shell (an argument:
    no shell reads it, nothing in it is quoted)."""
    return "LLMDEPLOY_ENV_FILES=" + "\n".join(run.env_files)


def container_command(run: DockerRun) -> list[str]:
    """The step's command in the container: the environment files and ``-e`` values, then the unit's command."""
    return ["env", env_files_arg(run), "sh", "-c", environment(run) + 'exec "$@"\n', "llmdeploy-unit", *run.command]


def step_options(run: DockerRun, container_name: str, image: str | None = None) -> list[str]:
    """The pyxis options of a unit's step (after srun's own options: job,
    node, GRES, name). ``image``: what the step runs, when not the plan's (an
    imported squashfs on the node)."""
    if not run.command:
        raise LlmdeployError(f"{container_name}: the docker run line has no command (pyxis does not run the image's entrypoint here)")
    args = [f"--container-image={image_uri(image or run.image)}", f"--container-name={container_name}",
            # a Docker container's own filesystem is writable (etcd makes its data directory in it): so is the step's
            "--container-writable", "--no-container-mount-home", f"--container-env={','.join(DEVICE_VARIABLES)}"]
    if run.mounts:
        args.append(f"--container-mounts={','.join(run.mounts)}")
    if run.workdir:
        args.append(f"--container-workdir={run.workdir}")
    return args


def step_args(run: DockerRun, container_name: str, image: str | None = None) -> list[str]:
    """The pyxis options and the command of a unit's step (``step_options``, then ``container_command``)."""
    return [*step_options(run, container_name, image), *container_command(run)]
