"""``python -m llmdeploy.hold``: a connection holder started as a process of
its own (llmdeploy/mux.py; the runner forks one instead when it can). Reads
the cluster as JSON on stdin."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .mux import hold
from .runner import Runner


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llmdeploy.hold", description="hold a cluster's SSH connections (started by the runner)")
    ap.add_argument("--socket", required=True, type=Path)
    ap.add_argument("--idle", required=True, type=float)
    a = ap.parse_args(argv)
    return hold(sys.stdin.read(), a.socket, a.idle, lambda c: Runner(c, persist=False, reconnect_idle=True))


if __name__ == "__main__":
    sys.exit(main())
