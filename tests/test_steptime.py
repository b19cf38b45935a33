"""Step-time backends: the measured tables against aiconfigurator-core, the disk cache, the
lookups and their extrapolation, and the improved roofline (TP, FP8, MoE, KV replication)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvtier.deploy.kv_budget import kv_budget
from kvtier.errors import InputError
from kvtier.hardware.loader import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy
from kvtier.sim import simulate_raw
from kvtier.sim import timing as T
from kvtier.sim.config import build_config
from kvtier.sim.steptime import measured_key, measured_tables, pack_measured, validate_timing
from kvtier.sim.steptime.measured import PF_DATA_MAX, MeasuredKey, MeasuredTables, cache_dir
from kvtier.trace.blocked import BlockedTrace
from tests.sim_strategies import timings  # noqa: F401 (the strategy the differential tests use)

LLAMA = "meta-llama/Meta-Llama-3.1-8B"


def _policy(**serving: object) -> Policy:
    return replace(Policy(), serving=replace(ServingPolicy(), **serving))


@pytest.fixture(scope="module")
def llama_tables() -> MeasuredTables:
    key = measured_key(LLAMA, "H100-SXM", "vllm", "current", 1, "bf16", "bf16")
    return measured_tables(key)


@pytest.fixture(scope="module")
def handle():  # noqa: ANN201 - aiconfigurator's EngineHandle
    from aiconfigurator_core.sdk.engine import EngineHandle

    return EngineHandle.compile(LLAMA, "h100_sxm", "vllm", tp_size=1)


def test_tables_reproduce_engine_queries(llama_tables: MeasuredTables, handle) -> None:  # noqa: ANN001
    """Interpolated step times match aiconfigurator-core's own mixed-step answers: a prefill
    chunk after a prefix, a decode batch at one context, within the data's range."""
    base = build_config(
        load_hardware("h100-node"), load_model("llama-3.1-8b"), _policy(step_time="roofline")
    ).timing_params()
    tp = pack_measured(base, llama_tables, 0.0)
    validate_timing(tp)
    rng = np.random.default_rng(7)
    errs = []
    for _ in range(120):
        q = int(rng.integers(1, 8192))
        c = int(rng.integers(0, PF_DATA_MAX - q))
        ref = handle.mixed_step_breakdown(q + c, 0, q + c, 1, c)
        got = T.step_time(q, q * (2 * c + q), q + c, 0, 0, T.prefill_attn_ns(q, c, tp), tp)
        errs.append(got / ((ref[1] + ref[2]) * 1e-3) - 1)
    for _ in range(120):
        b = int(rng.integers(1, 2048))
        c = int(rng.integers(1, 131072))
        ref = handle.mixed_step_breakdown(0, b, c, 2, 0)
        got = T.step_time(b, 0, 0, b, b * c, 0, tp)
        errs.append(got / ((ref[1] + ref[3]) * 1e-3) - 1)
    errs = np.abs(np.array(errs))
    assert errs.mean() < 0.01
    assert errs.max() < 0.05
    # on a grid point the lookup is the query itself (floor added back)
    ref = handle.mixed_step_breakdown(2048 + 1024, 0, 2048 + 1024, 1, 1024)
    got = T.step_time(2048, 0, 0, 0, 0, T.prefill_attn_ns(2048, 1024, tp), tp)
    na = float(np.interp(2048, llama_tables.tok_grid, llama_tables.non_attn))
    assert got == pytest.approx(na + ref[2] * 1e-3, rel=1e-6)


def test_tables_are_cached_on_disk(llama_tables: MeasuredTables) -> None:
    """The second request reads the cache file (the test session's directory), bit-equal."""
    key = llama_tables.key
    again = measured_tables(key)
    assert again.cached
    assert Path(cache_dir(), f"steptime-{key.digest()}.npz").is_file()
    assert str(cache_dir()) != str(Path.home() / ".cache" / "kvtier")
    for name in ("tok_grid", "non_attn", "prefill_attn", "decode_attn"):
        np.testing.assert_array_equal(getattr(again, name), getattr(llama_tables, name))
    assert again.pf_floor == llama_tables.pf_floor
    assert 0 < llama_tables.build_s < 30  # the first build: compile and about 800 queries


def test_extrapolation_scales_with_the_operation(llama_tables: MeasuredTables) -> None:
    base = build_config(
        load_hardware("h100-node"), load_model("llama-3.1-8b"), _policy(step_time="roofline")
    ).timing_params()
    tp = pack_measured(base, llama_tables, 0.0)
    cmax = float(llama_tables.pc_grid[-1])
    q = 512
    # a prefix beyond the data: attention FLOPs are linear in 2*ctx + q
    a = T.prefill_attn_s(q, int(cmax), tp)
    b = T.prefill_attn_s(q, int(2 * cmax), tp)
    assert b == pytest.approx(a * (4 * cmax + q) / (2 * cmax + q))
    assert T.prefill_out_of_range(q, PF_DATA_MAX, tp) == 1
    assert T.prefill_out_of_range(q, PF_DATA_MAX - q, tp) == 0
    # decode batches beyond 2,048 scale linearly
    d1 = T._decode_attn_s(2048, 2048 * 1000, tp)
    d2 = T._decode_attn_s(4096, 4096 * 1000, tp)
    assert d2 == pytest.approx(2 * d1)
    assert T.step_extrapolated(4096, 4096, 4096 * 1000, 0, tp) == 1
    assert T.step_extrapolated(2048, 2048, 2048 * 1000, 0, tp) == 0


def test_replay_counts_extrapolated_iterations_in_both_engines(llama_tables) -> None:  # noqa: ANN001
    """Prompts longer than the context-attention data: the iterations that prefill past 16,384
    tokens are counted, the same in both engines; short prompts count none."""
    cfg = build_config(load_hardware("h100-node"), load_model("llama-3.1-8b"), _policy())
    assert cfg.step_backend == "measured"
    cfg = replace(cfg, n_instances=1)
    for prompt, expect_some in ((2000, False), (40000, True)):
        trace = BlockedTrace.from_lists([0.0, 0.5], [prompt, prompt], [3, 3], [[], []], 16)
        ref = simulate_raw(trace, cfg, engine="reference")
        fast = simulate_raw(trace, cfg, engine="numba")
        np.testing.assert_array_equal(ref.first_token_s, fast.first_token_s)
        np.testing.assert_array_equal(ref.finish_s, fast.finish_s)
        assert ref.extrapolated_iterations == fast.extrapolated_iterations
        assert (ref.extrapolated_iterations > 0) == expect_some
        assert ref.extrapolated_iterations <= ref.n_iterations


def test_validate_timing_refuses_bad_tables(llama_tables: MeasuredTables) -> None:
    base = build_config(
        load_hardware("h100-node"), load_model("llama-3.1-8b"), _policy(step_time="roofline")
    ).timing_params()
    good = pack_measured(base, llama_tables, 0.0)
    validate_timing(good)
    o = T._offsets(good)
    bad = good.copy()
    bad[o[5] + 3] = bad[o[5] + 2]  # a context grid that is not strictly ascending
    with pytest.raises(ValueError, match="ascending"):
        validate_timing(bad)
    bad = good.copy()
    bad[o[6]] = np.nan
    with pytest.raises(ValueError, match="finite"):
        validate_timing(bad)
    with pytest.raises(ValueError, match="shapes"):
        validate_timing(good[:-1])
    bad = good.copy()
    bad[o[1] + 5] = -1.0  # a negative non-attention time
    with pytest.raises(ValueError, match=">= 0"):
        validate_timing(bad)
    bad = good.copy()
    bad[T.T_FRONTEND] = -1e-3
    with pytest.raises(ValueError, match="front-end"):
        validate_timing(bad)
    bad = good.copy()
    bad[T.T_FRONTEND_TOKEN] = -1e-6
    with pytest.raises(ValueError, match="front-end"):
        validate_timing(bad)


def test_dense_tables_are_the_grids_interpolated(llama_tables: MeasuredTables) -> None:
    """The packed non-attention entries and decode rows are the measured grids interpolated at
    every whole count: a step looks them up without searching, with the same values."""
    base = build_config(
        load_hardware("h100-node"), load_model("llama-3.1-8b"), _policy(step_time="roofline")
    ).timing_params()
    tp = pack_measured(base, llama_tables, 0.0)
    t = llama_tables
    assert tp[T.T_N_TOK] == t.tok_grid[-1] + 1 and tp[T.T_N_DB] == t.db_grid[-1] + 1
    for n in (1, 7, 33, 100, 2047, 8192, 32768):
        want = float(np.interp(n, t.tok_grid, t.non_attn))
        assert T._non_attention_s(n, tp) == pytest.approx(want, rel=1e-12)
    assert T._non_attention_s(65536, tp) == pytest.approx(2 * T._non_attention_s(32768, tp))
    for b in (1, 5, 100, 2048):
        for c in (1, 700, 16384, 100000):
            col = [float(np.interp(c, t.dc_grid, row)) for row in t.decode_attn]
            want = float(np.interp(b, t.db_grid, col))
            assert T._decode_attn_s(b, b * c, tp) == pytest.approx(want, rel=1e-9)


def test_backend_choice_and_missing_data() -> None:
    """auto: measured on H100 / Llama-3.1-8B, the roofline on H20; asking for measured where
    no data covers the scenario is a one-line error naming what is missing."""
    model = load_model("llama-3.1-8b")
    cfg = build_config(load_hardware("h100-node"), model, _policy())
    assert cfg.step_backend == "measured"
    assert "aiconfigurator-core 0.12.0" in cfg.step_provenance
    assert "vllm 0.24.0" in cfg.step_provenance
    h20 = load_hardware("h20-node")
    assert build_config(h20, model, _policy()).step_backend == "roofline"
    with pytest.raises(InputError, match="GPU 'H20'") as err:
        build_config(h20, model, _policy(step_time="measured"))
    assert "\n" not in str(err.value) and "serving.step_time" in str(err.value)
    with pytest.raises(InputError, match="hf_id"):
        build_config(
            load_hardware("h100-node"), load_model("mistral-7b"), _policy(step_time="measured")
        )


def test_measured_tp2_fp8_70b() -> None:
    """Llama-3.1-70B at tp=2 on 80 GB GPUs wants FP8 weights (BF16 leaves a few thousand tokens
    of KV room, none at tp=1); at tp=4 FP8 prefill is faster than BF16 in the measured
    tables."""
    hw, model = load_hardware("h100-node"), load_model("llama-3.1-70b")
    fp8 = build_config(hw, model, _policy(tp=2, weight_dtype="fp8"))
    assert fp8.step_backend == "measured" and fp8.n_instances == 4
    assert "tp=2, weights fp8" in fp8.step_provenance
    bf16 = build_config(hw, model, _policy(tp=2, weight_dtype="bf16"))
    assert bf16.capacity_blocks * bf16.block_tokens < 10_000 < fp8.capacity_blocks
    with pytest.raises(InputError, match="no room for KV"):
        build_config(hw, model, _policy(tp=1, weight_dtype="bf16"))

    def prefill(cfg) -> float:  # noqa: ANN001
        tp = cfg.timing
        return T.step_time(4096, 4096 * 4096, 4096, 0, 0, T.prefill_attn_ns(4096, 0, tp), tp)

    f8 = build_config(hw, model, _policy(tp=4, weight_dtype="fp8"))
    b16 = build_config(hw, model, _policy(tp=4, weight_dtype="bf16"))
    assert f8.step_backend == b16.step_backend == "measured"
    assert prefill(f8) < 0.9 * prefill(b16)  # 0.81x: the all-reduce does not shrink with FP8


def test_a_gpu_measured_as_a_faster_nvlink_sibling_pays_its_own_all_reduce() -> None:
    """The H800 reads the H100's tables, the A800 the A100's: the same tables, plus the ring
    all-reduce's difference at the GPU's own NVLink on every batch token (2 per layer, 2 (tp -
    1) / tp of hidden * 2 bytes: 200 GB/s against 450 and 300 per direction); nothing at tp 1,
    nothing for a GPU measured as itself."""
    model = load_model("llama-3.1-70b")
    per_token = 80 * 2 * 2 * 7 / 8 * 8192 * 2  # bytes of all-reduce per token at tp 8

    def non_attention(hw_name: str, tp: int, n: int, m: object = model) -> tuple[float, str]:
        cfg = build_config(load_hardware(hw_name), m, _policy(tp=tp, weight_dtype="bf16"))
        assert cfg.step_backend == "measured"
        return T._non_attention_s(n, cfg.timing), cfg.step_provenance

    for slow, fast, own_bw, fast_bw in (
        ("h800-node", "h100-node", 200e9, 450e9),
        ("mooncake-a800-testbed", "a100-node", 200e9, 300e9),
    ):
        extra = per_token * (1 / own_bw - 1 / fast_bw)
        for n in (1, 512, 8192):
            got, why = non_attention(slow, 8, n)
            want, _ = non_attention(fast, 8, n)
            assert got - want == pytest.approx(n * extra, rel=1e-9)
            assert "per token of all-reduce" in why
    small = load_model("llama-3.1-8b")
    got, why = non_attention("h800-node", 1, 4096, small)
    assert got == non_attention("h100-node", 1, 4096, small)[0] and "all-reduce" not in why
    assert "all-reduce" not in non_attention("h100-node", 8, 1)[1]


def test_roofline_tp_allreduce_fp8_and_moe() -> None:
    hw, model = load_hardware("h100-node"), load_model("llama-3.1-8b")
    tp1 = build_config(hw, model, _policy(step_time="roofline")).timing
    tp4 = build_config(hw, model, _policy(step_time="roofline", tp=4)).timing
    assert tp1[T.T_AR_TOKEN] == 0 and tp1[T.T_AR_FIXED] == 0
    # 2 all-reduces per layer, ring: 2 (tp-1)/tp of hidden * 2 bytes per token over NVLink
    assert tp4[T.T_AR_TOKEN] == pytest.approx(64 * 2 * 0.75 * 4096 * 2 / 450e9)
    assert tp4[T.T_AR_FIXED] == pytest.approx(64 * 8e-6)
    fp8 = build_config(hw, model, _policy(step_time="roofline", weight_dtype="fp8")).timing
    assert fp8[T.T_RATE_PF] == pytest.approx(2 * tp1[T.T_RATE_PF], rel=0.01)  # 1979 vs 989
    assert fp8[T.T_WEIGHTS] == pytest.approx(tp1[T.T_WEIGHTS] / 2)
    # DeepSeek-V3 (671 GB at FP8) fits 8 x H200, not 8 x H100
    roof = build_config(
        load_hardware("h200-node"), load_model("deepseek-v3"), _policy(tp=8, step_time="roofline")
    ).timing
    # one decode token touches 8 of 256 experts: far fewer weight bytes than the whole model
    one = T._weights_read(1, roof)
    many = T._weights_read(8192, roof)
    assert one < 0.1 * 671e9 and many == pytest.approx(671e9, rel=0.01)


def test_kv_replication_under_tp() -> None:
    """MLA latents are on every rank; GQA KV too once tp > kv_heads (8 for Llama-3.1-8B)."""
    hw = load_hardware("h200-node")
    ds = load_model("deepseek-v3")
    assert ds.kv_replication(8) == 8
    llama = load_model("llama-3.1-8b")
    assert llama.kv_replication(4) == 1 and llama.kv_replication(8) == 1
    assert replace(llama, kv_heads=2).kv_replication(8) == 4
    policy = _policy(tp=8, step_time="roofline")
    cfg = build_config(hw, ds, policy)
    rest = kv_budget(hw, ds, policy, 8).non_kv_per_gpu  # docs/model.md, "The KV budget"
    per_gpu = hw.gpu.engine_hbm_bytes * hw.gpu_memory_utilization - rest
    free = 8 * per_gpu - ds.weight_bytes
    block = Policy().kv_bytes_per_block(ds)
    assert cfg.capacity_blocks == int(free // (block * 8))


def test_synthetic_key_not_cached() -> None:
    key = MeasuredKey("x", "y", "vllm", "0", 1, "bf16", "bf16")
    assert key.digest() != replace(key, tp=2).digest()


def test_frontend_cost_in_both_engines() -> None:
    """The front-end cost delays what the client sees, the same in both engines: a lone
    request's first token and finish by exactly that cost (the engine's schedule unchanged);
    in a closed loop of one client the next request is sent only when the last response is
    complete, so every later request is delayed by one more front-end cost."""
    for step in ("measured", "roofline"):
        base = build_config(
            load_hardware("h100-node"), load_model("llama-3.1-8b"), _policy(step_time=step)
        )
        assert base.frontend_token_s > 0  # the default front end (per request it may be 0)
        base = replace(base, n_instances=1)
        trace = BlockedTrace.from_lists([0.0, 0.0, 0.0], [300, 900, 40], [4, 2, 6], [[]] * 3, 16)
        runs = {}
        for fe in (0.0, 0.02):
            cfg = replace(base, frontend_s=fe, concurrency=1)
            ref = simulate_raw(trace, cfg, engine="reference")
            fast = simulate_raw(trace, cfg, engine="numba")
            np.testing.assert_array_equal(ref.first_token_s, fast.first_token_s)
            np.testing.assert_array_equal(ref.finish_s, fast.finish_s)
            np.testing.assert_array_equal(ref.arrival_s, fast.arrival_s)
            assert ref.busy_s.tolist() == fast.busy_s.tolist()
            runs[fe] = ref
        a, b = runs[0.0], runs[0.02]
        np.testing.assert_allclose(b.arrival_s - a.arrival_s, [0.0, 0.02, 0.04], atol=1e-12)
        np.testing.assert_allclose(
            b.first_token_s - b.arrival_s, a.first_token_s - a.arrival_s + 0.02, atol=1e-12
        )
        np.testing.assert_allclose(
            b.finish_s - b.first_token_s, a.finish_s - a.first_token_s, atol=1e-12
        )
        assert b.busy_s.tolist() == a.busy_s.tolist()


def test_cpu_overhead_adds_to_every_iteration_in_both_engines() -> None:
    """serving.cpu_overhead_s is packed into the step overhead of either backend, so a lone
    decode's TPOT rises by exactly that much and its prefill iteration too, the same in both
    engines; 0 (the default) leaves the packed array as it was."""
    hw, md = load_hardware("h100-node"), load_model("llama-3.1-8b")
    trace = BlockedTrace.from_lists([0.0], [300], [9], [[]], 16)
    for step in ("measured", "roofline"):
        runs = {}
        for cpu in (0.0, 0.043):
            cfg = build_config(hw, md, _policy(step_time=step, cpu_overhead_s=cpu))
            cfg = replace(cfg, n_instances=1)
            ref = simulate_raw(trace, cfg, engine="reference")
            fast = simulate_raw(trace, cfg, engine="numba")
            np.testing.assert_array_equal(ref.first_token_s, fast.first_token_s)
            np.testing.assert_array_equal(ref.finish_s, fast.finish_s)
            runs[cpu] = (cfg, ref)
        (c0, a), (c1, b) = runs[0.0], runs[0.043]
        base = build_config(hw, md, _policy(step_time=step))
        np.testing.assert_array_equal(c0.timing_params(), base.timing_params())
        diff = c1.timing_params() - c0.timing_params()
        assert diff[T.T_OVERHEAD] == pytest.approx(0.043, abs=1e-15)
        assert np.count_nonzero(diff) == 1
        # the prefill iteration and each of the 8 decode steps, 0.043 s longer
        np.testing.assert_allclose(b.first_token_s, a.first_token_s + 0.043, atol=1e-12)
        tpot = lambda r: (r.finish_s - r.first_token_s) / 8  # noqa: E731
        np.testing.assert_allclose(tpot(b), tpot(a) + 0.043, atol=1e-12)
