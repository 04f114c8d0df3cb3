"""Qwen3.5 GB300 NVL72 agentic disaggregated serving on Dynamo, 1P1D on one
four-GPU GB300 node (shared/seeds/000): prefill P1 on GPU 0, decode D2-B8 on
GPUs 1,2, etcd and NATS on the same node.

An operator replaces: the node name and IP (documentation address), the NIC
and the model directory (the exact V2 checkpoint).
"""

from llmdeploy.inventory import Budget, Cluster, Model, Node
from llmdeploy.profiles import IMAGE_DYNAMO, dynamo_gb300_1p1d, image

cluster = Cluster(
    name="gb300-agentic",
    platform="gb300",
    nic="enP6p3s0f0np0",  # REPLACE
    nodes=[Node(name="gb300-node-0", ip="198.51.100.70")],  # REPLACE
    model=Model(path="/models/Qwen3.5-397B-A17B-NVFP4-V2"),  # REPLACE
    image=image(IMAGE_DYNAMO),
    # host memory: 3 ranks x 128 GiB host KV cache (from the profile), plus the
    # ~208 GiB NVFP4 checkpoint staged while loading, plus the OS margin
    budget=Budget(weights_host_gib=208),
    profile=dynamo_gb300_1p1d(node="gb300-node-0"),
)
