"""Slurm's host lists, both ways: the one implementation, which the
launcher and the simulator's stand-ins import. It uses the standard library
only, so that the simulated images carry it beside the stand-ins
(sim/images.py) for the ones that read ``SLURM_STEP_NODELIST`` in a step."""

from __future__ import annotations

import re

_ITEM = re.compile(r"([^,\[]+)(?:\[([^\]]*)\])?")


def join(names: list[str]) -> str:
    """A comma-separated node list (Slurm also takes compressed forms; commas always work)."""
    return ",".join(names)


def expand(text: str) -> list[str]:
    """Slurm's compressed host list (squeue's %N, SLURM_STEP_NODELIST) ->
    names: ``gpu-[0-2,5],login`` -> gpu-0, gpu-1, gpu-2, gpu-5, login, zero
    padding kept, as ``scontrol show hostnames`` does. A bracket that holds
    no range Slurm writes is kept as it is."""
    out: list[str] = []
    for m in _ITEM.finditer(text):
        prefix, ranges = m.group(1), m.group(2)
        if ranges is None:
            out.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not (lo.isdigit() and (hi.isdigit() or not hi)):
                out.append(f"{prefix}[{ranges}]")  # not a range Slurm writes: the text as it is
                break
            out += [f"{prefix}{str(i).zfill(len(lo))}" for i in range(int(lo), int(hi or lo) + 1)]
    return out
