"""sim-b200 run by Slurm: 2 simulated 8-GPU B200 hosts, trtllm-serve TP16, as a
Slurm job. `invoke sim.up --cluster sim-b200-slurm` starts munged and slurmd
on every host and slurmctld on a login host (sim-b200-slurm-login); the tool
reaches the nodes only as job steps (srun) from that login host. Units run
as pyxis + enroot steps (NVIDIA's default): the world is one `srun
--mpi=pmix` step of 16 tasks, `trtllm-llmapi-launch trtllm-serve` in each."""

from llmdeploy.inventory import Cluster, Model, VerifySettings
from launchers.slurm.schema import Slurm
from systems.trtllm.catalogue import IMAGE_TRTLLM, image, trtllm_qwen38_fp8
from sim.paths import sim_deploy, sim_nodes, sim_ssh, node_memlock_kib
from sim.users import OPERATOR

cluster = Cluster(
    name="sim-b200-slurm",
    platform="b200",
    nic="ens1f0",
    # the site's ordinary user (sim/users.py): jobs, steps and containers run as them
    ssh=sim_ssh("sim-b200-slurm", user=OPERATOR),
    cache_dir="/home/ops/.cache",
    nodes=sim_nodes("sim-b200-slurm-", 2, "198.19.25.10"),
    model=Model(path="/home/ops/.cache/huggingface/hub/Qwen3.8-2.4T-A95B-FP8"),
    image=image(IMAGE_TRTLLM),
    verify=VerifySettings(nccl_min_busbw=300),
    deploy=sim_deploy(),
    slurm=Slurm(login="sim-b200-slurm-login", partition="gpu", time_limit="1-00:00:00",
                # the memlock the simulated nodes can give (sim/paths.py node_memlock_kib; a real GPU node: unlimited)
                memlock_kib=node_memlock_kib(),
                # this site keeps PropagateResourceLimits=ALL (sim/slurm.py): without this the tasks would get the
                # login shell's 64 KiB memlock; --propagate=NONE gives them slurmd's
                propagate_limits=False),
    # one srun --mpi=pmix step forms the world: no mpirun, no SSH between the nodes
    profile=trtllm_qwen38_fp8("qwen3.8-low-latency.yaml"),
)
