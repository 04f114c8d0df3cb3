"""The simulated twin of a2.py: 8 simulated Atlas 800 A2 hosts on this machine.
Node 5's serving NIC has another name, as on clusters with mixed NIC models."""

from llmdeploy.inventory import Cluster, Model
from systems.vllm_ascend.catalogue import IMAGE_A2, image, vllm_a2_w4a8
from sim.paths import sim_deploy, sim_nodes, sim_ssh

cluster = Cluster(
    name="sim-a2",
    platform="a2",
    nic="enp189s0f0",
    ssh=sim_ssh("sim-a2"),
    nodes=sim_nodes("sim-a2-", 8, "198.19.2.10", **{"5": {"nic": "enp61s0f1"}}),
    model=Model(
        path="/root/.cache/models/Qwen3.8-2.4T-A95B-w4a8",
        tokenizer_path="/root/.cache/models/Qwen3.8-2.4T-A95B-w4a8",
    ),
    # seconds, not the hours a real load takes
    deploy=sim_deploy(),
    image=image(IMAGE_A2),
    profile=vllm_a2_w4a8(port=8000, rpc_port=13389),
)
