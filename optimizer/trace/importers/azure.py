"""Azure LLM inference CSV, 2023 and 2024 releases: TIMESTAMP, ContextTokens, GeneratedTokens.

The 2023 release (Splitwise) writes naive timestamps with 7 fractional digits
(``2023-11-16 18:17:03.9799600``), the 2024 one-week release (DynamoLLM) timestamps with a UTC
offset (``2024-05-10 00:00:00.009930+00:00``); both read here. No prefix information: the trace
gets empty hash lists and ``kvtier.prefix_info = false``.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from kvtier.trace.format import Trace
from kvtier.trace.importers.common import (
    check_field_counts,
    check_header,
    csv_row_lines,
    first_bad_csv_line,
    header_of,
    read_bytes,
)
from kvtier.trace.importers.registry import ImportOptions, register
from kvtier.trace.importers.tabular import ColumnMap, lengths_trace

AZURE = ColumnMap(
    arrival="TIMESTAMP", input="ContextTokens", output="GeneratedTokens", arrival_kind="timestamp"
)


def read_csv_strings(path: str) -> tuple[pl.DataFrame, np.ndarray]:
    """A CSV file as string columns, with the line where each row starts; blank lines (often a
    trailing one, or CRLF blank lines) are skipped as JSON Lines skips them."""
    data = read_bytes(path)
    check_header(header_of(data), path)
    check_field_counts(data, path)
    try:
        df = pl.read_csv(data, infer_schema=False)
    except Exception as err:
        raise first_bad_csv_line(data, path, err) from None
    lines, blank = csv_row_lines(data, df.height)
    if blank.any():
        df, lines = df.filter(pl.Series(~blank)), lines[~blank]
    return df, lines


@register("azure", "Azure LLM inference CSV, 2023 or 2024 (lengths only, no prefix hashes)")
def import_azure(path: str, options: ImportOptions) -> Trace:
    df, lines = read_csv_strings(path)
    return lengths_trace(path, df, lines, AZURE, "azure")
