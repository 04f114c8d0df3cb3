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
