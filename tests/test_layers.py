"""The packages of kvtier form floors, and no import points back up.

The floors (docs/design.md, "Layout"): a ground floor of helpers every layer may use, then
``trace``, ``cache``, ``hardware``, ``policy`` (the schema), ``deploy`` (placing a policy on
hardware), ``export`` (a deployment as a serving system's files, and what each target can
express, which the search reads), ``sim``, ``scenario``, ``search``, ``experiments``,
``report`` and ``cli``.
A module may import its own package and any floor below it, at module level or inside a
function alike: an import deferred to call time is still an arrow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[1] / "optimizer"

GROUND = {
    "errors",
    "toml_fields",
    "registry",
    "builtin",
    "jitcache",
    "files",
    "plotting",
    "plugins",
    "tier_kinds",
    "lazy",
}
FLOORS = [
    "trace",
    "cache",
    "hardware",
    "policy",
    "deploy",
    "export",
    "sim",
    "scenario",
    "search",
    "experiments",
    "report",
    "cli",
    "__main__",
]


def _floor(name: str) -> int:
    if name in GROUND or name == "__init__":
        return -1
    return FLOORS.index(name)


def _package_of(path: Path) -> str:
    rel = path.relative_to(SOURCE).with_suffix("")
    return rel.parts[0]


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, n.split(".")[1]) for n in names if n.startswith("kvtier.")]
    return found


def import_arrows() -> list[tuple[str, int, str, str]]:
    """Every cross-package import: (file, line, from package, to package)."""
    arrows = []
    for path in sorted(SOURCE.rglob("*.py")):
        source = _package_of(path)
        for line, target in _imports(path):
            if target != source:
                arrows.append((str(path.relative_to(SOURCE)), line, source, target))
    return arrows


def test_every_package_has_a_floor() -> None:
    packages = {_package_of(p) for p in SOURCE.rglob("*.py")}
    unknown = sorted(p for p in packages if p not in GROUND and p not in FLOORS and p != "__init__")
    assert unknown == [], f"packages without a floor in this test: {unknown}"


def test_no_import_points_back_up() -> None:
    upward = [
        f"{file}:{line}: {source} imports {target}"
        for file, line, source, target in import_arrows()
        if _floor(target) > _floor(source)
    ]
    assert upward == []


@pytest.mark.parametrize("floor", sorted(GROUND))
def test_ground_floor_imports_only_ground(floor: str) -> None:
    bad = [
        f"{file}:{line}: imports {target}"
        for file, line, source, target in import_arrows()
        if source == floor and target not in GROUND
    ]
    assert bad == []


def test_the_check_sees_a_back_arrow(tmp_path: Path) -> None:
    """The walk finds deferred imports too (a check that could never fail proves nothing)."""
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from kvtier.report.study import x\n")
    assert _imports(module) == [(2, "report")]
