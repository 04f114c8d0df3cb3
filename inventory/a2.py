"""8 x Atlas 800 A2 (64GB x 8), Qwen3.8-2.4T-A95B W4A8, DP8/TP8/EP64, 262144 context.

Values from shared/seeds/001 (vLLM-Ascend 0.23.0, A2 tab). An operator
replaces: node names and IPs (documentation addresses 198.51.100.0/24 here),
the NIC, the model and tokenizer paths, the ports and the SSH settings.
"""

from llmdeploy.inventory import Cluster, Model, Ssh, make_nodes
from systems.vllm_ascend.catalogue import IMAGE_A2, image, vllm_a2_w4a8

cluster = Cluster(
    name="a2",
    platform="a2",
    nic="enp189s0f0",  # REPLACE
    ssh=Ssh(user="root"),
    nodes=make_nodes("a2-node-", 8, "198.51.100.10"),  # REPLACE
    model=Model(
        path="/root/.cache/models/Qwen3.8-2.4T-A95B-w4a8",  # REPLACE
        tokenizer_path="/root/.cache/models/Qwen3.8-2.4T-A95B-w4a8",  # REPLACE
    ),
    image=image(IMAGE_A2),
    profile=vllm_a2_w4a8(port=8000, rpc_port=13389),  # REPLACE: SERVICE_PORT, DP_RPC_PORT
)
