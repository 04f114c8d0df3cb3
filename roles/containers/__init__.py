"""Container lifecycle on a node, as pure shell builders (the engine runs them):
start a unit's container from its release's run script (keeping an earlier
attempt's log), read the state of several containers in one round trip,
wait for a port while a container runs, and stop containers in phases
(the reverse of the start order), saving each one's log into its release.

Containers carry labels: ``llmdeploy.cluster``, ``llmdeploy.release``,
``llmdeploy.service``, ``llmdeploy.role`` and ``llmdeploy.stop_phase``
(0 is stopped first). Containers of releases made before phases existed
have no phase: their workers stop in phase 0 and node 0 in phase 1.

These are Docker's commands; the text around them (the state line, the
loop over the units by phase, the wait for a port) is every runtime's, in
``llmdeploy.unitscripts``.
"""

from __future__ import annotations

import shlex

# the formats every runtime's scripts share (LABEL and STATES read by the flows and the systems too)
from llmdeploy.unitscripts import LABEL, SIGNALS, STATES, each_unit, phases, state_lines, wait_port

STATE_FMT = "'{{.State.Status}} {{.State.ExitCode}}'"


def label_values(cluster: str, release: str, service: str, role: str, stop_phase: int, **extra: str | int) -> tuple[tuple[str, str], ...]:
    """A unit's labels (``ContainerSpec.labels``): (``llmdeploy.<key>``, value), in this order."""
    values = {"cluster": cluster, "release": release, "service": service, "role": role, "stop_phase": stop_phase, **extra}
    return tuple((f"{LABEL}.{k}", str(v)) for k, v in values.items())


def start_script(release_dir: str, container: str, run_file: str, attempt: int) -> str:
    """(Re)start one container as start number ``attempt`` of its release;
    the log of the previous attempt is kept in the release, and the number
    is recorded (``logs/<container>.attempt``: where a later command's
    attempts continue, read by ``roles.release.release_script``)."""
    q = shlex.quote
    prev = f"{release_dir}/logs/{container}.attempt-{attempt - 1}.log"
    return (
        f"if docker inspect {q(container)} >/dev/null 2>&1; then "
        f"docker logs {q(container)} > {q(prev)} 2>&1; "
        f"docker rm -f {q(container)} >/dev/null; fi\n"
        f"mkdir -p {q(release_dir + '/logs')} && printf '%s\\n' {int(attempt)} > {q(f'{release_dir}/logs/{container}.attempt')}\n"
        f"sh {q(release_dir + '/' + run_file)}\n"
    )


def _state(qc: str) -> str:
    """Prints ``<status> <exit code>`` of the container (its name quoted); fails when there is none."""
    return f"docker inspect --format {STATE_FMT} {qc} 2>/dev/null"


def states_script(containers: list[str]) -> str:
    """One line per container: ``<name> <status> <exit code>`` (``missing`` if absent)."""
    return state_lines(containers, _state)


def parse_states(out: str) -> dict[str, tuple[str, str]]:
    """``states_script``'s output -> {container: (status, exit code)}. A line
    whose status is not one of docker's is ("unreadable", the line)."""
    res = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            if parts[1] in STATES:
                res[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else "")
            else:
                res[parts[0]] = ("unreadable", repr(line.strip()[:200]))
    return res


def wait_port_script(container: str, ip: str, port: int, timeout: float) -> str:
    """Until ``ip:port`` accepts a connection; exit 3 as soon as the container is not running."""
    return wait_port(container, ip, port, timeout, _state)


def log_tail_script(container: str, max_bytes: int = 200000) -> str:
    return f"docker logs {shlex.quote(container)} 2>&1 | tail -c {int(max_bytes)}\n"


_LIST = (
    "docker ps -a --filter label={LABEL}.cluster={cluster} "
    "--format '{{{{.Names}}}}|{{{{.Label \"{LABEL}.release\"}}}}|{{{{.Label \"{LABEL}.stop_phase\"}}}}|{{{{.Label \"{LABEL}.role\"}}}}'"
)


def _list(cluster: str) -> str:
    return _LIST.format(LABEL=LABEL, cluster=shlex.quote(cluster))


def phases_script(cluster: str, keep_release: str | None) -> str:
    """The stop phases present on this node (one number per line), except ``keep_release``'s containers."""
    return phases(_list(cluster), keep_release)


def stop_script(cluster: str, releases_dir: str, keep_release: str | None, timeout: int, phase: int | None = None) -> str:
    """Stop and remove this cluster's containers (of ``phase`` only, if given)
    except ``keep_release``'s, saving each one's log into its own release directory first."""
    q = shlex.quote
    body = (f'd={q(releases_dir)}/"$rel"/logs; mkdir -p "$d"; '
            'docker logs "$name" > "$d/$name.final.log" 2>&1; '
            f'docker stop -t {int(timeout)} "$name" >/dev/null 2>&1; docker rm -f "$name" >/dev/null 2>&1 && echo "stopped $name"; ')
    return each_unit(_list(cluster), keep_release, body, phase) + "; true\n"


def stop_units_script(release_dir: str, containers: list[str], timeout: int, log_suffix: str = "stopped") -> str:
    """Stop and remove the named containers of one release (a group restart), keeping their logs."""
    q = shlex.quote
    lines = [f"mkdir -p {q(release_dir + '/logs')}"]
    for c in containers:
        lines.append(
            f"if docker inspect {q(c)} >/dev/null 2>&1; then docker logs {q(c)} > {q(f'{release_dir}/logs/{c}.{log_suffix}.log')} 2>&1; "
            f"docker stop -t {int(timeout)} {q(c)} >/dev/null 2>&1; docker rm -f {q(c)} >/dev/null 2>&1; echo stopped {q(c)}; fi"
        )
    return "\n".join(lines) + "\n"


def port_open_script(ip: str, port: int) -> str:
    """Prints ``open`` when ``ip:port`` accepts a TCP connection from the host within 2 s."""
    test = shlex.quote(f"exec 3<>/dev/tcp/{ip}/{int(port)}")
    return f"timeout 2 bash -c {test} 2>/dev/null && echo open"


def signal_script(containers: list[str], sig: str = "TERM") -> str:
    """Send ``sig`` to each named container that runs (``docker kill --signal``:
    the server stops taking new work and finishes what it holds, where it
    does so on that signal); one ``signalled <name>`` line each."""
    if sig not in SIGNALS:
        raise ValueError(f"not a signal this tool sends: {sig!r}")
    q = shlex.quote
    return "".join(f"docker kill --signal {sig} {q(c)} >/dev/null 2>&1 && echo signalled {q(c)}\n" for c in containers) + "true\n"
