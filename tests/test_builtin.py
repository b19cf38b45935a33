"""The built-in policy files are found in a checkout and in an installed wheel's data prefix."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import pytest

from kvtier import builtin

ROOT = Path(__file__).resolve().parents[1]


def test_checkout_policies_win() -> None:
    assert builtin.policies_dir() == ROOT / "policies"


def test_installed_copy_is_found_without_a_checkout(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(builtin, "CHECKOUT_POLICIES", tmp_path / "no-checkout" / "policies")
    installed = tmp_path / "prefix" / "share" / "kvtier" / "policies"
    (installed / "presets").mkdir(parents=True)
    monkeypatch.setattr(builtin.sysconfig, "get_path", lambda name: str(tmp_path / "prefix"))
    assert builtin.policies_dir() == installed


@pytest.mark.parametrize("path", sorted((ROOT / "policies").rglob("*.toml")), ids=str)
def test_every_policy_file_ships_in_the_wheel(path: Path) -> None:
    """Each built-in file matches a ``[tool.setuptools.data-files]`` glob of pyproject.toml."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        data_files = tomllib.load(f)["tool"]["setuptools"]["data-files"]
    rel = path.relative_to(ROOT).as_posix()
    matches = [
        dest
        for dest, globs in data_files.items()
        for g in globs
        if fnmatch.fnmatch(rel, g) and "/" not in rel[len(g.rsplit("/", 1)[0]) + 1 :]
    ]
    assert matches == [f"share/kvtier/{Path(rel).parent.as_posix()}"]
