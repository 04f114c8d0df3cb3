"""invoke deploy --check --json for the trtllm-serve clusters (b200, gb200,
qwen35-b200) against seed 000's own lines (tests/data/seeds/000): its
``docker run`` and ``trtllm-serve`` command, its curated profile and TP; the
MPI launch around them (mpirun, hostfile, ranks), the start order, and the
static EPLB map of a high-throughput inventory (good and bad)."""

import json
import re
import shlex
import textwrap
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from flows import deploy as dep
from llmdeploy.errors import LlmdeployError
from llmdeploy.inventory import load_cluster
from tests.conftest import run_invoke
from tests.unit.test_trtllm_config import map_text
from flows.binding import bind
from llmdeploy.deployment import Deployment
from tests.binding import runner_method

SEED = Path(__file__).resolve().parents[1] / "data" / "seeds" / "000_640ab2471bd84fcd.txt"
CLUSTERS = ["b200", "gb200", "qwen35-b200"]
# what the brief fixes independently of the code: TP (= -np) and GPUs per node
EXPECTED = {
    "b200": {"np": 16, "slots": [8, 8], "family": "qwen3.8"},
    "gb200": {"np": 16, "slots": [4, 4, 4, 4], "family": "qwen3.8"},
    "qwen35-b200": {"np": 4, "slots": [4], "family": "qwen3.5"},
}
# the seed's docker run parts that only make sense for an interactive shell
INTERACTIVE = ("--rm", "-it")


# --- the seed ---------------------------------------------------------------------------
def _seed_text() -> str:
    return SEED.read_text()


def _blocks(start: str, after: str = "") -> list[str]:
    """Every command of the seed that begins with ``start`` (below the line
    ``after``, if given), continuation lines joined."""
    lines = _seed_text().splitlines()
    first = lines.index(after) if after else 0
    out = []
    for i, line in enumerate(lines[first:], first):
        if line.startswith(start):
            buf, j = [], i
            while True:
                buf.append(lines[j].rstrip().rstrip("\\").strip())
                if not lines[j].rstrip().endswith("\\"):
                    break
                j += 1
            out.append(" ".join(buf))
    return out


def seed_docker_run() -> dict:
    """The seed's first ``docker run`` (section "Run Docker Container"), parsed:
    standalone flags, (flag, value) pairs, the image and the command."""
    tokens = shlex.split(_blocks("docker run ", after="Run Docker Container#")[0])
    assert tokens[:2] == ["docker", "run"]
    standalone, pairs, i = [], [], 2
    while tokens[i].startswith("-"):
        t = tokens[i]
        if t in INTERACTIVE or "=" in t:
            standalone.append(t)
            i += 1
        else:
            pairs.append((t, tokens[i + 1]))
            i += 2
    return {"tokens": tokens, "standalone": standalone, "pairs": pairs, "image": tokens[i], "command": tokens[i + 1:]}


def seed_serve() -> list[str]:
    cmds = _blocks("trtllm-serve ")
    assert len(cmds) == 1, cmds
    return shlex.split(cmds[0])


def seed_curated(family: str) -> str:
    """The curated file of the seed for a model family, inside the container."""
    text = _seed_text()
    trtllm_dir = re.search(r"^TRTLLM_DIR=(\S+)", text, re.M).group(1)
    extra = re.search(r"^EXTRA_LLM_API_FILE=(\S+)", text, re.M).group(1).replace("${TRTLLM_DIR}", trtllm_dir)
    if family == "qwen3.8":
        return extra  # the seed's example: qwen3.8-low-latency.yaml
    name = re.search(r"^Qwen3\.5-397B-A17B MoE NVFP4\tGeneral deployment\t`([^`]+)`$", text, re.M).group(1)
    return f"{extra.rsplit('/', 1)[0]}/{name}"


def seed_tp(family: str) -> int:
    text = _seed_text()
    if family == "qwen3.8":
        return int(re.search(r"Qwen3\.8 MoE FP8 checkpoint uses tensor_parallel_size: (\d+)", text).group(1))
    return int(re.search(r"Qwen3\.5 MoE NVFP4 checkpoint has been validated with tensor_parallel_size: (\d+)", text).group(1))


def test_the_seed_parses_as_expected():
    d = seed_docker_run()
    assert d["standalone"] == ["--rm", "-it", "--ipc=host"]
    assert dict(d["pairs"]) == {"--gpus": "all", "-p": "8000:8000", "-v": "~/.cache:/root/.cache:rw", "--name": "tensorrt_llm"}
    assert d["image"] == "nvcr.io/nvidia/tensorrt-llm/release:1.4.0rc1" and d["command"] == ["/bin/bash"]
    assert seed_serve()[:2] == ["trtllm-serve", "<model_path_or_hf_id>"]
    assert seed_curated("qwen3.8") == "/app/tensorrt_llm/examples/configs/curated/qwen3.8-low-latency.yaml"
    assert seed_curated("qwen3.5") == "/app/tensorrt_llm/examples/configs/curated/qwen3.5.yaml"
    assert (seed_tp("qwen3.8"), seed_tp("qwen3.5")) == (16, 4)


# --- the plan ---------------------------------------------------------------------------
_PLANS: dict[str, dict] = {}


def plan(cluster: str) -> dict:
    if cluster not in _PLANS:
        res = run_invoke("deploy", "--cluster", cluster, "--check", "--json")
        assert res.returncode == 0, res.stderr
        _PLANS[cluster] = json.loads(res.stdout)
    return _PLANS[cluster]


def rdir(doc: dict) -> str:
    return f"/var/lib/llmdeploy/{doc['cluster']}/releases/{doc['release']}"


def _home(value: str) -> str:
    """The seed's ``~`` is root's home: the containers run as root."""
    return value.replace("~/", "/root/")


def _pairs(tokens: list[str], flag: str) -> list[str]:
    return [tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t == flag]


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_container_command_is_the_seeds_docker_run_detached(cluster):
    doc = plan(cluster)
    seed = seed_docker_run()
    rd = rdir(doc)
    assert [n["host"] for n in doc["nodes"]] == [n.name for n in load_cluster(cluster).nodes]
    for i, node in enumerate(doc["nodes"]):
        ours = shlex.split(node["container_command"])
        # every non-interactive flag of the seed, with its value
        for flag in seed["standalone"]:
            if flag not in INTERACTIVE:
                assert flag in ours, (node["host"], flag)
        for flag, value in seed["pairs"]:
            if flag == "--name":
                continue
            assert _home(value) in _pairs(ours, flag), (node["host"], flag, value)
        # the interactive parts, replaced: detached, a release-named container, the serve/hold script
        assert ours[:3] == ["docker", "run", "-d"]
        for t in ("--rm", "-it", "-i", "-t", "--interactive", "--tty"):
            assert t not in ours, t
        seed_name = dict(seed["pairs"])["--name"]
        assert _pairs(ours, "--name") == [f"{cluster}-{doc['release']}"] != [seed_name]
        assert node["container"] == f"{cluster}-{doc['release']}"
        # the seed's image, followed by our script instead of /bin/bash
        assert node["image"] == seed["image"]
        at = ours.index(seed["image"])
        script = "serve.sh" if i == 0 else "hold.sh"
        assert ours[at + 1:] == ["sh", f"{rd}/{script}"]
        assert seed["command"] == ["/bin/bash"] and "/bin/bash" not in ours
        assert _pairs(ours, "--env-file") == [f"{rd}/env"]
        # the release directory is in the container (config, hostfile, scripts)
        assert f"{rd}:{rd}" in _pairs(ours, "-v")
        assert node["role"] == ("launcher" if i == 0 else "ranks")


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_the_launch_nodes_serve_command(cluster):
    doc = plan(cluster)
    want = EXPECTED[cluster]
    c = load_cluster(cluster)
    rd = rdir(doc)
    node0 = doc["nodes"][0]
    assert node0["host"] == c.node0.name == doc["launch"]["host"]
    # only the launch node runs mpirun
    assert [n for n in doc["nodes"][1:] if "serve_command" in n] == []
    ours = shlex.split(node0["serve_command"])
    assert doc["launch"]["mpirun"] == node0["serve_command"]
    assert ours[:6] == ["mpirun", "--allow-run-as-root", "-np", str(want["np"]), "--hostfile", f"{rd}/hostfile"]
    assert want["np"] == c.profile.tp * c.profile.pp == seed_tp(want["family"])
    # every rank has its node's environment file; -x exports only what is the same on every node (no value on
    # the line), never a node's own NIC (systems.mpi_exports; tests/unit/test_mpi_env.py)
    assert _pairs(ours, "-x") == doc["launch"]["exported_env"]
    assert doc["launch"]["exported_env"] + doc["launch"]["per_node_env"] == list(node0["env"]) and node0["env"]
    assert {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"} <= set(doc["launch"]["per_node_env"])
    for name, value in node0["env"].items():
        assert f"{name}={value}" not in node0["serve_command"]
    # the launch agent only across nodes
    multi = len(want["slots"]) > 1
    agent = ["--mca", "plm_rsh_agent", f"{rd}/mpi-agent.sh"]
    if multi:
        at = ours.index("plm_rsh_agent")
        assert ours[at - 1:at + 2] == agent
    else:
        assert "plm_rsh_agent" not in ours and "mpi-agent.sh" not in node0["serve_command"]
    # exactly the seed's trtllm-serve line, behind trtllm-llmapi-launch
    at = ours.index("trtllm-serve")
    assert ours[at - 1] == "trtllm-llmapi-launch"
    subst = {"<model_path_or_hf_id>": c.model.path, "${EXTRA_LLM_API_FILE}": f"{rd}/config.yaml"}
    assert ours[at:] == [subst.get(t, t) for t in seed_serve()]
    assert doc["launch"]["config"] == f"{rd}/config.yaml"
    # serve.sh merges the config, then runs exactly that line
    serve_sh = node0["files"]["serve.sh"]
    assert serve_sh.rstrip("\n").splitlines()[-1] == "exec " + node0["serve_command"]
    assert ("mpi-agent.sh" in node0["files"]) == multi


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_hostfile_and_ranks(cluster):
    doc = plan(cluster)
    want = EXPECTED[cluster]
    c = load_cluster(cluster)
    lines = [ln for ln in doc["nodes"][0]["files"]["hostfile"].splitlines() if ln.strip() and not ln.startswith("#")]
    entries = [re.fullmatch(r"(\S+) slots=(\d+)", ln).groups() for ln in lines]
    # across nodes each node by its serving IP (nothing to resolve on node 0); one node alone by its name
    names = [str(n.ip) for n in c.nodes] if len(c.nodes) > 1 else [c.node0.name]
    assert [(h, int(s)) for h, s in entries] == [(name, n["slots"]) for name, n in zip(names, doc["nodes"])]
    assert [int(s) for _, s in entries] == want["slots"] == [n.devices for n in c.nodes]
    # ranks: contiguous, node 0 first, every rank 0..TP-1 once, as many as the node's slots
    covered = []
    for n in doc["nodes"]:
        first, _, last = n["ranks"].partition("-")
        r = list(range(int(first), int(last or first) + 1))
        assert len(r) == n["slots"]
        assert r[0] == len(covered)
        covered += r
    assert covered == list(range(want["np"]))


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_overrides_name_the_curated_file_and_set_tp(cluster):
    doc = plan(cluster)
    want = EXPECTED[cluster]
    curated = seed_curated(want["family"])
    text = doc["nodes"][0]["files"]["trtllm-overrides.yaml"]
    assert text == doc["launch"]["overrides_yaml"]
    assert f"# Layered on the curated profile {curated}\n" in text
    assert doc["launch"]["curated"] == curated
    assert yaml.safe_load(text)["tensor_parallel_size"] == want["np"]
    # the launch node merges that curated file with these overrides into --config
    rd = rdir(doc)
    merge = next(ln for ln in doc["nodes"][0]["files"]["serve.sh"].splitlines() if ln.startswith("python3 "))
    assert shlex.split(merge)[1:] == [f"{rd}/merge-config.py", curated, f"{rd}/trtllm-overrides.yaml", f"{rd}/config.yaml"]


@pytest.mark.parametrize("cluster", CLUSTERS)
def test_trtllm_is_one_world_restarted_as_a_group(cluster):
    doc = plan(cluster)
    assert [(s["name"], s["restart"], s["after"], s["started"]) for s in doc["services"]] == [("world", "group", [], None)]
    units = doc["services"][0]["units"]
    assert [u["host"] for u in units] == [n["host"] for n in doc["nodes"]]
    # the holders (order 0) before the launcher (order 1)
    assert [(u["role"], u["order"]) for u in units] == [("launcher", 1)] + [("ranks", 0)] * (len(units) - 1)
    assert len(doc["ready"]) == 3 and doc["ready"][0].startswith("GET /health on ")


def test_single_node_hostfile_names_the_container_itself():
    doc = plan("qwen35-b200")
    (entry,) = [ln.split()[0] for ln in doc["nodes"][0]["files"]["hostfile"].splitlines() if ln and not ln.startswith("#")]
    ours = shlex.split(doc["nodes"][0]["container_command"])
    assert entry in ("localhost", "127.0.0.1") or _pairs(ours, "--hostname") == [entry] or _pairs(ours, "--network") == ["host"]


def test_a3_is_node0_then_workers():
    res = run_invoke("deploy", "--cluster", "a3", "--check", "--json")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    got = [(s["name"], s["restart"], s["after"]) for s in doc["services"]]
    assert got == [("node0", "none", []), ("workers", "each", ["node0"])]
    assert [u["host"] for u in doc["services"][0]["units"]] == [doc["nodes"][0]["host"]]
    assert [u["host"] for u in doc["services"][1]["units"]] == [n["host"] for n in doc["nodes"][1:]]
    assert doc["services"][0]["started"].startswith("the DP RPC port")


# --- a high-throughput inventory with a static EPLB map --------------------------------------
HT = "qwen3.8-high-throughput.yaml"


def ht_inventory(tmp_path: Path, name: str, text: str, nodes: int = 4, tp: int = 32) -> Path:
    """An inventory directory with one cluster (documentation addresses) and the guide's EP32 map under
    maps/; by default the guide's TP32/EP32 on 4 x 8 B200."""
    inv = tmp_path / "inventory"
    (inv / "maps").mkdir(parents=True)
    (inv / "maps" / "qwen3.8-ep32-static544.yaml").write_text(text)
    (inv / f"{name.replace('-', '_')}.py").write_text(textwrap.dedent(f"""
        from llmdeploy.inventory import Cluster, Model, make_nodes
        from systems.trtllm.catalogue import IMAGE_TRTLLM, image, trtllm_qwen38_fp8
        cluster = Cluster(name="{name}", platform="b200", nic="eth0", nodes=make_nodes("ht-node-", {nodes}, "192.0.2.70"),
                          model=Model(path="/root/.cache/huggingface/hub/Qwen3.8-2.4T-A95B-FP8"), image=image(IMAGE_TRTLLM),
                          profile=trtllm_qwen38_fp8("{HT}", tp={tp}, eplb_map="maps/qwen3.8-ep32-static544.yaml"))
    """))
    return inv


def test_eplb_map_is_the_load_balancer_of_the_overrides(tmp_path, monkeypatch):
    text = map_text()
    inv = ht_inventory(tmp_path, "ht-b200", text)
    res = run_invoke("deploy", "--cluster", "ht-b200", "--check", "--json", env={"LLMDEPLOY_INVENTORY": str(inv)})
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    rd = rdir(doc)
    overrides = yaml.safe_load(doc["launch"]["overrides_yaml"])
    assert overrides["moe_config"] == {"load_balancer": f"{rd}/eplb.yaml"}
    assert (overrides["tensor_parallel_size"], overrides["moe_expert_parallel_size"]) == (32, 32)
    assert f"Layered on the curated profile /app/tensorrt_llm/examples/configs/curated/{HT}" in doc["launch"]["overrides_yaml"]
    # every node gets the map itself next to that path, and its overrides point at it
    monkeypatch.setenv("LLMDEPLOY_INVENTORY", str(inv))
    _, _, p = dep.plan_release(bind(load_cluster("ht-b200")), {}, "sha256:x")
    for host, files in p.files.items():
        assert files["eplb.yaml"][0] == text, host
        assert f"load_balancer: /var/lib/llmdeploy/ht-b200/releases/{p.release}/eplb.yaml" in files["trtllm-overrides.yaml"][0]
        assert json.loads(files["release.json"][0])["eplb_map"]["num_slots"] == 544


def test_a_bad_eplb_map_stops_deploy_check_before_any_connection(tmp_path):
    inv = ht_inventory(tmp_path, "ht-bad", map_text(slots=lambda layer: 543 if layer == 7 else 544))
    res = run_invoke("deploy", "--cluster", "ht-bad", "--check", env={"LLMDEPLOY_INVENTORY": str(inv)}, timeout=60)
    assert res.returncode != 0
    assert "profile.eplb_map" in res.stderr and "layer 7 has 543 slots, expected 544" in res.stderr
    assert "Traceback" not in res.stderr and "unreachable" not in res.stderr.lower() and "connect" not in res.stderr.lower()
    assert res.stdout == ""


class _NoConnection:
    def __init__(self, *a, **k):
        raise AssertionError("a connection to the cluster was opened")


def test_a_bad_eplb_map_is_refused_in_check_mode_without_a_runner(tmp_path, monkeypatch):
    inv = ht_inventory(tmp_path, "ht-bad", map_text(slots=lambda layer: 543 if layer == 7 else 544))
    monkeypatch.setenv("LLMDEPLOY_INVENTORY", str(inv))
    monkeypatch.setattr(Deployment, "runner", runner_method(_NoConnection))
    c = load_cluster("ht-bad")  # the inventory itself loads: the map is a file
    with pytest.raises(LlmdeployError, match=r"(?s)profile\.eplb_map: .*layer 7 has 543 slots, expected 544"):
        dep.deploy(bind(c), Console(quiet=True), True, True, False, False, None, 0, False, prepare_fn=lambda *a: 0, rollback_fn=lambda *a: 0)


def test_a_bad_eplb_map_is_refused_before_a_real_deploy_connects(tmp_path, monkeypatch):
    inv = ht_inventory(tmp_path, "ht-bad", map_text(slots=lambda layer: 543 if layer == 7 else 544))
    monkeypatch.setenv("LLMDEPLOY_INVENTORY", str(inv))
    monkeypatch.setattr(Deployment, "runner", runner_method(_NoConnection))
    c = load_cluster("ht-bad")
    with pytest.raises(LlmdeployError, match=r"profile\.eplb_map"):
        dep.deploy(bind(c), Console(quiet=True), False, True, False, False, None, 0, False, prepare_fn=lambda *a: 0, rollback_fn=lambda *a: 0)


def test_tp16_with_the_ep32_map_is_refused_before_any_connection(tmp_path):
    """Issue 19: the guide's EP32 placement under a TP16 (so EP16) world was accepted silently; now the
    inventory is invalid: exit 2, the file, the field and both values, nothing read from any node."""
    inv = ht_inventory(tmp_path, "ht-tp16", map_text(), nodes=2, tp=16)
    res = run_invoke("deploy", "--cluster", "ht-tp16", "--check", env={"LLMDEPLOY_INVENTORY": str(inv)}, timeout=60)
    assert res.returncode == 2, res.stdout + res.stderr
    err = " ".join(res.stderr.split())
    assert "ht_tp16.py" in err
    assert ("profile.eplb_map: qwen3.8-ep32-static544.yaml is a placement for EP 32, but moe_expert_parallel_size is 16 "
            "(profile.ep, at tensor_parallel_size 16)") in err
    assert res.stdout == "" and "Traceback" not in res.stderr
    # a real deploy is refused the same way: the inventory does not load, so nothing connects
    res = run_invoke("deploy", "--cluster", "ht-tp16", env={"LLMDEPLOY_INVENTORY": str(inv)}, timeout=60)
    assert res.returncode == 2 and "is a placement for EP 32" in res.stderr
