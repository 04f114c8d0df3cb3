"""The simulated twin of gb200.py: 4 simulated 4-GPU GB200 hosts, trtllm-serve TP16 (one MPI world of 16 ranks, 4 per node)."""

from llmdeploy.inventory import Cluster, Model
from systems.trtllm.catalogue import IMAGE_TRTLLM, image, trtllm_qwen38_fp8
from sim.paths import cluster_dir, sim_deploy, sim_nodes, sim_ssh

cluster = Cluster(
    name="sim-gb200",
    platform="gb200",
    nic="enP6p3s0f0np0",
    ssh=sim_ssh("sim-gb200"),
    nodes=sim_nodes("sim-gb200-", 4, "198.19.21.10"),
    model=Model(path="/root/.cache/huggingface/hub/Qwen3.8-2.4T-A95B-FP8"),
    image=image(IMAGE_TRTLLM),
    # seconds, not the hours a real load takes
    deploy=sim_deploy(),
    # mpirun's launch agent on node 0 reaches the other nodes with the simulator's own ssh_config (key, known_hosts)
    profile=trtllm_qwen38_fp8("qwen3.8-low-latency.yaml", launch_ssh_config=str(cluster_dir("sim-gb200") / "ssh_config")),
)
