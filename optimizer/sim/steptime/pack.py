"""Pack step-time parameters into the one float64 array both simulators read, and check it.

The layout is :mod:`kvtier.sim.timing`'s (header, MoE distinct-expert fractions, then the
measured tables). :func:`validate_timing` is what the engine runs before the array enters a
numba function: every value finite, rates positive, grids strictly ascending and tables of the
declared shapes, so a lookup can never index outside the array or divide by zero.
"""

from __future__ import annotations

import numpy as np

from kvtier.sim import timing as T
from kvtier.sim.steptime.measured import PF_DATA_MAX, MeasuredTables


def roofline_params(
    *,
    flops_per_token: float,
    attn_coef: float,
    prefill_rate: float,
    decode_rate: float,
    weight_bytes: float,
    kv_bytes_per_token: float,
    mem_rate: float,
    step_overhead_s: float,
    ar_s_per_token: float = 0.0,
    ar_fixed_s: float = 0.0,
    expert_bytes: float = 0.0,
    moe_fraction: np.ndarray | None = None,
    frontend_s: float = 0.0,
    frontend_token_s: float = 0.0,
) -> np.ndarray:
    """The roofline's packed array (``T_BACKEND`` = roofline, no tables)."""
    frac = np.zeros(0) if moe_fraction is None else np.asarray(moe_fraction, dtype=np.float64)
    head = np.zeros(T.HEADER)
    head[T.T_FLOPS] = flops_per_token
    head[T.T_ATTN_COEF] = attn_coef
    head[T.T_RATE_PF] = prefill_rate
    head[T.T_WEIGHTS] = weight_bytes
    head[T.T_KV_BYTES] = kv_bytes_per_token
    head[T.T_MEM_RATE] = mem_rate
    head[T.T_OVERHEAD] = step_overhead_s
    head[T.T_BACKEND] = T.BACKEND_ROOFLINE
    head[T.T_RATE_DEC] = decode_rate
    head[T.T_AR_TOKEN] = ar_s_per_token
    head[T.T_AR_FIXED] = ar_fixed_s
    head[T.T_EXPERT_BYTES] = expert_bytes
    head[T.T_N_MOE] = frac.size
    head[T.T_FRONTEND] = frontend_s
    head[T.T_FRONTEND_TOKEN] = frontend_token_s
    return np.concatenate([head, frac])


def _integral_end(grid: np.ndarray, name: str) -> int:
    last = float(grid[-1])
    if last != int(last) or last < 1:
        raise ValueError(f"step-time grid {name} must end at a whole count >= 1")
    return int(last)


def dense_non_attention(t: MeasuredTables) -> np.ndarray:
    """The non-attention time at every batch token count 0..max of the grid (the grid
    interpolated piecewise-linearly; below its first point, its first value)."""
    n = _integral_end(t.tok_grid, "tokens")
    return np.interp(np.arange(n + 1, dtype=np.float64), t.tok_grid, t.non_attn)


def dense_decode_rows(t: MeasuredTables) -> np.ndarray:
    """Decode attention by batch size 0..max of the batch grid: for each cell ``j`` of the
    context grid, the value at its lower point and the slope to the next (shape ``(batches,
    cells, 2)``), each context column interpolated along the batch grid at every whole size."""
    n = _integral_end(t.db_grid, "decode batch")
    b = np.arange(n + 1, dtype=np.float64)
    vals = np.stack(
        [np.interp(b, t.db_grid, t.decode_attn[:, j]) for j in range(t.dc_grid.size)], 1
    )
    slope = np.diff(vals, axis=1) / np.diff(t.dc_grid)
    return np.ascontiguousarray(np.stack([vals[:, :-1], slope], axis=2))


def pack_measured(
    base: np.ndarray, t: MeasuredTables, step_overhead_s: float, extra_s_per_token: float = 0.0
) -> np.ndarray:
    """``base`` (a roofline array, kept for the parts that read the roofline's scalars) with the
    measured tables appended and the backend switched to measured: the non-attention time and
    the decode-attention rows dense by token count and batch size (one load, no search, on the
    hot path), the prefill attention on its grids. ``extra_s_per_token`` is added to the
    non-attention time of every batch token (a GPU measured as a sibling with faster NVLink:
    :func:`kvtier.sim.steptime.backend.nvlink_extra_s_per_token`)."""
    if not (np.isfinite(extra_s_per_token) and extra_s_per_token >= 0):
        raise ValueError("the extra time per batch token must be finite and >= 0")
    head = base[: T.HEADER].copy()
    frac = base[T.HEADER : T.HEADER + int(base[T.T_N_MOE])]
    head[T.T_BACKEND] = T.BACKEND_MEASURED
    head[T.T_OVERHEAD] = step_overhead_s
    na = dense_non_attention(t)
    if extra_s_per_token:
        na += extra_s_per_token * np.arange(na.size, dtype=np.float64)
    da = dense_decode_rows(t)
    head[T.T_N_TOK] = na.size
    head[T.T_N_PQ] = t.pq_grid.size
    head[T.T_N_PC] = t.pc_grid.size
    head[T.T_N_DB] = da.shape[0]
    head[T.T_N_DC] = t.dc_grid.size
    head[T.T_PF_FLOOR] = t.pf_floor
    head[T.T_PF_MAX] = PF_DATA_MAX
    head[T.T_DC_MAX] = t.dc_grid[-1]
    o = T._offsets(head)
    head[T.T_O_DC] = o[5]
    head[T.T_O_DA] = o[6]
    parts = [head, frac, na, t.pq_grid, t.pc_grid, t.prefill_attn.ravel()]
    parts += [t.dc_grid, da.ravel()]
    return np.ascontiguousarray(np.concatenate(parts), dtype=np.float64)


def _ascending(a: np.ndarray, name: str, positive: bool) -> None:
    if a.size < 2 or not np.all(np.diff(a) > 0):
        raise ValueError(f"step-time grid {name} must hold >= 2 strictly ascending values")
    if positive and a[0] <= 0:
        raise ValueError(f"step-time grid {name} must be positive")
    if not positive and a[0] < 0:
        raise ValueError(f"step-time grid {name} must be non-negative")


def validate_timing(tp: np.ndarray) -> None:
    """Refuse a packed array that a kernel could misread (``ValueError``: a programming error)."""
    if tp.dtype != np.float64 or tp.ndim != 1 or tp.size < T.HEADER:
        raise ValueError("timing must be a 1-D float64 array with the full header")
    if not np.all(np.isfinite(tp)):
        raise ValueError("timing parameters must be finite")
    if tp[T.T_RATE_PF] <= 0 or tp[T.T_RATE_DEC] <= 0 or tp[T.T_MEM_RATE] <= 0:
        raise ValueError("timing rates must be positive")
    if min(tp[T.T_OVERHEAD], tp[T.T_AR_TOKEN], tp[T.T_AR_FIXED], tp[T.T_EXPERT_BYTES]) < 0:
        raise ValueError("timing overheads and byte counts must be >= 0")
    if tp[T.T_FRONTEND] < 0 or tp[T.T_FRONTEND_TOKEN] < 0:
        raise ValueError("the front-end costs must be >= 0")
    counts = tp[T.T_N_MOE : T.T_N_DC + 1]
    if np.any(counts < 0) or np.any(counts != np.floor(counts)):
        raise ValueError("timing section lengths must be non-negative integers")
    n_moe = int(tp[T.T_N_MOE])
    if n_moe and np.any(
        (tp[T.HEADER : T.HEADER + n_moe] < 0) | (tp[T.HEADER : T.HEADER + n_moe] > 1)
    ):
        raise ValueError("MoE distinct-expert fractions must lie in [0, 1]")
    backend = tp[T.T_BACKEND]
    if backend == T.BACKEND_ROOFLINE:
        if tp.size != T.HEADER + n_moe:
            raise ValueError("roofline timing array has trailing values")
        return
    if backend != T.BACKEND_MEASURED:
        raise ValueError(f"unknown step-time backend code {backend}")
    o = T._offsets(tp)
    n_tok, n_pq, n_pc, n_db, n_dc = (int(x) for x in tp[T.T_N_TOK : T.T_N_DC + 1])
    if n_tok < 2 or n_db < 2:
        raise ValueError("measured dense tables need >= 2 entries (counts 0 and 1)")
    if tp.size != o[6] + 2 * n_db * (n_dc - 1):
        raise ValueError("measured timing array does not match its declared table shapes")
    if tp[T.T_O_DC] != o[5] or tp[T.T_O_DA] != o[6]:
        raise ValueError("measured timing header offsets do not match its sections")
    _ascending(tp[o[2] : o[2] + n_pq], "prefill chunk", True)
    _ascending(tp[o[3] : o[3] + n_pc], "prefill prefix", False)
    dc = tp[o[5] : o[5] + n_dc]
    _ascending(dc, "decode context", True)
    if tp[T.T_DC_MAX] != dc[-1]:
        raise ValueError("measured decode context maximum does not match its grid")
    rows = tp[o[6] :].reshape(n_db, n_dc - 1, 2)
    values = np.concatenate(
        [
            tp[o[1] : o[1] + n_tok],
            tp[o[4] : o[4] + n_pq * n_pc],
            rows[:, :, 0].ravel(),
            tp[T.T_PF_FLOOR : T.T_PF_FLOOR + 1],
        ]
    )
    if np.any(values < 0):
        raise ValueError("measured step times must be >= 0")
    if tp[T.T_PF_MAX] <= 0:
        raise ValueError("measured prefill data range must be positive")
