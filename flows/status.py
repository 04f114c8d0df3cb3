"""``invoke status``: per node, the current release's units as they run
(state, image, uptime, what the plan shows of each) and, with ``--diff``,
how each differs from the release's record; the endpoint's first readiness
probe. Everything is read from the nodes (the release's own plan.json):
one round trip per node, plus the probe. The read is a standing one
(``flows/reads.py``): where the cluster's launcher keeps a reader of the
release, it answers with what that reader read at most a few seconds before.
"""

from __future__ import annotations

import time
from collections.abc import Set as AbstractSet

from rich.console import Console
from rich.markup import escape

from flows.probes import body_problem, fetch
from flows.reads import status_read
from flows.releases import current_plan
from llmdeploy import report
from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster
from llmdeploy.launcher import ReleaseView
from llmdeploy.releaseplan import ReleasePlan, Unit
from llmdeploy.runner import Runner
from roles.containers import LABEL
from roles.status import docker_problem, parse_status, started_at


def drift(plan: ReleasePlan, st: dict, c: dict | None, main: bool, secret_keys: AbstractSet[str] = frozenset(),
          own_env: tuple[str, ...] = ()) -> list[str]:
    """How a running container differs from the current release's record.
    A host's main unit (prefix "") is compared with release.json (image,
    command) and the env file; other units with their release label. Secret
    values are never shown. ``own_env``: the variables the units' runtime
    sets itself, compared only where the release sets them too."""
    meta = st["meta"] or {}
    if c is None:
        return ["the release's container is missing"]
    out = []
    if main and not meta.get("serving_image") and meta.get("image_id") and c.get("Image") != meta["image_id"]:
        out.append(f"image {c.get('Image', '')[:19]} runs, the release has {meta['image_id'][:19]}")
    labels = (c.get("Config") or {}).get("Labels") or {}
    if labels.get(f"{LABEL}.release") != st["release"]:
        out.append(f"container label {LABEL}.release={labels.get(f'{LABEL}.release')!r}, current release {st['release']}")
    if not main:
        return out
    return out + _env_drift(plan, st, c, secret_keys, own_env) + _command_drift(meta, c)


def _env_drift(plan: ReleasePlan, st: dict, c: dict, secret_keys: AbstractSet[str], own_env: tuple[str, ...] = ()) -> list[str]:
    env = {k: v for k, v in (x.split("=", 1) for x in (c.get("Config") or {}).get("Env", []) if "=" in x)
           if k not in own_env or k in st["env"]}
    prefixes = tuple(plan.drift_env_prefixes)
    out = []
    for k in sorted(set(st["env"]) | set(k for k in env if k in st["env"] or (prefixes and k.startswith(prefixes)))):
        if st["env"].get(k) != env.get(k):
            if k in secret_keys:
                out.append(f"environment {k}: the running value differs from the release's (a secret: not shown)")
            else:
                out.append(f"environment {k}: running {env.get(k)!r}, release {st['env'].get(k)!r}")
    return out


def _command_drift(meta: dict, c: dict) -> list[str]:
    cmd = (c.get("Config") or {}).get("Cmd") or []
    want = meta.get("command")
    if not want or cmd == want:
        return []
    have, need = _flag_pairs(cmd), _flag_pairs(want)
    added = [a for a in have if a not in need]
    dropped = [a for a in need if a not in have]
    return [f"command line differs from the release: running has {' '.join(added[:6]) or '-'}, lacks {' '.join(dropped[:6]) or '-'}"]


def _flag_pairs(args: list[str]) -> list[str]:
    """``--flag value`` pairs (and bare flags/positionals) of a command line."""
    out, i = [], 0
    while i < len(args):
        if args[i].startswith("--") and i + 1 < len(args) and not args[i + 1].startswith("--"):
            out.append(f"{args[i]} {args[i + 1]}")
            i += 2
        else:
            out.append(args[i])
            i += 1
    return out


def _docker_state(c: dict | None) -> dict:
    s = (c or {}).get("State")
    return s if isinstance(s, dict) else {}


def _uptime(c: dict | None) -> str:
    started = str(_docker_state(c).get("StartedAt") or "")
    if not started or not _docker_state(c).get("Running"):
        return "-"
    t = started_at(started)
    return started if t is None else f"{int(time.time() - t)}s"


def _state(c: dict | None) -> str:
    if c is None:
        return "missing"
    s = _docker_state(c)
    return "running" if s.get("Running") else f"exited ({s.get('ExitCode')})"


def endpoint_health(runner: Runner, cluster: Cluster, plan: ReleasePlan | None) -> tuple[object, str | None]:
    """(what the plan's first readiness probe answered: its status or
    "unreachable (<the error's type>)", the problem its body check names or
    None): one request, ``flows.probes.fetch``."""
    if plan is None or not plan.ready:
        return None, None
    p = plan.ready[0]
    got = fetch(runner, cluster.node(p.host), p, 10)
    if got.status is None:
        return f"unreachable ({type(got.error).__name__})", None
    return got.status, (body_problem(p, got.body) if got.ok else None)


def _shown(plan: ReleasePlan, u: Unit, c: dict | None) -> list[str]:
    """The values of the plan's table columns for a unit (a value the plan lacks: its container's label)."""
    labels = ((c or {}).get("Config") or {}).get("Labels") or {}
    return [escape(str(u.show[k]) if u.show.get(k) is not None else labels.get(f"{LABEL}.{k}", "")) for k in plan.show_labels]


def _node_view(cluster: Cluster, plan: ReleasePlan | None, name: str, st: dict, show_diff: bool,
               held: ReleaseView | None = None, own_env: tuple[str, ...] = ()) -> tuple[list[list[str]], dict, bool]:
    """(table rows, JSON document, whether it keeps the cluster from serving) of one reachable node;
    ``held``: what the cluster's launcher says of the release (a unit's state as it runs it);
    ``own_env``: the variables the unit runtime sets itself, which are no drift (``UnitRuntime.own_env``;
    Docker sets none)."""
    held = held or ReleaseView()
    n_cols = len(plan.show_labels) if plan is not None else 0
    units = plan.units(name) if plan is not None and st["release"] == plan.release else []
    if not units:
        row = [name, st["release"] or "-", "-", *["-"] * n_cols, "[bold red]no current release[/]" if not st["release"] else "[bold red]not in the release[/]",
               "-", "-", ""]
        why = ("no current release here" if not st["release"]
               else f"runs release {st['release']}, the current release is {plan.release}" if plan is not None and plan.units(name)
               else "not in the current release")
        # not serving: no release here, or another one than the current release runs here
        bad = not st["release"] or (plan is not None and bool(plan.units(name)))
        return [row], {"release": st["release"], "state": "missing", "drift": [], "units": {}, "reason": why}, bad
    doc = {"release": st["release"], "state": "running", "image_id": None, "uptime": "-", "drift": [], "units": {}, "reason": None}
    rows, whys, bad = [], [], False
    # docker could not list the containers (its daemon does not answer): say so, not "missing"
    docker_state, docker_why = docker_problem(name, st["docker_error"]) if st.get("docker_error") else (None, None)
    if docker_why:
        whys.append(docker_why)
    assert plan is not None  # units come from the plan
    for i, u in enumerate(units):
        c = st["containers"].get(u.container)
        state, role = held.unit_state(docker_state or _state(c), u), u.role or plan.service_of(u).name
        drifts = drift(plan, st, c, u.prefix == "", set(cluster.secret_env), own_env) if show_diff else []
        bad = bad or state != "running" or bool(drifts)
        if state != "running" and doc["state"] == "running":
            doc["state"] = state
        rows.append([name, st["release"], role, *_shown(plan, u, c), state if state == "running" else f"[bold red]{state}[/]",
                     ((c or {}).get("Image") or "-")[:19], _uptime(c), "\n".join(f"[red]{escape(x)}[/]" for x in drifts) if show_diff else ""])
        doc["units"][u.container] = {"service": plan.service_of(u).name, "state": state, "uptime": _uptime(c), **held.unit_doc(u)}
        whys += ([f"{role} container {u.container} {state}"] if state != "running" and not docker_state else []) + drifts
        doc["drift"] += drifts
        if i == 0:
            doc["image_id"], doc["uptime"] = (c or {}).get("Image"), _uptime(c)
    doc["reason"] = "; ".join(whys) or None
    return rows, doc, bad


def status(dep: Deployment, con: Console, show_diff: bool, json_out: bool, wide: bool = False) -> int:
    cluster = dep.cluster
    with dep.runner() as runner:
        res = runner.run(status_read(dep))
        sts = {h: (parse_status(r.stdout) if not r.failed else None) for h, r in res.items()}
        plan = current_plan(cluster, sts)
        health, health_problem = endpoint_health(runner, cluster, plan)
        # what the cluster's launcher says of the release (its job, say)
        held = dep.units(runner, con.print).view(plan)
    rows, doc, bad = [], {}, plan is None or held.problem is not None
    n_cols = len(plan.show_labels) if plan is not None else 0
    for n in cluster.nodes:
        st = sts[n.name]
        if st is None:
            msg = res[n.name].msg
            rows.append([n.name, "-", "-", *["-"] * n_cols, f"[red]unreachable: {escape(msg)}[/]", "-", "-", ""])
            doc[n.name], bad = {"error": msg, "state": "unreachable", "reason": f"unreachable: {msg}"}, True
            continue
        node_rows, doc[n.name], node_bad = _node_view(cluster, plan, n.name, st, show_diff, held, dep.runtime.own_env)
        rows += node_rows
        bad = bad or node_bad
    if plan is not None and health_problem is None and plan.ready and health != plan.ready[0].status:
        health_problem = f"{plan.ready[0].path} answered {health}, not {plan.ready[0].status}"
    if plan is not None and health_problem and plan.entry_host in doc:
        entry = doc[plan.entry_host]
        entry["reason"] = "; ".join(x for x in (entry.get("reason"), f"endpoint: {health_problem}") if x)
    healthy = bool(plan is not None and plan.ready and health == plan.ready[0].status and not health_problem)
    if json_out:
        report.emit_json({"cluster": cluster.name, "release": plan.release if plan else None, "system": plan.system if plan else None,
                          "health": health, "health_problem": health_problem, "healthy": healthy and not bad, "nodes": doc, **held.doc})
    else:
        _print(cluster, con, plan, rows, doc, health, health_problem, healthy, show_diff, wide)
        held.show(con)
    return 0 if healthy and not bad else 1


def status_table(cluster: Cluster, con: Console, plan: ReleasePlan | None, rows: list[list[str]], show_diff: bool, wide: bool = False):
    """The status table, fitted to ``con``: host names and release ids whole.
    When it does not fit whole, the release column is folded into the title
    (every node runs the same one), then image, uptime and role are left out."""
    C = report.Col
    cols = [C("host", whole=True), C("release", whole=True), C("role", drop=3),
            *(C(label) for label in (plan.show_labels.values() if plan is not None else [])),
            C("container"), C("image", drop=1), C("uptime", drop=2), C("drift" if show_diff else "")]
    title = f"status of {cluster.name}"
    t = report.table(title, cols, rows, con=con, wide=wide)
    releases = {r[1] for r in rows} - {"-"}
    if wide or len(releases) != 1 or (report.fits(con, t) and not t.caption):
        return t
    cols, rows = cols[:1] + cols[2:], [r[:1] + r[2:] for r in rows]
    return report.table(f"{title}, release {releases.pop()}", cols, rows, con=con)


def _print(cluster: Cluster, con: Console, plan: ReleasePlan | None, rows, doc, health, health_problem, healthy: bool, show_diff: bool,
           wide: bool = False) -> None:
    report.print_table(con, status_table(cluster, con, plan, rows, show_diff, wide), wide)
    style = "green" if healthy else "bold red"
    if plan is None:
        con.print(f"[bold red]{cluster.name} has no current release[/] (invoke releases --cluster {cluster.name})")
    else:
        p = plan.ready[0] if plan.ready else None
        con.print(f"endpoint http://{cluster.node(plan.entry_host).ip}:{plan.entry_port}{p.path if p else ''}: [{style}]{health}[/]"
                  + (f" [bold red]{escape(health_problem)}[/]" if health_problem else ""))
    for h, d in doc.items():
        if d.get("reason"):
            con.print(f"[bold red]not serving[/] {h}: {escape(d['reason'])}", soft_wrap=True)
