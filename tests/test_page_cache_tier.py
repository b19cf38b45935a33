"""The page cache of a file tier (tier kind ``pagecache``): one pool per host in front of the
file tier, written with it and read through the same connector, so a host re-reads from memory
what it wrote; a storage prefetch reads each block from the first tier holding it, one transfer
per tier, each after the other (docs/model.md, "The page cache of a file tier").

Two hosts of two engines each, round robin (request i on engine i mod 4; engines 0 and 1 on
host 0). Engine 0 computes a prefix, written through to its host pool, host 0's page cache and
the shared file tier; an extension of it then reaches engine 1 (host 0) or engine 2 (host 1).
"""

from __future__ import annotations

from dataclasses import replace

from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import LOWER_TIERS
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.sim.config import build_config
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import REQUEST_FIELDS, TIER_FIELDS, assert_fields_equal, replay_both

B = 16
PREFIX = 64
GAP_S = 1.0e4
DRAM, PAGECACHE, SSD = 0, 1, 2  # lower-tier columns of RawResult.loaded_blocks


def test_the_page_cache_is_looked_up_before_the_file_tier_and_is_half_the_hosts_ram() -> None:
    assert LOWER_TIERS.index("memserver") < LOWER_TIERS.index("pagecache")
    assert LOWER_TIERS.index("pagecache") + 1 == LOWER_TIERS.index("ssd")
    hw = load_hardware("a3-highgpu-4g-lustre-9t")
    assert hw.tiers["pagecache"].capacity_bytes == 936e9 / 2  # the Lustre client's default


def trace(engine: int) -> BlockedTrace:
    """The prefix on engine 0; at GAP_S its extension on ``engine`` (one-block prompts on the
    engines between keep the turns)."""
    base = list(range(PREFIX))
    x = PREFIX
    prompts = [base + [x]] + [[x + 1 + j] for j in range(engine - 1)] + [base + [x + engine]]
    times = [0.0] + [GAP_S + 1e-4 * j for j in range(len(prompts) - 1)]
    inputs = [len(p) * B + 1 for p in prompts]
    return BlockedTrace.from_lists(times, inputs, [4] * len(prompts), prompts, B, n_blocks=x + 5)


def config(page_cache_blocks: int | None):  # noqa: ANN201 - a SimConfig
    """Two hosts of two H100 engines, a host pool per engine, a page cache per host holding
    ``page_cache_blocks`` blocks (None: no page cache), one shared file tier, both behind
    SGLang's file back end, written through."""
    model = load_model("Qwen3-8B")
    block_gb = B * model.kv_bytes_per_token("bf16") / 1e9
    cache = ()
    if page_cache_blocks is not None:
        cache = (
            TierPolicy(
                name="pagecache",
                capacity_gb=(page_cache_blocks + 0.5) * block_gb,
                connector="sglang-hicache-file",
            ),
        )
    policy = Policy(
        block_tokens=B,
        write_policy="write_through",
        serving=ServingPolicy(instances=4, tp=1, routing="round_robin"),
        tiers=(
            TierPolicy(capacity_gb=20.0),
            TierPolicy(name="dram", capacity_gb=100.0),
            *cache,
            TierPolicy(name="ssd", capacity_gb=200.0, connector="sglang-hicache-file"),
        ),
    )
    hw = load_hardware("a3-highgpu-4g-lustre")
    hw = replace(hw, topology=replace(hw.topology, hosts=2, gpus_per_host=2))
    cfg = build_config(hw, model, policy)
    if page_cache_blocks is not None:
        assert cfg.tiers_read_at_arrival.tolist() == [False, True, True]
        assert int(cfg.tiers.capacity_blocks[PAGECACHE]) == page_cache_blocks
    return cfg


def both(engine: int, page_cache_blocks: int):  # noqa: ANN201 - the reference's RawResult
    pair = replay_both(trace(engine), config(page_cache_blocks), check_invariants=True)
    assert pair is not None
    ref, fast = pair
    assert_fields_equal(ref, fast, (*REQUEST_FIELDS, *TIER_FIELDS))
    return ref


def test_an_engine_on_the_writing_host_reads_the_page_cache_not_the_file_tier() -> None:
    raw = both(engine=1, page_cache_blocks=1000)
    assert raw.tier_prefetched_blocks.tolist() == [0, PREFIX, 0]
    assert raw.tier_hit_blocks.tolist() == [PREFIX, 0, 0]  # (then loaded from its host pool)
    assert raw.loaded_blocks[1, DRAM] == PREFIX


def test_an_engine_on_another_host_reads_the_file_tier() -> None:
    raw = both(engine=2, page_cache_blocks=1000)
    assert raw.tier_prefetched_blocks.tolist() == [0, 0, PREFIX]
    assert raw.tier_hit_blocks.tolist() == [PREFIX, 0, 0]
    assert raw.loaded_blocks[2, DRAM] == PREFIX


def test_a_prefix_half_in_the_page_cache_reads_both_tiers_one_after_the_other() -> None:
    """The page cache keeps the last 32 blocks written (LRU, in order: the prefix's last 31 and
    the first prompt's own block): the prefetch reads the prefix's first 33 from the file tier
    and the rest from the cache, and the request waits for both; with the whole prefix in the
    cache it is served sooner."""
    half = both(engine=1, page_cache_blocks=PREFIX // 2)
    assert half.tier_prefetched_blocks.tolist() == [0, 31, 33]
    assert half.loaded_blocks[1, DRAM] == PREFIX
    whole = both(engine=1, page_cache_blocks=1000)
    assert whole.first_token_s[1] < half.first_token_s[1]


def test_without_the_page_cache_the_writing_host_reads_the_file_tier() -> None:
    pair = replay_both(trace(1), config(None), check_invariants=True)
    assert pair is not None
    assert pair[0].tier_prefetched_blocks.tolist() == [0, PREFIX]
    assert pair[0].tier_hit_blocks.tolist() == [PREFIX, 0]
    assert_fields_equal(*pair, (*REQUEST_FIELDS, "tier_hit_blocks", "tier_prefetched_blocks"))


def exported(target: str, with_file_tier: bool):  # noqa: ANN201 - an ExportResult
    from kvtier.export import export

    tiers = [
        TierPolicy(capacity_gb=20.0),
        TierPolicy(name="dram", capacity_gb=100.0),
        TierPolicy(name="pagecache", capacity_gb=400.0, connector="sglang-hicache-file"),
    ]
    if with_file_tier:
        tiers.append(TierPolicy(name="ssd", capacity_gb=2000.0, connector="sglang-hicache-file"))
    policy = Policy(
        block_tokens=16,
        write_policy="write_through",
        serving=ServingPolicy(instances=2, tp=1, routing="round_robin"),
        tiers=tuple(tiers),
    )
    return export(policy, target, load_hardware("a3-highgpu-4g-lustre"), load_model("Qwen3-8B"))


def test_an_export_places_the_page_cache_with_its_file_tier_and_says_so() -> None:
    """SGLang's export names the page cache as the mount's, with its simulated size; another
    target placing a file tier says the same generically; without the file tier the page cache
    is reported as not exported, never dropped silently."""
    notes = exported("sglang", True).notes
    named = [n for n in notes if "pagecache" in n]
    assert [n.kind for n in named] == ["informational"]
    assert "400 GB per host" in named[0] and "SGLang sets nothing" in named[0]
    vllm = [n for n in exported("vllm", True).notes if "pagecache" in n]
    assert [n.kind for n in vllm] == ["informational"]
    assert "comes with the ssd tier's mount" in vllm[0]
    alone = [n for n in exported("sglang", False).notes if " pagecache " in f" {n} "]
    assert [n.kind for n in alone] == ["inexpressible"]
