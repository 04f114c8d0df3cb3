"""The type checker (issue 44): mypy over the product (``[tool.mypy]`` in
pyproject.toml: strict on the core, the basic checks elsewhere) finds
nothing; and a plug-in whose hook has the wrong signature fails it through
its conformance declaration (``_conforms: LauncherPlugin = _this``), as it
fails the registry's check when it loads."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from llmdeploy.launcher import LauncherPlugin
from llmdeploy.plugin import check

ROOT = Path(__file__).resolve().parents[2]


def mypy(*args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """mypy with the project's configuration (``args``: what to check instead of its ``files``)."""
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})})


def test_the_product_type_checks():
    res = mypy()
    assert res.returncode == 0, res.stdout[-6000:] + res.stderr[-2000:]
    assert res.stdout.startswith("Success: no issues found"), res.stdout


def _plugin_copy(tmp_path: Path, name: str, change: tuple[str, str] | None) -> Path:
    """The SSH launcher as a plug-in module of its own (``name``), its
    relative imports made absolute, with one ``change`` (old, new) made."""
    text = (ROOT / "launchers" / "ssh.py").read_text()
    text = re.sub(r"^from \.\.(\w+) import", r"from llmdeploy.\1 import", text, flags=re.M)
    text = text.replace("import launchers.ssh as _this", f"import {name} as _this")
    assert f"import {name} as _this" in text, "the SSH launcher no longer declares its conformance"
    if change:
        assert change[0] in text, change[0]
        text = text.replace(change[0], change[1])
    path = tmp_path / f"{name}.py"
    path.write_text(text)
    return path


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


WRONG = [
    # a parameter too many: the registry's check refuses it too
    ("def outside_ssh(cluster: Cluster) -> bool:", "def outside_ssh(cluster: Cluster, strict: bool) -> bool:", "outside_ssh", True),
    # a parameter of another type: only the type checker sees it (the registry compares names and kinds)
    ("def runtime(cluster: Cluster) -> None:", "def runtime(cluster: int) -> None:", "runtime", False),
]


@pytest.mark.parametrize("old, new, hook, load_refuses", WRONG, ids=[w[2] for w in WRONG])
def test_a_plugin_with_a_wrong_hook_fails_the_type_check(tmp_path, old, new, hook, load_refuses):
    good = _plugin_copy(tmp_path, "goodlauncher", None)
    # the product's own findings are test_the_product_type_checks's: here only the plug-in's
    one = ("--follow-imports=silent", "--no-warn-unused-configs")
    res = mypy(*one, str(good), env={"MYPYPATH": str(tmp_path)})
    assert res.returncode == 0, res.stdout  # the copy as it is conforms: what fails below is the change
    bad = _plugin_copy(tmp_path, "badlauncher", (old, new))
    res = mypy(*one, str(bad), env={"MYPYPATH": str(tmp_path)})
    assert res.returncode == 1, res.stdout
    assert re.search(r'badlauncher\.py:\d+: error: Incompatible types in assignment .*"LauncherPlugin"', res.stdout), res.stdout
    assert f"def {hook}(" in res.stdout, res.stdout
    # and the registry's own check, when such a plug-in loads
    check(_load(good), LauncherPlugin, "launcher")
    if load_refuses:
        with pytest.raises(TypeError, match=f"badlauncher.{hook}"):
            check(_load(bad), LauncherPlugin, "launcher")
    else:
        check(_load(bad), LauncherPlugin, "launcher")
