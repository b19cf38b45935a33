"""How `kvtier validate offload`'s errors move when every run's steps run slower or faster.

The catalogue's checks replay the built-in hardware profiles, whose measured step times are
aiconfigurator-core's kernel tables. This script replays the same catalogue with a hardware
profile's two calibrated factors set on every run (``[efficiency] measured_memory_scale`` and
``measured_compute_scale``, docs/calibrate.md: memory-bound work such as decode, compute-bound
work such as long prefills) and prints, per pair of factors, each metric's MAPE over the checks
and how many checks the model puts below and above the measured figure; ``--runs`` adds each
run's errors. It is a sensitivity study: which residuals a step-time gap would explain. No
factor it tries is a parameter of the validation, which replays the profiles as they are.

    python scripts/step_time_sensitivity.py 1.0,1.0 1.1,1.0 1.0,1.1 [--runs ttft_mean_s]

Each pair replays the whole catalogue (about a minute warm on 2 cores).
"""

from __future__ import annotations

import argparse

from kvtier.experiments.offload_validation import load_catalogue, run_offload

METRICS = ("ttft_mean_s", "throughput", "ttft_p90_s", "e2e_mean_s", "e2e_p90_s")


def _pair(text: str) -> tuple[float, float]:
    try:
        memory, compute = (float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give MEMORY,COMPUTE, e.g. 1.1,1.0") from None
    if not (0.25 <= memory <= 4.0 and 0.25 <= compute <= 4.0):
        raise argparse.ArgumentTypeError(f"{text!r}: each factor in 0.25-4")
    return memory, compute


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pairs", nargs="+", type=_pair, help="MEMORY,COMPUTE factors to replay")
    ap.add_argument("--runs", metavar="METRIC", choices=METRICS,
                    help="also print each run's error in this metric")  # fmt: skip
    args = ap.parse_args()
    runs = load_catalogue()
    per_run: dict[tuple[float, float], dict[tuple[str, str], float | None]] = {}
    print("memory  compute  " + "  ".join(f"{m:>22}" for m in METRICS))
    for memory, compute in args.pairs:
        eff = {"measured_memory_scale": memory, "measured_compute_scale": compute}
        v = run_offload(runs, efficiency=eff)
        cols = []
        for metric in METRICS:
            mape = v.mape(metric)
            below, above = v.lean(metric)
            cols.append(f"{'-' if mape is None else f'{100 * mape:.1f} %'} ({below}/{above})")
        print(f"{memory:6.3g}  {compute:7.3g}  " + "  ".join(f"{c:>22}" for c in cols))
        if args.runs:
            per_run[(memory, compute)] = {(c.run, c.side): c.error for c in v.checks(args.runs)}
    if args.runs:
        keys = sorted({k for d in per_run.values() for k in d})
        print(f"\n{args.runs} error per run and side, at each pair (memory, compute):")
        print(f"{'run':<58} {'side':<9}" + "".join(f"{f'{m:g},{c:g}':>12}" for m, c in per_run))
        for run, side in keys:
            errs = [d.get((run, side)) for d in per_run.values()]
            cells = "".join(f"{'-' if e is None else f'{100 * e:+.1f} %':>12}" for e in errs)
            print(f"{run:<58} {side:<9}{cells}")


if __name__ == "__main__":
    main()
