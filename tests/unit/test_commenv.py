"""The rendered communication environment against every variable of the
seed's A3 and A2 blocks (shared/seeds/001), node 0 and a worker."""

import re
import subprocess
from pathlib import Path

import pytest

import roles.commenv as commenv
from llmdeploy.inventory import load_cluster
from roles.files import put_script

# a copy of shared/seeds/001 kept with the tests, so that CI always compares
SEED = Path(__file__).resolve().parents[1] / "data" / "seeds" / "001_932fa0211de51daf.txt"
# values the operator adapts; they go into the serve command, not the env file
ADAPTED = {"MODEL_PATH", "TOKENIZER_PATH", "LOCAL_IP", "NODE0_IP", "NIC_NAME", "PORT", "RPC_PORT", "DP_SIZE", "TP_SIZE", "DP_START_RANK"}


def seed_blocks():
    """The four export blocks of the seed: A3 node 0, A3 worker, A2 node 0, A2 worker."""
    assert SEED.exists(), f"{SEED} is missing"
    blocks, cur = [], None
    for line in SEED.read_text().splitlines():
        if line.startswith("# Values that must be adapted"):
            cur = {}
            blocks.append(cur)
        elif cur is not None and line.startswith("export "):
            k, v = line[len("export "):].split("=", 1)
            cur[k] = v.strip('"')
        elif line.startswith("vllm serve"):
            cur = None
    assert len(blocks) == 4, "the seed's layout changed"
    return blocks


def expected(block, ip, nic):
    out = {}
    for k, v in block.items():
        if k in ADAPTED:
            continue
        out[k] = v.replace("$LOCAL_IP", ip).replace("$NIC_NAME", nic)
    return out


@pytest.mark.parametrize("cluster,index,block_no", [("a3", 0, 0), ("a3", 2, 1), ("a2", 0, 2), ("a2", 7, 3)])
def test_env_file_has_every_seed_variable(cluster, index, block_no):
    c = load_cluster(cluster)
    node = c.nodes[index]
    want = expected(seed_blocks()[block_no], str(node.ip), node.nic)
    got = commenv.parse_env_file(commenv.render(c, node))
    assert got == want


def test_each_node_gets_its_own_ip_and_nic():
    c = load_cluster("sim-a2")
    for n in c.nodes:
        env = commenv.env_vars(c, n)
        assert env["HCCL_IF_IP"] == str(n.ip)
        assert env["HCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == n.nic
    assert commenv.env_vars(c, c.nodes[5])["HCCL_SOCKET_IFNAME"] == "enp61s0f1"


def test_dynamo_env_from_the_seed():
    c = load_cluster("gb300-agentic")
    env = commenv.env_vars(c, c.nodes[0])
    assert env["ETCD_ENDPOINTS"] == "http://198.51.100.70:2379" and env["NATS_SERVER"] == "nats://198.51.100.70:4222"
    assert env["DYN_NAMESPACE"] == "qwen35-gb300" and env["DYN_DISCOVERY_BACKEND"] == "etcd" and env["DYN_REQUEST_PLANE"] == "tcp"
    assert env["TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL"] == "1"


def _run(script):
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True)


def test_put_script_is_atomic_idempotent_and_check_writes_nothing(tmp_path):
    target = tmp_path / "etc" / "x.env"
    content = "A=1\nB=$(reboot) `x` 'q'\n"
    res = _run(put_script(str(target), content, 0o600, check=True, diff=True))
    assert "would-change" in res.stdout and "+B=$(reboot)" in res.stdout
    assert not target.parent.exists()  # check mode: nothing made
    assert "changed" in _run(put_script(str(target), content, 0o600)).stdout
    assert target.read_text() == content and oct(target.stat().st_mode & 0o777) == "0o600"
    assert "unchanged" in _run(put_script(str(target), content, 0o600)).stdout
    # a mode drift alone is a change
    target.chmod(0o644)
    assert re.search(r"changed$", _run(put_script(str(target), content, 0o600)).stdout.strip())
    assert list(target.parent.iterdir()) == [target]  # no staging files left


def test_put_script_refuses_unsafe_paths():
    with pytest.raises(ValueError):
        put_script("/etc/x; reboot", "a")
    with pytest.raises(ValueError):
        put_script("/etc/../root/x", "a")
