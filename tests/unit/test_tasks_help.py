"""Every task answers -h and --help with its help (no flag takes them as a value)."""

import json

from tests.conftest import run_invoke


def _names(coll, prefix=""):
    for t in coll["tasks"]:
        yield prefix + t["name"]
    for sub in coll["collections"]:
        yield from _names(sub, prefix + sub["name"] + ".")


def test_every_task_has_help():
    names = list(_names(json.loads(run_invoke("--list", "--list-format=json").stdout)))
    assert {"facts", "prepare", "check", "verify-comm", "deploy", "rollback", "lock.break"} <= set(names)
    for name in names:
        for flag in ("-h", "--help"):
            res = run_invoke(name, flag)
            assert res.returncode == 0 and "Docstring:" in res.stdout, (name, flag, res.stderr)
