"""The runtime of a cluster's units: the node's scripts that start, read and
stop them (``llmdeploy.launcher.UnitRuntime``). Docker's is here, made of
``roles.containers`` and ``roles.status``; a launcher that runs units
another way gives its own (``LauncherPlugin.runtime``: the Slurm launcher's
pyxis steps). The binder (``flows.binding``) picks a cluster's once, into its
:class:`~llmdeploy.deployment.Deployment`; every caller takes it from there.
"""

from __future__ import annotations

import shlex
from typing import Callable

from llmdeploy.container import ContainerSpec, docker_run
from llmdeploy.inventory import Cluster
from llmdeploy.launcher import UnitRuntime, Wheels
from llmdeploy.release import releases_dir
from llmdeploy.unitscripts import LABEL
from roles import containers as ctr
from roles import status


class Docker:
    """Units as containers of the node's dockerd (``roles.containers``, ``roles.status``)."""

    # an MPI world starts from its launch container (mpirun reaches the others)
    worlds = False
    # nothing in a container's environment is Docker's own (--gpus sets no CUDA_ variable)
    own_env: tuple[str, ...] = ()

    def __init__(self, cluster: Cluster):
        self.c = cluster

    def run_command(self, spec: ContainerSpec, release: str) -> str:
        return shlex.join(docker_run(spec))

    def start_script(self, release_dir: str, container: str, run_file: str, attempt: int) -> str | None:
        return ctr.start_script(release_dir, container, run_file, attempt)

    def states_script(self, containers: list[str]) -> str:
        return ctr.states_script(containers)

    def wait_port_script(self, container: str, ip: str, port: int, timeout: float) -> str:
        return ctr.wait_port_script(container, ip, port, timeout)

    def log_tail_script(self, container: str) -> str:
        return ctr.log_tail_script(container)

    def phases_script(self, keep_release: str | None) -> str:
        return ctr.phases_script(self.c.name, keep_release)

    def stop_script(self, keep_release: str | None, timeout: int, phase: int | None = None) -> str:
        return ctr.stop_script(self.c.name, releases_dir(self.c), keep_release, timeout, phase)

    def stop_units_script(self, release_dir: str, containers: list[str], timeout: int, log_suffix: str = "stopped") -> str:
        return ctr.stop_units_script(release_dir, containers, timeout, log_suffix)

    def signal_script(self, containers: list[str], sig: str = "TERM") -> str:
        return ctr.signal_script(containers, sig)

    def status_script(self) -> str:
        return status.status_script(self.c)

    def top_script(self, accel: str, metrics: tuple[str, int, str] | None = None) -> str:
        return status.top_script(self.c, accel, metrics)

    def logs_script(self, service: str | None, opts: list[str], with_logs: bool = True) -> str:
        return status.logs_script(self.c, service, opts, with_logs)

    def follow_command(self, container: str, opts: list[str]) -> str:
        return status.follow_command(container, opts)

    def bundle_sections(self, containers: list[str], max_bytes: int) -> list[tuple[str, str]]:
        out = []
        for c in containers:
            stem = "container" if len(containers) == 1 else c
            out += [(f"{stem}.log", f"docker logs {shlex.quote(c)} 2>&1 | tail -c {int(max_bytes)}"),
                    (f"{stem}.inspect.json", f"docker inspect {shlex.quote(c)} 2>&1")]
        return out

    def image_script(self, ref: str, check: bool) -> str | None:
        return None  # docker pull or load (roles.image)

    def image_id_script(self) -> str:
        return "llmdeploy_image_id() { docker image inspect --format '{{.Id}}' \"$1\" 2>/dev/null; }\n"

    def engine_script(self) -> str:
        return "docker --version"

    def running_script(self) -> str:
        return f"docker ps --filter label={LABEL}.cluster={shlex.quote(self.c.name)} --format '{{{{.Names}}}}'"

    def wheels_script(self, wheels: Wheels, check: bool) -> str | None:
        return None  # a derived image: docker run + pip + docker commit (roles.wheels)

    def wheels_files(self, serving: str) -> tuple[str, ...]:
        return ()  # an image of dockerd's: it travels as docker save (flows.stage.distribute_wheels)


# Docker's runtime conforms to the interface (for the type checker)
_conforms: Callable[[Cluster], UnitRuntime] = Docker
