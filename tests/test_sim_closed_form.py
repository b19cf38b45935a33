"""Closed-form checks of the serving model (docs/design.md 4.2) on real profiles."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import Hardware, ModelProfile
from kvtier.policy import SLO
from kvtier.policy import Policy as _Policy
from kvtier.sim import build_config, compute_metrics, simulate, simulate_raw
from kvtier.sim.steptime.frontend import frontend_s, frontend_token_s
from kvtier.trace.blocked import BlockedTrace

ENGINES = ["reference", "numba"]
B = 16


@pytest.fixture(scope="module")
def hw() -> Hardware:
    return load_hardware("h100-node")


@pytest.fixture(scope="module")
def model() -> ModelProfile:
    return load_model("Llama-3.1-8B")


def Policy() -> _Policy:  # noqa: N802 - stands in for the class in these closed forms
    """The default policy on the roofline backend: the closed forms here are the roofline's
    (the measured backend is checked against its tables in tests/test_steptime.py)."""
    p = _Policy()
    return replace(p, serving=replace(p.serving, step_time="roofline"))


# Every request's first token and finish also carry the front-end costs (HTTP and the rest
# per request; tokenization and the detokenizer's priming per prompt token;
# kvtier.sim.steptime.frontend), outside the engine's iterations.
FRONTEND_S = frontend_s(_Policy().serving.framework)
FRONTEND_TOKEN_S = frontend_token_s(_Policy().serving.framework)


def front_end(prompt_tokens: int) -> float:
    """What a request of ``prompt_tokens`` spends in the front end."""
    return FRONTEND_S + FRONTEND_TOKEN_S * prompt_tokens


def prefill_seconds(hw: Hardware, m: ModelProfile, q: int, ctx: int) -> float:
    """docs/design.md 4.2 for one chunk of q tokens after ctx cached ones, written out by hand."""
    tp = hw.topology.tp
    compute = (
        2 * m.active_params * q + 4 * m.layers * m.attention_heads * m.head_dim * q * (ctx + q / 2)
    ) / (tp * hw.gpu.peak_flops * hw.efficiency.mfu)
    memory = (m.weight_bytes + m.kv_bytes_per_token() * (ctx + q)) / (
        tp * hw.gpu.hbm_bw * hw.efficiency.mbu
    )
    return max(compute, memory) + hw.efficiency.step_overhead_s


def one(arrivals, inputs, outputs, blocks) -> BlockedTrace:
    return BlockedTrace.from_lists(arrivals, inputs, outputs, blocks, B)


@pytest.mark.parametrize("engine", ENGINES)
def test_single_request_ttft_is_the_prefill_formula(hw, model, engine) -> None:
    trace = one([0.5], [3000], [1], [list(range(3000 // B))])
    m = simulate(trace, hw, model, Policy(), engine=engine)
    expected = prefill_seconds(hw, model, 3000, 0) + front_end(3000)
    assert m.ttft_mean_s == pytest.approx(expected, rel=1e-12)
    assert m.n_iterations == 1  # 3000 tokens fit the 8192-token budget
    assert m.e2e_mean_s == m.ttft_mean_s  # one output token: done at the first token


@pytest.mark.parametrize("engine", ENGINES)
def test_chunked_prefill_sums_chunks(hw, model, engine) -> None:
    policy = replace(Policy(), serving=replace(Policy().serving, max_num_batched_tokens=1000))
    trace = one([0.0], [2500], [1], [[]])
    m = simulate(trace, hw, model, policy, engine=engine)
    expected = (
        prefill_seconds(hw, model, 1000, 0)
        + prefill_seconds(hw, model, 1000, 1000)
        + prefill_seconds(hw, model, 500, 2000)
    )
    assert m.ttft_mean_s == pytest.approx(expected + front_end(2500), rel=1e-12)
    assert m.n_iterations == 3


@pytest.mark.parametrize("engine", ENGINES)
def test_decode_only_batch_has_memory_bound_step(hw, model, engine) -> None:
    # four requests arrive together: one prefill iteration, then decode-only iterations of 4
    k, inp, out = 4, 100, 6
    trace = one([0.0] * k, [inp] * k, [out] * k, [[]] * k)
    policy = replace(Policy(), serving=replace(Policy().serving, instances=1))
    cfg = build_config(hw, model, policy)
    raw = simulate_raw(trace, cfg, engine=engine)
    assert np.all(raw.first_token_s == raw.first_token_s[0])
    mem_rate = hw.topology.tp * hw.gpu.hbm_bw * hw.efficiency.mbu
    kvb = model.kv_bytes_per_token()
    expected = 0.0
    for step in range(out - 1):  # decode step s reads ctx = inp + s cached tokens, adds one
        memory = (model.weight_bytes + kvb * k * (inp + step + 1)) / mem_rate
        compute = (2 * model.active_params * k) / (hw.gpu.peak_flops * hw.efficiency.mfu)
        assert memory > compute  # the regime this test is about
        expected += memory + hw.efficiency.step_overhead_s
    gen = raw.finish_s - raw.first_token_s
    np.testing.assert_allclose(gen, expected, rtol=1e-12)
    tpot = compute_metrics(trace, raw, cost_per_hour=1.0).tpot_mean_s
    assert tpot == pytest.approx(expected / (out - 1), rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_full_prefix_hit_skips_prefill(hw, model, engine) -> None:
    n_blocks = 100
    inp = n_blocks * B + 5
    blocks = list(range(n_blocks))
    policy = replace(Policy(), serving=replace(Policy().serving, instances=1))
    trace = one([0.0, 10.0], [inp, inp], [2, 2], [blocks, blocks])
    m_raw = simulate_raw(trace, build_config(hw, model, policy), engine=engine)
    ttft = m_raw.first_token_s - trace.arrival_s
    assert ttft[0] == pytest.approx(prefill_seconds(hw, model, inp, 0) + front_end(inp), rel=1e-12)
    # the second request finds all 100 blocks and computes only its 5-token tail
    assert m_raw.hit_blocks.tolist() == [0, n_blocks]
    tail = prefill_seconds(hw, model, 5, n_blocks * B) + front_end(inp)
    assert ttft[1] == pytest.approx(tail, rel=1e-12)
    m = simulate(trace, hw, model, policy, engine=engine)
    assert m.prefill_tokens_saved == n_blocks * B
    assert m.hit_ratio_tokens["hbm"] == pytest.approx(n_blocks * B / (2 * inp))


@pytest.mark.parametrize("engine", ENGINES)
def test_block_aligned_full_hit_recomputes_last_block(hw, model, engine) -> None:
    blocks = list(range(10))
    policy = replace(Policy(), serving=replace(Policy().serving, instances=1))
    trace = one([0.0, 10.0], [160, 160], [1, 1], [blocks, blocks])
    raw = simulate_raw(trace, build_config(hw, model, policy), engine=engine)
    assert raw.hit_blocks.tolist() == [0, 9]  # vLLM keeps one prompt token to compute


def _hardware_file(tmp: Path, flops: float, overhead: float) -> Path:
    (tmp / "gpus").mkdir(exist_ok=True)
    (tmp / "gpus" / "g.toml").write_text(
        f'name = "G"\nhbm_gb = 80\nhbm_bw_gbps = 3350\nbf16_tflops = {flops}\n'
        "pcie_gbps = 55\nprice_per_hour = 2\n"
    )
    path = tmp / f"hw-{flops}.toml"
    path.write_text(
        f'name = "test"\ngpu = "gpus/g.toml"\n[topology]\nhosts = 1\ngpus_per_host = 1\ntp = 1\n'
        f"[efficiency]\nmfu = 0.5\nmbu = 0.75\nstep_overhead_s = {overhead}\n"
    )
    return path


@pytest.mark.parametrize("engine", ENGINES)
def test_twice_the_flops_halves_a_compute_bound_prefill(tmp_path, model, engine) -> None:
    trace = one([0.0], [8000], [1], [[]])
    slow = simulate(
        trace, load_hardware(_hardware_file(tmp_path, 989, 0.0)), model, Policy(), engine=engine
    )
    fast = simulate(
        trace, load_hardware(_hardware_file(tmp_path, 1978, 0.0)), model, Policy(), engine=engine
    )
    # the engine's part halves; the front-end costs outside it do not
    assert fast.ttft_mean_s - front_end(8000) == pytest.approx(
        (slow.ttft_mean_s - front_end(8000)) / 2, rel=1e-12
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_admission_waits_for_hbm(tmp_path, model, engine) -> None:
    # a pool of exactly 300 blocks: two 250-block requests cannot run together
    policy = replace(Policy(), serving=replace(Policy().serving, instances=1))
    kvb = model.kv_bytes_per_token()
    from kvtier.policy.model import TierPolicy

    policy = replace(policy, tiers=(TierPolicy(capacity_gb=300 * B * kvb / 1e9),))
    hw = load_hardware("h100-node")
    assert build_config(hw, model, policy).capacity_blocks == 300
    inp = 250 * B - 1
    trace = one([0.0, 0.0], [inp, inp], [50, 50], [[], []])
    raw = simulate_raw(trace, build_config(hw, model, policy), engine=engine)
    # the second starts only after the first finished and freed its blocks
    assert raw.first_token_s[1] > raw.finish_s[0]
    # a request larger than the whole pool is rejected, not left to block the queue
    big = one([0.0, 1.0], [301 * B, 100], [1, 1], [[], []])
    m = simulate(big, hw, model, policy, engine=engine)
    assert m.n_rejected == 1 and m.n_served == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_early_stop_reports_a_missed_slo(hw, model, engine) -> None:
    n = 200
    trace = one(list(np.zeros(n)), [6000] * n, [20] * n, [[]] * n)
    policy = replace(Policy(), serving=replace(Policy().serving, instances=1))
    slo = SLO(ttft_p99_s=0.5)
    full = simulate(trace, hw, model, policy, engine=engine, slo=slo)
    early = simulate(trace, hw, model, policy, engine=engine, slo=slo, stop_early=True)
    assert full.slo_met is False and not full.early_stopped
    assert early.early_stopped and early.slo_met is False
    assert early.n_iterations < full.n_iterations
    loose = SLO(ttft_p99_s=1e6)
    ok = simulate(trace, hw, model, policy, engine=engine, slo=loose, stop_early=True)
    assert ok.slo_met is True and ok.slo_attainment == 1.0 and not ok.early_stopped
