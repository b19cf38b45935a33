"""``IdTable``'s kernels alone, for one version: numbering and finding keys in a table allocated
large enough beforehand (no growth, so no allocation or page faults in the timing).

6M distinct random 64-bit keys plus 3M repeats (9M lookups); median of 5 calls each, process
CPU time; prints the package file, then the median ``ids`` and ``find`` seconds. Run it once per
version and round, alternating, with that version's tree linked as ``kvtier`` first on
``PYTHONPATH`` and its own ``NUMBA_CACHE_DIR`` (as ``scripts/bench_cache_versions.py`` does):

    for r in 1 2 3 4; do for v in old new; do NUMBA_CACHE_DIR=/tmp/nbc/$v \\
        PYTHONPATH=/tmp/${v}kv python scripts/bench_idtable.py; done; done
"""

from __future__ import annotations

import statistics
import time

import numpy as np

import kvtier
from kvtier.trace.idtable import IdTable


def main() -> None:
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 2**63, size=6_000_000, dtype=np.uint64)
    keys = np.concatenate([keys, keys[rng.integers(0, len(keys), 3_000_000)]])
    IdTable(capacity=16).ids(keys[:1000])  # compile (or load) outside the timing
    IdTable(capacity=16).find(keys[:1000])
    ins, fnd = [], []
    for _ in range(5):
        table = IdTable(capacity=1 << 24)
        table.keys_hi[:] = 0  # numpy's zeros are mapped lazily: fault the pages in now
        table.vals[:] = -1
        t0 = time.process_time()
        table.ids(keys)
        ins.append(time.process_time() - t0)
        t0 = time.process_time()
        table.find(keys)
        fnd.append(time.process_time() - t0)
    print(kvtier.__file__, f"{statistics.median(ins):.3f}", f"{statistics.median(fnd):.3f}")


if __name__ == "__main__":
    main()
