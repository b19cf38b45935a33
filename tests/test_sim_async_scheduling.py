"""vLLM's async scheduling (``serving.async_scheduling``): the scheduler decides step n + 1
when step n is launched, so a request that arrives during a step is scheduled for the step
after next while another request runs on; an idle engine schedules it at once."""

from __future__ import annotations

import pytest

from kvtier.errors import InputError
from kvtier.policy.model import POLICY_FORMAT, policy_from_dict
from kvtier.sim import simulate_raw
from kvtier.sim.config import SimConfig
from kvtier.sim.timing import prefill_attn_ns, step_time
from kvtier.trace.blocked import BlockedTrace
from tests.test_sim_differential import assert_same

PROMPT = 8


def _config(async_scheduling: bool, scheduler: int = 1) -> SimConfig:
    return SimConfig(
        n_instances=1,
        capacity_blocks=200,
        block_tokens=4,
        token_budget=64,  # a prompt and the running decode fit one step
        max_seqs=4,
        router=0,
        affinity_overload=0,
        flops_per_token=3.0,
        attn_coef=0.01,
        compute_rate=1000.0,
        weight_bytes=5.0,
        kv_bytes_per_token=0.3,
        mem_rate=1000.0,
        step_overhead_s=1e-3,
        cost_per_hour=10.0,
        scheduler=scheduler,
        async_scheduling=async_scheduling,
    )


def _decode_ends(cfg: SimConfig, steps: int) -> list[float]:
    """End times of a lone request's steps: its one-chunk prefill, then decode steps."""
    p = cfg.timing_params()
    t = float(step_time(PROMPT, PROMPT * PROMPT, PROMPT, 0, 0, prefill_attn_ns(PROMPT, 0, p), p))
    ends = [t]
    for kv in range(PROMPT, PROMPT + steps):
        t += float(step_time(1, 2 * kv + 1, kv + 1, 1, kv + 1, 0, p))
        ends.append(t)
    return ends


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
    ref = simulate_raw(trace, cfg, engine="reference")
    fast = simulate_raw(trace, cfg, engine="numba")
    assert_same(ref, fast, trace)
    return ref


def test_a_request_sent_during_a_step_waits_for_the_step_after_next() -> None:
    """Request 1 arrives inside request 0's sixth decode step. Synchronous: it is prefilled
    in the next step, beside the seventh decode. Async: the next step was scheduled when the
    sixth was launched, so it joins the one after, beside the eighth decode."""
    ends = _decode_ends(_config(False), 20)
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
    ends = _decode_ends(_config(False), 10)
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
    ends = _decode_ends(_config(False), 20)
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
