"""The platform interface: the one place that says what a hardware vendor
gives the rest of the tool. The generic code (the core, the roles, the flows)
asks a cluster's vendor through what is declared here and never names one.

A vendor is a package ``platforms/<vendor>/`` (``platforms/ascend``,
``platforms/nvidia``) registered with one line in ``platforms/__init__.py``
(``VENDORS``: the vendor's package -> the platform names it declares). The
package declares:

1. **Its platforms** (``PLATFORMS``): one :class:`Platform` row per machine
   type an inventory may name (``cluster.platform``): its name, its
   accelerators per node and what their tool calls them. A vendor may
   subclass the row for what only its tools need (the NPU address query of
   an Ascend platform, say).
2. **Its behaviour** (:class:`Vendor`, module attributes): the facts
   commands that list the devices and how to read them, the device files a
   container needs, the live view's query, the files a log bundle adds, the
   check verify-comm runs, the labels of its pictures.

The core's inventory validation asks :func:`platform` for a cluster's row;
the registry loads a vendor's package only when a cluster names one of its
platforms (:func:`vendor` imports ``platforms.<vendor>`` on first use), so a
start-up loads none of the plug-ins it does not need.

Core: imports nothing above ``llmdeploy`` (the plug-in root is found by
name, :data:`PLUGINS`, like the serving systems' ``systems.module_for``).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import Field

from .errors import LlmdeployError
from .plugin import Registry, check
from .schema import Strict

if TYPE_CHECKING:  # pragma: no cover - types only
    from .inventory import Cluster, Node

# the package that holds the vendors and their registry (``VENDORS``)
PLUGINS = "platforms"

# the verify-comm methods a vendor's tools offer (flows.verify runs them):
# "device_pings": per device, the vendor's NIC tool's link checks and
#   device-to-device pings across nodes (roles.comm's ping plan);
# "collective": the device table read by the facts, then one all_reduce over
#   every device of every node (roles.comm's all_reduce_perf under mpirun).
COMM_METHODS = ("device_pings", "collective")


class Platform(Strict):
    """One platform: a machine type with a fixed number of accelerators."""

    # what people call it (tables, messages): "Atlas 800 A3", "B200"
    name: str
    # the package under platforms/ that declares it
    vendor: str
    # accelerators per node: a node reporting another number is not this platform
    devices: int = Field(ge=1, le=64)
    # what the device tool calls one of them (a regular expression the whole
    # name must match): "NVIDIA B200", "Ascend910"
    model: str

    def model_matches(self, name: str) -> bool:
        return re.fullmatch(self.model, name.strip()) is not None


class Vendor(Protocol):
    """What the generic code calls in a vendor's package (``platforms/<vendor>/__init__.py``).

    Declarations: ``VENDOR`` (the package's name), ``PLATFORMS`` (name ->
    :class:`Platform`), ``DEVICE`` (how one accelerator is named in facts,
    messages and pictures: ``npu``, ``gpu``), ``DEVICE_TOOL`` (the facts
    section whose table lists the devices, and the command people know it
    by: ("npusmi", "npu-smi info")), ``IB_PORTS`` (the facts read the
    InfiniBand ports with ``ibstat`` and ``cluster.ib_rate`` applies),
    ``COMM_METHOD`` (one of :data:`COMM_METHODS`), ``LOG_FILES`` (file in a
    log bundle -> the command that fills it), ``TOP_QUERY`` (the live
    view's command for the accelerators' use and memory),
    ``SCHEDULED_CONTAINERS`` (how its sites run a unit's container under a
    batch scheduler, the inventory's ``slurm.container`` values it allows,
    the first its default: NVIDIA's sites run pyxis + enroot, Ascend's Docker).

    Builders and parsers (pure; the runner runs what they build):
    ``facts_lines(cluster, node)`` the facts script's device lines (sections
    built with ``llmdeploy.sections.section``), ``devices(sections,
    cpu_nodes)`` the device list read from them (one dict per device: ``id``,
    ``name``, ``health`` ("OK" or what is wrong), ``cpu_affinity``, ``numa``
    and the vendor's own keys), ``container_devices(cluster, node)`` the
    device files a serving container needs on ``node`` (``--device``; the
    facts check that each exists), ``parse_top(text)`` the live view's
    accelerators (``id``, ``util_pct``, ``mem_used_mib``, ``mem_total_mib``),
    ``comm_device_checks(cluster, node, facts)`` verify-comm's checks of a
    node's devices from its facts (check -> {ok, summary, failures}; the
    ``collective`` method), and, for the ``device_pings`` method,
    ``link_script``/``parse_links``/``LINK_CHECKS``/``LINK_TOOL``/``PING_PRELUDE``/``ping_job``
    (``platforms.ascend.comm``)."""

    VENDOR: str
    PLATFORMS: dict[str, Platform]
    DEVICE: str
    DEVICE_TOOL: tuple[str, str]
    IB_PORTS: bool
    COMM_METHOD: Literal["device_pings", "collective"]
    LOG_FILES: dict[str, str]
    TOP_QUERY: str
    SCHEDULED_CONTAINERS: tuple[str, ...]

    def facts_lines(self, cluster: "Cluster", node: "Node") -> list[str]: ...

    def devices(self, sections: dict[str, tuple[str, int | None]], cpu_nodes: dict[int, int]) -> list[dict[str, Any]]: ...

    def container_devices(self, cluster: "Cluster", node: "Node") -> list[str]: ...

    def parse_top(self, text: str) -> list[dict[str, Any]]: ...


# a vendor's package has every member of Vendor (checked when it loads, with the hooks'
# parameters: llmdeploy.plugin.check), and those its verify-comm method needs
REQUIRED_BY_METHOD = {
    "collective": ("comm_device_checks",),
    "device_pings": ("LINK_CHECKS", "LINK_TOOL", "PING_PRELUDE", "link_script", "parse_links", "ping_job"),
}


def _registry() -> ModuleType:
    """The plug-in root's registry (``platforms/__init__.py``: ``VENDORS``)."""
    return importlib.import_module(PLUGINS)


def platform_names() -> tuple[str, ...]:
    """Every platform name an inventory may give, in the registry's order
    (no vendor package is loaded to answer)."""
    return tuple(name for names in _registry().VENDORS.values() for name in names)


def vendor_name(platform_name: str) -> str:
    """The vendor package that declares ``platform_name``; LlmdeployError when none does."""
    registered: dict[str, tuple[str, ...]] = _registry().VENDORS
    for vendor, names in registered.items():
        if platform_name in names:
            return vendor
    raise LlmdeployError(f"platform {platform_name!r}: no vendor under {PLUGINS}/ declares it (known: {', '.join(platform_names())})")


def _accept(mod: ModuleType, name: str) -> Vendor:
    """``platforms/<name>/`` against the interface (:class:`Vendor`, ``llmdeploy.plugin.check``) and the registry's line."""
    registered = _registry().VENDORS
    check(mod, Vendor, "platform vendor")
    if mod.VENDOR != name:
        raise TypeError(f"{mod.__name__}: VENDOR {mod.VENDOR!r} is not its package's name {name!r}")
    if mod.COMM_METHOD not in COMM_METHODS:
        raise TypeError(f"{mod.__name__}: COMM_METHOD {mod.COMM_METHOD!r} is none of {', '.join(COMM_METHODS)}")
    missing = [a for a in REQUIRED_BY_METHOD[mod.COMM_METHOD] if not hasattr(mod, a)]
    if missing:
        raise TypeError(f"{mod.__name__}: verify-comm's {mod.COMM_METHOD} method needs {', '.join(missing)} (llmdeploy.platform.Vendor)")
    declared, listed = set(mod.PLATFORMS), set(registered[name])
    if declared != listed:
        raise TypeError(f"{mod.__name__} declares the platforms {', '.join(sorted(declared))}, but {PLUGINS}/__init__.py registers "
                        f"{', '.join(sorted(listed))} for it")
    wrong = [k for k, row in mod.PLATFORMS.items() if row.vendor != name]
    if wrong:
        raise TypeError(f"{mod.__name__}: the rows {', '.join(wrong)} name another vendor")
    accepted: Vendor = mod
    return accepted


# the vendors: the package platforms/<name>/ of each name VENDORS lists
VENDORS: Registry[Vendor] = Registry("platform vendor", PLUGINS, lambda: {name: name for name in _registry().VENDORS}, _accept)


def vendor(name: str) -> Vendor:
    """The package ``platforms/<name>/``, loaded on first use and checked
    against the interface and the registry's line (``_accept``)."""
    return VENDORS.load(name)


def platform(platform_name: str) -> Platform:
    """The row of ``platform_name`` (its vendor's package is loaded to give it)."""
    return vendor(vendor_name(platform_name)).PLATFORMS[platform_name]


def device_word(vendor_name_: str | None, default: str = "npu") -> str:
    """How the vendor ``vendor_name_`` names one accelerator (``default`` for a
    document that names no vendor, or one this tool does not have)."""
    if not vendor_name_ or vendor_name_ not in _registry().VENDORS:
        return default
    return vendor(vendor_name_).DEVICE


def comm_method(vendor_name_: str | None, default: str = "device_pings") -> str:
    """The verify-comm method of the vendor ``vendor_name_`` (``default`` as for :func:`device_word`)."""
    if not vendor_name_ or vendor_name_ not in _registry().VENDORS:
        return default
    return vendor(vendor_name_).COMM_METHOD



class _Platforms(Mapping[str, Platform]):
    """Every registered platform by name, each row read from its vendor's
    package when asked for (``PLATFORMS["gb300"]`` loads that vendor only)."""

    def __getitem__(self, name: str) -> Platform:
        if name not in platform_names():
            raise KeyError(name)
        return platform(name)

    def __iter__(self) -> Iterator[str]:
        return iter(platform_names())

    def __len__(self) -> int:
        return len(platform_names())


PLATFORMS: Mapping[str, Platform] = _Platforms()
