"""The layers of issue 20, checked on every run of the suite.

1. ``lint-imports`` (import-linter, the contracts in pyproject.toml's
   ``[tool.importlinter]``): tasks.py > flows > systems > roles >
   platforms | launchers > transports > llmdeploy, no import upwards; sim,
   bench and tests outside the product.
2. No serving system is named in the code of the generic packages
   (llmdeploy/, transports/, roles/, flows/): not in a name, attribute, function, class,
   argument, keyword or import, and not in a string constant (f-string parts
   included). Docstrings and comments may name systems: they explain, they do
   not decide. A system's name belongs in systems/<name>/ (and templates/,
   playbooks/, inventory/, sim/, tests/).
3. Nor is a hardware vendor (issue 32): ``ascend``, ``nvidia`` and every
   vendor package platforms/ registers. A vendor's name belongs in
   platforms/<vendor>/ (and systems/: a serving system may be made for one
   vendor).
4. Nor is a launcher (issue 29): ``slurm`` and its commands (``srun``,
   ``squeue``, ``sbatch``, ``salloc``, ``scancel``, ``sinfo``), and every
   launcher launchers/ registers but the default one (SSH, the
   transport every other one reaches its first host with), in the generic
   packages and tasks.py. A launcher's name belongs in
   launchers/<name> (and in the inventory's schema,
   llmdeploy/inventory.py, whose section picks it).

The checker is tested on small snippets first, so it cannot pass by seeing
nothing.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent

# the packages that must not know any serving system by name
GENERIC = ("llmdeploy", "transports", "roles", "flows")

# Always checked, whatever systems/ holds today: every system the project
# serves or is about to, in the spellings the code uses (kinds, module names,
# entry points). Matched case-insensitively as substrings of identifiers and
# strings, so VllmAscendProfile, TRTLLM_DIR and "trtllm-llmapi-launch" count.
# None of them is part of an ordinary English or Python word ("dynamo" is not
# in "dynamic"; "tensorrt" is not in "tensor").
FIXED_NAMES = ("vllm", "vllm-ascend", "vllm_ascend", "trtllm", "trtllm-serve", "tensorrt", "dynamo", "sglang")

# Always checked as hardware vendors, whatever platforms/ holds today ("nvidia"
# also catches nvidia-smi; "ascend" the driver's /usr/local/Ascend paths).
FIXED_VENDORS = ("ascend", "nvidia")

# Always checked as a launcher's words, whatever launchers/ holds today:
# the Slurm launcher's name and the commands only it runs
FIXED_LAUNCHER_WORDS = ("slurm", "srun", "squeue", "sbatch", "salloc", "scancel", "sinfo")

# where a launcher's name may appear: its own implementation, and the inventory's
# schema, which declares the section that picks it (``Cluster.slurm``)
LAUNCHER_PLACES = ("launchers/", "llmdeploy/inventory.py")

# Folders under systems/ that are not a serving system (shared helpers, if the
# restructuring makes any); a folder listed here is not a name to look for.
NOT_SYSTEMS: frozenset[str] = frozenset()


# --- which names are systems' names ------------------------------------------------------------


def _subscript_of(node: ast.expr | None, name: str) -> bool:
    """Whether ``node`` is ``name[...]`` or ``typing.name[...]``."""
    if not isinstance(node, ast.Subscript):
        return False
    base = node.value
    return (isinstance(base, ast.Name) and base.id == name) or (isinstance(base, ast.Attribute) and base.attr == name)


def _literal_strings(node: ast.expr | None) -> list[str]:
    """The strings of ``Literal["a", ...]`` (or ``typing.Literal[...]``), else []."""
    if not _subscript_of(node, "Literal"):
        return []
    elts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
    return [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]


def declared_kinds(tree: ast.AST) -> set[str]:
    """The kind strings a class declares: ``kind: Literal["x"]`` (a pydantic
    discriminator with one value: a profile's system), ``kind = "x"`` or
    ``kind: ClassVar[str] = "x"`` in a class body. Not an instance field's
    default (``kind: str = "http"``: a probe's kind is not a system)."""
    kinds: set[str] = set()
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == "kind":
                lits = _literal_strings(stmt.annotation)
                if len(lits) == 1:
                    kinds.add(lits[0])
                elif _subscript_of(stmt.annotation, "ClassVar") and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                    kinds.add(stmt.value.value)
            elif isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
                if any(isinstance(t, ast.Name) and t.id == "kind" for t in stmt.targets):
                    kinds.add(stmt.value.value)
    return kinds


def registry_entries(tree: ast.Module, modules: set[str]) -> tuple[set[str], set[str]]:
    """(kinds, modules) of the registry in systems/__init__.py: a module-level
    dict whose keys are strings and whose every value names one of systems'
    modules (``"vllm_ascend"``, ``vllm_ascend`` or ``vllm_ascend.SYSTEM``)."""
    kinds: set[str] = set()
    mods: set[str] = set()

    def module_of(v: ast.expr) -> str | None:
        while isinstance(v, ast.Attribute):
            v = v.value
        if isinstance(v, ast.Constant) and isinstance(v.value, str):
            return v.value
        if isinstance(v, ast.Name):
            return v.id
        return None

    for stmt in tree.body:
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
        if not isinstance(value, ast.Dict) or not value.keys:
            continue
        keys = [k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        vals = [module_of(v) for v in value.values]
        if len(keys) == len(value.keys) and all(v in modules for v in vals):
            kinds.update(keys)
            mods.update(v for v in vals if v)
    return kinds, mods


def derived_system_names(systems_dir: Path) -> set[str]:
    """The systems that systems/ declares: every package folder under it (a
    system is ``systems/<name>/``) but private ones and NOT_SYSTEMS, the
    modules and kinds its registry maps, and every kind a class under it
    declares."""
    if not systems_dir.is_dir():
        return set()
    names: set[str] = set()
    folders = {p.name for p in systems_dir.iterdir() if (p / "__init__.py").is_file()}
    names |= {f for f in folders if not f.startswith("_") and f not in NOT_SYSTEMS}
    modules = folders | {p.stem for p in systems_dir.glob("*.py") if p.stem != "__init__"}
    init = systems_dir / "__init__.py"
    if init.is_file():
        kinds, mods = registry_entries(ast.parse(init.read_text(), str(init)), modules)
        names |= kinds | mods
    for path in sorted(systems_dir.rglob("*.py")):
        if "__pycache__" not in path.parts:
            names |= declared_kinds(ast.parse(path.read_text(), str(path)))
    return {n for n in names if n}


def spellings(names: set[str] | tuple[str, ...]) -> set[str]:
    """Each name lower-cased, and as the code may spell it: vllm-ascend, vllm_ascend, vllmascend."""
    out: set[str] = set()
    for n in names:
        n = n.lower()
        out |= {n, n.replace("-", "_"), n.replace("_", "-"), n.replace("-", "").replace("_", "")}
    return {n for n in out if n}


def system_names(repo: Path = REPO) -> set[str]:
    return spellings(set(FIXED_NAMES) | derived_system_names(repo / "systems"))


def derived_vendor_names(platforms_dir: Path) -> set[str]:
    """The vendors that platforms/ declares: every package folder under it
    (a vendor is ``platforms/<name>/``) but private ones, and the keys of its
    registry in platforms/__init__.py (a module-level dict whose keys are
    strings, each naming one of its folders: ``VENDORS``)."""
    if not platforms_dir.is_dir():
        return set()
    folders = {p.name for p in platforms_dir.iterdir() if (p / "__init__.py").is_file()}
    names = {f for f in folders if not f.startswith("_")}
    init = platforms_dir / "__init__.py"
    if init.is_file():
        for stmt in ast.parse(init.read_text(), str(init)).body:
            value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
            if isinstance(value, ast.Dict) and value.keys:
                keys = [k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
                if len(keys) == len(value.keys) and all(k in folders for k in keys):
                    names |= set(keys)
    return names


def vendor_names(repo: Path = REPO) -> set[str]:
    return spellings(set(FIXED_VENDORS) | derived_vendor_names(repo / "platforms"))


def launcher_registry(launchers_dir: Path) -> dict[str, str | None]:
    """The registry in launchers/__init__.py: a module-level dict
    whose keys are strings and whose values are strings or None (``LAUNCHERS``:
    launcher -> the inventory section that picks it, None for the default)."""
    init = launchers_dir / "__init__.py"
    if not init.is_file():
        return {}
    for stmt in ast.parse(init.read_text(), str(init)).body:
        value = stmt.value if isinstance(stmt, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Dict) and value.keys:
            keys = [k.value for k in value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
            vals = [v.value for v in value.values if isinstance(v, ast.Constant) and (v.value is None or isinstance(v.value, str))]
            if len(keys) == len(vals) == len(value.keys):
                return dict(zip(keys, vals))
    return {}


def derived_launcher_names(launchers_dir: Path) -> set[str]:
    """The launchers launchers/ declares, but the default one: every
    module or package under it (but private ones), and the names and sections
    of its registry."""
    if not launchers_dir.is_dir():
        return set()
    registry = launcher_registry(launchers_dir)
    default = {name for name, section in registry.items() if section is None}
    found = {p.name for p in launchers_dir.iterdir() if (p / "__init__.py").is_file()}
    found |= {p.stem for p in launchers_dir.glob("*.py") if p.stem != "__init__"}
    names = {n for n in found if not n.startswith("_")} | set(registry) | {s for s in registry.values() if s}
    return names - default


def launcher_names(repo: Path = REPO) -> set[str]:
    return spellings(set(FIXED_LAUNCHER_WORDS) | derived_launcher_names(repo / "launchers"))


# --- where the code names them -------------------------------------------------------------------


@dataclass(frozen=True, order=True)
class Hit:
    path: str
    line: int
    what: str  # "module", "name", "attribute", "def", "class", "argument", "keyword", "import", "string"
    text: str
    names: tuple[str, ...]

    def __str__(self) -> str:
        text = self.text if len(self.text) <= 100 else self.text[:97] + "..."
        return f"{self.path}:{self.line}: {', '.join(self.names)} in {self.what} {text!r}"


def docstring_nodes(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that are docstrings: the first statement of a
    module, class or function when it is a bare string."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                ids.add(id(first.value))
    return ids


def code_words(node: ast.AST) -> list[tuple[str, str]]:
    """(what, text) of every identifier this node itself defines or uses."""
    if isinstance(node, ast.Name):
        return [("name", node.id)]
    if isinstance(node, ast.Attribute):
        return [("attribute", node.attr)]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [("def", node.name)]
    if isinstance(node, ast.ClassDef):
        return [("class", node.name)]
    if isinstance(node, ast.arg):
        return [("argument", node.arg)]
    if isinstance(node, ast.keyword) and node.arg:
        return [("keyword", node.arg)]
    if isinstance(node, ast.alias):
        return [("import", node.name)] + ([("import", node.asname)] if node.asname else [])
    if isinstance(node, ast.ImportFrom) and node.module:
        return [("import", node.module)]
    if isinstance(node, ast.ExceptHandler) and node.name:
        return [("name", node.name)]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return [("name", n) for n in node.names]
    if isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
        return [("name", node.name)]
    if isinstance(node, ast.MatchMapping) and node.rest:
        return [("name", node.rest)]
    if isinstance(node, ast.MatchClass):
        return [("keyword", k) for k in node.kwd_attrs]
    return []


def matched_names(text: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """The ``names`` (lower-case) that ``text`` contains, whatever its case; the
    longest spelling only ("vllm-ascend", not also "vllm")."""
    low = text.lower()
    found = [n for n in names if n in low]
    return tuple(n for n in found if not any(n != m and n in m for m in found))


def find_system_names(source: str, names: set[str] | tuple[str, ...], path: str = "<snippet>", module: str = "") -> list[Hit]:
    """Every place in ``source`` whose code names one of ``names`` (lower-case),
    docstrings and comments aside (comments are not in the syntax tree).
    ``module``: the file's dotted module name, a name other code imports it by
    (``roles.dynamo`` names a system even where its text does not)."""
    tree = ast.parse(source, path)
    docs = docstring_nodes(tree)
    names = tuple(sorted(set(names)))
    hits: set[Hit] = set()

    def matched(text: str) -> tuple[str, ...]:
        return matched_names(text, names)

    if module and matched(module):
        hits.add(Hit(path, 1, "module", module, matched(module)))

    def visit(node: ast.AST, line: int) -> None:
        line = getattr(node, "lineno", None) or line
        words = code_words(node)
        if isinstance(node, ast.Constant) and id(node) not in docs:
            if isinstance(node.value, str):
                words.append(("string", node.value))
            elif isinstance(node.value, bytes):
                words.append(("string", node.value.decode("latin-1")))
        for what, text in words:
            found = matched(text)
            if found:
                hits.add(Hit(path, line, what, text, found))
        for child in ast.iter_child_nodes(node):
            visit(child, line)

    visit(tree, 1)
    return sorted(hits)


def generic_sources(repo: Path = REPO) -> list[Path]:
    return sorted(p for d in GENERIC for p in (repo / d).rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path, repo: Path = REPO) -> str:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def generic_code_hits(repo: Path = REPO, names: set[str] | None = None, sources: list[Path] | None = None) -> list[Hit]:
    names = system_names(repo) if names is None else names
    hits: list[Hit] = []
    for path in generic_sources(repo) if sources is None else sources:
        hits += find_system_names(path.read_text(), names, str(path.relative_to(repo)), module_name(path, repo))
    return hits


def launcher_generic_sources(repo: Path = REPO) -> list[Path]:
    """The generic packages and tasks.py, but where a launcher's name belongs (``LAUNCHER_PLACES``)."""
    paths = generic_sources(repo) + [repo / "tasks.py"]
    return [p for p in paths if not str(p.relative_to(repo)).startswith(LAUNCHER_PLACES)]


# --- the checks ----------------------------------------------------------------------------------


def lint_imports_command() -> str | None:
    """The lint-imports of the Python running the tests (its venv's bin), else the one on PATH.
    (import-linter has no ``python -m`` entry point; its console script is the supported way.)"""
    exe = Path(sys.executable).parent / "lint-imports"
    return str(exe) if exe.is_file() else shutil.which("lint-imports")


def test_lint_imports_keeps_every_contract():
    exe = lint_imports_command()
    assert exe, "lint-imports is not installed: run scripts/setup.sh (import-linter is in pyproject.toml's test extra)"
    # --no-cache: no .import_linter_cache written into the checkout
    res = subprocess.run([exe, "--no-cache", "--no-logo"], cwd=REPO, capture_output=True, text=True, timeout=300,
                         env=dict(os.environ), stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        pytest.fail(f"lint-imports exited {res.returncode} (the contracts: pyproject.toml [tool.importlinter])\n{res.stdout}{res.stderr}",
                    pytrace=False)


def fail_on_hits(hits, names, what: str, where: str, advice: str) -> None:
    """Fail naming every place in ``hits`` (a count per file, then each place) that names ``what``."""
    if hits:
        per_file = Counter(h.path for h in hits)
        pytest.fail(
            f"{len(hits)} places in {len(per_file)} files of {where} name {what} in code "
            f"(looked for: {', '.join(sorted(names))}); {advice}.\n"
            + "".join(f"  {n:4d}  {f}\n" for f, n in sorted(per_file.items()))
            + "\n".join(str(h) for h in hits),
            pytrace=False,
        )


GENERIC_DIRS = ", ".join(f"{d}/" for d in GENERIC)


def test_no_serving_system_named_in_generic_code():
    assert generic_sources(), f"no .py under {', '.join(GENERIC)} of {REPO}"
    fail_on_hits(generic_code_hits(), system_names(), "a serving system", GENERIC_DIRS,
                 "move them into the system's folder under systems/ and ask the system through its declared interface")


def test_no_vendor_named_in_generic_code():
    names = vendor_names()
    fail_on_hits(generic_code_hits(names=names), names, "a hardware vendor", GENERIC_DIRS,
                 "move them into the vendor's package under platforms/ and ask it through llmdeploy.platform (the Vendor interface)")


def test_no_launcher_named_in_generic_code():
    names = launcher_names()
    sources = launcher_generic_sources()
    assert any(str(p.relative_to(REPO)) == "flows/engine.py" for p in sources)
    fail_on_hits(generic_code_hits(names=names, sources=sources), names, "a launcher", f"{GENERIC_DIRS} and tasks.py",
                 "move them into the launcher under launchers/ and ask it through llmdeploy.launcher "
                 "(the Transport and Launcher interfaces)")


def test_every_launcher_is_in_the_independence_contract():
    """pyproject.toml's ``launchers-independent`` contract names every launcher the registry has (a new one is kept apart too)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10: import-linter's own dependency reads pyproject.toml there
        import tomli as tomllib

    contracts = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (independent,) = [c for c in contracts if c["id"] == "launchers-independent"]
    registered = launcher_registry(REPO / "launchers")
    assert len(registered) >= 2, registered
    assert sorted(independent["modules"]) == sorted(f"launchers.{name}" for name in registered)


# --- the checker itself --------------------------------------------------------------------------

NAMES = spellings(FIXED_NAMES)


def hits_of(src: str) -> list[tuple[int, str, str]]:
    return [(h.line, h.what, h.text) for h in find_system_names(textwrap.dedent(src), NAMES)]


def test_docstrings_and_comments_may_name_systems():
    src = '''
        """Starts vLLM-Ascend, trtllm-serve, Dynamo and SGLang alike."""
        # vllm_port, trtllm-serve, dynamo: a comment

        class Engine:
            """One engine for vllm and dynamo."""

            def start(self, port):  # sglang too
                """Starts a TensorRT-LLM world."""
                return port
        '''
    assert hits_of(src) == []


def test_identifiers_naming_a_system_fail():
    src = '''
        vllm_port = 1
        cfg.trtllm_dir = 2
        def start_dynamo(sglang_args, *, TensorRT=0):
            pass
        class VllmAscendProfile:
            pass
        run(dynamo_port=3)
        import systems.vllm_ascend as engine
        from roles.dynamo import x
        from roles import trtllm as t
        '''
    got = hits_of(src)
    assert (2, "name", "vllm_port") in got
    assert (3, "attribute", "trtllm_dir") in got
    assert (4, "def", "start_dynamo") in got
    assert (4, "argument", "sglang_args") in got
    assert (4, "argument", "TensorRT") in got
    assert (6, "class", "VllmAscendProfile") in got
    assert (8, "keyword", "dynamo_port") in got
    assert (9, "import", "systems.vllm_ascend") in got
    assert (10, "import", "roles.dynamo") in got
    assert (11, "import", "trtllm") in got


def test_strings_naming_a_system_fail():
    src = '''
        def f(plan, x):
            """A docstring: fine."""
            "a bare string that is not the first statement is not a docstring: vllm"
            if plan.system == "trtllm-serve":
                return f"python3 -m dynamo.frontend --port {x}"
            return b"sglang"
        '''
    got = hits_of(src)
    assert (4, "string", "a bare string that is not the first statement is not a docstring: vllm") in got
    assert (5, "string", "trtllm-serve") in got
    assert (6, "string", "python3 -m dynamo.frontend --port ") in got  # an f-string's constant part
    assert (7, "string", "sglang") in got
    assert not any(text == "A docstring: fine." for _, _, text in got)


def test_fstring_expression_naming_a_system_fails():
    assert hits_of('x = f"{vllm_port}"\n') == [(1, "name", "vllm_port")]


def test_ordinary_words_pass():
    assert hits_of('dynamic = "tensor parallel"\ndef llm(serve, ascend): return serve\n') == []


def test_a_hit_names_file_line_and_the_longest_name():
    (hit,) = find_system_names('kind = "vllm-ascend"\n', NAMES, "flows/x.py")
    assert hit.names == ("vllm-ascend",)
    assert str(hit) == "flows/x.py:1: vllm-ascend in string 'vllm-ascend'"


def test_a_module_named_for_a_system_fails():
    (hit,) = find_system_names('"""Dynamo\'s worker placement."""\n', NAMES, "roles/dynamo/__init__.py", "roles.dynamo")
    assert (hit.line, hit.what, hit.text) == (1, "module", "roles.dynamo")
    assert module_name(REPO / "roles" / "dynamo" / "__init__.py") == "roles.dynamo"
    assert module_name(REPO / "flows" / "ops.py") == "flows.ops"


def test_system_names_come_from_the_registry(tmp_path):
    systems = tmp_path / "systems"
    (systems / "sglang").mkdir(parents=True)
    (systems / "_shared").mkdir()
    (systems / "_shared" / "__init__.py").write_text("")
    (systems / "sglang" / "__init__.py").write_text("from typing import Literal\nclass P:\n    kind: Literal['sglang-mn'] = 'sglang-mn'\n")
    (systems / "tgi.py").write_text("class S:\n    kind = 'text-generation-inference'\n")
    (systems / "helpers.py").write_text("import typing\nclass Probe:\n    kind: str = 'http'\n    how: Literal['port', 'http']\n"
                                        "class Sys:\n    kind: typing.ClassVar[str] = 'lmdeploy'\n")
    (systems / "__init__.py").write_text("MODULES = {'tgi-serve': 'tgi'}\nPORTS = {'http': 8000}\n")
    names = derived_system_names(systems)
    assert names == {"sglang", "sglang-mn", "tgi", "tgi-serve", "text-generation-inference", "lmdeploy"}
    assert {"tgi_serve", "tgiserve", "vllm", "dynamo"} <= system_names(tmp_path)


VENDOR_NAMES = spellings(FIXED_VENDORS)


def test_vendor_names_in_code_fail_and_their_tools_words_pass():
    src = textwrap.dedent('''
        """Reads npu-smi on Ascend and nvidia-smi on NVIDIA."""
        def ascend_script(node):  # Ascend: hccn_tool
            return "nvidia-smi topo -m"
        HCCN = "HCCN=$(command -v hccn_tool || echo /usr/local/Ascend/driver/tools/hccn_tool)"
        if plat.vendor == "ascend":
            tool = "npu-smi info"
        ''')
    got = [(h.line, h.what, h.text) for h in find_system_names(src, VENDOR_NAMES)]
    assert (3, "def", "ascend_script") in got
    assert (4, "string", "nvidia-smi topo -m") in got
    assert (5, "string", "HCCN=$(command -v hccn_tool || echo /usr/local/Ascend/driver/tools/hccn_tool)") in got
    assert (6, "string", "ascend") in got
    assert not any("npu-smi info" == text for _, _, text in got)  # a tool's name that is no vendor's passes
    assert not any(line == 2 for line, _, _ in got)  # the docstring


def test_vendor_names_come_from_the_registry(tmp_path):
    plat = tmp_path / "platforms"
    for name in ("amd", "_shared", "intel"):
        (plat / name).mkdir(parents=True)
        (plat / name / "__init__.py").write_text("")
    (plat / "__init__.py").write_text("VENDORS = {'amd': ('mi355',), 'intel': ('gaudi3',)}\nOTHER = {'x': 1}\n")
    assert derived_vendor_names(plat) == {"amd", "intel"}
    assert {"amd", "intel", "ascend", "nvidia"} <= vendor_names(tmp_path)


def test_launcher_names_come_from_the_registry_but_the_default(tmp_path):
    launchers = tmp_path / "launchers"
    (launchers / "kube").mkdir(parents=True)
    (launchers / "kube" / "__init__.py").write_text("")
    (launchers / "_common.py").write_text("")
    (launchers / "ssh.py").write_text("")
    (launchers / "__init__.py").write_text("LAUNCHERS = {'ssh': None, 'kube': 'kubernetes'}\nOTHER = {'x': 1}\n")
    assert derived_launcher_names(launchers) == {"kube", "kubernetes"}
    assert {"kube", "kubernetes", "slurm", "srun", "sbatch"} <= launcher_names(tmp_path)
    assert "ssh" not in launcher_names(tmp_path)


def test_launcher_words_in_code_fail_and_docstrings_pass():
    src = textwrap.dedent('''
        """Reaches a Slurm cluster's nodes with srun; squeue reads the jobs."""
        if runner.slurm is not None:  # sbatch
            cmd = ["scancel", job]
        def sinfo_states(x):
            return x
        ''')
    got = [(h.line, h.what, h.text) for h in find_system_names(src, spellings(FIXED_LAUNCHER_WORDS))]
    assert (3, "attribute", "slurm") in got
    assert (4, "string", "scancel") in got
    assert (5, "def", "sinfo_states") in got
    assert not any(line == 2 for line, _, _ in got)  # the docstring


def test_this_tree_declares_launchers():
    """The derivation reads today's launchers/ (else a new launcher would be checked against the fixed words only)."""
    assert "slurm" in derived_launcher_names(REPO / "launchers")
    assert "ssh" not in derived_launcher_names(REPO / "launchers")


def test_this_tree_declares_vendors():
    """The derivation reads today's platforms/ (else a new vendor would be checked against the fixed list only)."""
    assert derived_vendor_names(REPO / "platforms") >= {"ascend", "nvidia"}, f"no vendor found in {REPO / 'platforms'}"


def test_this_tree_declares_systems():
    """The derivation reads today's systems/ (else a new layout would be checked against the fixed list only)."""
    assert derived_system_names(REPO / "systems"), f"no system found in {REPO / 'systems'}: teach derived_system_names its layout"


def test_the_flows_build_no_command_text():
    """Command text is built in roles/ and systems/ (pure builders a test reads
    as an operator would type them), and the flows only run it: no flow quotes
    a value for a shell, so none builds a command line."""
    offenders = []
    for path in sorted((REPO / "flows").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            offenders += [f"{path.relative_to(REPO)}:{node.lineno}: imports {n}" for n in names if n.split(".")[0] == "shlex"]
    assert not offenders, "build the command in roles/ or systems/ and run it from the flow:\n" + "\n".join(offenders)
