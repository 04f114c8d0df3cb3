"""What runs on a node, as pure shell builders and parsers (the flows run
them): the current release's record and the state of the cluster's
containers (``invoke status``, ``stop``), and the serving logs of every unit
of a node (``invoke logs``).

The builders give Docker's commands to the text every runtime shares
(``llmdeploy.unitscripts``); the parsers read every runtime's output.
Every value is quoted; nothing here opens a connection.
"""

from __future__ import annotations

import calendar
import json
import re
import time
import shlex

from llmdeploy import unitscripts
from llmdeploy.inventory import Cluster
from llmdeploy.platform import Vendor
from llmdeploy.unitscripts import LABEL, LOG_MARK, UNIT_MARK
from roles.commenv import parse_env_file
from llmdeploy.sections import split_sections

# the current release's record (what stop, top and deploy read first): every runtime's
current_script = unitscripts.current_script


# the inspect section's last line when ``docker ps`` could not list the containers; docker's words come before it
DOCKER_FAILED = "@@llmdeploy-docker-ps-failed@@"
# what the docker client says when no daemon answers on its socket (a stopped or dead dockerd)
_DAEMON_DOWN = re.compile(r"Cannot connect to the Docker daemon|Is the docker daemon running\?", re.IGNORECASE)


def status_script(cluster: Cluster) -> str:
    """``current_script`` with the release's env file and every container of
    the cluster on this node as docker inspect JSON lines (sections env,
    inspect): one round trip. When ``docker ps`` fails (a daemon that does
    not answer), the inspect section says so (docker's words, then
    :data:`DOCKER_FAILED`) and fails, instead of listing no container."""
    q = shlex.quote
    ps = f"docker ps -a --filter label={LABEL}.cluster={q(cluster.name)} --format '{{{{.Names}}}}'"
    return unitscripts.status_script(cluster, f"if names=$({ps}); then for c in $names; do docker inspect --format '{{{{json .}}}}' \"$c\"; done; "
                                              f"else echo '{DOCKER_FAILED}'; false; fi")


def docker_problem(host: str, said: str) -> tuple[str, str]:
    """(state, reason) of a node whose ``docker ps`` failed, from what docker
    said: a daemon that does not answer is named as such."""
    words = " ".join(said.split()) or "no output"
    if _DAEMON_DOWN.search(said):
        return "docker down", f"the Docker daemon on {host} does not answer ({words}): its containers' state is unknown"
    return "docker failed", f"docker ps failed on {host} ({words}): its containers' state is unknown"


def parse_status(out: str) -> dict:
    """{"release": id or None, "meta": release.json or None, "env": the env
    file's variables, "plan": plan.json text, "containers": {name: docker
    inspect}, "docker_error": what docker said when ``docker ps`` failed (None:
    it listed the containers)} from ``status_script``'s (or
    ``current_script``'s) output; a section that failed or is not JSON reads
    as absent."""
    s = split_sections(out)

    def text(name: str) -> str:
        v = s.get(name)
        return v[0] if v and v[1] == 0 else ""

    def load(name: str):
        try:
            return json.loads(text(name)) if text(name).strip() else None
        except ValueError:
            return None

    containers = {}
    for line in text("inspect").splitlines():
        try:
            c = json.loads(line)
        except ValueError:
            continue
        if isinstance(c, dict) and isinstance(c.get("Name"), str):
            containers[c["Name"].lstrip("/")] = c
    meta = load("meta")
    lines = (s.get("inspect") or ("", 0))[0].splitlines()
    failed = [i for i, line in enumerate(lines) if line.strip() == DOCKER_FAILED]
    docker_error = ("\n".join(lines[: failed[0]]).strip() or "no output") if failed else None
    return {"release": text("release").strip() or None, "meta": meta if isinstance(meta, dict) else None,
            "env": parse_env_file(text("env")), "plan": text("plan"), "containers": containers, "docker_error": docker_error}


def _units(cluster: Cluster) -> str:
    """The cluster's containers on this node, in start order (the highest stop phase first): ``phase|name|service``."""
    fmt = f'{{{{.Label "{LABEL}.stop_phase"}}}}|{{{{.Names}}}}|{{{{.Label "{LABEL}.service"}}}}'
    return f"docker ps -a --filter label={LABEL}.cluster={shlex.quote(cluster.name)} --format {shlex.quote(fmt)} | sort -t'|' -k1,1nr -k2,2"


def logs_script(cluster: Cluster, service: str | None, opts: list[str], with_logs: bool = True) -> str:
    """Every unit of the cluster on this node (a line ``UNIT_MARK name
    service`` each, in start order), then, with ``with_logs``, the log of each
    (of ``service``'s only, if given) behind a line ``LOG_MARK name``.
    ``opts``: ``docker logs`` options (``--since``, ``--tail``), each quoted."""
    return unitscripts.logs_script(service, _units(cluster), f'docker logs {shlex.join(opts)} "$name"', with_logs)


def parse_logs(out: str) -> tuple[list[tuple[str, str]], dict[str, list[str]]]:
    """([(container, service)] in start order, {container: its log lines}) from ``logs_script``'s output."""
    units: list[tuple[str, str]] = []
    logs: dict[str, list[str]] = {}
    cur = None
    for line in out.splitlines():
        if line.startswith(UNIT_MARK + " ") and cur is None:
            name, _, svc = line[len(UNIT_MARK) + 1:].partition(" ")
            units.append((name, svc))
        elif line.startswith(LOG_MARK + " "):
            cur = line[len(LOG_MARK) + 1:]
            logs[cur] = []
        elif cur is not None:
            logs[cur].append(line)
    return units, logs


def follow_command(container: str, opts: list[str]) -> str:
    """Print one container's log and keep printing new lines."""
    return f"docker logs {shlex.join(opts + ['-f', container])} 2>&1"


# --- the live view (invoke top): everything about one node in one round trip ------------------------
TOP_FORMAT = (f'{{{{.Name}}}}|{{{{.State.Status}}}}|{{{{.State.StartedAt}}}}|{{{{index .Config.Labels "{LABEL}.service"}}}}|'
              f'{{{{index .Config.Labels "{LABEL}.release"}}}}')


def top_script(cluster: Cluster, accel: str, metrics: tuple[str, int, str] | None = None) -> str:
    """``llmdeploy.unitscripts.top_script`` with Docker's units: one
    ``docker inspect`` line (TOP_FORMAT) per container of the cluster
    (``accel``: the platform's query of its devices)."""
    q = shlex.quote
    ids = f"docker ps -aq --filter label={LABEL}.cluster={q(cluster.name)}"
    return unitscripts.top_script(cluster, metrics, f'ids=$({ids}); [ -z "$ids" ] || docker inspect --format {q(TOP_FORMAT)} $ids', accel)


def parse_top(out: str, vendor: Vendor) -> dict:
    """``top_script``'s output: {"release", "units": [{name, state, started,
    service, release}], "attempts": {container: n}, "accel": [{id, util_pct,
    mem_used_mib, mem_total_mib}], "metrics": the page's body (None unless
    it answered 200), "metrics_status": its HTTP status (None: no answer)};
    ``vendor`` reads its devices' section."""
    s = split_sections(out)

    def text(name: str) -> str:
        v = s.get(name)
        return v[0] if v else ""

    units = []
    for line in text("units").splitlines():
        cells = line.split("|")
        if len(cells) == 5:
            units.append({"name": cells[0].lstrip("/"), "state": cells[1], "started": cells[2], "service": cells[3], "release": cells[4]})
    attempts = {}
    for line in text("attempts").splitlines():
        m = re.fullmatch(r"(\S+)\.attempt ([0-9]{1,9})", line.strip())
        if m:
            attempts[m.group(1)] = int(m.group(2))
    accel = text("accel")
    metrics, status = None, None
    if "metrics" in s and s["metrics"][1] == 0:
        head, sep, body = text("metrics").partition("\r\n\r\n")
        if not sep:
            head, sep, body = text("metrics").partition("\n\n")
        code = head.split(" ")[1:2]
        status = int(code[0]) if sep and code and code[0].isdigit() else None
        metrics = body if status == 200 else None
    return {"release": text("release").strip() or None, "units": units, "attempts": attempts,
            "accel": vendor.parse_top(accel), "metrics": metrics, "metrics_status": status}


def started_at(started: str) -> float | None:
    """docker inspect's State.StartedAt (RFC 3339, UTC, nanoseconds) as
    seconds since the epoch; None for a container never started (0001-...)
    or a value that is not such a time."""
    if not started or started.startswith("0001-"):
        return None
    try:
        return calendar.timegm(time.strptime(started[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
