"""Exact expected results of every policy on one small fixed trace.

When a change of semantics is intended, print the new table with
``PYTHONPATH=. python -m tests.test_cache_expected`` and paste it over ``EXPECTED``.
"""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.cache import replay
from kvtier.trace.blocked import BlockedTrace

POLICIES = ["lru", "fifo", "lfu", "s3fifo", "sieve", "gdsf"]
CAPACITIES = [4, 10, 20, 40]


def fixed_trace() -> BlockedTrace:
    """60 requests over 8 shared prefixes (conversations) with private tails; seed fixed."""
    rng = np.random.default_rng(20240601)
    blocks: list[list[int]] = []
    for r in range(60):
        root = int(rng.integers(0, 8))
        shared = [root * 10 + k for k in range(int(rng.integers(1, 6)))]
        tail = [100 + r * 3 + k for k in range(int(rng.integers(0, 3)))]
        blocks.append(shared + tail)
    return BlockedTrace.from_lists(
        [float(i) for i in range(60)],
        [len(b) * 16 + 5 for b in blocks],
        [1] * 60,
        blocks,
        16,
        n_blocks=300,
    )


def table() -> dict[tuple[str, int, str], int]:
    trace = fixed_trace()
    out: dict[tuple[str, int, str], int] = {}
    for policy in POLICIES:
        for cap in CAPACITIES:
            for mode in ("prefix", "flat"):
                out[(policy, cap, mode)] = replay(trace, policy, cap, flat=mode == "flat").hits
    return out


EXPECTED: dict[tuple[str, int, str], int] = {
    ("fifo", 4, "flat"): 14,
    ("fifo", 4, "prefix"): 26,
    ("fifo", 10, "flat"): 30,
    ("fifo", 10, "prefix"): 53,
    ("fifo", 20, "flat"): 70,
    ("fifo", 20, "prefix"): 73,
    ("fifo", 40, "flat"): 112,
    ("fifo", 40, "prefix"): 114,
    ("gdsf", 4, "flat"): 14,
    ("gdsf", 4, "prefix"): 29,
    ("gdsf", 10, "flat"): 39,
    ("gdsf", 10, "prefix"): 53,
    ("gdsf", 20, "flat"): 88,
    ("gdsf", 20, "prefix"): 89,
    ("gdsf", 40, "flat"): 138,
    ("gdsf", 40, "prefix"): 137,
    ("lfu", 4, "flat"): 10,
    ("lfu", 4, "prefix"): 25,
    ("lfu", 10, "flat"): 40,
    ("lfu", 10, "prefix"): 52,
    ("lfu", 20, "flat"): 83,
    ("lfu", 20, "prefix"): 90,
    ("lfu", 40, "flat"): 144,
    ("lfu", 40, "prefix"): 144,
    ("lru", 4, "flat"): 14,
    ("lru", 4, "prefix"): 26,
    ("lru", 10, "flat"): 33,
    ("lru", 10, "prefix"): 51,
    ("lru", 20, "flat"): 81,
    ("lru", 20, "prefix"): 87,
    ("lru", 40, "flat"): 123,
    ("lru", 40, "prefix"): 124,
    ("s3fifo", 4, "flat"): 0,
    ("s3fifo", 4, "prefix"): 0,
    ("s3fifo", 10, "flat"): 0,
    ("s3fifo", 10, "prefix"): 0,
    ("s3fifo", 20, "flat"): 98,
    ("s3fifo", 20, "prefix"): 105,
    ("s3fifo", 40, "flat"): 143,
    ("s3fifo", 40, "prefix"): 141,
    ("sieve", 4, "flat"): 17,
    ("sieve", 4, "prefix"): 32,
    ("sieve", 10, "flat"): 35,
    ("sieve", 10, "prefix"): 51,
    ("sieve", 20, "flat"): 83,
    ("sieve", 20, "prefix"): 90,
    ("sieve", 40, "flat"): 144,
    ("sieve", 40, "prefix"): 144,
}


@pytest.mark.parametrize("key", sorted(EXPECTED))
def test_expected_hits(key: tuple[str, int, str]) -> None:
    assert table_cached()[key] == EXPECTED[key]


def test_table_covers_every_case() -> None:
    assert set(EXPECTED) == set(table_cached())


_CACHE: dict[tuple[str, int, str], int] = {}


def table_cached() -> dict[tuple[str, int, str], int]:
    if not _CACHE:
        _CACHE.update(table())
    return _CACHE


if __name__ == "__main__":  # pragma: no cover - prints the table to paste over EXPECTED
    print("EXPECTED: dict[tuple[str, int, str], int] = {")
    for k, v in sorted(table().items()):
        print(f"    {k!r}: {v},")
    print("}")
