"""Invariants every eviction policy must keep (one shared suite, subclassed per policy)."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.cache import TierState, parse_policy, replay
from kvtier.errors import InputError
from kvtier.trace.blocked import BlockedTrace
from tests.cache_helpers import random_ids


class PolicyInvariants:
    """Subclasses set ``policy``; every test here runs for each of them."""

    policy: str = ""

    def ids(self, seed: int = 0) -> np.ndarray:
        return random_ids(seed, 3000, 200, zipf=seed % 2 == 0)

    @pytest.mark.parametrize("capacity", [1, 7, 25, 60, 300])
    def test_capacity_never_exceeded_and_residency_consistent(self, capacity: int) -> None:
        tier = TierState.create(self.policy, capacity, 200)
        for b in self.ids(capacity)[:800]:
            hit, victim = tier.access(int(b))
            assert tier.size <= capacity
            assert tier.size == len(tier.resident())
            if victim >= 0:
                assert not tier.contains(victim)
                assert not hit

    @pytest.mark.parametrize("capacity", [3, 40])
    def test_hits_plus_misses_equal_accesses(self, capacity: int) -> None:
        ids = self.ids(5)
        tier = TierState.create(self.policy, capacity, 200)
        hit, evicted = tier.access_many(ids)
        assert len(hit) == len(ids) and tier.clock == len(ids)
        misses = int((~hit).sum())
        assert int(hit.sum()) + misses == len(ids)
        # every miss admits one block and every eviction frees one, so the balance is exact;
        # S3-FIFO with a small FIFO of at most 1 block admits nothing (as libCacheSim)
        assert tier.n_evictions == int((evicted >= 0).sum())
        spec = parse_policy(self.policy)
        if spec.base == "s3fifo" and int(capacity * spec.param("small")) <= 1:
            assert tier.size == 0 and tier.n_evictions == 0
        else:
            assert tier.size == misses - tier.n_evictions

    def test_deterministic(self) -> None:
        ids = self.ids(3)
        runs = []
        for _ in range(2):
            tier = TierState.create(self.policy, 30, 200)
            runs.append(tier.access_many(ids))
        assert np.array_equal(runs[0][0], runs[1][0])
        assert np.array_equal(runs[0][1], runs[1][1])

    def test_everything_fits_means_only_cold_misses(self) -> None:
        ids = self.ids(7)
        tier = TierState.create(self.policy, 200, 200)
        hit, evicted = tier.access_many(ids)
        first = np.zeros(len(ids), dtype=bool)
        _, idx = np.unique(ids, return_index=True)
        first[idx] = True
        assert np.array_equal(hit, ~first)
        assert (evicted < 0).all()

    def test_capacity_zero_caches_nothing(self) -> None:
        tier = TierState.create(self.policy, 0, 10)
        hit, evicted = tier.access_many(np.array([1, 1, 2, 1], dtype=np.int32))
        assert not hit.any() and tier.size == 0 and (evicted < 0).all()

    def test_remove(self) -> None:
        tier = TierState.create(self.policy, 50, 200)
        tier.access_many(self.ids(9)[:400])
        resident = tier.resident()
        assert len(resident) > 0
        b = int(resident[0])
        assert tier.remove(b) is True
        assert not tier.contains(b) and tier.size == len(resident) - 1
        assert tier.remove(b) is False
        tier.access_many(self.ids(11)[:400])  # the structure is still sound after removal
        assert tier.size <= 50 and tier.size == len(tier.resident())

    def test_replay_accounting(self) -> None:
        trace = BlockedTrace.from_lists(
            [0.0, 1.0, 2.0, 3.0],
            [70, 50, 70, 20],
            [1, 1, 1, 1],
            [[0, 1, 2, 3], [0, 1, 5], [0, 1, 2, 3], []],
            16,
        )
        for flat in (False, True):
            r = replay(trace, self.policy, 40, flat=flat, warmup=0.5)
            assert r.first_measured == 2
            assert r.accesses == 4 and r.hits + r.misses == r.accesses
            assert r.hit_ratio_tokens == pytest.approx(r.hits * 16 / 90)


class TestLru(PolicyInvariants):
    policy = "lru"


class TestFifo(PolicyInvariants):
    policy = "fifo"


class TestLfu(PolicyInvariants):
    policy = "lfu"


class TestS3Fifo(PolicyInvariants):
    policy = "s3fifo"


class TestS3FifoEager(PolicyInvariants):
    policy = "s3fifo(small=0.3,ghost=0.5,threshold=1)"


class TestSieve(PolicyInvariants):
    policy = "sieve"


class TestGdsf(PolicyInvariants):
    policy = "gdsf"


def test_policy_names_carry_parameters() -> None:
    assert parse_policy("lru").name == "lru"
    assert parse_policy("s3fifo").name == "s3fifo(small=0.1,ghost=0.9,threshold=2)"
    assert parse_policy(" S3FIFO(threshold=1, small=0.2) ").name == (
        "s3fifo(small=0.2,ghost=0.9,threshold=1)"
    )
    assert parse_policy(parse_policy("gdsf").name) == parse_policy("gdsf")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("arc", "unknown policy"),
        ("lru(x=1)", "unknown parameter"),
        ("s3fifo(small=abc)", "not a number"),
        ("s3fifo(small=1.5)", "0 <= small < 1"),
        ("s3fifo(threshold=0)", "threshold"),
        ("s3fifo(threshold=1.5)", "threshold"),
        ("lru(", "does not parse"),
    ],
)
def test_bad_policy_names(text: str, fragment: str) -> None:
    with pytest.raises(InputError, match=fragment):
        parse_policy(text)


def test_bad_tier_arguments() -> None:
    with pytest.raises(InputError, match="capacity"):
        TierState.create("lru", -1, 10)
    with pytest.raises(InputError, match="capacity"):
        TierState.create("lru", 2.5, 10)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="cost"):
        TierState.create("gdsf", 2, 3, cost=np.array([1.0, np.nan, 1.0]))
    with pytest.raises(InputError, match="cost"):
        TierState.create("gdsf", 2, 3, cost=np.ones(4))
    tier = TierState.create("lru", 2, 3)
    for bad in (-1, 3, 1.5):
        with pytest.raises(InputError, match="block id"):
            tier.access(bad)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="block ids"):
        tier.access_many(np.array([0, 3]))
    with pytest.raises(InputError, match="warmup"):
        replay(BlockedTrace.from_lists([0.0], [32], [1], [[0]], 16), "lru", 1, warmup=1.0)


def test_replay_through_a_warm_tier() -> None:
    trace = BlockedTrace.from_lists([0.0, 1.0], [48, 48], [1, 1], [[0, 1, 2], [0, 1, 2]], 16)
    tier = TierState.create("lru", 8, 3)
    assert replay(trace, "lru", 0, tier=tier).hit_blocks.tolist() == [0, 3]
    assert replay(trace, "lru", 0, tier=tier).hit_blocks.tolist() == [3, 3]  # still warm
    with pytest.raises(InputError, match="does not match"):
        replay(trace, "fifo", 8, tier=tier)
    with pytest.raises(InputError, match="block ids"):
        replay(trace, "lru", 8, tier=TierState.create("lru", 8, 2))
