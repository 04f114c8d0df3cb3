"""The inventory schema (pydantic) and its loader.

A cluster is described by one Python module in ``inventory/`` that builds
``cluster = Cluster(...)``. Everything is validated when the module loads,
before any connection is opened: a broken inventory never touches a host.
Every problem names the file, the field and, for per-node values, the node.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    Field,
    ModelWrapValidatorHandler,
    SerializeAsAny,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from .errors import SECRETS, InventoryError, LlmdeployError
from .launcher import SECTIONS, LauncherSection, section_class
from .schema import (  # noqa: F401 (the names every schema module has always imported from here)
    CLUSTER_RE,
    ENV_NAME_RE,
    IMAGE_RE,
    NAME_RE,
    NIC_RE,
    PATH_RE,
    ClusterProblems,
    Port,
    SafePath,
    Strict,
    safe_path,
)
from .serving import INVENTORY_FIELDS, PROFILE_KINDS, ServingProfile

# --- platforms ----------------------------------------------------------------
# (each vendor's rows live in its package, platforms/<vendor>/; the registry loads it when a cluster names one)
from .platform import PLATFORMS, Platform, platform as _platform_row, platform_names, vendor as _vendor, vendor_name as _vendor_name  # noqa: E402,F401


# --- SSH ----------------------------------------------------------------------
# a user name (useradd's default NAME_REGEX)
USER_RE = r"^[a-z_][a-z0-9_-]{0,31}$"
class Ssh(Strict):
    """How to reach the nodes. Host keys are always checked."""

    # Unset user/port fall back to the ssh_config entry, then to ssh's defaults.
    user: str | None = Field(default=None, pattern=USER_RE)
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
    # through them (like OpenSSH's ControlPersist; transports/ssh/mux.py). 0: off,
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
    # Run every command on the nodes as root through sudo, like Ansible's
    # become: SSH logs in as ``user`` (yourself) and each command runs as
    # ``sudo -n -H -u root -- /bin/bash -c '<command>'`` (llmdeploy/become.py).
    # -n never prompts: each node's sudoers must let the user run anything
    # as root without a password (``alice ALL=(root) NOPASSWD: ALL``); a
    # node whose sudo refuses fails with the reason. MPI worlds across nodes
    # still need root's own SSH key between them (mpirun runs as root on
    # node 0). Refused with ``slurm``: its jobs run as the submitting user.
    become: bool = False

    @field_validator("identity_file", "known_hosts", "config_file")
    @classmethod
    def _expand(cls, v: str | None) -> str | None:
        """An absolute path (a leading ~ is expanded) of safe characters only: it goes into an ssh_config."""
        if v is None:
            return v
        v = os.path.expanduser(v)
        if not v.startswith("/"):
            raise ValueError(f"{v!r} must be an absolute path (or start with ~)")
        # invoke check writes it into an ssh_config: a newline there would add
        # directives (a ProxyCommand runs on this machine), a space splits it
        return safe_path(v)


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
    def _name_the_node(cls, data: Any, handler: ModelWrapValidatorHandler[Node]) -> Node:
        """Every problem of a node names the node."""
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
    # Where ``prepare`` stages the weights from (``invoke stage``): a node's
    # name, or "source" for the host declared in the cluster's ``stage.source``;
    # None: the operator puts them there, prepare only checks.
    stage_from: str | None = Field(default=None, pattern=NAME_RE.pattern)

    _check_path = field_validator("path", "tokenizer_path")(
        classmethod(lambda cls, v: v if v is None else safe_path(v))
    )

    @model_validator(mode="after")
    def _default_tokenizer(self) -> "Model":
        """``tokenizer_path`` defaults to ``path``."""
        if self.tokenizer_path is None:
            self.tokenizer_path = self.path
        return self


class Image(Strict):
    ref: str = Field(pattern=IMAGE_RE.pattern)
    # Load the image with ``docker load -i`` from this file on each node
    # instead of pulling it (clusters without registry access).
    tarball: SafePath | None = None
    # prepare gets the image once (node 0 pulls it, or loads the tarball) and
    # sends it down the nodes' chain (docker save -> docker load, as ``invoke
    # stage`` sends weights): the registry serves one pull, not one per node
    distribute: bool = False

    _check_tar = field_validator("tarball")(
        classmethod(lambda cls, v: v if v is None else safe_path(v))
    )


class Budget(Strict):
    """Host resources a node must have beyond what the profile reserves."""

    # host memory left to the OS, the container runtime and everything else
    os_margin_gib: float = Field(default=64, ge=0)
    # host memory for loading and staging weights (on top of reserved caches)
    weights_host_gib: float = Field(default=0, ge=0)
    # free space under base_dir (releases, logs) and where the model lives
    min_free_disk_gib: float = Field(default=20, ge=0)


class GateTolerance(Strict):
    """How much worse than the baseline each figure may be, as a fraction of
    it: 0.25 lets a latency grow by 25 % (or throughput drop by 25 %)."""

    ttft_p50: float = Field(default=0.5, ge=0, le=100)
    ttft_p95: float = Field(default=0.75, ge=0, le=100)
    tpot_p50: float = Field(default=0.5, ge=0, le=100)
    tpot_p95: float = Field(default=0.75, ge=0, le=100)
    output_tokens_per_s: float = Field(default=0.35, ge=0, le=1)


class GateSettings(Strict):
    """The smoke benchmark the gate runs (llmdeploy.loadgen) and its tolerances (llmdeploy.gate)."""

    enabled: bool = True
    requests: int = Field(default=16, ge=1, le=10000)
    concurrency: int = Field(default=4, ge=1, le=1024)
    input_tokens: int = Field(default=128, ge=1, le=1_000_000)
    output_tokens: int = Field(default=64, ge=2, le=1_000_000)
    # the whole smoke benchmark is bounded by this
    timeout_s: float = Field(default=300, gt=0, le=86400)
    tolerance: GateTolerance = Field(default_factory=GateTolerance)
    # a latency change smaller than this is never a regression (noise)
    floor_ms: float = Field(default=5, ge=0)
    # requests of the smoke benchmark that may fail
    max_errors: int = Field(default=0, ge=0)


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
    # before a serving release is stopped: wait up to this long for its
    # in-flight requests (its /metrics) to finish; 0: stop at once
    drain_s: float = Field(default=30, ge=0, le=3600)
    # the quality gate after readiness (deploy, rollback --gate)
    gate: GateSettings = Field(default_factory=GateSettings)


class VerifySettings(Strict):
    """invoke verify-comm."""

    # NPU pings: the full matrix up to this many pings, a sampled plan above
    ping_full_max: int = Field(default=2048, ge=1)
    # NVIDIA: all_reduce_perf's arguments (nccl-tests README)
    all_reduce_args: str = Field(default="-b 8 -e 8G -f 2 -g 1", pattern=r"^[A-Za-z0-9 .=-]+$")
    # NVIDIA: the busbw floor in GB/s of the largest size (like NCCL_TESTS_MIN_BW); None: no floor
    nccl_min_busbw: float | None = Field(default=None, gt=0)
    # deploy refuses a cluster whose last verification is older (None: any age)
    max_age_s: float | None = Field(default=7 * 86400, gt=0)



class StageSource(Strict):
    """A host that holds the model and is not a node (an NFS server, a staging
    box): ``invoke stage`` reads the checkpoint there and sends it down the chain."""

    name: str = Field(pattern=NAME_RE.pattern)
    # its address on the nodes' data network (it sends to the first node from there)
    ip: ipaddress.IPv4Address
    ssh_host: str | None = Field(default=None, pattern=r"^[A-Za-z0-9.:][A-Za-z0-9.:-]*$")
    ssh_port: Port | None = None
    # the model and tokenizer directories there (default: the nodes' paths)
    path: SafePath | None = None
    tokenizer_path: SafePath | None = None

    _check_path = field_validator("path", "tokenizer_path")(
        classmethod(lambda cls, v: v if v is None else safe_path(v))
    )

    def as_node(self) -> "Node":
        return Node(name=self.name, ip=self.ip, ssh_host=self.ssh_host, ssh_port=self.ssh_port)


class StageSettings(Strict):
    """``invoke stage``: the broadcast of the checkpoint over the data network."""

    # TCP port each node's receiver listens on, on its data address (``ip``)
    port: Port = 29871
    # the data links' speed (Mbit/s), for the expected time ``stage --check``
    # prints, and for how an image saved on a node travels (image_compression)
    link_mbit: float | None = Field(default=None, gt=0)
    # an image a node saves (``docker save``: its layers uncompressed, about
    # 2.9 times what a pull moves) and sends down the chain: "gzip" compresses
    # it again (pigz on every core where the node has it, else gzip -1), "none"
    # sends it as it is, "auto" (the default) compresses unless link_mbit says
    # the links are at least as fast as the node's compression: gzip -1 reads
    # about 400 Mbit/s per core (measured: 925 MB in 19 s), so one core
    # without pigz, nproc cores with it (roles/stage SAVE_AUTO, decided on the
    # node). A link of unknown speed gets the compressed stream
    image_compression: Literal["auto", "gzip", "none"] = "auto"
    # how long a node waits for its sender to connect, and for the next byte
    connect_timeout_s: float = Field(default=60, gt=0)
    idle_timeout_s: float = Field(default=300, gt=0)
    source: StageSource | None = None


# --- the cluster ------------------------------------------------------------------
class Cluster(Strict):
    name: str = Field(pattern=CLUSTER_RE.pattern)
    # one of the registered platforms (platforms/__init__.py)
    platform: str
    # Default serving NIC for nodes that do not name their own.
    nic: str | None = Field(default=None, pattern=NIC_RE.pattern)
    ssh: Ssh = Field(default_factory=Ssh)
    nodes: list[Node] = Field(min_length=1)
    model: Model
    image: Image
    # the serving system's profile (llmdeploy.serving; each system's schema in systems/<name>/)
    profile: SerializeAsAny[ServingProfile]
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
    # Where the tool keeps releases, the ledger and the lock on every node.
    # On a Slurm cluster, where jobs run as the user who submits them, the
    # three default to a folder of that user's on each node instead:
    # /var/tmp/llmdeploy-<user>/{lib,etc,log} (node-local, kept across
    # reboots, writable by every user; <user>: ssh.user, else your own
    # name here, as ssh logs in with it). A path the user cannot write is
    # named by prepare.
    base_dir: SafePath = "/var/lib/llmdeploy"
    # Where rendered environment files go on every node.
    etc_dir: SafePath = "/etc/llmdeploy"
    log_dir: SafePath = "/var/log/llmdeploy"
    # The folder the seeds mount into the serving containers as the model
    # cache (their ``-v /root/.cache:/root/.cache``), at the same path; a
    # model outside it gets a mount of its own. On a site run as an ordinary
    # user, a folder of theirs (their ~/.cache): a user cannot read /root.
    cache_dir: SafePath = "/root/.cache"
    # the nodes belong to a Slurm controller (None: the tool reaches every node over SSH): the Slurm
    # launcher's section, its schema and rules its own (launchers/slurm/schema.py: ``Slurm``)
    slurm: SerializeAsAny[LauncherSection] | None = None
    stage: StageSettings = Field(default_factory=StageSettings)

    _check_dirs = field_validator("base_dir", "etc_dir", "log_dir", "cache_dir")(
        classmethod(lambda cls, v: safe_path(v))
    )

    @field_validator("secret_env")
    @classmethod
    def _secret_names(cls, v: dict[str, str]) -> dict[str, str]:
        """Each entry maps a variable name (A-Z, 0-9, _) to the name of one of the operator's environment variables."""
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
        return _platform_row(self.platform)

    @field_validator("platform")
    @classmethod
    def _registered_platform(cls, v: str) -> str:
        names = platform_names()
        if v not in names:
            listed = ", ".join(repr(n) for n in names[:-1]) + f" or {names[-1]!r}" if len(names) > 1 else repr(names[0])
            raise ValueError(f"Input should be {listed}")
        return v

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

    @field_validator("profile", mode="before")
    @classmethod
    def _profile_of_kind(cls, v: object) -> ServingProfile:
        """A serving system's profile, built with its catalogue (``systems/<name>/catalogue.py``); read back as
        data, one whose ``kind`` a loaded system claims."""
        # a mapping (a cluster read back as JSON) becomes its system's profile class
        if isinstance(v, dict):
            kind = v.get("kind")
            if not isinstance(kind, str) or kind not in PROFILE_KINDS:
                known = ", ".join(sorted(PROFILE_KINDS)) or "none loaded"
                raise ClusterProblems([("kind", f"{kind!r} is no serving system this tool has loaded (known: {known}); "
                                                "build the profile with its system's catalogue (systems/<name>/catalogue.py)")])
            return PROFILE_KINDS[kind].model_validate(v)
        if not isinstance(v, ServingProfile) or type(v) is ServingProfile:
            raise ValueError(f"{type(v).__name__} is no serving system's profile: build it with its system's catalogue (systems/<name>/catalogue.py)")
        return v

    @field_validator("slurm", mode="before")
    @classmethod
    def _launcher_section(cls, v: object, info: ValidationInfo) -> LauncherSection | None:
        """A launcher's section, built with the class its launcher declares (``LauncherSection``); read back
        as data (a cluster read back as JSON), the class of the registered launcher that declares the field."""
        field = info.field_name or ""
        declared = SECTIONS.get(field)
        if isinstance(v, dict):
            declared = section_class(field)
            if declared is None:
                raise ValueError(f"no registered launcher declares the section {field!r} (launchers/__init__.py)")
            return declared.model_validate(v)
        if v is not None and (not isinstance(v, LauncherSection) or (declared is not None and not isinstance(v, declared))):
            raise ValueError(f"{type(v).__name__} is not the {field} section: build it with its launcher's class (launchers/<name>/schema.py)")
        return v

    @model_validator(mode="after")
    def _derive_and_check(self) -> "Cluster":
        """Each node gets what it leaves to the cluster (NIC, devices, first DP rank) and must have a NIC; node
        names, IPs and SSH endpoints are unique; the serving system's own checks pass (``profile.problems``);
        no two profile ports are the same; a launcher's section passes its launcher's rules (``settle``: the
        Slurm launcher's, launchers/slurm/schema.py, which also fill what the section leaves to the platform);
        ``model.stage_from`` names a node, or 'source' with a ``stage.source`` host that is not a node."""
        problems = self._derive_nodes() + self._unique_nodes() + self.profile.problems(self) + self._unique_ports() + self._launcher_problems() + self._stage_problems()
        if problems:
            raise ClusterProblems(problems)
        return self

    def _stage_problems(self) -> list[tuple[str, str]]:
        frm = self.model.stage_from
        names = [n.name for n in self.nodes]
        src = self.stage.source
        out = []
        if src is not None and src.name in names:
            out.append(("stage.source.name", f"{src.name!r} is a node; a source that is a node is named by model.stage_from alone"))
        if frm is None or frm in names:
            return out
        if frm == "source":
            if src is None:
                out.append(("model.stage_from", "'source' needs the host declared in stage.source"))
            return out
        return out + [("model.stage_from", f"{frm!r} is neither a node ({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}) nor 'source'")]

    def where(self, i: int, field: str) -> str:
        """How a problem names a node's field: ``nodes[2] (a3-node-2).nic``."""
        return f"nodes[{i}] ({self.nodes[i].name}).{field}"

    def _derive_nodes(self) -> list[tuple[str, str]]:
        """Fill what a node leaves to the cluster: its NIC, its devices, its first rank."""
        problems = []
        step = self.profile.ranks_per_node()
        for i, n in enumerate(self.nodes):
            if n.nic is None:
                n.nic = self.nic
            if n.nic is None:
                problems.append((self.where(i, "nic"), "no NIC: set it on the node or the cluster's 'nic'"))
            if n.devices is None:
                n.devices = self.platform_info.devices
            if n.start_rank is None:
                n.start_rank = i * step
        return problems

    def _unique_nodes(self) -> list[tuple[str, str]]:
        problems = []
        seen: dict[str, dict[str, int]] = {"name": {}, "ip": {}, "ssh": {}}
        for i, n in enumerate(self.nodes):
            for key, value, field in (
                ("name", n.name, "name"),
                ("ip", str(n.ip), "ip"),
                ("ssh", f"{n.address}:{n.ssh_port or self.ssh.port or 22}", "ssh_host"),
            ):
                if value in seen[key]:
                    j = seen[key][value]
                    problems.append((self.where(i, field), f"{value} is already used by nodes[{j}] ({self.nodes[j].name})"))
                else:
                    seen[key][value] = i
        return problems

    def _launcher_problems(self) -> list[tuple[str, str]]:
        """Its launcher's section's rules (``LauncherSection.settle``), with the platform's vendor."""
        section = self.slurm
        if section is None:
            return []
        try:
            vendor = _vendor(_vendor_name(self.platform))
        except LlmdeployError:
            vendor = None  # the platform's own problem is named where it is checked
        return section.settle(self, vendor)

    def slurm_name(self, node: Node) -> str:
        """The scheduler's name of one of the inventory's nodes (its launcher section's ``node_name``; else its own)."""
        if self.slurm is None:
            return node.name
        return self.slurm.node_name(self, node)

    def _unique_ports(self) -> list[tuple[str, str]]:
        problems = []
        by_port: dict[int, str] = {}
        for key, port in self.profile.ports().items():
            if port in by_port:
                problems.append((f"profile.{key}", f"port {port} is also profile.{by_port[port]}"))
            by_port[port] = key
        return problems


def image(ref: str, tarball: str | None = None) -> Image:
    """The serving image: pulled by reference, or loaded from ``tarball`` on each node."""
    return Image(ref=ref, tarball=tarball)


def make_nodes(prefix: str, count: int, first_ip: str, **common: Any) -> list[Node]:
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


def _describe_loc(loc: tuple[int | str, ...], raw_nodes: list[Any] | None) -> str:
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
        elif item in PROFILE_KINDS and parts and parts[-1].startswith("profile"):
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
}


def _split(problems: list[str]) -> list[tuple[str, str]]:
    return [(head, rest) if sep else ("cluster", p) for p in problems for head, sep, rest in [p.partition(": ")]]


def problems_from_validation(err: ValidationError, raw_nodes: list[Any] | None = None) -> list[str]:
    out: list[str] = []
    # a profile (or a part of one) names its own field (llmdeploy.serving.inventory_field)
    prefix = _TITLE_FIELD.get(err.title) or INVENTORY_FIELDS.get(err.title, "")
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
    assert spec is not None and spec.loader is not None  # a .py file's spec, with its source loader
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


def _raw_nodes(err: ValidationError) -> list[Any] | None:
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
