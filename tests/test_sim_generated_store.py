"""A connector that stores a request's generated blocks (vLLM's OffloadingConnector before
``offload_prompt_only``) copies them into its tier at the request's finish: they take the tier's
capacity (evicting by its policy) and store bandwidth like any copy, and are never hit. A
connector that does not (LMCache, ``save_decode_cache`` false; vLLM from PR #43797 on) leaves
the tier to the prompts."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.sim.tiers import generated_bases
from kvtier.trace.blocked import BlockedTrace

ENGINES = ["reference", "numba"]
B = 16
A = [0, 1, 2, 3]  # an early prompt's four blocks
X = 4  # the long answer's one-block prompt


def three_requests() -> BlockedTrace:
    """One at a time (100 s apart), on one instance:
    0: prompt A (64 tokens), 1 token out: A0..A3 are written to the CPU tier;
    1: prompt [X] (16 tokens), 33 tokens out: X is written; its answer fills
       (16 + 33 - 1) // 16 - 16 // 16 = 2 full blocks (the last token's KV is never computed);
    2: prompt A + one token, 1 token out: finds A0..A3 in the CPU tier, if A0 is still there."""
    return BlockedTrace.from_lists(
        [0.0, 100.0, 200.0], [64, 16, 65], [1, 33, 1], [A, [X], A], B, n_blocks=5
    )


def config(store_generated: bool):
    hw = load_hardware("h100-node")
    model = load_model("Llama-3.1-8B")

    def build(capacity_gb: float):
        # HBM's own prefix cache off, so request 2 can only find A below HBM
        dram = TierPolicy(
            name="dram",
            capacity_gb=capacity_gb,
            connector="vllm-offloading",
            eviction="lru",
            store_generated=store_generated,
        )
        policy = Policy(
            block_tokens=B,
            serving=ServingPolicy(instances=1, prefix_caching=False),
            tiers=(TierPolicy(), dram),
        )
        return build_config(hw, model, policy)

    block_bytes = build(1.0).tiers.block_bytes
    cfg = build(6.5 * block_bytes / 1e9)  # a CPU tier of exactly six blocks
    assert int(cfg.tiers.capacity_blocks[0]) == 6
    return cfg


@pytest.mark.parametrize("engine", ENGINES)
def test_a_long_answer_stored_below_evicts_an_older_prefix(engine: str) -> None:
    # Stored: the tier holds A0..A3, X (five of six blocks) when request 1 ends; its two answer
    # blocks need two more, so LRU evicts A0, the oldest. Request 2's run below HBM ends at A0,
    # its first block: it finds nothing and computes the whole prompt, whose four blocks are
    # written again (A0 evicts A1, the oldest then, A1 evicts A2, ...): 5 + 2 + 4 written.
    # Not stored: A0..A3 stay, request 2 loads all four ((65 - 1) // 16 = 4, the cap): 5.
    extra = {"check_invariants": True} if engine == "reference" else {}
    trace = three_requests()
    stored = simulate_raw(trace, config(True), engine=engine, **extra)
    prompt_only = simulate_raw(trace, config(False), engine=engine, **extra)
    assert stored.loaded_blocks[2, 0] == 0
    assert prompt_only.loaded_blocks[2, 0] == 4
    block_bytes = config(True).tiers.block_bytes
    assert prompt_only.tier_bytes_written[0] == pytest.approx(5 * block_bytes)
    assert stored.tier_bytes_written[0] == pytest.approx(11 * block_bytes)


def test_both_engines_agree_per_request() -> None:
    trace = three_requests()
    for store in (True, False):
        cfg = config(store)
        ref = simulate_raw(trace, cfg, engine="reference", check_invariants=True)
        fast = simulate_raw(trace, cfg, engine="numba")
        np.testing.assert_array_equal(ref.first_token_s, fast.first_token_s)
        np.testing.assert_array_equal(ref.finish_s, fast.finish_s)
        np.testing.assert_array_equal(ref.loaded_blocks, fast.loaded_blocks)
        np.testing.assert_array_equal(ref.tier_bytes_written, fast.tier_bytes_written)


def test_generated_ids_follow_the_prompt_ids() -> None:
    # request 0: (64 + 0) // 16 - 4 = 0; request 1: (16 + 32) // 16 - 1 = 2; request 2: 0
    base = generated_bases(np.array([64, 16, 65]), np.array([1, 33, 1]), B, 5)
    assert base.tolist() == [5, 5, 7, 7]
