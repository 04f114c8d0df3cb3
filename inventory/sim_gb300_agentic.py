"""The simulated twin of gb300_agentic.py: one 4-GPU GB300 host, Dynamo 1P1D-B8."""

from llmdeploy.inventory import Budget, Cluster, Model
from systems.dynamo.catalogue import IMAGE_DYNAMO, dynamo_gb300, image
from sim.paths import sim_deploy, sim_nodes, sim_ssh

cluster = Cluster(
    name="sim-gb300-agentic",
    platform="gb300",
    nic="enP6p3s0f0np0",
    ssh=sim_ssh("sim-gb300-agentic"),
    nodes=sim_nodes("sim-gb300-", 1, "198.19.30.10"),
    model=Model(path="/root/.cache/models/Qwen3.5-397B-A17B-NVFP4-V2"),
    image=image(IMAGE_DYNAMO),
    # host memory: 3 ranks x 128 GiB host KV cache (from the placement), plus
    # the ~208 GiB NVFP4 checkpoint staged while loading, plus the OS margin
    budget=Budget(weights_host_gib=208),
    # seconds, not the hours a real load takes
    deploy=sim_deploy(),
    # the TensorRT-LLM checkout with the base role files, on each simulated host
    profile=dynamo_gb300("1P1D-B8", recipes_dir="/opt/trtllm-recipes"),
)
