"""A sample records its full trace's prompt-length strata, and its replays post-stratify their
latency statistics by them (docs/traces.md, "Samples and slices")."""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import replace
from functools import cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.sim.metrics import compute_metrics
from kvtier.sim.result import RawResult
from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.format import Trace
from kvtier.trace.io import read_trace, write_trace
from kvtier.trace.sampling import sample, time_slice
from kvtier.trace.strata import META_SAMPLE_STRATA, SampleStrata
from kvtier.trace.synth import synthesize
from tests.helpers import assert_one_line_error, invoke


@cache
def _traces() -> dict[str, Trace]:
    """A trace with sessions, the same without (sampled by prefix subtrees), and one of
    lengths only (sampled by requests)."""
    chat = synthesize("chat", requests=400, rate=5.0, seed=5)
    table = chat.table.drop_columns(["session_id"])
    subtrees = Trace.from_table(table, block_tokens=chat.block_tokens, source=chat.source)
    lengths = Trace.from_arrays(
        arrival_s=chat.arrival_s,
        input_tokens=chat.input_tokens,
        output_tokens=chat.output_tokens,
        hash_offsets=np.zeros(chat.n_requests + 1, dtype=np.int64),
        hashes=np.zeros(0, dtype=np.uint64),
        block_tokens=16,
        has_prefix_info=False,
    )
    return {"sessions": chat, "prefix subtrees": subtrees, "requests": lengths}


def _expected(input_tokens: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Edges and population as the format defines them, computed the direct way."""
    edges = tuple(
        int(v) for v in np.quantile(input_tokens, [0.5, 0.9, 0.99], method="inverted_cdf")
    )
    k = np.searchsorted(np.asarray(edges), input_tokens, side="left")
    return edges, tuple(int(c) for c in np.bincount(k, minlength=4))


def _file_meta(path: Path) -> dict[bytes, bytes]:
    return dict(pq.read_schema(path).metadata)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["sessions", "prefix subtrees", "requests"]),
    fraction=st.sampled_from([0.1, 0.25, 0.3, 0.5, 0.8]),
    seed=st.integers(0, 50),
    batch_rows=st.sampled_from([37, 128, 1 << 20]),
)
def test_strata_are_written_and_identical_in_memory_and_streamed(
    kind: str, fraction: float, seed: int, batch_rows: int
) -> None:
    from kvtier.trace.samplestream import stream_sample

    full = _traces()[kind]
    with tempfile.TemporaryDirectory() as tmp:
        src, direct, streamed = (Path(tmp) / n for n in ("t.parquet", "m.parquet", "s.parquet"))
        write_trace(full, src)
        sampled, roots = sample(full, fraction, seed=seed)
        assert roots == kind
        write_trace(sampled, direct)
        stream_sample(str(src), fraction, str(streamed), seed=seed, batch_rows=batch_rows)
        meta = _file_meta(direct)
        assert meta == _file_meta(streamed)
        strata = json.loads(meta[META_SAMPLE_STRATA.encode()])
        edges, population = _expected(full.input_tokens)
        assert strata == {
            "by": "input_tokens",
            "quantiles": [0.5, 0.9, 0.99],
            "edges": list(edges),
            "population": list(population),
        }
        a, b = read_trace(direct), read_trace(streamed)
        assert a.sample_strata == b.sample_strata == SampleStrata(edges, population)
        assert a.table.equals(b.table.cast(a.table.schema))


def test_a_whole_trace_and_a_fraction_one_sample_record_no_strata(tmp_path: Path) -> None:
    chat = _traces()["sessions"]
    assert chat.sample_strata is None
    everything, _ = sample(chat, 1.0)
    assert everything.sample_strata is None
    write_trace(everything, tmp_path / "all.parquet")
    assert META_SAMPLE_STRATA.encode() not in _file_meta(tmp_path / "all.parquet")


def test_a_sample_of_a_sample_keeps_the_first_full_traces_strata(tmp_path: Path) -> None:
    from kvtier.trace.samplestream import stream_sample

    full = _traces()["sessions"]
    once, _ = sample(full, 0.5, seed=1)
    twice, _ = sample(once, 0.5, seed=2)
    first = SampleStrata(*_expected(full.input_tokens))
    assert once.sample_strata == twice.sample_strata == first
    assert SampleStrata.of_lengths(once.input_tokens) != first  # the sample's own would differ
    write_trace(once, tmp_path / "once.parquet")
    stream_sample(str(tmp_path / "once.parquet"), 0.5, str(tmp_path / "twice.parquet"), seed=2)
    assert read_trace(tmp_path / "twice.parquet").sample_strata == first


def test_a_slice_drops_the_strata_and_says_so(tmp_path: Path) -> None:
    full = _traces()["sessions"]
    sampled, _ = sample(full, 0.5, seed=1)
    assert time_slice(sampled, 10.0, 60.0).sample_strata is None
    write_trace(sampled, tmp_path / "s.parquet")
    write_trace(full, tmp_path / "full.parquet")
    for stream in ("--no-stream", "--stream"):
        out = tmp_path / f"cut{stream}.parquet"
        cut = invoke(
            "trace", "slice", str(tmp_path / "s.parquet"), "--start", "10", "--end", "60",
            stream, "-o", str(out),
        )  # fmt: skip
        assert cut.code == 0, cut.stderr
        notes = [x for x in cut.stderr.splitlines() if x.startswith("note:")]
        assert len(notes) == 1 and "strata" in notes[0], cut.stderr
        read = read_trace(out)
        assert read.sample_strata is None and read.sample_fraction == pytest.approx(0.5)
        assert META_SAMPLE_STRATA.encode() not in _file_meta(out)
        whole = invoke(
            "trace", "slice", str(tmp_path / "full.parquet"), "--end", "60", stream,
            "-o", str(tmp_path / "w.parquet"),
        )  # fmt: skip
        assert whole.code == 0 and "note:" not in whole.stderr
        assert read_trace(tmp_path / "w.parquet").sample_strata is None


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[1, 2]",
        '{"by": "output_tokens", "quantiles": [0.5], "edges": [3], "population": [1, 1]}',
        '{"by": "input_tokens", "quantiles": [0.5, 0.9, 0.99], "edges": [10, 20], '
        '"population": [1, 1, 1]}',
        '{"by": "input_tokens", "quantiles": [0.5, 0.9, 0.99], "edges": [10, 30, 20], '
        '"population": [1, 1, 1, 1]}',
        '{"by": "input_tokens", "quantiles": [0.5, 0.9, 0.99], "edges": [10, 20, 30], '
        '"population": [1, -1, 1, 1]}',
        '{"by": "input_tokens", "quantiles": [0.5, 0.9, 0.99], "edges": [10, 20, 30], '
        '"population": [1, 1, 1]}',
        '{"by": "input_tokens", "quantiles": [0.9, 0.5, 0.99], "edges": [10, 20, 30], '
        '"population": [1, 1, 1, 1]}',
    ],
)
def test_malformed_strata_are_a_one_line_error(tmp_path: Path, text: str) -> None:
    sampled, _ = sample(_traces()["sessions"], 0.5, seed=1)
    meta = dict(sampled.table.schema.metadata)
    meta[META_SAMPLE_STRATA.encode()] = text.encode()
    path = tmp_path / "bad.parquet"
    pq.write_table(sampled.table.replace_schema_metadata(meta), path)
    for stream in ("--no-stream", "--stream"):
        result = invoke("trace", "stats", str(path), stream)
        assert_one_line_error(result, "bad.parquet", META_SAMPLE_STRATA)


def test_edges_may_repeat_where_quantiles_coincide() -> None:
    strata = SampleStrata.of_lengths(np.array([8] * 95 + [40] * 5))
    assert strata.edges == (8, 8, 40) and strata.population == (95, 0, 5, 0)
    assert SampleStrata.from_json(strata.to_json(), "t.parquet") == strata


# -- weighted metrics ---------------------------------------------------------------------------
def _tiny(strata: SampleStrata | None) -> tuple[BlockedTrace, RawResult]:
    """Six requests, two in stratum 0, two in 1, one in 2 and 3 (edges 10, 20, 30): TTFTs
    1, 2, 3, 4, 5, 100 s, each request generating 3 tokens over 2 s."""
    lengths = [5, 10, 15, 20, 25, 40]
    trace = BlockedTrace.from_lists([0.0] * 6, lengths, [3] * 6, [[]] * 6, block_tokens=16)
    trace = replace(trace, sample_strata=strata)
    ttft = np.array([1.0, 2.0, 3.0, 4.0, 5.0, 100.0])
    raw = RawResult(
        first_token_s=ttft,
        finish_s=ttft + 2.0,
        hit_blocks=np.zeros(6, dtype=np.int64),
        instance=np.zeros(6, dtype=np.int64),
        busy_s=np.array([50.0]),
        n_iterations=10,
        early_stopped=False,
        end_s=102.0,
    )
    return trace, raw


def test_post_stratified_quantiles_and_means_have_their_closed_form() -> None:
    """Full-trace counts 60, 28, 10, 2: weights 30, 30, 14, 14, 10, 2 (sum 100), cumulative
    30, 60, 74, 88, 98, 100. The inverted-CDF P50 is 2 s (60 >= 50), P90 5 s (98 >= 90), P99
    and P99.9 100 s (98 < 99); the mean (30 + 60 + 42 + 56 + 50 + 200) / 100 = 4.38 s."""
    from kvtier.policy.model import SLO

    strata = SampleStrata(edges=(10, 20, 30), population=(60, 28, 10, 2))
    trace, raw = _tiny(strata)
    m = compute_metrics(trace, raw, cost_per_hour=1.0, slo=SLO(ttft_p99_s=4.5))
    assert (m.ttft_p50_s, m.ttft_p90_s, m.ttft_p99_s, m.ttft_p999_s) == (2.0, 5.0, 100.0, 100.0)
    assert m.ttft_mean_s == pytest.approx(4.38)
    assert m.e2e_mean_s == pytest.approx(6.38)
    assert m.tpot_mean_s == pytest.approx(1.0) and m.tpot_p99_s == pytest.approx(1.0)
    assert m.slo_attainment == pytest.approx(0.88)  # TTFT <= 4.5 s: weights 30+30+14+14
    assert "post-stratified" in m.extra["latency_weighting"]
    plain = compute_metrics(*_tiny(None), cost_per_hour=1.0, slo=SLO(ttft_p99_s=4.5))
    for name in ("throughput_rps", "throughput_tps", "hit_ratio_tokens", "gpu_busy_fraction"):
        assert getattr(m, name) == getattr(plain, name), name  # totals stay unweighted


def test_a_stratum_the_sample_misses_gets_no_weight() -> None:
    strata = SampleStrata(edges=(10, 20, 30), population=(60, 28, 10, 2))
    trace, raw = _tiny(strata)
    keep = np.arange(5)  # no request above 30 tokens: the others renormalised to 98
    trace = BlockedTrace.from_lists([0.0] * 5, [5, 10, 15, 20, 25], [3] * 5, [[]] * 5, 16)
    trace = replace(trace, sample_strata=strata)
    raw = replace(
        raw,
        first_token_s=raw.first_token_s[keep],
        finish_s=raw.finish_s[keep],
        hit_blocks=raw.hit_blocks[keep],
        instance=raw.instance[keep],
    )
    m = compute_metrics(trace, raw, cost_per_hour=1.0)
    assert m.ttft_mean_s == pytest.approx(238 / 98)
    assert m.ttft_p99_s == 5.0


def test_metrics_of_a_trace_without_strata_are_unweighted_linear_quantiles() -> None:
    trace, raw = _tiny(None)
    m = compute_metrics(trace, raw, cost_per_hour=1.0)
    ttft = raw.first_token_s
    assert m.ttft_p50_s == 3.5
    assert m.ttft_p99_s == float(np.quantile(ttft, 0.99, method="linear"))
    assert m.ttft_mean_s == float(np.mean(ttft))
    assert m.extra == {}


def test_effective_share_weighs_a_samples_requests() -> None:
    """Weights 30, 30, 14, 14, 10, 2 (sum 100): TTFT <= 4.5 s holds for the first four, 88 of
    100; a TBT tail over 0.2 s for the fifth alone takes its 10 off. Unweighted: 4 and 5 of 6."""
    from kvtier.sim.metrics import effective_share

    tails = np.array([0.1, 0.1, 0.1, 0.1, 0.5, 0.1])
    strata = SampleStrata(edges=(10, 20, 30), population=(60, 28, 10, 2))
    for s, by_ttft, by_tbt in ((strata, 0.88, 0.90), (None, 4 / 6, 5 / 6)):
        trace, raw = _tiny(s)
        raw = replace(raw, tbt_tail_s=tails)
        assert effective_share(trace, raw, 4.5, math.inf) == pytest.approx(by_ttft)
        assert effective_share(trace, raw, math.inf, 0.2) == pytest.approx(by_tbt)
        assert effective_share(trace, raw, 4.5, 0.2) == pytest.approx(by_ttft)


def test_request_rows_carry_the_weight_the_metrics_used() -> None:
    from kvtier.sim.requests import request_table

    strata = SampleStrata(edges=(10, 20, 30), population=(60, 28, 10, 2))
    trace, raw = _tiny(strata)
    raw = replace(raw, loaded_blocks=np.zeros((6, 0), dtype=np.int64))  # no lower tier
    rows = request_table(trace, raw).to_pydict()
    assert rows["weight"] == [30.0, 30.0, 14.0, 14.0, 10.0, 2.0]
    m = compute_metrics(trace, raw, cost_per_hour=1.0)
    w, ttft = np.array(rows["weight"]), np.array(rows["ttft_s"])
    assert float(np.quantile(ttft, 0.9, weights=w, method="inverted_cdf")) == m.ttft_p90_s
    assert float(np.average(ttft, weights=w)) == pytest.approx(m.ttft_mean_s)
    plain = request_table(_tiny(None)[0], raw)
    assert plain.schema.field("weight").type == pa.float64()
    assert plain.column("weight").to_pylist() == [1.0] * 6


def test_the_slo_lower_bound_takes_the_weighted_statistics() -> None:
    """Prompts of 5k to 40k tokens, no prefix shared, weights 30, 30, 14, 14, 10, 2: the
    weighted P99 and P99.9 are the 40k prompt's prefill (cumulative 98 < 99), the mean the
    weighted mean of the six; unweighted, the linear P99 falls short of the longest prompt."""
    from types import SimpleNamespace

    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy import Policy
    from kvtier.policy.model import SLO
    from kvtier.search.bound import slo_bound

    lengths = [5000, 10000, 15000, 20000, 25000, 40000]
    strata = SampleStrata(edges=(10000, 20000, 30000), population=(60, 28, 10, 2))
    slo = SLO(ttft_mean_s=1e-6, ttft_p99_s=1e-6, ttft_p999_s=1e-6)

    def bound(lens: list[int], s: SampleStrata | None) -> dict[str, float]:
        n = len(lens)
        trace = BlockedTrace.from_lists([0.0] * n, lens, [2] * n, [[]] * n, block_tokens=16)
        scenario = SimpleNamespace(
            blocked=lambda policy: replace(trace, sample_strata=s),
            hardware=load_hardware("h100-node"),
            model=load_model("Llama-3.1-8B"),
        )
        got = slo_bound(scenario, Policy(), slo, None)
        assert got is not None
        return got.bounds

    alone = [bound([x], None)["ttft_p99_s"] for x in lengths]
    weighted = bound(lengths, strata)
    assert weighted["ttft_p99_s"] == weighted["ttft_p999_s"] == alone[-1]
    mean = np.dot([30, 30, 14, 14, 10, 2], alone) / 100
    assert weighted["ttft_mean_s"] == pytest.approx(mean, rel=1e-12)
    plain = bound(lengths, None)
    assert plain["ttft_p99_s"] < alone[-1]
    assert plain["ttft_mean_s"] == pytest.approx(np.mean(alone), rel=1e-12)


# -- replays of a stratified sample -------------------------------------------------------------
def _scenario(trace: Trace, engine: str = "numba"):  # noqa: ANN202
    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy.model import Policy
    from kvtier.scenario import Scenario

    return Scenario(
        trace, load_hardware("h100-node"), load_model("Llama-3.1-8B"), Policy(), engine=engine
    )


def test_both_engines_agree_on_a_stratified_sample() -> None:
    sampled, _ = sample(_traces()["sessions"], 0.25, seed=2)
    fast = _scenario(sampled).replay(track_tbt=True).metrics
    slow = _scenario(sampled, "reference").replay(track_tbt=True).metrics
    assert "post-stratified" in fast.extra["latency_weighting"]
    assert fast.same_as(slow)


def test_a_stratified_sample_never_stops_early() -> None:
    from kvtier.policy.model import SLO

    impossible = SLO(ttft_p99_s=1e-6)
    full = _traces()["sessions"]
    sampled, _ = sample(full, 0.25, seed=2)
    assert sampled.sample_strata is not None
    scenario = replace(_scenario(sampled), slo=impossible)
    kept = scenario.replay(stop_early=True).metrics
    assert not kept.early_stopped and kept.n_served == kept.n_requests
    assert kept.slo_met is False
    unweighted = replace(scenario, trace=replace(sampled, sample_strata=None), blocks=None)
    assert unweighted.replay(stop_early=True).metrics.early_stopped  # the check stops it
    assert replace(_scenario(full), slo=impossible).replay(stop_early=True).metrics.early_stopped


def test_replay_compare_optimize_and_stats_name_the_weighting(tmp_path: Path) -> None:
    sampled, _ = sample(_traces()["sessions"], 0.25, seed=2)
    path = tmp_path / "s.parquet"
    write_trace(sampled, path)
    replayed = invoke("replay", "--trace", str(path))
    assert replayed.code == 0, replayed.stderr
    notes = [x for x in replayed.stderr.splitlines() if "post-stratified" in x]
    assert len(notes) == 1 and notes[0].startswith("note:") and "P50/P90/P99" in notes[0]
    compared = invoke("compare", "--trace", str(path), "--preset", "vllm-hbm")
    assert compared.code == 0, compared.stderr
    assert len([x for x in compared.stdout.splitlines() if "post-stratified" in x]) == 1
    optimized = invoke(
        "optimize", "--trace", str(path), "--trials", "1", "--no-presets",
        "--out", str(tmp_path / "p.toml"), "--study", "strata",
        "--storage", f"sqlite:///{tmp_path / 's.db'}",
    )  # fmt: skip
    assert optimized.code in (0, 1), optimized.stderr
    assert len([x for x in optimized.stdout.splitlines() if "post-stratified" in x]) == 1
    stats = invoke("trace", "stats", str(path), "--json")
    data = json.loads(stats.stdout)
    assert data["sample_strata"]["population"] == list(sampled.sample_strata.population)
    assert data["sample_fraction"] == pytest.approx(0.25)
    streamed = json.loads(invoke("trace", "stats", str(path), "--json", "--stream").stdout)
    assert streamed["sample_strata"] == data["sample_strata"]
    shown = invoke("trace", "stats", str(path))
    assert "sample strata" in shown.stdout
    write_trace(_traces()["sessions"], tmp_path / "full.parquet")
    whole = invoke("replay", "--trace", str(tmp_path / "full.parquet"))
    assert "post-stratified" not in whole.stderr + whole.stdout
    assert math.isfinite(data["requests"])


def test_block_mapping_carries_the_strata(tmp_path: Path) -> None:
    from kvtier.trace.blocks import block_trace
    from kvtier.trace.mapstream import map_trace_file, mapped_trace

    sampled, _ = sample(_traces()["sessions"], 0.5, seed=1)
    assert block_trace(sampled, 32).sample_strata == sampled.sample_strata
    assert block_trace(sampled, 32).head(10).sample_strata == sampled.sample_strata
    in_memory, blocked = mapped_trace(sampled, 32)
    assert in_memory.sample_strata == blocked.sample_strata == sampled.sample_strata
    write_trace(sampled, tmp_path / "s.parquet")
    map_trace_file(str(tmp_path / "s.parquet"), 32, str(tmp_path / "m.parquet"))
    assert read_trace(tmp_path / "m.parquet").sample_strata == sampled.sample_strata
