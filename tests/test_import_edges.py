"""Edges of the request-log importers, in memory and streamed alike: blank CSV lines, duplicate
JSON keys, fields a format does not use, mixed Parquet parts, mixed timestamp kinds, outputs
under a file."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.errors import InputError
from kvtier.trace.importers import ImportOptions, import_trace, parse_columns, stream_plan
from kvtier.trace.streaming import stream_import

AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens"
AZURE_ROWS = [
    "2024-05-10 00:00:00.000000+00:00,100,5",
    "2024-05-10 00:00:01.500000+00:00,200,6",
    "2024-05-10 00:00:02.000000+00:00,300,7",
]


def _both(path: str, kind: str = "azure", columns: str | None = None) -> list[list]:
    """The imported (input, output) tokens of ``path``, in memory and streamed."""
    options = ImportOptions(columns=parse_columns(columns) if columns else {})
    memory = import_trace(kind, path, options)
    plan = stream_plan(kind, path, options, True)
    out = str(Path(path).with_suffix(".streamed.parquet"))
    stream_import(path, plan, out, batch_rows=2)
    from kvtier.trace.io import read_trace

    streamed = read_trace(out)
    return [
        [t.table.column(c).to_pylist() for c in ("arrival_s", "input_tokens", "output_tokens")]
        for t in (memory, streamed)
    ]


@pytest.mark.parametrize(
    "text",
    [
        "\n".join([AZURE_HEAD, *AZURE_ROWS]) + "\n\n",  # a trailing blank line
        "\r\n".join([AZURE_HEAD, AZURE_ROWS[0], "", AZURE_ROWS[1], " \t", AZURE_ROWS[2]]) + "\r\n",
        "\n".join([AZURE_HEAD, AZURE_ROWS[0], "", "", AZURE_ROWS[1], AZURE_ROWS[2], "   "]),
    ],
)
def test_blank_csv_lines_are_skipped_in_memory_and_streamed(tmp_path: Path, text: str) -> None:
    path = tmp_path / "a.csv"
    path.write_bytes(text.encode())
    memory, streamed = _both(str(path))
    assert memory == streamed
    assert memory[1] == [100, 200, 300] and memory[0] == [0.0, 1.5, 2.0]


def test_blank_lines_keep_line_numbers_and_quoted_files_skip_them(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    rows = [AZURE_HEAD, AZURE_ROWS[0], "", AZURE_ROWS[1], "", '"2024-05-10 00:00:03+00:00",x,1']
    path.write_text("\n".join(rows) + "\n\n")
    with pytest.raises(InputError) as memory:
        import_trace("azure", str(path))
    assert memory.value.line == 6 and memory.value.column == "ContextTokens"
    plan = stream_plan("azure", str(path), ImportOptions(), True)
    with pytest.raises(InputError) as streamed:
        stream_import(str(path), plan, str(tmp_path / "s.parquet"), batch_rows=2)
    assert streamed.value.line == 6 and streamed.value.column == "ContextTokens"
    rows[-1] = '"2024-05-10 00:00:03+00:00",400,1'
    path.write_text("\n".join(rows) + "\n\n")
    memory_cols, streamed_cols = _both(str(path))
    assert memory_cols == streamed_cols and memory_cols[1] == [100, 200, 400]


def test_a_line_of_separators_only_is_still_malformed(tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("\n".join([AZURE_HEAD, AZURE_ROWS[0], ",,", AZURE_ROWS[1]]) + "\n")
    with pytest.raises(InputError) as memory:
        import_trace("azure", str(path))
    assert memory.value.line == 3
    plan = stream_plan("azure", str(path), ImportOptions(), True)
    with pytest.raises(InputError) as streamed:
        stream_import(str(path), plan, str(tmp_path / "s.parquet"))
    assert streamed.value.line == 3


def test_an_output_under_a_file_is_refused_in_one_line(tmp_path: Path) -> None:
    from kvtier.trace.io import write_trace
    from tests.helpers import assert_one_line_error, invoke

    path = tmp_path / "a.csv"
    path.write_text("\n".join([AZURE_HEAD, *AZURE_ROWS]) + "\n")
    (tmp_path / "f").write_text("x")
    out = str(tmp_path / "f" / "sub" / "t.parquet")
    for stream in ("--no-stream", "--stream"):
        result = invoke("trace", "import", "--from", "azure", str(path), stream, "-o", out)
        assert_one_line_error(result, "--output", f"{tmp_path / 'f'} is not a directory")
    with pytest.raises(InputError, match="f is a file, not a directory"):
        write_trace(import_trace("azure", str(path)), out)


@pytest.mark.parametrize("stream", [False, True])
def test_azure_mixing_naive_and_utc_offset_timestamps_is_refused_by_line(
    tmp_path: Path, stream: bool
) -> None:
    path = tmp_path / "a.csv"
    rows = [*AZURE_ROWS, "2024-05-10 00:00:03.000000,400,8", "2024-05-10 00:00:04+00:00,1,1"]
    path.write_text("\n".join([AZURE_HEAD, *rows]) + "\n")
    with pytest.raises(InputError, match="must not mix naive and UTC-offset") as err:
        if stream:
            plan = stream_plan("azure", str(path), ImportOptions(), True)
            stream_import(str(path), plan, str(tmp_path / "s.parquet"), batch_rows=2)
        else:
            import_trace("azure", str(path))
    assert err.value.line == 5 and err.value.column == "TIMESTAMP"
    assert "without a UTC offset, the first one with one" in str(err.value)


@pytest.mark.parametrize("stream", [False, True])
def test_dataset_parts_with_different_columns_are_refused(tmp_path: Path, stream: bool) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kvtier.trace.batches import iter_batches, open_batches
    from kvtier.trace.io import read_trace

    path = tmp_path / "a.csv"
    path.write_text("\n".join([AZURE_HEAD, *AZURE_ROWS]) + "\n")
    table = import_trace("azure", str(path)).table
    parts = tmp_path / "ds"
    parts.mkdir()
    pq.write_table(table, parts / "part-0.parquet")
    tenant = pa.array(["a"] * table.num_rows).dictionary_encode()
    pq.write_table(table.append_column("tenant", tenant), parts / "part-1.parquet")
    with pytest.raises(InputError) as err:
        if stream:
            list(iter_batches(open_batches(parts)))
        else:
            read_trace(parts)
    message = str(err.value)
    assert "part-1.parquet" in message and "part-0.parquet" in message
    assert "'tenant'" in message and "\n" not in message


MOONCAKE = '{"timestamp": %d, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]%s}'


def _jsonl(tmp_path: Path, extras: list[str]) -> str:
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(MOONCAKE % (i * 10, e) for i, e in enumerate(extras)) + "\n")
    return str(path)


def _import_jsonl(path: str, stream: bool, kind: str = "mooncake", columns: str = "") -> None:
    from kvtier.trace.jsonlstream import stream_import_jsonl

    options = ImportOptions(columns=parse_columns(columns) if columns else {})
    if stream:
        plan = stream_plan(kind, path, options, True)
        stream_import_jsonl(path, plan, str(Path(path).with_suffix(".parquet")), batch_rows=2)
    else:
        import_trace(kind, path, options)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("extra", "key"),
    [(', "input_length": 700', "input_length"), (', "note": 1, "note": 2', "note")],
)
def test_a_duplicate_json_key_is_refused_by_line_and_key(
    tmp_path: Path, stream: bool, extra: str, key: str
) -> None:
    path = _jsonl(tmp_path, ["", "", "", extra])
    with pytest.raises(InputError, match="key given twice") as err:
        _import_jsonl(path, stream)
    assert err.value.line == 4 and err.value.column == key


@pytest.mark.parametrize("stream", [False, True])
def test_a_duplicate_key_in_a_mapped_jsonl_log_is_refused(tmp_path: Path, stream: bool) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"t": 0, "i": 5, "o": 1}\n{"t": 1, "i": 5, "o": 1, "i": 9}\n')
    with pytest.raises(InputError, match="key given twice") as err:
        _import_jsonl(str(path), stream, "jsonl", "arrival=t,input=i,output=o")
    assert err.value.line == 2 and err.value.column == "i"


def test_same_key_in_different_nested_objects_and_in_string_values_is_fine(
    tmp_path: Path,
) -> None:
    path = _jsonl(tmp_path, [', "a": {"x": 1}, "b": {"x": 2}', ', "s": "\\"timestamp\\": 1"'])
    from kvtier.trace.importers.common import IgnoredFieldsNote

    for stream in (False, True):  # the note names the top-level fields only
        with pytest.warns(IgnoredFieldsNote, match="ignored: a, b, s$"):
            _import_jsonl(path, stream)


@pytest.mark.parametrize("stream", ["--no-stream", "--stream"])
def test_fields_a_format_does_not_read_are_named_once(tmp_path: Path, stream: str) -> None:
    from tests.helpers import invoke

    path = _jsonl(tmp_path, [', "tenant": "a"', "", ', "model": "m"', ', "tenant": "b"', ""])
    out = str(tmp_path / "o.parquet")
    sized = ["--batch-rows", "2"] if stream == "--stream" else []
    result = invoke("trace", "import", "--from", "mooncake", path, stream, *sized, "-o", out)
    notes = [ln for ln in result.stderr.splitlines() if ln.startswith("note:")]
    assert result.code == 0, result.stderr
    assert notes == [f"note: {path}: fields not read by this format, ignored: model, tenant"]


def test_a_log_with_only_the_fields_read_gets_no_note(tmp_path: Path) -> None:
    import warnings

    path = _jsonl(tmp_path, ["", ""])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _import_jsonl(path, False)
        _import_jsonl(path, True)
