"""What a node's scripts say about a release's units, whatever runs them, as
pure shell text: the formats the flows parse (a unit's state line, the
status read's sections, top's units section, the logs' marker lines) and
the text around a runtime's own commands (a loop over the cluster's units
by stop phase, the wait for a port while a unit runs).

A runtime gives the commands: how to read one unit's state, list the
cluster's units, inspect them, print one's log. Docker's are in
``roles.containers`` and ``roles.status``; a pyxis job step's in the Slurm
launcher (``launchers/slurm/units.py``), which reads a record its
units keep. The text around them is here, once, so the flows read every
runtime's output with the same parsers (``roles.containers.parse_states``,
``roles.status.parse_status``, ``parse_top``, ``parse_logs``).

Units carry labels: ``llmdeploy.cluster``, ``llmdeploy.release``,
``llmdeploy.service``, ``llmdeploy.role`` and ``llmdeploy.stop_phase`` (0 is
stopped first). Units of releases made before phases existed have no
phase: their workers stop in phase 0 and node 0 in phase 1.

Every value is quoted; nothing here opens a connection.
"""

from __future__ import annotations

import ipaddress
import re
import shlex
from typing import Callable

from .inventory import Cluster
from .release import current_link, root
from .sections import section

LABEL = "llmdeploy"

# a unit's statuses in a state line: docker's (docker inspect .State.Status), and "missing" (no such unit)
STATES = {"created", "restarting", "running", "removing", "paused", "exited", "dead", "missing"}

# the signals a unit is sent (a drain's TERM, and what a server reads as "reopen logs" and the like)
SIGNALS = ("TERM", "INT", "USR1", "USR2", "HUP")

# What a runtime's image script prints (``UnitRuntime.image_script``, read by
# roles.image): ``IMAGE_MARK <state> <image ID> <JSON list of repo digests>``
# (state present, pulled, loaded, imported), or ``IMAGE_MARK would-<what>``
# in a check; and, when the units run another thing than the reference
# (an imported file), ``IMAGE_MARK serving <what they run>``. roles.image's
# accessories script puts ``IMAGE_MARK accessory <ref>`` before the lines of
# each accessory image's script and ``IMAGE_MARK accessory-exit <ref> <status>`` after.
IMAGE_MARK = "@@llmdeploy-image@@"

# What a runtime's wheels script prints (``UnitRuntime.wheels_script``, read
# by roles.wheels): ``WHEELS_MARK state <state>`` (present, built; or
# would-build in a check), ``WHEELS_MARK versions <JSON>`` (what the
# ``verify`` command of the wheels prints: the installed versions), and
# ``WHEELS_MARK serving <what the units run>`` (the image with the wheels).
WHEELS_MARK = "@@llmdeploy-wheels@@"

# a runtime's command printing ``<status> <exit code>`` of one unit (its name given quoted); fails when there is none
StateCommand = Callable[[str], str]


def state_lines(containers: list[str], state: StateCommand) -> str:
    """One line per unit: ``<name> <status> <exit code>``, ``missing -`` when ``state`` fails."""
    q = shlex.quote
    return "\n".join(f"s=$({state(q(c))}) || s='missing -'; echo {q(c)} \"$s\"" for c in containers) + "\n"


def wait_port(container: str, ip: str, port: int, timeout: float, state: StateCommand) -> str:
    """Until ``ip:port`` accepts a connection (exit 0); exit 3 as soon as the unit is not running, 4 at ``timeout``."""
    ipaddress.ip_address(ip)  # an address, never shell text (it comes back from a node's plan.json)
    q = shlex.quote
    return (
        f"end=$(( $(date +%s) + {int(timeout)} )); n=0\n"
        "while :; do\n"
        f"  st=$({state(q(container))})\n"
        '  case "$st" in running*) ;; *) echo "container $st"; exit 3;; esac\n'
        f"  if timeout 2 bash -c {q(f'exec 3<>/dev/tcp/{ip}/{port}')} 2>/dev/null; then echo open; exit 0; fi\n"
        '  [ "$(date +%s)" -ge "$end" ] && { echo timeout; exit 4; }\n'
        # the first tries close together (a port that opens at once is seen at once), then every second
        '  n=$((n + 1)); if [ "$n" -le 5 ]; then sleep 0.2; else sleep 1; fi\n'
        "done\n"
    )


# a unit's phase, from its labels (legacy: workers 0, node 0 1)
PHASE = 'case "$ph" in [0-9]|[0-9][0-9]) ;; *) if [ "$role" = node0 ]; then ph=1; else ph=0; fi;; esac'


def each_unit(listing: str, keep_release: str | None, body: str, phase: int | None = None) -> str:
    """``body`` for each ``name|rel|ph|role`` line of ``listing`` (a
    runtime's list of the cluster's units on the node) but ``keep_release``'s
    and, with ``phase``, those of other phases; ``$ph`` is the unit's phase."""
    keep = shlex.quote(keep_release or "")
    only = "" if phase is None else f'[ "$ph" = {int(phase)} ] || continue; '
    return f"{listing} | while IFS='|' read -r name rel ph role; do [ \"$rel\" = {keep} ] && continue; {PHASE}; {only}{body}done"


def phases(listing: str, keep_release: str | None) -> str:
    """The stop phases present on this node (one number per line), except ``keep_release``'s units."""
    return each_unit(listing, keep_release, 'echo "$ph"; ') + " | sort -un; true\n"


# --- the reads: status, top, logs ---------------------------------------------------------------
def current_script(cluster: Cluster) -> str:
    """The current release on this node: its id, release.json and plan.json
    (sections release, meta, plan). What ``stop`` reads."""
    q = shlex.quote
    rel = f'{q(root(cluster))}/releases/"$rel"'
    return "\n".join([
        f"rel=$(readlink {q(current_link(cluster))} 2>/dev/null); rel=${{rel##*/}}",
        section("release", 'echo "$rel"'),
        section("meta", f'[ -n "$rel" ] && cat {rel}/release.json'),
        section("plan", f'[ -n "$rel" ] && cat {rel}/plan.json 2>/dev/null; true'),
    ]) + "\n"


def status_script(cluster: Cluster, inspect: str) -> str:
    """``current_script`` with the release's env file (section env) and
    ``inspect`` (section inspect: a runtime's docker inspect JSON line per
    unit of the cluster on this node): one round trip."""
    q = shlex.quote
    rel = f'{q(root(cluster))}/releases/"$rel"'
    return current_script(cluster) + "\n".join([
        section("env", f'[ -n "$rel" ] && cat {rel}/env'),
        section("inspect", inspect),
    ]) + "\n"


UNIT_MARK = "@@llmdeploy-unit@@"
LOG_MARK = "@@llmdeploy-log@@"


def logs_script(service: str | None, listing: str, log: str, with_logs: bool = True) -> str:
    """Every unit of ``listing`` (a runtime's ``phase|name|service`` lines, in
    start order) as a line ``UNIT_MARK name service``, then, with
    ``with_logs``, the log of each (of ``service``'s only, if given) behind a
    line ``LOG_MARK name``; ``log``: a runtime's command printing ``$name``'s log."""
    want = shlex.quote(service or "")
    lines = [
        f"list=$({listing})",
        f"printf '%s\\n' \"$list\" | while IFS='|' read -r ph name svc; do [ -n \"$name\" ] && echo \"{UNIT_MARK} $name ${{svc:--}}\"; done",
    ]
    if with_logs:
        lines.append(
            f"printf '%s\\n' \"$list\" | while IFS='|' read -r ph name svc; do [ -n \"$name\" ] || continue; "
            f"[ -z {want} ] || [ \"$svc\" = {want} ] || continue; "
            f"echo \"{LOG_MARK} $name\"; {log} 2>&1 </dev/null; done"
        )
    return "\n".join(lines) + "\ntrue\n"


def top_script(cluster: Cluster, metrics: tuple[str, int, str] | None, units: str, accel: str) -> str:
    """One node's units (``units``: a runtime's ``name|status|started|service|release``
    line per unit, ``roles.status.TOP_FORMAT``'s fields), the current
    release's attempt numbers, its accelerators' use and memory
    (``accel``: the platform's ``TOP_QUERY``: ``nvidia-smi --query-gpu``, ``npu-smi info``) and, with ``metrics``
    (ip, port, path), the server's metrics page read on the node itself
    (bash's /dev/tcp: no other tool needed). Sections release, units,
    attempts, accel, metrics."""
    q = shlex.quote
    rel = f'{q(root(cluster))}/releases/"$rel"'
    parts = [
        f"rel=$(readlink {q(current_link(cluster))} 2>/dev/null); rel=${{rel##*/}}",
        section("release", 'echo "$rel"'),
        section("units", units),
        section("attempts", f'[ -n "$rel" ] && for f in {rel}/logs/*.attempt; do [ -f "$f" ] && printf "%s %s\\n" "${{f##*/}}" "$(head -c 12 "$f")"; done; true'),
        # the platform's query of its devices' use and memory (nvidia-smi --query-gpu, npu-smi info)
        section("accel", accel),
    ]
    if metrics:
        ip, port, path = metrics
        if not re.fullmatch(r"[A-Za-z0-9.:-]+", ip) or not re.fullmatch(r"/[A-Za-z0-9/._-]*", path):
            raise ValueError(f"not a metrics address: {ip}:{port}{path}")
        get = f'exec 3<>/dev/tcp/{ip}/{int(port)} && printf "GET {path} HTTP/1.0\\r\\nHost: {ip}\\r\\n\\r\\n" >&3 && cat <&3'
        parts.append(section("metrics", f"timeout 3 bash -c {q(get)}"))
    return "\n".join(parts) + "\n"
