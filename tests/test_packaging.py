"""The package installs as ``kvtier`` from the folder ``optimizer/``, and light commands stay light.

Commands that do not simulate (``--version``, ``--help``, ``export``, ``report`` without
``--what-if``, ``trace import``) must not import numba: importing it costs seconds at every
start-up. Each case runs in a fresh interpreter, so nothing imported by the test process counts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers import REPO

PACKAGE_DIR = REPO / "optimizer"


def _run_python(code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_every_subpackage_is_listed_in_pyproject() -> None:
    """``packages`` is an explicit list (``package-dir`` renames the folder); none is missed."""
    with open(REPO / "pyproject.toml", "rb") as fh:
        setuptools = tomllib.load(fh)["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"kvtier": "optimizer"}
    on_disk = {
        ".".join(("kvtier", *init.parent.relative_to(PACKAGE_DIR).parts))
        for init in PACKAGE_DIR.rglob("__init__.py")
    }
    assert set(setuptools["packages"]) == on_disk


def test_import_name_is_kvtier_and_not_optimizer(tmp_path: Path) -> None:
    """Outside the checkout, ``kvtier`` imports from the installed package and ``optimizer``
    does not exist (it is a generic name another distribution already uses)."""
    proc = _run_python(
        "import importlib.util, json, kvtier\n"
        "print(json.dumps([kvtier.__file__, importlib.util.find_spec('optimizer') is None]))",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    path, no_optimizer = json.loads(proc.stdout)
    assert Path(path) == PACKAGE_DIR / "__init__.py"
    assert no_optimizer


def test_python_dash_m_kvtier(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kvtier", "--version"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("kvtier, version ")


def _modules_after(args: list[str], cwd: Path) -> dict[str, object]:
    """Run the CLI in-process in a fresh interpreter; report its exit code and numba's fate."""
    code = (
        "import json, sys\n"
        "from kvtier.cli import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "else:\n"
        "    code = 0\n"
        "print(json.dumps({'code': code, 'numba': 'numba' in sys.modules}), file=sys.stderr)\n"
    )
    proc = _run_python(code, cwd)
    return json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["export", "--help"],
        ["replay", "--help"],
        ["optimize", "--help"],
        ["trace", "synth", "--help"],
        ["trace", "map", "--help"],
        ["trace", "stats", "--help"],
    ],
    ids=" ".join,
)
def test_commands_that_do_not_simulate_do_not_import_numba(args: list[str], tmp_path: Path) -> None:
    result = _modules_after(args, tmp_path)
    assert result == {"code": 0, "numba": False}


def test_export_and_trace_import_do_not_import_numba(tmp_path: Path) -> None:
    """Real work, not only ``--help``: an export of a preset and an Azure CSV import."""
    preset = REPO / "policies" / "presets" / "vllm-hbm.toml"
    out = _modules_after(["export", str(preset), "--target", "vllm", "-o", "out"], tmp_path)
    assert out == {"code": 0, "numba": False}
    csv = tmp_path / "azure.csv"
    csv.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.0,64,8\n"
        "2023-11-16 18:15:47.0,128,4\n"
    )
    out = _modules_after(
        ["trace", "import", "--from", "azure", str(csv), "-o", "t.parquet"], tmp_path
    )
    assert out == {"code": 0, "numba": False}
    assert (tmp_path / "t.parquet").is_file()


def test_the_optimize_script_reports_its_version_without_numba(tmp_path: Path) -> None:
    code = (
        "import json, sys\n"
        "from kvtier.cli import optimize_main\n"
        "try:\n"
        "    optimize_main(['--version'])\n"
        "except SystemExit as e:\n"
        "    out = {'code': e.code, 'numba': 'numba' in sys.modules}\n"
        "    print(json.dumps(out), file=sys.stderr)\n"
    )
    proc = _run_python(code, tmp_path)
    assert proc.stdout.startswith("kvtier, version ")
    assert json.loads(proc.stderr.strip().splitlines()[-1]) == {"code": 0, "numba": False}
