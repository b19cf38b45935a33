"""Test helpers: traces built from explicit token contents, so truths can be brute-forced."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvtier.trace.format import Trace

MASK64 = (1 << 64) - 1
REPO = __import__("pathlib").Path(__file__).resolve().parents[1]


def content_hashes(tokens: Sequence[int], block_tokens: int, salt: int = 0) -> list[int]:
    """Chained hashes of ``tokens`` in ``block_tokens`` blocks (the last may be partial).

    Each hash depends on the whole prefix through its block, so equal hashes mean equal
    prefixes (up to the negligible chance of a 64-bit collision).
    """
    out: list[int] = []
    h = salt
    for start in range(0, len(tokens), block_tokens):
        h = hash((h, tuple(tokens[start : start + block_tokens]))) & MASK64
        out.append(h)
    return out


def make_trace(
    prompts: Sequence[Sequence[int]],
    block_tokens: int,
    *,
    arrivals: Sequence[float] | None = None,
    outputs: Sequence[int] | None = None,
    tenants: Sequence[str] | None = None,
    sessions: Sequence[int] | None = None,
) -> Trace:
    n = len(prompts)
    hashes = [content_hashes(p, block_tokens) for p in prompts]
    offsets = np.zeros(n + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(h) for h in hashes])
    extra: dict[str, object] = {}
    if tenants is not None:
        extra["tenant"] = np.asarray(tenants, dtype=object)
    if sessions is not None:
        extra["session_id"] = np.asarray(sessions, dtype=np.int64)
    return Trace.from_arrays(
        arrival_s=np.asarray(arrivals if arrivals is not None else np.arange(n), dtype=float),
        input_tokens=np.asarray([len(p) for p in prompts], dtype=np.int64),
        output_tokens=np.asarray(outputs if outputs is not None else [1] * n, dtype=np.int64),
        hash_offsets=offsets,
        hashes=np.asarray([x for h in hashes for x in h], dtype=np.uint64),
        block_tokens=block_tokens,
        source="test",
        extra_columns=extra,  # type: ignore[arg-type]
    )


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str


def invoke(*args: str) -> CliResult:
    """Run ``kvtier`` in this process (fast), with stdout and stderr apart."""
    from click.testing import CliRunner

    from kvtier.cli import main

    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return CliResult(result.exit_code, result.stdout, result.stderr)


def run_cli(*args: str, cwd: str | None = None) -> CliResult:
    """Run ``kvtier`` in a subprocess, exactly as a user would."""
    proc = subprocess.run(
        [sys.executable, "-m", "kvtier", *args],
        capture_output=True,
        text=True,
        cwd=cwd or str(REPO),
        env={**__import__("os").environ, "COLUMNS": "120"},
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


def assert_one_line_error(result: CliResult, *needles: str) -> None:
    assert result.code == 2, (result.code, result.stdout, result.stderr)
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def replay_both(trace, cfg, *, fast=None, **options):  # noqa: ANN001, ANN003, ANN201
    """Both engines' replays of ``trace`` under ``cfg`` (``options`` for both but
    ``check_invariants``, the reference's alone; ``fast`` replays with the numba engine
    instead, if given), or None when both stop at the same stall with the same message
    (kvtier.errors.StallError, docs/model.md "A replay that does not progress")."""
    import pytest

    from kvtier.errors import StallError
    from kvtier.sim import simulate_raw

    numba_options = {k: v for k, v in options.items() if k != "check_invariants"}
    if fast is None:

        def fast():  # noqa: ANN202
            return simulate_raw(trace, cfg, engine="numba", **numba_options)

    try:
        ref = simulate_raw(trace, cfg, engine="reference", **options)
    except StallError as err:
        with pytest.raises(StallError) as fast_err:
            fast()
        assert str(fast_err.value) == str(err)
        return None
    return ref, fast()


REQUEST_FIELDS = ("first_token_s", "finish_s", "hit_blocks", "loaded_blocks", "preemptions")
# the lower tiers' counters: loads into HBM, storage prefetches' reads, bytes, link time
TIER_FIELDS = (
    "tier_hit_blocks",
    "tier_prefetched_blocks",
    "tier_bytes_read",
    "tier_bytes_written",
    "link_busy_s",
)


def assert_fields_equal(a, b, fields=REQUEST_FIELDS) -> None:  # noqa: ANN001
    """Two replays' results (RawResult) agree exactly on ``fields`` (per request by default)."""
    import numpy as np

    for name in fields:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
