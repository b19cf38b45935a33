"""How much slower compute-bound GEMMs run at a GPU's power limit than in short bursts.

aiconfigurator's operator tables time each kernel over a few CUDA-graph replays (3 warm-ups, 6
timed runs: milliseconds of work) at the maximum application clocks its collector's README
asks for; in its power mode (``collect.py --measure_power``) each kernel runs for about a
second while NVML samples the board's power. A serving engine's prefill runs for seconds, at
the power limit. This script compares the two on the GPUs that have a power-measured GEMM table
(``power`` and ``power_limit`` columns; aiconfigurator PR #1408): each shape of the power table
against the geometric mean of the same shape in the short-burst tables of the releases of the
same framework just before and just after it, over the shapes that drew at least 97 % of the
limit, per GEMM type (bf16; fp8 per tensor, the type kvtier's FP8 tables use; fp8 block-scaled).
The medians are a GPU profile's ``sustained_compute_scale`` and ``sustained_compute_scale_fp8``
(docs/sources.md [AIC-power-tables]; docs/model.md, "Compute at the power limit").

    python scripts/sustained_compute_scale.py --data DATA

``DATA`` is ``aic-core/src/aiconfigurator_core/systems/data`` in a checkout of
github.com/ai-dynamo/aiconfigurator (the figures in docs/sources.md: commit 095f58a5,
2026-08-21); aiconfigurator-core 0.12.0's wheel ships no power tables.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import polars as pl

# GPU system -> [(framework, power-measured release, (release before, release after))]
POWER_TABLES: dict[str, list[tuple[str, str, tuple[str, str]]]] = {
    "h200_sxm": [("vllm", "0.22.0", ("0.19.0", "0.24.0"))],
    "b200_sxm": [
        ("vllm", "0.22.0", ("0.19.0", "0.24.0")),
        ("trtllm", "1.3.0rc15", ("1.3.0rc10", "1.3.0rc20")),
    ],
    "gb200": [
        ("vllm", "0.22.0", ("0.19.0", "0.24.0")),
        ("trtllm", "1.3.0rc17", ("1.3.0rc10", "1.3.0rc20")),
    ],
}
AT_LIMIT = 0.97  # a shape "at the limit" drew at least this share of the board's power limit
SHAPE = ["m", "n", "k"]


GEMM_TYPES = ("bfloat16", "fp8", "fp8_block")


def _table(data: Path, system: str, framework: str, release: str, dtype: str) -> pl.DataFrame:
    path = data / system / "gemm" / framework / release / "gemm_perf.parquet"
    return pl.read_parquet(path).filter(pl.col("gemm_dtype") == dtype)


def ratios(data: Path, system: str, dtype: str = "bfloat16") -> pl.DataFrame:
    """Per shape of GEMM type ``dtype``: the power table's latency over the short-burst
    neighbours' geometric mean, with the power the shape drew as a share of the limit."""
    parts = []
    for framework, release, around in POWER_TABLES[system]:
        power = _table(data, system, framework, release, dtype)
        joined = power.select([*SHAPE, "latency", "power", "power_limit"])
        for i, other in enumerate(around):
            burst = _table(data, system, framework, other, dtype)
            joined = joined.join(
                burst.select([*SHAPE, pl.col("latency").alias(f"burst{i}")]), on=SHAPE
            )
        log_mean = (pl.col("burst0").log() + pl.col("burst1").log()) / 2
        parts.append(
            joined.select(
                *SHAPE,
                (pl.col("latency").log() - log_mean).exp().alias("ratio"),
                (pl.col("power") / pl.col("power_limit")).alias("power_share"),
                pl.lit(f"{framework} {release}").alias("table"),
            )
        )
    return pl.concat(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, required=True, help="aiconfigurator systems/data")
    args = parser.parse_args()
    for system in POWER_TABLES:
        for dtype in GEMM_TYPES:
            r = ratios(args.data, system, dtype)
            at_limit = r.filter(pl.col("power_share") >= AT_LIMIT)
            if at_limit.height == 0:
                print(f"{system} {dtype}: no shape at the limit ({r.height} compared)")
                continue
            small = r.filter(pl.col("m") <= 64)
            print(
                f"{system} {dtype}: {at_limit.height} of {r.height} shapes at the limit, median "
                f"{at_limit['ratio'].median():.3f} (quartiles "
                f"{at_limit['ratio'].quantile(0.25):.3f}-{at_limit['ratio'].quantile(0.75):.3f});"
                f" m <= 64 (memory-bound) median {small['ratio'].median():.3f} at "
                f"{small['power_share'].median():.0%} of the limit"
            )


if __name__ == "__main__":
    main()
