"""vLLM V1's admission gate (``reserve_full_prompt``, vLLM's ``scheduler_reserve_full_isl``):
a waiting request is admitted only when the blocks of its whole sequence, less its hits, are
free, not only its first chunk's (docs/model.md, "Memory accounting: vLLM V1")."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import REQUEST_FIELDS, assert_fields_equal, replay_both
from tests.test_sim_preemption import ENGINES, run, token_clock

# B = 2, six blocks, eight tokens a step, one second a token: A (6 tokens, 3 blocks) and B
# (8 tokens, 4 blocks) arrive together, three tokens out each
TRACE = BlockedTrace.from_lists([0.0, 0.0], [6, 8], [3, 3], [[], []], 2)


@pytest.mark.parametrize("engine", ENGINES)
def test_the_gate_keeps_a_prompt_out_until_all_of_it_fits(engine: str) -> None:
    # gated: B's four blocks never fit beside A's three (then four); it starts when A ends at
    # 8 s (6 s of prefill, two decodes) and prefills 8 s, decodes twice
    gated = run(TRACE, token_clock(6, 2, token_budget=8, reserve_full_prompt=True), engine)
    assert gated.preemptions.tolist() == [0, 0]
    assert gated.first_token_s.tolist() == [6.0, 16.0]
    assert gated.finish_s.tolist() == [8.0, 18.0]
    # first chunk only: B's first two tokens (one block) join A's prefill step (8 s), its next
    # chunk finds one block where it needs three and B, the last admitted, is preempted; it
    # starts again when A ends at 10 s
    chunked = run(TRACE, token_clock(6, 2, token_budget=8, reserve_full_prompt=False), engine)
    assert chunked.preemptions.tolist() == [0, 1]
    assert chunked.first_token_s.tolist() == [8.0, 18.0]
    assert chunked.finish_s.tolist() == [10.0, 20.0]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_gate_counts_the_prefix_hits(engine: str) -> None:
    # eight blocks; D (7 tokens: blocks 0-2 and a partial one) runs; at 8 s it holds four, so
    # four are free. C (9 tokens: D's blocks 0-2 and one more) needs five blocks in all, but
    # three are D's cached ones, so two fresh blocks are all the gate asks: it joins D's next
    # step (one decode token and C's three uncached tokens) instead of waiting for D to end
    trace = BlockedTrace.from_lists([0.0, 7.5], [7, 9], [3, 1], [[0, 1, 2], [0, 1, 2, 7]], 2)
    cfg = token_clock(8, 2, token_budget=16, reserve_full_prompt=True, prefix_caching=True)
    raw = run(trace, cfg, engine)
    assert raw.hit_blocks.tolist() == [0, 3]
    assert raw.preemptions.tolist() == [0, 0]
    assert raw.first_token_s.tolist() == [7.0, 12.0]
    assert raw.finish_s.tolist() == [12.0, 12.0]


def test_policy_defaults_follow_the_schedulers() -> None:
    hw = load_hardware("h100-node")
    model = load_model("Qwen3-8B")
    v1 = build_config(hw, model, Policy(serving=ServingPolicy(tp=1)))
    assert v1.reserve_full_prompt and v1.watermark_blocks == 0
    v0 = build_config(hw, model, Policy(serving=ServingPolicy(tp=1, scheduler="vllm_v0")))
    assert v0.watermark_blocks == int(0.01 * v0.capacity_blocks)
    stated = build_config(hw, model, Policy(serving=ServingPolicy(tp=1, watermark=0.02)))
    assert stated.watermark_blocks == int(0.02 * stated.capacity_blocks)


def test_engines_agree() -> None:
    for gate in (True, False):
        cfg = token_clock(6, 2, token_budget=8, reserve_full_prompt=gate)
        pair = replay_both(TRACE, cfg, check_invariants=True)
        assert pair is not None
        assert_fields_equal(*pair, REQUEST_FIELDS)
    assert replace(cfg, reserve_full_prompt=True) != cfg
    assert simulate_raw(TRACE, cfg, engine="numba").preemptions.tolist() == [0, 1]
