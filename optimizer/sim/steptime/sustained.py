"""Compute at the power limit: the measured tables' short bursts against a serving engine's hours.

aiconfigurator's collector times each kernel over a few CUDA-graph replays at the maximum
application clocks (milliseconds of work). A serving engine runs its prefills back to back for
seconds at a time, and a compute-bound GEMM at full clocks draws more than an H100's or
H200's 700 W: the board lowers its clocks to stay at the limit. aiconfigurator's own power
tables, which run each kernel for about a second, show it: on an H200 the GEMMs that drew the
limit took a median 1.118x as long as the same shapes in its short-burst tables, while the
memory-bound ones (at a third of the limit) did not slow (``scripts/sustained_compute_scale.py``;
docs/sources.md [AIC-power-tables]; docs/model.md, "Compute at the power limit").

A GPU profile's ``sustained_compute_scale`` is that factor for BF16 tensor-core work and
``sustained_compute_scale_fp8`` for FP8 (1, no change, where the power tables do not measure
it: FP8 on Hopper). The weights' type picks the GEMMs' factor, the KV's the prefill
attention's. The factor applies to the compute-bound share of a step's work, which grows with
the tokens the kernel multiplies: a GEMM over ``n`` tokens is compute-bound past the ridge
point ``n* = peak FLOP/s x weight bytes per parameter / (2 x HBM bytes/s)`` (295 tokens on an
H100 at BF16 or FP8), and its time is scaled by ``1 + (scale - 1) x n / (n + n*)``: about 1
for a decode step of a few sequences, the full factor for a prefill of thousands of tokens.
Prefill attention, whose intensity grows with the chunk, is scaled by the same rule over its
chunk; decode attention (memory-bound) is not. The all-reduce inside the non-attention time is
scaled with it (its kernels run on the same SMs). The factor is stateless: how soon the clocks
drop after an idle spell is not modelled (docs/model.md).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from kvtier.hardware.types import GPUProfile
from kvtier.sim.steptime.measured import MeasuredTables


def scale_for(gpu: GPUProfile, dtype: str) -> float:
    """The GPU's factor for tensor-core work in ``dtype`` (``fp8``, else BF16)."""
    return gpu.sustained_compute_scale_fp8 if dtype == "fp8" else gpu.sustained_compute_scale


def ridge_tokens(peak_flops: float, weight_bytes_per_param: float, hbm_bw: float) -> float:
    """Tokens at which a GEMM's FLOPs take as long as reading its weights: each weight is read
    once per step and used in ``2 x tokens`` FLOPs."""
    if not (peak_flops > 0 and weight_bytes_per_param > 0 and hbm_bw > 0):
        raise ValueError("peak FLOP/s, weight bytes and HBM bandwidth must be positive")
    return peak_flops * weight_bytes_per_param / (2.0 * hbm_bw)


def compute_factor(tokens: np.ndarray, scale: float, ridge: float) -> np.ndarray:
    """The slowdown of work over ``tokens`` tokens at the power limit: ``1 + (scale - 1) x
    tokens / (tokens + ridge)`` (1 for no tokens, ``scale`` in the limit)."""
    if not (np.isfinite(scale) and scale >= 1.0 and ridge > 0):
        raise ValueError("the sustained compute scale must be >= 1 and the ridge positive")
    n = np.maximum(np.asarray(tokens, dtype=np.float64), 0.0)
    return 1.0 + (scale - 1.0) * n / (n + ridge)


def at_power_limit(
    tables: MeasuredTables, gemm_scale: float, attention_scale: float, ridge: float
) -> MeasuredTables:
    """The tables as a serving engine runs them at the power limit: the non-attention time by
    batch tokens scaled by :func:`compute_factor` at ``gemm_scale`` (the factor of the
    weights' GEMM type), the prefill attention by chunk at ``attention_scale`` (the KV's);
    the decode attention and the one-token prefill floor unchanged."""
    if gemm_scale == 1.0 and attention_scale == 1.0:
        return tables
    non_attn = tables.non_attn * compute_factor(tables.tok_grid, gemm_scale, ridge)
    by_chunk = compute_factor(tables.pq_grid, attention_scale, ridge)[:, None]
    return dataclasses.replace(
        tables, non_attn=non_attn, prefill_attn=tables.prefill_attn * by_chunk
    )
