"""What people and machines read: rich progress, tables, the recap, JSON."""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterable, Sequence

from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from .errors import SECRETS, mask  # noqa: F401 (mask: used as report.mask)
from .runner import CHANGED, FAILED, OK, SKIPPED, UNREACHABLE, HostResult

STATUS_STYLE = {OK: "green", CHANGED: "yellow", FAILED: "bold red", UNREACHABLE: "bold red", SKIPPED: "cyan"}


def console(json_mode: bool = False) -> Console:
    # With --json, stdout is for the document only: people's output goes to stderr.
    con = Console(stderr=json_mode, highlight=False, soft_wrap=False)
    if not con.is_terminal and not _columns_set():
        # logs and pipes without COLUMNS: wide enough that tables are not cut to 80 columns
        con = Console(stderr=json_mode, highlight=False, soft_wrap=False, width=200)
    return con


def _columns_set() -> bool:
    """Whether COLUMNS names a width (rich reads it: a pipe honours it too)."""
    return os.environ.get("COLUMNS", "").strip().isdigit() and int(os.environ["COLUMNS"]) > 0


def _say_failure(con: Console, step: str, host: str, result: HostResult | None) -> None:
    if result is not None and result.failed:
        con.print(f"[{STATUS_STYLE[result.status]}]{result.status}[/]: {host} ({step}): {escape(result.msg)}")


@contextmanager
def host_progress(con: Console, total_hosts: int, enabled: bool = True):
    """A progress bar per step; yields the callback the Runner calls.
    Failures are printed as they happen, with or without the bar."""
    if not enabled or not con.is_terminal:
        yield lambda step, host, result: _say_failure(con, step, host, result)
        return
    progress = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=con, transient=True
    )
    tasks: dict[str, int] = {}
    with progress:
        def cb(step: str, host: str, result: HostResult | None) -> None:
            if step not in tasks:
                tasks[step] = progress.add_task(step, total=total_hosts)
            if result is not None:
                progress.advance(tasks[step])
            _say_failure(progress.console, step, host, result)
        yield cb


def step_lines(con: Console, step: str, results: dict[str, HostResult], diff: bool = False) -> None:
    """Ansible-style: the step, then one line per host that failed or changed
    (with its diff when asked); hosts that were ok are counted on one line."""
    con.print(f"[bold]STEP {escape(f'[{step}]')}[/]")
    oks, skipped = [], {}
    for host, r in results.items():
        if r.status == OK:
            oks.append(host)
            continue
        if r.status == SKIPPED:
            skipped.setdefault(r.msg, []).append(host)
            continue
        con.print(f"  [{STATUS_STYLE[r.status]}]{r.status}[/]: {host}: {escape(r.msg)}")
        d = (r.data or {}).get("diff") if isinstance(r.data, dict) else None
        if diff and d:
            for line in d.splitlines():
                style = "green" if line.startswith("+") else "red" if line.startswith("-") else "dim"
                con.print(f"    [{style}]{escape(line)}[/]")
    for msg, hosts in skipped.items():
        con.print(f"  [cyan]skipped[/]: {', '.join(hosts)}: {escape(msg)}")
    if oks:
        sample = results[oks[0]].msg
        more = f" ({escape(sample)})" if sample and len({results[h].msg for h in oks}) == 1 else ""
        con.print(f"  [green]ok[/]: {len(oks)} host{'s' if len(oks) != 1 else ''}{more}")


def recap_table(recap: dict[str, dict[str, int]]) -> Table:
    t = Table(title="RECAP", title_justify="left", show_edge=False)
    t.add_column("host", no_wrap=True, min_width=max([4] + [len(h) for h in recap]))
    for s in (OK, CHANGED, FAILED, UNREACHABLE, SKIPPED):
        t.add_column(s, justify="right")
    for host, counts in recap.items():
        cells = []
        for s in (OK, CHANGED, FAILED, UNREACHABLE, SKIPPED):
            n = counts.get(s, 0)
            cells.append(f"[{STATUS_STYLE[s]}]{n}[/]" if n and s != OK else str(n))
        name = f"[bold red]{host}[/]" if counts.get(FAILED) or counts.get(UNREACHABLE) else host
        t.add_row(name, *cells)
    return t


@dataclass(frozen=True)
class Col:
    """A table column. ``whole``: its cells (host names, release ids) are never
    cut nor wrapped, and the column is never dropped. ``drop``: 0 never
    dropped; otherwise the order in which columns are dropped when the table
    does not fit the console (1 first)."""

    label: str
    whole: bool = False
    drop: int = 0
    justify: str = "left"


def _cells(rows: Iterable[Iterable[object]]) -> list[list[str]]:
    return [[str(x) if x is not None else "-" for x in r] for r in rows]


def _build(title: str, cols: Sequence[Col], rows: list[list[str]], shown: list[int], caption: str | None = None) -> Table:
    t = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    for i in shown:
        c = cols[i]
        widest = max([len(c.label)] + [Text.from_markup(r[i]).cell_len for r in rows if i < len(r)]) if c.whole else None
        t.add_column(c.label, justify=c.justify, no_wrap=c.whole, min_width=widest)
    for r in rows:
        t.add_row(*[r[i] if i < len(r) else "" for i in shown])
    return t


def table(title: str, columns: Iterable[str | Col], rows: Iterable[Iterable[object]], con: Console | None = None,
          wide: bool = False, hint: str = "--wide shows them", one_line: bool = False) -> Table:
    """A table; with ``con`` (and not ``wide``) one that fits its width: columns
    whose label and cells are all empty are left out, then the droppable ones
    in their order until the table fits (``one_line``: until no cell needs
    to wrap either); a caption names what was left out. Whole columns (host
    names, release ids) are never cut."""
    cols = [c if isinstance(c, Col) else Col(c) for c in columns]
    cells = _cells(rows)
    shown = [i for i, c in enumerate(cols) if c.label or any(i < len(r) and r[i].strip() for r in cells)]
    if con is None or wide:
        return _build(title, cols, cells, shown)
    order = sorted((c.drop, i) for i, c in enumerate(cols) if c.drop and i in shown)
    left_out: list[int] = []
    t = _build(title, cols, cells, shown)
    while order and (_need(con, t).minimum if not one_line else _need(con, t).maximum) > con.width:
        i = order.pop(0)[1]
        shown.remove(i)
        left_out.append(i)
        t = _build(title, cols, cells, shown)
    if left_out:
        names = ", ".join(cols[i].label for i in left_out)
        t = _build(title, cols, cells, shown, caption=f"left out at {con.width} columns: {names}" + (f" ({hint})" if hint else ""))
    _allot(con, t, [[r[i] if i < len(r) else "" for i in shown] for r in cells])
    return t


def fits(con: Console, t: Table) -> bool:
    """Whether ``t`` fits ``con`` without cutting a word."""
    return _need(con, t).minimum <= con.width


def natural_width(con: Console, t: Table) -> int:
    """The width ``t`` takes without wrapping a cell (whatever widths ``table`` gave its columns)."""
    widths = [c.width for c in t.columns]
    for c in t.columns:
        c.width = None
    try:
        return _need(con, t).maximum
    finally:
        for c, w in zip(t.columns, widths):
            c.width = w


def print_table(con: Console, t: Table, wide: bool = False) -> None:
    """``t`` on ``con``; ``wide``: at its full width, lines longer than the console's (not cut)."""
    if wide:
        t.width = max(con.width, _need(con, t).maximum)
        con.print(t, crop=False)
    else:
        con.print(t)


def _need(con: Console, t: Table) -> Measurement:
    """The table's true (minimum, maximum) width: rich measures within the console's width."""
    return con.measure(t, options=con.options.update_width(100_000))


def _allot(con: Console, t: Table, rows: list[list[str]]) -> None:
    """Fix the widths of a table wider than ``con`` so that no column is
    narrower than its longest word: rich would narrow the widest columns
    first, and could cut a word (an id inside a longer text) to fit."""
    need = _need(con, t)
    if need.maximum <= con.width or need.minimum > con.width:
        return
    lo, hi = [], []
    for j, col in enumerate(t.columns):
        ms = [Measurement.get(con, con.options, Text.from_markup(x)) for x in [str(col.header)] + [r[j] for r in rows]]
        lo.append(max([m.minimum for m in ms] + [col.min_width or 0]))
        hi.append(max(lo[j], max(m.maximum for m in ms)))
    widths = list(lo)
    spare = con.width - need.minimum
    for j in sorted(range(len(widths)), key=lambda j: hi[j] - lo[j]):  # the narrowest first: fewer cells wrap
        add = min(hi[j] - lo[j], spare)
        widths[j] += add
        spare -= add
    for col, w in zip(t.columns, widths):
        col.width = w


def emit_json(doc: dict) -> None:
    # one write: json.dump streams the text in small pieces (64 nodes' facts,
    # 1.1 MB: 0.19 s, against 0.06 s encoded at once)
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    sys.stdout.flush()


def mask_env(env: dict[str, str], secrets: list[str]) -> dict[str, str]:
    """``env`` with every value that is a secret shown as ***."""
    return {k: ("***" if v and (v in secrets or v in SECRETS) else v) for k, v in env.items()}


@contextmanager
def shielded():
    """Ignore SIGINT and SIGTERM while cleaning up after an interruption (the
    stop, the ledger line, the lock): a second Ctrl-C must not leave the
    cluster half-stopped with the lock held. Only in the main thread."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
