"""The cache engine of two versions side by side: warm replays and the cold compile.

Each version is a directory holding a ``kvtier`` link to that version's ``optimizer/`` folder
(``git archive REV | tar -x -C TREE; ln -s TREE/optimizer DIR/kvtier``), put first on
``PYTHONPATH`` of a fresh process; each version keeps its own numba cache, so neither loads
the other's kernels.

* **warm**: in each round, one process per version (the order alternating between rounds)
  maps the Mooncake conversation trace at B=16, compiles (or loads) the kernels on a small
  slice, then times ``--runs`` replays of each case and keeps their median. Cases: every
  eviction policy over the whole trace with prefix semantics (``replay_nb``: the linked-list
  and heap kernels, LRU and FIFO included); the non-ring policies flat over a Zipf(0.9)
  sequence on 1M ids; ``TierState.access_many`` (``access_many_nb``) over the trace's ids; and
  ``IdTable.ids`` numbering the trace's block hashes. Capacity is 10% of the working set.
  Time is the process's CPU time (``time.process_time``), which other jobs on a shared machine
  disturb less than wall time. Printed per case: each version's median over the rounds, the
  median (range) of the per-round ratios new / old, and whether both gave the same hits.
* **cold** (first): one process per version and round with an empty ``NUMBA_CACHE_DIR`` times (CPU)
  the first calls of every cache kernel (each policy's replay with both semantics, a tier's
  contains / access / remove / access_many) and, apart, of the ``IdTable`` kernels. The trace
  is mapped before the clock starts. Without ``--cache-root`` the first round compiles into
  the version's own cache, which the warm rounds then load.

Usage: ``python scripts/bench_cache_versions.py --version old=/tmp/oldkv --version
new=/tmp/newkv [--rounds 5] [--runs 3] [--cold-rounds 2] [--zipf-accesses 2000000]
[--cache-root DIR]``.
The first version named is the baseline of the ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "mooncake-conversation.parquet"
POLICIES = ("lru", "fifo", "s3fifo", "sieve", "lfu", "gdsf")
ZIPF_POLICIES = ("s3fifo", "sieve", "lfu", "gdsf")  # flat LRU and FIFO run the ring kernels

CHILD = r"""
import json, os, sys, time
import numpy as np
mode, trace_path, runs, zipf_n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
POLICIES = {policies!r}
ZIPF_POLICIES = {zipf_policies!r}
import kvtier
from kvtier.cache import TierState, replay
from kvtier.cache.mrc import working_set_blocks
from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.blocks import block_trace, first_appearance_ids
from kvtier.trace.io import read_trace

raw = read_trace(trace_path)
trace = block_trace(raw, 16)
cap = max(1, working_set_blocks(trace) // 10)
small = trace.head(50)
# the trace's block identities as one-word keys: each block's first reference in request order
keys = np.ascontiguousarray(trace.block_ids, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)

def zipf(n, n_objects=1_000_000, alpha=0.9, seed=1):
    rng = np.random.default_rng(seed)
    p = np.arange(1, n_objects + 1, dtype=np.float64) ** -alpha
    p /= p.sum()
    ranks = rng.choice(n_objects, size=n, p=p).astype(np.int64)
    ids, n_ids = first_appearance_ids(ranks, n_objects)
    per = 1000
    n_req = -(-n // per)
    off = np.minimum(np.arange(n_req + 1, dtype=np.int64) * per, n)
    return BlockedTrace(
        arrival_s=np.zeros(n_req), input_tokens=np.full(n_req, per * 16, dtype=np.int64),
        output_tokens=np.ones(n_req, dtype=np.int64), block_offsets=off,
        block_ids=np.ascontiguousarray(ids), n_blocks=n_ids, block_tokens=16,
    )

def first_calls_cache():
    for p in POLICIES:
        replay(small, p, 64)
        replay(small, p, 64, flat=True)
        t = TierState.create(p, 64, small.n_blocks)
        t.contains(0); t.access(0); t.remove(0)
        t.access_many(small.block_ids)

def first_calls_idtable():
    from kvtier.trace.idtable import IdTable
    tab = IdTable(capacity=16)
    tab.ids(keys[:1000])
    tab.find(keys[:1000])
    two = IdTable(two_words=True, capacity=16)
    two.ids(keys[:1000], keys[:1000])
    two.find(keys[:1000], keys[:1000])

out = {{"file": os.path.realpath(kvtier.__file__)}}
if mode == "cold":
    t0 = time.process_time()
    first_calls_cache()
    t1 = time.process_time()
    first_calls_idtable()
    t2 = time.process_time()
    out["cache"], out["idtable"] = t1 - t0, t2 - t1
else:
    first_calls_cache()
    first_calls_idtable()
    z = zipf(zipf_n)
    zcap = max(1, working_set_blocks(z) // 10)
    cases = {{}}
    for p in POLICIES:
        cases[f"mooncake prefix {{p}}"] = lambda p=p: int(replay(trace, p, cap).hits)
    for p in ZIPF_POLICIES:
        cases[f"zipf flat {{p}}"] = lambda p=p: int(replay(z, p, zcap, flat=True).hits)
    def many(p):
        t = TierState.create(p, cap, trace.n_blocks)
        return int(t.access_many(trace.block_ids)[0].sum())
    for p in ("lru", "s3fifo"):
        cases[f"access_many {{p}}"] = lambda p=p: many(p)
    def idt():
        from kvtier.trace.idtable import IdTable
        return int(IdTable().ids(keys).max())
    cases["IdTable.ids"] = idt
    for name, fn in cases.items():
        times, res = [], None
        for _ in range(runs):
            t0 = time.process_time()
            res = fn()
            times.append(time.process_time() - t0)
        out[name] = [statistics.median(times), res]
print("RESULT " + json.dumps(out))
"""


def run(version: str, cache: str, mode: str, runs: int, zipf_n: int) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": version}
    code = "import statistics\n" + CHILD.format(policies=POLICIES, zipf_policies=ZIPF_POLICIES)
    proc = subprocess.run(
        [sys.executable, "-c", code, mode, str(TRACE), str(runs), str(zipf_n)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.exit(f"{version}: {proc.stderr.strip().splitlines()[-1]}")
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="append", required=True, metavar="NAME=DIR")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cold-rounds", type=int, default=2)
    ap.add_argument("--zipf-accesses", type=int, default=2_000_000)
    ap.add_argument(
        "--cache-root", help="keep each version's numba cache in ROOT/NAME (kept between runs)"
    )
    args = ap.parse_args()
    versions = dict(v.split("=", 1) for v in args.version)
    names = list(versions)
    base, other = names[0], names[-1]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.cache_root) if args.cache_root else Path(tmp)
        caches = {n: str(root / n) for n in names}
        cold: dict[str, dict[str, list[float]]] = {n: {"cache": [], "idtable": []} for n in names}
        for r in range(args.cold_rounds):
            for n in names if r % 2 == 0 else reversed(names):
                # the first round compiles into the version's own cache, for the warm rounds
                with tempfile.TemporaryDirectory() as empty:
                    fill = r == 0 and not args.cache_root
                    out = run(versions[n], caches[n] if fill else empty, "cold", 1, 0)
                for k in ("cache", "idtable"):
                    cold[n][k].append(out[k])
                print(
                    f"cold {n} ({out['file']}): cache kernels {out['cache']:.1f} s, "
                    f"IdTable {out['idtable']:.1f} s (CPU)",
                    flush=True,
                )
        for n in names:  # each version's own cache holds its kernels before the warm rounds
            if args.cold_rounds < 1 or args.cache_root:
                run(versions[n], caches[n], "cold", 1, 0)
        warm: dict[str, list[dict]] = {n: [] for n in names}
        for r in range(args.rounds):
            for n in names if r % 2 == 0 else reversed(names):
                warm[n].append(run(versions[n], caches[n], "warm", args.runs, args.zipf_accesses))
            print(f"round {r + 1}: " + json.dumps({n: warm[n][-1] for n in names}), flush=True)
    print()
    print("| kernels | " + " | ".join(f"{n}, CPU s (rounds)" for n in names) + " | ratio |")
    print("|---|" + "---|" * len(names) + "---|")
    for k, label in (("cache", "cache engine"), ("idtable", "IdTable")) * (args.cold_rounds > 0):
        meds = {n: statistics.median(cold[n][k]) for n in names}
        cells = " | ".join(
            f"{meds[n]:.1f} ({', '.join(f'{x:.1f}' for x in cold[n][k])})" for n in names
        )
        print(f"| cold compile, {label} | {cells} | {meds[other] / meds[base]:.2f} |")
    print()
    header = " | ".join(f"{n}, CPU s" for n in names)
    print(f"| case | {header} | {other} / {base}: median (range) | same result |")
    print("|---|" + "---|" * len(names) + "---|---|")
    for case in [k for k in warm[base][0] if k != "file"]:
        meds = {n: statistics.median(w[case][0] for w in warm[n]) for n in names}
        ratios = [o[case][0] / b[case][0] for b, o in zip(warm[base], warm[other], strict=True)]
        same = all(w[case][1] == warm[base][0][case][1] for n in names for w in warm[n])
        cells = " | ".join(f"{meds[n]:.3f}" for n in names)
        print(
            f"| {case} | {cells} | {statistics.median(ratios):.3f} "
            f"({min(ratios):.2f}-{max(ratios):.2f}) | {'yes' if same else 'NO'} |"
        )


if __name__ == "__main__":
    main()
