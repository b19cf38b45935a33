"""The numba engine against the reference: identical results on generated traces."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.errors import InputError, StallError
from kvtier.policy.model import SLO, policy_from_dict
from kvtier.sim import compute_metrics, simulate_raw
from kvtier.sim.config import SimConfig
from kvtier.sim.requests import request_table
from kvtier.sim.result import RawResult
from kvtier.sim.timing import prefill_attn_ns, step_time
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import replay_both
from tests.sim_strategies import blocked_traces, sim_configs

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def assert_same_rows(
    trace: BlockedTrace, a: RawResult, b: RawResult, tier_names: tuple[str, ...] = ()
) -> None:
    """The per-request tables (``--requests-out``) of two replays are equal, row by row."""
    rows_a = request_table(trace, a, tier_names).to_pylist()
    rows_b = request_table(trace, b, tier_names).to_pylist()
    assert len(rows_a) == len(rows_b) == trace.n_requests
    for i, (ra, rb) in enumerate(zip(rows_a, rows_b, strict=True)):
        assert ra == rb, f"request {i}: {ra} != {rb}"


def assert_same(
    a: RawResult, b: RawResult, trace: BlockedTrace, tier_names: tuple[str, ...] = ()
) -> None:
    """Two replays of ``trace`` agree exactly: per-request times, counters, table rows."""
    np.testing.assert_array_equal(a.first_token_s, b.first_token_s)
    np.testing.assert_array_equal(a.finish_s, b.finish_s)
    np.testing.assert_array_equal(a.hit_blocks, b.hit_blocks)
    np.testing.assert_array_equal(a.instance, b.instance)
    np.testing.assert_array_equal(a.busy_s, b.busy_s)
    assert a.n_iterations == b.n_iterations
    assert a.extrapolated_iterations == b.extrapolated_iterations
    assert a.early_stopped == b.early_stopped
    assert a.end_s == b.end_s
    np.testing.assert_array_equal(a.loaded_blocks, b.loaded_blocks)
    assert (a.decode_hit_blocks is None) == (b.decode_hit_blocks is None)
    if a.decode_hit_blocks is not None:  # disaggregated: P/D transfers and decode-side hits
        np.testing.assert_array_equal(a.decode_instance, b.decode_instance)
        np.testing.assert_array_equal(a.kv_transfer_s, b.kv_transfer_s)
        np.testing.assert_array_equal(a.decode_hit_blocks, b.decode_hit_blocks)
    assert a.loaded_blocks.shape == (trace.n_requests, len(tier_names))
    assert (a.tbt_tail_s is None) == (b.tbt_tail_s is None)
    if a.tbt_tail_s is not None:
        np.testing.assert_array_equal(a.tbt_tail_s, b.tbt_tail_s)  # NaN in the same places
        assert_tbt_defined(trace, a)
    assert_same_rows(trace, a, b, tier_names)


def assert_tbt_defined(trace: BlockedTrace, raw: RawResult) -> None:
    """A TBT tail exactly for each finished request of two tokens or more, no shorter than
    its mean interval (TPOT without the front end's share) and within its E2E."""
    tail = raw.tbt_tail_s
    assert tail is not None
    has = ~np.isnan(raw.finish_s) & (trace.output_tokens >= 2)
    np.testing.assert_array_equal(~np.isnan(tail), has)
    gaps = trace.output_tokens[has] - 1
    mean_gap = (raw.finish_s[has] - raw.first_token_s[has]) / gaps
    assert np.all(tail[has] >= mean_gap * (1 - 1e-9) - 1e-12)
    assert np.all(tail[has] <= raw.finish_s[has] - raw.first_token_s[has] + 1e-12)


@st.composite
def cases(draw: st.DrawFn, max_output: int = 12):
    trace = draw(blocked_traces(max_output=max_output))
    return trace, draw(sim_configs(trace.block_tokens))


@SETTINGS
@given(cases())
def test_engines_agree(case) -> None:
    trace, cfg = case
    pair = replay_both(trace, cfg, check_invariants=True)
    if pair is None:  # both stopped at the same stall
        return
    ref, fast = pair
    assert_same(ref, fast, trace)
    m_ref = compute_metrics(trace, ref, cost_per_hour=cfg.cost_per_hour)
    m_fast = compute_metrics(trace, fast, cost_per_hour=cfg.cost_per_hour)
    assert m_ref.same_as(m_fast)
    # every request is either rejected (larger than a pool) or served to the end
    served = ~np.isnan(ref.finish_s)
    assert np.array_equal(served, ref.instance >= 0)
    assert np.all(ref.first_token_s[served] >= trace.arrival_s[served])
    assert np.all(ref.finish_s[served] >= ref.first_token_s[served])


@SETTINGS
@given(
    cases(),
    st.sampled_from([None, 0.001, 0.01, 0.1]),
    st.sampled_from([None, 0.005, 0.05]),
    st.sampled_from([None, 0.001, 0.01]),
    st.sampled_from([None, None, 0.002, 0.02]),
)
def test_engines_agree_with_early_stop(case, p99, mean, tpot, tbt) -> None:
    trace, cfg = case
    slo = SLO(ttft_mean_s=mean, ttft_p99_s=p99, ttft_p999_s=p99, tpot_p99_s=tpot, tbt_p99_s=tbt)
    pair = replay_both(trace, cfg, slo=slo, stop_early=True)
    if pair is None:  # both stopped at the same stall
        return
    ref, fast = pair
    assert_same(ref, fast, trace)
    assert (ref.tbt_tail_s is not None) == (cfg.track_tbt or tbt is not None)
    try:
        full = simulate_raw(trace, cfg, engine="numba", slo=slo)  # (tracks TBT when slo has it)
    except StallError:  # the complete replay stalls after the early stop
        assert ref.early_stopped
        return
    m_full = compute_metrics(trace, full, cost_per_hour=1.0, slo=slo)
    if ref.early_stopped:
        # an early stop is only taken when the complete run misses the SLO too
        assert m_full.slo_met is False
    else:
        assert_same(ref, full, trace)


@SETTINGS
@given(cases())
def test_engines_agree_on_the_shortest_free_ring(case) -> None:
    """With a free ring one entry longer than needed, pinning free cached slots fills it
    often, so the kernel's compaction runs (it never does at the default length on these
    small traces); results must not change."""
    import kvtier.sim.engine as engine

    trace, cfg = case

    def fast():  # noqa: ANN202
        default = engine.free_ring_length
        try:
            engine.free_ring_length = lambda capacity: max(capacity, engine.AHEAD) + 1
            return simulate_raw(trace, cfg, engine="numba")
        finally:
            engine.free_ring_length = default

    pair = replay_both(trace, cfg, fast=fast)
    if pair is not None:  # (None: both stopped at the same stall)
        assert_same(*pair, trace)


# The numba engine runs a decode-only batch's steps ahead of its event loop until the next
# arrival or the first finish (optimizer/sim/nb.py). The cases below aim at that path: long
# decodes between sparse arrivals, an arrival exactly at the end of a step, and an early stop
# while another instance is running ahead.


@SETTINGS
@given(cases(max_output=300))
def test_engines_agree_on_long_decodes(case) -> None:
    trace, cfg = case
    pair = replay_both(trace, cfg)
    if pair is not None:  # (None: both stopped at the same stall)
        assert_same(*pair, trace)


def _config(n_instances: int) -> SimConfig:
    return SimConfig(
        n_instances=n_instances,
        capacity_blocks=200,
        block_tokens=4,
        token_budget=8,
        max_seqs=4,
        router=0,  # round robin
        affinity_overload=0,
        flops_per_token=3.0,
        attn_coef=0.01,
        compute_rate=1000.0,
        weight_bytes=5.0,
        kv_bytes_per_token=0.3,
        mem_rate=1000.0,
        step_overhead_s=1e-3,
        cost_per_hour=10.0,
    )


def _step_ends(cfg: SimConfig, prompt: int, steps: int) -> list[float]:
    """End times of a lone request's iterations: its one-chunk prefill, then decode steps."""
    p = cfg.timing_params()
    t = float(step_time(prompt, prompt * prompt, prompt, 0, 0, prefill_attn_ns(prompt, 0, p), p))
    ends = [t]
    for kv in range(prompt, prompt + steps):
        t += float(step_time(1, 2 * kv + 1, kv + 1, 1, kv + 1, 0, p))
        ends.append(t)
    return ends


def test_arrival_at_the_end_of_a_decode_step_is_admitted_at_the_next_step() -> None:
    """A request arriving exactly when a step ends joins the next iteration: both engines."""
    cfg = _config(1)
    ends = _step_ends(cfg, 8, 20)
    t_arrive = ends[6]  # end of the sixth decode step of request 0
    trace = BlockedTrace.from_lists([0.0, t_arrive], [8, 8], [50, 5], [[0, 1], [2, 3]], 4)
    ref = simulate_raw(trace, cfg, engine="reference")
    fast = simulate_raw(trace, cfg, engine="numba")
    assert_same(ref, fast, trace)
    # request 0 ran alone until then, exactly as computed above
    assert ref.first_token_s[0] == ends[0]
    assert ref.first_token_s[1] > t_arrive


def test_early_stop_while_another_instance_runs_ahead() -> None:
    """Instance 0 decodes a long output alone while instance 1 prefills a long prompt in
    chunks; the prompt's late first token breaks the mean-TTFT bound and stops the replay
    in the middle of instance 0's decode. Busy time and iteration count must be those of the
    steps begun by then, as step by step."""
    cfg = _config(2)
    trace = BlockedTrace.from_lists([0.0, 0.0], [8, 200], [400, 2], [[0, 1], list(range(2, 52))], 4)
    full = simulate_raw(trace, cfg, engine="reference")
    ttft = full.first_token_s - trace.arrival_s
    assert ttft[1] > 10 * ttft[0]
    bound = (ttft[0] + ttft[1]) / 4  # met by request 0 alone, broken once request 1 is in
    slo = SLO(ttft_mean_s=float(bound))
    ref = simulate_raw(trace, cfg, engine="reference", slo=slo, stop_early=True)
    fast = simulate_raw(trace, cfg, engine="numba", slo=slo, stop_early=True)
    assert ref.early_stopped
    assert ref.end_s < full.finish_s[0]  # request 0 was still decoding
    assert_same(ref, fast, trace)


def test_prefill_first_runs_a_new_prompt_without_the_decodes() -> None:
    """SGLang's batching (``prefill_first``): while request 1's 40-token prompt is prefilled
    in chunks of the 8-token budget, request 0's decode takes no token (its tokens stop for
    five steps), and request 1's prefill steps carry no decode; mixed batching (vLLM V1)
    gives request 0 a token in every step and request 1 seven of the budget's eight. Both
    engines agree in both modes."""
    mixed = _config(1)
    split = replace(mixed, prefill_first=True)
    ends = _step_ends(mixed, 8, 30)
    blocks = [[0, 1], list(range(2, 12))]
    trace = BlockedTrace.from_lists([0.0, ends[3]], [8, 40], [30, 2], blocks, 4)
    out = {}
    for name, cfg in (("mixed", mixed), ("split", split)):
        ref = simulate_raw(trace, cfg, engine="reference")
        assert_same(ref, simulate_raw(trace, cfg, engine="numba"), trace)
        out[name] = ref
    # request 0 decodes alone, identically, until request 1 arrives
    assert out["mixed"].first_token_s[0] == out["split"].first_token_s[0] == ends[0]
    # its prompt runs in five steps of 8 tokens alone (split), in six beside a decode (mixed)
    assert out["split"].first_token_s[1] < out["mixed"].first_token_s[1]
    # and request 0, paused for those steps, finishes later than when it decoded in them
    assert out["split"].finish_s[0] > out["mixed"].finish_s[0]
    with pytest.raises(InputError, match="serving.batching"):
        policy_from_dict(
            {"serving": {"batching": "prefill_first", "scheduler": "vllm_v0"}}, "x.toml"
        )
