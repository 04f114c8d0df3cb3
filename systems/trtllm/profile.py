"""The trtllm-serve profile: one MPI world across the nodes, HTTP on rank 0,
with the curated profiles of the TensorRT LLM guide (seed 000), and the checks
of a cluster it runs on."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from llmdeploy.inventory import Cluster, Node, inventory_dir
from llmdeploy.schema import ClusterProblems, Port, SafePath, env_name_list, env_values_one_line, json_value_problem, safe_path
from llmdeploy.serving import ServingProfile
from systems.common import NcclEnvironment

KIND = "trtllm-serve"


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
    problem = json_value_problem(value, where)
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


class TrtllmProfile(NcclEnvironment, ServingProfile):
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
        classmethod(lambda cls, v: v if v is None else safe_path(v))
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: dict[str, str]) -> dict[str, str]:
        # names of variables in the node's environment file and of mpirun's -x
        env_name_list(list(v))
        return env_values_one_line(v)

    @field_validator("eplb_map")
    @classmethod
    def _eplb_map_text(cls, v: str | None) -> str | None:
        """A file name: not blank, one line."""
        if v is not None and (not v.strip() or any(c in v for c in "\n\r\0")):
            raise ValueError(f"{v!r} is not a file name")
        return v

    @model_validator(mode="after")
    def _check_profile(self) -> "TrtllmProfile":
        """Fill in the defaults that follow from the curated profile
        (config_dir, ep), then refuse the profile with every problem at once."""
        if self.config_dir is None:
            self.config_dir = f"{self.trtllm_dir.rstrip('/')}/examples/configs/curated"
        curated = TRTLLM_CURATED.get(self.config)
        if curated is not None and self.ep is None and curated.ep is not None:
            self.ep = self.tp if curated.ep == "tp" else 1
        problems = [
            *_curated_problems(self, curated),
            *_override_problems(self, curated),
            *_eplb_map_problems(self, curated),
        ]
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

    def launched_worlds(self, cluster: Cluster) -> str | None:
        """The world is one launch over its nodes: the same number of ranks on each."""
        placed = self.ranks(cluster.nodes)
        if len({count for _, count in placed}) > 1:
            return (f"the world has unequal ranks per node ({', '.join(f'{count} on {name}' for name, count in placed)}): "
                    "one srun step starts the same number of tasks on each of its nodes")
        return None

    def launch_ssh(self) -> str | None:
        return self.launch_ssh_config

    def ports(self) -> dict[str, int]:
        # the HTTP server runs on rank 0's host only
        return {"port": self.port}

    def problems(self, cluster: Cluster) -> list[tuple[str, str]]:
        return cluster_problems(self, cluster)





def _curated_problems(prof: TrtllmProfile, curated: CuratedProfile | None) -> list[tuple[str, str]]:
    """A config that is no curated profile, or a model, TP or EP it is not tuned for."""
    if curated is None:
        return [("config", f"{prof.config!r} is not a curated profile; use one of: {', '.join(TRTLLM_CURATED)}")]
    problems: list[tuple[str, str]] = []
    family_re = QWEN38_RE if curated.family == "Qwen3.8" else QWEN35_RE
    if not family_re.search(prof.served_model_name):
        problems.append(
            ("served_model_name", f"{prof.served_model_name!r} is not a {curated.family} model, "
             f"but {prof.config} is tuned for {curated.checkpoint}")
        )
    elif curated.family == "Qwen3.8" and re.search(r"27b", prof.served_model_name, re.IGNORECASE):
        problems.append(
            ("served_model_name", f"{prof.served_model_name!r} is the dense Qwen3.8-27B, "
             f"but {prof.config} is tuned for {curated.checkpoint}")
        )
    if prof.tp not in curated.tp:
        allowed = " or ".join(f"TP{t}" for t in curated.tp)
        problems.append(("tp", f"{prof.config} runs {curated.checkpoint} at {allowed}, not TP{prof.tp}"))
    if curated.ep == "tp" and prof.ep != prof.tp:
        problems.append(
            ("ep", f"moe_expert_parallel_size {prof.ep} (profile.ep) disagrees with tensor_parallel_size {prof.tp} "
             f"(profile.tp): {prof.config} runs attention DP with EP = TP (seed 000: TP32/EP32)")
        )
    return problems


def _override_problems(prof: TrtllmProfile, curated: CuratedProfile | None) -> list[tuple[str, str]]:
    """Overrides that do not flatten, that set what the profile's own fields
    set (parallel sizes, the EPLB map), or an MTP draft length the profile
    cannot take."""
    flat, bad = flatten_overrides(prof.overrides)
    problems = [(f"overrides.{where}", msg) for where, msg in bad]
    for dotted, value in flat.items():
        top = dotted.split(".", 1)[0]
        if top in _PARALLEL_KEYS:
            problems.append(
                (f"overrides.{dotted}", f"comes from profile.{_PARALLEL_KEYS[top]}; set that instead")
            )
        if dotted == "speculative_config.max_draft_len" and curated is not None:
            if not curated.mtp:
                mtp = prof.config.replace(".yaml", "-mtp3.yaml")
                hint = f" (use {mtp})" if mtp in TRTLLM_CURATED else ""
                problems.append(
                    (f"overrides.{dotted}", f"{prof.config} has no MTP speculative decoding{hint}")
                )
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                problems.append((f"overrides.{dotted}", f"the MTP draft length must be an integer >= 1, not {value!r}"))
        if prof.eplb_map is not None and (dotted == "moe_config.load_balancer" or dotted.startswith("moe_config.load_balancer.")):
            problems.append((f"overrides.{dotted}", "profile.eplb_map sets moe_config.load_balancer; set one, not both"))
    return problems


def _eplb_map_problems(prof: TrtllmProfile, curated: CuratedProfile | None) -> list[tuple[str, str]]:
    """profile.eplb_map and eplb_map_ep: set together, on a high-throughput
    profile, for this EP, and naming a file on this machine."""
    problems: list[tuple[str, str]] = []
    if prof.eplb_map_ep is not None and prof.eplb_map is None:
        problems.append(("eplb_map_ep", "is the EP of profile.eplb_map, which is not set"))
    if prof.eplb_map is None or curated is None:
        return problems
    if curated.high_throughput:
        problems += _eplb_ep_problems(prof)
        problems += _eplb_file_problems(prof)
    else:
        ht = [name for name, c in TRTLLM_CURATED.items() if c.high_throughput]
        problems.append(
            ("eplb_map", f"a static EPLB map goes with the high-throughput profiles ({', '.join(ht)}), not {prof.config}")
        )
    return problems


def _eplb_ep_problems(prof: TrtllmProfile) -> list[tuple[str, str]]:
    """The map's EP (eplb_map_ep, else its file name) against the profile's,
    and the profile's EP against the map's slots."""
    problems: list[tuple[str, str]] = []
    assert prof.eplb_map is not None  # _eplb_map_problems asks only about a profile with a map
    map_ep = prof.eplb_map_ep or eplb_map_ep_from_name(prof.eplb_map)
    if map_ep is None:
        problems.append(
            ("eplb_map", f"{prof.eplb_map}: the expert-parallel size the placement was generated for is not known: "
             "name it in the file name (qwen3.8-ep32-static544.yaml, as the guide does) or set profile.eplb_map_ep")
        )
    elif map_ep != prof.ep:
        problems.append(
            ("eplb_map", f"{Path(prof.eplb_map).name} is a placement for EP {map_ep}, but moe_expert_parallel_size "
             f"is {prof.ep} (profile.ep, at tensor_parallel_size {prof.tp}): a placement is specific to its EP "
             f"(seed 000: generate a new one when EP changes); use a map for EP {prof.ep} or run TP{map_ep}/EP{map_ep}")
        )
    if prof.ep is not None and EPLB_NUM_SLOTS % prof.ep:
        problems.append(("ep", f"EP {prof.ep} does not divide the static map's {EPLB_NUM_SLOTS} slots"))
    return problems


def _eplb_file_problems(prof: TrtllmProfile) -> list[tuple[str, str]]:
    """The map is a file on this machine (relative to the inventory directory)."""
    try:
        path = prof.eplb_map_file()
        assert path is not None  # _eplb_map_problems asks only about a profile with a map
        found = path.is_file()
    except (OSError, RuntimeError) as exc:  # a name too long for the OS, a ~user that does not exist
        return [("eplb_map", f"{prof.eplb_map!r} is not a readable path: {exc}")]
    if not found:
        return [("eplb_map", f"{path} is not a file (relative paths are read from {inventory_dir()})")]
    return []


def cluster_problems(prof: TrtllmProfile, cluster: Cluster) -> list[tuple[str, str]]:
    """One rank per GPU (or per slot), TP x PP ranks, rank 0 on node 0, EP divides TP."""
    problems: list[tuple[str, str]] = []
    if cluster.platform_info.vendor != "nvidia":
        problems.append(("profile.kind", f"{KIND} needs an NVIDIA platform, not {cluster.platform}"))
    world = prof.tp * prof.pp
    total_devices = sum(n.devices or 0 for n in cluster.nodes)
    if not prof.slots:
        if world != total_devices:  # one rank per GPU of every node
            problems.append(("profile.tp", f"TP {prof.tp} x PP {prof.pp} = {world} but the nodes have {total_devices} GPUs"))
    else:
        problems += slot_problems(prof, cluster, world, total_devices)
    if prof.ep is not None and prof.tp % prof.ep:
        problems.append(("profile.ep", f"EP {prof.ep} must divide TP {prof.tp}"))
    return problems


def slot_problems(prof: TrtllmProfile, cluster: Cluster, world: int, total_devices: int) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    by_name = {n.name: i for i, n in enumerate(cluster.nodes)}
    for name in prof.slots:
        if name not in by_name:
            problems.append((f"profile.slots.{name}", f"no node named {name!r} (nodes: {', '.join(by_name)})"))
    slots = prof.slots_by_node(cluster.nodes)
    for i, n in enumerate(cluster.nodes):
        if slots[n.name] > (n.devices or 0):
            problems.append((f"profile.slots.{n.name}", f"{slots[n.name]} slots but nodes[{i}] ({n.name}) has {n.devices} GPUs (devices)"))
    ranks = sum(slots.values())
    if ranks > total_devices:
        problems.append(("profile.slots", f"{ranks} ranks but the nodes have {total_devices} GPUs"))
    if ranks != world:
        problems.append(("profile.slots", f"{ranks} ranks (the sum of the slots) ≠ TP {prof.tp} × PP {prof.pp} = {world}"))
    node0 = cluster.nodes[0]
    if slots[node0.name] < 1:
        problems.append((f"profile.slots.{node0.name}", f"node 0 ({node0.name}) needs at least one slot: rank 0 and the HTTP server run there"))
    return problems
