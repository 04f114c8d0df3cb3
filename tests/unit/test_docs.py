"""The README and the documentation site stay true to the code.

- The README starts with exactly two commands (set up and run the main job on
  the simulated cluster; the whole test suite), is a front door (120 lines at
  most), and its inventory is inventory/a3.py trimmed.
- Its support matrix claims nothing the tests do not show: every ✓ cell
  (serving system x platform x launcher) has an integration test that deploys
  on a simulated cluster of that system, platform and launcher; every such
  test has its ✓; every – cell is at least accepted by the inventory.
- Every ``invoke`` command in the README's and the docs' shell blocks is a
  task with those flags; every relative link of the README resolves.
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
from markdown.extensions.toc import slugify
from pydantic import BaseModel, field_validator, model_validator

from llmdeploy.inventory import Cluster, load_cluster, load_cluster_file
from tasks import ns
from tests.conftest import run_invoke

REPO = Path(__file__).resolve().parent.parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
INTEGRATION = REPO / "tests" / "integration"

# the README's names of the serving systems -> their profiles' kind
SYSTEMS = {"vLLM-Ascend": "vllm-ascend", "TensorRT-LLM": "trtllm-serve", "Dynamo": "dynamo", "SGLang": "sglang"}
# the README's launcher columns -> whether the cluster has a Slurm controller
LAUNCHERS = {"SSH + Docker": False, "Slurm": True}


def _reference_module():
    spec = importlib.util.spec_from_file_location("docs_reference_hook", DOCS / "hooks" / "reference.py")
    module = importlib.util.module_from_spec(spec)
    before, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # nothing written into docs/
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = before
    return module


# --- the README's first screen ------------------------------------------------------
def test_the_readme_starts_with_exactly_two_commands():
    lines = README.read_text().splitlines()
    assert len(lines) <= 120, f"README.md has {len(lines)} lines: the front door is 120 at most (the rest belongs in docs/)"
    assert lines[0].startswith("# ") and lines[1] == "" and lines[2] == "```sh", lines[:3]
    end = lines.index("```", 3)
    commands = [line.split("#")[0].strip() for line in lines[3:end]]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"], commands
    for command in commands:
        assert (REPO / command.split()[1]).is_file(), command
    # "CI runs exactly this through .ci/run"
    assert "exec bash scripts/test.sh" in (REPO / ".ci" / "run").read_text()


def test_the_readme_inventory_is_inventory_a3_trimmed(tmp_path):
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) == 1, "the README shows one inventory"
    path = tmp_path / "inventory" / "a3.py"
    path.parent.mkdir()
    path.write_text(blocks[0])
    shown = load_cluster_file(path)
    assert shown.model_dump() == load_cluster("a3").model_dump(), "the README's inventory must build the same cluster as inventory/a3.py"


# --- the support matrix ------------------------------------------------------------------
def readme_matrix() -> list[tuple[str, str, str, str, str]]:
    """[(system, platform label, platform, launcher, mark)] of every cell of the README's matrix."""
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| serving system | platform |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    cells = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        row = [c.strip() for c in line.strip().strip("|").split("|")]
        system, platform_label = row[0], row[1]
        m = re.fullmatch(r"(.+) \(`([a-z0-9]+)`\)", platform_label)
        assert m, f"matrix row {row}: the platform is written 'Name (`id`)'"
        for launcher, cell in zip(header[2:], row[2:]):
            mark = re.sub(r"^\[(.*)\]\(.*\)$", r"\1", cell)
            cells.append((system, m.group(1), m.group(2), launcher, mark))
    assert cells, "no matrix found in README.md"
    return cells


def integration_tests() -> dict[str, tuple[str, bool]]:
    """{test file: (its SIM_CLUSTER, whether it deploys)} of tests/integration."""
    out = {}
    for path in sorted(INTEGRATION.glob("test_*.py")):
        src = path.read_text()
        m = re.search(r'^SIM_CLUSTER = "([a-z0-9-]+)"', src, re.M)
        if not m:
            continue
        deploys = any(re.search(r'run_invoke\(\s*"deploy"', line) and "--check" not in line for line in src.splitlines())
        out[path.name] = (m.group(1), deploys)
    return out


def _shape(cluster: Cluster) -> tuple[str, str, bool]:
    return cluster.profile.kind, cluster.platform, cluster.slurm is not None


def deploying_tests() -> dict[tuple[str, str, bool], list[str]]:
    """{(kind, platform, slurm?): [test files that deploy a simulated cluster of that shape]}."""
    out: dict[tuple[str, str, bool], list[str]] = {}
    for name, (sim, deploys) in integration_tests().items():
        if deploys:
            out.setdefault(_shape(load_cluster(sim)), []).append(name)
    return out


def test_the_matrix_reader_sees_the_tests_it_must_see():
    # the reader of tests/integration finds what is there, so the checks below cannot pass on nothing
    tests = integration_tests()
    assert tests["test_deploy_a3.py"] == ("sim-a3", True)
    assert tests["test_facts_a2.py"] == ("sim-a2", False)
    assert deploying_tests()[("trtllm-serve", "b200", True)] == ["test_slurm_b200.py"]


def test_every_tick_of_the_matrix_has_an_integration_test():
    tested = deploying_tests()
    missing = []
    for system, label, platform, launcher, mark in readme_matrix():
        assert system in SYSTEMS, f"matrix: unknown serving system {system!r} (known: {', '.join(SYSTEMS)})"
        assert launcher in LAUNCHERS, f"matrix: unknown launcher column {launcher!r}"
        assert mark in ("✓", "–"), f"matrix cell {system} x {label} x {launcher}: {mark!r} is neither ✓ nor –"
        if mark == "✓" and (SYSTEMS[system], platform, LAUNCHERS[launcher]) not in tested:
            missing.append(f"{system} x {label} x {launcher}")
    assert not missing, ("README.md's matrix ticks cells that no integration test deploys (a tests/integration/test_*.py "
                         "whose SIM_CLUSTER inventory has that system, platform and launcher, and that runs deploy): " + "; ".join(missing))


def test_every_deploying_integration_test_has_its_tick():
    ticked = {(SYSTEMS.get(s), p, LAUNCHERS.get(launcher)) for s, _, p, launcher, mark in readme_matrix() if mark == "✓"}
    unticked = [f"{kind} x {platform} x {'Slurm' if slurm else 'SSH'} ({', '.join(files)})"
                for (kind, platform, slurm), files in deploying_tests().items() if (kind, platform, slurm) not in ticked]
    assert not unticked, "integration tests deploy what README.md's matrix does not tick: " + "; ".join(unticked)


def test_the_matrix_names_the_platforms_as_the_code_does_and_its_dashes_are_accepted():
    tested = deploying_tests()
    for system, label, platform, launcher, mark in readme_matrix():
        kind, slurm = SYSTEMS[system], LAUNCHERS[launcher]
        # a tested cluster of this system and platform (either launcher): its platform's name and a base to vary
        base = next((load_cluster(integration_tests()[files[0]][0]) for (k, p, _), files in sorted(tested.items()) if (k, p) == (kind, platform)), None)
        assert base is not None, f"matrix row {system} x {label}: no integration test deploys this system on this platform"
        assert base.platform_info.name == label, f"matrix: {platform} is {base.platform_info.name!r} in the code, not {label!r}"
        if mark == "–":
            doc = base.model_dump()
            doc["slurm"] = {"login": "login01", "partition": "gpu"} if slurm else None
            Cluster.model_validate(doc)  # raises, naming the field, if the inventory refuses the cell



def test_what_the_readme_says_the_inventory_also_accepts():
    """'The inventory also accepts TensorRT-LLM and SGLang on every NVIDIA platform (B200, ...) with either
    launcher': each of those systems validates on each of those platforms, SSH and Slurm, and the list is
    every NVIDIA platform the code has."""
    text = " ".join(README.read_text().split())
    m = re.search(r"The inventory also accepts (.+?) on every NVIDIA platform \((.+?)\) with either launcher", text)
    assert m, "README.md no longer says what else the inventory accepts: update this test with it"
    systems = [SYSTEMS[s] for s in re.split(r", | and ", m.group(1))]
    named = set(m.group(2).split(", "))
    bases = {_shape(load_cluster(sim))[0]: load_cluster(sim) for sim, deploys in integration_tests().values() if deploys}
    nvidia = {}
    from llmdeploy.platform import platform_names

    for platform in platform_names():
        doc = bases["sglang"].model_dump()
        doc.update(platform=platform, nodes=[{"name": "n0", "ip": "198.19.9.10"}])
        info = Cluster.model_construct(**doc).platform_info
        if info.vendor == "nvidia":
            nvidia[info.name] = (platform, info.devices)
    assert named == set(nvidia), f"README.md names {sorted(named)}; the code's NVIDIA platforms are {sorted(nvidia)}"
    for kind in systems:
        for name, (platform, devices) in nvidia.items():
            for slurm in (None, {"login": "login01", "partition": "gpu"}):
                doc = bases[kind].model_dump()
                nodes = [{"name": f"n{i}", "ip": f"198.19.9.{10 + i}"} for i in range(16 // devices)]  # a TP16 world
                doc.update(platform=platform, nodes=nodes, slurm=slurm)
                if kind == "trtllm-serve":
                    doc["profile"]["slots"] = {}
                Cluster.model_validate(doc)  # raises, naming the field, if the inventory refuses it

# --- commands and links ----------------------------------------------------------------------
def shell_blocks(path: Path) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", path.read_text(), re.S)


@pytest.mark.parametrize("page", ["README.md"] + sorted(str(p.relative_to(REPO)) for p in DOCS.glob("*.md")))
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


def anchors(page: Path) -> set[str]:
    out = set()
    for line in page.read_text().splitlines():
        m = re.match(r"#+ (.*?)(?: \{#([\w-]+)\})?$", line)
        if m:
            out.add(m.group(2) or slugify(m.group(1), "-"))
    return out


def test_the_serving_system_page_names_the_interface_as_declared():
    """docs/adding-a-serving-system.md shows every value and hook of
    llmdeploy.serving's ServingSystem and OptionalHooks, each hook with the
    parameters registration demands, and the shared openai_probe with its
    own: the page changes with the code."""
    import inspect

    from llmdeploy import serving
    from systems.common import openai_probe

    flat = " ".join((DOCS / "adding-a-serving-system.md").read_text().split())

    def shown(name: str, fn) -> str:
        params = [p for p in inspect.signature(fn).parameters if p != "self"]
        return f"`{name}({', '.join(params)})`"

    for proto, values, hooks in ((serving.ServingSystem, serving.REQUIRED_VALUES, serving.REQUIRED_HOOKS),
                                 (serving.OptionalHooks, serving.OPTIONAL_VALUES, serving.OPTIONAL_HOOKS)):
        for name in values:
            assert f"`{name}`" in flat, f"{proto.__name__}.{name} is not on the page"
        for name in hooks:
            assert shown(name, getattr(proto, name)) in flat, f"{proto.__name__}: {shown(name, getattr(proto, name))} is not on the page"
    assert shown("systems.common.openai_probe", openai_probe) in flat


def test_the_launchers_page_names_the_interface_as_declared():
    """docs/launchers.md shows every value and hook of llmdeploy.launcher's
    Transport, Connector, Launcher, LauncherPlugin and UnitRuntime, each hook with its parameters."""
    import inspect

    from llmdeploy import launcher
    from llmdeploy.plugin import members

    flat = " ".join((DOCS / "launchers.md").read_text().split())
    for proto in (launcher.Transport, launcher.Connector, launcher.Launcher, launcher.LauncherPlugin, launcher.UnitRuntime):
        values, hooks = members(proto)
        for name in values:
            assert f"`{name}`" in flat, f"{proto.__name__}.{name} is not on the page"
        for name in hooks:
            params = [p for p in inspect.signature(getattr(proto, name)).parameters if p != "self"]
            assert f"`{name}({', '.join(params)})`" in flat, f"{proto.__name__}.{name}({', '.join(params)}) is not on the page"


def test_every_relative_link_of_the_readme_resolves():
    links = re.findall(r"\]\(([^)#]+)(?:#([^)]+))?\)", README.read_text())
    assert links
    for target, anchor in links:
        if re.match(r"[a-z]+://", target):
            continue
        path = REPO / target
        assert path.exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            assert anchor in anchors(path), f"README.md links to {target}#{anchor}, which has no such heading"


def test_nothing_points_at_a_readme_section():
    # the README's long sections moved into docs/; a "README ... section" pointer would lead nowhere
    pattern = re.compile(r"README(\.md)?#|README \"[A-Z]")
    hits = [f"{p.relative_to(REPO)}:{i}" for p in REPO.rglob("*") if p.suffix in (".py", ".md", ".sh", ".j2", ".yaml", ".toml")
            and ".venv" not in p.parts and p.is_file() for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
            if pattern.search(line) and p.name != "test_docs.py"]
    assert not hits, "pointers into README sections that moved to docs/: " + ", ".join(hits)


# --- the site ----------------------------------------------------------------------------------
def test_mkdocs_build_strict(tmp_path):
    site = tmp_path / "site"
    # no banner from mkdocs-material; no bytecode of the hook in docs/hooks: the build writes only into tmp_path
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=REPO,
                         capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    inventory = (site / "reference" / "inventory" / "index.html").read_text()
    models = _reference_module().inventory_models()
    # every launcher's section is there, with its fields (the inventory's Cluster.slurm is typed by their base class)
    from launchers.slurm.schema import Slurm

    assert Slurm in models and 'id="slurm"' in inventory
    for model in models:
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
