"""Qwen3.5 GB300 NVL72 agentic disaggregated serving on Dynamo, topology
1P1D-B8 (1P1D, decode batch 8) on one four-GPU GB300 node (shared/seeds/000):
prefill P1 on GPU 0 (DYN_SYSTEM_PORT 8081), decode D2-B8 on GPUs 1,2 (8082),
the frontend, etcd and NATS on the same node.

Another topology of the seed is one argument: dynamo_gb300("1P2D", ...) with
five nodes, "3P1D" with seven, ... (llmdeploy.inventory.DYNAMO_TOPOLOGIES).

An operator replaces: the node name and IP (documentation address), the NIC,
the model directory (the exact V2 checkpoint) and the TensorRT-LLM checkout
the base role files come from (mounted at /opt/trtllm-recipes).
"""

from llmdeploy.inventory import Budget, Cluster, Model, Node
from systems.dynamo.catalogue import IMAGE_DYNAMO, dynamo_gb300, image

cluster = Cluster(
    name="gb300-agentic",
    platform="gb300",
    nic="enP6p3s0f0np0",  # REPLACE
    nodes=[Node(name="gb300-node-0", ip="198.51.100.70")],  # REPLACE
    model=Model(path="/models/Qwen3.5-397B-A17B-NVFP4-V2"),  # REPLACE
    image=image(IMAGE_DYNAMO),
    # host memory: 3 ranks x 128 GiB host KV cache (from the placement), plus
    # the ~208 GiB NVFP4 checkpoint staged while loading, plus the OS margin
    budget=Budget(weights_host_gib=208),
    profile=dynamo_gb300("1P1D-B8", recipes_dir="/opt/TensorRT-LLM"),  # REPLACE recipes_dir
)
