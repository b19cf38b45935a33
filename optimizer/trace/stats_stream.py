"""``kvtier trace stats`` of a trace read by record batches: the same figures, bounded memory.

Every figure of :func:`kvtier.trace.stats.trace_stats` is a sum, a maximum or an order
statistic, so it accumulates batch by batch and comes out *equal* to the in-memory figure:

* lengths: exact integer sums and a count per distinct token count (prompt lengths take far
  fewer distinct values than there are requests); a percentile is the same linear
  interpolation numpy makes, between the same two order statistics;
* the peak 60 s rate: windows whose end lies in a later batch wait in a carry of the last
  60 s of arrivals;
* reuse under the prefix rule: the batch's dense ids (:mod:`kvtier.trace.mapstream`) and one
  byte per distinct block (referenced by an earlier request or not);
* sessions: a table of distinct session ids.

Memory is therefore the mapping's (proportional to distinct blocks) plus one byte per
distinct block and the distinct sessions, not proportional to requests.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.trace.batches import BATCH_ROWS, open_batches
from kvtier.trace.format import META_SAMPLE_FRACTION, META_SOURCE
from kvtier.trace.io import sample_strata
from kvtier.trace.mapstream import mapper_for
from kvtier.trace.stats import PEAK_WINDOW_S, TraceStats, strata_dict


@njit(cache=True, nogil=True)
def _prefix_hits_nb(offsets: np.ndarray, ids: np.ndarray, seen: np.ndarray) -> np.int64:
    """Sum over requests of their leading blocks referenced by an earlier request; marks
    every block of each request seen after counting it (``ids`` lie in ``[0, len(seen))``)."""
    total = np.int64(0)
    for i in range(offsets.shape[0] - 1):
        lo = offsets[i]
        hi = offsets[i + 1]
        h = lo
        while h < hi and seen[ids[h]]:
            h += 1
        total += h - lo
        for r in range(lo, hi):
            seen[ids[r]] = 1
    return total


class _Counts:
    """A count per distinct integer value, merged batch by batch."""

    def __init__(self) -> None:
        self.values = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)
        self.sum = 0

    def add(self, x: np.ndarray) -> None:
        self.sum += int(x.sum())
        v, c = np.unique(x, return_counts=True)
        allv = np.concatenate([self.values, v])
        allc = np.concatenate([self.counts, c])
        self.values, inv = np.unique(allv, return_inverse=True)
        self.counts = np.zeros(len(self.values), dtype=np.int64)
        np.add.at(self.counts, inv.ravel(), allc)

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def order_stat(self, k: int) -> int:
        """The ``k``-th smallest value (0-based)."""
        return int(self.values[np.searchsorted(np.cumsum(self.counts), k, side="right")])

    def summary(self) -> dict[str, float]:
        """:func:`kvtier.trace.stats.summary` of the values counted, bit for bit."""
        n = self.n
        if n == 0:
            return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0}
        out = {"mean": float(self.sum / n)}
        for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            virtual = np.float64(n - 1) * np.float64(q)  # numpy's virtual index for "linear"
            below = int(np.floor(virtual))
            gamma = float(virtual - below)
            pair = np.array(
                [self.order_stat(below), self.order_stat(min(below + 1, n - 1))], dtype=np.int64
            )
            # the same interpolation numpy makes between the two order statistics
            out[name] = float(np.quantile(pair, gamma, method="linear"))
        return out


class _PeakRate:
    """:func:`kvtier.trace.stats.peak_rate` over arrivals given batch by batch."""

    def __init__(self, window_s: float) -> None:
        self.window = window_s
        self.pending = np.zeros(0, dtype=np.float64)  # starts whose window end is not seen yet
        self.pending_first = 0  # global index of pending[0]
        self.n = 0
        self.best = 0
        self.first = np.nan
        self.last = np.nan

    def add(self, arrival: np.ndarray) -> None:
        if np.isnan(self.first):
            self.first = float(arrival[0])
        self.last = float(arrival[-1])
        buf = np.concatenate([self.pending, arrival])
        ends = np.searchsorted(buf, buf + self.window, side="left")
        resolved = ends < len(buf)
        if resolved.any():
            idx = np.flatnonzero(resolved)
            self.best = max(self.best, int((ends[idx] - idx).max()))
        keep = int(np.argmax(~resolved)) if not resolved.all() else len(buf)
        # starts are sorted, so the unresolved ones are a suffix
        self.pending_first += keep
        self.pending = buf[keep:]
        self.n += len(arrival)

    def result(self) -> float:
        if self.n == 0:
            return 0.0
        span = self.last - self.first
        if 0 < span <= self.window:
            return self.n / span
        if len(self.pending):
            best_tail = self.n - self.pending_first  # the first pending start counts the most
            self.best = max(self.best, best_tail)
        return float(self.best / self.window)


def stream_trace_stats(
    path: str,
    block_tokens: int | None = None,
    *,
    share_across_tenants: bool = False,
    model: str | None = None,
    kv_bytes_per_token: int | None = None,
    batch_rows: int = BATCH_ROWS,
) -> TraceStats:
    """:func:`kvtier.trace.stats.trace_stats` of the trace ``path``, read by batches."""
    from kvtier.trace.batches import iter_batches
    from kvtier.trace.idtable import IdTable

    trace = open_batches(path)
    B = trace.block_tokens if block_tokens is None else block_tokens
    mapper = mapper_for(trace, B, share_across_tenants)
    inp_counts, out_counts = _Counts(), _Counts()
    peak = _PeakRate(PEAK_WINDOW_S)
    seen = np.zeros(1 << 16, dtype=np.uint8)
    sessions = IdTable() if "session_id" in trace.schema.names else None
    hits = 0
    refs = 0
    for _row0, table in iter_batches(trace, batch_rows):
        offsets, ids = mapper.map(table)
        if mapper.n_blocks > len(seen):
            grown = np.zeros(max(2 * len(seen), mapper.n_blocks), dtype=np.uint8)
            grown[: len(seen)] = seen
            seen = grown
        if len(ids) and (ids.min() < 0 or ids.max() >= len(seen)):
            raise ValueError("block ids outside the table")  # the mapping guarantees this
        if offsets[0] != 0 or offsets[-1] != len(ids):
            raise ValueError("block offsets do not cover the ids")
        hits += int(_prefix_hits_nb(offsets, ids, seen))
        refs += len(ids)
        inp = table.column("input_tokens").to_numpy().astype(np.int64, copy=False)
        inp_counts.add(inp)
        out_counts.add(table.column("output_tokens").to_numpy().astype(np.int64, copy=False))
        peak.add(table.column("arrival_s").to_numpy().astype(np.float64, copy=False))
        if sessions is not None:
            sessions.ids(table.column("session_id").to_numpy().astype(np.int64).view(np.uint64))
    duration = peak.last - peak.first if peak.n else 0.0
    distinct_kv = None
    if kv_bytes_per_token is not None:
        distinct_kv = int(mapper.n_blocks) * mapper.block_tokens * int(kv_bytes_per_token)
    return TraceStats(
        source=trace.meta.get(META_SOURCE, ""),
        requests=peak.n,
        duration_s=float(duration),
        native_block_tokens=trace.block_tokens,
        block_tokens=mapper.block_tokens,
        has_prefix_info=trace.has_prefix_info,
        input_tokens=inp_counts.summary(),
        output_tokens=out_counts.summary(),
        block_refs=refs,
        distinct_blocks=int(mapper.n_blocks),
        reuse_ratio_blocks=float(hits / refs) if refs else 0.0,
        reuse_ratio_tokens=float(hits * mapper.block_tokens / inp_counts.sum) if peak.n else 0.0,
        peak_rate_60s_rps=peak.result(),
        mean_rate_rps=float(peak.n / duration) if duration > 0 else 0.0,
        sessions=sessions.n if sessions is not None else None,
        tenants=len(mapper.tenants) if "tenant" in trace.schema.names else None,
        model=model,
        kv_bytes_per_token=kv_bytes_per_token,
        distinct_kv_bytes=distinct_kv,
        sample_fraction=float(trace.meta.get(META_SAMPLE_FRACTION, "1.0")),
        sample_strata=strata_dict(sample_strata(trace.meta, trace.path)),
    )
