"""vLLM V1 scheduling (``scheduler = "vllm_v1"``): blocks as requests grow, preemption of the
most recently admitted request, the admission watermark; closed forms on both engines."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.sim import simulate_raw
from kvtier.sim.config import SimConfig
from kvtier.sim.requests import request_table
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import replay_both
from tests.sim_strategies import blocked_traces, sim_configs, tiered_configs
from tests.test_sim_tiers_differential import assert_same_tiers

ENGINES = ["reference", "numba"]


def token_clock(capacity: int, B: int, **kw) -> SimConfig:
    """One instance whose iteration takes one second per token it computes (no attention, no
    memory term, no overhead): its busy time counts the tokens computed."""
    base = dict(
        n_instances=1,
        capacity_blocks=capacity,
        block_tokens=B,
        token_budget=1000,
        max_seqs=8,
        router=0,
        affinity_overload=0,
        flops_per_token=1.0,
        attn_coef=0.0,
        compute_rate=1.0,
        weight_bytes=0.0,
        kv_bytes_per_token=0.0,
        mem_rate=1.0,
        step_overhead_s=0.0,
        cost_per_hour=1.0,
        scheduler=1,
        prefix_caching=False,
    )
    base.update(kw)
    return SimConfig(**base)


def run(trace: BlockedTrace, cfg: SimConfig, engine: str):
    extra = {"check_invariants": True} if engine == "reference" else {}
    return simulate_raw(trace, cfg, engine=engine, **extra)


@pytest.mark.parametrize("engine", ENGINES)
def test_preemption_recomputes_exactly_the_preempted_tokens(engine) -> None:
    # B = 2, 6 blocks. Both prompts (4 tokens, 2 blocks each) run at once; decodes grow them to
    # 3 blocks each; at the third decode request 0 needs its 4th block and none is free:
    # request 1 (the most recently admitted, 6 tokens of KV) is preempted. Request 0 ends at
    # 14 s; request 1 then recomputes prompt and 3 generated tokens (7 s) and decodes once.
    t = BlockedTrace.from_lists([0.0, 0.0], [4, 4], [5, 5], [[], []], 2)
    raw = run(t, token_clock(6, 2), engine)
    assert raw.preemptions.tolist() == [0, 1]
    assert raw.preempted_tokens.tolist() == [0, 6]
    assert raw.first_token_s.tolist() == [8.0, 8.0]
    assert raw.finish_s.tolist() == [14.0, 22.0]
    # every token computed once, plus the preempted ones again
    computed = int((t.input_tokens + np.maximum(t.output_tokens - 1, 0)).sum())
    assert raw.busy_s.sum() == computed + raw.preempted_tokens.sum() == 22.0
    rows = request_table(t, raw).to_pydict()
    assert rows["preemptions"] == [0, 1] and rows["preempted_tokens"] == [0, 6]
    # reserving the footprint (4 blocks each) instead: request 1 waits, nobody is preempted
    res = run(t, token_clock(6, 2, scheduler=0), engine)
    assert res.preemptions.tolist() == [0, 0]
    assert res.finish_s.tolist() == [4.0 + 4, 8.0 + 4 + 4]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_preempted_request_finds_its_own_blocks_again(engine) -> None:
    # as above with prefix caching: request 1's two full prompt blocks are still cached when
    # it returns, so it recomputes 3 of its 7 tokens
    t = BlockedTrace.from_lists([0.0, 0.0], [4, 4], [5, 5], [[0, 1], [2, 3]], 2, n_blocks=4)
    raw = run(t, token_clock(6, 2, prefix_caching=True), engine)
    assert raw.preempted_tokens.tolist() == [0, 6]
    assert raw.busy_s.sum() == 22.0 - 4
    assert raw.finish_s.tolist() == [14.0, 18.0]


@pytest.mark.parametrize("engine", ENGINES)
def test_watermark_holds_back_an_admission_while_others_run(engine) -> None:
    # B = 1, 100 blocks: request 0 (50 tokens, 3 out) runs first; request 1 (45 tokens) fits
    # the 50 free blocks but would leave 5 (then 4), under a watermark of 10: it waits until
    # request 0 is gone (nothing else scheduled, so no watermark)
    t = BlockedTrace.from_lists([0.0, 0.0], [50, 45], [3, 1], [[], []], 1)
    free = run(t, token_clock(100, 1, watermark_blocks=0), engine)
    held = run(t, token_clock(100, 1, watermark_blocks=10), engine)
    assert free.first_token_s.tolist() == [95.0, 95.0]
    assert held.first_token_s.tolist() == [50.0, 97.0]
    assert held.preemptions.tolist() == [0, 0]


@st.composite
def v1_cases(draw: st.DrawFn):
    """Long decodes on small pools: decode steps run ahead across block boundaries, and
    preemptions, with and without lower tiers."""
    trace = draw(blocked_traces(max_output=80))
    tiered = draw(st.booleans())
    cfg = draw(tiered_configs(trace.block_tokens) if tiered else sim_configs(trace.block_tokens))
    return trace, replace(cfg, scheduler=1, watermark_blocks=draw(st.sampled_from([0, 1])))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(v1_cases())
def test_engines_agree_under_vllm_v1(case) -> None:
    assert_engines_agree(*case)


def assert_engines_agree(trace, cfg) -> None:
    """Both engines give the same replay, preemptions and preempted tokens included."""
    pair = replay_both(trace, cfg, check_invariants=True)
    if pair is None:  # both stopped at the same stall
        return
    ref, fast = pair
    assert_same_tiers(ref, fast, trace, cfg)
    np.testing.assert_array_equal(ref.preemptions, fast.preemptions)
    np.testing.assert_array_equal(ref.preempted_tokens, fast.preempted_tokens)


def _decode_side_preemption_case() -> tuple[BlockedTrace, SimConfig]:
    """A P/D replay (1 prefill + 2 decode instances of 5 two-token blocks) in which decode
    instance 1 preempts request 2 while request 5's KV, still arriving, holds the blocks it
    lacks, and is then idle with request 2 waiting, while instance 2 decodes (steps the
    kernel runs ahead). When an idle instance retried at every instance's event, the
    reference preempted request 2 three times and the kernel twice."""
    from kvtier.sim.pd import PdConfig

    trace = BlockedTrace(
        arrival_s=np.zeros(7),
        input_tokens=np.ones(7, dtype=np.int64),
        output_tokens=np.array([0, 0, 9, 10, 0, 2, 0], dtype=np.int64),
        block_offsets=np.zeros(8, dtype=np.int64),
        block_ids=np.array([], dtype=np.int32),
        n_blocks=0,
        block_tokens=2,
    )
    none = -np.ones((3, 3), dtype=np.int64)
    pd = PdConfig(
        connector="drawn",
        path=np.array([none, none, [[0, 0, -1], [0, 0, 0], [0, 0, 0]]], dtype=np.int64),
        queue=np.zeros((3, 3, 3), dtype=np.int64),
        scale=np.array(
            [np.ones((3, 3)), np.ones((3, 3)), [[0.5, 0.5, 1.0], [0.5, 0.5, 0.5], [0.5] * 3]]
        ),
        lat_s=np.zeros((3, 3)),
        link_bw_read=np.full(3, 0.5),
        link_bw_write=np.full(3, 0.5),
        link_duplex=np.zeros(3, dtype=np.int64),
        link_names=("pd[0]", "pd[1]", "pd[2]"),
        block_bytes=1.0,
        unit=0,
        fragments=1,
        coalesce=1,
        rpc_s=0.0,
        stream_bw=np.inf,
        stage_bw=5.0,
        serial=0,
        depth=1,
        workers=1,
        layerwise=False,
        layers=1,
        decode_hit=False,
    )
    cfg = SimConfig(
        n_instances=3,
        capacity_blocks=5,
        block_tokens=2,
        token_budget=3,
        max_seqs=3,
        router=0,
        affinity_overload=0,
        flops_per_token=1.0,
        attn_coef=0.0,
        compute_rate=1000.0,
        weight_bytes=1.0,
        kv_bytes_per_token=0.01,
        mem_rate=100.0,
        step_overhead_s=0.0,
        cost_per_hour=10.0,
        kv_overlap_weight=0.0,
        scheduler=1,
        n_prefill=1,
        pd=pd,
        track_tbt=True,
    )
    return trace, cfg


def test_engines_agree_on_decode_side_preemption() -> None:
    assert_engines_agree(*_decode_side_preemption_case())


@pytest.mark.parametrize("engine", ENGINES)
def test_an_instance_that_preempted_admits_again_at_once(engine) -> None:
    # the case above: after each preemption instance 1 runs nothing and admits request 2
    # again at the same instant (vLLM's engine loop schedules again at once), recomputes it
    # and, short of a block again, preempts it, until request 5's KV has arrived; instance
    # 2's steps play no part
    raw = run(*_decode_side_preemption_case(), engine)
    assert raw.preemptions.tolist() == [0, 0, 7, 0, 0, 0, 0]
