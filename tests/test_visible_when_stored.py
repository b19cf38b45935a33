"""A copy found only once its store has ended (docs/model.md, "A copy is found once stored").

vLLM 0.19.1's CPU manager stops a look-up at the first block whose store is in flight, and
llm-d's FS back end writes each file under a temporary name and renames it when written, so a
request arriving while a prefix is still being stored does not find it there: it computes the
rest. A tier that shows copies at once (the default) lets it load them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.trace.blocked import BlockedTrace

B = 256
BLOCKS = 64


def _replay(second_at: float, when_stored: bool | None):  # noqa: ANN202
    """The first instance computes a prompt and writes it through to a shared RDMA pool; the
    second instance is sent the same prompt at ``second_at``. Both engines agreeing."""
    hw = load_hardware("beluga-testbed")
    hw = replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=2))
    pool = TierPolicy(name="rdma", capacity_gb=1000.0, visible_when_stored=when_stored)
    policy = Policy(
        block_tokens=B,
        serving=ServingPolicy(instances=2, routing="round_robin"),
        tiers=(TierPolicy(), pool),
    )
    cfg = build_config(hw, load_model("Qwen3-32B"), policy)
    ids = list(range(BLOCKS))
    n = B * BLOCKS + 1
    trace = BlockedTrace.from_lists(
        [0.0, second_at], [n, n], [1, 1], [ids, ids], B, n_blocks=BLOCKS
    )
    ref = simulate_raw(trace, cfg, engine="reference", check_invariants=True)
    fast = simulate_raw(trace, cfg, engine="numba")
    np.testing.assert_array_equal(ref.first_token_s, fast.first_token_s)
    np.testing.assert_array_equal(ref.loaded_blocks, fast.loaded_blocks)
    return fast


def _stored_by(raw) -> float:  # noqa: ANN001
    """A time the first request's prompt is surely in the pool: 10 s after its prefill ended,
    where its 4.3 GB write takes well under a second on the pool's links."""
    return float(raw.first_token_s[0]) + 10.0


def test_a_copy_being_stored_is_not_found() -> None:
    first = _replay(1000.0, None)
    assert first.loaded_blocks[1].sum() == BLOCKS  # long after: loaded from the pool
    # sent as the first prompt's prefill ends, its copy's write still on the links
    at = float(first.first_token_s[0])
    visible = _replay(at, None)
    hidden = _replay(at, True)
    assert visible.loaded_blocks[1].sum() == BLOCKS
    # the prompt's first chunk was computed (and its copies stored) an iteration earlier: it
    # is found; the last chunk's copies are still being written: computed instead
    assert 0 < hidden.loaded_blocks[1].sum() < BLOCKS
    assert hidden.first_token_s[1] > visible.first_token_s[1]


def test_a_copy_is_found_once_its_store_has_ended() -> None:
    at = _stored_by(_replay(1000.0, True))
    assert _replay(at, True).loaded_blocks[1].sum() == BLOCKS


@pytest.mark.parametrize("flag", [None, False])
def test_the_default_shows_a_copy_at_once(flag: bool | None) -> None:
    at = float(_replay(1000.0, flag).first_token_s[0])
    assert _replay(at, flag).loaded_blocks[1].sum() > 0
