"""Compute at the power limit: the measured tables' compute-bound share slowed by the GPU's
``sustained_compute_scale`` (docs/model.md, "Compute at the power limit")."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import InputError
from kvtier.hardware.loader import load_gpu, load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy
from kvtier.sim import timing as T
from kvtier.sim.config import build_config
from kvtier.sim.steptime.sustained import at_power_limit, compute_factor, ridge_tokens


def _policy(**serving: object) -> Policy:
    return replace(Policy(), serving=replace(ServingPolicy(), **serving))


def test_ridge_is_where_flops_meet_the_weight_read() -> None:
    """H100: 989 TFLOP/s BF16 over 3.35 TB/s with 2-byte weights, or FP8 at twice the peak
    and 1-byte weights: about 295 tokens either way."""
    assert ridge_tokens(989e12, 2.0, 3350e9) == pytest.approx(295.2, abs=0.1)
    assert ridge_tokens(1979e12, 1.0, 3350e9) == pytest.approx(295.4, abs=0.1)
    with pytest.raises(ValueError):
        ridge_tokens(0.0, 2.0, 3350e9)


@given(
    scale=st.floats(1.0, 2.0),
    ridge=st.floats(1.0, 1e4),
    tokens=st.lists(st.integers(0, 1 << 20), min_size=2, max_size=20),
)
def test_factor_grows_from_one_to_the_scale(scale: float, ridge: float, tokens: list[int]) -> None:
    n = np.sort(np.array(tokens, dtype=np.float64))
    f = compute_factor(n, scale, ridge)
    assert np.all(f >= 1.0) and np.all(f <= scale + 1e-12)
    assert np.all(np.diff(f) >= -1e-12)
    assert compute_factor(np.array([0.0]), scale, ridge)[0] == 1.0
    assert compute_factor(np.array([ridge]), scale, ridge)[0] == pytest.approx(1 + (scale - 1) / 2)


def test_factor_refuses_a_speed_up() -> None:
    with pytest.raises(ValueError):
        compute_factor(np.array([1.0]), 0.9, 295.0)


def test_tables_scaled_by_tokens_and_chunk_decode_untouched() -> None:
    hw, model = load_hardware("h100-node"), load_model("llama-3.1-8b")
    cfg = build_config(hw, model, _policy())
    assert cfg.step_backend == "measured"
    from kvtier.sim.steptime import measured_key, measured_tables

    tables = measured_tables(
        measured_key(model.hf_id, "H100-SXM", "vllm", "current", 1, "bf16", "bf16")
    )
    assert at_power_limit(tables, 1.0, 1.0, 295.0) is tables
    hot = at_power_limit(tables, 1.2, 1.1, 295.0)
    want = tables.non_attn * (1 + 0.2 * tables.tok_grid / (tables.tok_grid + 295.0))
    np.testing.assert_allclose(hot.non_attn, want, rtol=1e-12)
    chunk = (1 + 0.1 * tables.pq_grid / (tables.pq_grid + 295.0))[:, None]
    np.testing.assert_allclose(hot.prefill_attn, tables.prefill_attn * chunk, rtol=1e-12)
    assert np.array_equal(hot.decode_attn, tables.decode_attn)
    assert hot.pf_floor == tables.pf_floor


def test_a_long_prefill_slows_by_the_scale_a_small_decode_hardly() -> None:
    """The H100's 1.118: a prefill of 8,192 tokens takes 1.114x as long as in the short-burst
    tables, a decode step of 16 sequences 1.006x; a GPU without a power table is unchanged."""
    hw, model = load_hardware("h100-node"), load_model("llama-3.1-8b")
    assert hw.gpu.sustained_compute_scale == pytest.approx(1.118)
    cool_gpu = replace(hw.gpu, sustained_compute_scale=1.0)
    hot = build_config(hw, model, _policy())
    cool = build_config(replace(hw, gpu=cool_gpu), model, _policy())
    assert "GEMMs x1.118 and prefill attention x1.118 at the power limit" in hot.step_provenance
    assert "power limit" not in cool.step_provenance

    def prefill(tp: np.ndarray) -> float:
        return T.step_time(8192, 8192 * 8192, 8192, 0, 0, T.prefill_attn_ns(8192, 0, tp), tp)

    def decode(tp: np.ndarray) -> float:
        return T.step_time(16, 0, 0, 16, 16 * 4096, 0, tp)

    ridge = 989e12 * 2.0 / (2 * 3350e9)
    assert prefill(hot.timing) / prefill(cool.timing) == pytest.approx(
        1 + 0.118 * 8192 / (8192 + ridge), rel=2e-3
    )
    ratio = decode(hot.timing) / decode(cool.timing)
    assert 1.0 < ratio < 1 + 0.118 * 16 / (16 + ridge) + 1e-9
    rf = build_config(hw, model, _policy(step_time="roofline"))
    rf_cool = build_config(replace(hw, gpu=cool_gpu), model, _policy(step_time="roofline"))
    assert np.array_equal(rf.timing, rf_cool.timing)  # the roofline is not scaled


def test_each_gemm_type_takes_its_own_factor() -> None:
    """FP8 weights and KV take the FP8 factor: 1 on the H100 (not measured on Hopper), so an
    FP8 model's steps are the short-burst tables'; the B200's own 1.032 where it has one."""
    hw, model = load_hardware("h100-node"), load_model("llama-3.1-70b")
    assert hw.gpu.sustained_compute_scale_fp8 == 1.0
    fp8 = build_config(hw, model, _policy(tp=2, weight_dtype="fp8"))
    fp8_kv = replace(
        Policy(), kv_dtype="fp8", serving=replace(ServingPolicy(), tp=2, weight_dtype="fp8")
    )
    cool_gpu = replace(hw.gpu, sustained_compute_scale=1.0)
    cool = build_config(replace(hw, gpu=cool_gpu), model, _policy(tp=2, weight_dtype="fp8"))
    n = 8192
    tok = T._non_attention_s(n, fp8.timing)
    assert tok == T._non_attention_s(n, cool.timing)  # FP8 GEMMs unchanged on the H100
    assert "GEMMs x1 and prefill attention x1.118" in fp8.step_provenance  # BF16 KV
    both = build_config(hw, model, fp8_kv)
    assert "power limit" not in both.step_provenance  # FP8 weights and KV: nothing known
    b200 = load_gpu("b200")
    assert (b200.sustained_compute_scale, b200.sustained_compute_scale_fp8) == (1.132, 1.032)


@pytest.mark.parametrize("key", ["sustained_compute_scale", "sustained_compute_scale_fp8"])
@pytest.mark.parametrize(("value", "why"), [(0.9, "must be >= 1"), (2.5, "must be <= 2")])
def test_profile_keys_are_checked(tmp_path: Path, key: str, value: float, why: str) -> None:
    text = Path(str(load_gpu("h100-sxm").source)).read_text()
    bad = tmp_path / "gpu.toml"
    bad.write_text(
        "\n".join(line for line in text.splitlines() if not line.startswith(key + " "))
        + f"\n{key} = {value}\n"
    )
    with pytest.raises(InputError, match=f"key '{key}': {why}"):
        load_gpu(bad)
