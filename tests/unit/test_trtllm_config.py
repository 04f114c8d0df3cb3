"""trtllm-serve configuration: the TrtllmProfile schema (curated profiles,
overrides, EPLB map, MPI slots), the static EPLB map checks, the overrides
YAML and the merge program that layers it on the curated profile."""

import hashlib
import subprocess
import sys
import textwrap

import pytest
import yaml
from pydantic import ValidationError

from llmdeploy.errors import InventoryError
from llmdeploy.inventory import Cluster, Model, Node, load_cluster, load_cluster_file, make_nodes, problems_from_validation
from systems.trtllm.profile import TrtllmProfile, eplb_map_ep_from_name
from systems.trtllm.catalogue import IMAGE_TRTLLM, image, trtllm_qwen35_nvfp4, trtllm_qwen38_fp8
from systems.trtllm import config as trtllm
from systems.trtllm import eplb

HT = "qwen3.8-high-throughput.yaml"
HT_MTP = "qwen3.8-high-throughput-mtp3.yaml"


# --- EPLB maps ------------------------------------------------------------------
def map_text(layers=92, slots=544, num_slots=544, updates=0, expert=None, extra=""):
    """A static placement: every expert once plus 32 replicas, one flow list per layer."""
    expert = expert or (lambda layer, slot: (slot + layer) % 512)
    rows = []
    for layer in range(layers):
        n = slots(layer) if callable(slots) else slots
        rows.append(f"  {layer}: [{', '.join(str(expert(layer, s)) for s in range(n))}]")
    return f"num_slots: {num_slots}\ninitial_global_assignments:\n" + "\n".join(rows) + f"\nlayer_updates_per_iter: {updates}\n{extra}"


def test_valid_maps_pass_and_report_their_sha256(tmp_path):
    for config, layers in ((HT, 92), (HT_MTP, 93)):
        text = map_text(layers=layers)
        assert eplb.check_map(text, config) == []
        path = tmp_path / f"{layers}.yaml"
        path.write_text(text)
        m = eplb.load_map(path, config)
        assert (m.num_slots, m.layers) == (544, layers)
        assert m.sha256 == hashlib.sha256(text.encode()).hexdigest()
        assert m.text == text and m.path == str(path)


def test_a_layer_with_543_slots_is_refused(tmp_path):
    text = map_text(slots=lambda layer: 543 if layer == 7 else 544)
    assert "layer 7 has 543 slots, expected 544" in eplb.check_map(text, HT)
    path = tmp_path / "qwen3.8-ep32-static544.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as exc:
        eplb.load_map(path, HT)
    assert str(path) in str(exc.value) and "layer 7 has 543 slots, expected 544" in str(exc.value)


def test_a_92_layer_map_under_the_mtp3_profile_is_refused():
    problems = eplb.check_map(map_text(layers=92), HT_MTP)
    assert problems == ["92 layers but qwen3.8-high-throughput-mtp3.yaml needs 93 (the 92 MoE layers + the MTP layer)"]
    # and the MTP3 map under the plain profile
    problems = eplb.check_map(map_text(layers=93), HT)
    assert any(p.startswith("93 layers but qwen3.8-high-throughput.yaml needs 92") for p in problems)
    assert any("layer 92 is outside 0..91" in p for p in problems)


def test_expert_id_512_is_refused():
    text = map_text(expert=lambda layer, slot: 512 if (layer, slot) == (3, 10) else (slot + layer) % 512)
    problems = eplb.check_map(text, HT)
    assert problems == ["layer 3 slot 10: expert id 512 is outside 0..511"]


def test_every_problem_is_listed_at_once(tmp_path):
    text = map_text(
        num_slots=512,
        updates=2,
        slots=lambda layer: 543 if layer == 7 else 544,
        expert=lambda layer, slot: 600 if (layer, slot) == (3, 10) else (slot + layer) % 512,
        extra="ep_size: 32\n",
    )
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as exc:
        eplb.load_map(path, HT)
    msg = str(exc.value)
    for frag in (
        "num_slots is 512, expected 544",
        "layer_updates_per_iter is 2; a static map needs 0",
        "layer 7 has 543 slots, expected 544",
        "layer 3 slot 10: expert id 600 is outside 0..511",
        "unknown key 'ep_size'",
        f"EPLB map {path} is not usable with {HT}",
    ):
        assert frag in msg, f"{frag!r} not in {msg!r}"


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("num_slots: 544\nlayer_updates_per_iter: 0\n", "initial_global_assignments is missing"),
        ("- 1\n- 2\n", "must be a mapping"),
        ("num_slots: [\n", "not valid YAML"),
        ("num_slots: 544\nnum_slots: 544\n", "key 'num_slots' appears twice"),
    ],
)
def test_malformed_maps(text, fragment):
    problems = eplb.check_map(text, HT)
    assert any(fragment in p for p in problems), problems


def test_a_layer_missing_an_expert_is_refused():
    # expert 5 never placed in layer 0: its slots 5 and 517 (the replica) hold 6 instead
    text = map_text(expert=lambda layer, slot: 6 if layer == 0 and slot in (5, 517) else (slot + layer) % 512)
    assert eplb.check_map(text, HT) == ["layer 0 has no slot for expert 5 (every expert 0..511 needs at least one)"]


def test_maps_are_only_for_high_throughput_profiles(tmp_path):
    assert "takes no static EPLB map" in eplb.check_map(map_text(), "qwen3.8-low-latency.yaml")[0]
    with pytest.raises(ValueError, match="cannot read"):
        eplb.load_map(tmp_path / "absent.yaml", HT)


# --- the profile and the cluster ---------------------------------------------------
def nvidia_cluster(profile, nodes=None, platform="b200"):
    return Cluster(
        name="t", platform=platform, nic="eth0", nodes=nodes or make_nodes("n", 2, "192.0.2.10"),
        model=Model(path="/models/x"), image=image(IMAGE_TRTLLM), profile=profile,
    )


def problems_of(build) -> str:
    with pytest.raises(ValidationError) as exc:
        build()
    return "\n".join(problems_from_validation(exc.value))


def test_shipped_trtllm_inventories_load_with_default_placement():
    b200 = load_cluster("b200")
    assert b200.profile.ranks(b200.nodes) == [("b200-node-0", 8), ("b200-node-1", 8)]
    q = load_cluster("qwen35-b200")
    assert q.profile.ranks(q.nodes) == [("b200-node-0", 4)]
    assert b200.profile.config_dir == "/app/tensorrt_llm/examples/configs/curated"
    assert b200.profile.launch_ssh_config is None and b200.profile.overrides == {}


def test_slots_that_do_not_make_tp_x_pp_are_refused():
    text = problems_of(lambda: nvidia_cluster(trtllm_qwen38_fp8(slots={"n0": 8, "n1": 4})))
    assert "profile.slots: 12 ranks (the sum of the slots) ≠ TP 16 × PP 1 = 16" in text


def test_a_node_with_more_slots_than_gpus_is_refused():
    text = problems_of(lambda: nvidia_cluster(trtllm_qwen38_fp8(slots={"n0": 10, "n1": 6})))
    assert "profile.slots.n0: 10 slots but nodes[0] (n0) has 8 GPUs (devices)" in text
    assert "n1" not in text.replace("nodes[0] (n0)", "")  # only the node at fault


def test_unknown_slot_nodes_and_an_empty_node_0_are_refused():
    text = problems_of(lambda: nvidia_cluster(trtllm_qwen38_fp8(slots={"n0": 8, "n1": 8, "n9": 0})))
    assert "profile.slots.n9: no node named 'n9' (nodes: n0, n1)" in text
    text = problems_of(lambda: nvidia_cluster(trtllm_qwen35_nvfp4(slots={"n0": 0, "n1": 4})))
    assert "profile.slots.n0: node 0 (n0) needs at least one slot" in text


def test_more_ranks_than_gpus_without_slots_is_refused():
    text = problems_of(lambda: nvidia_cluster(trtllm_qwen38_fp8(), nodes=[Node(name="n0", ip="192.0.2.10")]))
    assert "profile.tp: TP 16 x PP 1 = 16 but the nodes have 8 GPUs" in text


def test_slots_place_ranks_unevenly_node_0_first():
    nodes = make_nodes("n", 3, "192.0.2.10")
    c = nvidia_cluster(trtllm_qwen38_fp8(slots={"n2": 4, "n1": 4}), nodes=nodes)
    assert c.profile.ranks(c.nodes) == [("n0", 8), ("n1", 4), ("n2", 4)]
    # a spare node with no slot is left out of the placement
    c = nvidia_cluster(trtllm_qwen35_nvfp4(slots={"n0": 4, "n1": 0}))
    assert c.profile.ranks(c.nodes) == [("n0", 4)]


@pytest.mark.parametrize(
    "build,fragments",
    [
        (lambda: trtllm_qwen38_fp8("qwen3.8-medium.yaml"),
         ["profile.config", "'qwen3.8-medium.yaml' is not a curated profile", "qwen3.8-low-latency.yaml", "qwen3.5.yaml"]),
        (lambda: trtllm_qwen38_fp8(served_model_name="nvidia/Qwen3.5-397B-A17B-NVFP4"),
         ["profile.served_model_name", "is not a Qwen3.8 model", "qwen3.8-low-latency.yaml"]),
        (lambda: trtllm_qwen35_nvfp4(served_model_name="Qwen/Qwen3.8-2.4T-A95B-FP8"),
         ["profile.served_model_name", "is not a Qwen3.5 model"]),
        (lambda: trtllm_qwen38_fp8(tp=8), ["profile.tp", "qwen3.8-low-latency.yaml runs Qwen3.8-2.4T-A95B FP8 at TP16, not TP8"]),
        (lambda: trtllm_qwen35_nvfp4(tp=8), ["profile.tp", "at TP4, not TP8"]),
        (lambda: trtllm_qwen38_fp8(overrides={"tensor_parallel_size": 8}),
         ["profile.overrides.tensor_parallel_size", "comes from profile.tp"]),
        (lambda: trtllm_qwen38_fp8(overrides={"pipeline_parallel_size": 2}),
         ["profile.overrides.pipeline_parallel_size", "comes from profile.pp"]),
        (lambda: trtllm_qwen38_fp8(overrides={"speculative_config.max_draft_len": 2}),
         ["profile.overrides.speculative_config.max_draft_len", "has no MTP", "qwen3.8-low-latency-mtp3.yaml"]),
        (lambda: trtllm_qwen38_fp8(overrides={"speculative_config": {"max_draft_len": 2}}),
         ["profile.overrides.speculative_config.max_draft_len", "has no MTP"]),
        (lambda: trtllm_qwen38_fp8("qwen3.8-low-latency-mtp3.yaml", overrides={"speculative_config.max_draft_len": 0}),
         ["max_draft_len", "integer >= 1"]),
        (lambda: trtllm_qwen38_fp8(overrides={"kv_cache_config.Dtype": "fp8"}),
         ["profile.overrides.kv_cache_config.Dtype", "'Dtype' must match [a-z_][a-z0-9_]*"]),
        (lambda: trtllm_qwen38_fp8(overrides={"max_batch_size": 8, "max_batch_size.x": 1}),
         ["profile.overrides.max_batch_size", "also has 'max_batch_size.x'"]),
        (lambda: trtllm_qwen38_fp8(overrides={"kv_cache_config.dtype": "fp8", "kv_cache_config": {"dtype": "auto"}}),
         ["profile.overrides.kv_cache_config.dtype", "set twice"]),
        (lambda: trtllm_qwen38_fp8(eplb_map="/tmp/map.yaml"),
         ["profile.eplb_map", "high-throughput profiles", "not qwen3.8-low-latency.yaml"]),
        (lambda: trtllm_qwen38_fp8(HT, eplb_map="/nonexistent/qwen3.8-ep32-static544.yaml"),
         ["profile.eplb_map", "/nonexistent/qwen3.8-ep32-static544.yaml is not a file"]),
        (lambda: trtllm_qwen38_fp8(HT, tp=8), ["profile.tp", "qwen3.8-high-throughput.yaml runs Qwen3.8-2.4T-A95B FP8 at TP16 or TP32, not TP8"]),
        (lambda: trtllm_qwen38_fp8(overrides={"moe_expert_parallel_size": 8}),
         ["profile.overrides.moe_expert_parallel_size", "comes from profile.ep"]),
        (lambda: trtllm_qwen38_fp8(HT, ep=8),
         ["profile.ep", "moe_expert_parallel_size 8 (profile.ep) disagrees with tensor_parallel_size 16 (profile.tp)", "EP = TP"]),
        (lambda: trtllm_qwen38_fp8(eplb_map_ep=32), ["profile.eplb_map_ep", "profile.eplb_map, which is not set"]),
        (lambda: trtllm_qwen38_fp8(launch_ssh_config="ssh_config"), ["profile.launch_ssh_config", "safe absolute path"]),
        (lambda: trtllm_qwen38_fp8(trtllm_dir="/app/$(x)"), ["profile.trtllm_dir", "safe absolute path"]),
    ],
)
def test_profile_problems_name_the_field(build, fragments):
    text = problems_of(build)
    for frag in fragments:
        assert frag in text, f"{frag!r} not in {text!r}"


def test_high_throughput_at_the_minimum_tp16_on_16_gpus(tmp_path):
    """TP16 is the checkpoint's minimum: attention DP at EP16, written into the overrides; a static map
    generated for EP16 goes with it."""
    c = nvidia_cluster(trtllm_qwen38_fp8(HT_MTP, overrides={"speculative_config.max_draft_len": 2}))
    assert (c.profile.tp, c.profile.ep) == (16, 16)
    assert c.profile.ranks(c.nodes) == [("n0", 8), ("n1", 8)]
    doc = trtllm.overrides_doc(c, c.profile)
    assert (doc["tensor_parallel_size"], doc["moe_expert_parallel_size"]) == (16, 16)
    path = tmp_path / "qwen3.8-ep16-static544-mtp3.yaml"
    path.write_text(map_text(layers=93))
    c = nvidia_cluster(trtllm_qwen38_fp8(HT_MTP, eplb_map=str(path), overrides={"speculative_config.max_draft_len": 2}))
    assert trtllm.overrides_doc(c, c.profile, "/etc/llmdeploy/map.yaml")["moe_config"] == {"load_balancer": "/etc/llmdeploy/map.yaml"}


def test_an_ep32_placement_at_tp16_is_refused_naming_both_values(tmp_path):
    """Issue 19: qwen3.8-high-throughput.yaml at TP16 with the guide's ep32-static544 map used to be
    accepted; the map is for EP32 (seed 000: a placement is specific to EP), the merged config's EP is 16."""
    path = tmp_path / "qwen3.8-ep32-static544.yaml"
    path.write_text(map_text())
    text = problems_of(lambda: nvidia_cluster(trtllm_qwen38_fp8(HT, eplb_map=str(path))))
    assert ("profile.eplb_map: qwen3.8-ep32-static544.yaml is a placement for EP 32, but moe_expert_parallel_size is 16 "
            "(profile.ep, at tensor_parallel_size 16)") in text
    assert "use a map for EP 16 or run TP32/EP32" in text
    # the same map at the guide's TP32/EP32 (32 GPUs) is fine
    c = nvidia_cluster(trtllm_qwen38_fp8(HT, tp=32, eplb_map=str(path)), nodes=make_nodes("n", 4, "192.0.2.10"))
    assert (c.profile.ep, trtllm.overrides_doc(c, c.profile, "/m.yaml")["moe_expert_parallel_size"]) == (32, 32)
    # a map whose name says no EP: profile.eplb_map_ep says it, else refused
    plain = tmp_path / "placement.yaml"
    plain.write_text(map_text())
    text = problems_of(lambda: trtllm_qwen38_fp8(HT, eplb_map=str(plain)))
    assert "profile.eplb_map" in text and "expert-parallel size the placement was generated for is not known" in text
    assert trtllm_qwen38_fp8(HT, eplb_map=str(plain), eplb_map_ep=16).ep == 16
    text = problems_of(lambda: trtllm_qwen38_fp8(HT, eplb_map=str(plain), eplb_map_ep=32))
    assert "placement.yaml is a placement for EP 32, but moe_expert_parallel_size is 16" in text


@pytest.mark.parametrize("name, ep", [("qwen3.8-ep32-static544.yaml", 32), ("qwen3.8-ep32-static544-mtp3.yaml", 32),
                                      ("maps/EP16_static.yaml", 16), ("deep16.yaml", None), ("static544.yaml", None),
                                      ("qwen3.8-ep320.yaml", 320)])
def test_the_map_ep_from_its_file_name(name, ep):
    assert eplb_map_ep_from_name(name) == ep


def test_every_guide_profile_writes_its_ep_and_qwen35_keeps_the_curated_one():
    for config, ep in (("qwen3.8-low-latency.yaml", 1), ("qwen3.8-low-latency-mtp3.yaml", 1),
                       (HT, 16), (HT_MTP, 16)):
        c = nvidia_cluster(trtllm_qwen38_fp8(config))
        assert trtllm.overrides_doc(c, c.profile)["moe_expert_parallel_size"] == ep, config
        assert f"moe_expert_parallel_size {ep}: profile.ep" in trtllm.overrides_yaml(c, c.profile)
    # the guide gives Qwen3.5 no EP: the curated file's value stays unless the inventory sets one
    one = [Node(name="n0", ip="192.0.2.10", devices=4)]
    q = nvidia_cluster(trtllm_qwen35_nvfp4(), nodes=one)
    assert q.profile.ep is None and "moe_expert_parallel_size" not in trtllm.overrides_doc(q, q.profile)
    ep2 = nvidia_cluster(trtllm_qwen35_nvfp4(ep=2), nodes=one)
    assert trtllm.overrides_doc(ep2, ep2.profile)["moe_expert_parallel_size"] == 2
    assert "profile.ep: EP 3 must divide TP 4" in problems_of(lambda: nvidia_cluster(trtllm_qwen35_nvfp4(ep=3), nodes=one))


def test_config_dir_follows_trtllm_dir_unless_set():
    assert trtllm_qwen38_fp8(trtllm_dir="/opt/trtllm").config_dir == "/opt/trtllm/examples/configs/curated"
    assert trtllm_qwen38_fp8(trtllm_dir="/opt/trtllm", config_dir="/cfg").config_dir == "/cfg"


def test_eplb_map_relative_to_the_inventory_dir(tmp_path, monkeypatch):
    (tmp_path / "maps").mkdir()
    (tmp_path / "maps" / "qwen3.8-ep32-static544.yaml").write_text(map_text())
    monkeypatch.setenv("LLMDEPLOY_INVENTORY", str(tmp_path))
    p = trtllm_qwen38_fp8(HT, tp=32, eplb_map="maps/qwen3.8-ep32-static544.yaml")
    assert p.eplb_map_file() == tmp_path / "maps" / "qwen3.8-ep32-static544.yaml"
    assert (p.tp, p.ep) == (32, 32)  # attention DP: EP = TP, the map's EP
    assert eplb.load_map(p.eplb_map_file(), p.config).layers == 92


def test_inventory_file_with_bad_slots_names_file_field_and_node(tmp_path):
    inv = tmp_path / "inventory"
    inv.mkdir()
    (inv / "slots_t.py").write_text(textwrap.dedent("""
        from llmdeploy.inventory import Cluster, Model, make_nodes
        from systems.trtllm.catalogue import IMAGE_TRTLLM, trtllm_qwen38_fp8
        from llmdeploy.inventory import image
        cluster = Cluster(name="slots-t", platform="gb200", nic="eth0", nodes=make_nodes("g", 4, "192.0.2.10"),
                          model=Model(path="/m"), image=image(IMAGE_TRTLLM),
                          profile=trtllm_qwen38_fp8(slots={"g1": 5, "g2": 3}))
    """))
    with pytest.raises(InventoryError) as exc:
        load_cluster_file(inv / "slots_t.py")
    text = str(exc.value)
    assert "slots_t.py" in text
    assert "profile.slots.g1: 5 slots but nodes[1] (g1) has 4 GPUs (devices)" in text
    assert "profile.slots: 16 ranks" not in text  # 4 + 5 + 3 + 4 = 16: only the node is wrong


# --- the overrides YAML and the merge program ----------------------------------------
def mtp_cluster():
    return nvidia_cluster(
        trtllm_qwen38_fp8(
            "qwen3.8-low-latency-mtp3.yaml",
            overrides={
                "speculative_config.max_draft_len": 2,
                "kv_cache_config": {"free_gpu_memory_fraction": 0.8},
                "max_batch_size": 4,
            },
        )
    )


def ht_cluster(tmp_path):
    path = tmp_path / "qwen3.8-ep32-static544.yaml"
    path.write_text(map_text())
    return nvidia_cluster(
        # the guide's topology: TP32/EP32 on 32 GPUs
        trtllm_qwen38_fp8(HT, tp=32, eplb_map=str(path), overrides={"moe_config.backend": "CUTLASS"}),
        nodes=make_nodes("n", 4, "192.0.2.10"),
    )


def test_overrides_yaml_names_the_curated_file_and_every_key():
    c = mtp_cluster()
    text = trtllm.overrides_yaml(c, c.profile)
    assert text == trtllm.overrides_yaml(c, c.profile)  # deterministic
    assert "/app/tensorrt_llm/examples/configs/curated/qwen3.8-low-latency-mtp3.yaml" in text.splitlines()[1]
    for key in ("tensor_parallel_size", "pipeline_parallel_size", "moe_expert_parallel_size", "speculative_config.max_draft_len",
                "kv_cache_config.free_gpu_memory_fraction", "max_batch_size"):
        assert f"#   {key}\n" in text
    doc = yaml.safe_load(text)
    assert doc == trtllm.overrides_doc(c, c.profile) == {
        "tensor_parallel_size": 16,
        "pipeline_parallel_size": 1,
        "moe_expert_parallel_size": 1,  # the guide's low latency: TP16/EP1
        "enable_iter_perf_stats": True,  # /metrics counts requests in flight (drain, top)
        "speculative_config": {"max_draft_len": 2},
        "kv_cache_config": {"free_gpu_memory_fraction": 0.8},
        "max_batch_size": 4,
    }
    assert list(doc) == ["tensor_parallel_size", "pipeline_parallel_size", "moe_expert_parallel_size", "enable_iter_perf_stats",
                         "speculative_config", "kv_cache_config", "max_batch_size"]
    # the inventory may turn the statistics off
    off = nvidia_cluster(trtllm_qwen38_fp8("qwen3.8-low-latency-mtp3.yaml", overrides={"enable_iter_perf_stats": False}))
    assert trtllm.overrides_doc(off, off.profile)["enable_iter_perf_stats"] is False
    assert trtllm.curated_path(c.profile) == "/app/tensorrt_llm/examples/configs/curated/qwen3.8-low-latency-mtp3.yaml"


def test_overrides_with_the_eplb_map(tmp_path):
    c = ht_cluster(tmp_path)
    doc = trtllm.overrides_doc(c, c.profile, "/etc/llmdeploy/qwen3.8-ep32-static544.yaml")
    assert doc["tensor_parallel_size"] == 32
    assert doc["moe_config"] == {"backend": "CUTLASS", "load_balancer": "/etc/llmdeploy/qwen3.8-ep32-static544.yaml"}
    text = trtllm.overrides_yaml(c, c.profile, "/etc/llmdeploy/qwen3.8-ep32-static544.yaml")
    assert "#   moe_config.load_balancer\n" in text and "qwen3.8-ep32-static544.yaml)" in text
    with pytest.raises(ValueError, match="eplb_map is set"):
        trtllm.overrides_doc(c, c.profile)
    with pytest.raises(ValueError, match="no eplb_map"):
        trtllm.overrides_doc(mtp_cluster(), mtp_cluster().profile, "/etc/x.yaml")
    with pytest.raises(ValueError, match="safe absolute path"):
        trtllm.overrides_doc(c, c.profile, "/etc/$(x).yaml")


CURATED = """\
tensor_parallel_size: 16
moe_expert_parallel_size: 1
max_batch_size: 1
kv_cache_config:
  free_gpu_memory_fraction: 0.9
  dtype: fp8
speculative_config:
  decoding_type: MTP
  max_draft_len: 3
cuda_graph_config:
  batch_sizes: [1, 2]
"""


def run_merge(tmp_path, curated_text, overrides_text):
    script = tmp_path / "merge-config.py"
    script.write_text(trtllm.merge_script())
    curated, overrides, out = tmp_path / "curated.yaml", tmp_path / "overrides.yaml", tmp_path / "out.yaml"
    if curated_text is not None:
        curated.write_text(curated_text)
    overrides.write_text(overrides_text)
    res = subprocess.run([sys.executable, str(script), str(curated), str(overrides), str(out)], capture_output=True, text=True)
    return res, out


def test_merge_script_layers_the_overrides_on_the_curated_file(tmp_path):
    mtp = mtp_cluster()
    res, out = run_merge(tmp_path, CURATED, trtllm.overrides_yaml(mtp, mtp.profile))
    assert res.returncode == 0, res.stderr
    merged = yaml.safe_load(out.read_text())
    assert merged == {
        "tensor_parallel_size": 16,
        "moe_expert_parallel_size": 1,
        "enable_iter_perf_stats": True,
        "max_batch_size": 4,
        "kv_cache_config": {"free_gpu_memory_fraction": 0.8, "dtype": "fp8"},
        "speculative_config": {"decoding_type": "MTP", "max_draft_len": 2},
        "cuda_graph_config": {"batch_sizes": [1, 2]},
        "pipeline_parallel_size": 1,
    }
    assert "4 change(s)" in res.stdout.splitlines()[0] or "5 change(s)" in res.stdout.splitlines()[0]  # + enable_iter_perf_stats
    assert "set speculative_config.max_draft_len: 3 -> 2" in res.stdout
    assert "set kv_cache_config.free_gpu_memory_fraction: 0.9 -> 0.8" in res.stdout
    assert "set max_batch_size: 1 -> 4" in res.stdout
    assert "added pipeline_parallel_size: 1" in res.stdout
    assert "tensor_parallel_size" not in res.stdout  # unchanged
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curated.yaml", "merge-config.py", "out.yaml", "overrides.yaml"]
    # again: same output, written over the old one
    before = out.read_text()
    mtp = mtp_cluster()
    res, out = run_merge(tmp_path, CURATED, trtllm.overrides_yaml(mtp, mtp.profile))
    assert res.returncode == 0 and out.read_text() == before


def test_merge_script_lists_replace_and_empty_overrides(tmp_path):
    res, out = run_merge(tmp_path, CURATED, "cuda_graph_config:\n  batch_sizes: [4]\n")
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load(out.read_text())["cuda_graph_config"] == {"batch_sizes": [4]}
    assert "set cuda_graph_config.batch_sizes: [1, 2] -> [4]" in res.stdout
    res, out = run_merge(tmp_path, CURATED, "# nothing\n")
    assert res.returncode == 0 and "0 change(s)" in res.stdout
    assert yaml.safe_load(out.read_text()) == yaml.safe_load(CURATED)


@pytest.mark.parametrize(
    "curated_text,overrides_text,fragment",
    [
        (None, "max_batch_size: 4\n", "curated profile {curated} does not exist"),
        ("- a\n- b\n", "max_batch_size: 4\n", "curated profile {curated} must be a YAML mapping of options, but it is a list"),
        ("", "max_batch_size: 4\n", "but it is empty"),
        ("a: [\n", "max_batch_size: 4\n", "is not valid YAML"),
        (CURATED, "- 1\n", "overrides {overrides} must be a YAML mapping"),
    ],
)
def test_merge_script_refuses_bad_input(tmp_path, curated_text, overrides_text, fragment):
    res, out = run_merge(tmp_path, curated_text, overrides_text)
    assert res.returncode == 2
    fragment = fragment.format(curated=tmp_path / "curated.yaml", overrides=tmp_path / "overrides.yaml")
    assert fragment in res.stderr and res.stderr.startswith("merge-config: ")
    assert not out.exists()


def test_merge_script_usage(tmp_path):
    script = tmp_path / "merge-config.py"
    script.write_text(trtllm.merge_script())
    res = subprocess.run([sys.executable, str(script), "only-one"], capture_output=True, text=True)
    assert res.returncode == 2 and "usage: python3 merge-config.py <curated.yaml> <overrides.yaml> <out.yaml>" in res.stderr
    assert trtllm.merge_script().startswith("#!/usr/bin/env python3\n")
    compile(trtllm.merge_script(), "merge-config.py", "exec")


def test_trtllm_profile_is_the_schema_class():
    assert isinstance(load_cluster("sim-b200").profile, TrtllmProfile)
