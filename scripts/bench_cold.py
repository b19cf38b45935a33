"""Cold start of one replay, from an empty numba cache, for two versions side by side.

Each version is a directory holding a ``kvtier`` link to that version's ``optimizer/`` folder
(``git archive REV | tar -x -C TREE; ln -s TREE/optimizer DIR/kvtier``); it is put first on
``PYTHONPATH`` of a fresh process, with a new ``NUMBA_CACHE_DIR``, which reads the Mooncake
trace, maps it at B=16 and replays it once with the default policy. The versions alternate
from round to round; the median of each is printed. Times are the process's CPU time (other
jobs on a shared machine stretch the wall time far more), the replay's (compile included) and
the preparation's (imports, reading and mapping the trace) apart.

With ``--timers N`` each run also prints numba's compile timers of the ``N`` slowest
dispatchers (``compiler_lock``: the whole compile of that overload, the functions it calls
compiled meanwhile included; ``llvm_lock``: LLVM's share), summed over their overloads.

Usage: ``python scripts/bench_cold.py --version old=/tmp/oldlink --version new=/tmp/newkv
[--rounds 2] [--timers 12]``.
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
t0 = time.process_time()
from kvtier.scenario import Scenario
s = Scenario.from_files({trace!r}, block_tokens=16)
s.blocked()
t1 = time.process_time()
s.replay()
t2 = time.process_time()
import gc, kvtier, os
from numba.core.registry import CPUDispatcher
print(os.path.realpath(kvtier.__file__), t1 - t0, t2 - t1)
rows = {{}}
for d in gc.get_objects():
    if isinstance(d, CPUDispatcher):
        name = d.py_func.__module__ + "." + d.py_func.__qualname__
        for cres in d.overloads.values():
            tm = (cres.metadata or {{}}).get("timers", {{}})
            c, l, n = rows.get(name, (0.0, 0.0, 0))
            rows[name] = (c + tm.get("compiler_lock", 0.0), l + tm.get("llvm_lock", 0.0), n + 1)
for name, (c, l, n) in sorted(rows.items(), key=lambda r: -r[1][0])[:{timers}]:
    print(f"  {{c:7.1f}} {{l:7.1f}} {{n:3d}}  {{name}}")
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--version", action="append", required=True, metavar="NAME=DIR")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timers", type=int, default=0, metavar="N")
    args = ap.parse_args()
    versions = dict(v.split("=", 1) for v in args.version)
    times: dict[str, list[float]] = {k: [] for k in versions}
    prep: dict[str, list[float]] = {k: [] for k in versions}
    for r in range(args.rounds):
        order = list(versions) if r % 2 == 0 else list(reversed(versions))
        for name in order:
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PYTHONPATH": versions[name]}
                lines = subprocess.run(
                    [sys.executable, "-c", CODE.format(trace=str(TRACE), timers=args.timers)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.splitlines()
            where, t_prep, t_replay = lines[0].split()
            times[name].append(float(t_replay))
            prep[name].append(float(t_prep))
            print(
                f"{name} ({where}): a replay from an empty cache {float(t_replay):.1f} s CPU "
                f"(imports and trace {float(t_prep):.1f} s)"
            )
            if args.timers:
                print("  compile  (llvm)  overloads  dispatcher")
                print("\n".join(lines[1:]), flush=True)
    for name, ts in times.items():
        each = ", ".join(f"{t:.1f}" for t in ts)
        print(
            f"{name}: median {statistics.median(ts):.1f} s CPU over {len(ts)} ({each}); "
            f"imports and trace {statistics.median(prep[name]):.1f} s"
        )


if __name__ == "__main__":
    main()
