"""The eviction-policy registry: every policy the cache engine can run, by name and code.

This module is the one place a policy is named. Its code is what the kernels dispatch on
(``kvtier.cache.hooks`` and ``kvtier.cache.kernels``, generated from this registry), its
defaults are what ``parse_policy`` fills in, its help is what the CLI and docs print. The
implementation (numba hooks and the Python ``Reference``, see ``kvtier.cache.policies.base``)
lives in ``kvtier.cache.policies.<name>``, imported only when a cache is built, so listing
policies stays free of numba.

To add a policy: write ``kvtier/cache/policies/<name>.py``, add an entry here (the next code),
and run ``python -m kvtier.cache.gen`` to regenerate the dispatch (``tests/test_registry.py``
fails until the generated files match the registry).
"""

from __future__ import annotations

from kvtier.registry import Entry, Registry


def _policy(name: str, code: int, help: str, **defaults: float) -> Entry:
    return Entry(name, code, help, defaults, impl=f"kvtier.cache.policies.{name}")


EVICTIONS = Registry(
    "eviction policy",
    [
        _policy(
            "lru",
            0,
            "least recently used; a hit moves the block to the head, eviction takes the tail",
        ),
        _policy("fifo", 1, "first in, first out; hits do not reorder"),
        _policy("lfu", 2, "least frequently used, ties by least recently used"),
        _policy(
            "s3fifo",
            3,
            "small FIFO + main FIFO (2-bit clock) + ghost; libCacheSim defaults",
            small=0.1,
            ghost=0.9,
            threshold=2,
        ),
        _policy(
            "sieve",
            4,
            "FIFO with a visited bit; the hand clears bits from old to new and evicts the first "
            "clear",
        ),
        _policy(
            "gdsf",
            5,
            "greedy-dual size-frequency: H = L + cost * freq, evict min H, L = H of the victim",
        ),
    ],
)


def policy_help() -> str:
    """The policies as ``--policy`` takes them, with each one's parameters and defaults."""
    parts = []
    for e in EVICTIONS:
        params = ",".join(f"{k}={v}" for k, v in e.defaults.items())
        parts.append(f"{e.name}({params})" if params else e.name)
    return ", ".join(parts)
