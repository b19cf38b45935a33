"""vLLM's async scheduling (``serving.async_scheduling``): the scheduler decides step n + 1
when step n is launched, so a request that arrives during a step is scheduled for the step
after next while another request runs on; an idle engine schedules it at once."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.errors import InputError, StallError
from kvtier.policy.model import POLICY_FORMAT, policy_from_dict
from kvtier.sim import simulate_raw
from kvtier.sim.config import SimConfig
from kvtier.sim.tiers import TierConfig
from kvtier.sim.timing import prefill_attn_ns, step_time
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import replay_both
from tests.sim_strategies import blocked_traces, tiered_configs
from tests.test_sim_differential import _step_ends, assert_same
from tests.test_sim_tbt import config

PROMPT = 8


def _config(async_scheduling: bool, scheduler: int = 1) -> SimConfig:
    """The toy instance of the TBT tests: one instance, a budget a prompt and the running
    decode fit in one step."""
    return config(
        capacity_blocks=200, track_tbt=False, scheduler=scheduler,
        async_scheduling=async_scheduling,
    )  # fmt: skip


def _mixed_step(cfg: SimConfig, decode_kv: int) -> float:
    """One step of a decode at ``decode_kv`` tokens beside a whole fresh prompt."""
    p = cfg.timing_params()
    attn = (2 * decode_kv + 1) + PROMPT * PROMPT
    return float(
        step_time(
            1 + PROMPT,
            attn,
            decode_kv + 1 + PROMPT,
            1,
            decode_kv + 1,
            prefill_attn_ns(PROMPT, 0, p),
            p,
        )  # fmt: skip
    )


def _both(trace: BlockedTrace, cfg: SimConfig):  # noqa: ANN202
    """The reference's replay, once the numba engine's has been found the same."""
    ref, fast = replay_both(trace, cfg)
    assert_same(ref, fast, trace)
    return ref


def test_a_request_sent_during_a_step_waits_for_the_step_after_next() -> None:
    """Request 1 arrives inside request 0's sixth decode step. Synchronous: it is prefilled
    in the next step, beside the seventh decode. Async: the next step was scheduled when the
    sixth was launched, so it joins the one after, beside the eighth decode."""
    ends = _step_ends(_config(False), PROMPT, 20)
    t_arrive = (ends[5] + ends[6]) / 2
    trace = BlockedTrace.from_lists([0.0, t_arrive], [PROMPT, PROMPT], [40, 5], [[0, 1], [2, 3]], 4)

    sync = _both(trace, _config(False))
    assert sync.first_token_s[1] == pytest.approx(ends[6] + _mixed_step(_config(False), 14))

    late = _both(trace, _config(True))
    assert late.first_token_s[1] == pytest.approx(ends[7] + _mixed_step(_config(True), 15))
    # request 0 ran alone until then: its first token is the same either way
    assert late.first_token_s[0] == sync.first_token_s[0] == pytest.approx(ends[0])


def test_an_idle_engine_schedules_a_request_at_once() -> None:
    """Nothing runs on: the request sent after request 0 finished is scheduled when it
    arrives, with or without async scheduling."""
    ends = _step_ends(_config(False), PROMPT, 10)
    trace = BlockedTrace.from_lists(
        [0.0, ends[4] + 1.0], [PROMPT, PROMPT], [4, 4], [[0, 1], [2, 3]], 4
    )
    sync = _both(trace, _config(False))
    late = _both(trace, _config(True))
    assert late.first_token_s[1] == sync.first_token_s[1]
    assert late.finish_s[1] == sync.finish_s[1]


@pytest.mark.parametrize("scheduler", [0, 2])  # reserve, vllm_v0
def test_other_schedulers_ignore_the_flag(scheduler: int) -> None:
    """Only vLLM V1's scheduler runs ahead: the other schedulers replay as before."""
    ends = _step_ends(_config(False), PROMPT, 20)
    trace = BlockedTrace.from_lists(
        [0.0, (ends[5] + ends[6]) / 2], [PROMPT, PROMPT], [40, 5], [[0, 1], [2, 3]], 4
    )
    base = _both(trace, _config(False, scheduler))
    flagged = _both(trace, _config(True, scheduler))
    assert flagged.first_token_s.tolist() == base.first_token_s.tolist()


def test_a_policy_refuses_the_flag_on_another_scheduler() -> None:
    data = {
        "format": POLICY_FORMAT,
        "serving": {"scheduler": "reserve", "async_scheduling": True},
    }
    with pytest.raises(InputError, match="serving.async_scheduling"):
        policy_from_dict(data)


def test_a_policy_refuses_the_flag_beside_a_framework_cpu_cost() -> None:
    """The replay adds ``cpu_overhead_s`` to every step; an engine that schedules ahead hides
    it, so the two together would replay neither engine."""
    data = {
        "format": POLICY_FORMAT,
        "serving": {"async_scheduling": True, "cpu_overhead_s": 0.004},
    }
    with pytest.raises(InputError, match="cpu_overhead_s"):
        policy_from_dict(data)
    assert policy_from_dict(
        {"format": POLICY_FORMAT, "serving": {"async_scheduling": True}}
    ).serving.async_scheduling


@st.composite
def _tiered_async(draw: st.DrawFn):
    trace = draw(blocked_traces())
    cfg = draw(tiered_configs(trace.block_tokens))
    return trace, replace(cfg, scheduler=1, async_scheduling=True)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tiered_async())
def test_an_attempt_that_schedules_nothing_leaves_no_step_in_flight(case) -> None:
    """A running request preempts itself while the others' loads end after the step was
    decided: nothing runs, so the next attempt is decided when it starts and runs those loads
    at once (before, the instance woke at their end, at or before the present, for ever). The
    reference's checked mode asserts that events come in time order and that an instant
    passes; the engines agree."""
    trace, cfg = case
    replay_both(trace, cfg, check_invariants=True)  # (None: both stopped at the same stall)


def _decode(value):  # noqa: ANN001, ANN202
    """A value of tests/data/livelock-behind-loads.json: arrays and dataclasses as written."""
    if isinstance(value, dict) and "__array__" in value:
        return np.array(value["__array__"], dtype=value["dtype"])
    if isinstance(value, dict) and "__dataclass__" in value:
        cls = {"TierConfig": TierConfig, "SimConfig": SimConfig}[value["__dataclass__"]]
        return cls(**{k: _decode(v) for k, v in value.items() if k != "__dataclass__"})
    if isinstance(value, list):
        return tuple(_decode(v) for v in value)
    if isinstance(value, dict):
        return {k: _decode(v) for k, v in value.items()}
    return value


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_requests_that_preempt_each_other_behind_loads_stop_the_replay(async_scheduling) -> None:
    """A drawn case (hypothesis, tests/data/livelock-behind-loads.json: one instance of 14
    one-token blocks, a token budget of 3, a DRAM tier): two requests take turns; each, when
    its load ends, computes a chunk, cannot grow while the other's load holds its blocks,
    preempts itself and loads again. No token is ever emitted. Both engines used to replay
    it for ever; now both stop at the same preemption with one error that names the cause."""
    doc = json.loads((Path(__file__).parent / "data" / "livelock-behind-loads.json").read_text())
    t = doc["trace"]
    trace = BlockedTrace.from_lists(
        t["arrival_s"], t["input_tokens"], t["output_tokens"], t["blocks"], t["block_tokens"]
    )
    cfg = replace(_decode(doc["config"]), scheduler=1, async_scheduling=async_scheduling)
    messages = []
    for engine in ("reference", "numba"):
        with pytest.raises(StallError) as err:
            simulate_raw(trace, cfg, engine=engine)
        assert err.value.behind_loads
        messages.append(str(err.value))
    assert messages[0] == messages[1]
    assert "held by requests loading from a lower tier" in messages[0]
