"""Transfer and estimate formulas, written once for both simulators (docs/design.md 4.4).

The numba engine compiles these very functions (as :func:`kvtier.sim.timing.iteration_time`
is compiled), the reference calls them as Python, so link times agree to the bit.

A transfer of ``nbytes`` in ``ops`` operations over the links ``path`` (-1 = unused slot) starts
when every link on it is free (``start = max(now, free[l])``) and ends at
``start + ops * op_s + nbytes / bottleneck + lat_s``, the bottleneck being the slowest link or
the per-transfer cap (one CXL device when data is not interleaved). Each link is then busy for
its own share, ``nbytes / bw[l]`` plus, on links that issue operations (PCIe, ports; not a
pool's aggregate link), ``ops * op_s``: so a pool shared by many hosts serves them in parallel
up to its aggregate bandwidth while each host's adapter or NIC queues its own transfers.
"""

from __future__ import annotations

import numpy as np


def n_ops(blocks: int, fragments: int, coalesce: int) -> int:
    """``ceil(blocks * fragments / coalesce)`` transfer operations."""
    return -(-(blocks * fragments) // coalesce)


def transfer(
    now: float,
    nbytes: float,
    ops: int,
    op_s: float,
    lat_s: float,
    cap: float,
    path: np.ndarray,
    bw: np.ndarray,
    link_ops: np.ndarray,
    free: np.ndarray,
    busy: np.ndarray,
    moved: np.ndarray,
) -> float:
    """Run one transfer on the FIFO links of ``path``; returns its finish time.

    (Self-contained, like :func:`estimate`, because numba compiles each function alone.)
    """
    start = now
    slowest = cap
    for j in range(path.shape[0]):
        link = path[j]
        if link >= 0:
            if free[link] > start:
                start = free[link]
            if bw[link] < slowest:
                slowest = bw[link]
    overhead = ops * op_s
    finish = start + overhead + nbytes / slowest + lat_s
    for j in range(path.shape[0]):
        link = path[j]
        if link >= 0:
            occupied = nbytes / bw[link]
            if link_ops[link] == 1:
                occupied = occupied + overhead
            free[link] = start + occupied
            busy[link] += occupied
            moved[link] += nbytes
    return finish


def estimate(
    now: float,
    nbytes: float,
    ops: int,
    op_s: float,
    lat_s: float,
    cap: float,
    path: np.ndarray,
    bw: np.ndarray,
    free: np.ndarray,
) -> float:
    """The finish time :func:`transfer` would give, without occupying anything."""
    start = now
    slowest = cap
    for j in range(path.shape[0]):
        link = path[j]
        if link >= 0:
            if free[link] > start:
                start = free[link]
            if bw[link] < slowest:
                slowest = bw[link]
    return start + ops * op_s + nbytes / slowest + lat_s


def prefill_estimate(
    q: int, ctx: int, flops_per_token: float, attn_coef: float, compute_rate: float
) -> float:
    """Seconds to compute ``q`` prompt tokens after ``ctx`` (compute term, docs/design.md 4.2)."""
    return (flops_per_token * q + attn_coef * (q * (2 * ctx + q))) / compute_rate
