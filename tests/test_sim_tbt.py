"""The per-request TBT tail (mean of the longest 10% token intervals) in closed form.

Each case computes the intervals from the step-time function independently of the engines,
then checks both engines. The differential tests (test_sim_differential.py and the files that
reuse its ``assert_same``) compare the engines on generated traces.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from kvtier.policy.model import SLO
from kvtier.policy.registries import VLLM_V0, VLLM_V1
from kvtier.sim import compute_metrics, simulate_raw
from kvtier.sim.config import SimConfig
from kvtier.sim.metrics import effective_share
from kvtier.sim.requests import request_table
from kvtier.sim.result import TBT_TAIL_SHARE, tbt_tail_counts
from kvtier.sim.slo import SloCheck
from kvtier.sim.timing import prefill_attn_ns, step_time
from kvtier.trace.blocked import BlockedTrace

ENGINES = ("reference", "numba")


def config(**kw) -> SimConfig:
    base = dict(
        n_instances=1,
        capacity_blocks=400,
        block_tokens=4,
        token_budget=64,
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
        track_tbt=True,
    )
    base.update(kw)
    return SimConfig(**base)


def prefill_s(cfg: SimConfig, q: int) -> float:
    p = cfg.timing_params()
    return float(step_time(q, q * q, q, 0, 0, prefill_attn_ns(q, 0, p), p))


def decode_s(cfg: SimConfig, kvs: list[int]) -> float:
    """One decode step of requests holding ``kvs`` tokens of KV each (one more each)."""
    p = cfg.timing_params()
    attn = sum(2 * kv + 1 for kv in kvs)
    read = sum(kv + 1 for kv in kvs)
    return float(step_time(len(kvs), attn, read, len(kvs), read, 0, p))


def tail_of(intervals: list[float], k: int) -> float:
    return sum(sorted(intervals)[-k:]) / k


def test_tail_counts_round_up_in_integers() -> None:
    assert TBT_TAIL_SHARE == 0.1
    out = np.array([0, 1, 2, 11, 12, 26, 31, 32])  # L - 1 = -1, 0, 1, 10, 11, 25, 30, 31
    assert tbt_tail_counts(out).tolist() == [0, 0, 1, 1, 2, 3, 3, 4]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("gaps", [1, 10, 11, 25])
def test_a_lone_decode_averages_its_longest_steps(engine, gaps) -> None:
    """One request alone: each interval is one decode step, longer as its KV grows, so its
    tail is the mean of its last ``k`` steps (k = ceil(0.1 * (L - 1)): 1, 1, 2, 3)."""
    cfg = config()
    prompt = 8
    trace = BlockedTrace.from_lists([0.0], [prompt], [gaps + 1], [[0, 1]], 4)
    raw = simulate_raw(trace, cfg, engine=engine)
    t = prefill_s(cfg, prompt)
    ends = [t]
    for kv in range(prompt, prompt + gaps):
        t += decode_s(cfg, [kv])
        ends.append(t)
    intervals = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    k = -(-gaps // 10)
    assert raw.finish_s[0] == ends[-1]
    assert raw.tbt_tail_s is not None
    assert raw.tbt_tail_s[0] == pytest.approx(tail_of(intervals, k), rel=1e-12)
    # with every step longer than the one before, the tail is the mean of the last k
    assert intervals == sorted(intervals)
    tpot = (raw.finish_s[0] - raw.first_token_s[0]) / gaps
    assert raw.tbt_tail_s[0] >= tpot * (1 - 1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_vllm_v0_prompt_iteration_stalls_a_running_decode(engine) -> None:
    """Request 1 arrives while request 0 decodes; vLLM v0 runs its prompt in an iteration of
    its own, so request 0's next token comes a prompt iteration and a two-request decode step
    after its last: that stall is its longest interval (L - 1 = 10, k = 1). vLLM V1 mixes the
    prompt with the decode (one step), a shorter stall."""
    cfg = config(scheduler=VLLM_V0)
    prompt0, prompt1 = 8, 48
    t = prefill_s(cfg, prompt0)
    ends = [t]
    for kv in range(prompt0, prompt0 + 3):
        t += decode_s(cfg, [kv])
        ends.append(t)
    arrive = (ends[2] + ends[3]) / 2  # during request 0's third decode step
    trace = BlockedTrace.from_lists(
        [0.0, arrive], [prompt0, prompt1], [11, 2], [[0, 1], list(range(2, 14))], 4
    )
    raw = simulate_raw(trace, cfg, engine=engine)
    assert raw.first_token_s[0] == ends[0]
    stall_end = ends[3] + prefill_s(cfg, prompt1)
    assert raw.first_token_s[1] == stall_end  # its prompt iteration ran alone
    stall_end += decode_s(cfg, [prompt0 + 3, prompt1])
    stall = stall_end - ends[3]
    assert raw.tbt_tail_s is not None
    assert raw.tbt_tail_s[0] == pytest.approx(stall, rel=1e-12)
    v1 = simulate_raw(trace, replace(cfg, scheduler=VLLM_V1), engine=engine)
    assert v1.tbt_tail_s is not None and v1.tbt_tail_s[0] < stall


@pytest.mark.parametrize("engine", ENGINES)
def test_nan_below_two_tokens_rejected_or_unfinished(engine) -> None:
    cfg = config(capacity_blocks=8)
    trace = BlockedTrace.from_lists(
        [0.0, 0.0, 0.0], [8, 8, 64], [1, 3, 2], [[0, 1], [2, 3], list(range(4, 20))], 4
    )
    raw = simulate_raw(trace, cfg, engine=engine)
    assert raw.instance[2] == -1  # larger than the pool: rejected
    tail = raw.tbt_tail_s
    assert tail is not None
    assert math.isnan(tail[0]) and not math.isnan(tail[1]) and math.isnan(tail[2])
    rows = request_table(trace, raw).to_pydict()
    assert rows["tbt_tail_s"][0] is None and rows["tbt_tail_s"][1] == tail[1]
    untracked = simulate_raw(trace, replace(cfg, track_tbt=False), engine=engine)
    assert untracked.tbt_tail_s is None
    assert "tbt_tail_s" not in request_table(trace, untracked).column_names
    np.testing.assert_array_equal(untracked.finish_s, raw.finish_s)


def test_metrics_quantiles_and_effective_share() -> None:
    cfg = config()
    trace = BlockedTrace.from_lists(
        [0.0, 0.0, 0.5], [8, 8, 8], [1, 12, 30], [[0, 1], [2, 3], [4, 5]], 4
    )
    raw = simulate_raw(trace, cfg, engine="numba")
    m = compute_metrics(trace, raw, cost_per_hour=1.0)
    tails = raw.tbt_tail_s[1:]  # request 0 has a single token
    assert m.tbt_p50_s == float(np.quantile(tails, 0.5))
    assert m.tbt_p99_s == float(np.quantile(tails, 0.99))
    untracked = simulate_raw(trace, replace(cfg, track_tbt=False), engine="numba")
    assert compute_metrics(trace, untracked, cost_per_hour=1.0).tbt_p99_s is None
    ttft = raw.first_token_s - trace.arrival_s
    # every request within both bounds; the single-token one has no interval to bound
    assert effective_share(trace, raw, float(ttft.max()), float(tails.max())) == 1.0
    assert effective_share(trace, raw, float(ttft.max()), float(tails.min())) == pytest.approx(
        2 / 3
    )
    assert effective_share(trace, raw, float(ttft.min()) / 2, math.inf) == 0.0
    with pytest.raises(ValueError, match="track_tbt"):
        effective_share(trace, untracked, 1.0, 1.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_an_slo_on_tbt_tracks_it_and_stops_early_on_it(engine) -> None:
    """``slo.tbt_p99_s`` turns tracking on; a bound below every tail is certainly missed
    once enough requests finish, and the replay stops there (both engines alike)."""
    cfg = config(track_tbt=False)
    n = 30
    trace = BlockedTrace.from_lists(
        [0.01 * i for i in range(n)], [8] * n, [20] * n, [[2 * i, 2 * i + 1] for i in range(n)], 4
    )
    loose = SLO(tbt_p99_s=10.0)
    raw = simulate_raw(trace, cfg, engine=engine, slo=loose, stop_early=True)
    assert raw.tbt_tail_s is not None and not raw.early_stopped
    m = compute_metrics(trace, raw, cost_per_hour=1.0, slo=loose)
    assert m.slo_met is True and m.slo_attainment == 1.0
    tight = SLO(tbt_p99_s=float(np.nanmin(raw.tbt_tail_s)) / 2)
    stopped = simulate_raw(trace, cfg, engine=engine, slo=tight, stop_early=True)
    assert stopped.early_stopped
    assert np.isnan(stopped.finish_s).any()
    full = simulate_raw(trace, cfg, engine=engine, slo=tight)
    assert compute_metrics(trace, full, cost_per_hour=1.0, slo=tight).slo_met is False
    # the tracker's limit: with 30 requests the P99 is missed once 30 - floor(29 * .99) exceed
    check = SloCheck.from_slo(tight)
    assert check.limits(n)[3] == 2
    done = ~np.isnan(stopped.finish_s)
    assert int(done.sum()) >= 2


def test_trackers_count_tbt_like_the_kernel() -> None:
    """Both engines stop at the same event on a TBT bound (the reference's SloTracker)."""
    cfg = config(track_tbt=False, n_instances=2, scheduler=VLLM_V0)
    n = 24
    trace = BlockedTrace.from_lists(
        [0.02 * i for i in range(n)],
        [8 + 12 * (i % 3) for i in range(n)],
        [15] * n,
        [list(range(20 * i, 20 * i + 2 + 3 * (i % 3))) for i in range(n)],
        4,
    )
    full = simulate_raw(trace, cfg, engine="numba", track_tbt=True)
    bound = float(np.nanquantile(full.tbt_tail_s, 0.7))
    slo = SLO(tbt_p99_s=bound)
    a = simulate_raw(trace, cfg, engine="reference", slo=slo, stop_early=True)
    b = simulate_raw(trace, cfg, engine="numba", slo=slo, stop_early=True)
    assert a.early_stopped and b.early_stopped and a.end_s == b.end_s
    np.testing.assert_array_equal(a.finish_s, b.finish_s)
    np.testing.assert_array_equal(a.tbt_tail_s, b.tbt_tail_s)


def test_optimize_constrains_tbt_and_policy_files_keep_it(tmp_path) -> None:
    from kvtier.policy import Policy
    from kvtier.policy.file import read_policy_file, write_policy_file
    from kvtier.report.optimize import TERM_WORDS
    from kvtier.search.objective import binding_term
    from kvtier.search.run import parse_slo
    from kvtier.sim.slo import violations as slo_violations

    slo = parse_slo("ttft_p99=5,tbt_p99=0.01")
    assert slo == SLO(ttft_p99_s=5.0, tbt_p99_s=0.01)
    trace = BlockedTrace.from_lists([0.0, 0.0], [8, 8], [12, 30], [[0, 1], [2, 3]], 4)
    raw = simulate_raw(trace, config(track_tbt=False), engine="numba", slo=slo)
    m = compute_metrics(trace, raw, cost_per_hour=1.0, slo=slo)
    v = slo_violations(m, slo)
    assert v["tbt_p99_s"] == m.tbt_p99_s - 0.01 > 0  # one decode step is about 10 ms
    assert binding_term(v, slo) == "tbt_p99_s" and "tbt_p99_s" in TERM_WORDS
    # no request of two tokens: no interval, the term holds
    one = BlockedTrace.from_lists([0.0], [8], [1], [[0, 1]], 4)
    m1 = compute_metrics(
        one, simulate_raw(one, config(), engine="numba"), cost_per_hour=1.0, slo=slo
    )
    assert math.isnan(m1.tbt_p99_s) and slo_violations(m1, slo)["tbt_p99_s"] < 0
    assert m1.slo_met is True
    path = tmp_path / "p.toml"
    write_policy_file(path, Policy(slo=slo), metrics=m.to_dict())
    back = read_policy_file(path)
    assert back.policy.slo == slo and back.metrics["tbt_p99_s"] == m.tbt_p99_s


def test_the_slo_lower_bound_on_tbt_is_the_tpot_one() -> None:
    """A request's TBT tail is at least its mean interval, so the lower bound on TPOT (one
    lone decode step) bounds the TBT term too; a TBT SLO below it is unreachable."""
    from types import SimpleNamespace

    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy import Policy
    from kvtier.search.bound import slo_bound

    trace = BlockedTrace.from_lists([0.0, 1.0], [64, 64], [8, 8], [[0, 1, 2, 3], [4, 5]], 16)
    scenario = SimpleNamespace(
        blocked=lambda policy: trace,
        hardware=load_hardware("h100-node"),
        model=load_model("Llama-3.1-8B"),
    )
    bound = slo_bound(scenario, Policy(), SLO(tpot_p99_s=1e-6, tbt_p99_s=1e-6), None)
    assert bound is not None
    assert bound.bounds["tbt_p99_s"] == bound.bounds["tpot_p99_s"] > 1e-6
    assert set(bound.unreachable) == {"tpot_p99_s", "tbt_p99_s"}
    assert "tbt_p99=" in bound.suggestion()
