"""``kvtier replay --requests-out``: one row per request, consistent with the replay's metrics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.trace.format import Trace
from kvtier.trace.io import read_trace, write_trace

ROOT = Path(__file__).resolve().parent.parent
MOONCAKE = ROOT / "traces" / "mooncake-conversation.parquet"
# Two instances with 2 GB of HBM each and a DRAM tier: some requests never fit (rejected),
# some prefixes are found in HBM and some are loaded from DRAM.
POLICY = """
[serving]
instances = 2

[[tiers]]
name = "hbm"
capacity_gb = 2

[[tiers]]
name = "dram"
capacity_gb = 50
"""


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first 150 Mooncake requests, with request ids of their own."""
    full = read_trace(MOONCAKE)
    n = 150
    off, hashes = full.hash_arrays()
    small = Trace.from_arrays(
        arrival_s=full.arrival_s[:n],
        input_tokens=full.input_tokens[:n],
        output_tokens=full.output_tokens[:n],
        hash_offsets=off[: n + 1],
        hashes=hashes[: off[n]],
        block_tokens=full.block_tokens,
        source="mooncake head",
        extra_columns={"request_id": np.arange(1000, 1000 + n, dtype=np.int64)},
    )
    path = tmp_path_factory.mktemp("t") / "small.parquet"
    write_trace(small, path)
    return path


def replay(trace: Path, policy: Path, out: Path, *extra: str) -> dict:
    res = CliRunner().invoke(
        main,
        ["replay", "--trace", str(trace), "--policy", str(policy), "--json"]
        + ["--requests-out", str(out), *extra],
    )
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)  # a rejection warning goes to stderr


def test_requests_out_rows_match_the_metrics(small_trace: Path, tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text(POLICY)
    out = tmp_path / "requests.parquet"
    metrics = replay(small_trace, policy, out)
    table = pq.read_table(out)
    assert table.num_rows == metrics["n_requests"] == 150
    assert table.column("request_id").to_pylist() == list(range(1000, 1150))
    assert "dram_tokens" in table.column_names
    rows = table.to_pydict()
    ttft = np.array([x for x in rows["ttft_s"] if x is not None])
    assert float(np.quantile(ttft, 0.99, method="linear")) == metrics["ttft_p99_s"]
    tpot = np.array([x for x in rows["tpot_s"] if x is not None])
    assert float(np.quantile(tpot, 0.99, method="linear")) == metrics["tpot_p99_s"]
    assert rows["weight"] == [1.0] * 150  # no strata: every request counts once
    rejected = np.array(rows["rejected"])
    assert int(rejected.sum()) == metrics["n_rejected"] > 0
    assert all(i == -1 for i, r in zip(rows["instance"], rejected, strict=True) if r)
    served = np.array([f is not None for f in rows["finish_s"]])
    assert int(served.sum()) == metrics["n_served"]
    hbm, dram = np.array(rows["hbm_tokens"]), np.array(rows["dram_tokens"])
    recomputed = np.array([-1 if x is None else x for x in rows["recomputed_tokens"]])
    inp = np.array(rows["input_tokens"])
    assert np.array_equal((hbm + dram + recomputed)[served], inp[served])
    assert np.all(recomputed[served] >= 1)  # at least one prompt token is computed
    admitted_input = int(inp[~rejected].sum())
    assert int(hbm.sum()) / admitted_input == metrics["hit_ratio_tokens"]["hbm"]
    # a preempted request's loads on its return count in the tier's hits, not in its row
    if any(rows["preemptions"]):
        assert 0 < dram.sum() < metrics["tier_hit_tokens"]["dram"]
    else:
        assert dram.sum() == metrics["tier_hit_tokens"]["dram"] > 0
    saved = hbm.sum() + dram.sum()
    pre = np.array(rows["preemptions"])
    assert int(pre.sum()) == metrics["preemptions"]
    assert int(np.array(rows["preempted_tokens"]).sum()) == metrics["preempted_tokens"]
    if pre.any():  # (the prompt's first admission in the rows, every load in the metrics)
        assert saved < metrics["prefill_tokens_saved"]
    else:
        assert saved == metrics["prefill_tokens_saved"]
    # the reference engine writes the same rows
    ref_out = tmp_path / "ref.parquet"
    replay(small_trace, policy, ref_out, "--engine", "reference")
    assert pq.read_table(ref_out).to_pylist() == table.to_pylist()


def test_the_weight_column_reproduces_a_stratified_samples_metrics(tmp_path: Path) -> None:
    """A sample with prompt-length strata: each row's weight is its post-stratification
    weight, and the weighted quantiles and means of the rows are the replay's metrics."""
    from kvtier.trace.sampling import sample
    from kvtier.trace.synth import synthesize

    sampled, _ = sample(synthesize("chat", requests=400, rate=5.0, seed=5), 0.25, seed=2)
    assert sampled.sample_strata is not None
    path = tmp_path / "s.parquet"
    write_trace(sampled, path)
    policy = tmp_path / "p.toml"
    policy.write_text("[slo]\nttft_p99_s = 0.5\n")
    out = tmp_path / "requests.parquet"
    metrics = replay(path, policy, out, "--track-tbt")
    table = pq.read_table(out)
    assert table.schema.field("weight").type == pa.float64()
    rows = table.to_pydict()
    w = np.array(rows["weight"])
    assert np.array_equal(w, sampled.sample_strata.weights(sampled.input_tokens))
    assert len(set(w.tolist())) > 1  # the strata are not sampled in their full-trace shares

    def weighted(column: str, q: float) -> float:
        has = np.array([x is not None for x in rows[column]])
        x = np.array([v for v in rows[column] if v is not None])
        return float(np.quantile(x, q, weights=w[has], method="inverted_cdf"))

    assert weighted("ttft_s", 0.99) == metrics["ttft_p99_s"]
    assert weighted("ttft_s", 0.5) == metrics["ttft_p50_s"]
    assert weighted("tpot_s", 0.99) == metrics["tpot_p99_s"]
    assert weighted("tbt_tail_s", 0.99) == metrics["tbt_p99_s"]
    ttft = np.array([np.nan if x is None else x for x in rows["ttft_s"]])
    met = np.nan_to_num(ttft, nan=np.inf) <= 0.5
    assert float(np.average(met, weights=w)) == pytest.approx(metrics["slo_attainment"])


def test_requests_out_must_be_parquet(small_trace: Path, tmp_path: Path) -> None:
    res = CliRunner().invoke(
        main, ["replay", "--trace", str(small_trace), "--requests-out", str(tmp_path / "r.csv")]
    )
    assert res.exit_code == 2
    assert "--requests-out" in res.output and ".parquet" in res.output
    assert "Traceback" not in res.output
    assert not (tmp_path / "r.csv").exists()


def test_track_tbt_adds_the_tail_column_and_quantiles(small_trace: Path, tmp_path: Path) -> None:
    policy = tmp_path / "p.toml"
    policy.write_text(POLICY)
    out = tmp_path / "requests.parquet"
    metrics = replay(small_trace, policy, out, "--track-tbt")
    rows = pq.read_table(out).to_pydict()
    has = [t is not None for t in rows["tbt_tail_s"]]
    served = [f is not None for f in rows["finish_s"]]
    two = [n >= 2 for n in rows["output_tokens"]]
    assert has == [s and t for s, t in zip(served, two, strict=True)]
    tails = np.array([t for t in rows["tbt_tail_s"] if t is not None])
    assert float(np.quantile(tails, 0.99, method="linear")) == metrics["tbt_p99_s"]
    assert float(np.quantile(tails, 0.5, method="linear")) == metrics["tbt_p50_s"]
    plain = replay(small_trace, policy, tmp_path / "plain.parquet")
    assert plain["tbt_p99_s"] is None and plain["ttft_p99_s"] == metrics["ttft_p99_s"]
    assert "tbt_tail_s" not in pq.read_table(tmp_path / "plain.parquet").column_names
    # an SLO bounding the TBT tracks it without the flag; the text report shows it then only
    policy.write_text(POLICY + "\n[slo]\ntbt_p99_s = 1.0\n")
    res = CliRunner().invoke(main, ["replay", "--trace", str(small_trace), "--policy", str(policy)])
    assert res.exit_code == 0, res.output
    assert "TBT p50 / p99" in res.output
    policy.write_text(POLICY)
    res = CliRunner().invoke(main, ["replay", "--trace", str(small_trace), "--policy", str(policy)])
    assert res.exit_code == 0 and "TBT" not in res.output
