"""What a fault cost a replay: tail TTFT during it and the time until the cache recovered.

Computed after the replay from its per-request outputs (both engines give the same), so a
shared pool's blast radius is a number (docs/model.md, "Faults"):

- Windows of ``window_s`` seconds (default: a fiftieth of the trace's span) by arrival; each
  window's hit ratio is the prompt blocks reused (HBM hits and blocks loaded from a lower
  tier) over the full prompt blocks of the requests that arrived in it.
- The level the fault is measured against: the same window of a replay without the fault
  (``baseline``) when given, else the hit ratio of every request that arrived before it.
- Recovered: from the first window starting at or after the fault whose hit ratio, and that
  of each of the ``hold`` windows after it, lies within ``band`` (absolute) of the level; the
  recovery time runs from the fault to that window's start (None: not within the trace).
- During the fault: the requests that arrived from the fault until it recovered (the trace's
  end when it did not); their P99 and P99.9 TTFT (``numpy.quantile``, linear), beside the
  same requests' in the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtier.sim.faults import Fault
from kvtier.sim.result import RawResult
from kvtier.trace.blocked import BlockedTrace

BAND = 0.05  # hit ratio within 5 points of its level counts as recovered (a stated choice)
HOLD = 2  # ... and stays so for this many further windows


@dataclass(frozen=True)
class FaultImpact:
    """One fault's figures (times in seconds from the trace's start)."""

    label: str
    at_s: float
    back_s: float  # when the device was reachable again
    lost_blocks: int
    window_s: float
    band: float
    level_hit_ratio: float  # pre-fault (or the baseline's mean over the fault's windows)
    lowest_hit_ratio: float  # the lowest windowed hit ratio from the fault on
    recovery_s: float | None
    requests_during: int
    ttft_p99_s: float | None
    ttft_p999_s: float | None
    baseline_ttft_p99_s: float | None
    baseline_ttft_p999_s: float | None
    # the windows (start times), their hit ratio and the baseline's (NaN where empty)
    window_start_s: np.ndarray
    window_hit: np.ndarray
    window_base_hit: np.ndarray

    def as_dict(self) -> dict[str, object]:
        return {
            "fault": self.label,
            "at_s": self.at_s,
            "back_s": self.back_s,
            "lost_blocks": self.lost_blocks,
            "window_s": self.window_s,
            "band": self.band,
            "level_hit_ratio": self.level_hit_ratio,
            "lowest_hit_ratio": self.lowest_hit_ratio,
            "recovery_s": self.recovery_s,
            "requests_during": self.requests_during,
            "ttft_p99_s": self.ttft_p99_s,
            "ttft_p999_s": self.ttft_p999_s,
            "baseline_ttft_p99_s": self.baseline_ttft_p99_s,
            "baseline_ttft_p999_s": self.baseline_ttft_p999_s,
        }


def reused_blocks(raw: RawResult) -> np.ndarray:
    """Prompt blocks each request reused: its HBM hits and the blocks it loaded from below."""
    loaded = raw.loaded_blocks.sum(axis=1) if raw.loaded_blocks.size else 0
    return (raw.hit_blocks + loaded).astype(np.float64)


def windowed_hit_ratio(
    trace: BlockedTrace, raw: RawResult, edges: np.ndarray
) -> np.ndarray:  # fmt: skip
    """Hit ratio of the requests that arrived in each window ``[edges[j], edges[j + 1])``."""
    sent = raw.arrival_s if raw.arrival_s is not None else trace.arrival_s
    full = np.diff(trace.block_offsets).astype(np.float64)
    idx = np.searchsorted(edges, sent, side="right") - 1
    ok = (idx >= 0) & (idx < len(edges) - 1)
    n = len(edges) - 1
    reused = np.bincount(idx[ok], weights=reused_blocks(raw)[ok], minlength=n)
    blocks = np.bincount(idx[ok], weights=full[ok], minlength=n)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(blocks > 0, reused / np.maximum(blocks, 1), np.nan)


def _tail(ttft: np.ndarray, q: float) -> float | None:
    x = ttft[~np.isnan(ttft)]
    return float(np.quantile(x, q, method="linear")) if len(x) else None


def fault_impact(
    trace: BlockedTrace,
    raw: RawResult,
    fault: Fault,
    lost_blocks: int,
    baseline: RawResult | None = None,
    window_s: float | None = None,
    band: float = BAND,
    hold: int = HOLD,
) -> FaultImpact:
    """The figures of one fault of a replay (``baseline``: the same trace without it)."""
    sent = raw.arrival_s if raw.arrival_s is not None else trace.arrival_s
    span = float(sent.max()) if len(sent) else 0.0
    w = float(window_s) if window_s else max(span / 50.0, 1e-3)
    at = fault.at_s
    edges = np.arange(0.0, span + 2 * w, w)
    hit = windowed_hit_ratio(trace, raw, edges)
    base = windowed_hit_ratio(trace, baseline, edges) if baseline is not None else None
    starts = edges[:-1]
    after = np.nonzero(starts >= at)[0]
    if base is not None:
        level_of = base
        level = float(np.nanmean(base[after])) if len(after) else float("nan")
    else:
        before = sent < at
        full = np.diff(trace.block_offsets).astype(np.float64)
        denom = full[before].sum()
        level = float(reused_blocks(raw)[before].sum() / denom) if denom > 0 else float("nan")
        level_of = np.full(len(hit), level)
    recovered_at = None
    for j in after:
        ahead = range(j, min(j + hold + 1, len(hit)))
        within = all(np.isnan(hit[x]) or hit[x] >= level_of[x] - band for x in ahead)
        if within and not np.isnan(hit[j]):
            recovered_at = float(starts[j])
            break
    end = recovered_at if recovered_at is not None else np.inf
    during = (sent >= at) & (sent < end)
    ttft = raw.first_token_s - sent
    b_ttft = baseline.first_token_s - sent if baseline is not None else None
    low = hit[after] if len(after) else np.array([np.nan])
    return FaultImpact(
        label=fault.label(),
        at_s=at,
        back_s=at + fault.down_s,
        lost_blocks=int(lost_blocks),
        window_s=w,
        band=band,
        level_hit_ratio=level,
        lowest_hit_ratio=float(np.nanmin(low)) if np.any(~np.isnan(low)) else float("nan"),
        recovery_s=None if recovered_at is None else max(recovered_at - at, 0.0),
        requests_during=int(during.sum()),
        ttft_p99_s=_tail(ttft[during], 0.99),
        ttft_p999_s=_tail(ttft[during], 0.999),
        baseline_ttft_p99_s=_tail(b_ttft[during], 0.99) if b_ttft is not None else None,
        baseline_ttft_p999_s=_tail(b_ttft[during], 0.999) if b_ttft is not None else None,
        window_start_s=starts,
        window_hit=hit,
        window_base_hit=base if base is not None else np.full(len(hit), np.nan),
    )


def fault_impacts(
    trace: BlockedTrace,
    raw: RawResult,
    faults: tuple[Fault, ...],
    baseline: RawResult | None = None,
    window_s: float | None = None,
) -> list[FaultImpact]:
    """:func:`fault_impact` of each fault (``raw.fault_lost_ids`` holds one entry per fault)."""
    lost = [len(x) for x in (raw.fault_lost_ids or ())] or [0] * len(faults)
    return [
        fault_impact(trace, raw, f, n, baseline, window_s)
        for f, n in zip(faults, lost, strict=True)
    ]
