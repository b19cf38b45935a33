"""Step-time formulas, written once for both simulators.

The numba engine compiles these very functions (``kvtier.sim.nb``), and the reference calls
them as Python; the operations and their order are the same, so both give bit-identical times.

Every parameter of a replay's step time travels as one packed float64 array (``timing``,
built by :mod:`kvtier.sim.steptime.pack`), so the kernels carry a single array whichever
backend produced it. Its header (``T_*`` indices below) holds the roofline's scalars, the
backend code and the lengths of the tables that follow it.

Per iteration the kernels accumulate integers only, so no float sum depends on the order in
which requests are scheduled:

- ``tokens``: prefill and decode tokens; ``attn = sum q * (2*ctx + q)`` (exact in int64;
  ``4*L*H*d*sum(q*(ctx + q/2)) == (2*L*H*d) * attn``); ``kv_read`` the KV tokens read;
- ``n_dec`` / ``dec_kv``: decode requests and the KV tokens they attend to (``sum ctx+1``);
- ``pf_ns``: the measured backend's prefill attention of each prefill request, looked up by
  (chunk, prefix) and rounded to integer nanoseconds (:func:`prefill_attn_ns`), and ``pf_ext``
  how many of those lookups lay beyond the measured data.

Backends: ``roofline`` (``max(compute, memory) + all-reduce + overhead``, with separate prefill
and decode efficiencies and MoE weights read as the distinct experts a batch touches) and
``measured`` (tables of measured operator times: non-attention time by batch tokens, prefill
attention by chunk and prefix, decode attention by batch and mean context; docs/model.md). The
measured non-attention time is packed dense, one entry per batch token count, and the decode
attention as one row per batch size (each cell of the context grid as its value and slope), so
that a step finds both without searching the token or batch axes (a decode step searches only
the 15-point context grid).

Both backends add front-end costs to the times a client sees, per request (``T_FRONTEND``:
HTTP and the rest) and per prompt token (``T_FRONTEND_TOKEN``: tokenization, and vLLM's
detokenizer priming on the prompt): a request's first token and its finish are recorded
``T_FRONTEND + T_FRONTEND_TOKEN * prompt tokens`` seconds after the engine's iteration produced
them. The engine's schedule does not wait for them (vLLM's API server runs in its own process,
beside the engine core), but a closed-loop client does: its next request is sent when the last
one's response is complete.
"""

from __future__ import annotations

import numpy as np

# header of the packed ``timing`` array
T_FLOPS = 0  # flops per token: 2 * active params
T_ATTN_COEF = 1  # 2 * layers * query heads * head_dim
T_RATE_PF = 2  # prefill compute rate: tp * peak FLOP/s * prefill MFU
T_WEIGHTS = 3  # weight bytes read every step (dense part, whole replica)
T_KV_BYTES = 4  # KV bytes per token
T_MEM_RATE = 5  # tp * HBM bytes/s * MBU
T_OVERHEAD = 6  # seconds per step (scheduler, launch)
T_BACKEND = 7  # BACKEND_ROOFLINE or BACKEND_MEASURED
T_RATE_DEC = 8  # decode compute rate: tp * peak FLOP/s * decode MFU
T_AR_TOKEN = 9  # all-reduce seconds per batch token (tp > 1)
T_AR_FIXED = 10  # all-reduce seconds per step (latency of 2 all-reduces per layer)
T_EXPERT_BYTES = 11  # bytes of every routed expert of every MoE layer (0: dense)
T_N_MOE = 12  # entries of the distinct-expert fraction by batch tokens
T_N_TOK = 13  # measured: non-attention entries, dense by batch tokens (0, 1, ..., n - 1)
T_N_PQ = 14  # measured: prefill-attention chunk grid
T_N_PC = 15  # measured: prefill-attention prefix grid
T_N_DB = 16  # measured: decode-attention rows, dense by batch size (0, 1, ..., n - 1)
T_N_DC = 17  # measured: decode-attention context grid
T_PF_FLOOR = 18  # measured: seconds of an iteration's prefill attention beyond the per-request sum
T_PF_MAX = 19  # measured: chunk + prefix covered by the context-attention data
T_FRONTEND = 20  # seconds per request outside the engine (HTTP, tokenization, detokenization)
T_O_DC = 21  # measured: offset of the decode context grid (see _offsets)
T_O_DA = 22  # measured: offset of the decode rows (value and slope per batch size and cell)
T_DC_MAX = 23  # measured: the decode context grid's last point
# seconds per prompt token outside the engine (tokenization; vLLM: the detokenizer's priming)
T_FRONTEND_TOKEN = 24
HEADER = 25

BACKEND_ROOFLINE = 0
BACKEND_MEASURED = 1


def _cell(x: float, tp: np.ndarray, off: int, n: int) -> tuple[int, float]:
    """Grid cell (lower index) and weight of ``x`` clamped to the grid at ``tp[off:off+n]``."""
    if x <= tp[off]:
        return 0, 0.0
    if x >= tp[off + n - 1]:
        return n - 2, 1.0
    lo = 0
    hi = n - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tp[off + mid] <= x:
            lo = mid
        else:
            hi = mid
    return lo, (x - tp[off + lo]) / (tp[off + hi] - tp[off + lo])


def _interp2(
    x: float, y: float, tp: np.ndarray, ox: int, nx: int, oy: int, ny: int, ov: int
) -> float:
    """Bilinear table ``tp[ov:ov+nx*ny]`` (row-major, x rows) at (x, y) clamped to the grids."""
    i, wx = _cell(x, tp, ox, nx)
    j, wy = _cell(y, tp, oy, ny)
    a = tp[ov + i * ny + j]
    b = tp[ov + i * ny + j + 1]
    c = tp[ov + (i + 1) * ny + j]
    d = tp[ov + (i + 1) * ny + j + 1]
    top = a + wy * (b - a)
    bottom = c + wy * (d - c)
    return top + wx * (bottom - top)


def _offsets(tp: np.ndarray) -> tuple[int, int, int, int, int, int, int]:
    """Start of each packed section: moe, na (dense), pq, pc, pa, dc, da (dense rows). The
    decode sections' offsets are also in the header (``T_O_DC``, ``T_O_DA``) for the hot path;
    the packer writes, and :func:`kvtier.sim.steptime.pack.validate_timing` checks, both."""
    n_moe = int(tp[T_N_MOE])
    n_tok = int(tp[T_N_TOK])
    n_pq = int(tp[T_N_PQ])
    n_pc = int(tp[T_N_PC])
    n_dc = int(tp[T_N_DC])
    o_moe = HEADER
    o_na = o_moe + n_moe
    o_pq = o_na + n_tok
    o_pc = o_pq + n_pq
    o_pa = o_pc + n_pc
    o_dc = o_pa + n_pq * n_pc
    o_da = o_dc + n_dc
    return o_moe, o_na, o_pq, o_pc, o_pa, o_dc, o_da


def _grid_cell(x: float, tp: np.ndarray, off: int, n: int) -> int:
    """The last cell ``j`` (``0 <= j <= n - 2``) of the ascending grid ``tp[off:off+n]`` whose
    lower point is at or below ``x`` (0 below the grid)."""
    lo = 0
    hi = n - 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tp[off + mid] <= x:
            lo = mid
        else:
            hi = mid
    return lo


def prefill_attn_s(q: int, ctx: int, tp: np.ndarray) -> float:
    """Measured attention seconds of a ``q``-token chunk after ``ctx`` cached or computed tokens,
    less the iteration's shared floor (``T_PF_FLOOR``). Beyond the data the time scales with the
    attention FLOPs: linearly in ``2*ctx + q`` for a longer prefix, as ``q**2`` for a longer chunk.
    """
    o = _offsets(tp)
    n_pq = int(tp[T_N_PQ])
    n_pc = int(tp[T_N_PC])
    qmax = tp[o[2] + n_pq - 1]
    cmax = tp[o[3] + n_pc - 1]
    qf = float(q)
    cf = float(ctx)
    scale = 1.0
    if qf > qmax:
        scale = (qf * (2.0 * cf + qf)) / (qmax * qmax)
        qf = qmax
        cf = 0.0
    elif cf > cmax:
        scale = (2.0 * cf + qf) / (2.0 * cmax + qf)
        cf = cmax
    return scale * _interp2(qf, cf, tp, o[2], n_pq, o[3], n_pc, o[4])


def prefill_attn_ns(q: int, ctx: int, tp: np.ndarray) -> int:
    """:func:`prefill_attn_s` in integer nanoseconds (0 for the roofline), so that the kernels
    sum a batch's requests exactly, in any order."""
    if tp[T_BACKEND] != BACKEND_MEASURED:
        return 0
    return int(prefill_attn_s(q, ctx, tp) * 1e9 + 0.5)


def prefill_out_of_range(q: int, ctx: int, tp: np.ndarray) -> int:
    """1 when the measured backend's prefill lookup for (q, ctx) lies beyond the data."""
    if tp[T_BACKEND] == BACKEND_MEASURED and q + ctx > tp[T_PF_MAX]:
        return 1
    return 0


def _non_attention_s(tokens: int, tp: np.ndarray) -> float:
    """Non-attention seconds of a batch of ``tokens``: one load from the dense table (built by
    interpolating the measured grid at every count); beyond it, in proportion to the tokens."""
    o_na = HEADER + int(tp[T_N_MOE])
    last = int(tp[T_N_TOK]) - 1
    if tokens <= last:
        return tp[o_na + tokens]
    return tp[o_na + last] * (float(tokens) / float(last))


def _decode_attn_s(n_dec: int, dec_kv: int, tp: np.ndarray) -> float:
    """Decode attention of ``n_dec`` requests attending ``dec_kv`` tokens in all, at their mean
    context: the batch's dense row (no search on the batch), the context's cell by a search of
    the short context grid, and the cell's value and slope (one multiply, no division beyond
    the mean); beyond the data the time scales linearly in batch and in context (KV bytes)."""
    n_dc = int(tp[T_N_DC])
    o_dc = int(tp[T_O_DC])
    bmax = int(tp[T_N_DB]) - 1
    cmax = tp[T_DC_MAX]
    c = float(dec_kv) / float(n_dec)
    b = n_dec
    scale = 1.0
    if b > bmax:
        scale = float(b) / float(bmax)
        b = bmax
    if c > cmax:
        scale = scale * (c / cmax)
        c = cmax
    x0 = tp[o_dc]
    if c < x0:
        c = x0
    j = _grid_cell(c, tp, o_dc, n_dc)
    row = int(tp[T_O_DA]) + 2 * (b * (n_dc - 1) + j)
    return scale * (tp[row] + (c - tp[o_dc + j]) * tp[row + 1])


def step_extrapolated(tokens: int, n_dec: int, dec_kv: int, pf_ext: int, tp: np.ndarray) -> int:
    """1 when an iteration's measured step time used values beyond the measured data."""
    if tp[T_BACKEND] != BACKEND_MEASURED:
        return 0
    if pf_ext > 0 or tokens >= tp[T_N_TOK]:
        return 1
    if n_dec > 0 and (n_dec >= tp[T_N_DB] or float(dec_kv) > tp[T_DC_MAX] * float(n_dec)):
        return 1
    return 0


def _weights_read(tokens: int, tp: np.ndarray) -> float:
    """Weight bytes one step reads: the dense part plus, for MoE, the expected share of distinct
    experts that ``tokens`` routed tokens touch (tabulated by token count)."""
    n_moe = int(tp[T_N_MOE])
    if n_moe == 0:
        return tp[T_WEIGHTS]
    i = tokens if tokens < n_moe else n_moe - 1
    return tp[T_WEIGHTS] + tp[T_EXPERT_BYTES] * tp[HEADER + i]


def step_time(
    tokens: int, attn: int, kv_read: int, n_dec: int, dec_kv: int, pf_ns: int, tp: np.ndarray
) -> float:
    """Seconds of one iteration from its integer sums (module docstring) and the packed array."""
    if tp[T_BACKEND] == BACKEND_MEASURED:
        t = _non_attention_s(tokens, tp)
        if tokens > n_dec:
            t = t + (tp[T_PF_FLOOR] + pf_ns * 1e-9)
        if n_dec > 0:
            t = t + _decode_attn_s(n_dec, dec_kv, tp)
        return t + tp[T_OVERHEAD]
    # roofline: decode requests' attention sum is 2*dec_kv - n_dec (q = 1, ctx = kv)
    attn_dec = 2 * dec_kv - n_dec
    compute = (tp[T_FLOPS] * (tokens - n_dec) + tp[T_ATTN_COEF] * (attn - attn_dec)) / tp[
        T_RATE_PF
    ] + (tp[T_FLOPS] * n_dec + tp[T_ATTN_COEF] * attn_dec) / tp[T_RATE_DEC]
    memory = (_weights_read(tokens, tp) + tp[T_KV_BYTES] * kv_read) / tp[T_MEM_RATE]
    longest = compute if compute > memory else memory
    return longest + tp[T_AR_TOKEN] * tokens + tp[T_AR_FIXED] + tp[T_OVERHEAD]


def prefill_seconds(q: int, ctx: int, tp: np.ndarray) -> float:
    """Seconds to compute ``q`` prompt tokens after ``ctx`` (the cost-aware load rule's estimate
    of recomputing instead of loading), from the same backend as the step time."""
    if tp[T_BACKEND] == BACKEND_MEASURED:
        return _non_attention_s(q, tp) + prefill_attn_s(q, ctx, tp)
    return (tp[T_FLOPS] * q + tp[T_ATTN_COEF] * (q * (2 * ctx + q))) / tp[T_RATE_PF]


def iteration_time(
    tokens: int,
    attn: int,
    kv_tokens: int,
    flops_per_token: float,
    attn_coef: float,
    compute_rate: float,
    weight_bytes: float,
    kv_bytes_per_token: float,
    mem_rate: float,
    step_overhead_s: float,
) -> float:
    """The plain roofline ``max(compute, memory) + overhead`` (one efficiency, no all-reduce,
    dense weights): what :func:`step_time`'s roofline computes for a dense model at tp=1 with
    equal prefill and decode MFU, up to the rounding of its two compute terms."""
    compute = (flops_per_token * tokens + attn_coef * attn) / compute_rate
    memory = (weight_bytes + kv_bytes_per_token * kv_tokens) / mem_rate
    longest = compute if compute > memory else memory
    return longest + step_overhead_s
