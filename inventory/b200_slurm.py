"""2 x 8 B200 run by a Slurm site: Qwen3.8-2.4T-A95B FP8 with trtllm-serve at
TP16 (shared/seeds/000), as inventory/b200.py, but reached through the site's
login host and run as its ordinary user alice: the release is a job, the
world one `srun --mpi=pmix` step of 16 tasks in a pyxis + enroot container,
and what the tool writes on a node is under /var/tmp/llmdeploy-alice/
(docs/slurm.md, "What a site needs").

An operator replaces: the login host, partition, account and time limit; the
user (ssh.user, cache_dir and the model path under it); node names and IPs
(documentation addresses; nodelist if Slurm names the nodes otherwise); the
NIC used for NCCL/GLOO/UCX; the curated profile if not low latency.
"""

from llmdeploy.inventory import Cluster, Model, Ssh, make_nodes
from launchers.slurm.schema import Slurm
from systems.trtllm.catalogue import IMAGE_TRTLLM, image, trtllm_qwen38_fp8

cluster = Cluster(
    name="b200-slurm",
    platform="b200",
    nic="ens1f0",  # REPLACE
    # REPLACE: the user the jobs, steps and containers run as (SSH logs in to the login host as them)
    ssh=Ssh(user="alice"),
    # REPLACE: the user's own cache folder, mounted into the container at the same path (where the seed mounts /root/.cache)
    cache_dir="/home/alice/.cache",
    nodes=make_nodes("b200-node-", 2, "192.0.2.80"),  # REPLACE: node 0 first
    model=Model(path="/home/alice/.cache/huggingface/hub/Qwen3.8-2.4T-A95B-FP8"),  # REPLACE
    image=image(IMAGE_TRTLLM),
    slurm=Slurm(login="login01.example.org",  # REPLACE: the site's login host (an ssh_config name works)
                partition="gpu", account="llm",  # REPLACE
                time_limit="7-00:00:00",  # the release job's --time (None: the partition's default)
                # nodelist=["gpu-017", "gpu-018"],  # Slurm's names of the nodes, if not the inventory's
                # propagate_limits=False,  # where slurm.conf lacks PropagateResourceLimitsExcept=MEMLOCK
                ),
    # as b200.py: one of the curated profiles, overrides layered on it
    profile=trtllm_qwen38_fp8("qwen3.8-low-latency.yaml"),
)
