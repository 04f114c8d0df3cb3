"""Invoke entry points: parse flags, call flows.app, set the exit status.

`invoke --list` shows them; `invoke --help TASK` explains each flag.
"""

import functools
import signal
import sys

from invoke import Collection, Exit, task

from flows import app
from llmdeploy.errors import LlmdeployError
from llmdeploy.report import mask

LOCK_HELP = {
    "message": "a note kept with the deploy lock and in the audit log",
    "lock_wait": "wait up to this many seconds for the deploy lock (default: fail at once)",
}


def _sigterm(signum, frame):
    # a terminated run unwinds like Ctrl-C: locks released, state recorded
    raise KeyboardInterrupt


def _guard(fn):
    """Turn a LlmdeployError into its message on stderr and its exit status."""

    @functools.wraps(fn)
    def wrapper(c, *args, **kwargs):
        signal.signal(signal.SIGTERM, _sigterm)
        try:
            code = fn(c, *args, **kwargs)
        except LlmdeployError as exc:
            print(f"error: {mask(str(exc))}", file=sys.stderr)
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
    positional=[],
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
    positional=[],
    auto_shortflags=False,
    help={
        "cluster": "cluster name: a module in inventory/",
        "check": "change nothing; say what would change",
        "diff": "show the difference of every file it writes (or would write)",
        "limit": "only these nodes, comma-separated names",
        "json": "print the result as JSON on stdout",
        "no_check": "do not run the node acceptance tests (invoke check) at the end",
        **LOCK_HELP,
    }
)
@_guard
def prepare(c, cluster, check=False, diff=False, limit=None, json=False, no_check=False, message=None, lock_wait=0):
    """Make every node ready to serve (under the deploy lock): checks (NIC, model, budgets, NUMA), then image, wheels, environment file."""
    return app.prepare(cluster, check=check, diff=diff, limit=limit, json_out=json, run_checks=not no_check, message=message,
                       lock_wait=float(lock_wait))


@task(
    positional=[],
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
    positional=[],
    auto_shortflags=False,
    help={
        "cluster": "cluster name: a module in inventory/",
        "check": "change nothing: print per node the exact container and serve commands (and rendered files) it would run",
        "json": "print the plan (with --check) or the result as JSON on stdout",
        "skip_prepare": "do not run prepare first (the nodes must have been prepared)",
        "force": "deploy even though the last verify-comm failed or is too old (and say so)",
        "no_rollback": "if the new release fails, leave the failed state for debugging (default: bring back the last good release)",
        **LOCK_HELP,
    }
)
@_guard
def deploy(c, cluster, check=False, json=False, skip_prepare=False, force=False, message=None, lock_wait=0, no_rollback=False):
    """Prepare, then start serving as a new release in the system's order (playbooks/serve-*.yaml); ready = health, models, chat."""
    return app.deploy(cluster, check=check, json_out=json, skip_prepare=skip_prepare, force=force, message=message,
                      lock_wait=float(lock_wait), rollback_on_failure=not no_rollback)


@task(auto_shortflags=False, 
    positional=[],
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


@task(
    positional=[],
    name="verify-comm",
    help={
        "cluster": "cluster name: a module in inventory/",
        "json": "print the report as JSON on stdout",
        "full": "Ascend: ping the full NPU matrix even on large clusters",
    },
)
@_guard
def verify_comm(c, cluster, json=False, full=False):
    """Is multi-node communication healthy? Ascend hccn_tool checks and NPU pings; NVIDIA IB/NIC and all_reduce_perf; host network pings."""
    return app.verify_comm(cluster, json_out=json, full=full)


@task(positional=[], help={"cluster": "cluster name", "json": "print the releases as JSON"})
@_guard
def releases(c, cluster, json=False):
    """The release ledger from node 0: every attempt of every release, was it ever good, current, the rollback target."""
    return app.ops_call("releases", cluster, json_out=json)


@task(
    positional=[],
    help={
        "cluster": "cluster name",
        "to": "the release to bring back (default: the one good most recently that is neither running nor failing now)",
        "json": "print the result as JSON",
        **LOCK_HELP,
    }
)
@_guard
def rollback(c, cluster, to=None, json=False, message=None, lock_wait=0):
    """Bring back a good release from its own files on every node, in the same order, under the deploy lock."""
    return app.ops_call("rollback", cluster, json_out=json, to=to, message=message, lock_wait=float(lock_wait))


@task(positional=[], help={"cluster": "cluster name", "diff": "compare what runs with the current release's record and name every drift", "json": "print as JSON"})
@_guard
def status(c, cluster, diff=False, json=False):
    """Per node: the current release's containers, start rank or MPI ranks, image, uptime; and the endpoint's /health (exit 1 unless serving)."""
    return app.ops_call("status", cluster, json_out=json, diff=diff)


@task(positional=[], help={"cluster": "cluster name", **LOCK_HELP})
@_guard
def stop(c, cluster, message=None, lock_wait=0):
    """Stop serving in reverse start order (vLLM: workers, then node 0), logs kept; remove stale /dev/shm/moe_* files."""
    return app.ops_call("stop", cluster, message=message, lock_wait=float(lock_wait))


@task(auto_shortflags=False, positional=[], help={
    "cluster": "cluster name",
    "host": "only this node's containers (a vLLM worker; for an MPI world, the whole world); default: the whole current release in order",
    "service": "only this service of the release (e.g. decode0 of a Dynamo release; an MPI group is restarted whole)",
    **LOCK_HELP,
})
@_guard
def restart(c, cluster, host=None, service=None, message=None, lock_wait=0):
    """Restart the current release (or one node's or one service's part of it) from its own files; wait until healthy."""
    return app.ops_call("restart", cluster, host=host, service=service, message=message, lock_wait=float(lock_wait))


@task(positional=[], help={"cluster": "cluster name", "last": "only the last N lines", "json": "print as JSON"})
@_guard
def audit(c, cluster, last=None, json=False):
    """The audit log on node 0: prepares, deploys, rollbacks, stops, restarts, lock breaks."""
    return app.ops_call("audit", cluster, json_out=json, last=int(last) if last else None)


@task(positional=[], help={"cluster": "cluster name"})
@_guard
def disconnect(c, cluster):
    """End the SSH connections kept open for the cluster (ssh.persist_s): the next command connects and checks host keys anew."""
    return app.disconnect(cluster)


@task(positional=[], name="status", help={"cluster": "cluster name"})
@_guard
def lock_status(c, cluster):
    """Who holds the deploy lock, since when, running what (exit 1 while held)."""
    return app.ops_call("lock.status", cluster)


@task(positional=[], name="break", help={"cluster": "cluster name", "reason": "why the holder is gone (kept in the audit log)"})
@_guard
def lock_break(c, cluster, reason=None):
    """Remove a deploy lock whose holder vanished; the break and its reason are audited."""
    return app.ops_call("lock.break", cluster, reason=reason)


@task(positional=[], help={"cluster": "simulated cluster to bring up (an inventory named sim-*)"})
@_guard
def sim_up(c, cluster="sim-a3"):
    """Bring up a simulated cluster: a network namespace, a real sshd and a real dockerd per node."""
    return app.sim_up(cluster)


@task(positional=[], help={"cluster": "only this simulated cluster (default: every one that is up)"})
@_guard
def sim_down(c, cluster=None):
    """Remove simulated clusters: processes, namespaces, links and files."""
    return app.sim_down(cluster)


@task(positional=[])
@_guard
def sim_status(c):
    """List the simulated clusters that are up."""
    return app.sim_status()


@task(positional=[], help={"cluster": "simulated cluster to run the demo on"})
@_guard
def demo(c, cluster="sim-a3"):
    """The main job on the simulated cluster: sim.up, prepare, verify-comm, deploy, the model's answer, status."""
    return app.demo(cluster)


sim = Collection("sim")
sim.add_task(sim_up, name="up")
sim.add_task(sim_down, name="down")
sim.add_task(sim_status, name="status")

lock_ns = Collection("lock")
lock_ns.add_task(lock_status, name="status")
lock_ns.add_task(lock_break, name="break")

ns = Collection(facts, prepare, check_nodes, verify_comm, deploy, serving_logs, releases, rollback, status, stop, restart, audit, disconnect, demo, sim, lock_ns)
