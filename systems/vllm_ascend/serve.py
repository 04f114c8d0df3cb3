"""What serving runs on each node, as pure builders: the ``vllm serve``
command of seed 001 (node 0, and headless workers with their start rank and
node 0's address) and the container start command (the seed's ``docker run``
devices and mounts), detached and named for the cluster and release.
Values come from the inventory; nothing here opens a connection."""

from __future__ import annotations

import json
import shlex

from llmdeploy.container import ContainerSpec, Mount
from llmdeploy.inventory import Cluster, Node
from roles import containers
from .profile import VllmAscendProfile

# seed 001, "Docker Image Installation": every node gets these (its devices: platforms/ascend)
ASCEND_MOUNTS = tuple(Mount(p, p) for p in (
    "/usr/local/dcmi",
    "/usr/local/Ascend/driver/tools/hccn_tool",
    "/usr/local/bin/npu-smi",
    "/usr/local/Ascend/driver/lib64/",
    "/usr/local/Ascend/driver/version.info",
    "/etc/ascend_install.info",
))
# the seed's docker run options, in its order and spelling
SEED_FLAGS = ("--net=", "--shm-size=", "--device")


def _json_arg(value: dict) -> str:
    # the seed's spelling: compact JSON, true/false
    return json.dumps(value, separators=(",", ":"))


def vllm_args(cluster: Cluster, prof: VllmAscendProfile, node: Node) -> list[str]:
    """``vllm serve`` and its flags, in the seed's order (``prof``: the
    cluster's profile, as the hook that builds the plan received it)."""
    worker = node.name != cluster.node0.name
    args = ["vllm", "serve", cluster.model.path]
    if worker:
        args.append("--headless")
    args += ["--host", prof.host, "--port", str(prof.port), "--served-model-name", prof.served_model_name]
    assert cluster.model.tokenizer_path is not None  # Model._default_tokenizer: path unless set
    args += ["--tokenizer", cluster.model.tokenizer_path]
    if prof.trust_remote_code:
        args.append("--trust-remote-code")
    if prof.quantization:
        args += ["--quantization", prof.quantization]
    if prof.safetensors_load_strategy:
        args += ["--safetensors-load-strategy", prof.safetensors_load_strategy]
    args += [
        "--tensor-parallel-size", str(prof.tp),
        "--data-parallel-size", str(prof.dp),
        "--data-parallel-size-local", str(prof.dp_local),
    ]
    if worker:
        args += ["--data-parallel-start-rank", str(node.start_rank)]
    # node 0's own IP on node 0, node 0's IP on the workers: always node 0
    args += ["--data-parallel-address", str(cluster.node0.ip), "--data-parallel-rpc-port", str(prof.rpc_port)]
    if prof.enable_prefix_caching:
        args.append("--enable-prefix-caching")
    if prof.enable_expert_parallel:
        args.append("--enable-expert-parallel")
    args += [
        "--max-model-len", str(prof.max_model_len),
        "--max-num-seqs", str(prof.max_num_seqs),
        "--max-num-batched-tokens", str(prof.max_num_batched_tokens),
        "--gpu-memory-utilization", f"{prof.gpu_memory_utilization:g}",
    ]
    for flag, value in (
        ("--speculative-config", prof.speculative_config),
        ("--compilation-config", prof.compilation_config),
        ("--additional-config", prof.additional_config),
    ):
        if value is not None:
            args += [flag, _json_arg(value)]
    return args


def serve_command(cluster: Cluster, prof: VllmAscendProfile, node: Node) -> str:
    return shlex.join(vllm_args(cluster, prof, node))


def container_name(cluster: Cluster, release: str) -> str:
    return f"{cluster.name}-{release}"


def cache_mount(cluster: Cluster) -> Mount:
    """The seed mounts /root/.cache (the inventory's ``cache_dir``); a model elsewhere gets its own directory mounted too."""
    return Mount(cluster.cache_dir, cluster.cache_dir)


def container_spec(cluster: Cluster, prof: VllmAscendProfile, node: Node, release: str, env_file: str, image: str,
                   devices: list[str], service: str = "serve", stop_phase: int = 0) -> ContainerSpec:
    """The seed's container: named for the cluster and release, with the
    release's environment file, every NPU and control device of the node
    (``devices``: what its platform gives a container, ``Vendor.container_devices``)
    and the seed's mounts; its command ``vllm serve`` (``vllm_args``)."""
    mounts = [*ASCEND_MOUNTS, cache_mount(cluster)]
    assert cluster.model.tokenizer_path is not None  # Model._default_tokenizer: path unless set
    assert node.start_rank is not None  # Cluster._derive_nodes gives every node one
    for path in sorted({cluster.model.path, cluster.model.tokenizer_path}):
        if not path.startswith(cluster.cache_dir + "/"):
            mounts.append(Mount(path, path, readonly=True))
    return ContainerSpec(
        name=container_name(cluster, release), image=image, command=tuple(vllm_args(cluster, prof, node)),
        labels=containers.label_values(cluster.name, release, service, cluster.role_of(node), stop_phase, start_rank=node.start_rank),
        network="host", shm_size="1g",
        # every NPU of the node and the control devices (seed 001): what the platform gives a container
        devices=tuple(devices),
        mounts=tuple(mounts), env_files=(env_file,), docker_flags=SEED_FLAGS)
