"""Block mapping and statistics against brute force on small traces built from token contents."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.errors import InputError
from kvtier.trace.blocks import block_trace
from kvtier.trace.stats import peak_rate, prefix_hits, trace_stats
from tests.helpers import invoke, make_trace
from tests.sim_strategies import branching_prompts

G = 4  # native granularity of the generated traces


@st.composite
def workloads(draw: st.DrawFn):
    """Prompts that often share prefixes: each extends or branches from an earlier one."""
    n = draw(st.integers(1, 10))
    prompts = branching_prompts(draw, n)
    tenants = draw(st.lists(st.sampled_from(["a", "b"]), min_size=n, max_size=n))
    return prompts, tenants


def identity(prompt: list[int], tenant: str, j: int, B: int, shared: bool) -> tuple:
    """What block j of ``prompt`` stands for, by docs/design.md section 3.

    B = m*G: the prompt through the block's end. B = G/m: the content of the native block
    that holds it (as hashed: possibly partial) with everything before, plus its index in it.
    """
    salt = None if shared else tenant
    if B >= G:
        return (salt, tuple(prompt[: (j + 1) * B]))
    m = G // B
    native = j // m
    return (salt, tuple(prompt[: (native + 1) * G]), j % m)


@settings(max_examples=80, deadline=None)
@given(work=workloads(), B=st.sampled_from([1, 2, 4, 8, 12, 16]), shared=st.booleans())
def test_ids_equal_exactly_when_identities_equal(work, B: int, shared: bool) -> None:
    prompts, tenants = work
    trace = make_trace(prompts, G, tenants=tenants)
    blocked = block_trace(trace, B, share_across_tenants=shared)
    # full-block rule
    assert blocked.blocks_per_request.tolist() == [len(p) // B for p in prompts]
    seen: dict[tuple, int] = {}
    expected: list[int] = []
    for p, t in zip(prompts, tenants, strict=True):
        for j in range(len(p) // B):
            expected.append(seen.setdefault(identity(p, t, j, B, shared), len(seen)))
    # dense ids in first-appearance order, equal exactly when identities are equal
    assert blocked.block_ids.tolist() == expected
    assert blocked.n_blocks == len(seen)


def test_block_size_must_fit_native_granularity() -> None:
    trace = make_trace([[1] * 10], G)
    with pytest.raises(InputError, match="multiple or a divisor"):
        block_trace(trace, 6)
    with pytest.raises(InputError):
        block_trace(trace, 0)


def brute_force_reuse(prompts, tenants, B: int) -> tuple[int, int, list[int]]:
    held: set = set()
    hits = []
    for p, t in zip(prompts, tenants, strict=True):
        ids = [identity(p, t, j, B, False) for j in range(len(p) // B)]
        h = 0
        while h < len(ids) and ids[h] in held:
            h += 1
        hits.append(h)
        held.update(ids)
    return sum(len(p) // B for p in prompts), len(held), hits


@settings(max_examples=60, deadline=None)
@given(work=workloads(), B=st.sampled_from([1, 2, 4, 8]))
def test_statistics_equal_brute_force(work, B: int) -> None:
    prompts, tenants = work
    arrivals = np.cumsum(np.linspace(0.0, 30.0, len(prompts)))
    trace = make_trace(prompts, G, tenants=tenants, arrivals=arrivals)
    blocked = block_trace(trace, B)
    refs, distinct, hits = brute_force_reuse(prompts, tenants, B)
    assert prefix_hits(blocked).tolist() == hits
    stats = trace_stats(trace, blocked)
    assert stats.block_refs == refs and stats.distinct_blocks == distinct
    assert stats.reuse_ratio_blocks == (pytest.approx(sum(hits) / refs) if refs else 0.0)
    assert stats.reuse_ratio_tokens == pytest.approx(sum(hits) * B / sum(map(len, prompts)))
    lengths = [len(p) for p in prompts]
    assert stats.input_tokens["p90"] == pytest.approx(np.quantile(lengths, 0.9))
    assert stats.input_tokens["mean"] == pytest.approx(np.mean(lengths))
    assert stats.tenants == len(set(tenants))
    best = max(sum(1 for b in arrivals if a <= b < a + 60) for a in arrivals)
    span = arrivals[-1] - arrivals[0]
    expected = len(arrivals) / span if 0 < span <= 60 else best / 60
    assert stats.peak_rate_60s_rps == pytest.approx(expected)


def test_prefix_rule_stops_at_first_gap() -> None:
    # request 2 shares block 0 with request 0 and nothing after, though block 2 of its own
    # prompt equals nothing else: hits stop at the first block not held
    trace = make_trace([[1] * 8, [1, 1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 3, 3, 3, 3]], G)
    assert prefix_hits(block_trace(trace, 4)).tolist() == [0, 1, 1]
    assert prefix_hits(block_trace(trace, 2)).tolist() == [0, 2, 2]


def test_peak_rate_window() -> None:
    assert peak_rate(np.array([0.0, 1.0, 59.9, 60.0, 61.0])) == pytest.approx(3 / 60)
    assert peak_rate(np.array([])) == 0.0
    assert peak_rate(np.array([0.0, 10.0, 20.0])) == pytest.approx(3 / 20)  # shorter than 60 s


def test_stats_cli_json(tmp_path) -> None:
    from kvtier.trace.io import write_trace

    trace = make_trace([[1] * 9, [1] * 9, [2] * 3], G, tenants=["a", "a", "b"], sessions=[1, 1, 2])
    write_trace(trace, tmp_path / "t.arrow")
    result = invoke("trace", "stats", str(tmp_path / "t.arrow"), "--json", "-B", "2")
    assert result.code == 0, result.stderr
    data = __import__("json").loads(result.stdout)
    for key in (
        "requests",
        "duration_s",
        "block_tokens",
        "input_tokens",
        "output_tokens",
        "block_refs",
        "distinct_blocks",
        "reuse_ratio_blocks",
        "reuse_ratio_tokens",
        "peak_rate_60s_rps",
        "sessions",
        "tenants",
    ):
        assert key in data
    assert data["block_refs"] == 4 + 4 + 1 and data["distinct_blocks"] == 4 + 1
    assert data["reuse_ratio_blocks"] == pytest.approx(4 / 9)
    assert data["sessions"] == 2 and data["tenants"] == 2
    table = invoke("trace", "stats", str(tmp_path / "t.arrow"))
    assert table.code == 0 and "reuse" in table.stdout


def test_stats_model_gives_distinct_kv_bytes(tmp_path) -> None:
    from kvtier.trace.io import write_trace

    trace = make_trace([[1] * 9, [1] * 9, [2] * 3], G)
    write_trace(trace, tmp_path / "t.parquet")
    result = invoke(
        "trace",
        "stats",
        str(tmp_path / "t.parquet"),
        "--json",
        "-B",
        "2",
        "--model",
        "Llama-3.1-8B",
    )
    assert result.code == 0, result.stderr
    data = __import__("json").loads(result.stdout)
    # Llama-3.1-8B: 2 x 32 layers x 8 KV heads x 128 dims x 2 bytes = 128 KiB per token
    assert data["kv_bytes_per_token"] == 131_072
    assert data["distinct_kv_bytes"] == data["distinct_blocks"] * 2 * 131_072
    bad = invoke("trace", "stats", str(tmp_path / "t.parquet"), "--model", "no-such-model")
    assert bad.code == 2 and "no-such-model" in bad.stderr
