"""BurstGPT, Azure 2024 and mapped CSV / JSON Lines logs: what they hold, and what they refuse."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from kvtier.errors import InputError
from kvtier.trace.importers import ImportOptions, import_trace, parse_columns
from kvtier.trace.importers.burstgpt import FailedRequestsWarning
from kvtier.trace.io import read_trace
from tests.helpers import assert_one_line_error, invoke

BURST_HEAD = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def _write(tmp_path: Path, name: str, lines: list[str]) -> str:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _import_cli(tmp_path: Path, *args: str):  # noqa: ANN202
    out = tmp_path / "out.parquet"
    return invoke("trace", "import", *args, "-o", str(out)), out


# -- BurstGPT -------------------------------------------------------------------------------------
def test_burstgpt_lengths_arrivals_and_kept_columns(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "burst.csv",
        [
            BURST_HEAD,
            "5,ChatGPT,472,18,490,Conversation log",
            "45,GPT-4,1087,230,1317,API log",
            "118,ChatGPT,0,0,0,Conversation log",  # a failed request
            "190,ChatGPT,417,276,693,Conversation log",
        ],
    )
    with pytest.warns(FailedRequestsWarning, match=r"1 failed requests.*line 4"):
        trace = import_trace("burstgpt", path)
    assert trace.n_requests == 3
    assert np.array_equal(trace.arrival_s, [0.0, 40.0, 185.0])
    assert np.array_equal(trace.input_tokens, [472, 1087, 417])
    assert np.array_equal(trace.output_tokens, [18, 230, 276])
    assert not trace.has_prefix_info
    assert trace.table.column("model").to_pylist() == ["ChatGPT", "GPT-4", "ChatGPT"]
    assert trace.metadata["burstgpt.failed_rows"] == "1"


def test_burstgpt_through_the_cli_round_trips_and_says_lengths_only(tmp_path: Path) -> None:
    path = _write(tmp_path, "b.csv", [BURST_HEAD, "0,ChatGPT,10,2,12,API log", "3,X,20,1,21,a"])
    result, out = _import_cli(tmp_path, "--from", "burstgpt", path)
    assert result.code == 0, result.stderr
    assert "lengths only" in result.stdout
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back, direct = read_trace(out).table, import_trace("burstgpt", path).table
    assert back.column_names == direct.column_names
    for name in back.column_names:
        assert back.column(name).to_pylist() == direct.column(name).to_pylist(), name


@pytest.mark.parametrize(
    ("row", "needles"),
    [
        ("7,ChatGPT,abc,1,1,x", ["line 3", "Request tokens", "not an integer"]),
        ("seven,ChatGPT,5,1,1,x", ["line 3", "Timestamp", "not a finite number"]),
        ("7,ChatGPT,5,-1,1,x", ["line 3", "Response tokens", ">= 0"]),
        ("7,ChatGPT,5,1,1", ["line 3", "5 fields"]),
    ],
)
def test_burstgpt_malformed_rows(tmp_path: Path, row: str, needles: list[str]) -> None:
    path = _write(tmp_path, "b.csv", [BURST_HEAD, "0,ChatGPT,10,2,12,API log", row])
    result, out = _import_cli(tmp_path, "--from", "burstgpt", path)
    assert_one_line_error(result, "b.csv", *needles)
    assert not out.exists()


def test_burstgpt_missing_column_lists_the_file_columns(tmp_path: Path) -> None:
    path = _write(tmp_path, "b.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", "x,1,1"])
    result, _ = _import_cli(tmp_path, "--from", "burstgpt", path)
    assert_one_line_error(result, "column 'Timestamp'", "missing column", "ContextTokens")


# -- Azure 2024 -----------------------------------------------------------------------------------
def test_azure_2024_timestamps_with_utc_offsets_and_optional_fractions(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "code_1week.csv",
        [
            "TIMESTAMP,ContextTokens,GeneratedTokens",
            "2024-05-10 00:00:00.009930+00:00,2048,28",
            "2024-05-10 00:00:01+00:00,1024,4",
            "2024-05-10 02:00:01.5+02:00,512,1",  # the same instant as 00:00:01.5 UTC
        ],
    )
    trace = import_trace("azure", path)
    assert trace.arrival_s == pytest.approx([0.0, 0.99007, 1.49007], abs=1e-9)
    assert np.array_equal(trace.input_tokens, [2048, 1024, 512])


def test_azure_options_that_do_not_apply_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "a.csv", ["TIMESTAMP,ContextTokens,GeneratedTokens", "x,1,1"])
    result, _ = _import_cli(tmp_path, "--from", "azure", path, "--columns", "arrival=TIMESTAMP")
    assert_one_line_error(result, "--columns", "does not apply to --from azure")
    with pytest.raises(InputError, match="--tokenizer"):
        import_trace("azure", path, ImportOptions(tokenizer="t.json"))


# -- mapped CSV and JSON Lines --------------------------------------------------------------------
def test_mapped_csv_with_spaces_in_names_ms_arrivals_and_tenants(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "log.csv",
        [
            "when ms,prompt tokens,completion tokens,user,conv",
            "1000,100,10,alice,7",
            "1250,200,20,bob,7",
            "3000,300,30,alice,8",
        ],
    )
    spec = (
        "arrival=when ms,arrival_unit=ms,input=prompt tokens,output=completion tokens,"
        "tenant=user,session_id=conv"
    )
    result, out = _import_cli(tmp_path, "--from", "csv", path, "--columns", spec)
    assert result.code == 0, result.stderr
    trace = read_trace(out)
    assert trace.arrival_s == pytest.approx([0.0, 0.25, 2.0])
    assert trace.table.column("tenant").to_pylist() == ["alice", "bob", "alice"]
    assert trace.table.column("session_id").to_pylist() == [7, 7, 8]


def test_mapped_jsonl_with_chained_hash_ids(tmp_path: Path) -> None:
    rows = [
        {"t": 0.5, "in": 40, "out": 3, "ids": [1, 2, 3]},
        {"t": 1.5, "in": 33, "out": 3, "ids": [1, 2, 4]},
    ]
    path = _write(tmp_path, "log.jsonl", [json.dumps(r) for r in rows])
    columns = parse_columns("arrival=t,input=in,output=out,hashes=ids,block_tokens=16")
    trace = import_trace("jsonl", path, ImportOptions(columns=columns))
    assert trace.has_prefix_info and trace.block_tokens == 16
    assert trace.table.column("block_hashes").to_pylist() == [[1, 2, 3], [1, 2, 4]]
    assert trace.arrival_s == pytest.approx([0.0, 1.0])


@pytest.mark.parametrize(
    ("spec", "needles"),
    [
        ("arrival=t,input=in", ["field 'output' is required", "valid:"]),
        ("arrival=t,input=in,output=out,colour=x", ["unknown field 'colour'", "tenant"]),
        ("arrival=t,input=in,output=out,arrival_unit=h", ["arrival_unit", "timestamp, s, ms"]),
        ("arrival=t,input=in,output=out,hashes=ids", ["block_tokens"]),
        ("arrival=t,input", ["expected FIELD=COLUMN"]),
        ("arrival=t,arrival=u,input=in,output=out", ["given twice"]),
    ],
)
def test_bad_column_mappings_are_one_line(tmp_path: Path, spec: str, needles: list[str]) -> None:
    path = _write(tmp_path, "log.jsonl", [json.dumps({"t": 0, "in": 4, "out": 1, "ids": [1]})])
    result, _ = _import_cli(tmp_path, "--from", "jsonl", path, "--columns", spec)
    assert_one_line_error(result, "--columns", *needles)


def test_mapped_csv_needs_a_mapping_and_names_bad_values_by_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "log.csv", ["a,b,c", "0,5,1", "1,five,1"])
    result, _ = _import_cli(tmp_path, "--from", "csv", path)
    assert_one_line_error(result, "--columns", "needs --columns")
    result, _ = _import_cli(
        tmp_path, "--from", "csv", path, "--columns", "arrival=a,input=b,output=c"
    )
    assert_one_line_error(result, "log.csv", "line 3", "column 'b'", "not an integer")


def test_mapped_jsonl_malformed_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "log.jsonl", [json.dumps({"t": 0, "in": 4, "out": 1}), '{"t": 1,'])
    result, _ = _import_cli(
        tmp_path, "--from", "jsonl", path, "--columns", "arrival=t,input=in,output=out"
    )
    assert_one_line_error(result, "log.jsonl", "line 2", "malformed JSON")
