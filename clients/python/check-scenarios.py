"""Fails when a row of docs/client-scenarios.md has no Python test, or a test names an id that
is not a row. A test names its rows with @pytest.mark.scenario("<id>", ...); read with ast, so
only a real decorator counts (not a comment or a string elsewhere)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
table = (here.parents[1] / "docs" / "client-scenarios.md").read_text()
rows = set(re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M))
covered: dict[str, list[str]] = {}
for path in sorted((here / "tests").glob("test_*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if not node.name.startswith("test_"):
            continue
        for deco in node.decorator_list:
            if (isinstance(deco, ast.Call) and isinstance(deco.func, ast.Attribute)
                    and deco.func.attr == "scenario"):
                for arg in deco.args:
                    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                        covered.setdefault(arg.value, []).append(f"{path.name}::{node.name}")
missing = sorted(rows - covered.keys())
unknown = sorted(covered.keys() - rows)
for row in missing:
    print(f"scenarios: row `{row}` has no Python test", file=sys.stderr)
for row in unknown:
    print(f"scenarios: {covered[row]} name `{row}`, which is not a row", file=sys.stderr)
if not rows:
    print("scenarios: no rows found in docs/client-scenarios.md", file=sys.stderr)
if missing or unknown or not rows:
    sys.exit(1)
print(f"scenarios: {len(rows)} rows, each with a Python test")
