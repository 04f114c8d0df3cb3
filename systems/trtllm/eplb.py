"""Static EPLB placement maps for the high-throughput Qwen3.8 profiles.

The file is TensorRT LLM's ``MoeLoadBalancerConfig`` as YAML (what
``moe_config.load_balancer`` accepts as a file name)::

    num_slots: 544
    initial_global_assignments:
      0: [17, 402, 3, ...]     # 544 expert ids, one per global slot
      ...
    layer_updates_per_iter: 0  # static: never move experts

Rules (seed 000): 544 global slots for every MoE layer, expert ids of the 512
routed experts (repeats are replicas, and every expert needs a slot), the 92
target-model layers for qwen3.8-high-throughput.yaml and the 92 + the MTP
layer for qwen3.8-high-throughput-mtp3.yaml, ``layer_updates_per_iter: 0``.

Pure: text in, problems out. Nothing here opens a connection.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import yaml

from .profile import EPLB_NUM_EXPERTS, EPLB_NUM_SLOTS, QWEN38_MOE_LAYERS, TRTLLM_CURATED

# the fields of TensorRT LLM's MoeLoadBalancerConfig (a strict model: others are refused)
FIELDS = ("num_slots", "initial_global_assignments", "layer_updates_per_iter")
# at most this many bad slots are listed per layer
_SHOWN_PER_LAYER = 5


@dataclass(frozen=True)
class EplbMap:
    text: str
    sha256: str
    num_slots: int
    layers: int
    path: str = ""


class _DuplicateKey(Exception):
    pass


_Base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_Base):  # type: ignore[misc, valid-type]
    """safe_load that refuses a key given twice (YAML would keep the last one)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                hashable = key in seen
            except TypeError:
                continue
            if hashable:
                raise _DuplicateKey(f"key {key!r} appears twice (line {key_node.start_mark.line + 1})")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def expected_layers(config: str) -> int | None:
    """MoE layers a map for ``config`` covers; None: the profile takes no map."""
    curated = TRTLLM_CURATED.get(config)
    return curated.eplb_layers if curated is not None else None


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ranges(numbers: list[int]) -> str:
    """[1, 2, 3, 7] -> '1..3, 7'"""
    out: list[list[int]] = []
    for n in sorted(numbers):
        if out and isinstance(out[-1], list) and out[-1][1] == n - 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ", ".join(f"{a}" if a == b else f"{a}..{b}" for a, b in out)


def check_map(text: str, config: str) -> list[str]:
    """Every problem of ``text`` as the static EPLB map of the curated profile
    ``config``; [] when TensorRT LLM can use it."""
    return _check(text, config)[0]


def _check(text: str, config: str) -> tuple[list[str], dict | None]:
    """Every problem of ``text`` as ``config``'s map, in the order a reader
    meets them, and the parsed document (None when it is not even a mapping)."""
    want_layers = expected_layers(config)
    if want_layers is None:
        ht = [name for name, c in TRTLLM_CURATED.items() if c.eplb_layers]
        return [f"{config} takes no static EPLB map (only {', '.join(ht)})"], None
    doc, unreadable = _load(text)
    if doc is None:
        return [unreadable], None

    problems = _field_problems(doc)
    layers = doc.get("initial_global_assignments")
    if layers is None:
        problems.append(f"initial_global_assignments is missing: {want_layers} layers of {EPLB_NUM_SLOTS} expert ids each")
        return problems, doc
    if not isinstance(layers, dict):
        problems.append(
            f"initial_global_assignments must map a layer index to its {EPLB_NUM_SLOTS} expert ids, not a {type(layers).__name__}"
        )
        return problems, doc
    problems.extend(_layer_key_problems(layers, config, want_layers))
    for key, slots in layers.items():
        problems.extend(_slot_problems(f"layer {key}", slots))
    return problems, doc


def _load(text: str) -> tuple[dict | None, str]:
    """The map as a mapping, or None and why it is not one."""
    try:
        doc = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as err:
        return None, str(err)
    except yaml.YAMLError as err:
        return None, f"not valid YAML: {' '.join(str(err).split())}"
    if not isinstance(doc, dict):
        kind = f"a {type(doc).__name__}" if doc is not None else "empty"
        return None, f"the file must be a mapping with {', '.join(FIELDS)}, but it is {kind}"
    return doc, ""


def _field_problems(doc: dict) -> list[str]:
    """Unknown keys, num_slots and layer_updates_per_iter."""
    problems: list[str] = []
    for key in doc:
        if key not in FIELDS:
            problems.append(f"unknown key {key!r} (TensorRT LLM's MoeLoadBalancerConfig has {', '.join(FIELDS)})")

    num_slots = doc.get("num_slots")
    if num_slots is None:
        problems.append(f"num_slots is missing, expected {EPLB_NUM_SLOTS}")
    elif not _is_int(num_slots) or num_slots != EPLB_NUM_SLOTS:
        problems.append(f"num_slots is {num_slots!r}, expected {EPLB_NUM_SLOTS}")

    updates = doc.get("layer_updates_per_iter", 0)
    if not _is_int(updates) or updates != 0:
        problems.append(f"layer_updates_per_iter is {updates!r}; a static map needs 0 (anything else moves experts online)")
    return problems


def _layer_key_problems(layers: dict, config: str, want_layers: int) -> list[str]:
    """The layers of initial_global_assignments: how many, keys that are no
    layer index or outside the range, and (with the right count) the missing ones."""
    layer_note = (
        f"the {QWEN38_MOE_LAYERS} MoE layers + the MTP layer"
        if want_layers > QWEN38_MOE_LAYERS
        else f"the {QWEN38_MOE_LAYERS} MoE layers of the target model"
    )
    problems: list[str] = []
    if len(layers) != want_layers:
        problems.append(f"{len(layers)} layers but {config} needs {want_layers} ({layer_note})")
    indices: list[int] = []
    for key in layers:
        index = key
        if isinstance(key, str) and key.isdigit():
            index = int(key)
        if not _is_int(index):
            problems.append(f"layer key {key!r} is not a layer index")
        elif not 0 <= index < want_layers:
            problems.append(f"layer {index} is outside 0..{want_layers - 1} ({layer_note})")
        else:
            indices.append(index)
    if len(layers) == want_layers:
        missing = sorted(set(range(want_layers)) - set(indices))
        if missing:
            problems.append(f"no assignment for layers {_ranges(missing)} (expected every layer 0..{want_layers - 1})")
    return problems


def _slot_problems(label: str, slots) -> list[str]:
    """One layer's slots: their count, expert ids that are no integer or out
    of range (the first few), and experts left without a slot."""
    if not isinstance(slots, list):
        return [f"{label}: expected a list of {EPLB_NUM_SLOTS} expert ids, got {type(slots).__name__}"]
    problems: list[str] = []
    if len(slots) != EPLB_NUM_SLOTS:
        problems.append(f"{label} has {len(slots)} slots, expected {EPLB_NUM_SLOTS}")
    bad: list[str] = []
    present: set[int] = set()
    for slot, expert in enumerate(slots):
        if not _is_int(expert):
            bad.append(f"{label} slot {slot}: {expert!r} is not an integer expert id")
        elif not 0 <= expert < EPLB_NUM_EXPERTS:
            bad.append(f"{label} slot {slot}: expert id {expert} is outside 0..{EPLB_NUM_EXPERTS - 1}")
        else:
            present.add(expert)
    problems.extend(bad[:_SHOWN_PER_LAYER])
    if len(bad) > _SHOWN_PER_LAYER:
        problems.append(f"{label}: {len(bad) - _SHOWN_PER_LAYER} more bad slots")
    absent = sorted(set(range(EPLB_NUM_EXPERTS)) - present)
    if absent and not bad:
        problems.append(
            f"{label} has no slot for expert{'s' if len(absent) > 1 else ''} {_ranges(absent)} "
            f"(every expert 0..{EPLB_NUM_EXPERTS - 1} needs at least one)"
        )
    return problems


def load_map(path: str | Path, config: str) -> EplbMap:
    """Read and check the map for ``config``; ValueError naming the file and
    listing every problem."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise ValueError(f"EPLB map {path}: cannot read it ({err.strerror or err})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"EPLB map {path}: not UTF-8 text (byte {err.start})") from None
    problems, doc = _check(text, config)
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ValueError(f"EPLB map {path} is not usable with {config}:\n{lines}")
    assert doc is not None  # _check gives no document only with a problem
    return EplbMap(
        text=text,
        sha256=hashlib.sha256(raw).hexdigest(),
        num_slots=doc["num_slots"],
        layers=len(doc["initial_global_assignments"]),
        path=str(path),
    )
