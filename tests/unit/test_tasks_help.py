"""Every task answers -h and --help with its help (no flag takes them as a value)."""

import contextlib
import io

from invoke import Program

from tasks import ns
from tests.conftest import REPO, run_invoke


def _help(name: str, flag: str) -> tuple[int, str]:
    """``invoke NAME FLAG`` in this process: invoke's own Program over the
    tasks' collection (a subprocess per task and flag took ~0.4 s each,
    18 s in all); the exit code and what it printed."""
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            Program(namespace=ns).run(["invoke", name, flag])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return code, out.getvalue()


def test_every_task_has_help():
    names = sorted(ns.task_names)
    assert {"facts", "prepare", "check", "verify-comm", "deploy", "rollback", "lock.break", "sim.up"} <= set(names)
    for name in names:
        for flag in ("-h", "--help"):
            code, out = _help(name, flag)
            assert code == 0 and "Docstring:" in out, (name, flag, out)


def test_help_as_a_user_runs_it():
    """The same through ``python -m invoke`` (tasks.py found as a user's shell finds it), for one task."""
    for flag in ("-h", "--help"):
        res = run_invoke("deploy", flag)
        assert res.returncode == 0 and "Docstring:" in res.stdout, (flag, res.stderr)


def _needs_cluster(name: str) -> bool:
    """Whether the task's ``cluster`` parameter has no default (its body's own signature)."""
    import inspect

    param = inspect.signature(ns[name].body).parameters.get("cluster")
    return param is not None and param.default is inspect.Parameter.empty


def test_a_task_that_needs_a_cluster_says_so_without_one():
    from llmdeploy.inventory import list_clusters

    needing = [name for name in sorted(ns.task_names) if _needs_cluster(name)]
    assert {"facts", "prepare", "check", "verify-comm", "deploy", "status", "lock.status", "lock.break", "logs"} <= set(needing)
    assert not {"sim.up", "sim.down", "sim.status", "demo"} & set(needing)  # a default, or no cluster at all
    said = f"error: --cluster is required (one of: {', '.join(list_clusters())})\n"
    assert "a3" in said and "sim-a3" in said
    for name in needing:
        res = run_invoke(name)
        assert (res.returncode, res.stdout, res.stderr) == (1, "", said), name


def test_a_required_flag_other_than_cluster_is_named_when_missing():
    res = run_invoke("sim.shape", "--cluster", "sim-a3")
    assert (res.returncode, res.stderr) == (1, "error: --mbit is required\n")


def test_every_flag_has_its_help_and_the_shared_ones_are_said_once():
    """tasks.py's ``command``: a flag's help is the task's own or SHARED_HELP's
    (one text for --cluster, --limit, --message, --lock-wait and --wide
    wherever a task takes them); a help for a flag the task does not take is
    refused when tasks.py is imported."""
    import importlib.util
    import inspect

    import pytest

    # tasks.py loaded afresh: Invoke takes a task's help out of it (Task.arg_opts pops it) once it has parsed that task
    spec = importlib.util.spec_from_file_location("_tasks_fresh", REPO / "tasks.py")
    tasks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tasks)
    ns = tasks.ns
    for name in sorted(ns.task_names):
        t = ns[name]
        flags = list(inspect.signature(t.body).parameters)[1:]
        assert sorted(t.help) == sorted(flags), (name, flags, sorted(t.help))
    own = {"sim.up", "sim.down", "sim.shape", "demo"}  # the simulator's tasks say which clusters they take
    for name in sorted(set(ns.task_names) - own):
        if "cluster" in ns[name].help:
            assert ns[name].help["cluster"] == tasks.SHARED_HELP["cluster"], name
    assert ns["facts"].help["wide"] != tasks.SHARED_HELP["wide"] == ns["status"].help["wide"]

    def lost(c, cluster, json=False):
        """A task with a help for a flag it lost."""

    with pytest.raises(TypeError, match="lost: help for flags it does not take: jsn"):
        tasks.command(jsn="print as JSON")(lost)
