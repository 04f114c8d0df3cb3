"""The documentation site stays true to the code.

- Every ``invoke`` command in the docs' shell blocks is a task with those flags.
- ``mkdocs build --strict`` passes (every link, anchor and nav entry resolves,
  and docs/hooks/reference.py generates the inventory and CLI references from
  the code without a warning), and the CLI reference is what invoke prints.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel, field_validator, model_validator

from tasks import ns
from tests.conftest import run_invoke

REPO = Path(__file__).resolve().parent.parent.parent
DOCS = REPO / "docs"



def _reference_module():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- commands ----------------------------------------------------------------------
def shell_blocks(path: Path) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", path.read_text(), re.S)


@pytest.mark.parametrize("page", sorted(str(p.relative_to(REPO)) for p in DOCS.glob("*.md")))
def test_every_invoke_command_shown_is_a_task_with_those_flags(page):
    problems = []
    for block in shell_blocks(REPO / page):
        for line in block.splitlines():
            line = line.split(" #")[0].strip()
            if not line.startswith("invoke "):
                continue
            words = shlex.split(line)[1:]
            if words[0].startswith("-"):
                assert words[0] in ("--list", "--help", "-h", "-l"), line
                continue
            task = words[0]
            if task not in ns.task_names:
                problems.append(f"{line}: no task {task!r}")
                continue
            flags = {f"--{n}" if len(n) > 1 else f"-{n}" for a in ns[task].get_arguments() for n in a.names} | {"--help", "-h"}
            problems += [f"{line}: {task} has no flag {w.split('=')[0]}" for w in words[1:] if w.startswith("-") and w.split("=")[0] not in flags]
    assert not problems, f"{page}: " + "; ".join(problems)


# --- the site ----------------------------------------------------------------------------------
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=REPO,
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    inventory = (site / "reference" / "inventory" / "index.html").read_text()
    for model in _reference_module().inventory_models():
        assert f'id="{model.__name__.lower()}"' in inventory, model.__name__
        for field in model.model_fields:
            assert f"<code>{field}</code>" in inventory, f"{model.__name__}.{field} is not in the inventory reference"
    cli = (site / "reference" / "cli" / "index.html").read_text()
    for name in ns.task_names:
        assert f'id="{name.replace(".", "-")}"' in cli, name
    for picture in ("top.png", "verify-comm.png"):
        assert (site / picture).is_file()


def test_the_cli_reference_is_what_invoke_prints():
    ref = _reference_module()
    for args in (["--list"], ["--help", "deploy"], ["--help", "lock.break"]):
        assert ref.invoke_output(*args) == run_invoke(*args).stdout, args
    text, problems = ref.cli_markdown()
    assert not problems
    assert ref.invoke_output("--help", "deploy").rstrip() in text
    assert "- 4: The deploy lock is held by someone else" in text and "- 130: `KeyboardInterrupt`" in text


def test_a_validator_without_words_is_named():
    ref = _reference_module()

    class Sample(BaseModel):
        size: int = 1
        name: str = "x"

        @field_validator("size")
        @classmethod
        def _documented(cls, v):
            """At most 10."""
            return v

        @field_validator("name")
        @classmethod
        def _silent(cls, v):
            return v.strip()

        @model_validator(mode="after")
        def _by_helper(self):
            return _helper_with_words(self)

    rules, missing = ref.model_rules(Sample)
    assert ("`size`", "At most 10.") in rules
    assert [m for m in missing if "Sample._silent validates `name`" in m] and len(missing) == 1, missing
    assert rules[-1] == ("the whole model", "Always passes.")


def _helper_with_words(model):
    """Always passes."""
    return model
