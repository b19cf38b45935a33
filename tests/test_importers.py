"""Importers, on the real public traces where we have them and on small written files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kvtier.errors import InputError
from kvtier.trace.importers import import_trace
from kvtier.trace.io import read_trace
from tests.helpers import assert_one_line_error, invoke

PUBLIC = Path(__file__).resolve().parents[2] / "shared" / "traces-public"
MOONCAKE = PUBLIC / "mooncake-fast25" / "conversation_trace.jsonl"
AZURE_CONV = PUBLIC / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = PUBLIC / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"
BUNDLED = Path(__file__).resolve().parents[1] / "traces" / "mooncake-conversation.parquet"

needs_public = pytest.mark.skipif(not MOONCAKE.exists(), reason="public traces not present")


@needs_public
def test_mooncake_conversation_trace(tmp_path) -> None:
    trace = import_trace("mooncake", MOONCAKE)
    assert trace.n_requests == 12_031
    assert trace.duration_s == pytest.approx(3_537.0, abs=0.5)
    assert trace.block_tokens == 512
    assert trace.input_tokens.mean() == pytest.approx(12_035, abs=1)  # traces/README.md
    first = json.loads(MOONCAKE.read_text().splitlines()[0])
    assert trace.table.column("block_hashes")[0].as_py() == first["hash_ids"]
    assert trace.input_tokens[0] == first["input_length"]
    # the CLI writes a file that reads back identically
    out = tmp_path / "m.parquet"
    result = invoke("trace", "import", "--from", "mooncake", str(MOONCAKE), "-o", str(out))
    assert result.code == 0, result.stderr
    assert read_trace(out).table.equals(trace.table)


@needs_public
def test_bundled_mooncake_copy_is_current() -> None:
    assert read_trace(BUNDLED).table.equals(import_trace("mooncake", MOONCAKE).table)


@needs_public
@pytest.mark.parametrize(("path", "rows"), [(AZURE_CONV, 19_366), (AZURE_CODE, 8_819)])
def test_azure_traces(path: Path, rows: int) -> None:
    trace = import_trace("azure", path)
    assert trace.n_requests == rows
    assert not trace.has_prefix_info
    assert trace.table.schema.metadata[b"kvtier.prefix_info"] == b"false"
    assert trace.hash_arrays()[1].size == 0
    assert trace.arrival_s[0] == 0.0
    assert 3_000 < trace.duration_s < 4_000  # about one hour


def _write_lines(tmp_path: Path, name: str, lines: list[str]) -> str:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _bailian_row(chat: int, parent: int, t: float, ids: list[int], n: int, turn: int) -> str:
    return json.dumps(
        {
            "chat_id": chat,
            "parent_chat_id": parent,
            "timestamp": t,
            "input_length": n,
            "output_length": 5,
            "type": "text",
            "turn": turn,
            "hash_ids": ids,
        }
    )


def test_bailian_sessions_chaining_and_type(tmp_path) -> None:
    lines = [
        _bailian_row(10, -1, 0.0, [1, 2], 20, 1),
        _bailian_row(11, -1, 0.5, [3, 2], 32, 1),  # block 2 again, after another prefix
        _bailian_row(12, 10, 1.0, [1, 2, 4], 40, 2),
        _bailian_row(13, 12, 2.0, [1, 2, 4, 5], 64, 3),
        _bailian_row(14, 99, 3.0, [6], 3, 2),  # parent outside the trace window
    ]
    trace = import_trace("bailian", _write_lines(tmp_path, "b.jsonl", lines))
    assert trace.block_tokens == 16
    assert trace.table.column("session_id").to_pylist() == [10, 11, 10, 10, 14]
    assert trace.table.column("request_id").to_pylist() == [10, 11, 12, 13, 14]
    assert trace.table.column("type").to_pylist() == ["text"] * 5
    h = trace.table.column("block_hashes").to_pylist()
    assert h[0] == h[2][:2] == h[3][:2]  # same content prefix, same chained hashes
    assert h[1][1] != h[0][1]  # same block content after a different prefix: not shared


def test_bailian_cycle_is_refused(tmp_path) -> None:
    lines = [_bailian_row(1, 2, 0.0, [1], 10, 1), _bailian_row(2, 1, 1.0, [1], 10, 1)]
    with pytest.raises(InputError, match="cycle"):
        import_trace("bailian", _write_lines(tmp_path, "c.jsonl", lines))


GOOD = '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}'


@pytest.mark.parametrize(
    ("bad", "needles"),
    [
        (
            '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]',
            ["line 3", "malformed JSON"],
        ),
        (
            '{"timestamp": 0, "input_length": "x", "output_length": 5, "hash_ids": [0, 1]}',
            ["line 3", "input_length"],
        ),
        ('{"timestamp": 0, "output_length": 5, "hash_ids": [0, 1]}', ["line 3", "input_length"]),
        (
            '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0]}',
            ["line 3", "hash_ids", "expected ceil"],
        ),
        (
            '{"timestamp": 0, "input_length": 600, "output_length": -1, "hash_ids": [0, 1]}',
            ["line 3", "output_length"],
        ),
        (
            '{"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [0, -1]}',
            ["line 3", "negative hash"],
        ),
    ],
)
def test_mooncake_malformed_line_is_reported(tmp_path, bad: str, needles: list[str]) -> None:
    path = _write_lines(tmp_path, "m.jsonl", [GOOD, "", bad, GOOD])
    with pytest.raises(InputError):
        import_trace("mooncake", path)
    result = invoke(
        "trace", "import", "--from", "mooncake", path, "-o", str(tmp_path / "o.parquet")
    )
    assert_one_line_error(result, path, *needles)
    assert not (tmp_path / "o.parquet").exists()


def test_azure_malformed_rows(tmp_path) -> None:
    head = "TIMESTAMP,ContextTokens,GeneratedTokens"
    ok = "2023-11-16 18:15:46.6805900,374,44"
    for bad, needles in [
        ("2023-11-16 18:15:47.1,abc,44", ["line 3", "ContextTokens"]),
        ("yesterday,374,44", ["line 3", "TIMESTAMP"]),
        ("2023-11-16 18:15:48.0,0,44", ["line 3", "ContextTokens", "> 0"]),
    ]:
        path = _write_lines(tmp_path, "a.csv", [head, ok, bad])
        result = invoke("trace", "import", "--from", "azure", path, "-o", str(tmp_path / "o.arrow"))
        assert_one_line_error(result, *needles)
    path = _write_lines(tmp_path, "h.csv", ["when,ContextTokens,GeneratedTokens", ok])
    assert_one_line_error(
        invoke("trace", "import", "--from", "azure", path, "-o", str(tmp_path / "o.arrow")),
        "TIMESTAMP",
    )


def test_azure_timestamps_keep_microseconds(tmp_path) -> None:
    lines = [
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        "2023-11-16 18:15:46.6805900,374,44",
        "2023-11-16 18:15:50.9951690,396,109",
    ]
    trace = import_trace("azure", _write_lines(tmp_path, "a.csv", lines))
    assert np.allclose(trace.arrival_s, [0.0, 4.314579], atol=1e-9)


def test_empty_and_missing_inputs(tmp_path) -> None:
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    for kind in ("mooncake", "bailian", "azure"):
        assert_one_line_error(
            invoke(
                "trace", "import", "--from", kind, str(empty), "-o", str(tmp_path / "o.parquet")
            ),
            "empty file",
        )
    assert_one_line_error(
        invoke("trace", "import", "--from", "mooncake", str(tmp_path / "nope"), "-o", "x.parquet"),
        "no such file",
    )


@pytest.mark.parametrize(
    ("bad", "needles"),
    [
        ('{"chat_id": 12, "parent_chat_id": 10}', ["line 2", "timestamp", "missing field"]),
        (_bailian_row(12, 10, 1.0, [1, 2, 4], 40, 2).replace("40", '"40"'), ["line 2"]),
        (_bailian_row(12, 10, 1.0, [1, -2], 20, 2), ["line 2", "negative hash"]),
    ],
)
def test_bailian_malformed_line_is_reported(tmp_path, bad: str, needles: list[str]) -> None:
    path = _write_lines(tmp_path, "b.jsonl", [_bailian_row(10, -1, 0.0, [1, 2], 20, 1), bad])
    result = invoke("trace", "import", "--from", "bailian", path, "-o", str(tmp_path / "o.parquet"))
    assert_one_line_error(result, path, *needles)


ROUND_TRIPS = {
    "mooncake": (
        "m.jsonl",
        [
            '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}',
            '{"timestamp": 1500, "input_length": 1100, "output_length": 7, "hash_ids": [1, 2, 3]}',
        ],
        [],
    ),
    "bailian": (
        "b.jsonl",
        [_bailian_row(10, -1, 0.0, [1, 2], 20, 1), _bailian_row(12, 10, 1.0, [1, 2, 4], 40, 2)],
        [],
    ),
    "azure": (
        "a.csv",
        [
            "TIMESTAMP,ContextTokens,GeneratedTokens",
            "2023-11-16 18:15:46.6805900,374,44",
            "2023-11-16 18:15:50.1,12,3",
        ],
        [],
    ),
    "burstgpt": (
        "g.csv",
        [
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
            "5,ChatGPT,472,18,490,Conversation log",
            "9,GPT-4,10,2,12,API log",
        ],
        [],
    ),
    "csv": (
        "c.csv",
        ["t,a,b", "0.5,10,1", "2.5,20,2"],
        ["--columns", "arrival=t,input=a,output=b"],
    ),
    "jsonl": (
        "j.jsonl",
        ['{"t": 0, "a": 32, "b": 1, "h": [7, 8]}', '{"t": 2, "a": 48, "b": 2, "h": [7, 8, 9]}'],
        ["--columns", "arrival=t,input=a,output=b,hashes=h,block_tokens=16"],
    ),
}


@pytest.mark.parametrize("kind", sorted(ROUND_TRIPS))
def test_every_importer_round_trips_through_a_file(tmp_path, kind: str) -> None:
    """The CLI's written trace reads back equal to the direct import, metadata included."""
    from kvtier.trace.importers import ImportOptions, parse_columns

    name, lines, extra = ROUND_TRIPS[kind]
    path = _write_lines(tmp_path, name, lines)
    out = tmp_path / "out.arrow"
    result = invoke("trace", "import", "--from", kind, path, *extra, "-o", str(out))
    assert result.code == 0, result.stderr
    options = ImportOptions(columns=parse_columns(extra[1]) if extra else {})
    direct = import_trace(kind, path, options)
    back = read_trace(out)
    assert back.table.schema.metadata == direct.table.schema.metadata
    for column in direct.table.column_names:
        assert back.table.column(column).to_pylist() == direct.table.column(column).to_pylist()
