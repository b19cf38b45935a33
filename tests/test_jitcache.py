"""The kernel cache is dropped when a source a kernel compiles changes (kvtier.jitcache)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier import jitcache

TOP_LEVEL_NUMBA = re.compile(r"^(from numba[ .]|import numba)", re.M)


def test_kernel_modules_are_every_module_with_cached_kernels() -> None:
    found = {
        str(p.relative_to(jitcache.ROOT))
        for p in jitcache.ROOT.rglob("*.py")
        if "cache=True" in (text := p.read_text()) and TOP_LEVEL_NUMBA.search(text)
    }
    assert set(jitcache.KERNEL_MODULES) == found
    for rel in jitcache.KERNEL_MODULES:
        assert "import kvtier.jitcache" in (jitcache.ROOT / rel).read_text(), rel


def test_sources_follow_imports_not_passed_through_packages() -> None:
    files = {
        str(p.relative_to(jitcache.ROOT)) for p in jitcache.sources_of(jitcache.ROOT / "sim/nb.py")
    }
    # what the serving kernel inlines: the tier kernel, the transfer and step-time formulas,
    # the cache engine's policy hooks, the registries' codes
    assert {
        "sim/nb_tiers.py",
        "sim/transfer.py",
        "sim/timing.py",
        "cache/policies/lru.py",
        "policy/registries.py",
    } <= files
    # the reference simulator and the CLI never reach a kernel
    assert "sim/reference.py" not in files
    assert not any(f.startswith("cli/") for f in files)


KERNEL = """
from numba import njit

import kvtier.jitcache  # noqa: F401
from kvtier.dep import step

step_nb = njit(cache=True)(step)


@njit(cache=True)
def kernel(x):
    return step_nb(x) * 10
"""


def _package(root: Path, with_refresh: bool) -> None:
    pkg = root / "kvtier"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    text = Path(jitcache.__file__).read_text()
    text = re.sub(
        r"KERNEL_MODULES = \(.*?\n\)", 'KERNEL_MODULES = ("kernel.py",)', text, flags=re.S
    )
    if not with_refresh:
        text = text.replace("\nrefresh()\n", "\n")
    (pkg / "jitcache.py").write_text(text)
    (pkg / "kernel.py").write_text(KERNEL)
    (pkg / "dep.py").write_text("def step(x):\n    return x + 1\n")


def _run(root: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("NUMBA_CACHE_DIR", None)
    code = "from kvtier.kernel import kernel; print(kernel(1))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


@pytest.mark.parametrize("with_refresh", [True, False])
def test_an_inlined_module_change_recompiles_the_kernel(tmp_path: Path, with_refresh: bool) -> None:
    _package(tmp_path, with_refresh)
    assert _run(tmp_path) == "20"
    assert _run(tmp_path) == "20"  # loaded from the cache
    dep = tmp_path / "kvtier" / "dep.py"
    dep.write_text("def step(x):\n    return x + 2\n")
    # numba alone keys the kernel by kernel.py and would load the stale machine code
    assert _run(tmp_path) == ("30" if with_refresh else "20")


def test_touching_a_source_without_changing_it_keeps_the_cache(tmp_path: Path) -> None:
    _package(tmp_path, with_refresh=True)
    assert _run(tmp_path) == "20"
    cache = tmp_path / "kvtier" / "__pycache__"
    indexes = sorted(cache.glob("kernel.*.nbi"))
    assert indexes
    before = [p.stat().st_mtime_ns for p in indexes]
    dep = tmp_path / "kvtier" / "dep.py"
    os.utime(dep, ns=(dep.stat().st_atime_ns, dep.stat().st_mtime_ns + 10**9))
    assert _run(tmp_path) == "20"
    assert [p.stat().st_mtime_ns for p in sorted(cache.glob("kernel.*.nbi"))] == before
