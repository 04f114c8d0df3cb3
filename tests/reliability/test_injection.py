"""Issue 12, "Bad input": shell metacharacters in every inventory string that
reaches a remote command never run a command on a node; values are rejected
(naming the field) or quoted.

Part A (no simulator, no connection):

1. every string an operator can set is enumerated from the schema
   (``Cluster.model_fields``, recursively: ssh, nodes, model, image, verify,
   the profile of each kind, string lists, env maps and other string-valued
   dicts, their keys too) for the three profile kinds (sim-a3: vllm-ascend,
   sim-b200: trtllm-serve, sim-gb300-agentic: dynamo, and sim-gb300-1p2d:
   dynamo groups across nodes, with launch agents and hostfiles); plus the operator's
   secret values (``secret_env``) and the CLI strings (``--message``,
   ``lock.break --reason``, ``logs --since``);
2. each field gets each payload of ``PAYLOADS`` in a copy of the real cluster
   (``Cluster.model_validate`` of its dump; when the payload alone is refused,
   also the field's real value followed by the payload, which gets past a
   pattern's start: ``/root/.cache/x$(touch ...)``): REJECTED (a problem
   names the field) or ACCEPTED;
3. per cluster and payload, every accepted field at once (each with a marker
   of its own, ``PWNED<field number>``) is built without connecting:
   prepare's steps (check mode too), verify-comm, the deploy plan's files and
   what the engine, the lock, the ledger and the audit log send, status, stop,
   rollback, lock.break and logs (the real flows, through a runner that
   records commands instead of sending them), and the ssh_config ``invoke
   check`` writes;
4. the shell scripts that differ from the unchanged cluster's are checked with
   ``bash -n``, and the ones a value reaches are executed in a sandbox: bash in
   a chroot of its own (bash and its libraries, nothing else) without network
   (``unshare -r -n -p``), where every command is a shell function that logs its
   argv and does nothing, except ``touch`` (creates the file, inside the
   chroot), ``sh -c``/``bash -c``, ``ssh host cmd``, ``docker ... sh -c cmd``,
   ``timeout``, ``flock`` and ``exec``, which run what they are given as a node
   would. Each script runs twice: every stand-in succeeding, then every one
   failing (both sides of ``x || y``). No ``PWNED*`` file may ever exist;
   ``spl it`` never arrives as two arguments; ``-rf`` is never an option of its
   own (only the value of an option); env files, YAML, JSON, hostfiles and the ssh_config keep their
   structure; no value makes a builder raise (invoke would print a traceback).

Self-checks prove the harness can fail: unquoted ``echo <payload>`` creates
the marker; a builder patched to drop its quoting is caught; writes, ``cd`` and
TCP from inside the sandbox change nothing outside it.

Part B (simulator; ``test_sim_*``, deselected by ``-k "not sim"``; run by the
lead engineer): on sim-a3, two variant inventories with payloads in the fields
part A accepts that reach the nodes, through prepare, verify-comm, deploy,
status, logs, stop and lock.break with payload CLI strings: no marker file
(under /tmp, shared with the simulated hosts) ever exists and no command ends
in a Python traceback.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import types
import typing
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import pytest
import yaml
from pydantic import BaseModel, ValidationError
from rich.console import Console

REPO = Path(__file__).resolve().parent.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from flows import check as flows_check  # noqa: E402
from flows import deploy as dep  # noqa: E402
from flows import lifecycle, releases, serving_logs, verify  # noqa: E402
from flows import plan as flows_plan  # noqa: E402
from flows.engine import Engine, Outcome  # noqa: E402
from llmdeploy import lock  # noqa: E402
from llmdeploy import logs as llm_logs  # noqa: E402
from llmdeploy.errors import LlmdeployError  # noqa: E402
from llmdeploy.inventory import ENV_NAME_RE, Cluster, load_cluster, problems_from_validation  # noqa: E402
from llmdeploy.launcher import SECTIONS, LauncherSection  # noqa: E402
import launchers.slurm.schema  # noqa: E402,F401 (the Slurm section, which the inventory fields below walk)
from llmdeploy.release import ledger_record, release_dir, set_current_script, write_script  # noqa: E402
from llmdeploy.runner import FAILED, OK, SKIPPED, HostResult, UnreachableError  # noqa: E402
from roles import comm, record  # noqa: E402
from roles.comm import picture  # noqa: E402
from roles.status import status_script  # noqa: E402
from flows.binding import bind  # noqa: E402
from tests.binding import runners

MARK = "PWNED"
# {m}: the marker file; each payload tries another way out of a shell word
PAYLOADS = [
    "$(touch {m})",
    "`touch {m}`",
    "x; touch {m}",
    "x | touch {m}",
    "x & touch {m}",
    "x\ntouch {m}",
    "x' ; touch {m} ; '",
    'x" ; touch {m} ; "',
    "$(echo x >{m})",  # the shell's own redirection, no command at all
    "x;echo x >{m}",
    "spl it{n}",  # a space: must stay one argument
    "-rf{n}",  # a leading dash: never an option of its own
]
SPLIT_TPL, DASH_TPL = 10, 11
# fields that are argument lists by design (split at spaces; their pattern allows no metacharacter)
ARGV_FIELDS = {"verify.all_reduce_args"}
FILE_TOOLS = {"rm", "mv", "cp", "chmod", "chown", "ln", "mkdir", "touch", "tee", "find", "tar", "cat", "dirname", "basename", "readlink", "stat"}
CLUSTERS = {"vllm-ascend": "sim-a3", "trtllm-serve": "sim-b200", "dynamo": "sim-gb300-agentic", "dynamo across nodes": "sim-gb300-1p2d",
            "sglang": "sim-h200-sglang"}
INVENTORY = REPO / "inventory"
FIXED_RID = "20260101T000000Z-0badc0de"
# verify-comm's clock, fixed as the release id is: its document (and the picture drawn from it) is then
# the same in every build that no value reaches
VERIFY_CLOCK = types.SimpleNamespace(time=lambda: 1767225600.0, strftime=time.strftime, gmtime=time.gmtime)
IMAGE_ID = "sha256:" + "ab" * 32
SECRET_SRC = "LLMDEPLOY_INJECT_SECRET"
BENIGN = {"message": "benign note", "reason": "holder gone", "since": "10m"}


def payload(tpl: int, n: int) -> str:
    """Payload ``tpl`` for field number ``n``: its marker is PWNED<n>."""
    return PAYLOADS[tpl].format(m=f"{MARK}{n}", n=n)


# --- the fields ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class FieldRef:
    cluster: str  # sim-a3, ...
    label: str  # profile.env.HCCL_BUFFSIZE, profile.env{key}, nodes[0].ssh_host, ...
    path: tuple  # into the cluster's dump
    how: str  # value | item | dict-value | dict-key | secret | cli
    key: str = ""  # dict-value: the key set; dict-key: the value set (JSON); cli: which string
    container: str = ""  # the field a problem may name instead (the dict or list)

    @property
    def id(self) -> str:
        # no "sim" in part A's test ids: -k "not sim" deselects part B only
        return f"{self.cluster.removeprefix('sim-')}:{self.label}"


def _unwrap(ann):
    """(shape, arg): model | union | list | dict | str | any | other."""
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(ann)[0])
    if origin in (typing.Union, types.UnionType):
        args = [_unwrap(a) for a in typing.get_args(ann) if a is not type(None)]
        if len(args) == 1:
            return args[0]
        if all(shape == "model" for shape, _ in args):
            return "union", [cls for _, cls in args]
        return "other", None
    if origin is typing.Literal:
        return ("str", None) if all(isinstance(a, str) for a in typing.get_args(ann)) else ("other", None)
    if origin is list:
        return "list", typing.get_args(ann)[0]
    if origin is dict or ann is dict:
        return "dict", (typing.get_args(ann) or (str, typing.Any))
    if ann is typing.Any:
        return "any", None
    if isinstance(ann, type):
        if issubclass(ann, BaseModel):
            return "model", ann
        if issubclass(ann, (str, ipaddress.IPv4Address)):
            return "str", None
    return "other", None


def _stringish(ann) -> bool:
    return _unwrap(ann)[0] in ("str", "any")


# fields whose value is None in the real clusters but hold models an operator can set
SEEDS = {(name, "profile.workers"): lambda c: [{} for _ in c.profile.worker_specs()] for name in ("sim-gb300-agentic", "sim-gb300-1p2d")}


def _walk(cluster_name: str, cluster: Cluster, inst, cls, path: tuple, label: str, out: list[FieldRef]) -> None:
    for name, f in cls.model_fields.items():
        value = getattr(inst, name, None) if inst is not None else None
        p, lab = path + (name,), f"{label}{'.' if label else ''}{name}"
        shape, arg = _unwrap(f.annotation)
        if shape == "str":
            out.append(FieldRef(cluster_name, lab, p, "value"))
        elif shape == "model":
            # a field typed by a base class (cluster.profile: ServingProfile) holds a subclass: walk what it holds;
            # an unset launcher section (cluster.slurm: LauncherSection), the class its launcher declares
            held = type(value) if isinstance(value, arg) else SECTIONS[name] if issubclass(arg, LauncherSection) else arg
            _walk(cluster_name, cluster, value, held, p, lab, out)
        elif shape == "union" and value is not None:
            _walk(cluster_name, cluster, value, type(value), p, lab, out)
        elif shape == "list":
            ishape, icls = _unwrap(arg)
            if ishape == "str":
                out.append(FieldRef(cluster_name, f"{lab}[0]", p, "item", container=lab))
            elif ishape == "model":
                items = list(value or [])
                seed = SEEDS.get((cluster_name, lab))
                if not items and seed:
                    items = [icls.model_validate(x) for x in seed(cluster)]
                for i in sorted({0, len(items) - 1}) if items else []:
                    _walk(cluster_name, cluster, items[i], icls, p + (i,), f"{lab}[{i}]", out)
        elif shape == "dict":
            kann, vann = arg
            current = dict(value or {})
            if _stringish(vann):
                # an empty dict gets a key of its own (two env dicts merged into one file must not share it)
                key = next(iter(current), f"LLMDEPLOY_INJECT{len(out)}" if name.endswith("env") else f"llmdeploy_inject{len(out)}")
                out.append(FieldRef(cluster_name, f"{lab}.{key}", p, "dict-value", key=key, container=lab))
                default = "1"
            else:
                default = next(iter(current.values()), [0] if _unwrap(vann)[0] == "list" else 1)
            if _stringish(kann):
                out.append(FieldRef(cluster_name, f"{lab}{{key}}", p, "dict-key", key=json.dumps(default), container=lab))


def enumerate_fields() -> list[FieldRef]:
    out: list[FieldRef] = []
    for cname in CLUSTERS.values():
        c = load_cluster(cname, INVENTORY)
        _walk(cname, c, c, Cluster, (), "", out)
        # the operator's secret values (secret_env names the variable; its value is read at run time)
        out.append(FieldRef(cname, f"secret_env value (${SECRET_SRC})", ("secret_env",), "secret"))
    for what in ("message", "reason", "since"):
        out.append(FieldRef("sim-a3", f"cli --{what}", (), "cli", key=what))
    return out


@functools.lru_cache(maxsize=None)
def real(name: str) -> Cluster:
    return load_cluster(name, INVENTORY)


def _seed_dump(cluster_name: str) -> dict:
    return copy.deepcopy(_seed_dump_cached(cluster_name))


@functools.lru_cache(maxsize=None)
def _seed_dump_cached(cluster_name: str) -> dict:
    cluster = real(cluster_name)
    d = cluster.model_dump(exclude_unset=True)
    d["profile"]["kind"] = cluster.profile.kind  # the discriminator: a default the dump leaves out
    for (cname, lab), seed in SEEDS.items():
        if cname == cluster_name:
            node = d
            parts = lab.split(".")
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node.setdefault(parts[-1], seed(cluster))
    return d


def _derived(d: dict, orig: Cluster, ref: FieldRef) -> None:
    """Values the schema derives (copied into the dump) follow the changed field, as in an inventory that sets only it."""
    if ref.path == ("nic",):
        for n in d["nodes"]:
            if n.get("nic") == orig.nic:
                n["nic"] = None
    if ref.path == ("model", "path") and orig.model.tokenizer_path == orig.model.path:
        d["model"]["tokenizer_path"] = None
    if ref.path == ("profile", "trtllm_dir") and getattr(orig.profile, "config_dir", None) == f"{orig.profile.trtllm_dir}/examples/configs/curated":
        d["profile"]["config_dir"] = None


def apply(d: dict, ref: FieldRef, value: str) -> None:
    """Put ``value`` into the dump ``d`` where ``ref`` says."""
    if ref.how == "secret":
        d.setdefault("secret_env", {})["HF_TOKEN"] = SECRET_SRC
        return
    node = d
    for part in ref.path[:-1]:
        if isinstance(part, int):
            node = node[part]
        else:
            if node.get(part) is None:
                node[part] = {}
            node = node[part]
    last = ref.path[-1]
    if ref.how == "value":
        node[last] = value
    elif ref.how == "item":
        items = list(node.get(last) or [])
        node[last] = [value] + items[1:]
    elif ref.how == "dict-value":
        node[last] = dict(node.get(last) or {})
        node[last][ref.key] = value
    elif ref.how == "dict-key":
        node[last] = dict(node.get(last) or {})
        node[last][value] = json.loads(ref.key)
    _derived(d, real(ref.cluster), ref)


def original_value(ref: FieldRef) -> str:
    """The field's value in the real cluster ('' when unset or not a string)."""
    if ref.how in ("secret", "cli"):
        return BENIGN.get(ref.key, "") if ref.key != "since" else ""
    node = _seed_dump(ref.cluster)
    for part in ref.path:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return ""
        if node is None:
            return ""
    if ref.how == "item":
        node = node[0] if isinstance(node, list) and node else ""
    elif ref.how == "dict-value":
        node = node.get(ref.key, "") if isinstance(node, dict) else ""
    elif ref.how == "dict-key":
        node = next(iter(node), "") if isinstance(node, dict) else ""
    return str(node) if isinstance(node, (str, ipaddress.IPv4Address)) else ""


def _norm(where: str) -> str:
    where = re.sub(r" \([^)]*\)", "", where)
    return re.sub(r"\.node [^.:]+\.", ".", where)


def names_field(problems: list[str], ref: FieldRef) -> bool:
    """Does one of the problems name the field (or the dict/list it is in; a
    discriminator such as profile.kind is named by its parent and its name)?"""
    label = ref.label.split("{")[0]
    bases = {label} | ({ref.container} if ref.container else set())
    parent, _, last = label.rpartition(".")
    for p in problems:
        where, _, msg = p.partition(": ")
        where = _norm(where)
        if any(where == b or where.startswith((b + ".", b + "[")) for b in bases):
            return True
        if parent and where == parent and f"'{last}'" in msg:
            return True
    return False


# --- a runner that records instead of sending ------------------------------------------------------

def _text(data: str | bytes) -> str:
    """A command's standard input as text (files travel as their bytes)."""
    return data.decode("utf-8", "surrogateescape") if isinstance(data, bytes) else data

class Capture:
    """Stands in for llmdeploy.runner.Runner: every command a flow would send
    (and what it would send on standard input) is recorded, label -> text, and
    answered from ``canned``; nothing connects."""

    def __init__(self, cluster: Cluster, sink: dict, label: str, nodes=None):
        self.cluster, self.sink, self.label = cluster, sink, label
        self.nodes = list(nodes if nodes is not None else cluster.nodes)
        self.recap, self.round_trips, self.unreachable, self.excluded = {}, {}, {}, {}

    def factory(self, label: str):
        return lambda cluster, nodes=None, **_: Capture(cluster, self.sink, label, nodes)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def close(self):
        pass

    def add(self, what: str, command: str, kind: str = "sh", args: list | None = None) -> None:
        key, k = f"{self.label}/{what}", 1
        while key in self.sink:
            k += 1
            key = f"{self.label}/{what}#{k}"
        self.sink[key] = (kind, command, args or [])

    def canned(self, command: str, node) -> str:
        if "holder.json" in command and "acquired" in command:
            return "acquired\n"
        if "holder.json" in command and "broken" in command:
            return '{"who": "someone@laptop", "pid": 1, "command": "deploy"}\nbroken\n'
        if "prepared.json" in command:
            return prepared_record(self.cluster, node)
        if "sort -un" in command:
            return "0\n"
        return ""

    def exec(self, node, command, timeout=None, stdin=None, **_):
        self.add(f"exec/{node.name}", command)
        if stdin is not None:
            self.add(f"exec/{node.name}/stdin", _text(stdin), "data")
        return self.canned(command, node), "", 0

    def run(self, step, nodes=None, deadline=None, **_):
        res = {}
        for n in nodes if nodes is not None else self.nodes:
            if step.local:
                res[n.name] = HostResult(n.name, SKIPPED, msg="local step")
                continue
            cmd = step.build(n)
            if cmd is None:
                res[n.name] = HostResult(n.name, SKIPPED, msg="nothing to do here")
                continue
            self.add(f"{step.name}/{n.name}", cmd)
            stdin = getattr(step, "stdin", None)
            if stdin is not None:
                self.add(f"{step.name}/{n.name}/stdin", _text(stdin(n) or ""), "data")
            out = self.canned(cmd, n)
            try:
                r = step.parse(n, out, "", 0) if step.parse else HostResult(n.name, OK, stdout=out, exit_code=0)
            except Exception as exc:  # a parser that needs real output: the command is what matters here
                r = HostResult(n.name, FAILED, msg=f"{type(exc).__name__}: {exc}")
            r.host, r.stdout = n.name, r.stdout or out
            res[n.name] = r
        if step.aggregate:
            with contextlib.suppress(Exception):
                step.aggregate(res)
        return res

    def connection(self, node):
        raise UnreachableError("recording runner: no connection")


def _binding(cluster: Cluster) -> dict:
    return {"kind": "numactl", "prefix": "numactl -m 0,1"} if cluster.profile.kind == "dynamo" else {"kind": "none", "reason": "off"}


def prepared_record(cluster: Cluster, node) -> str:
    return record.content(cluster, node, {"id": IMAGE_ID}, _binding(cluster))


# --- everything that goes to a node ----------------------------------------------------------------
KINDS = {".sh": "sh", ".env": "env", ".yaml": "yaml", ".json": "json", "hostfile": "hostfile", ".py": "py"}


def _files_of(sink: dict, host: str, files: dict) -> None:
    for name, (text, _) in files.items():
        kind = "env" if name == "env" else next((k for suffix, k in KINDS.items() if name.endswith(suffix)), "text")
        # the agent is called with a hostfile entry (a node's serving IP): the last node its case maps
        ips = re.findall(r"^\s+'?([0-9.]+)'?\) target=", text, re.M) if name.endswith("mpi-agent.sh") else []
        args = [ips[-1], "orted", "--mca", "ess", "env"] if ips else []
        sink[f"release/{host}/{name}"] = (kind, text, args)


_PNGS: dict[str, bytes] = {}


def render_png_once(doc: dict, _render=picture.render_png) -> bytes:
    """picture.render_png, drawn once per document (a pure function of it, byte for byte; about
    a second of matplotlib a call): the variants whose values do not reach verify-comm's
    document share the unchanged cluster's picture, the others get their own."""
    key = repr(doc)
    if key not in _PNGS:
        _PNGS[key] = _render(doc)
    return _PNGS[key]


def build_artifacts(cluster: Cluster, cli: dict[str, str], only: tuple[str, ...] = ()) -> tuple[dict[str, tuple[str, str, list]], dict[str, str]]:
    """({label: (kind, text, args)}, {section: error}): everything the tool would
    send or write on a node for ``cluster`` and the CLI strings ``cli``, without
    connecting. Each section is driven on its own: a refusal (LlmdeployError)
    is recorded as a ``!refused`` artifact, any other exception as an error."""
    sink: dict[str, tuple[str, str, list]] = {}
    errors: dict[str, str] = {}
    quiet = Console(file=io.StringIO(), width=200)
    cap = Capture(cluster, sink, "")
    kind = cluster.profile.kind
    state: dict = {}

    def section(name, fn):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                fn()
        except LlmdeployError as exc:
            sink[f"!refused/{name}"] = ("refusal", str(exc), [])
        except Exception as exc:  # noqa: BLE001 - reported per section
            errors[name] = f"{type(exc).__name__}: {exc}"

    def prepare():
        # prepare (facts included), as applied and in check/diff mode; steps that
        # read earlier steps' results get none (what prepare does after a failure)
        for check in (False, True):
            run = cap.factory("prepare-check" if check else "prepare")(cluster)
            ctx = flows_plan.Context(bind(cluster), check=check, diff=check)
            for play in flows_plan.load_playbook("prepare"):
                for ref in play.steps:
                    run.run(flows_plan.resolve_step(ref, ctx))

    def verify_comm():
        # NPU addresses come back from the nodes: the ping scripts with some
        if cluster.platform_info.vendor == "ascend":
            ips = {n.name: {d: f"10.{i}.0.{d}" for d in range(n.devices)} for i, n in enumerate(cluster.nodes)}
            for full in (False, True):
                _, plan = comm.ping_plan(cluster, ips, full, cluster.verify.ping_full_max)
                for n in cluster.nodes:
                    text = comm.ping_script(bind(cluster), plan[n.name])
                    if text:
                        sink[f"verify/pings{'-full' if full else ''}/{n.name}"] = ("sh", text, [])
        sink["verify/all_reduce"] = ("sh", comm.all_reduce_command(bind(cluster), cluster.verify.all_reduce_args), [])
        # the host network pings of every node (the flow builds them only for nodes whose facts it read)
        host_ping = getattr(comm, "host_ping_script", None)
        for n in cluster.nodes if host_ping else []:
            text = host_ping(cluster, n)
            if text:
                sink[f"verify/host pings/{n.name}"] = ("sh", text, [])
        # its report's local copies in a directory of their own (not the checkout's logs/)
        with runners(cap.factory("verify-comm")), mock.patch.object(verify, "time", VERIFY_CLOCK), \
                mock.patch.object(picture, "render_png", render_png_once), tempfile.TemporaryDirectory() as report_dir:
            verify.run(bind(cluster), quiet, True, False, report_dir)

    def plan():
        with mock.patch.object(dep, "new_id", lambda chash, now=None: FIXED_RID):
            prepared = {n.name: json.loads(prepared_record(cluster, n)) for n in cluster.nodes}
            state["rid"], state["chash"], state["plan"] = dep.plan_release(bind(cluster), prepared, IMAGE_ID, IMAGE_ID)
        dep.check_doc(bind(cluster), state["plan"], state["chash"], [])
        for host, files in state["plan"].files.items():
            _files_of(sink, host, files)
            sink[f"release/{host}/write_script"] = ("sh", write_script(cluster, state["rid"], files), [])

    def engine():
        if "plan" not in state:
            return  # the plan was refused: nothing to start
        rid, chash, plan = state["rid"], state["chash"], state["plan"]
        run = cap.factory("deploy")(cluster)
        with lock.held(run, cluster, "deploy", cli["message"]):
            dep.read_prepared(run, cluster)
            run.exec(cluster.node0, verify.last_report_script(cluster))
            dep.write_release(run, cluster, plan)
            dep.ledger(run, cluster, ledger_record(cluster, rid, "started", IMAGE_ID, chash[:16]))
            eng = Engine(bind(cluster), run, quiet, quiet=True, signatures=plan.signatures)
            eng.stop(rid, "stop previous")
            out = Outcome(ok=False, release=rid)
            for svc in plan.services:
                eng.start_units(plan, svc.units, out)
                p = svc.started
                if p is not None and p.kind == "port":
                    if any(u.host == p.host for u in svc.units):
                        eng.wait_started(plan, svc, out)
                    else:
                        eng.probe(p)
                eng.stop_service(plan, svc, "attempt-1")
            for p in plan.ready:
                if p.kind == "port":
                    eng.probe(p)
            eng.states(plan)
            for u in plan.units():
                eng.exit_reason(u)
            for n in cluster.nodes:
                run.add(f"bundle/{n.name}", llm_logs.bundle_script(cluster, n, release_dir(cluster, rid), bind(cluster).runtime.bundle_sections([u.container for u in plan.units(n.name)], llm_logs.BUNDLE_BYTES),
                                                                  bind(cluster).vendor.LOG_FILES))
            eng.stop(None, "stop", cleanup=plan.stop_cleanup)
            run.add("set current", set_current_script(cluster, rid))
            dep.ledger(run, cluster, ledger_record(cluster, rid, "good", IMAGE_ID, chash[:16]))
        lock.audit(run, cluster, "deploy", "good", rid, message=cli["message"])

    def operations():
        with runners(cap.factory("ops")):
            if "rid" in state:
                releases.read_release(cap.factory("ops")(cluster), bind(cluster), state["rid"], "verify target")
            cap.factory("ops")(cluster).add("status", status_script(cluster))
            lifecycle.stop(bind(cluster), quiet, cli["message"], 0)
            releases.lock_status(bind(cluster), quiet)
            releases.audit_log(bind(cluster), quiet, 5, False)

    def rollback():
        with runners(cap.factory("rollback")):
            lifecycle.rollback(bind(cluster), quiet, None, cli["message"], 0, False)  # no ledger here: refused after the lock

    def lock_break():
        with runners(cap.factory("lock.break")):
            releases.lock_break(bind(cluster), quiet, cli["reason"])

    def logs():
        with runners(cap.factory("logs")):
            serving_logs.serving_logs(bind(cluster), since=cli["since"], tail="100")

    def ssh_config():
        # invoke check's ssh_config: ssh runs a ProxyCommand line, so its lines are commands too
        sink["check/ssh_config"] = ("ssh_config", flows_check.ssh_config_text(cluster, cluster.nodes, "/tmp/llmdeploy-check-x/cm"), [])

    for name, fn in (("prepare", prepare), ("verify-comm", verify_comm), ("deploy plan", plan), ("deploy engine", engine),
                     ("operations", operations), ("rollback", rollback), ("lock.break", lock_break), ("logs", logs), ("ssh_config", ssh_config)):
        if not only or name in only:
            section(name, fn)
    return sink, errors


# --- the sandbox -------------------------------------------------------------------------------------
PRELUDE = r"""
__log() { { printf '\036%s\037' "$__IDX"; printf '%s\037' "$@"; } >> "$WORK/.argv" 2>/dev/null; return 0; }
command_not_found_handle() { __log "$@"; return "${STUB_RC:-0}"; }
exec() { [ $# -eq 0 ] && return 0; "$@"; }
__nested() { local __s=$1; shift; [ $# -gt 0 ] && shift; ( eval "$__s" ); }
sh() {
  __log sh "$@"
  while [ $# -gt 0 ]; do case $1 in -c) shift; __nested "$@"; return $?;; -*) shift;; *) return "${STUB_RC:-0}";; esac; done
  return "${STUB_RC:-0}"
}
bash() { sh "$@"; }
docker() {
  __log docker "$@"; local __prev=""
  while [ $# -gt 0 ]; do
    case $__prev in sh|bash|/bin/sh|/bin/bash) if [ "$1" = -c ]; then shift; __nested "$@"; return $?; fi;; esac
    __prev=$1; shift
  done
  return "${STUB_RC:-0}"
}
ssh() {
  __log ssh "$@"
  while [ $# -gt 0 ]; do case $1 in -[FoipJlEcmbLRDWSOQeIwB]) shift 2;; -*) shift;; *) break;; esac; done
  [ $# -gt 0 ] && shift
  [ $# -gt 0 ] || return "${STUB_RC:-0}"
  ( eval "$*" )
}
timeout() { __log timeout "$@"; while [ $# -gt 0 ]; do case $1 in -s|-k|--signal|--kill-after) shift 2;; -*) shift;; *) break;; esac; done; shift; "$@"; }
flock() {
  __log flock "$@"; while [ $# -gt 0 ]; do case $1 in -w|-E|--timeout|--conflict-exit-code) shift 2;; -*) shift;; *) break;; esac; done; shift
  if [ "$1" = -c ]; then ( eval "$2" ); else "$@"; fi
}
touch() { __log touch "$@"; local __a; for __a; do case $__a in -*) ;; *) : > "$__a";; esac; done; return 0; }
dirname() { __log dirname "$@"; local __p=${1%/}; case $__p in */*) __p=${__p%/*};; *) __p=.;; esac; printf '%s\n' "${__p:-/}"; }
basename() { __log basename "$@"; local __p=${1%/}; printf '%s\n' "${__p##*/}"; }
mktemp() { __log mktemp "$@"; local __t=/tmp/tmp.XXXXXX __a; for __a; do case $__a in -*) ;; *) __t=$__a;; esac; done; printf '%s\n' "${__t//X/0}"; }
# the other commands the scripts use: functions (a fork less than command_not_found_handle)
for __c in $STUBS; do eval "$__c() { __log $__c \"\$@\"; return \"\${STUB_RC:-0}\"; }"; done
export -f __log command_not_found_handle exec __nested sh bash docker ssh timeout flock touch dirname basename mktemp
# syntax: every script at once (each as a function body), then one by one if that fails
if ! /bin/bash -n /s/all.sh 2>/dev/null; then
  __i=0; while [ -e "/s/$__i.sh" ]; do /bin/bash -n "/s/$__i.sh" 2>"$BASE/.syntax.$__i" || echo "SYNTAX $__i"; __i=$((__i + 1)); done
fi
# every script to run, once per mode: the stand-ins exit STUB_RC
for STUB_RC in $MODES; do
  WORK=$BASE/$STUB_RC
  cd "$WORK" || exit 99
  declare -A __seen=()
  __i=0
  while [ -e "/s/$__i.sh" ]; do
    if [ -e "/s/$__i.run" ]; then
      __IDX=$__i
      __args=(); [ -e "/s/$__i.args" ] && mapfile -t __args < "/s/$__i.args"
      ( cd "$WORK" && . "/s/$__i.sh" "${__args[@]}" ) </empty >"$WORK/.out" 2>&1
      for __f in "$WORK"/PWNED*; do
        if [ -e "$__f" ] && [ -z "${__seen[${__f##*/}]}" ]; then __seen[${__f##*/}]=1; echo "MARKER $STUB_RC $__i ${__f##*/}"; fi
      done
    fi
    __i=$((__i + 1))
  done
  echo "DONE $STUB_RC"
done
"""
# the commands the builders' scripts run, as stand-in functions (anything else: command_not_found_handle)
STUBS = ("mkdir rm mv cp cat ls sed grep flock ln chmod chown base64 cmp diff stat find sort uniq head tail tr cut wc tee tar readlink "
         "hostname uname lscpu numactl ip df ss npu-smi nvidia-smi ibstat hccn_tool date sleep mpirun python3 vllm dmesg uptime free "
         "sha256sum xargs awk env kill ps getent id true false seq ping")


class Sandbox:
    """bash in a chroot of its own (bash and its libraries only), no network, stand-in commands."""

    def __init__(self, root: Path):
        self.root = root
        self.reason = None
        self.runs = 0
        (root / "bin").mkdir(parents=True)
        for d in ("dev", "s", "work", "tmp"):
            (root / d).mkdir()
        bash = shutil.which("bash") or "/bin/bash"
        shutil.copy2(bash, root / "bin" / "bash")
        out = subprocess.run(["ldd", bash], capture_output=True, text=True).stdout
        for lib in re.findall(r"(/\S+\.so[.\d]*)", out):
            dest = root / lib.lstrip("/")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(lib, dest)
        (root / "prelude.sh").write_text(PRELUDE)
        (root / "empty").write_text("")
        (root / "dev" / "null").write_text("")  # a plain file: writes to it stay in here
        res = self._run(["echo ok\n"], (0,))
        if res is None or "DONE 0" not in res[0]:
            self.reason = f"the sandbox (unshare -r -n chroot) does not start here: {res}"

    def _cmd(self) -> list[str]:
        unshare, chroot = shutil.which("unshare"), shutil.which("chroot")
        if not unshare or not chroot:
            return []
        # its own user, network and pid namespaces: no network, and whatever it starts dies with it
        return [unshare, "-r", "-n", "-p", "--kill-child", chroot, str(self.root), "/bin/bash", "/prelude.sh"]

    def _run(self, scripts: list[str], modes, args: list[list[str]] | None = None, execute: list[bool] | None = None, timeout: float = 60):
        cmd = self._cmd()
        if not cmd:
            return None
        sdir = self.root / "s"
        shutil.rmtree(sdir)
        sdir.mkdir()
        syntax = []
        for i, text in enumerate(scripts):
            (sdir / f"{i}.sh").write_text(text)
            syntax.append(f"__syntax_{i}() {{\n:\n{text}\n}}\n")
            if args and args[i]:
                (sdir / f"{i}.args").write_text("\n".join(args[i]) + "\n")
            if execute is None or execute[i]:
                (sdir / f"{i}.run").write_text("")
        (sdir / "all.sh").write_text("".join(syntax))
        self.runs += 1
        base = f"/work/{self.runs}"
        for rc in modes:
            (self.root / base.lstrip("/") / str(rc)).mkdir(parents=True)
        env = {"PATH": "/nonexistent", "HOME": base, "BASE": base, "WORK": base, "MODES": " ".join(map(str, modes)), "STUBS": STUBS, "LC_ALL": "C"}
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # the sandbox's session: unshare, bash and all it started
            p.communicate()
            return "TIMEOUT", "", self.root / base.lstrip("/")
        return out, err, self.root / base.lstrip("/")

    def run(self, scripts: list[str], args: list[list[str]] | None = None, execute: list[bool] | None = None, modes=(0, 1)) -> dict:
        """Every script checked with bash -n; those in ``execute`` (default: all)
        run once per mode (stand-ins exiting 0, then 1): syntax errors, markers
        (mode, script index, file name), the argv of every stand-in, problems."""
        report = {"syntax": {}, "marker": [], "argv": [], "errors": []}
        res = self._run(scripts, modes, args, execute)
        if res is None:
            report["errors"].append("no unshare/chroot")
            return report
        out, err, base = res
        if out == "TIMEOUT":
            # name the scripts that do not end (a value that makes a loop endless is a finding too)
            hung = [i for i, text in enumerate(scripts) if (execute is None or execute[i])
                    and self._run([text], modes, [args[i]] if args else None, timeout=10)[0] == "TIMEOUT"]
            report["errors"].append(f"scripts {hung} do not end")
            shutil.rmtree(base, ignore_errors=True)
            return report
        for rc in modes:
            if f"DONE {rc}" not in out:
                report["errors"].append(f"the sandbox did not finish (stand-ins exiting {rc}): {out[-300:]} {err[-300:]}")
        for line in out.splitlines():
            if line.startswith("SYNTAX "):
                i = int(line.split()[1])
                f = base / f".syntax.{i}"
                report["syntax"][i] = f.read_text() if f.exists() else "?"
            if line.startswith("MARKER "):
                _, rc, i, name = line.split()
                report["marker"].append((int(rc), int(i), name))
        for p in list(self.root.rglob(f"{MARK}*")):
            if not any(name == p.name for _, _, name in report["marker"]):
                report["marker"].append((-1, -1, p.name))
            p.unlink()
        for rc in modes:
            f = base / str(rc) / ".argv"
            argv = f.read_text(errors="replace") if f.exists() else ""
            for rec in argv.split("\x1e")[1:]:
                fields = rec.split("\x1f")[:-1]
                if fields and fields[0].isdigit():
                    report["argv"].append((int(fields[0]), fields[1:]))
        shutil.rmtree(base, ignore_errors=True)
        return report


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    box = Sandbox(tmp_path_factory.mktemp("inject") / "root")
    if box.reason:
        pytest.skip(box.reason)
    return box


# --- checks of what is not a script --------------------------------------------------------------------
ENV_LINE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=[^\n]*$")
SSH_DIRECTIVES = {"Host", "HostName", "Port", "User", "IdentityFile", "IdentitiesOnly", "UserKnownHostsFile", "StrictHostKeyChecking", "BatchMode",
                  "ConnectTimeout", "ControlMaster", "ControlPath", "ControlPersist", "ProxyJump", "ServerAliveInterval", "ServerAliveCountMax"}


def structure_problems(kind: str, text: str, nodes: int) -> list[str]:
    out = []
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if kind == "env":
        out += [f"env line {ln!r} is not NAME=value" for ln in lines if not ENV_LINE.match(ln) or not ENV_NAME_RE.match(ln.split("=", 1)[0])]
    elif kind == "yaml":
        try:
            yaml.safe_load(text)
        except yaml.YAMLError as exc:
            out.append(f"YAML does not parse: {exc}")
    elif kind == "json":
        try:
            json.loads(text)
        except ValueError as exc:
            out.append(f"JSON does not parse: {exc}")
    elif kind == "hostfile":
        out += [f"hostfile line {ln!r}" for ln in lines if not re.match(r"^[A-Za-z0-9][A-Za-z0-9.-]* slots=\d+$", ln)]
    elif kind == "py":
        try:
            compile(text, "merge-config.py", "exec")
        except SyntaxError as exc:
            out.append(f"Python does not compile: {exc}")
    elif kind == "ssh_config":
        hosts = 0
        for ln in lines:
            m = re.match(r"^(Host|    ([A-Za-z]+)) (\S.*)$", ln)
            directive = (m.group(2) or m.group(1)) if m else None
            if directive not in SSH_DIRECTIVES:
                out.append(f"ssh_config line {ln!r} is not one the tool writes (a ProxyCommand would run on this machine)")
            hosts += directive == "Host"
        if hosts != nodes:
            out.append(f"{hosts} Host blocks for {nodes} nodes")
    return out


# --- the matrix ---------------------------------------------------------------------------------------------
@dataclass
class Row:
    ref: FieldRef
    n: int  # its number: its marker is PWNED<n>
    results: dict = field(default_factory=dict)  # template index -> rejected | accepted | accepted+real | refused: ... | CRASH
    values: dict = field(default_factory=dict)  # template index -> the accepted value
    failures: list = field(default_factory=list)
    reached: set = field(default_factory=set)  # labels of what the value reached (commands, files)
    notes: set = field(default_factory=set)  # where a leading-dash value is an option's value
    whole: dict = field(default_factory=dict)  # template index -> a command got the value whole (it reached a script that ran)

    def tokens(self, tpl: int) -> list[str]:
        """What shows in a text the value reached."""
        if tpl == SPLIT_TPL:
            return [f"spl it{self.n}"]
        if tpl == DASH_TPL:
            return [f"-rf{self.n}"]
        return [f"{MARK}{self.n}"]


def classify(row: Row, tpl: int) -> None:
    """Rejected or accepted, for the payload alone and, if refused, after the field's real value."""
    ref = row.ref
    value = payload(tpl, row.n)
    candidates = [("accepted", value)]
    orig = original_value(ref)
    if orig and tpl != DASH_TPL:
        candidates.append(("accepted after its real value", orig + value))
    for verdict, v in candidates:
        if ref.how in ("secret", "cli"):
            row.results[tpl], row.values[tpl] = verdict, v  # checked when built (secret values, --since)
            return
        d = _seed_dump(ref.cluster)
        apply(d, ref, v)
        try:
            Cluster.model_validate(d)
        except ValidationError as err:
            problems = problems_from_validation(err)
            if not names_field(problems, ref):
                row.failures.append(f"{v!r}: rejected, but no problem names {ref.label}: {problems[:3]}")
            continue
        row.results[tpl], row.values[tpl] = verdict, v
        return
    row.results[tpl] = "rejected"


def _variant(cluster_name: str, members: list[tuple[Row, str]]) -> tuple[Cluster, dict, dict]:
    d = _seed_dump(cluster_name)
    env, cli = {}, dict(BENIGN)
    for row, v in members:
        if row.ref.how == "cli":
            cli[row.ref.key] = v
        else:
            apply(d, row.ref, v)
            if row.ref.how == "secret":
                env[SECRET_SRC] = v
    return Cluster.model_validate(d), env, cli


# the flows a CLI string goes to (a group of CLI strings alone builds only these)
CLI_SECTIONS = {"message": ("deploy plan", "deploy engine", "operations", "rollback"), "reason": ("lock.break",), "since": ("logs",)}


@functools.lru_cache(maxsize=None)
def baseline(cluster_name: str) -> tuple:
    return build_artifacts(real(cluster_name), BENIGN)


def build_members(cluster_name: str, members: list[tuple[Row, str]]):
    """The artifacts of the cluster with every member's value at once; a member
    whose value alone makes a builder raise (where the baseline does not) or
    is refused together with others is split off and reported."""
    base_arts, base_errors = baseline(cluster_name)
    only = tuple(s for row, _ in members for s in CLI_SECTIONS[row.ref.key]) if all(row.ref.how == "cli" for row, _ in members) else ()
    try:
        cluster, env, cli = _variant(cluster_name, members)
        with mock.patch.dict(os.environ, env):
            arts, errors = build_artifacts(cluster, cli, only)
        new_errors = {k: v for k, v in errors.items() if base_errors.get(k) != v}
        refused = [lab for lab in arts if lab.startswith("!refused/") and base_arts.get(lab) != arts[lab]]
    except ValidationError as err:
        if len(members) == 1:
            members[0][0].failures.append(f"{members[0][1]!r}: accepted alone, refused when built: {problems_from_validation(err)[:3]}")
            return []
        new_errors, refused, arts = {"validation": str(err)}, [], {}
    if len(members) == 1:
        row, v = members[0]
        if new_errors:
            for k in row.results:
                if row.values.get(k) == v:
                    row.results[k] = "CRASH"
            row.failures += [f"{v!r}: accepted by the schema, then {sec} raises {e} (invoke would print a traceback)" for sec, e in new_errors.items()]
        return [(members, arts)]
    if not new_errors and not refused:
        return [(members, arts)]
    # one value stopped a flow (or broke it): the others must still get through it
    half = len(members) // 2
    return build_members(cluster_name, members[:half]) + build_members(cluster_name, members[half:])


def _owners(text: str, members: list[tuple[Row, str]], tpl: int) -> list[Row]:
    return [row for row, _ in members if any(t in text for t in row.tokens(tpl))]


def check_members(cluster_name: str, tpl: int, members: list[tuple[Row, str]], sandbox: Sandbox) -> None:
    """Build with every member's value, compare with the baseline, check
    structure, bash -n and run in the sandbox what the values reached."""
    base_arts, _ = baseline(cluster_name)
    nodes = len(real(cluster_name).nodes)
    by_n = {row.n: row for row, _ in members}
    for group, arts in build_members(cluster_name, members):
        scripts = []
        for lab, (kind, text, args) in arts.items():
            if base_arts.get(lab) == (kind, text, args):
                continue
            owners = _owners(text, group, tpl)
            for row in owners:
                row.reached.add(lab)
            if kind == "refusal":
                for row in owners or [r for r, _ in group]:
                    row.results[tpl] = f"refused: {text.splitlines()[0][:120]}"
                continue
            if kind == "sh":
                scripts.append((lab, text, args, bool(owners)))
                continue
            for p in structure_problems(kind, text, nodes):
                for row in _owners(p, group, tpl) or owners or [r for r, _ in group]:
                    row.failures.append(f"{row.values.get(tpl)!r}: {lab}: {p}")
        if not scripts:
            continue
        rep = sandbox.run([s[1] for s in scripts], [s[2] for s in scripts], [s[3] for s in scripts])
        everyone = [r for r, _ in group]
        for e in rep["errors"]:
            for row in everyone:
                row.failures.append(f"{row.values.get(tpl)!r}: sandbox: {e}")
        for i, e in rep["syntax"].items():
            for row in _owners(scripts[i][1], group, tpl) or everyone:
                row.failures.append(f"{row.values.get(tpl)!r}: {scripts[i][0]}: bash -n fails: {e.strip()[:300]}")
        for rc, i, name in rep["marker"]:
            n = int(name[len(MARK):]) if name[len(MARK):].isdigit() else -1
            where = scripts[i][0] if i >= 0 else "(after the scripts)"
            for row in [by_n[n]] if n in by_n else everyone:
                row.failures.append(f"{row.values.get(tpl)!r}: INJECTION: {where} created {name} (stand-ins exiting {rc}):\n"
                                    + (scripts[i][1][:3000] if i >= 0 else ""))
        executed = {i for i, s in enumerate(scripts) if s[3]}
        for row, v in group:
            if any(any(t in scripts[i][1] for t in row.tokens(tpl)) for i in executed):
                # it reached a script that ran: does a command get the value whole, as (part of) one argument?
                row.whole[tpl] = any(v in a for _, argv in rep["argv"] for a in argv)
        for i, argv in rep["argv"]:
            for a, b in zip(argv, argv[1:]):
                m = re.match(r"^it(\d+)", b)
                if a.endswith("spl") and m and int(m.group(1)) in by_n and by_n[int(m.group(1))].ref.label not in ARGV_FIELDS:
                    row = by_n[int(m.group(1))]
                    row.failures.append(f"{row.values.get(tpl)!r}: {scripts[i][0]}: the value arrives split into two arguments: {argv}")
            for k, a in enumerate(argv[1:], 1):
                m = re.match(r"^-rf(\d+)$", a)
                if not m or int(m.group(1)) not in by_n or by_n[int(m.group(1))].ref.label in ARGV_FIELDS:
                    continue
                row = by_n[int(m.group(1))]
                if argv[k - 1].startswith("-") and argv[0] not in FILE_TOOLS:
                    row.notes.add(f"{argv[0]} {argv[k - 1]} {a}")  # the value of an option: the program may refuse it, no command runs
                else:
                    row.failures.append(f"{row.values.get(tpl)!r}: {scripts[i][0]}: {argv[0]} gets it as an option of its own: {argv}")


FIELDS = enumerate_fields()


@pytest.fixture(scope="module")
def matrix(sandbox) -> dict[str, Row]:
    rows = {ref.id: Row(ref, n) for n, ref in enumerate(FIELDS)}
    for row in rows.values():
        for tpl in range(len(PAYLOADS)):
            classify(row, tpl)
    for cluster_name in CLUSTERS.values():
        for tpl in range(len(PAYLOADS)):
            members = [(row, row.values[tpl]) for row in rows.values()
                       if row.ref.cluster == cluster_name and tpl in row.values and row.results.get(tpl, "").startswith("accepted")]
            # every value at once; --since (which logs refuses as a whole) on its own
            for group in ([m for m in members if m[0].ref.key != "since"], *([m] for m in members if m[0].ref.key == "since")):
                if group:
                    check_members(cluster_name, tpl, group, sandbox)
    return rows


# --- the tests ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cluster_name", list(CLUSTERS.values()), ids=[c.removeprefix("sim-") for c in CLUSTERS.values()])
def test_harness_drives_every_flow_of_the_real_cluster(cluster_name, sandbox):
    """The unchanged cluster: every section builds, every script passes bash -n
    and runs in the sandbox (both modes) without a marker, every file keeps its structure."""
    arts, errors = baseline(cluster_name)
    assert not errors, f"the harness could not drive these flows (update build_artifacts): {errors}"
    for must in ("prepare/", "release/", "deploy/", "ops/", "lock.break/", "logs/", "check/ssh_config", "verify-comm/"):
        assert any(lab.startswith(must) for lab in arts), f"nothing recorded for {must}"
    bad = [f"{lab}: {p}" for lab, (kind, text, _) in arts.items() for p in structure_problems(kind, text, len(real(cluster_name).nodes))]
    scripts = [(lab, a) for lab, a in arts.items() if a[0] == "sh"]
    rep = sandbox.run([a[1] for _, a in scripts], [a[2] for _, a in scripts])
    bad += [f"{scripts[i][0]}: bash -n: {e}" for i, e in rep["syntax"].items()] + rep["errors"]
    bad += [f"marker {name} after {scripts[i][0] if i >= 0 else '?'}" for _, i, name in rep["marker"]]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("ref", FIELDS, ids=[f.id for f in FIELDS])
def test_every_payload_is_rejected_or_quoted(ref: FieldRef, matrix):
    row = matrix[ref.id]
    assert len(row.results) == len(PAYLOADS)
    assert not row.failures, f"{ref.id}:\n" + "\n".join(row.failures)


def test_harness_sees_an_unquoted_value(sandbox: Sandbox):
    """An unquoted value creates the marker (bare, in single or in double
    quotes: each payload escapes one of them); quoted with shlex.quote it does not."""
    injecting = [payload(t, 0) for t in range(len(PAYLOADS)) if t not in (SPLIT_TPL, DASH_TPL)]
    missed = []
    for p in injecting:
        rep = sandbox.run([f"echo {p}\n", f"echo '{p}'\n", f'echo "{p}"\n'])
        if not rep["marker"]:
            missed.append(p)
    assert not missed, f"the harness does not see these injections: {missed}"
    safe = sandbox.run([f"echo {shlex.quote(p)}\n" for p in injecting] + [f"docker run x sh -c {shlex.quote('echo ' + shlex.quote(p))}\n" for p in injecting])
    assert not safe["marker"] and not safe["syntax"], safe
    split = sandbox.run([f"docker run x --name {payload(SPLIT_TPL, 3)}\n", f"docker run x --name {shlex.quote(payload(SPLIT_TPL, 3))}\n"])
    assert sorted({i for i, argv in split["argv"] if any(a.endswith("spl") and b.startswith("it") for a, b in zip(argv, argv[1:]))}) == [0]


def test_harness_sees_a_builder_that_drops_its_quoting(sandbox: Sandbox):
    """systems.vllm_ascend.serve with shlex.join replaced by ' '.join: the field and payloads
    the matrix accepts are then caught (marker, split argument)."""
    from systems.vllm_ascend import serve

    ref = next(f for f in FIELDS if f.id == "a3:profile.quantization")
    baseline(ref.cluster)
    with mock.patch.object(serve, "serve_command", lambda c, p, n: " ".join(serve.vllm_args(c, p, n))):
        text = ""
        for tpl in (2, SPLIT_TPL):
            row = Row(ref, 7)
            classify(row, tpl)
            assert row.results[tpl] == "accepted"
            check_members(ref.cluster, tpl, [(row, row.values[tpl])], sandbox)
            text += "\n".join(row.failures)
    assert "INJECTION" in text and "serve.sh" in text and f"{MARK}7" in text, text
    assert "split into two arguments" in text, text


def test_sandbox_keeps_writes_inside(sandbox: Sandbox, tmp_path):
    """A script that writes to an absolute path, cd's, opens a TCP connection
    and touches a file changes nothing outside the chroot."""
    outside = tmp_path / "must-not-exist"
    rep = sandbox.run([f"echo x > {outside}\ncd / && echo y > {outside}\nexec 3<>/dev/tcp/127.0.0.1/22 && echo open > {outside}\ntouch {outside}\n"])
    assert not outside.exists() and not rep["marker"], rep


def test_every_kind_of_string_field_is_enumerated():
    ids = {f.id for f in FIELDS}
    ids = {re.sub(r"(LLMDEPLOY_INJECT|llmdeploy_inject)\d+", r"\1", i) for i in ids}
    for want in ("a3:name", "a3:nic", "a3:ssh.identity_file", "a3:ssh.jump_host", "a3:nodes[0].name", "a3:nodes[3].ssh_host",
                 "a3:model.path", "a3:model.checksum_files[0]", "a3:image.ref", "a3:image.tarball", "a3:base_dir",
                 "a3:verify.all_reduce_args", "a3:secret_env{key}", "a3:profile.served_model_name", "a3:profile.host",
                 "a3:profile.quantization", "a3:profile.env.HCCL_BUFFSIZE_EP", "a3:profile.env{key}", "a3:profile.ip_env[0]",
                 "a3:profile.additional_config.enable_cpu_binding", "b200:profile.reasoning_parser", "b200:profile.overrides.llmdeploy_inject",
                 "b200:profile.env.LLMDEPLOY_INJECT", "b200:profile.slots{key}", "b200:profile.launch_ssh_config",
                 "gb300-agentic:profile.namespace", "gb300-agentic:profile.wheels[0]", "gb300-agentic:profile.frontend_env.ETCD_LEASE_TTL",
                 "gb300-agentic:profile.workers[0].env.LLMDEPLOY_INJECT", "gb300-agentic:profile.workers[1].gpus{key}",
                 "gb300-agentic:profile.etcd_endpoints", "gb300-agentic:profile.numa_membind", "a3:cli --message"):
        assert want in ids, f"{want} is not enumerated"
    assert len(FIELDS) > 140


LEGEND = {"accepted": "A", "accepted after its real value": "S", "rejected": "-", "CRASH": "X"}


def cell(verdict: str) -> str:
    """A verdict's letter in the matrix; "?" for a verdict the legend does not name."""
    return LEGEND.get(verdict, "r" if verdict.startswith("refused: ") else "?")


def matrix_report(matrix: dict[str, Row]) -> tuple[list[str], list[Row], list[Row]]:
    """The field x payload matrix as text, with the fields that accept some
    payload and those that reject every one."""
    lines = ["payloads: " + "  ".join(f"P{i}={payload(i, 0)!r}" for i in range(len(PAYLOADS))),
             "A accepted, S accepted after the field's real value (e.g. /root/.cache/m$(touch ...)), - rejected naming the field, "
             "r refused by the flow (LlmdeployError), X raises; then per payload w: a stand-in command got the value whole as one argument "
             "(. it reached a script only as a builtin's word, e.g. export K='...')"]
    accepting = [row for row in matrix.values() if any(v.startswith("accepted") or v.startswith("refused") for v in row.results.values())]
    rejecting = [row for row in matrix.values() if all(v == "rejected" for v in row.results.values())]
    lines.append(f"{len(matrix)} fields: {len(rejecting)} reject every payload, {len(accepting)} accept some")
    for row in accepting:
        cells = "".join(cell(row.results[t]) for t in range(len(PAYLOADS)))
        groups = sorted({lab.split("/")[0] for lab in row.reached})
        whole = "".join("w" if row.whole.get(t) else ("." if t in row.whole else " ") for t in range(len(PAYLOADS)))
        lines.append(f"  {row.ref.id:58} {cells} {whole} reaches {len(row.reached):3} ({', '.join(groups)})"
                     + (f"; -rf as an option's value: {sorted(row.notes)[0]}" if row.notes else ""))
    by_cluster: dict[str, list[str]] = {}
    for row in rejecting:
        cluster, _, label = row.ref.id.partition(":")
        by_cluster.setdefault(cluster, []).append(label)
    for cluster, labels in by_cluster.items():
        lines += textwrap.wrap(f"{cluster} rejects every payload in: " + ", ".join(labels), 158, subsequent_indent="    ")
    return lines, accepting, rejecting


def test_the_matrix_accounts_for_every_field_and_payload(matrix):
    """The field x payload matrix (printed with ``-rP``) says what it shows:
    every field has a verdict for every payload, each one a letter of the
    legend, none a crash; every field either rejects every payload or
    accepts (or has refused by its flow) some, and is listed once; a payload
    that reached a script that ran is marked there. The matrix is the module
    fixture's, built once whatever order the tests run in."""
    lines, accepting, rejecting = matrix_report(matrix)
    report = "\n".join(lines)
    print(report)
    for row in matrix.values():
        assert sorted(row.results) == list(range(len(PAYLOADS))), f"{row.ref.id}: {row.results}\n{report}"
        bad = {t: v for t, v in row.results.items() if cell(v) in ("?", "X")}
        assert not bad, f"{row.ref.id}: verdicts the matrix cannot show or that crash: {bad}\n{report}"
        # only a value the schema let through can have reached a script ("w" or "." in the matrix)
        assert not {t for t in row.whole if row.results[t] == "rejected"}, f"{row.ref.id}: {row.results} {row.whole}"
    ids = [row.ref.id for row in accepting + rejecting]
    assert sorted(ids) == sorted(matrix) and len(set(ids)) == len(ids), f"fields missing from the matrix: {set(matrix) - set(ids)}\n{report}"
    # both kinds are there: the schema rejects some fields' payloads outright, the flows quote the others'
    assert accepting and rejecting, report


# --- part B: on the simulated A3 cluster (run by the lead engineer; needs root) -----------------------------
SIM_CLUSTER = "sim-a3"
TRACEBACK = "Traceback (most recent call last)"


def _sim_variant(tmp: Path, marker_dir: Path, which: int) -> dict[str, str]:
    """sim-a3 with payloads in fields part A accepts that reach the nodes:
    which=1 keeps serving working (env values, extra additional_config and
    compilation_config keys, a secret value); which=2 also puts them into
    vllm serve's free-text flags (quantization, safetensors_load_strategy, host:
    serving may fail, nothing may run)."""
    text = (REPO / "inventory" / "sim_a3.py").read_text()
    m = [str(marker_dir / f"m{i}") for i in range(10)]
    anchor = "vllm_a3_w8a8(port=8000, rpc_port=13389)"
    assert anchor in text and "from systems.vllm_ascend.catalogue import IMAGE_A3, image, vllm_a3_w8a8" in text and "    image=image(IMAGE_A3),\n" in text
    env = {"LLMDEPLOY_INJECT_A": f"$(touch {m[0]})", "LLMDEPLOY_INJECT_B": f"`touch {m[1]}`", "LLMDEPLOY_INJECT_C": f"x; touch {m[2]}",
           "LLMDEPLOY_INJECT_D": f"x' ; touch {m[3]} ; '", "LLMDEPLOY_INJECT_E": f'x" ; touch {m[4]} ; "', "LLMDEPLOY_INJECT_F": f"x | touch {m[5]} & y",
           "LLMDEPLOY_INJECT_G": "spl it", "LLMDEPLOY_INJECT_H": "-rf"}
    extra = (f"env={{**a3_env(), **{env!r}}}, "
             f"additional_config={{'enable_cpu_binding': True, 'enable_fused_mc2': 1, 'llmdeploy_note': {f'$(touch {m[6]})'!r}}}, "
             f"compilation_config={{'cudagraph_mode': 'FULL_DECODE_ONLY', 'llmdeploy_note': {f'x; touch {m[6]}' + chr(39)!r}}}")
    if which == 2:
        extra += f", quantization={f'ascend; touch {m[7]}'!r}, safetensors_load_strategy={f'`touch {m[8]}`'!r}, host={f'0.0.0.0 $(touch {m[9]})'!r}"
    text = text.replace(anchor, f"vllm_a3_w8a8(port=8000, rpc_port=13389, {extra})")
    text = text.replace("from systems.vllm_ascend.catalogue import IMAGE_A3, image, vllm_a3_w8a8", "from systems.vllm_ascend.catalogue import IMAGE_A3, a3_env, image, vllm_a3_w8a8")
    text = text.replace("    image=image(IMAGE_A3),\n", f"    image=image(IMAGE_A3),\n    secret_env={{'HF_TOKEN': {SECRET_SRC!r}}},\n")
    inv = tmp / f"inventory{which}"
    inv.mkdir()
    (inv / "sim_a3.py").write_text(text)
    return {"LLMDEPLOY_INVENTORY": str(inv), SECRET_SRC: f"tok$(touch {m[6]})'\"`touch {m[6]}`; touch {m[6]}"}


@pytest.mark.parametrize("which", [1, 2])
def test_part_b_inventories_load_and_quote_their_payloads(which, tmp_path, monkeypatch):
    """Part B's variant inventories (no simulator needed): they load, and the
    plan carries their values quoted (checked by part A's sandbox elsewhere)."""
    from llmdeploy.inventory import load_cluster_file

    env = _sim_variant(tmp_path, tmp_path / "markers", which)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    c = load_cluster_file(Path(env["LLMDEPLOY_INVENTORY"]) / "sim_a3.py")
    assert c.profile.env["LLMDEPLOY_INJECT_A"].startswith("$(touch ") and c.secret_env == {"HF_TOKEN": SECRET_SRC}
    with mock.patch.object(dep, "new_id", lambda chash, now=None: FIXED_RID):
        _, _, plan = dep.plan_release(bind(c), {}, c.image.ref)
    serve_sh = plan.files["sim-a3-1"]["serve.sh"][0]
    assert shlex.quote(c.profile.additional_config["llmdeploy_note"]) in serve_sh or "llmdeploy_note" in serve_sh
    if which == 2:
        assert f"--quantization {shlex.quote(c.profile.quantization)}" in serve_sh


def _no_marker_no_traceback(marker_dir: Path, what: str, res) -> None:
    made = sorted(p.name for p in marker_dir.iterdir())
    assert not made, f"{what}: INJECTION: {made} created under {marker_dir}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    assert TRACEBACK not in res.stdout + res.stderr, f"{what} crashed (exit {res.returncode}):\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"


@pytest.fixture(scope="module")
def marker_dir():
    d = Path("/tmp") / f"llmdeploy-inject-{uuid.uuid4().hex}"
    d.mkdir()
    d.chmod(0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_sim_markers_made_on_a_simulated_host_are_seen(sim_cluster, marker_dir):
    """The harness can fail: a file touched by a command on a simulated host
    shows here (/tmp is shared), so a missing marker means nothing ran."""
    from sim.paths import cluster_dir

    probe = marker_dir / "selfcheck"
    res = subprocess.run(["ssh", "-F", str(cluster_dir(SIM_CLUSTER) / "ssh_config"), "sim-a3-1", f"touch {shlex.quote(str(probe))}"],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    assert probe.exists(), "a file made on a simulated host is not visible here: the marker check would prove nothing"
    probe.unlink()


@pytest.mark.parametrize("which", [1, 2])
@pytest.mark.slow
def test_sim_payloads_in_the_inventory_and_the_cli_run_nothing(sim_cluster, marker_dir, tmp_path, which):
    from sim import hostview
    from sim.paths import host_dir
    from tests.conftest import run_invoke

    env = _sim_variant(tmp_path, marker_dir, which)
    cli = [f"$(touch {marker_dir}/c0)", f"`touch {marker_dir}/c1`", f"x; touch {marker_dir}/c2", f"x' ; touch {marker_dir}/c3 ; '",
           f'x" ; touch {marker_dir}/c4 ; "', f"x\ntouch {marker_dir}/c5", f"x | touch {marker_dir}/c6 & y", "-rf", "[bold]markup[/] spl it"]
    steps = [
        ("prepare", ["prepare", "--cluster", SIM_CLUSTER, "--no-check"], 600),
        ("verify-comm", ["verify-comm", "--cluster", SIM_CLUSTER], 300),
        ("deploy", ["deploy", "--cluster", SIM_CLUSTER, "--skip-prepare", "--force", f"--message={cli[which - 1]}"], 400),
        ("status", ["status", "--cluster", SIM_CLUSTER, "--diff"], 120),
        ("logs", ["logs", "--cluster", SIM_CLUSTER, "--tail", "20"], 120),
    ]
    steps += [(f"logs --since {p!r}", ["logs", "--cluster", SIM_CLUSTER, f"--since={p}"], 120) for p in cli[:3]]
    steps += [(f"stop --message {p!r}", ["stop", "--cluster", SIM_CLUSTER, f"--message={p}"], 300) for p in cli]
    steps += [(f"lock.break --reason {p!r}", ["lock.break", "--cluster", SIM_CLUSTER, f"--reason={p}"], 120) for p in cli]
    steps += [("audit", ["audit", "--cluster", SIM_CLUSTER, "--last", "40"], 120), ("lock.status", ["lock.status", "--cluster", SIM_CLUSTER], 120)]
    lock_dir = host_dir(SIM_CLUSTER, "sim-a3-0") / "root/var/lib/llmdeploy/sim-a3/lock"
    for what, args, timeout in steps:
        if what.startswith("lock.break"):
            # a holder that vanished (its message a payload too), so that the reason is used and audited
            lock_dir.mkdir(parents=True, exist_ok=True)
            (lock_dir / "holder.json").write_text(json.dumps({"who": "ghost@laptop", "pid": 4242, "since": "2026-12-01T03:00:00Z",
                                                              "since_epoch": 1796094000, "command": "deploy", "message": args[-1], "token": "x"}) + "\n")
        res = run_invoke(*args, env=env, timeout=timeout)
        _no_marker_no_traceback(marker_dir, what, res)
        if what == "prepare":
            assert res.returncode == 0, f"prepare of the variant inventory failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
        if what == "deploy" and which == 1:
            # env values, extra JSON config keys and a secret with metacharacters still serve,
            # and the container got the JSON argument whole
            assert res.returncode == 0, f"deploy of variant 1 failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
            names = list(hostview.containers(SIM_CLUSTER, "sim-a3-1"))
            cmds = [c["Config"]["Cmd"] for c in json.loads(hostview.docker(SIM_CLUSTER, "sim-a3-1", "inspect", *names).stdout)]
            notes = [json.loads(c[c.index("--additional-config") + 1]).get("llmdeploy_note") for c in cmds if "--additional-config" in c]
            assert f"$(touch {marker_dir}/m6)" in notes, cmds
        if what.startswith("logs --since"):
            assert res.returncode == 2 and "--since" in res.stderr, res.stderr
        if what.startswith("lock.break"):
            assert res.returncode == 0 and not lock_dir.exists(), res.stdout + res.stderr
    # the node got the values verbatim (docker --env-file: no shell reads it)
    envfile = host_dir(SIM_CLUSTER, "sim-a3-1") / "root/etc/llmdeploy/sim-a3.env"
    assert f"LLMDEPLOY_INJECT_A=$(touch {marker_dir}/m0)" in envfile.read_text()
