"""Benchmark: the cache engine against libCacheSim's C simulator, side by side in one run.

Workloads (flat semantics, one access per block reference, so both simulators see the same
sequence): the Mooncake conversation trace at B=16 (9,044,013 accesses) and a 10M-access Zipf
sequence. libCacheSim runs its C path (``process_trace``) over an oracleGeneral binary file that
this script writes; kvtier replays the same ids through ``kvtier.cache.replay`` (the ring
kernels of ``kvtier.cache.ring`` for LRU and FIFO, ``replay_nb`` for the others).
Hit counts of both are printed and must agree. Each measurement is the median of ``--runs``,
alternating the two simulators; numba's compilation is excluded by a warm-up call. Also times
the exact one-pass LRU curve for 20 capacities against 20 LRU replays (prefix semantics).
Prints Markdown for docs/benchmarks.md.

    python scripts/bench_cache.py [--runs 3] [--policies lru,fifo,s3fifo,sieve,lfu,gdsf]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kvtier.cache import default_capacities, replay  # noqa: E402
from kvtier.cache.mrc import lru_stack_hits, working_set_blocks  # noqa: E402
from kvtier.cache.oracle import write_oracle_general  # noqa: E402
from kvtier.trace.blocked import BlockedTrace  # noqa: E402
from kvtier.trace.blocks import block_trace, first_appearance_ids  # noqa: E402
from kvtier.trace.io import read_trace  # noqa: E402

LCS_NAMES = {
    "lru": "LRU",
    "fifo": "FIFO",
    "lfu": "LFU",
    "s3fifo": "S3FIFO",
    "sieve": "Sieve",
    "gdsf": "GDSF",
}


def zipf_trace(n: int, n_objects: int, alpha: float, seed: int) -> BlockedTrace:
    """``n`` accesses with Zipf(alpha) popularity over ``n_objects`` objects.

    Ids are numbered by first appearance, as ``block_trace`` numbers the blocks of any trace;
    libCacheSim reads the same ids (it hashes them, so their order does not matter to it).
    """
    rng = np.random.default_rng(seed)
    p = np.arange(1, n_objects + 1, dtype=np.float64) ** -alpha
    p /= p.sum()
    ranks = rng.choice(n_objects, size=n, p=p)
    # dense ids in order of first appearance, as block_trace numbers every trace's blocks
    ids, n_objects = first_appearance_ids(ranks.astype(np.int64), n_objects)
    per = 1000  # accesses per synthetic request; flat semantics ignores the grouping
    n_req = -(-n // per)
    offsets = np.minimum(np.arange(n_req + 1, dtype=np.int64) * per, n)
    return BlockedTrace(
        arrival_s=np.zeros(n_req),
        input_tokens=np.full(n_req, per * 16, dtype=np.int64),
        output_tokens=np.ones(n_req, dtype=np.int64),
        block_offsets=offsets,
        block_ids=np.ascontiguousarray(ids),
        n_blocks=n_objects,
        block_tokens=16,
    )


def median_time(fn: Callable[[], object], runs: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def bench_workload(
    name: str, trace: BlockedTrace, policies: list[str], runs: int, tmp: Path
) -> list[str]:
    import libcachesim as lcs

    wss = working_set_blocks(trace)
    cap = max(1, wss // 10)
    n = trace.n_block_refs
    path = tmp / f"{name}.oracleGeneral.bin"
    write_oracle_general(trace.block_ids, path)
    rows = []
    for policy in policies:
        replay(trace.head(50), policy, cap, flat=True)  # compile outside the timing

        def ours(policy: str = policy) -> int:
            return replay(trace, policy, cap, flat=True).hits

        def theirs(policy: str = policy) -> int:
            reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
            cache = getattr(lcs, LCS_NAMES[policy])(cap)
            miss_ratio, _ = cache.process_trace(reader)
            return round((1.0 - miss_ratio) * n)

        t_ours, t_lcs = [], []
        h_ours = h_lcs = 0
        for _ in range(runs):  # alternate so both see the same machine state
            t, h_ours = median_time(ours, 1)
            t_ours.append(t)
            t, h_lcs = median_time(theirs, 1)
            t_lcs.append(t)
        mo, ml = statistics.median(t_ours), statistics.median(t_lcs)
        same = "yes" if h_ours == h_lcs else f"no ({h_ours - h_lcs:+,})"
        rows.append(
            f"| {name} | {policy} | {cap:,} | {n / mo / 1e6:.1f} | {n / ml / 1e6:.2f} "
            f"| {ml / mo:.1f}x | {h_ours:,} | {same} |"
        )
        print(rows[-1], flush=True)
    return rows


def bench_curve(trace: BlockedTrace, runs: int) -> str:
    caps = default_capacities(working_set_blocks(trace))
    lru_stack_hits(trace.head(50), caps[:3])  # compile
    t_stack, stack = median_time(lambda: lru_stack_hits(trace, caps), runs)
    t_rep, rep = median_time(lambda: [replay(trace, "lru", c).hits for c in caps], runs)
    same = "yes" if list(stack) == list(rep) else "NO"  # type: ignore[arg-type]
    return (
        f"| one-pass LRU curve, {len(caps)} capacities (prefix) | {t_stack:.2f} s | "
        f"{len(caps)} LRU replays | {t_rep:.2f} s | {t_rep / t_stack:.1f}x | {same} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--policies", default="lru,fifo,s3fifo,sieve,lfu,gdsf")
    ap.add_argument("--trace", default=str(REPO / "traces" / "mooncake-conversation.parquet"))
    ap.add_argument("--zipf-accesses", type=int, default=10_000_000)
    args = ap.parse_args()
    policies = [p.strip() for p in args.policies.split(",")]
    import libcachesim

    print(
        f"machine: {platform.machine()} {platform.python_version()}, libcachesim "
        f"{getattr(libcachesim, '__version__', '?')}, runs={args.runs}\n"
    )
    mooncake = block_trace(read_trace(args.trace), 16)
    zipf = zipf_trace(args.zipf_accesses, 1_000_000, 0.9, seed=1)
    print(
        "| workload | policy | capacity (blocks) | kvtier M acc/s | libCacheSim M acc/s "
        "| speed-up | kvtier hits | same hits |"
    )
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        bench_workload("mooncake B=16", mooncake, policies, args.runs, Path(tmp))
        bench_workload("zipf 0.9, 1M ids", zipf, policies, args.runs, Path(tmp))
    print("\n| curve | time | baseline | time | speed-up | identical |")
    print("|---|---|---|---|---|---|")
    print(bench_curve(mooncake, args.runs), flush=True)


if __name__ == "__main__":
    main()
