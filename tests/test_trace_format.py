"""Trace format v1: round trips, and one-line errors for every kind of bad file."""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.errors import InputError
from kvtier.trace.format import Trace
from kvtier.trace.io import read_trace, starting_at_zero, write_trace
from kvtier.trace.validate import UnsortedTraceWarning
from tests.helpers import assert_one_line_error, invoke, make_trace, run_cli

G = 4


def good_trace() -> Trace:
    return make_trace(
        [[1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2, 3, 4, 9], [7, 7]],
        G,
        arrivals=[0.0, 0.5, 2.0],
        outputs=[3, 0, 5],
        tenants=["a", "b", "a"],
        sessions=[1, 2, 1],
    )


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    n = draw(st.integers(1, 12))
    prompts = [draw(st.lists(st.integers(0, 3), min_size=1, max_size=20)) for _ in range(n)]
    arrivals = sorted(draw(st.lists(st.floats(0, 1e6), min_size=n, max_size=n)))
    outputs = draw(st.lists(st.integers(0, 10_000), min_size=n, max_size=n))
    tenants = draw(st.lists(st.sampled_from(["x", "y", "z"]), min_size=n, max_size=n))
    return make_trace(prompts, G, arrivals=arrivals, outputs=outputs, tenants=tenants)


@settings(max_examples=40, deadline=None)
@given(trace=traces(), suffix=st.sampled_from([".parquet", ".arrow"]))
def test_round_trip_keeps_data_and_metadata(tmp_path_factory, trace: Trace, suffix: str) -> None:
    path = tmp_path_factory.mktemp("rt") / f"t{suffix}"
    write_trace(trace, path)
    back = read_trace(path)
    # read back relative to its first arrival, where the source's clock stood kept in metadata
    expected = starting_at_zero(trace)
    assert back.table.equals(expected.table)
    assert back.table.schema.metadata == expected.table.schema.metadata
    assert back.arrival_offset_s == trace.table.column("arrival_s")[0].as_py()
    write_trace(back, path)
    again = read_trace(path)  # a second round trip changes nothing
    assert again.table.equals(back.table)
    assert again.table.schema.metadata == back.table.schema.metadata
    assert (back.block_tokens, back.source, back.has_prefix_info) == (G, "test", True)


def test_extra_columns_and_metadata_survive(tmp_path) -> None:
    t = good_trace()
    t2 = Trace.from_table(
        t.table.append_column("type", pa.array(["text", "image", "text"])),
        block_tokens=G,
        source="s",
        metadata={"origin": "unit test"},
    )
    write_trace(t2, tmp_path / "x.parquet")
    back = read_trace(tmp_path / "x.parquet")
    assert back.table.column("type").to_pylist() == ["text", "image", "text"]
    assert back.metadata == {"origin": "unit test"}


def test_unsorted_arrivals_are_sorted_stably_with_warning(tmp_path) -> None:
    t = good_trace().table
    shuffled = t.take([2, 0, 1])
    with pytest.warns(UnsortedTraceWarning):
        fixed = Trace.from_table(shuffled, block_tokens=G)
    assert fixed.table.column("arrival_s").to_pylist() == [0.0, 0.5, 2.0]
    # stable: equal arrivals keep file order
    tie = t.set_column(0, "arrival_s", pa.array([1.0, 0.0, 1.0]))
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        fixed = Trace.from_table(tie, block_tokens=G)
    assert fixed.table.column("output_tokens").to_pylist() == [0, 3, 5]
    pq.write_table(shuffled.replace_schema_metadata(t.schema.metadata), tmp_path / "u.parquet")
    result = invoke("trace", "stats", str(tmp_path / "u.parquet"), "--json")
    assert result.code == 0
    assert "warning:" in result.stderr and "sorted" in result.stderr


# -- bad input: one line, file, row and column, exit code 2 --------------------------------------
def _write(tmp_path, table: pa.Table, name: str = "bad.parquet") -> str:
    path = tmp_path / name
    pq.write_table(table, path)
    return str(path)


def _with(table: pa.Table, column: str, values: pa.Array) -> pa.Table:
    i = table.column_names.index(column)
    return table.set_column(i, column, values)


def _bad_cases() -> dict[str, tuple]:
    t = good_trace().table
    hashes = t.column("block_hashes").to_pylist()
    return {
        "missing column": (t.drop_columns(["output_tokens"]), None, "output_tokens", "missing"),
        "wrong type": (_with(t, "arrival_s", pa.array(["0", "1", "2"])), None, "arrival_s", "type"),
        "nan arrival": (
            _with(t, "arrival_s", pa.array([0.0, float("nan"), 1.0])),
            1,
            "arrival_s",
            "NaN",
        ),
        "inf arrival": (
            _with(t, "arrival_s", pa.array([0.0, 1.0, float("inf")])),
            2,
            "arrival_s",
            "infinite",
        ),
        "negative arrival": (
            _with(t, "arrival_s", pa.array([0.0, -1.0, 1.0])),
            1,
            "arrival_s",
            "negative",
        ),
        "zero input": (_with(t, "input_tokens", pa.array([9, 0, 2])), 1, "input_tokens", "> 0"),
        "negative output": (
            _with(t, "output_tokens", pa.array([1, -2, 2])),
            1,
            "output_tokens",
            ">= 0",
        ),
        "hash count": (
            _with(t, "input_tokens", pa.array([9, 5, 9])),
            2,
            "block_hashes",
            "expected ceil",
        ),
        "hash at two positions": (
            _with(
                t,
                "block_hashes",
                pa.array([hashes[0], hashes[1], [hashes[0][1]]], pa.list_(pa.uint64())),
            ),
            2,
            "block_hashes",
            "also appears at block",
        ),
        "hash after two parents": (
            _with(
                t,
                "block_hashes",
                pa.array(
                    [hashes[0], [hashes[2][0], hashes[0][1]], hashes[2]], pa.list_(pa.uint64())
                ),
            ),
            1,
            "block_hashes",
            "different parent",
        ),
        "duplicate request id": (
            t.append_column("request_id", pa.array([7, 8, 7])),
            2,
            "request_id",
            "duplicate",
        ),
        "null value": (
            _with(t, "output_tokens", pa.array([1, None, 2], pa.int64())),
            1,
            "output_tokens",
            "missing value",
        ),
    }


@pytest.mark.parametrize("case", list(_bad_cases()))
def test_bad_table_gets_one_line_error(tmp_path, case: str) -> None:
    table, row, column, words = _bad_cases()[case]
    path = _write(tmp_path, table.replace_schema_metadata(good_trace().table.schema.metadata))
    with pytest.raises(InputError) as err:
        read_trace(path)
    assert err.value.column == column
    assert err.value.row == row
    result = invoke("trace", "stats", path)
    needles = [path, f"column '{column}'", words] + ([f"row {row}"] if row is not None else [])
    assert_one_line_error(result, *needles)


def test_bad_files(tmp_path) -> None:
    meta = good_trace().table.schema.metadata
    empty = tmp_path / "empty.parquet"
    empty.write_bytes(b"")
    assert_one_line_error(invoke("trace", "stats", str(empty)), "empty file")
    text = tmp_path / "t.parquet"
    text.write_text("arrival_s,input_tokens\n0,1\n")
    assert_one_line_error(invoke("trace", "stats", str(text)), "not an Arrow IPC or Parquet")
    corrupt = tmp_path / "c.parquet"
    corrupt.write_bytes(b"PAR1" + b"\0" * 64)
    assert_one_line_error(invoke("trace", "stats", str(corrupt)), "corrupt")
    no_rows = _write(
        tmp_path, good_trace().table.slice(0, 0).replace_schema_metadata(meta), "n.parquet"
    )
    assert_one_line_error(invoke("trace", "stats", no_rows), "no requests")
    version = dict(meta)
    version[b"kvtier.format"] = b"request-trace/9"
    vpath = _write(tmp_path, good_trace().table.replace_schema_metadata(version), "v.parquet")
    assert_one_line_error(invoke("trace", "stats", vpath), "unknown trace format version")
    nometa = _write(tmp_path, good_trace().table.replace_schema_metadata({}), "m.parquet")
    assert_one_line_error(invoke("trace", "stats", nometa), "kvtier.format")
    assert_one_line_error(
        invoke("trace", "stats", str(tmp_path / "absent.parquet")), "no such file"
    )


def test_subprocess_error_has_no_traceback(tmp_path) -> None:
    """The real console entry point, not only click's test runner."""
    bad = tmp_path / "x.arrow"
    bad.write_bytes(b"hello")
    assert_one_line_error(run_cli("trace", "stats", str(bad)), str(bad))


def test_write_refuses_unknown_suffix(tmp_path) -> None:
    with pytest.raises(InputError, match="unknown output format"):
        write_trace(good_trace(), tmp_path / "t.csv")
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_hash_arrays_match_table() -> None:
    t = good_trace()
    offsets, hashes = t.hash_arrays()
    lists = t.table.column("block_hashes").to_pylist()
    assert offsets.tolist() == np.cumsum([0] + [len(x) for x in lists]).tolist()
    assert hashes.tolist() == [h for x in lists for h in x]


def test_click_usage_errors_are_one_line() -> None:
    assert_one_line_error(
        run_cli("trace", "synth", "chat", "-o", "x.parquet", "--requests", "abc"),
        "--requests",
        "--help",
    )
    assert_one_line_error(run_cli("trace", "nosuchcommand"), "No such command")
    assert_one_line_error(run_cli("trace", "stats"), "TRACE")
    ok = run_cli("trace", "--help")
    assert ok.code == 0 and "stats" in ok.stdout
