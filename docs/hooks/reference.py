"""MkDocs hook: the inventory reference and the CLI reference, made from the
code at every build, so that neither can drift from it.

- ``reference/inventory.md``: every model of the inventory schema
  (``llmdeploy.inventory.Cluster`` and the models its fields hold) and every
  registered serving system's profile (each system of ``systems.SYSTEMS``
  loaded: the registry imports a system only when asked for it): each
  field's type, default and description (its ``Field(description=...)``,
  else the comments above and beside it in the source), its constraints in
  words, and each validator's rule (its docstring, else the docstrings of
  the functions it calls).
- ``reference/cli.md``: ``invoke --list`` and ``invoke --help TASK`` of every
  task of ``tasks.ns``, as Invoke prints them in 80 columns.

Neither page exists in ``docs/``: ``on_files`` adds them to the build. A
validator whose rule has no words is a warning, which fails
``mkdocs build --strict`` (the test suite runs it). This module is outside
the product: nothing under llmdeploy/, roles/, systems/ or flows/ imports it
(the import-linter contract ``no-tests-bench-docs``).
"""

from __future__ import annotations

import ast
import contextlib
import enum
import inspect
import io
import ipaddress
import logging
import re
import sys
import textwrap
import tokenize
import typing
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.reference")

INVENTORY_PAGE = "reference/inventory.md"
CLI_PAGE = "reference/cli.md"


def on_files(files, config):
    from mkdocs.structure.files import File

    root = Path(config.config_file_path).resolve().parent
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    for src, make in ((INVENTORY_PAGE, inventory_markdown), (CLI_PAGE, cli_markdown)):
        text, problems = make()
        for p in problems:
            log.warning(f"{src}: {p}")
        files.append(File.generated(config, src, content=text))
    return files


# --- the inventory ---------------------------------------------------------------
def inventory_models() -> list[type]:
    """Cluster and every model its fields hold, then each launcher's section
    and each serving profile and the models their fields hold; in the order
    they are first met."""
    from llmdeploy.inventory import Cluster

    order: list[type] = []

    def walk(model: type) -> None:
        if model in order or model in (_serving_profile(), _launcher_section()):
            return
        order.append(model)
        for field in model.model_fields.values():
            for t in _leaf_types(field.annotation):
                if _is_model(t):
                    walk(t)

    walk(Cluster)
    for cls in sections().values():
        walk(cls)
    for cls in profiles().values():
        walk(cls)
    return order


def sections() -> dict[str, type]:
    """field -> the section class its launcher declares (``cluster.slurm``:
    launchers/slurm/schema.py's ``Slurm``), every launcher that registers a
    section loaded here (a class registers itself when its module loads)."""
    import launchers
    from llmdeploy import launcher
    from llmdeploy.launcher import SECTIONS

    for name, section in launchers.LAUNCHERS.items():
        if section is not None:
            launcher.plugin(name)
    return {field: SECTIONS[field] for field in sorted(SECTIONS)}


def _launcher_section() -> type:
    from llmdeploy.launcher import LauncherSection

    return LauncherSection


def profiles() -> dict[str, type]:
    """kind -> profile class of every registered serving system, in kind
    order. Each system is loaded here: the registry imports a system's
    package only when its kind is asked for, so ``PROFILE_KINDS`` holds
    just the systems something happened to load before."""
    import systems

    return {kind: systems.SYSTEMS[kind].module.PROFILE for kind in sorted(systems.SYSTEMS)}


def _serving_profile() -> type:
    from llmdeploy.serving import ServingProfile

    return ServingProfile


def _is_model(t) -> bool:
    from pydantic import BaseModel

    return isinstance(t, type) and issubclass(t, BaseModel)


def _leaf_types(annotation) -> list:
    out = [annotation]
    for arg in typing.get_args(annotation):
        if not isinstance(arg, (str, int, float, bool)) and arg is not None:
            out += _leaf_types(arg)
    return out


def anchor(model: type) -> str:
    return model.__name__.lower()


def type_words(annotation) -> str:
    """The type as an inventory author writes it; models link to their section."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return type_words(args[0])
    if origin is typing.Literal:
        return " | ".join(f"`{a!r}`" for a in args)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " | ".join(type_words(a) for a in args)
    if origin in (list, tuple, set):
        return f"list of {type_words(args[0])}" if args else "list"
    if origin is dict:
        return f"mapping {type_words(args[0])} → {type_words(args[1])}" if args else "mapping"
    if annotation is type(None):
        return "`None`"
    if annotation is ipaddress.IPv4Address:
        return "IPv4 address"
    if annotation is _serving_profile():
        return "[a serving profile](#profiles)"
    if annotation is _launcher_section():
        return " | ".join(f"[{cls.__name__}](#{anchor(cls)})" for cls in sections().values())
    if _is_model(annotation):
        return f"[{annotation.__name__}](#{anchor(annotation)})"
    if origin is not None:  # SerializeAsAny[...] and the like
        return type_words(args[0]) if args else getattr(origin, "__name__", str(origin))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(f"`{m.value!r}`" for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def default_words(field) -> str:
    from pydantic_core import PydanticUndefined

    if field.default_factory is not None:
        value = field.default_factory()
        if _is_model(type(value)):
            return f"`{type(value).__name__}()`"
        return f"`{value!r}`"
    if field.default is PydanticUndefined:
        return "**required**"
    return f"`{field.default!r}`"


_BOUNDS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤", "min_length": "at least {} long", "max_length": "at most {} long",
           "multiple_of": "a multiple of {}"}


def constraint_words(metadata) -> list[str]:
    """annotated-types bounds and pydantic's pattern, in words."""
    out = []
    for m in metadata:
        for key in ("gt", "ge", "lt", "le", "min_length", "max_length", "multiple_of"):
            value = getattr(m, key, None)
            if value is not None:
                form = _BOUNDS[key]
                out.append(form.format(value) if "{}" in form else f"{form} {value}")
        pattern = getattr(m, "pattern", None)
        if pattern is not None:
            out.append(f"matches `{pattern}`")
        # a FieldInfo inside Annotated[...] carries its own metadata
        if hasattr(m, "metadata") and isinstance(m.metadata, list):
            out += constraint_words(m.metadata)
    return out


def field_constraints(field) -> list[str]:
    words = constraint_words(field.metadata)

    def inner(annotation, where: str) -> None:
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        if origin is typing.Annotated:
            words.extend(f"{where}{w}" for w in constraint_words(args[1:]))
            inner(args[0], where)
        elif origin in (list, tuple, set) and args:
            inner(args[0], "each item ")
        elif origin is dict and args:
            inner(args[1], "each value ")
        elif origin is typing.Union or type(annotation).__name__ == "UnionType":
            for a in args:
                inner(a, where)

    inner(field.annotation, "")
    return list(dict.fromkeys(words))


def source_comments(model: type) -> dict[str, str]:
    """{field: the comment lines right above it and the comment beside it}, from
    the class's source."""
    try:
        lines, start = inspect.getsourcelines(model)
    except (OSError, TypeError):
        return {}
    src = textwrap.dedent("".join(lines))
    comments: dict[int, str] = {}
    code_lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            code_lines.add(tok.start[0])
    out: dict[str, str] = {}
    cls = ast.parse(src).body[0]
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above, n = [], node.lineno - 1
            while n in comments and n not in code_lines:
                above.insert(0, comments[n])
                n -= 1
            beside = [comments[n] for n in range(node.lineno, node.end_lineno + 1) if n in comments and n in code_lines]
            text = " ".join(above + beside).strip()
            if text:
                out[node.target.id] = text
    return out


def _function(obj):
    obj = getattr(obj, "__func__", obj)
    return getattr(obj, "__wrapped__", obj)


def _first_paragraph(doc: str | None) -> str:
    return " ".join(inspect.cleandoc(doc).split("\n\n")[0].split()) if doc else ""


REPO = Path(__file__).resolve().parent.parent.parent


def _ours(obj) -> bool:
    """A function of this repository's code (not pydantic's, not the standard library's)."""
    func = _function(obj)
    if not inspect.isfunction(func):
        return False
    try:
        return Path(inspect.getfile(func)).resolve().is_relative_to(REPO) and ".venv" not in Path(inspect.getfile(func)).parts
    except (OSError, TypeError):
        return False


def rule_words(func, owner: type | None = None, depth: int = 2) -> list[str]:
    """A check in words: its docstring; else the docstrings of the functions
    (and the owner's methods) it calls, ``depth`` calls deep."""
    func = _function(func)
    doc = _first_paragraph(func.__doc__)
    if doc:
        return [doc]
    if depth == 0:
        return []
    try:
        src = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return []
    try:
        tree = ast.parse(src)
    except SyntaxError:  # a lambda in the middle of a line: parse from the lambda on
        at = src.find("lambda")
        tree = ast.parse(src[at:].rstrip().rstrip(")").rstrip(")").rstrip(")")) if at >= 0 else ast.parse("")
    out: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        callee = None
        if isinstance(node.func, ast.Name):
            callee = getattr(func, "__globals__", {}).get(node.func.id)
        elif isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name) and node.func.value.id in ("self", "cls") \
                and owner is not None:
            callee = getattr(owner, node.func.attr, None)
        if _ours(callee):
            out += [w for w in rule_words(callee, owner, depth - 1) if w not in out]
    return out


def model_rules(model: type) -> tuple[list[tuple[str, str]], list[str]]:
    """[(what it applies to, the rule in words)] of the model's own validators
    (and a profile's ``problems``), and the validators that have no words."""
    rules, missing = [], []
    decorators = model.__pydantic_decorators__
    for name, dec in list(decorators.field_validators.items()) + list(decorators.model_validators.items()):
        if name not in model.__dict__:
            continue  # inherited: listed with the class that defines it
        fields = getattr(dec.info, "fields", None)
        where = ", ".join(f"`{f}`" for f in fields) if fields else "the whole model"
        words = rule_words(dec.func, model)
        if words:
            rules.append((where, " ".join(words)))
        else:
            missing.append(f"{model.__module__}.{model.__qualname__}.{name} validates {where} but says nowhere what it checks "
                           "(give it a docstring)")
    # a profile's checks of the whole cluster (problems), a launcher section's (settle)
    for hook in ("problems", "settle"):
        fn = model.__dict__.get(hook)
        if fn is None:
            continue
        words = rule_words(fn, model)
        if words:
            rules.append((f"the whole cluster (`{hook}`)", " ".join(words)))
        else:
            missing.append(f"{model.__module__}.{model.__qualname__}.{hook} says nowhere what it checks (give it a docstring)")
    return rules, missing


def _cell(text: str) -> str:
    """Text for a table cell: a '|' outside code spans escaped (the tables extension does not split a
    row inside a code span, where an escape would show), on one line."""
    parts = re.split(r"(`[^`]*`)", text.replace("\n", " "))
    return "".join(part if part.startswith("`") else part.replace("|", "\\|") for part in parts)


def model_section(model: type) -> tuple[str, list[str]]:
    comments: dict[str, str] = {}
    for klass in reversed(model.__mro__):
        if _is_model(klass) and klass.__module__.split(".")[0] in ("llmdeploy", "systems", "launchers"):
            comments.update(source_comments(klass))
    doc = _first_paragraph(model.__doc__) if model.__doc__ and "__doc__" in model.__dict__ else ""
    lines = [f"## {model.__name__} {{#{anchor(model)}}}", "", f"`{model.__module__}.{model.__qualname__}`" + (f": {doc}" if doc else ""), ""]
    lines += ["| field | type | default | description |", "|---|---|---|---|"]
    for name, field in model.model_fields.items():
        text = field.description or comments.get(name, "")
        bounds = field_constraints(field)
        if bounds:
            if text and not text.endswith((".", ")")):
                text += "."
            text = (text + " " if text else "") + "Constraints: " + "; ".join(bounds) + "."
        lines.append(f"| `{name}` | {_cell(type_words(field.annotation))} | {_cell(default_words(field))} | {_cell(text)} |")
    rules, missing = model_rules(model)
    if rules:
        lines += ["", "Checked when the inventory loads:", ""]
        lines += [f"- {where}: {words}" for where, words in rules]
    return "\n".join(lines) + "\n", missing


def inventory_markdown() -> tuple[str, list[str]]:
    from llmdeploy.inventory import PLATFORMS

    models = inventory_models()
    head = [
        "# Inventory reference",
        "",
        "Generated from the pydantic models at every build of these pages "
        "(`docs/hooks/reference.py`): what an inventory module (`inventory/<cluster>.py`, "
        "`cluster = Cluster(...)`) may set. Everything is validated when the module loads, "
        "before any connection; a problem names the file, the field and the node. "
        "How to write one: [Pointing it at a real cluster](../real-cluster.md).",
        "",
        "## Platforms {#platforms}",
        "",
        "`Cluster.platform` is one of these (`llmdeploy.inventory.PLATFORMS`):",
        "",
        "| platform | hardware | vendor | devices per node |",
        "|---|---|---|---|",
    ]
    head += [f"| `{k}` | {p.name} | {p.vendor} | {p.devices} |" for k, p in PLATFORMS.items()]
    head += ["", "## Serving profiles {#profiles}", "",
             "`Cluster.profile` is one system's profile, built with the system's catalogue "
             "(`systems/<name>/catalogue.py`); its `kind` names the system:", ""]
    head += [f"- `{kind}`: [{cls.__name__}](#{anchor(cls)})" for kind, cls in profiles().items()]
    sections, missing = [], []
    for model in models:
        text, miss = model_section(model)
        sections.append(text)
        missing += miss
    return "\n".join(head) + "\n\n" + "\n".join(sections), missing


# --- the CLI ---------------------------------------------------------------------------
def invoke_output(*args: str) -> str:
    """What ``invoke ARGS`` prints for the repository's tasks.py, in 80 columns
    (Invoke's width when its output is not a terminal)."""
    from invoke.main import program

    import tasks

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        # the installed invoke's own program, finding tasks.py as it does from the repository's root
        program.run(["invoke", "--search-root", str(Path(tasks.__file__).parent), *args], exit=False)
    return out.getvalue()


def task_names() -> list[str]:
    from tasks import ns

    return sorted(ns.task_names)


def exit_statuses() -> list[str]:
    """One line per exit status a task ends with: each LlmdeployError class's
    ``exit_code`` and docstring, then the exceptions ``tasks._guard`` turns
    into a fixed status."""
    import llmdeploy.lock  # noqa: F401 (LockHeld)
    import tasks
    from llmdeploy.errors import LlmdeployError

    def classes(cls):
        yield cls
        for sub in cls.__subclasses__():
            yield from classes(sub)

    subclasses = sorted(set(classes(LlmdeployError)) - {LlmdeployError}, key=lambda c: c.exit_code)
    lines = [f"- {c.exit_code}: {_first_paragraph(c.__doc__)} (`{c.__name__}`)" for c in subclasses if c.exit_code != LlmdeployError.exit_code]
    guard = ast.parse(textwrap.dedent(inspect.getsource(tasks._guard)))
    for handler in ast.walk(guard):
        if not isinstance(handler, ast.ExceptHandler) or not isinstance(handler.type, ast.Name):
            continue
        for call in ast.walk(handler):
            if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "Exit":
                code = next((k.value for k in call.keywords if k.arg == "code"), None)
                if isinstance(code, ast.Constant):
                    lines.append(f"- {code.value}: `{handler.type.id}`")
    return lines


def cli_markdown() -> tuple[str, list[str]]:
    lines = [
        "# CLI reference",
        "",
        "Generated from `tasks.py` at every build of these pages (`docs/hooks/reference.py`): "
        "exactly what `invoke --list` and `invoke --help TASK` print. `-h` is the same as `--help`. "
        "Every task takes `--cluster`, the name of a module in `inventory/` (or in `$LLMDEPLOY_INVENTORY`).",
        "",
        "## Exit status {#exit-status}",
        "",
        "0: every host fine; 1: a host failed or was unreachable (the recap names it), or the command failed. "
        "The other statuses come from the errors' classes (`llmdeploy.errors.LlmdeployError`'s subclasses) "
        "and `tasks._guard` (130: Ctrl-C or SIGTERM, raised where no lock is held, `llmdeploy/interrupt.py`):",
        "",
        *exit_statuses(),
        "",
        "## invoke --list {#list}",
        "",
        "```text",
        invoke_output("--list").rstrip(),
        "```",
        "",
    ]
    problems = []
    for name in task_names():
        text = invoke_output("--help", name).rstrip()
        if "Docstring:" not in text:
            problems.append(f"invoke --help {name} printed no docstring")
        lines += [f"## {name} {{#{name.replace('.', '-')}}}", "", "```text", text, "```", ""]
    return "\n".join(lines), problems
