import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
INVOKE = [sys.executable, "-m", "invoke"]


# A terminal's size: the tool reads COLUMNS even in a pipe (its tables fit
# the width it names), so an output read by a test must not depend on
# whatever environment runs the suite.
TERMINAL_SIZE = ("COLUMNS", "LINES")


def tool_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment to run the tool in as a subprocess: this process's,
    without COLUMNS and LINES (a pipe then gets the tool's 200-column
    default), and ``extra`` on top; a test that wants a width sets COLUMNS
    in ``extra``. Every test that runs the tool and reads its output uses it."""
    env = {k: v for k, v in os.environ.items() if k not in TERMINAL_SIZE}
    env.update(extra or {})
    return env


def run_invoke(*args, env=None, timeout=300):
    """Run an invoke task the way a user does; returns CompletedProcess.
    ``env``: added to ``tool_env()`` (COLUMNS and LINES only when given here)."""
    return subprocess.run(
        INVOKE + list(args), cwd=REPO, capture_output=True, text=True, env=tool_env(env), timeout=timeout, stdin=subprocess.DEVNULL
    )


def sim_possible() -> str | None:
    if os.geteuid() != 0:
        return "the simulated cluster needs root"
    if not Path("/usr/sbin/sshd").exists():
        return "sshd is missing (run scripts/setup.sh)"
    return None


@pytest.fixture
def invoke():
    return run_invoke


# tests/node are the node acceptance tests that `invoke check` runs against a
# cluster's hosts; they are collected only then (LLMDEPLOY_NODE_TESTS names the cluster).
collect_ignore = [] if os.environ.get("LLMDEPLOY_NODE_TESTS") else ["node"]
