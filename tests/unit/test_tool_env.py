"""Tests that run the tool as a subprocess and read its output do not take
COLUMNS or LINES from whatever environment runs the suite: the tool honours
COLUMNS in a pipe, and a COLUMNS=80 inherited by ``invoke deploy`` once
wrapped the lines an integration test matched (tests.conftest.tool_env)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests import conftest
from tests.conftest import INVOKE, tool_env

TESTS = Path(__file__).resolve().parents[1]
SUBPROCESS_CALLS = {"Popen", "run", "check_output", "check_call", "call"}


def test_tool_env_leaves_out_the_terminal_size_unless_asked(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("LINES", "24")
    monkeypatch.setenv("LLMDEPLOY_SOMETHING", "kept")
    env = tool_env()
    assert "COLUMNS" not in env and "LINES" not in env and env["LLMDEPLOY_SOMETHING"] == "kept"
    assert tool_env({"COLUMNS": "120", "X": "1"})["COLUMNS"] == "120"


def test_run_invoke_runs_the_tool_without_the_suites_terminal_size(monkeypatch):
    seen = {}

    def fake_run(argv, **kw):
        seen.update(kw["env"], argv=argv)

    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(conftest.FORKS, "run", fake_run)
    conftest.run_invoke("status", "--cluster", "x", env={"LLMDEPLOY_INVENTORY": "/tmp/inv"})
    assert seen["argv"] == INVOKE + ["status", "--cluster", "x"] and "COLUMNS" not in seen and seen["LLMDEPLOY_INVENTORY"] == "/tmp/inv"
    conftest.run_invoke("status", env={"COLUMNS": "100"})
    assert seen["COLUMNS"] == "100"


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node))


def _tool_env_call(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "tool_env"


def test_every_test_that_starts_the_tool_passes_tool_env():
    """Every subprocess call on ``INVOKE`` (or a list made from it) in tests/
    has ``env=tool_env(...)``, or a name bound to ``tool_env(...)``."""
    bad, found = [], 0
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        commands, envs = {"INVOKE"}, set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if _mentions(node.value, {"INVOKE"}):
                    commands.add(node.targets[0].id)
                if _tool_env_call(node.value):
                    envs.add(node.targets[0].id)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SUBPROCESS_CALLS
                    and node.args and _mentions(node.args[0], commands)):
                continue
            found += 1
            env = next((k.value for k in node.keywords if k.arg == "env"), None)
            if env is None or not (_tool_env_call(env) or isinstance(env, ast.Name) and env.id in envs):
                bad.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}")
    assert found >= 9  # conftest's run_invoke, and the Popens of integration and reliability tests
    assert not bad, f"starts the tool without env=tool_env(...): {bad}"
