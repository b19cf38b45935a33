"""The code base stays ruff-clean (lint and format), as the project's standards require."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import REPO


def _ruff() -> list[str]:
    """The ruff of this environment (the test extra pins its range), not one on PATH."""
    return [sys.executable, "-m", "ruff"]


@pytest.mark.parametrize("args", [["check", "."], ["format", "--check", "."]])
def test_ruff(args: list[str]) -> None:
    proc = subprocess.run([*_ruff(), *args], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
