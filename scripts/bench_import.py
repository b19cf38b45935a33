"""Benchmark: streamed import of a synthetic request log far larger than a small machine's memory.

Writes a synthetic log of N requests (BurstGPT's columns with arrivals in seconds, or the Azure
2024 layout with UTC timestamps), then runs ``kvtier trace import --stream`` on it in a fresh
process and records wall time, time per million requests and the process's peak resident
memory (``ru_maxrss`` of the child). The log is written once per size and kept in --work-dir.

    python scripts/bench_import.py [--requests 100000000] [--layout burstgpt|azure] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HEADS = {
    "burstgpt": "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n",
    "azure": "TIMESTAMP,ContextTokens,GeneratedTokens\n",
}


def write_log(path: Path, n: int, layout: str, chunk: int = 2_000_000) -> None:
    """A seeded log of ``n`` requests at 1,000 requests per second (Poisson arrivals)."""
    rng = np.random.default_rng(0)
    start = np.datetime64("2024-05-10T00:00:00", "us")
    t = 0.0
    with open(path, "w") as fh:
        fh.write(HEADS[layout])
        for lo in range(0, n, chunk):
            m = min(chunk, n - lo)
            arrivals = t + np.cumsum(rng.exponential(1e-3, m))
            t = float(arrivals[-1])
            inp = rng.integers(1, 16_000, m)
            out = rng.integers(0, 1_000, m)
            if layout == "burstgpt":
                cols = [
                    np.char.mod("%.3f", arrivals),
                    np.full(m, "ChatGPT"),
                    inp.astype(str),
                    out.astype(str),
                    (inp + out).astype(str),
                    np.full(m, "Conversation log"),
                ]
            else:
                stamps = start + (arrivals * 1e6).astype("timedelta64[us]")
                text = np.datetime_as_string(stamps, unit="us")
                cols = [
                    np.char.add(np.char.replace(text, "T", " "), "+00:00"),
                    inp.astype(str),
                    out.astype(str),
                ]
            rows = cols[0]
            for c in cols[1:]:
                rows = np.char.add(np.char.add(rows, ","), c)
            fh.write("\n".join(rows.tolist()))
            fh.write("\n")


def run_import(log: Path, out: Path, layout: str) -> dict[str, float]:
    """One import in a fresh process (see :func:`run_timed`)."""
    return run_timed(["trace", "import", "--from", layout, str(log), "--stream", "-o", str(out)])


def run_timed(args: list[str]) -> dict[str, float]:
    """One kvtier command in a fresh process, under GNU time for the child's own peak memory
    (the parent's ``RUSAGE_CHILDREN`` would count the forked copy of this process's arrays)."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "kvtier", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    peak_kb = next(
        int(line.split(":")[1])
        for line in proc.stderr.splitlines()
        if "Maximum resident set size" in line
    )
    return {"wall_s": wall, "peak_rss_mb": peak_kb / 1024, "stdout": proc.stdout.strip()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=100_000_000)
    ap.add_argument("--layout", choices=sorted(HEADS), default="burstgpt")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--work-dir", default="runs/bench-import")
    ap.add_argument("--sample", type=float, default=0.01, help="then sample this fraction")
    args = ap.parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    log = work / f"{args.layout}-{args.requests}.csv"
    if not log.exists():
        t0 = time.perf_counter()
        write_log(log, args.requests, args.layout)
        print(
            f"wrote {log} ({log.stat().st_size / 2**30:.1f} GiB) in "
            f"{time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
        )
    results = []
    for _ in range(args.runs):  # each run a fresh child: ru_maxrss is that child's peak
        results.append(run_import(log, work / "out.parquet", args.layout))
    wall = statistics.median(r["wall_s"] for r in results)
    sampled = [
        run_timed(
            [
                "trace",
                "sample",
                str(work / "out.parquet"),
                "--fraction",
                str(args.sample),
                "--stream",
                "-o",
                str(work / "sample.parquet"),
            ]
        )
        for _ in range(args.runs)
    ]
    print(
        json.dumps(
            {
                "layout": args.layout,
                "requests": args.requests,
                "log_gib": round(log.stat().st_size / 2**30, 2),
                "runs": args.runs,
                "median_wall_s": round(wall, 1),
                "s_per_million": round(wall / (args.requests / 1e6), 3),
                "peak_rss_mb": round(max(r["peak_rss_mb"] for r in results)),
                "sample_fraction": args.sample,
                "sample_median_wall_s": round(statistics.median(r["wall_s"] for r in sampled), 1),
                "sample_peak_rss_mb": round(max(r["peak_rss_mb"] for r in sampled)),
                "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "output": results[-1]["stdout"],
            }
        )
    )


if __name__ == "__main__":
    main()
