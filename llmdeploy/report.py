"""What people and machines read: rich progress, tables, the recap, JSON."""

from __future__ import annotations

import json
import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from rich.console import Console, JustifyMethod
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TaskID, TextColumn
from rich.table import Column, Table
from rich.text import Text

from .errors import SECRETS, mask  # noqa: F401 (mask: used as report.mask)
from .runner import CHANGED, FAILED, OK, SKIPPED, UNREACHABLE, HostResult
from .runner import Progress as Reading

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


# -- progress: on a terminal only, gone when it ends (transient) -----------------------------
# One board (a rich Progress) for every kind of row: a step (hosts done of
# hosts), a host's long command (bytes or things done of a total, rate, ETA:
# what the step's progress parser read from its output), a wait (seconds of
# a deadline, and the last answer).
_BYTES = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"]
HOSTS, SECONDS, BYTES = "hosts", "s", "B"


def clock(seconds: float) -> str:
    m, s = divmod(int(max(0, seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}"


def _size(n: float, scale: tuple[int, str]) -> str:
    unit, _ = scale
    return f"{n / unit:,.{0 if unit == 1 else 1}f}"


def amount_text(done: float, total: float | None, unit: str) -> str:
    """How much is done, of what total, in binary units for bytes:
    "1.5/40.0 GiB", "3/7 layers", "12 wheels", "35s/900s"."""
    if unit == BYTES:
        from rich.filesize import pick_unit_and_suffix

        scale = pick_unit_and_suffix(int(max(total or 0, done, 1)), _BYTES, 1024)
        return (f"{_size(done, scale)}/{_size(total, scale)}" if total is not None else _size(done, scale)) + f" {scale[1]}"
    if unit == SECONDS:
        return f"{done:.0f}s/{total:.0f}s" if total is not None else f"{done:.0f}s"
    shown = f"{int(done)}/{int(total)}" if total is not None else f"{int(done)}"
    return f"{shown} {unit}".rstrip()


def rate_text(speed: float | None, unit: str) -> str:
    """"12.5 MiB/s", "0.4 layers/s"; "" when not known (or not a rate: hosts, seconds)."""
    if speed is None or unit in (HOSTS, SECONDS, ""):
        return ""
    if unit == BYTES:
        from rich.filesize import pick_unit_and_suffix

        scale = pick_unit_and_suffix(int(max(speed, 1)), _BYTES, 1024)
        return f"{_size(speed, scale)} {scale[1]}/s"
    return f"{speed:.1f} {unit}/s"


class _Amount(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(amount_text(task.completed, task.total, task.fields.get("unit", "")), style="progress.download")


class _Rate(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(rate_text(task.speed, task.fields.get("unit", "")), style="progress.data.speed")


class _Time(ProgressColumn):
    """ETA where a total and a rate are known, else the time so far (a
    wait's row says its seconds already)."""

    max_refresh = 0.5

    def render(self, task: Task) -> Text:
        if task.fields.get("unit") == SECONDS:
            return Text("")
        left = task.time_remaining if task.fields.get("unit") not in (HOSTS, SECONDS) and task.total else None
        if left is not None:
            return Text(f"ETA {clock(left)}", style="progress.remaining")
        return Text(clock(task.elapsed or 0), style="progress.elapsed")


class _Note(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(task.fields.get("note", ""), style="dim", no_wrap=True, overflow="ellipsis")


def _board(con: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}", table_column=Column(no_wrap=True, overflow="ellipsis", max_width=40)),
        BarColumn(bar_width=20),
        _Amount(),
        _Rate(),
        _Time(),
        _Note(table_column=Column(no_wrap=True, overflow="ellipsis")),
        console=con,
        transient=True,
    )


class HostProgress:
    """What :func:`host_progress` yields. Called by the Runner at each
    host's start of a step (``result`` None) and with its result (once the
    step has ended on every host): failures are printed then, bar or no bar.
    ``line`` (None when nothing is shown): a host's progress in a step, a row
    of its own until its result."""

    def __init__(self, con: Console, total_hosts: int, board: Progress | None):
        self.con, self.total, self.board = con, total_hosts, board
        self.steps: dict[str, TaskID] = {}
        self.rows: dict[tuple[str, str], TaskID] = {}
        self.ended: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.line: Callable[[str, str, Reading], None] | None = self._line if board is not None else None

    def __call__(self, step: str, host: str, result: HostResult | None) -> None:
        board = self.board
        if board is None:
            _say_failure(self.con, step, host, result)
            return
        with self._lock:
            if step not in self.steps:
                self.steps[step] = board.add_task(f"[bold]{escape(step)}[/]", total=self.total, unit=HOSTS)
            if result is not None:
                board.advance(self.steps[step])
                self.ended.add((step, host))
                row = self.rows.pop((step, host), None)
                if row is not None:
                    board.remove_task(row)
            else:
                self.ended.discard((step, host))
        _say_failure(board.console, step, host, result)

    def _line(self, step: str, host: str, reading: Reading) -> None:
        done, total, unit, label = reading
        desc = f"  {escape(host)} {escape(label)}"
        board = self.board
        assert board is not None  # self.line is this method only when there is a board
        with self._lock:
            key = (step, host)
            if key in self.ended:  # a line after the host's result (a step past its deadline)
                return
            row = self.rows.get(key)
            if row is None:
                self.rows[key] = board.add_task(desc, total=total, completed=done, unit=unit)  # type: ignore[arg-type]  # rich says int, its Task keeps a float
            else:
                board.update(row, description=desc, total=total, completed=done, unit=unit)


@contextmanager
def host_progress(con: Console, total_hosts: int, enabled: bool = True) -> Iterator[HostProgress]:
    """A progress bar per step, and a row per host that says how far its long
    command got (see :class:`HostProgress`); yields the callback the Runner
    calls. Only on a terminal (and when ``enabled``): elsewhere failures are
    printed as they happen and nothing else."""
    if not enabled or not con.is_terminal:
        yield HostProgress(con, total_hosts, None)
        return
    board = _board(con)
    with board:
        yield HostProgress(con, total_hosts, board)


@contextmanager
def waiting(con: Console, what: str, limit_s: float, enabled: bool = True) -> Iterator[Callable[[float, str], None]]:
    """One row while something is awaited: the seconds so far of ``limit_s``
    and the last answer. Yields ``update(elapsed_s, note)``; on a terminal
    only (and when ``enabled``), else it shows nothing."""
    if not enabled or not con.is_terminal:
        def nothing(elapsed: float, note: str = "") -> None:
            return None

        yield nothing
        return
    board = _board(con)
    with board:
        row = board.add_task(escape(what), total=limit_s, unit=SECONDS, note="")

        def update(elapsed: float, note: str = "") -> None:
            board.update(row, completed=min(max(0.0, elapsed), limit_s), note=note)

        yield update


def step_lines(con: Console, step: str, results: dict[str, HostResult], diff: bool = False) -> None:
    """Ansible-style: the step, then one line per host that failed or changed
    (with its diff when asked); hosts that were ok are counted on one line."""
    con.print(f"[bold]STEP {escape(f'[{step}]')}[/]")
    oks: list[str] = []
    skipped: dict[str, list[str]] = {}
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
    justify: JustifyMethod = "left"


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


def emit_json(doc: dict[str, Any]) -> None:
    # one write: json.dump streams the text in small pieces (64 nodes' facts,
    # 1.1 MB: 0.19 s, against 0.06 s encoded at once)
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    sys.stdout.flush()


def mask_env(env: dict[str, str], secrets: list[str]) -> dict[str, str]:
    """``env`` with every value that is a secret shown as ***."""
    return {k: ("***" if v and (v in secrets or v in SECRETS) else v) for k, v in env.items()}


@contextmanager
def shielded() -> Iterator[None]:
    """The cleanup after an interruption (the stop, the ledger line, the
    lock): a further Ctrl-C or SIGTERM is only counted, never raised, so it
    cannot leave the cluster half-stopped with the lock held
    (llmdeploy/interrupt.py; each action there has a deadline of its own)."""
    from . import interrupt

    with interrupt.cleanup():
        yield
