"""Time is relative: a trace's results do not depend on where its clock started, and arrivals
too large to resolve a microsecond are refused rather than rounded."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvtier.trace.format import META_ARRIVAL_OFFSET
from kvtier.trace.io import read_trace, write_trace
from tests.helpers import assert_one_line_error, invoke, make_trace


def trace_at(offset: float, tmp_path: Path, n: int = 30) -> Path:
    prompts = [[i % 5, 7, 9] * (20 + 7 * (i % 6)) for i in range(n)]
    # steps of 1/64 s: offset + k/64 is exact in float64, so the shifted arrivals are the same
    arrivals = offset + np.arange(1, n + 1) / 64
    trace = make_trace(
        prompts, 16, arrivals=arrivals, outputs=[1 + (i * 37) % 90 for i in range(n)]
    )
    path = tmp_path / f"at-{offset:g}.parquet"
    write_trace(trace, path)
    return path


def replay_json(path: Path, engine: str) -> dict:
    result = invoke("replay", "--trace", str(path), "--engine", engine, "--json")
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("engine", ["numba", "reference"])
def test_results_do_not_depend_on_the_clock_origin(tmp_path: Path, engine: str) -> None:
    base = replay_json(trace_at(0.0, tmp_path), engine)
    for offset in (1e5, 1.7e9):  # a day in; an epoch timestamp in seconds
        assert replay_json(trace_at(offset, tmp_path), engine) == base


def test_offset_is_kept_in_metadata_and_carried_by_slices(tmp_path: Path) -> None:
    path = trace_at(1.7e9, tmp_path)
    trace = read_trace(path)
    assert trace.arrival_s[0] == 0.0
    assert trace.arrival_offset_s == 1.7e9 + 1 / 64
    for stream in ("--no-stream", "--stream"):
        out = tmp_path / f"cut{stream}.parquet"
        result = invoke("trace", "slice", str(path), "--start", "0.1", "-o", str(out), stream)
        assert result.code == 0, result.stderr
        meta = pq.read_schema(out).metadata
        assert float(meta[META_ARRIVAL_OFFSET.encode()]) == pytest.approx(1.7e9 + 1 / 64 + 0.1)
        cut = read_trace(out)
        assert cut.arrival_s[0] == 0.0
        # its first kept arrival, 8/64 s after the trace's first, becomes 0 in turn
        assert cut.arrival_offset_s == pytest.approx(1.7e9 + 8 / 64, abs=1e-5)


@pytest.mark.parametrize("offset", [1.7e12, 1e17])
def test_arrivals_coarser_than_a_microsecond_are_refused(tmp_path: Path, offset: float) -> None:
    path = trace_at(0.0, tmp_path)
    table = pq.read_table(path)
    moved = pa.array(table.column("arrival_s").to_numpy() + offset)
    pq.write_table(table.set_column(0, "arrival_s", moved), path)  # as a foreign writer would
    for args in (("replay", "--trace", str(path)), ("trace", "stats", str(path)),
                 ("trace", "stats", "--stream", str(path))):  # fmt: skip
        result = invoke(*args)
        assert_one_line_error(result, path.name, "column 'arrival_s'", "microseconds")


def test_arrival_offset_metadata_must_be_finite(tmp_path: Path) -> None:
    path = trace_at(0.0, tmp_path)
    table = pq.read_table(path)
    meta = {**table.schema.metadata, META_ARRIVAL_OFFSET.encode(): b"nan"}
    pq.write_table(table.replace_schema_metadata(meta), path)
    result = invoke("trace", "stats", str(path))
    assert_one_line_error(result, META_ARRIVAL_OFFSET)
