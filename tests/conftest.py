import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from xdist.scheduler import LoadScopeScheduling

from tests import forkserver

REPO = Path(__file__).resolve().parent.parent
INVOKE = [sys.executable, "-m", "invoke"]

# A suite started in the background of a non-interactive shell (`cmd &`,
# nohup) gets SIGINT and SIGQUIT ignored, and every process it starts would
# inherit that: Ctrl-C would not reach the tool in the tests that interrupt
# it, and a unit's command would start deaf to both. They are given back as
# a terminal gives them (each xdist worker imports this file too).
for _sig, _handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGQUIT, signal.SIG_DFL)):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, _handler)


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


# the tool's commands, forked from a process that imported it once
# (tests/forkserver.py: the same argv, environment, directory and streams as
# ``python -m invoke``; LLMDEPLOY_TEST_FORKSERVER=0 runs each as a fresh process)
FORKS = forkserver.Client(REPO, base_env=tool_env())


def run_invoke(*args, env=None, timeout=300):
    """Run an invoke task the way a user does; returns CompletedProcess (as
    ``subprocess.run(..., capture_output=True, text=True)``, TimeoutExpired
    past ``timeout``). ``env``: added to ``tool_env()`` (COLUMNS and LINES
    only when given here)."""
    return FORKS.run(INVOKE + list(args), env=tool_env(env), cwd=REPO, timeout=timeout)


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
    process table, and another cluster may be up beside this one
    (the suite runs two at a time), so a test never looks at
    every process on the machine."""
    from sim import netns
    from sim.paths import cluster_dir

    state = json.loads((cluster_dir(cluster) / "state.json").read_text())
    hosts = {**state.get("hosts", {}), **({state["login"]["name"]: state["login"]} if state.get("login") else {})}
    return {pid for name, host in hosts.items() if node in (None, name) for pid in netns.pids(host["netns"])}


# where the xdist workers leave {nodeid: cluster} for the controller's scheduler
GROUPS_ENV = "LLMDEPLOY_TEST_GROUPS"


def _cluster_of(item) -> str | None:
    """The simulated cluster a test brings up (its class's or module's
    SIM_CLUSTER), or None: a module may name a cluster for its simulated
    tests only (tests/reliability's loopback and property tests run anywhere)."""
    name = getattr(item.cls, "SIM_CLUSTER", None) or getattr(item.module, "SIM_CLUSTER", None)
    on_sim = {"sim_cluster", "sim_class_cluster"} & set(getattr(item, "fixturenames", ()))
    if name and (on_sim or REPO / "tests" / "integration" in Path(str(item.fspath)).resolve().parents):
        return name
    return None


def pytest_configure(config):
    config.add_cleanup(FORKS.close)  # the forkserver ends with the session (each xdist worker has its own)
    if getattr(config.option, "dist", "no") == "loadgroup" and not hasattr(config, "workerinput"):
        d = tempfile.mkdtemp(prefix="lds-test-groups-")
        os.environ[GROUPS_ENV] = d  # the workers start after this, with it
        config.add_cleanup(lambda: shutil.rmtree(d, ignore_errors=True))


def pytest_collection_modifyitems(config, items):
    """One group per simulated cluster (``scripts/test.sh`` runs the suite
    on two xdist workers, ``--dist loadgroup``): every test of a cluster, whichever
    module or class names it, runs on one worker, one after another, while
    the other worker runs another cluster's tests or the unit tests; two
    modules that bring up the same cluster never run at once. Each worker
    writes what it collected into the controller's directory, where
    ``ClusterScheduling`` reads it (xdist's own groups, ``xdist_group``
    marks, do not reach its scheduler under pytest 9: it rewrites
    ``item._nodeid``, which pytest 9 no longer reads)."""
    groups = {item.nodeid: c for item in items if (c := _cluster_of(item))}
    d = os.environ.get(GROUPS_ENV)
    if d and hasattr(config, "workerinput"):
        path = Path(d) / f"{config.workerinput['workerid']}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(path)


def pytest_xdist_make_scheduler(config, log):
    if getattr(config.option, "dist", "no") == "loadgroup":
        return ClusterScheduling(config, log)
    return None


class ClusterScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with a simulated cluster's tests as one scope
    (what the workers collected, ``pytest_collection_modifyitems``) and every
    other test a scope of its own. The scopes go out largest first (xdist's
    --loadscope-reorder): the clusters' long groups start at once, the unit
    tests fill in."""

    _groups: dict[str, str] | None = None

    def _split_scope(self, nodeid: str) -> str:
        if self._groups is None:
            d = Path(os.environ[GROUPS_ENV])
            found = [json.loads(f.read_text()) for f in sorted(d.glob("*.json"))]
            if not found:
                raise RuntimeError(f"no worker said which tests bring up which simulated cluster (nothing in {d})")
            if any(g != found[0] for g in found[1:]):
                raise RuntimeError("the xdist workers grouped the simulated clusters' tests differently")
            self._groups = found[0]
        group = self._groups.get(nodeid)
        return f"cluster {group}" if group else nodeid


@pytest.fixture
def short_tmp():
    """A fresh directory with a short path, removed afterwards: for Unix
    sockets (XDG_RUNTIME_DIR of the connection holders), whose path holds at
    most 107 bytes, which pytest's tmp_path under an xdist worker
    (.../popen-gw0/<test name>0/) leaves too little of."""
    d = Path(tempfile.mkdtemp(prefix="lds-", dir="/tmp"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def invoke():
    return run_invoke


# tests/node are the node acceptance tests that `invoke check` runs against a
# cluster's hosts; they are collected only then (LLMDEPLOY_NODE_TESTS names the cluster).
collect_ignore = [] if os.environ.get("LLMDEPLOY_NODE_TESTS") else ["node"]
