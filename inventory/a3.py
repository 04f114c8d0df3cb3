"""4 x Atlas 800 A3 (64GB x 16), Qwen3.8-2.4T-A95B W8A8, DP4/TP16/EP64.

Values from shared/seeds/001 (vLLM-Ascend 0.23.0). An operator replaces:
the node names and IPs (documentation addresses 192.0.2.0/24 here), the
NIC that owns each IP, the model and tokenizer paths, the ports, and the SSH
settings. Every other value is the seed's.
"""

from llmdeploy.inventory import Cluster, Model, Ssh, make_nodes
from systems.vllm_ascend.catalogue import IMAGE_A3, image, vllm_a3_w8a8

cluster = Cluster(
    name="a3",
    platform="a3",
    nic="enp189s0f0",  # REPLACE: the interface that owns each node's IP
    ssh=Ssh(user="root"),
    # REPLACE: node 0 first; its IP is --data-parallel-address for everyone.
    nodes=make_nodes("a3-node-", 4, "192.0.2.10"),
    model=Model(
        path="/root/.cache/models/Qwen3.8-2.4T-A95B-w8a8",  # REPLACE
        tokenizer_path="/root/.cache/models/Qwen3.8-2.4T-A95B-w8a8",  # REPLACE
    ),
    image=image(IMAGE_A3),
    profile=vllm_a3_w8a8(port=8000, rpc_port=13389),  # REPLACE: SERVICE_PORT, DP_RPC_PORT
)
