"""When vLLM's scheduler learns that a lower-tier load has ended (``load_report``): its KV
connector's worker polls for finished loads (``get_finished``) as it launches each step, and
the scheduler reads them with that step's output, so a load that ends during a step is run in
a later step than the first one decided after its end; a load starts when its step is decided
(scheduling ahead, a step before the step runs). ``at_once`` is the scheduler that sees a
load's end at its next decision."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import (
    POLICY_FORMAT,
    Policy,
    ServingPolicy,
    TierPolicy,
    policy_from_dict,
)
from kvtier.sim.config import SimConfig, build_config
from kvtier.sim.timing import step_time
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import replay_both
from tests.test_sim_differential import assert_same

B = 16
A = [0, 1, 2, 3]  # a prompt's four blocks


def config(load_report: str, async_scheduling: bool, load_wait: str = "request") -> SimConfig:
    """One Llama-3.1-8B instance on an H100 with vLLM's OffloadingConnector to CPU DRAM; HBM's
    own prefix cache off, so a repeated prompt is found only below HBM."""
    dram = TierPolicy(name="dram", capacity_gb=10.0, connector="vllm-offloading", eviction="lru")
    policy = Policy(
        block_tokens=B,
        load_report=load_report,
        load_wait=load_wait,
        serving=ServingPolicy(instances=1, prefix_caching=False, async_scheduling=async_scheduling),
        tiers=(TierPolicy(), dram),
    )
    return build_config(load_hardware("h100-node"), load_model("Llama-3.1-8B"), policy)


def load_beside_a_decode() -> BlockedTrace:
    """0: prompt A (64 tokens), written to DRAM; 1: a one-block prompt and 400 tokens out, so
    the engine decodes it step after step from t = 10 s; 2: prompt A again plus a token, sent
    during those steps: it loads A's four blocks (about 2 ms, well inside a 6 ms step) and
    computes one token."""
    return BlockedTrace.from_lists(
        [0.0, 10.0, 10.5], [64, 16, 65], [1, 400, 2], [A, [4], A], B, n_blocks=5
    )


def _replay(cfg: SimConfig):  # noqa: ANN202
    trace = load_beside_a_decode()
    ref, fast = replay_both(trace, cfg)
    assert_same(ref, fast, trace, ("dram",))
    assert ref.loaded_blocks[2, 0] == 4
    return ref


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_load_that_ends_during_a_step_runs_one_step_later(async_scheduling: bool) -> None:
    """In step: the load starts when its step is decided and ends inside it; the next step
    was decided on the output of a step launched before the end, so the request runs in the
    step after. Scheduling ahead, the load starts a step earlier (when its step is decided),
    and the scheduler reads the poll two steps later. Either way request 2's first token
    comes exactly one of request 1's decode steps later than with a scheduler that sees the
    load's end at once; request 1 is not delayed."""
    polled = _replay(config("step_output", async_scheduling))
    at_once = _replay(config("at_once", async_scheduling))
    p = config("step_output", async_scheduling).timing_params()
    kv = 60  # request 1's context then (16 prompt tokens and about 45 generated)
    decode = float(step_time(1, 2 * kv + 1, kv + 1, 1, kv + 1, 0, p))
    delay = polled.first_token_s[2] - at_once.first_token_s[2]
    assert delay == pytest.approx(decode, rel=1e-3)
    np.testing.assert_array_equal(polled.first_token_s[:2], at_once.first_token_s[:2])
    assert polled.finish_s[1] == pytest.approx(at_once.finish_s[1], rel=1e-6)


def test_an_idle_engine_runs_a_load_when_it_ends() -> None:
    """Nothing else runs: the engine polls at once (an empty step), so the request computes as
    soon as its load has ended, whichever rule."""
    trace = BlockedTrace.from_lists([0.0, 10.0], [64, 65], [1, 2], [A, A], B, n_blocks=4)
    polled, _ = replay_both(trace, config("step_output", True))
    at_once, _ = replay_both(trace, config("at_once", True))
    assert polled.loaded_blocks[1, 0] == 4
    np.testing.assert_array_equal(polled.first_token_s, at_once.first_token_s)


def test_the_rule_needs_vllm_v1_and_a_request_that_waits_alone() -> None:
    """It is a property of vLLM V1's connector scheduling: off without lower tiers, with the
    batch waiting for loads (LMCache's synchronous retrieve), or under another scheduler."""
    assert config("step_output", True).polls_loads
    assert not config("at_once", True).polls_loads
    assert not config("step_output", True, load_wait="batch").polls_loads
    hw, model = load_hardware("h100-node"), load_model("Llama-3.1-8B")
    plain = Policy(block_tokens=B, serving=ServingPolicy(instances=1))
    assert not build_config(hw, model, plain).polls_loads
    v0 = Policy(
        block_tokens=B,
        serving=ServingPolicy(instances=1, scheduler="vllm_v0"),
        tiers=(TierPolicy(), TierPolicy(name="dram", capacity_gb=10.0)),
    )
    assert not build_config(hw, model, v0).polls_loads


def test_a_policy_names_the_valid_choices() -> None:
    """A misspelt value is refused with the valid ones listed."""
    with pytest.raises(InputError, match="step_output"):
        policy_from_dict({"format": POLICY_FORMAT, "load_report": "polled"})
