"""Routers: where requests go, on both engines."""

from __future__ import annotations

from dataclasses import replace

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
