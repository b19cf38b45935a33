"""Parity with libCacheSim (PyPI ``libcachesim``) in flat mode, access by access.

All six policies agree exactly with ``libcachesim`` 0.3 on every access, at capacities that
libCacheSim accepts: its S3-FIFO refuses (aborts the process) when the small FIFO would hold
0 blocks, so S3-FIFO is compared only at capacities with ``int(C * 0.1) >= 1``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvtier.cache import TierState
from kvtier.cache.oracle import write_oracle_general
from tests.cache_helpers import random_ids

lcs = pytest.importorskip("libcachesim")

MAKERS = {
    "lru": lambda c: lcs.LRU(c),
    "fifo": lambda c: lcs.FIFO(c),
    "lfu": lambda c: lcs.LFU(c),
    "s3fifo": lambda c: lcs.S3FIFO(c),
    "sieve": lambda c: lcs.Sieve(c),
    "gdsf": lambda c: lcs.GDSF(c),
}


def libcachesim_hits(policy: str, capacity: int, ids: np.ndarray) -> np.ndarray:
    cache = MAKERS[policy](capacity)
    out = np.zeros(len(ids), dtype=bool)
    req = lcs.Request()
    req.obj_size = 1
    for j, b in enumerate(ids):
        req.obj_id = int(b)
        out[j] = cache.get(req)
    return out


CASES = [
    (seed, nb, zipf) for seed, (nb, zipf) in enumerate([(50, True), (300, False), (300, True)])
]


@pytest.mark.parametrize("policy", list(MAKERS))
@pytest.mark.parametrize("capacity", [1, 2, 7, 10, 19, 20, 64, 150])
@pytest.mark.parametrize(("seed", "n_blocks", "zipf"), CASES)
def test_flat_parity_access_by_access(
    policy: str, capacity: int, seed: int, n_blocks: int, zipf: bool
) -> None:
    if policy == "s3fifo" and int(capacity * 0.1) < 1:
        pytest.skip("libCacheSim's S3-FIFO aborts when its small FIFO has 0 blocks")
    ids = random_ids(seed, 3000, n_blocks, zipf)
    ours, _ = TierState.create(policy, capacity, n_blocks).access_many(ids)
    assert np.array_equal(ours, libcachesim_hits(policy, capacity, ids))


@pytest.mark.parametrize("policy", ["lru", "fifo", "s3fifo", "sieve"])
def test_process_trace_on_oracle_general_file(policy: str, tmp_path: Path) -> None:
    """The C path the benchmark times reads our oracleGeneral file and agrees with us."""
    ids = random_ids(42, 20000, 2000, zipf=True)
    path = tmp_path / "t.oracleGeneral.bin"
    write_oracle_general(ids, path)
    assert path.stat().st_size == 24 * len(ids)
    reader = lcs.TraceReader(str(path), lcs.TraceType.ORACLE_GENERAL_TRACE)
    miss_ratio, _ = MAKERS[policy](300).process_trace(reader)
    hits, _ = TierState.create(policy, 300, 2000).access_many(ids)
    assert round((1 - miss_ratio) * len(ids)) == int(hits.sum())


@pytest.mark.parametrize(
    ("small", "ghost", "threshold"), [(0.2, 0.9, 1), (0.1, 0.0, 2), (0.3, 0.5, 3), (0.05, 1.5, 2)]
)
@pytest.mark.parametrize("capacity", [40, 120])
def test_s3fifo_parameters_match(small: float, ghost: float, threshold: int, capacity: int) -> None:
    """Small-queue ratio, ghost size (0 = no ghost) and move threshold mean the same."""
    ids = random_ids(capacity, 4000, 400, zipf=True)
    name = f"s3fifo(small={small},ghost={ghost},threshold={threshold})"
    ours, _ = TierState.create(name, capacity, 400).access_many(ids)
    cache = lcs.S3FIFO(
        capacity,
        small_size_ratio=small,
        ghost_size_ratio=ghost,
        move_to_main_threshold=threshold,
    )
    req = lcs.Request()
    req.obj_size = 1
    theirs = np.zeros(len(ids), dtype=bool)
    for j, b in enumerate(ids):
        req.obj_id = int(b)
        theirs[j] = cache.get(req)
    assert np.array_equal(ours, theirs)
