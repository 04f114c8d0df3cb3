import json
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


def sim_pids(cluster: str, node: str | None = None) -> set[int]:
    """The pids of every process in the simulated ``cluster``'s hosts (its login
    host too), or in ``node`` only: those in their network namespaces, as the
    cluster's state records them. The simulated hosts share this machine's
    process table, and another cluster may be up beside this one (the suite
    runs two at a time), so a test never looks at every process on the machine."""
    from sim.paths import cluster_dir

    state = json.loads((cluster_dir(cluster) / "state.json").read_text())
    hosts = {**state.get("hosts", {}), **({state["login"]["name"]: state["login"]} if state.get("login") else {})}
    pids: set[int] = set()
    for name, host in hosts.items():
        if node in (None, name):
            out = subprocess.run(["ip", "netns", "pids", host["netns"]], capture_output=True, text=True).stdout
            pids |= {int(p) for p in out.split()}
    return pids


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """One pytest-xdist group per simulated cluster (scripts/test.sh runs the
    suite with ``--dist loadgroup``): every test of a cluster, whichever module
    or class names it in SIM_CLUSTER, runs on one worker, one after another,
    while another worker runs another cluster's tests or the unit tests. Two
    modules that bring up the same cluster can never run at once. First of
    the hooks: xdist reads the groups in its own (``item.nodeid@group``)."""
    integration = REPO / "tests" / "integration"
    for item in items:
        name = getattr(item.cls, "SIM_CLUSTER", None) or getattr(item.module, "SIM_CLUSTER", None)
        # a module may name a cluster for its simulated tests only (tests/reliability's
        # loopback and property tests run anywhere, beside the rest)
        on_sim = {"sim_cluster", "sim_class_cluster"} & set(getattr(item, "fixturenames", ()))
        if name and (on_sim or integration in Path(str(item.fspath)).resolve().parents):
            item.add_marker(pytest.mark.xdist_group(name=name))


def pytest_collection_finish(session):
    """Under ``--dist loadgroup``, a test of a simulated cluster that xdist
    did not group would run beside another of the same cluster: stop here."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    loose = [item.nodeid for item in session.items
             if any(m.name == "xdist_group" for m in item.iter_markers()) and "@" not in item.nodeid]
    if loose:
        raise pytest.UsageError(f"tests of a simulated cluster left out of their xdist group: {', '.join(loose[:3])}")


@pytest.fixture
def invoke():
    return run_invoke


# tests/node are the node acceptance tests that `invoke check` runs against a
# cluster's hosts; they are collected only then (LLMDEPLOY_NODE_TESTS names the cluster).
collect_ignore = [] if os.environ.get("LLMDEPLOY_NODE_TESTS") else ["node"]
