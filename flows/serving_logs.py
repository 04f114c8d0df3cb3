"""``invoke logs``: the serving logs of every unit of the cluster on each
node (a node may run several: a Dynamo node's frontend and workers), in
start order, each line prefixed with its host (and its service where the
node runs more than one); ``--service NAME`` picks one service's units.
One round trip per node; ``--follow`` keeps printing one unit's log.
The shell text is ``roles.status``'s."""

from __future__ import annotations

import re
import sys

from flows.plan import select_nodes
from llmdeploy.errors import InventoryError, LlmdeployError
from llmdeploy.inventory import Cluster, Node
from llmdeploy.runner import Runner, Step
from llmdeploy.deployment import Deployment
from roles.status import parse_logs

_SINCE = re.compile(r"^(\d+[smhd]?|\d{4}-\d{2}-\d{2}(T[0-9:.]+Z?)?)$")
_TAIL = re.compile(r"^(\d+|all)$")
_SERVICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def _options(cluster: Cluster, host: str | None, follow: bool, since: str | None, tail: str | None, service: str | None) -> tuple[list[Node], list[str]]:
    """(the nodes, the ``docker logs`` options); every bad flag named at once (exit 2), before any connection."""
    problems = []
    if since is not None and not _SINCE.match(since):
        problems.append(f"--since {since!r}: use a duration like 10m or 2h, or a date like 2026-12-02T10:00:00Z")
    if tail is not None and not _TAIL.match(tail):
        problems.append(f"--tail {tail!r}: a number of lines or 'all'")
    if service is not None and not _SERVICE.match(service):
        problems.append(f"--service {service!r}: a service name of the release (letters, digits, '.', '_', '-')")
    nodes = select_nodes(cluster, host)
    if follow and len(nodes) != 1:
        problems.append("--follow needs one --host")
    if problems:
        raise InventoryError("logs", problems)
    return nodes, (["--since", since] if since else []) + (["--tail", tail] if tail else [])


def serving_logs(dep: Deployment, host: str | None = None, follow: bool = False, since: str | None = None, tail: str | None = None,
                 service: str | None = None) -> int:
    """Print every unit's log on each node (``--service``: that service's); exit 1 if a node failed or had none."""
    cluster = dep.cluster
    nodes, opts = _options(cluster, host, follow, since, tail, service)
    rt = dep.runtime
    rt.logs_script(service, opts)  # what the runtime cannot read (a pyxis unit's log has no times: --since) is refused before any connection
    with dep.runner(nodes=nodes) as runner:
        if follow:
            return _follow(runner, dep, nodes[0], opts, service)
        res = runner.run(Step(name="logs", build=lambda n: rt.logs_script(service, opts)))
    status, found = 0, set()
    for h, r in res.items():
        if r.failed:
            print(f"{h}: {r.msg}", file=sys.stderr)
            status = 1
            continue
        units, logs = parse_logs(r.stdout)
        found |= {svc for _, svc in units}
        if not units:
            print(f"{h}: no serving container of {cluster.name} here", file=sys.stderr)
            status = 1
        several = len(units) > 1
        for name, svc in units:
            for line in logs.get(name, []):
                print(f"{h}/{svc if svc != '-' else name} | {line}" if several else f"{h} | {line}")
    if service is not None and service not in found:
        raise LlmdeployError(f"--service {service}: no container of that service of {cluster.name} on "
                             f"{', '.join(n.name for n in nodes)} (services there: {', '.join(sorted(found - {'-'})) or 'none'})")
    return status


def _follow(runner: Runner, dep: Deployment, node: Node, opts: list[str], service: str | None) -> int:
    """Keep printing the log of the one unit on ``node`` (of ``service``)."""
    out, err, code = runner.exec(node, dep.runtime.logs_script(service, opts, with_logs=False))
    units, _ = parse_logs(out)
    chosen = [name for name, svc in units if service is None or svc == service]
    if len(chosen) != 1:
        have = ", ".join(f"{name} ({svc})" for name, svc in units) or "none"
        why = "no such unit" if not chosen else "several units: pick one with --service"
        raise LlmdeployError(f"--follow on {node.name}: {why} (units there: {have})")
    return 0 if runner.stream(node, dep.runtime.follow_command(chosen[0], opts), f"logs {chosen[0]}") == 0 else 1
