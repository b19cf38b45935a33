"""Trace statistics: lengths, block reuse under the prefix rule, arrival peaks.

``reuse_ratio_blocks`` and ``reuse_ratio_tokens`` are what an *infinite* cache would serve:
each request reuses the longest run of its full blocks, from block 0, that earlier requests
have already produced (docs/design.md 4.3). They bound from above what any tier configuration can
save on the trace, at that block size.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.format import Trace
from kvtier.trace.strata import SampleStrata

PEAK_WINDOW_S = 60.0


def summary(values: np.ndarray) -> dict[str, float]:
    """Mean and linear-interpolated percentiles (numpy's default method)."""
    if len(values) == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
    q = np.quantile(values, [0.5, 0.9, 0.99], method="linear")
    # token counts: the exact integer sum, divided once (correctly rounded), which a trace read
    # by batches reproduces bit for bit (kvtier.trace.stats_stream)
    mean = int(values.sum()) / len(values) if values.dtype.kind in "iu" else np.mean(values)
    return {
        "mean": float(mean),
        "p50": float(q[0]),
        "p90": float(q[1]),
        "p99": float(q[2]),
    }


def prefix_hits(blocked: BlockedTrace) -> np.ndarray:
    """Per request: how many leading blocks an infinite cache already holds (int64).

    A block is held once any earlier request (or an earlier position of this request) has
    referenced it; the count stops at the request's first block not yet held.
    """
    ids = blocked.block_ids
    total = len(ids)
    n = blocked.n_requests
    if total == 0:
        return np.zeros(n, dtype=np.int64)
    first_ref = np.full(blocked.n_blocks, total, dtype=np.int64)
    # first reference index of each id: reverse assignment leaves the smallest index
    first_ref[ids[::-1]] = np.arange(total - 1, -1, -1, dtype=np.int64)
    counts = blocked.blocks_per_request
    starts = blocked.block_offsets[:-1]
    req_start = np.repeat(starts, counts)
    # held: first referenced before this request started
    held = first_ref[ids] < req_start
    pos = np.arange(total, dtype=np.int64) - req_start
    miss_pos = np.where(held, np.iinfo(np.int64).max, pos)
    nonempty = counts > 0
    first_miss = np.zeros(n, dtype=np.int64)
    first_miss[nonempty] = np.minimum.reduceat(miss_pos, starts[nonempty])
    return np.minimum(first_miss, counts)


def peak_rate(arrival_s: np.ndarray, window_s: float = PEAK_WINDOW_S) -> float:
    """Largest number of arrivals in any ``window_s`` window starting at an arrival, per second.

    A trace spanning at most one window is one window: its peak is its mean rate over its span.
    """
    if len(arrival_s) == 0:
        return 0.0
    span = float(arrival_s[-1] - arrival_s[0])
    if 0 < span <= window_s:
        return len(arrival_s) / span
    ends = np.searchsorted(arrival_s, arrival_s + window_s, side="left")
    return float((ends - np.arange(len(arrival_s))).max() / window_s)


@dataclass(frozen=True)
class TraceStats:
    """What ``kvtier trace stats`` reports (``--json`` prints ``as_dict()``)."""

    source: str
    requests: int
    duration_s: float
    native_block_tokens: int
    block_tokens: int
    has_prefix_info: bool
    input_tokens: dict[str, float]
    output_tokens: dict[str, float]
    block_refs: int
    distinct_blocks: int
    reuse_ratio_blocks: float
    reuse_ratio_tokens: float
    peak_rate_60s_rps: float
    mean_rate_rps: float
    sessions: int | None
    tenants: int | None
    model: str | None = None
    kv_bytes_per_token: int | None = None
    distinct_kv_bytes: int | None = None
    # a spatial sample's fraction and prompt-length strata (kvtier.trace.strata), as recorded
    sample_fraction: float = 1.0
    sample_strata: dict[str, object] | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def trace_stats(
    trace: Trace,
    blocked: BlockedTrace,
    *,
    model: str | None = None,
    kv_bytes_per_token: int | None = None,
) -> TraceStats:
    """Statistics of ``trace`` at the block size of ``blocked`` (its mapping)."""
    hits = prefix_hits(blocked)
    refs = blocked.n_block_refs
    inp = blocked.input_tokens
    arrival = blocked.arrival_s
    duration = float(arrival[-1] - arrival[0]) if len(arrival) else 0.0
    distinct_kv = None
    if kv_bytes_per_token is not None:
        distinct_kv = int(blocked.n_blocks) * blocked.block_tokens * int(kv_bytes_per_token)
    return TraceStats(
        source=trace.source,
        requests=blocked.n_requests,
        duration_s=duration,
        native_block_tokens=trace.block_tokens,
        block_tokens=blocked.block_tokens,
        has_prefix_info=trace.has_prefix_info,
        input_tokens=summary(inp),
        output_tokens=summary(blocked.output_tokens),
        block_refs=refs,
        distinct_blocks=int(blocked.n_blocks),
        reuse_ratio_blocks=float(hits.sum() / refs) if refs else 0.0,
        reuse_ratio_tokens=float(hits.sum() * blocked.block_tokens / inp.sum())
        if len(inp)
        else 0.0,
        peak_rate_60s_rps=peak_rate(arrival),
        mean_rate_rps=float(len(arrival) / duration) if duration > 0 else 0.0,
        sessions=int(len(np.unique(blocked.session_id)))
        if blocked.session_id is not None
        else None,
        tenants=int(blocked.tenant_id.max() + 1) if blocked.tenant_id is not None else None,
        model=model,
        kv_bytes_per_token=kv_bytes_per_token,
        distinct_kv_bytes=distinct_kv,
        sample_fraction=trace.sample_fraction,
        sample_strata=strata_dict(trace.sample_strata),
    )


def strata_dict(strata: SampleStrata | None) -> dict[str, object] | None:
    """``strata`` as its metadata's JSON object (None without strata)."""
    return None if strata is None else json.loads(strata.to_json())
