"""Benchmark: import the Mooncake conversation trace and map it to 16-token blocks.

Each run is a fresh process (so peak memory is that run's own), timed warm: numba's on-disk
cache is filled by a first, unrecorded run. Prints a Markdown table row set for
docs/benchmarks.md.

    python scripts/bench_trace.py [--runs 5] [--jsonl PATH] [--block-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_JSONL = (
    REPO.parent / "shared" / "traces-public" / "mooncake-fast25" / "conversation_trace.jsonl"
)

CHILD = r"""
import json, resource, sys, time
from kvtier.trace.importers import import_trace
from kvtier.trace.blocks import block_trace
from kvtier.trace.stats import trace_stats
path, B = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
trace = import_trace("mooncake", path)
t1 = time.perf_counter()
blocked = block_trace(trace, B)
t2 = time.perf_counter()
stats = trace_stats(trace, blocked)
t3 = time.perf_counter()
print(json.dumps({
    "import_s": t1 - t0, "map_s": t2 - t1, "stats_s": t3 - t2, "total_s": t2 - t0,
    "refs": blocked.n_block_refs, "distinct": blocked.n_blocks,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


NAIVE = r"""
import json, resource, sys, time
# plain Python: parse line by line, number (native hash, piece) keys with a dict
path, B = sys.argv[1], int(sys.argv[2])
t0 = time.perf_counter()
rows = [json.loads(line) for line in open(path)]
t1 = time.perf_counter()
G, ids, refs = 512, {}, 0
for r in rows:
    h = r["hash_ids"]
    for j in range(r["input_length"] // B):
        key = (h[j * B // G], j % (G // B)) if B < G else h[(j + 1) * B // G - 1]
        ids.setdefault(key, len(ids))
        refs += 1
t2 = time.perf_counter()
print(json.dumps({
    "import_s": t1 - t0, "map_s": t2 - t1, "stats_s": 0.0, "total_s": t2 - t0,
    "refs": refs, "distinct": len(ids),
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def run_once(jsonl: Path, block_tokens: int, code: str = CHILD) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", code, str(jsonl), str(block_tokens)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--jsonl", type=Path, default=DEFAULT_JSONL)
    parser.add_argument("--block-tokens", type=int, default=16)
    args = parser.parse_args()
    run_once(args.jsonl, args.block_tokens)  # fill numba's cache
    runs = [run_once(args.jsonl, args.block_tokens) for _ in range(args.runs)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(
        f"machine: {platform.machine()}, {platform.python_implementation()} "
        f"{platform.python_version()}, {len(runs)} runs, medians"
    )
    print(f"block references: {int(med['refs']):,}, distinct blocks: {int(med['distinct']):,}")
    print("| step | median s |")
    print("|---|---|")
    for key in ("import_s", "map_s", "total_s", "stats_s"):
        print(f"| {key[:-2]} | {med[key]:.3f} |")
    print(f"| peak RSS (MB) | {med['peak_rss_mb']:.0f} |")
    naive = [run_once(args.jsonl, args.block_tokens, NAIVE) for _ in range(max(1, args.runs // 2))]
    naive_total = statistics.median(r["total_s"] for r in naive)
    assert int(statistics.median(r["distinct"] for r in naive)) == int(med["distinct"])
    print(
        f"plain-Python baseline (json + dict), median of {len(naive)}: {naive_total:.2f} s "
        f"= {naive_total / med['total_s']:.1f}x slower, peak RSS "
        f"{statistics.median(r['peak_rss_mb'] for r in naive):.0f} MB"
    )


if __name__ == "__main__":
    main()
