"""``invoke deploy``: prepare, then start serving in the seed's order, as a
recorded release.

1. render each node's release files (environment, serve command, container
   command) and a release id from their hash and the image digest;
2. write them under ``releases/<id>/`` on every node; ledger line ``started``;
3. stop what the previous release left running (workers first, then node 0),
   keeping its logs in its own release directory;
4. start node 0, wait for its DP RPC port (failing early if it exits);
5. start every worker at once, and watch all of them: a worker that exits is
   started again with backoff, each attempt's log kept, its reason matched
   against the known failure signatures;
6. ready = ``/health`` 200, ``/v1/models`` lists the served name, and the
   seed's chat request answers 200 with a ``<think>`` block: HTTP goes
   through the SSH connection to node 0 (no other route needed);
7. ``current`` -> the release on every node, ledger ``good``, a summary.

On failure: a log bundle from every node, ledger ``failed``, and the new
release's containers stopped (the cluster is left stopped, and says so).
"""

from __future__ import annotations

import http.client
import json
import shlex
import time
from dataclasses import dataclass, field

import paramiko
from rich.console import Console
from rich.markup import escape

from . import logs, report
from .errors import LlmdeployError
from .inventory import Cluster, Node
from .release import (
    append_script,
    content_hash,
    new_id,
    ledger_path,
    ledger_record,
    release_dir,
    set_current_script,
    write_script,
)
from .runner import HostResult, Runner, Step

CHAT_PROMPT = "Write a Python function to merge two sorted linked lists."


@dataclass
class NodePlan:
    host: str
    role: str
    start_rank: int
    env: dict[str, str]
    env_text: str
    serve_command: str
    container_command: str
    container: str
    image: str

    def as_json(self, secrets: list[str]) -> dict:
        from roles.files import mask

        return {
            "host": self.host,
            "role": self.role,
            "start_rank": self.start_rank,
            "env": {k: ("***" if v in secrets and v else v) for k, v in self.env.items()},
            "container": self.container,
            "image": self.image,
            "container_command": mask(self.container_command, secrets),
            "serve_command": mask(self.serve_command, secrets),
        }


@dataclass
class Outcome:
    ok: bool
    release: str
    reason: str = ""
    where: str = ""
    bundle: str = ""
    phases: dict[str, float] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)


def env_file(cluster: Cluster, rid: str) -> str:
    return f"{release_dir(cluster, rid)}/env"


def plan(cluster: Cluster, rid: str, prepared: dict[str, dict]) -> list[NodePlan]:
    """Per node: what the release runs. Pure: inventory + prepare's records."""
    from roles import commenv, serve, wheels

    out = []
    for n in cluster.nodes:
        rec = prepared.get(n.name) or {}
        image = (rec.get("image") or {}).get("serving_ref") or wheels.serving_ref(cluster)
        out.append(
            NodePlan(
                host=n.name,
                role=cluster.role_of(n),
                start_rank=n.start_rank,
                env=commenv.env_vars(cluster, n),
                env_text=commenv.render(cluster, n),
                serve_command=serve.serve_command(cluster, n),
                container_command=serve.container_command(cluster, n, rid, env_file(cluster, rid), image),
                container=serve.container_name(cluster, rid),
                image=image,
            )
        )
    return out


DRAFT_ID = "00000000T000000Z-00000000"


def plan_release(cluster: Cluster, prepared: dict[str, dict], image_key: str) -> tuple[str, str, list[NodePlan]]:
    """(release id, content hash, per-node plan): the id is the time plus a
    hash of what every node runs and of the image (``image_key``)."""
    draft = plan(cluster, DRAFT_ID, prepared)
    chash = content_hash([image_key] + [x for p in draft for x in (p.env_text, p.serve_command, p.container_command)])
    rid = new_id(chash)
    return rid, chash, plan(cluster, rid, prepared)


def release_files(cluster: Cluster, p: NodePlan, rid: str, image_id: str | None) -> dict[str, tuple[str, int]]:
    from roles import commenv

    meta = {"release": rid, "cluster": cluster.name, "host": p.host, "role": p.role, "start_rank": p.start_rank,
            "container": p.container, "image": p.image, "image_id": image_id,
            "command": shlex.split(p.serve_command)}
    return {
        "env": (p.env_text, commenv.env_mode(cluster)),
        "serve.sh": ("#!/bin/sh\n# what the container runs (for people; run.sh starts it)\nexec " + p.serve_command + "\n", 0o755),
        "run.sh": ("#!/bin/sh\n# start this node's serving container for release " + rid + "\nset -e\n" + p.container_command + "\n", 0o755),
        "release.json": (json.dumps(meta, indent=1, sort_keys=True) + "\n", 0o644),
    }


# --- remote scripts ---------------------------------------------------------------------------
def prepared_script(cluster: Cluster) -> str:
    from roles import record

    return f"cat {shlex.quote(record.prepared_path(cluster))} 2>/dev/null; true\n"


def parse_prepared(out: str) -> dict | None:
    try:
        return json.loads(out) if out.strip() else None
    except ValueError:
        return None


def stop_script(cluster: Cluster, keep_release: str | None, timeout: int) -> str:
    """Stop and remove this cluster's containers except ``keep_release``'s,
    saving each one's log into its own release directory first."""
    q = shlex.quote
    rel_root = q(f"{cluster.base_dir}/{cluster.name}/releases")
    keep = q(keep_release or "")
    return (
        f"docker ps -a --filter label=llmdeploy.cluster={q(cluster.name)} --format '{{{{.Names}}}} {{{{.Label \"llmdeploy.release\"}}}}' | "
        "while read -r name rel; do "
        f'[ "$rel" = {keep} ] && continue; '
        f'd={rel_root}/"$rel"/logs; mkdir -p "$d"; '
        'docker logs "$name" > "$d/$name.final.log" 2>&1; '
        f'docker stop -t {int(timeout)} "$name" >/dev/null 2>&1; docker rm -f "$name" >/dev/null 2>&1 && echo "stopped $name"; '
        "done; true\n"
    )


def stop_in_order(runner: Runner, cluster: Cluster, script: str, name: str, say) -> dict[str, HostResult]:
    """Run a stop script on the workers, then on node 0 (a worker outliving
    node 0 only waits for it); every line it prints goes to ``say``."""
    results: dict[str, HostResult] = {}
    for group in (cluster.nodes[1:], [cluster.node0]):
        if not group:
            continue
        res = runner.run(Step(name=name, build=lambda n: script, timeout=cluster.deploy.stop_timeout_s + 60), group)
        for h, r in res.items():
            for line in r.stdout.splitlines():
                say(f"  {h}: {escape(line)}")
        results.update(res)
    return results


def start_script(cluster: Cluster, rid: str, container: str, attempt: int) -> str:
    """(Re)start this node's container; the log of a previous attempt is kept."""
    q = shlex.quote
    d = release_dir(cluster, rid)
    return (
        f"if docker inspect {q(container)} >/dev/null 2>&1; then "
        f"docker logs {q(container)} > {q(f'{d}/logs/{container}.attempt-{attempt - 1}.log')} 2>&1; "
        f"docker rm -f {q(container)} >/dev/null; fi\n"
        f"sh {q(d + '/run.sh')}\n"
    )


def wait_port_script(container: str, ip: str, port: int, timeout: float) -> str:
    """Until ``ip:port`` accepts a connection; exit 3 as soon as the container is not running."""
    q = shlex.quote
    return (
        f"end=$(( $(date +%s) + {int(timeout)} ))\n"
        "while :; do\n"
        f"  st=$(docker inspect --format '{{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {q(container)} 2>/dev/null)\n"
        '  case "$st" in running*) ;; *) echo "container $st"; exit 3;; esac\n'
        f"  if timeout 2 bash -c {q(f'exec 3<>/dev/tcp/{ip}/{port}')} 2>/dev/null; then echo open; exit 0; fi\n"
        '  [ "$(date +%s)" -ge "$end" ] && { echo timeout; exit 4; }\n'
        "  sleep 1\n"
        "done\n"
    )


def inspect_script(container: str) -> str:
    return f"docker inspect --format '{{{{.State.Status}}}} {{{{.State.ExitCode}}}}' {shlex.quote(container)} 2>&1\n"


# --- HTTP to node 0 through its SSH connection -----------------------------------------------------
def http_via_ssh(runner: Runner, node: Node, port: int, method: str, path: str, body: dict | None, timeout: float) -> tuple[int, bytes]:
    """One HTTP request to ``127.0.0.1:port`` on ``node``, over a direct-tcpip
    channel of the runner's SSH connection to it."""
    conn = runner.connection(node)
    transport = conn.client.get_transport()
    chan = transport.open_channel("direct-tcpip", ("127.0.0.1", port), ("127.0.0.1", 0), timeout=timeout)
    chan.settimeout(timeout)
    hc = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    hc.sock = chan
    try:
        data = json.dumps(body).encode() if body is not None else None
        hc.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
        resp = hc.getresponse()
        return resp.status, resp.read()
    finally:
        hc.close()


def chat_request(served: str) -> dict:
    """The seed's functional check (stream, thinking on)."""
    return {
        "model": served,
        "messages": [{"role": "user", "content": CHAT_PROMPT}],
        "temperature": 1.0,
        "top_p": 0.95,
        "stream": True,
        "chat_template_kwargs": {"enable_thinking": True, "preserve_thinking": True},
    }


def chat_content(raw: bytes) -> str:
    """The text of a chat completion, streamed (SSE) or not."""
    text = raw.decode(errors="replace")
    if text.lstrip().startswith("{"):
        doc = json.loads(text)
        return "".join((c.get("message") or {}).get("content") or "" for c in doc.get("choices", []))
    out = []
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            doc = json.loads(line[5:])
            for c in doc.get("choices", []):
                out.append((c.get("delta") or {}).get("content") or "")
    return "".join(out)


# --- the sequence -------------------------------------------------------------------------------------
class Deployer:
    def __init__(self, cluster: Cluster, runner: Runner, con: Console, quiet: bool = False):
        self.c = cluster
        self.r = runner
        self.con = con
        self.quiet = quiet
        self.node0 = cluster.node0
        self.workers = list(cluster.nodes[1:])

    def say(self, msg: str) -> None:
        if not self.quiet:
            self.con.print(msg)

    def exec_all(self, name: str, build, nodes: list[Node] | None = None, timeout: float | None = None) -> dict[str, HostResult]:
        return self.r.run(Step(name=name, build=build, timeout=timeout), nodes if nodes is not None else list(self.c.nodes))

    def read_prepared(self) -> dict[str, dict | None]:
        """Each node's prepare record (None where there is none)."""
        res = self.exec_all("read prepare records", lambda n: prepared_script(self.c))
        bad = {h: r.msg for h, r in res.items() if r.failed}
        if bad:
            raise LlmdeployError("cannot read the nodes' prepare records: " + "; ".join(f"{h}: {m}" for h, m in bad.items()))
        return {h: parse_prepared(r.stdout) for h, r in res.items()}

    def ledger(self, record: dict) -> None:
        out, err, code = self.r.exec(self.node0, append_script(ledger_path(self.c), record))
        if code != 0:
            raise LlmdeployError(f"{self.node0.name}: cannot append to the ledger: {err.strip() or out.strip()}")

    def run(self, plans: list[NodePlan], rid: str, image_id: str | None, config_hash: str) -> Outcome:
        """Write the release, start it, and record it as good."""
        out = Outcome(ok=False, release=rid)
        if self.write(plans, rid, image_id, config_hash, out) and self.start(plans, rid, out):
            self.finish(rid, image_id, config_hash, out)
        return out

    def write(self, plans: list[NodePlan], rid: str, image_id: str | None, config_hash: str, out: Outcome) -> bool:
        c = self.c
        t0 = time.monotonic()
        by_host = {p.host: p for p in plans}
        # 1-2. files on every node, then the ledger
        res = self.exec_all("write release", lambda n: write_script(c, rid, release_files(c, by_host[n.name], rid, image_id)))
        failed = {h: r for h, r in res.items() if r.failed}
        if failed:
            h, r = next(iter(failed.items()))
            self._fail(out, h, f"writing the release files failed: {r.msg}")
            return False
        self.ledger(ledger_record(c, rid, "started", image_id, config_hash))
        out.phases["write"] = time.monotonic() - t0
        return True

    def finish(self, rid: str, image_id: str | None, config_hash: str, out: Outcome, **extra) -> None:
        """7. ``current`` -> the release everywhere; the ledger says good."""
        res = self.exec_all("set current", lambda n: set_current_script(self.c, rid))
        bad = {h: r.msg for h, r in res.items() if r.failed}
        if bad:
            self._fail(out, next(iter(bad)), f"could not set the current release: {next(iter(bad.values()))}")
            return
        self.ledger(ledger_record(self.c, rid, "good", image_id, config_hash, **extra))
        out.ok = True

    def start(self, plans: list[NodePlan], rid: str, out: Outcome) -> bool:
        """Stop what else runs, start ``rid`` in order, wait until it is ready."""
        c, d = self.c, self.c.deploy
        by_host = {p.host: p for p in plans}
        # 3. stop the previous release: workers first, then node 0
        t = time.monotonic()
        stop_in_order(self.r, c, stop_script(c, rid, d.stop_timeout_s), "stop previous", self.say)
        out.phases["stop previous"] = time.monotonic() - t

        # 4. node 0, then its RPC port
        t = time.monotonic()
        attempts = {p.host: 1 for p in plans}
        out.attempts = attempts
        name0 = by_host[self.node0.name].container
        o, e, code = self.r.exec(self.node0, start_script(c, rid, name0, 1))
        if code != 0:
            return self._fail(out, self.node0.name, f"node 0's container did not start: {(e or o).strip().splitlines()[-1:]}")
        self.say(f"[bold]node 0[/] {self.node0.name}: started {name0}; waiting for the DP RPC port {c.profile.rpc_port}")
        o, e, code = self.r.exec(self.node0, wait_port_script(name0, str(self.node0.ip), c.profile.rpc_port, d.rpc_timeout_s), timeout=d.rpc_timeout_s + 30)
        if code != 0:
            why = "exited" if code == 3 else f"did not open port {c.profile.rpc_port} within {d.rpc_timeout_s:g}s"
            return self._fail(out, self.node0.name, f"node 0 {why} ({o.strip()})")
        out.phases["node 0 RPC port"] = time.monotonic() - t

        # 5. all workers at once, then watch everyone until ready
        t = time.monotonic()
        if self.workers:
            res = self.exec_all("start workers", lambda n: start_script(c, rid, by_host[n.name].container, 1), self.workers)
            for h, r in res.items():
                if r.failed:
                    return self._fail(out, h, f"the container did not start: {r.msg}")
            self.say(f"[bold]workers[/]: {len(self.workers)} started (start ranks {', '.join(str(n.start_rank) for n in self.workers)})")
        if not self._watch(out, by_host, rid):
            return False
        out.phases["all ranks joined, /health 200"] = time.monotonic() - t

        # 6. /v1/models and a real chat completion
        t = time.monotonic()
        served = c.profile.served_model_name
        try:
            status, body = http_via_ssh(self.r, self.node0, c.profile.port, "GET", "/v1/models", None, d.request_timeout_s)
            ids = [m.get("id") for m in json.loads(body).get("data", [])] if status == 200 else []
            if served not in ids:
                return self._fail(out, self.node0.name, f"/v1/models answered {status} without {served!r} (has {ids})")
            status, body = http_via_ssh(self.r, self.node0, c.profile.port, "POST", "/v1/chat/completions", chat_request(served), d.request_timeout_s)
            text = chat_content(body) if status == 200 else ""
            if status != 200 or not text.lstrip().startswith("<think>") or "</think>" not in text:
                return self._fail(out, self.node0.name, f"the chat check answered {status}: {text[:120] or body[:200]!r} (expected content that begins with <think>...</think>)")
        except (OSError, ValueError, http.client.HTTPException, paramiko.SSHException) as exc:
            return self._fail(out, self.node0.name, f"readiness request failed: {type(exc).__name__}: {exc}")
        out.phases["models + chat check"] = time.monotonic() - t

        return True

    def _watch(self, out: Outcome, by_host: dict[str, NodePlan], rid: str) -> bool:
        c, d = self.c, self.c.deploy
        end = time.monotonic() + d.ready_timeout_s
        restart_at: dict[str, float] = {}
        reasons: dict[str, str] = {}
        while True:
            now = time.monotonic()
            res = self.exec_all("watch", lambda n: inspect_script(by_host[n.name].container))
            for host, r in res.items():
                state = (r.stdout.split() or ["missing"])[0]
                if host in restart_at or state == "running":
                    continue
                node = c.node(host)
                log_text = self.r.exec(node, f"docker logs {shlex.quote(by_host[host].container)} 2>&1 | tail -c 200000")[0]
                found = logs.match(log_text)
                reason = f"{found[0]} [{found[1]}]" if found else f"container {r.stdout.strip()}"
                reasons[host] = reason
                if host == self.node0.name:
                    self._fail(out, host, f"node 0 exited: {reason}")
                    return False
                n = out.attempts[host]
                if n > d.worker_retries:
                    self._fail(out, host, f"worker exited {n} times; last reason: {reason}")
                    return False
                delay = min(d.backoff_s * (2 ** (n - 1)), d.backoff_max_s)
                self.say(f"  [yellow]worker {host} (start rank {c.node(host).start_rank}) exited[/] (attempt {n}): {escape(reason)}; again in {delay:g}s")
                restart_at[host] = now + delay
            for host, when in list(restart_at.items()):
                if time.monotonic() >= when:
                    out.attempts[host] += 1
                    node = c.node(host)
                    o, e, code = self.r.exec(node, start_script(c, rid, by_host[host].container, out.attempts[host]))
                    del restart_at[host]
                    if code != 0:
                        self._fail(out, host, f"restart failed: {(e or o).strip()}")
                        return False
            if not restart_at:
                try:
                    status, _ = http_via_ssh(self.r, self.node0, c.profile.port, "GET", "/health", None, min(10, d.request_timeout_s))
                    if status == 200:
                        return True
                except (OSError, http.client.HTTPException, paramiko.SSHException):
                    pass  # not listening yet
            if time.monotonic() >= end:
                waiting = ", ".join(f"{h}: {m}" for h, m in reasons.items()) or "no rank reported an error"
                self._fail(out, self.node0.name, f"not ready within {d.ready_timeout_s:g}s ({waiting})")
                return False
            time.sleep(d.poll_s)

    def _fail(self, out: Outcome, where: str, reason: str) -> bool:
        out.ok, out.where, out.reason = False, where, reason
        return False


def collect_bundle(cluster: Cluster, runner: Runner, rid: str, plans: list[NodePlan], secrets: list[str]) -> tuple[str, str]:
    by_host = {p.host: p for p in plans}
    res = runner.run(Step(name="collect logs", build=lambda n: logs.bundle_script(cluster, n, release_dir(cluster, rid), by_host[n.name].container)))
    per_host = {h: logs.split_bundle(r.stdout) for h, r in res.items() if not r.failed}
    for h, r in res.items():
        if r.failed:
            per_host[h] = {"unreachable.txt": f"could not collect from {h}: {r.msg}\n"}
    root, tgz = logs.save_bundle(cluster, rid, per_host, secrets)
    return str(root), str(tgz)


def summary(cluster: Cluster, plans: list[NodePlan], states: dict[str, str], attempts: dict[str, int]):
    rows = []
    for p in plans:
        st = states.get(p.host, "?")
        style = "green" if st == "running" else "bold red"
        rows.append([p.host, p.role, p.container, str(p.start_rank), f"[{style}]{st}[/]", str(attempts.get(p.host, 1))])
    return report.table(f"release on {cluster.name}", ["host", "role", "container", "start rank", "state", "attempts"], rows)
