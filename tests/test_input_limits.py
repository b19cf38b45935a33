"""Corrupt Arrow data, malformed model configs and derived allocations the machine cannot hold
are each one line and exit code 2, before any column is used or any array is made."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from kvtier.errors import InputError
from kvtier.files import check_allocation
from kvtier.trace.io import write_trace
from tests.helpers import assert_one_line_error, invoke, make_trace


def small_trace(n: int = 12):  # noqa: ANN201
    prompts = [[1, 2, 3] * (8 + i % 4) for i in range(n)]
    return make_trace(prompts, 16, tenants=[f"t{i % 2}" for i in range(n)])


def write_ipc(table: pa.Table, path: Path) -> Path:
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)  # the IPC writer does not validate: what a corrupt file holds
    return path


def bad_utf8(tmp_path: Path) -> Path:
    table = small_trace().table
    n = table.num_rows
    offsets = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * 2).tobytes())
    tenant = pa.Array.from_buffers(pa.string(), n, [None, offsets, pa.py_buffer(b"\xff\xfe" * n)])
    table = table.set_column(table.column_names.index("tenant"), "tenant", tenant)
    return write_ipc(table, tmp_path / "bad-utf8.arrow")


def bad_offsets(tmp_path: Path) -> Path:
    table = small_trace().table
    col = table.column("block_hashes").combine_chunks()
    offs = col.offsets.to_numpy().astype(np.int32).copy()
    offs[5] = offs[8] + 1  # in bounds, out of order: only a full validation sees it
    lists = pa.Array.from_buffers(
        pa.list_(pa.uint64()), len(col), [None, pa.py_buffer(offs.tobytes())], children=[col.values]
    )
    table = table.set_column(table.column_names.index("block_hashes"), "block_hashes", lists)
    return write_ipc(table, tmp_path / "bad-offsets.arrow")


@pytest.mark.parametrize("make", [bad_utf8, bad_offsets])
@pytest.mark.parametrize(
    "command",
    [("trace", "stats"), ("trace", "stats", "--stream"), ("trace", "mrc", "-B", "16")],
)
def test_corrupt_arrow_data_is_one_line(tmp_path: Path, make, command) -> None:  # noqa: ANN001
    path = make(tmp_path)
    result = invoke(*command, str(path))
    assert_one_line_error(result, path.name, "corrupt Arrow/Parquet data")


def test_corrupt_arrow_data_in_replay(tmp_path: Path) -> None:
    path = bad_utf8(tmp_path)
    result = invoke("replay", "--trace", str(path))
    assert_one_line_error(result, path.name, "Invalid UTF8")


def write_config(path: Path, **changes: object) -> Path:
    cfg = {
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "intermediate_size": 14336,
    }
    cfg.update(changes)
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"hidden_size": 8}, "'hidden_size'"),
        ({"hidden_size": 4001}, "'hidden_size'"),
        ({"num_key_value_heads": 5}, "'num_key_value_heads'"),
        ({"vocab_size": 2**40}, "'vocab_size'"),
        ({"head_dim": 2**40}, "'head_dim'"),
    ],
)
def test_model_config_shapes_must_fit(tmp_path: Path, changes: dict, key: str) -> None:
    trace = tmp_path / "t.parquet"
    write_trace(small_trace(), trace)
    cfg = write_config(tmp_path / "config.json", **changes)
    result = invoke("trace", "mrc", str(trace), "-B", "16", "--model", str(cfg))
    assert_one_line_error(result, "config.json", key)


def test_model_config_nesting_is_bounded(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text('{"num_hidden_layers": 2, "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    trace = tmp_path / "t.parquet"
    write_trace(small_trace(), trace)
    result = invoke("trace", "mrc", str(trace), "-B", "16", "--model", str(cfg))
    assert_one_line_error(result, "config.json", "deeper than")
    # brackets inside strings are text, not nesting
    write_config(cfg, note="[[[[" * 50)
    assert invoke("trace", "mrc", str(trace), "-B", "16", "--model", str(cfg)).code == 0


def with_fraction(tmp_path: Path, fraction: str) -> Path:
    table = small_trace().table
    meta = dict(table.schema.metadata)
    meta[b"kvtier.sample_fraction"] = fraction.encode()
    path = tmp_path / f"frac-{fraction}.parquet"
    pq.write_table(table.replace_schema_metadata(meta), path)
    return path


@pytest.mark.parametrize(
    ("fraction", "needle"),
    [
        ("1e-320", "[2^-30, 1]"),
        ("1e-300", "[2^-30, 1]"),
        ("1e-100", "[2^-30, 1]"),
        ("1e-12", "[2^-30, 1]"),
        ("1e-3", "not a whole number"),
    ],
)
def test_tiny_sample_fraction(tmp_path: Path, fraction: str, needle: str) -> None:
    path = with_fraction(tmp_path, fraction)
    result = invoke("replay", "--trace", str(path))
    assert_one_line_error(result, path.name, "kvtier.sample_fraction", needle)
    assert "--set" not in result.stderr.split(":")[1]  # not blamed on an option not given


def test_worker_count_checked_against_memory(tmp_path: Path) -> None:
    trace = tmp_path / "t.parquet"
    write_trace(small_trace(), trace)
    result = invoke("replay", "--trace", str(trace), "--set", "tiers.dram.workers=1073741824")
    assert_one_line_error(result, "tiers.dram.workers", "would need", "available")


def test_check_allocation() -> None:
    check_allocation(1024, "a small array", option="--x")
    for huge in (float(1 << 62), float("inf"), float("nan")):
        with pytest.raises(InputError, match="option --x: a huge array would need"):
            check_allocation(huge, "a huge array", option="--x")


@pytest.mark.parametrize("value", ["1e308", "inf", "nan", "2e6"])
def test_absurd_prices_are_refused(tmp_path: Path, value: str) -> None:
    trace = tmp_path / "t.parquet"
    write_trace(small_trace(), trace)
    prices = tmp_path / "prices.toml"
    prices.write_text(f"gpu_per_hour = {value}\n")
    result = invoke("replay", "--trace", str(trace), "--prices", str(prices))
    assert_one_line_error(result, "prices.toml", "gpu_per_hour")
    prices.write_text(f"[tiers.dram]\nper_gb_hour = {value}\n")
    result = invoke("replay", "--trace", str(trace), "--prices", str(prices))
    assert result.code == 2 and "prices.toml" in result.stderr, result.stderr


@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_sample_below_the_smallest_replayable_fraction(tmp_path: Path, stream: str) -> None:
    trace = with_fraction(tmp_path, "0.001")
    out = tmp_path / "s.parquet"
    result = invoke("trace", "sample", str(trace), "--fraction", "1e-7", "-o", str(out), stream)
    assert_one_line_error(result, "--fraction", "2^-30")
    assert not out.exists()
