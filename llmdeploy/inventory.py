"""The inventory schema (pydantic) and its loader.

A cluster is described by one Python module in ``inventory/`` that builds
``cluster = Cluster(...)``. Everything is validated when the module loads,
before any connection is opened: a broken inventory never touches a host.
Every problem names the file, the field and, for per-node values, the node.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .errors import SECRETS, InventoryError

# --- safe patterns: every value that reaches a remote shell is either quoted
# or matches one of these ------------------------------------------------------
NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
CLUSTER_RE = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,30}[a-z0-9])?$")
# Linux interface names: at most 15 characters, no '/', no whitespace.
NIC_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")
PATH_RE = re.compile(r"^/[A-Za-z0-9._+@:/-]*$")
IMAGE_RE = re.compile(r"^[a-z0-9][a-z0-9._/:-]*(@sha256:[0-9a-f]{64})?$")
ENV_NAME_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


def _safe_path(value: str) -> str:
    if not PATH_RE.match(value):
        raise ValueError(
            f"{value!r} is not a safe absolute path (allowed: / letters digits . _ + @ : -)"
        )
    if any(part == ".." for part in value.split("/")):
        raise ValueError(f"{value!r} must not contain '..'")
    return value


SafePath = Annotated[str, Field(min_length=1)]
Port = Annotated[int, Field(ge=1, le=65535)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


# --- platforms ----------------------------------------------------------------
class Platform(Strict):
    name: str
    vendor: Literal["ascend", "nvidia"]
    devices: int
    # How an NPU's own address is read: A2 ``-ip -g``, A3 ``-vnic -g``.
    npu_ip_query: Literal["ip", "vnic", ""] = ""


PLATFORMS: dict[str, Platform] = {
    "a3": Platform(name="Atlas 800 A3", vendor="ascend", devices=16, npu_ip_query="vnic"),
    "a2": Platform(name="Atlas 800 A2", vendor="ascend", devices=8, npu_ip_query="ip"),
    "b200": Platform(name="B200", vendor="nvidia", devices=8),
    "b300": Platform(name="B300", vendor="nvidia", devices=8),
    "gb200": Platform(name="GB200", vendor="nvidia", devices=4),
    "gb300": Platform(name="GB300", vendor="nvidia", devices=4),
}
PlatformName = Literal["a3", "a2", "b200", "b300", "gb200", "gb300"]


# --- SSH ----------------------------------------------------------------------
class Ssh(Strict):
    """How to reach the nodes. Host keys are always checked."""

    # Unset user/port fall back to the ssh_config entry, then to ssh's defaults.
    user: str | None = Field(default=None, pattern=r"^[a-z_][a-z0-9_-]{0,31}$")
    port: Port | None = None
    identity_file: SafePath | None = None
    # known_hosts to check host keys against; default: the ssh_config's
    # UserKnownHostsFile for the host, else ~/.ssh/known_hosts.
    known_hosts: SafePath | None = None
    # An ssh_config file; default ~/.ssh/config. Its Host, HostName, User,
    # Port, IdentityFile and ProxyJump entries are honoured.
    config_file: SafePath | None = None
    # "[user@]host[:port]" of a bastion, like ssh -J.
    # (a host never starts with "-": ssh would take it for an option)
    jump_host: str | None = Field(default=None, pattern=r"^([a-z_][a-z0-9_-]*@)?[A-Za-z0-9][A-Za-z0-9.-]*(:\d{1,5})?$")
    connect_timeout: float = Field(default=10.0, gt=0)
    command_timeout: float = Field(default=120.0, gt=0)
    forks: int = Field(default=32, ge=1, le=512)
    # Keep the SSH connections open this many idle seconds after a command,
    # in a background process of this user, and send the next commands
    # through them (like OpenSSH's ControlPersist; llmdeploy/mux.py). 0: off,
    # every command connects on its own.
    persist_s: float = Field(default=0, ge=0, le=86400)
    # Dead-peer detection, like OpenSSH's ServerAliveInterval/ServerAliveCountMax:
    # after keepalive_s seconds in which this side sent nothing, a keepalive
    # that wants an answer goes to the host; keepalive_count of them in a row
    # with nothing heard back end the connection ("no answer to keepalives"),
    # so a network cut without FIN is noticed then, not at the command's
    # deadline. 0: off.
    keepalive_s: float = Field(default=15.0, ge=0, le=3600)
    keepalive_count: int = Field(default=3, ge=1, le=100)

    @field_validator("identity_file", "known_hosts", "config_file")
    @classmethod
    def _expand(cls, v: str | None) -> str | None:
        if v is None:
            return v
        v = os.path.expanduser(v)
        if not v.startswith("/"):
            raise ValueError(f"{v!r} must be an absolute path (or start with ~)")
        # invoke check writes it into an ssh_config: a newline there would add
        # directives (a ProxyCommand runs on this machine), a space splits it
        return _safe_path(v)


# --- nodes --------------------------------------------------------------------
class Node(Strict):
    """One serving host. Unset values are derived from the cluster."""

    name: str = Field(pattern=NAME_RE.pattern)
    # The node's serving/communication IP (HCCL_IF_IP, NCCL, DP address).
    ip: ipaddress.IPv4Address
    # The interface that owns ``ip``; default: the cluster's ``nic``.
    nic: str | None = Field(default=None, pattern=NIC_RE.pattern)
    # Where SSH connects; default: ``ip``. May be a name from ssh_config.
    ssh_host: str | None = Field(default=None, pattern=r"^[A-Za-z0-9.:][A-Za-z0-9.:-]*$")  # no leading "-" (an ssh option)
    ssh_port: Port | None = None
    devices: int | None = Field(default=None, ge=1, le=64)
    # First global DP rank on this node; default index * DP-local size.
    start_rank: int | None = Field(default=None, ge=0)

    @model_validator(mode="wrap")
    @classmethod
    def _name_the_node(cls, data, handler):
        # A node built on its own (Node(...) in an inventory module) fails
        # before the cluster knows its index: name it in every problem.
        try:
            return handler(data)
        except ValidationError as err:
            name = data.get("name") if isinstance(data, dict) else getattr(data, "name", None)
            label = f"node {name}" if name else "node"
            raise ClusterProblems(
                [(f"{label}.{f}" if f != "cluster" else label, m) for f, m in _split(problems_from_validation(err))]
            ) from None

    @property
    def address(self) -> str:
        return self.ssh_host or str(self.ip)


# --- model, image ---------------------------------------------------------------
class Model(Strict):
    path: SafePath
    tokenizer_path: SafePath | None = None
    # Files every node must have under ``path`` / ``tokenizer_path`` (relative names).
    required_files: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9._+-][A-Za-z0-9._+/-]*$")]] = Field(default_factory=lambda: ["config.json"])
    tokenizer_files: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9._+-][A-Za-z0-9._+/-]*$")]] = Field(
        default_factory=lambda: ["tokenizer_config.json"]
    )
    # Files (shell globs in the model directory) whose sha256 must agree
    # across nodes on top of names and sizes; [] compares names and sizes only.
    # (no leading "-": each name goes to sha256sum)
    checksum_files: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9._*?+][A-Za-z0-9._*?+-]*$")]] = Field(
        default_factory=lambda: ["*.index.json", "config.json"]
    )

    _check_path = field_validator("path", "tokenizer_path")(
        classmethod(lambda cls, v: v if v is None else _safe_path(v))
    )

    @model_validator(mode="after")
    def _default_tokenizer(self) -> "Model":
        if self.tokenizer_path is None:
            self.tokenizer_path = self.path
        return self


class Image(Strict):
    ref: str = Field(pattern=IMAGE_RE.pattern)
    # Load the image with ``docker load -i`` from this file on each node
    # instead of pulling it (clusters without registry access).
    tarball: SafePath | None = None

    _check_tar = field_validator("tarball")(
        classmethod(lambda cls, v: v if v is None else _safe_path(v))
    )


class Budget(Strict):
    """Host resources a node must have beyond what the profile reserves."""

    # host memory left to the OS, the container runtime and everything else
    os_margin_gib: float = Field(default=64, ge=0)
    # host memory for loading and staging weights (on top of reserved caches)
    weights_host_gib: float = Field(default=0, ge=0)
    # free space under base_dir (releases, logs) and where the model lives
    min_free_disk_gib: float = Field(default=20, ge=0)


class DeploySettings(Strict):
    """Deadlines and retry policy of the start sequence."""

    # node 0's DP RPC port must accept connections within this
    rpc_timeout_s: float = Field(default=1800, gt=0)
    # all ranks joined and /health 200 within this (the A2 seed's
    # VLLM_ENGINE_READY_TIMEOUT_S is 7200: real loads take that long)
    ready_timeout_s: float = Field(default=7200, gt=0)
    # /v1/models and the chat completion, each
    request_timeout_s: float = Field(default=300, gt=0)
    # a worker that exits is started again up to this many times
    worker_retries: int = Field(default=3, ge=0, le=20)
    backoff_s: float = Field(default=10, ge=0)
    backoff_max_s: float = Field(default=120, ge=0)
    poll_s: float = Field(default=5, gt=0)
    stop_timeout_s: int = Field(default=60, ge=0)


class VerifySettings(Strict):
    """invoke verify-comm."""

    # NPU pings: the full matrix up to this many pings, a sampled plan above
    ping_full_max: int = Field(default=2048, ge=1)
    # NVIDIA: all_reduce_perf's arguments (nccl-tests README) and the busbw
    # floor in GB/s (like NCCL_TESTS_MIN_BW); None: no floor
    all_reduce_args: str = Field(default="-b 8 -e 8G -f 2 -g 1", pattern=r"^[A-Za-z0-9 .=-]+$")
    nccl_min_busbw: float | None = Field(default=None, gt=0)
    # deploy refuses a cluster whose last verification is older (None: any age)
    max_age_s: float | None = Field(default=7 * 86400, gt=0)


# --- serving profiles -----------------------------------------------------------
def _json_value_problem(value, where: str) -> tuple[str, str] | None:
    """(dotted key, why) when ``value`` cannot be written as JSON, else None."""
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (where, f"{value!r} is not a finite number")
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            problem = _json_value_problem(item, f"{where}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(value, dict):
        for k, item in value.items():
            if not isinstance(k, str):
                return where, f"key {k!r} is not a string"
            problem = _json_value_problem(item, f"{where}.{k}" if where else k)
            if problem:
                return problem
        return None
    return where, f"a {type(value).__name__} cannot be written as JSON (use str, int, float, bool, None, lists, mappings)"


def _env_name_list(v: list[str]) -> list[str]:
    for k in v:
        if not ENV_NAME_RE.match(k):
            raise ValueError(f"environment variable name {k!r} is not valid")
    return v


def _env_values_one_line(v: dict[str, str]) -> dict[str, str]:
    """The environment file holds one NAME=value per line: a value with a line
    break would end there (and add a line), so it is refused, naming its key."""
    bad = [(k, "a value must be one line") for k, value in v.items() if any(c in value for c in "\n\r\0")]
    if bad:
        raise ClusterProblems(bad)
    return v


class VllmAscendProfile(Strict):
    """``vllm serve`` on Ascend: node 0 plus headless data-parallel workers."""

    kind: Literal["vllm-ascend"] = "vllm-ascend"
    served_model_name: str = Field(default="qwen3.8", pattern=r"^[A-Za-z0-9._/-]+$")
    dp: int = Field(ge=1)
    tp: int = Field(ge=1)
    ep: int = Field(ge=1)
    # DP ranks per node: dp_local x TP is the node's devices (at most 64), so
    # no larger value is valid (and the rank check loops over it per node)
    dp_local: int = Field(default=1, ge=1, le=64)
    host: str = "0.0.0.0"
    port: Port = 8000
    rpc_port: Port = 13389
    quantization: str | None = "ascend"
    safetensors_load_strategy: str | None = "lazy"
    trust_remote_code: bool = True
    enable_prefix_caching: bool = True
    enable_expert_parallel: bool = True
    max_model_len: int = Field(ge=1)
    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=1)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    speculative_config: dict | None = None
    compilation_config: dict | None = None
    additional_config: dict | None = None
    # Static environment of the seed. Per-node values are added per node:
    # ``ip_env`` get the node's IP, ``ifname_env`` the node's NIC.
    env: dict[str, str] = Field(default_factory=dict)
    ip_env: list[str] = Field(default_factory=lambda: ["HCCL_IF_IP"])
    ifname_env: list[str] = Field(default_factory=lambda: ["HCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"])

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not ENV_NAME_RE.match(k):
                raise ValueError(f"environment variable name {k!r} is not valid")
        return _env_values_one_line(v)

    # names of variables in the node's environment file
    _env_lists = field_validator("ip_env", "ifname_env")(classmethod(lambda cls, v: _env_name_list(v)))

    @field_validator("speculative_config", "compilation_config", "additional_config")
    @classmethod
    def _plain_json(cls, v: dict | None) -> dict | None:
        # vllm serve gets these as JSON arguments: only what JSON can say
        problem = _json_value_problem(v, "")
        if problem:
            raise ClusterProblems([problem]) if problem[0] else ValueError(problem[1])
        return v

    def ports(self) -> dict[str, int]:
        return {"port": self.port, "rpc_port": self.rpc_port}


# The curated trtllm-serve profiles of the TensorRT LLM guide (seed 000), as
# they ship in the container under <trtllm_dir>/examples/configs/curated.
QWEN38_RE = re.compile(r"qwen3[._-]?8(?![0-9])", re.IGNORECASE)
QWEN35_RE = re.compile(r"qwen3[._-]?5(?![0-9])", re.IGNORECASE)
# static EPLB maps (seed 000): 544 global slots per MoE layer, 512 routed experts
EPLB_NUM_SLOTS = 544
EPLB_NUM_EXPERTS = 512
QWEN38_MOE_LAYERS = 92


class CuratedProfile(BaseModel):
    model_config = ConfigDict(frozen=True)

    checkpoint: str  # what the file was tuned for, for messages
    family: str  # "Qwen3.8" / "Qwen3.5": served_model_name must name it
    tp: tuple[int, ...]  # tensor_parallel_size values the guide runs it at, the minimum first
    mtp: bool  # speculative_config (MTP3) is part of the profile
    high_throughput: bool  # attention DP + a static EPLB map
    # moe_expert_parallel_size as the guide runs the profile: "1" (low latency,
    # TP16/EP1), "tp" (high throughput, attention DP: TP32/EP32, EP = TP), or
    # None (the guide names no EP: the curated file's own value applies)
    ep: Literal["1", "tp"] | None = None
    eplb_layers: int | None = None  # MoE layers a static map must cover
    eplb_map_name: str | None = None  # the guide's map for this profile


TRTLLM_CURATED: dict[str, CuratedProfile] = {
    # "Low-latency profiles use TP16/EP1 on 16 GPUs"
    "qwen3.8-low-latency.yaml": CuratedProfile(
        checkpoint="Qwen3.8-2.4T-A95B FP8", family="Qwen3.8", tp=(16,), mtp=False, high_throughput=False, ep="1"
    ),
    "qwen3.8-low-latency-mtp3.yaml": CuratedProfile(
        checkpoint="Qwen3.8-2.4T-A95B FP8", family="Qwen3.8", tp=(16,), mtp=True, high_throughput=False, ep="1"
    ),
    # TP16 is the checkpoint's minimum ("tensor_parallel_size: 16 for the
    # minimum-GPU configurations"); "High-throughput profiles use attention DP
    # with TP32/EP32 on 32 GPUs and a 544-slot static EPLB map". The no-MTP map
    # covers the 92 target-model layers, the MTP3 map also the MTP layer.
    "qwen3.8-high-throughput.yaml": CuratedProfile(
        checkpoint="Qwen3.8-2.4T-A95B FP8", family="Qwen3.8", tp=(16, 32), mtp=False, high_throughput=True, ep="tp",
        eplb_layers=QWEN38_MOE_LAYERS, eplb_map_name="qwen3.8-ep32-static544.yaml",
    ),
    "qwen3.8-high-throughput-mtp3.yaml": CuratedProfile(
        checkpoint="Qwen3.8-2.4T-A95B FP8", family="Qwen3.8", tp=(16, 32), mtp=True, high_throughput=True, ep="tp",
        eplb_layers=QWEN38_MOE_LAYERS + 1, eplb_map_name="qwen3.8-ep32-static544-mtp3.yaml",
    ),
    "qwen3.5.yaml": CuratedProfile(
        checkpoint="Qwen3.5-397B-A17B NVFP4", family="Qwen3.5", tp=(4,), mtp=False, high_throughput=False
    ),
}

OVERRIDE_KEY_RE = re.compile(r"^[a-z_][a-z0-9_]*$")
# set from profile.tp / profile.pp / profile.ep, never through overrides
_PARALLEL_KEYS = {"tensor_parallel_size": "tp", "pipeline_parallel_size": "pp", "moe_expert_parallel_size": "ep"}
# the expert-parallel size a static EPLB map was generated for, in its file name as the guide names them
# (qwen3.8-ep32-static544.yaml)
EPLB_MAP_EP_RE = re.compile(r"(?:^|[^a-z0-9])ep(\d+)(?![0-9])")


def eplb_map_ep_from_name(name: str) -> int | None:
    """32 for ``qwen3.8-ep32-static544-mtp3.yaml``; None when the name says no EP."""
    m = EPLB_MAP_EP_RE.search(Path(name).name.lower())
    return int(m.group(1)) if m else None


def _override_value_problem(value, where: str) -> str | None:
    """Why ``value`` cannot go into the overrides YAML, or None (YAML holds what JSON holds)."""
    problem = _json_value_problem(value, where)
    if problem is None:
        return None
    return f"{problem[0]}: {problem[1].replace('written as JSON', 'written to YAML')}"


def flatten_overrides(overrides: dict) -> tuple[dict[str, object], list[tuple[str, str]]]:
    """``{"dotted.key": value}`` of every leaf of ``overrides`` (dotted keys and
    nested mappings both accepted), in the given order, and the problems as
    (dotted key, message)."""
    flat: dict[str, object] = {}
    problems: list[tuple[str, str]] = []

    def walk(mapping: dict, prefix: tuple[str, ...]) -> None:
        for key, value in mapping.items():
            shown = ".".join(prefix + (str(key),))
            if not isinstance(key, str):
                problems.append((shown, "a key must be a string"))
                continue
            segments = tuple(key.split("."))
            bad = [s for s in segments if not OVERRIDE_KEY_RE.match(s)]
            if bad:
                problems.append((shown, f"key segment {bad[0]!r} must match [a-z_][a-z0-9_]* (dotted keys: a.b.c)"))
                continue
            path = prefix + segments
            if isinstance(value, dict) and value:
                walk(value, path)
                continue
            dotted = ".".join(path)
            problem = _override_value_problem(value, dotted)
            if problem:
                problems.append((dotted, problem))
            elif dotted in flat:
                problems.append((dotted, "set twice (once dotted, once nested)"))
            else:
                flat[dotted] = value

    walk(overrides, ())
    keys = list(flat)
    for key in keys:
        for other in keys:
            if other.startswith(key + "."):
                problems.append((key, f"set to a value and also has {other!r} inside it"))
    return flat, problems


def nest_overrides(flat: dict[str, object]) -> dict:
    """The nested mapping of ``{"a.b": v}`` (order kept); assumes no conflicts."""
    out: dict = {}
    for dotted, value in flat.items():
        *parents, leaf = dotted.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


class TrtllmProfile(Strict):
    """``trtllm-serve`` as one MPI world across the nodes; HTTP on rank 0."""

    kind: Literal["trtllm-serve"] = "trtllm-serve"
    served_model_name: str = Field(pattern=r"^[A-Za-z0-9._/-]+$")
    tp: int = Field(ge=1)
    pp: int = Field(default=1, ge=1)
    # moe_expert_parallel_size, written into the overrides; default as the
    # guide runs the curated profile (CuratedProfile.ep): 1 for low latency,
    # TP for high throughput; for a profile the guide gives no EP, unset
    # leaves the curated file's own value
    ep: int | None = Field(default=None, ge=1)
    port: Port = 8000
    # TRTLLM_DIR of the guide: where TensorRT LLM lives inside the container
    trtllm_dir: SafePath = "/app/tensorrt_llm"
    # the curated profiles; default <trtllm_dir>/examples/configs/curated
    config_dir: SafePath | None = None
    # one of TRTLLM_CURATED
    config: str = Field(pattern=r"^[A-Za-z0-9._-]+\.yaml$")
    # LLM API options layered on the curated file: dotted keys
    # ("kv_cache_config.free_gpu_memory_fraction") or nested mappings
    overrides: dict[str, Any] = Field(default_factory=dict)
    # a static EPLB placement on this machine (absolute, or relative to the
    # inventory directory); high-throughput profiles only
    eplb_map: str | None = None
    # the expert-parallel size the map was generated for; default: read from
    # its file name (qwen3.8-ep32-static544.yaml: 32). Must equal ep.
    eplb_map_ep: int | None = Field(default=None, ge=1)
    # MPI slots (ranks) per node name; a node not named here gets its devices
    slots: dict[str, Annotated[int, Field(ge=0, le=64)]] = Field(default_factory=dict)
    # the ssh_config (a path on node 0) mpirun's launch agent uses to reach
    # the other nodes; None: ssh's default
    launch_ssh_config: SafePath | None = None
    reasoning_parser: str = "qwen3_5"
    tool_parser: str = "qwen3"
    env: dict[str, str] = Field(default_factory=dict)

    _check_paths = field_validator("trtllm_dir", "config_dir", "launch_ssh_config")(
        classmethod(lambda cls, v: v if v is None else _safe_path(v))
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        # names of variables in the node's environment file and of mpirun's -x
        _env_name_list(list(v))
        return _env_values_one_line(v)

    @field_validator("eplb_map")
    @classmethod
    def _eplb_map_text(cls, v: str | None) -> str | None:
        if v is not None and (not v.strip() or any(c in v for c in "\n\r\0")):
            raise ValueError(f"{v!r} is not a file name")
        return v

    @model_validator(mode="after")
    def _check_profile(self) -> "TrtllmProfile":
        if self.config_dir is None:
            self.config_dir = f"{self.trtllm_dir.rstrip('/')}/examples/configs/curated"
        problems: list[tuple[str, str]] = []
        curated = TRTLLM_CURATED.get(self.config)
        if curated is None:
            problems.append(
                ("config", f"{self.config!r} is not a curated profile; use one of: {', '.join(TRTLLM_CURATED)}")
            )
        else:
            family_re = QWEN38_RE if curated.family == "Qwen3.8" else QWEN35_RE
            if not family_re.search(self.served_model_name):
                problems.append(
                    ("served_model_name", f"{self.served_model_name!r} is not a {curated.family} model, "
                     f"but {self.config} is tuned for {curated.checkpoint}")
                )
            elif curated.family == "Qwen3.8" and re.search(r"27b", self.served_model_name, re.IGNORECASE):
                problems.append(
                    ("served_model_name", f"{self.served_model_name!r} is the dense Qwen3.8-27B, "
                     f"but {self.config} is tuned for {curated.checkpoint}")
                )
            if self.tp not in curated.tp:
                allowed = " or ".join(f"TP{t}" for t in curated.tp)
                problems.append(("tp", f"{self.config} runs {curated.checkpoint} at {allowed}, not TP{self.tp}"))
            if self.ep is None and curated.ep is not None:
                self.ep = self.tp if curated.ep == "tp" else 1
            if curated.ep == "tp" and self.ep != self.tp:
                problems.append(
                    ("ep", f"moe_expert_parallel_size {self.ep} (profile.ep) disagrees with tensor_parallel_size {self.tp} "
                     f"(profile.tp): {self.config} runs attention DP with EP = TP (seed 000: TP32/EP32)")
                )

        flat, bad = flatten_overrides(self.overrides)
        problems += [(f"overrides.{where}", msg) for where, msg in bad]
        for dotted, value in flat.items():
            top = dotted.split(".", 1)[0]
            if top in _PARALLEL_KEYS:
                problems.append(
                    (f"overrides.{dotted}", f"comes from profile.{_PARALLEL_KEYS[top]}; set that instead")
                )
            if dotted == "speculative_config.max_draft_len" and curated is not None:
                if not curated.mtp:
                    mtp = self.config.replace(".yaml", "-mtp3.yaml")
                    hint = f" (use {mtp})" if mtp in TRTLLM_CURATED else ""
                    problems.append(
                        (f"overrides.{dotted}", f"{self.config} has no MTP speculative decoding{hint}")
                    )
                elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    problems.append((f"overrides.{dotted}", f"the MTP draft length must be an integer >= 1, not {value!r}"))
            if self.eplb_map is not None and (dotted == "moe_config.load_balancer" or dotted.startswith("moe_config.load_balancer.")):
                problems.append((f"overrides.{dotted}", "profile.eplb_map sets moe_config.load_balancer; set one, not both"))

        if self.eplb_map_ep is not None and self.eplb_map is None:
            problems.append(("eplb_map_ep", "is the EP of profile.eplb_map, which is not set"))
        if self.eplb_map is not None and curated is not None and curated.high_throughput:
            map_ep = self.eplb_map_ep or eplb_map_ep_from_name(self.eplb_map)
            if map_ep is None:
                problems.append(
                    ("eplb_map", f"{self.eplb_map}: the expert-parallel size the placement was generated for is not known: "
                     "name it in the file name (qwen3.8-ep32-static544.yaml, as the guide does) or set profile.eplb_map_ep")
                )
            elif map_ep != self.ep:
                problems.append(
                    ("eplb_map", f"{Path(self.eplb_map).name} is a placement for EP {map_ep}, but moe_expert_parallel_size "
                     f"is {self.ep} (profile.ep, at tensor_parallel_size {self.tp}): a placement is specific to its EP "
                     f"(seed 000: generate a new one when EP changes); use a map for EP {self.ep} or run TP{map_ep}/EP{map_ep}")
                )
            if self.ep is not None and EPLB_NUM_SLOTS % self.ep:
                problems.append(("ep", f"EP {self.ep} does not divide the static map's {EPLB_NUM_SLOTS} slots"))
        if self.eplb_map is not None and curated is not None:
            if not curated.high_throughput:
                ht = [name for name, c in TRTLLM_CURATED.items() if c.high_throughput]
                problems.append(
                    ("eplb_map", f"a static EPLB map goes with the high-throughput profiles ({', '.join(ht)}), not {self.config}")
                )
            else:
                try:
                    path = self.eplb_map_file()
                    found = path.is_file()
                except (OSError, RuntimeError) as exc:  # a name too long for the OS, a ~user that does not exist
                    problems.append(("eplb_map", f"{self.eplb_map!r} is not a readable path: {exc}"))
                else:
                    if not found:
                        problems.append(("eplb_map", f"{path} is not a file (relative paths are read from {inventory_dir()})"))
        if problems:
            raise ClusterProblems(problems)
        return self

    @property
    def curated(self) -> CuratedProfile:
        return TRTLLM_CURATED[self.config]

    def eplb_map_file(self) -> Path | None:
        """The EPLB map on this machine: absolute, or under the inventory directory."""
        if self.eplb_map is None:
            return None
        path = Path(self.eplb_map).expanduser()
        return path if path.is_absolute() else inventory_dir() / path

    def flat_overrides(self) -> dict[str, object]:
        """``{"dotted.key": value}`` of the overrides, in the given order."""
        return flatten_overrides(self.overrides)[0]

    def slots_by_node(self, nodes: list["Node"]) -> dict[str, int]:
        """Ranks per node, every node of ``nodes``: ``slots`` or the node's devices."""
        return {n.name: self.slots.get(n.name, n.devices or 0) for n in nodes}

    def ranks(self, nodes: list["Node"]) -> list[tuple[str, int]]:
        """The MPI placement [(node name, ranks)] in rank order: the cluster's
        node 0 first (rank 0, the HTTP server), nodes with no slot left out."""
        return [(name, count) for name, count in self.slots_by_node(nodes).items() if count > 0]

    def ports(self) -> dict[str, int]:
        return {"port": self.port}


# --- Dynamo disaggregated serving (seed 000, "Qwen3.5 GB300 NVL72 Agentic
# Disaggregated Serving"): the role profiles and topologies as data ------------------
class _DynamoRoleRow(BaseModel):
    """A row of one of the seed's role tables: "TP=EP in every row", one GPU per rank."""

    model_config = ConfigDict(frozen=True)

    name: str
    gpus: int

    @property
    def tp(self) -> int:
        return self.gpus

    @property
    def ep(self) -> int:
        return self.gpus


class DynamoPrefillProfile(_DynamoRoleRow):
    """A row of the seed's prefill table. GPUs = TP = EP per worker."""

    enable_attention_dp: bool
    max_num_tokens: int

    @property
    def role(self) -> str:
        return "prefill"

    @property
    def capture_num_tokens(self) -> list[int]:
        """torch_compile_config.capture_num_tokens: the powers of two from 1
        through max_num_tokens, complete."""
        out, n = [], 1
        while n <= self.max_num_tokens:
            out.append(n)
            n *= 2
        return out


class DynamoDecodeProfile(_DynamoRoleRow):
    """A row of the seed's decode table. GPUs = TP = EP per worker."""

    enable_attention_dp: bool
    enable_lm_head_tp_in_adp: bool
    max_batch_size: int
    max_num_tokens: int
    cuda_graph_batch_sizes: tuple[int, ...]
    moe_backend: str

    @property
    def role(self) -> str:
        return "decode"


class DynamoTopology(BaseModel):
    """A row of the seed's topology table: replicas x profile per role and the
    physical four-GPU nodes it occupies. The colocated ones run both roles on
    one node and keep the bounce buffer and TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL=1."""

    model_config = ConfigDict(frozen=True)

    name: str
    title: str  # the seed's wording
    prefill_replicas: int
    prefill_profile: str
    decode_replicas: int
    decode_profile: str
    nodes: int
    colocated: bool


DYNAMO_PREFILL_PROFILES: dict[str, DynamoPrefillProfile] = {
    p.name: p
    for p in (
        DynamoPrefillProfile(name="P1", gpus=1, enable_attention_dp=True, max_num_tokens=8192),
        DynamoPrefillProfile(name="P4-TEP", gpus=4, enable_attention_dp=False, max_num_tokens=32768),
        DynamoPrefillProfile(name="P4-DEP", gpus=4, enable_attention_dp=True, max_num_tokens=8192),
    )
}

DYNAMO_DECODE_PROFILES: dict[str, DynamoDecodeProfile] = {
    d.name: d
    for d in (
        DynamoDecodeProfile(name="D2-B8", gpus=2, enable_attention_dp=False, enable_lm_head_tp_in_adp=False,
                            max_batch_size=8, max_num_tokens=56, cuda_graph_batch_sizes=(1, 2, 4, 8), moe_backend="TRTLLM"),
        DynamoDecodeProfile(name="D2-B4", gpus=2, enable_attention_dp=False, enable_lm_head_tp_in_adp=False,
                            max_batch_size=4, max_num_tokens=28, cuda_graph_batch_sizes=(1, 2, 4), moe_backend="TRTLLM"),
        DynamoDecodeProfile(name="D8-B4", gpus=8, enable_attention_dp=False, enable_lm_head_tp_in_adp=False,
                            max_batch_size=4, max_num_tokens=28, cuda_graph_batch_sizes=(1, 2, 4), moe_backend="CUTEDSL"),
        DynamoDecodeProfile(name="D8-B1", gpus=8, enable_attention_dp=False, enable_lm_head_tp_in_adp=False,
                            max_batch_size=1, max_num_tokens=7, cuda_graph_batch_sizes=(1, 2, 4), moe_backend="CUTEDSL"),
        DynamoDecodeProfile(name="D16-B8", gpus=16, enable_attention_dp=True, enable_lm_head_tp_in_adp=True,
                            max_batch_size=8, max_num_tokens=56, cuda_graph_batch_sizes=(1, 2, 4, 8), moe_backend="CUTEDSL"),
        DynamoDecodeProfile(name="D4-B32", gpus=4, enable_attention_dp=True, enable_lm_head_tp_in_adp=True,
                            max_batch_size=32, max_num_tokens=224, cuda_graph_batch_sizes=(1, 2, 4, 8, 16, 24, 32),
                            moe_backend="CUTEDSL"),
    )
}

DYNAMO_TOPOLOGIES: dict[str, DynamoTopology] = {
    t.name: t
    for t in (
        DynamoTopology(name="1P1D-B8", title="1P1D, decode batch 8", prefill_replicas=1, prefill_profile="P1",
                       decode_replicas=1, decode_profile="D2-B8", nodes=1, colocated=True),
        DynamoTopology(name="1P1D-B4", title="1P1D, decode batch 4", prefill_replicas=1, prefill_profile="P1",
                       decode_replicas=1, decode_profile="D2-B4", nodes=1, colocated=True),
        DynamoTopology(name="1P2D", title="1P2D", prefill_replicas=1, prefill_profile="P4-TEP",
                       decode_replicas=2, decode_profile="D8-B4", nodes=5, colocated=False),
        DynamoTopology(name="1P4D-B1", title="1P4D, decode batch 1", prefill_replicas=1, prefill_profile="P4-TEP",
                       decode_replicas=4, decode_profile="D8-B1", nodes=9, colocated=False),
        DynamoTopology(name="1P4D-B4", title="1P4D, decode batch 4", prefill_replicas=1, prefill_profile="P4-TEP",
                       decode_replicas=4, decode_profile="D8-B4", nodes=9, colocated=False),
        DynamoTopology(name="2P3D", title="2P3D", prefill_replicas=2, prefill_profile="P4-TEP",
                       decode_replicas=3, decode_profile="D8-B4", nodes=8, colocated=False),
        DynamoTopology(name="3P1D", title="3P1D", prefill_replicas=3, prefill_profile="P4-DEP",
                       decode_replicas=1, decode_profile="D16-B8", nodes=7, colocated=False),
        DynamoTopology(name="3P2D", title="3P2D", prefill_replicas=3, prefill_profile="P4-DEP",
                       decode_replicas=2, decode_profile="D4-B32", nodes=5, colocated=False),
    )
}

# the platforms seed 000 gives the Dynamo profile for: "Use a GB300 NVL72 system"
DYNAMO_PLATFORMS = ("gb300",)
# never set in production or accuracy runs (seed 000); the workers unset it
DYNAMO_FORBIDDEN_ENV = "TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS"
# set from the topology and the placement, never through an env dict
DYNAMO_PLACEMENT_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "DYN_SYSTEM_PORT",
    "CUDA_SCALE_LAUNCH_QUEUES",
    "TRTLLM_SKIP_KV_CACHE_ESTIMATION",
    "TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL",
)
# the seed's per-shell setup block: from the profile's fields (roles.dynamo.common_env)
DYNAMO_COMMON_ENV = (
    "MODEL_PATH",
    "CONFIG_DIR",
    "ETCD_ENDPOINTS",
    "NATS_SERVER",
    "DYN_NAMESPACE",
    "DYN_DISCOVERY_BACKEND",
    "DYN_REQUEST_PLANE",
)

_ETCD_URL_RE = r"https?://[A-Za-z0-9.-]+:\d{1,5}"
_NATS_URL_RE = r"nats://[A-Za-z0-9.-]+:\d{1,5}"


class DynamoWorker(Strict):
    """Optional settings of one worker of the topology, in its order (the
    prefill replicas, then the decode replicas). Every field is optional."""

    # node name -> GPU ids on it, in rank order (the nodes in the given order);
    # None: derived from the topology. Set it on every worker or on none.
    gpus: dict[Annotated[str, Field(pattern=NAME_RE.pattern)], list[Annotated[int, Field(ge=0, le=63)]]] | None = None
    # DYN_SYSTEM_PORT; None: profile.system_port_base + the worker's index
    system_port: Port | None = None
    # variables for this worker only (after profile.worker_env)
    env: dict[str, str] = Field(default_factory=dict)


@dataclass(frozen=True)
class DynamoPlacedWorker:
    """One worker (one MPI group) of a Dynamo release, placed on the nodes.
    ``env`` is the worker's own environment in the seed's order, without
    CUDA_VISIBLE_DEVICES, which is per node: ``cuda_visible_devices(node)``."""

    name: str  # prefill0, prefill1, ..., decode0, ...
    role: str  # prefill / decode
    profile: str  # P1, P4-TEP, D8-B4, ...
    index: int  # position in the topology's order (0 = first prefill replica)
    replica: int  # position among the workers of its role
    tp: int
    ep: int
    pp: int
    ranks: int  # = tp * pp, one per GPU
    nodes: list  # [(node name, [GPU ids])] in rank order; rank 0 on the first
    system_port: int
    env: dict

    @property
    def node_names(self) -> list[str]:
        return [name for name, _ in self.nodes]

    @property
    def rank0_node(self) -> str:
        """The node of rank 0: where dynamo.trtllm and its system port run."""
        return self.nodes[0][0]

    def gpus_on(self, node: str) -> list[int]:
        for name, gpus in self.nodes:
            if name == node:
                return list(gpus)
        return []

    def ranks_on(self, node: str) -> int:
        return len(self.gpus_on(node))

    def cuda_visible_devices(self, node: str) -> str:
        """CUDA_VISIBLE_DEVICES on ``node``, e.g. "1,2"; KeyError if the worker has no rank there."""
        gpus = self.gpus_on(node)
        if not gpus:
            raise KeyError(f"{self.name} has no rank on {node}")
        return ",".join(str(g) for g in gpus)

    def as_dict(self) -> dict:
        return {
            "name": self.name, "role": self.role, "profile": self.profile, "index": self.index,
            "replica": self.replica, "tp": self.tp, "ep": self.ep, "pp": self.pp, "ranks": self.ranks,
            "nodes": [[n, list(g)] for n, g in self.nodes], "system_port": self.system_port, "env": dict(self.env),
        }


class DynamoProfile(Strict):
    """Dynamo disaggregated prefill/decode (frontend, etcd and NATS on node 0)
    in one of the seed's topologies; the workers are placed from it."""

    kind: Literal["dynamo"] = "dynamo"
    served_model_name: str = Field(pattern=r"^[A-Za-z0-9._/-]+$")
    namespace: str = Field(pattern=r"^[A-Za-z0-9_-]+$")
    # one of DYNAMO_TOPOLOGIES: 1P1D-B8, 1P1D-B4, 1P2D, 1P4D-B1, 1P4D-B4, 2P3D, 3P1D, 3P2D
    topology: str
    # the base role files the rendered role settings layer on, in config_dir
    base_prefill_yaml: str = Field(default="qwen3.5-gb300-agentic-prefill.yaml", pattern=r"^[A-Za-z0-9._-]+\.yaml$")
    base_decode_yaml: str = Field(default="qwen3.5-gb300-agentic-decode.yaml", pattern=r"^[A-Za-z0-9._-]+\.yaml$")
    # the TensorRT-LLM checkout on every node (host path), mounted read-only
    # at recipes_mount; the base files come from it, not from the image
    recipes_dir: SafePath
    recipes_mount: SafePath = "/opt/trtllm-recipes"
    # CONFIG_DIR inside the container: under recipes_mount
    config_dir: SafePath = "/opt/trtllm-recipes/examples/configs/curated"
    # the model directory (cluster.model.path) inside the container: MODEL_PATH
    model_mount: SafePath = "/models/qwen35"
    frontend_port: Port = 8000
    etcd_port: Port = 2379
    etcd_peer_port: Port = 2380
    nats_port: Port = 4222
    nats_monitor_port: Port = 8222
    # DYN_SYSTEM_PORT of the workers in order: 8081, 8082, ... (the seed's)
    system_port_base: Port = 8081
    # An external control plane: when set, the tool checks its health and
    # does not start it on node 0. "http://host:2379[,http://host2:2379]".
    etcd_endpoints: str | None = Field(default=None, pattern=rf"^{_ETCD_URL_RE}(,{_ETCD_URL_RE})*$")
    # "nats://host:4222"
    nats_server: str | None = Field(default=None, pattern=rf"^{_NATS_URL_RE}$")
    # the control plane the tool starts on node 0 (unless the endpoints above
    # are given): one container each, pulled by prepare like Kamal's accessories
    etcd_image: str = Field(default="quay.io/coreos/etcd:v3.5.17", pattern=IMAGE_RE.pattern)
    nats_image: str = Field(default="nats:2.10.24-alpine", pattern=IMAGE_RE.pattern)
    # the ssh_config mpirun's launch agent uses to reach the other nodes of a
    # worker that spans several (None: ssh's default for root)
    launch_ssh_config: SafePath | None = None
    # kv_cache_config.host_cache_size of every rank (128 GiB, the seed's)
    host_cache_bytes_per_rank: int = Field(default=137438953472, ge=1)
    # Pinned wheels installed into the image (name==version), from the seed's
    # indexes or, on clusters without PyPI access, from ``wheel_dir`` on each node.
    wheels: list[Annotated[str, Field(pattern=r"^[A-Za-z0-9._-]+==[A-Za-z0-9._+!-]+$")]] = Field(default_factory=list)
    wheel_index_url: str = Field(default="https://pypi.org/simple", pattern=r"^https?://[A-Za-z0-9._:/@%-]+$")
    wheel_extra_index_urls: list[Annotated[str, Field(pattern=r"^https?://[A-Za-z0-9._:/@%-]+$")]] = Field(
        default_factory=lambda: ["https://pypi.nvidia.com"]
    )
    wheel_dir: SafePath | None = None
    # Bind worker host memory with ``numactl -m``: "auto" applies the seed's
    # "0,1" only where the node has that Grace-Blackwell layout (CPU NUMA
    # nodes 0 and 1, GPU memory as CPU-less nodes); "off" never; a list such
    # as "0,1" demands it (prepare refuses a node that cannot give it).
    numa_membind: str = Field(default="auto", pattern=r"^(auto|off|\d+(,\d+)*)$")
    frontend_env: dict[str, str] = Field(default_factory=dict)
    # every worker, after the topology's own variables
    worker_env: dict[str, str] = Field(default_factory=dict)
    # optional per-worker settings, one per worker of the topology
    workers: list[DynamoWorker] | None = None

    _check_paths = field_validator("recipes_dir", "recipes_mount", "config_dir", "model_mount", "wheel_dir", "launch_ssh_config")(
        classmethod(lambda cls, v: v if v is None else _safe_path(v))
    )

    @field_validator("topology")
    @classmethod
    def _known_topology(cls, v: str) -> str:
        if v not in DYNAMO_TOPOLOGIES:
            raise ValueError(f"{v!r} is not a topology; use one of: {', '.join(DYNAMO_TOPOLOGIES)}")
        return v

    @model_validator(mode="after")
    def _check_profile(self) -> "DynamoProfile":
        problems: list[tuple[str, str]] = []
        mount = self.recipes_mount.rstrip("/")
        if not (self.config_dir == mount or self.config_dir.startswith(mount + "/")):
            problems.append(
                ("config_dir", f"{self.config_dir} is not under recipes_mount {self.recipes_mount}: "
                 "the base files come from the recipes checkout, not from the image")
            )
        envs = [("frontend_env", self.frontend_env), ("worker_env", self.worker_env)]
        envs += [(f"workers[{i}].env", w.env) for i, w in enumerate(self.workers or [])]
        for field, env in envs:
            for key, value in env.items():
                where = f"{field}.{key}"
                if not ENV_NAME_RE.match(key):
                    problems.append((where, f"environment variable name {key!r} is not valid"))
                elif key == DYNAMO_FORBIDDEN_ENV:
                    problems.append((where, "must never be set in production or accuracy runs (seed 000); the workers unset it"))
                elif key in DYNAMO_COMMON_ENV:
                    problems.append((where, "comes from the profile's fields (the seed's setup block); set those instead"))
                elif key in DYNAMO_PLACEMENT_ENV and field != "frontend_env":
                    problems.append((where, "comes from the topology and the placement, not from an env dict"))
                elif "\n" in value or "\r" in value or "\0" in value:
                    problems.append((where, "a value must be one line"))
        if problems:
            raise ClusterProblems(problems)
        return self

    @property
    def topology_info(self) -> DynamoTopology:
        return DYNAMO_TOPOLOGIES[self.topology]

    def worker_specs(self) -> list[tuple[str, DynamoPrefillProfile | DynamoDecodeProfile, int]]:
        """(name, role profile, replica) of every worker in the topology's
        order: the prefill replicas, then the decode replicas."""
        t = self.topology_info
        out: list = []
        for r in range(t.prefill_replicas):
            out.append((f"prefill{r}", DYNAMO_PREFILL_PROFILES[t.prefill_profile], r))
        for r in range(t.decode_replicas):
            out.append((f"decode{r}", DYNAMO_DECODE_PROFILES[t.decode_profile], r))
        return out

    def accessory_images(self) -> list[str]:
        """Images node 0 needs besides the serving image: the control plane the tool starts."""
        return ([] if self.etcd_endpoints else [self.etcd_image]) + ([] if self.nats_server else [self.nats_image])

    def ports(self) -> dict[str, int]:
        """The ports node 0 binds: the frontend, and etcd and NATS unless external."""
        out = {"frontend_port": self.frontend_port}
        if self.etcd_endpoints is None:
            out["etcd_port"] = self.etcd_port
            out["etcd_peer_port"] = self.etcd_peer_port
        if self.nats_server is None:
            out["nats_port"] = self.nats_port
            out["nats_monitor_port"] = self.nats_monitor_port
        return out

    def placement(self, nodes: list[Node]) -> list[DynamoPlacedWorker]:
        """The workers on ``nodes`` (see dynamo_placement); ClusterProblems if they do not fit."""
        workers, problems = dynamo_placement(self, nodes)
        if problems:
            raise ClusterProblems(problems)
        return workers


def _derive_gpus(sizes: list[int], nodes: list[Node], spare_devices: int) -> list[list[tuple[str, list[int]]]]:
    """GPUs per worker, in order: a worker that fits in what is left of the
    current node goes there (the colocated 1P1D: P1 on GPU 0, D2 on 1,2),
    any other starts on a fresh node and takes whole nodes in order (TP8: two
    four-GPU nodes, TP16: four). Past the inventory's nodes it continues on
    virtual nodes named "+1", "+2", ... of ``spare_devices`` GPUs."""
    out: list[list[tuple[str, list[int]]]] = []
    cur, used = 0, 0

    def node_at(i: int) -> tuple[str, int]:
        if i < len(nodes):
            return nodes[i].name, nodes[i].devices or spare_devices
        return f"+{i - len(nodes) + 1}", spare_devices

    for size in sizes:
        name, devices = node_at(cur)
        if used and size <= devices - used:
            out.append([(name, list(range(used, used + size)))])
            used += size
            continue
        if used:
            cur, used = cur + 1, 0
        parts, left = [], size
        while left > 0:
            name, devices = node_at(cur)
            take = min(left, devices)
            parts.append((name, list(range(take))))
            left -= take
            if take == devices:
                cur, used = cur + 1, 0
            else:
                used = take
        out.append(parts)
    return out


def dynamo_placement(profile: DynamoProfile, nodes: list[Node]) -> tuple[list[DynamoPlacedWorker], list[tuple[str, str]]]:
    """(workers, problems): the topology's workers placed on ``nodes`` (node 0
    first; it also runs the frontend, etcd and NATS), each its own MPI group of
    TP x PP ranks, one per GPU; DYN_SYSTEM_PORT 8081, 8082, ... in order.
    Pure; the problems name the field or node."""
    problems: list[tuple[str, str]] = []
    topo = profile.topology_info
    specs = profile.worker_specs()
    explicit = profile.workers
    if explicit is not None and len(explicit) != len(specs):
        names = ", ".join(name for name, _, _ in specs)
        problems.append(("profile.workers", f"{len(explicit)} entries but topology {topo.name} has {len(specs)} workers ({names})"))
        return [], problems
    per = [explicit[i] if explicit else DynamoWorker() for i in range(len(specs))]
    given = [w.gpus is not None for w in per]
    spare = (nodes[0].devices if nodes else None) or PLATFORMS["gb300"].devices
    if any(given) and not all(given):
        i = given.index(False)
        problems.append((f"profile.workers[{i}].gpus", "set gpus on every worker or on none (derived from the topology)"))
        return [], problems

    if all(given) and per:
        layout = [list((n, list(g)) for n, g in w.gpus.items()) for w in per]
    else:
        layout = _derive_gpus([p.gpus for _, p, _ in specs], nodes, spare)
        virtual = sorted({n for parts in layout for n, _ in parts if n.startswith("+")})
        if virtual:
            need_nodes = len(nodes) + len(virtual)
            need_gpus = sum(p.gpus for _, p, _ in specs)
            have_gpus = sum(n.devices or 0 for n in nodes)
            desc = f"{topo.prefill_replicas} x {topo.prefill_profile} + {topo.decode_replicas} x {topo.decode_profile}"
            problems.append(
                ("profile.topology",
                 f"{topo.name} ({desc}) needs {need_nodes} nodes of {spare} GPUs ({need_gpus} GPUs in use) "
                 f"but the inventory has {len(nodes)} node{'s' if len(nodes) != 1 else ''} ({have_gpus} GPUs)")
            )
            return [], problems

    by_name = {n.name: (i, n) for i, n in enumerate(nodes)}
    owner: dict[tuple[str, int], str] = {}
    workers: list[DynamoPlacedWorker] = []
    for i, ((name, prof, replica), w, parts) in enumerate(zip(specs, per, layout)):
        field = f"profile.workers[{i}].gpus" if w.gpus is not None else "profile.topology"
        ok = True
        for node_name, gpus in parts:
            if node_name not in by_name:
                problems.append((f"{field}.{node_name}", f"no node named {node_name!r} (nodes: {', '.join(by_name)})"))
                ok = False
                continue
            j, node = by_name[node_name]
            if not gpus:
                problems.append((f"{field}.{node_name}", f"{name} has no GPU on nodes[{j}] ({node_name})"))
                ok = False
            for g in gpus:
                if g >= (node.devices or 0):
                    problems.append((f"{field}.{node_name}", f"GPU {g} does not exist on nodes[{j}] ({node_name}), which has {node.devices} GPUs"))
                    ok = False
                elif owner.get((node_name, g)) == name:
                    problems.append((f"{field}.{node_name}", f"GPU {g} is listed twice for {name}"))
                    ok = False
                elif (node_name, g) in owner:
                    problems.append((f"{field}.{node_name}", f"{name}'s GPU mask overlaps {owner[(node_name, g)]}: GPU {g} on nodes[{j}] ({node_name})"))
                    ok = False
                else:
                    owner[(node_name, g)] = name
        ranks = sum(len(g) for _, g in parts)
        pp = 1
        if ranks != prof.tp * pp:
            problems.append((field, f"{name} ({prof.name}) has {ranks} ranks (GPUs) but runs TP {prof.tp} x PP {pp} = {prof.tp * pp}"))
            ok = False
        port = w.system_port if w.system_port is not None else profile.system_port_base + i
        env: dict[str, str] = {"DYN_SYSTEM_PORT": str(port)}
        if prof.role == "prefill":
            env["CUDA_SCALE_LAUNCH_QUEUES"] = "4x"
            env["TRTLLM_SKIP_KV_CACHE_ESTIMATION"] = "1"
        if topo.colocated:
            env["TRT_LLM_DISABLE_LOAD_WEIGHTS_IN_PARALLEL"] = "1"
        env.update(profile.worker_env)
        env.update(w.env)
        if ok:
            workers.append(
                DynamoPlacedWorker(
                    name=name, role=prof.role, profile=prof.name, index=i, replica=replica, tp=prof.tp, ep=prof.ep,
                    pp=pp, ranks=ranks, nodes=[(n, list(g)) for n, g in parts], system_port=port, env=env,
                )
            )
    if problems:
        return [], problems

    # ports: node 0's services, then each worker's system port on its rank-0 node
    used_ports: dict[tuple[str, int], str] = {}
    if nodes:
        for key, port in profile.ports().items():
            used_ports.setdefault((nodes[0].name, port), f"profile.{key}")
    seen_ports: dict[int, str] = {}
    for w, spec in zip(workers, per):
        field = (f"profile.workers[{w.index}].system_port" if spec.system_port is not None
                 else f"profile.system_port_base (+{w.index})")
        what = f"{w.name}'s DYN_SYSTEM_PORT {w.system_port}"
        key = (w.rank0_node, w.system_port)
        if w.system_port > 65535:
            problems.append((field, f"{what} is above 65535"))
        elif w.system_port in seen_ports:
            problems.append((field, f"{what} is also {seen_ports[w.system_port]}'s: every worker needs its own DYN_SYSTEM_PORT"))
        elif key in used_ports:
            j = by_name[w.rank0_node][0]
            problems.append((field, f"{what} on nodes[{j}] ({w.rank0_node}) is also {used_ports[key]}"))
        else:
            used_ports[key] = field
        seen_ports.setdefault(w.system_port, w.name)

    # every node runs something
    busy = {n for w in workers for n in w.node_names}
    for j, n in enumerate(nodes):
        if n.name not in busy and j != 0:
            problems.append(
                (f"nodes[{j}] ({n.name})",
                 f"topology {topo.name} places no worker on this node (it uses {len(busy | {nodes[0].name})} of "
                 f"{len(nodes)} nodes): remove it or choose a larger topology")
            )
    return (workers if not problems else []), problems


Profile = Annotated[
    Union[VllmAscendProfile, TrtllmProfile, DynamoProfile], Field(discriminator="kind")
]


# --- the cluster ------------------------------------------------------------------
class ClusterProblems(ValueError):
    """Cross-field problems, each a (field path, message) pair."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{f}: {m}" for f, m in problems))


class Cluster(Strict):
    name: str = Field(pattern=CLUSTER_RE.pattern)
    platform: PlatformName
    # Default serving NIC for nodes that do not name their own.
    nic: str | None = Field(default=None, pattern=NIC_RE.pattern)
    ssh: Ssh = Field(default_factory=Ssh)
    nodes: list[Node] = Field(min_length=1)
    model: Model
    image: Image
    profile: Profile
    # Where the tool keeps releases, the ledger and the lock on every node.
    budget: Budget = Field(default_factory=Budget)
    deploy: DeploySettings = Field(default_factory=DeploySettings)
    verify: VerifySettings = Field(default_factory=VerifySettings)
    # NVIDIA: the ibstat Rate every port must show (Gb/s; 400 = NDR); None
    # skips the InfiniBand check (clusters on RoCE/Ethernet only).
    ib_rate: int | None = Field(default=400, ge=1)
    # Secrets by reference: {VARIABLE: name of the operator's environment
    # variable that holds it}. Read at run time, written only into the 0600
    # environment file, masked everywhere else.
    secret_env: dict[str, str] = Field(default_factory=dict)
    base_dir: SafePath = "/var/lib/llmdeploy"
    # Where rendered environment files go on every node.
    etc_dir: SafePath = "/etc/llmdeploy"
    log_dir: SafePath = "/var/log/llmdeploy"

    _check_dirs = field_validator("base_dir", "etc_dir", "log_dir")(
        classmethod(lambda cls, v: _safe_path(v))
    )

    @field_validator("secret_env")
    @classmethod
    def _secret_names(cls, v: dict[str, str]) -> dict[str, str]:
        for k, src in v.items():
            if not ENV_NAME_RE.match(k) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", src):
                raise ValueError(f"{k!r}: {src!r} must map a variable name to an environment variable name")
        return v

    def secret_values(self) -> dict[str, str]:
        """The secrets' values from the operator's environment (never logged)."""
        out, missing = {}, []
        for key, src in self.secret_env.items():
            value = os.environ.get(src)
            if value is None:
                missing.append(f"secret_env.{key}: ${src} is not set in your environment")
            elif "\n" in value:
                missing.append(f"secret_env.{key}: ${src} must be one line")
            else:
                out[key] = value
                SECRETS.add(value)
        if missing:
            raise InventoryError(f"cluster {self.name}", missing)
        return out

    @property
    def platform_info(self) -> Platform:
        return PLATFORMS[self.platform]

    @property
    def node0(self) -> Node:
        return self.nodes[0]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def role_of(self, node: Node) -> str:
        return "node0" if node is self.nodes[0] else "worker"

    @model_validator(mode="after")
    def _derive_and_check(self) -> "Cluster":
        problems: list[tuple[str, str]] = []
        plat = PLATFORMS[self.platform]

        def where(i: int, field: str) -> str:
            return f"nodes[{i}] ({self.nodes[i].name}).{field}"

        dp_local = getattr(self.profile, "dp_local", 1)
        for i, n in enumerate(self.nodes):
            if n.nic is None:
                n.nic = self.nic
            if n.nic is None:
                problems.append((where(i, "nic"), "no NIC: set it on the node or the cluster's 'nic'"))
            if n.devices is None:
                n.devices = plat.devices
            if n.start_rank is None:
                n.start_rank = i * dp_local

        seen: dict[str, dict[str, int]] = {"name": {}, "ip": {}, "ssh": {}}
        for i, n in enumerate(self.nodes):
            for key, value, field in (
                ("name", n.name, "name"),
                ("ip", str(n.ip), "ip"),
                ("ssh", f"{n.address}:{n.ssh_port or self.ssh.port or 22}", "ssh_host"),
            ):
                if value in seen[key]:
                    j = seen[key][value]
                    problems.append(
                        (where(i, field), f"{value} is already used by nodes[{j}] ({self.nodes[j].name})")
                    )
                else:
                    seen[key][value] = i

        prof = self.profile
        total_devices = sum(n.devices or 0 for n in self.nodes)
        if isinstance(prof, VllmAscendProfile):
            if plat.vendor != "ascend":
                problems.append(("profile.kind", f"vllm-ascend needs an Ascend platform, not {self.platform}"))
            if prof.dp != len(self.nodes) * prof.dp_local:
                problems.append(
                    ("profile.dp", f"DP {prof.dp} != {len(self.nodes)} nodes x dp_local {prof.dp_local}")
                )
            if prof.dp * prof.tp != total_devices:
                problems.append(
                    ("profile.tp", f"DP {prof.dp} x TP {prof.tp} = {prof.dp * prof.tp} but the nodes have {total_devices} devices")
                )
            for i, n in enumerate(self.nodes):
                if prof.dp_local * prof.tp != n.devices:
                    problems.append(
                        (where(i, "devices"), f"dp_local {prof.dp_local} x TP {prof.tp} != {n.devices} devices on this node")
                    )
            if prof.enable_expert_parallel and prof.ep != prof.dp * prof.tp:
                problems.append(("profile.ep", f"EP {prof.ep} != DP {prof.dp} x TP {prof.tp} (vLLM's expert-parallel size)"))
            if not prof.enable_expert_parallel and prof.ep != 1:
                problems.append(("profile.ep", "EP must be 1 when enable_expert_parallel is off"))
            ranks: dict[int, int] = {}
            for i, n in enumerate(self.nodes):
                for r in range(n.start_rank, n.start_rank + prof.dp_local):
                    if r in ranks:
                        j = ranks[r]
                        problems.append(
                            (where(i, "start_rank"), f"DP rank {r} is also owned by nodes[{j}] ({self.nodes[j].name})")
                        )
                    elif r >= prof.dp:
                        problems.append((where(i, "start_rank"), f"DP rank {r} is outside 0..{prof.dp - 1}"))
                    else:
                        ranks[r] = i
            if self.nodes[0].start_rank != 0:
                problems.append((where(0, "start_rank"), "node 0 must own DP rank 0"))
        elif isinstance(prof, TrtllmProfile):
            if plat.vendor != "nvidia":
                problems.append(("profile.kind", f"trtllm-serve needs an NVIDIA platform, not {self.platform}"))
            world = prof.tp * prof.pp
            if not prof.slots:
                # one rank per GPU of every node
                if world != total_devices:
                    problems.append(
                        ("profile.tp", f"TP {prof.tp} x PP {prof.pp} = {world} but the nodes have {total_devices} GPUs")
                    )
            else:
                by_name = {n.name: i for i, n in enumerate(self.nodes)}
                for name in prof.slots:
                    if name not in by_name:
                        problems.append(
                            (f"profile.slots.{name}", f"no node named {name!r} (nodes: {', '.join(by_name)})")
                        )
                slots = prof.slots_by_node(self.nodes)
                for i, n in enumerate(self.nodes):
                    if slots[n.name] > (n.devices or 0):
                        problems.append(
                            (f"profile.slots.{n.name}",
                             f"{slots[n.name]} slots but nodes[{i}] ({n.name}) has {n.devices} GPUs (devices)")
                        )
                ranks = sum(slots.values())
                if ranks > total_devices:
                    problems.append(("profile.slots", f"{ranks} ranks but the nodes have {total_devices} GPUs"))
                if ranks != world:
                    problems.append(
                        ("profile.slots", f"{ranks} ranks (the sum of the slots) ≠ TP {prof.tp} × PP {prof.pp} = {world}")
                    )
                node0 = self.nodes[0]
                if slots[node0.name] < 1:
                    problems.append(
                        (f"profile.slots.{node0.name}",
                         f"node 0 ({node0.name}) needs at least one slot: rank 0 and the HTTP server run there")
                    )
            if prof.ep is not None and prof.tp % prof.ep:
                problems.append(("profile.ep", f"EP {prof.ep} must divide TP {prof.tp}"))
        elif isinstance(prof, DynamoProfile):
            if self.platform not in DYNAMO_PLATFORMS:
                # seed 000 gives Dynamo's profile, topologies and placement for
                # four-GPU GB300 NVL72 nodes only ("Use a GB300 NVL72 system")
                problems.append(
                    ("platform", f"{self.platform} ({plat.name}): the dynamo profile (profile.kind) is the seed's "
                     f"Qwen3.5 GB300 NVL72 agentic profile, for {', '.join(DYNAMO_PLATFORMS)} only; its topologies, "
                     "GPU placement and host-memory budget are not given for other platforms")
                )
            else:
                # GPU masks, ranks = TP x PP, nodes and GPUs the topology needs,
                # ports per node (node 0's services and every DYN_SYSTEM_PORT)
                problems += dynamo_placement(prof, self.nodes)[1]
            for key in self.secret_env:
                if key == DYNAMO_FORBIDDEN_ENV:
                    problems.append(
                        (f"secret_env.{key}", "must never be set in production or accuracy runs (seed 000); the workers unset it")
                    )

        ports = getattr(prof, "ports")()
        by_port: dict[int, str] = {}
        for key, port in ports.items():
            if port in by_port:
                problems.append((f"profile.{key}", f"port {port} is also profile.{by_port[port]}"))
            by_port[port] = key

        if problems:
            raise ClusterProblems(problems)
        return self


def make_nodes(prefix: str, count: int, first_ip: str, **common) -> list[Node]:
    """``count`` nodes named ``<prefix>0..`` with consecutive IPs from ``first_ip``."""
    base = ipaddress.IPv4Address(first_ip)
    return [Node(name=f"{prefix}{i}", ip=base + i, **common) for i in range(count)]


# --- loading ------------------------------------------------------------------------
def inventory_dir() -> Path:
    """``$LLMDEPLOY_INVENTORY`` or the repository's ``inventory/``."""
    env = os.environ.get("LLMDEPLOY_INVENTORY")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "inventory"


def cluster_module_path(name: str, directory: Path | None = None) -> Path:
    if not CLUSTER_RE.match(name):
        raise InventoryError("--cluster", [f"{name!r} is not a valid cluster name"])
    directory = directory or inventory_dir()
    return directory / f"{name.replace('-', '_')}.py"


def list_clusters(directory: Path | None = None) -> list[str]:
    directory = directory or inventory_dir()
    return sorted(
        p.stem.replace("_", "-") for p in directory.glob("*.py") if not p.name.startswith("_")
    )


# a key shown as it is in a field path; any other (empty, spaces, ': ', unicode) is quoted
_PLAIN_KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")


def _describe_loc(loc: tuple, raw_nodes: list | None) -> str:
    parts: list[str] = []
    i = 0
    while i < len(loc):
        item = loc[i]
        if isinstance(item, int):
            label = f"[{item}]"
            if parts and parts[-1] == "nodes" and raw_nodes is not None and item < len(raw_nodes):
                name = getattr(raw_nodes[item], "name", None)
                if name is None and isinstance(raw_nodes[item], dict):
                    name = raw_nodes[item].get("name")
                if name:
                    label += f" ({name})"
            parts[-1] = parts[-1] + label if parts else label
        elif item in ("vllm-ascend", "trtllm-serve", "dynamo") and parts and parts[-1].startswith("profile"):
            pass  # discriminator tag: not a field
        else:
            parts.append(str(item) if item == "[key]" or _PLAIN_KEY_RE.match(str(item)) else repr(item))
        i += 1
    return ".".join(parts) or "cluster"


# Models built on their own in an inventory module report fields relative to
# themselves; this names the cluster field they stand for.
_TITLE_FIELD = {
    "Budget": "budget",
    "DeploySettings": "deploy",
    "VerifySettings": "verify",
    "Model": "model",
    "Image": "image",
    "Ssh": "ssh",
    "VllmAscendProfile": "profile",
    "TrtllmProfile": "profile",
    "DynamoProfile": "profile",
    "DynamoWorker": "profile.workers[]",
}


def _split(problems: list[str]) -> list[tuple[str, str]]:
    return [tuple(p.split(": ", 1)) if ": " in p else ("cluster", p) for p in problems]


def problems_from_validation(err: ValidationError, raw_nodes: list | None = None) -> list[str]:
    out: list[str] = []
    prefix = _TITLE_FIELD.get(err.title, "")
    for e in err.errors():
        loc = tuple(e["loc"])
        where = _describe_loc(loc, raw_nodes) if loc else ""
        if prefix:
            where = f"{prefix}.{where}" if where else prefix
        ctx_err = (e.get("ctx") or {}).get("error")
        if isinstance(ctx_err, ClusterProblems):
            for f, m in ctx_err.problems:
                out.append(f"{where + '.' if where else ''}{f}: {m}")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field"
        elif e["type"] == "missing":
            msg = "required field is missing"
        elif "input" in e and not isinstance(e["input"], (dict, list, BaseModel)) and repr(e["input"]) not in msg:
            msg = f"{msg} (got {e['input']!r})"
        out.append(f"{where or 'cluster'}: {msg}")
    return out


def load_cluster(name: str, directory: Path | None = None) -> Cluster:
    """Load and validate ``inventory/<name>.py``; raise InventoryError on any problem."""
    path = cluster_module_path(name, directory)
    return load_cluster_file(path)


def load_cluster_file(path: Path) -> Cluster:
    shown = _shown(path)
    if not path.is_file():
        known = ", ".join(list_clusters(path.parent)) or "none"
        raise InventoryError(shown, [f"no such inventory file (known clusters: {known})"])
    mod_name = f"_llmdeploy_inventory_{path.stem}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    inv_parent = str(path.parent.parent)
    added = inv_parent not in sys.path
    if added:
        sys.path.insert(0, inv_parent)
    try:
        spec.loader.exec_module(module)
    except ValidationError as err:
        raise InventoryError(shown, problems_from_validation(err, _raw_nodes(err))) from None
    except InventoryError:
        raise
    except Exception as err:  # a syntax or name error in the module itself
        raise InventoryError(shown, [f"{type(err).__name__}: {err}"]) from None
    finally:
        if added:
            sys.path.remove(inv_parent)
    cluster = getattr(module, "cluster", None)
    if not isinstance(cluster, Cluster):
        raise InventoryError(shown, ["cluster: the module must define cluster = Cluster(...)"])
    expected = path.stem.replace("_", "-")
    if cluster.name != expected:
        raise InventoryError(shown, [f"name: {cluster.name!r} must match the file name ({expected!r})"])
    return cluster


def _raw_nodes(err: ValidationError) -> list | None:
    # pydantic keeps no reference to the input of a nested list; the error's
    # input for a node-level loc is the node itself, so collect those.
    nodes: dict[int, object] = {}
    for e in err.errors():
        loc = tuple(e["loc"])
        if len(loc) >= 2 and loc[0] == "nodes" and isinstance(loc[1], int):
            inp = e.get("input")
            if len(loc) == 2:
                nodes[loc[1]] = inp
    if not nodes:
        return None
    size = max(nodes) + 1
    return [nodes.get(i) for i in range(size)]


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)
