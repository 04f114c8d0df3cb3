"""``invoke stage``: the model (and tokenizer) onto every node in the time of
one copy, as a pipelined broadcast over the data network (``roles.stage``
says why a chain and why plain TCP).

1. scan: every node (and the source) lists what it has; the source hashes
   what its cache does not vouch for, and each node the files of the source's
   size, so a node skips what it has already (same size and sha256);
2. plan: what the stream carries (a partial file left by an interrupted
   stage resumes from the shortest one), what each node writes, and whether
   it has the room: a node without it is named before anything moves;
3. relay: every link of the chain at once; each node writes and forwards
   what it receives, and verifies each file's sha256 before it takes its
   name;
4. a node that fails mid-stream is named and left out; the nodes behind it
   get the rest from a new chain that routes around it (their partial files
   resume), and the run exits 1;
5. record: the manifest (name, size, sha256 of every file) on every node
   that has all of it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.markup import escape
from rich.table import Table

import roles.stage as st
from flows.plan import select_nodes
from llmdeploy import report
from llmdeploy.errors import LlmdeployError
from flows.binding import load
from llmdeploy.deployment import Deployment
from llmdeploy.inventory import Cluster, Node
from llmdeploy.runner import FAILED, OK, HostResult, Runner, Step
from roles import progress_line
from roles.model import paths as model_paths

# the relay step runs as long as the copy takes; the agents end themselves
# when their stream stalls (stage.idle_timeout_s)
RELAY_TIMEOUT_S = 14 * 86400
SCAN_TIMEOUT_S = 600
# hashing a checkpoint reads it whole: hours for terabytes
HASH_TIMEOUT_S = 2 * 86400


@dataclass
class Outcome:
    """What a stage did: the plan it started from, per node what it wrote,
    skipped and why it failed, the bytes the source sent, and the time."""

    cluster: str
    source: str
    plan: st.StagePlan | None = None
    check: bool = False
    failed: dict[str, str] = field(default_factory=dict)  # node -> why
    written: dict[str, int] = field(default_factory=dict)  # node -> bytes written
    verified: dict[str, int] = field(default_factory=dict)  # node -> files verified on arrival
    sent: int = 0  # bytes the source sent, over every pass
    passes: int = 0
    seconds: float = 0.0
    recorded: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed and (self.plan is None or not self.plan.problems())

    def as_json(self, link_mbit: float | None) -> dict:
        return {
            "cluster": self.cluster,
            "source": self.source,
            "check": self.check,
            "ok": self.ok,
            "plan": self.plan.as_json(link_mbit) if self.plan else None,
            "sent_bytes": self.sent,
            "passes": self.passes,
            "seconds": round(self.seconds, 3),
            "nodes": {
                name: {"written_bytes": self.written.get(name, 0), "verified_files": self.verified.get(name, 0),
                       "failed": self.failed.get(name), "recorded": name in self.recorded}
                for name in (self.plan.nodes if self.plan else {})
            },
            "failed": self.failed,
        }


def _dirs(cluster: Cluster, source) -> list[tuple[str, str]]:
    """(path on the source, path on the nodes): the model directory and the
    tokenizer's when it is elsewhere (one inside the other is staged once)."""
    node_paths = list(model_paths(cluster))
    node_paths = [p for p in node_paths if not any(p != q and p.startswith(q.rstrip("/") + "/") for q in node_paths)]
    out = []
    for p in node_paths:
        src = p
        if source is not None and not isinstance(source, Node):
            if p == cluster.model.path and source.path:
                src = source.path
            elif p == cluster.model.tokenizer_path and source.tokenizer_path:
                src = source.tokenizer_path
        out.append((src, p))
    return out


def resolve_source(cluster: Cluster, frm: str | None) -> tuple[Node, object]:
    """The source as a node of the runner's, and what the inventory says of
    it (the Node, or the stage.source host)."""
    name = frm or cluster.model.stage_from or cluster.node0.name
    names = [n.name for n in cluster.nodes]
    if name in names:
        node = cluster.node(name)
        return node, node
    src = cluster.stage.source
    if src is not None and name in ("source", src.name):
        return src.as_node(), src
    where = "--from" if frm else "model.stage_from"
    extra = f" or {src.name!r} (stage.source)" if src is not None else " (declare a host that is not a node in stage.source)"
    raise LlmdeployError(f"{where} {name!r}: no such node in {cluster.name} ({', '.join(names[:6])}{', ...' if len(names) > 6 else ''}){extra}")


def _agent_step(cluster: Cluster, name: str, mode: str, orders: dict[str, str], timeout: float, *, upstream_ok: bool = False) -> Step:
    """A step that runs the agent on each node that has orders; its answer is the result's data."""

    def parse(node: Node, out: str, err: str, code: int) -> HostResult:
        doc = st.parse_answer(out)
        if code == 0 and doc is not None:
            return HostResult(node.name, OK, data=doc, exit_code=code)
        if upstream_ok and code == st.EXIT_UPSTREAM and doc is not None:
            return HostResult(node.name, OK, msg="upstream", data=doc, exit_code=code)
        why = (doc or {}).get("error") or _failed_files(doc) or (err.strip().splitlines() or [f"exit {code}"])[-1]
        return HostResult(node.name, FAILED, msg=f"{mode}: {why}", data=doc, exit_code=code)

    return Step(
        name=name,
        build=lambda node: st.agent_command(mode, st.mark(cluster)) if node.name in orders else None,
        stdin=lambda node: orders.get(node.name),
        parse=parse,
        timeout=timeout,
        progress=progress_line,
    )


def _failed_files(doc: dict | None) -> str:
    failed = (doc or {}).get("failed") or {}
    if not failed:
        return ""
    first = next(iter(failed.items()))
    more = f" (+{len(failed) - 1} more)" if len(failed) > 1 else ""
    return f"{first[0].split('/', 1)[-1]}: {first[1]}{more}"


def run(dep: Deployment, con: Console, frm: str | None = None, check: bool = False, quiet: bool = False,
        limit: str | None = None) -> Outcome:
    """Stage the checkpoint onto every node of the cluster (see the module), or
    the nodes ``limit`` names (the source may be outside it)."""
    cluster = dep.cluster
    src_node, source = resolve_source(cluster, frm)
    dirs = _dirs(cluster, source)
    chosen = {n.name for n in select_nodes(cluster, limit)}
    targets = [n for n in cluster.nodes if n.name != src_node.name and n.name in chosen]
    out = Outcome(cluster.name, src_node.name, check=check)
    t0 = time.monotonic()
    with report.host_progress(con, len(targets) + 1, enabled=not quiet) as cb, \
            dep.runner(nodes=[src_node, *targets], progress=cb, lines=cb.line) as runner:
        # the source: what it has, and every file's sha256 (its cache keeps them between stages)
        res = runner.run(_agent_step(cluster, "stage.scan", "scan", {src_node.name: st.scan_orders(cluster, [s for s, _ in dirs])},
                                     SCAN_TIMEOUT_S), [src_node])
        src_scan = _answer(res, src_node, "scan")
        src_sizes, problems = st.source_files(dirs, src_scan)
        if problems:
            raise LlmdeployError(f"stage source {src_node.name}: " + "; ".join(problems))
        need_hash = st.to_hash(dirs, src_sizes, src_scan, on_source=True)
        src_sums = dict(src_scan.get("sums") or {})
        if need_hash:
            res = runner.run(_agent_step(cluster, "stage.sha256", "hash", {src_node.name: st.hash_orders(cluster, need_hash)},
                                         HASH_TIMEOUT_S), [src_node])
            src_sums.update(_answer(res, src_node, "sha256").get("sums") or {})
        live = list(targets)
        while True:
            p = _plan(cluster, runner, dirs, src_node, src_scan, src_sums, live, out)
            live = [n for n in live if n.name not in out.failed]
            if out.plan is None:
                out.plan = p
            else:  # a later pass: the first plan stays what was asked; the per-node figures add up
                for name, np in p.nodes.items():
                    out.plan.nodes[name].problems = np.problems
            if check or p.problems() or not p.order:
                break
            chain_nodes = [src_node, *[cluster.node(n) for n in p.order]]
            upstream = _relay(cluster, runner, p, chain_nodes, dirs, out)
            out.passes += 1
            if not upstream:
                break
            # the nodes behind a failed one: a new chain from the source, resuming their partial files
            live = [n for n in live if n.name not in out.failed]
            if out.passes > len(targets):
                for name in upstream:
                    out.failed.setdefault(name, "its stream ended early on every pass")
                break
        if not check and not (out.plan and out.plan.problems()):
            _record(cluster, runner, src_node, out)
    out.seconds = time.monotonic() - t0
    return out


def _answer(res: dict[str, HostResult], node: Node, what: str) -> dict:
    r = res[node.name]
    if r.failed or not isinstance(r.data, dict):
        raise LlmdeployError(f"stage source {node.name}: {what} failed: {r.msg or 'no answer'}")
    return r.data


def _plan(cluster: Cluster, runner: Runner, dirs, src_node: Node, src_scan: dict, src_sums: dict, live: list[Node],
          out: Outcome) -> st.StagePlan:
    """Scan and hash the live nodes, then plan; a node that cannot be read is named and left out."""
    node_dirs = [d for _, d in dirs]
    res = runner.run(_agent_step(cluster, "stage.scan", "scan", {n.name: st.scan_orders(cluster, node_dirs) for n in live},
                                 SCAN_TIMEOUT_S), live)
    scans = {}
    for n in live:
        r = res[n.name]
        if r.failed:
            out.failed[n.name] = r.msg
        else:
            scans[n.name] = r.data
    src_sizes, _ = st.source_files(dirs, src_scan)
    hashes = {n: st.to_hash(dirs, src_sizes, scans[n], on_source=False) for n in scans}
    orders = {n: st.hash_orders(cluster, files) for n, files in hashes.items() if files}
    sums = {n: dict(scans[n].get("sums") or {}) for n in scans}
    if orders:
        hosts = [cluster.node(n) for n in orders]
        res = runner.run(_agent_step(cluster, "stage.sha256", "hash", orders, HASH_TIMEOUT_S), hosts)
        for name in orders:
            r = res[name]
            if r.failed:
                out.failed[name] = r.msg
                scans.pop(name, None)
            else:
                sums[name].update((r.data or {}).get("sums") or {})
    order = [n.name for n in live if n.name in scans]
    return st.plan(dirs, src_node.name, src_scan, src_sums, scans, sums, order)


def _relay(cluster: Cluster, runner: Runner, p: st.StagePlan, chain: list[Node], dirs, out: Outcome) -> list[str]:
    """One pass of the chain; the nodes whose stream ended early through no
    fault of theirs (they go again), after the failed ones are named."""
    token = st.new_token()
    s = cluster.stage
    orders = {}
    for i, node in enumerate(chain):
        roots = [src if i == 0 else dst for src, dst in dirs]
        orders[node.name] = st.relay_orders(cluster, p, chain, i, roots, token, s.port, s.connect_timeout_s, s.idle_timeout_s)
    res = runner.run(_agent_step(cluster, "stage.relay", "relay", orders, RELAY_TIMEOUT_S, upstream_ok=True), chain)
    src = chain[0]
    r = res[src.name]
    doc = r.data if isinstance(r.data, dict) else {}
    out.sent += int(doc.get("forwarded", 0) or 0)
    if r.failed and not doc.get("downstream"):
        raise LlmdeployError(f"stage source {src.name}: {r.msg}")
    upstream = []
    for node in chain[1:]:
        r = res[node.name]
        d = r.data if isinstance(r.data, dict) else {}
        out.written[node.name] = out.written.get(node.name, 0) + int(d.get("written", 0) or 0)
        out.verified[node.name] = out.verified.get(node.name, 0) + len(d.get("verified") or [])
        if r.failed:
            out.failed[node.name] = r.msg or f"exit {r.exit_code}"
        elif r.exit_code == st.EXIT_UPSTREAM:
            upstream.append(node.name)
    # who broke the chain: the first node after a sender that lost its next one
    return [n for n in upstream if n not in out.failed]


def _record(cluster: Cluster, runner: Runner, src_node: Node, out: Outcome) -> None:
    """The manifest on every node that has every file (and on the source)."""
    p = out.plan
    assert p is not None  # run() plans before it records
    doc = json.dumps({"cluster": cluster.name, "source": src_node.name, "staged_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      "files": p.manifest}, indent=1, sort_keys=True) + "\n"
    names = [n for n in p.nodes if n not in out.failed]
    if not names:
        return
    step = Step(name="stage.record", build=lambda node: st.record_command(cluster), stdin=lambda node: doc)
    res = runner.run(step, [cluster.node(n) for n in names])
    for n, r in res.items():
        if r.failed:
            out.failed[n] = f"record: {r.msg}"
        else:
            out.recorded.append(n)


# --- the command ------------------------------------------------------------
def stage(cluster_name: str, frm: str | None = None, check: bool = False, json_out: bool = False, message: str | None = None,
          lock_wait: float = 0) -> int:
    """``invoke stage``: under the deploy lock unless ``check``."""
    con = report.console(json_out)
    dep = load(cluster_name)
    cluster = dep.cluster
    if check:
        out = run(dep, con, frm, check=True, quiet=json_out)
        return show(con, cluster, out, json_out)
    from llmdeploy import lock

    with contextlib.ExitStack() as stack:
        holder_runner = stack.enter_context(dep.runner(nodes=[cluster.node0]))
        held = stack.enter_context(lock.held(holder_runner, cluster, "stage", message, lock_wait))
        try:
            out = run(dep, con, frm, quiet=json_out)
        except KeyboardInterrupt:
            with report.shielded():
                lock.audit(holder_runner, cluster, "stage", "interrupted", None, message=message or "")
                print(f"stage interrupted: what was sent is kept and not sent again; the deploy lock is released; "
                      f"to finish: invoke stage --cluster {cluster.name}", file=sys.stderr)
            raise
        status = show(con, cluster, out, json_out)
        lock.audit(holder_runner, cluster, "stage", "good" if status == 0 else "failed", None, held=held, message=message or "")
        return status


def show(con: Console, cluster: Cluster, out: Outcome, json_out: bool) -> int:
    """The plan (``--check``) or what was done, as a table or JSON; the exit status."""
    status = 0 if out.ok else 1
    link = cluster.stage.link_mbit
    if json_out:
        report.emit_json(out.as_json(link))
        return status
    p = out.plan
    assert p is not None  # run() always plans at least once
    size = st.size_text
    con.print(f"[bold]stage {escape(cluster.name)}[/]: from {escape(out.source)}, {size(p.total_bytes)} in "
              f"{sum(len(f) for f in p.manifest.values())} files" + (" (check mode: nothing is moved)" if out.check else ""))
    if out.check:
        chain = " -> ".join([out.source, *p.order]) if p.order else "nothing to send"
        con.print(f"  chain: {escape(chain)}")
        eta = p.expected_s(link)
        speed = f"{size(p.stream_bytes)} down the chain" + (f", about {report.clock(eta)} at {link:g} Mbit/s (stage.link_mbit)" if eta else
                                                              " (set stage.link_mbit for the expected time)")
        con.print(f"  {escape(speed)}")
    t = Table(show_edge=False, title_justify="left")
    for c in ("node", "skip", "write", "bytes", "kept", "result"):
        t.add_column(c, no_wrap=c in ("node", "bytes"), justify="right" if c in ("skip", "write", "bytes", "kept") else "left")
    for name, np in p.nodes.items():
        if np.problems:
            result = f"[red]{escape('; '.join(np.problems))}[/]"
        elif name in out.failed:
            result = f"[red]failed: {escape(out.failed[name])}[/]"
        elif out.check:
            result = "would write" if np.need else "has it all"
        else:
            result = "[green]verified[/]" + (f", {len(np.extra)} extra file(s) left alone" if np.extra else "")
        written = out.written.get(name, np.write_bytes if out.check else 0)
        t.add_row(escape(name), str(np.skip), str(len(np.need)), size(written), size(np.kept_bytes), result)
    for name, why in out.failed.items():
        if name not in p.nodes:
            t.add_row(escape(name), "", "", "", "", f"[red]failed: {escape(why)}[/]")
    con.print(t)
    if not out.check:
        rate = report.rate_text(out.sent / out.seconds if out.seconds else None, report.BYTES) or "no rate"
        con.print(f"sent {size(out.sent)} from {escape(out.source)} in {out.seconds:.1f}s ({rate}), {out.passes} pass(es)")
    if p.problems():
        con.print("[bold red]nothing was moved[/]: " + escape("; ".join(p.problems())))
    elif out.failed:
        con.print(f"[bold red]FAILED[/] on {escape(', '.join(out.failed))}; the others have every file, verified")
    return status


# --- the image, the same way ------------------------------------------------
@dataclass
class ImageOutcome:
    """``image.distribute``: who had the image, who got it down the chain, who failed."""

    source: str | None = None
    via: str | None = None  # what the chain carried: "registry", "docker save", "tarball"
    had: list[str] = field(default_factory=list)
    got: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    pulled: bool = False  # the source pulled it with docker first (the registry could not be read directly)
    fallback: str | None = None  # why it did
    sent: int = 0
    seconds: float = 0.0
    ref: str | None = None  # the image sent, when not the inventory's (the image with the wheels)
    built: str | None = None  # the node that built it first (the wheels' one pip install)
    # node -> {"stream_s": its agent's start to the stream's last byte there,
    # "sink_s": docker load after that}, from the pass that reached it (a node
    # reached on a second pass counts from that pass's start)
    timings: dict[str, dict[str, float]] = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"source": self.source, "via": self.via, "had": self.had, "got": self.got, "failed": self.failed, "pulled": self.pulled,
                "fallback": self.fallback, "sent_bytes": self.sent, "seconds": round(self.seconds, 3), "timings": self.timings,
                **({"ref": self.ref, "built": self.built} if self.ref else {})}

    def said(self) -> str:
        """What happened, in one line for people."""
        if self.built and not self.got:
            return f"built on {self.built}"
        if not self.source:
            return f"present on all {len(self.had)} node(s)"
        first = f"built on {self.built}, then " if self.built else ""
        pulled = f" after one docker pull there ({self.fallback or ''})" if self.pulled else ""
        return f"{first}{len(self.got)} node(s) got it from {self.source} ({self.via or ''}){pulled}"


def distribute_image(dep: Deployment, con: Console, quiet: bool = False, limit: str | None = None) -> ImageOutcome:
    """The image onto every node that lacks it, in one chain:

    - from a node that has it: ``docker save`` there, down the chain;
    - else from the tarball (``image.tarball``) on node 0, as it is;
    - else node 0 reads it from its registry (the agent's ``export``: the
      layers as the registry keeps them, one pull's bytes) and loads it itself
      while it sends it on; where the registry cannot be read as docker would
      (a credential helper, say), node 0 pulls it with docker and saves it.

    Every receiving node feeds ``docker load``; prepare's image step then
    finds the image present everywhere and compares the image IDs."""
    cluster = dep.cluster
    out = ImageOutcome()
    t0 = time.monotonic()
    chosen = list(select_nodes(cluster, limit))
    with report.host_progress(con, len(chosen), enabled=not quiet) as cb, \
            dep.runner(nodes=chosen, progress=cb, lines=cb.line) as runner:
        lacking = _who_lacks(runner.run(_probe("image.distribute", dep), chosen), chosen, out)
        if out.failed or not lacking:
            return _done(out, t0)
        if out.had:
            src, source, loads = cluster.node(out.had[0]), st.save_source(cluster), False
        else:  # nobody has it: node 0 (or the first chosen node) gets it once, and loads it while it sends it
            src = cluster.node0 if cluster.node0 in chosen else chosen[0]
            source = st.tarball_source(cluster) if cluster.image.tarball else st.registry_source(cluster)
            loads = True
        while True:
            code = _image_chain(cluster, runner, src, source, loads, [n for n in lacking if n.name != src.name], out)
            if code != UNSUPPORTED:
                break
            # the registry cannot be read here as docker would: one docker pull on the source, then its saved image
            r = runner.run(_image_step("image.pull", dep), [src])[src.name]
            if r.failed:
                out.failed[src.name] = r.msg
                break
            out.pulled = True
            source, loads = st.save_source(cluster), False
    return _done(out, t0)


def distribute_wheels(dep: Deployment, con: Console, quiet: bool = False, limit: str | None = None) -> ImageOutcome | None:
    """The image with the pinned wheels (``roles.wheels``), once for the
    cluster: built on one node (node 0, or a node that has it already, then
    no build at all) with the one pip install, and sent down the chain of the
    nodes that lack it, so that every node holds the same image. prepare's
    wheels step then finds it on every node, checks the versions in it and
    compares the nodes'.

    Docker's derived image travels as ``docker save`` into ``docker load``
    (the same image ID everywhere); a runtime that keeps its own as files
    (``UnitRuntime.wheels_files``: pyxis's squashfs and its versions) sends
    those, written whole or not at all on each node (``stage.files_sink``).

    None: nothing for it to do here, and the wheels step does it all (the
    profile pins no wheels; one node)."""
    from roles import wheels

    cluster = dep.cluster
    w = wheels.spec(cluster)
    chosen = list(select_nodes(cluster, limit))
    if w is None or len(chosen) < 2:
        return None
    rt = dep.runtime
    own = rt.wheels_script(w, True) is not None
    out = ImageOutcome(ref=None if own else wheels.derived_ref(cluster))
    t0 = time.monotonic()
    with report.host_progress(con, len(chosen), enabled=not quiet) as cb, \
            dep.runner(nodes=chosen, progress=cb, lines=cb.line) as runner:
        probe = _wheels_step(dep, True) if own else _probe("wheels.distribute", dep, out.ref)
        found = runner.run(probe, chosen)
        lacking = _who_lacks(found, chosen, out)
        if out.failed or not lacking:
            return _done(out, t0)
        if out.had:
            src = cluster.node(out.had[0])
            serving = (found[src.name].data or {}).get("serving_ref")
        else:
            src = cluster.node0 if cluster.node0 in chosen else chosen[0]
            serving = _build_wheels_on(dep, runner, src, out)
            if serving is None:
                return _done(out, t0)
            lacking = [n for n in lacking if n.name != src.name]
        if own:
            files = rt.wheels_files(str(serving or ""))
            out.ref = serving
            source, sink = st.files_source(files), st.files_sink(files)
        else:
            source, sink = st.save_source(cluster, out.ref), st.LOAD
        if lacking:
            _image_chain(cluster, runner, src, source, False, lacking, out, sink=sink)
    return _done(out, t0)


def _wheels_step(dep: Deployment, check: bool = False) -> Step:
    """prepare's wheels step on the nodes given (``check``: what a node has, read-only)."""
    from roles import wheels

    cluster = dep.cluster
    return Step(name="wheels.distribute" if check else "wheels", build=lambda node: wheels.build(dep, check),
                parse=lambda node, o, e, c: _wheels_had(wheels.parse(cluster, node, o, e, c)) if check else wheels.parse(cluster, node, o, e, c),
                timeout=None if check else max(cluster.ssh.command_timeout, 1800.0),
                progress=None if check else progress_line)


def _wheels_had(r: HostResult) -> HostResult:
    """A node's read-only wheels step as an image probe reads: ``id`` (here
    the file its units run) when it has the image with the wheels."""
    data = dict(r.data or {})
    if data.get("state") == "present" and data.get("serving_ref"):
        data["id"] = data["serving_ref"]
    else:
        data.pop("id", None)
    return HostResult(r.host, r.status, msg=r.msg, data=data, exit_code=r.exit_code)


def _build_wheels_on(dep: Deployment, runner: Runner, src: Node, out: ImageOutcome) -> str | None:
    """The base image on ``src`` (prepare's image step has it everywhere
    else, after), then the wheels' one pip install there: what its units
    run (the runtime's file, or Docker's derived image), None when it failed
    (``out.failed`` names the node and why)."""
    from roles import wheels

    for step in (_image_step("image", dep), _wheels_step(dep)):
        r = runner.run(step, [src])[src.name]
        if r.failed:
            out.failed[src.name] = r.msg
            return None
    out.built = src.name
    out.had.append(src.name)
    return (r.data or {}).get("serving_ref") or wheels.derived_ref(dep.cluster)


def _image_step(name: str, dep: Deployment) -> Step:
    """The inventory's image onto one node, pulled (or loaded from its tarball), with its progress."""
    from roles import image as image_role

    cluster = dep.cluster
    return Step(name=name, build=lambda node: image_role.build(dep), parse=lambda node, o, e, c: image_role.parse(cluster, node, o, e, c),
                timeout=max(cluster.ssh.command_timeout, 3600.0), progress=progress_line)


def _probe(name: str, dep: Deployment, ref: str | None = None) -> Step:
    """Is the image (the inventory's, or ``ref`` in Docker) on the node: its
    ID when it is; a node without it says nothing and exits 0."""
    from roles import image as image_role

    cluster = dep.cluster

    def parse(node: Node, o: str, e: str, c: int) -> HostResult:
        if image_role.MARK in o:
            return image_role.parse_ref(ref or cluster.image.ref, node, o, e, c)
        return HostResult(node.name, OK if c == 0 else FAILED, msg="" if c == 0 else (e.strip() or f"exit {c}"), exit_code=c)

    return Step(name=name, build=lambda node: image_role.probe(dep, node, ref), parse=parse)


def _who_lacks(res: dict[str, HostResult], chosen: list[Node], out: ImageOutcome) -> list[Node]:
    """From an image probe's results: who has it (``out.had``), who could
    not be read (``out.failed``), and the nodes that lack it."""
    lacking = []
    for n in chosen:
        r = res[n.name]
        if r.failed:
            out.failed[n.name] = r.msg
        elif isinstance(r.data, dict) and r.data.get("id"):
            out.had.append(n.name)
        else:
            lacking.append(n)
    return lacking


UNSUPPORTED = "unsupported"


def _image_chain(cluster: Cluster, runner: Runner, src: Node, source: st.ImageSource, loads: bool, lacking: list[Node],
                 out: ImageOutcome, sink: list[str] = st.LOAD) -> str | None:
    """Send the image from ``src`` down the chain of ``lacking`` into each
    one's ``sink`` (again around a node that fails, to the ones behind it);
    UNSUPPORTED when the source cannot read the registry and nothing was sent."""
    out.source, out.via = src.name, source.what
    first = True
    while lacking or (first and loads):
        chain = [src, *lacking]
        token = st.new_token()
        orders = {n.name: st.pipe_orders(cluster, chain, i, token, source, sink, source_loads=loads and first)
                  for i, n in enumerate(chain)}
        res = runner.run(_agent_step(cluster, "image.stream", "pipe", orders, RELAY_TIMEOUT_S, upstream_ok=True), chain)
        r = res[src.name]
        doc = r.data if isinstance(r.data, dict) else {}
        out.sent += int(doc.get("forwarded", 0) or 0)
        for n in chain:
            d = res[n.name].data if isinstance(res[n.name].data, dict) else {}
            if "stream_s" in d and (n.name != src.name or (loads and first)):
                out.timings[n.name] = {k: float(d[k]) for k in ("stream_s", "sink_s") if k in d}
        if doc.get("unsupported"):
            out.fallback = doc["unsupported"]
            return UNSUPPORTED
        if loads and first:
            if doc.get("sink") and not doc.get("downstream"):
                out.failed[src.name] = f"{source.what}: {doc['sink']}"
                return None
            out.got.append(src.name)
        elif r.failed and not doc.get("downstream"):
            out.failed[src.name] = r.msg
            return None
        first = False
        again = []
        for n in lacking:
            rn = res[n.name]
            d = rn.data if isinstance(rn.data, dict) else {}
            if rn.failed:
                out.failed[n.name] = f"{'docker load' if sink == st.LOAD else 'writing the files'}: {d['sink']}" if d.get("sink") else rn.msg
            elif rn.exit_code == st.EXIT_UPSTREAM:
                again.append(n)
            else:
                out.got.append(n.name)
        if again and len(again) == len(lacking):  # nobody got further: the source's own link is down
            for n in again:
                out.failed[n.name] = "the stream never reached it"
            return None
        lacking = again
        # a second pass: the head has the image now (it loaded it), so it saves what it has
        if again and loads:
            source, loads = st.save_source(cluster), False
    return None


def _done(out: ImageOutcome, t0: float) -> ImageOutcome:
    out.seconds = time.monotonic() - t0
    return out
