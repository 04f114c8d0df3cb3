import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
INVOKE = [sys.executable, "-m", "invoke"]


def run_invoke(*args, env=None, timeout=300):
    """Run an invoke task the way a user does; returns CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        INVOKE + list(args), cwd=REPO, capture_output=True, text=True, env=full_env, timeout=timeout, stdin=subprocess.DEVNULL
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
