"""Roles: one package each; a role is a few steps, each a pure command builder
plus the parser of what it reads back. Helpers shared by the roles live here."""

from __future__ import annotations

import math
import re
import shlex
from collections import Counter
from pathlib import Path
from functools import cache
from typing import Any, Callable, Hashable

from llmdeploy.inventory import Node
from llmdeploy.runner import FAILED, PROGRESS_MARK, SKIPPED, HostResult, Progress

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"


@cache
def _environment(extra: tuple[tuple[str, Callable], ...] = ()):
    """A Jinja2 environment over templates/ with ``| q`` (shlex.quote) and the
    ``extra`` filters; one per set of filters, made when first rendered with
    (jinja2 is imported then, not when the tool starts)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["q"] = shlex.quote
    env.filters.update(dict(extra))
    return env


def render(template: str, **values) -> str:
    """``templates/<template>`` rendered with ``values`` (``| q``: shlex.quote)."""
    return _environment().get_template(template).render(**values)


def renderer(**filters: Callable) -> Callable[..., str]:
    """``render`` for templates that use filters of their own (e.g. a system's
    YAML scalars): the filters live in a private environment, never in the
    one every other template renders through."""
    extra = tuple(sorted(filters.items()))

    def render_with(template: str, **values) -> str:
        return _environment(extra).get_template(template).render(**values)

    return render_with


def node_facts(ctx, node: Node) -> dict | None:
    """The facts the ``facts`` step read on ``node`` (None if it did not get them)."""
    f = ctx.data("facts", node.name)
    return f if f and f.get("hostname") else None


def from_facts(fn: Callable[[Node, dict], HostResult], ctx) -> Callable[[Node], HostResult]:
    """A local step body that needs the node's facts."""

    def body(node: Node) -> HostResult:
        f = node_facts(ctx, node)
        if f is None:
            return HostResult(node.name, SKIPPED, msg="no facts from this node")
        return fn(node, f)

    return body


def majority(values: dict[str, Hashable], order: list[str]) -> tuple[Any, list[str]]:
    """The value most hosts have (ties: the one of the host first in ``order``,
    node 0 first), and the hosts that have another value."""
    if not values:
        return None, []
    counts = Counter(values.values())
    best = max(counts.values())
    ref = next(values[h] for h in order if h in values and counts[values[h]] == best)
    return ref, [h for h in order if h in values and values[h] != ref]


def fail_odd_ones(
    results: dict[str, HostResult], key: Callable[[HostResult], Hashable | None], describe: Callable[[str, Any, Any, list[str]], str]
) -> None:
    """Cross-host agreement: hosts whose ``key`` differs from the majority fail
    with ``describe(host, their value, majority value, hosts with the majority)``."""
    order = list(results)
    values = {h: key(r) for h, r in results.items() if not r.failed and r.status != SKIPPED and key(r) is not None}
    ref, odd = majority(values, order)
    agreeing = [h for h in order if h in values and values[h] == ref]
    for h in odd:
        r = results[h]
        r.status, r.msg = FAILED, describe(h, values[h], ref, agreeing)


def hosts_text(hosts: list[str], limit: int = 4) -> str:
    return ", ".join(hosts[:limit]) + (f" and {len(hosts) - limit} more" if len(hosts) > limit else "")


def in_one_piece(script: str) -> str:
    """``script``, its standard output sent when it ends, in one piece (for
    scripts that print many small pieces: the facts script, the ping lanes).
    Each write of a script goes out as an SSH packet of its own, which the
    tool decrypts and hands over one at a time: the ~50 writes of an A2
    node's facts (13 KB) took 50 reads and ~15 ms of the tool's CPU per host,
    against 2 reads and 2.4 ms in one piece. Text only (a shell variable
    holds it, trailing newlines as one); the exit status is the script's; a
    script cut short by its deadline shows no partial output."""
    return (
        f"__llmdeploy_out=$(\n{script.rstrip()}\n)\n__llmdeploy_rc=$?\n"
        '[ -z "$__llmdeploy_out" ] || printf \'%s\\n\' "$__llmdeploy_out"\n'
        "exit $__llmdeploy_rc\n"
    )


# -- progress lines: how far a long command got, printed while it runs ----------------------
# They go to stderr, or to the descriptor the facts script keeps for them (its
# sections send stderr to stdout, which it sends in one piece at the end).
PROGRESS_FD_VAR = "__llmdeploy_progress_fd"
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,15}")
_COUNT = re.compile(r'(?:\$[A-Za-z_][A-Za-z0-9_]*|\$\{[A-Za-z_][A-Za-z0-9_]*\}|[0-9]+|-)')


def progress_echo(done: str, total: str, unit: str, label: str) -> str:
    """Shell: one progress line (``PROGRESS_MARK done total unit label``) on
    stderr (or the facts script's descriptor for them, ``keep_progress_fd``).
    ``done``/``total``: a number or one shell variable (``$d``; ``total`` may
    be ``-``: not known); ``unit``: a word ("B": bytes); ``label``: text that
    may name shell variables (printed inside double quotes: a variable's value
    is never run or split)."""
    for value, what in ((done, "done"), (total, "total")):
        if not _COUNT.fullmatch(value):
            raise ValueError(f"progress {what} must be a number, a variable or -: {value!r}")
    if not _WORD.fullmatch(unit):
        raise ValueError(f"progress unit must be a word: {unit!r}")
    if any(c in label for c in '"`\\\n') or "$(" in label:
        raise ValueError(f"progress label may name variables, nothing else: {label!r}")
    # printf, not echo: dash's echo reads backslashes in a file's name as escapes
    return f'printf \'%s\\n\' "{PROGRESS_MARK} {done} {total} {unit} {label}" >&"${{{PROGRESS_FD_VAR}:-2}}"'


def keep_progress_fd() -> str:
    """Shell, first in a script whose parts send stderr to stdout (the facts
    script): descriptor 3 is the command's stderr, for progress lines."""
    return f"exec 3>&2; {PROGRESS_FD_VAR}=3\n"


def progress_line(line: str) -> Progress | None:
    """A progress line's (done, total or None, unit, label); None for any
    other line, or one that does not read (a number that is not one)."""
    if not line.startswith(PROGRESS_MARK + " "):
        return None
    parts = line[len(PROGRESS_MARK) + 1 :].strip().split(" ", 3)
    if len(parts) < 3 or not _WORD.fullmatch(parts[2]):
        return None
    try:
        done = float(parts[0])
        total = None if parts[1] == "-" else float(parts[1])
    except ValueError:
        return None
    if not math.isfinite(done) or done < 0 or (total is not None and (not math.isfinite(total) or total < 0)):
        return None
    label = parts[3].strip() if len(parts) > 3 else ""
    return done, total, parts[2], label[:48] + ("..." if len(label) > 48 else "")
