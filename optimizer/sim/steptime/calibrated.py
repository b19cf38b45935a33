"""A cluster's own step times against the measured tables: two factors a calibration fits.

The measured backend's tables are aiconfigurator-core's kernel timings on its own machines, at
its framework release (docs/model.md, "The measured backend"). A serving cluster differs from
them in ways no table records: another release of the framework, its kernels and their launch
gaps, the board's clocks and cooling, the work between kernels. ``kvtier calibrate --backend
measured`` fits how far this cluster's steps run from the tables, from the server's own
``/metrics`` (docs/calibrate.md), as two factors of a hardware profile's ``[efficiency]``:

- ``measured_memory_scale`` scales the memory-bound work: decode attention, the one-token
  prefill floor, and the share of the non-attention time spent reading weights;
- ``measured_compute_scale`` scales the compute-bound work: the share of the non-attention time
  and of prefill attention past the ridge point.

The split follows the rule the power-limit factor uses (:mod:`kvtier.sim.steptime.sustained`):
work over ``n`` tokens is compute-bound in the share ``n / (n + n*)``, where ``n*`` is the
ridge point (295 tokens on an H100 at BF16), and memory-bound in the rest. A decode step of a
few sequences is thus scaled by about the memory factor, a prefill of thousands of tokens by
about the compute factor. Both are 1 unless a profile sets them; no built-in profile does.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from kvtier.errors import InputError
from kvtier.hardware.types import Hardware
from kvtier.sim.steptime.measured import MeasuredTables


def blend(
    tokens: np.ndarray, memory_scale: float, compute_scale: float, ridge: float
) -> np.ndarray:
    """The factor of work over ``tokens`` tokens: ``memory_scale`` weighted by the memory-bound
    share ``n* / (n + n*)`` plus ``compute_scale`` weighted by the compute-bound share."""
    if not (memory_scale > 0 and compute_scale > 0 and ridge > 0):
        raise ValueError("the calibrated scales and the ridge must be positive")
    n = np.maximum(np.asarray(tokens, dtype=np.float64), 0.0)
    share = n / (n + ridge)
    return memory_scale * (1.0 - share) + compute_scale * share


def at_cluster_scale(
    tables: MeasuredTables, memory_scale: float, compute_scale: float, ridge: float
) -> MeasuredTables:
    """The tables as the calibrated cluster runs them (the same object when both are 1): the
    non-attention time by batch tokens and the prefill attention by chunk scaled by
    :func:`blend`, the decode attention and the prefill floor by ``memory_scale``."""
    if memory_scale == 1.0 and compute_scale == 1.0:
        return tables
    by_chunk = blend(tables.pq_grid, memory_scale, compute_scale, ridge)[:, None]
    return dataclasses.replace(
        tables,
        non_attn=tables.non_attn * blend(tables.tok_grid, memory_scale, compute_scale, ridge),
        prefill_attn=tables.prefill_attn * by_chunk,
        pf_floor=tables.pf_floor * memory_scale,
        decode_attn=tables.decode_attn * memory_scale,
    )


def with_step_scale(hardware: Hardware, factor: float) -> Hardware:
    """``hardware`` with its engine steps ``factor`` times as long: the measured tables' two
    factors times ``factor`` (every step exactly so), the roofline's efficiencies over it and
    its per-step cost times it (its all-reduce terms, set by the interconnect, stay). The front
    end's per-request and per-token costs are not steps and stay. ``kvtier compare
    --step-time-margin`` replays each policy so, to show whether a verdict holds when the
    cluster's steps run a little slower or faster than the model's."""
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError("the step-time factor must be positive")
    eff = hardware.efficiency
    scaled = dataclasses.replace(
        eff,
        measured_memory_scale=eff.measured_memory_scale * factor,
        measured_compute_scale=eff.measured_compute_scale * factor,
        mfu=eff.mfu / factor,
        mbu=eff.mbu / factor,
        decode_mfu=eff.decode_mfu / factor,
        step_overhead_s=eff.step_overhead_s * factor,
    )
    return dataclasses.replace(hardware, efficiency=scaled)


MAX_STEP_MARGIN = 0.5  # a --step-time-margin: a share of the step time


def check_step_margin(margin: float) -> None:
    """A step-time margin is a share of the step time, in [0, :data:`MAX_STEP_MARGIN`]."""
    if not (math.isfinite(margin) and 0.0 <= margin <= MAX_STEP_MARGIN):
        raise InputError(
            f"must be between 0 and {MAX_STEP_MARGIN:g} (a share of the step time), got {margin:g}",
            option="--step-time-margin",
        )
