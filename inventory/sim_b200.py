"""The simulated twin of b200.py: 2 simulated 8-GPU B200 hosts, trtllm-serve TP16."""

from llmdeploy.inventory import Cluster, Model, VerifySettings
from systems.trtllm.catalogue import IMAGE_TRTLLM, image, trtllm_qwen38_fp8
from sim.paths import cluster_dir, sim_deploy, sim_nodes, sim_ssh

cluster = Cluster(
    name="sim-b200",
    platform="b200",
    nic="ens1f0",
    ssh=sim_ssh("sim-b200"),
    nodes=sim_nodes("sim-b200-", 2, "198.19.20.10"),
    model=Model(path="/root/.cache/huggingface/hub/Qwen3.8-2.4T-A95B-FP8"),
    image=image(IMAGE_TRTLLM),
    # all_reduce_perf busbw floor (GB/s) for the simulated pair
    verify=VerifySettings(nccl_min_busbw=300),
    # seconds, not the hours a real load takes
    deploy=sim_deploy(),
    # mpirun's launch agent on node 0 reaches the other node with the simulator's own ssh_config (key, known_hosts)
    profile=trtllm_qwen38_fp8("qwen3.8-low-latency.yaml", launch_ssh_config=str(cluster_dir("sim-b200") / "ssh_config")),
)
