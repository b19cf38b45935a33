"""Routers: where requests go, on both engines."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy import Policy
from kvtier.sim import build_config, simulate_raw
from kvtier.sim.routers.llmd_epp import tie_draw
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


def tie_pick(i: int, tied: list[int]) -> int:
    """The max-score picker's random tie-break as the replay draws it for request ``i``
    (kvtier.sim.routers.llmd_epp.tie_draw): the ``t``-th tied instance, in index order,
    replaces the pick when its draw in ``[0, t)`` is 0."""
    best = tied[0]
    for t, k in enumerate(tied[1:], start=2):
        if tie_draw(i, t) == 0:
            best = k
    return best


def test_ties_are_broken_alike_over_the_tied_instances() -> None:
    for n in (2, 3, 8):
        counts = np.bincount([tie_pick(i, list(range(n))) for i in range(6000)], minlength=n)
        assert counts.min() > 0.85 * 6000 / n and counts.max() < 1.15 * 6000 / n


def epp_cfg(instances: int = 2, metrics_interval: float = 0.0, **weights: float):
    # the scorers reading the instances' caches and, unless ``metrics_interval`` is given,
    # their exact queues and KV use, as these cases are derived (the EPP's own indexes:
    # tests/test_sim_epp_index.py; its scraped metrics: tests/test_sim_epp_metrics.py)
    p = Policy()
    serving = replace(
        p.serving,
        routing="llmd_epp",
        instances=instances,
        epp_prefix_source="cache",
        epp_metrics_interval_s=metrics_interval,
    )
    serving = replace(serving, **{f"epp_{k}_weight": v for k, v in weights.items()})
    return build_config(
        load_hardware("h100-node"), load_model("Llama-3.1-8B"), replace(p, serving=serving)
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_llmd_epp_no_hit_lru_spreads_cold_requests(engine) -> None:
    # four prompts no instance holds, each finished before the next: queue and KV scores tie
    # (1 everywhere), the no-hit-LRU score ranks never-used instances first (index order:
    # 1, 0.5, 0), then the least recently used; the fifth reads the first one's document,
    # scores 2 x 50/50 more on instance 0 (GPU and CPU prefix) and LRU 0.5 everywhere
    docs = [list(range(j * 50, j * 50 + 50)) for j in range(4)]
    t = BlockedTrace.from_lists(
        [0.0, 5.0, 10.0, 15.0, 20.0], [801] * 5, [1] * 5, [*docs, docs[0]], 16, n_blocks=200
    )
    raw = simulate_raw(t, epp_cfg(instances=3), engine=engine)
    assert raw.instance.tolist() == [0, 1, 2, 0, 0]
    assert raw.hit_blocks.tolist()[4] == 50
    # without it every cold request ties on all three (the picker's random draw, fixed by the
    # request's index); the fifth goes where the first one's document is
    lru_off = simulate_raw(t, epp_cfg(instances=3, no_hit_lru=0.0), engine=engine)
    first = [tie_pick(i, [0, 1, 2]) for i in range(4)]
    assert lru_off.instance.tolist() == [*first, first[0]]


def group_trace(doc_blocks: int) -> BlockedTrace:
    """Request 0 caches a ``doc_blocks``-block system prompt on instance 0 and finishes; at
    5 s four prompts of the group arrive at once (the system prompt and 6 - doc_blocks blocks
    of their own, 97 tokens), routed before either instance runs an iteration."""
    doc = list(range(doc_blocks))
    own = [list(range(100 + 10 * j, 100 + 10 * j + 6 - doc_blocks)) for j in range(4)]
    return BlockedTrace.from_lists(
        [0.0] + [5.0] * 4,
        [16 * doc_blocks + 1] + [97] * 4,
        [1] * 5,
        [doc, *(doc + o for o in own)],
        16,
        n_blocks=200,
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_llmd_epp_group_sticks_until_the_queue_outweighs_its_prefix(engine) -> None:
    # weights 1:1:1:1:1, no lower tier (the CPU prefix is the HBM prefix): on instance 0 the
    # group scores 2 x doc/6 for its prefix, the queue scorer (max - q) / (max - min) takes at
    # most 1 from the instance with the longer queue; KV use is 0 on both (nothing admitted
    # yet, 1 each) and the LRU score 0.5 on both (a hit somewhere)
    # 4 of 6 blocks: 2 x 4/6 = 1.33 > 1, every request stays on instance 0
    assert simulate_raw(group_trace(4), epp_cfg(), engine=engine).instance.tolist() == [0] * 5
    # 2 of 6 blocks: 0.67 < 1, the second of the burst (queue 1 against 0) goes to
    # instance 1, the third back to 0 (queues equal), the fourth to 1
    raw = simulate_raw(group_trace(2), epp_cfg(), engine=engine)
    assert raw.instance.tolist() == [0, 0, 1, 0, 1]
    # 4 of 6 blocks with the queue weighted 2: 2 x 1 > 1.33, the group splits
    raw = simulate_raw(group_trace(4), epp_cfg(queue=2.0), engine=engine)
    assert raw.instance.tolist() == [0, 0, 1, 0, 1]


@pytest.mark.parametrize("engine", ENGINES)
def test_llmd_epp_active_request_scorer_counts_running_requests(engine) -> None:
    # three long requests (2,000 tokens out, still decoding at 3 s) at 0, 1 and 2 s, then two
    # short ones together at 3 s; only the active-request scorer weighs (1 when an instance
    # has none, else (max - a) / max): at 0 s every instance scores 1 (a tie, the picker's
    # draw); at 1 s the two idle ones score 1 (a tie); at 2 s the last idle one; at 3 s every
    # instance has one and scores 0 (a tie); the second at 3 s sees 2 on that one, 1 on the
    # others: 0 there, 0.5 on the other two (a tie)
    t = BlockedTrace.from_lists(
        [0.0, 1.0, 2.0, 3.0, 3.0],
        [5000, 5000, 5000, 10, 10],
        [2000, 2000, 2000, 1, 1],
        [[]] * 5,
        16,
    )
    off = {k: 0.0 for k in ("queue", "kv_util", "gpu_prefix", "cpu_prefix", "no_hit_lru")}
    raw = simulate_raw(t, epp_cfg(instances=3, **off, active=1.0), engine=engine)
    p0 = tie_pick(0, [0, 1, 2])
    p1 = tie_pick(1, [k for k in range(3) if k != p0])
    p2 = next(k for k in range(3) if k not in (p0, p1))
    p3 = tie_pick(3, [0, 1, 2])
    p4 = tie_pick(4, [k for k in range(3) if k != p3])
    assert raw.instance.tolist() == [p0, p1, p2, p3, p4]
    # the queue scorer sees only waiting requests: the running ones leave every queue empty
    # (1 everywhere, a tie) until the first short request waits on its instance
    raw = simulate_raw(t, epp_cfg(instances=3, **{**off, "queue": 1.0}), engine=engine)
    picks = [tie_pick(i, [0, 1, 2]) for i in range(4)]
    assert raw.instance.tolist() == [*picks, tie_pick(4, [k for k in range(3) if k != picks[3]])]


def test_llmd_epp_active_score_is_scaled_by_the_most_active_not_min_max() -> None:
    # the reference step on three instances with 3, 2 and 1 requests running and none
    # waiting, a cold request (no prefix anywhere), no-hit-LRU weight 0.8 and active weight 1;
    # LRU order (stamps 3, 1, 2): instance 1 first (1), 2 (0.5), 0 (0).
    # active scores (3 - a) / 3 = [0, 1/3, 2/3]: totals [0, 0.8 + 1/3, 0.4 + 2/3] = [0,
    # 1.133, 1.067] -> instance 1 (a min-max scaling, [0, 0.5, 1], would give 1.3 < 1.4 ->
    # instance 2)
    from types import SimpleNamespace

    from kvtier.sim.routers import RouteView
    from kvtier.sim.routers.llmd_epp import route

    def inst(running: int):
        pool = SimpleNamespace(capacity=100, free=list(range(100)))
        return SimpleNamespace(pool=pool, waiting=[], load=running)

    cfg = SimpleNamespace(block_tokens=16, epp_weights=(0.0, 0.0, 0.0, 0.0, 0.8, 1.0))
    view = RouteView(
        instances=[inst(3), inst(2), inst(1)],
        n_route=3,
        cfg=cfg,
        prefix=False,
        lower=None,
        route_w=np.zeros((0, 3)),
        cold_stamp=[3, 1, 2],
    )
    req = SimpleNamespace(blocks=[7, 8], input_tokens=40, idx=9)
    assert route(view, req) == 1
    assert view.cold_stamp == [3, 10, 2]  # the cold request's pick becomes the most recent
