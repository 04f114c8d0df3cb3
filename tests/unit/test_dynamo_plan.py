"""invoke deploy --check --json and the in-process release plan for Dynamo
(gb300-agentic, and temporary 3P1D and external-control-plane inventories)
against seed 000's own lines, section "Qwen3.5 GB300 NVL72 Agentic
Disaggregated Serving": its ``docker run`` in every TensorRT-LLM container,
its frontend, setup and role shells (their exports and commands, also run
with ``sh`` next to the seed's own shell lines, with stand-in ``mpirun`` and
``python3``), the control plane, the start order and stop phases, the
readiness probes, an MPI group across four nodes, an external etcd/NATS and
prepare's accessory images. The role YAML values and the placement are
tests/unit/test_dynamo_topology.py's."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from rich.console import Console

from flows import deploy as dep
from flows import engine as engine_mod
from llmdeploy.inventory import load_cluster
from llmdeploy.release import release_dir
from roles import commenv, wheels
from systems.dynamo import workers as dynamo
from roles import image as image_role
from tests.conftest import run_invoke
from flows.binding import bind

SEED = Path(__file__).resolve().parents[1] / "data" / "seeds" / "000_640ab2471bd84fcd.txt"
SECTION = "Qwen3.5 GB300 NVL72 Agentic Disaggregated Serving#"
SECTION_END = "Testing API Endpoint#"
CLUSTER = "gb300-agentic"
# the seed's docker run parts that only make sense for an interactive shell
INTERACTIVE = ("--rm", "-it")
SETUP_HEADER = "Open a shell in this container for each of the frontend, prefill, and decode commands below"
ROLE_HEADERS = {"frontend": "In the frontend shell:", "prefill": "In the prefill shell:", "decode": "In the decode shell:"}
FORCED = "TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS"
EXTERNAL_ETCD = "http://192.0.2.5:2379"
EXTERNAL_NATS = "nats://192.0.2.5:4222"


# --- the seed, parsed --------------------------------------------------------------------
def _section() -> str:
    text = SEED.read_text()
    start = text.index(SECTION)
    return text[start:text.index(SECTION_END, start)]


def _commands(start: str) -> list[str]:
    """Every command of the section beginning with ``start``, continuation lines joined."""
    lines = _section().splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith(start):
            buf, j = [], i
            while True:
                buf.append(lines[j].rstrip().rstrip("\\").strip())
                if not lines[j].rstrip().endswith("\\"):
                    break
                j += 1
            out.append(" ".join(buf))
    return out


def seed_block(header: str) -> list[str]:
    """The raw lines of the shell block after the line starting with ``header``."""
    lines = _section().splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(header))
    out: list[str] = []
    for line in lines[i + 1:]:
        if not line.strip():
            if out:
                break
            continue
        out.append(line)
    return out


def seed_exports(header: str) -> dict[str, str]:
    return dict(line[len("export "):].split("=", 1) for line in seed_block(header) if line.startswith("export "))


def seed_command(header: str) -> list[str]:
    """The block's command after its exports (continuation lines joined), as tokens."""
    rest = [line for line in seed_block(header) if not line.startswith("export ")]
    return shlex.split(" ".join(line.rstrip().rstrip("\\").strip() for line in rest))


def seed_docker_run() -> dict:
    (cmd,) = _commands("docker run ")
    tokens = shlex.split(cmd)
    assert tokens[:2] == ["docker", "run"]
    standalone, pairs, i = [], [], 2
    while tokens[i].startswith("-"):
        if tokens[i] in INTERACTIVE:
            standalone.append(tokens[i])
            i += 1
        else:
            pairs.append((tokens[i], tokens[i + 1]))
            i += 2
    return {"standalone": standalone, "pairs": pairs, "image": tokens[i], "command": tokens[i + 1:]}


def seed_mpirun(role: str) -> list[str]:
    (cmd,) = [c for c in _commands("mpirun ") if f"--disaggregation-mode {role}" in c]
    return shlex.split(cmd)


def seed_setup() -> list[str]:
    return seed_block(SETUP_HEADER)


def seed_profile_env() -> str:
    """The file name the setup block sources ($CONFIG_DIR/<this>)."""
    (line,) = [ln for ln in seed_setup() if ln.startswith("source ")]
    (path,) = shlex.split(line)[1:]
    assert path.startswith("$CONFIG_DIR/")
    return path.removeprefix("$CONFIG_DIR/")


def seed_unset() -> str:
    (line,) = [ln for ln in seed_setup() if ln.startswith("unset ")]
    return line


def seed_curls() -> list[list[str]]:
    return [shlex.split(c) for c in _commands("curl --fail ")]


def _url(tokens: list[str]):
    (url,) = [t for t in tokens if t.startswith("http://")]
    return urlparse(url)


def seed_chat() -> tuple[dict, dict[str, str]]:
    """(body, headers) of the seed's chat request."""
    (tokens,) = [t for t in seed_curls() if "-d" in t]
    headers = dict(h.split(": ", 1) for h in _pairs(tokens, "-H"))
    return json.loads(_pairs(tokens, "-d")[0]), headers


def seed_metric() -> str:
    sec = _section()
    i = sec.index("verify that both worker endpoints expose ")
    return sec[i:].split()[6]


def seed_pins() -> list[str]:
    (cmd,) = _commands("python3 -m pip install ")
    return [t for t in shlex.split(cmd) if "==" in t]


def _pairs(tokens: list[str], flag: str) -> list[str]:
    return [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == flag]


def _has_seq(tokens: list[str], seq: list[str]) -> bool:
    return any(tokens[i:i + len(seq)] == seq for i in range(len(tokens) - len(seq) + 1))


def _labels(tokens: list[str]) -> dict[str, str]:
    return dict(v.split("=", 1) for v in _pairs(tokens, "--label"))


def _exec_line(script: str) -> list[str]:
    """The tokens of the script's last line, an ``exec``."""
    last = script.rstrip("\n").splitlines()[-1]
    tokens = shlex.split(last)
    assert tokens[0] == "exec", last
    return tokens[1:]


def with_served_name(tokens: list[str], served: str) -> list[str]:
    """The seed's ``dynamo.trtllm`` argv with ``--served-model-name <served>``
    right after its ``--model-path <path>``: the one pair the deployment adds,
    so that the worker registers the name the seed's chat request asks for."""
    at = tokens.index("--model-path")
    return tokens[:at + 2] + ["--served-model-name", served] + tokens[at + 2:]


def _strip_ours(tokens: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(mpirun argv without what the deployment adds, the -x names, the rest of the added options)."""
    out, xs, added, i = [], [], [], 0
    while i < len(tokens):
        t = tokens[i]
        if t == "-x":
            xs.append(tokens[i + 1])
            i += 2
        elif t in ("--host", "--hostfile", "--mca"):
            n = 3 if t == "--mca" else 2
            added += tokens[i:i + n]
            i += n
        elif t == "$X":
            added.append(t)
            i += 1
        else:
            out.append(t)
            i += 1
    return out, xs, added


def test_the_seed_parses_as_expected():
    # guards the parser: these are the lines the brief quotes
    d = seed_docker_run()
    assert d["standalone"] == ["--rm", "-it"]
    assert d["pairs"] == [("--name", "qwen35-gb300"), ("--gpus", "all"), ("--network", "host"), ("--ipc", "host"),
                          ("--ulimit", "memlock=-1"), ("--mount", "type=bind,src=$MODEL_DIR,dst=/models/qwen35,readonly"),
                          ("--mount", "type=bind,src=$PWD,dst=/opt/trtllm-recipes,readonly")]
    assert d["image"] == "nvcr.io/nvidia/tensorrt-llm/release:1.3.0a0.dev202610151219" and d["command"] == ["/bin/bash"]
    assert seed_command(ROLE_HEADERS["frontend"]) == shlex.split(
        "python3 -m dynamo.frontend --http-port 8000 --router-mode kv --router-session-affinity-ttl-secs 14400")
    assert seed_mpirun("prefill")[:6] == ["mpirun", "--allow-run-as-root", "-np", "1", "--bind-to", "none"]
    assert seed_mpirun("decode")[:6] == ["mpirun", "--allow-run-as-root", "-np", "2", "--bind-to", "none"]
    assert seed_command(ROLE_HEADERS["decode"]) == seed_mpirun("decode")
    assert seed_mpirun("prefill")[6:] == ["trtllm-llmapi-launch", "python3", "-m", "dynamo.trtllm", "--model-path", "$MODEL_PATH",
                                          "--disaggregation-mode", "prefill", "--extra-engine-args",
                                          "$CONFIG_DIR/qwen3.5-gb300-agentic-prefill.yaml", "--publish-metrics"]
    assert seed_exports(ROLE_HEADERS["frontend"]) == {"ETCD_LEASE_TTL": "120", "DYN_TOKENIZER_CACHE": "1",
                                                      "DYN_TOKENIZER_CACHE_BYTES": "8000000000", "DYN_TOKENIZER": "fastokens"}
    assert list(seed_exports(ROLE_HEADERS["prefill"])) == ["CUDA_VISIBLE_DEVICES", "DYN_SYSTEM_PORT", "CUDA_SCALE_LAUNCH_QUEUES",
                                                           "TRTLLM_SKIP_KV_CACHE_ESTIMATION", "TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL"]
    assert seed_exports(ROLE_HEADERS["decode"]) == {"CUDA_VISIBLE_DEVICES": "1,2", "DYN_SYSTEM_PORT": "8082",
                                                    "TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL": "1"}
    assert list(seed_exports(SETUP_HEADER)) == ["MODEL_PATH", "CONFIG_DIR", "ETCD_ENDPOINTS", "NATS_SERVER", "DYN_NAMESPACE",
                                                "DYN_DISCOVERY_BACKEND", "DYN_REQUEST_PLANE"]
    assert seed_profile_env() == "qwen3.5-gb300-agentic.env" and seed_unset() == f"unset {FORCED}"
    body, headers = seed_chat()
    assert body["model"] == "nvidia/Qwen3.5-397B-A17B-NVFP4-V2" and headers["x-dynamo-session-id"] == "qwen35-example-session"
    assert seed_metric() == "trtllm_kv_cache_utilization"
    assert seed_pins() == ["ai-dynamo==1.6.0.dev20261010", "ai-dynamo-runtime==1.6.0.dev20261010"]
    assert [(_url(t).port, _url(t).path) for t in seed_curls()] == [(8000, "/health"), (8000, "/v1/models"), (8000, "/v1/chat/completions"),
                                                                   (8081, "/metrics"), (8082, "/metrics")]


# --- plans ---------------------------------------------------------------------------------
_DOCS: dict[tuple[str, str | None], dict] = {}


def check_json(cluster: str = CLUSTER, inventory: Path | None = None) -> dict:
    key = (cluster, str(inventory) if inventory else None)
    if key not in _DOCS:
        env = {"LLMDEPLOY_INVENTORY": str(inventory)} if inventory else None
        res = run_invoke("deploy", "--cluster", cluster, "--check", "--json", env=env)
        assert res.returncode == 0, res.stderr
        _DOCS[key] = json.loads(res.stdout)
    return _DOCS[key]


def rdir(doc: dict) -> str:
    return f"/var/lib/llmdeploy/{doc['cluster']}/releases/{doc['release']}"


def units_of(doc: dict) -> list[dict]:
    """Every unit of every node of a check document, with its host."""
    return [{**u, "host": n["host"]} for n in doc["nodes"] for u in n["units"]]


def node_doc(doc: dict, host: str) -> dict:
    return next(n for n in doc["nodes"] if n["host"] == host)


def planned(cluster):
    return dep.plan_release(bind(cluster), {}, "sha256:x")


INVENTORY = """
from llmdeploy.inventory import Budget, Cluster, Model, make_nodes
from systems.dynamo.catalogue import IMAGE_DYNAMO, dynamo_gb300, image
cluster = Cluster(name="{name}", platform="gb300", nic="eth0", nodes=make_nodes("{name}-", {nodes}, "198.51.100.{first}"),
                  model=Model(path="/models/Qwen3.5-397B-A17B-NVFP4-V2"), image=image(IMAGE_DYNAMO), budget=Budget(weights_host_gib=208),
                  profile=dynamo_gb300("{topology}", recipes_dir="/opt/TensorRT-LLM"{extra}))
"""
EXTERNAL = f', etcd_endpoints="{EXTERNAL_ETCD}", nats_server="{EXTERNAL_NATS}"'
TEMP_CLUSTERS = {
    # name: (topology, nodes, first IP's last octet, extra profile arguments)
    "t-3p1d": ("3P1D", 7, 10, ""),
    "t-ext-1p1d": ("1P1D-B8", 1, 30, EXTERNAL),
    "t-ext-3p1d": ("3P1D", 7, 40, EXTERNAL),
    # one inventory per other multi-node topology
    "t-1p2d": ("1P2D", 5, 100, ""),
    "t-1p4d-b1": ("1P4D-B1", 9, 110, ""),
    "t-1p4d-b4": ("1P4D-B4", 9, 120, ""),
    "t-2p3d": ("2P3D", 8, 130, ""),
    "t-3p2d": ("3P2D", 5, 140, ""),
    "t-1p1d-b4": ("1P1D-B4", 1, 150, ""),
}


@pytest.fixture(scope="module")
def inventory(tmp_path_factory) -> Path:
    """An inventory directory of four-GPU GB300 nodes with documentation addresses."""
    inv = tmp_path_factory.mktemp("dynamo") / "inventory"
    inv.mkdir()
    for name, (topology, nodes, first, extra) in TEMP_CLUSTERS.items():
        (inv / f"{name.replace('-', '_')}.py").write_text(textwrap.dedent(INVENTORY.format(
            name=name, topology=topology, nodes=nodes, first=first, extra=extra)))
    return inv


@pytest.fixture
def temp_cluster(inventory):
    """load_cluster for the temporary inventory (LLMDEPLOY_INVENTORY while it loads)."""
    def load(name: str):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("LLMDEPLOY_INVENTORY", str(inventory))
            return load_cluster(name)
    return load


# --- the seed's docker run in every TensorRT-LLM container --------------------------------------
def assert_seeds_docker_run(c, doc_or_plan_units: list[dict], rd: str, rid: str) -> set[str]:
    """Every unit running the serving image has the seed's docker run, detached;
    returns the services of those units."""
    seed = seed_docker_run()
    subst = {"$MODEL_DIR": c.model.path, "$PWD": c.profile.recipes_dir}
    serving = wheels.serving_ref(c)
    seen = set()
    for u in doc_or_plan_units:
        ours = shlex.split(u["container_command"])
        if serving not in ours:
            assert "--gpus" not in ours, u["container"]  # etcd and NATS: no GPUs
            continue
        svc = u["service"]
        seen.add(svc)
        assert u["image"] == serving
        for flag, value in seed["pairs"]:
            if flag == "--name":
                continue
            for k, v in subst.items():
                value = value.replace(k, v)
            assert value in _pairs(ours, flag), (svc, flag, value)
        # the interactive parts, replaced: detached, a release-named container, a script instead of /bin/bash
        assert ours[:3] == ["docker", "run", "-d"]
        for t in (*seed["standalone"], "-i", "-t", "--interactive", "--tty"):
            assert t not in ours, (svc, t)
        container = f"{c.name}-{rid}-{svc}"
        assert _pairs(ours, "--name") == [container] != [dict(seed["pairs"])["--name"]]
        assert u["container"] == container
        at = ours.index(serving)
        assert ours.count(serving) == 1 and ours[at + 1] == "sh" and len(ours) == at + 3
        script = ours[at + 2]
        assert script in (f"{rd}/{svc}.sh", f"{rd}/{svc}.serve.sh", f"{rd}/{svc}.hold.sh"), script
        assert seed["command"] == ["/bin/bash"] and "/bin/bash" not in ours
        # the container's own environment file; the release directory at its own path
        env_file = f"{rd}/{svc}.env"
        assert _pairs(ours, "--env-file") == [env_file]
        assert f"{rd}:{rd}" in _pairs(ours, "-v")
        assert _labels(ours)["llmdeploy.service"] == svc and _labels(ours)["llmdeploy.release"] == rid
    return seen


def test_every_trtllm_container_is_the_seeds_docker_run_detached():
    doc = check_json()
    c = load_cluster(CLUSTER)
    seen = assert_seeds_docker_run(c, units_of(doc), rdir(doc), doc["release"])
    assert seen == {"frontend", "prefill0", "decode0"}
    # in-process, the same commands
    _, _, plan = planned(c)
    units = [{**u.show, "service": plan.service_of(u).name, "container": u.container} for u in plan.units()]
    assert assert_seeds_docker_run(c, units, release_dir(c, plan.release), plan.release) == seen
    # the frontend runs frontend.sh, the single-node workers their serve scripts
    rd = rdir(doc)
    scripts = {u["service"]: shlex.split(u["container_command"])[-1] for u in units_of(doc) if u["service"] in seen}
    assert scripts == {"frontend": f"{rd}/frontend.sh", "prefill0": f"{rd}/prefill0.serve.sh", "decode0": f"{rd}/decode0.serve.sh"}


def test_the_image_is_the_seeds_image_with_the_seeds_wheels():
    c = load_cluster(CLUSTER)
    seed = seed_docker_run()
    assert c.image.ref == seed["image"]
    assert wheels.pins(c) == dict(p.split("==", 1) for p in seed_pins())
    derived = wheels.serving_ref(c)
    assert derived == wheels.derived_ref(c) != seed["image"]
    assert derived.startswith(f"llmdeploy/{CLUSTER}:{seed['image'].rsplit(':', 1)[1]}-wheels-")
    # prepare builds it from the seed's image: pip install the pins, docker commit to that tag
    script = wheels.build(bind(c))
    assert f"tag={shlex.quote(derived)}\n" in script
    # (read by an awk that passes its lines on and prints progress from them)
    (run,) = [ln for ln in script.splitlines() if ln.startswith("{ docker run --name ")]
    tokens = shlex.split(run.removeprefix("{ ").split(" 2>&1;")[0])
    at = tokens.index(seed["image"])
    # unbuffered: pip's lines as it prints them (progress)
    assert tokens[at + 1:at + 7] == ["env", "PYTHONUNBUFFERED=1", "python3", "-m", "pip", "install"] and tokens[-len(seed_pins()):] == seed_pins()
    assert any(ln.startswith("docker commit ") and '"$tag"' in ln for ln in script.splitlines())
    # every container of that image runs the derived one; release.json names both
    doc = check_json()
    assert {u["image"] for u in units_of(doc) if u["service"] in ("frontend", "prefill0", "decode0")} == {derived}
    _, _, plan = planned(c)
    meta = json.loads(plan.files[c.node0.name]["release.json"][0])
    assert (meta["image"], meta["serving_image"]) == (seed["image"], derived)


# --- the frontend ------------------------------------------------------------------------------
def test_the_frontend_runs_exactly_the_seeds_command():
    doc = check_json()
    seed = seed_command(ROLE_HEADERS["frontend"])
    node0 = doc["nodes"][0]
    assert _exec_line(node0["files"]["frontend.sh"]) == seed
    (fe,) = [u for u in units_of(doc) if u["service"] == "frontend"]
    assert shlex.split(fe["serve_command"]) == seed and fe["host"] == node0["host"]
    # only node 0 runs the frontend
    assert [n["host"] for n in doc["nodes"] if "frontend.sh" in n["files"]] == [node0["host"]]


def _env_file(text: str) -> dict[str, str]:
    return commenv.parse_env_file(text)


def assert_setup_block(c, env: dict[str, str], where: str) -> None:
    """The seed's setup exports, the control plane at node 0's IP with the seed's ports."""
    for k, v in seed_exports(SETUP_HEADER).items():
        if k in ("ETCD_ENDPOINTS", "NATS_SERVER"):
            seed_url = urlparse(v)
            assert seed_url.hostname == "127.0.0.1"
            assert env[k] == f"{seed_url.scheme}://{c.node0.ip}:{seed_url.port}", (where, k)
        else:
            assert env[k] == v, (where, k)


def test_frontend_env_is_the_seeds_frontend_and_setup_exports():
    doc = check_json()
    c = load_cluster(CLUSTER)
    env = _env_file(doc["nodes"][0]["files"]["frontend.env"])
    assert_setup_block(c, env, "frontend.env")
    front = seed_exports(ROLE_HEADERS["frontend"])
    assert {k: env[k] for k in front} == front
    # in the seed's order: the setup block, then the frontend's exports
    seed_keys = list(seed_exports(SETUP_HEADER)) + list(front)
    assert [k for k in env if k in seed_keys] == seed_keys
    # the workers' variables stay out of the frontend (weight loading, GPU mask, system port, prefill knobs)
    for role in ("prefill", "decode"):
        for k in seed_exports(ROLE_HEADERS[role]):
            assert k not in env, k
    assert "TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL" not in env and FORCED not in env


# --- the setup part of every script, run ---------------------------------------------------------
def _scripts(files: dict[str, tuple[str, int]]) -> dict[str, str]:
    """The frontend, serve and hold scripts of one node."""
    return {name: text for name, (text, _) in files.items() if name == "frontend.sh" or name.endswith((".serve.sh", ".hold.sh"))}


def _env_file_of(script: str) -> str:
    return "frontend.env" if script == "frontend.sh" else script.split(".")[0] + ".env"


def _scripts_of(plan) -> list[tuple[str, str, str]]:
    return [(host, name, text) for host, files in plan.files.items() for name, text in sorted(_scripts(files).items())]


def assert_sources_and_unsets(plan) -> int:
    source = f'. "$CONFIG_DIR/{seed_profile_env()}"'
    n = 0
    for host, name, text in _scripts_of(plan):
        lines = text.splitlines()
        assert lines.count(source) == 1, (host, name)
        assert lines.count(seed_unset()) == 1, (host, name)
        at, un = lines.index(source), lines.index(seed_unset())
        assert lines[at - 1] == "set -a" and lines[at + 1] == "set +a", (host, name)
        assert at < un < len(lines) - 1 and lines[-1].startswith("exec "), (host, name)
        n += 1
    return n


def test_every_script_sources_the_profile_env_and_unsets_forced_acceptance(temp_cluster):
    _, _, plan = planned(load_cluster(CLUSTER))
    assert assert_sources_and_unsets(plan) == 3  # frontend.sh, prefill0.serve.sh, decode0.serve.sh
    _, _, plan = planned(temp_cluster("t-3p1d"))
    assert assert_sources_and_unsets(plan) == 1 + 3 + 4  # the frontend, 3 prefill serve scripts, decode0's serve + 3 hold


PROFILE_ENV = """\
# a stand-in for the recipes' profile environment
export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
MIMALLOC_PURGE_DELAY=
TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS=3
export TLLM_TEST_GC_KNOB=7
"""


def _fake(bin_dir: Path, name: str, log: Path) -> None:
    """A stand-in command that appends its argv and environment (JSON) to ``log``."""
    code = ("import json, os, sys\n"
            f"with open({str(log)!r}, 'a') as f:\n"
            "    f.write(json.dumps({'tool': sys.argv[1], 'argv': sys.argv[2:], 'env': dict(os.environ)}) + '\\n')\n")
    path = bin_dir / name
    path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c {shlex.quote(code)} {name} \"$@\"\n")
    path.chmod(0o755)


def run_script(tmp: Path, shell: str, text: str, env: dict[str, str], profile_env: str) -> list[dict]:
    """Run ``text`` with ``shell`` (stand-in mpirun and python3 on PATH, the
    profile environment under ``$CONFIG_DIR``); every stand-in call, in order."""
    tmp.mkdir(parents=True, exist_ok=True)
    conf, bin_dir, log = tmp / "conf", tmp / "bin", tmp / "calls.jsonl"
    conf.mkdir(exist_ok=True)
    bin_dir.mkdir(exist_ok=True)
    (conf / seed_profile_env()).write_text(profile_env)
    for name in ("mpirun", "python3"):
        _fake(bin_dir, name, log)
    script = tmp / "script.sh"
    script.write_text(text.replace("@CONF@", str(conf)))
    base = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp)}
    full = {**base, **{k: v.replace("@CONF@", str(conf)) for k, v in env.items()}}
    res = subprocess.run([shell, str(script)], env=full, capture_output=True, text=True, timeout=60, cwd=tmp)
    assert res.returncode == 0, (res.stdout, res.stderr)
    return [json.loads(line) for line in log.read_text().splitlines()]


# the same, every line exported (the seed's shell sources it without ``set -a``)
PROFILE_ENV_EXPORTED = "".join(ln if ln.startswith(("#", "export ")) else f"export {ln}" for ln in PROFILE_ENV.splitlines(keepends=True))
IGNORED_ENV = {"PATH", "HOME", "PWD", "OLDPWD", "SHLVL", "_", "LC_CTYPE"}


def _final_env(call: dict) -> dict[str, str]:
    return {k: v for k, v in call["env"].items() if k not in IGNORED_ENV}


@pytest.mark.parametrize("script", ["frontend.sh", "prefill0.serve.sh", "decode0.serve.sh"])
def test_the_setup_part_exports_the_profile_env_and_unsets_forced_acceptance(tmp_path, script):
    c = load_cluster(CLUSTER)
    _, _, plan = planned(c)
    files = plan.files[c.node0.name]
    text = files[script][0]
    lines = text.splitlines()
    # the setup part: everything up to the seed's unset line, then a stand-in that shows the environment
    setup = "\n".join(lines[:lines.index(seed_unset()) + 1]) + "\nexec python3 -c env-dump\n"
    env = {**_env_file(files[_env_file_of(script)][0]), "CONFIG_DIR": "@CONF@", FORCED: "9"}  # also set by the container
    (call,) = run_script(tmp_path, "sh", setup, env, PROFILE_ENV)
    got = call["env"]
    assert FORCED not in got
    # the profile's variables, exported (with and without export in the file), the empty one too
    assert got["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True" and got["TLLM_TEST_GC_KNOB"] == "7"
    assert got["MIMALLOC_PURGE_DELAY"] == ""
    # the environment file's variables stay
    for k, v in _env_file(files[_env_file_of(script)][0]).items():
        assert got[k] == (str(tmp_path / "conf") if k == "CONFIG_DIR" else v), k
    # a missing profile environment stops the script before anything runs
    broken = tmp_path / "missing"
    res = subprocess.run(["sh", "-c", setup], env={"PATH": "/usr/bin:/bin", "CONFIG_DIR": str(broken)}, capture_output=True, text=True)
    assert res.returncode == 2 and f"{broken}/{seed_profile_env()} is missing" in res.stderr


# --- the workers ----------------------------------------------------------------------------------
def assert_seeds_mpirun(ours: list[str], role: str, ranks: int, rd: str, worker: str, served: str) -> list[str]:
    """``ours`` is the seed's mpirun line for ``role`` with -np ``ranks``, the
    release's merged file for the seed's YAML and ``--served-model-name
    <served>`` after its ``--model-path``, token for token, plus the
    deployment's own options between ``--bind-to none`` and the launch; the -x names."""
    seed = seed_mpirun(role)
    at_seed = seed.index("trtllm-llmapi-launch")
    assert seed[2] == "-np"
    head = [str(ranks) if i == 3 else t for i, t in enumerate(seed[:at_seed])]
    yaml_path = _pairs(seed, "--extra-engine-args")[0]
    tail = with_served_name([f"{rd}/{worker}.config.yaml" if t == yaml_path else t for t in seed[at_seed:]], served)
    assert ours[:len(head)] == head, ours
    at = ours.index("trtllm-llmapi-launch")
    assert ours[at:] == tail
    stripped, xs, _ = _strip_ours(ours[:at])
    assert stripped == head
    assert "CUDA_VISIBLE_DEVICES" not in xs
    return xs


def test_worker_serve_scripts_are_the_seeds_mpirun():
    doc = check_json()
    c = load_cluster(CLUSTER)
    rd = rdir(doc)
    files = doc["nodes"][0]["files"]
    for worker, role, ranks in (("prefill0", "prefill", 1), ("decode0", "decode", 2)):
        script = files[f"{worker}.serve.sh"]
        ours = _exec_line(script)
        xs = assert_seeds_mpirun(ours, role, ranks, rd, worker, c.profile.served_model_name)
        assert ours[6:8] == ["--host", f"localhost:{ranks}"]
        # every variable of its environment file goes to the ranks, except the per-node ones (the GPU mask, the
        # node's NIC: each container has its own, systems.mpi_exports); then the profile's
        env = _env_file(files[f"{worker}.env"])
        per_node = ("CUDA_VISIBLE_DEVICES", *commenv.node_specific(c))
        assert xs == [k for k in env if k not in per_node]
        assert ours[ours.index("trtllm-llmapi-launch") - 1] == "$X"
        # the merged file: the seed's YAML (from the recipes checkout) with the role settings layered on
        (merge,) = [ln for ln in script.splitlines() if ln.startswith("python3 ")]
        seed_yaml = _pairs(seed_mpirun(role), "--extra-engine-args")[0]
        assert shlex.split(merge)[1:] == [f"{rd}/merge-config.py", seed_yaml, f"{rd}/{worker}.overrides.yaml", f"{rd}/{worker}.config.yaml"]
        # what --check shows is that line
        (unit,) = [u for u in units_of(doc) if u["service"] == worker]
        shown = unit["serve_command"].replace(f" <-x every variable of {seed_profile_env()}> ", " $X ")
        # numa_membind auto: check mode says which prepare record decides numactl (tests/unit/test_numactl_check.py)
        shown = re.sub(r"\[numactl -m 0,1 or nothing: [^\]]*\] ", "", shown)
        assert shlex.split(shown) == ours
        assert unit["cuda_visible_devices"] == seed_exports(ROLE_HEADERS[role])["CUDA_VISIBLE_DEVICES"]
        assert str(unit["system_port"]) == seed_exports(ROLE_HEADERS[role])["DYN_SYSTEM_PORT"]
        assert c.profile.topology == doc["topology"] == "1P1D-B8"


def test_worker_env_files_are_the_seeds_role_exports():
    doc = check_json()
    c = load_cluster(CLUSTER)
    files = doc["nodes"][0]["files"]
    prefill, decode = seed_exports(ROLE_HEADERS["prefill"]), seed_exports(ROLE_HEADERS["decode"])
    for worker, role, seed in (("prefill0", "prefill", prefill), ("decode0", "decode", decode)):
        env = _env_file(files[f"{worker}.env"])
        assert_setup_block(c, env, worker)
        assert {k: env[k] for k in seed} == seed, worker
        # nothing of the other role, nothing of the frontend
        other = decode if role == "prefill" else prefill
        for k in set(other) - set(seed):
            assert k not in env, (worker, k)
        for k in seed_exports(ROLE_HEADERS["frontend"]):
            assert k not in env, (worker, k)
        assert FORCED not in env


@pytest.mark.parametrize("name", [CLUSTER, "t-1p2d", "t-1p4d-b1", "t-1p4d-b4", "t-2p3d", "t-3p1d", "t-3p2d"])
def test_every_worker_registers_the_name_that_readiness_and_the_seeds_chat_ask_for(name, temp_cluster):
    """Without --served-model-name a Dynamo worker registers a name derived from
    --model-path ("$MODEL_PATH", /models/qwen35): /v1/models and the chat
    request, which ask for the checkpoint's id, would never pass."""
    c = load_cluster(CLUSTER) if name == CLUSTER else temp_cluster(name)
    _, _, plan = planned(c)
    body, _ = seed_chat()
    (models,) = [p for p in plan.ready if p.path == "/v1/models"]
    chats = [p for p in plan.ready if p.path == "/v1/chat/completions"]
    assert models.arg == body["model"] == c.profile.served_model_name
    assert chats and all(p.body["model"] == body["model"] for p in chats)
    launches = []
    for host, fname, text in _scripts_of(plan):
        argv = _exec_line(text)
        if fname.endswith(".serve.sh"):
            args = argv[argv.index("dynamo.trtllm") + 1:]
            assert _pairs(args, "--served-model-name") == [body["model"]], (host, fname)
            assert _pairs(args, "--model-path") == ["$MODEL_PATH"], (host, fname)  # the seed's spelling stays
            launches.append(fname.split(".")[0])
        else:
            assert "dynamo.trtllm" not in argv, (host, fname)
    assert sorted(launches) == sorted(w.name for w in dynamo.placement(c, c.profile))
    # what --check shows for each launcher is that line
    for u in plan.units():
        if "serve_command" in u.show and u.role in ("prefill", "decode"):
            assert f"--served-model-name {body['model']} " in u.show["serve_command"], u.container


# --- the seed's shells against ours, both run -----------------------------------------------------
def seed_shell(role: str) -> str:
    """The seed's lines for a role's shell: the setup block (CONFIG_DIR at the
    stand-in directory), then the role's exports and command; bash, as in the container."""
    setup = ["export CONFIG_DIR=@CONF@" if ln.startswith("export CONFIG_DIR=") else ln for ln in seed_setup()]
    return "set -e\n" + "\n".join(setup + seed_block(ROLE_HEADERS[role])) + "\n"


def differential(tmp: Path, role: str, profile_env: str):
    """(the seed's last call, ours, the cluster, the plan, the worker or None)."""
    c = load_cluster(CLUSTER)
    _, _, plan = planned(c)
    files = plan.files[c.node0.name]
    worker = None if role == "frontend" else next(w for w in dynamo.placement(c, c.profile) if w.role == role)
    script = "frontend.sh" if worker is None else f"{worker.name}.serve.sh"
    seed_calls = run_script(tmp / "seed", "bash", seed_shell(role), {}, profile_env)
    env = {**_env_file(files[_env_file_of(script)][0]), "CONFIG_DIR": "@CONF@"}
    our_calls = run_script(tmp / "ours", "sh", files[script][0], env, profile_env)
    return seed_calls[-1], our_calls[-1], c, plan, worker


def assert_same_end(seed: dict, ours: dict, c, plan, worker, tmp: Path) -> None:
    assert seed["tool"] == ours["tool"] == ("python3" if worker is None else "mpirun")
    s_env, o_env = _final_env(seed), _final_env(ours)
    # what the deployment changes on purpose: the control plane at node 0, the node's NIC for NCCL/GLOO
    for k in ("ETCD_ENDPOINTS", "NATS_SERVER"):
        u = urlparse(s_env.pop(k))
        assert o_env.pop(k) == f"{u.scheme}://{c.node0.ip}:{u.port}"
    for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
        assert o_env.pop(k) == c.node0.nic
    # what a worker adds so that its system port's /health turns ready (systems/dynamo/placement.py, HEALTH_ENDPOINTS)
    if worker is not None:
        assert o_env.pop("DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS") == '["generate"]'
    s_env["CONFIG_DIR"] = s_env["CONFIG_DIR"].replace(str(tmp / "seed"), str(tmp / "ours"))
    assert o_env == s_env
    if worker is None:
        assert ours["argv"] == seed["argv"]
        return
    rd = release_dir(c, plan.release)
    seed_yaml = _pairs(seed["argv"], "--extra-engine-args")[0]
    assert seed_yaml == f"{tmp / 'seed' / 'conf'}/{dynamo.base_yaml_name(c.profile, worker)}"
    want = with_served_name([f"{rd}/{worker.name}.config.yaml" if a == seed_yaml else a for a in seed["argv"]], c.profile.served_model_name)
    stripped, xs, added = _strip_ours(ours["argv"])
    assert stripped == want
    assert added == ["--host", f"localhost:{worker.ranks}"]
    # the ranks get every variable of the final environment but the per-node ones: the GPU mask and the NIC
    # (each node's container has its own)
    per_node = ("CUDA_VISIBLE_DEVICES", *commenv.node_specific(c))
    assert set(xs) == {k for k in _final_env(ours) if k not in per_node}


@pytest.mark.parametrize("role", ["frontend", "prefill", "decode"])
def test_our_scripts_end_where_the_seeds_shells_end(tmp_path, role):
    """The seed's own lines and our script, run: the same command with the same
    environment (but for the endpoints and the NIC), the forced acceptance unset."""
    seed, ours, c, plan, worker = differential(tmp_path, role, PROFILE_ENV_EXPORTED)
    assert FORCED not in seed["env"] and FORCED not in ours["env"]
    assert ours["env"]["MIMALLOC_PURGE_DELAY"] == ""
    assert_same_end(seed, ours, c, plan, worker, tmp_path)


# the profile environment setting a variable a role exports after it in the seed
PROFILE_ENV_WITH_ROLE_VARIABLES = PROFILE_ENV_EXPORTED + """\
export CUDA_SCALE_LAUNCH_QUEUES=2x
export TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL=0
export DYN_TOKENIZER=hf
"""


@pytest.mark.parametrize("role", ["frontend", "prefill", "decode"])
def test_role_exports_win_over_the_profile_env_as_in_the_seed(tmp_path, role):
    seed, ours, c, plan, worker = differential(tmp_path, role, PROFILE_ENV_WITH_ROLE_VARIABLES)
    # the seed's shell ends with the role's own values
    role_exports = seed_exports(ROLE_HEADERS[role])
    for k in set(role_exports) & {"CUDA_SCALE_LAUNCH_QUEUES", "TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL", "DYN_TOKENIZER"}:
        assert seed["env"][k] == role_exports[k]
    assert_same_end(seed, ours, c, plan, worker, tmp_path)


# --- the weight-loading variable, per topology -------------------------------------------------------
WEIGHTS = dynamo.WEIGHT_LOADING_ENV
# a profile environment that sets it (the seed: it "preserves the source profile's ... weight-staging ... settings")
PROFILE_ENV_WITH_WEIGHTS = PROFILE_ENV_EXPORTED + f"export {WEIGHTS}=0\n"
EVERY_TOPOLOGY = [CLUSTER, "t-1p1d-b4", "t-1p2d", "t-1p4d-b1", "t-1p4d-b4", "t-2p3d", "t-3p1d", "t-3p2d"]


def test_the_seed_names_the_weight_loading_variable_and_when_to_unset_it():
    sec = " ".join(_section().split())
    assert seed_exports(ROLE_HEADERS["prefill"])[WEIGHTS] == seed_exports(ROLE_HEADERS["decode"])[WEIGHTS] == "1"
    assert (f"For the two colocated 1P1D profiles, retain cache_transceiver_config.kv_cache_bounce_size_mb: 2048 on both roles "
            f"and {WEIGHTS}=1 on both workers. For the other profiles, remove that bounce-size override and unset the "
            "weight-loading variable to use the pinned runtime’s defaults.") in sec
    colocated = {t.name for t in dynamo.TOPOLOGIES.values() if t.colocated}
    assert colocated == {"1P1D-B8", "1P1D-B4"}


@pytest.mark.parametrize("name", EVERY_TOPOLOGY)
def test_the_weight_loading_variable_is_unset_where_the_seed_says(name, temp_cluster, tmp_path):
    """Colocated 1P1D: every worker keeps TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL=1
    (its own export wins over the profile environment) and its ranks get it.
    Every other topology: each worker script unsets it after sourcing the
    profile environment, so neither the launcher's shell nor any rank (mpirun
    -x) has it, whatever the profile environment says. The frontend is left alone."""
    c = load_cluster(CLUSTER) if name == CLUSTER else temp_cluster(name)
    colocated = c.profile.topology_info.colocated
    _, _, plan = planned(c)
    source = f'. "$CONFIG_DIR/{seed_profile_env()}"'
    scripts = 0
    for host, fname, text in _scripts_of(plan):
        lines = text.splitlines()
        worker = fname != "frontend.sh"
        if worker and not colocated:
            assert lines.count(f"unset {WEIGHTS}") == 1, (host, fname)
            assert lines.index(source) < lines.index(seed_unset()) < lines.index(f"unset {WEIGHTS}"), (host, fname)
            # after it, nothing sets it again
            assert not any(WEIGHTS in ln for ln in lines[lines.index(f"unset {WEIGHTS}") + 1:]), (host, fname)
        else:
            assert f"unset {WEIGHTS}" not in lines, (host, fname)
        scripts += worker
        if not worker:
            continue
        # run it: the launcher to its mpirun, a holder's setup to a stand-in that shows its environment
        env = {**_env_file(plan.files[host][_env_file_of(fname)][0]), "CONFIG_DIR": "@CONF@"}
        assert (env.get(WEIGHTS) == "1") == colocated, (host, fname)
        body = text if fname.endswith(".serve.sh") else text.replace("exec sleep infinity", "exec python3 -c env-dump")
        call = run_script(tmp_path / host / fname, "sh", body, env, PROFILE_ENV_WITH_WEIGHTS)[-1]
        if colocated:
            assert call["env"][WEIGHTS] == "1", (host, fname)
        else:
            assert WEIGHTS not in call["env"], (host, fname)
        if call["tool"] == "mpirun":
            _, xs, _ = _strip_ours(call["argv"][:call["argv"].index("trtllm-llmapi-launch")])
            assert (WEIGHTS in xs) == colocated, (host, fname)
            # -x names only variables the launcher has (OpenMPI warns about the others and passes nothing)
            assert set(xs) <= set(call["env"]), (host, fname)
    assert scripts == sum(len(w.nodes) for w in dynamo.placement(c, c.profile))


# --- the control plane, the order, the probes ------------------------------------------------------
def test_etcd_and_nats_run_on_node_0_with_their_data_in_the_release():
    doc = check_json()
    c = load_cluster(CLUSTER)
    rd = rdir(doc)
    n0 = c.node0
    setup = seed_exports(SETUP_HEADER)
    etcd_port, nats_port = urlparse(setup["ETCD_ENDPOINTS"]).port, urlparse(setup["NATS_SERVER"]).port
    units = {u["service"]: u for u in units_of(doc)}
    etcd, nats = shlex.split(units["etcd"]["container_command"]), shlex.split(units["nats"]["container_command"])
    assert units["etcd"]["host"] == units["nats"]["host"] == n0.name
    assert units["etcd"]["image"] == c.profile.etcd_image and c.profile.etcd_image in etcd
    assert units["nats"]["image"] == c.profile.nats_image and c.profile.nats_image in nats
    for cmd in (etcd, nats):
        assert cmd[:3] == ["docker", "run", "-d"] and _pairs(cmd, "--network") == ["host"] and f"{rd}:{rd}" in _pairs(cmd, "-v")
    assert _pairs(etcd, "--listen-client-urls") == [f"http://0.0.0.0:{etcd_port}"]
    assert _pairs(etcd, "--advertise-client-urls") == [f"http://{n0.ip}:{etcd_port}"]
    # their state in the container, not the release: a release started again must not get its dead instances back
    assert _pairs(etcd, "--data-dir") == ["/etcd-data"]
    at = nats.index("nats-server")
    assert nats[at:] == ["nats-server", "-js", "-p", str(nats_port), "-m", "8222", "-sd", "/nats-data"]
    # their gates
    services = {s["name"]: s for s in doc["services"]}
    assert services["etcd"]["started"] == f"GET /health on {n0.name}:{etcd_port}"
    assert services["nats"]["started"] == f"GET /healthz on {n0.name}:8222"
    _, _, plan = planned(c)
    e, n = plan.service("etcd").started, plan.service("nats").started
    assert (e.kind, e.host, e.ip, e.port, e.path, e.check, e.arg) == ("http", n0.name, "127.0.0.1", etcd_port, "/health", "json", "health=true")
    assert (n.kind, n.host, n.ip, n.port, n.path, n.check, n.arg) == ("http", n0.name, "127.0.0.1", 8222, "/healthz", "json", "status=ok")
    # prepare pulls those two images on node 0 only
    assert image_role.accessories(c) == [c.profile.etcd_image, c.profile.nats_image]
    script = image_role.accessories_build(bind(c), n0, check=False)
    for ref in (c.profile.etcd_image, c.profile.nats_image):
        assert f"docker pull {shlex.quote(ref)}" in script
        assert f"would-pull {ref}" in image_role.accessories_build(bind(c), n0, check=True)


def test_start_order_and_reverse_stop_phases():
    doc = check_json()
    got = [(s["name"], s["after"], s["restart"]) for s in doc["services"]]
    assert got == [("etcd", [], "none"), ("nats", [], "none"), ("frontend", ["etcd", "nats"], "each"),
                   ("prefill0", ["frontend"], "group"), ("decode0", ["frontend"], "group")]
    phases = {u["service"]: int(_labels(shlex.split(u["container_command"]))["llmdeploy.stop_phase"]) for u in units_of(doc)}
    assert [phases[s["name"]] for s in doc["services"]] == [4, 3, 2, 1, 0]
    assert all(u["order"] == (1 if s["name"] in ("prefill0", "decode0") else 0) for s in doc["services"] for u in s["units"])


def test_readiness_probes_are_the_seeds_checks():
    c = load_cluster(CLUSTER)
    _, _, plan = planned(c)
    n0 = c.node0.name
    ready = plan.ready
    body, headers = seed_chat()
    prefill, decode = seed_exports(ROLE_HEADERS["prefill"]), seed_exports(ROLE_HEADERS["decode"])
    ports = {"prefill0": int(prefill["DYN_SYSTEM_PORT"]), "decode0": int(decode["DYN_SYSTEM_PORT"])}
    front = _url(seed_curls()[0]).port
    # the first: the frontend's body lists both workers
    first = ready[0]
    assert (first.host, first.port, first.path, first.check) == (n0, front, "/health", "dynamo_health")
    assert [(w["name"], w["role"], w["port"]) for w in json.loads(first.arg)] == [("prefill0", "prefill", 8081), ("decode0", "decode", 8082)]
    by = {(p.port, p.path, p.method): p for p in ready}
    for name, port in ports.items():
        assert by[(port, "/health", "GET")].host == n0
        # the seed's curl --fail of /metrics: Prometheus text; its "after traffic" metric is not waited for
        m = by[(port, "/metrics", "GET")]
        assert (m.host, m.check) == (n0, "prometheus")
    assert not any(seed_metric() in p.arg for p in ready)
    models = by[(front, "/v1/models", "GET")]
    assert (models.check, models.arg) == ("models", body["model"])
    chat = by[(front, "/v1/chat/completions", "POST")]
    assert chat.body == body and chat.headers["x-dynamo-session-id"] == headers["x-dynamo-session-id"]
    assert chat.check == "answer"
    # last, the first check again, waiting (not failing) until the frontend lists exactly the workers
    last = ready[-1]
    assert (last.path, last.check, last.arg, last.wait_body) == ("/health", "dynamo_health", first.arg, True) and not first.wait_body
    assert len(ready) == 1 + 2 + 1 + 1 + 2 + 1
    # every curl of the seed is one of them, on the same port and path
    for tokens in seed_curls():
        u = _url(tokens)
        assert (u.port, u.path, "POST" if "-d" in tokens else "GET") in by
    # deploy --check names the two reads of the frontend's /health apart
    shown = check_json()["ready"]
    assert shown[0] == f"{first.describe()} ({first.name})" and shown[-1] == f"{last.describe()} ({last.name})"
    assert shown[1:-1] == [p.describe() for p in ready[1:-1]]


# --- 3P1D across seven nodes ------------------------------------------------------------------------
def test_3p1d_decode_is_one_mpi_group_across_four_nodes(temp_cluster, inventory):
    c = temp_cluster("t-3p1d")
    doc = check_json("t-3p1d", inventory)
    rd = rdir(doc)
    assert [n["host"] for n in doc["nodes"]] == [n.name for n in c.nodes] and len(c.nodes) == 7
    workers = {w["name"]: w for w in doc["workers"]}
    assert list(workers) == ["prefill0", "prefill1", "prefill2", "decode0"]
    d = workers["decode0"]
    decode_nodes = [h for h, _ in d["nodes"]]
    assert (d["profile"], d["ranks"], len(decode_nodes)) == ("D16-B8", 16, 4)
    launcher, holders = decode_nodes[0], decode_nodes[1:]
    # the launcher: the seed's decode line with -np 16, the hostfile and the launch agent
    files = node_doc(doc, launcher)["files"]
    ours = _exec_line(files["decode0.serve.sh"])
    assert_seeds_mpirun(ours, "decode", 16, rd, "decode0", c.profile.served_model_name)
    assert _has_seq(ours, ["--hostfile", f"{rd}/decode0.hostfile", "--mca", "plm_rsh_agent", f"{rd}/decode0.mpi-agent.sh"])
    assert "--host" not in ours
    hosts = [ln.split() for ln in files["decode0.hostfile"].splitlines() if ln.strip() and not ln.startswith("#")]
    assert hosts == [[str(c.node(h).ip), "slots=4"] for h in decode_nodes]
    for h in decode_nodes:
        f = node_doc(doc, h)["files"]
        assert "decode0.mpi-agent.sh" in f, h
        assert f"docker exec -i {c.name}-{doc['release']}-decode0 " in f["decode0.mpi-agent.sh"]
        env = _env_file(f["decode0.env"])
        assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3", h
        assert_setup_block(c, env, h)
        assert ("decode0.serve.sh" in f, "decode0.hold.sh" in f, "decode0.hostfile" in f) == ((True, False, True) if h == launcher else (False, True, False))
    (unit_list,) = [s["units"] for s in doc["services"] if s["name"] == "decode0"]
    assert [(u["host"], u["order"]) for u in unit_list] == [(launcher, 1)] + [(h, 0) for h in holders]
    for u in units_of(doc):
        if u["service"] == "decode0":
            script = shlex.split(u["container_command"])[-1]
            assert script == f"{rd}/decode0.{'serve' if u['host'] == launcher else 'hold'}.sh"
            assert u["cuda_visible_devices"] == "0,1,2,3"
    # the holders hold: the setup, the merge, then sleep
    for h in holders:
        assert _exec_line(node_doc(doc, h)["files"]["decode0.hold.sh"]) == ["sleep", "infinity"]
    # the three prefill workers: one node each, their slots said outright
    for i in range(3):
        ((host, gpus),) = workers[f"prefill{i}"]["nodes"]
        assert gpus == [0, 1, 2, 3]
        f = node_doc(doc, host)["files"]
        ours = _exec_line(f[f"prefill{i}.serve.sh"])
        assert_seeds_mpirun(ours, "prefill", 4, rd, f"prefill{i}", c.profile.served_model_name)
        assert ours[6:8] == ["--host", "localhost:4"]
        assert "--hostfile" not in ours and "plm_rsh_agent" not in ours and f"prefill{i}.mpi-agent.sh" not in f
    # every TensorRT-LLM container has the seed's docker run
    seen = assert_seeds_docker_run(c, units_of(doc), rd, doc["release"])
    assert seen == {"frontend", "prefill0", "prefill1", "prefill2", "decode0"}


def test_3p1d_in_process_no_rank_gets_a_gpu_mask_through_mpirun(temp_cluster):
    c = temp_cluster("t-3p1d")
    _, _, plan = planned(c)
    rd = release_dir(c, plan.release)
    serves = 0
    for host, name, text in _scripts_of(plan):
        if name.endswith(".serve.sh"):
            serves += 1
            _, xs, _ = _strip_ours(_exec_line(text)[:_exec_line(text).index("trtllm-llmapi-launch")])
            assert "CUDA_VISIBLE_DEVICES" not in xs and xs, (host, name)
    assert serves == 4
    # each node's container has its own mask (its GPUs), not the launcher's
    for w in dynamo.placement(c, c.profile):
        for host, gpus in w.nodes:
            env = _env_file(plan.files[host][f"{w.name}.env"][0])
            assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, gpus))
            # a non-colocated topology: the weight-loading variable stays unset (the seed)
            assert "TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL" not in env
    assert plan.service("decode0").restart == "group" and len(plan.service("decode0").units) == 4
    assert f"{rd}/decode0.hostfile" in plan.units(c.nodes[3].name)[0].show["serve_command"]
    # the stop phases: control plane last, the workers first, a playbook entry's services together
    phases = [int(_labels(shlex.split(u.show["container_command"]))["llmdeploy.stop_phase"]) for u in plan.units()]
    assert phases == [4, 3, 2] + [1] * 3 + [0] * 4


# --- an external control plane ------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["t-ext-1p1d", "t-ext-3p1d"])
def test_external_control_plane_is_probed_not_started(temp_cluster, inventory, name):
    c = temp_cluster(name)
    n0 = c.node0
    doc = check_json(name, inventory)
    # no etcd or NATS container anywhere
    assert [s["name"] for s in doc["services"]][:3] == ["etcd", "nats", "frontend"]
    services = {s["name"]: s for s in doc["services"]}
    assert services["etcd"]["units"] == [] and services["nats"]["units"] == []
    assert services["frontend"]["after"] == ["etcd", "nats"]
    for u in units_of(doc):
        cmd = shlex.split(u["container_command"])
        assert c.profile.etcd_image not in cmd and c.profile.nats_image not in cmd
        assert "etcd" not in cmd and "nats-server" not in cmd and u["service"] not in ("etcd", "nats")
    assert f"({urlparse(EXTERNAL_NATS).hostname}:{urlparse(EXTERNAL_NATS).port} on {n0.name})" in services["nats"]["started"]
    # the gates, in-process: from node 0 to the external addresses
    _, _, plan = planned(c)
    assert plan.service("etcd").units == [] and plan.service("nats").units == []
    e, n = plan.service("etcd").started, plan.service("nats").started
    assert (e.kind, e.host, e.ip, e.port, e.path, e.check, e.arg) == ("http", n0.name, "192.0.2.5", 2379, "/health", "json", "health=true")
    assert (n.kind, n.host, n.ip, n.port) == ("port", n0.name, "192.0.2.5", 4222)
    # every environment file of every node names them
    count = 0
    for host, files in plan.files.items():
        for fname, (text, _) in files.items():
            if fname == "env" or fname.endswith(".env"):
                env = _env_file(text)
                assert (env["ETCD_ENDPOINTS"], env["NATS_SERVER"]) == (EXTERNAL_ETCD, EXTERNAL_NATS), (host, fname)
                count += 1
    assert count >= 2 * len(c.nodes)
    # prepare pulls no accessory image
    assert image_role.accessories(c) == []
    assert all(image_role.accessories_build(bind(c), node, check) is None for node in c.nodes for check in (True, False))


def test_accessory_images_are_node_0s_only(temp_cluster):
    c = temp_cluster("t-3p1d")
    assert image_role.accessories(c) == [c.profile.etcd_image, c.profile.nats_image]
    assert image_role.accessories_build(bind(c), c.node0, check=True) is not None
    assert all(image_role.accessories_build(bind(c), node, check=False) is None for node in c.nodes[1:])


def test_check_names_the_external_etcd_address(inventory):
    doc = check_json("t-ext-1p1d", inventory)
    started = next(s["started"] for s in doc["services"] if s["name"] == "etcd")
    assert "192.0.2.5:2379" in started, started


# --- the engine at an external control plane's gates (no connection: stand-ins) ------------------------
class _Runner:
    """Answers every command as if the port were open; records what ran where."""

    def __init__(self):
        self.ran: list[tuple[str, str]] = []

    def exec(self, node, script, timeout=None):
        self.ran.append((node.name, script))
        return "open\n", "", 0


def _gates(c, monkeypatch) -> tuple[list, _Runner, list[bool]]:
    probed = []
    monkeypatch.setattr(engine_mod, "http_probe", lambda runner, node, p, timeout: probed.append((node.name, p.ip, p.port, p.path)))
    _, _, plan = planned(c)
    runner = _Runner()
    eng = engine_mod.Engine(bind(c), runner, Console(quiet=True), quiet=True)
    out = engine_mod.Outcome(ok=False, release=plan.release)
    results = [eng.wait_started(plan, plan.service(name), out) for name in ("etcd", "nats")]
    return probed, runner, results


def test_engine_gates_on_the_control_plane_it_starts(monkeypatch):
    c = load_cluster(CLUSTER)
    probed, runner, results = _gates(c, monkeypatch)
    assert results == [True, True]
    assert probed == [(c.node0.name, "127.0.0.1", 2379, "/health"), (c.node0.name, "127.0.0.1", 8222, "/healthz")]


def test_engine_gates_on_an_external_control_plane(temp_cluster, monkeypatch):
    c = temp_cluster("t-ext-1p1d")
    probed, runner, results = _gates(c, monkeypatch)
    assert results == [True, True]
    assert probed == [(c.node0.name, "192.0.2.5", 2379, "/health")]
    # NATS: its client port from node 0, with no container to watch
    ((host, script),) = runner.ran
    assert host == c.node0.name and "192.0.2.5" in script and "4222" in script and "docker inspect" not in script


# --- every multi-node topology through deploy --check --json ---------------------------------------
@pytest.mark.parametrize("name", ["t-1p2d", "t-1p4d-b1", "t-1p4d-b4", "t-2p3d", "t-3p1d", "t-3p2d"])
def test_every_multi_node_topology_in_check_json(name, temp_cluster, inventory):
    """Per worker: its role settings are the topology's (checked against the
    seed's tables in test_dynamo_topology), the seed's mpirun line with its
    rank count, a hostfile and launch agent exactly when it spans nodes, and
    each node's own GPU mask and the worker's system port; the bounce buffer
    is removed (no multi-node topology is colocated)."""
    c = temp_cluster(name)
    doc = check_json(name, inventory)
    rd = rdir(doc)
    placed = {w.name: w for w in dynamo.placement(c, c.profile)}
    assert [w["name"] for w in doc["workers"]] == list(placed)
    ports = [w.system_port for w in placed.values()]
    assert ports == list(range(8081, 8081 + len(ports)))
    for w in placed.values():
        first = w.nodes[0][0]
        files = node_doc(doc, first)["files"]
        overrides = yaml.safe_load(files[f"{w.name}.overrides.yaml"])
        assert overrides == dynamo.role_overrides(c, c.profile, w)
        assert "cache_transceiver_config.kv_cache_bounce_size_mb" in overrides.get("__delete__", [])
        assert overrides["tensor_parallel_size"] == w.tp == w.ranks
        ours = _exec_line(files[f"{w.name}.serve.sh"])
        assert_seeds_mpirun(ours, w.role, w.ranks, rd, w.name, c.profile.served_model_name)
        if len(w.nodes) > 1:
            hosts = [ln.split() for ln in files[f"{w.name}.hostfile"].splitlines() if ln.strip() and not ln.startswith("#")]
            assert hosts == [[str(c.node(h).ip), f"slots={len(g)}"] for h, g in w.nodes]
        else:
            assert ["--host", f"localhost:{w.ranks}"] == ours[6:8]
        for host, gpus in w.nodes:
            f = node_doc(doc, host)["files"]
            env = _env_file(f[f"{w.name}.env"])
            assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, gpus)) and env["DYN_SYSTEM_PORT"] == str(w.system_port)
            assert (f"{w.name}.mpi-agent.sh" in f) == (len(w.nodes) > 1)
