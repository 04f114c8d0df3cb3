"""4 x 4 GB200: Qwen3.8-2.4T-A95B FP8 with trtllm-serve at TP16 (shared/seeds/000).

An operator replaces: node names and IPs (documentation addresses), the NIC,
the model path and the curated profile.
"""

from llmdeploy.inventory import Cluster, Model, make_nodes
from systems.trtllm.catalogue import IMAGE_TRTLLM, image, trtllm_qwen38_fp8

cluster = Cluster(
    name="gb200",
    platform="gb200",
    nic="enP6p3s0f0np0",  # REPLACE
    nodes=make_nodes("gb200-node-", 4, "198.51.100.40"),  # REPLACE
    model=Model(path="/root/.cache/huggingface/hub/Qwen3.8-2.4T-A95B-FP8"),  # REPLACE
    image=image(IMAGE_TRTLLM),
    profile=trtllm_qwen38_fp8("qwen3.8-low-latency.yaml"),
)
