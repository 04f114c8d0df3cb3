"""Ctrl-C and SIGTERM, taken only where no lock is held.

Python's own SIGINT handler raises ``KeyboardInterrupt`` in the main thread
at whatever bytecode it has reached. When that is right after a lock's
``acquire`` returned and before the ``try`` that releases it, the lock stays
held: logging's module lock in ``logging.getLogger`` (which paramiko's
``Channel()`` and ``Transport()`` call), ``ThreadPoolExecutor.submit``'s
shutdown lock, a future's condition in ``concurrent.futures.wait``. The
cleanup after the interrupt (the stop, the ledger line, the lock's release)
then waits for that lock forever, and the deploy lock stays held.

So the handlers :func:`install` puts in only count the signal: they print
nothing, take no lock and set no ``threading.Event`` (whose Condition the
main thread may hold). The command raises :class:`Interrupted` (a
``KeyboardInterrupt``) itself, at points where it holds no lock:

- :func:`check`, in the main thread: between steps, in every wait taken in
  short slices (:func:`sleep`, :func:`wait`, :func:`join`);
- :func:`Command.check`, in any thread: between reads of a channel, for a
  command started before the interrupt (one started during the cleanup is
  never cut).

Once raised, the command is unwinding: the cleanup runs under
:func:`cleanup` and a further signal is only counted. Each cleanup action
runs with a deadline (:func:`bounded`), and its failure is reported beside
the interruption, never instead of it: the exit stays 130.

The runner's ``abandon`` (a connection given up when a ``KeyboardInterrupt``
from elsewhere lands inside paramiko) stays as a second line of defence.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from concurrent.futures import Future
from concurrent.futures import wait as _futures_wait
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, TypeVar, cast

T = TypeVar("T")

SLICE_S = 0.2  # how long a wait blocks between two looks at the flag
# the deadline of each last line after an interruption (the ledger's, the
# audit log's) and of the deploy lock's release: node 0 answers these in well
# under a second; one that does not must not keep the operator's prompt
LAST_LINE_S = 20.0


class Interrupted(KeyboardInterrupt):
    """Raised by this module at a point where no lock is held."""


class _State:
    """Plain attributes: a signal handler may set them (no lock, no Event)."""

    def __init__(self) -> None:
        self.received = 0  # signals counted while the command ran normally
        self.signum = 0
        self.shield = 0  # depth of shield(): no interrupt is raised inside
        self.unwinding = False  # an interrupt was raised: the command is on its way out
        self.installed = False
        self.before: dict[int, Any] = {}  # the handlers install() replaced


_S = _State()


def _handler(signum: int, frame: Any) -> None:
    # only counts (see the module's docstring); while it unwinds or is shielded, not even that
    if not (_S.unwinding or _S.shield):
        _S.received += 1
        _S.signum = signum


def reset() -> None:
    """Forget every signal counted (a new command in this process)."""
    _S.received = _S.signum = 0
    _S.shield = 0
    _S.unwinding = False


def install(counting: bool = True) -> None:
    """SIGINT and SIGTERM only counted from now on (main thread only; a no-op
    elsewhere). ``counting=False``: both raise ``KeyboardInterrupt`` where
    the main thread is (a SIGTERM unwinds like Ctrl-C), for a command that
    has no looks at the flag and holds no deploy lock (the simulator's).

    A signal this process was started with ignored stays ignored, as Python
    itself leaves it: a shell starts a background job (``cmd &``) with SIGINT
    ignored, so that a Ctrl-C meant for the foreground does not end it."""
    if threading.current_thread() is not threading.main_thread():
        return
    reset()
    _S.before = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue
        _S.before[sig] = signal.signal(sig, _handler if counting else _raise)
    _S.installed = counting


def uninstall() -> None:
    """The handlers :func:`install` found (Python's own: SIGINT raises, SIGTERM ends the process)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig, h in _S.before.items():
        signal.signal(sig, h if h is not None else signal.SIG_DFL)
    _S.before = {}
    _S.installed = False


def _raise(signum: int, frame: Any) -> None:
    _S.signum = signum
    raise KeyboardInterrupt(signal.Signals(signum).name)


@contextmanager
def native() -> Iterator[None]:
    """Python's way inside (SIGINT and SIGTERM raise ``KeyboardInterrupt``
    wherever the main thread is): for code that holds no lock of this tool's
    and waits on its own terms, e.g. Invoke's runner following a log until
    Ctrl-C, which catches the interrupt in its wait loop. A signal counted
    before is raised first."""
    check()
    if threading.current_thread() is not threading.main_thread() or not _S.installed:
        yield
        return
    old = {sig: signal.signal(sig, _raise) for sig in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)


def unwinding() -> bool:
    return _S.unwinding


def signal_name() -> str:
    return signal.Signals(_S.signum).name if _S.signum else "SIGINT"


def check() -> None:
    """Raise :class:`Interrupted` when a signal came and none was raised yet,
    outside a shield. Main thread only: elsewhere it does nothing (a worker
    thread's command is cut by :meth:`Command.check`)."""
    if _S.received and not _S.unwinding and not _S.shield and threading.current_thread() is threading.main_thread():
        _S.unwinding = True
        raise Interrupted(signal_name())


class Command:
    """One remote command's view of the flag, taken when it starts: one
    started while the command ran normally is cut at its next read after a
    signal; one started in a shield or during the cleanup never is."""

    __slots__ = ("cuttable",)

    def __init__(self) -> None:
        self.cuttable = not (_S.unwinding or _S.shield)

    def check(self) -> None:
        if self.cuttable and _S.received:
            if threading.current_thread() is threading.main_thread():
                _S.unwinding = True  # raised to the command itself (a worker's reaches it through its future)
            raise Interrupted(signal_name())


def slices(end: float | None, look: Callable[[], None] = check) -> Iterator[float]:
    """The waits until ``end`` (a ``time.monotonic()``; None: no end), each
    at most SLICE_S, with a look at the flag (``look``: :func:`check`, or a
    command's :meth:`Command.check`) before each: every sliced wait of the
    tool is a loop over these."""
    while True:
        look()
        left = SLICE_S if end is None else min(SLICE_S, end - time.monotonic())
        if left <= 0:
            return
        yield left


def sleep(seconds: float) -> None:
    """``time.sleep`` in slices, raising at the first look after a signal."""
    for left in slices(time.monotonic() + max(0.0, seconds)):
        time.sleep(left)


def wait(futures: Iterable[Future[T]], timeout: float | None) -> tuple[set[Future[T]], set[Future[T]]]:
    """``concurrent.futures.wait`` (every future) in slices, raising at the first look after a signal."""
    pending_fs = set(futures)
    done: set[Future[T]] = set()
    for left in slices(None if timeout is None else time.monotonic() + timeout):
        if not pending_fs:
            break
        got, pending_fs = _futures_wait(pending_fs, timeout=left)
        done |= got
    check()  # a worker's command cut by the signal ended its future: raised here, not by its result()
    return done, pending_fs


def join(thread: threading.Thread, timeout: float | None = None) -> bool:
    """``thread.join`` in slices; whether it ended."""
    for left in slices(None if timeout is None else time.monotonic() + timeout):
        if not thread.is_alive():
            break
        thread.join(left)
    check()
    return not thread.is_alive()


@contextmanager
def shield() -> Iterator[None]:
    """No interrupt is raised inside; a signal that comes is raised at the
    first check after it (a short action that must end whole: the lock's
    release). When Python's handlers are in place (a flow called without
    :func:`install`), the shield puts the counting ones in for its length."""
    main = threading.current_thread() is threading.main_thread()
    old = None
    if main and not _S.installed:
        old = {sig: signal.signal(sig, _handler) for sig in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(sig) is not signal.SIG_IGN}
    _S.shield += 1
    try:
        yield
    finally:
        _S.shield -= 1
        if old is not None:
            for sig, h in old.items():
                signal.signal(sig, h)


@contextmanager
def cleanup() -> Iterator[None]:
    """The cleanup after an interruption: a shield, and the command unwinds
    (no further interrupt is raised, a further signal is only counted)."""
    _S.unwinding = True
    with shield():
        yield


def bounded(what: str, seconds: float, fn: Callable[[], T]) -> T | None:
    """``fn()`` on a thread of its own, waited for at most ``seconds``: a
    cleanup action that can neither hang the command nor replace its
    interruption. A failure or an overrun is said on stderr (``what`` names
    the action) and None returned; the thread that overran is left to end on
    its own (a daemon)."""
    got: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            got.append((True, fn()))
        except BaseException as exc:  # reported below, never raised here
            got.append((False, exc))

    t = threading.Thread(target=run, name=f"llmdeploy-cleanup-{what[:20]}", daemon=True)
    t.start()
    t.join(seconds)
    if not got:
        print(f"warning: {what} did not finish within {seconds:g}s; left behind", file=sys.stderr, flush=True)
        return None
    ok, value = got[0]
    if not ok:
        from .errors import mask

        print(f"warning: {what} failed: {mask(f'{type(value).__name__}: {value}')}", file=sys.stderr, flush=True)
        return None
    return cast(T, value)  # ok: fn()'s own result
