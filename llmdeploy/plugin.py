"""What every plug-in axis shares (serving systems, hardware vendors, launchers): its
interface is a ``typing.Protocol``, and a plug-in package is checked against
it when it loads: every declared value present and of its type, every hook a
function with the Protocol's parameters (names and kinds), each problem named
with the package, the hook and what was expected.

Core: imports nothing above ``llmdeploy``.
"""

from __future__ import annotations

import inspect


def members(proto: type) -> tuple[list[str], list[str]]:
    """(values, hooks) a Protocol declares: its annotated names, its methods."""
    values = list(proto.__annotations__)
    hooks = [name for name, v in vars(proto).items() if inspect.isfunction(v) and not name.startswith("_")]
    return values, hooks


def _params(sig: inspect.Signature) -> list[tuple[str, str]]:
    return [(p.name, p.kind.description) for p in sig.parameters.values()]


def _shown(params: list[tuple[str, str]]) -> str:
    return "(" + ", ".join(name if kind == "positional or keyword" else f"{name} [{kind}]" for name, kind in params) + ")"


def signature_problem(pkg: str, proto: type, name: str, fn: object) -> str | None:
    """What is wrong with ``fn`` as the hook ``name`` of ``proto``, or None."""
    if not callable(fn):
        return f"{pkg}.{name} is a {type(fn).__name__}, expected a function {name}{_shown(_params(inspect.signature(getattr(proto, name)))[1:])}"
    want = _params(inspect.signature(getattr(proto, name)))[1:]  # without self
    try:
        have = _params(inspect.signature(fn))
    except (TypeError, ValueError):
        return f"{pkg}.{name}: its signature cannot be read, expected {name}{_shown(want)}"
    if have != want:
        return f"{pkg}.{name}{_shown(have)} does not match the interface: expected {name}{_shown(want)}"
    return None


def check(mod: object, proto: type, what: str) -> None:
    """A loaded plug-in module against its interface: TypeError naming what
    ``mod`` lacks of ``proto`` (``what``: the kind of plug-in, for the
    message), else each hook whose parameters differ from the interface's."""
    values, hooks = members(proto)
    name = getattr(mod, "__name__", repr(mod))
    missing = [a for a in (*values, *hooks) if not hasattr(mod, a)]
    if missing:
        raise TypeError(f"{name} is no {what}: it lacks {', '.join(missing)} ({proto.__module__}.{proto.__qualname__})")
    wrong = [p for p in (signature_problem(name, proto, h, getattr(mod, h)) for h in hooks) if p]
    if wrong:
        raise TypeError("; ".join(wrong))
