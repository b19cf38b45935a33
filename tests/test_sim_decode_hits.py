"""Decode-side prefix hits in P/D disaggregation: closed forms on both engines.

vLLM's decode scheduler looks a handed-over prompt up in its own prefix cache
(``get_computed_blocks``) and the NixlConnector reads only the blocks past that hit
(docs/model.md, "Prefill/decode disaggregation"). Each expected transfer below is computed
from the connector's transfer rule, not read back from the engine.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.sim import simulate_raw
from kvtier.sim.pd import pd_traffic
from kvtier.trace.blocked import BlockedTrace
from tests.test_sim_disaggregated import ENGINES, GB, config, span

B = 16
TURN1 = 100 * B + 5  # 100 full blocks and a partial one: 101 blocks to move
TURN2 = TURN1 + 900  # turn 1's prompt and 900 new tokens: 156 full blocks, 157 to move


def nixl_blocks(blocks: int, bw: float = 450 * GB) -> float:
    """NIXL reading ``blocks`` blocks of Llama-3.1-8B's KV over NVLink: one descriptor per
    block and layer's K or V (64 per 16-token block), 2.57 us each, 32 deep."""
    return span(blocks * 64, blocks * B * 131072.0, 2.57e-6, bw, 32)


def session(*extra: tuple[float, int, list[int]]) -> BlockedTrace:
    """Two turns of one conversation, 10 s apart (turn 2's prompt starts with turn 1's), and
    any ``extra`` requests (arrival, tokens, blocks) between them."""
    turn1 = list(range(100))
    turn2 = turn1 + list(range(100, 156))
    rows = sorted([(0.0, TURN1, turn1), (10.0, TURN2, turn2), *extra], key=lambda r: r[0])
    return BlockedTrace.from_lists(
        [r[0] for r in rows], [r[1] for r in rows], [4] * len(rows), [r[2] for r in rows], B
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_second_turn_pulls_only_the_blocks_its_decode_instance_lacks(engine) -> None:
    # 1 prefill + 1 decode instance: turn 1's KV lands on the decode instance and stays in its
    # prefix cache after it finishes; turn 2 (prefilled with turn 1's blocks as hits, as an
    # aggregated instance would) moves 157 - 100 blocks, and its TTFT is the aggregated
    # prefill plus that transfer
    t = session()
    check = engine == "reference"
    agg = simulate_raw(t, config(1, 0), engine=engine)  # one instance: both turns
    assert agg.instance.tolist() == [0, 0]
    pd = simulate_raw(t, config(2, 1), engine=engine, check_invariants=check)
    assert pd.decode_instance.tolist() == [1, 1]
    assert pd.decode_hit_blocks.tolist() == [0, 100]
    assert pd.kv_transfer_s[0] == pytest.approx(nixl_blocks(101), rel=1e-12)
    assert pd.kv_transfer_s[1] == pytest.approx(nixl_blocks(157 - 100), rel=1e-12)
    for i, blocks in ((0, 101), (1, 57)):
        expected = agg.first_token_s[i] + nixl_blocks(blocks)
        assert pd.first_token_s[i] == pytest.approx(expected, rel=1e-12)
    # what the replay's summary reports: 158 blocks moved, 100 saved
    cfg = config(2, 1)
    traffic = pd_traffic(
        t.input_tokens, pd.decode_instance, pd.first_token_s, pd.decode_hit_blocks, B,
        cfg.pd.block_bytes,
    )  # fmt: skip
    assert (traffic.requests, traffic.blocks, traffic.hit_blocks) == (2, 158, 100)
    assert traffic.bytes_saved == 100 * cfg.pd.block_bytes
    # without vLLM's prefix cache the decode side holds nothing: the whole prompt moves
    off = replace(config(2, 1), prefix_caching=False)
    cold = simulate_raw(t, off, engine=engine, check_invariants=check)
    assert cold.decode_hit_blocks.tolist() == [0, 0]
    assert cold.kv_transfer_s[1] == pytest.approx(nixl_blocks(157), rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
def test_evicted_tail_blocks_move_again(engine) -> None:
    # a 200-block decode instance (reserve: each request's footprint at admission). Turn 1
    # frees its 101 slots tail-first: its partial block's slot to the free queue's head, its
    # 100 cached blocks to the tail, last block first. Another conversation's 2,080-token
    # prompt (131 slots) in between takes the 100 slots before them and evicts 31 of turn 1's
    # blocks (99 down to 69); turn 2 finds blocks 0..68 and moves 157 - 69
    other = (5.0, 130 * B, list(range(1000, 1130)))
    t = session(other)
    cfg = replace(config(2, 1, scheduler="reserve"), capacity_blocks=200, watermark_blocks=0)
    pd = simulate_raw(t, cfg, engine=engine, check_invariants=engine == "reference")
    assert pd.decode_instance.tolist() == [1, 1, 1]
    assert pd.decode_hit_blocks.tolist() == [0, 0, 69]
    assert pd.kv_transfer_s[2] == pytest.approx(nixl_blocks(157 - 69), rel=1e-12)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("connector", ["lmcache-mooncake", "mooncake-te"])
def test_connectors_that_move_every_block_keep_doing_so(engine, connector) -> None:
    # LMCache's P/D backend pushes every chunk the decode side's buffer lacks, whatever its
    # HBM holds; Mooncake's layer-wise push leaves before the decode side admits the request.
    # Turn 2's transfer is that of the same prompt sent to a cold decode instance.
    t = session()
    cfg = config(2, 1, connector=connector)
    assert not cfg.pd.decode_hit
    pd = simulate_raw(t, cfg, engine=engine, check_invariants=engine == "reference")
    assert pd.decode_hit_blocks.tolist() == [0, 0]
    alone = BlockedTrace.from_lists([10.0], [TURN2], [4], [t.request_blocks(1).tolist()], B)
    cold = simulate_raw(alone, cfg, engine=engine)
    assert pd.kv_transfer_s[1] == pytest.approx(cold.kv_transfer_s[0], rel=1e-12)


def test_decode_hits_are_the_pull_connectors() -> None:
    # vLLM's NixlConnector pull (and the connectors kvtier models with that pull) trims; a
    # layer-wise push and LMCache's P/D backend do not
    from kvtier.policy.registries import CONNECTORS

    trims = {c: config(2, 1, connector=c).pd.decode_hit for c in CONNECTORS.names}
    assert trims == {
        "direct": True,
        "lmcache-0.3-mooncake": False,
        "lmcache-mooncake": False,
        "mooncake-te": False,
        "vllm-offloading": True,
        "nixl": True,
        "beluga-cxl": True,
        "lmcache-pd": False,
        "sglang-hicache-file": True,
        "sglang-hicache-mooncake": True,
        "sglang-0.5.10-hicache-mooncake": True,
    }


def test_the_lmcache_pd_preset_moves_every_block_of_a_later_turn() -> None:
    # vllm-pd-lmcache's P/D path is LMCache's backend: no decode-side trim, NIXL's rates
    from kvtier.policy.presets import load_preset
    from kvtier.policy.registries import CONNECTORS

    preset = load_preset("vllm-pd-lmcache")
    assert preset.serving.pd_connector == "lmcache-pd"
    lm, nixl = CONNECTORS.get("lmcache-pd").defaults, CONNECTORS.get("nixl").defaults
    assert not lm["pd_decode_hit"] and nixl["pd_decode_hit"]
    assert {k: v for k, v in lm.items() if k != "pd_decode_hit"} == {
        k: v for k, v in nixl.items() if k != "pd_decode_hit"
    }
