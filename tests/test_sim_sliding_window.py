"""vLLM's hybrid KV cache manager keeps a sliding-window group's blocks that fall behind the
window cached in the block pool the full-attention layers draw from (docs/model.md,
"Sliding-window blocks in the pool"): a prompt computed on a sliding-window model pushes older
prefixes out of HBM sooner than the full layers' blocks alone would."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.hardware.loader import load_model
from kvtier.policy.model import ServingPolicy
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


def long_answer_then_prefix() -> BlockedTrace:
    """One instance of two-token blocks, window one block:
    0 (t=0): prompt [A, X] (4 tokens), 20 tokens out: A stays pinned while it decodes;
    1 (t=5): a 16-token prompt of eight new blocks, 1 token out;
    2 (t=200): prompt [A] + one token, 1 token out: a hit on A needs A's sliding copy."""
    return BlockedTrace.from_lists(
        [0.0, 5.0, 200.0],
        [4, 16, 3],
        [20, 1, 1],
        [[A, A + 1], [Z + x for x in range(8)], [A]],
        2,
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_a_hit_needs_the_sliding_copy_of_its_last_block(engine: str) -> None:
    # 12 slots. Request 0 holds slots 0, 1 (A, X); after its prefill A's sliding copy takes
    # slot 2 (the window passed A: 4 - 2 + 1 = 3 skipped tokens, one block) and goes to the
    # tail; its first decode takes slot 3. Request 1 takes the 8 slots 4..11, leaving only
    # slot 2 free: the copies of its blocks behind the window (7 after its prefill, 1 at its
    # end) each take slot 2, evicting A's copy. A itself stays pinned by request 0 and is
    # cached when request 0 ends, but without its copy request 2 misses.
    extra = {"check_invariants": True} if engine == "reference" else {}
    cfg = token_clock(12, 2, prefix_caching=True, swa_window=2, swa_blocks=1)
    raw = simulate_raw(long_answer_then_prefix(), cfg, engine=engine, **extra)
    assert list(raw.hit_blocks) == [0, 0, 0]
    # the full layers' blocks alone: A is hit
    raw = simulate_raw(long_answer_then_prefix(), replace(cfg, swa_window=0, swa_blocks=0),
                       engine=engine, **extra)  # fmt: skip
    assert list(raw.hit_blocks) == [0, 0, 1]
    # 40 slots: request 1 and the copies take never-used slots, A's copy survives: a hit
    raw = simulate_raw(long_answer_then_prefix(), replace(cfg, capacity_blocks=40),
                       engine=engine, **extra)  # fmt: skip
    assert list(raw.hit_blocks) == [0, 0, 1]


def test_groups_follow_vllm_grouping() -> None:
    oss = load_model("gpt-oss-120b")
    v1 = ServingPolicy(scheduler="vllm_v1", max_num_batched_tokens=8192)
    # 0.34.0's cap under async scheduling: two batches in flight, cdiv(127 + 16384, 128) + 1
    assert _sliding_groups(oss, replace(v1, async_scheduling=True), 128) == {
        "swa_window": 128, "swa_blocks": 1, "swa_admission_blocks": 130,
    }  # fmt: skip
    # 0.22.0's: the window and one batch, cdiv(127 + 8192, 128) + 1; 0.19.1's: none
    one = _sliding_groups(oss, replace(v1, swa_admission_cap="one_batch"), 128)
    assert one["swa_admission_blocks"] == 66
    assert (
        _sliding_groups(oss, replace(v1, swa_admission_cap="none"), 16)["swa_admission_blocks"] == 0
    )
    assert _sliding_groups(oss, replace(v1, scheduler="reserve"), 16) == {}
    # a 5:1 pattern (8 full, 40 sliding layers): groups of 8, five sliding groups per full one
    five = replace(oss, layers=48, sliding_window_layers=40)
    assert _sliding_groups(five, v1, 16)["swa_blocks"] == 5
    assert _sliding_groups(load_model("qwen3-32b"), v1, 16) == {}


def decode_then_cold_prompt() -> BlockedTrace:
    """One instance of two-token blocks: request 0 (t=0) a 12-token prompt and 20 tokens out;
    request 1 (t=13, while request 0 decodes) a cold 12-token prompt of its own."""
    return BlockedTrace.from_lists(
        [0.0, 13.0],
        [12, 12],
        [20, 1],
        [[A + x for x in range(6)], [Z + x for x in range(6)]],
        2,
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_the_full_sequence_gate_counts_the_sliding_window_group(engine: str) -> None:
    # 18 slots; at t=13 request 0 holds 7 (its prompt's 6 and its answer's first): 11 are
    # free (the sliding copies behind its window sit cached in the free queue). Request 1
    # needs 6 for its full-attention layers; vLLM's can_fit_full_sequence adds the
    # sliding-window group's blocks from the window's start, 6 more for a cold prompt: 12 > 11,
    # so it waits for request 0 to finish (about t=32), where without sliding-window layers it
    # runs at once. Capped at 3 blocks (max_admission_blocks_per_request), 9 <= 11: at once.
    extra = {"check_invariants": True} if engine == "reference" else {}
    cfg = token_clock(
        18, 2, prefix_caching=True, reserve_full_prompt=True, swa_window=2, swa_blocks=1
    )
    ttft = {}
    for name, c in {
        "none": replace(cfg, swa_window=0, swa_blocks=0),
        "uncapped": cfg,
        "capped": replace(cfg, swa_admission_blocks=3),
        "first chunk": replace(cfg, reserve_full_prompt=False),
    }.items():
        raw = simulate_raw(decode_then_cold_prompt(), c, engine=engine, **extra)
        ttft[name] = raw.first_token_s[1] - 13.0
    assert ttft["none"] < 20.0
    assert ttft["uncapped"] > ttft["none"] + 15.0
    assert ttft["capped"] == pytest.approx(ttft["none"])
    assert ttft["first chunk"] == pytest.approx(ttft["none"])
