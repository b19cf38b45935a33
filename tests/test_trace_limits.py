"""Extreme and malformed trace input: one-line errors with a place, never a traceback or a wrap.

Each case came from an adversarial pass over the CLI; each failed (a traceback, a line-less
error, a wrapped-around number or an accepted overflow) before the validating layer checked it.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kvtier.errors import InputError
from kvtier.files import atomic_write
from kvtier.trace.format import MAX_TOKENS, Trace
from kvtier.trace.importers import import_trace
from kvtier.trace.io import read_trace, write_trace
from tests.helpers import assert_one_line_error, invoke

MOONCAKE_ROW = {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}


def _jsonl(tmp_path: Path, rows: list[str], name: str = "t.jsonl", raw: bytes | None = None) -> str:
    path = tmp_path / name
    path.write_bytes(raw if raw is not None else ("\n".join(rows) + "\n").encode())
    return str(path)


def _import(kind: str, path: str, tmp_path: Path):  # noqa: ANN202
    return invoke("trace", "import", "--from", kind, path, "-o", str(tmp_path / "out.parquet"))


def _row(**changes: object) -> str:
    return json.dumps({**MOONCAKE_ROW, **changes})


# -- token counts: a documented bound, checked before any cast ----------------------------------
def _azure(tmp_path: Path, rows: list[tuple[str, str, str]]) -> str:
    path = tmp_path / "azure.csv"
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens", *(",".join(r) for r in rows)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_huge_token_counts_in_a_no_prefix_trace_are_refused(tmp_path: Path) -> None:
    """The three rows that made the numba kernel write out of bounds (exit 139)."""
    path = _azure(
        tmp_path,
        [
            ("2023-11-16 18:15:46.0", "4611686018427387904", "4611686018427387906"),
            ("2023-11-16 18:15:46.5", "64", "8"),
            ("2023-11-16 18:15:47.0", "4611686018427387904", "4611686018427387904"),
        ],
    )
    result = _import("azure", path, tmp_path)
    assert_one_line_error(result, "azure.csv", "line 2", "ContextTokens", "supported maximum")


@pytest.mark.parametrize(
    ("column", "dtype", "value", "needle"),
    [
        ("input_tokens", pa.int64(), 2**63 - 1, "supported maximum"),
        ("input_tokens", pa.uint64(), 2**64 - 1, "supported maximum"),
        ("output_tokens", pa.uint64(), 2**64 - 1, "supported maximum"),
        ("input_tokens", pa.int64(), MAX_TOKENS + 1, f"{MAX_TOKENS:,}"),
        ("input_tokens", pa.uint64(), 0, "must be > 0"),
        ("output_tokens", pa.int64(), -1, "must be >= 0"),
    ],
)
def test_token_counts_are_bounded_in_their_own_type(
    tmp_path: Path, column: str, dtype: pa.DataType, value: int, needle: str
) -> None:
    table = pa.table(
        {
            "arrival_s": pa.array([0.0, 1.0]),
            "input_tokens": pa.array([5, 7], type=pa.int64()),
            "output_tokens": pa.array([1, 1], type=pa.int64()),
            "block_hashes": pa.array([[], []], type=pa.list_(pa.uint64())),
        }
    )
    values = table.column(column).to_pylist()
    values[1] = value
    table = table.set_column(table.schema.get_field_index(column), column, pa.array(values, dtype))
    with pytest.raises(InputError) as err:
        Trace.from_table(table, block_tokens=16, has_prefix_info=False, path="t.parquet")
    assert err.value.row == 1 and err.value.column == column
    assert needle in str(err.value)
    assert "-" not in str(err.value).split(":")[-1].replace("must be >= 0", "")  # no wrap-around


def test_the_largest_supported_count_is_accepted() -> None:
    table = pa.table(
        {
            "arrival_s": pa.array([0.0]),
            "input_tokens": pa.array([MAX_TOKENS]),
            "output_tokens": pa.array([MAX_TOKENS]),
            "block_hashes": pa.array([[]], type=pa.list_(pa.uint64())),
        }
    )
    trace = Trace.from_table(table, block_tokens=16, has_prefix_info=False)
    assert int(trace.input_tokens[0]) == MAX_TOKENS


def _prefix_free_table(**extra: pa.Array) -> pa.Table:
    return pa.table(
        {
            "arrival_s": pa.array([0.0, 1.0]),
            "input_tokens": pa.array([5, 7]),
            "output_tokens": pa.array([1, 1]),
            "block_hashes": pa.array([[], []], type=pa.list_(pa.uint64())),
            **extra,
        }
    )


def test_uint64_session_ids_beyond_int64_are_refused_and_others_normalised() -> None:
    big = _prefix_free_table(session_id=pa.array([1, 2**64 - 1], type=pa.uint64()))
    with pytest.raises(InputError, match="does not fit int64") as err:
        Trace.from_table(big, block_tokens=16, has_prefix_info=False)
    assert err.value.row == 1
    ok = Trace.from_table(
        _prefix_free_table(session_id=pa.array([1, 2], type=pa.uint64())),
        block_tokens=16,
        has_prefix_info=False,
    )
    assert ok.table.schema.field("session_id").type == pa.int64()


# -- trace files: metadata ------------------------------------------------------------------------
def _write_with_metadata(tmp_path: Path, meta: dict[bytes, bytes]) -> str:
    table = _prefix_free_table()
    path = tmp_path / "meta.parquet"
    pq.write_table(table.replace_schema_metadata(meta), path)
    return str(path)


@pytest.mark.parametrize(
    ("meta", "needle"),
    [
        ({b"kvtier.format": b"request-trace/1", b"note": b"\xff\xfe"}, "not valid UTF-8"),
        (
            {b"kvtier.format": b"request-trace/1", b"kvtier.block_tokens": b"9" * 20},
            "kvtier.block_tokens",
        ),
        (
            {b"kvtier.format": b"request-trace/1", b"kvtier.block_tokens": b"0"},
            "kvtier.block_tokens",
        ),
    ],
)
def test_bad_trace_metadata_is_one_line(tmp_path: Path, meta: dict, needle: str) -> None:
    path = _write_with_metadata(tmp_path, meta)
    result = invoke("trace", "stats", path)
    assert_one_line_error(result, "meta.parquet", needle)


# -- importers ------------------------------------------------------------------------------------
def test_gzipped_jsonl_is_read_as_the_plain_file(tmp_path: Path) -> None:
    rows = [_row(), _row(timestamp=1000, hash_ids=[1, 3])]
    plain = _jsonl(tmp_path, rows)
    packed = tmp_path / "t.jsonl.gz"
    packed.write_bytes(gzip.compress(Path(plain).read_bytes()))
    assert import_trace("mooncake", packed).table.equals(import_trace("mooncake", plain).table)


def test_non_utf8_jsonl_names_its_line(tmp_path: Path) -> None:
    raw = (_row() + "\n").encode() + b'{"timestamp": 1, "x": "\xff"}\n'
    result = _import("mooncake", _jsonl(tmp_path, [], raw=raw), tmp_path)
    assert_one_line_error(result, "t.jsonl", "line 2", "UTF-8")


def test_corrupt_gzip_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    path.write_bytes(gzip.compress(b"x" * 100)[:20])
    assert_one_line_error(_import("mooncake", str(path), tmp_path), "t.jsonl.gz", "gzip")


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_jsonl_with_a_byte_order_mark_reads(tmp_path: Path, newline: str) -> None:
    text = newline.join([_row(), _row(timestamp=1000, hash_ids=[1, 3])]) + newline
    path = _jsonl(tmp_path, [], raw=b"\xef\xbb\xbf" + text.encode())
    assert import_trace("mooncake", path).n_requests == 2


@pytest.mark.parametrize(
    ("bad", "column", "needle"),
    [
        (_row(hash_ids=[1, 2**63]), "hash_ids", "does not fit int64"),
        (
            '{"timestamp": NaN, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}',
            "timestamp",
            "not a finite number",
        ),
        (_row(output_length=2**64), "output_length", "does not fit int64"),
    ],
)
def test_jsonl_values_out_of_range_name_line_and_field(
    tmp_path: Path, bad: str, column: str, needle: str
) -> None:
    path = _jsonl(tmp_path, [_row(), "   ", bad])
    assert_one_line_error(_import("mooncake", path, tmp_path), "line 3", column, needle)


def test_whitespace_only_lines_are_blank_and_later_errors_keep_their_line(tmp_path: Path) -> None:
    path = _jsonl(tmp_path, [_row(), "  \t ", _row(timestamp=1000, hash_ids=[1, 3])])
    assert import_trace("mooncake", path).n_requests == 2
    bad = _jsonl(tmp_path, [_row(), "  \t ", '{"timestamp": 1'], name="bad.jsonl")
    assert_one_line_error(_import("mooncake", bad, tmp_path), "line 3", "malformed JSON")


def test_azure_header_only_is_one_line(tmp_path: Path) -> None:
    path = _azure(tmp_path, [])
    assert_one_line_error(_import("azure", path, tmp_path), "azure.csv", "no requests")


def test_azure_ragged_row_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.0,64,8\n"
        "2023-11-16 18:15:46.5,64,8,99\n"
    )
    assert_one_line_error(_import("azure", str(path), tmp_path), "line 3", "4 fields")


def test_azure_quoted_newline_keeps_later_line_numbers_right(tmp_path: Path) -> None:
    path = tmp_path / "azure.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens,Note\n"
        '2023-11-16 18:15:46.0,64,8,"two\nlines"\n'
        "2023-11-16 18:15:46.5,sixty,8,x\n"
    )
    assert_one_line_error(_import("azure", str(path), tmp_path), "line 4", "ContextTokens")


# -- outputs --------------------------------------------------------------------------------------
def _small_trace() -> Trace:
    return Trace.from_table(_prefix_free_table(), block_tokens=16, has_prefix_info=False)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_unwritable_directory_is_an_input_error(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    with pytest.raises(InputError, match="cannot write"):
        write_trace(_small_trace(), ro / "t.parquet")


def test_output_under_a_file_is_one_line(tmp_path: Path) -> None:
    """A path whose parent is a file cannot be written (works as root too)."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = invoke("trace", "synth", "short", "--requests", "5", "-o", str(blocker / "t.parquet"))
    assert_one_line_error(result, "cannot write")
    azure = _azure(tmp_path, [("2023-11-16 18:15:46.0", "64", "8")])
    result = invoke("trace", "import", "--from", "azure", azure, "-o", str(blocker / "t.parquet"))
    assert_one_line_error(result, "cannot write")


def test_full_disk_leaves_nothing_behind(tmp_path: Path) -> None:
    def fill(tmp: str) -> None:
        Path(tmp).write_text("partial")
        raise OSError(28, "No space left on device")

    with pytest.raises(InputError, match="No space left on device"):
        atomic_write(tmp_path / "out.bin", fill)
    assert list(tmp_path.iterdir()) == []


def test_atomic_write_fsyncs_before_the_rename(tmp_path: Path, monkeypatch) -> None:
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(
        os, "replace", lambda a, b: (calls.append("replace"), real_replace(a, b))[1]
    )
    atomic_write(tmp_path / "x.txt", lambda tmp: Path(tmp).write_text("hello"))
    assert calls[:2] == ["fsync", "replace"]
    assert (tmp_path / "x.txt").read_text() == "hello"


def test_written_trace_reads_back(tmp_path: Path) -> None:
    trace = _small_trace()
    write_trace(trace, tmp_path / "t.parquet")
    assert np.array_equal(read_trace(tmp_path / "t.parquet").input_tokens, trace.input_tokens)


# -- options --------------------------------------------------------------------------------------
def test_trace_stats_block_size_zero_is_refused_as_replay_and_mrc_refuse_it(tmp_path: Path) -> None:
    path = str(tmp_path / "t.parquet")
    write_trace(_small_trace(), path)
    assert_one_line_error(invoke("trace", "stats", path, "-B", "0"), "--block-tokens", ">= 1")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["short", "--system-tokens", "1e12"], "--system-tokens"),
        (["rag", "--doc-tokens", "1e9", "--docs-per-request", "4"], "supported maximum"),
    ],
)
def test_synth_lengths_beyond_the_largest_request_are_one_line(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    out = tmp_path / "t.parquet"
    result = invoke("trace", "synth", *args, "--requests", "5", "-o", str(out))
    assert_one_line_error(result, needle)
    assert not out.exists()
