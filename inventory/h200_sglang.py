"""2 x 8 H200 (Hopper), Qwen3.8-2.4T-A95B FP8 on SGLang: one world of TP16
(EP16) across both nodes, HTTP on node 0 (node rank 0).

Values from SGLang's multi-node docs (launch_server with --dist-init-addr,
--nnodes, --node-rank; the docker run of two H200 x 8 nodes) and the TensorRT
LLM guide's 16-GPU minimum for the checkpoint (seed 000). An operator replaces:
the node names and IPs (documentation addresses 192.0.2.0/24 here), the NIC
that owns each IP, the model path, the ports, and the SSH settings.
"""

from llmdeploy.inventory import Cluster, Model, Ssh, make_nodes
from systems.sglang.catalogue import IMAGE_SGLANG, image, sglang_qwen38_fp8

cluster = Cluster(
    name="h200-sglang",
    platform="h200",
    nic="ens1f0",  # REPLACE: the interface that owns each node's IP (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)
    ssh=Ssh(user="root"),
    # REPLACE: node 0 first; its IP is --dist-init-addr for every node
    nodes=make_nodes("h200-node-", 2, "192.0.2.40"),
    model=Model(path="/root/.cache/huggingface/hub/Qwen3.8-2.4T-A95B-FP8"),  # REPLACE
    image=image(IMAGE_SGLANG),
    ib_rate=400,
    # REPLACE: --port (the API) and the port of --dist-init-addr
    profile=sglang_qwen38_fp8(port=30000, dist_port=20000),
)
