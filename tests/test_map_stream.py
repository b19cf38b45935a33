"""Streamed block mapping and statistics equal the in-memory ones exactly, at any batch size."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.errors import InputError
from kvtier.trace.batches import open_batches
from kvtier.trace.blocks import block_trace
from kvtier.trace.idtable import IdTable
from kvtier.trace.io import read_trace, write_trace
from kvtier.trace.mapstream import TAIL_TAG, map_batches, map_trace_file, mapped_trace
from kvtier.trace.stats import trace_stats
from kvtier.trace.stats_stream import stream_trace_stats
from tests.helpers import assert_one_line_error, invoke, make_trace
from tests.sim_strategies import branching_prompts

G = 4
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@st.composite
def traces(draw: st.DrawFn):
    """Prompts that extend or branch from earlier ones, tenants, sessions, tied arrivals."""
    n = draw(st.integers(1, 14))
    prompts = branching_prompts(draw, n)
    tenants = draw(st.none() | st.lists(st.sampled_from(["a", "b", "c"]), min_size=n, max_size=n))
    sessions = draw(st.none() | st.lists(st.integers(0, 3), min_size=n, max_size=n))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.5, 20.0, 61.0]), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    return make_trace(
        prompts,
        G,
        arrivals=np.cumsum(gaps),
        outputs=outputs,
        tenants=tenants,
        sessions=sessions,
    )


def _streamed_ids(path: str, B: int, shared: bool, batch_rows: int) -> tuple[np.ndarray, ...]:
    parts = list(
        map_batches(open_batches(path), B, share_across_tenants=shared, batch_rows=batch_rows)
    )
    counts = np.concatenate([np.diff(o) for _, _, o, _ in parts])
    return counts, np.concatenate([i for _, _, _, i in parts])


@SETTINGS
@given(
    trace=traces(),
    B=st.sampled_from([1, 2, 4, 8, 12]),
    shared=st.booleans(),
    batch_rows=st.sampled_from([1, 2, 3, 5, 1000]),
)
def test_streamed_ids_equal_the_in_memory_mapping(
    tmp_path: Path, trace, B: int, shared: bool, batch_rows: int
) -> None:
    path = str(tmp_path / "t.parquet")
    write_trace(trace, path)
    expected = block_trace(trace, B, share_across_tenants=shared)
    counts, ids = _streamed_ids(path, B, shared, batch_rows)
    assert counts.tolist() == expected.blocks_per_request.tolist()
    assert ids.tolist() == expected.block_ids.tolist()

    # the mapped trace: the same file either way, and mapping it again gives the same ids
    out = str(tmp_path / "m.parquet")
    done = map_trace_file(path, B, out, share_across_tenants=shared, batch_rows=batch_rows)
    assert (done.n_requests, done.n_block_refs, done.n_blocks) == (
        trace.n_requests,
        expected.n_block_refs,
        expected.n_blocks,
    )
    in_memory, blocked = mapped_trace(read_trace(path), B, share_across_tenants=shared)
    assert blocked.block_ids.tolist() == expected.block_ids.tolist()
    streamed = pq.read_table(out)
    assert streamed.equals(in_memory.table)
    assert streamed.schema.metadata == in_memory.table.schema.metadata
    again = read_trace(out)  # a valid chained-hash trace at block size B
    assert again.block_tokens == B
    assert block_trace(again, B, share_across_tenants=shared).block_ids.tolist() == (
        expected.block_ids.tolist()
    )
    if shared:  # sharing composes: read without sharing, the ids of the original unshared
        assert block_trace(again, B).block_ids.tolist() == block_trace(trace, B).block_ids.tolist()


@SETTINGS
@given(trace=traces(), B=st.sampled_from([1, 4, 8]), batch_rows=st.sampled_from([1, 2, 7, 1000]))
def test_streamed_statistics_equal_the_in_memory_ones(
    tmp_path: Path, trace, B: int, batch_rows: int
) -> None:
    path = str(tmp_path / "t.parquet")
    write_trace(trace, path)
    expected = trace_stats(trace, block_trace(trace, B))
    got = stream_trace_stats(path, B, batch_rows=batch_rows)
    assert got.as_dict() == expected.as_dict()  # every figure, bit for bit


def test_mapped_hashes_are_dense_ids_then_a_tail_of_the_request_s_own() -> None:
    trace = make_trace([[1] * 10, [1] * 8, [1] * 9], G)  # 2 full + tail, 2 full, 2 full + tail
    mapped, _ = mapped_trace(trace, G)
    assert mapped.table.column("block_hashes").to_pylist() == [
        [0, 1, int(TAIL_TAG)],
        [0, 1],
        [0, 1, int(TAIL_TAG) + 2],
    ]
    assert mapped.table.schema.metadata[b"map.native_block_tokens"] == b"4"
    assert mapped.table.schema.metadata[b"map.shared_across_tenants"] == b"false"


def test_a_big_synthetic_trace_maps_equal_across_a_dataset_and_batches(tmp_path: Path) -> None:
    from kvtier.trace.synth import synthesize

    trace = synthesize("chat", requests=3_000, rate=5.0, seed=3, block_tokens=16)
    parts = tmp_path / "parts"
    parts.mkdir()
    table = trace.table
    for i, lo in enumerate(range(0, table.num_rows, 1_100)):
        pq.write_table(table.slice(lo, 1_100), parts / f"p{i}.parquet")
    expected = block_trace(trace, 32)
    counts, ids = _streamed_ids(str(parts), 32, False, 777)
    assert np.array_equal(ids, expected.block_ids)
    assert np.array_equal(counts, expected.blocks_per_request)
    out = tmp_path / "mapped"  # a dataset directory of parts
    map_trace_file(str(parts), 32, str(out), batch_rows=500, part_rows=1_000)
    assert len(list(out.glob("*.parquet"))) == 3
    assert np.array_equal(block_trace(read_trace(out), 32).block_ids, expected.block_ids)
    assert stream_trace_stats(str(out)).as_dict() == {
        **trace_stats(trace, expected).as_dict(),
        "native_block_tokens": 32,
    }


def test_id_table_numbers_keys_in_first_appearance_order_through_growth() -> None:
    rng = np.random.default_rng(1)
    hi = rng.integers(0, 50_000, 200_000).astype(np.uint64) * np.uint64(1 << 40)
    lo = rng.integers(0, 3, 200_000).astype(np.uint64)
    table = IdTable(two_words=True, capacity=16)
    got = np.concatenate([table.ids(hi[a : a + 30_000], lo[a : a + 30_000]) for a in
                          range(0, len(hi), 30_000)])  # fmt: skip
    seen: dict[tuple[int, int], int] = {}
    want = [seen.setdefault((int(h), int(w)), len(seen)) for h, w in zip(hi, lo, strict=True)]
    assert got.tolist() == want and table.n == len(seen)
    assert table.n <= table.capacity * 3 // 4
    one = IdTable()
    assert one.ids(np.array([7, 7, 0, 2**64 - 1, 0], dtype=np.uint64)).tolist() == [0, 0, 1, 2, 1]


def _write(tmp_path: Path, trace, name: str = "t.parquet") -> str:  # noqa: ANN001
    path = str(tmp_path / name)
    write_trace(trace, path)
    return path


def test_trace_map_cli_streamed_and_in_memory_write_the_same_file(tmp_path: Path) -> None:
    trace = make_trace([[1, 2, 3, 4, 5, 6, 7, 8, 9]] * 5, G, tenants=["a", "b"] * 2 + ["a"])
    path = _write(tmp_path, trace)
    a, b = str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")
    r1 = invoke("trace", "map", path, "-B", "8", "--stream", "--batch-rows", "2", "-o", a)
    r2 = invoke("trace", "map", path, "-B", "8", "--no-stream", "-o", b)
    assert r1.code == 0 and r2.code == 0, (r1.stderr, r2.stderr)
    assert "5 requests, 5 full-block references to 2 distinct 8-token blocks (streamed)" in (
        r1.stdout
    )
    assert "to 2 distinct 8-token blocks (in memory)" in r2.stdout
    assert pq.read_table(a).equals(pq.read_table(b))
    s = invoke("trace", "stats", a, "--stream", "--json")
    m = invoke("trace", "stats", b, "--no-stream", "--json")
    assert s.code == 0 and s.stdout == m.stdout


def test_trace_map_bad_input_is_one_line(tmp_path: Path) -> None:
    trace = make_trace([[1] * 9] * 6, G, arrivals=[0, 1, 2, 3, 4, 5])
    path = _write(tmp_path, trace)
    out = str(tmp_path / "o.parquet")
    assert_one_line_error(
        invoke("trace", "map", path, "-B", "6", "--stream", "-o", out),
        "multiple or a divisor",
        "block_tokens",
    )
    assert_one_line_error(
        invoke("trace", "map", path, "-B", "4", "--stream", "-o", str(tmp_path / "o.csv")),
        "name the output .parquet",
    )
    assert_one_line_error(invoke("trace", "map", path, "-B", "0", "-o", out), "--block-tokens")
    assert_one_line_error(
        invoke("trace", "map", path, "--batch-rows", "0", "--stream", "-o", out), "--batch-rows"
    )
    # a bad row in a later batch is named by its row in the whole trace
    table = pq.read_table(path)
    tokens = table.column("output_tokens").to_pylist()
    tokens[4] = -1
    bad = table.set_column(2, "output_tokens", pa.array(tokens, type=pa.int64()))
    pq.write_table(bad, tmp_path / "bad.parquet")
    result = invoke(
        "trace", "map", str(tmp_path / "bad.parquet"), "--stream", "--batch-rows", "2", "-o", out
    )
    assert_one_line_error(result, "bad.parquet", "row 4", "output_tokens")
    # rows out of arrival order across batches
    late = table.set_column(0, "arrival_s", pa.array([0.0, 1, 2, 0.5, 4, 5]))
    pq.write_table(late, tmp_path / "late.parquet")
    result = invoke(
        "trace", "map", str(tmp_path / "late.parquet"), "--stream", "--batch-rows", "3", "-o", out
    )
    assert_one_line_error(result, "row 3", "arrival_s", "arrival order")
    assert not Path(out).exists()
    # parts of two different traces
    parts = tmp_path / "parts"
    parts.mkdir()
    pq.write_table(table, parts / "a.parquet")
    other = make_trace([[1] * 9], 8)
    pq.write_table(other.table, parts / "b.parquet")
    assert_one_line_error(
        invoke("trace", "stats", str(parts), "--stream"), "b.parquet", "not parts of one trace"
    )


def test_a_lengths_only_trace_maps_to_no_blocks(tmp_path: Path) -> None:
    trace = make_trace([[1] * 9, [2] * 3], G)
    lengths = trace.table.set_column(
        3,
        "block_hashes",
        pa.ListArray.from_arrays(pa.array([0, 0, 0], pa.int32()), pa.array([], pa.uint64())),
    )
    path = str(tmp_path / "l.parquet")
    from kvtier.trace.format import Trace

    write_trace(Trace.from_table(lengths, block_tokens=G, has_prefix_info=False), path)
    out = str(tmp_path / "m.parquet")
    assert map_trace_file(path, 2, out).n_block_refs == 0
    mapped = read_trace(out)
    assert not mapped.has_prefix_info and mapped.block_tokens == 2
    assert (
        stream_trace_stats(path, 2).as_dict()
        == trace_stats(read_trace(path), block_trace(read_trace(path), 2)).as_dict()
    )
    with pytest.raises(InputError, match="multiple or a divisor"):
        map_trace_file(path, 3, out)
