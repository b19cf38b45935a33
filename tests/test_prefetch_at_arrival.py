"""SGLang HiCache's storage prefetch: a request's hits in the file tier are read into its
engine's host pool when it arrives, and it waits in its queue, holding no HBM and blocking no
one behind it, until they are there (``wait_complete``); a prefetch under 256 tokens is declined
(docs/model.md, "Storage prefetch at arrival"); the engine's prefetches in flight may reserve
half its host pool, and one declined or missing is retried by later scheduling passes.

Two engines on one host share a file tier and keep host pools of their own (round robin: even
requests on engine 0, odd on engine 1). Engine 0 computes a prefix, written through to the file
tier; engine 1 then extends it, and a short unrelated prompt reaches engine 1 just after.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import REQUEST_FIELDS, TIER_FIELDS, assert_fields_equal, replay_both

B = 16
GAP_S = 1.0e4
DRAM, SSD = 0, 1  # lower-tier columns of RawResult.loaded_blocks


def trace(prefix: int) -> BlockedTrace:
    """The prefix on engine 0; at GAP_S its extension on engine 1, then an unrelated prompt on
    engine 0 and a one-block prompt on engine 1, a millisecond apart."""
    base = list(range(prefix))
    nxt = prefix
    other = list(range(nxt + 2, nxt + 2 + prefix))
    prompts = [base + [nxt], base + [nxt + 1], other, [nxt + 2 + prefix]]
    n_blocks = nxt + 3 + prefix
    times = [0.0, GAP_S, GAP_S + 5e-4, GAP_S + 1e-3]
    inputs = [len(p) * B + 1 for p in prompts]
    return BlockedTrace.from_lists(times, inputs, [4] * 4, prompts, B, n_blocks=n_blocks)


def config(prefetch: bool, dram_gb: float = 100.0, max_seqs: int | None = None):
    """Two H100 engines on one host, host pools of ``dram_gb`` in all and one shared file tier
    behind SGLang's file back end (``sglang-hicache-file``), written through; its prefetch on
    or off."""
    model = load_model("Qwen3-8B")
    policy = Policy(
        block_tokens=B,
        write_policy="write_through",
        serving=ServingPolicy(
            instances=2,
            tp=1,
            routing="round_robin",
            **({} if max_seqs is None else {"max_num_seqs": max_seqs}),
        ),
        tiers=(
            TierPolicy(capacity_gb=20.0),
            TierPolicy(name="dram", capacity_gb=dram_gb),
            TierPolicy(name="ssd", capacity_gb=200.0, connector="sglang-hicache-file"),
        ),
    )
    hw = load_hardware("a3-highgpu-4g-lustre")
    hw = replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=2))
    cfg = build_config(hw, model, policy)
    assert cfg.tiers.prefetch_at_arrival.tolist() == [False, True]
    if not prefetch:
        off = np.zeros(cfg.tiers.n_tiers, dtype=np.bool_)
        cfg = replace(cfg, tiers=replace(cfg.tiers, prefetch_at_arrival=off))
    assert cfg.prefetches_at_arrival == prefetch
    return cfg


def replay(prefix: int, prefetch: bool, engine: str):  # noqa: ANN201 - a RawResult
    return simulate_raw(
        trace(prefix), config(prefetch), engine=engine, check_invariants=engine == "reference"
    )


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_the_file_tier_is_read_at_arrival_into_the_host_pool(engine: str) -> None:
    raw = replay(64, True, engine)
    assert raw.tier_hit_blocks[SSD] == 0 and raw.tier_hit_blocks[DRAM] == 64
    assert raw.tier_prefetched_blocks.tolist() == [0, 64]  # (a prefetch's read, not a load)
    assert raw.loaded_blocks[1, DRAM] == 64 and raw.loaded_blocks[1, SSD] == 0
    off = replay(64, False, engine)
    assert off.loaded_blocks[1, SSD] == 64 and off.loaded_blocks[1, DRAM] == 0
    assert off.tier_prefetched_blocks.tolist() == [0, 0]
    # the one-block prompt behind it on engine 1 is not held up by the prefetch in flight
    assert raw.first_token_s[3] < raw.first_token_s[1]


def test_the_tier_table_shows_what_prefetches_read_from_the_file_tier() -> None:
    """The file tier's row: nothing loaded into HBM from it, its prefix read by the prefetch
    (64 blocks); the host pool's row: the prefix loaded from it."""
    from rich.console import Console

    from kvtier.report.tiers import tier_table
    from kvtier.sim.tier_stats import tier_stats

    cfg = config(True)
    tr = trace(64)
    raw = simulate_raw(tr, cfg, engine="numba")
    dram, ssd = tier_stats(cfg.tiers, raw, tr.arrival_s, load_hardware("a3-highgpu-4g-lustre"))
    block_gb = cfg.tiers.block_bytes / 1e9
    assert ssd.loaded_gb == 0 and ssd.prefetched_gb == pytest.approx(64 * block_gb)
    assert dram.loaded_gb == pytest.approx(64 * block_gb) and dram.prefetched_gb == 0
    console = Console(width=250, record=True)
    console.print(tier_table([dram, ssd]))
    (row,) = [line for line in console.export_text().splitlines() if "sglang-hicache-file" in line]
    assert f"0.0 (+ {64 * block_gb:,.1f} prefetched)" in row


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_a_prefetch_under_256_tokens_is_declined_and_its_blocks_computed(engine: str) -> None:
    """SGLang's admission matches the device and host trees only: storage pages reach the host
    pool through a prefetch, so a declined one's blocks are computed, not loaded."""
    raw = replay(8, True, engine)  # 128 tokens
    assert raw.tier_prefetched_blocks[SSD] == 0
    assert raw.loaded_blocks[1, SSD] == 0 and raw.loaded_blocks[1, DRAM] == 0
    off = replay(8, False, engine)  # (without the prefetch, the file tier loads at admission)
    assert off.loaded_blocks[1, SSD] == 8


@pytest.mark.parametrize(("prefix", "prefetch"), [(64, True), (64, False), (8, True)])
def test_engines_agree(prefix: int, prefetch: bool) -> None:
    ref = replay(prefix, prefetch, "reference")
    fast = replay(prefix, prefetch, "numba")
    assert_fields_equal(
        ref, fast, (*REQUEST_FIELDS, "tier_hit_blocks", "tier_prefetched_blocks", "tier_bytes_read")
    )


def group_trace(prefix: int, long_output: int = 0) -> BlockedTrace:
    """The prefix on engine 0; at GAP_S, on engine 1: a one-block prompt generating
    ``long_output`` tokens (none: no such request), then two extensions of the prefix, with
    one-block prompts on engine 0 between them to keep the turns."""
    base = list(range(prefix))
    x = prefix
    rows = [(base + [x], 4)]  # engine 0
    if long_output:
        rows += [([x + 1], long_output), ([x + 2], 4)]
    rows += [(base + [x + 3], 4), ([x + 4], 4), (base + [x + 5], 4)]
    prompts = [r[0] for r in rows]
    times = [0.0] + [GAP_S + 1e-4 * j for j in range(len(rows) - 1)]
    inputs = [len(p) * B + 1 for p in prompts]
    return BlockedTrace.from_lists(times, inputs, [r[1] for r in rows], prompts, B, n_blocks=x + 6)


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_a_prefetch_past_the_in_flight_limit_is_declined_and_computed(engine: str) -> None:
    """Two extensions of one prefix reach engine 1 a fraction of a millisecond apart. With a
    host pool of 100 GB each prefetches the prefix (the second before the first's pages are
    in: SGLang reads them twice too); with one of about 106 blocks the first prefetch's 65
    reserved blocks pass half of it and the second is declined: it computes the prefix."""
    tr = group_trace(64)
    big = simulate_raw(tr, config(True), engine=engine, check_invariants=True)
    assert big.tier_prefetched_blocks[SSD] == 128
    # (the first loads the pages from the host pool; the second, admitted after it, hits them
    # in HBM)
    assert big.loaded_blocks[1, DRAM] == 64 and big.hit_blocks[3] == 64
    small_cfg = config(True, dram_gb=0.5)
    assert small_cfg.prefetch_limit_tokens // B < 65 < small_cfg.tiers.capacity_blocks[0]
    small = simulate_raw(tr, small_cfg, engine=engine, check_invariants=True)
    assert small.tier_prefetched_blocks[SSD] == 64
    # the second, held by nothing, is admitted first and computes the prefix; the first, its
    # prefetch ended, then finds the prefix in HBM
    assert small.loaded_blocks[3].tolist() == [0, 0] and small.hit_blocks[3] == 0
    assert small.first_token_s[3] < small.first_token_s[1] and small.hit_blocks[1] == 64


@pytest.mark.parametrize(
    ("passes", "attempts", "calls"), [(8, 8, 9), (8, 2, 3), (0, 8, 1), (1, 8, 9), (8, 0, 1)]
)
def test_a_declined_prefetch_is_retried_every_few_passes_up_to_its_attempts(
    monkeypatch: pytest.MonkeyPatch, passes: int, attempts: int, calls: int
) -> None:
    """One engine runs one request at a time (``max_num_seqs`` 1) and decodes a long answer
    while the prefix's two extensions wait behind it, the first's prefetch holding the host
    pool's in-flight share until the scheduler reaches it. The second, declined, is re-issued
    ``passes`` passes after the first that sees it, declined again each time, at most
    ``attempts`` times (SGLang's defaults: 8 and 8); then, the queue's head, it computes the
    prefix. Both engines agree on every request."""
    from kvtier.sim.reference import ReferenceReplay

    issued: list[int] = []
    issue = ReferenceReplay.prefetch

    def counted(self, inst, k, req, t):  # noqa: ANN001, ANN202
        issued.append(req.idx)
        return issue(self, inst, k, req, t)

    monkeypatch.setattr(ReferenceReplay, "prefetch", counted)
    cfg = replace(
        config(True, dram_gb=0.5, max_seqs=1),
        prefetch_retry_passes=passes,
        prefetch_retry_attempts=attempts,
    )
    tr = group_trace(64, long_output=200)
    pair = replay_both(tr, cfg, check_invariants=True)
    assert pair is not None
    ref, fast = pair
    assert issued.count(5) == calls and issued.count(3) == 1
    assert ref.loaded_blocks[3, DRAM] == 64 and ref.loaded_blocks[5].tolist() == [0, 0]
    assert_fields_equal(
        ref, fast, (*REQUEST_FIELDS, "tier_hit_blocks", "tier_prefetched_blocks", "tier_bytes_read")
    )


def drawn_trace(groups: int, prefix: int, per_group: int, spread: float):
    """Round by round, one request of each group (a group's prefix and a block of its own), sent
    to the engines in turn (round robin): a group's later requests land on engines that did not
    compute its prefix, whose host pools may hold it or not."""
    prompts, times = [], []
    nxt = groups * prefix
    t = 0.0
    for r in range(per_group):
        for g in range(groups):
            prompts.append(list(range(g * prefix, (g + 1) * prefix)) + [nxt])
            nxt += 1
            times.append(t)
            t += spread
        t += 0.0 if r % 2 else 5.0  # every other round long after the one before
    n = len(prompts)
    return BlockedTrace.from_lists(
        times, [(prefix + 1) * B + 1] * n, [2] * n, prompts, B, n_blocks=nxt
    )


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    groups=st.integers(1, 4),
    prefix=st.integers(2, 24),
    per_group=st.integers(2, 5),
    instances=st.integers(2, 3),
    spread=st.sampled_from([0.0, 1e-3, 2e-2]),
    hbm_prompts=st.sampled_from([1.5, 3.0]),
    dram_prompts=st.sampled_from([0.5, 1.5, 8.0]),
    min_blocks=st.sampled_from([1, 4, 16]),
    async_scheduling=st.booleans(),
    load_report=st.sampled_from(["step_output", "at_once"]),
    retry_passes=st.sampled_from([0, 1, 8]),
    retry_attempts=st.sampled_from([0, 1, 8]),
    page_cache_prompts=st.sampled_from([0.0, 0.5, 4.0]),
)
# re-issued prefetches, some of them read (found by instrumenting the reference; the drawn
# examples rarely queue a declined request behind another long enough)
@example(4, 8, 5, 2, 0.0, 1.5, 0.5, 1, False, "step_output", 1, 8, 0.0)
@example(4, 8, 5, 2, 1e-3, 1.5, 0.5, 1, True, "at_once", 1, 8, 0.5)
# prefixes evicted while their requests wait, looked up in storage again (10 and 6 times)
@example(4, 24, 5, 2, 0.0, 1.5, 0.5, 1, False, "step_output", 8, 8, 0.0)
@example(3, 16, 5, 2, 0.0, 1.5, 1.5, 4, True, "at_once", 1, 8, 4.0)
def test_engines_agree_on_drawn_prefetches(
    groups, prefix, per_group, instances, spread, hbm_prompts, dram_prompts, min_blocks,
    async_scheduling, load_report, retry_passes, retry_attempts, page_cache_prompts,
) -> None:  # fmt: skip
    """Drawn groups sharing prefixes over two or three engines whose host pools hold a few
    prompts or many (their in-flight share, half, declining prefetches or not), a shared file
    tier behind SGLang's file back end, with a page cache of half a prompt, four or none in
    front of it, drawn retries: identical per-request results and tier
    counts from both engines, the model's invariants checked at every step."""
    tr = drawn_trace(groups, prefix, per_group, spread)
    model = load_model("Qwen3-8B")
    prompt_gb = (prefix + 2) * B * model.kv_bytes_per_token("bf16") / 1e9
    policy = Policy(
        block_tokens=B,
        write_policy="write_through",
        serving=ServingPolicy(
            instances=instances, tp=1, routing="round_robin", async_scheduling=async_scheduling
        ),
        tiers=(
            TierPolicy(capacity_gb=hbm_prompts * prompt_gb),
            TierPolicy(name="dram", capacity_gb=dram_prompts * prompt_gb * instances),
            *(
                (
                    TierPolicy(
                        name="pagecache",
                        capacity_gb=page_cache_prompts * prompt_gb,
                        connector="sglang-hicache-file",
                    ),
                )
                if page_cache_prompts
                else ()
            ),
            TierPolicy(name="ssd", capacity_gb=200.0, connector="sglang-hicache-file"),
        ),
        load_report=load_report,
    )
    hw = load_hardware("a3-highgpu-4g-lustre")
    hw = replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=instances))
    cfg = replace(
        build_config(hw, model, policy),
        prefetch_min_tokens=min_blocks * B,
        prefetch_retry_passes=retry_passes,
        prefetch_retry_attempts=retry_attempts,
    )
    assert cfg.prefetches_at_arrival
    pair = replay_both(tr, cfg, check_invariants=True)
    if pair is None:  # both stopped at the same stall
        return
    assert_fields_equal(*pair, (*REQUEST_FIELDS, *TIER_FIELDS))
    ref = pair[0]
    if not ref.preemptions.any():  # a tier's hits are the requests' loads, not prefetches
        np.testing.assert_array_equal(ref.loaded_blocks.sum(axis=0), ref.tier_hit_blocks)
    read = ref.tier_hit_blocks + ref.tier_prefetched_blocks  # (cascades read blocks too)
    assert np.all(read * cfg.tiers.block_bytes <= ref.tier_bytes_read * (1 + 1e-12))


def test_the_first_lower_tier_has_nothing_above_to_prefetch_into() -> None:
    """The file back end's connector on the only lower tier: its hits load at admission, once
    (no prefetch reads them first)."""
    model = load_model("Qwen3-8B")
    policy = Policy(
        block_tokens=B,
        serving=ServingPolicy(instances=2, tp=1, routing="round_robin"),
        tiers=(
            TierPolicy(capacity_gb=20.0),
            TierPolicy(name="ssd", capacity_gb=200.0, connector="sglang-hicache-file"),
        ),
    )
    hw = load_hardware("a3-highgpu-4g-lustre")
    cfg = build_config(
        replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=2)), model, policy
    )
    assert cfg.prefetches_at_arrival
    for engine in ("reference", "numba"):
        raw = simulate_raw(trace(64), cfg, engine=engine, check_invariants=engine == "reference")
        assert raw.loaded_blocks[1, 0] == 64 and raw.tier_hit_blocks[0] == 64


def hit_loss_replay(attempts: int, engine: str):  # noqa: ANN201 - a RawResult
    """One engine running one request at a time, HBM of 100 blocks, a host pool of 70 and the
    file tier: a 64-block prefix computed (request 0), then a long answer running (1), an
    unrelated 80-block prompt (2) and an extension of the prefix (3) waiting behind it. At its
    arrival the extension finds the prefix in HBM and the host pool (nothing to prefetch); the
    80-block prompt, admitted first, evicts most of it from HBM and, written through, all of it
    from the host pool."""
    model = load_model("Qwen3-8B")
    block_gb = B * model.kv_bytes_per_token("bf16") / 1e9
    policy = Policy(
        block_tokens=B,
        write_policy="write_through",
        serving=ServingPolicy(instances=1, tp=1, routing="round_robin", max_num_seqs=1),
        tiers=(
            TierPolicy(capacity_gb=100.5 * block_gb),
            TierPolicy(name="dram", capacity_gb=70.5 * block_gb),
            TierPolicy(name="ssd", capacity_gb=200.0, connector="sglang-hicache-file"),
        ),
    )
    hw = load_hardware("a3-highgpu-4g-lustre")
    hw = replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=1))
    cfg = replace(build_config(hw, model, policy), prefetch_retry_attempts=attempts)
    base = list(range(64))
    prompts = [base + [64], [65], list(range(66, 146)), base + [146]]
    times = [0.0, GAP_S, GAP_S + 0.01, GAP_S + 0.02]
    outputs = [4, 200, 4, 4]
    tr = BlockedTrace.from_lists(
        times, [len(p) * B + 1 for p in prompts], outputs, prompts, B, n_blocks=147
    )
    return simulate_raw(tr, cfg, engine=engine, check_invariants=engine == "reference")


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_a_prefix_evicted_while_waiting_is_looked_up_in_storage_again(engine: str) -> None:
    """SGLang's ``_prefetch_after_device_hit_loss``: at admission the extension's prefix in
    HBM and the host pool is shorter than at its arrival, so its storage lookup is issued again
    and it waits for that prefetch: its prefix comes back from the file tier through the host
    pool. With no re-issue left it is admitted with what HBM holds and computes the rest."""
    again = hit_loss_replay(8, engine)
    assert again.tier_prefetched_blocks[SSD] > 0
    assert again.loaded_blocks[3, DRAM] == again.tier_prefetched_blocks[SSD]
    assert again.hit_blocks[3] + again.loaded_blocks[3, DRAM] == 64
    spent = hit_loss_replay(0, engine)
    assert spent.tier_prefetched_blocks[SSD] == 0 and spent.loaded_blocks[3].tolist() == [0, 0]
    assert spent.hit_blocks[3] < 64


def test_engines_agree_on_a_prefix_evicted_while_waiting() -> None:
    for attempts in (0, 8):
        ref, fast = (hit_loss_replay(attempts, e) for e in ("reference", "numba"))
        assert_fields_equal(
            ref,
            fast,
            (*REQUEST_FIELDS, "tier_hit_blocks", "tier_prefetched_blocks", "tier_bytes_read"),
        )


def mooncake_config(*connectors: str):
    """One A100-40GB engine, a host pool twice its device pool and a Mooncake pool (and an SSD
    tier behind it when two connectors are given), each read by the storage prefetch."""
    model = load_model("Qwen3-8B")
    names = ("rdma", "ssd")
    policy = Policy(
        block_tokens=64,
        write_policy="write_through",
        serving=ServingPolicy(framework="sglang", tp=1, instances=1),
        tiers=(
            TierPolicy(capacity_gb=19.016),
            TierPolicy(name="dram", capacity_gb=38.032),
            *(
                TierPolicy(name=name, capacity_gb=85.9, connector=c)
                for name, c in zip(names, connectors, strict=False)
            ),
        ),
    )
    return build_config(load_hardware("dgx-a100-40gb-mooncake"), model, policy)


def test_sglang_0510s_prefetch_rules_come_with_its_connector() -> None:
    """SGLang 0.5.10 (the Mooncake SSD-offload runs' release) neither retries a declined
    prefetch nor looks a lost prefix up again, and lets its prefetches in flight reserve 0.8
    of the host pool past the device pool; the current release retries and reserves half."""
    old = mooncake_config("sglang-0.5.10-hicache-mooncake")
    new = mooncake_config("sglang-hicache-mooncake")
    host = int(new.tiers.capacity_blocks[0]) * 64
    assert (new.prefetch_retry_attempts, new.prefetch_limit_tokens) == (8, host // 2)
    spare = int(old.tiers.capacity_blocks[0]) * 64 - old.capacity_blocks * 64
    assert old.prefetch_retry_attempts == 0
    assert old.prefetch_limit_tokens == int(0.8 * spare) < host // 2
    plain = mooncake_config("mooncake-te")  # no prefetch at arrival: the defaults stand
    assert (plain.prefetch_retry_attempts, plain.prefetch_reserve) == (8, "half_host")


def test_two_releases_prefetch_rules_in_one_engine_are_refused() -> None:
    with pytest.raises(InputError) as err:
        mooncake_config("sglang-0.5.10-hicache-mooncake", "sglang-hicache-mooncake")
    assert "tiers.rdma.connector" in err.value.message
    assert err.value.option == "tiers.ssd.connector"
