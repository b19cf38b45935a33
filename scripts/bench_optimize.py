"""Benchmark the optimizer: trials per minute with 1 and 2 threads, and `optimize` wall time.

1. Trials per minute on the Mooncake conversation trace (default space and SLO; trace load,
   where most trials stop early, and capacity load, where each trial replays about eight
   times) with 1 and 2 threads, every block size mapped before timing: the engine releases
   the GIL, so the replays of two threads overlap; Optuna's sampling and SQLite writes do not.
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


def make_evaluator(load: str):
    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy.model import Policy
    from kvtier.scenario import Scenario
    from kvtier.search.objective import Evaluator
    from kvtier.search.run import DEFAULT_SLO
    from kvtier.search.space import load_space
    from kvtier.trace.io import read_trace

    space = load_space("default")
    base = Policy(hardware="h100-node", model="Llama-3.1-8B", slo=DEFAULT_SLO)
    scenario = Scenario(
        read_trace(MOONCAKE),
        load_hardware("h100-node"),
        load_model("Llama-3.1-8B"),
        base,
        slo=DEFAULT_SLO,
        load=load,
    )
    evaluator = Evaluator(scenario)
    for p in space.params:  # map every block size once, outside the timing
        if p.name == "block_tokens":
            for b in p.choices:
                scenario.blocked(base.with_block_tokens(int(b)))
    return evaluator, space


def trials_per_minute(evaluator, space, trials: int, jobs: int, workdir: Path) -> float:
    from kvtier.search.study import make_objective, open_study

    study = open_study(
        f"bench-{jobs}-{time.time_ns()}",
        seed=jobs,
        pareto=False,
        storage=f"sqlite:///{workdir / f'b{time.time_ns()}.db'}",
    )
    started = time.perf_counter()
    study.optimize(make_objective(evaluator, space, pareto=False), n_trials=trials, n_jobs=jobs)
    return trials / ((time.perf_counter() - started) / 60.0)


def optimize_wall(cache_dir: str, workdir: Path) -> float:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache_dir, "PYTHONPATH": str(REPO)}
    started = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-c",
            "from kvtier.cli import optimize_main; optimize_main()",
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
        for load in ("trace", "capacity"):
            evaluator, space = make_evaluator(load)
            trials_per_minute(evaluator, space, 2, 1, work)  # compile before timing
            rates = {}
            for jobs in (1, 2):
                runs = [
                    trials_per_minute(evaluator, space, args.trials, jobs, work)
                    for _ in range(args.runs)
                ]
                rates[jobs] = statistics.median(runs)
                print(f"| Mooncake, --load {load}, --jobs {jobs} | {rates[jobs]:.1f} trials/min |")
            print(
                f"| Mooncake, --load {load}: --jobs 2 over --jobs 1 | {rates[2] / rates[1]:.2f}x |"
            )
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
