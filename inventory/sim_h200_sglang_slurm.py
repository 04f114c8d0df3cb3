"""sim-h200-sglang run by Slurm: two simulated 8-GPU H200 hosts, SGLang TP16,
as a Slurm job on pyxis + enroot (NVIDIA's default). `invoke sim.up --cluster
sim-h200-sglang-slurm` starts munged and slurmd on every host and slurmctld on
a login host (sim-h200-sglang-slurm-login); the tool reaches the nodes only
as job steps from that login host, and no node accepts SSH from another.

The world is one step with a task per node and `--mpi=none`: SGLang's nodes
meet at node rank 0's torch.distributed store (--dist-init-addr), not through
MPI; each node's task runs its own line, with its own --node-rank."""

from llmdeploy.inventory import Cluster, Model, VerifySettings
from launchers.slurm.schema import Slurm
from sim.paths import sim_deploy, sim_nodes, sim_ssh, node_memlock_kib
from sim.users import OPERATOR
from systems.sglang.catalogue import IMAGE_SGLANG, image, sglang_qwen38_fp8

cluster = Cluster(
    name="sim-h200-sglang-slurm",
    platform="h200",
    nic="ens1f0",
    # the site's ordinary user (sim/users.py): jobs, steps and containers run as them
    ssh=sim_ssh("sim-h200-sglang-slurm", user=OPERATOR),
    cache_dir="/home/ops/.cache",
    nodes=sim_nodes("sim-h200-sglang-slurm-", 2, "198.19.41.10"),
    model=Model(path="/home/ops/.cache/huggingface/hub/Qwen3.8-2.4T-A95B-FP8"),
    image=image(IMAGE_SGLANG),
    verify=VerifySettings(nccl_min_busbw=300),
    # seconds, not the minutes a real load takes
    deploy=sim_deploy(),
    slurm=Slurm(login="sim-h200-sglang-slurm-login", partition="gpu", time_limit="1-00:00:00",
                # the memlock the simulated nodes can give (sim/paths.py node_memlock_kib; a real GPU node: unlimited)
                memlock_kib=node_memlock_kib(),),
    # --dist-timeout short enough that a world that cannot form fails inside ready_timeout_s
    profile=sglang_qwen38_fp8(dist_timeout_s=30),
)
