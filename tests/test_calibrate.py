"""kvtier calibrate: vLLM /metrics read as vLLM 0.34 writes them, and parameters recovered from
metrics a replay with known parameters generated."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, TierPolicy
from kvtier.trace.format import Trace
from kvtier.trace.io import write_trace
from kvtier.trace.vllm_metrics import (
    ITL_BUCKETS,
    ITL_LEGACY,
    Histogram,
    bucketize,
    metrics_text,
    parse_metrics,
    read_metrics,
)
from tests.helpers import assert_one_line_error, invoke

FIXTURE = Path(__file__).resolve().parent / "data" / "vllm-metrics" / "vllm-0.34.0-offload.txt"
TRUTH = {"step_overhead_s": 0.004, "mfu": 0.38, "mbu": 0.62}


# -- reading /metrics ---------------------------------------------------------------------------


def test_fixture_sums_every_engine_and_reason() -> None:
    m = read_metrics(str(FIXTURE))
    assert m.ttft.count == 100 and m.requests == 100  # 2 engines x 50, every finish reason
    assert m.tpot is not None and m.tpot.count == 100
    assert m.generation_tokens is not None
    assert m.itl.count == m.generation_tokens - 100  # one interval per token after the first
    assert 0.0 < m.hit_ratio < 1.0 and m.external_hit_ratio is not None
    assert 0.0 < m.external_hit_ratio < 1.0
    assert m.offload_load_ops == 100
    rate = m.offload_load_rate
    assert rate is not None and 5e9 < rate < 20e9  # 20 GB/s streams plus 100 us per load
    qs = [m.ttft.quantile(q) for q in (0.1, 0.5, 0.9, 0.99)]
    assert qs == sorted(qs) and m.ttft.bounds[0] < qs[0]
    assert m.names["itl"] == "vllm:inter_token_latency_seconds"


def test_older_inter_token_name_is_read() -> None:
    text = FIXTURE.read_text().replace("vllm:inter_token_latency_seconds", ITL_LEGACY)
    m = parse_metrics(text, "old.txt")
    assert m.names["itl"] == ITL_LEGACY and m.itl.count > 0


def test_quantile_interpolates_as_prometheus() -> None:
    # 10 observations: 2 <= 1 s, 8 more <= 2 s, none above: the median is 1 + 1 * (5 - 2) / 8
    h = Histogram(np.array([1.0, 2.0, 4.0]), np.array([2.0, 10.0, 10.0, 10.0]), 14.0, 10.0)
    assert h.quantile(0.5) == pytest.approx(1.375)
    assert h.quantile(0.1) == pytest.approx(0.5)  # from 0 inside the first bucket
    assert h.mean == pytest.approx(1.4)
    over = Histogram(np.array([1.0]), np.array([1.0, 4.0]), 9.0, 4.0)
    assert over.quantile(0.9) == 1.0  # in +Inf: the largest finite bound


def test_bucketize_counts_a_bound_in_its_own_bucket() -> None:
    h = bucketize(np.array([0.01, 0.011, 100.0]), ITL_BUCKETS, np.array([2.0, 1.0, 1.0]))
    assert h.cumulative[0] == 2.0 and h.cumulative[1] == 3.0 and h.cumulative[-1] == 4.0
    assert h.total == pytest.approx(0.02 + 0.011 + 100.0)


def test_written_metrics_parse_back() -> None:
    ttft = np.array([0.05, 0.3, np.nan])
    itl = np.array([0.02, 0.03, np.nan])
    out = np.array([11, 1, 5])
    text = metrics_text(ttft, itl, out, prompt_tokens=np.array([100, 200, 300]),
                        hit_tokens=np.array([50, 0, 300]))  # fmt: skip
    m = parse_metrics(text)
    assert m.ttft.count == 2 and m.ttft.mean == pytest.approx(0.175)
    assert m.itl.count == 10 and m.itl.mean == pytest.approx(0.02)  # request 2 has no interval
    assert m.hit_ratio == pytest.approx(50 / 300) and m.requests == 2


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"ttft": 1.0}\n', "not Prometheus text"),
        ("", "vllm:time_to_first_token_seconds"),
    ],
)
def test_bad_metrics_text(text: str, needle: str) -> None:
    with pytest.raises(InputError, match=needle) as err:
        parse_metrics(text, "scrape.txt")
    assert "scrape.txt" in str(err.value)


def test_missing_prefix_counters() -> None:
    text = "\n".join(
        ln for ln in FIXTURE.read_text().splitlines() if "vllm:prefix_cache_queries" not in ln
    )
    with pytest.raises(InputError, match="no vllm:prefix_cache_queries counter"):
        parse_metrics(text, "scrape.txt")


def _scale_counter(text: str, name: str, factor: float) -> str:
    """``text`` with every series of counter ``name`` multiplied by ``factor``."""
    out = []
    for ln in text.splitlines():
        if ln.startswith(name + "{"):
            head, value = ln.rsplit(" ", 1)
            ln = f"{head} {float(value) * factor}"
        out.append(ln)
    return "\n".join(out) + "\n"


def test_retried_lookups_keep_the_hit_ratio_out_of_the_comparison() -> None:
    from kvtier.experiments.calibrate import errors, stats_of

    # vLLM before PR #48860 recorded a waiting request's lookup at every scheduling retry: three
    # lookups per prompt token, hits counted as often. Its ratio is not a per-request one.
    text = FIXTURE.read_text()
    fixed = parse_metrics(text, "fixed.txt")
    assert fixed.lookups_per_prompt_token == pytest.approx(1.0)
    assert not fixed.hit_ratio_counts_retries
    assert stats_of(fixed).hit_ratio == pytest.approx(fixed.hit_ratio)
    retried_text = _scale_counter(text, "vllm:prefix_cache_queries_total", 3.0)
    retried = parse_metrics(retried_text, "retried.txt")
    assert retried.lookups_per_prompt_token == pytest.approx(3.0)
    assert retried.hit_ratio_counts_retries and stats_of(retried).hit_ratio is None
    model = stats_of(fixed)
    assert "hit ratio" in errors(model, stats_of(fixed))
    errs = errors(model, stats_of(retried))
    assert "hit ratio" not in errs and set(errs) == set(model.values)
    # prompts admitted but still in prefill when scraped: up to 10 % more queries is not a retry
    margin = parse_metrics(_scale_counter(text, "vllm:prefix_cache_queries_total", 1.09), "m")
    assert not margin.hit_ratio_counts_retries
    # without vllm:prompt_tokens nothing tells: the ratio is compared as read
    bare = "\n".join(ln for ln in retried_text.splitlines() if "vllm:prompt_tokens" not in ln)
    m = parse_metrics(bare, "bare.txt")
    assert m.lookups_per_prompt_token is None and stats_of(m).hit_ratio == m.hit_ratio


def test_scrape_line_says_why_the_hit_ratio_is_not_compared() -> None:
    from kvtier.cli.calibrate import _scrape_json, _scrape_text

    text = _scale_counter(FIXTURE.read_text(), "vllm:prefix_cache_queries_total", 3.0)
    s = _scrape_json(parse_metrics(text, "retried.txt"))
    assert s["hit_ratio_compared"] is False and s["lookups_per_prompt_token"] == pytest.approx(3)
    line = _scrape_text(s)
    assert "not compared: 3.00 lookups per prompt token" in line and "#48860" in line
    assert "not compared" not in _scrape_text(_scrape_json(read_metrics(str(FIXTURE))))


# -- calibration ---------------------------------------------------------------------------------


def _trace(n: int, seed: int) -> Trace:
    """Light load (Poisson arrivals 1 s apart: requests seldom overlap), prompts of 64-30k
    tokens, four shared system prompts of up to 1k tokens. Alone, a request's decode step is
    the per-step cost plus weights and its own context read at mbu; contexts this varied tell
    the per-step cost from mbu (under heavy load the two trade off: docs/calibrate.md)."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0, n))
    inp = rng.integers(64, 30000, n)
    out = rng.integers(16, 256, n)
    block = 16
    per = -(-inp // block)
    hashes = []
    for i in range(n):
        h = np.arange(per[i], dtype=np.uint64) + np.uint64(10**9 * (i + 1))
        k = min(int(per[i]), 64)
        h[:k] = np.arange(k, dtype=np.uint64) + np.uint64(10**6 * (1 + rng.integers(0, 4)))
        hashes.append(h)
    return Trace.from_arrays(
        arrival_s=arrival,
        input_tokens=inp,
        output_tokens=out,
        hash_offsets=np.concatenate([[0], np.cumsum(per)]),
        hashes=np.concatenate(hashes),
        block_tokens=block,
    )


def _generated(trace: Trace, hardware, model) -> str:  # noqa: ANN001
    from kvtier.experiments.calibrate import backend_policy, replay_times

    t = replay_times(trace, hardware, model, backend_policy(Policy(), "roofline"))
    return metrics_text(t.ttft_s, t.itl_s, t.output_tokens, prompt_tokens=t.input_tokens,
                        hit_tokens=t.hit_tokens)  # fmt: skip


@pytest.fixture(scope="module")
def setup() -> dict:
    hw = load_hardware("h100-node")
    truth = replace(hw, efficiency=replace(hw.efficiency, **TRUTH))
    model = load_model("llama-3.1-8b")
    full = _trace(800, 1)
    fit_half = Trace.from_table(full.table.slice(0, 400), block_tokens=16)
    held_half = Trace.from_table(full.table.slice(400, 400), block_tokens=16)
    return {
        "hw": hw,
        "model": model,
        "fit": fit_half,
        "held": held_half,
        "fit_text": _generated(fit_half, truth, model),
        "held_text": _generated(held_half, truth, model),
    }


def test_recovers_known_parameters_and_helps_held_back_half(setup: dict, tmp_path: Path) -> None:
    from kvtier.experiments.calibrate import calibrate, evaluate, mean_abs_error, profile_toml

    cal = calibrate(
        setup["fit"], setup["hw"], setup["model"], Policy(), parse_metrics(setup["fit_text"])
    )
    for name, want in TRUTH.items():
        assert cal.after[name] == pytest.approx(want, rel=0.05), (name, cal.after)
        assert cal.before[name] != pytest.approx(want, rel=0.05)  # the start was off
    assert cal.error_after < 0.02 < cal.error_before
    held = parse_metrics(setup["held_text"])
    before = mean_abs_error(evaluate(setup["held"], setup["hw"], setup["model"], Policy(), held))
    after = mean_abs_error(evaluate(setup["held"], cal.hardware, setup["model"], Policy(), held))
    assert after < 0.25 * before, (before, after)
    # the profile written loads as --hardware with the fitted values
    out = tmp_path / "calibrated.toml"
    out.write_text(profile_toml(cal, load_hardware("h100-node").source, "calibrated"))
    loaded = load_hardware(str(out))
    assert loaded.efficiency.mfu == pytest.approx(cal.after["mfu"], rel=1e-5)
    assert loaded.efficiency.step_overhead_s == pytest.approx(cal.after["step_overhead_s"], 1e-5)
    assert loaded.gpu == setup["hw"].gpu and loaded.name == "calibrated"


def test_cli_writes_a_profile(setup: dict, tmp_path: Path) -> None:
    import json

    metrics = tmp_path / "metrics.txt"
    metrics.write_text(setup["fit_text"])
    trace = tmp_path / "trace.parquet"
    write_trace(setup["fit"], trace)
    held_metrics = tmp_path / "held.txt"
    held_metrics.write_text(setup["held_text"])
    held_trace = tmp_path / "held.parquet"
    write_trace(setup["held"], held_trace)
    out = tmp_path / "prof" / "mine.toml"
    check = ["--check-metrics", str(held_metrics), "--check-trace", str(held_trace)]
    res = invoke("calibrate", "--metrics", str(metrics), "--trace", str(trace), "--out",
                 str(out), "--sample", "200", "--max-replays", "30", "--json",
                 "--backend", "roofline", *check)  # fmt: skip
    assert res.code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["backend"] == "roofline" and set(data["params"]) == set(TRUTH)
    assert data["replays"] <= 31 and data["error_after"] < data["error_before"]
    assert data["check_error_after"] < data["check_error_before"]
    assert data["scrape"]["requests"] == 400 and data["scrape"]["offload_load_gbps"] is None
    assert load_hardware(str(out)).efficiency.mbu == pytest.approx(
        data["params"]["mbu"]["after"], rel=1e-5
    )


def test_cli_bad_input(setup: dict, tmp_path: Path) -> None:
    trace = tmp_path / "trace.parquet"
    write_trace(setup["fit"], trace)
    good = tmp_path / "metrics.txt"
    good.write_text(setup["fit_text"])
    out = str(tmp_path / "out.toml")
    bad = tmp_path / "log.jsonl"
    bad.write_text('{"request_id": 1, "ttft": 0.2}\n')
    res = invoke("calibrate", "--metrics", str(bad), "--trace", str(trace), "--out", out)
    assert_one_line_error(res, "log.jsonl", "not Prometheus text")
    other = tmp_path / "other.parquet"
    write_trace(setup["held"].__class__.from_table(setup["held"].table.slice(0, 100),
                                                   block_tokens=16), other)  # fmt: skip
    res = invoke("calibrate", "--metrics", str(good), "--trace", str(other), "--out", out)
    assert_one_line_error(res, "--trace", "100 requests", "400 first tokens")
    held = tmp_path / "held.parquet"  # as many requests, other prompts
    write_trace(setup["held"], held)
    res = invoke("calibrate", "--metrics", str(good), "--trace", str(held), "--out", out)
    assert_one_line_error(res, "--trace", "tokens but the /metrics counts", "vllm:prompt_tokens")
    res = invoke("calibrate", "--metrics", str(good), "--trace", str(trace), "--out", out,
                 "--fit", "mfu,tiers.dram.op_overhead_us", "--backend", "roofline")  # fmt: skip
    assert_one_line_error(res, "--fit", "policy (--set) has no tier 'dram'", "valid: step_")
    # the default backend here is the measured tables', which read no mfu
    res = invoke("calibrate", "--metrics", str(good), "--trace", str(trace), "--out", out,
                 "--fit", "mfu")  # fmt: skip
    assert_one_line_error(res, "--fit", "mfu sets the roofline", "valid: measured_memory_scale")
    res = invoke("calibrate", "--metrics", str(good), "--trace", str(trace), "--out", out,
                 "--backend", "roofline", "--fit", "measured_memory_scale")  # fmt: skip
    assert_one_line_error(res, "--fit", "sets the measured step-time backend", "valid: step_")
    res = invoke("calibrate", "--metrics", str(good), "--trace", str(trace), "--out", out,
                 "--backend", "measured", "--hardware", "h20-node")  # fmt: skip
    assert_one_line_error(res, "--backend", "no measured step-time data")
    res = invoke("calibrate", "--metrics", str(good), "--trace", str(trace), "--out", out,
                 "--fit", "speed")  # fmt: skip
    assert_one_line_error(res, "--fit", "unknown parameter 'speed'")
    res = invoke("calibrate", "--metrics", str(good), "--trace", str(trace), "--out", out,
                 "--check-metrics", str(good))  # fmt: skip
    assert_one_line_error(res, "--check-metrics", "needs --check-trace")
    res = invoke("calibrate", "--metrics", str(good), "--trace", str(trace), "--out", out,
                 "--sample", "0")  # fmt: skip
    assert_one_line_error(res, "--sample", "must be >= 1")
    assert not Path(out).exists()


def _documents_twice(gap_s: float, seed: int):  # noqa: ANN202
    """60 documents of 2k-16k tokens sent twice, ``gap_s`` apart, a 4 GB HBM prefix cache too
    small to keep them and one host DRAM pool the engines share (``per_engine = false``: every
    repeat finds its blocks), through the ``direct`` connector at 12 GB/s and 1 us per
    operation. Returns the trace, the (roofline) policy, the stock hardware, the model, the
    rate and per-operation parameters, and the true replay's times."""
    from kvtier.experiments.calibrate import backend_policy, fit_params, replay_times

    rng = np.random.default_rng(seed)
    lens = rng.integers(2000, 16000, 60)
    order = [*range(60), *rng.permutation(60)]
    inp = lens[order]
    per = -(-inp // 16)
    hashes = [
        np.arange(p, dtype=np.uint64) + np.uint64(10**7 * (d + 1))
        for d, p in zip(order, per, strict=True)
    ]
    trace = Trace.from_arrays(arrival_s=np.arange(120) * gap_s, input_tokens=inp,
                              output_tokens=rng.integers(16, 64, 120),
                              hash_offsets=np.concatenate([[0], np.cumsum(per)]),
                              hashes=np.concatenate(hashes), block_tokens=16)  # fmt: skip
    policy = backend_policy(
        Policy(tiers=(TierPolicy(capacity_gb=4.0),
                      TierPolicy(name="dram", capacity_gb=200.0, per_engine=False))),
        "roofline",
    )  # fmt: skip
    hw, model = load_hardware("h100-node"), load_model("llama-3.1-8b")
    rate, op = fit_params(["tiers.dram.port_read_gbps", "tiers.dram.op_overhead_us"], hw, policy)
    truth = rate.set(op.set(hw, 1.0), 12.0)
    return trace, policy, hw, model, rate, op, replay_times(trace, truth, model, policy)


def test_recovers_a_tier_stream_rate(tmp_path: Path) -> None:
    """Long documents sent twice, the HBM prefix cache too small to keep them: the second
    round loads them from host DRAM through the direct connector, and its TTFT carries the
    stream rate. (The per-operation cost is held at its true value: with a fixed number of
    operations per block it trades off exactly against the rate; docs/calibrate.md.)"""
    from kvtier.experiments.calibrate import calibrate, fit_params, profile_toml

    trace, policy, hw, model, rate, op, t = _documents_twice(1.5, 3)
    assert t.hit_ratio < 0.05  # the hits come from DRAM, not HBM
    text = metrics_text(t.ttft_s, t.itl_s, t.output_tokens, prompt_tokens=t.input_tokens,
                        hit_tokens=t.hit_tokens)  # fmt: skip
    start = rate.set(op.set(hw, 1.0), 40.0)
    cal = calibrate(trace, start, model, policy, parse_metrics(text),
                    fit=["tiers.dram.port_read_gbps"], max_replays=150)  # fmt: skip
    assert cal.after["tiers.dram.port_read_gbps"] == pytest.approx(12.0, rel=0.05)
    assert cal.error_after < 0.01 < cal.error_before
    # written as a profile: the fitted read rate, the write rate the fit kept
    written = tmp_path / "tier.toml"
    written.write_text(profile_toml(cal, hw.source, "tier"))
    dram = load_hardware(str(written)).tiers["dram"]
    assert dram.port_read_bw == pytest.approx(cal.hardware.tiers["dram"].port_read_bw, rel=1e-5)
    assert dram.port_write_bw == hw.tiers["dram"].port_write_bw
    with pytest.raises(InputError, match="sets its own per-operation cost"):
        lm = Policy(tiers=(TierPolicy(), TierPolicy(name="dram", connector="vllm-offloading")))
        fit_params(["tiers.dram.op_overhead_us"], hw, lm)


MEASURED_TRUTH = {"measured_memory_scale": 1.15, "measured_compute_scale": 1.3}


@pytest.fixture(scope="module")
def measured_setup(setup: dict) -> dict:
    """The same requests served by a cluster whose steps run 1.15x the measured tables' on
    memory-bound work and 1.3x on compute-bound work."""
    from kvtier.experiments.calibrate import backend_policy, replay_times

    hw, model = setup["hw"], setup["model"]
    truth = replace(hw, efficiency=replace(hw.efficiency, **MEASURED_TRUTH))
    policy = backend_policy(Policy(), "measured")
    out = {}
    for half in ("fit", "held"):
        t = replay_times(setup[half], truth, model, policy)
        out[half] = metrics_text(t.ttft_s, t.itl_s, t.output_tokens, prompt_tokens=t.input_tokens,
                                 hit_tokens=t.hit_tokens)  # fmt: skip
    return out


def test_recovers_the_measured_tables_cluster_factors(setup: dict, measured_setup: dict) -> None:
    from kvtier.experiments.calibrate import calibrate, evaluate, mean_abs_error

    cal = calibrate(setup["fit"], setup["hw"], setup["model"], Policy(),
                    parse_metrics(measured_setup["fit"]), backend="measured")  # fmt: skip
    assert cal.backend == "measured" and [p.name for p in cal.params] == list(MEASURED_TRUTH)
    for name, want in MEASURED_TRUTH.items():
        assert cal.before[name] == 1.0
        assert cal.after[name] == pytest.approx(want, rel=0.05), (name, cal.after)
    assert cal.error_after < 0.02 < cal.error_before
    held = parse_metrics(measured_setup["held"])
    kw = {"backend": "measured"}
    before = mean_abs_error(
        evaluate(setup["held"], setup["hw"], setup["model"], Policy(), held, **kw)
    )
    after = mean_abs_error(
        evaluate(setup["held"], cal.hardware, setup["model"], Policy(), held, **kw)
    )
    assert after < 0.25 * before, (before, after)


def test_cli_fits_the_measured_tables_by_default(
    setup: dict, measured_setup: dict, tmp_path: Path
) -> None:
    import json

    metrics = tmp_path / "metrics.txt"
    metrics.write_text(measured_setup["fit"])
    trace = tmp_path / "trace.parquet"
    write_trace(setup["fit"], trace)
    out = tmp_path / "mine.toml"
    res = invoke("calibrate", "--metrics", str(metrics), "--trace", str(trace), "--out",
                 str(out), "--sample", "200", "--max-replays", "30", "--json")  # fmt: skip
    assert res.code == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["backend"] == "measured" and set(data["params"]) == set(MEASURED_TRUTH)
    assert data["error_after"] < data["error_before"]
    text = out.read_text()
    assert "Fitted for the measured step-time backend" in text
    eff = load_hardware(str(out)).efficiency
    assert eff.measured_memory_scale == pytest.approx(
        data["params"]["measured_memory_scale"]["after"], rel=1e-5
    )
    again = str(tmp_path / "again.toml")
    res = invoke("calibrate", "--metrics", str(metrics), "--trace", str(trace), "--out", again,
                 "--sample", "200", "--max-replays", "30")  # fmt: skip
    assert res.code == 0, res.stderr
    assert "calibrated the measured step-time backend" in res.stdout
    assert "replay it with --hardware and the measured tables" in res.stdout


def test_the_offloading_connectors_load_rate_is_a_statistic_of_the_fit(tmp_path: Path) -> None:
    """A scrape with vLLM's offload counters (bytes over the seconds its load jobs ran, summed
    over ranks): the replay counts its loads the same way, so at the true stream rate the two
    agree exactly, and the fit recovers the rate from them and the latencies together."""
    from kvtier.experiments.calibrate import OFFLOAD_RATE, calibrate, evaluate

    trace, policy, hw, model, rate, op, t = _documents_twice(0.3, 5)
    truth = rate.set(op.set(hw, 1.0), 12.0)
    assert t.offload is not None and t.offload.sizes.size == int(np.sum(t.offload.sizes > 0))
    loaded = t.offload.bytes
    assert loaded > 0 and t.offload.sizes.sum() == pytest.approx(loaded)
    # the stream's busy seconds: no faster than the link, slower by the per-operation costs
    assert 0 < t.offload.rate <= 12e9 * 1.0001
    text = metrics_text(t.ttft_s, t.itl_s, t.output_tokens, prompt_tokens=t.input_tokens,
                        hit_tokens=t.hit_tokens, offload_load_bytes=t.offload.bytes,
                        offload_load_time_s=t.offload.time_s,
                        offload_load_sizes=t.offload.sizes)  # fmt: skip
    scrape = parse_metrics(text)
    assert scrape.offload_load_rate == pytest.approx(t.offload.rate, rel=1e-12)
    assert scrape.offload_load_ops == t.offload.sizes.size
    at_truth = evaluate(trace, truth, model, policy, scrape)
    assert at_truth[OFFLOAD_RATE] == pytest.approx(0.0, abs=1e-12)
    start = rate.set(op.set(hw, 1.0), 40.0)
    off = evaluate(trace, start, model, policy, scrape)
    assert off[OFFLOAD_RATE] > 1.0  # a 40 GB/s stream moves the bytes in under a third the time
    cal = calibrate(trace, start, model, policy, scrape, fit=["tiers.dram.port_read_gbps"],
                    max_replays=150)  # fmt: skip
    assert cal.after["tiers.dram.port_read_gbps"] == pytest.approx(12.0, rel=0.02)
    assert abs(cal.errors_after[OFFLOAD_RATE]) < 0.01 < abs(cal.errors_before[OFFLOAD_RATE])
    # the served deployment must have the tier the scrape's loads came from
    metrics = tmp_path / "metrics.txt"
    metrics.write_text(text)
    trace_path = tmp_path / "trace.parquet"
    write_trace(trace, trace_path)
    res = invoke("calibrate", "--metrics", str(metrics), "--trace", str(trace_path), "--out",
                 str(tmp_path / "out.toml"), "--backend", "roofline")  # fmt: skip
    assert_one_line_error(res, "--policy", "kv_offload_load_bytes", "no tier below HBM")
