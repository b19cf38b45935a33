"""Workload synthesis: determinism, hash rules, stated reuse per kind, arrivals, passes, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.cli import main
from kvtier.errors import InputError
from kvtier.trace.blocks import block_trace
from kvtier.trace.format import Trace
from kvtier.trace.io import read_trace
from kvtier.trace.stats import trace_stats
from kvtier.trace.synth import arrival_times, synthesize
from kvtier.trace.synth.content import block_content_ids, prompt_hashes
from tests.helpers import assert_one_line_error, invoke

KINDS = ("chat", "rag", "agent", "short")


def reused_tokens(trace: Trace) -> np.ndarray:
    """Tokens of each request an infinite prefix cache serves, by brute force.

    Per request (in arrival order): the longest run of already-seen full blocks from block 0;
    then every full block of the request becomes seen.
    """
    offsets, hashes = trace.hash_arrays()
    g = trace.block_tokens
    inp = trace.input_tokens
    seen: set[int] = set()
    reused = np.zeros(len(inp), dtype=np.int64)
    for i in range(len(inp)):
        full = hashes[offsets[i] : offsets[i] + int(inp[i]) // g].tolist()
        k = 0
        while k < len(full) and full[k] in seen:
            k += 1
        reused[i] = k * g
        seen.update(full)
    return reused


def prefix_reuse(trace: Trace) -> float:
    """Share of all input tokens an infinite prefix cache serves."""
    return float(reused_tokens(trace).sum() / trace.input_tokens.sum())


def request_hashes(trace: Trace, i: int) -> list[int]:
    offsets, hashes = trace.hash_arrays()
    return hashes[offsets[i] : offsets[i + 1]].tolist()


# -- determinism and the format rules ----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_table_and_different_seed_different(kind: str) -> None:
    a = synthesize(kind, requests=150, rate=3.0, seed=7)
    b = synthesize(kind, requests=150, rate=3.0, seed=7)
    c = synthesize(kind, requests=150, rate=3.0, seed=8)
    assert a.table.equals(b.table, check_metadata=True)
    assert not a.table.equals(c.table)
    assert a.n_requests == 150


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("block_tokens", [16, 64])
def test_hash_count_is_ceil_of_input_over_block_tokens(kind: str, block_tokens: int) -> None:
    trace = synthesize(kind, requests=120, seed=3, block_tokens=block_tokens)
    offsets, _ = trace.hash_arrays()
    expected = -(-trace.input_tokens // block_tokens)
    np.testing.assert_array_equal(np.diff(offsets), expected)
    assert trace.block_tokens == block_tokens
    assert np.all(np.diff(trace.arrival_s) >= 0)


@settings(max_examples=30, deadline=None)
@given(
    kind=st.sampled_from(KINDS),
    seed=st.integers(0, 2**32 - 1),
    requests=st.integers(1, 40),
    block_tokens=st.sampled_from([4, 16, 512]),
)
def test_synthesis_is_a_function_of_its_seed(
    kind: str, seed: int, requests: int, block_tokens: int
) -> None:
    a = synthesize(kind, requests=requests, seed=seed, block_tokens=block_tokens)
    b = synthesize(kind, requests=requests, seed=seed, block_tokens=block_tokens)
    assert a.table.equals(b.table, check_metadata=True)
    assert a.n_requests == requests
    offsets, _ = a.hash_arrays()
    np.testing.assert_array_equal(np.diff(offsets), -(-a.input_tokens // block_tokens))


def test_partial_tail_block_differs_from_the_full_block_that_extends_it() -> None:
    # Prompt 0: segment A (20 tokens); prompt 1: A then B (12 tokens); prompt 2: A again.
    seg_offsets = np.array([0, 1, 3, 4])
    ids = np.array([11, 11, 22, 11], dtype=np.uint64)
    lens = np.array([20, 20, 12, 20])
    inp, off, h = prompt_hashes(seg_offsets, ids, lens, 16)
    np.testing.assert_array_equal(inp, [20, 32, 20])
    np.testing.assert_array_equal(off, [0, 2, 4, 6])
    assert h[0] == h[2] == h[4]  # the full block A[0:16] is shared
    assert h[1] != h[3]  # A[16:20] (partial) is not A[16:20] + B[0:12] (full)
    assert h[1] == h[5]  # but the same partial block twice is the same content


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    z = np.asarray(x, dtype=np.uint64) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def numpy_block_content_ids(
    seg_offsets: np.ndarray, seg_ids: np.ndarray, seg_lens: np.ndarray, g: int
) -> np.ndarray:
    """Reference for the kernel: cut prompts at every segment and block start, numpy only."""
    seg_end = np.cumsum(seg_lens)
    seg_start = seg_end - seg_lens
    req_start = np.concatenate(([0], seg_end))[seg_offsets]
    n_blocks = -(-np.diff(req_start) // g)
    block_offsets = np.concatenate(([0], np.cumsum(n_blocks)))
    block_req = np.repeat(np.arange(len(n_blocks)), n_blocks)
    block_start = req_start[:-1][block_req] + g * (
        np.arange(block_offsets[-1]) - block_offsets[:-1][block_req]
    )
    cuts = np.union1d(seg_start, block_start)
    piece_end = np.append(cuts[1:], req_start[-1])
    seg = np.searchsorted(seg_start, cuts, side="right") - 1
    blk = np.searchsorted(block_start, cuts, side="right") - 1
    length = (piece_end - cuts).astype(np.uint64)
    in_seg = (cuts - seg_start[seg]).astype(np.uint64)
    in_blk = (cuts - block_start[blk]).astype(np.uint64)
    piece = mix64(seg_ids[seg] ^ mix64(in_seg ^ mix64((in_blk << np.uint64(32)) | length)))
    return np.bitwise_xor.reduceat(piece, np.searchsorted(cuts, block_start))


def test_kernel_inputs_are_checked_before_the_kernel_runs() -> None:
    ids = np.array([1, 2], dtype=np.uint64)
    with pytest.raises(ValueError, match="lengths"):
        block_content_ids(np.array([0, 2]), ids, np.array([5, 0]), 16)
    with pytest.raises(ValueError, match="seg_offsets"):
        block_content_ids(np.array([0, 3]), ids, np.array([5, 5]), 16)
    with pytest.raises(ValueError, match="block_tokens"):
        block_content_ids(np.array([0, 2]), ids, np.array([5, 5]), 0)


@st.composite
def segment_prompts(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    n = draw(st.integers(1, 6))
    counts = draw(st.lists(st.integers(1, 4), min_size=n, max_size=n))
    total = sum(counts)
    ids = draw(st.lists(st.integers(0, 3), min_size=total, max_size=total))
    lens = draw(st.lists(st.integers(1, 40), min_size=total, max_size=total))
    g = draw(st.sampled_from([1, 4, 16]))
    offsets = np.concatenate(([0], np.cumsum(counts)))
    return offsets, np.array(ids, dtype=np.uint64), np.array(lens), g


@settings(max_examples=80, deadline=None)
@given(segment_prompts())
def test_equal_hash_exactly_when_prompts_agree_through_the_block(
    case: tuple[np.ndarray, np.ndarray, np.ndarray, int],
) -> None:
    seg_offsets, ids, lens, g = case
    # Brute force: token k of segment s is (id, k); a block is identified by all tokens so far.
    tokens = []
    for r in range(len(seg_offsets) - 1):
        toks: list[tuple[int, int]] = []
        for s in range(seg_offsets[r], seg_offsets[r + 1]):
            toks.extend((int(ids[s]), k) for k in range(int(lens[s])))
        tokens.append(toks)
    inp, off, h = prompt_hashes(seg_offsets, ids, lens, g)
    _, _, content_ids = block_content_ids(seg_offsets, ids, lens, g)
    np.testing.assert_array_equal(content_ids, numpy_block_content_ids(seg_offsets, ids, lens, g))
    keys: dict[int, tuple[tuple[int, int], ...]] = {}
    for r, toks in enumerate(tokens):
        assert inp[r] == len(toks)
        assert off[r + 1] - off[r] == -(-len(toks) // g)
        for j in range(off[r + 1] - off[r]):
            prefix = tuple(toks[: (j + 1) * g])
            hj = int(h[off[r] + j])
            if hj in keys:
                assert keys[hj] == prefix
            keys[hj] = prefix
    assert len(keys) == len(set(keys.values()))  # equal prefixes never get two hashes


# -- stated reuse per kind (infinite cache, contiguous-prefix rule) ------------------------------

REUSE_RANGES = {  # at 600 requests; documented in docs/workloads.md
    "chat": (0.75, 0.90),
    "rag": (0.20, 0.40),
    "agent": (0.90, 1.0),
    "short": (0.0, 0.10),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", [1, 2])
def test_each_kind_meets_its_stated_reuse(kind: str, seed: int) -> None:
    trace = synthesize(kind, requests=600, rate=2.0, seed=seed)
    lo, hi = REUSE_RANGES[kind]
    assert lo <= prefix_reuse(trace) <= hi


def test_rag_long_reuse_is_in_its_stated_range() -> None:
    assert 0.45 <= prefix_reuse(synthesize("rag", requests=600, seed=1, long=True)) <= 0.75


@pytest.mark.parametrize("kind", KINDS)
def test_trace_stats_agree_with_the_brute_force_reuse(kind: str) -> None:
    trace = synthesize(kind, requests=150, seed=11, passes=2)
    blocked = block_trace(trace, trace.block_tokens)
    stats = trace_stats(trace, blocked)
    assert stats.reuse_ratio_tokens == pytest.approx(prefix_reuse(trace), abs=1e-12)


@pytest.mark.parametrize("kind", ["chat", "agent"])
def test_each_turn_extends_the_previous_turn_of_its_session(kind: str) -> None:
    trace = synthesize(kind, requests=300, seed=5)
    sessions = trace.column_numpy("session_id")
    inp, out = trace.input_tokens, trace.output_tokens
    g = trace.block_tokens
    checked = 0
    for s in np.unique(sessions):
        rows = np.flatnonzero(sessions == s)
        for prev, nxt in zip(rows[:-1], rows[1:], strict=True):
            assert inp[nxt] > inp[prev] + out[prev]  # previous prompt + answer + new text
            full = int(inp[prev]) // g
            assert request_hashes(trace, nxt)[:full] == request_hashes(trace, prev)[:full]
            checked += 1
    assert checked > 100


def test_sessions_knob_splits_requests_over_exactly_that_many_sessions() -> None:
    trace = synthesize("chat", requests=400, seed=2, sessions=37)
    assert len(np.unique(trace.column_numpy("session_id"))) == 37


def test_rag_long_inputs_are_lv_eval_like() -> None:
    trace = synthesize("rag", requests=300, seed=4, long=True)
    assert trace.input_tokens.min() >= 16384  # LV-Eval: length levels 16k-256k words
    assert trace.input_tokens.min() > 15000  # Beluga: all LV-Eval inputs > 15K tokens


def test_rag_min_input_knob_is_respected() -> None:
    trace = synthesize("rag", requests=200, seed=4, min_input=5000)
    assert trace.input_tokens.min() >= 5000


def test_rag_documents_follow_zipf_popularity() -> None:
    # Exact lengths (sigma 0): a 2-block system prompt, then one 50-block document, so block 10
    # identifies the document. The most popular of 50 documents has p = 1 / H(50, 1.2) ~ 0.27.
    trace = synthesize(
        "rag",
        requests=2000,
        seed=9,
        docs_per_request=1,
        documents=50,
        zipf=1.2,
        system_tokens=32,
        doc_tokens=800,
        length_sigma=0.0,
    )
    offsets, hashes = trace.hash_arrays()
    assert len(np.unique(hashes[offsets[:-1]])) == 1  # a single system prompt
    counts = np.unique(hashes[offsets[:-1] + 10], return_counts=True)[1]
    assert 0.2 < counts.max() / trace.n_requests < 0.35
    assert len(counts) > 25


def test_two_passes_repeat_the_first_pass_exactly_and_later() -> None:
    trace = synthesize("rag", requests=200, seed=6, passes=2, pass_gap_s=10.0)
    n = 200
    assert trace.n_requests == 2 * n
    p = trace.column_numpy("pass")
    assert trace.table.schema.field("pass").type == "int32"
    np.testing.assert_array_equal(p, np.repeat([0, 1], n))
    a = trace.arrival_s
    assert a[n:].min() > a[:n].max()
    np.testing.assert_allclose(a[n:] - a[:n], a[n - 1] + 10.0)
    np.testing.assert_array_equal(trace.input_tokens[:n], trace.input_tokens[n:])
    np.testing.assert_array_equal(trace.output_tokens[:n], trace.output_tokens[n:])
    for i in range(0, n, 17):
        assert request_hashes(trace, i) == request_hashes(trace, n + i)
    # The second pass is a full hit under an infinite cache: every full block is reused.
    reused = reused_tokens(trace)
    np.testing.assert_array_equal(reused[n:], trace.input_tokens[n:] // 16 * 16)
    assert reused[:n].sum() < reused[n:].sum()
    assert len(np.unique(trace.column_numpy("request_id"))) == 2 * n


# -- arrivals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("burstiness", [0.5, 2.0, 4.0])
def test_gamma_gaps_have_the_requested_coefficient_of_variation(burstiness: float) -> None:
    rng = np.random.default_rng(123)
    t = arrival_times(rng, rate=5.0, process="gamma", burstiness=burstiness, requests=40_000)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(burstiness, rel=0.1)
    assert gaps.mean() == pytest.approx(1 / 5.0, rel=0.05)


def test_poisson_gaps_have_unit_coefficient_of_variation_through_synthesize() -> None:
    trace = synthesize("short", requests=20_000, rate=10.0, seed=1)
    gaps = np.diff(trace.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)
    assert trace.arrival_s[0] == 0.0


def test_session_kinds_keep_the_arrival_process() -> None:
    # Sessions only choose which request comes next; the gaps stay gamma with CV = burstiness.
    small = {"system_tokens": 20, "user_tokens": 20, "answer_tokens": 20}
    trace = synthesize(
        "chat", requests=20_000, rate=8.0, arrivals="gamma", burstiness=3.0, seed=4, **small
    )
    gaps = np.diff(trace.arrival_s)
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.1)
    rng = np.random.default_rng(4)
    expected = arrival_times(rng, rate=8.0, process="gamma", burstiness=3.0, requests=20_000)
    np.testing.assert_array_equal(trace.arrival_s, expected)


def test_duration_mode_keeps_arrivals_inside_the_duration() -> None:
    trace = synthesize("short", duration=300.0, rate=4.0, seed=2)
    assert trace.arrival_s.max() < 300.0
    assert 1000 < trace.n_requests < 1400  # Poisson(1200): 1200 +- 5.8 sigma


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"requests": 10, "duration": 5.0}, "--requests or --duration"),
        ({"requests": 0}, "--requests"),
        ({"rate": -1.0}, "--rate"),
        ({"burstiness": 2.0}, "--arrivals gamma"),
        ({"arrivals": "uniform"}, "arrival process"),
        ({"long": True}, "--long does not apply to 'chat'"),
        ({"sessions": 50, "requests": 10}, "--sessions"),
        ({"sessions": 5, "turns_mean": 3.0}, "exclude each other"),
        ({"turns_mean": 0.5}, "--turns-mean"),
        ({"passes": 0}, "--passes"),
    ],
)
def test_bad_options_raise_input_error(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(InputError, match=fragment.replace("-", r"\-")):
        synthesize("chat", **{"requests": 20, **kwargs})


def test_bad_rag_and_kind_options_raise_input_error() -> None:
    with pytest.raises(InputError, match="docs-per-request"):
        synthesize("rag", requests=10, documents=3, docs_per_request=4)
    with pytest.raises(InputError, match="doc-order"):
        synthesize("rag", requests=10, doc_order="random")
    with pytest.raises(InputError, match="unknown workload kind"):
        synthesize("batch", requests=10)


def test_bundled_sample_is_what_its_documented_command_makes() -> None:
    # traces/README.md: kvtier trace synth chat -o ... --requests 3000 --rate 5 --seed 1
    sample = read_trace(Path(__file__).parent.parent / "traces" / "sample-chat.parquet")
    assert sample.table.equals(synthesize("chat", requests=3000, rate=5.0, seed=1).table)


MULTIROUND_QA = dict(  # traces/README.md, sample-multiround-qa.parquet
    requests=2000,
    rate=4.1,
    seed=1,
    turns_max=10,
    turns_mean=10,
    turns_fixed=True,
    system_prompts=1,
    system_tokens=1000,
    first_tokens=20020,
    user_tokens=20,
    answer_tokens=100,
    think_s=78,
    length_sigma=0,
)


def test_multiround_qa_sample_is_what_its_documented_command_makes() -> None:
    sample = read_trace(Path(__file__).parent.parent / "traces" / "sample-multiround-qa.parquet")
    assert sample.table.equals(synthesize("chat", **MULTIROUND_QA).table)


def test_fixed_turns_and_first_turn_length() -> None:
    # fixed lengths: turn k's prompt is system + first + k * (answer + question), k < turns_max
    t = synthesize("chat", **{**MULTIROUND_QA, "requests": 600})
    inputs = t.table.column("input_tokens").to_numpy()
    k, rest = np.divmod(inputs - 1000 - 20020, 100 + 20)
    assert (rest == 0).all() and k.min() >= 0 and k.max() == 9
    sessions = t.table.column("session_id").to_numpy()
    assert np.bincount(sessions).max() <= 10
    # a session's turns in the trace are consecutive rounds: its prompts grow by one round
    for s in np.unique(sessions)[:50]:
        assert (np.diff(k[sessions == s]) == 1).all()


def test_fixed_turns_exclude_sessions() -> None:
    with pytest.raises(InputError, match="--turns-fixed"):
        synthesize("chat", requests=20, sessions=4, turns_fixed=True)


@settings(max_examples=25, deadline=None)
@given(sessions=st.integers(1, 12), rounds=st.integers(1, 6), seed=st.integers(0, 1000))
def test_round_major_conversations_take_their_turns_round_by_round(
    sessions: int, rounds: int, seed: int
) -> None:
    """Request ``i`` is round ``i // sessions``: every conversation once a round, its prompt
    the previous round's prompt and answer plus new text (each a prefix of the next), and a
    round's conversations in a drawn order, so the trace replays behind ``--round-barrier``."""
    t = synthesize(
        "chat", requests=sessions * rounds, sessions=sessions, round_major=True, seed=seed
    )
    sess = t.table.column("session_id").to_numpy().reshape(rounds, sessions)
    assert all(sorted(row) == list(range(sessions)) for row in sess)
    offsets, hashes = t.hash_arrays()
    inputs = t.input_tokens
    g = t.block_tokens
    last: dict[int, tuple[int, list[int]]] = {}
    for i, s in enumerate(sess.ravel().tolist()):
        blocks = hashes[offsets[i] : offsets[i] + int(inputs[i]) // g].tolist()
        if s in last:
            n, before = last[s]
            assert inputs[i] > n and blocks[: len(before)] == before
        last[s] = (int(inputs[i]), blocks)


def test_round_major_needs_sessions_dividing_the_requests() -> None:
    with pytest.raises(InputError, match="--round-major needs --sessions"):
        synthesize("chat", requests=20, round_major=True)
    with pytest.raises(InputError, match=r"--requests \(21\) a multiple of --sessions \(4\)"):
        synthesize("chat", requests=21, sessions=4, round_major=True)
    with pytest.raises(InputError, match="--think-s exclude each other"):
        synthesize("chat", requests=20, sessions=4, round_major=True, think_s=5.0)
    # a session's first turns differ in order round to round (drawn), the sessions do not
    t = synthesize("chat", requests=40, sessions=20, round_major=True, seed=2)
    rows = t.table.column("session_id").to_numpy().reshape(2, 20)
    assert rows[0].tolist() == list(range(20)) and rows[1].tolist() != list(range(20))


def test_round_major_trace_replays_behind_the_round_barrier(tmp_path: Path) -> None:
    path = str(tmp_path / "rounds.parquet")
    out = invoke(
        "trace", "synth", "chat", "-o", path, "--requests", "24", "--sessions", "6",
        "--round-major", "--json",
    )  # fmt: skip
    assert out.code == 0 and json.loads(out.stdout)["requests"] == 24
    res = invoke("replay", "--trace", path, "--concurrency", "2", "--round-barrier", "6", "--json")
    assert res.code == 0 and json.loads(res.stdout)["n_served"] == 24


# -- command line ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_cli_writes_a_readable_trace(kind: str, tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / f"{kind}.parquet"
    result = CliRunner().invoke(
        main,
        ["trace", "synth", kind, "-o", str(out), "--requests", "80", "--seed", "3", "--rate", "2"],
    )
    assert result.exit_code == 0, result.output
    trace = read_trace(out)
    assert trace.n_requests == 80
    assert trace.table.equals(synthesize(kind, requests=80, seed=3, rate=2.0).table)


def test_cli_json_summary(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "a.parquet"
    args = ["trace", "synth", "agent", "-o", str(out), "--requests", "30", "--steps-mean", "5"]
    result = CliRunner().invoke(main, [*args, "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["requests"] == 30 and summary["kind"] == "agent"
    assert summary["params"]["knobs"]["steps_mean"] == 5.0
    assert read_trace(out).metadata["synth.params"] == json.dumps(summary["params"], sort_keys=True)


def test_cli_gamma_and_kind_knobs(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "rag.arrow"
    args = ["trace", "synth", "rag", "-o", str(out), "--duration", "60", "--rate", "3"]
    args += ["--arrivals", "gamma", "--burstiness", "2", "--long", "--passes", "2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    trace = read_trace(out)
    assert trace.input_tokens.min() >= 16384
    assert set(trace.column_numpy("pass").tolist()) == {0, 1}


@pytest.mark.parametrize(
    "extra",
    [
        ["chat", "--requests", "10", "--duration", "5"],
        ["chat", "--long"],
        ["short", "--burstiness", "3"],
        ["agent", "--arrivals", "weibull"],
        ["video"],
        ["rag", "--rate", "0"],
        ["chat", "--requests", "5", "--sessions", "9"],
    ],
)
def test_cli_bad_options_exit_2_with_one_line(extra: list[str], tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "bad.parquet"
    result = CliRunner().invoke(main, ["trace", "synth", *extra[:1], "-o", str(out), *extra[1:]])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "Traceback" not in result.output
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "option", "count"),
    [
        (("--requests", "100000000"), "--requests", "100,000,000"),
        (("--requests", "6000000", "--passes", "2"), "--requests", "12,000,000"),
        (("--duration", "1e9", "--rate", "5"), "--duration", "5,000,000,000"),
    ],
)
def test_synth_refuses_an_absurd_count_in_one_line(
    tmp_path: Path, args: tuple[str, ...], option: str, count: str
) -> None:
    out = tmp_path / "big.parquet"
    result = invoke("trace", "synth", "rag", "-o", str(out), *args)
    assert_one_line_error(result, option, count, "10,000,000")
    assert not out.exists()


def test_synth_at_the_cap_is_not_refused_by_the_count_check() -> None:
    from kvtier.trace.synth.core import MAX_REQUESTS, _check_size

    _check_size(MAX_REQUESTS, None, 1.0, 1)  # exactly the cap: allowed
    _check_size(None, MAX_REQUESTS / 2.0, 2.0, 1)
    with pytest.raises(InputError, match="--passes 2"):
        _check_size(MAX_REQUESTS // 2 + 1, None, 1.0, 2)
