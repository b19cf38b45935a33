"""BurstGPT CSV (Wang et al., KDD'25): Timestamp, Model, Request tokens, Response tokens, ...

Arrivals are seconds from the trace's start; lengths only (no prefix information, said in
``kvtier trace stats``). Requests that failed carry ``Request tokens = 0``: they did no prefill
or decode work and have no valid request-trace/1 form, so they are left out with a warning
that counts them, and the count is kept in the trace metadata (``burstgpt.failed_rows``).
``Model`` and ``Log Type`` are kept as the columns ``model`` and ``log_type``.
"""

from __future__ import annotations

import warnings

import numpy as np
import polars as pl

from kvtier.trace.format import Trace
from kvtier.trace.importers.azure import read_csv_strings
from kvtier.trace.importers.registry import ImportOptions, register
from kvtier.trace.importers.tabular import ColumnMap, lengths_trace

BURSTGPT = ColumnMap(
    arrival="Timestamp",
    input="Request tokens",
    output="Response tokens",
    arrival_kind="s",
    keep=(("model", "Model"), ("log_type", "Log Type")),
)


class FailedRequestsWarning(UserWarning):
    """Rows of failed requests (no prompt tokens) were left out of an imported trace."""


@register("burstgpt", "BurstGPT CSV (seconds, request/response tokens; lengths only)")
def import_burstgpt(path: str, options: ImportOptions) -> Trace:
    df, lines = read_csv_strings(path)
    failed = np.zeros(df.height, dtype=bool)
    if BURSTGPT.input in df.columns:
        failed = (df.get_column(BURSTGPT.input).str.strip_chars() == "0").to_numpy()
    if failed.any():
        warnings.warn(
            f"{path}: left out {int(failed.sum()):,} failed requests (Request tokens = 0), "
            f"first at line {int(lines[failed][0])}",
            FailedRequestsWarning,
            stacklevel=2,
        )
        df, lines = df.filter(pl.Series(~failed)), lines[~failed]
    trace = lengths_trace(path, df, lines, BURSTGPT, "burstgpt")
    meta = {**trace.metadata, "burstgpt.failed_rows": str(int(failed.sum()))}
    return Trace.from_table(
        trace.table,
        block_tokens=trace.block_tokens,
        source=trace.source,
        has_prefix_info=False,
        metadata=meta,
    )
