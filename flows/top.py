"""``invoke top``: a live view of a serving cluster.

Every ``--interval`` seconds, one round trip per host over the connections
the runner keeps open (``roles.status.top_script``): the cluster's
containers on it (state, uptime, service, the release's attempt numbers),
its accelerators' use and memory (``nvidia-smi``/``npu-smi``) and, on the
host of the release's metrics page (the plan's ``metrics``, the same for
every serving system), the server's requests running and waiting, KV cache
use and generated tokens (a rate between two refreshes). The refresh runs
in a thread of its own: a host slower than the interval is shown as such
and the view keeps answering keys. ``q`` or Ctrl-C quits; ``--once --json``
prints one snapshot for scripts.

The view is built by pure functions from the snapshot documents
(``snapshot_doc``, ``render``); only ``snapshot`` and ``live`` do I/O.
"""

from __future__ import annotations

import datetime as dt
import os
import select
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from rich import box
from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from flows.probes import samples
from flows.reads import top_read
from flows.releases import serving_plan
from llmdeploy import interrupt, report
from llmdeploy.errors import LlmdeployError
from llmdeploy.deployment import Deployment
from llmdeploy.platform import Vendor
from llmdeploy.releaseplan import ReleasePlan
from llmdeploy.runner import HostResult, Runner
from roles.status import parse_top, started_at


def node_doc(vendor: Vendor, host: str, r: HostResult | None, now: float) -> dict:
    """One host's part of a snapshot, from its ``top_script`` result (``vendor``: the platform's, which reads its devices)."""
    if r is None or r.failed or r.status == "skipped":
        why = (r.msg if r is not None else "no answer") or "no answer"
        return {"host": host, "reachable": False, "error": why, "release": None, "units": [], "accelerators": []}
    got = parse_top(r.stdout, vendor)
    units = []
    for u in got["units"]:
        t = started_at(u["started"])
        units.append({"container": u["name"], "service": u["service"] or "-", "state": u["state"], "release": u["release"],
                      "uptime_s": round(now - t, 1) if t and u["state"] == "running" else None,
                      "restarts": max(0, got["attempts"].get(u["name"], 1) - 1)})
    return {"host": host, "reachable": True, "error": "", "release": got["release"], "units": units, "accelerators": got["accel"],
            "metrics_page": (got["metrics_status"], got["metrics"])}


def server_doc(plan: ReleasePlan | None, nodes: list[dict]) -> dict | None:
    """What the release's metrics page says (None: the plan names none)."""
    m = plan.metrics if plan else None
    if m is None:
        return None
    status, page = next((n.get("metrics_page") for n in nodes if n["host"] == m.probe.host), None) or (None, None)
    doc = {"host": m.probe.host, "port": m.probe.port, "path": m.probe.path, "answers": status is not None, "status": status,
           "running": None, "waiting": None, "kv_cache": None, "generated_tokens": None}
    if page is None:
        return doc
    try:
        got = samples(page.encode(), m.running + m.waiting + m.kv_cache + m.generated_tokens)
    except ValueError:
        return doc | {"status": "unreadable"}
    for key, names in (("running", m.running), ("waiting", m.waiting), ("kv_cache", m.kv_cache), ("generated_tokens", m.generated_tokens)):
        vals = [got[n] for n in names if n in got]
        doc[key] = sum(vals) if vals else None
    if page.strip() == "[]":  # iteration statistics with no iteration since the last read: idle
        doc["running"], doc["waiting"] = 0, 0
    return doc


def snapshot_doc(dep: Deployment, plan: ReleasePlan | None, results: Mapping[str, HostResult | None], now: float) -> dict:
    cluster = dep.cluster
    nodes = [node_doc(dep.vendor, n.name, results.get(n.name), now) for n in cluster.nodes]
    server = server_doc(plan, nodes)
    for n in nodes:
        n.pop("metrics_page", None)
    return {"cluster": cluster.name, "time": dt.datetime.fromtimestamp(now, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "release": plan.release if plan else None, "system": plan.system if plan else None, "server": server, "nodes": nodes}


def snapshot(runner: Runner, dep: Deployment, plan: ReleasePlan | None, timeout: float) -> dict:
    """One refresh: one round trip per host (at most ``timeout`` seconds
    each), or what the launcher's reader read of them a few seconds before
    (``flows.reads``): the snapshot's time is when the metrics page (else the
    oldest answer) was read."""
    runner.unreachable.clear()  # a node that was down is tried again
    res = runner.run(top_read(dep, plan, timeout), deadline=timeout + 1)
    now = time.time()
    m = plan.metrics if plan else None
    read = res.get(m.probe.host) if m else None
    age = read.age if read is not None else max((r.age for r in res.values()), default=0.0)
    return snapshot_doc(dep, plan, res, now - age)


def with_rate(doc: dict, before: dict | None) -> dict:
    """``doc`` with the server's generated tokens per second since ``before``."""
    s = doc.get("server")
    if not s:
        return doc
    s["tokens_per_s"] = None
    b = (before or {}).get("server") or {}
    if s.get("generated_tokens") is not None and b.get("generated_tokens") is not None and before is not None and before.get("release") == doc.get("release"):
        secs = (dt.datetime.fromisoformat(doc["time"].rstrip("Z")) - dt.datetime.fromisoformat(before["time"].rstrip("Z"))).total_seconds()
        if secs > 0 and s["generated_tokens"] >= b["generated_tokens"]:
            s["tokens_per_s"] = round((s["generated_tokens"] - b["generated_tokens"]) / secs, 1)
        elif secs <= 0:
            # the same reading of the page again (a reader's, read before this refresh): the rate it had
            s["tokens_per_s"] = b.get("tokens_per_s")
    return doc


# --- the view (pure) -----------------------------------------------------------------------------
def _age(s: float | None) -> str:
    if s is None:
        return "-"
    s = int(s)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _num(v, fmt="{:g}") -> str:
    return "-" if v is None else fmt.format(v)


def _state(n: dict) -> Text:
    if not n["reachable"]:
        return Text("unreachable", style="bold red")
    if not n["units"]:
        return Text("no units", style="yellow")
    states = [u["state"] for u in n["units"]]
    up = states.count("running")
    if up == len(states):
        return Text(f"{up}/{len(states)} up", style="green")
    bad = next(s for s in states if s != "running")
    return Text(f"{up}/{len(states)} up, {bad}", style="bold red")


def _accel(n: dict) -> tuple[str, str, str]:
    a = n["accelerators"]
    if not a:
        return "-", "-", "-"
    util = [x["util_pct"] for x in a if x["util_pct"] is not None]
    used = sum(x["mem_used_mib"] or 0 for x in a)
    total = sum(x["mem_total_mib"] or 0 for x in a)
    return (str(len(a)), f"{sum(util) / len(util):.0f}%" if util else "-", f"{100 * used / total:.0f}%" if total else "-")


def ends(dep: Deployment, runner: Runner, plan: ReleasePlan | None) -> tuple[str, float] | None:
    """What ends the release by itself and when, as monotonic seconds (the
    launcher's hold: a Slurm job's time limit), read once; None when nothing does."""
    if plan is None:
        return None
    said = dep.units(runner, lambda _: None).view(plan).ends
    return (said[0], time.monotonic() + said[1]) if said else None


def with_ends(doc: dict, until: tuple[str, float] | None) -> dict:
    """``doc`` with ``ends``: {what, in_s} counted down on this host's clock from when it was read."""
    if until is not None:
        doc["ends"] = {"what": until[0], "in_s": round(max(0.0, until[1] - time.monotonic()), 1)}
    return doc


def render(doc: dict, interval: float, width: int, age_s: float = 0.0) -> Group:
    """The view of one snapshot for a terminal ``width`` columns wide: a
    header (release, endpoint, the server's load), then a row per node. At
    80 columns 16 nodes fit; wider terminals get the services and releases."""
    wide = width >= 110
    s = doc.get("server")
    head = Text()
    head.append(f"{doc['cluster']}", style="bold")
    head.append(f"  release {doc['release'] or 'none'}" + (f" ({doc['system']})" if doc.get("system") else ""))
    head.append(f"  {doc['time'][11:19]}Z")
    if age_s > 2 * interval + 1:
        head.append(f" ({age_s:.0f}s old: a node is slow)", style="yellow")
    lines: list[RenderableType] = [head]
    if s:
        load = Text(f"endpoint {s['host']}:{s['port']} ")
        load.append("answers" if s["answers"] else "does not answer", style="green" if s["answers"] else "bold red")
        if s["answers"] and s["status"] != 200:
            load.append(f"  {s['path']}: {s['status'] if s['status'] == 'unreadable' else 'HTTP ' + str(s['status'])}", style="yellow")
        elif s["answers"]:
            load.append(f"  running {_num(s['running'])}  waiting {_num(s['waiting'])}")
            if s.get("kv_cache") is not None:
                kv = s["kv_cache"] * 100 if s["kv_cache"] <= 1 else s["kv_cache"]
                load.append(f"  KV cache {kv:.0f}%")
            if s.get("tokens_per_s") is not None:
                load.append(f"  {s['tokens_per_s']:g} tok/s")
        lines.append(load)
    if doc.get("ends"):
        e = doc["ends"]
        lines.append(Text(f"{e['what']} ends in {report.clock(e['in_s'])}", style="yellow" if e["in_s"] < 3600 else ""))
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, expand=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (("node", "left"), ("units", "left"), ("up", "right"), ("restarts", "right"),
                                                      ("acc", "right"), ("use", "right"), ("mem", "right"))
    for col, just in columns:
        t.add_column(col, justify=just, no_wrap=True)
    if wide:
        t.add_column("services", no_wrap=False)
        t.add_column("release", no_wrap=True)
    for n in doc["nodes"]:
        ups = [u["uptime_s"] for u in n["units"] if u["uptime_s"] is not None]
        rst = sum(u["restarts"] for u in n["units"])
        count, use, mem = _accel(n)
        row = [n["host"], _state(n), _age(min(ups)) if ups else "-", str(rst) if n["units"] else "-", count, use, mem]
        if wide:
            row += [", ".join(sorted({u["service"] for u in n["units"]})) or escape(n["error"][:60]), n["release"] or "-"]
        t.add_row(*row)
    lines.append(t)
    down = [n for n in doc["nodes"] if not n["reachable"]]
    for n in down[:4]:
        lines.append(Text(f"{n['host']}: {n['error'][:width - len(n['host']) - 3]}", style="red"))
    lines.append(Text(f"every {interval:g}s; q quits", style="dim"))
    return Group(*lines)


# --- running it ----------------------------------------------------------------------------------
def once(dep: Deployment, con: Console, json_out: bool, interval: float) -> int:
    with dep.runner() as runner:
        plan, why = serving_plan(runner, dep.cluster)
        doc = with_ends(snapshot(runner, dep, plan, max(interval, 5)), ends(dep, runner, plan))
    if plan is None:
        doc["no_release"] = why
    if json_out:
        report.emit_json(doc)
    else:
        con.print(render(doc, interval, con.width))
    return 0 if all(n["reachable"] for n in doc["nodes"]) else 1


class _Keys:
    """Single keys from a terminal's standard input (cbreak mode), restored on exit."""

    def __init__(self):
        self.fd: int | None = sys.stdin.fileno() if sys.stdin and sys.stdin.isatty() else None
        self.saved: list[Any] | None = None

    def __enter__(self):
        if self.fd is not None:
            import termios
            import tty

            self.saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd)
        return self

    def __exit__(self, *exc):
        if self.saved is not None:
            assert self.fd is not None  # saved only when there is a terminal
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

    def read(self, timeout: float) -> str:
        if self.fd is None:
            time.sleep(timeout)
            return ""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        return os.read(self.fd, 1).decode(errors="replace") if ready else ""


def live(dep: Deployment, con: Console, interval: float) -> int:
    if not 0.2 <= interval <= 3600:
        raise LlmdeployError(f"--interval {interval:g}: expected 0.2 to 3600 seconds")
    cluster = dep.cluster
    with dep.runner() as runner:
        plan, why = serving_plan(runner, cluster)
        state: dict[str, Any] = {"doc": None, "at": 0.0, "plan": plan, "ends": ends(dep, runner, plan)}
        stop = threading.Event()

        def refresh():
            before = None
            while not stop.is_set():
                t = time.monotonic()
                try:
                    doc = snapshot(runner, dep, state["plan"], max(interval, 2))
                    if doc["nodes"][0].get("release") not in (None, state["plan"].release if state["plan"] else None):
                        state["plan"], _ = serving_plan(runner, cluster)  # another release became current
                        state["ends"] = ends(dep, runner, state["plan"])
                    with_ends(doc, state["ends"])
                    state["doc"], state["at"] = with_rate(doc, before), time.monotonic()
                    before = doc
                except Exception as exc:  # the view goes on; the next refresh tries again
                    state["error"] = f"{type(exc).__name__}: {exc}"
                except KeyboardInterrupt:  # its command cut by Ctrl-C (llmdeploy/interrupt.py): the view ends
                    return
                stop.wait(max(0.0, interval - (time.monotonic() - t)))

        worker = threading.Thread(target=refresh, daemon=True)
        worker.start()
        try:
            with _Keys() as keys, Live(Text(f"{cluster.name}: reading {len(cluster.nodes)} nodes ..."), console=con, auto_refresh=False,
                                       screen=con.is_terminal, transient=False) as view:
                while True:
                    if state["doc"] is not None:
                        view.update(render(state["doc"], interval, con.width, time.monotonic() - state["at"]), refresh=True)
                    elif plan is None:
                        view.update(Text(f"{cluster.name}: {why}; reading the nodes ..."), refresh=True)
                    if keys.read(0.25).lower() == "q":
                        break
                    interrupt.check()  # Ctrl-C (counted by the handler) ends the view here
        except KeyboardInterrupt:
            pass
        finally:
            stop.set()
            worker.join(interval + 10)
    return 0


def top(dep: Deployment, con: Console, interval: float, once_only: bool, json_out: bool) -> int:
    if json_out and not once_only:
        raise LlmdeployError("--json needs --once (the live view is for people)")
    return once(dep, con, json_out, interval) if once_only else live(dep, con, interval)
