"""What every plug-in axis shares (serving systems, hardware vendors, launchers): its
interface is a ``typing.Protocol``, and a plug-in package is checked against
it when it loads: every declared value present and of its type, every hook a
function with the Protocol's parameters (names and kinds), each problem named
with the package, the hook and what was expected. One loader serves the three
axes (:class:`Registry`): a name's package is imported on first use, checked,
and kept.

Core: imports nothing above ``llmdeploy`` (a plug-in package is imported by
its name, which the axis's registry lists).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Generic, TypeVar

from .errors import LlmdeployError

T = TypeVar("T")


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


class Registry(Mapping[str, T], Generic[T]):
    """One plug-in axis: name -> what its package gives once loaded.

    ``packages()`` lists the names and the package under ``root`` each is
    (read at every use: the axis's registry module is the one place a
    plug-in is registered); listing them imports no plug-in. A name's
    package is imported when it is first asked for and given to ``accept``
    (the interface's check, ``check``, and the axis's own; it returns what
    the axis keeps: the module, or a record of it), then kept in ``loaded``.
    ``load(name)`` names the axis and the registered names when there is no such one."""

    def __init__(self, what: str, root: str, packages: Callable[[], Mapping[str, str]], accept: Callable[[ModuleType, str], T]):
        self.what = what
        self.root = root
        self.packages = packages
        self.accept = accept
        self.loaded: dict[str, T] = {}

    def __getitem__(self, name: str) -> T:
        got = self.loaded.get(name)
        if got is not None:
            return got
        package = self.packages()[name]  # KeyError: no such name
        got = self.accept(importlib.import_module(f"{self.root}.{package}"), name)
        self.loaded[name] = got
        return got

    def __iter__(self) -> Iterator[str]:
        return iter(self.packages())

    def __len__(self) -> int:
        return len(self.packages())

    def load(self, name: str) -> T:
        """The plug-in ``name``; LlmdeployError when the axis has none of that name."""
        if name not in self.packages():
            raise LlmdeployError(f"no {self.what} {name!r} (registered: {', '.join(self.packages())})")
        return self[name]
