"""Small jobs start fast: the NumPy paths equal the jitted ones, and the light commands import
neither numba nor polars nor pandas.

``trace stats`` and ``trace mrc`` on a trace of a few hundred thousand block references run
without numba (the one-pass LRU curve by :mod:`kvtier.cache.stack_np`, the block numbering
and the chain check by NumPy); above the thresholds the jitted and polars paths take over, and
each pair must give the same answer.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.cache import curve, enums
from kvtier.cache.mrc import lru_stack_hist_nb, lru_stack_hits
from kvtier.cache.stack_np import count_below, lru_stack_hist_np
from kvtier.errors import InputError
from kvtier.trace import blocks, validate
from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.blocks import block_trace
from kvtier.trace.io import read_trace
from tests.cache_helpers import blocked_traces
from tests.helpers import REPO

TRACES = REPO / "traces"


def _kernel_hist(trace: BlockedTrace, semantics: int, first: int) -> np.ndarray:
    hist = np.zeros(trace.n_blocks + 2, dtype=np.int64)
    words = trace.n_block_refs // 64 + 1
    lru_stack_hist_nb(
        trace.block_offsets,
        trace.block_ids,
        semantics,
        first,
        np.zeros(words, dtype=np.uint64),
        np.zeros(words + 1, dtype=np.int64),
        np.full(trace.n_blocks, -1, dtype=np.int64),
        hist,
    )
    return hist


@pytest.mark.parametrize("semantics", [enums.PREFIX, enums.FLAT], ids=["prefix", "flat"])
@settings(max_examples=150, deadline=None)
@given(trace=blocked_traces(), first=st.integers(0, 30))
def test_numpy_histogram_equals_the_kernel(trace: BlockedTrace, semantics: int, first: int) -> None:
    first = min(first, trace.n_requests)
    got = lru_stack_hist_np(trace.block_offsets, trace.block_ids, trace.n_blocks, semantics, first)
    want = _kernel_hist(trace, semantics, first)
    if got is None:
        # only a prefix request that names one block twice is left to the kernel
        assert semantics == enums.PREFIX
        assert any(
            len(set(ids)) < len(ids) for ids in np.split(trace.block_ids, trace.block_offsets[1:-1])
        )
    else:
        assert got.tolist() == want.tolist()


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.integers(0, 40), min_size=1, max_size=60),
    queries=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60), st.integers(0, 45))),
)
def test_count_below_is_a_range_count(values: list[int], queries: list[tuple]) -> None:
    v = np.array(values, dtype=np.int64)
    lo = np.array([min(a, b, len(v)) for a, b, _ in queries], dtype=np.int64)
    hi = np.array([min(max(a, b), len(v)) for a, b, _ in queries], dtype=np.int64)
    bound = np.array([c for _, _, c in queries], dtype=np.int64)
    want = [int((v[a:b] < c).sum()) for a, b, c in zip(lo, hi, bound, strict=True)]
    assert count_below(v, lo, hi, bound).tolist() == want


@pytest.mark.parametrize("flat", [False, True])
def test_both_paths_of_the_curve_agree_on_a_bundled_trace(
    flat: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = block_trace(read_trace(TRACES / "sample-chat.parquet"), 64)
    caps = curve.default_capacities(curve.working_set_blocks(trace))
    small = curve.stack_hits(trace, caps, flat=flat, warmup=0.3)
    monkeypatch.setattr(curve, "NUMPY_STACK_MAX", 0)
    assert small.tolist() == curve.stack_hits(trace, caps, flat=flat, warmup=0.3).tolist()
    assert small.tolist() == lru_stack_hits(trace, caps, flat=flat, warmup=0.3).tolist()


def test_block_numbering_and_chain_check_agree_above_the_thresholds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    trace = read_trace(TRACES / "mooncake-conversation.parquet")
    small = block_trace(trace, 256)
    monkeypatch.setattr(blocks, "NUMPY_IDS_MAX", 0)
    large = block_trace(trace, 256)
    assert small.n_blocks == large.n_blocks
    assert np.array_equal(small.block_ids, large.block_ids)

    # a hash seen at block 0 reappears at block 1 of row 2; both checks name the same row
    offsets = np.array([0, 2, 4, 6], dtype=np.int64)
    hashes = np.array([1, 2, 1, 3, 5, 1], dtype=np.uint64)
    errors = []
    for limit in (1 << 20, 0):
        monkeypatch.setattr(validate, "NUMPY_CHECK_MAX", limit)
        with pytest.raises(InputError) as err:
            validate.check_chained(offsets, hashes, "t.parquet")
        errors.append(str(err.value))
    assert errors[0] == errors[1]
    assert "row 2" in errors[0]


def _modules_after(args: list[str], cwd: Path) -> dict[str, object]:
    code = (
        "import json, sys\n"
        "from kvtier.cli import main\n"
        "try:\n"
        f"    main({args!r})\n"
        "except SystemExit as e:\n"
        "    code = e.code\n"
        "else:\n"
        "    code = 0\n"
        "heavy = sorted(m for m in ('numba', 'polars', 'pandas', 'optuna') if m in sys.modules)\n"
        "print(json.dumps({'code': code, 'heavy': heavy}), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    return json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "args",
    [
        ["trace", "stats", str(TRACES / "mooncake-conversation.parquet"), "--json"],
        ["trace", "stats", str(TRACES / "sample-chat.parquet"), "-B", "32"],
        ["trace", "mrc", str(TRACES / "mooncake-conversation.parquet"), "-B", "512"],
        ["trace", "mrc", str(TRACES / "sample-chat.parquet"), "-B", "64", "--flat", "--json"],
    ],
    ids=lambda a: " ".join(a[:2] + a[3:]),
)
def test_trace_stats_and_mrc_on_a_small_trace_import_no_numba(
    args: list[str], tmp_path: Path
) -> None:
    assert _modules_after(args, tmp_path) == {"code": 0, "heavy": []}
