"""Reference and numba engine with lower tiers on: identical results on generated traces."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.cache.state import empty_block_row
from kvtier.errors import StallError
from kvtier.policy.model import SLO
from kvtier.sim import compute_metrics, simulate_raw
from kvtier.sim.engine import SCRATCH, kernel_inputs, maps_every_block
from kvtier.sim.nb import simulate_nb
from kvtier.sim.nb_state import DIRTY_SPAN
from kvtier.sim.nb_tiers import reset_dirty_rows_nb
from kvtier.sim.requests import request_table
from tests.helpers import replay_both
from tests.sim_strategies import blocked_traces, tiered_configs
from tests.test_sim_differential import assert_same

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def cases(draw: st.DrawFn):
    trace = draw(blocked_traces())
    return trace, draw(tiered_configs(trace.block_tokens))


def assert_same_tiers(a, b, trace, cfg) -> None:
    assert_same(a, b, trace, cfg.tiers.names if cfg.tiers is not None else ())
    np.testing.assert_array_equal(a.tier_hit_blocks, b.tier_hit_blocks)
    np.testing.assert_array_equal(a.tier_prefetched_blocks, b.tier_prefetched_blocks)
    np.testing.assert_array_equal(a.tier_bytes_read, b.tier_bytes_read)
    np.testing.assert_array_equal(a.tier_bytes_written, b.tier_bytes_written)
    np.testing.assert_array_equal(a.link_busy_s, b.link_busy_s)
    np.testing.assert_array_equal(a.link_bytes, b.link_bytes)
    np.testing.assert_array_equal(a.load_s, b.load_s)
    np.testing.assert_array_equal(a.worker_busy_s, b.worker_busy_s)
    np.testing.assert_array_equal(a.stage_s, b.stage_s)
    np.testing.assert_array_equal(a.arrival_s, b.arrival_s)


def tiered_engines_agree(trace, cfg):  # noqa: ANN001, ANN201
    """Both engines' replays of ``trace`` under ``cfg``, asserted identical per request and on
    every tier counter; None when both stopped at the same stall."""
    pair = replay_both(trace, cfg, check_invariants=True)
    if pair is not None:
        assert_same_tiers(*pair, trace, cfg)
    return pair


@SETTINGS
@given(cases())
def test_engines_agree_with_tiers(case) -> None:
    trace, cfg = case
    pair = tiered_engines_agree(trace, cfg)
    if pair is None:  # both stopped at the same stall
        return
    ref, fast = pair
    m_ref = compute_metrics(trace, ref, cost_per_hour=cfg.cost_per_hour, tiers=cfg.tiers)
    m_fast = compute_metrics(trace, fast, cost_per_hour=cfg.cost_per_hour, tiers=cfg.tiers)
    assert m_ref.same_as(m_fast)
    served = ~np.isnan(ref.finish_s)
    assert np.array_equal(served, ref.instance >= 0)
    assert np.all(ref.first_token_s[served] >= ref.arrival_s[served] + ref.load_s[served])
    assert np.all(ref.arrival_s >= trace.arrival_s)  # a closed loop only delays a send
    # per request: the blocks loaded from each tier sum to the tiers' hit counts (a storage
    # prefetch's reads are not hits: its blocks count where a request then loads them from),
    # and the prompt is found in HBM, loaded from the tiers or recomputed
    names = cfg.tiers.names if cfg.tiers is not None else ()
    # (a preempted request's loads on its return count in the tiers, not in its row)
    loaded_total = ref.loaded_blocks.sum(axis=0)
    if not ref.preemptions.any():
        np.testing.assert_array_equal(loaded_total, ref.tier_hit_blocks)
    assert np.all(loaded_total <= ref.tier_hit_blocks)
    rows = request_table(trace, ref, names).to_pydict()
    covered = np.array(rows["hbm_tokens"]) + sum(np.array(rows[f"{x}_tokens"]) for x in names)
    recomputed = np.array([0 if x is None else x for x in rows["recomputed_tokens"]])
    assert np.array_equal((covered + recomputed)[served], trace.input_tokens[served])
    assert np.all(recomputed[served] >= 1)


@SETTINGS
@given(cases())
def test_every_byte_below_crosses_its_tier_port(case) -> None:
    """Bytes read from and written to a tier equal the bytes its port links carried (with the
    pools aggregated: a P/D transfer may cross the same ports)."""
    trace, cfg = case
    cfg = replace(cfg, n_prefill=0, pd=None)
    try:
        raw = simulate_raw(trace, cfg, engine="numba")
    except StallError:  # (a replay that does not progress: no byte counts to compare)
        return
    tiers = cfg.tiers
    if tiers is None:
        return
    for t in range(tiers.n_tiers):
        carried = raw.link_bytes[np.unique(tiers.gpu_path[t, :, 2])].sum()
        expected = raw.tier_bytes_read[t] + raw.tier_bytes_written[t]
        assert np.isclose(carried, expected, rtol=1e-12, atol=0)


@SETTINGS
@given(cases(), st.sampled_from([0.001, 0.01]))
def test_engines_agree_with_tiers_and_early_stop(case, p99) -> None:
    trace, cfg = case
    slo = SLO(ttft_p99_s=p99)
    pair = replay_both(trace, cfg, slo=slo, stop_early=True)
    if pair is not None:  # (None: both stopped at the same stall)
        assert_same_tiers(*pair, trace, cfg)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), cases(), st.sampled_from([None, 0.001]))
def test_kept_scratch_arrays_give_fresh_results(first, second, p99) -> None:
    """A replay on arrays kept from earlier replays (same shape, other traces and configs, early
    stops) gives what a replay on freshly allocated arrays gives, and leaves the kept
    prefix-cache map all zero."""
    trace, cfg = first
    slo = SLO(ttft_p99_s=p99) if p99 is not None else None

    def replay(case):  # noqa: ANN001, ANN202 - a result, or the stall's message
        try:
            return simulate_raw(*case, engine="numba", slo=slo, stop_early=True)
        except StallError as err:  # (a replay that does not progress; it still returns arrays)
            return str(err)

    SCRATCH.clear()
    fresh = replay(first)
    replay(second)  # (a stall here leaves kept arrays too)
    replay(first)
    again = replay(first)
    if isinstance(fresh, str):
        assert again == fresh
    else:
        assert_same_tiers(fresh, again, trace, cfg)
    n_shared = max(trace.n_blocks if maps_every_block(cfg.scheduler) else trace.shared_blocks[1], 1)
    # (sliding-window copies, vLLM's hybrid manager: a second map of the same size)
    if cfg.prefix_caching and cfg.swa_window > 0 and cfg.swa_blocks > 0:
        n_shared *= 2
    kept = SCRATCH.take("slot_of", (cfg.n_instances * n_shared,), np.int32)
    assert kept is not None and not kept.any()


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_concurrent_replays_do_not_share_kept_arrays(case) -> None:
    """Replays in threads (as ``optimize --jobs`` runs them) each get their own arrays."""
    trace, cfg = case

    def replay():  # noqa: ANN202
        try:
            return simulate_raw(trace, cfg, engine="numba")
        except StallError as err:  # (a replay that does not progress: the same error)
            return str(err)

    expected = replay()
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda _: replay(), range(8)))
    for got in results:
        if isinstance(expected, str):
            assert got == expected
        else:
            assert_same_tiers(expected, got, trace, cfg)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_every_row_a_replay_changed_lies_in_a_flagged_span(case) -> None:
    """The dirty flags cover every pool row a replay wrote (faults included), so resetting
    only the flagged spans empties the pools for the next replay on the kept arrays."""
    trace, cfg = case
    if cfg.tiers is None:
        return
    inputs = kernel_inputs(trace, cfg)
    simulate_nb(*inputs[:7])
    blk, dirty = inputs.ts.blk, inputs.ts.dirty
    n = blk.shape[1]
    flagged = np.repeat(dirty.astype(bool), DIRTY_SPAN, axis=1)[:, :n]
    unchanged = (blk == empty_block_row()).all(axis=2)
    assert unchanged[~flagged].all()
    reset_dirty_rows_nb(blk, dirty, empty_block_row())
    assert (blk == empty_block_row()).all() and not dirty.any()
