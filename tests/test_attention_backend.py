"""SGLang's Triton attention kernels: the measured tables' prefill attention scaled by
aiconfigurator-core's own measured ratio of the Triton lane to the default one (docs/model.md,
"Attention back end")."""

from __future__ import annotations

import importlib.resources
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import InputError
from kvtier.export import export
from kvtier.hardware.loader import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, policy_from_dict
from kvtier.sim import timing as T
from kvtier.sim.config import build_config
from kvtier.sim.steptime import measured_key, measured_tables
from kvtier.sim.steptime.attention_backend import (
    equivalent_length,
    triton_ratio,
    with_triton_attention,
)

RTX_TABLE = "rtx_pro_6000_server/attention/sglang/0.5.14/context_attention_perf.parquet"


def _policy(**serving: object) -> Policy:
    base = {"framework": "sglang", "tp": 1, **serving}
    return replace(Policy(), serving=replace(ServingPolicy(), **base))


def _measured(isl: int, lane: str) -> float:
    """The package's own median latency of one request of ``isl`` tokens on the RTX PRO
    6000's SGLang table (40 query / 8 KV heads of 128, bf16), read here independently."""
    root = Path(str(importlib.resources.files("aiconfigurator_core"))) / "systems" / "data"
    rows = pl.read_parquet(root / RTX_TABLE).filter(
        (pl.col("num_heads") == 40)
        & (pl.col("num_key_value_heads") == 8)
        & (pl.col("head_dim") == 128)
        & (pl.col("attn_dtype") == "bfloat16")
        & (pl.col("kv_cache_dtype") == "bfloat16")
        & (pl.col("window_size") == 0)
        & (pl.col("batch_size") == 1)
        & (pl.col("isl") == isl)
        & (pl.col("kernel_source") == lane)
    )
    return float(rows["latency"].median())


def test_ratio_is_the_packages_measured_triton_over_flashinfer() -> None:
    """No A100 table holds SGLang's Triton lane: the ratio comes from the one table that
    measures it beside FlashInfer at a GQA shape of 128-wide heads, and equals its figures."""
    r = triton_ratio("a100_sxm", 128, "bf16", 4.0)
    assert r.source == "rtx_pro_6000_server sglang 0.5.14: 40/8 heads, triton over flashinfer"
    for isl in (1024, 4096, 16384):
        want = _measured(isl, "triton") / _measured(isl, "flashinfer")
        assert float(r.at(np.array(float(isl)))) == pytest.approx(want, rel=1e-12)
    assert 2.0 < float(r.at(np.array(4096.0))) < float(r.at(np.array(16384.0))) < 2.5
    # held beyond the measured lengths
    assert float(r.at(np.array(65536.0))) == float(r.at(np.array(16384.0)))


def test_a_head_size_nobody_measured_is_a_one_line_error() -> None:
    with pytest.raises(InputError) as err:
        triton_ratio("a100_sxm", 96, "bf16", 4.0)
    assert err.value.option == "serving.attention_backend"
    assert "head_dim 96" in err.value.message and "default" in err.value.message


@given(chunk=st.integers(1, 1 << 16), prefix=st.integers(0, 1 << 18))
def test_equivalent_length_does_the_same_causal_work(chunk: int, prefix: int) -> None:
    """A chunk over a cached prefix and a fresh prompt of the equivalent length attend the same
    number of query-key pairs (half the square for the fresh causal prompt)."""
    n = float(equivalent_length(np.array(chunk), np.array(prefix)))
    assert n * n / 2 == pytest.approx(chunk * prefix + chunk * chunk / 2, rel=1e-9)
    assert n >= chunk and (prefix > 0 or n == pytest.approx(chunk))


def test_only_prefill_attention_is_scaled() -> None:
    model = load_model("qwen3-8b")
    tables = measured_tables(
        measured_key(model.hf_id, "A100-SXM-40GB", "sglang", "current", 1, "bf16", "bf16")
    )
    r = triton_ratio(tables.key.system, 128, "bf16", 4.0)
    tri = with_triton_attention(tables, r)
    assert np.array_equal(tri.non_attn, tables.non_attn)
    assert np.array_equal(tri.decode_attn, tables.decode_attn)
    assert tri.pf_floor == pytest.approx(tables.pf_floor * float(r.at(np.array(1.0))))
    i, j = list(tables.pq_grid).index(4096), list(tables.pc_grid).index(12288)
    whole = tables.prefill_attn[i, j] + tables.pf_floor
    want = whole * float(r.at(equivalent_length(np.array(4096.0), np.array(12288.0))))
    assert tri.prefill_attn[i, j] + tri.pf_floor == pytest.approx(want, rel=1e-12)
    assert np.all(tri.prefill_attn >= 0)


def test_a_long_sglang_prefill_under_triton_takes_longer() -> None:
    """Qwen3-8B on the A100-40GB: a 4,096-token chunk over 28,000 cached tokens; the
    attention more than doubles, the rest of the step does not move, decode is unchanged."""
    hw, model = load_hardware("dgx-a100-40gb-mooncake"), load_model("qwen3-8b")
    fa = build_config(hw, model, _policy())
    tri = build_config(hw, model, _policy(attention_backend="triton"))
    assert fa.step_backend == tri.step_backend == "measured"
    assert "Triton's measured ratio (rtx_pro_6000_server sglang 0.5.14" in tri.step_provenance
    assert "Triton" not in fa.step_provenance

    def chunk(tp: np.ndarray, prefix: int) -> float:
        ctx = 4096 * (4096 + 2 * prefix) // 2
        return T.step_time(4096, ctx, 4096, 0, 0, T.prefill_attn_ns(4096, prefix, tp), tp)

    def decode(tp: np.ndarray) -> float:
        return T.step_time(16, 0, 0, 16, 16 * 4096, 0, tp)

    slow = chunk(tri.timing, 28000) / chunk(fa.timing, 28000)
    assert 1.3 < slow < 2.37  # attention is part of the step, scaled by at most 2.37
    assert chunk(tri.timing, 28000) - chunk(fa.timing, 28000) > (
        chunk(tri.timing, 0) - chunk(fa.timing, 0)
    )
    assert decode(tri.timing) == decode(fa.timing)
    roof = build_config(hw, model, _policy(attention_backend="triton", step_time="roofline"))
    assert "attention_backend triton not modelled" in roof.step_provenance


def test_triton_is_sglangs_option_only() -> None:
    with pytest.raises(InputError) as err:
        policy_from_dict(
            {"format": "kvtier-policy/1", "serving": {"attention_backend": "triton"}}, "p.toml"
        )
    assert "serving.attention_backend" in str(err.value) and "SGLang" in str(err.value)
    with pytest.raises(InputError) as err:
        policy_from_dict(
            {
                "format": "kvtier-policy/1",
                "serving": {"framework": "sglang", "attention_backend": "flash"},
            },
            "p.toml",
        )
    assert "default" in str(err.value) and "triton" in str(err.value)


def test_sglang_export_launches_the_simulated_kernels() -> None:
    hw, model = load_hardware("dgx-a100-40gb-mooncake"), load_model("qwen3-8b")
    out = export(_policy(attention_backend="triton"), "sglang", hw, model)
    script = out.files["sglang-serve.sh"]
    assert "--attention-backend triton" in " ".join(script.split())
    plain = export(_policy(), "sglang", hw, model)
    assert "--attention-backend" not in plain.files["sglang-serve.sh"]
    vllm = export(
        replace(
            Policy(),
            serving=replace(ServingPolicy(), framework="sglang", attention_backend="triton"),
        ),
        "vllm",
        hw,
        model,
    )
    assert any("attention_backend = triton" in str(n) for n in vllm.notes)
