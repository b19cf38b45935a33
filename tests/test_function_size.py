"""No function of the simulator (``sim``) or the middle floor (``scenario`` and ``search``) is
over 150 lines: a longer one is split into named steps (the reference engine's steps are
methods of one replay, the numba engine's iteration start is its scheduling steps, ``optimize``
is its stages)."""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "optimizer"
MAX_LINES = 150
CHECKED = [
    SOURCE / "scenario.py",
    *sorted((SOURCE / "search").rglob("*.py")),
    *sorted((SOURCE / "sim").rglob("*.py")),
]


def long_functions(path: Path, limit: int = MAX_LINES) -> list[tuple[str, int]]:
    """Every function (methods and nested ones too) of ``path`` over ``limit`` lines."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            lines = node.end_lineno - node.lineno + 1
            if lines > limit:
                found.append((node.name, lines))
    return found


def test_no_function_of_sim_scenario_or_search_is_over_150_lines() -> None:
    over = [
        f"{path.relative_to(SOURCE).as_posix()}: {name} ({lines} lines)"
        for path in CHECKED
        for name, lines in long_functions(path)
    ]
    assert over == []


def test_the_measure_sees_a_long_function(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("class C:\n    def f(self):\n" + "        x = 1\n" * 150)
    assert long_functions(module) == [("f", 151)]
    assert long_functions(module, limit=151) == []
