"""The simulated twin of a3.py: 4 simulated Atlas 800 A3 hosts on this machine.

Same profile and image as a3 (the seed's values); the nodes are network
namespaces made by `invoke sim.up --cluster sim-a3`, the model is a small
stand-in checkpoint directory on each host.
"""

from llmdeploy.inventory import Cluster, Model
from systems.vllm_ascend.catalogue import IMAGE_A3, image, vllm_a3_w8a8
from sim.paths import sim_deploy, sim_nodes, sim_ssh

cluster = Cluster(
    name="sim-a3",
    platform="a3",
    nic="enp189s0f0",
    ssh=sim_ssh("sim-a3"),
    nodes=sim_nodes("sim-a3-", 4, "198.19.3.10"),
    model=Model(
        path="/root/.cache/models/Qwen3.8-2.4T-A95B-w8a8",
        tokenizer_path="/root/.cache/models/Qwen3.8-2.4T-A95B-w8a8",
    ),
    # seconds, not the hours a real load takes
    deploy=sim_deploy(),
    image=image(IMAGE_A3),
    profile=vllm_a3_w8a8(port=8000, rpc_port=13389),
)
