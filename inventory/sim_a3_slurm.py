"""sim-a3 run by Slurm: 4 simulated Atlas 800 A3 hosts, vLLM-Ascend DP4/TP16,
as a Slurm job. `invoke sim.up --cluster sim-a3-slurm` starts munged and
slurmd on every host and slurmctld on a login host (sim-a3-slurm-login); the
tool reaches the nodes only as job steps (srun) from that login host."""

from llmdeploy.inventory import Cluster, Model
from launchers.slurm.schema import Slurm
from systems.vllm_ascend.catalogue import IMAGE_A3, image, vllm_a3_w8a8
from sim.paths import sim_deploy, sim_nodes, sim_ssh
from sim.users import OPERATOR

cluster = Cluster(
    name="sim-a3-slurm",
    platform="a3",
    nic="enp189s0f0",
    # the site's ordinary user (sim/users.py): jobs, steps and containers run as them
    ssh=sim_ssh("sim-a3-slurm", user=OPERATOR),
    nodes=sim_nodes("sim-a3-slurm-", 4, "198.19.5.10"),
    # on each node's data disk: the user stages it there (invoke stage), Docker's root mounts it
    model=Model(
        path="/data/models/Qwen3.8-2.4T-A95B-w8a8",
        tokenizer_path="/data/models/Qwen3.8-2.4T-A95B-w8a8",
    ),
    deploy=sim_deploy(),
    image=image(IMAGE_A3),
    slurm=Slurm(login="sim-a3-slurm-login", partition="npu"),
    profile=vllm_a3_w8a8(port=8000, rpc_port=13389),
)
