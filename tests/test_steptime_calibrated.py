"""A calibrated cluster's factors on the measured tables: memory-bound work by
``measured_memory_scale``, compute-bound work by ``measured_compute_scale``
(:mod:`kvtier.sim.steptime.calibrated`; docs/calibrate.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.errors import InputError
from kvtier.hardware.loader import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy
from kvtier.sim import timing as T
from kvtier.sim.config import build_config
from kvtier.sim.steptime.calibrated import at_cluster_scale, blend

RIDGE = 989e12 * 2.0 / (2 * 3350e9)  # the H100's at BF16


def _calibrated(memory: float, compute: float):  # noqa: ANN202
    hw = load_hardware("h100-node")
    eff = replace(hw.efficiency, measured_memory_scale=memory, measured_compute_scale=compute)
    return replace(hw, efficiency=eff)


@given(
    memory=st.floats(0.25, 4.0),
    compute=st.floats(0.25, 4.0),
    tokens=st.lists(st.integers(0, 1 << 20), min_size=2, max_size=20),
)
def test_blend_moves_from_the_memory_to_the_compute_scale(
    memory: float, compute: float, tokens: list[int]
) -> None:
    n = np.sort(np.array(tokens, dtype=np.float64))
    f = blend(n, memory, compute, RIDGE)
    lo, hi = min(memory, compute), max(memory, compute)
    assert np.all(f >= lo - 1e-12) and np.all(f <= hi + 1e-12)
    # monotone from one end to the other
    steps = np.diff(f) * (1.0 if compute >= memory else -1.0)
    assert np.all(steps >= -1e-12)
    assert blend(np.array([0.0]), memory, compute, RIDGE)[0] == pytest.approx(memory)
    mid = blend(np.array([RIDGE]), memory, compute, RIDGE)[0]
    assert mid == pytest.approx((memory + compute) / 2)


def test_blend_refuses_a_nonpositive_scale() -> None:
    with pytest.raises(ValueError):
        blend(np.array([1.0]), 0.0, 1.0, RIDGE)


def test_tables_scaled_by_their_kind_of_work() -> None:
    from kvtier.sim.steptime import measured_key, measured_tables

    model = load_model("llama-3.1-8b")
    tables = measured_tables(
        measured_key(model.hf_id, "H100-SXM", "vllm", "current", 1, "bf16", "bf16")
    )
    assert at_cluster_scale(tables, 1.0, 1.0, RIDGE) is tables
    out = at_cluster_scale(tables, 1.2, 0.9, RIDGE)
    share = tables.tok_grid / (tables.tok_grid + RIDGE)
    np.testing.assert_allclose(out.non_attn, tables.non_attn * (1.2 * (1 - share) + 0.9 * share))
    chunk = tables.pq_grid / (tables.pq_grid + RIDGE)
    np.testing.assert_allclose(
        out.prefill_attn, tables.prefill_attn * (1.2 * (1 - chunk) + 0.9 * chunk)[:, None]
    )
    np.testing.assert_allclose(out.decode_attn, tables.decode_attn * 1.2)
    assert out.pf_floor == pytest.approx(tables.pf_floor * 1.2)


def test_a_decode_step_takes_the_memory_scale_a_long_prefill_the_compute_scale() -> None:
    model = load_model("llama-3.1-8b")
    policy = Policy()
    base = build_config(_calibrated(1.0, 1.0), model, policy)
    cal = build_config(_calibrated(1.25, 1.1), model, policy)
    assert base.step_backend == cal.step_backend == "measured"
    assert "calibrated" not in base.step_provenance
    assert "calibrated x1.25 memory-bound and x1.1 compute-bound work" in cal.step_provenance

    def decode(tp: np.ndarray) -> float:
        return T.step_time(1, 0, 0, 1, 4096, 0, tp)

    def prefill(tp: np.ndarray) -> float:
        return T.step_time(16384, 16384 * 16384, 16384, 0, 0, T.prefill_attn_ns(16384, 0, tp), tp)

    # the per-step overhead and front-end terms are not scaled: compare the GPU work only
    over = float(base.timing[T.T_OVERHEAD])
    assert over == float(cal.timing[T.T_OVERHEAD])
    ratio_decode = (decode(cal.timing) - over) / (decode(base.timing) - over)
    assert ratio_decode == pytest.approx(1.25 * RIDGE / (1 + RIDGE) + 1.1 / (1 + RIDGE), rel=0.01)
    ratio_prefill = (prefill(cal.timing) - over) / (prefill(base.timing) - over)
    assert 1.1 <= ratio_prefill < 1.1 + 0.15 * RIDGE / (16384 + RIDGE) + 1e-3
    # the roofline does not read them
    roof = replace(policy, serving=replace(ServingPolicy(), step_time="roofline"))
    assert np.array_equal(
        build_config(_calibrated(1.0, 1.0), model, roof).timing,
        build_config(_calibrated(1.25, 1.1), model, roof).timing,
    )


@pytest.mark.parametrize("key", ["measured_memory_scale", "measured_compute_scale"])
@pytest.mark.parametrize(("value", "why"), [(0, "must be > 0"), (11, "must be <= 10")])
def test_profile_keys_are_checked(tmp_path: Path, key: str, value: float, why: str) -> None:
    text = Path(str(load_hardware("h100-node").source)).read_text()
    assert "[efficiency]" in text
    bad = tmp_path / "hw.toml"
    bad.write_text(text.replace("[efficiency]", f"[efficiency]\n{key} = {value}"))
    with pytest.raises(InputError, match=f"key 'efficiency.{key}': {why}"):
        load_hardware(str(bad))


@pytest.mark.parametrize("step_time", ["measured", "roofline"])
def test_a_step_scale_makes_every_step_that_much_longer(step_time: str) -> None:
    """At tp 1 (no all-reduce term), on either backend: a decode step and a long prefill
    each take exactly 1.1x as long; the roofline's per-step cost is part of the step."""
    from kvtier.sim.steptime.calibrated import with_step_scale

    model = load_model("llama-3.1-8b")
    policy = replace(Policy(), serving=replace(ServingPolicy(), step_time=step_time))
    hw = load_hardware("h100-node")
    base = build_config(hw, model, policy)
    slow = build_config(with_step_scale(hw, 1.1), model, policy)
    assert base.step_backend == slow.step_backend == step_time

    def steps(tp: np.ndarray | None, cfg) -> tuple[float, float]:  # noqa: ANN001
        p = cfg.timing_params()
        decode = T.step_time(8, 0, 0, 8, 8 * 4096, 0, p)
        prefill = T.step_time(8192, 8192 * 8192, 8192, 0, 0, T.prefill_attn_ns(8192, 0, p), p)
        return decode, prefill

    for a, b in zip(steps(None, base), steps(None, slow), strict=True):
        assert b == pytest.approx(1.1 * a, rel=1e-9)
    with pytest.raises(ValueError):
        with_step_scale(hw, 0.0)
