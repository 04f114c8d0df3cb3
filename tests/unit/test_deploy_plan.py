"""invoke deploy --check --json for a3 and a2 against the seed guide's own
commands (tests/data/seeds/001): every flag of node 0's and the workers'
vllm serve, every device and mount of docker run, every variable."""

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import run_invoke

SEED = Path(__file__).resolve().parents[1] / "data" / "seeds" / "001_932fa0211de51daf.txt"


def _blocks(start: str):
    """Every command of the seed that begins with ``start``, continuation lines joined."""
    lines = SEED.read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.startswith(start):
            buf = []
            j = i
            while True:
                buf.append(lines[j].rstrip().rstrip("\\").strip())
                if not lines[j].rstrip().endswith("\\"):
                    break
                j += 1
            out.append(" ".join(buf))
    return out


def _exports_before(index_of_serve: int):
    """The export block that precedes the n-th vllm serve of the seed."""
    text = SEED.read_text()
    serves = [m.start() for m in re.finditer(r"^vllm serve ", text, re.M)]
    prev = serves[index_of_serve - 1] if index_of_serve else 0
    chunk = text[prev : serves[index_of_serve]]
    return dict(re.findall(r"^export (\w+)=\"?([^\"\n]*)\"?$", chunk, re.M))


def _plan(cluster):
    res = run_invoke("deploy", "--cluster", cluster, "--check", "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("cluster,first_serve", [("a3", 0), ("a2", 2)])
def test_serve_commands_match_the_seed(cluster, first_serve):
    doc = _plan(cluster)
    seeds = _blocks("vllm serve ")
    assert len(seeds) == 4
    for k, node in ((0, doc["nodes"][0]), (1, doc["nodes"][1])):
        exports = _exports_before(first_serve + k)
        ours = shlex.split(node["serve_command"])
        seed = shlex.split(seeds[first_serve + k])
        # substitute the values the seed leaves to the operator with the inventory's
        inv = {
            "$MODEL_PATH": ours[2],
            "$TOKENIZER_PATH": ours[ours.index("--tokenizer") + 1],
            "$PORT": "8000",
            "$RPC_PORT": "13389",
            "$TP_SIZE": exports["TP_SIZE"],
            "$DP_SIZE": exports["DP_SIZE"],
            "$LOCAL_IP": doc["nodes"][0]["env"]["HCCL_IF_IP"],
            "$NODE0_IP": doc["nodes"][0]["env"]["HCCL_IF_IP"],
            "$DP_START_RANK": str(node["start_rank"]),
        }
        assert [inv.get(t, t) for t in seed] == ours
        # the container runs exactly that command, with the node's environment file
        assert node["container_command"].endswith(node["serve_command"])
        # every variable of the seed's export block, with this node's own values
        for key, value in exports.items():
            if key in ("MODEL_PATH", "TOKENIZER_PATH", "LOCAL_IP", "NODE0_IP", "NIC_NAME", "PORT", "RPC_PORT", "DP_SIZE", "DP_START_RANK", "TP_SIZE", "IMAGE", "NAME"):
                continue
            want = {"$LOCAL_IP": node["env"]["HCCL_IF_IP"], "$NIC_NAME": node["env"]["HCCL_SOCKET_IFNAME"]}.get(value, value)
            assert node["env"].get(key) == want, key
    # every worker: headless, its own start rank, node 0's address
    node0_ip = doc["nodes"][0]["env"]["HCCL_IF_IP"]
    ranks = []
    for node in doc["nodes"][1:]:
        args = shlex.split(node["serve_command"])
        assert "--headless" in args and args[args.index("--data-parallel-address") + 1] == node0_ip
        ranks.append(int(args[args.index("--data-parallel-start-rank") + 1]))
    assert ranks == list(range(1, len(doc["nodes"])))


@pytest.mark.parametrize("cluster,which", [("a3", 0), ("a2", 1)])
def test_container_command_has_every_device_and_mount_of_the_seed(cluster, which):
    doc = _plan(cluster)
    seed = shlex.split(_blocks("docker run --rm")[which])
    for node in doc["nodes"]:
        ours = shlex.split(node["container_command"])
        for flag in ("--device", "-v"):
            want = [seed[i + 1] for i, t in enumerate(seed) if t == flag]
            have = [ours[i + 1] for i, t in enumerate(ours) if t == flag]
            assert want and [w for w in want if w not in have] == []
        for t in ("--net=host", "--shm-size=1g"):
            assert t in seed and t in ours
        # detached, named for the cluster and release, environment from the release
        assert ours[:3] == ["docker", "run", "-d"]
        assert ours[ours.index("--name") + 1] == f"{cluster}-{doc['release']}"
        assert ours[ours.index("--env-file") + 1] == f"/var/lib/llmdeploy/{cluster}/releases/{doc['release']}/env"
        image = "quay.io/ascend/vllm-ascend:qwen3.8-a3" if cluster == "a3" else "quay.io/ascend/vllm-ascend:v0.23.0"
        assert ours[ours.index(image) + 1 : ours.index(image) + 3] == ["vllm", "serve"]


def test_deploy_refuses_a_profile_kind_it_does_not_know(monkeypatch):
    import systems
    from llmdeploy.errors import LlmdeployError

    monkeypatch.setattr(systems, "SYSTEMS", systems._registry(**{"vllm-ascend": "vllm_ascend"}))
    with pytest.raises(LlmdeployError, match="deploy cannot start dynamo profiles yet"):
        systems.module_for("dynamo")


def test_a_node_unreachable_earlier_is_named_not_taken_for_one_without_a_prepare_record():
    """The runner skips a node an earlier step of the command found
    unreachable (a Slurm node not responding): its record is unknown, and
    deploy says why instead of "no prepare record on <node>"."""
    from flows.deploy import read_prepared
    from llmdeploy.errors import LlmdeployError
    from llmdeploy.inventory import load_cluster
    from llmdeploy.runner import OK, SKIPPED, HostResult

    c = load_cluster("sim-b200-slurm")
    n0, n1 = (n.name for n in c.nodes)

    class Runner:
        def run(self, step):
            return {n0: HostResult(n0, OK, stdout='{"node": "%s"}' % n0),
                    n1: HostResult(n1, SKIPPED, msg="unreachable earlier: Slurm reports sim-b200-slurm-1 allocated, not responding")}

    with pytest.raises(LlmdeployError, match=f"cannot read the nodes' prepare records: {n1}: unreachable earlier: Slurm reports"):
        read_prepared(Runner(), c)
