"""Routers: where requests go, on both engines."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy import Policy
from kvtier.sim import build_config, simulate_raw
from kvtier.trace.blocked import BlockedTrace

ENGINES = ["reference", "numba"]


def cfg_for(routing: str, instances: int = 4, overload: int = 8):
    p = Policy()
    serving = replace(p.serving, routing=routing, instances=instances)
    p = replace(p, serving=replace(serving, affinity_overload=overload))
    return build_config(load_hardware("h100-node"), load_model("Llama-3.1-8B"), p)


@pytest.mark.parametrize("engine", ENGINES)
def test_round_robin_cycles(engine) -> None:
    t = BlockedTrace.from_lists([0.0] * 6, [10] * 6, [1] * 6, [[]] * 6, 16)
    raw = simulate_raw(t, cfg_for("round_robin"), engine=engine)
    assert raw.instance.tolist() == [0, 1, 2, 3, 0, 1]


@pytest.mark.parametrize("engine", ENGINES)
def test_least_loaded_fills_idle_instances_first(engine) -> None:
    # request 0 is long-running; later ones avoid its instance while others are emptier
    t = BlockedTrace.from_lists(
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.5],
        [5000, 10, 10, 10, 10, 10],
        [500, 1, 1, 1, 1, 1],
        [[]] * 6,
        16,
    )
    raw = simulate_raw(t, cfg_for("least_loaded"), engine=engine)
    # five at once: loads tie at the end, lowest index wins; at 0.5 s only instance 0 is busy
    assert raw.instance.tolist() == [0, 1, 2, 3, 0, 1]


@pytest.mark.parametrize("engine", ENGINES)
def test_prefix_affinity_follows_the_cached_prefix(engine) -> None:
    doc = list(range(50))
    # request 0 lands on instance 0 (all empty, lowest index); requests 1-3 occupy 1..3;
    # request 4 (same document, much later) returns to instance 0 where the prefix is cached
    t = BlockedTrace.from_lists(
        [0.0, 0.001, 0.001, 0.001, 5.0],
        [810, 20, 20, 20, 810],
        [1, 1, 1, 1, 1],
        [doc, [60], [61], [62], doc],
        16,
        n_blocks=63,
    )
    rr = simulate_raw(t, cfg_for("round_robin"), engine=engine)
    pa = simulate_raw(t, cfg_for("prefix_affinity"), engine=engine)
    assert rr.instance.tolist()[4] == 0 and pa.instance.tolist()[4] == 0
    t2 = BlockedTrace.from_lists([0.0, 5.0], [810, 810], [1, 1], [doc, doc], 16, n_blocks=63)
    rr2 = simulate_raw(t2, cfg_for("round_robin"), engine=engine)
    pa2 = simulate_raw(t2, cfg_for("prefix_affinity"), engine=engine)
    assert rr2.instance.tolist() == [0, 1] and rr2.hit_blocks.tolist() == [0, 0]
    assert pa2.instance.tolist() == [0, 0] and pa2.hit_blocks.tolist() == [0, 50]


@pytest.mark.parametrize("engine", ENGINES)
def test_prefix_affinity_skips_overloaded_instance(engine) -> None:
    doc = list(range(50))
    n = 4
    # the prefix lives on instance 0, which is busy with 3 more requests of the same document:
    # with overload 0 the next one goes to the least loaded instance instead
    t = BlockedTrace.from_lists(
        [0.0] + [1.0] * n, [810] * (n + 1), [200] * (n + 1), [doc] * (n + 1), 16, n_blocks=50
    )
    sticky = simulate_raw(t, cfg_for("prefix_affinity", overload=100), engine=engine)
    spread = simulate_raw(t, cfg_for("prefix_affinity", overload=0), engine=engine)
    assert set(sticky.instance.tolist()) == {0}
    assert len(set(spread.instance.tolist())) == 4


def kv_cfg(weight: float, instances: int = 4, tiers: tuple[str, ...] = ()):
    from kvtier.policy.model import TierPolicy

    p = Policy()
    serving = replace(p.serving, routing="kv_aware", instances=instances, kv_overlap_weight=weight)
    tier_pols = (TierPolicy(), *(TierPolicy(name=t, capacity_gb=100.0) for t in tiers))
    p = replace(p, serving=serving, tiers=tier_pols)
    return build_config(load_hardware("h100-node"), load_model("Llama-3.1-8B"), p)


def busy_prefix_trace() -> BlockedTrace:
    """Request 0 caches a 50-block document on instance 0 and finishes; request 1 (313 prompt
    blocks, a long decode) ties everywhere and lands on instance 0 too; request 2 reads the
    document while request 1 still holds instance 0's 313 active blocks."""
    doc = list(range(50))
    return BlockedTrace.from_lists(
        [0.0, 1.0, 1.001], [810, 5000, 810], [1, 500, 1], [doc, [], doc], 16, n_blocks=50
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_kv_aware_weighs_the_cached_prefix_against_active_blocks(engine) -> None:
    # cost = w * (810 / 16 - hits) + (active + 51 - hits); instance 0 has 50 hits and 313
    # active blocks, the others none: w = 1 gives 314.625 there against 101.625 elsewhere
    # (it leaves), w = 10 gives 320.25 against 557.25 (it stays with the prefix)
    t = busy_prefix_trace()
    light = simulate_raw(t, kv_cfg(1.0), engine=engine)
    heavy = simulate_raw(t, kv_cfg(10.0), engine=engine)
    assert light.instance.tolist() == [0, 0, 1] and light.hit_blocks.tolist() == [0, 0, 0]
    assert heavy.instance.tolist() == [0, 0, 0] and heavy.hit_blocks.tolist() == [0, 0, 50]


@pytest.mark.parametrize("engine", ENGINES)
def test_kv_aware_with_weight_zero_balances_active_blocks(engine) -> None:
    # weight 0: only active blocks count; a request of 313 blocks outweighs a short one
    t = BlockedTrace.from_lists(
        [0.0, 0.0, 0.0, 0.0], [5000, 10, 10, 10], [500, 1, 1, 1], [[]] * 4, 16
    )
    raw = simulate_raw(t, kv_cfg(0.0, instances=2), engine=engine)
    assert raw.instance.tolist() == [0, 1, 1, 1]


def test_kv_aware_tier_weights_follow_load_against_recompute() -> None:
    from kvtier.sim.routing import kv_route_weights

    w = kv_route_weights(kv_cfg(1.0, tiers=("dram", "ssd")))
    assert w.shape == (2, 4)
    assert np.all((w >= 0) & (w <= 1))
    # DRAM over PCIe loads faster than NVMe: each of its blocks is worth more to the router
    assert np.all(w[0] > w[1])
    assert kv_route_weights(kv_cfg(1.0)).shape == (0, 4)
