"""One B200 node, Qwen3.5-397B-A17B NVFP4 at TP4 with trtllm-serve (shared/seeds/000).

Uses 4 of the node's 8 GPUs. An operator replaces: the node name and IP
(documentation address), the NIC and the model path.
"""

from llmdeploy.inventory import Cluster, Model, Node
from systems.trtllm.catalogue import IMAGE_TRTLLM, image, trtllm_qwen35_nvfp4

cluster = Cluster(
    name="qwen35-b200",
    platform="b200",
    nic="ens1f0",  # REPLACE
    nodes=[Node(name="b200-node-0", ip="192.0.2.60", devices=4)],  # REPLACE
    model=Model(path="/root/.cache/huggingface/hub/Qwen3.5-397B-A17B-NVFP4"),  # REPLACE
    image=image(IMAGE_TRTLLM),
    profile=trtllm_qwen35_nvfp4(),
)
