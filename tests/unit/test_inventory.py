"""The inventory schema: the real modules load with the seeds' values, and
every broken inventory is refused with the file, field and node named."""

import textwrap

import pytest

from llmdeploy.errors import InventoryError
from llmdeploy.inventory import list_clusters, load_cluster, load_cluster_file

REAL = ["a3", "a2", "b200", "gb200", "qwen35-b200", "gb300-agentic"]


@pytest.mark.parametrize("name", REAL + ["sim-a3", "sim-a2", "sim-b200", "sim-b200-nics", "sim-gb300-agentic", "sim-gb300-1p2d"])
def test_every_shipped_inventory_loads(name):
    c = load_cluster(name)
    assert c.name == name
    assert all(n.nic and n.start_rank is not None and n.devices for n in c.nodes)


def test_a3_values_from_the_seed():
    c = load_cluster("a3")
    p = c.profile
    assert (p.dp, p.tp, p.ep, p.dp_local) == (4, 16, 64, 1)
    assert (p.max_model_len, p.max_num_seqs, p.max_num_batched_tokens, p.gpu_memory_utilization) == (131072, 8, 16384, 0.85)
    assert c.image.ref == "quay.io/ascend/vllm-ascend:qwen3.8-a3"
    assert [n.start_rank for n in c.nodes] == [0, 1, 2, 3]
    assert p.env["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(map(str, range(16)))
    assert p.speculative_config == {"method": "qwen3_5_mtp", "num_speculative_tokens": 1}
    assert p.additional_config == {"enable_cpu_binding": True, "enable_fused_mc2": 1}
    # documentation addresses only
    assert all(str(n.ip).startswith("192.0.2.") for n in c.nodes)


def test_a2_values_from_the_seed():
    c = load_cluster("a2")
    p = c.profile
    assert (p.dp, p.tp, p.ep) == (8, 8, 64)
    assert (p.max_model_len, p.max_num_batched_tokens, p.gpu_memory_utilization) == (262144, 4096, 0.92)
    assert c.image.ref == "quay.io/ascend/vllm-ascend:v0.23.0"
    assert p.env["VLLM_ENGINE_READY_TIMEOUT_S"] == "7200"
    assert p.env["HCCL_INTRA_PCIE_ENABLE"] == "1" and p.env["HCCL_CONNECT_TIMEOUT"] == "1800"
    assert "TP_SOCKET_IFNAME" in p.ifname_env
    assert [n.start_rank for n in c.nodes] == list(range(8))


def test_nvidia_profiles():
    assert load_cluster("b200").profile.tp == 16
    assert sum(n.devices for n in load_cluster("gb200").nodes) == 16
    assert load_cluster("qwen35-b200").profile.tp == 4
    c = load_cluster("gb300-agentic")
    workers = c.profile.placement(c.nodes)
    assert [(w.role, w.cuda_visible_devices("gb300-node-0"), w.system_port) for w in workers] == [("prefill", "0", 8081), ("decode", "1,2", 8082)]
    assert workers[0].env == {"DYN_SYSTEM_PORT": "8081", "DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS": '["generate"]', "CUDA_SCALE_LAUNCH_QUEUES": "4x", "TRTLLM_SKIP_KV_CACHE_ESTIMATION": "1", "TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL": "1"}


def test_list_clusters_names_the_modules():
    assert {"a3", "a2", "sim-a3"} <= set(list_clusters())


BASE = """
from llmdeploy.inventory import Cluster, Model, Node, Ssh, make_nodes
from systems.vllm_ascend.catalogue import IMAGE_A3, image, vllm_a3_w8a8
from flows.binding import bind
nodes = make_nodes("n", 4, "192.0.2.10")
model = Model(path="/models/x")
profile = vllm_a3_w8a8()
extra = {}
"""

# (name, code after BASE, expected fragments of the message)
BROKEN = [
    ("wrong_tp_dp", 'profile = vllm_a3_w8a8(tp=8)', ["profile.tp", "DP 4 x TP 8 = 32", "64 devices"]),
    ("wrong_dp", 'profile = vllm_a3_w8a8(dp=2, ep=32)', ["profile.dp", "DP 2 != 4 nodes"]),
    ("wrong_ep", 'profile = vllm_a3_w8a8(ep=32)', ["profile.ep", "EP 32 != DP 4 x TP 16"]),
    ("duplicate_ip", 'nodes[2] = Node(name="n2", ip="192.0.2.11")', ["nodes[2] (n2).ip", "192.0.2.11", "nodes[1] (n1)"]),
    ("duplicate_name", 'nodes[3] = Node(name="n1", ip="192.0.2.99")', ["nodes[3] (n1).name", "already used by nodes[1]"]),
    ("duplicate_start_rank", 'nodes[2] = Node(name="n2", ip="192.0.2.12", start_rank=1)', ["nodes[2] (n2).start_rank", "DP rank 1", "nodes[1] (n1)"]),
    ("rank_out_of_range", 'nodes[3] = Node(name="n3", ip="192.0.2.13", start_rank=9)', ["nodes[3] (n3).start_rank", "outside 0..3"]),
    ("nic_with_semicolon", 'nodes[1] = Node(name="n1", ip="192.0.2.11", nic="eth0;reboot")', ["node n1.nic", "eth0;reboot"]),
    ("missing_model_path", 'model = Model(tokenizer_path="/models/x")', ["model.path", "required field is missing"]),
    ("unsafe_model_path", 'model = Model(path="/models/x $(reboot)")', ["model.path", "not a safe absolute path"]),
    ("relative_model_path", 'model = Model(path="models/x")', ["model.path", "safe absolute path"]),
    ("unknown_field", 'extra = {"colour": "red"}', ["colour", "unknown field"]),
    ("unknown_node_field", 'nodes[0] = Node(name="n0", ip="192.0.2.10", rack="r1")', ["node n0.rack", "unknown field"]),
    ("port_out_of_range", 'profile = vllm_a3_w8a8(port=70000)', ["profile.port", "65535"]),
    ("port_shared", 'profile = vllm_a3_w8a8(port=9000, rpc_port=9000)', ["profile.rpc_port", "port 9000"]),
    ("bad_ip", 'nodes[0] = Node(name="n0", ip="192.0.2.300")', ["node n0.ip"]),
    ("no_nic", 'nic_override = True', ["nodes[0] (n0).nic", "no NIC"]),
    ("bad_hostname", 'nodes[0] = Node(name="n0;x", ip="192.0.2.10")', ["node n0;x.name"]),
]


def _module(tmp_path, name, code, cluster_nic='"eth0"'):
    inv = tmp_path / "inventory"
    inv.mkdir(exist_ok=True)
    nic = "None" if "nic_override" in code else cluster_nic
    text = BASE + code + f"""
cluster = Cluster(name={name.replace('_', '-')!r}, platform="a3", nic={nic}, nodes=nodes,
                  model=model, image=image(IMAGE_A3), profile=profile, **extra)
"""
    path = inv / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("name,code,fragments", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_inventory_names_file_and_field(tmp_path, name, code, fragments):
    path = _module(tmp_path, name, code)
    with pytest.raises(InventoryError) as exc:
        load_cluster_file(path)
    text = str(exc.value)
    assert exc.value.exit_code == 2
    assert f"{name}.py" in text
    for frag in fragments:
        assert frag in text, f"{frag!r} not in {text!r}"


def test_good_base_inventory_loads(tmp_path):
    # the BASE above is valid: the broken cases fail for their own reason only
    c = load_cluster_file(_module(tmp_path, "good", ""))
    assert [n.start_rank for n in c.nodes] == [0, 1, 2, 3]


def test_every_problem_is_reported_at_once(tmp_path):
    code = 'nodes[2] = Node(name="n2", ip="192.0.2.11", start_rank=1)\nprofile = vllm_a3_w8a8(ep=8)'
    with pytest.raises(InventoryError) as exc:
        load_cluster_file(_module(tmp_path, "many", code))
    assert len(exc.value.problems) >= 3


def test_per_node_overrides(tmp_path):
    code = 'nodes[3] = Node(name="n3", ip="192.0.2.50", nic="ens9")'
    c = load_cluster_file(_module(tmp_path, "override", code))
    assert c.nodes[3].nic == "ens9" and c.nodes[0].nic == "eth0"
    assert str(c.nodes[3].ip) == "192.0.2.50"


def test_name_must_match_file(tmp_path):
    path = _module(tmp_path, "alpha", "")
    path.rename(path.with_name("beta.py"))
    with pytest.raises(InventoryError, match="must match the file name"):
        load_cluster_file(path.with_name("beta.py"))


def test_missing_cluster_lists_known(tmp_path):
    with pytest.raises(InventoryError, match="known clusters"):
        load_cluster("no-such-cluster")


def test_broken_inventory_exits_2_from_the_task(tmp_path, invoke):
    path = _module(tmp_path, "broken_task", 'nodes[1] = Node(name="n1", ip="192.0.2.11", nic="eth0;reboot")')
    res = invoke("facts", "--cluster", "broken-task", env={"LLMDEPLOY_INVENTORY": str(path.parent)})
    assert res.returncode == 2, res.stderr
    assert "broken_task.py" in res.stderr and "node n1.nic" in res.stderr
    assert "RECAP" not in res.stdout  # no host was contacted


def test_unknown_limit_host_exits_2(invoke):
    res = invoke("facts", "--cluster", "a3", "--limit", "a3-node-9")
    assert res.returncode == 2
    assert "a3-node-9" in res.stderr


def test_a_missing_ssh_config_file_is_named_before_any_connection(tmp_path):
    from flows.binding import bind

    c = load_cluster("sim-a3")
    c = c.model_copy(update={"ssh": c.ssh.model_copy(update={"config_file": str(tmp_path / "gone" / "ssh_config")})})
    with pytest.raises(InventoryError, match=r"ssh\.config_file: .*/gone/ssh_config does not exist \(is the simulated cluster up\? invoke sim\.up"):
        bind(c).runner()
