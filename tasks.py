"""Invoke entry points: parse flags, load the cluster, call its flow, set
the exit status. The simulator's tasks call ``sim`` themselves: no flow
imports it.

`invoke --list` shows them; `invoke --help TASK` explains each flag.
"""

import functools
import importlib
import inspect
import sys

from invoke import Collection, Exit, task

from llmdeploy.errors import LlmdeployError, mask

# the help of the flags that several tasks take, said once (a task's own
# help for one of them, given to ``command``, says more)
SHARED_HELP = {
    "cluster": "cluster name: a module in inventory/ (e.g. a3, sim-a3)",
    "limit": "only these nodes, comma-separated names",
    "message": "a note kept with the deploy lock and in the audit log",
    "lock_wait": "wait up to this many seconds for the deploy lock (default: fail at once)",
    "wide": "every column, even wider than the terminal (by default the table fits it: host names and release ids whole, "
            "the less important columns left out)",
}


def _flow(name: str):
    """The flow module ``flows.<name>``, imported when its task runs: ``invoke
    --list`` and ``--help`` load none, and a task only the flows it calls."""
    return importlib.import_module(f"flows.{name}")


def _inventory(name: str):
    """The inventory ``inventory/<name>.py``, loaded and validated (the simulator's tasks need no binding)."""
    from llmdeploy.inventory import load_cluster

    return load_cluster(name)


def deployment(name: str):
    """The inventory ``inventory/<name>.py`` bound to its plug-ins (``flows.binding``), once for the command."""
    from flows.binding import load

    return load(name)


def _console(json_out: bool):
    from llmdeploy import report

    return report.console(json_out)


def _cluster_given(sig: inspect.Signature, c, args, kwargs) -> None:
    """A task whose ``cluster`` has no default needs --cluster: Invoke runs
    it without one, with None (a flag's parameter is never positional)."""
    if sig.bind_partial(c, *args, **kwargs).arguments.get("cluster") is None:
        from llmdeploy.inventory import list_clusters

        raise LlmdeployError(f"--cluster is required (one of: {', '.join(list_clusters())})")


def _guard(fn=None, *, counting: bool = True):
    """Turn a LlmdeployError into its message on stderr and its exit status;
    a task whose ``cluster`` parameter has no default refuses to run without
    --cluster, naming the inventories. ``counting=False``: Ctrl-C and SIGTERM
    raise where the task is (the simulator's tasks: no deploy lock, no look
    at the flag in their waits)."""
    if fn is None:
        return functools.partial(_guard, counting=counting)
    sig = inspect.signature(fn)
    cluster = sig.parameters.get("cluster")
    needs_cluster = cluster is not None and cluster.default is inspect.Parameter.empty
    # every other flag without a default is required too (Invoke would pass None)
    required = [n for n, p in list(sig.parameters.items())[1:] if n != "cluster" and p.default is inspect.Parameter.empty]

    @functools.wraps(fn)
    def wrapper(c, *args, **kwargs):
        from llmdeploy import interrupt

        # Ctrl-C and SIGTERM are only counted; the command raises the
        # interrupt where it holds no lock (llmdeploy/interrupt.py), and a
        # terminated run unwinds like Ctrl-C: locks released, state recorded
        interrupt.install(counting)
        try:
            if needs_cluster:
                _cluster_given(sig, c, args, kwargs)
            given = sig.bind_partial(c, *args, **kwargs).arguments
            for name in required:
                if given.get(name) is None:
                    raise LlmdeployError(f"--{name.rstrip('_').replace('_', '-')} is required")
            code = fn(c, *args, **kwargs)
        except LlmdeployError as exc:
            print(f"error: {mask(str(exc))}", file=sys.stderr)
            raise Exit(code=exc.exit_code)
        except KeyboardInterrupt:
            print(f"interrupted ({interrupt.signal_name()})", file=sys.stderr)
            raise Exit(code=130)
        except BrokenPipeError:
            # the reader of our output went away (| head): nothing more to say
            sys.stderr.close()
            raise Exit(code=141)
        finally:
            interrupt.uninstall()
        if code:
            raise Exit(code=code)

    return wrapper


def command(*, name: str | None = None, auto_shortflags: bool = True, counting: bool = True, **own_help: str):
    """A task (flags only, no positional arguments) run through ``_guard``:
    each flag's help is the task's own (``own_help``) or ``SHARED_HELP``'s.
    A help for a flag the task does not take is a mistake, raised at import."""

    def decorate(fn):
        flags = list(inspect.signature(fn).parameters)[1:]
        stray = sorted(set(own_help) - set(flags))
        if stray:
            raise TypeError(f"{fn.__name__}: help for flags it does not take: {', '.join(stray)}")
        helps = {f: own_help.get(f, SHARED_HELP.get(f)) for f in flags if f in own_help or f in SHARED_HELP}
        return task(positional=[], name=name, auto_shortflags=auto_shortflags, help=helps)(_guard(fn, counting=counting))

    return decorate


@command(
    json="print the facts as JSON on stdout (people's output goes to stderr)",
    wide="every column, even wider than the terminal (by default the table fits it: host names whole, the less important columns left out)",
)
def facts(c, cluster, json=False, limit=None, wide=False):
    """Gather facts from every node (OS, CPUs/NUMA, memory, disk, NPUs/GPUs, NICs, engine)."""
    return _flow("app").facts(cluster, json_out=json, limit=limit, wide=wide)


@command(
    auto_shortflags=False,
    check="change nothing; say what would change",
    diff="show the difference of every file it writes (or would write)",
    json="print the result as JSON on stdout",
    no_check="do not run the node acceptance tests (invoke check) at the end",
)
def prepare(c, cluster, check=False, diff=False, limit=None, json=False, no_check=False, message=None, lock_wait=0):
    """Make every node ready to serve (under the deploy lock): checks (NIC, model, budgets, NUMA), then image, wheels, environment file."""
    return _flow("app").prepare(cluster, check=check, diff=diff, limit=limit, json_out=json, run_checks=not no_check, message=message,
                       lock_wait=float(lock_wait))


@command(name="check", select="only tests matching this pytest -k expression")
def check_nodes(c, cluster, limit=None, select=None):
    """Node acceptance tests (tests/node, pytest-testinfra over the inventory's SSH settings, or through the cluster's launcher)."""
    return _flow("app").check(cluster, limit=limit, select=select)


@command(
    auto_shortflags=False,
    check="change nothing: print per node the exact container and serve commands (and rendered files) it would run",
    json="print the plan (with --check) or the result as JSON on stdout",
    skip_prepare="do not run prepare first (the nodes must have been prepared)",
    force="deploy even though the last verify-comm failed or is too old (and say so)",
    no_rollback="if the new release fails, leave the failed state for debugging (default: bring back the last good release)",
    no_gate="skip the quality gate (the smoke benchmark against the last good release); the ledger records that it was skipped",
)
def deploy(c, cluster, check=False, json=False, skip_prepare=False, force=False, message=None, lock_wait=0, no_rollback=False, no_gate=False):
    """Prepare, then start serving as a new release in the system's order (playbooks/serve-*.yaml); ready = health, models, chat, then the quality gate."""
    return _flow("app").deploy(cluster, check=check, json_out=json, skip_prepare=skip_prepare, force=force, message=message,
                      lock_wait=float(lock_wait), rollback_on_failure=not no_rollback, gate=not no_gate)


@command(
    name="logs",
    auto_shortflags=False,
    host="only these nodes, comma-separated names (one with --follow)",
    follow="keep printing new lines (needs one --host)",
    since="only lines since this: 10m, 2h, or 2026-12-02T10:00:00Z",
    tail="only the last N lines",
    service="only this service's containers (e.g. decode0 of a Dynamo release; default: every one on each node)",
)
def serving_logs(c, cluster, host=None, follow=False, since=None, tail=None, service=None):
    """Serving logs of every container of the cluster on each node, in start order; each line prefixed with its host (and service)."""
    return _flow("serving_logs").serving_logs(deployment(cluster), host=host, follow=follow, since=since, tail=tail, service=service)


@command(
    auto_shortflags=False,
    from_="the node that has the model (default: model.stage_from, else node 0), or 'source' for the stage.source host",
    check="move nothing: print the plan (source, chain order, bytes per node, expected time at stage.link_mbit)",
    json="print the plan (with --check) or the result as JSON on stdout",
)
def stage(c, cluster, from_=None, check=False, json=False, message=None, lock_wait=0):
    """Copy the model (and tokenizer) to every node's model.path: one pipelined broadcast over the data network, resumable, every file's sha256 verified."""
    return _flow("stage").stage(cluster, frm=from_, check=check, json_out=json, message=message, lock_wait=float(lock_wait))


@command(
    name="verify-comm",
    json="print the report as JSON on stdout",
    full="Ascend: ping the full NPU matrix even on large clusters",
    report="the local folder for the run's HTML report and PNG picture (default: logs/<cluster>/verify-comm); "
                  "node 0 keeps them beside its record",
)
def verify_comm(c, cluster, json=False, full=False, report=None):
    """Is multi-node communication healthy? Ascend hccn_tool checks and NPU pings; NVIDIA IB/NIC and all_reduce_perf; host network pings.
    Each run also draws the result as an HTML page and a PNG (the NPU ping matrix, host pairs, all_reduce busbw), saved locally and on node 0."""
    return _flow("app").verify_comm(cluster, json_out=json, full=full, report_dir=report)


@command(
    json="print the releases as JSON",
    events="after the table, per release its gate verdict and figures, its last benchmark and every event, one a line",
)
def releases(c, cluster, json=False, events=False, wide=False):
    """The release ledger from node 0: every attempt of every release, was it ever good, the gate's verdict, current, the rollback target."""
    return _flow("releases").releases(deployment(cluster), _console(json), json, events=events, wide=wide)


@command(
    to="the release to bring back (default: the one good most recently that is neither running nor failing now)",
    json="print the result as JSON",
    gate="run the quality gate on the release brought back (it keeps serving if it fails; the exit status says so)",
)
def rollback(c, cluster, to=None, json=False, message=None, lock_wait=0, gate=False):
    """Bring back a good release from its own files on every node, in the same order, under the deploy lock."""
    return _flow("lifecycle").rollback(deployment(cluster), _console(json), to, message, float(lock_wait), json, gate)


@command(
    auto_shortflags=False,
    concurrency="requests in flight at once, one level per value, comma-separated (default 1,4)",
    requests="requests per concurrency level (default 32)",
    input_tokens="prompt length in words of the synthetic prompts (default 128)",
    output_tokens="tokens each answer streams (max_tokens with ignore_eos; default 128)",
    prompts="a file of prompts, one per line or JSON lines with a \"prompt\" field, sent in turn",
    duration="no request starts after this many seconds of a level (default 300)",
    direct="send straight to the endpoint instead of through node 0's SSH connection",
    json="print the figures as JSON on stdout",
)
def bench(c, cluster, concurrency="1,4", requests=32, input_tokens=128, output_tokens=128, prompts=None, duration="300", direct=False, json=False):
    """A bounded streaming load on the current release: TTFT, TPOT, end-to-end p50/p90/p99, tokens/s; kept with the release."""
    from flows import bench as bench_flow

    load = bench_flow.load_from_flags(concurrency, requests, input_tokens, output_tokens, prompts, duration)
    return bench_flow.bench(deployment(cluster), _console(json), load, json, direct)


@command(
    interval="seconds between refreshes (default 2)",
    once="one snapshot, printed, then exit (1 if a node is unreachable)",
    json="with --once: the snapshot as JSON on stdout",
)
def top(c, cluster, interval="2", once=False, json=False):
    """A live view of the serving cluster: per node its units, uptime, restarts, accelerator use; the server's requests and tokens/s (q quits)."""
    from flows import top as top_flow

    try:
        secs = float(interval)
    except ValueError:
        raise LlmdeployError(f"--interval {interval!r}: not a number of seconds") from None
    return top_flow.top(deployment(cluster), _console(json), secs, once, json)


@command(
    diff="compare what runs with the current release's record and name every drift",
    json="print as JSON",
)
def status(c, cluster, diff=False, json=False, wide=False):
    """Per node: the current release's containers, start rank or MPI ranks, image, uptime; and the endpoint's /health (exit 1 unless serving)."""
    return _flow("status").status(deployment(cluster), _console(json), diff, json, wide=wide)


@command()
def stop(c, cluster, message=None, lock_wait=0):
    """Stop serving in reverse start order (vLLM: workers, then node 0), logs kept; then the current release's clean-up (stale /dev/shm/moe_* files)."""
    return _flow("lifecycle").stop(deployment(cluster), _console(False), message, float(lock_wait))


@command(
    auto_shortflags=False,
    host="only this node's containers (a vLLM worker; for an MPI world, the whole world); default: the whole current release in order",
    service="only this service of the release (e.g. decode0 of a Dynamo release; an MPI group is restarted whole)",
)
def restart(c, cluster, host=None, service=None, message=None, lock_wait=0):
    """Restart the current release (or one node's or one service's part of it) from its own files; wait until healthy."""
    return _flow("lifecycle").restart(deployment(cluster), _console(False), host, message, float(lock_wait), service)


@command(last="only the last N lines", json="print as JSON")
def audit(c, cluster, last=None, json=False):
    """The audit log on node 0: prepares, deploys, rollbacks, stops, restarts, lock breaks."""
    return _flow("releases").audit_log(deployment(cluster), _console(json), int(last) if last else None, json)


@command()
def disconnect(c, cluster):
    """End the SSH connections kept open for the cluster (ssh.persist_s): the next command connects and checks host keys anew."""
    return _flow("app").disconnect(cluster)


@command(name="status")
def lock_status(c, cluster):
    """Who holds the deploy lock, since when, running what (exit 1 while held)."""
    return _flow("releases").lock_status(deployment(cluster), _console(False))


@command(name="break", reason="why the holder is gone (kept in the audit log)")
def lock_break(c, cluster, reason=None):
    """Remove a deploy lock whose holder vanished; the break and its reason are audited."""
    return _flow("releases").lock_break(deployment(cluster), _console(False), reason or "")


@command(counting=False, cluster="simulated cluster to bring up (an inventory named sim-*)")
def sim_up(c, cluster="sim-a3"):
    """Bring up a simulated cluster: a network namespace, a real sshd and a real dockerd per node (sim-*-slurm: with munged and slurmd, and slurmctld on a login host)."""
    return _sim_up(cluster)


def _sim_up(name: str) -> int:
    from sim import cluster as simc

    cl = _inventory(name)
    if not cl.name.startswith("sim-"):
        raise LlmdeployError(f"{cl.name} is not a simulated cluster (its name must start with sim-)")
    simc.up(cl)
    return 0


@command(counting=False, cluster="only this simulated cluster (default: every one that is up)")
def sim_down(c, cluster=None):
    """Remove simulated clusters: processes, namespaces, links and files."""
    from sim import cluster as simc

    names = [cluster] if cluster else simc.running()
    if not names:
        print("sim: nothing is up")
    for name in names:
        simc.down(name)
    return 0


@command(counting=False, cluster="a simulated cluster that is up", mbit="each host's link speed in Mbit/s (0: unshaped)")
def sim_shape(c, cluster, mbit):
    """Give a simulated cluster's hosts and its registry physical links: tc token buckets on both ends of every veth."""
    from sim import cluster as simc

    try:
        rate = float(mbit)
    except ValueError:
        rate = -1.0
    if not rate >= 0:
        raise LlmdeployError(f"--mbit {mbit}: a speed is 0 (unshaped) or more")
    simc.shape(_inventory(cluster), rate or None)
    return 0


@command(counting=False)
def sim_status(c):
    """List the simulated clusters that are up."""
    from sim import cluster as simc

    names = simc.running()
    print("\n".join(names) if names else "sim: nothing is up")
    return 0


@command(cluster="simulated cluster to run the demo on")
def demo(c, cluster="sim-a3"):
    """The main job on the simulated cluster: sim.up, prepare, verify-comm, deploy, the model's answer, status."""
    from flows import demo as demo_flow
    from llmdeploy import interrupt

    def up() -> int:
        with interrupt.native():  # the simulator's waits do not look at the Ctrl-C flag
            return _sim_up(cluster)

    return demo_flow.demo(cluster, up, f"invoke sim.down --cluster {cluster}")


sim = Collection("sim")
sim.add_task(sim_up, name="up")
sim.add_task(sim_down, name="down")
sim.add_task(sim_status, name="status")
sim.add_task(sim_shape, name="shape")

lock_ns = Collection("lock")
lock_ns.add_task(lock_status, name="status")
lock_ns.add_task(lock_break, name="break")

ns = Collection(facts, prepare, check_nodes, stage, verify_comm, deploy, bench, top, serving_logs, releases, rollback, status, stop, restart, audit, disconnect, demo, sim, lock_ns)
