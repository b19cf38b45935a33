"""Per-request results of one replay as an Arrow table (``kvtier replay --requests-out``).

One row per request of the blocked trace, in trace order, built from a :class:`RawResult`
only, so both engines give the same table whenever their raw results agree (the differential
tests compare it row by row). Columns:

- ``request_id``: the trace's ``request_id`` column when it has one, else the row index;
- ``arrival_s``, ``instance`` (-1: rejected), ``first_token_s``, ``finish_s``: simulated
  seconds, null when not reached (rejected, or the replay stopped early);
- ``ttft_s``, ``tpot_s``: as :mod:`kvtier.sim.metrics` computes them (the same arrays), null
  when not reached (``tpot_s`` also for an answer of fewer than two tokens, which has none);
- ``input_tokens``, ``output_tokens``;
- ``hbm_tokens`` and ``<tier>_tokens`` for each lower tier the policy has: prompt tokens
  found in HBM, or loaded from that tier, at its first admission (0 if never admitted);
- ``recomputed_tokens``: prompt tokens computed, the rest of the prompt; null for a request
  whose prompt was not completed (its count is not settled);
- ``preemptions`` and ``preempted_tokens`` (``scheduler = "vllm_v1"``): times the request was
  preempted and the computed KV tokens those preemptions discarded (computed again, less any
  found in a cache on its return);
- ``rejected``: the request can never fit an instance's HBM;
- ``weight``: what the request counts for in the replay's per-request latency statistics, its
  post-stratification weight on a sample with prompt-length strata
  (:func:`kvtier.sim.metrics.request_weights`), 1.0 for every request otherwise; always there,
  so any weighted statistic of the rows is the metrics' own (``numpy.quantile(x, q,
  weights=weight, method="inverted_cdf")`` over the rows a statistic uses, on a sample);
- disaggregated replays only (some request handed over): ``decode_instance`` (-1: it
  never left its prefill instance) and ``kv_transfer_s``, seconds from its prefill's end to
  its KV's arrival on the decode instance (waiting for decode blocks included; null when not
  handed over or its KV had not arrived when the replay stopped), and
  ``decode_hit_blocks``, the prompt's leading blocks the decode instance already held in its
  HBM prefix cache, which the transfer did not move (0 when the connector moves every block;
  null when not handed over);
- replays that tracked token intervals only (``track_tbt``): ``tbt_tail_s``, the mean of the
  request's longest 10% token intervals (``RawResult.tbt_tail_s``), null below two tokens or
  when not finished.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from kvtier.errors import InputError
from kvtier.sim.metrics import request_tpot, request_ttft, request_weights
from kvtier.sim.result import RawResult
from kvtier.trace.blocked import BlockedTrace


def _nullable(x: np.ndarray, valid: np.ndarray, type_: pa.DataType) -> pa.Array:
    return pa.array(x, type=type_, mask=~valid)


def request_table(
    trace: BlockedTrace,
    raw: RawResult,
    tier_names: Sequence[str] = (),
    request_ids: pa.Array | pa.ChunkedArray | None = None,
) -> pa.Table:
    """The per-request table of ``raw``, a replay of ``trace`` with lower tiers ``tier_names``.

    ``request_ids`` (int64 or string, one per request) name the rows; the row index otherwise.
    """
    n = trace.n_requests
    B = trace.block_tokens
    loaded = raw.loaded_blocks
    if len(raw.finish_s) != n or loaded.shape != (n, len(tier_names)):
        raise ValueError(
            f"a replay of {len(raw.finish_s)} requests and {loaded.shape[1]} lower tiers does "
            f"not match a trace of {n} requests and tiers {', '.join(tier_names) or 'none'}"
        )
    if request_ids is None:
        ids: pa.Array | pa.ChunkedArray = pa.array(np.arange(n, dtype=np.int64))
    elif len(request_ids) != n:
        raise ValueError(f"{len(request_ids)} request ids for {n} requests")
    else:
        ids = request_ids
    has_first = ~np.isnan(raw.first_token_s)
    served = ~np.isnan(raw.finish_s)
    rejected = raw.instance < 0
    hbm_tokens = raw.hit_blocks * B
    tier_tokens = loaded * B
    recomputed = trace.input_tokens - hbm_tokens - tier_tokens.sum(axis=1)
    f8, i8 = pa.float64(), pa.int64()
    columns: dict[str, pa.Array | pa.ChunkedArray] = {
        "request_id": ids,
        "arrival_s": pa.array(trace.arrival_s, type=f8),
        "instance": pa.array(raw.instance, type=i8),
        "first_token_s": _nullable(raw.first_token_s, has_first, f8),
        "finish_s": _nullable(raw.finish_s, served, f8),
        "ttft_s": _nullable(request_ttft(trace, raw), has_first, f8),
        "tpot_s": _nullable(request_tpot(trace, raw), served & (trace.output_tokens >= 2), f8),
        "input_tokens": pa.array(trace.input_tokens, type=i8),
        "output_tokens": pa.array(trace.output_tokens, type=i8),
        "hbm_tokens": pa.array(hbm_tokens, type=i8),
    }
    for t, name in enumerate(tier_names):
        columns[f"{name}_tokens"] = pa.array(tier_tokens[:, t], type=i8)
    columns["recomputed_tokens"] = _nullable(recomputed, has_first, i8)
    zeros = np.zeros(n, dtype=np.int64)
    pre = raw.preemptions if raw.preemptions is not None else zeros
    pre_tok = raw.preempted_tokens if raw.preempted_tokens is not None else zeros
    columns["preemptions"] = pa.array(pre, type=i8)
    columns["preempted_tokens"] = pa.array(pre_tok, type=i8)
    columns["rejected"] = pa.array(rejected, type=pa.bool_())
    weights = request_weights(trace)
    columns["weight"] = pa.array(np.ones(n) if weights is None else weights, type=f8)
    dec = raw.decode_instance
    if dec is not None and raw.kv_transfer_s is not None and bool((dec >= 0).any()):
        columns["decode_instance"] = pa.array(dec, type=i8)
        columns["kv_transfer_s"] = _nullable(raw.kv_transfer_s, (dec >= 0) & has_first, f8)
        hits = raw.decode_hit_blocks if raw.decode_hit_blocks is not None else zeros
        columns["decode_hit_blocks"] = _nullable(hits, dec >= 0, i8)
    if raw.tbt_tail_s is not None:
        columns["tbt_tail_s"] = _nullable(raw.tbt_tail_s, ~np.isnan(raw.tbt_tail_s), f8)
    return pa.table(columns)


def trace_request_ids(table: pa.Table) -> pa.ChunkedArray | None:
    """The ``request_id`` column of a trace table (rows in trace order), None without one."""
    return table.column("request_id") if "request_id" in table.column_names else None


def write_request_table(path: str, table: pa.Table) -> None:
    """Write ``table`` as Parquet at ``path``, atomically (a crash leaves no partial file)."""
    import pyarrow.parquet as pq

    from kvtier.files import atomic_write

    check_requests_path(path)
    atomic_write(path, lambda tmp: pq.write_table(table, tmp))


def check_requests_path(path: str) -> None:
    """Refuse a ``--requests-out`` path that does not name a Parquet file (before a replay)."""
    if not str(path).endswith(".parquet"):
        raise InputError(f"must name a .parquet file, got {path!r}", option="--requests-out")
