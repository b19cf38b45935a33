"""Small jobs side by side: ``kvtier trace stats`` and ``kvtier trace mrc`` against
kvcache-simulator's ``run`` on the same 10,000 requests.

The input is the first ``--requests`` lines of the Mooncake FAST'25 conversation trace (JSON
Lines with ``hash_ids`` per 512-token block, which kvcache-simulator reads as it is); kvtier
reads the same requests after one ``kvtier trace import --from mooncake`` (timed apart, not
part of the comparison, as a trace is imported once and inspected many times).
kvcache-simulator 0.1.3 (``pip install kvcache-simulator``, or ``.[bench]``) has no separate
statistics command: its ``run`` prints the trace's counts and the LRU hit rate at each memory
budget, the equivalent of both kvtier commands, so each kvtier command is compared with one
whole ``run`` (``--policies lru``; its default ``cpp`` backend, and its pure-Python one).

Every command runs as a fresh process, the tools alternating from round to round; a first,
unrecorded round fills the caches (kvcache-simulator's compiled C++ core; kvtier's numba
cache, which these small jobs no longer use). Wall time is ``time.perf_counter`` around the
process; CPU time is the process's user + system time (``RUSAGE_CHILDREN``), the figure that
holds on a shared machine. Prints the medians and the ratios as Markdown.

    python scripts/bench_small_jobs.py [--runs 5] [--requests 10000] [--jsonl PATH]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_JSONL = (
    REPO.parent / "shared" / "traces-public" / "mooncake-fast25" / "conversation_trace.jsonl"
)
PEER_MODEL = "llama-3.1-70b"  # kvcache-simulator's catalogue id; only sizes the budgets in GiB


def _timed(cmd: list[str]) -> tuple[float, float]:
    """Wall and CPU seconds of ``cmd`` run to completion (its output discarded)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def _peer_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvcache-simulator")
    except PackageNotFoundError:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="recorded rounds (median of these)")
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--jsonl", type=Path, default=DEFAULT_JSONL)
    ap.add_argument(
        "--peer-backends", default="cpp,python", help="kvcache-simulator backends to run"
    )
    args = ap.parse_args()
    peer = _peer_version()
    if peer is None:
        sys.exit("kvcache-simulator is not installed: pip install kvcache-simulator (or .[bench])")
    if not args.jsonl.is_file():
        sys.exit(f"no such trace: {args.jsonl}")

    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        jsonl = Path(tmp) / f"mooncake-{args.requests}.jsonl"
        with args.jsonl.open() as src, jsonl.open("w") as dst:
            for i, line in enumerate(src):
                if i >= args.requests:
                    break
                dst.write(line)
        parquet = Path(tmp) / f"mooncake-{args.requests}.parquet"
        kvtier = [py, "-m", "kvtier"]
        import_cmd = [*kvtier, "trace", "import", "--from", "mooncake", str(jsonl)]
        import_cmd += ["-o", str(parquet)]
        import_wall, import_cpu = _timed(import_cmd)

        peer_cmd = [py, "-m", "kvcache_sim", "run", "--trace", str(jsonl), "--block-size", "512"]
        peer_cmd += ["--model", PEER_MODEL, "--policies", "lru", "--no-progress"]
        jobs = {
            "kvtier trace stats": [*kvtier, "trace", "stats", str(parquet)],
            "kvtier trace mrc -B 512": [*kvtier, "trace", "mrc", str(parquet), "-B", "512"],
        }
        for backend in args.peer_backends.split(","):
            if backend == "cpp" and shutil.which("c++") is None and shutil.which("g++") is None:
                print("no C++ compiler: kvcache-simulator's cpp backend skipped", file=sys.stderr)
                continue
            jobs[f"kvcache-simulator run ({backend})"] = [*peer_cmd, "--backend", backend]

        times: dict[str, list[tuple[float, float]]] = {name: [] for name in jobs}
        for r in range(args.runs + 1):
            order = list(jobs) if r % 2 == 0 else list(reversed(jobs))
            for name in order:
                wall, cpu = _timed(jobs[name])
                if r > 0:  # round 0 fills the caches
                    times[name].append((wall, cpu))
                print(f"round {r} {name}: {wall:.2f} s wall, {cpu:.2f} s CPU", file=sys.stderr)

    med = {
        name: (statistics.median(w for w, _ in ts), statistics.median(c for _, c in ts))
        for name, ts in times.items()
    }
    print(
        f"{args.requests:,} requests of {args.jsonl.name}; {args.runs} rounds; "
        f"kvcache-simulator {peer}; Python {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} CPUs"
    )
    print(
        f"kvtier trace import (once, not compared): {import_wall:.2f} s wall, "
        f"{import_cpu:.2f} s CPU"
    )
    print()
    print("| command | median wall | median CPU | runs (CPU s) |")
    print("|---|---:|---:|---|")
    for name, (wall, cpu) in med.items():
        each = ", ".join(f"{c:.2f}" for _, c in times[name])
        print(f"| `{name}` | {wall:.2f} s | {cpu:.2f} s | {each} |")
    print()
    for mine in (n for n in med if n.startswith("kvtier")):
        for theirs in (n for n in med if n.startswith("kvcache-simulator")):
            ratio = med[mine][1] / med[theirs][1]
            wall_ratio = med[mine][0] / med[theirs][0]
            print(f"- `{mine}` / `{theirs}`: CPU {ratio:.2f}x, wall {wall_ratio:.2f}x")


if __name__ == "__main__":
    main()
