"""The iteration-time formula, written once for both simulators.

The numba engine compiles this very function (``kvtier.sim.nb.iteration_time_nb``), and
the reference calls it as Python; the operations and their order are the same, so both give
bit-identical times. The attention term is accumulated as an integer
``attn = sum q * (2*ctx + q)`` (exact in int64) so no float sum depends on batch order:
``4*L*H*d*sum(q*(ctx + q/2)) == (2*L*H*d) * attn``.
"""

from __future__ import annotations


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
    """Seconds of one iteration: ``max(compute, memory) + overhead`` (docs/design.md 4.2).

    ``tokens`` are the iteration's prefill and decode tokens, ``attn`` the integer attention
    sum above, ``kv_tokens`` the KV tokens read (context plus new tokens of every request).
    """
    compute = (flops_per_token * tokens + attn_coef * attn) / compute_rate
    memory = (weight_bytes + kv_bytes_per_token * kv_tokens) / mem_rate
    longest = compute if compute > memory else memory
    return longest + step_overhead_s
