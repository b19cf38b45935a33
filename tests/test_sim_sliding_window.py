"""vLLM's hybrid KV cache manager keeps a sliding-window group's blocks that fall behind the
window cached in the block pool the full-attention layers draw from (docs/model.md,
"Sliding-window blocks in the pool"): a prompt computed on a sliding-window model pushes older
prefixes out of HBM sooner than the full layers' blocks alone would."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.hardware.loader import load_model
from kvtier.sim import simulate_raw
from kvtier.sim.config import _sliding_groups
from kvtier.trace.blocked import BlockedTrace
from tests.test_sim_preemption import token_clock

ENGINES = ["reference", "numba"]
A, Z = 1, 10  # block ids: an early prompt's block, a later prompt's first block


def three_requests() -> BlockedTrace:
    """One instance of 8 two-token slots, one request at a time (100 s apart), 1 token out:
    0: prompt [A] (2 tokens): A is cached;
    1: a 12-token prompt of six new blocks;
    2: prompt [A] + one token: hits A if A is still cached."""
    return BlockedTrace.from_lists(
        [0.0, 100.0, 200.0],
        [2, 12, 3],
        [1, 1, 1],
        [[A], [Z, Z + 1, Z + 2, Z + 3, Z + 4, Z + 5], [A]],
        2,
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_sliding_window_blocks_push_an_older_prefix_out(engine: str) -> None:
    # Window 2 tokens = one block. Request 0 holds slot 0 (A); at its end its block's sliding
    # copy takes slot 1 from the free queue's head and goes cached to the tail, then slot 0
    # (A) follows: the queue is [2..7, 1, 0]. Request 1 takes slots 2..7; after its prefill
    # 5 of its 6 blocks are behind the window (skipped tokens 12 - 2 + 1 = 11, 5 blocks):
    # their sliding copies take the 2 free slots, 1 and then 0, evicting A. Request 2 misses.
    extra = {"check_invariants": True} if engine == "reference" else {}
    cfg = token_clock(8, 2, prefix_caching=True, swa_window=2, swa_blocks=1)
    raw = simulate_raw(three_requests(), cfg, engine=engine, **extra)
    assert list(raw.hit_blocks) == [0, 0, 0]
    # without the sliding-window blocks request 1 takes slots 1..6 and A survives
    raw = simulate_raw(three_requests(), replace(cfg, swa_window=0, swa_blocks=0), engine=engine,
                       **extra)  # fmt: skip
    assert list(raw.hit_blocks) == [0, 0, 1]


def test_groups_follow_vllm_grouping() -> None:
    oss = load_model("gpt-oss-120b")
    assert _sliding_groups(oss, "vllm_v1") == {"swa_window": 128, "swa_blocks": 1}
    assert _sliding_groups(oss, "reserve") == {}
    # a 5:1 pattern (8 full, 40 sliding layers): groups of 8, five sliding groups per full one
    five = replace(oss, layers=48, sliding_window_layers=40)
    assert _sliding_groups(five, "vllm_v1")["swa_blocks"] == 5
    assert _sliding_groups(load_model("qwen3-32b"), "vllm_v1") == {}
