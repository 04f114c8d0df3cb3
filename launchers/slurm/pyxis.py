"""A unit's container (``llmdeploy.container.ContainerSpec``) as a pyxis
job step: the same image, command, environment files and mounts, run by
``srun --container-image`` in an enroot container that lives and ends with
its step (pyxis 0.24, enroot 4.1). Docker renders the same spec as
``docker run`` (``llmdeploy.container.docker_run``); nothing here reads
Docker's line.

What Docker does that a pyxis step does by itself is not rendered, and
each is named here:

- the step is the container: it ends with it, scancel ends it (Docker's
  ``-d``, a container kept for its logs);
- ``gpus``, ``devices``: the step's GRES give it its devices (Slurm sets
  CUDA_VISIBLE_DEVICES, ConstrainDevices keeps the others out);
- ``network``/``ipc`` ``host``, ``ports``, ``hostname``: an enroot
  container has the node's network, host name and IPC (no such namespaces);
- ``ulimits``: Slurm gives the tasks the limits of srun's environment
  (slurm.conf PropagateResourceLimits);
- ``shm_size``: the node's /dev/shm is the container's (enroot's mounts.d);
- ``writable``: ``--container-writable`` (pyxis's containers are read-only otherwise);
- ``name``, ``labels``: the step's name and ``--container-name`` say which
  unit it is; the labels go to the unit's record (``units.unit_command``).

A spec a step cannot run as planned (``privileged``, a network or IPC
namespace of its own, a mount path with a comma) is refused with the unit
and the field named: a unit must not start different from its plan.

The environment files are read inside the container before the command
starts, with Docker's ``--env-file`` rules (``NAME=value`` lines taken
verbatim, ``#`` comments and blank lines skipped, a bare ``NAME`` taken from
the environment), so their values win over the image's as with Docker, and
no value is on the srun line.
"""

from __future__ import annotations

import shlex

from llmdeploy.container import ContainerSpec
from llmdeploy.errors import LlmdeployError

# what Slurm sets for a step's GRES and the image must not override (pyxis
# keeps the image's value of a variable unless --container-env names it)
DEVICE_VARIABLES = ("CUDA_VISIBLE_DEVICES",)


def refusal(spec: ContainerSpec) -> str | None:
    """Why a pyxis step cannot run ``spec`` as planned, naming the field; None when it can."""
    if spec.privileged:
        return "privileged: a pyxis container runs with the user's rights only"
    for what in ("network", "ipc"):
        value = getattr(spec, what)
        if value not in (None, "host"):
            return f"{what} {value}: a pyxis container has its node's {what} only"
    for m in spec.mounts:
        if "," in m.text:
            return f"mount {m.text}: a path with a comma cannot be a pyxis mount (--container-mounts is comma-separated)"
        if ":" in m.source or ":" in m.target:
            return f"mount {m.source} at {m.target}: a path with a colon cannot be a pyxis mount (SRC:DST[:ro])"
    for f in spec.env_files:
        if "\n" in f:
            return f"env file {f.splitlines()[0]!r}...: a path with a newline"
    for k, v in spec.labels:
        if "\n" in k or "\n" in v:
            return f"label {k!r}: a pyxis unit's label is one line (its record keeps one a line)"
    if not spec.command:
        return "no command (pyxis does not run the image's entrypoint here)"
    return None


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


def env_files_arg(spec: ContainerSpec) -> str:
    """``LLMDEPLOY_ENV_FILES=...``: the environment files the container reads
    (``ENV_FILE_LOADER``), one a line, for ``env`` before its shell (an argument:
    no shell reads it, nothing in it is quoted)."""
    return "LLMDEPLOY_ENV_FILES=" + "\n".join(spec.env_files)


def container_command(spec: ContainerSpec) -> list[str]:
    """The step's command in the container: the environment files (``ENV_FILE_LOADER``), then the unit's command."""
    return ["env", env_files_arg(spec), "sh", "-c", ENV_FILE_LOADER + 'exec "$@"\n', "llmdeploy-unit", *spec.command]


def container_name(container: str, release: str, attempt: int) -> str:
    """The enroot container of start ``attempt`` of unit ``container``:
    ``<release>.<unit>.<attempt>``. A start never reuses an earlier one's
    writable root (etcd's data directory is in it), whatever pyxis's
    ``container_scope``; the node's stop scripts remove the containers of
    units that no longer run (``units.ENROOT_GC``), so that under pyxis's
    default global scope nothing piles up."""
    return f"{release}.{container}.{int(attempt)}"


def step_options(spec: ContainerSpec, container_name: str, image: str | None = None) -> list[str]:
    """The pyxis options of a unit's step (after srun's own options: job,
    node, GRES, name). ``image``: what the step runs, when not the plan's (an
    imported squashfs on the node). LlmdeployError: ``refusal``."""
    why = refusal(spec)
    if why:
        raise LlmdeployError(f"{spec.name}: {why}")
    return _options(spec, container_name, image)


def _options(spec: ContainerSpec, container_name: str, image: str | None) -> list[str]:
    args = [f"--container-image={image_uri(image or spec.image)}", f"--container-name={container_name}"]
    if spec.writable:
        # a Docker container's own filesystem is writable (etcd makes its data directory in it): so is the step's
        args.append("--container-writable")
    args += ["--no-container-mount-home", f"--container-env={','.join(DEVICE_VARIABLES)}"]
    if spec.mounts:
        args.append(f"--container-mounts={','.join(m.text for m in spec.mounts)}")
    if spec.workdir:
        args.append(f"--container-workdir={spec.workdir}")
    return args


def step_args(spec: ContainerSpec, container_name: str, image: str | None = None) -> list[str]:
    """The pyxis options and the command of a unit's step (``step_options``, then ``container_command``)."""
    return [*step_options(spec, container_name, image), *container_command(spec)]


def run_command(spec: ContainerSpec, release: str) -> str:
    """What ``deploy --check`` shows a pyxis unit runs: ``srun``, the step's
    pyxis options and the unit's command (srun's job, node, GRES and MPI
    options are the launcher's, shown with each step's line). A spec a step
    cannot run is refused where its steps are made, with the release and
    the unit named (``jobs.plan_steps``), not here."""
    return shlex.join(["srun", *_options(spec, container_name(spec.name, release, 1), None), *spec.command])
