"""The front-end cost per prompt token (tokenization, and vLLM's detokenizer priming on the
prompt): the client sees a request's first token and its finish that much later per prompt
token, the engine does not wait for it, a closed-loop client does, and the token intervals
after the first are the engine's."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy
from kvtier.sim.config import build_config
from kvtier.sim.steptime.frontend import (
    DETOKENIZER_PRIME_S_PER_TOKEN,
    TOKENIZE_S_PER_TOKEN,
    frontend_token_s,
)
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import replay_both
from tests.test_sim_differential import assert_same
from tests.test_sim_tbt import config

PER_TOKEN = 1e-4  # large, so that the shift is far above float noise


def _trace() -> BlockedTrace:
    """Three requests of 8, 16 and 40 prompt tokens, overlapping on one instance."""
    return BlockedTrace.from_lists(
        [0.0, 0.001, 0.002], [8, 16, 40], [6, 3, 5], [[0, 1], [2, 3, 4, 5], list(range(6, 16))], 4
    )


def _both(cfg, trace, concurrency: int = 0):  # noqa: ANN001, ANN202
    cfg = replace(cfg, concurrency=concurrency)
    ref, fast = replay_both(trace, cfg)
    assert_same(ref, fast, trace)
    return ref


def test_first_token_and_finish_are_seen_later_by_the_prompt_tokens() -> None:
    """Open loop: the engine's schedule is the same, so every request's first token and finish
    move by exactly its prompt tokens times the rate, and its token intervals do not."""
    trace = _trace()
    base = config(frontend_s=2e-3)
    without = _both(base, trace)
    with_tokens = _both(replace(base, frontend_token_s=PER_TOKEN), trace)
    shift = PER_TOKEN * trace.input_tokens
    np.testing.assert_allclose(with_tokens.first_token_s - without.first_token_s, shift)
    np.testing.assert_allclose(with_tokens.finish_s - without.finish_s, shift)
    np.testing.assert_array_equal(with_tokens.tbt_tail_s, without.tbt_tail_s)
    assert with_tokens.n_iterations == without.n_iterations


def test_a_closed_loop_client_sends_its_next_request_after_the_whole_response() -> None:
    """Concurrency 1: each request is sent when the last one's response is complete, so every
    later request starts the earlier requests' per-token costs later."""
    trace = _trace()
    base = config(frontend_s=0.0)
    without = _both(base, trace, concurrency=1)
    with_tokens = _both(replace(base, frontend_token_s=PER_TOKEN), trace, concurrency=1)
    delay = PER_TOKEN * np.cumsum(trace.input_tokens)  # each request's own and its forerunners'
    np.testing.assert_allclose(with_tokens.finish_s - without.finish_s, delay)


def test_the_rate_follows_the_framework_and_token_ids_switch_it_off() -> None:
    """vLLM tokenizes and primes its detokenizer on the prompt; SGLang and TensorRT-LLM
    tokenize; a client that sends token ids pays neither."""
    assert frontend_token_s("vllm") == pytest.approx(
        TOKENIZE_S_PER_TOKEN + DETOKENIZER_PRIME_S_PER_TOKEN
    )
    assert frontend_token_s("sglang") == frontend_token_s("trtllm") == TOKENIZE_S_PER_TOKEN
    hw, model = load_hardware("h100-node"), load_model("Llama-3.1-8B")

    def rate(**serving) -> float:  # noqa: ANN003
        policy = Policy(block_tokens=16, serving=ServingPolicy(instances=1, **serving))
        return build_config(hw, model, policy).frontend_token_s

    assert rate() == frontend_token_s("vllm")
    assert rate(framework="sglang", step_time="roofline") == TOKENIZE_S_PER_TOKEN
    assert rate(token_ids_io=True) == 0.0
