"""The product's functions stay short enough to read whole (issue 44): none
in llmdeploy/, transports/, flows/, roles/, systems/, platforms/ or tasks.py is longer
than 60 lines, its docstring included. A longer one is split where its
parts have names of their own."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("llmdeploy", "transports", "flows", "roles", "systems", "platforms")
LIMIT = 60


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_function_of_the_product_is_longer_than_60_lines():
    files = [p for d in PRODUCT for p in sorted((ROOT / d).rglob("*.py"))] + [ROOT / "tasks.py"]
    assert len(files) > 50
    long = [f"{p.relative_to(ROOT)}:{line} {name} ({n} lines)" for p in files for name, line, n in _functions(p) if n > LIMIT]
    assert long == [], "\n".join(long)
