"""vLLM v0 scheduling (``scheduler = "vllm_v0"``, vllm/core/scheduler.py ``_schedule_default``):
prompts run whole in iterations of their own, decodes only in iterations without a prompt, a
free block per decoding request; closed forms on both engines, and the engines agree."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.hardware import load_hardware
from kvtier.policy.registries import SCHEDULERS, VLLM_V0, VLLM_V1
from kvtier.sim.steptime.frontend import frontend_token_s
from kvtier.trace.blocked import BlockedTrace
from tests.sim_strategies import blocked_traces, sim_configs, tiered_configs
from tests.test_sim_preemption import ENGINES, assert_engines_agree, run, token_clock


def test_vllm_v0_is_a_registered_scheduler() -> None:
    assert SCHEDULERS.codes["vllm_v0"] == VLLM_V0 != VLLM_V1


@pytest.mark.parametrize("engine", ENGINES)
def test_a_decode_waits_for_a_whole_prefill_iteration(engine) -> None:
    # one second per computed token. Request 0 (4 in, 5 out) prefills 0-4 s and decodes
    # 4-5, 5-6; request 1 (6 in, 2 out) arrives at 5.5 s. vLLM v0 runs its prompt alone,
    # 6-12 s: request 0's next token waits the whole prefill. Then both decode (12-14 s, request
    # 1 done) and request 0 its last token (14-15 s).
    t = BlockedTrace.from_lists([0.0, 5.5], [4, 6], [5, 2], [[], []], 1)
    v0 = run(t, token_clock(100, 1, scheduler=VLLM_V0), engine)
    assert v0.first_token_s.tolist() == [4.0, 12.0]
    assert v0.finish_s.tolist() == [15.0, 14.0]
    assert v0.n_iterations == 6
    # vLLM V1 mixes the prompt into request 0's decode step (7 tokens, 6-13 s)
    v1 = run(t, token_clock(100, 1, scheduler=VLLM_V1), engine)
    assert v1.first_token_s.tolist() == [4.0, 13.0]
    assert v1.finish_s.tolist() == [15.0, 15.0]


@pytest.mark.parametrize("engine", ENGINES)
def test_prompts_are_never_chunked_and_the_budget_caps_an_iteration(engine) -> None:
    # budget 6: request 0's prompt (4) runs alone, request 1's (4) does not fit the 2 left and
    # runs whole in the next iteration (4-8 s) while request 0's decode waits; both decode
    # at 8-10 s. Request 2's prompt (7) is over the budget: rejected (vLLM v0 ignores it).
    t = BlockedTrace.from_lists([0.0, 0.0, 0.0], [4, 4, 7], [2, 2, 2], [[], [], []], 1)
    raw = run(t, token_clock(100, 1, scheduler=VLLM_V0, token_budget=6), engine)
    assert raw.first_token_s[:2].tolist() == [4.0, 8.0]
    assert raw.finish_s[:2].tolist() == [10.0, 10.0]
    assert np.isnan(raw.first_token_s[2]) and np.isnan(raw.finish_s[2])
    # vLLM V1 chunks request 1 (2 + 2 tokens) and runs request 2 too
    v1 = run(t, token_clock(100, 1, scheduler=VLLM_V1, token_budget=6), engine)
    assert not np.isnan(v1.finish_s).any()


@pytest.mark.parametrize("engine", ENGINES)
def test_every_decoding_request_needs_a_free_block(engine) -> None:
    # B = 2, 4 blocks: both prompts (3 tokens, 2 blocks each) run at once (0-6 s) and take
    # every block. Their next token fits their second block, but vLLM v0's can_append_slots
    # asks a free block per request: request 1 is preempted (3 tokens), request 0 decodes
    # (6-7 s, done), then request 1 recomputes its prompt and first token (4 tokens, 7-11 s)
    t = BlockedTrace.from_lists([0.0, 0.0], [3, 3], [2, 2], [[], []], 2)
    v0 = run(t, token_clock(4, 2, scheduler=VLLM_V0), engine)
    assert v0.first_token_s.tolist() == [6.0, 6.0]
    assert v0.finish_s.tolist() == [7.0, 11.0]
    assert v0.preemptions.tolist() == [0, 1]
    assert v0.preempted_tokens.tolist() == [0, 3]
    # vLLM V1 allocates only the blocks a step needs: nobody is preempted
    v1 = run(t, token_clock(4, 2, scheduler=VLLM_V1), engine)
    assert v1.preemptions.tolist() == [0, 0]
    assert v1.finish_s.tolist() == [8.0, 8.0]


@st.composite
def v0_cases(draw: st.DrawFn):
    """Long decodes on small pools and bursts of prompts: prompt iterations between decode
    runs, decode steps run ahead across block boundaries, preemptions; with and without lower
    tiers, aggregated or disaggregated."""
    trace = draw(blocked_traces(max_output=80))
    tiered = draw(st.booleans())
    cfg = draw(tiered_configs(trace.block_tokens) if tiered else sim_configs(trace.block_tokens))
    budget = draw(st.sampled_from([cfg.token_budget, 64, 4096]))
    return trace, replace(
        cfg,
        scheduler=VLLM_V0,
        token_budget=budget,
        watermark_blocks=draw(st.sampled_from([0, 1])),
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(v0_cases())
def test_engines_agree_under_vllm_v0(case) -> None:
    assert_engines_agree(*case)


def test_a_handed_over_first_step_is_not_run_ahead_under_vllm_v0() -> None:
    """Disaggregated vllm_v0: a handed-over request's first decode step on its decode instance
    ends at an event (its first token counts in the mean-TTFT early stop there), so the
    kernel does not run its decode steps ahead; both engines stop at the same instant."""
    from kvtier.policy.model import SLO
    from kvtier.sim import simulate_raw
    from kvtier.sim.config import SimConfig
    from kvtier.sim.pd import PdConfig

    K = 3
    path = np.full((K, K, 2), -1, dtype=np.int64)
    path[2, 1:] = 0
    scale = np.ones((K, K, 2))
    scale[2, 1:] = 0.5
    pd = PdConfig(
        connector="drawn", path=path, queue=np.zeros((K, K, 2), dtype=np.int64), scale=scale,
        lat_s=np.zeros((K, K)), link_bw_read=np.array([0.5]), link_bw_write=np.array([0.5]),
        link_duplex=np.array([0]), link_names=("pd[0]",), block_bytes=0.0, unit=0,
        fragments=1, coalesce=1, rpc_s=1e-4, stream_bw=np.inf, stage_bw=np.inf, serial=0,
        depth=1, workers=1, layerwise=False, layers=1,
    )  # fmt: skip
    cfg = SimConfig(
        n_instances=K, capacity_blocks=7, block_tokens=1, token_budget=8, max_seqs=1,
        router=0, affinity_overload=0, flops_per_token=1.0, attn_coef=0.0, compute_rate=1000.0,
        weight_bytes=1.0, kv_bytes_per_token=0.01, mem_rate=100.0, step_overhead_s=0.0,
        cost_per_hour=1.0, scheduler=VLLM_V0, n_prefill=1, pd=pd,
    )  # fmt: skip
    trace = BlockedTrace.from_lists(
        [0.0] * 8, [1, 1, 1, 4, 1, 1, 1, 1], [0, 0, 4, 0, 0, 0, 0, 0],
        [[], [], [], [0, 0, 0, 0], [], [], [], []], 1, n_blocks=1,
    )  # fmt: skip
    slo = SLO(ttft_mean_s=0.005)
    ref, fast = (simulate_raw(trace, cfg, engine=e, slo=slo, stop_early=True) for e in ENGINES)
    assert ref.early_stopped and fast.early_stopped
    np.testing.assert_array_equal(ref.first_token_s, fast.first_token_s)
    np.testing.assert_array_equal(ref.busy_s, fast.busy_s)
    assert not np.isnan(ref.first_token_s[2])  # the handed-over request's, at the stop


@pytest.mark.parametrize("tier", ["cxl", "rdma"])
def test_a_lower_tier_load_is_part_of_the_step_that_admits_it(tier: str) -> None:
    """vllm_v0 with a lower tier: a v0 connector loads inside ``execute_model``, unseen by the
    scheduler, so the engine is inside the step that admitted the prompt until its load ends.
    A request decoding on that instance makes no progress during the load (it finishes at
    least the load time later than without the loading prompt), and a prompt arriving during
    the load is admitted only after the loaded prompt's step (its first token comes later).

    Round robin over two instances: the long prompt is computed on instance 0 and written to
    the tier; a long decode (request 3) runs on instance 1, where the same prompt (request 5)
    loads from the tier and a one-block prompt (request 7) arrives during that load."""
    from tests.test_sim_tiers_behaviour import PROMPT, replay, tiered, two_hosts

    B = 16
    prompt = list(range(PROMPT // B))
    other = lambda j: [PROMPT // B + j]  # noqa: E731 - a one-block prompt of its own
    arrivals = [0.0, 0.0, 500.0, 1000.0, 1000.5, 1001.0, 1001.04, 1001.04]
    inputs = [PROMPT + 1, B, B, B, B, PROMPT + 1, B, B]
    outputs = [1, 1, 1, 400, 1, 1, 1, 1]
    blocks = [prompt, other(0), other(1), other(2), other(3), prompt, other(4), other(5)]
    hw = two_hosts(load_hardware("beluga-testbed"), gpus_per_host=2)
    policy = tiered(tier, B)
    serving = replace(policy.serving, scheduler="vllm_v0", max_num_batched_tokens=2 * PROMPT)
    policy = replace(policy, serving=serving)
    raw, _ = replay(hw, policy, BlockedTrace.from_lists(arrivals, inputs, outputs, blocks, B))
    assert raw.instance.tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    assert raw.tier_hit_blocks.sum() == PROMPT // B  # request 5's prompt loads from below
    load = float(raw.load_s[5])
    assert load > 0.05
    # admitted after the loaded step: the engine's first tokens (the client sees each its
    # prompt's front-end cost later, which a long prompt pays more of)
    engine_first = raw.first_token_s - frontend_token_s(policy.serving.framework) * np.array(inputs)
    assert engine_first[7] > engine_first[5]
    alone = [j for j in range(8) if j not in (5, 7)]  # the decode without the loading prompt
    pick = lambda xs: [xs[j] for j in alone]  # noqa: E731
    base, _ = replay(
        hw,
        policy,
        BlockedTrace.from_lists(pick(arrivals), pick(inputs), pick(outputs), pick(blocks), B),
    )
    assert raw.finish_s[3] - base.finish_s[3] >= load
