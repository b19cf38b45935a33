"""Time the README's first command from a fresh clone: the install, then the main job.

Each run clones this repository (``--rev``, the checked-out commit by default) into a new
temporary folder, creates a virtual environment there and installs the package as the README
says (``pip install -e .``; pip's own download cache is used as a user's would be), then runs
the README's first command (``.venv/bin/optimize --trace traces/sample-multiround-qa.parquet``)
in the clone with an empty numba cache (``NUMBA_CACHE_DIR`` a new folder) and, unless
``--warm-tables``, an empty step-time table cache (``KVTIER_CACHE_DIR``). It prints, per run,
the install's wall time, the command's wall time and its CPU time (user + system of the
process and its children), the load average before and after, and the medians over the runs.

The machine is shared, so the CPU time is the figure to compare between runs; the wall time
is what a user waits and is only meaningful with nothing else running (the load average
says how busy it was).

Usage: ``python scripts/bench_first_run.py [--runs 3] [--rev HEAD] [--warm-tables] [--keep]``.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [".venv/bin/optimize", "--trace", "traces/sample-multiround-qa.parquet"]


def children_cpu() -> float:
    """User + system seconds of every waited-for child process so far."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def one_run(rev: str, warm_tables: bool, keep: bool) -> tuple[float, float, float]:
    """(install wall s, first command wall s, first command CPU s) of one fresh clone."""
    top = Path(tempfile.mkdtemp(prefix="kvtier-first-run-"))
    clone = top / "kvtier"
    try:
        subprocess.run(
            ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True
        )
        subprocess.run(["git", "-C", str(clone), "checkout", "--quiet", rev], check=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", ".venv"], cwd=clone, check=True)
        subprocess.run(
            [".venv/bin/pip", "install", "--quiet", "-e", "."],
            cwd=clone,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        install = time.perf_counter() - t0
        env = dict(os.environ, NUMBA_CACHE_DIR=str(top / "numba-cache"))
        if not warm_tables:
            env["KVTIER_CACHE_DIR"] = str(top / "kvtier-cache")
        cpu0 = children_cpu()
        t1 = time.perf_counter()
        subprocess.run(
            COMMAND, cwd=clone, env=env, check=True, stdout=subprocess.DEVNULL, stderr=None
        )
        wall = time.perf_counter() - t1
        return install, wall, children_cpu() - cpu0
    finally:
        if keep:
            print(f"  kept {top}")
        else:
            shutil.rmtree(top, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--rev", default="HEAD", help="the commit to clone (default: HEAD)")
    ap.add_argument("--warm-tables", action="store_true", help="keep the step-time tables' cache")
    ap.add_argument("--keep", action="store_true", help="keep each run's folder")
    args = ap.parse_args()
    rev = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", args.rev],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    print(f"README first run from a fresh clone of {rev}: {' '.join(COMMAND)}")
    installs, walls, cpus = [], [], []
    for r in range(args.runs):
        load0 = os.getloadavg()[0]
        install, wall, cpu = one_run(rev, args.warm_tables, args.keep)
        installs.append(install)
        walls.append(wall)
        cpus.append(cpu)
        print(
            f"run {r + 1}: install {install:.0f} s; first command {wall:.0f} s wall, "
            f"{cpu:.0f} s CPU; load average {load0:.1f} before, {os.getloadavg()[0]:.1f} after",
            flush=True,
        )
    print(
        f"median of {args.runs}: install {statistics.median(installs):.0f} s; first command "
        f"{statistics.median(walls):.0f} s wall, {statistics.median(cpus):.0f} s CPU"
    )


if __name__ == "__main__":
    main()
