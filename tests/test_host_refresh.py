"""SGLang's radix tree keeps one node, with one access time, for a page's device and host
copies, and vLLM's OffloadingConnector touches the prompt's blocks it holds at each look-up: a
request's HBM hits make their host copies recent too (``load_caching = "at_admission"``, or a
connector with ``touches_prompt``; docs/model.md, "One access time for HBM and the host
tier").

One engine whose host pool holds three and a half prompts: a prefix, computed, then a filler,
then a request hitting the prefix in HBM; then a filler of two prompts' size, which pushes the
prefix out of HBM and, written through, half a prompt out of the host pool. With the refresh
the host pool drops the first filler's blocks and keeps the prefix; without it, it drops the
prefix's oldest blocks, so the last request, extending the prefix, finds less of it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import REQUEST_FIELDS, assert_fields_equal, replay_both

B = 16
P = 64  # blocks of the prefix
GAP_S = 1.0e4


def trace() -> BlockedTrace:
    base = list(range(P))
    nxt = P
    f1 = list(range(nxt, nxt + P + 1))
    nxt += P + 1
    f2 = list(range(nxt, nxt + 2 * (P + 1)))
    nxt += 2 * (P + 1)
    prompts = [base + [nxt], f1, base + [nxt + 1], f2, base + [nxt + 2]]
    n = len(prompts)
    inputs = [len(p) * B + 1 for p in prompts]
    times = [j * GAP_S for j in range(n)]
    return BlockedTrace.from_lists(times, inputs, [4] * n, prompts, B, n_blocks=nxt + 3)


def config(load_caching: str, connector: str = "direct"):
    model = load_model("Qwen3-8B")
    prompt_gb = (P + 1) * B * model.kv_bytes_per_token("bf16") / 1e9
    policy = Policy(
        block_tokens=B,
        write_policy="write_through",
        serving=ServingPolicy(instances=1, tp=1),
        tiers=(
            TierPolicy(capacity_gb=2.5 * prompt_gb),
            TierPolicy(name="dram", capacity_gb=3.5 * prompt_gb, connector=connector),
        ),
        load_caching=load_caching,
    )
    hw = load_hardware("h100-node")
    return build_config(
        replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=1)), model, policy
    )


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_a_hit_in_hbm_keeps_the_host_copy(engine: str) -> None:
    on, off = config("at_admission"), config("first_step")
    assert on.refreshes_host_on_hbm_hit and not off.refreshes_host_on_hbm_hit
    kept = simulate_raw(trace(), on, engine=engine, check_invariants=engine == "reference")
    lost = simulate_raw(trace(), off, engine=engine, check_invariants=engine == "reference")
    assert kept.hit_blocks[2] == P and lost.hit_blocks[2] == P  # the prefix hit in HBM
    found_kept = kept.hit_blocks[-1] + kept.loaded_blocks[-1, 0]
    found_lost = lost.hit_blocks[-1] + lost.loaded_blocks[-1, 0]
    assert found_kept == P and found_lost < P


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_vllms_offloading_connector_touches_the_prompt_it_holds(engine: str) -> None:
    # vLLM's OffloadingConnector touches every block of the prompt it holds when it looks a
    # request up (0.11.0-0.22.0 ``manager.touch``): its HBM hits keep their CPU copies recent
    # although its loads are cached after their first step (``first_step``)
    on = config("first_step", connector="vllm-offloading")
    assert on.refreshes_host_on_hbm_hit and not on.shares_loading_hits
    kept = simulate_raw(trace(), on, engine=engine, check_invariants=engine == "reference")
    assert kept.hit_blocks[2] == P
    assert kept.hit_blocks[-1] + kept.loaded_blocks[-1, 0] == P
    # without prefix caching there is no HBM hit to refresh with
    off = replace(on, prefix_caching=False)
    assert not off.refreshes_host_on_hbm_hit


@pytest.mark.parametrize(
    ("load_caching", "connector"),
    [("at_admission", "direct"), ("first_step", "direct"), ("first_step", "vllm-offloading")],
)
def test_engines_agree(load_caching: str, connector: str) -> None:
    pair = replay_both(trace(), config(load_caching, connector), check_invariants=True)
    assert pair is not None
    assert_fields_equal(*pair, (*REQUEST_FIELDS, "tier_hit_blocks", "tier_bytes_read"))
