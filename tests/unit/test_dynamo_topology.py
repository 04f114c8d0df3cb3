"""Dynamo topologies as data (seed 000, "Qwen3.5 GB300 NVL72 Agentic
Disaggregated Serving"): the seed's three tables and retained values against
the data and the rendered role YAMLs of every topology, the placement of every
topology, each refusal before any connection, and merge-config.py's deletion."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from llmdeploy.errors import InventoryError
from llmdeploy.inventory import PLATFORMS, Budget, Cluster, Model, Node, load_cluster, load_cluster_file, make_nodes, problems_from_validation
from systems.dynamo.profile import DynamoWorker
from systems.dynamo.catalogue import IMAGE_DYNAMO, dynamo_gb300, image
from llmdeploy.runner import FAILED, OK
from roles import budget, commenv
from systems.dynamo import workers as dynamo
from systems.trtllm import config as trtllm
from tests.conftest import run_invoke

SEED = Path(__file__).resolve().parent.parent / "data" / "seeds" / "000_640ab2471bd84fcd.txt"
BOUNCE = "cache_transceiver_config.kv_cache_bounce_size_mb"
GIB = 1024**3


# --- the seed, parsed ------------------------------------------------------------------
def _section() -> str:
    text = SEED.read_text()
    start = text.index("Qwen3.5 GB300 NVL72 Agentic Disaggregated Serving#")
    return text[start:text.index("Verify Responses and Metrics#", start)]


def _table(header: str) -> list[list[str]]:
    """The tab-separated rows under the line starting with ``header``."""
    lines = _section().splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[i + 1:]:
        if "\t" not in line:
            break
        rows.append([cell.strip().strip("`") for cell in line.split("\t")])
    return rows


def _value(text: str):
    return yaml.safe_load(text)


def _pairs(sentence_start: str) -> dict:
    """``dotted.key: value`` pairs of the sentence starting with ``sentence_start``."""
    sec = _section()
    i = sec.index(sentence_start)
    sentence = sec[i:sec.index(". ", i)]
    return {k: _value(v) for k, v in re.findall(r"([a-z_]+(?:\.[a-z_]+)*): ([A-Za-z0-9.]+?)(?=[,;)\s]|$)", sentence)}


def _bool(cell: str) -> bool:
    return {"true": True, "false": False}[cell]


def _powers_of_two(cell: str) -> list[int]:
    m = re.fullmatch(r"Powers of two from 1 through (\d+)", cell)
    top = int(m.group(1))
    out, n = [], 1
    while n <= top:
        out.append(n)
        n *= 2
    assert out[-1] == top
    return out


def seed_prefill() -> dict[str, dict]:
    out = {}
    for name, gpus, adp, tokens, capture in _table("Prefill profile\t"):
        out[name] = dict(gpus=int(gpus), enable_attention_dp=_bool(adp), max_num_tokens=int(tokens), capture=_powers_of_two(capture))
    return out


def seed_decode() -> dict[str, dict]:
    out = {}
    for name, gpus, adp, tokens_batch, tokens, sizes, backend in [
        r for r in _table("Decode profile\t")
    ]:
        attention_dp, lm_head = (c.strip().strip("`") for c in adp.split("/"))
        out[name] = dict(
            gpus=int(gpus), enable_attention_dp=_bool(attention_dp), enable_lm_head_tp_in_adp=_bool(lm_head),
            max_batch_size=int(tokens_batch), max_num_tokens=int(tokens), batch_sizes=_value(sizes), moe_backend=backend,
        )
    return out


def seed_topologies() -> list[dict]:
    out = []
    for title, prefill, decode, nodes in _table("Topology\t"):
        p = re.fullmatch(r"(\d+) × (\S+)", prefill)
        d = re.fullmatch(r"(\d+) × ([^,]+)(, colocated)?", decode)
        out.append(dict(
            title=title, prefill=(int(p.group(1)), p.group(2)), decode=(int(d.group(1)), d.group(2)),
            colocated=bool(d.group(3)), nodes=int(nodes),
        ))
    return out


def seed_exports(after: str) -> dict[str, str]:
    """The ``export K=V`` lines of the shell block after the line ``after``."""
    lines = _section().splitlines()
    i = lines.index(after)
    out = {}
    for line in lines[i + 1:]:
        if line.startswith("export "):
            k, v = line[len("export "):].split("=", 1)
            out[k] = v
        elif out and not line.strip():
            continue
        elif out:
            break
    return out


PREFILL_RETAINED = _pairs("Prefill retains")
DECODE_RETAINED = _pairs("Decode retains")
BOTH_METRICS = {**_pairs("Both workers use --publish-metrics"), **_pairs("Keep return_perf_metrics")}
HOST_CACHE = _pairs("Each rank reserves 128 GiB of host KV cache")
BOTH_KEEP = _pairs("All workers keep pipeline_parallel_size")
BOUNCE_SEED = _pairs("For the two colocated 1P1D profiles, retain")


def test_the_seed_parses_as_expected():
    # guards the parser itself: the sentences it reads carry the values the issue lists
    assert PREFILL_RETAINED == {"max_batch_size": 64, "max_seq_len": 262144,
                                "kv_cache_config.free_gpu_memory_fraction": 0.8, "moe_config.backend": "CUTEDSL"}
    assert DECODE_RETAINED == {"max_seq_len": 262148, "kv_cache_config.avg_seq_len": 102150,
                               "kv_cache_config.free_gpu_memory_fraction": 0.85,
                               "moe_config.use_low_precision_moe_combine": True}
    assert "and MTP6" in _section()
    assert BOTH_METRICS == {"enable_iter_perf_stats": True, "iter_perf_stats_interval": 40,
                            "kv_cache_config.iteration_stats_interval": 40, "return_perf_metrics": False,
                            "kv_cache_config.event_buffer_max_size": 0}
    assert HOST_CACHE == {"host_cache_size": 137438953472}
    assert BOTH_KEEP == {"pipeline_parallel_size": 1}
    assert BOUNCE_SEED == {BOUNCE: 2048}
    assert len(seed_prefill()) == 3 and len(seed_decode()) == 6 and len(seed_topologies()) == 8


# --- the data against the seed's tables ------------------------------------------------
def test_prefill_profiles_are_the_seed_table():
    seed = seed_prefill()
    assert list(dynamo.PREFILL_PROFILES) == list(seed)
    for name, row in seed.items():
        p = dynamo.PREFILL_PROFILES[name]
        assert (p.gpus, p.tp, p.ep) == (row["gpus"],) * 3  # TP = EP in every row
        assert p.enable_attention_dp is row["enable_attention_dp"]
        assert p.max_num_tokens == row["max_num_tokens"]
        assert p.capture_num_tokens == row["capture"]


def test_decode_profiles_are_the_seed_table():
    seed = seed_decode()
    assert list(dynamo.DECODE_PROFILES) == list(seed)
    for name, row in seed.items():
        d = dynamo.DECODE_PROFILES[name]
        assert (d.gpus, d.tp, d.ep) == (row["gpus"],) * 3
        assert (d.enable_attention_dp, d.enable_lm_head_tp_in_adp) == (row["enable_attention_dp"], row["enable_lm_head_tp_in_adp"])
        assert (d.max_batch_size, d.max_num_tokens) == (row["max_batch_size"], row["max_num_tokens"])
        assert list(d.cuda_graph_batch_sizes) == row["batch_sizes"]
        assert d.moe_backend == row["moe_backend"]


def test_topologies_are_the_seed_table():
    seed = seed_topologies()
    assert [t.title for t in dynamo.TOPOLOGIES.values()] == [row["title"] for row in seed]
    for t, row in zip(dynamo.TOPOLOGIES.values(), seed):
        assert (t.prefill_replicas, t.prefill_profile) == row["prefill"]
        assert (t.decode_replicas, t.decode_profile) == row["decode"]
        assert (t.nodes, t.colocated) == (row["nodes"], row["colocated"])
    assert list(dynamo.TOPOLOGIES) == ["1P1D-B8", "1P1D-B4", "1P2D", "1P4D-B1", "1P4D-B4", "2P3D", "3P1D", "3P2D"]


# --- clusters ---------------------------------------------------------------------------------
def gb300(topology: str, nodes: int | None = None, **profile) -> Cluster:
    count = dynamo.TOPOLOGIES[topology].nodes if nodes is None else nodes
    return Cluster(
        name=f"t-{topology.lower()}",
        platform="gb300",
        nic="eth0",
        nodes=make_nodes("n", count, "198.51.100.10"),
        model=Model(path="/models/Qwen3.5-397B-A17B-NVFP4-V2"),
        image=image(IMAGE_DYNAMO),
        budget=Budget(weights_host_gib=208),
        profile=dynamo_gb300(topology, **{"recipes_dir": "/opt/TensorRT-LLM", **profile}),
    )


def refused(build) -> list[str]:
    with pytest.raises(ValidationError) as exc:
        build()
    return problems_from_validation(exc.value)


def _dotted(doc: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            out.update(_dotted(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


ALL = list(dynamo.TOPOLOGIES)


@pytest.mark.parametrize("topology", ALL)
def test_rendered_role_yamls_carry_every_seed_value(topology):
    c = gb300(topology)
    row = next(r for r in seed_topologies() if r["title"] == dynamo.TOPOLOGIES[topology].title)
    workers = dynamo.placement(c, c.profile)
    assert [w.profile for w in workers] == [row["prefill"][1]] * row["prefill"][0] + [row["decode"][1]] * row["decode"][0]
    for w in workers:
        text = dynamo.role_yaml(c, c.profile, w)
        doc = yaml.safe_load(text)
        assert doc == dynamo.role_overrides(c, c.profile, w)
        base = dynamo.base_yaml_path(c.profile, w)
        assert base == f"/opt/trtllm-recipes/examples/configs/curated/qwen3.5-gb300-agentic-{w.role}.yaml"
        assert f"# Layers on the base file {base}\n" in text and text.startswith("# Dynamo ")
        flat = _dotted({k: v for k, v in doc.items() if k != "__delete__"})
        # TP = EP = the worker's GPUs, PP 1, ranks = TP x PP
        assert flat["tensor_parallel_size"] == flat["moe_expert_parallel_size"] == w.tp == w.ep == w.ranks
        for key, value in {**BOTH_KEEP, **BOTH_METRICS, "kv_cache_config.host_cache_size": HOST_CACHE["host_cache_size"]}.items():
            assert flat[key] == value and type(flat[key]) is type(value), key
        if w.role == "prefill":
            seed = seed_prefill()[w.profile]
            assert flat["tensor_parallel_size"] == seed["gpus"]
            assert flat["enable_attention_dp"] is seed["enable_attention_dp"]
            assert flat["max_num_tokens"] == seed["max_num_tokens"]
            assert flat["torch_compile_config.capture_num_tokens"] == seed["capture"]
            for key, value in PREFILL_RETAINED.items():
                assert flat[key] == value, key
            assert "speculative_config.max_draft_len" not in flat
        else:
            seed = seed_decode()[w.profile]
            assert flat["tensor_parallel_size"] == seed["gpus"]
            assert flat["enable_attention_dp"] is seed["enable_attention_dp"]
            assert flat["enable_lm_head_tp_in_adp"] is seed["enable_lm_head_tp_in_adp"]
            assert (flat["max_batch_size"], flat["max_num_tokens"]) == (seed["max_batch_size"], seed["max_num_tokens"])
            assert flat["cuda_graph_config.batch_sizes"] == seed["batch_sizes"]
            assert flat["moe_config.backend"] == seed["moe_backend"]
            for key, value in DECODE_RETAINED.items():
                assert flat[key] == value, key
            # MTP6
            assert (flat["speculative_config.decoding_type"], flat["speculative_config.max_draft_len"]) == ("MTP", 6)
        if row["colocated"]:
            assert flat[BOUNCE] == BOUNCE_SEED[BOUNCE] and "__delete__" not in doc
            assert w.env["TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL"] == "1"
        else:
            assert BOUNCE not in flat and doc["__delete__"] == [BOUNCE]
            assert "TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL" not in dynamo.worker_env(c, w, w.rank0_node)
        prefill_vars = {"CUDA_SCALE_LAUNCH_QUEUES": "4x", "TRTLLM_SKIP_KV_CACHE_ESTIMATION": "1"}
        has = {k: w.env[k] for k in prefill_vars if k in w.env}
        assert has == (prefill_vars if w.role == "prefill" else {})


def test_the_1p1d_worker_shells_are_the_seeds():
    c = load_cluster("gb300-agentic")
    node = c.nodes[0]
    prefill, decode = dynamo.placement(c, c.profile)

    def seed(header):
        # the seed's shell, plus the one variable the tool adds after DYN_SYSTEM_PORT: without it a worker's
        # system port /health never turns ready (systems/dynamo/placement.py, HEALTH_ENDPOINTS)
        out = {}
        for k, v in seed_exports(header).items():
            out[k] = v
            if k == "DYN_SYSTEM_PORT":
                out["DYN_SYSTEM_USE_ENDPOINT_HEALTH_STATUS"] = '["generate"]'
        return out

    assert dynamo.worker_env(c, prefill, node) == seed("In the prefill shell:")
    assert dynamo.worker_env(c, decode, node) == seed("In the decode shell:")
    # in the seed's order
    assert list(dynamo.worker_env(c, prefill, node)) == list(seed("In the prefill shell:"))
    assert list(dynamo.worker_env(c, decode, node)) == list(seed("In the decode shell:"))
    assert "CUDA_VISIBLE_DEVICES" not in dynamo.worker_env(c, decode)  # per node only
    assert dynamo.frontend_env(c.profile) == seed_exports("In the frontend shell:")
    # mpirun -np 1 / -np 2
    assert [w.ranks for w in (prefill, decode)] == [1, 2]
    setup = seed_exports("Open a shell in this container for each of the frontend, prefill, and decode commands below with docker exec -it qwen35-gb300 /bin/bash. Run this setup in each shell. Replace the service endpoints when they run on another host:")
    common = dynamo.common_env(c, c.profile, node)
    assert list(common) == list(setup)
    # the endpoints point at node 0's serving IP instead of 127.0.0.1
    assert common == {**setup, "ETCD_ENDPOINTS": "http://198.51.100.70:2379", "NATS_SERVER": "nats://198.51.100.70:4222"}
    # the prepared env file (roles.commenv) carries the same block
    env = commenv.env_vars(c, node)
    assert {k: env[k] for k in common} == common
    assert env["TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL"] == "1"


def test_env_file_of_a_non_colocated_topology_has_no_weight_loading_variable():
    c = load_cluster("sim-gb300-1p2d")
    for node in c.nodes:
        env = commenv.env_vars(c, node)
        assert "TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL" not in env
        assert env["ETCD_ENDPOINTS"] == "http://198.19.31.10:2379" and env["NATS_SERVER"] == "nats://198.19.31.10:4222"
        assert env["MODEL_PATH"] == "/models/qwen35" and env["CONFIG_DIR"] == "/opt/trtllm-recipes/examples/configs/curated"


# --- placement ------------------------------------------------------------------------------
@pytest.mark.parametrize("topology,nodes", list(zip(ALL, [1, 1, 5, 9, 9, 8, 7, 5])))
def test_placement_of_every_topology(topology, nodes):
    c = gb300(topology)
    assert len(c.nodes) == nodes
    workers = dynamo.placement(c, c.profile)
    t = dynamo.TOPOLOGIES[topology]
    assert [w.name for w in workers] == [f"prefill{i}" for i in range(t.prefill_replicas)] + [f"decode{i}" for i in range(t.decode_replicas)]
    # every node of the inventory is used
    assert {n for w in workers for n in w.node_names} == {n.name for n in c.nodes}
    # GPU masks disjoint, one rank per GPU, ranks = TP x PP
    seen = set()
    for w in workers:
        assert w.ranks == w.tp * w.pp == sum(len(g) for _, g in w.nodes) and w.pp == 1
        for node, gpus in w.nodes:
            assert len(set(gpus)) == len(gpus) and all(0 <= g < 4 for g in gpus)
            for g in gpus:
                assert (node, g) not in seen
                seen.add((node, g))
            assert w.cuda_visible_devices(node) == ",".join(map(str, gpus))
        if w.tp == 8:
            assert len(w.nodes) == 2 and all(len(g) == 4 for _, g in w.nodes)
        if w.tp == 16:
            assert len(w.nodes) == 4 and all(len(g) == 4 for _, g in w.nodes)
        if w.tp <= 4:
            assert len(w.nodes) == 1
    # distinct system ports 8081, 8082, ... in order
    assert [w.system_port for w in workers] == list(range(8081, 8081 + len(workers)))
    assert [w.env["DYN_SYSTEM_PORT"] for w in workers] == [str(p) for p in range(8081, 8081 + len(workers))]
    # the frontend, etcd and NATS on node 0
    ports0 = budget.ports_for(c, c.nodes[0])
    assert {8000, 2379, 2380, 4222, 8222} <= set(ports0)
    for n in c.nodes[1:]:
        assert not {8000, 2379, 2380, 4222, 8222} & set(budget.ports_for(c, n))
    # no two services on one port on one node
    for n in c.nodes:
        mine = [w.system_port for w in workers if w.rank0_node == n.name]
        assert set(mine) <= set(budget.ports_for(c, n))


def test_the_colocated_1p1d_is_the_seeds_and_1p2d_spans_five_nodes():
    c = load_cluster("gb300-agentic")
    assert [(w.name, w.nodes, w.system_port) for w in dynamo.placement(c, c.profile)] == [
        ("prefill0", [("gb300-node-0", [0])], 8081),
        ("decode0", [("gb300-node-0", [1, 2])], 8082),
    ]
    c = load_cluster("sim-gb300-1p2d")
    names = [n.name for n in c.nodes]
    assert [(w.name, w.profile, w.node_names) for w in dynamo.placement(c, c.profile)] == [
        ("prefill0", "P4-TEP", names[0:1]),
        ("decode0", "D8-B4", names[1:3]),
        ("decode1", "D8-B4", names[3:5]),
    ]
    assert [str(n.ip) for n in c.nodes] == [f"198.19.31.{10 + i}" for i in range(5)]
    assert c.deploy.ready_timeout_s <= 120 and load_cluster("sim-gb300-agentic").deploy.ready_timeout_s <= 120
    w = dynamo.worker(c, c.profile, "decode1")
    assert w.as_dict()["nodes"] == [[names[3], [0, 1, 2, 3]], [names[4], [0, 1, 2, 3]]]
    assert dynamo.ranks_on(c, c.profile, names[3]) == {"decode1": 4}
    with pytest.raises(KeyError):
        w.cuda_visible_devices(names[0])


def test_3p1d_and_3p2d_layouts():
    c = gb300("3P1D")
    names = [w.node_names for w in dynamo.placement(c, c.profile)]
    assert names == [["n0"], ["n1"], ["n2"], ["n3", "n4", "n5", "n6"]]
    c = gb300("3P2D")
    names = [w.node_names for w in dynamo.placement(c, c.profile)]
    assert names == [["n0"], ["n1"], ["n2"], ["n3"], ["n4"]]


def test_the_simulated_3p2d_is_the_layout_its_integration_test_expects():
    from llmdeploy.inventory import list_clusters
    from tests.integration import test_deploy_dynamo_3p2d as t

    c = load_cluster("sim-gb300-3p2d")
    assert c.profile.topology == "3P2D" and [n.name for n in c.nodes] == t.NODES
    assert {w.name: (w.rank0_node, w.system_port) for w in dynamo.placement(c, c.profile)} == t.WORKERS
    assert all(len(w.nodes) == 1 and w.ranks == 4 for w in dynamo.placement(c, c.profile))
    assert c.profile.served_model_name == t.SERVED and not c.profile.topology_info.colocated
    # its own addresses: no other simulated cluster's node shares an IP with it
    mine = {str(n.ip) for n in c.nodes}
    for name in list_clusters():
        if name.startswith("sim-") and name != c.name:
            assert not mine & {str(n.ip) for n in load_cluster(name).nodes}, name


def test_explicit_workers_place_where_told():
    c = gb300("1P1D-B4", workers=[
        DynamoWorker(gpus={"n0": [3]}, system_port=9001, env={"EXTRA": "1"}),
        DynamoWorker(gpus={"n0": [0, 1]}, system_port=9002),
    ])
    p, d = dynamo.placement(c, c.profile)
    assert (p.nodes, p.system_port, p.env["EXTRA"]) == ([("n0", [3])], 9001, "1")
    assert d.cuda_visible_devices("n0") == "0,1" and d.env["DYN_SYSTEM_PORT"] == "9002"
    # only ports and env: the GPUs stay derived
    c = gb300("1P2D", workers=[DynamoWorker(env={"A": "1"}), DynamoWorker(), DynamoWorker(system_port=9100)])
    assert [w.system_port for w in dynamo.placement(c, c.profile)] == [8081, 8082, 9100]


def test_external_control_plane_is_not_bound_on_node_0():
    c = gb300("1P1D-B8", etcd_endpoints="http://192.0.2.5:2379,http://192.0.2.6:2379", nats_server="nats://192.0.2.7:4222")
    assert c.profile.ports() == {"frontend_port": 8000}
    assert set(budget.ports_for(c, c.nodes[0])) == {8000, 8081, 8082}
    env = dynamo.common_env(c, c.profile, c.nodes[0])
    assert env["ETCD_ENDPOINTS"] == "http://192.0.2.5:2379,http://192.0.2.6:2379" and env["NATS_SERVER"] == "nats://192.0.2.7:4222"
    # etcd's ports are free to reuse when etcd runs elsewhere
    gb300("1P1D-B8", etcd_endpoints="http://192.0.2.5:2379", nats_port=2379)


# --- refusals, before any connection -----------------------------------------------------
def test_a_topology_needing_more_nodes_is_refused_with_how_many():
    problems = refused(lambda: gb300("1P2D", nodes=1))
    assert problems == [
        "profile.topology: 1P2D (1 x P4-TEP + 2 x D8-B4) needs 5 nodes of 4 GPUs (20 GPUs in use) "
        "but the inventory has 1 node (4 GPUs)"
    ]
    problems = refused(lambda: gb300("3P1D", nodes=6))
    assert problems == [
        "profile.topology: 3P1D (3 x P4-DEP + 1 x D16-B8) needs 7 nodes of 4 GPUs (28 GPUs in use) "
        "but the inventory has 6 nodes (24 GPUs)"
    ]


def test_a_node_with_too_few_gpus_is_refused():
    def build():
        nodes = [Node(name="n0", ip="198.51.100.10", devices=2)]
        return Cluster(name="t", platform="gb300", nic="eth0", nodes=nodes, model=Model(path="/m"),
                       image=image(IMAGE_DYNAMO), profile=dynamo_gb300("1P1D-B8", recipes_dir="/opt/TensorRT-LLM"))

    assert refused(build) == [
        "profile.topology: 1P1D-B8 (1 x P1 + 1 x D2-B8) needs 2 nodes of 2 GPUs (3 GPUs in use) "
        "but the inventory has 1 node (2 GPUs)"
    ]


def test_a_node_the_topology_does_not_use_is_refused():
    assert refused(lambda: gb300("1P1D-B8", nodes=2)) == [
        "nodes[1] (n1): topology 1P1D-B8 places no worker on this node (it uses 1 of 2 nodes): "
        "remove it or choose a larger topology"
    ]


def test_overlapping_gpu_masks_are_refused():
    problems = refused(lambda: gb300("1P1D-B8", workers=[
        DynamoWorker(gpus={"n0": [0]}), DynamoWorker(gpus={"n0": [0, 1]}),
    ]))
    assert problems == ["profile.workers[1].gpus.n0: decode0's GPU mask overlaps prefill0: GPU 0 on nodes[0] (n0)"]
    problems = refused(lambda: gb300("1P1D-B8", workers=[
        DynamoWorker(gpus={"n0": [0]}), DynamoWorker(gpus={"n0": [2, 2]}),
    ]))
    assert problems == ["profile.workers[1].gpus.n0: GPU 2 is listed twice for decode0"]


def test_rank_counts_that_do_not_match_tp_x_pp_are_refused():
    problems = refused(lambda: gb300("1P1D-B8", workers=[
        DynamoWorker(gpus={"n0": [0]}), DynamoWorker(gpus={"n0": [1]}),
    ]))
    assert problems == ["profile.workers[1].gpus: decode0 (D2-B8) has 1 ranks (GPUs) but runs TP 2 x PP 1 = 2"]
    problems = refused(lambda: gb300("1P2D", workers=[
        DynamoWorker(gpus={"n0": [0, 1, 2, 3]}),
        DynamoWorker(gpus={"n1": [0, 1, 2, 3], "n2": [0, 1]}),
        DynamoWorker(gpus={"n3": [0, 1, 2, 3], "n4": [0, 1, 2, 3]}),
    ]))
    assert problems == ["profile.workers[1].gpus: decode0 (D8-B4) has 6 ranks (GPUs) but runs TP 8 x PP 1 = 8"]


def test_explicit_gpus_on_unknown_nodes_or_gpus_and_partial_lists_are_refused():
    problems = refused(lambda: gb300("1P1D-B8", workers=[
        DynamoWorker(gpus={"n9": [0]}), DynamoWorker(gpus={"n0": [3, 4]}),
    ]))
    assert problems == [
        "profile.workers[0].gpus.n9: no node named 'n9' (nodes: n0)",
        "profile.workers[1].gpus.n0: GPU 4 does not exist on nodes[0] (n0), which has 4 GPUs",
    ]
    assert refused(lambda: gb300("1P1D-B8", workers=[DynamoWorker(gpus={"n0": [0]}), DynamoWorker()])) == [
        "profile.workers[1].gpus: set gpus on every worker or on none (derived from the topology)"
    ]
    assert refused(lambda: gb300("1P1D-B8", workers=[DynamoWorker()])) == [
        "profile.workers: 1 entries but topology 1P1D-B8 has 2 workers (prefill0, decode0)"
    ]


def test_two_services_on_one_port_on_one_node_are_refused():
    # a worker's system port on node 0 against the frontend
    assert refused(lambda: gb300("1P1D-B8", frontend_port=8081)) == [
        "profile.system_port_base (+0): prefill0's DYN_SYSTEM_PORT 8081 on nodes[0] (n0) is also profile.frontend_port"
    ]
    # node 0's services against each other (NATS monitor on etcd's peer port)
    assert refused(lambda: gb300("1P1D-B8", nats_monitor_port=2380)) == [
        "profile.nats_monitor_port: port 2380 is also profile.etcd_peer_port"
    ]
    # two workers on one system port
    assert refused(lambda: gb300("1P1D-B8", workers=[DynamoWorker(), DynamoWorker(system_port=8081)])) == [
        "profile.workers[1].system_port: decode0's DYN_SYSTEM_PORT 8081 is also prefill0's: every worker needs its own DYN_SYSTEM_PORT"
    ]
    assert refused(lambda: gb300("1P1D-B8", system_port_base=32767)) == [
        "profile.system_port_base (+1): decode0's DYN_SYSTEM_PORT 32768 is above 32767: Dynamo's runtime reads it as a 16-bit signed integer"
    ]
    # etcd's client port on a system port
    assert refused(lambda: gb300("1P2D", system_port_base=2379)) == [
        "profile.system_port_base (+0): prefill0's DYN_SYSTEM_PORT 2379 on nodes[0] (n0) is also profile.etcd_port"
    ]


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(frontend_env={"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS": "3"}), "profile.frontend_env.TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS"),
        (dict(worker_env={"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS": "3"}), "profile.worker_env.TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS"),
        (dict(workers=[DynamoWorker(), DynamoWorker(env={"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS": "3"})]),
         "profile.workers[1].env.TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS"),
    ],
)
def test_forced_acceptance_is_refused_in_every_env_dict(kwargs, field):
    assert refused(lambda: gb300("1P1D-B8", **kwargs)) == [
        f"{field}: must never be set in production or accuracy runs (seed 000); the workers unset it"
    ]


def test_forced_acceptance_is_refused_as_a_secret():
    def build():
        c = gb300("1P1D-B8")
        return Cluster(**{**dict(c), "secret_env": {"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS": "MY_VAR"}})

    assert refused(build) == [
        "secret_env.TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS: must never be set in production or accuracy runs (seed 000); the workers unset it"
    ]


def test_placement_and_common_variables_are_refused_in_env_dicts():
    problems = refused(lambda: gb300("1P2D", worker_env={"TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL": "1", "MODEL_PATH": "/x"}))
    assert problems == [
        "profile.worker_env.TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL: comes from the topology and the placement, not from an env dict",
        "profile.worker_env.MODEL_PATH: comes from the profile's fields (the seed's setup block); set those instead",
    ]


def test_profile_fields_are_checked():
    assert refused(lambda: gb300("2P2D", nodes=1)) == [
        "profile.topology: '2P2D' is not a topology; use one of: 1P1D-B8, 1P1D-B4, 1P2D, 1P4D-B1, 1P4D-B4, 2P3D, 3P1D, 3P2D"
    ]
    assert refused(lambda: gb300("1P1D-B8", config_dir="/app/tensorrt_llm/examples/configs/curated")) == [
        "profile.config_dir: /app/tensorrt_llm/examples/configs/curated is not under recipes_mount /opt/trtllm-recipes: "
        "the base files come from the recipes checkout, not from the image"
    ]
    problems = refused(lambda: gb300("1P1D-B8", recipes_dir="/opt/x $(reboot)", nats_server="http://x:4222"))
    assert any(p.startswith("profile.recipes_dir: ") and "not a safe absolute path" in p for p in problems)
    assert any(p.startswith("profile.nats_server: ") for p in problems)


@pytest.mark.parametrize("platform", sorted(set(PLATFORMS) - {"gb300"}))
def test_dynamo_outside_gb300_is_refused_naming_the_platform(platform):
    """Seed 000's Dynamo profile is for GB300 NVL72: on another platform it is
    refused with the reason, naming the field, whatever the node count."""
    def build(nodes: int):
        return Cluster(name="t", platform=platform, nic="eth0", nodes=make_nodes("n", nodes, "198.51.100.10"),
                       model=Model(path="/models/Qwen3.5-397B-A17B-NVFP4-V2"), image=image(IMAGE_DYNAMO),
                       profile=dynamo_gb300("1P1D-B8", recipes_dir="/opt/TensorRT-LLM"))

    name = PLATFORMS[platform].name
    for nodes in (1, 2):
        assert refused(lambda: build(nodes)) == [
            f"platform: {platform} ({name}): the dynamo profile (profile.kind) is the seed's Qwen3.5 GB300 NVL72 agentic "
            "profile, for gb300 only; its topologies, GPU placement and host-memory budget are not given for other platforms"
        ]


def test_dynamo_on_a_b200_inventory_exits_2_before_any_connection(tmp_path):
    """invoke with a B200 inventory of the Dynamo profile: exit 2, the file and
    the field named, and no node contacted (its address is a documentation
    one; facts would have to connect to it)."""
    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "dyn_b200.py").write_text(INVENTORY.format(extra="").replace('platform="gb300"', 'platform="b200"')
                                     .replace('"1P4D-B4"', '"1P1D-B8"').replace('make_nodes("g", 3,', 'make_nodes("g", 1,')
                                     .replace('name="big"', 'name="dyn-b200"'))
    for task in (["deploy", "--check"], ["facts"], ["prepare"]):
        res = run_invoke(task[0], "--cluster", "dyn-b200", *task[1:], env={"LLMDEPLOY_INVENTORY": str(inv)}, timeout=60)
        assert res.returncode == 2, (task, res.stdout, res.stderr)
        assert "dyn_b200.py: platform: b200 (B200): the dynamo profile (profile.kind)" in res.stderr, res.stderr
        assert "Traceback" not in res.stderr and res.stdout == "", task


INVENTORY = """
from llmdeploy.inventory import Cluster, Model, make_nodes
from systems.dynamo.catalogue import IMAGE_DYNAMO, dynamo_gb300
from llmdeploy.inventory import image
cluster = Cluster(name="big", platform="gb300", nic="eth0", nodes=make_nodes("g", 3, "198.51.100.10"),
                  model=Model(path="/m"), image=image(IMAGE_DYNAMO),
                  profile=dynamo_gb300("1P4D-B4", recipes_dir="/opt/TensorRT-LLM"{extra}))
"""


@pytest.mark.parametrize(
    "extra,fragment",
    [
        ("", "profile.topology: 1P4D-B4 (1 x P4-TEP + 4 x D8-B4) needs 9 nodes of 4 GPUs (36 GPUs in use) "
             "but the inventory has 3 nodes (12 GPUs)"),
        (', worker_env={"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS": "1"}',
         "profile.worker_env.TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS: must never be set"),
    ],
)
def test_an_inventory_file_names_file_and_field(tmp_path, extra, fragment):
    inv = tmp_path / "inventory"
    inv.mkdir()
    path = inv / "big.py"
    path.write_text(INVENTORY.format(extra=extra))
    with pytest.raises(InventoryError) as exc:
        load_cluster_file(path)
    assert exc.value.exit_code == 2
    assert f"big.py: {fragment}" in str(exc.value)


# --- prepare's budget: 128 GiB host KV cache per rank on each node, from the placement ------------
def _facts(mem_gib: float, listening=(22,)) -> dict:
    return {
        "hostname": "h", "mem_total_kib": int(mem_gib * 1048576), "base_disk_free_gib": 500.0,
        "listening": list(listening), "our_containers": [],
    }


def test_budget_uses_the_placement_per_node():
    c = load_cluster("sim-gb300-1p2d")
    for node in c.nodes:
        need = budget.memory_need(c, node)
        assert need == {"host KV cache (4 ranks x 128 GiB)": 512.0, "weights loading/staging": 208.0, "OS margin": 64.0}
        assert budget.check(node, _facts(840), c).status == OK
    r = budget.check(c.nodes[3], _facts(700), c)
    assert r.status == FAILED and r.msg == (
        "host memory 700 GiB < 784 GiB needed "
        "(512 GiB host KV cache (4 ranks x 128 GiB) + 208 GiB weights loading/staging + 64 GiB OS margin)"
    )
    assert r.host == c.nodes[3].name
    # 1P1D: 3 ranks on the one node (1 prefill + 2 decode); GPU 3 is idle
    one = load_cluster("gb300-agentic")
    assert budget.memory_need(one, one.nodes[0])["host KV cache (3 ranks x 128 GiB)"] == 384.0
    # the system ports on the node of each worker's rank 0
    assert budget.ports_for(c, c.nodes[1]) == {8082: "decode0 DYN_SYSTEM_PORT"}
    assert budget.ports_for(c, c.nodes[2]) == {}
    r = budget.check(c.nodes[1], _facts(840, listening=(22, 8082)), c)
    assert r.status == FAILED and r.msg == "port 8082 (decode0 DYN_SYSTEM_PORT) is already in use"
    # host_cache_bytes_per_rank drives both the YAML and the budget
    half = gb300("1P1D-B8", host_cache_bytes_per_rank=64 * GIB)
    assert budget.memory_need(half, half.nodes[0])["host KV cache (3 ranks x 64 GiB)"] == 192.0
    assert dynamo.role_overrides(half, half.profile, dynamo.placement(half, half.profile)[0])["kv_cache_config"]["host_cache_size"] == 64 * GIB


# --- merge-config.py: removal ---------------------------------------------------------------------
BASE_DECODE = """\
tensor_parallel_size: 2
moe_expert_parallel_size: 2
max_batch_size: 8
kv_cache_config:
  dtype: fp8
  use_kv_cache_manager_v2: true
  free_gpu_memory_fraction: 0.85
cache_transceiver_config:
  backend: NIXL
  kv_cache_bounce_size_mb: 2048
speculative_config:
  decoding_type: MTP
  max_draft_len: 6
stream_interval: 20
"""


def run_merge(tmp_path, base_text, overrides_text):
    script = tmp_path / "merge-config.py"
    script.write_text(trtllm.merge_script())
    base, overrides, out = tmp_path / "base.yaml", tmp_path / "role.yaml", tmp_path / "out.yaml"
    base.write_text(base_text)
    overrides.write_text(overrides_text)
    res = subprocess.run([sys.executable, str(script), str(base), str(overrides), str(out)], capture_output=True, text=True)
    return res, out


def test_merge_removes_the_bounce_size_for_a_non_colocated_topology(tmp_path):
    c = load_cluster("sim-gb300-1p2d")
    w = dynamo.worker(c, c.profile, "decode0")
    res, out = run_merge(tmp_path, BASE_DECODE, dynamo.role_yaml(c, c.profile, w))
    assert res.returncode == 0, res.stderr
    merged = yaml.safe_load(out.read_text())
    assert merged["cache_transceiver_config"] == {"backend": "NIXL"}
    assert "__delete__" not in merged
    # the base's own keys stay, the role's keys are set
    assert merged["stream_interval"] == 20 and merged["kv_cache_config"]["dtype"] == "fp8"
    flat = _dotted(merged)
    for key, value in _dotted({k: v for k, v in dynamo.role_overrides(c, c.profile, w).items() if k != "__delete__"}).items():
        assert flat[key] == value, key
    assert "  removed cache_transceiver_config.kv_cache_bounce_size_mb: 2048" in res.stdout.splitlines()
    assert "set tensor_parallel_size: 2 -> 8" in res.stdout


def test_merge_keeps_the_bounce_size_for_the_colocated_1p1d(tmp_path):
    c = load_cluster("gb300-agentic")
    w = dynamo.worker(c, c.profile, "decode0")
    res, out = run_merge(tmp_path, BASE_DECODE, dynamo.role_yaml(c, c.profile, w))
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load(out.read_text())["cache_transceiver_config"] == {"backend": "NIXL", "kv_cache_bounce_size_mb": 2048}
    assert "removed" not in res.stdout


def test_merge_removal_of_an_absent_key_is_reported_not_counted(tmp_path):
    res, out = run_merge(tmp_path, "a: 1\nb:\n  c: 2\n", "__delete__:\n- b.x\n- z.y\n")
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load(out.read_text()) == {"a": 1, "b": {"c": 2}}
    assert "0 change(s)" in res.stdout.splitlines()[0]
    assert "  __delete__ b.x: not in the curated file, nothing to remove" in res.stdout
    res, out = run_merge(tmp_path, "a: 1\nb:\n  c: 2\n  d: 3\n", "__delete__: [b.c, a]\n")
    assert yaml.safe_load(out.read_text()) == {"b": {"d": 3}}
    assert "2 change(s)" in res.stdout.splitlines()[0]


@pytest.mark.parametrize(
    "overrides_text,fragment",
    [
        ("a: 2\n__delete__: [a]\n", "a is both set and listed under __delete__"),
        ("__delete__: b.c\n", "__delete__ must be a list of dotted keys"),
        ("__delete__: [b..c]\n", "__delete__ must be a list of dotted keys"),
        ("__delete__: [1]\n", "__delete__ must be a list of dotted keys"),
    ],
)
def test_merge_refuses_a_bad_delete_list(tmp_path, overrides_text, fragment):
    res, out = run_merge(tmp_path, "a: 1\nb:\n  c: 2\n", overrides_text)
    assert res.returncode == 2 and fragment in res.stderr and res.stderr.startswith("merge-config: ")
    assert not out.exists()
