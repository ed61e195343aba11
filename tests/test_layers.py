"""The three floors of docs/design.md section 2, enforced by reading every module's imports.

The core (`leaderboard`) imports no layer; `jobs`, `speed_layer` and `serving` import only
the core, never one another; only `app` and `dags` wire layers together. `serving` never
imports pyspark, and a DAG file imports nothing heavy at module level (the scheduler parses
it every few seconds). Imports inside functions count too: a layer that reaches sideways
lazily is still coupled. The source is parsed with `ast`, never imported, so a violation is
found even in a module no test runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FIRST_PARTY = ("leaderboard", "jobs", "speed_layer", "serving", "app", "dags")

#: Which first-party packages each package may import (besides itself).
ALLOWED = {
    "leaderboard": set(),
    "jobs": {"leaderboard"},
    "speed_layer": {"leaderboard"},
    "serving": {"leaderboard"},
    "app": {"leaderboard", "jobs", "speed_layer", "serving"},
    "dags": {"leaderboard", "jobs", "speed_layer", "serving"},
}

#: Libraries a DAG file must not import at module level (only inside its tasks).
HEAVY = {"pyspark", "duckdb", "pyarrow", "pandas", "numpy", "redis", "matplotlib", "fastapi",
         *(name for name in FIRST_PARTY if name != "dags")}

__all__: list[str] = []


def _modules(package: str, root: Path = ROOT) -> list[Path]:
    return sorted((root / package).rglob("*.py"))


def _absolute(node: ast.ImportFrom, path: Path, root: Path) -> str:
    """The absolute module an ImportFrom names (relative imports resolved from `path`)."""
    if node.level == 0:
        return node.module or ""
    parts = list(path.relative_to(root).with_suffix("").parts)
    base = parts[: len(parts) - node.level]
    return ".".join([*base, *([node.module] if node.module else [])])


def imports(path: Path, root: Path = ROOT, *,
            top_level_only: bool = False) -> list[tuple[int, str]]:
    """(line, top-level package) of every import in a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: list[tuple[int, str]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, _absolute(node, path, root).split(".")[0]))
    return found


def violations(package: str, root: Path = ROOT) -> list[str]:
    bad: list[str] = []
    for path in _modules(package, root):
        for line, name in imports(path, root):
            if name in FIRST_PARTY and name != package and name not in ALLOWED[package]:
                bad.append(f"{path.relative_to(root)}:{line} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_floor_imports_only_the_floors_below(package):
    assert _modules(package), f"{package}/ holds no module: is the layout still as documented?"
    assert violations(package) == []


def test_serving_never_imports_pyspark():
    bad = [f"{path.relative_to(ROOT)}:{line}"
           for path in _modules("serving")
           for line, name in imports(path) if name == "pyspark"]
    assert bad == []


def test_dag_files_import_nothing_heavy_at_module_level():
    bad = [f"{path.relative_to(ROOT)}:{line} imports {name}"
           for path in _modules("dags")
           for line, name in imports(path, top_level_only=True) if name in HEAVY]
    assert bad == []


def test_the_check_sees_a_sideways_import(tmp_path):
    """The checker itself: a lazy sideways import inside a function is reported."""
    package = tmp_path / "serving"
    package.mkdir()
    (package / "x.py").write_text("def f():\n    from jobs.batch import run_batch\n")
    (package / "y.py").write_text("from . import x\nfrom ..jobs import batch\n")
    assert violations("serving", tmp_path) == [
        "serving/x.py:2 imports jobs",
        "serving/y.py:2 imports jobs",
    ]
