"""Malformed input of any shape ends in InputError (a one-line message), never a crash."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.errors import InputError
from kvtier.trace.importers import import_trace
from kvtier.trace.io import read_trace
from tests.helpers import make_trace

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(data=st.binary(max_size=300), magic=st.sampled_from([b"", b"PAR1", b"ARROW1", b"\xff" * 4]))
def test_random_bytes(tmp_path, data: bytes, magic: bytes) -> None:
    path = tmp_path / "x.parquet"
    path.write_bytes(magic + data)
    try:
        read_trace(path)
    except InputError as err:
        assert "\n" not in str(err)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 10**6)
    | st.floats(allow_nan=True)
    | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4),
    max_leaves=8,
)


@SETTINGS
@given(
    rows=st.lists(
        st.fixed_dictionaries(
            {},
            optional={
                "timestamp": json_values,
                "input_length": json_values,
                "output_length": json_values,
                "hash_ids": json_values,
            },
        ),
        min_size=1,
        max_size=5,
    )
)
def test_random_mooncake_rows(tmp_path, rows: list[dict]) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    try:
        trace = import_trace("mooncake", path)
    except InputError as err:
        assert "\n" not in str(err)
    else:
        assert trace.n_requests == len(rows)  # nothing dropped


@SETTINGS
@given(
    column=st.sampled_from(["arrival_s", "input_tokens", "output_tokens", "block_hashes"]),
    values=st.lists(
        st.none() | st.integers(-(2**63), 2**63 - 1) | st.floats() | st.text(max_size=3),
        min_size=3,
        max_size=3,
    ),
)
def test_random_column_values(tmp_path, column: str, values: list) -> None:
    good = make_trace([[1, 2, 3, 4, 5], [1, 2], [9]], 2).table
    try:
        arr = pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
        return
    table = good.set_column(good.column_names.index(column), column, arr)
    path = tmp_path / "t.parquet"
    pq.write_table(table.replace_schema_metadata(good.schema.metadata), path)
    try:
        read_trace(path)
    except InputError as err:
        assert "\n" not in str(err)
