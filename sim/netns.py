"""Ending what runs in a network namespace (the simulated hosts, the image builder)."""

from __future__ import annotations

import os
import signal
import subprocess
import time


def pids(ns: str) -> list[int]:
    res = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
    return [int(p) for p in res.stdout.split() if p.isdigit()]


def kill(ns: str, grace: float = 3.0) -> None:
    """SIGTERM every process in ``ns``, SIGKILL what is left after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        found = pids(ns)
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace
        while time.monotonic() < end and pids(ns):
            time.sleep(0.05)
