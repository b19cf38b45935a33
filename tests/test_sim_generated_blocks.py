"""Full blocks of generated tokens stay cached (vLLM V1 hashes and caches them as it does a
prompt's), so when their request ends they are evicted after older cached blocks, not before."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.sim import simulate_raw
from kvtier.trace.blocked import BlockedTrace
from tests.test_sim_preemption import token_clock

ENGINES = ["reference", "numba"]
A, X, Z = 1, 2, 10  # block ids: an early prompt's block, the long answer's prompt, a filler


def four_requests(answer_tokens: int) -> BlockedTrace:
    """One instance of 8 two-token slots, one request at a time (100 s apart):
    0: prompt [A] (2 tokens), 1 token out: A is cached;
    1: prompt [X], ``answer_tokens`` out: its answer fills (answer_tokens - 1) // 2 more blocks;
    2: a 12-token prompt of six new blocks, 1 token out: takes six slots;
    3: prompt [A] + one token, 1 token out: hits A if A was not evicted by request 2."""
    return BlockedTrace.from_lists(
        [0.0, 100.0, 200.0, 300.0],
        [2, 2, 12, 3],
        [1, answer_tokens, 1, 1],
        [[A], [X], [Z, Z + 1, Z + 2, Z + 3, Z + 4, Z + 5], [A]],
        2,
    )


@pytest.mark.parametrize("engine", ENGINES)
def test_a_long_answer_pushes_older_prefixes_out(engine: str) -> None:
    # Request 1 ends holding X and three full answer blocks, all cached: the free queue is then
    # [5 never-used slots' remainder..., A, answer blocks (tail first), X]. Request 2's six
    # slots take the three unused ones, then A: request 3 misses. With the answer blocks
    # anonymous (reused first), request 2 would take them and the unused ones, and A survive.
    cfg = token_clock(8, 2, prefix_caching=True)
    extra = {"check_invariants": True} if engine == "reference" else {}
    raw = simulate_raw(four_requests(7), cfg, engine=engine, **extra)
    assert raw.hit_blocks[3] == 0
    # the same with a 1-token answer (no full answer block): A survives and is hit
    raw = simulate_raw(four_requests(1), cfg, engine=engine, **extra)
    assert raw.hit_blocks[3] == 1


@pytest.mark.parametrize("engine", ENGINES)
def test_without_prefix_caching_answer_blocks_stay_anonymous(engine: str) -> None:
    # vLLM with prefix caching off hashes nothing: every freed block goes to the queue's head
    cfg = token_clock(8, 2, prefix_caching=False)
    extra = {"check_invariants": True} if engine == "reference" else {}
    raw = simulate_raw(four_requests(7), cfg, engine=engine, **extra)
    assert np.all(raw.hit_blocks == 0)
