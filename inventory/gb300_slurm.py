"""Five four-GPU GB300 nodes run by a Slurm site: Qwen3.5 agentic
disaggregated serving on Dynamo, topology 1P2D (shared/seeds/000), as the
simulated sim-gb300-1p2d-slurm, run as the site's ordinary user alice:
prefill0 (P4-TEP) on node 0 with the frontend, etcd and NATS; the TP8 decode
groups decode0 (nodes 1,2) and decode1 (nodes 3,4). The release is a job;
etcd, NATS and the frontend are steps on node 0, each worker group one
`srun --mpi=pmix` step in a pyxis + enroot container (no mpirun, no SSH
between the nodes); what the tool writes on a node is under
/var/tmp/llmdeploy-alice/ (docs/slurm.md, "What a site needs").

An operator replaces: the login host, partition, account and time limit; the
user (ssh.user, cache_dir and the model path under it); node names and IPs
(documentation addresses; nodelist if Slurm names the nodes otherwise); the
NIC; the model directory (the exact V2 checkpoint) and the TensorRT-LLM
checkout the base role files come from (mounted at /opt/trtllm-recipes).
"""

from llmdeploy.inventory import Budget, Cluster, Model, Ssh, make_nodes
from launchers.slurm.schema import Slurm
from systems.dynamo.catalogue import IMAGE_DYNAMO, dynamo_gb300, image

cluster = Cluster(
    name="gb300-slurm",
    platform="gb300",
    nic="enP6p3s0f0np0",  # REPLACE
    # REPLACE: the user the jobs, steps and containers run as (SSH logs in to the login host as them)
    ssh=Ssh(user="alice"),
    # REPLACE: the user's own cache folder (Dynamo's workers mount the model directory itself, read-only)
    cache_dir="/home/alice/.cache",
    nodes=make_nodes("gb300-node-", 5, "198.51.100.80"),  # REPLACE: node 0 first
    model=Model(path="/home/alice/.cache/models/Qwen3.5-397B-A17B-NVFP4-V2"),  # REPLACE
    image=image(IMAGE_DYNAMO),
    # host memory per node: 4 ranks x 128 GiB host KV cache (from the placement), plus
    # the ~208 GiB NVFP4 checkpoint staged while loading, plus the OS margin
    budget=Budget(weights_host_gib=208),
    slurm=Slurm(login="login01.example.org",  # REPLACE: the site's login host (an ssh_config name works)
                partition="gpu", account="llm",  # REPLACE
                time_limit="7-00:00:00",  # the release job's --time (None: the partition's default)
                # nodelist=[...],  # Slurm's names of the nodes, if not the inventory's
                # propagate_limits=False,  # where slurm.conf lacks PropagateResourceLimitsExcept=MEMLOCK
                ),
    profile=dynamo_gb300("1P2D", recipes_dir="/opt/TensorRT-LLM"),  # REPLACE recipes_dir
)
