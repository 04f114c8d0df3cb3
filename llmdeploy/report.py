"""What people and machines read: rich progress, tables, the recap, JSON."""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from typing import Iterable

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from .errors import SECRETS, mask  # noqa: F401 (mask: used as report.mask)
from .runner import CHANGED, FAILED, OK, SKIPPED, UNREACHABLE, HostResult

STATUS_STYLE = {OK: "green", CHANGED: "yellow", FAILED: "bold red", UNREACHABLE: "bold red", SKIPPED: "cyan"}


def console(json_mode: bool = False) -> Console:
    # With --json, stdout is for the document only: people's output goes to stderr.
    con = Console(stderr=json_mode, highlight=False, soft_wrap=False)
    if not con.is_terminal:
        # logs and pipes: wide enough that tables are not cut to 80 columns
        con = Console(stderr=json_mode, highlight=False, soft_wrap=False, width=200)
    return con


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
    t.add_column("host")
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


def table(title: str, columns: Iterable[str], rows: Iterable[Iterable[str]]) -> Table:
    t = Table(title=title, title_justify="left")
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*[str(x) if x is not None else "-" for x in r])
    return t


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
