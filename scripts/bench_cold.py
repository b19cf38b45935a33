"""Cold start of one replay, from an empty numba cache, for two versions side by side.

Each version is a directory holding a ``kvtier`` link to that version's ``optimizer/`` folder
(``git archive REV | tar -x -C TREE; ln -s TREE/optimizer DIR/kvtier``); it is put first on
``PYTHONPATH`` of a fresh process, with a new ``NUMBA_CACHE_DIR``, which reads the Mooncake
trace, maps it at B=16 and replays it once with the default policy. The versions alternate
from round to round; the median of each is printed.

Usage: ``python scripts/bench_cold.py --version old=/tmp/oldlink --version new=/tmp/newkv
[--rounds 2]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "traces" / "mooncake-conversation.parquet"
CODE = """
import time
t0 = time.perf_counter()
from kvtier.scenario import Scenario
s = Scenario.from_files({trace!r}, block_tokens=16)
s.blocked()
t1 = time.perf_counter()
s.replay()
t2 = time.perf_counter()
import kvtier, os
print(os.path.realpath(kvtier.__file__), t1 - t0, t2 - t1)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="append", required=True, metavar="NAME=DIR")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    versions = dict(v.split("=", 1) for v in args.version)
    times: dict[str, list[float]] = {k: [] for k in versions}
    for r in range(args.rounds):
        order = list(versions) if r % 2 == 0 else list(reversed(versions))
        for name in order:
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": versions[name]}
                out = subprocess.run(
                    [sys.executable, "-c", CODE.format(trace=str(TRACE))],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
            times[name].append(float(out[2]))
            print(f"{name} ({out[0]}): a replay from an empty cache {float(out[2]):.1f} s")
    for name, ts in times.items():
        each = ", ".join(f"{t:.1f}" for t in ts)
        print(f"{name}: median {statistics.median(ts):.1f} s over {len(ts)} ({each})")


if __name__ == "__main__":
    main()
