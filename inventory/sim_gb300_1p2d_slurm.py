"""sim-gb300-1p2d run by Slurm: five simulated 4-GPU GB300 hosts, Dynamo 1P2D,
as a Slurm job on pyxis + enroot (NVIDIA's default). `invoke sim.up --cluster
sim-gb300-1p2d-slurm` starts munged and slurmd on every host and slurmctld on
a login host (sim-gb300-1p2d-slurm-login); the tool reaches the nodes only as
job steps from that login host, and no node accepts SSH from another.

etcd, NATS and the frontend are steps of their own on node 0 (no GPU asked
for); prefill0 (P4-TEP, node 0) and the TP8 decode groups decode0 (nodes
1,2) and decode1 (nodes 3,4) are each one `srun --mpi=pmix` step, a task per
GPU, `trtllm-llmapi-launch python3 -m dynamo.trtllm` in each: no mpirun, no
launch agent, no hostfile."""

from llmdeploy.inventory import Budget, Cluster, Model
from launchers.slurm.schema import Slurm
from systems.dynamo.catalogue import IMAGE_DYNAMO, dynamo_gb300, image
from sim.paths import sim_deploy, sim_nodes, sim_ssh, node_memlock_kib
from sim.users import OPERATOR

cluster = Cluster(
    name="sim-gb300-1p2d-slurm",
    platform="gb300",
    nic="enP6p3s0f0np0",
    # the site's ordinary user (sim/users.py): jobs, steps and containers run as them
    ssh=sim_ssh("sim-gb300-1p2d-slurm", user=OPERATOR),
    cache_dir="/home/ops/.cache",
    nodes=sim_nodes("sim-gb300-1p2d-slurm-", 5, "198.19.33.10"),
    model=Model(path="/home/ops/.cache/models/Qwen3.5-397B-A17B-NVFP4-V2"),
    image=image(IMAGE_DYNAMO),
    # as sim-gb300-1p2d: 4 ranks x 128 GiB host KV cache, the ~208 GiB checkpoint staged while loading, the OS margin
    budget=Budget(weights_host_gib=208),
    # seconds, not the hours a real load takes
    deploy=sim_deploy(),
    slurm=Slurm(login="sim-gb300-1p2d-slurm-login", partition="gpu", time_limit="1-00:00:00",
                # the memlock the simulated nodes can give (sim/paths.py node_memlock_kib; a real GPU node: unlimited)
                memlock_kib=node_memlock_kib(),),
    # the TensorRT-LLM checkout with the base role files, on each simulated host
    profile=dynamo_gb300("1P2D", recipes_dir="/opt/trtllm-recipes"),
)
