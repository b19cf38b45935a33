"""Benchmark the optimizer: trials per minute with 1 and 2 threads, and `optimize` wall time.

1. Trials per minute on the Mooncake conversation trace (default space, default SLO, trace
   load) with ``--jobs 1`` and ``--jobs 2``: the engine releases the GIL, so two threads should
   come close to twice the rate on two cores.
2. Wall time of ``optimize --trace traces/sample-chat.parquet`` with defaults, in a fresh
   process, from a cold numba cache (an empty NUMBA_CACHE_DIR) and from a warm one.

    python scripts/bench_optimize.py [--trials 40] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MOONCAKE = REPO / "traces" / "mooncake-conversation.parquet"
SAMPLE = REPO / "traces" / "sample-chat.parquet"


def trials_per_minute(trials: int, jobs: int, workdir: Path) -> float:
    from optimizer.search.run import optimize

    started = time.perf_counter()
    result = optimize(
        str(MOONCAKE),
        n_trials=trials,
        n_jobs=jobs,
        seed=jobs,
        runs_dir=workdir / f"runs-{jobs}-{time.time_ns()}",
        out=str(workdir / "p.toml"),
        warm_start=False,
    )
    return result.new_trials / ((time.perf_counter() - started) / 60.0)


def optimize_wall(cache_dir: str, workdir: Path) -> float:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from optimizer.cli import optimize_main; optimize_main()",
            "--trace",
            str(SAMPLE),
            "--out",
            str(workdir / "sample.toml"),
            "--storage",
            f"sqlite:///{workdir / f'{time.time_ns()}.db'}",
        ],
        check=True,
        cwd=workdir,
        env=env,
        capture_output=True,
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}; medians of {args.runs} runs"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trials_per_minute(4, 1, work)  # compile and map once before timing
        for jobs in (1, 2):
            rates = [trials_per_minute(args.trials, jobs, work) for _ in range(args.runs)]
            print(f"| Mooncake, --jobs {jobs} | {statistics.median(rates):.1f} trials/min |")
        colds = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as cache:
                colds.append(optimize_wall(cache, work))
        warm_cache = str(work / "numba-cache")
        optimize_wall(warm_cache, work)
        warms = [optimize_wall(warm_cache, work) for _ in range(args.runs)]
        print(f"| optimize on sample-chat, cold numba cache | {statistics.median(colds):.1f} s |")
        print(f"| optimize on sample-chat, warm numba cache | {statistics.median(warms):.1f} s |")


if __name__ == "__main__":
    main()
