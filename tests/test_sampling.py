"""Spatial samples keep whole sessions and prefix subtrees; slices keep a time window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.trace.format import Trace
from kvtier.trace.io import read_trace, starting_at_zero, write_trace
from kvtier.trace.sampling import TRUNK_SHARE, root_keys, sample, time_slice
from kvtier.trace.synth import synthesize
from tests.helpers import assert_one_line_error, invoke, make_trace

MOONCAKE = Path(__file__).resolve().parents[1] / "traces" / "mooncake-conversation.parquet"
PROFILES = Path(__file__).resolve().parents[1] / "optimizer" / "hardware" / "profiles" / "hardware"


@pytest.fixture(scope="module")
def chat():  # noqa: ANN201
    return synthesize("chat", requests=600, rate=5.0, seed=3)


def test_sample_keeps_whole_sessions_and_about_the_fraction(chat) -> None:  # noqa: ANN001
    sampled, roots = sample(chat, 0.3, seed=1)
    assert roots == "sessions"
    full_sessions = chat.column_numpy("session_id")
    kept = set(sampled.column_numpy("session_id").tolist())
    counts = {s: int((full_sessions == s).sum()) for s in kept}
    for s, c in counts.items():
        assert int((sampled.column_numpy("session_id") == s).sum()) == c
    n_sessions = len(np.unique(full_sessions))
    assert abs(len(kept) / n_sessions - 0.3) < 0.12
    assert sampled.sample_fraction == pytest.approx(0.3)


def test_samples_of_samples_multiply_and_the_fraction_survives_a_file(chat, tmp_path) -> None:  # noqa: ANN001
    once, _ = sample(chat, 0.5, seed=2)
    twice, _ = sample(once, 0.5, seed=3)
    assert twice.sample_fraction == pytest.approx(0.25)
    path = tmp_path / "s.parquet"
    result = invoke(
        "trace", "sample", str(tmp_path / "missing.parquet"), "--fraction", "0.5", "-o", str(path)
    )
    assert_one_line_error(result, "missing.parquet")
    write_trace(twice, path)
    assert read_trace(path).sample_fraction == pytest.approx(0.25)


def test_seeds_draw_independent_samples_and_fraction_one_keeps_all(chat) -> None:  # noqa: ANN001
    a, _ = sample(chat, 0.4, seed=0)
    b, _ = sample(chat, 0.4, seed=1)
    assert set(a.column_numpy("session_id")) != set(b.column_numpy("session_id"))
    same, _ = sample(chat, 0.4, seed=0)
    assert same.table.equals(a.table)
    everything, _ = sample(chat, 1.0)
    assert everything.n_requests == chat.n_requests


def test_prefix_subtrees_below_a_shared_trunk_stay_together() -> None:
    """Without sessions, a request's root is its first block read by at most 1% of requests:
    a system prompt every request starts with is trunk, and each conversation (a chain of
    prompts extending each other) shares one root."""
    system = list(range(64))
    prompts, conversation = [], []
    for c in range(150):
        history = system + [1000 + c] * 16
        for turn in range(3):
            history = history + [5000 + 10 * c + turn] * 16
            prompts.append(list(history))
            conversation.append(c)
    trace = make_trace(prompts, 16)
    keys, roots = root_keys(trace)
    assert roots == "prefix subtrees"
    conversation = np.asarray(conversation)
    for c in range(150):
        assert len(set(keys[conversation == c].tolist())) == 1
    assert len(np.unique(keys)) == 150
    assert TRUNK_SHARE * trace.n_requests < 150  # the system prompt's blocks are trunk


def test_no_prefix_information_samples_requests() -> None:
    trace = synthesize("short", requests=400, seed=1)
    empty = pa.array([[]] * 400, type=pa.list_(pa.uint64()))
    table = trace.table.drop_columns(["block_hashes"]).append_column("block_hashes", empty)
    trace = Trace.from_table(table, block_tokens=16, has_prefix_info=False)
    sampled, roots = sample(trace, 0.5)
    assert roots == "requests"
    assert 120 < sampled.n_requests < 280


@settings(max_examples=25, deadline=None)
@given(fraction=st.floats(0.05, 1.0), seed=st.integers(0, 1000))
def test_sample_is_a_subset_in_arrival_order(fraction: float, seed: int) -> None:
    trace = synthesize("chat", requests=120, seed=7)
    try:
        sampled, _ = sample(trace, fraction, seed=seed)
    except Exception as err:  # only "keeps none" is allowed, as a one-line InputError
        assert "keeps none" in str(err)
        return
    ids = sampled.column_numpy("request_id")
    assert set(ids) <= set(trace.column_numpy("request_id"))
    assert np.all(np.diff(sampled.arrival_s) >= 0)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--fraction", "0"], "(0, 1]"),
        (["--fraction", "1.5"], "(0, 1]"),
        (["--fraction", "nan"], "(0, 1]"),
        (["--fraction", "0.5", "--seed", "-1"], "--seed"),
    ],
)
def test_bad_sample_options(tmp_path: Path, args: list[str], needle: str) -> None:
    result = invoke("trace", "sample", str(MOONCAKE), *args, "-o", str(tmp_path / "s.parquet"))
    assert_one_line_error(result, needle)


def test_slice_keeps_the_window_shifted_to_zero(tmp_path: Path) -> None:
    trace = read_trace(MOONCAKE)
    cut = time_slice(trace, 600.0, 1200.0)
    inside = (trace.arrival_s >= 600) & (trace.arrival_s < 1200)
    assert cut.n_requests == int(inside.sum())
    assert np.allclose(cut.arrival_s, trace.arrival_s[inside] - 600.0)
    out = tmp_path / "cut.parquet"
    result = invoke(
        "trace", "slice", str(MOONCAKE), "--start", "600", "--end", "1200", "-o", str(out)
    )
    assert result.code == 0, result.stderr
    assert read_trace(out).table.equals(cut.table)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--start", "-1"], "--start"),
        (["--start", "10", "--end", "5"], "--end"),
        (["--start", "1e9"], "no request arrives"),
    ],
)
def test_bad_slices(tmp_path: Path, args: list[str], needle: str) -> None:
    result = invoke("trace", "slice", str(MOONCAKE), *args, "-o", str(tmp_path / "s.parquet"))
    assert_one_line_error(result, needle)


# -- replays of a sample run on a cluster scaled by the same fraction ---------------------------
def test_a_sample_replays_on_a_scaled_cluster_and_shared_pools(chat) -> None:  # noqa: ANN001
    from kvtier.deploy.sample import scaled_for_sample
    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy.presets import load_preset
    from kvtier.scenario import Scenario

    hardware = load_hardware("h100-node")
    policy = load_preset("mooncake-rdma")
    run_policy, run_hw = scaled_for_sample(policy, hardware, 0.25)
    assert run_policy.serving.instances == 2  # 8 GPUs x 0.25
    full_pool = hardware.tiers["rdma"].capacity_bytes / 2**30
    rdma = run_policy.tier("rdma")
    assert rdma is not None
    expected = (policy.tier("rdma").capacity_gb or full_pool) * 0.25
    assert rdma.capacity_gb == pytest.approx(expected)
    assert run_hw.tiers["rdma"].pool_bw == pytest.approx(hardware.tiers["rdma"].pool_bw * 0.25)

    sampled, _ = sample(chat, 0.25, seed=4)
    replay = Scenario(sampled, hardware, load_model("Llama-3.1-8B"), policy).replay()
    assert replay.config.n_instances == 2
    assert replay.policy == policy  # what a user stores is the full deployment
    full = Scenario(chat, hardware, load_model("Llama-3.1-8B"), policy).replay()
    assert full.config.n_instances == 8


@pytest.mark.parametrize(
    ("fraction", "share"), [(0.1, 0.5), (0.2, 1.0), (0.25, 0.625), (0.5, 5 / 6)]
)
def test_per_host_tiers_hold_the_fraction_of_the_full_deployments(
    fraction: float, share: float
) -> None:
    """40 instances on five 8-GPU hosts: a 10% sample's 4 instances fill half a host, so the
    host's DRAM pool keeps half its size (a fifth of the hosts' DRAM would be 1 pool = 2x per
    instance otherwise); 8 instances fill one host exactly; 10 fill two hosts, 5/8 each; 20 fill
    three, 5/6 each (2.5 hosts' worth in all)."""
    from dataclasses import replace

    from kvtier.deploy.sample import scaled_for_sample
    from kvtier.hardware import load_hardware
    from kvtier.policy.presets import load_preset

    hardware = load_hardware("h100-node")
    hardware = replace(hardware, topology=replace(hardware.topology, hosts=5))
    policy = load_preset("lmcache-cpu-disk")
    run_policy, run_hw = scaled_for_sample(policy, hardware, fraction)
    assert run_policy.serving.instances == round(40 * fraction)
    for name in ("dram", "ssd"):
        tier, run_tier = policy.tier(name), run_policy.tier(name)
        assert tier is not None and run_tier is not None
        full = tier.capacity_gb or hardware.tiers[name].capacity_bytes / 2**30
        assert run_tier.capacity_gb == pytest.approx(full * share)
        hw, run = hardware.tiers[name], run_hw.tiers[name]
        ports = share if hw.attach == "host" else 1.0
        assert run.port_read_bw == pytest.approx(hw.port_read_bw * ports)


def test_a_fraction_that_leaves_a_partial_instance_is_one_line(chat, tmp_path) -> None:  # noqa: ANN001
    sampled, _ = sample(chat, 0.1, seed=0)
    path = tmp_path / "s.parquet"
    write_trace(sampled, path)
    result = invoke("replay", "--trace", str(path))
    assert_one_line_error(result, "0.1 sample", "8 instances", "whole number")
    two_hosts = tmp_path / "h100-2hosts.toml"
    text = (PROFILES / "h100-node.toml").read_text().replace('"h100-node"', '"h100-2hosts"')
    two_hosts.write_text(text.replace("hosts = 1 ", "hosts = 2 ", 1))
    ok = invoke(
        "replay",
        "--trace",
        str(path),
        "--hardware",
        str(two_hosts),
        "--set",
        "serving.instances=10",
        "--json",
    )
    assert ok.code == 0, ok.stderr


# -- streamed samples of traces larger than memory ----------------------------------------------
def test_streamed_sample_of_sessions_equals_the_in_memory_sample(chat, tmp_path) -> None:  # noqa: ANN001
    from kvtier.trace.samplestream import stream_sample

    path = tmp_path / "chat.parquet"
    write_trace(chat, path)
    read, kept, roots = stream_sample(
        str(path), 0.3, str(tmp_path / "s.parquet"), seed=5, batch_rows=97
    )
    direct, _ = sample(chat, 0.3, seed=5)
    direct = starting_at_zero(direct)  # as every reader reads the written sample
    streamed = read_trace(tmp_path / "s.parquet")
    assert (read, kept, roots) == (chat.n_requests, direct.n_requests, "sessions")
    assert streamed.sample_fraction == pytest.approx(0.3)
    for name in direct.table.column_names:
        assert streamed.table.column(name).to_pylist() == direct.table.column(name).to_pylist()


def test_streamed_sample_of_lengths_only_requests(tmp_path) -> None:
    trace = synthesize("short", requests=500, seed=2)
    empty = pa.array([[]] * 500, type=pa.list_(pa.uint64()))
    table = trace.table.drop_columns(["block_hashes"]).append_column("block_hashes", empty)
    trace = Trace.from_table(table, block_tokens=16, has_prefix_info=False)
    path = tmp_path / "t.parquet"
    write_trace(trace, path)
    result = invoke(
        "trace",
        "sample",
        str(path),
        "--fraction",
        "0.4",
        "--stream",
        "-o",
        str(tmp_path / "s.parquet"),
    )
    assert result.code == 0, result.stderr
    direct, _ = sample(trace, 0.4)
    assert read_trace(tmp_path / "s.parquet").table.column("request_id").to_pylist() == (
        direct.table.column("request_id").to_pylist()
    )


def _same_file(path: Path, direct: Trace) -> None:
    got = pq.read_table(path)
    assert got.column_names == direct.table.column_names
    for name in got.column_names:
        assert got.column(name).to_pylist() == direct.table.column(name).to_pylist(), name
    assert got.schema.metadata == direct.table.schema.metadata


@pytest.mark.parametrize(("fraction", "batch_rows"), [(0.4, 1_000), (0.1, 4_096), (1.0, 50_000)])
def test_streamed_sample_of_prefix_subtrees_equals_in_memory(
    tmp_path: Path, fraction: float, batch_rows: int
) -> None:
    from kvtier.trace.samplestream import stream_sample

    out = tmp_path / "s.parquet"
    read, kept, roots = stream_sample(
        str(MOONCAKE), fraction, str(out), seed=3, batch_rows=batch_rows
    )
    direct, direct_roots = sample(read_trace(MOONCAKE), fraction, seed=3)
    assert (roots, direct_roots) == ("prefix subtrees", "prefix subtrees")
    assert (read, kept) == (12_031, direct.n_requests)
    _same_file(out, direct)


def test_streamed_sample_of_tenant_subtrees_through_the_cli(tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    prompts = [[int(rng.integers(0, 3))] * 16 + list(rng.integers(0, 4, int(rng.integers(1, 60))))
               for _ in range(400)]  # fmt: skip
    tenants = [["a", "b", "c"][i % 3] for i in range(400)]
    trace = make_trace(prompts, 16, tenants=tenants)
    path = tmp_path / "t.parquet"
    write_trace(trace, path)
    out = tmp_path / "s.parquet"
    result = invoke(
        "trace", "sample", str(path), "--fraction", "0.3", "--seed", "2", "--stream", "-o", str(out)
    )
    assert result.code == 0, result.stderr
    assert "prefix subtrees, streamed" in result.stdout
    direct, roots = sample(trace, 0.3, seed=2)
    assert roots == "prefix subtrees" and 0 < direct.n_requests < 400
    _same_file(out, direct)


@pytest.mark.parametrize(
    ("start", "end", "batch_rows"), [(100.0, 900.0, 777), (0.0, None, 5_000), (3_000.0, None, 100)]
)
def test_streamed_slice_equals_in_memory(
    tmp_path: Path, start: float, end: float | None, batch_rows: int
) -> None:
    from kvtier.trace.samplestream import stream_slice

    out = tmp_path / "c.parquet"
    read, kept, span = stream_slice(str(MOONCAKE), start, end, str(out), batch_rows=batch_rows)
    direct = time_slice(read_trace(MOONCAKE), start, end)
    assert (read, kept) == (12_031, direct.n_requests)
    assert span == pytest.approx(direct.duration_s)
    _same_file(out, direct)


def test_streamed_slice_of_a_sample_keeps_its_fraction_and_refuses_an_empty_window(
    tmp_path: Path,
) -> None:
    from kvtier.trace.samplestream import stream_sample

    sampled = tmp_path / "s.parquet"
    stream_sample(str(MOONCAKE), 0.5, str(sampled), batch_rows=3_000)
    out = tmp_path / "c.parquet"
    result = invoke(
        "trace", "slice", str(sampled), "--start", "60", "--end", "600", "--stream", "-o", str(out)
    )
    assert result.code == 0, result.stderr
    _same_file(out, time_slice(read_trace(sampled), 60.0, 600.0))
    assert read_trace(out).sample_fraction == pytest.approx(0.5)
    result = invoke("trace", "slice", str(sampled), "--start", "99999", "--stream", "-o", str(out))
    assert_one_line_error(result, "--start", "no request arrives", "0 to 3,53")


@pytest.mark.parametrize(
    "command",
    [
        ["sample", "--fraction", "1"],
        ["slice", "--start", "0"],
        ["map", "-B", "16"],
    ],
)
@pytest.mark.parametrize("stream", ["--stream", "--no-stream"])
def test_an_output_that_is_the_input_is_refused(
    tmp_path: Path, command: list[str], stream: str
) -> None:
    """Writing a derived trace over its source would destroy the source; a file written into
    a dataset directory would become one of its parts."""
    trace = tmp_path / "t.parquet"
    write_trace(make_trace([[1] * 40, [1] * 20 + [2] * 20], 16), trace)
    before = trace.read_bytes()
    name, *rest = command
    for target in (trace, tmp_path / "." / "t.parquet"):
        result = invoke("trace", name, str(trace), *rest, "-o", str(target), stream)
        assert_one_line_error(result, "--output", "is the input")
    assert trace.read_bytes() == before
    dataset = tmp_path / "ds"
    dataset.mkdir()
    write_trace(read_trace(trace), dataset / "part-0.parquet")
    result = invoke("trace", name, str(dataset), *rest, "-o", str(dataset / "x.parquet"), stream)
    assert_one_line_error(result, "--output", "inside the input dataset directory")
    assert sorted(p.name for p in dataset.iterdir()) == ["part-0.parquet"]
