"""Container lifecycle on a node, as pure shell builders (the engine runs them):
start a unit's container from its release's run script (keeping an earlier
attempt's log), read the state of several containers in one round trip,
wait for a port while a container runs, and stop containers in phases
(the reverse of the start order), saving each one's log into its release.

Containers carry labels: ``llmdeploy.cluster``, ``llmdeploy.release``,
``llmdeploy.service``, ``llmdeploy.role`` and ``llmdeploy.stop_phase``
(0 is stopped first). Containers of releases made before phases existed
have no phase: their workers stop in phase 0 and node 0 in phase 1.
"""

from __future__ import annotations

import ipaddress
import shlex

LABEL = "llmdeploy"
STATE_FMT = "'{{.State.Status}} {{.State.ExitCode}}'"


def labels(cluster: str, release: str, service: str, role: str, stop_phase: int, **extra: str | int) -> list[str]:
    """``--label k=v`` arguments for a unit's container."""
    out: list[str] = []
    values = {"cluster": cluster, "release": release, "service": service, "role": role, "stop_phase": stop_phase, **extra}
    for k, v in values.items():
        out += ["--label", f"{LABEL}.{k}={v}"]
    return out


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


def states_script(containers: list[str]) -> str:
    """One line per container: ``<name> <status> <exit code>`` (``missing`` if absent)."""
    q = shlex.quote
    lines = []
    for c in containers:
        lines.append(f"s=$(docker inspect --format {STATE_FMT} {q(c)} 2>/dev/null) || s='missing -'; echo {q(c)} \"$s\"")
    return "\n".join(lines) + "\n"


# docker's container states (docker inspect .State.Status), and the script's own "missing"
STATES = {"created", "restarting", "running", "removing", "paused", "exited", "dead", "missing"}


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
    ipaddress.ip_address(ip)  # an address, never shell text (it comes back from a node's plan.json)
    q = shlex.quote
    return (
        f"end=$(( $(date +%s) + {int(timeout)} )); n=0\n"
        "while :; do\n"
        f"  st=$(docker inspect --format {STATE_FMT} {q(container)} 2>/dev/null)\n"
        '  case "$st" in running*) ;; *) echo "container $st"; exit 3;; esac\n'
        f"  if timeout 2 bash -c {q(f'exec 3<>/dev/tcp/{ip}/{port}')} 2>/dev/null; then echo open; exit 0; fi\n"
        '  [ "$(date +%s)" -ge "$end" ] && { echo timeout; exit 4; }\n'
        # the first tries close together (a port that opens at once is seen at once), then every second
        '  n=$((n + 1)); if [ "$n" -le 5 ]; then sleep 0.2; else sleep 1; fi\n'
        "done\n"
    )


def log_tail_script(container: str, max_bytes: int = 200000) -> str:
    return f"docker logs {shlex.quote(container)} 2>&1 | tail -c {int(max_bytes)}\n"


_LIST = (
    "docker ps -a --filter label={LABEL}.cluster={cluster} "
    "--format '{{{{.Names}}}}|{{{{.Label \"{LABEL}.release\"}}}}|{{{{.Label \"{LABEL}.stop_phase\"}}}}|{{{{.Label \"{LABEL}.role\"}}}}'"
)


def _list(cluster: str) -> str:
    return _LIST.format(LABEL=LABEL, cluster=shlex.quote(cluster))


# a container's phase, from its labels (legacy: workers 0, node 0 1)
_PHASE = 'case "$ph" in [0-9]|[0-9][0-9]) ;; *) if [ "$role" = node0 ]; then ph=1; else ph=0; fi;; esac'


def phases_script(cluster: str, keep_release: str | None) -> str:
    """The stop phases present on this node (one number per line), except ``keep_release``'s containers."""
    keep = shlex.quote(keep_release or "")
    return (
        f"{_list(cluster)} | while IFS='|' read -r name rel ph role; do "
        f'[ "$rel" = {keep} ] && continue; {_PHASE}; echo "$ph"; done | sort -un; true\n'
    )


def stop_script(cluster: str, releases_dir: str, keep_release: str | None, timeout: int, phase: int | None = None) -> str:
    """Stop and remove this cluster's containers (of ``phase`` only, if given)
    except ``keep_release``'s, saving each one's log into its own release directory first."""
    q = shlex.quote
    keep = q(keep_release or "")
    only = "" if phase is None else f'[ "$ph" = {int(phase)} ] || continue; '
    return (
        f"{_list(cluster)} | while IFS='|' read -r name rel ph role; do "
        f'[ "$rel" = {keep} ] && continue; {_PHASE}; {only}'
        f'd={q(releases_dir)}/"$rel"/logs; mkdir -p "$d"; '
        'docker logs "$name" > "$d/$name.final.log" 2>&1; '
        f'docker stop -t {int(timeout)} "$name" >/dev/null 2>&1; docker rm -f "$name" >/dev/null 2>&1 && echo "stopped $name"; '
        "done; true\n"
    )


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
    if sig not in ("TERM", "INT", "USR1", "USR2", "HUP"):
        raise ValueError(f"not a signal this tool sends: {sig!r}")
    q = shlex.quote
    return "".join(f"docker kill --signal {sig} {q(c)} >/dev/null 2>&1 && echo signalled {q(c)}\n" for c in containers) + "true\n"
