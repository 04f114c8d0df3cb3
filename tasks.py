"""Invoke entry points: parse flags, call llmdeploy.app, set the exit status.

`invoke --list` shows them; `invoke --help TASK` explains each flag.
"""

import functools
import sys

from invoke import Collection, Exit, task

from llmdeploy import app
from llmdeploy.errors import LlmdeployError


def _guard(fn):
    """Turn a LlmdeployError into its message on stderr and its exit status."""

    @functools.wraps(fn)
    def wrapper(c, *args, **kwargs):
        try:
            code = fn(c, *args, **kwargs)
        except LlmdeployError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise Exit(code=exc.exit_code)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            raise Exit(code=130)
        except BrokenPipeError:
            # the reader of our output went away (| head): nothing more to say
            sys.stderr.close()
            raise Exit(code=141)
        if code:
            raise Exit(code=code)

    return wrapper


@task(
    help={
        "cluster": "cluster name: a module in inventory/ (e.g. a3, sim-a3)",
        "json": "print the facts as JSON on stdout (people's output goes to stderr)",
        "limit": "only these nodes, comma-separated names",
    }
)
@_guard
def facts(c, cluster, json=False, limit=None):
    """Gather facts from every node (OS, CPUs/NUMA, memory, disk, NPUs/GPUs, NICs, engine)."""
    return app.facts(cluster, json_out=json, limit=limit)


@task(
    help={
        "cluster": "cluster name: a module in inventory/",
        "check": "change nothing; say what would change",
        "diff": "show the difference of every file it writes (or would write)",
        "limit": "only these nodes, comma-separated names",
        "json": "print the result as JSON on stdout",
        "no_check": "do not run the node acceptance tests (invoke check) at the end",
    }
)
@_guard
def prepare(c, cluster, check=False, diff=False, limit=None, json=False, no_check=False):
    """Make every node ready to serve: checks (NIC, model, budgets, NUMA), then image, wheels, environment file."""
    return app.prepare(cluster, check=check, diff=diff, limit=limit, json_out=json, run_checks=not no_check)


@task(
    name="check",
    help={
        "cluster": "cluster name: a module in inventory/",
        "limit": "only these nodes, comma-separated names",
        "select": "only tests matching this pytest -k expression",
    },
)
@_guard
def check_nodes(c, cluster, limit=None, select=None):
    """Node acceptance tests (tests/node, pytest-testinfra over the inventory's SSH settings)."""
    return app.check(cluster, limit=limit, select=select)


@task(
    help={
        "cluster": "cluster name: a module in inventory/",
        "check": "change nothing: print per node the exact container and serve commands it would run",
        "json": "print the plan (with --check) or the result as JSON on stdout",
        "skip_prepare": "do not run prepare first (the nodes must have been prepared)",
    }
)
@_guard
def deploy(c, cluster, check=False, json=False, skip_prepare=False):
    """Prepare, then start serving as a new release: node 0, then the headless workers; ready = health, models, chat."""
    return app.deploy(cluster, check=check, json_out=json, skip_prepare=skip_prepare)


@task(
    name="logs",
    help={
        "cluster": "cluster name: a module in inventory/",
        "host": "only these nodes, comma-separated names (one with --follow)",
        "follow": "keep printing new lines (needs one --host)",
        "since": "only lines since this: 10m, 2h, or 2026-12-02T10:00:00Z",
        "tail": "only the last N lines",
    },
)
@_guard
def serving_logs(c, cluster, host=None, follow=False, since=None, tail=None):
    """Serving logs of the cluster's containers, each line prefixed with its host."""
    return app.serving_logs(cluster, host=host, follow=follow, since=since, tail=tail)


@task(help={"cluster": "simulated cluster to bring up (an inventory named sim-*)"})
@_guard
def sim_up(c, cluster="sim-a3"):
    """Bring up a simulated cluster: a network namespace and a real sshd per node."""
    return app.sim_up(cluster)


@task(help={"cluster": "only this simulated cluster (default: every one that is up)"})
@_guard
def sim_down(c, cluster=None):
    """Remove simulated clusters: processes, namespaces, links and files."""
    return app.sim_down(cluster)


@task
@_guard
def sim_status(c):
    """List the simulated clusters that are up."""
    return app.sim_status()


@task(help={"cluster": "simulated cluster to run the demo on"})
@_guard
def demo(c, cluster="sim-a3"):
    """The main job on the built-in simulated cluster: bring it up, then prepare it (and check it)."""
    code = app.sim_up(cluster)
    return code or app.prepare(cluster)


sim = Collection("sim")
sim.add_task(sim_up, name="up")
sim.add_task(sim_down, name="down")
sim.add_task(sim_status, name="status")

ns = Collection(facts, prepare, check_nodes, deploy, serving_logs, demo, sim)
