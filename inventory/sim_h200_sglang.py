"""The simulated twin of h200_sglang.py: 2 simulated 8-GPU H200 hosts, SGLang TP16."""

from llmdeploy.inventory import Cluster, Model, VerifySettings
from sim.paths import cluster_dir, sim_deploy, sim_nodes, sim_ssh
from systems.sglang.catalogue import IMAGE_SGLANG, image, sglang_qwen38_fp8

cluster = Cluster(
    name="sim-h200-sglang",
    platform="h200",
    nic="ens1f0",
    ssh=sim_ssh("sim-h200-sglang"),
    nodes=sim_nodes("sim-h200-sglang-", 2, "198.19.40.10"),
    model=Model(path="/root/.cache/huggingface/hub/Qwen3.8-2.4T-A95B-FP8"),
    image=image(IMAGE_SGLANG),
    verify=VerifySettings(nccl_min_busbw=300),
    # seconds, not the minutes a real load takes
    deploy=sim_deploy(),
    # --dist-timeout short enough that a world that cannot form fails inside ready_timeout_s;
    # verify-comm's all_reduce_perf reaches the other node with the simulator's own ssh_config
    profile=sglang_qwen38_fp8(dist_timeout_s=30, launch_ssh_config=str(cluster_dir("sim-h200-sglang") / "ssh_config")),
)
