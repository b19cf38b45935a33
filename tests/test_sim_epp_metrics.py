"""llm-d's EPP reading the queue and KV use it last scraped (kvtier.sim.routers.epp_metrics)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.sim import simulate_raw
from kvtier.sim.routers.epp_metrics import (
    RING,
    new_metrics,
    scraped_at,
    seen,
    step_ended,
    step_scheduled,
)
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import replay_both
from tests.test_sim_routing import epp_cfg, tie_pick

ENGINES = ["reference", "numba"]


def test_an_instance_that_ended_no_step_looks_empty() -> None:
    mx = new_metrics(2)
    assert seen(mx, 0, 10.0, 500) == (0, 500)
    step_scheduled(mx, 1, 3)
    step_ended(mx, 1, 0.4, 120, True, 1)
    assert seen(mx, 0, 10.0, 500) == (0, 500)
    assert seen(mx, 1, 0.35, 500) == (0, 500)  # its step ended after the scrape
    assert seen(mx, 1, 0.4, 500) == (3, 120)


def test_the_last_step_ended_by_the_scrape_is_seen() -> None:
    mx = new_metrics(1)
    for j in range(5):  # steps ending at 0.1, 0.2, ... with j waiting and 100 - j free
        step_scheduled(mx, 0, j)
        step_ended(mx, 0, 0.1 * (j + 1), 100 - j, False, 1)
    assert seen(mx, 0, scraped_at(0.349, 0.05), 100) == (2, 98)  # scraped at 0.30
    assert seen(mx, 0, scraped_at(0.351, 0.05), 100) == (2, 98)  # 0.35: the step of 0.4 later
    assert seen(mx, 0, 9.0, 100) == (4, 96)


@given(st.integers(1, 3 * RING), st.floats(0.0, 4.0))
def test_the_ring_keeps_the_last_steps(n_steps: int, tick: float) -> None:
    # steps ending every 0.01 s from 0.01: the EPP sees the last one ended by the scrape
    # among the RING kept, the oldest kept when every kept one ended later
    mx = new_metrics(1)
    ends = [0.01 * (j + 1) for j in range(n_steps)]
    for j, t in enumerate(ends):
        step_scheduled(mx, 0, j)
        step_ended(mx, 0, t, 1000 - j, j % 2 == 0, 1)
    kept = list(range(max(0, n_steps - RING), n_steps))
    by = [j for j in kept if ends[j] <= tick]
    if by:
        want = (by[-1], 1000 - by[-1])
    elif n_steps > RING:
        want = (kept[0], 1000 - kept[0])
    else:
        want = (0, 1000)
    assert seen(mx, 0, tick, 1000) == want


def test_sglang_reports_a_decode_step_only_every_interval() -> None:
    # SGLang's gauges: after each prefill batch and every decode_log_interval-th decode batch
    # (here 3): steps ending at 1..9 s, prefill at 1 and 6, decodes otherwise (the 3rd and 6th
    # decode steps end at 4 and 8 s)
    mx = new_metrics(1)
    for t in range(1, 10):
        step_scheduled(mx, 0, t)
        step_ended(mx, 0, float(t), 100 - t, t in (1, 6), 3)
    seen_at = {t: seen(mx, 0, t + 0.5, 100)[0] for t in range(1, 10)}
    assert seen_at == {1: 1, 2: 1, 3: 1, 4: 4, 5: 4, 6: 6, 7: 6, 8: 8, 9: 8}


def burst() -> BlockedTrace:
    """Four long prompts within 30 ms, before any instance ends its first step."""
    return BlockedTrace.from_lists([0.0, 0.01, 0.02, 0.03], [12000] * 4, [2] * 4, [[]] * 4, 16)


@pytest.mark.parametrize("engine", ENGINES)
def test_requests_sent_during_a_step_are_invisible_to_the_kv_scorer(engine) -> None:
    # only the KV-utilisation scorer weighs. With the exact state each request avoids the
    # instances already holding a prompt's blocks (1 - use is lower there): four instances,
    # four requests, one each. Scraped every 50 ms, every instance still reports the empty
    # pool of before its first step (none ends within the 30 ms), so each request is a
    # four-way tie, the picker's draw: requests pile onto the same instance
    off = {k: 0.0 for k in ("queue", "gpu_prefix", "cpu_prefix", "no_hit_lru")}
    exact = simulate_raw(burst(), epp_cfg(instances=4, **off, kv_util=1.0), engine=engine)
    assert sorted(exact.instance.tolist()) == [0, 1, 2, 3]
    cfg = epp_cfg(instances=4, metrics_interval=0.05, **off, kv_util=1.0)
    stale = simulate_raw(burst(), cfg, engine=engine)
    picks = [tie_pick(i, [0, 1, 2, 3]) for i in range(4)]
    assert stale.instance.tolist() == picks
    assert len(set(picks)) < 4  # (the draws of these four requests share an instance)
    assert stale.first_token_s.max() > exact.first_token_s.max()  # and queue there


def test_both_engines_agree_with_scraped_metrics() -> None:
    # the same burst twice, the second after the first's steps have ended and been scraped,
    # with every scorer on: the engines pick alike, request by request
    t = BlockedTrace.from_lists(
        [0.0, 0.01, 0.02, 0.03, 3.0, 3.01, 3.02, 3.03],
        [12000, 300, 12000, 300] * 2,
        [40, 2] * 4,
        [[]] * 8,
        16,
    )
    pair = replay_both(t, epp_cfg(instances=3, metrics_interval=0.05))
    assert pair is not None
    ref, fast = pair
    np.testing.assert_array_equal(ref.instance, fast.instance)
    np.testing.assert_array_equal(ref.first_token_s, fast.first_token_s)
    np.testing.assert_array_equal(ref.finish_s, fast.finish_s)
