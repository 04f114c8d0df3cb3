"""Five simulated 4-GPU GB300 hosts, Dynamo 1P2D: prefill0 (P4-TEP) on node 0
with the frontend, etcd and NATS; decode0 and decode1 (D8-B4), each one TP8
MPI group across two nodes (1,2 and 3,4)."""

from llmdeploy.inventory import Budget, Cluster, Model
from systems.dynamo.catalogue import IMAGE_DYNAMO, dynamo_gb300, image
from sim.paths import cluster_dir, sim_deploy, sim_nodes, sim_ssh, sim_stage_uncompressed

cluster = Cluster(
    name="sim-gb300-1p2d",
    platform="gb300",
    nic="enP6p3s0f0np0",
    ssh=sim_ssh("sim-gb300-1p2d"),
    nodes=sim_nodes("sim-gb300-1p2d-", 5, "198.19.31.10"),
    model=Model(path="/root/.cache/models/Qwen3.5-397B-A17B-NVFP4-V2"),
    image=image(IMAGE_DYNAMO),
    # host memory per node: 4 ranks x 128 GiB host KV cache (from the
    # placement), plus the ~208 GiB NVFP4 checkpoint staged while loading,
    # plus the OS margin: 784 of the node's 840 GiB
    budget=Budget(weights_host_gib=208),
    # the image with the wheels sent uncompressed: the links are veths
    stage=sim_stage_uncompressed(),
    # seconds, not the hours a real load takes
    deploy=sim_deploy(),
    # the TensorRT-LLM checkout with the base role files, on each simulated host
    # a decode worker's launch agent reaches its second node with the simulator's ssh_config
    profile=dynamo_gb300("1P2D", recipes_dir="/opt/trtllm-recipes", launch_ssh_config=str(cluster_dir("sim-gb300-1p2d") / "ssh_config")),
)
