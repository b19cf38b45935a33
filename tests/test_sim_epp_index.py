"""llmd_epp reading the EPP's approximate prefix indexes (kvtier.sim.routers.epp_index)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy import Policy
from kvtier.sim import build_config, simulate_raw
from kvtier.sim.routers.epp_index import EppIndex, index_geometry
from kvtier.trace.blocked import BlockedTrace

ENGINES = ["reference", "numba"]


def epp_cfg(source: str, **serving: object):
    """Two instances behind llmd_epp with only the prefix and no-hit-LRU scorers weighing."""
    p = Policy()
    s = replace(
        p.serving,
        routing="llmd_epp",
        instances=2,
        epp_queue_weight=0.0,
        epp_kv_util_weight=0.0,
        epp_prefix_source=source,
        **serving,
    )
    return build_config(
        load_hardware("h100-node"), load_model("Llama-3.1-8B"), replace(p, serving=s)
    )


def indexes_of(entries: int) -> dict[str, int]:
    """Both producers with ``entries`` entries of 16 tokens per server."""
    return {
        "epp_gpu_index_entries": entries,
        "epp_gpu_index_entry_tokens": 16,
        "epp_cpu_index_entries": entries,
        "epp_cpu_index_entry_tokens": 16,
    }


def four_documents() -> BlockedTrace:
    """Documents A, C, D (four blocks each, 65 tokens), one request every 5 s, each finished
    before the next; then A again."""
    a, c, d = ([*range(j, j + 4)] for j in (0, 10, 20))
    return BlockedTrace.from_lists(
        [0.0, 5.0, 10.0, 15.0], [65] * 4, [1] * 4, [a, c, d, a], 16, n_blocks=30
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_the_index_forgets_a_prefix_its_lru_turned_over(engine) -> None:
    # A goes to instance 0 and C to instance 1 (cold: the no-hit-LRU scorer takes the
    # never-used instances in order), D to instance 0 (the least recent cold pick). With
    # four blocks of capacity per index (4 entries of 16 tokens), D's blocks push A's out of
    # instance 0's indexes: the second A is cold for the EPP and goes to the least recent
    # cold pick, instance 1, and recomputes; reading the caches, it finds A in instance 0's
    # HBM (pools far larger than four documents) and loads its 4 blocks there.
    t = four_documents()
    raw = simulate_raw(t, epp_cfg("index", **indexes_of(4)), engine=engine)
    assert raw.instance.tolist() == [0, 1, 0, 1]
    assert raw.hit_blocks.tolist() == [0, 0, 0, 0]
    raw = simulate_raw(t, epp_cfg("cache"), engine=engine)
    assert raw.instance.tolist() == [0, 1, 0, 0]
    assert raw.hit_blocks.tolist() == [0, 0, 0, 4]
    # at the defaults (31,250 CPU entries, the HBM's block count) nothing turns over: the
    # second A scores 2 on instance 0 in the indexes as in the cache
    raw = simulate_raw(t, epp_cfg("index"), engine=engine)
    assert raw.instance.tolist() == [0, 1, 0, 0]


@pytest.mark.parametrize("engine", ENGINES)
def test_the_index_remembers_a_prefix_the_cache_evicted(engine) -> None:
    # the same requests on instances of five HBM blocks: D's five blocks on instance 0 evict
    # A's. Reading the caches, no instance holds A: the second A is cold and goes to the least
    # recent cold pick, instance 1. The EPP's index still has A on instance 0 and sends it
    # there, where it recomputes all the same.
    t = four_documents()
    raw = simulate_raw(
        t, replace(epp_cfg("cache"), capacity_blocks=5, watermark_blocks=0), engine=engine
    )
    assert raw.instance.tolist() == [0, 1, 0, 1]
    raw = simulate_raw(
        t, replace(epp_cfg("index"), capacity_blocks=5, watermark_blocks=0), engine=engine
    )
    assert raw.instance.tolist() == [0, 1, 0, 0]
    assert raw.hit_blocks.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("engine", ENGINES)
def test_denser_prompt_text_fills_the_index_sooner(engine) -> None:
    # Eight entries of 16 "tokens" per index: at the EPP's own 4 bytes a token they hold 8
    # blocks, A's and D's four each, so the second A still scores on instance 0 and hits
    # there. At 8 bytes a token an entry is 64 bytes, 8 prompt tokens: the indexes hold 4
    # blocks, D's push A's out, and the second A is cold for the EPP (instance 1, recompute).
    t = four_documents()
    raw = simulate_raw(t, epp_cfg("index", **indexes_of(8)), engine=engine)
    assert raw.instance.tolist() == [0, 1, 0, 0]
    assert raw.hit_blocks.tolist() == [0, 0, 0, 4]
    dense = epp_cfg("index", epp_prompt_bytes_per_token=8.0, **indexes_of(8))
    assert dense.epp_bytes_per_token == 8.0
    raw = simulate_raw(t, dense, engine=engine)
    assert raw.instance.tolist() == [0, 1, 0, 1]
    assert raw.hit_blocks.tolist() == [0, 0, 0, 0]


def test_the_entries_of_text_denser_than_four_bytes_a_token() -> None:
    # gpt-oss's random-token prompts, 7 bytes a token: a GPU entry of 128 "tokens" is 512
    # bytes, 73.1 tokens, kept as one 128-token block with the capacity scaled by 4/7 (1,392
    # entries hold 795 blocks); the CPU producer's 41,000 entries of 64 "tokens", 11,714
    # blocks; the 131,072-token cap hashes 74,898 tokens, 585 blocks
    g = index_geometry((0, 0, 41000, 64, 131072), np.array([1392]), 128, 7.0)
    assert g.step.tolist() == [1, 1]
    assert g.caps.tolist() == [[795], [11714]]
    assert g.max_entries.tolist() == [585, 585]
    # at 4 bytes a token nothing changes (the next test's figures)
    assert index_geometry((0, 0, 41000, 64, 131072), np.array([1392]), 128, 4.0).caps.tolist() == [
        [1392],
        [20500],
    ]


def test_the_producers_entries_in_blocks() -> None:
    # 16-token blocks: the GPU entry (autoTune, max(16, 64) tokens) is 4 blocks, its capacity
    # the instance's HBM block count in entries (4 times the HBM's tokens); the CPU entry of 64
    # tokens 4 blocks, 41,000 entries; 131,072 tokens are 2,048 entries
    g = index_geometry((0, 0, 41000, 64, 131072), np.array([100, 7]), 16)
    assert g.step.tolist() == [4, 4]
    assert g.caps.tolist() == [[100, 7], [41000, 41000]]
    assert g.max_entries.tolist() == [2048, 2048]
    # 128-token blocks (gpt-oss): the GPU entry is the block; a 64-token CPU entry is half a
    # block, kept as one block with the capacity halved
    g = index_geometry((0, 0, 41000, 64, 131072), np.array([1392]), 128)
    assert g.step.tolist() == [1, 1]
    assert g.caps.tolist() == [[1392], [20500]]
    assert g.max_entries.tolist() == [1024, 1024]


def test_an_entry_is_keyed_by_its_last_block_and_a_short_prompt_hashes_none() -> None:
    ix = EppIndex(index_geometry((2, 32, 5, 48, 96), np.array([9]), 16))
    blocks = list(range(100, 110))
    # 2 blocks per GPU entry, 3 per CPU entry; 96 tokens cap both at 3 and 2 entries
    assert ix.keys(blocks, 160, 16) == [[101, 103, 105], [102, 105]]
    assert ix.keys(blocks[:2], 40, 16) == [[101], []]  # 40 tokens: one 32-token entry only


def test_a_present_entry_moves_to_the_front_and_a_new_one_evicts_the_oldest() -> None:
    # hashicorp/golang-lru's Add, as the EPP's indexer calls it
    ix = EppIndex(index_geometry((3, 16, 2, 16, 1 << 20), np.array([9]), 16))
    ix.add(0, [[1, 2, 3], [1, 2, 3]])  # GPU list (3 entries) 1, 2, 3; CPU list (2) 2, 3
    ix.add(0, [[1], [1]])  # GPU: 1 moves to the front, 2, 3, 1; CPU: 1 is new, evicts 2
    ix.add(0, [[4], [4]])  # GPU: evicts 2; CPU: evicts 3
    assert list(ix.lru[0][0]) == [3, 1, 4]
    assert list(ix.lru[1][0]) == [1, 4]
    # the match counts the leading run some instance holds: entry 2 is nowhere, so the run
    # stops there although 3 is still indexed
    assert ix.match([[1, 2, 3], [1, 2, 3]], 1) == [[1], [1]]
    # (per producer: 3 is no longer in the CPU list, so its run is empty)
    assert ix.match([[3, 1, 4], [3, 1, 4]], 1) == [[3], [0]]
