"""Streamed JSON Lines imports (Mooncake, Qwen-Bailian, mapped) equal the in-memory ones;
errors name file, line and field; invariants across batches hold at batch boundaries."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.errors import InputError
from kvtier.trace.importers import ImportOptions, import_trace, parse_columns, stream_plan
from kvtier.trace.io import read_trace
from kvtier.trace.jsonlstream import JsonlPlan, stream_import_jsonl
from tests.helpers import assert_one_line_error, invoke

BUNDLED = Path(__file__).resolve().parents[1] / "traces" / "mooncake-conversation.parquet"


def _mooncake_lines(n: int | None = None) -> list[str]:
    """The bundled Mooncake conversation trace written back in its JSONL layout."""
    trace = read_trace(BUNDLED)
    offsets, hashes = trace.hash_arrays()
    a, inp, out = trace.arrival_s, trace.input_tokens, trace.output_tokens
    rows = range(trace.n_requests if n is None else n)
    return [
        json.dumps(
            {
                "timestamp": int(round(a[i] * 1000)),
                "input_length": int(inp[i]),
                "output_length": int(out[i]),
                "hash_ids": [int(x) for x in hashes[offsets[i] : offsets[i + 1]]],
            }
        )
        for i in rows
    ]


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _same_file(streamed: str, in_memory_table: pa.Table) -> None:
    """Identical contents and schema metadata, read back from the written file."""
    got = pq.read_table(streamed)
    assert got.column_names == in_memory_table.column_names
    for name in got.column_names:
        assert got.column(name).to_pylist() == in_memory_table.column(name).to_pylist(), name
    assert got.schema.metadata == in_memory_table.schema.metadata


@pytest.mark.parametrize("batch_rows", [997, 1 << 18])
def test_streamed_mooncake_equals_the_in_memory_import(tmp_path: Path, batch_rows: int) -> None:
    path = _write(tmp_path / "m.jsonl", _mooncake_lines())
    out = str(tmp_path / "s.parquet")
    done = stream_import_jsonl(path, JsonlPlan("mooncake"), out, batch_rows=batch_rows)
    memory = import_trace("mooncake", path)
    _same_file(out, memory.table)
    assert done.n_requests == memory.n_requests == 12_031
    assert done.duration_s == pytest.approx(memory.duration_s)
    assert read_trace(out).table.equals(memory.table)


def test_streamed_gzip_and_blank_lines_keep_line_numbers(tmp_path: Path) -> None:
    lines = _mooncake_lines(40)
    lines.insert(7, "")
    lines.insert(20, "   ")
    raw = ("\n".join(lines) + "\n").encode()
    path = tmp_path / "m.jsonl.gz"
    path.write_bytes(gzip.compress(b"\xef\xbb\xbf" + raw))
    out = str(tmp_path / "s.parquet")
    stream_import_jsonl(str(path), JsonlPlan("mooncake"), out, batch_rows=6)
    _same_file(out, import_trace("mooncake", str(path)).table)
    bad = [*lines[:30], '{"timestamp": 9e9, "input_length": 1024, "output_length": 1}']
    path.write_bytes(gzip.compress(("\n".join(bad) + "\n").encode()))
    with pytest.raises(InputError, match="line 31, column 'hash_ids'"):
        stream_import_jsonl(str(path), JsonlPlan("mooncake"), out, batch_rows=6)


def _bailian(chat: int, parent: int, t: float, ids: list[int], turn: int = 1) -> str:
    return json.dumps(
        {
            "chat_id": chat,
            "parent_chat_id": parent,
            "timestamp": t,
            "input_length": 16 * len(ids) - 3,
            "output_length": 5,
            "type": "text" if chat % 3 else "image",
            "turn": turn,
            "hash_ids": ids,
        }
    )


def _bailian_sessions(n_sessions: int, seed: int) -> list[str]:
    """Conversations in arrival order, each turn after its parent; some parents outside."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[float, int, int, list[int], int]] = []
    chat = 100
    for s in range(n_sessions):
        t = float(rng.uniform(0, 50))
        parent = -1 if s % 4 else 10_000 + s  # a window that starts mid-session
        ids = [int(x) for x in rng.integers(0, 30, rng.integers(1, 4))]
        for turn in range(1, int(rng.integers(1, 5)) + 1):
            rows.append((t, chat, parent, list(ids), turn))
            parent, chat = chat, chat + 1
            ids += [int(x) for x in rng.integers(0, 30, rng.integers(1, 3))]
            t += float(rng.uniform(0.5, 5))
    rows.sort(key=lambda r: r[0])
    return [_bailian(c, p, round(t, 3), ids, turn) for t, c, p, ids, turn in rows]


@pytest.mark.parametrize("batch_rows", [1, 5, 1000])
def test_streamed_bailian_equals_the_in_memory_import(tmp_path: Path, batch_rows: int) -> None:
    path = _write(tmp_path / "b.jsonl", _bailian_sessions(30, seed=batch_rows))
    out = str(tmp_path / "s.parquet")
    stream_import_jsonl(path, JsonlPlan("bailian"), out, batch_rows=batch_rows)
    memory = import_trace("bailian", path)
    _same_file(out, memory.table)
    sessions = pq.read_table(out).column("session_id").to_pylist()
    assert len(set(sessions)) < len(sessions)  # turns share sessions across batches


def test_streamed_bailian_refuses_what_it_cannot_resolve(tmp_path: Path) -> None:
    late_parent = [_bailian(11, 10, 0.0, [1, 2]), _bailian(10, -1, 1.0, [1])]
    path = _write(tmp_path / "b.jsonl", late_parent)
    out = str(tmp_path / "s.parquet")
    with pytest.raises(InputError, match="line 2, column 'chat_id'.*after its parent"):
        stream_import_jsonl(path, JsonlPlan("bailian"), out, batch_rows=1)
    stream_import_jsonl(path, JsonlPlan("bailian"), out, batch_rows=2)  # one chunk: resolved
    _same_file(out, import_trace("bailian", path).table)
    cycle = [_bailian(1, 2, 0.0, [1]), _bailian(2, 1, 1.0, [1])]
    path = _write(tmp_path / "c.jsonl", cycle)
    with pytest.raises(InputError, match="cycle"):
        stream_import_jsonl(path, JsonlPlan("bailian"), out, batch_rows=2)
    twice = [_bailian(1, -1, 0.0, [1]), _bailian(2, -1, 1.0, [1]), _bailian(1, -1, 2.0, [1])]
    path = _write(tmp_path / "d.jsonl", twice)
    with pytest.raises(InputError, match="line 3, column 'chat_id'.*duplicate request id"):
        stream_import_jsonl(path, JsonlPlan("bailian"), out, batch_rows=2)
    with pytest.raises(InputError, match="line 3, column 'chat_id'.*duplicate request id"):
        import_trace("bailian", path)


MAPPED = "arrival=ts,input=n_in,output=n_out,hashes=h,block_tokens=4,request_id=rid,tenant=who"


def _mapped_lines(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    lines = []
    t = 1_000.0
    for i in range(n):
        t += float(rng.exponential(0.5))
        n_in = int(rng.integers(1, 20))
        stem = int(rng.integers(0, 3))
        hashes = [stem * 1000 + j for j in range((n_in + 3) // 4)]  # chained: a prefix tree
        row = {"ts": round(t, 3), "n_in": n_in, "n_out": int(rng.integers(0, 9)), "h": hashes,
               "rid": 7 * i + 1, "who": ["a", "b"][i % 2]}  # fmt: skip
        lines.append(json.dumps(row))
    return lines


@pytest.mark.parametrize("batch_rows", [3, 64])
def test_streamed_mapped_jsonl_with_hashes_equals_in_memory(
    tmp_path: Path, batch_rows: int
) -> None:
    path = _write(tmp_path / "j.jsonl", _mapped_lines(50, seed=batch_rows))
    options = ImportOptions(columns=parse_columns(MAPPED))
    plan = stream_plan("jsonl", path, options, True)
    assert isinstance(plan, JsonlPlan)
    out = str(tmp_path / "s.parquet")
    done = stream_import_jsonl(path, plan, out, batch_rows=batch_rows)
    assert done.block_tokens == 4 and done.has_prefix_info
    _same_file(out, import_trace("jsonl", path, options).table)


def _import(path: str, out: Path, *extra: str) -> object:
    return invoke("trace", "import", "--from", "mooncake", path, "--stream", "-o", str(out), *extra)


GOOD = [
    '{"timestamp": 0, "input_length": 1024, "output_length": 5, "hash_ids": [0, 1]}',
    '{"timestamp": 1, "input_length": 1024, "output_length": 5, "hash_ids": [0, 2]}',
]


@pytest.mark.parametrize(
    ("bad", "needles"),
    [
        ('{"timestamp": 2, "input_length": 1024, "output_length": 5', ["malformed JSON"]),
        (
            '{"timestamp": 2, "input_length": "x", "output_length": 5, "hash_ids": [0, 1]}',
            ["column 'input_length'"],
        ),  # fmt: skip
        (
            '{"timestamp": 2, "input_length": 1024, "output_length": 5, "hash_ids": [0]}',
            ["column 'hash_ids'", "expected ceil"],
        ),  # fmt: skip
        (
            '{"timestamp": 2, "input_length": 1024, "output_length": 5, "hash_ids": [0, -3]}',
            ["column 'hash_ids'", "negative hash"],
        ),  # fmt: skip
        (
            '{"timestamp": 0.5, "input_length": 1024, "output_length": 5, "hash_ids": [0, 3]}',
            ["column 'timestamp'", "arrival order"],
        ),  # fmt: skip
        # block 1 first sits at position 1 after block 0 (line 1), here after block 3: the
        # violation spans the batch boundary (full blocks: a partial last block's hash is
        # checked within its batch only)
        (
            '{"timestamp": 2, "input_length": 1024, "output_length": 5, "hash_ids": [3, 1]}',
            ["column 'hash_ids'", "different parent hash"],
        ),  # fmt: skip
        (
            '{"timestamp": 2, "input_length": 1024, "output_length": 5, "hash_ids": [1, 5]}',
            ["column 'hash_ids'", "also appears at block 1"],
        ),  # fmt: skip
    ],
)
def test_streamed_errors_name_file_line_and_field(
    tmp_path: Path, bad: str, needles: list[str]
) -> None:
    path = _write(tmp_path / "m.jsonl", [*GOOD, "", bad, GOOD[1].replace('": 1,', '": 9,', 1)])
    result = _import(path, tmp_path / "o.parquet", "--batch-rows", "3")  # line 4 starts batch 2
    assert_one_line_error(result, "m.jsonl", "line 4", *needles)
    assert not (tmp_path / "o.parquet").exists()
    if "arrival order" not in needles[-1]:  # in memory the same line and message
        memory = invoke(
            "trace", "import", "--from", "mooncake", path, "-o", str(tmp_path / "x.parquet")
        )
        assert_one_line_error(memory, "m.jsonl", "line 4", *needles)


def test_batch_rows_and_stream_options_are_checked(tmp_path: Path) -> None:
    path = _write(tmp_path / "m.jsonl", GOOD)
    result = _import(path, tmp_path / "o.parquet", "--batch-rows", "0")
    assert_one_line_error(result, "--batch-rows", ">= 1")
    result = invoke(
        "trace", "import", "--from", "mooncake", path, "--batch-rows", "5", "--no-stream",
        "-o", str(tmp_path / "o.parquet"),
    )  # fmt: skip
    assert_one_line_error(result, "--batch-rows", "streamed import only")
    result = _import(path, tmp_path / "o.parquet")
    assert result.code == 0, result.stderr
    assert "streamed, 512-token blocks" in result.stdout


def test_cross_batch_checks_of_traces_read_by_batches(tmp_path: Path) -> None:
    """``trace map --stream`` reads a trace whose only faults span two batches."""
    table = pa.table(
        {
            "arrival_s": [0.0, 1.0, 2.0, 3.0],
            "input_tokens": pa.array([32, 32, 32, 32], type=pa.int64()),
            "output_tokens": pa.array([1, 1, 1, 1], type=pa.int64()),
            "block_hashes": pa.array([[5, 6], [5, 7], [8, 6], [9, 10]], type=pa.list_(pa.uint64())),
            "request_id": pa.array([1, 2, 3, 1], type=pa.int64()),
        }
    ).replace_schema_metadata({"kvtier.format": "request-trace/1", "kvtier.block_tokens": "16"})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path)
    out = str(tmp_path / "o.parquet")
    args = ("trace", "map", str(path), "--stream", "-o", out, "--batch-rows")
    assert_one_line_error(invoke(*args, "2"), "t.parquet", "row 2", "different parent hash")
    pq.write_table(table.set_column(3, "block_hashes", pa.array(
        [[5, 6], [5, 7], [8, 11], [9, 10]], type=pa.list_(pa.uint64()))), path)  # fmt: skip
    assert_one_line_error(invoke(*args, "3"), "t.parquet", "row 3", "duplicate request id")
    strings = table.set_column(4, "request_id", pa.array(["x", "y", "z", "x"]))
    pq.write_table(strings.set_column(3, "block_hashes", pa.array(
        [[5, 6], [5, 7], [8, 11], [9, 10]], type=pa.list_(pa.uint64()))), path)  # fmt: skip
    assert_one_line_error(invoke(*args, "1"), "t.parquet", "row 3", "duplicate request id")


@st.composite
def _chained_rows(draw: st.DrawFn) -> list[str]:
    """Mooncake rows whose hash ids walk a random prefix tree (so they are chained)."""
    n = draw(st.integers(1, 40))
    children: dict[tuple[int, ...], int] = {}
    rows, t = [], 0
    for _ in range(n):
        path: list[int] = []
        for _ in range(draw(st.integers(1, 5))):
            key = tuple(path)
            branch = draw(st.integers(0, 2))
            node = children.setdefault((*key, branch), len(children))
            path.append(node)
        t += draw(st.integers(0, 3))
        rows.append(json.dumps({"timestamp": t, "input_length": 512 * len(path) - 7,
                                "output_length": 3, "hash_ids": path}))  # fmt: skip
    return rows


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(rows=_chained_rows(), batch_rows=st.integers(1, 12))
def test_streamed_and_in_memory_agree_for_any_batch_size(
    tmp_path: Path, rows: list[str], batch_rows: int
) -> None:
    path = _write(tmp_path / "h.jsonl", rows)
    out = str(tmp_path / "h.parquet")
    stream_import_jsonl(path, JsonlPlan("mooncake"), out, batch_rows=batch_rows)
    _same_file(out, import_trace("mooncake", path).table)


def test_partial_last_blocks_are_chained_within_their_batch(tmp_path: Path) -> None:
    rows = [
        '{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}',
        '{"timestamp": 1, "input_length": 600, "output_length": 5, "hash_ids": [3, 1]}',
    ]
    path = _write(tmp_path / "m.jsonl", rows)
    result = _import(path, tmp_path / "o.parquet", "--batch-rows", "2")
    assert_one_line_error(result, "m.jsonl", "line 2", "column 'hash_ids'", "different parent")
