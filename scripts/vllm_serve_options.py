"""Regenerate ``sim/standins/vllm_serve_options.txt``: every option ``vllm serve``
accepts, read from vLLM's own sources in a downloaded wheel (and, when given,
what a vllm-ascend source archive adds), so that the simulated ``vllm serve``
refuses exactly what the real parser refuses.

    pip download --no-deps -d /tmp/vllm vllm==0.23.0
    # vllm-ascend ships only an sdist, whose metadata pip builds before saving
    # it: that needs setuptools-scm (not its whole build environment) and a chip
    python3 -m venv /tmp/va && /tmp/va/bin/pip install setuptools setuptools-scm wheel
    SOC_VERSION=ascend910_9391 /tmp/va/bin/pip download --no-deps --no-build-isolation \\
        -d /tmp/vllm-ascend vllm-ascend==0.23.0.post1
    python3 scripts/vllm_serve_options.py /tmp/vllm/vllm-0.23.0-*.whl \\
        --ascend /tmp/vllm-ascend/vllm_ascend-0.23.0.post1.tar.gz -o sim/standins/vllm_serve_options.txt

Nothing is imported from the wheel (it needs torch): the sources are read
with ``ast``, the way vLLM builds its parser (vLLM 0.23.0):

- ``vllm/entrypoints/cli/main.py``: the top-level parser ``vllm`` (its own
  options, and the subcommands in ``CMD_MODULES`` order, each module's
  ``cmd_init`` and each command's ``name``);
- ``vllm/entrypoints/cli/serve.py``: the ``serve`` subparser (its ``usage``)
  and ``make_arg_parser``;
- ``vllm/entrypoints/openai/cli_args.py``: ``make_arg_parser``'s own
  ``add_argument`` calls, then ``FrontendArgs.add_cli_args``: one
  ``--kebab-case`` option per field of ``FrontendArgs`` and
  ``BaseFrontendArgs``, after their ``_customize_cli_kwargs``;
- ``vllm/engine/arg_utils.py``: ``EngineArgs.add_cli_args`` and
  ``AsyncEngineArgs.add_cli_args``, whose ``add_argument`` calls name their
  flags literally and take their other keywords from ``get_kwargs(<Config>)``:
  the config dataclass field's type decides the arity as ``_compute_kwargs``
  does (a dataclass: one value; ``bool | str | None``: an optional value;
  any other ``bool``: ``argparse.BooleanOptionalAction``, hence also
  ``--no-<flag>``; ``tuple``/``list``/``set``: ``nargs``; else one value);
- ``vllm/config/*.py`` and wherever their type aliases live.

Output: one line per argparse action: its option strings (comma-separated),
its arity (``flag``: no value; ``bool``: no value, ``--no-`` form listed;
``1``; ``?``; ``+``; a number; ``help``; ``version``) and where it came from.
Lines starting with ``@`` carry the parser's name, usage and subcommands.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import posixpath
import sys
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

BUILTIN_SCALARS = {"bool", "str", "int", "float", "dict", "list", "tuple", "set", "bytes", "object"}
DATACLASS_DECORATORS = {"dataclass", "config"}
ENGINE_FILE = "vllm/engine/arg_utils.py"
FRONTEND_FILE = "vllm/entrypoints/openai/cli_args.py"
MAIN_FILE = "vllm/entrypoints/cli/main.py"
SERVE_FILE = "vllm/entrypoints/cli/serve.py"


class SourceError(Exception):
    """The sources do not have the shape this script reads: say where."""


# --- reading the archive ------------------------------------------------------------------
class Sources:
    """The ``.py`` files of a wheel (a zip), by path and by module name."""

    def __init__(self, files: dict[str, str]):
        self.files = files
        self._trees: dict[str, ast.Module] = {}

    def text(self, path: str) -> str:
        if path not in self.files:
            raise SourceError(f"{path}: not in the wheel")
        return self.files[path]

    def tree(self, path: str) -> ast.Module:
        if path not in self._trees:
            self._trees[path] = ast.parse(self.text(path), filename=path)
        return self._trees[path]

    def path_of(self, module: str) -> str | None:
        base = module.replace(".", "/")
        for p in (f"{base}.py", f"{base}/__init__.py"):
            if p in self.files:
                return p
        return None


def read_wheel(path: Path) -> Sources:
    with zipfile.ZipFile(path) as z:
        return Sources({n: z.read(n).decode("utf-8") for n in z.namelist() if n.startswith("vllm/") and n.endswith(".py")})


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# --- names: classes, aliases, imports -------------------------------------------------------
def _module_of(path: str) -> str:
    mod = path[:-3].replace("/", ".")
    return mod[: -len(".__init__")] if mod.endswith(".__init__") else mod


def _absolute(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_statements(body: list[ast.stmt]):
    """Top-level statements as they run: ``if TYPE_CHECKING`` takes its else
    branch (what the interpreter sees when vLLM builds its parser); other
    ``if``/``try`` blocks contribute every branch."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            if _is_type_checking(stmt.test):
                yield from _runtime_statements(stmt.orelse)
            else:
                yield from _runtime_statements(stmt.body)
                yield from _runtime_statements(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from _runtime_statements(stmt.body)
            for h in stmt.handlers:
                yield from _runtime_statements(h.body)
        else:
            yield stmt


@dataclass
class Found:
    """What a name is in a module: a class, an expression (an alias), or nothing we can read."""

    module: str
    cls: ast.ClassDef | None = None
    expr: ast.expr | None = None


class Names:
    def __init__(self, src: Sources):
        self.src = src

    def lookup(self, module: str, name: str, depth: int = 0) -> Found | None:
        """Where ``name`` comes from, as seen at runtime in ``module``; None
        when it is not vLLM's (typing, torch, a builtin) or cannot be read."""
        if depth > 20:
            raise SourceError(f"{module}: import cycle while looking up {name}")
        path = self.src.path_of(module)
        if path is None:
            return None
        tree = self.src.tree(path)
        for stmt in _runtime_statements(tree.body):
            if isinstance(stmt, ast.ClassDef) and stmt.name == name:
                return Found(module, cls=stmt)
            if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets):
                return Found(module, expr=stmt.value)
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id == name and stmt.value is not None:
                return Found(module, expr=stmt.value)
            if isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name:
                        src = _absolute(module, stmt, path.endswith("__init__.py"))
                        if not src.startswith("vllm"):
                            return None
                        if self.src.path_of(f"{src}.{alias.name}") is not None:
                            return None  # a module, not a type
                        return self.lookup(src, alias.name, depth + 1)
        return None


# --- a field's type, as _compute_kwargs sees it -------------------------------------------------
@dataclass
class Hints:
    """The members of a (flattened) type hint that decide the arity."""

    kinds: set[str] = field(default_factory=set)  # bool, str, None, int, float, dict, Literal, dataclass, class
    collections: list[tuple[str, ast.expr | None]] = field(default_factory=list)  # (list|tuple|set, subscript slice)


def _name(expr: ast.expr) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        return expr.attr
    return None


def _is_dataclass(cls: ast.ClassDef) -> bool:
    for d in cls.decorator_list:
        target = d.func if isinstance(d, ast.Call) else d
        if _name(target) in DATACLASS_DECORATORS:
            return True
    return False


def hints(names: Names, module: str, expr: ast.expr, out: Hints | None = None, depth: int = 0) -> Hints:
    """``get_type_hints`` of vllm/engine/arg_utils.py over source text: unions
    and ``Optional``/``Annotated`` flattened, aliases followed."""
    out = out if out is not None else Hints()
    if depth > 30:
        raise SourceError(f"{module}: type alias too deep at line {getattr(expr, 'lineno', '?')}")
    if isinstance(expr, ast.Constant):
        if expr.value is None:
            out.kinds.add("None")
        elif isinstance(expr.value, str):  # a forward reference
            hints(names, module, ast.parse(expr.value, mode="eval").body, out, depth + 1)
        else:
            raise SourceError(f"{module}: unexpected constant {expr.value!r} in a type at line {expr.lineno}")
        return out
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.BitOr):
        hints(names, module, expr.left, out, depth + 1)
        hints(names, module, expr.right, out, depth + 1)
        return out
    if isinstance(expr, ast.Subscript):
        head = _name(expr.value)
        args = expr.slice.elts if isinstance(expr.slice, ast.Tuple) else [expr.slice]
        if head == "Union":
            for a in args:
                hints(names, module, a, out, depth + 1)
        elif head == "Optional":
            hints(names, module, args[0], out, depth + 1)
            out.kinds.add("None")
        elif head == "Annotated":
            hints(names, module, args[0], out, depth + 1)
        elif head == "Literal":
            out.kinds.add("Literal")
        elif head in ("list", "tuple", "set", "List", "Tuple", "Set"):
            out.collections.append((head.lower(), expr.slice))
        elif head in ("dict", "Dict", "Mapping"):
            out.kinds.add("dict")
        else:  # a generic class: not builtin
            out.kinds.add("class")
        return out
    name = _name(expr)
    if name is None:
        raise SourceError(f"{module}: cannot read the type at line {getattr(expr, 'lineno', '?')}: {ast.unparse(expr)}")
    if name == "None":
        out.kinds.add("None")
        return out
    if name in ("list", "tuple", "set"):
        out.collections.append((name, None))
        return out
    if name in BUILTIN_SCALARS and isinstance(expr, ast.Name):
        out.kinds.add(name)
        return out
    found = names.lookup(module, name) if isinstance(expr, ast.Name) else None
    if found is None:
        out.kinds.add("class")  # typing.Any, torch.dtype, ...: not builtin
    elif found.cls is not None:
        out.kinds.add("dataclass" if _is_dataclass(found.cls) else "class")
    else:
        hints(names, found.module, found.expr, out, depth + 1)
    return out


def arity_of_type(h: Hints) -> str:
    """``_compute_kwargs``'s order of cases (vllm/engine/arg_utils.py)."""
    if "dataclass" in h.kinds:
        return "1"
    if not h.collections and h.kinds == {"bool", "str", "None"}:
        return "?"
    if "bool" in h.kinds:
        return "bool"
    if "Literal" in h.kinds:
        return "1"
    for kind in ("tuple", "list", "set"):
        for k, sl in h.collections:
            if k == kind:
                if kind == "tuple" and sl is not None:
                    elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
                    if not any(isinstance(e, ast.Constant) and e.value is Ellipsis for e in elts):
                        return str(len(elts))
                return "+"
    return "1"


def class_fields(names: Names, module: str, cls: ast.ClassDef) -> dict[str, tuple[str, ast.expr]]:
    """A dataclass's fields (bases first, as ``dataclasses.fields``): name -> (module, annotation)."""
    out: dict[str, tuple[str, ast.expr]] = {}
    for base in cls.bases:
        b = names.lookup(module, base.id) if isinstance(base, ast.Name) else None
        if b is not None and b.cls is not None:
            out.update(class_fields(names, b.module, b.cls))
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            ann = stmt.annotation
            head = _name(ann.value) if isinstance(ann, ast.Subscript) else _name(ann)
            if head in ("ClassVar", "InitVar"):
                continue
            out[stmt.target.id] = (module, ann)
    return out


# --- add_argument calls -----------------------------------------------------------------------
@dataclass
class Option:
    strings: list[str]
    arity: str
    source: str


def _literal_strings(call: ast.Call) -> list[str]:
    out = []
    for a in call.args:
        if isinstance(a, ast.Constant) and isinstance(a.value, str):
            out.append(a.value)
        else:
            raise SourceError(f"add_argument at line {call.lineno}: a flag that is not a literal: {ast.unparse(a)}")
    return out


def _sub(expr: ast.expr) -> tuple[str, str] | None:
    """``X["f"]`` -> ("X", "f")."""
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Name) and isinstance(expr.slice, ast.Constant):
        return expr.value.id, expr.slice.value
    return None


def _action_arity(action: ast.expr | None, nargs: ast.expr | None, typed: str | None) -> str:
    """Arity from explicit keywords, else from the field's type."""
    act = None
    if action is not None:
        act = action.value if isinstance(action, ast.Constant) else _name(action)
    if act in ("store_true", "store_false", "store_const", "count"):
        return "flag"
    if act == "BooleanOptionalAction":
        return "bool"
    if act == "version":
        return "version"
    if nargs is not None:
        if isinstance(nargs, ast.Constant):
            return str(nargs.value)
        raise SourceError(f"line {nargs.lineno}: nargs that is not a literal: {ast.unparse(nargs)}")
    if typed is not None and act not in ("append", "extend"):
        return typed
    if typed is not None and act in ("append", "extend"):
        return typed if typed not in ("bool", "?") else "1"
    return "1"


class KwargsState:
    """The ``get_kwargs(<Config>)`` dictionaries of one function, with the
    changes the function makes to them before ``add_argument`` (an ``action``
    set, ``nargs`` deleted), in statement order."""

    def __init__(self, names: Names, module: str):
        self.names, self.module = names, module
        self.classes: dict[str, tuple[str, ast.ClassDef]] = {}  # variable -> (module, class)
        self.aliases: dict[str, tuple[str, str]] = {}  # variable -> (kwargs variable, field)
        self.changes: dict[tuple[str, str], dict[str, ast.expr | None]] = {}

    def bind_class(self, var: str, cls_name: str) -> None:
        found = self.names.lookup(self.module, cls_name)
        if found is None or found.cls is None:
            raise SourceError(f"{self.module}: get_kwargs({cls_name}): class not found in the wheel")
        self.classes[var] = (found.module, found.cls)

    def field_arity(self, var: str, fname: str) -> tuple[str, str]:
        if var not in self.classes:
            raise SourceError(f"{self.module}: {var}[{fname!r}] used, but {var} is not get_kwargs(<a config class>)")
        mod, cls = self.classes[var]
        fields_ = class_fields(self.names, mod, cls)
        if fname not in fields_:
            raise SourceError(f"{mod}: {cls.name} has no field {fname!r} (used as {var}[{fname!r}])")
        fmod, ann = fields_[fname]
        typed = arity_of_type(hints(self.names, fmod, ann))
        ch = self.changes.get((var, fname), {})
        if "nargs" in ch and ch["nargs"] is None and (typed in ("+", "*") or typed.isdigit()):
            typed = "1"  # del kwargs[field]["nargs"]: one value
        arity = _action_arity(ch.get("action"), ch.get("nargs"), typed)
        return arity, f"{cls.name}.{fname}"

    def statement(self, stmt: ast.stmt) -> None:
        """Follow assignments that build or change the kwargs."""
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
            if isinstance(target, ast.Name):
                if isinstance(value, ast.Call) and _name(value.func) == "get_kwargs" and value.args:
                    arg = value.args[0]
                    if isinstance(arg, ast.Name) and arg.id != "cls":
                        self.bind_class(target.id, arg.id)
                elif (s := _sub(value)) is not None and s[0] in self.classes:
                    self.aliases[target.id] = s
                return
            # X["f"]["key"] = ... / alias["key"] = ...
            if isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant):
                key = target.slice.value
                owner = _sub(target.value)
                if owner is None and isinstance(target.value, ast.Name) and target.value.id in self.aliases:
                    owner = self.aliases[target.value.id]
                if owner is not None and key in ("action", "nargs"):
                    self.changes.setdefault(owner, {})[key] = value
        elif isinstance(stmt, ast.Delete):
            for t in stmt.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and (owner := _sub(t.value)) is not None:
                    self.changes.setdefault(owner, {})[t.slice.value] = None


def _statements(body: list[ast.stmt]):
    """Every statement of a function body in source order (branches included:
    ``--model`` is added unless ``serve --help`` is asked for)."""
    for stmt in body:
        yield stmt
        for attr in ("body", "orelse", "finalbody"):
            inner = getattr(stmt, attr, None)
            if isinstance(inner, list) and not isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
                yield from _statements(inner)


def _calls_in(stmt: ast.stmt):
    for node in ast.walk(stmt):
        if isinstance(node, ast.Call) and _name(node.func) == "add_argument":
            yield node


def options_of_function(names: Names, module: str, path: str, func: ast.FunctionDef, where: str) -> list[Option]:
    """Every ``add_argument`` call in ``func``, with its arity."""
    state = KwargsState(names, module)
    out: list[Option] = []
    for stmt in _statements(func.body):
        state.statement(stmt)
        if isinstance(stmt, (ast.Expr, ast.Assign)):
            for call in _calls_in(stmt):
                out.append(_option(state, path, call, where))
    return out


def _option(state: KwargsState, path: str, call: ast.Call, where: str) -> Option:
    strings = _literal_strings(call)
    kw = {k.arg: k.value for k in call.keywords if k.arg is not None}
    typed, field_name = None, None
    for k in call.keywords:
        if k.arg is not None:
            continue
        # **X["f"], or **{**X["f"], "default": None}
        spread = k.value
        if isinstance(spread, ast.Dict):
            for key, value in zip(spread.keys, spread.values):
                if key is None and (s := _sub(value)) is not None:
                    typed, field_name = state.field_arity(*s)
                elif isinstance(key, ast.Constant) and key.value in ("action", "nargs"):
                    kw[key.value] = value
        elif (s := _sub(spread)) is not None:
            typed, field_name = state.field_arity(*s)
        elif isinstance(spread, ast.Name) and spread.id in state.aliases:
            typed, field_name = state.field_arity(*state.aliases[spread.id])
        else:
            raise SourceError(f"{path}:{call.lineno}: cannot read **{ast.unparse(spread)}")
    if typed is not None and "action" not in kw and "nargs" not in kw:
        arity = typed
    else:
        arity = _action_arity(kw.get("action"), kw.get("nargs"), typed)
    if arity == "bool":
        strings = negatable(strings)
    source = f"{path}:{call.lineno} {where}" + (f" ({field_name})" if field_name else "")
    return Option(strings, arity, source)


def negatable(strings: list[str]) -> list[str]:
    """argparse.BooleanOptionalAction's option strings: each ``--x`` followed by ``--no-x``."""
    out = []
    for s in strings:
        out.append(s)
        if s.startswith("--"):
            out.append(f"--no-{s[2:]}")
    return out


def _find_function(tree: ast.Module, dotted: str, path: str) -> ast.FunctionDef:
    parts = dotted.split(".")
    nodes: list[ast.stmt] = tree.body
    found: ast.AST | None = None
    for part in parts:
        found = next((n for n in nodes if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if found is None:
            raise SourceError(f"{path}: no {dotted}")
        nodes = found.body
    assert isinstance(found, ast.FunctionDef)
    return found


# --- the frontend dataclasses ---------------------------------------------------------------------
def frontend_options(names: Names, src: Sources) -> list[Option]:
    """``FrontendArgs.add_cli_args``: every field of FrontendArgs (and its
    base) as ``--kebab-case``, after both ``_customize_cli_kwargs``."""
    path, module = FRONTEND_FILE, _module_of(FRONTEND_FILE)
    tree = src.tree(path)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    for needed in ("FrontendArgs", "BaseFrontendArgs"):
        if needed not in classes:
            raise SourceError(f"{path}: no class {needed}")
    add = _find_function(tree, "BaseFrontendArgs.add_cli_args", path)
    if not any(isinstance(n, ast.JoinedStr) and "--" in ast.unparse(n) for n in ast.walk(add)):
        raise SourceError(f"{path}: BaseFrontendArgs.add_cli_args no longer builds --<field> flags")
    state = KwargsState(names, module)
    state.classes["frontend_kwargs"] = (module, classes["FrontendArgs"])
    for cls in ("BaseFrontendArgs", "FrontendArgs"):
        for stmt in _statements(_find_function(tree, f"{cls}._customize_cli_kwargs", path).body):
            state.statement(stmt)
    out = []
    for fname in class_fields(names, module, classes["FrontendArgs"]):
        arity, field_name = state.field_arity("frontend_kwargs", fname)
        flag = "--" + fname.replace("_", "-")
        strings = negatable([flag]) if arity == "bool" else [flag]
        fmod, ann = class_fields(names, module, classes["FrontendArgs"])[fname]
        out.append(Option(strings, arity, f"{src.path_of(fmod)}:{ann.lineno} FrontendArgs.add_cli_args ({field_name})"))
    return out


# --- the top-level parser and the subcommands ---------------------------------------------------------
def top_level(names: Names, src: Sources) -> tuple[list[Option], list[str]]:
    tree = src.tree(MAIN_FILE)
    main = _find_function(tree, "main", MAIN_FILE)
    opts = [_option(KwargsState(names, "vllm.entrypoints.cli.main"), MAIN_FILE, c, "main")
            for s in _statements(main.body) if isinstance(s, ast.Expr) for c in _calls_in(s)]
    cmd_modules = None
    for stmt in _statements(main.body):
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "CMD_MODULES" for t in stmt.targets):
            cmd_modules = [ast.unparse(e) for e in stmt.value.elts]
    if not cmd_modules:
        raise SourceError(f"{MAIN_FILE}: no CMD_MODULES list in main()")
    commands = []
    for mod in cmd_modules:
        path = src.path_of(mod)
        if path is None:
            raise SourceError(f"{MAIN_FILE}: CMD_MODULES names {mod}, which is not in the wheel")
        mtree = src.tree(path)
        init = _find_function(mtree, "cmd_init", path)
        ret = next((s.value for s in ast.walk(init) if isinstance(s, ast.Return)), None)
        if not isinstance(ret, ast.List):
            raise SourceError(f"{path}: cmd_init does not return a list literal")
        for call in ret.elts:
            cls_name = _name(call.func) if isinstance(call, ast.Call) else None
            found = names.lookup(_module_of(path), cls_name) if cls_name else None
            if found is None or found.cls is None:
                raise SourceError(f"{path}: cmd_init returns {ast.unparse(call)}: class not found")
            name = next((s.value.value for s in found.cls.body if isinstance(s, ast.Assign)
                         and any(isinstance(t, ast.Name) and t.id == "name" for t in s.targets)
                         and isinstance(s.value, ast.Constant)), None)
            if name is None:
                raise SourceError(f"{path}: {cls_name} has no literal name")
            commands.append(name)
    return opts, commands


def serve_usage(src: Sources) -> str:
    tree = src.tree(SERVE_FILE)
    init = _find_function(tree, "ServeSubcommand.subparser_init", SERVE_FILE)
    for node in ast.walk(init):
        if isinstance(node, ast.Call) and _name(node.func) == "add_parser":
            for k in node.keywords:
                if k.arg == "usage" and isinstance(k.value, ast.Constant):
                    return k.value.value
    raise SourceError(f"{SERVE_FILE}: ServeSubcommand.subparser_init gives no literal usage")


def serve_options(names: Names, src: Sources) -> list[Option]:
    """``make_arg_parser`` in its order: its own calls, FrontendArgs,
    AsyncEngineArgs (EngineArgs' first), plus argparse's own -h/--help."""
    tree = src.tree(FRONTEND_FILE)
    make = _find_function(tree, "make_arg_parser", FRONTEND_FILE)
    calls = ast.unparse(make)
    for needed in ("FrontendArgs.add_cli_args(parser)", "AsyncEngineArgs.add_cli_args(parser)"):
        if needed not in calls:
            raise SourceError(f"{FRONTEND_FILE}: make_arg_parser no longer calls {needed}")
    out = [Option(["-h", "--help"], "help", "argparse (add_help)")]
    own = options_of_function(names, _module_of(FRONTEND_FILE), FRONTEND_FILE, make, "make_arg_parser")
    out += own
    out += frontend_options(names, src)
    etree = src.tree(ENGINE_FILE)
    emod = _module_of(ENGINE_FILE)
    out += options_of_function(names, emod, ENGINE_FILE, _find_function(etree, "EngineArgs.add_cli_args", ENGINE_FILE), "EngineArgs.add_cli_args")
    out += options_of_function(names, emod, ENGINE_FILE, _find_function(etree, "AsyncEngineArgs.add_cli_args", ENGINE_FILE), "AsyncEngineArgs.add_cli_args")
    seen: dict[str, str] = {}
    for o in out:
        for s in o.strings:
            if s in seen:
                raise SourceError(f"{s} defined twice: {seen[s]} and {o.source} (argparse would refuse the parser)")
            seen[s] = o.source
    return out


# --- vllm-ascend -----------------------------------------------------------------------------------
def ascend_additions(sdist: Path) -> tuple[list[Option], list[str]]:
    """Options the plugin adds (``add_argument`` calls in its package, tests
    and build tools aside) and what it changes on existing ones (every use of
    ``_option_string_actions``), each with its file."""
    added: list[Option] = []
    notes: list[str] = []
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if len(parts) < 3 or parts[1] != "vllm_ascend" or not member.name.endswith(".py"):
                continue
            data = tar.extractfile(member)
            if data is None:
                continue
            rel = posixpath.join(*parts[1:])
            tree = ast.parse(data.read().decode("utf-8"), filename=rel)
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and _name(node.func) == "add_argument":
                    strings = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                    if any(s.startswith("-") for s in strings):
                        kw = {k.arg: k.value for k in node.keywords if k.arg}
                        added.append(Option(strings, _action_arity(kw.get("action"), kw.get("nargs"), None), f"vllm-ascend {rel}:{node.lineno}"))
                if isinstance(node, ast.Attribute) and node.attr == "_option_string_actions":
                    notes.append(f"{rel}:{node.lineno}")
    return added, notes


# --- output ------------------------------------------------------------------------------------------
def render(wheel: Path, src: Sources, ascend: Path | None) -> str:
    names = Names(src)
    top, commands = top_level(names, src)
    usage = serve_usage(src)
    serve = serve_options(names, src)
    version = None
    for stmt in src.tree("vllm/_version.py").body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__version__" for t in stmt.targets):
            version = ast.literal_eval(stmt.value)
    lines = [
        "# Every option `vllm serve` accepts: read by the simulated vllm (sim/standins/vllm.py).",
        "# Generated by scripts/vllm_serve_options.py (do not edit by hand) from",
        f"#   {wheel.name} (vllm {version or '?'}) sha256 {sha256(wheel)}",
        f"#   files: {MAIN_FILE} (parser vllm, subcommands), {SERVE_FILE} (serve's usage),",
        f"#   {FRONTEND_FILE} (make_arg_parser, FrontendArgs), {ENGINE_FILE} (EngineArgs, AsyncEngineArgs),",
        "#   vllm/config/*.py (the config dataclasses' field types)",
    ]
    extra: list[Option] = []
    if ascend is not None:
        extra, notes = ascend_additions(ascend)
        lines.append(f"#   {ascend.name} sha256 {sha256(ascend)}: "
                     + (f"adds {len(extra)} option(s), listed with their file" if extra else "adds no option (no add_argument call in vllm_ascend/)"))
        if notes:
            lines.append(f"#   it changes existing actions at {', '.join(notes)} (NPUPlatform.pre_register_and_update: appends 'ascend' to")
            lines.append("#   --quantization's choices when that action has choices; vLLM's --quantization takes any string)")
    lines += [
        "# A line: option strings (comma-separated), arity, source. Arity: flag (no value),",
        "# bool (argparse.BooleanOptionalAction: no value; --no- form listed), 1, ?, +, N values,",
        "# help, version. @ lines: the parsers' names, usage and subcommands.",
        "@prog vllm",
        f"@subcommands {','.join(commands)}",
        f"@serve-usage {usage}",
    ]
    for o in top:
        lines.append(f"@top {','.join(o.strings)} {o.arity} {o.source}")
    lines.append("@top -h,--help help argparse (add_help)")
    lines.append("@positional model_tag ? vllm/entrypoints/openai/cli_args.py make_arg_parser")
    for o in serve + extra:
        flags = [s for s in o.strings if s.startswith("-")]
        if not flags:
            continue  # the positional model_tag, above
        lines.append(f"{','.join(flags)} {o.arity} {o.source}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("wheel", type=Path, help="the vllm wheel (pip download --no-deps vllm==VERSION)")
    p.add_argument("--ascend", type=Path, help="the vllm-ascend sdist, to list what it adds")
    p.add_argument("-o", "--output", type=Path, help="write here (default: standard output)")
    a = p.parse_args(argv)
    for f in (a.wheel, a.ascend):
        if f is not None and not f.is_file():
            print(f"vllm_serve_options: {f}: no such file", file=sys.stderr)
            return 2
    try:
        text = render(a.wheel, read_wheel(a.wheel), a.ascend)
    except (SourceError, SyntaxError, zipfile.BadZipFile, tarfile.TarError) as exc:
        print(f"vllm_serve_options: {exc}", file=sys.stderr)
        return 1
    if a.output:
        a.output.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
