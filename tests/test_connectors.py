"""Each connector's signature (docs/model.md, "Transfer paths"), through both engines.

A second instance loads a long prompt the first one wrote to a shared RDMA pool, through the
connector under test. The signatures follow from each path's stages, not from calibrated
values: LMCache 0.3.x's serial retrieve costs per chunk, so its load time grows with the chunk
count; vLLM's OffloadingConnector issues one DMA per fragment, so its time grows with the
fragment count; Mooncake's zero-copy batches keep operations in flight, so only the bytes
count. Workers, not links, carry the software cost: a second NIC does not speed a serial path.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import Hardware, Topology
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.sim.transfer import layerwise_ready, path_transfer
from kvtier.trace.blocked import BlockedTrace

PROMPT = 16 * 1024


def two_gpus(hw: Hardware, hosts: int = 1) -> Hardware:
    return replace(hw, topology=replace(hw.topology, hosts=hosts, gpus_per_host=2 // hosts))


def same_prompt_twice(B: int) -> BlockedTrace:
    ids = list(range(PROMPT // B))
    return BlockedTrace.from_lists(
        [0.0, 1000.0], [PROMPT + 1, PROMPT + 1], [1, 1], [ids, ids], B, n_blocks=len(ids)
    )


def load_time(connector: str, B: int, hw: Hardware | None = None, **kw: object) -> float:
    """Seconds the second request waits for its blocks, both engines agreeing."""
    return float(replay_pair(connector, B, hw, **kw).load_s[1])


def replay_pair(connector: str, B: int, hw: Hardware | None = None, **kw: object):  # noqa: ANN201
    """The second request loads what the first wrote through ``connector``; both engines
    agreeing, the numba engine's result."""
    hw = two_gpus(load_hardware("beluga-testbed")) if hw is None else hw
    tier = TierPolicy(name="rdma", capacity_gb=100.0, connector=connector)
    policy = Policy(
        block_tokens=B,
        serving=ServingPolicy(instances=2, routing="round_robin"),
        tiers=(TierPolicy(), tier),
        **kw,
    )
    cfg = build_config(hw, load_model("Qwen3-32B"), policy)
    trace = same_prompt_twice(B)
    ref = simulate_raw(trace, cfg, engine="reference", check_invariants=True)
    fast = simulate_raw(trace, cfg, engine="numba")
    np.testing.assert_array_equal(ref.first_token_s, fast.first_token_s)
    np.testing.assert_array_equal(ref.load_s, fast.load_s)
    np.testing.assert_array_equal(ref.stage_s, fast.stage_s)
    assert fast.tier_hit_blocks.sum() == PROMPT // B  # every block came from the pool
    return fast


def test_serial_retrieve_scales_with_chunk_count() -> None:
    """Same bytes in 16x more chunks: 16x more blocking gets, each paying its RPC."""
    small, large = load_time("lmcache-0.3-mooncake", 16), load_time("lmcache-0.3-mooncake", 256)
    rpc = 45e-3  # the connector's per-chunk RPC (kvtier.policy.registries)
    extra_chunks = PROMPT // 16 - PROMPT // 256
    assert small - large == pytest.approx(extra_chunks * rpc, rel=1e-6)


def test_dma_scales_with_fragment_count() -> None:
    """Per-layer K/V: 128 fragments a block, each one DMA; contiguous: one."""
    per_layer = load_time("vllm-offloading", 16)
    contiguous = load_time("vllm-offloading", 16, kv_layout="contiguous")
    blocks = PROMPT // 16
    assert per_layer - contiguous == pytest.approx(blocks * (128 - 1) * 7.0e-6, rel=1e-6)


def test_zero_copy_depends_on_bytes_only() -> None:
    """Pipelined batches keep enough operations in flight that fragments and chunks vanish."""
    a = load_time("mooncake-te", 16)
    b = load_time("mooncake-te", 256)
    c = load_time("mooncake-te", 16, kv_layout="contiguous")
    assert a == pytest.approx(b, rel=0.01)
    assert a == pytest.approx(c, rel=0.01)
    # and far from the serial retrieve of the same bytes
    assert 10 * a < load_time("lmcache-0.3-mooncake", 256)


def test_software_cost_is_worker_time_not_nic_time() -> None:
    """A serial connector is bound by its worker: splitting the host's NICs per GPU (more
    links, same total) changes nothing, while its per-operation cost occupies no link."""
    hw = two_gpus(load_hardware("beluga-testbed"))
    per_gpu = replace(hw, tiers={**hw.tiers, "rdma": replace(hw.tiers["rdma"], ports=2,
                                                              attach="gpu")})  # fmt: skip
    shared = load_time("lmcache-0.3-mooncake", 256, hw)
    split = load_time("lmcache-0.3-mooncake", 256, per_gpu)
    assert split == pytest.approx(shared, rel=0.02)


def test_each_tensor_parallel_rank_streams_its_own_shard() -> None:
    """LMCache runs one engine per tensor-parallel rank on the rank's KV heads: a TP=2
    instance moves its bytes over two streams and two staging copies at once, while each
    chunk's RPC is paid by both ranks together, once."""
    one = two_gpus(load_hardware("beluga-testbed"))
    two = replace(one, topology=replace(one.topology, gpus_per_host=4, tp=2))
    moved = 2 * PROMPT * 262_144  # the first request's store and the second's load (Qwen3-32B)
    for connector, rate in (("lmcache-mooncake", 10e9), ("lmcache-0.3-mooncake", 0.67e9)):
        s1 = replay_pair(connector, 256, one).stage_s[0]  # rpc, stream, staging, links
        s2 = replay_pair(connector, 256, two).stage_s[0]
        assert s1[1] == pytest.approx(moved / rate, rel=1e-9)
        assert s2[0] == s1[0]
        assert s2[1] == pytest.approx(s1[1] / 2, rel=1e-9)
        assert s2[2] == pytest.approx(s1[2] / 2, rel=1e-9)


def test_path_transfer_serial_and_pipelined_by_formula() -> None:
    """The rule of kvtier.sim.transfer.path_transfer on numbers small enough to check."""

    def run(serial: int, depth: int, ops: int) -> tuple[float, np.ndarray, np.ndarray]:
        free, busy, moved = np.zeros(2), np.zeros(1), np.zeros(1)
        wfree, wbusy, stage = np.zeros(1), np.zeros(1), np.zeros(4)
        fin = path_transfer(
            0.0, 100.0, ops, 1.0, np.inf, np.inf, serial, depth, 0.5, np.inf,
            np.array([0, -1, -1, -1, -1]), np.ones(5), np.array([10.0]), np.array([1]), 0,
            free, busy, moved, wfree, 0, 1, wbusy, stage, -1,
        )  # fmt: skip
        return fin, free, wbusy

    fin, free, wbusy = run(1, 1, 4)  # 4 ops of 25 bytes: each 1 s of RPC + 2.5 s on the link
    assert fin == 4 * (1.0 + 2.5) + 0.5
    assert free[0] == 10.0  # the link is busy for its bytes only
    assert wbusy[0] == 14.0
    fin, _, _ = run(0, 2, 4)  # pipelined: (w + c) + 3 * max(w / 2, c)
    assert fin == (1.0 + 2.5) + 3 * 2.5 + 0.5


def test_layerwise_ready_overlaps_the_prefill() -> None:
    # 10 s of load over 10 layers, 5 s of compute: start when the last layer's compute
    # (0.5 s) can follow the last layer's arrival, but never before the first layer arrives
    assert layerwise_ready(0.0, 10.0, 10, 5.0) == 10.0 - 4.5
    assert layerwise_ready(0.0, 10.0, 10, 100.0) == 1.0
    assert layerwise_ready(2.0, 2.0, 4, 1.0) == 2.0


def test_layerwise_load_starts_the_prefill_early() -> None:
    """A long recompute after a partial hit overlaps a layer-wise load, not a blocking one."""
    hw = two_gpus(load_hardware("beluga-testbed"))
    cfg_tier = {"name": "rdma", "capacity_gb": 100.0, "connector": "lmcache-0.3-mooncake"}
    B = 256
    ids = list(range(PROMPT // B))
    trace = BlockedTrace.from_lists(
        [0.0, 1000.0], [PROMPT // 2 + 1, PROMPT + 1], [1, 1], [ids[: len(ids) // 2], ids],
        B, n_blocks=len(ids),
    )  # fmt: skip
    ready = {}
    for lw in (False, True):
        tier = TierPolicy(**cfg_tier, layerwise=lw)
        policy = Policy(
            block_tokens=B,
            serving=ServingPolicy(instances=2, routing="round_robin"),
            tiers=(TierPolicy(), tier),
        )
        cfg = build_config(hw, load_model("Qwen3-32B"), policy)
        ref = simulate_raw(trace, cfg, engine="reference")
        fast = simulate_raw(trace, cfg, engine="numba")
        np.testing.assert_array_equal(ref.first_token_s, fast.first_token_s)
        ready[lw] = float(fast.load_s[1])
    assert ready[True] < ready[False]


def test_prefix_caching_off_sends_every_hit_through_the_connector() -> None:
    hw = load_hardware("beluga-testbed")
    hw = replace(hw, topology=Topology(hosts=1, gpus_per_host=1, tp=1))
    ids = list(range(PROMPT // 256))
    trace = BlockedTrace.from_lists(
        [0.0, 1000.0], [PROMPT + 1, PROMPT + 1], [1, 1], [ids, ids], 256, n_blocks=len(ids)
    )
    hits = {}
    for on in (True, False):
        policy = Policy(
            block_tokens=256,
            serving=ServingPolicy(instances=1, prefix_caching=on),
            tiers=(TierPolicy(), TierPolicy(name="rdma", capacity_gb=100.0)),
        )
        cfg = build_config(hw, load_model("Qwen3-32B"), policy)
        raw = simulate_raw(trace, cfg, engine="numba")
        ref = simulate_raw(trace, cfg, engine="reference")
        np.testing.assert_array_equal(ref.first_token_s, raw.first_token_s)
        hits[on] = (int(raw.hit_blocks[1]), int(raw.tier_hit_blocks.sum()))
    assert hits[True] == (len(ids), 0)  # the same instance: a full HBM hit
    assert hits[False] == (0, len(ids))  # every block from the pool


def test_closed_loop_keeps_n_requests_in_flight() -> None:
    """Four requests at time 0, two clients: the third is sent when the first finishes."""
    hw = load_hardware("beluga-testbed")
    hw = replace(hw, topology=Topology(hosts=1, gpus_per_host=1, tp=1))
    trace = BlockedTrace.from_lists(
        [0.0] * 4, [1000] * 4, [4] * 4, [[i * 10 + j for j in range(3)] for i in range(4)],
        256, n_blocks=40,
    )  # fmt: skip
    policy = Policy(block_tokens=256, serving=ServingPolicy(instances=1))
    cfg = replace(build_config(hw, load_model("Qwen3-32B"), policy), concurrency=2)
    for engine in ("reference", "numba"):
        raw = simulate_raw(trace, cfg, engine=engine)
        sent = raw.arrival_s
        assert sent[0] == sent[1] == 0.0
        finishes = np.sort(raw.finish_s[:2])
        assert sent[2] == finishes[0] and sent[3] == finishes[1]


def test_replay_concurrency_option_and_tier_table(tmp_path) -> None:  # noqa: ANN001
    from kvtier.trace.io import write_trace
    from kvtier.trace.synth import synthesize

    path = tmp_path / "t.parquet"
    write_trace(synthesize("rag", requests=40, rate=50.0, seed=2), path)
    args = ["replay", "--trace", str(path), "--preset", "mooncake-rdma", "--json"]
    open_loop = CliRunner().invoke(main, args)
    closed = CliRunner().invoke(main, [*args, "--concurrency", "4"])
    assert open_loop.exit_code == 0 and closed.exit_code == 0, closed.output
    import json

    a, b = json.loads(open_loop.output), json.loads(closed.output)
    assert a["n_served"] == b["n_served"] == 40
    (row,) = b["tiers"]
    assert row["tier"] == "rdma" and row["connector"] == "lmcache-mooncake"
    assert isinstance(row["net_loss"], bool) and row["load_s_idle"] > 0
    assert set(row["stage_share"]) == {"rpc", "stream", "staging", "links"}
    bad = CliRunner().invoke(main, [*args, "--concurrency", "-1"])
    assert bad.exit_code == 2 and "--concurrency" in bad.output


@pytest.mark.parametrize("connector", ["vllm-offloading", "lmcache-mooncake"])
def test_load_busy_seconds_are_the_loads_transfer_time_without_queueing(connector: str) -> None:
    """One request loads alone on an idle path: the tier's load workers were busy for its
    transfer, its wait less the path's latency (what vLLM's kv_offload_load_time sums); the
    first request's write counts on the store workers, not here. (A layer-wise connector,
    ``mooncake-te``, lets the prefill start before the last layer arrives, so its wait is
    shorter than its transfer.)"""
    from kvtier.sim.tier_stats import tier_stats

    B = 16
    hw = two_gpus(load_hardware("beluga-testbed"))
    raw = replay_pair(connector, B, hw)
    policy = Policy(
        block_tokens=B,
        serving=ServingPolicy(instances=2, routing="round_robin"),
        tiers=(TierPolicy(), TierPolicy(name="rdma", capacity_gb=100.0, connector=connector)),
    )
    cfg = build_config(hw, load_model("Qwen3-32B"), policy)
    (row,) = tier_stats(cfg.tiers, raw, same_prompt_twice(B).arrival_s, hw)
    lat = float(cfg.tiers.lat_s[0])
    assert row.load_busy_s == pytest.approx(float(raw.load_s[1]) - lat, rel=1e-9)
    assert raw.worker_busy_s.sum() > row.load_busy_s  # the store of the first request


def test_ssd_wear_is_reported_flagged_and_charged() -> None:
    """Write-through to NVMe on a busy 8-GPU host writes far more than 1 DWPD."""
    from kvtier.policy.presets import load_preset
    from kvtier.scenario import Scenario
    from kvtier.sim.tier_stats import DAY_S
    from kvtier.trace.synth import synthesize

    hw = load_hardware("h100-node")
    trace = synthesize("rag", requests=400, rate=40.0, seed=4)
    scenario = Scenario(trace, hw, load_model("Llama-3.1-8B"), load_preset("lmcache-cpu-disk"))
    result = scenario.replay()
    (ssd,) = [s for s in result.tiers if s.tier == "ssd"]
    ssd_hw = hw.tiers["ssd"]
    span = float(np.nanmax(result.raw.finish_s) - result.trace.arrival_s[0])
    written = float(result.raw.tier_bytes_written[result.config.tiers.names.index("ssd")])
    assert ssd.dwpd == pytest.approx(written / (span / DAY_S) / ssd_hw.capacity_bytes)
    assert ssd.dwpd_rating == 1.0 and ssd.over_rating
    endurance = ssd_hw.dwpd * ssd_hw.capacity_bytes / ssd_hw.drives * 365 * ssd_hw.warranty_years
    wear = written / (span / 3600) * ssd_hw.drive_price / endurance
    assert ssd.wear_per_hour == pytest.approx(wear)
    assert result.metrics.cost_per_hour == pytest.approx(result.config.cost_per_hour + wear)


def test_a_blocking_store_delays_the_cold_run_by_its_own_writes() -> None:
    """vLLM's wait_for_save with a synchronous store: each step's tokens wait for its copies."""
    hw = two_gpus(load_hardware("beluga-testbed"))
    B = 256
    ids = list(range(PROMPT // B))
    trace = BlockedTrace.from_lists([0.0], [PROMPT + 1], [8], [ids], B, n_blocks=len(ids))
    first, finish = {}, {}
    for blocking in (False, True):
        tier = TierPolicy(
            name="rdma", capacity_gb=100.0, connector="lmcache-0.3-mooncake",
            store_blocks=blocking,
        )  # fmt: skip
        policy = Policy(
            block_tokens=B, serving=ServingPolicy(instances=2), tiers=(TierPolicy(), tier)
        )
        cfg = build_config(hw, load_model("Qwen3-32B"), policy)
        ref = simulate_raw(trace, cfg, engine="reference", check_invariants=True)
        fast = simulate_raw(trace, cfg, engine="numba")
        np.testing.assert_array_equal(ref.first_token_s, fast.first_token_s)
        np.testing.assert_array_equal(ref.finish_s, fast.finish_s)
        first[blocking], finish[blocking] = float(fast.first_token_s[0]), float(fast.finish_s[0])
        assert fast.tier_bytes_written.sum() == len(ids) * cfg.tiers.block_bytes
    # 64 chunks of 67 MB put at 45 ms + 67 MB / 0.67 GB/s each, serially on one worker: the
    # prompt's steps wait for about 64 x 145 ms in all
    assert first[True] - first[False] > 5.0
    # decode steps compute no new prompt block: they do not wait
    assert finish[True] - first[True] == pytest.approx(finish[False] - first[False], rel=1e-9)
