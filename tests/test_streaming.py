"""Streamed imports equal in-memory ones; errors in any batch name their line; datasets read."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kvtier.errors import InputError
from kvtier.policy.file import sha256_of
from kvtier.trace.importers import ImportOptions, import_trace, parse_columns, stream_plan
from kvtier.trace.io import read_trace, write_trace
from kvtier.trace.streaming import stream_import
from kvtier.trace.synth import synthesize
from tests.helpers import assert_one_line_error, invoke

AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens"


def _azure_rows(n: int, start: int = 0) -> list[str]:
    rng = np.random.default_rng(start)
    rows = []
    for i in range(start, start + n):
        sec = i * 0.37
        stamp = f"2024-05-10 {int(sec // 3600):02d}:{int(sec % 3600 // 60):02d}:{sec % 60:09.6f}"
        rows.append(f"{stamp}+00:00,{rng.integers(1, 9000)},{rng.integers(0, 500)}")
    return rows


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _columns_equal(a, b) -> None:  # noqa: ANN001
    assert a.table.column_names == b.table.column_names
    for name in a.table.column_names:
        assert a.table.column(name).to_pylist() == b.table.column(name).to_pylist(), name
    assert a.table.schema.metadata == b.table.schema.metadata


def test_streamed_azure_equals_the_in_memory_import_across_batches(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.csv", [AZURE_HEAD, *_azure_rows(2_500)])
    plan = stream_plan("azure", path, ImportOptions(), True)
    summary = stream_import(path, plan, str(tmp_path / "s.parquet"), batch_rows=700)
    assert summary.n_requests == 2_500
    assert pq.ParquetFile(tmp_path / "s.parquet").metadata.num_row_groups >= 3
    _columns_equal(read_trace(tmp_path / "s.parquet"), import_trace("azure", path))


def test_streamed_errors_in_a_later_batch_name_their_line(tmp_path: Path) -> None:
    rows = _azure_rows(2_000)
    rows[1_500] = rows[1_500].split(",")[0] + ",lots,5"
    path = _write(tmp_path / "a.csv", [AZURE_HEAD, *rows])
    plan = stream_plan("azure", path, ImportOptions(), True)
    with pytest.raises(InputError) as err:
        stream_import(path, plan, str(tmp_path / "s.parquet"), batch_rows=512)
    assert err.value.line == 1_502 and err.value.column == "ContextTokens"
    assert not (tmp_path / "s.parquet").exists()


def test_streamed_import_refuses_unsorted_rows_by_line(tmp_path: Path) -> None:
    rows = _azure_rows(50)
    rows[30], rows[31] = rows[31], rows[30]
    path = _write(tmp_path / "a.csv", [AZURE_HEAD, *rows])
    result = invoke(
        "trace", "import", "--from", "azure", path, "--stream", "-o", str(tmp_path / "s.parquet")
    )
    assert_one_line_error(result, "line 33", "TIMESTAMP", "arrival order")


@pytest.mark.parametrize(
    ("bad", "needle"),
    [("0", "must be > 0"), ("4611686018427387904", "supported maximum")],
)
def test_streamed_bounds_as_in_memory(tmp_path: Path, bad: str, needle: str) -> None:
    rows = _azure_rows(10)
    rows[4] = rows[4].split(",")[0] + f",{bad},5"
    path = _write(tmp_path / "a.csv", [AZURE_HEAD, *rows])
    result = invoke(
        "trace", "import", "--from", "azure", path, "--stream", "-o", str(tmp_path / "s.parquet")
    )
    assert_one_line_error(result, "line 6", "ContextTokens", needle)


def _raw(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize(
    ("last", "needles"),
    [
        # a row with a field too many or too few, as the in-memory import reports it
        (b",1,2,3", ("line 3", "row has 4 fields, the header 3")),
        (b",1", ("line 3", "row has 2 fields, the header 3")),
        (b",1\xff2,3", ("line 3", "not UTF-8")),
        (None, ("empty file",)),
    ],
)
def test_streamed_csv_errors_name_their_line_as_in_memory(
    tmp_path: Path, last: bytes | None, needles: tuple[str, ...]
) -> None:
    rows = _azure_rows(2)
    data = b""
    if last is not None:
        stamp = rows[1].split(",")[0].encode()
        data = b"\n".join([AZURE_HEAD.encode(), rows[0].encode(), stamp + last]) + b"\n"
    path = _raw(tmp_path / "a.csv", data)
    for stream in ("--stream", "--no-stream"):
        out = tmp_path / "s.parquet"
        result = invoke("trace", "import", "--from", "azure", path, stream, "-o", str(out))
        assert_one_line_error(result, *needles)
        assert not out.exists()


def test_streamed_csv_reads_a_quoted_header_as_in_memory(tmp_path: Path) -> None:
    head = ",".join(f'"{name}"' for name in AZURE_HEAD.split(","))
    path = _write(tmp_path / "a.csv", [head, *_azure_rows(20)])
    plan = stream_plan("azure", path, ImportOptions(), True)
    stream_import(path, plan, str(tmp_path / "s.parquet"), batch_rows=7)
    _columns_equal(read_trace(tmp_path / "s.parquet"), import_trace("azure", path))


def test_a_streamed_gzip_csv_is_refused_and_imports_in_memory(tmp_path: Path) -> None:
    """polars scans plain text only; decompressing the whole file would break the bound."""
    import gzip

    text = "\n".join([AZURE_HEAD, *_azure_rows(20)]) + "\n"
    path = _raw(tmp_path / "a.csv.gz", gzip.compress(text.encode()))
    out = tmp_path / "s.parquet"
    result = invoke("trace", "import", "--from", "azure", path, "--stream", "-o", str(out))
    assert_one_line_error(result, "--stream", "gzip", "--no-stream")
    assert not out.exists()
    result = invoke("trace", "import", "--from", "azure", path, "-o", str(out))
    assert result.code == 0, result.stderr
    assert read_trace(out).n_requests == 20


def test_streamed_burstgpt_leaves_out_failed_requests(tmp_path: Path) -> None:
    head = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"
    rows = [f"{i},ChatGPT,{0 if i % 5 == 0 else 10 + i},3,0,API log" for i in range(1, 40)]
    path = _write(tmp_path / "b.csv", [head, *rows])
    plan = stream_plan("burstgpt", path, ImportOptions(), True)
    with pytest.warns(UserWarning, match="left out 7 failed requests"):
        summary = stream_import(path, plan, str(tmp_path / "s.parquet"), batch_rows=8)
    assert summary.n_requests == 32 and summary.failed_rows == 7
    trace = read_trace(tmp_path / "s.parquet")
    assert trace.input_tokens.min() > 0


def test_streamed_mapped_csv_and_what_cannot_stream(tmp_path: Path) -> None:
    path = _write(tmp_path / "l.csv", ["ms,in,out", "0,5,1", "250,6,2", "1000,7,3"])
    options = ImportOptions(columns=parse_columns("arrival=ms,arrival_unit=ms,input=in,output=out"))
    plan = stream_plan("csv", path, options, True)
    stream_import(path, plan, str(tmp_path / "s.parquet"))
    assert read_trace(tmp_path / "s.parquet").arrival_s.tolist() == [0.0, 0.25, 1.0]
    result = invoke(
        "trace", "import", "--from", "sharegpt", path, "--stream", "-o", str(tmp_path / "m.parquet")
    )
    assert_one_line_error(result, "--stream", "does not stream")


def test_small_files_import_in_memory_by_default(tmp_path: Path) -> None:
    path = _write(tmp_path / "a.csv", [AZURE_HEAD, *_azure_rows(5)])
    assert stream_plan("azure", path, ImportOptions(), None) is None
    assert stream_plan("azure", path, ImportOptions(), False) is None


def test_a_directory_of_parquet_parts_reads_as_one_trace(tmp_path: Path) -> None:
    trace = synthesize("chat", requests=300, seed=2)
    parts = tmp_path / "dataset"
    parts.mkdir()
    table = trace.table
    for i, start in enumerate(range(0, 300, 100)):
        pq.write_table(table.slice(start, 100), parts / f"part-{i}.parquet")
    whole = read_trace(parts)
    assert whole.n_requests == 300
    assert (
        whole.table.column("block_hashes").to_pylist() == table.column("block_hashes").to_pylist()
    )
    digest = sha256_of(parts)
    (parts / "part-1.parquet").write_bytes((parts / "part-1.parquet").read_bytes())
    assert sha256_of(parts) == digest
    result = invoke("trace", "stats", str(parts), "--json")
    assert result.code == 0, result.stderr


def test_a_directory_of_different_traces_is_refused(tmp_path: Path) -> None:
    parts = tmp_path / "dataset"
    parts.mkdir()
    write_trace(synthesize("chat", requests=20, seed=1), parts / "a.parquet")
    write_trace(synthesize("chat", requests=20, seed=1, block_tokens=32), parts / "b.parquet")
    assert_one_line_error(invoke("trace", "stats", str(parts)), "b.parquet", "not parts of one")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(invoke("trace", "stats", str(empty)), "no .parquet files")


def test_a_streamed_csv_import_creates_the_output_directory_or_says_why_not(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path / "a.csv", [AZURE_HEAD, *_azure_rows(5)])
    out = tmp_path / "new" / "dir" / "s.parquet"
    result = invoke("trace", "import", "--from", "azure", path, "--stream", "-o", str(out))
    assert result.code == 0, result.stderr
    assert read_trace(out).n_requests == 5
    (tmp_path / "file").write_text("")
    bad = tmp_path / "file" / "s.parquet"
    result = invoke("trace", "import", "--from", "azure", path, "--stream", "-o", str(bad))
    assert_one_line_error(result, "--output", "not a directory")


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_a_column_named_twice_in_the_header_is_refused(tmp_path: Path, stream: str) -> None:
    """A CSV reader keeps one of two same-named columns; the other's values would be lost."""
    rows = [f"{row},7" for row in _azure_rows(5)]
    path = _write(tmp_path / "a.csv", [AZURE_HEAD + ",ContextTokens", *rows])
    out = tmp_path / "s.parquet"
    result = invoke("trace", "import", "--from", "azure", path, stream, "-o", str(out))
    assert_one_line_error(result, "line 1", "ContextTokens", "named twice")
    assert not out.exists()


def _long_csv(path: Path, rows: int, *, bad_row: int | None, malformed_end: bool) -> str:
    with open(path, "w") as f:
        f.write("ts,inp,out\n")
        for i in range(rows):
            inp = "x" if i == bad_row else str(10 + i % 4000)
            f.write(f"{i * 0.01:.2f},{inp},{1 + i % 50}\n")
        if malformed_end:
            f.write('1e9,"unterminated,5\n')
    return str(path)


def test_a_bad_row_near_the_start_is_reported_before_the_whole_file_is_parsed(
    tmp_path: Path,
) -> None:
    """The first rows are checked first: a bad value in line 4 is the error, not the malformed
    line at the end of the file that the whole parse would meet first."""
    from kvtier.trace.streaming import HEAD_ROWS

    rows = HEAD_ROWS + 5000
    log = _long_csv(tmp_path / "log.csv", rows, bad_row=2, malformed_end=True)
    cols = ("--columns", "arrival=ts,input=inp,output=out")
    r = invoke(
        "trace",
        "import",
        "--from",
        "csv",
        log,
        "-o",
        str(tmp_path / "o.parquet"),
        *cols,
        "--stream",
    )
    assert_one_line_error(r, "line 4", "'inp'", "not an integer")
    # with the start clean the malformed end is still found, by the whole parse
    log = _long_csv(tmp_path / "end.csv", rows, bad_row=None, malformed_end=True)
    r = invoke(
        "trace",
        "import",
        "--from",
        "csv",
        log,
        "-o",
        str(tmp_path / "e.parquet"),
        *cols,
        "--stream",
    )
    assert_one_line_error(r, f"line {rows + 2}")


def test_the_first_rows_are_checked_once_and_counted_once(tmp_path: Path) -> None:
    from kvtier.trace.progress import Meter, metering
    from kvtier.trace.streaming import HEAD_ROWS

    rows = HEAD_ROWS + 123
    log = _long_csv(tmp_path / "ok.csv", rows, bad_row=None, malformed_end=False)
    plan = stream_plan(
        "csv", log, ImportOptions(columns=parse_columns("arrival=ts,input=inp,output=out")), True
    )
    with metering(Meter()) as meter:
        done = stream_import(log, plan, str(tmp_path / "ok.parquet"))
    assert done.n_requests == rows and meter.rows == rows
    assert read_trace(str(tmp_path / "ok.parquet")).n_requests == rows
