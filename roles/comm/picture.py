"""verify-comm as a picture: the verification document -> a PNG (matplotlib)
and a self-contained HTML page (the PNG inside as a data URI, inline CSS, no
script, no external address), both pure functions of the document.

The document is the one ``invoke verify-comm --json`` prints, with a
``detail`` key the run adds for the picture only (the printed JSON and node
0's record stay without it: at 64 nodes every ping is megabytes):

``devices``
    per node, in the cluster's order, its number of NPUs/GPUs (the axes);
``pings``
    Ascend: every planned NPU ping (``from``, ``npu``, ``to``, ``to_npu``,
    ``loss``, ``ok``, ``reason``, ``rtt_ms``: the mean round trip of the
    replies), full or sampled plan alike;
``host_pairs``
    every host-network pair (``from``, ``nic``, ``to``, ``ip``, ``mtu``,
    ``reply``, ``full_mtu``, ``ok``, ``reason``);
``all_reduce``
    NVIDIA: all_reduce_perf's table (``rows``: ``size``, ``busbw``, ...) and
    ``floor`` (``verify.nccl_min_busbw``, GB/s, or None);
``vendor``, ``platform``, ``device``
    ``ascend``/``nvidia``, the platform's name, ``npu``/``gpu``.

What shows: the NPU ping matrix as a heatmap (source node/device x
destination node/device; a lost ping red, partial loss orange, latency as
the shade of green, not pinged grey), every failed device named
(``sim-a3-1 npu5``) on the heatmap's edges and in the page; the host network
pairs with their MTU results; on NVIDIA all_reduce_perf's bus bandwidth per
size with the floor drawn. A device is failed when one of its own checks
failed (a check failure that names it: ``npu5: DOWN``) or when every ping
from and to it was lost.

matplotlib is imported inside :func:`render_png` only, on the Agg backend:
other commands do not pay for it.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re

from llmdeploy import platform

# the PNG's size in pixels, whatever the cluster: a 128 x 128 matrix (16 A2
# nodes x 8 NPUs) and a 512 x 512 one (64 nodes, sampled) alike
PNG_WIDTH, PNG_HEIGHT, DPI = 1600, 1000, 100
# colours of the heatmap's cells and the host network's pairs
LOST, PARTIAL, NOT_PINGED, OK_GREEN, MTU_FAIL = "#d62728", "#ff9f1c", "#e9e9e9", "#2ca02c", "#ff7f0e"
# a failure of a check that names its device(s): ``npu5: DOWN``, ``npu1,2: no NPU IP, not pinged``, ``gpu3: ...``
_DEVICE_FAILURE = re.compile(r"^(npu|gpu)(\d+(?:,\d+)*): (.+)$", re.S)
# how many failed devices the picture names on its edges (the page names all)
EDGE_LABELS = 24


# --- the data the picture shows (pure, no matplotlib) ------------------------------------------------


def detail(record: dict) -> dict:
    return record.get("detail") or {}


def device_word(record: dict) -> str:
    d = detail(record)
    if d.get("device"):
        return d["device"]
    return platform.device_word(d.get("vendor"))


def label(record: dict, host: str, device: int) -> str:
    """``sim-a3-1 npu5``"""
    return f"{host} {device_word(record)}{device}"


def devices(record: dict) -> dict[str, int]:
    """Per node its device count, in the cluster's order (from the detail,
    else as many as the document's failures and pings name)."""
    got = dict(detail(record).get("devices") or {})
    for host in record.get("nodes", {}):
        got.setdefault(host, 0)
    return {h: int(n) for h, n in got.items()}


def axis(record: dict) -> list[tuple[str, int]]:
    """The heatmap's rows and columns: (node, device), node by node."""
    return [(h, d) for h, n in devices(record).items() for d in range(n)]


def device_faults(record: dict) -> dict[tuple[str, int], list[str]]:
    """(node, device) -> why it is failed: its own checks' failures that name
    it, and "every ping lost" when every ping from and to it was lost, the
    pings with a failed peer aside (a peer whose own check failed explains
    them: on two nodes, npu5 of the healthy node loses every ping, all of them
    to the broken npu5)."""
    faults: dict[tuple[str, int], list[str]] = {}
    for host, v in record.get("nodes", {}).items():
        for check, c in (v.get("checks") or {}).items():
            for f in c.get("failures") or []:
                m = _DEVICE_FAILURE.match(str(f))
                if not m:
                    continue
                for d in m.group(2).split(","):
                    faults.setdefault((host, int(d)), []).append(f"{check}: {m.group(3)}")
    own = set(faults)
    seen: dict[tuple[str, int], list[int]] = {}  # device -> [pings from it, lost; pings to it, lost]
    for p in detail(record).get("pings") or []:
        src, dst = (p["from"], int(p["npu"])), (p["to"], int(p["to_npu"]))
        for end, other, i in ((src, dst, 0), (dst, src, 2)):
            if other in own:
                continue
            counts = seen.setdefault(end, [0, 0, 0, 0])
            counts[i] += 1
            counts[i + 1] += 0 if p["ok"] else 1
    for end, (n_out, lost_out, n_in, lost_in) in seen.items():
        if n_out + n_in and lost_out == n_out and lost_in == n_in:
            faults.setdefault(end, []).append(f"pings: every ping lost ({n_out} from it, {n_in} to it)")
    return faults


def failed_devices(record: dict) -> list[dict]:
    """Every failed device, in the axis' order: label, node, device, reasons."""
    faults = device_faults(record)
    order = {k: i for i, k in enumerate(axis(record))}
    keys = sorted(faults, key=lambda k: (order.get(k, len(order)), k))
    return [{"label": label(record, h, d), "host": h, "device": d, "reasons": faults[(h, d)]} for h, d in keys]


def unreachable(record: dict) -> dict[str, str]:
    return {h: v.get("error") or "unreachable" for h, v in record.get("nodes", {}).items() if not v.get("reachable")}


def ping_cells(record: dict) -> dict[tuple[int, int], dict]:
    """(row, column) of the heatmap -> that ping's result."""
    index = {k: i for i, k in enumerate(axis(record))}
    cells = {}
    for p in detail(record).get("pings") or []:
        a, b = index.get((p["from"], int(p["npu"]))), index.get((p["to"], int(p["to_npu"])))
        if a is not None and b is not None:
            cells[(a, b)] = p
    return cells


def failed_links(record: dict) -> list[dict]:
    """The lost pings: from the detail, else the document's own list."""
    pings = detail(record).get("pings")
    if pings is not None:
        return [p for p in pings if not p["ok"]]
    return list((record.get("links") or {}).get("failed") or [])


def link_name(record: dict, p: dict) -> str:
    """``sim-a3-0 npu5 → sim-a3-1 npu5``"""
    return f"{label(record, p['from'], int(p['npu']))} → {label(record, p['to'], int(p['to_npu']))}"


def host_pairs(record: dict) -> list[dict]:
    """Every host-network pair (the detail), else the document's failing ones."""
    pairs = detail(record).get("host_pairs")
    if pairs is not None:
        return list(pairs)
    return list((record.get("host_links") or {}).get("failed") or [])


def pair_state(p: dict) -> str:
    """ok, mtu (a reply, but the full-MTU don't-fragment ping failed), lost (no reply)."""
    if p.get("ok"):
        return "ok"
    return "mtu" if p.get("reply") else "lost"


def size_text(n: int) -> str:
    """all_reduce_perf's sizes: ``8 B``, ``1 KiB``, ``8 GiB``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:g} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def all_reduce(record: dict) -> dict | None:
    """{rows, floor}: the table and the floor, None when no all_reduce ran."""
    ar = detail(record).get("all_reduce")
    if ar is None and record.get("all_reduce") is None:
        return None
    ar = dict(ar or {})
    ar.setdefault("rows", [])
    ar.setdefault("floor", None)
    return ar


def verdict(record: dict) -> str:
    return "communication healthy" if record.get("ok") else "communication FAILED"


def title(record: dict) -> str:
    d = detail(record)
    n = len(record.get("nodes") or {})
    per = sorted(set(devices(record).values()))
    what = f"{n} node{'s' if n != 1 else ''}" + (f" × {per[0]} {device_word(record).upper()}s" if len(per) == 1 and per[0] else "")
    platform = f"{d['platform']}, " if d.get("platform") else ""
    return f"verify-comm {record.get('cluster', '?')} ({platform}{what}): {verdict(record)}"


# --- the PNG ---------------------------------------------------------------------------------------


def render_png(record: dict) -> bytes:
    """The picture: :data:`PNG_WIDTH` x :data:`PNG_HEIGHT` pixels.

    Ascend: the NPU ping heatmap (left), the host network matrix and the
    failures in words (right). NVIDIA: all_reduce_perf's busbw per size with
    the floor (left), the same right column."""
    # Agg's canvas on a Figure of its own: no pyplot, no global backend, no GUI
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(PNG_WIDTH / DPI, PNG_HEIGHT / DPI), dpi=DPI, layout="constrained")
    canvas = FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 2, width_ratios=[2.15, 1], height_ratios=[1.15, 1])
    hosts = fig.add_subplot(grid[0, 1])
    words = fig.add_subplot(grid[1, 1])
    fig.suptitle(f"{title(record)}  —  {record.get('time', '')}", fontsize=14, fontweight="bold",
                 color=OK_GREEN if record.get("ok") else LOST)
    if platform.comm_method(detail(record).get("vendor")) == "device_pings" or detail(record).get("pings") is not None:
        # the heatmap, under it the colour scale of the round trips and the legend
        left = grid[:, 0].subgridspec(2, 2, height_ratios=[30, 1], width_ratios=[1, 1.7])
        _heatmap(fig, fig.add_subplot(left[0, :]), fig.add_subplot(left[1, 0]), fig.add_subplot(left[1, 1]), record)
    else:
        _busbw(fig.add_subplot(grid[:, 0]), record)
    _host_matrix(hosts, record)
    _words(words, record)
    out = io.BytesIO()
    canvas.print_png(out)  # the figure's own size: no bbox_inches="tight", which would change it
    return out.getvalue()


def _ticks(ax, record: dict, n: int) -> None:
    """Per node a label at its block's middle, a tick per device (its number
    when there is room), lines between the nodes."""
    devs = devices(record)
    starts, pos = [], 0
    for h, k in devs.items():
        starts.append((h, pos, k))
        pos += k
    # the heatmap is about 700 pixels wide in the PNG: every device's number from 16 pixels a device, every other one's from 8
    per_device_px = 700 / max(1, n)
    every = 1 if per_device_px >= 16 else 2 if per_device_px >= 8 else 0
    step = max(1, math.ceil(len(starts) / 24))
    centers = [s + (k - 1) / 2 for _, s, k in starts]
    names = [h if i % step == 0 else "" for i, (h, _, _) in enumerate(starts)]
    down = unreachable(record)
    ax.set_xticks(centers, names, rotation=30 if len(starts) > 4 else 0, ha="right" if len(starts) > 4 else "center", fontsize=9)
    ax.set_yticks(centers, names, fontsize=9)
    for tl in ax.get_xticklabels() + ax.get_yticklabels():
        if tl.get_text() in down:
            tl.set_color(LOST)
    ax.tick_params(which="major", length=0, pad=16 if every else 4)
    minor = list(range(n))
    ax.set_xticks(minor, minor=True)
    ax.set_yticks(minor, minor=True)
    if every:
        dl = [str(d) if d % every == 0 else "" for h, s, k in starts for d in range(k)]
        ax.set_xticklabels(dl, minor=True, fontsize=6)
        ax.set_yticklabels(dl, minor=True, fontsize=6)
    ax.tick_params(which="minor", length=2, labelsize=6)
    lw, colour = (0.8, "#555555") if len(starts) <= 16 else (0.3, "#9a9a9a")
    for _, s, _ in starts[1:]:
        ax.axhline(s - 0.5, color=colour, lw=lw)
        ax.axvline(s - 0.5, color=colour, lw=lw)


def _heatmap(fig, ax, scale_ax, legend_ax, record: dict) -> None:
    import numpy as np
    from matplotlib import colormaps
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import LinearSegmentedColormap, Normalize

    ax_keys = axis(record)
    n = len(ax_keys)
    word = device_word(record).upper()
    plan = record.get("plan") or "?"
    links = record.get("links") or {}
    lost = len(failed_links(record))
    planned = links.get("planned", len(detail(record).get("pings") or []))
    ax.set_title(f"{word} ping matrix ({plan} plan): {planned - lost}/{planned} without loss", fontsize=12)
    legend_ax.set_axis_off()
    if not n:
        ax.text(0.5, 0.5, "no devices recorded", ha="center", va="center", transform=ax.transAxes)
        ax.set_axis_off()
        scale_ax.set_axis_off()
        return
    cells = ping_cells(record)
    rtts = [c["rtt_ms"] for c in cells.values() if c["ok"] and c.get("rtt_ms") is not None]
    lo, hi = (min(rtts), max(rtts)) if rtts else (0.0, 1.0)
    if hi <= lo:
        lo, hi = lo * 0.9, (hi * 1.1 if hi > 0 else 1.0)
    norm = Normalize(lo, hi)
    greens = colormaps["Greens"]
    cmap = LinearSegmentedColormap.from_list("rtt", [greens(x) for x in np.linspace(0.35, 0.95, 64)])
    _draw_cells(ax, cells, n, norm, cmap)
    _ticks(ax, record, n)
    ax.set_xlabel(f"destination node / {word}", fontsize=10)
    ax.set_ylabel(f"source node / {word}", fontsize=10)
    _shade_unreachable(ax, record, ax_keys)
    _mark_failed(ax, record, ax_keys, n)
    _legend(legend_ax, plan)
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=scale_ax, orientation="horizontal")
    bar.set_label("round-trip time (ms) of the pings without loss" if rtts else "round-trip time: no reply times recorded", fontsize=9)
    bar.ax.tick_params(labelsize=8)


def _draw_cells(ax, cells: dict, n: int, norm, cmap) -> None:
    """Each pinged pair's cell: its round trip's green, or the colour of its loss."""
    import numpy as np
    from matplotlib.colors import to_rgba

    img = np.empty((n, n, 4))
    img[:, :] = to_rgba(NOT_PINGED)
    bad, good = [], []
    for (a, b), c in cells.items():
        if c["ok"]:
            img[a, b] = cmap(norm(c["rtt_ms"])) if c.get("rtt_ms") is not None else cmap(0.5)
            good.append((a, b, img[a, b].copy()))
        else:
            img[a, b] = to_rgba(LOST if float(c.get("loss", 100.0)) >= 100.0 else PARTIAL)
            bad.append((a, b, img[a, b].copy()))
    ax.imshow(img, interpolation="nearest", aspect="equal", origin="upper")
    # above 128 x 128 a cell is under 5 pixels and a sampled plan's cells would vanish in the
    # resampling: every ping is drawn as a marker too, the lost ones bigger, on top
    if n > 128:
        for cells_, size in ((good, 3), (bad, 22)):
            if cells_:
                ax.scatter([b for _, b, _ in cells_], [a for a, _, _ in cells_], marker="s", s=size, c=[c for _, _, c in cells_],
                           linewidths=0, zorder=3)


def _shade_unreachable(ax, record: dict, ax_keys: list) -> None:
    """Unreachable nodes: their block's rows and columns shaded."""
    offset: dict[str, int] = {}
    for i, (h, d) in enumerate(ax_keys):
        offset.setdefault(h, i)
    for h in unreachable(record):
        if h in offset:
            k = devices(record)[h]
            ax.axhspan(offset[h] - 0.5, offset[h] + k - 0.5, color=LOST, alpha=0.12, lw=0)
            ax.axvspan(offset[h] - 0.5, offset[h] + k - 0.5, color=LOST, alpha=0.12, lw=0)


def _mark_failed(ax, record: dict, ax_keys: list, n: int) -> None:
    """Failed devices: their row and column shaded (at least ~4 pixels wide), named on the right (rows) and on top (columns)."""
    index = {k: i for i, k in enumerate(ax_keys)}
    failed = [f for f in failed_devices(record) if (f["host"], f["device"]) in index]
    half = max(0.5, n / 300)
    for f in failed:
        i = index[(f["host"], f["device"])]
        ax.axhspan(i - half, i + half, color=LOST, alpha=0.22, lw=0)
        ax.axvspan(i - half, i + half, color=LOST, alpha=0.22, lw=0)
        ax.add_patch(_cross_box(i, half))
    ax.set_xlim(-0.5, n - 0.5)
    ax.set_ylim(n - 0.5, -0.5)
    shown = failed[:EDGE_LABELS]
    if shown:
        right = ax.secondary_yaxis("right")
        right.set_yticks([index[(f["host"], f["device"])] for f in shown], [f"✗ {f['label']}" for f in shown])
        top = ax.secondary_xaxis("top")
        top.set_xticks([index[(f["host"], f["device"])] for f in shown], [f["label"] for f in shown], rotation=90)
        for sec in (right, top):
            sec.tick_params(colors=LOST, labelsize=8 if len(shown) > 8 else 10, length=4)
            for tl in sec.get_xticklabels() + sec.get_yticklabels():
                tl.set_fontweight("bold")


def _legend(legend_ax, plan: str) -> None:
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Patch

    handles = [Patch(color=LOST, label="lost (100% loss)"), Patch(color=PARTIAL, label="partial loss"),
               Patch(color=NOT_PINGED, label="not pinged (" + ("sampled plan" if plan == "sampled" else "not in the plan") + ")"),
               Patch(facecolor=to_rgba(LOST, 0.22), edgecolor=LOST, label="failed device: its row and column")]
    legend_ax.legend(handles=handles, loc="center", ncol=2, fontsize=9, frameon=False)


def _cross_box(i: int, half: float):
    from matplotlib.patches import Rectangle

    # the failed device's own diagonal cell, outlined: where its row and column cross
    return Rectangle((i - half, i - half), 2 * half, 2 * half, fill=False, edgecolor=LOST, lw=1.5)


def _busbw(ax, record: dict) -> None:
    ar = all_reduce(record) or {"rows": [], "floor": None}
    rows = ar["rows"]
    floor = ar.get("floor")
    perf = record.get("all_reduce") or {}
    state = "ok" if perf.get("ok") else "FAILED"
    ax.set_title(f"all_reduce_perf bus bandwidth per size: {state}", fontsize=12, color=OK_GREEN if perf.get("ok") else LOST)
    if not rows:
        said = "; ".join(perf.get("failures") or []) or "all_reduce_perf did not run"
        ax.text(0.5, 0.5, _wrap(said, 70), ha="center", va="center", transform=ax.transAxes, color=LOST, fontsize=11)
        ax.set_axis_off()
        return
    sizes = [r["size"] for r in rows]
    bw = [r["busbw"] for r in rows]
    ax.plot(sizes, bw, marker="o", ms=4, color="#1f77b4", lw=1.6, label="busbw (out of place)")
    if any(r.get("busbw_in_place") is not None for r in rows):
        ax.plot(sizes, [r.get("busbw_in_place") for r in rows], ls=":", color="#1f77b4", alpha=0.6, lw=1.2, label="busbw (in place)")
    ax.set_xscale("log", base=2)
    ticks = sizes[:: max(1, math.ceil(len(sizes) / 12))]
    if sizes[-1] not in ticks:
        ticks.append(sizes[-1])
    ax.set_xticks(ticks, [size_text(s) for s in ticks], rotation=30, ha="right", fontsize=9)
    ax.minorticks_off()
    ax.set_xlabel("message size (bytes)", fontsize=10)
    ax.set_ylabel("bus bandwidth (GB/s)", fontsize=10)
    ax.grid(True, alpha=0.3)
    top = max(bw + ([floor] if floor else []))
    ax.set_ylim(0, top * 1.15 if top > 0 else 1)
    last_ok = floor is None or bw[-1] >= floor
    if floor:
        ax.axhline(floor, color=LOST, ls="--", lw=1.5, label=f"floor {floor:g} GB/s (verify.nccl_min_busbw)")
        ax.axhspan(0, floor, color=LOST, alpha=0.06, lw=0)
    ax.scatter([sizes[-1]], [bw[-1]], s=90, zorder=5, color=OK_GREEN if last_ok else LOST, edgecolors="black",
               label=f"largest size {size_text(sizes[-1])}: {bw[-1]:g} GB/s ({'≥' if last_ok else '<'} floor)" if floor else
               f"largest size {size_text(sizes[-1])}: {bw[-1]:g} GB/s")
    ax.legend(loc="upper left", fontsize=9)


def _host_matrix(ax, record: dict) -> None:
    import numpy as np
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Patch

    names = list(devices(record)) or list(record.get("nodes") or {})
    pairs = host_pairs(record)
    hl = record.get("host_links") or {}
    planned = hl.get("planned", len(pairs))
    failed = len(hl.get("failed") or [p for p in pairs if not p.get("ok")])
    ax.set_title(f"host network (serving NIC): {planned - failed}/{planned} pairs pass", fontsize=11)
    n = len(names)
    if not n:
        ax.set_axis_off()
        return
    index = {h: i for i, h in enumerate(names)}
    img = np.empty((n, n, 4))
    img[:, :] = to_rgba(NOT_PINGED)
    colour = {"ok": OK_GREEN, "mtu": MTU_FAIL, "lost": LOST}
    texts = []
    for p in pairs:
        a, b = index.get(p["from"]), index.get(p["to"])
        if a is None or b is None:
            continue
        state = pair_state(p)
        img[a, b] = to_rgba(colour[state])
        texts.append((a, b, state, p.get("mtu")))
    ax.imshow(img, interpolation="nearest", aspect="equal")
    if n <= 12:
        for a, b, state, mtu in texts:
            t = f"{mtu}" if state == "ok" and mtu else ("MTU" if state == "mtu" else "✗" if state == "lost" else "")
            ax.text(b, a, t, ha="center", va="center", fontsize=7 if n > 6 else 9, color="white", fontweight="bold")
    step = max(1, math.ceil(n / 16))
    ticks = list(range(0, n, step))
    ax.set_xticks(ticks, [names[i] for i in ticks], rotation=45, ha="right", fontsize=8)
    ax.set_yticks(ticks, [names[i] for i in ticks], fontsize=8)
    down = unreachable(record)
    for tl in ax.get_xticklabels() + ax.get_yticklabels():
        if tl.get_text() in down:
            tl.set_color(LOST)
    ax.set_xlabel("to (serving IP)", fontsize=9)
    ax.set_ylabel("from (serving NIC)", fontsize=9)
    handles = [Patch(color=OK_GREEN, label="ping + full-MTU DF ok (MTU)"), Patch(color=MTU_FAIL, label="reply, full-MTU DF fails"),
               Patch(color=LOST, label="no reply")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8, frameon=False)


def _wrap(text: str, width: int) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or text


def _words(ax, record: dict) -> None:
    """The failures in words: devices, links, host pairs, all_reduce."""
    ax.set_axis_off()
    lines: list[tuple[str, str]] = []
    for h, why in unreachable(record).items():
        lines.append((f"{h}: unreachable ({why})", LOST))
    fd = failed_devices(record)
    if fd:
        lines.append((f"failed {device_word(record).upper()}s ({len(fd)}):", "black"))
        for f in fd[:8]:
            lines.append((f"  ✗ {f['label']}: {'; '.join(f['reasons'])}", LOST))
        if len(fd) > 8:
            lines.append((f"  (+{len(fd) - 8} more: the HTML page lists all)", "black"))
    fl = failed_links(record)
    if fl:
        lines.append((f"lost pings ({len(fl)}):", "black"))
        for p in fl[:5]:
            lines.append((f"  {link_name(record, p)}: {p.get('reason', '')}", LOST))
        if len(fl) > 5:
            lines.append((f"  (+{len(fl) - 5} more)", "black"))
    bad_pairs = [p for p in host_pairs(record) if not p.get("ok")]
    if bad_pairs:
        lines.append((f"host network pairs failing ({len(bad_pairs)}):", "black"))
        for p in bad_pairs[:4]:
            lines.append((f"  {p['from']} → {p['to']} {p.get('ip', '')}: {p.get('reason', '')}", LOST))
    perf = record.get("all_reduce")
    if perf is not None and not perf.get("ok"):
        for f in perf.get("failures") or []:
            lines.append((f"all_reduce_perf: {f}", LOST))
    if not lines:
        lines.append(("no failure: every check, ping and pair passed", OK_GREEN))
    wrapped = [(w, colour) for text, colour in lines for w in _wrap_lines(text, WORDS_WIDTH)]
    if len(wrapped) > WORDS_LINES:
        wrapped = wrapped[: WORDS_LINES - 1] + [("(more in the HTML page)", "black")]
    ax.set_title("what failed", fontsize=11, loc="left")
    for i, (text, colour) in enumerate(wrapped):
        ax.text(0.0, 1.0 - i * 0.048, text, transform=ax.transAxes, fontsize=9, family="monospace", color=colour, va="top")


# the words under the host network: characters a line (9 pt monospace in the right column), lines
WORDS_WIDTH, WORDS_LINES = 62, 21


def _wrap_lines(text: str, width: int) -> list[str]:
    import textwrap

    indent = " " * (len(text) - len(text.lstrip()) + 2)
    return textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=True) or [text]


# --- the HTML page ---------------------------------------------------------------------------------

CSS = """
body { font-family: "DejaVu Sans", Arial, sans-serif; margin: 1.5em; color: #222; background: #fff; }
header { padding: 0.6em 1em; border-radius: 6px; color: #fff; }
header.ok { background: #2ca02c; } header.failed { background: #d62728; }
header h1 { margin: 0 0 0.2em 0; font-size: 1.5em; } header p { margin: 0; }
h2 { font-size: 1.2em; margin-top: 1.4em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 0.4em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
td.ok { color: #1a7f1a; } td.bad, li.bad, .bad { color: #c01818; font-weight: bold; }
ul.failed-devices li { font-size: 1.1em; margin: 0.2em 0; }
img.picture { max-width: 100%; height: auto; border: 1px solid #ddd; }
.note { color: #666; font-size: 0.85em; }
code { font-family: "DejaVu Sans Mono", monospace; }
"""
PAGE_ROWS = 256


def _e(x) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def render_html(record: dict, png: bytes | None) -> str:
    """The page: verdict, failed devices by name, the picture (``png``,
    embedded; None: the page says it could not be drawn), the checks per
    node, the lost pings, the host network pairs, all_reduce_perf's table
    with its floor. Self-contained: no script, no external address."""
    ok = bool(record.get("ok"))
    d = detail(record)
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           f"<title>{_e(title(record))}</title>", f"<style>{CSS}</style></head><body>"]
    plan = record.get("plan")
    facts = [x for x in (record.get("time"), f"{record.get('duration_s')} s" if record.get("duration_s") is not None else None,
                         f"{plan} ping plan" if plan else None) if x]
    out.append(f'<header class="{"ok" if ok else "failed"}"><h1>{_e(title(record))}</h1><p>{_e(" · ".join(facts))}</p></header>')
    # the failed devices first: what a person looks for
    fd = failed_devices(record)
    down = unreachable(record)
    if fd or down:
        out.append('<section id="failed-devices"><h2>Failed devices</h2><ul class="failed-devices">')
        for h, why in down.items():
            out.append(f'<li class="bad"><span class="label">{_e(h)}</span>: unreachable ({_e(why)})</li>')
        for f in fd:
            out.append(f'<li class="bad"><span class="label">{_e(f["label"])}</span>: {_e("; ".join(f["reasons"]))}</li>')
        out.append("</ul></section>")
    out.append('<section id="picture"><h2>Picture</h2>')
    if png:
        alt = "verify-comm picture: " + ("failed devices " + ", ".join(f["label"] for f in fd[:EDGE_LABELS]) if fd else verdict(record))
        out.append(f'<img class="picture" width="{PNG_WIDTH}" height="{PNG_HEIGHT}" alt="{_e(alt)}" '
                   f'src="data:image/png;base64,{base64.b64encode(png).decode()}">')
    else:
        out.append('<p class="bad">the picture could not be drawn (matplotlib missing or failed); the tables below hold the same results</p>')
    out.append("</section>")
    out.append(_checks_table(record))
    if d.get("pings") is not None or record.get("links") is not None:
        out.append(_links_section(record))
    out.append(_hosts_section(record))
    if all_reduce(record) is not None:
        out.append(_all_reduce_section(record))
    rep = record.get("report") or {}
    saved = [f"{k}: {v}" for k, v in ((rep.get("node0") or {}).items()) if v]
    if saved:
        out.append(f'<p class="note">on node 0 — {_e("; ".join(saved))}</p>')
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def _checks_table(record: dict) -> str:
    nodes = record.get("nodes") or {}
    checks: list[str] = []
    for v in nodes.values():
        for k in v.get("checks") or {}:
            if k not in checks:
                checks.append(k)
    out = ['<section id="checks"><h2>Checks per node</h2><table><tr><th>node</th>' + "".join(f"<th>{_e(c)}</th>" for c in checks) + "</tr>"]
    for host, v in nodes.items():
        if not v.get("reachable"):
            out.append(f'<tr><td class="bad">{_e(host)}</td><td class="bad" colspan="{max(1, len(checks))}">{_e(v.get("error", "unreachable"))}</td></tr>')
            continue
        cells = []
        for k in checks:
            c = (v.get("checks") or {}).get(k)
            if c is None:
                cells.append("<td>-</td>")
            elif c.get("ok"):
                cells.append(f'<td class="ok">{_e(c.get("summary"))}</td>')
            else:
                fails = "<br>".join(_e(x) for x in c.get("failures") or [])
                cells.append(f'<td class="bad">{_e(c.get("summary"))}<br>{fails}</td>')
        out.append(f"<tr><td>{_e(host)}</td>{''.join(cells)}</tr>")
    out.append("</table></section>")
    return "\n".join(out)


def _links_section(record: dict) -> str:
    links = record.get("links") or {}
    fl = failed_links(record)
    planned = links.get("planned", len(detail(record).get("pings") or []))
    word = device_word(record).upper()
    out = [f'<section id="pings"><h2>{word} pings ({_e(record.get("plan") or "?")} plan): {planned - len(fl)}/{planned} without loss</h2>']
    pings = detail(record).get("pings") or []
    rtts = [p["rtt_ms"] for p in pings if p.get("ok") and p.get("rtt_ms") is not None]
    if rtts:
        out.append(f"<p>round-trip time of the pings without loss: min {min(rtts):g} ms, "
                   f"mean {sum(rtts) / len(rtts):.4g} ms, max {max(rtts):g} ms</p>")
    if fl:
        out.append("<table><tr><th>from</th><th>to</th><th>loss</th><th>reason</th></tr>")
        for p in fl[:PAGE_ROWS]:
            out.append(f'<tr><td class="bad">{_e(label(record, p["from"], int(p["npu"])))}</td>'
                       f'<td class="bad">{_e(label(record, p["to"], int(p["to_npu"])))}</td>'
                       f"<td>{_e(p.get('loss'))}%</td><td>{_e(p.get('reason'))}</td></tr>")
        out.append("</table>")
        if len(fl) > PAGE_ROWS:
            out.append(f'<p class="note">(+{len(fl) - PAGE_ROWS} more lost pings; the JSON lists all)</p>')
    out.append("</section>")
    return "\n".join(out)


def _hosts_section(record: dict) -> str:
    pairs = host_pairs(record)
    hl = record.get("host_links") or {}
    planned = hl.get("planned", len(pairs))
    bad = [p for p in pairs if not p.get("ok")]
    out = [f'<section id="host-network"><h2>Host network pairs (serving NIC: ping, then a full-MTU don\'t-fragment ping): '
           f"{planned - len(hl.get('failed') or bad)}/{planned} pass</h2>"]
    if not pairs:
        out.append("<p>no pairs (one node, or none reachable)</p></section>")
        return "\n".join(out)
    shown = pairs if len(pairs) <= PAGE_ROWS else bad[:PAGE_ROWS]
    if shown is not pairs:
        out.append(f'<p class="note">{len(pairs)} pairs: only the failing ones are listed</p>')
    out.append("<table><tr><th>from</th><th>NIC</th><th>to</th><th>IP</th><th>MTU</th><th>reply</th><th>full-MTU DF ping</th><th>result</th></tr>")
    for p in shown:
        good = p.get("ok")
        df = "ok" if p.get("full_mtu") else ("-" if p.get("full_mtu") is None else "fails")
        out.append(f"<tr><td>{_e(p.get('from'))}</td><td>{_e(p.get('nic'))}</td><td>{_e(p.get('to'))}</td><td>{_e(p.get('ip'))}</td>"
                   f"<td>{_e(p.get('mtu') if p.get('mtu') is not None else '?')}</td><td>{'yes' if p.get('reply') else 'no'}</td>"
                   f"<td>{df}</td><td class=\"{'ok' if good else 'bad'}\">{_e('ok' if good else p.get('reason'))}</td></tr>")
    out.append("</table></section>")
    return "\n".join(out)


def _all_reduce_section(record: dict) -> str:
    ar = all_reduce(record) or {}
    perf = record.get("all_reduce") or {}
    floor = ar.get("floor")
    rows = ar.get("rows") or []
    state = "ok" if perf.get("ok") else "FAILED"
    out = [f'<section id="all-reduce"><h2>all_reduce_perf: <span class="{"ok" if perf.get("ok") else "bad"}">{state}</span></h2>']
    floor_text = f"floor {floor:g} GB/s (verify.nccl_min_busbw), held against the largest size's busbw" if floor else "no floor (verify.nccl_min_busbw unset)"
    out.append(f"<p>busbw of the largest size: {_e(perf.get('max_busbw'))} GB/s; average over every size: {_e(perf.get('avg_busbw'))} GB/s; "
               f"{_e(floor_text)}; out of bounds values: {_e(perf.get('out_of_bounds'))}</p>")
    for f in perf.get("failures") or []:
        out.append(f'<p class="bad">{_e(f)}</p>')
    if rows:
        heads = ["size", "bytes", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "in-place busbw", "#wrong"]
        out.append("<table><tr>" + "".join(f"<th>{h}</th>" for h in heads) + "</tr>")
        for i, r in enumerate(rows):
            last = i == len(rows) - 1
            below = floor is not None and last and r["busbw"] < floor
            cls = ' class="bad"' if below else (' class="ok"' if last and floor is not None else "")
            out.append(f"<tr><td>{_e(size_text(r['size']))}</td><td>{r['size']}</td><td>{_e(r.get('time_us'))}</td><td>{_e(r.get('algbw'))}</td>"
                       f"<td{cls}>{_e(r['busbw'])}{' (&lt; floor)' if below else ''}</td><td>{_e(r.get('busbw_in_place'))}</td>"
                       f"<td>{_e(r.get('wrong'))}</td></tr>")
        out.append("</table>")
    out.append("</section>")
    return "\n".join(out)
