"""Five simulated 4-GPU GB300 hosts, Dynamo 3P2D (seed 000's last topology):
prefill0..2 (P4-DEP, TP4 with attention DP) on nodes 0, 1 and 2, node 0 also
running the frontend, etcd and NATS; decode0 and decode1 (D4-B32) on nodes 3
and 4. Five replicas behind one KV-aware router: the cluster on which
readiness must not depend on which worker the router picks."""

from llmdeploy.inventory import Budget, Cluster, Model
from systems.dynamo.catalogue import IMAGE_DYNAMO, dynamo_gb300, image
from sim.paths import sim_deploy, sim_nodes, sim_ssh, sim_stage_uncompressed

cluster = Cluster(
    name="sim-gb300-3p2d",
    platform="gb300",
    nic="enP6p3s0f0np0",
    ssh=sim_ssh("sim-gb300-3p2d"),
    nodes=sim_nodes("sim-gb300-3p2d-", 5, "198.19.32.10"),
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
    # the TensorRT-LLM checkout with the base role files, on each simulated host;
    # every worker fits on one node, so no launch agent needs SSH between them
    profile=dynamo_gb300("3P2D", recipes_dir="/opt/trtllm-recipes"),
)
