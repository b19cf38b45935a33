"""Benchmark: streamed import of a synthetic Mooncake-layout JSON Lines log with hash ids.

Writes once per size (kept in --work-dir) a seeded JSONL log of N requests in the Mooncake
FAST'25 layout (``timestamp`` ms, ``input_length``, ``output_length``, ``hash_ids`` of
512-token blocks, chained), generated chunk by chunk in bounded memory and written by polars:
Poisson arrivals at 1,000 requests per second; conversations of geometric turns (mean 4,
at most 64) whose requests follow each other, each under one of 2,000 system prompts (Zipf
1.1 popularity) of 1-32 blocks (uniform: long shared instructions, so that prompts average
9,695 tokens, near the Mooncake conversation trace's 12,035); turn t's prompt is the system
prompt, then the conversation so far (lognormal messages of mean 100 tokens and answers of
mean 200 a turn), whose full blocks are the conversation's own ids, then a partial last
block with an id of its own, as in the Mooncake traces (99.8% of whose requests end in a
partial block with its own id). Then, each
run in a fresh process under GNU ``time -v`` (the child's own peak resident memory):

    kvtier trace import --from mooncake LOG --stream -o out.parquet

    python scripts/bench_import_jsonl.py [--requests 100000000] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_import import run_timed  # noqa: E402

G = 512
RATE = 1_000.0
SYSTEM_PROMPTS = 2_000
SYS_MAX_BLOCKS = 32
SYS_BLOCKS = np.random.default_rng(1).integers(1, SYS_MAX_BLOCKS + 1, SYSTEM_PROMPTS)
ZIPF_A = 1.1
TURNS_MEAN, TURNS_MAX = 4.0, 64
USER_TOKENS, ANSWER_TOKENS = 100.0, 200.0  # lognormal means, sigma 0.8
CHUNK = 2_000_000
TAIL_BASE = 1 << 62  # ids of partial last blocks: TAIL_BASE + request index


def _lognormal(rng: np.random.Generator, mean: float, n: int) -> np.ndarray:
    sigma = 0.8
    return np.maximum(1, rng.lognormal(np.log(mean) - sigma**2 / 2, sigma, n)).astype(np.int64)


def _chunk(rng: np.random.Generator, first: int, n: int, t0: float, conv0: int) -> tuple:
    """Requests ``first .. first + n - 1``: a table and the state carried to the next chunk."""
    turns = np.minimum(rng.geometric(1 / TURNS_MEAN, n), TURNS_MAX)
    ends = np.cumsum(turns)
    k = int(np.searchsorted(ends, n)) + 1
    turns = turns[:k]
    turns[-1] -= int(ends[k - 1]) - n  # the last conversation is cut at the chunk's end
    conv = np.repeat(np.arange(k, dtype=np.int64), turns)
    turn = np.arange(n) - np.repeat(np.cumsum(turns) - turns, turns)
    ranks = (rng.zipf(ZIPF_A, k) - 1) % SYSTEM_PROMPTS
    sys_blocks = SYS_BLOCKS[ranks][conv]
    grown = _lognormal(rng, USER_TOKENS + ANSWER_TOKENS, n)
    grown[turn == 0] = _lognormal(rng, USER_TOKENS, int((turn == 0).sum()))
    history = np.cumsum(grown)
    history -= np.repeat(history[np.cumsum(turns) - turns] - grown[np.cumsum(turns) - turns], turns)
    full = history // G
    tail = (history % G > 0).astype(np.int64)
    counts = sys_blocks + full + tail
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    pos = np.arange(offsets[-1]) - np.repeat(offsets[:-1], counts)
    row = np.repeat(np.arange(n), counts)
    s_blocks, f_blocks = sys_blocks[row], full[row]
    conv_base = (conv0 + conv) * TURNS_MAX * 64  # room for every full block of a conversation
    ids = np.where(
        pos < s_blocks,
        ranks[conv][row] * SYS_MAX_BLOCKS + pos,
        np.where(
            pos < s_blocks + f_blocks,
            SYSTEM_PROMPTS * SYS_MAX_BLOCKS + conv_base[row] + (pos - s_blocks),
            TAIL_BASE + first + row,
        ),
    )
    arrivals = t0 + np.cumsum(rng.exponential(1.0 / RATE, n))
    table = pa.table(
        {
            "timestamp": np.round(arrivals * 1000).astype(np.int64),
            "input_length": sys_blocks * G + history,
            "output_length": _lognormal(rng, ANSWER_TOKENS, n),
            "hash_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
        }
    )
    return table, float(arrivals[-1]), conv0 + k


def write_log(path: Path, n: int) -> None:
    """The seeded log of ``n`` requests, written chunk by chunk."""
    rng = np.random.default_rng(0)
    t, conv = 0.0, 0
    tmp = path.with_suffix(".part")
    with open(tmp, "wb") as fh:
        for lo in range(0, n, CHUNK):
            table, t, conv = _chunk(rng, lo, min(CHUNK, n - lo), t, conv)
            pl.from_arrow(table).write_ndjson(fh)
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=100_000_000)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--work-dir", default="runs/bench-import-jsonl")
    args = ap.parse_args()
    work = Path(args.work_dir)
    work.mkdir(parents=True, exist_ok=True)
    log = work / f"mooncake-{args.requests}.jsonl"
    if not log.exists():
        t0 = time.perf_counter()
        write_log(log, args.requests)
        print(
            f"wrote {log} ({log.stat().st_size / 2**30:.1f} GiB) in "
            f"{time.perf_counter() - t0:.0f} s",
            file=sys.stderr,
        )
    out = work / "out.parquet"
    args_import = ["trace", "import", "--from", "mooncake", str(log), "--stream", "-o", str(out)]
    results = []
    for _ in range(args.runs):  # each run a fresh child: ru_maxrss is that child's peak
        results.append(run_timed(args_import))
        print(json.dumps({k: v for k, v in results[-1].items()}), file=sys.stderr)
    wall = statistics.median(r["wall_s"] for r in results)
    print(
        json.dumps(
            {
                "layout": "mooncake",
                "requests": args.requests,
                "log_gib": round(log.stat().st_size / 2**30, 2),
                "runs": args.runs,
                "walls_s": [round(r["wall_s"], 1) for r in results],
                "median_wall_s": round(wall, 1),
                "s_per_million": round(wall / (args.requests / 1e6), 3),
                "peak_rss_mb": [round(r["peak_rss_mb"]) for r in results],
                "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                "output": results[-1]["stdout"],
            }
        )
    )


if __name__ == "__main__":
    main()
