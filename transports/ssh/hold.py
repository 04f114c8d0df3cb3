"""``python -m transports.ssh.hold``: a connection holder started as a process
of its own (transports/ssh/mux.py; the runner's SSH session forks one instead
when it can). Reads the cluster as JSON on stdin."""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from pathlib import Path

from transports.ssh.session import holders_runner
from transports.ssh.mux import hold


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m transports.ssh.hold", description="hold a cluster's SSH connections (started by the runner)")
    ap.add_argument("--socket", required=True, type=Path)
    ap.add_argument("--idle", required=True, type=float)
    ap.add_argument("--profile-module", default=None, help="the module of the cluster's profile class (it registers the kind)")
    a = ap.parse_args(argv)
    if a.profile_module:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", a.profile_module):
            print(f"transports.ssh.hold: --profile-module {a.profile_module!r} is not a module name", file=sys.stderr)
            return 2
        importlib.import_module(a.profile_module)
    return hold(sys.stdin.read(), a.socket, a.idle, holders_runner)


if __name__ == "__main__":
    sys.exit(main())
