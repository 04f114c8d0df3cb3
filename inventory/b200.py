"""2 x 8 B200: Qwen3.8-2.4T-A95B FP8 with trtllm-serve at TP16 (shared/seeds/000).

An operator replaces: node names and IPs (documentation addresses), the NIC
used for NCCL/GLOO/UCX, the model path, the curated profile if not low latency.
"""

from llmdeploy.inventory import Cluster, Model, make_nodes
from systems.trtllm.catalogue import IMAGE_TRTLLM, image, trtllm_qwen38_fp8

cluster = Cluster(
    name="b200",
    platform="b200",
    nic="ens1f0",  # REPLACE
    nodes=make_nodes("b200-node-", 2, "192.0.2.40"),  # REPLACE
    model=Model(path="/root/.cache/huggingface/hub/Qwen3.8-2.4T-A95B-FP8"),  # REPLACE
    image=image(IMAGE_TRTLLM),
    # one of the curated profiles (qwen3.8-low-latency[-mtp3].yaml,
    # qwen3.8-high-throughput[-mtp3].yaml); overrides are layered on it, e.g.
    #   trtllm_qwen38_fp8("qwen3.8-high-throughput-mtp3.yaml",
    #                     overrides={"speculative_config.max_draft_len": 2, "kv_cache_config.free_gpu_memory_fraction": 0.8})
    # (attention DP at EP = TP = 16 here); the guide's static EPLB maps are for EP32, i.e. tp=32 on four nodes:
    #   trtllm_qwen38_fp8("qwen3.8-high-throughput-mtp3.yaml", tp=32,
    #                     eplb_map="maps/qwen3.8-ep32-static544-mtp3.yaml")   # a local file, checked before anything starts
    # mpirun's launch agent on node 0 reaches node 1 with root's ssh config there;
    # launch_ssh_config="/root/.ssh/cluster_config" names another.
    profile=trtllm_qwen38_fp8("qwen3.8-low-latency.yaml"),
)
