"""Every task answers -h and --help with its help (no flag takes them as a value)."""

from tasks import ns
from tests.conftest import run_invoke


def test_every_task_has_help():
    names = sorted(ns.task_names)
    assert {"facts", "prepare", "check", "verify-comm", "deploy", "rollback", "lock.break", "sim.up"} <= set(names)
    for name in names:
        for flag in ("-h", "--help"):
            res = run_invoke(name, flag)
            assert res.returncode == 0 and "Docstring:" in res.stdout, (name, flag, res.stderr)


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
