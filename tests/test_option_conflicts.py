"""Every option takes effect or is refused: conflicting pairs, a parameter both searched and
pinned, lenient number parsing, counts beyond what a trace can use."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from kvtier.errors import InputError
from kvtier.search.space import load_space
from kvtier.toml_fields import strict_float, strict_int
from kvtier.trace.io import write_trace
from tests.helpers import REPO, assert_one_line_error, invoke, make_trace


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "t.parquet"
    write_trace(make_trace([[1, 2, 3] * 20 for _ in range(5)], 16), path)
    return path


def test_block_size_given_twice_must_agree(trace: Path) -> None:
    result = invoke("replay", "--trace", str(trace), "-B", "32", "--set", "block_tokens=64")
    assert_one_line_error(result, "--block-tokens", "-B 32", "block_tokens=64")


def test_max_hosts_is_bounded_by_the_trace(trace: Path, tmp_path: Path) -> None:
    result = invoke("optimize", "--trace", str(trace), "--max-hosts", "100000", "--trials", "1")
    assert_one_line_error(result, "--max-hosts", "at most 1 ", "5 requests")
    assert not (tmp_path / "runs").exists()


def test_space_may_not_search_and_pin_one_parameter(tmp_path: Path) -> None:
    space = tmp_path / "space.toml"
    space.write_text(
        'format = "kvtier-space/1"\n[params.block_tokens]\nchoices = [16, 32]\n'
        "[pinned]\nblock_tokens = 16\n"
    )
    with pytest.raises(InputError, match="both searched"):
        load_space(str(space))
    for shipped in sorted((REPO / "policies" / "spaces").glob("*.toml")):
        load_space(str(shipped))  # the shipped spaces give each parameter once


def test_default_space_searches_kv_dtype_without_pinning_it() -> None:
    space = load_space("default")
    assert "kv_dtype" in {p.name for p in space.params}
    assert "kv_dtype" not in space.pinned


@pytest.mark.parametrize("text", ["1_6", " 16", "16 ", "١٦", "+", "", "16.0"])
def test_strict_int(text: str) -> None:
    assert strict_int(text) is None


def test_strict_numbers_accept_plain_decimals() -> None:
    assert strict_int("16") == 16 and strict_int("-3") == -3
    assert strict_float("0.25") == 0.25 and strict_float("1e-3") == 1e-3
    for text in ("1_0", "nan", "inf", " 1", "0x10", "1e999"):
        assert strict_float(text) is None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("kvtier.block_tokens", "1_6"),
        ("kvtier.block_tokens", " 16"),
        ("kvtier.sample_fraction", "0.5_0"),
    ],
)
def test_metadata_numbers_are_strict(trace: Path, key: str, value: str) -> None:
    table = pq.read_table(trace)
    pq.write_table(
        table.replace_schema_metadata({**table.schema.metadata, key.encode(): value.encode()}),
        trace,
    )
    for args in (("trace", "stats", str(trace)), ("trace", "stats", "--stream", str(trace))):
        assert_one_line_error(invoke(*args), trace.name, key)


def test_mrc_block_size_is_strict(trace: Path) -> None:
    result = invoke("trace", "mrc", str(trace), "-B", "1_6")
    assert_one_line_error(result, "--block-tokens", "1_6")
