"""``invoke verify-comm``: is the cluster's communication healthy, and if not,
which NPU on which node, or which pair, is broken.

Ascend: one round trip per node for every hccn_tool query (roles.comm), the
TLS value compared across every NPU of every node, then one round trip per
node for its share of the ping plan (pings in parallel on every node).
NVIDIA: the facts (GPUs, topology, ibstat, the NCCL interface), then
``all_reduce_perf`` as one MPI world: the real OpenMPI ``mpirun`` on node 0
reaches the other nodes over SSH as serving's worlds do (roles.mpi), one
rank per GPU, each node's ranks with that node's ``NCCL_SOCKET_IFNAME``;
the largest size's busbw against the floor. A failure names the node (the
hostname NCCL and nccl-tests print, the rank mpirun says failed first, ssh's
words when a daemon could not start there).

Both: the host network that HCCL/Gloo/NCCL bootstrap over (the serving NIC,
``*_SOCKET_IFNAME``): one round trip per node, which pings every other
node's serving IP from its NIC and then sends a full-MTU don't-fragment ping
(the NIC's MTU read on the node), the pings in parallel. Each node's result
is its ``host_net`` check (a column of the table); every failing pair is
listed by name (``sim-a3-0 enp189s0f0 -> sim-a3-2 198.19.3.12: no reply``,
``...: full-MTU (9000) DF ping fails: no reply``) under the table and in
``host_links`` of the JSON.

The report (a table for people, JSON for machines) is also written on node 0
(``<base>/<cluster>/verify-comm.json``) with its time, so that ``deploy`` can
refuse a cluster whose last verification failed or is too old.

Beside it, in the same round trip, the result drawn (roles.comm.picture): an
HTML page and a PNG, from the document and its ``detail`` (every planned
ping with its round trip, every host pair, all_reduce_perf's table), which
the run keeps for the picture only: the JSON and the record stay as they
were, with one more key, ``report``, the files' paths. The same page and
picture, and the document with its detail, go into a local folder
(``--report DIR``, default ``logs/<cluster>/verify-comm``), one set per run.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any, Protocol, cast

from rich.console import Console
from rich.markup import escape
from rich.padding import Padding

from llmdeploy import report
from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster, Node
from llmdeploy.release import root
from llmdeploy.runner import Runner, Step


class _CollectiveVendor(Protocol):
    """A vendor whose verify-comm method is ``collective``: the plug-in check
    (platform.REQUIRED_BY_METHOD) makes sure it has ``comm_device_checks``."""

    def comm_device_checks(self, cluster: Cluster, node: Node, facts: dict) -> dict[str, dict]: ...


def report_path(cluster: Cluster) -> str:
    return f"{root(cluster)}/verify-comm.json"


def _cell(items: list[tuple[int, bool, str]], total: int) -> tuple[bool, str, list[str]]:
    bad = [(d, detail) for d, ok, detail in items if not ok]
    if not bad:
        return True, f"{total}/{total}", []
    reasons = [f"npu{d}: {detail}" for d, detail in bad]
    return False, f"{total - len(bad)}/{total}", reasons


# a lost NPU ping in the document (the JSON and node 0's record); its round trip is the picture's only
LINK_KEYS = ("npu", "to", "to_npu", "ip", "loss", "ok", "reason", "from")


def device_pings(dep: Deployment, runner: Runner, full: bool, detail: dict | None = None) -> dict:
    """The ``device_pings`` method (Ascend): the platform's NIC tool's checks
    per device (hccn_tool), the TLS switch across devices, the device ping
    matrix (full or sampled) and the host network between the nodes.
    ``detail``: gets every planned ping and host pair, for the picture."""
    cluster = dep.cluster
    nodes, ips, tls_values = _link_checks(dep, runner)
    _tls_agreement(nodes, tls_values)
    mode, links = _npu_pings(dep, runner, nodes, ips, full)
    if detail is not None:
        detail["pings"] = [{k: x[k] for k in ("from", "npu", "to", "to_npu", "loss", "ok", "reason", "rtt_ms") if k in x} for x in links]
    host_links = host_network(cluster, runner, nodes, detail)
    failed = [{k: x[k] for k in LINK_KEYS if k in x} for x in links if not x["ok"]]
    return {"nodes": nodes, "plan": mode, "links": {"planned": len(links), "failed": failed}, "host_links": host_links}


def _link_checks(dep: Deployment, runner: Runner) -> tuple[dict[str, dict], dict[str, dict[int, str]], dict[tuple[str, int], str]]:
    """Per node its NIC tool's checks (hccn_tool), its devices' IPs and their TLS switch values, in one round trip each."""
    from roles import comm

    cluster = dep.cluster
    tool = comm.link_step_name(dep)
    res = runner.run(Step(name=tool, build=lambda n: comm.link_script(dep, n), timeout=max(120.0, cluster.ssh.command_timeout)))
    nodes: dict[str, dict] = {}
    ips: dict[str, dict[int, str]] = {}
    tls_values: dict[tuple[str, int], str] = {}
    for n in cluster.nodes:
        r = res[n.name]
        if r.failed:
            nodes[n.name] = {"reachable": False, "error": r.msg, "checks": {}}
            continue
        parsed = comm.parse_links(dep, n, r.stdout)
        ips[n.name] = parsed["ips"]
        checks = {}
        total = len(parsed["devices"])
        for check in comm.link_checks(dep):
            items = [(d, v[check][0], v[check][1]) for d, v in parsed["devices"].items()]
            ok, text, reasons = _cell(items, total)
            checks[check] = {"ok": ok, "summary": text, "failures": reasons}
        for d, v in parsed["devices"].items():
            if v["tls"][0]:
                tls_values[(n.name, d)] = v["tls"][1]
        conf = parsed["conf"]
        checks[parsed["conf_name"]] = {"ok": conf is not None, "summary": "read" if conf is not None else "missing",
                                       "failures": [] if conf is not None else [f"{parsed['conf_path']} could not be read"]}
        nodes[n.name] = {"reachable": True, "checks": checks}
    return nodes, ips, tls_values


def _tls_agreement(nodes: dict[str, dict], tls_values: dict[tuple[str, int], str]) -> None:
    """TLS: the same switch value on every NPU of every node; an NPU that differs fails its node's check."""
    if not tls_values:
        return
    common, _ = Counter(tls_values.values()).most_common(1)[0]
    for (host, d), v in tls_values.items():
        if v != common:
            c = nodes[host]["checks"]["tls"]
            c["ok"] = False
            c["failures"].append(f"npu{d}: TLS switch {v}, the other NPUs have {common}")
    for host, nd in nodes.items():
        if nd.get("reachable"):
            c = nd["checks"]["tls"]
            bad = len(c["failures"])
            total = len([k for k in tls_values if k[0] == host]) or 1
            c["summary"] = f"{total - bad}/{total} (switch {common})"


def _npu_pings(dep: Deployment, runner: Runner, nodes: dict[str, dict], ips: dict[str, dict[int, str]], full: bool) -> tuple[str, list[dict]]:
    """(plan mode, every planned link's result): the NPU ping matrix from every
    reachable node, each node's ``pings`` check, and NPUs without an IP named."""
    from roles import comm

    cluster = dep.cluster
    mode, plan = comm.ping_plan(cluster, ips, full, cluster.verify.ping_full_max)
    reachable = [n for n in cluster.nodes if nodes[n.name].get("reachable")]
    res = runner.run(Step(name=f"NPU pings ({mode})", build=lambda n: comm.ping_script(dep, plan[n.name]), timeout=max(300.0, cluster.ssh.command_timeout)), reachable)
    links = []
    for n in reachable:
        r = res[n.name]
        pings = plan[n.name]
        if r.failed:
            results = [{"npu": d, "to": b, "to_npu": bd, "ip": ip, "loss": 100.0, "ok": False, "reason": r.msg, "rtt_ms": None}
                       for d, b, bd, ip in pings]
        elif r.status == "skipped":
            results = []
        else:
            results = comm.parse_pings(r.stdout, pings)
        for x in results:
            x["from"] = n.name
        links += results
    for n in reachable:
        mine = [x for x in links if x["from"] == n.name]
        bad = [x for x in mine if not x["ok"]]
        nodes[n.name]["checks"]["pings"] = {
            "ok": not bad and bool(mine or len(cluster.nodes) == 1),
            "summary": f"{len(mine) - len(bad)}/{len(mine)}",
            "failures": [f"npu{x['npu']} -> {x['to']}/npu{x['to_npu']}: {x['reason']}" for x in bad],
        }
        # an NPU whose IP is missing cannot be pinged: say so on its node
        missing = [d for d in range(n.devices or cluster.platform_info.devices) if d not in ips.get(n.name, {})]
        if missing:
            nodes[n.name]["checks"]["pings"]["failures"].append(f"npu{','.join(map(str, missing))}: no NPU IP, not pinged")
            nodes[n.name]["checks"]["pings"]["ok"] = False
    return mode, links


def host_timeout(cluster: Cluster) -> float:
    """The host network step's deadline: a lane's pairs one after another, a
    pair at worst ~6 s (no reply to the full-MTU pings, sendmsg retries)."""
    from roles import comm

    per_lane = -(-max(0, len(cluster.nodes) - 1) // comm.HOST_LANES)
    return max(120.0, cluster.ssh.command_timeout, 6.0 * per_lane + 30)


def host_network(cluster: Cluster, runner: Runner, nodes: dict[str, dict], detail: dict | None = None) -> dict:
    """Every reachable node pings every other node's serving IP from its
    serving NIC, plain then full-MTU with don't-fragment; adds the
    ``host_net`` check to each of them in ``nodes``; returns
    ``{"planned": n, "failed": [pair, ...]}``; ``detail`` gets every pair
    (without ping's raw output), for the picture."""
    from roles import comm

    reachable = [n for n in cluster.nodes if nodes[n.name].get("reachable")]
    res = runner.run(Step(name="host network pings", build=lambda n: comm.host_ping_script(cluster, n), timeout=host_timeout(cluster)), reachable)
    answers: dict[str, dict | str] = {}
    for n in reachable:
        r = res[n.name]
        if r.failed:
            answers[n.name] = f"the ping script failed: {r.msg}"
        elif r.status == "skipped":  # a one-node cluster: no peers
            answers[n.name] = {"nic": n.nic, "state": "", "mtu": None, "problems": [], "pairs": []}
        else:
            answers[n.name] = comm.parse_host_pings(cluster, n, r.stdout, r.stderr)
    cells, pairs = comm.host_net_report(cluster, answers)
    for host, cell in cells.items():
        nodes[host]["checks"]["host_net"] = cell
    if detail is not None:
        detail["host_pairs"] = [{k: v for k, v in x.items() if k != "raw"} for x in pairs]
    return {"planned": len(pairs), "failed": [x for x in pairs if not x["ok"]]}


def collective(dep: Deployment, runner: Runner, detail: dict | None = None) -> dict:
    """The ``collective`` method (NVIDIA): the devices and topology of every
    node (the platform's checks of its facts), ibstat, the NCCL interface,
    the host network, then all_reduce_perf; ``detail`` gets the host pairs
    and all_reduce_perf's table, for the picture."""
    from roles import facts, nic

    cluster = dep.cluster
    res = runner.run(facts.gather_step(dep))
    nodes: dict[str, dict] = {}
    for n in cluster.nodes:
        r = res[n.name]
        if r.failed:
            nodes[n.name] = {"reachable": False, "error": r.msg, "checks": {}}
            continue
        f = r.data
        checks = cast(_CollectiveVendor, dep.vendor).comm_device_checks(cluster, n, f)
        ib = nic.ib_problems(dep, f)
        checks["ib"] = {"ok": not ib, "summary": f"{len(f.get('ib_ports') or [])} ports" if not ib else "FAILED", "failures": ib}
        nicp = facts.nic_problems(n, f)
        checks["nccl_if"] = {"ok": not nicp, "summary": n.nic, "failures": nicp}
        nodes[n.name] = {"reachable": True, "checks": checks}
    host_links = host_network(cluster, runner, nodes, detail)
    perf = None
    if all(v.get("reachable") for v in nodes.values()):
        perf = all_reduce(dep, runner, {n.name: (res[n.name].data or {}).get("hostname") for n in cluster.nodes}, detail)
    return {"nodes": nodes, "all_reduce": perf, "host_links": host_links}


def all_reduce(dep: Deployment, runner: Runner, hostnames: dict[str, str | None], detail: dict | None = None) -> dict:
    """``all_reduce_perf`` as one MPI world from node 0 (roles.comm), judged:
    the largest size's busbw against ``verify.nccl_min_busbw``, out-of-bounds
    values, the exit status; every failure names its node. ``detail`` gets
    its table (every size) and the floor, for the picture."""
    from roles import comm

    cluster = dep.cluster
    vs = cluster.verify
    if detail is not None:
        detail["all_reduce"] = {"rows": [], "floor": vs.nccl_min_busbw, "args": vs.all_reduce_args}
    empty: dict[str, Any] = {"max_busbw": None, "avg_busbw": None, "out_of_bounds": None, "oob_ok": False, "wrong_ranks": [], "sizes": 0}
    timeout = max(600.0, cluster.ssh.command_timeout)
    try:
        # a world the cluster's launcher wires itself (PMIx on Slurm: no SSH between nodes), else mpirun from node 0
        world = comm.all_reduce_world(cluster, vs.all_reduce_args)
        got = runner.world(*world, timeout) if world else None
        if got is not None and world:  # a world was run only when there is one
            cmd = comm.world_text(world)
            out, err, code = got
        else:
            cmd = comm.all_reduce_command(dep, vs.all_reduce_args)
            out, err, code = runner.exec(cluster.node0, cmd, timeout=timeout)
    except ValueError as exc:
        return {**empty, "command": None, "ok": False, "failures": [f"all_reduce_perf not run: {exc}"]}
    perf = comm.parse_all_reduce(out)
    if detail is not None:
        detail["all_reduce"]["rows"] = comm.all_reduce_table(out)
    perf["command"] = cmd
    perf["exit"] = code
    problems = []
    why = comm.all_reduce_failure(cluster, vs.all_reduce_args, hostnames, out, err) if code else []
    if perf["max_busbw"] is None:
        lines = [ln.strip() for ln in (err + "\n" + out).strip().splitlines() if ln.strip() and set(ln.strip()) != {"-"}]
        problems.append(f"all_reduce_perf did not run (exit {code})" + (": " + "; ".join(why) if why else f": {lines[-1] if lines else 'no output'}"))
    else:
        if vs.nccl_min_busbw and perf["max_busbw"] < vs.nccl_min_busbw:
            problems.append(f"busbw {perf['max_busbw']:g} GB/s < floor {vs.nccl_min_busbw:g} GB/s (verify.nccl_min_busbw)")
        if not perf["oob_ok"]:
            problems.append(f"out of bounds values: {perf['out_of_bounds']} FAILED")
        if perf["wrong_ranks"]:
            problems.append(f"wrong results on ranks {perf['wrong_ranks']}")
        if code and not problems:
            problems.append(f"all_reduce_perf exited with status {code}" + (": " + "; ".join(why) if why else ""))
    perf["ok"] = not problems
    perf["failures"] = problems
    if problems:
        # what mpirun and the ranks said, for the saved report (the table itself is in max_busbw & co.)
        perf["raw"] = (err.strip() + "\n" + out.strip())[-3000:]
    return perf


def report_files(cluster: Cluster, local_dir: str | None, started: float) -> dict:
    """Where the run's report goes: on node 0 beside the record
    (``verify-comm.html``, ``.png``: the last run's), and locally in
    ``local_dir`` (default: ``logs/<cluster>/verify-comm``, beside the log
    bundles), one set per run named by its time: the page, the picture and
    the document they were drawn from (the JSON with its ``detail``)."""
    from llmdeploy import logs

    folder = Path(local_dir) if local_dir else logs.local_root(cluster) / "verify-comm"
    stem = f"verify-comm-{cluster.name}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(started))}"
    n = 1
    while any((folder / f"{stem}{'' if n == 1 else f'.{n}'}{ext}").exists() for ext in (".html", ".png", ".json")):
        n += 1
    stem += "" if n == 1 else f".{n}"
    base = report_path(cluster).removesuffix(".json")
    return {"local": {"html": str(folder / f"{stem}.html"), "png": str(folder / f"{stem}.png"), "json": str(folder / f"{stem}.json")},
            "node0": {"host": cluster.node0.name, "html": f"{base}.html", "png": f"{base}.png"}}


def _save_local(files: dict, contents: dict[str, str | bytes]) -> list[str]:
    """Write the local copies; returns the problems (none: all written)."""
    problems = []
    for key, content in contents.items():
        path = Path(files[key])
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content if isinstance(content, bytes) else content.encode())
        except OSError as exc:
            problems.append(f"could not write {path}: {exc.strerror or exc}")
            files[key] = None
    return problems


def collect(dep: Deployment, runner: Runner, full: bool, started: float) -> tuple[dict, dict]:
    """(the verification document, its detail for the picture): every check
    of the platform, judged."""
    cluster = dep.cluster
    info = cluster.platform_info
    vendor = dep.vendor
    detail: dict = {"vendor": info.vendor, "platform": info.name, "device": vendor.DEVICE,
                    "devices": {n.name: n.devices or info.devices for n in cluster.nodes}}
    if vendor.COMM_METHOD == "device_pings":
        result = device_pings(dep, runner, full, detail)
    else:
        result = collective(dep, runner, detail)
    ok = all(v.get("reachable") and all(c["ok"] for c in v["checks"].values()) for v in result["nodes"].values())
    if result.get("all_reduce") is not None:
        ok = ok and result["all_reduce"]["ok"]
    elif vendor.COMM_METHOD == "collective":
        ok = False  # the collective did not run
    doc = {"cluster": cluster.name, "ok": ok, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
           "epoch": int(started), "duration_s": round(time.time() - started, 1), **result}
    return doc, detail


def _draw(doc: dict, detail: dict, files: dict) -> tuple[str, bytes | None, list[str]]:
    """The page and the picture (roles.comm.picture) of ``doc`` with its
    ``detail``; ``doc["report"]`` gets the files that will hold them. When the
    picture cannot be drawn (matplotlib missing or failing) the page says so
    and the verdict is saved all the same."""
    from roles.comm import picture

    problems = []
    try:
        png = picture.render_png({**doc, "detail": detail})
    except Exception as exc:  # the verdict matters more than its picture
        png = None
        problems.append(f"the picture could not be drawn: {type(exc).__name__}: {exc}")
        files["local"]["png"] = files["node0"]["png"] = None
    doc["report"] = files
    return picture.render_html({**doc, "detail": detail}, png), png, problems


def run(dep: Deployment, con: Console, json_out: bool, full: bool, report_dir: str | None = None) -> int:
    started = time.time()
    cluster = dep.cluster
    with dep.runner() as runner:
        doc, detail = collect(dep, runner, full, started)
        files = report_files(cluster, report_dir, started)
        page, png, problems = _draw(doc, detail, files)
        # the record on node 0 for deploy (and the next engineer), the page and the picture beside it:
        # one round trip, every file on stdin (at 64 nodes the record is larger than one command-line argument may be)
        from roles.files import puts_step

        on_node0: list[tuple[str, str | bytes, int]] = [(report_path(cluster), json.dumps(doc, indent=1) + "\n", 0o644), (files["node0"]["html"], page, 0o644)]
        if png is not None:
            on_node0.append((files["node0"]["png"], png, 0o644))
        saved = runner.run(puts_step("save the verification", lambda n: on_node0), [cluster.node0])[cluster.node0.name]
        from llmdeploy import lock
        from roles.comm import pair_name

        lock.audit(runner, cluster, "verify-comm", "passed" if doc["ok"] else "failed", None,
                   failed=([f"{x['from']}/npu{x['npu']} -> {x['to']}/npu{x['to_npu']}" for x in (doc.get("links") or {}).get("failed", [])]
                           + [pair_name(x) for x in (doc.get("host_links") or {}).get("failed", [])])[:20])
    if saved.failed:
        problems.insert(0, f"could not save the report on {cluster.node0.name}: {saved.msg}")
        files["node0"].update(html=None, png=None)
    # the local copies: the page, the picture, and the document they were drawn from (with its detail)
    local: dict[str, str | bytes] = {"html": page, "json": json.dumps({**doc, "detail": detail}, indent=1) + "\n"}
    if png is not None:
        local["png"] = png
    problems += _save_local(files["local"], local)
    if json_out:
        if problems:
            doc["report"] = {**files, "problems": problems}
        report.emit_json(doc)
        return 0 if doc["ok"] else 1
    _print(con, cluster, doc)
    _print_files(con, files)
    for p in problems:
        con.print(f"[yellow]{escape(p)}[/]")
    return 0 if doc["ok"] else 1


def _print_files(con: Console, files: dict) -> None:
    local, node0 = files["local"], files["node0"]
    if local.get("html"):
        con.print(f"report: {escape(local['html'])}" + (f" (picture: {escape(local['png'])})" if local.get("png") else ""), soft_wrap=True)
    on0 = ", ".join(escape(node0[k]) for k in ("html", "png") if node0.get(k))
    con.print(f"on {escape(node0['host'])}: {on0}", soft_wrap=True)


def _node_rows(doc: dict, checks: list[str], details: bool) -> list[list[str]]:
    """A row per host: each check's summary, with its first failures when ``details``."""
    rows = []
    for host, v in doc["nodes"].items():
        if not v.get("reachable"):
            rows.append([f"[bold red]{host}[/]"] + [f"[red]{escape(v.get('error', 'unreachable'))}[/]"] + [""] * (len(checks) - 1))
            continue
        cells = []
        for k in checks:
            c = v["checks"].get(k)
            if c is None:
                cells.append("-")
            elif c["ok"]:
                cells.append(f"[green]{escape(c['summary'])}[/]")
            elif not details:
                cells.append(f"[bold red]{escape(c['summary'])}[/]")
            else:
                shown = "\n".join(escape(x) for x in c["failures"][:4]) + (f"\n(+{len(c['failures']) - 4} more)" if len(c["failures"]) > 4 else "")
                cells.append(f"[bold red]{escape(c['summary'])}[/]\n[red]{shown}[/]")
        rows.append([host] + cells)
    return rows


def nodes_table(con: Console, cluster: Cluster, doc: dict):
    """(the per-host table fitted to ``con``, whether the failures are left for
    lines below it): checks every node passes are left out first, then the
    failures move out of the cells."""
    checks: list[str] = []
    for v in doc["nodes"].values():
        for k in v.get("checks", {}):
            if k not in checks:
                checks.append(k)
    passed = [all(v.get("reachable") and v["checks"].get(k, {"ok": True})["ok"] for v in doc["nodes"].values()) for k in checks]
    cols = [report.Col("host", whole=True)] + [report.Col(k, drop=i + 1 if ok else 0) for i, (k, ok) in enumerate(zip(checks, passed))]
    title = f"verify-comm: {cluster.name} ({cluster.platform_info.name}, {len(doc['nodes'])} nodes)"
    t = report.table(title, cols, _node_rows(doc, checks, True), con=con, hint="every node passes them")
    if report.fits(con, t):
        return t, False
    return report.table(title, cols, _node_rows(doc, checks, False), con=con, hint="every node passes them"), True


def _print(con: Console, cluster: Cluster, doc: dict) -> None:
    t, below = nodes_table(con, cluster, doc)
    con.print(t)
    for host, v in doc["nodes"].items() if below else ():
        for k, c in v.get("checks", {}).items():
            for x in [] if c["ok"] else c["failures"][:4]:
                con.print(Padding(f"[red]{host} {escape(k)}: {escape(x)}[/]", (0, 0, 0, 2), expand=False))
            if not c["ok"] and len(c["failures"]) > 4:
                con.print(Padding(f"[red]{host} {escape(k)}: (+{len(c['failures']) - 4} more; --json lists all)[/]", (0, 0, 0, 2), expand=False))
    links = doc.get("links")
    if links is not None:
        con.print(f"NPU pings ({doc['plan']} plan): {links['planned'] - len(links['failed'])}/{links['planned']} without loss")
        for x in links["failed"][:50]:
            con.print(f"  [red]{x['from']}/npu{x['npu']} → {x['to']}/npu{x['to_npu']}: {escape(x['reason'])}[/]")
        if len(links["failed"]) > 50:
            con.print(f"  (+{len(links['failed']) - 50} more failing links; --json lists all)")
    hosts = doc.get("host_links")
    if hosts is not None:
        from roles.comm import pair_name

        con.print(f"host network (serving NIC, ping + full-MTU don't-fragment ping): {hosts['planned'] - len(hosts['failed'])}/{hosts['planned']} pairs pass")
        for x in hosts["failed"][:50]:
            con.print(f"  [red]{escape(pair_name(x))}: {escape(x['reason'])}[/]")
        if len(hosts["failed"]) > 50:
            con.print(f"  (+{len(hosts['failed']) - 50} more failing pairs; --json lists all)")
    perf = doc.get("all_reduce")
    if perf is not None:
        style = "green" if perf["ok"] else "bold red"
        said = "ok" if perf["ok"] else "; ".join(perf["failures"])
        if perf["max_busbw"] is None:
            con.print(f"all_reduce_perf: [{style}]{escape(said)}[/]")
        else:
            con.print(f"all_reduce_perf: busbw {perf['max_busbw']} GB/s (avg {perf['avg_busbw']}), out of bounds {perf['out_of_bounds']}: [{style}]{escape(said)}[/]")
    verdict = "[bold green]communication healthy[/]" if doc["ok"] else "[bold red]communication FAILED[/]"
    con.print(f"{verdict}; report saved on {cluster.node0.name}:{report_path(cluster)}")


def last_report_script(cluster: Cluster) -> str:
    from roles.files import read_script

    return read_script(report_path(cluster))


def gate(cluster: Cluster, text: str, force: bool, now: float | None = None) -> tuple[bool, str]:
    """May deploy proceed given node 0's last verification? (ok, what to say)."""
    max_age = cluster.verify.max_age_s
    try:
        doc = json.loads(text) if text.strip() else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        doc = None
    if doc is None:
        return True, f"no verify-comm report on {cluster.node0.name}: communication was not verified (run invoke verify-comm --cluster {cluster.name})"
    try:
        age = (now or time.time()) - float(doc.get("epoch", 0))
    except (TypeError, ValueError):
        age = None
    if age is None or age != age or age in (float("inf"), float("-inf")):
        return force, ("the last verify-comm report has no readable time (epoch): "
                       + ("deploying anyway (--force)" if force else f"run invoke verify-comm --cluster {cluster.name}, or deploy with --force"))
    problems = []
    if not doc.get("ok"):
        problems.append(f"the last verify-comm ({doc.get('time')}) FAILED")
    if max_age is not None and age > max_age:
        problems.append(f"the last verify-comm ({doc.get('time')}) is {int(age)}s old (verify.max_age_s {max_age:g})")
    if not problems:
        return True, f"communication verified at {doc.get('time')}"
    if force:
        return True, "; ".join(problems) + ": deploying anyway (--force)"
    return False, "; ".join(problems) + f": run invoke verify-comm --cluster {cluster.name}, or deploy with --force"
