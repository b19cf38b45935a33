"""A request whose lower-tier hits another request is loading waits for that load (vLLM's
OffloadingConnector, ``_blocks_being_loaded``; docs/model.md, "Hits another request is
loading").

A shared prefix is computed once, evicted from HBM by other prompts (it stays in the DRAM tier,
written through), then a burst of requests that extend it arrives at one instant. With the
connector's deferral the first loads the prefix and the others wait, then find it in HBM; without
it each loads its own copy while HBM has room. Both engines agree on both.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.errors import StallError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.trace.blocked import BlockedTrace

B = 16
PREFIX = 64  # blocks of the shared prefix
FILLERS = 3  # prompts of the prefix's size that push it out of HBM
BURST = 5  # requests extending the prefix, at one instant
GAP_S = 1.0e4  # each phase starts long after the last has finished


def trace(
    prefix: int = PREFIX,
    fillers: int = FILLERS,
    burst: int = BURST,
    outputs: int = 4,
    spread: float = 0.0,
) -> BlockedTrace:
    """The prefix alone, then the fillers, then the burst (each with one block of its own,
    ``spread`` seconds apart)."""
    base = list(range(prefix))
    nxt = prefix
    prompts, times = [base + [nxt]], [0.0]
    nxt += 1
    for _ in range(fillers):
        prompts.append(list(range(nxt, nxt + prefix + 1)))
        times.append(GAP_S)
        nxt += prefix + 1
    for j in range(burst):
        prompts.append(base + [nxt])
        times.append(2 * GAP_S + j * spread)
        nxt += 1
    n = len(prompts)
    return BlockedTrace.from_lists(
        times, [(prefix + 1) * B + 1] * n, [outputs] * n, prompts, B, n_blocks=nxt
    )


def config(defer: bool | None, load_caching: str = "first_step"):
    """One H100 instance with HBM for about two and a half prompts and a DRAM tier behind
    vLLM's OffloadingConnector (``defer`` overrides its ``defer_loading_hits``)."""
    model = load_model("Qwen3-8B")
    hbm_gb = 2.5 * (PREFIX + 1) * B * model.kv_bytes_per_token("bf16") / 1e9
    dram = TierPolicy(
        name="dram", capacity_gb=50.0, connector="vllm-offloading", defer_loading_hits=defer
    )
    policy = Policy(
        block_tokens=B,
        serving=ServingPolicy(instances=1, tp=1),
        tiers=(TierPolicy(capacity_gb=hbm_gb), dram),
        load_caching=load_caching,
    )
    hw = load_hardware("h100-node")
    hw = replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=1))
    return build_config(hw, model, policy)


def burst_rows(raw) -> tuple[np.ndarray, np.ndarray]:  # noqa: ANN001 - a RawResult
    """The burst's HBM hits and blocks loaded from DRAM, per request."""
    return raw.hit_blocks[-BURST:], raw.loaded_blocks[-BURST:, 0]


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_the_burst_loads_the_prefix_once_and_then_hits_it(engine: str) -> None:
    cfg = config(None)  # the connector's own rule: it defers
    assert cfg.defers_loading_hits
    raw = simulate_raw(trace(), cfg, engine=engine, check_invariants=engine == "reference")
    hits, loaded = burst_rows(raw)
    assert loaded.sum() == PREFIX  # one load of the prefix
    assert sorted(hits.tolist()) == [0] + [PREFIX] * (BURST - 1)  # the rest hit it in HBM
    # a deferred request is admitted in the step that promotes the loader (vLLM caches the
    # loaded blocks then): served with it, not before
    first = raw.first_token_s[-BURST:]
    assert np.all(first[hits == PREFIX] >= first[hits == 0].min())


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_without_the_deferral_every_request_loads_its_own_copy(engine: str) -> None:
    cfg = config(False)
    assert not cfg.defers_loading_hits
    raw = simulate_raw(trace(), cfg, engine=engine, check_invariants=engine == "reference")
    hits, loaded = burst_rows(raw)
    # duplicate loads of the same blocks (as many as HBM has room for; the rest, admitted
    # once a copy is cached, hit it)
    assert loaded.sum() >= 2 * PREFIX
    assert np.count_nonzero(hits) < BURST - 1


@pytest.mark.parametrize("defer", [None, False])
def test_engines_agree_on_the_burst(defer: bool | None) -> None:
    cfg = config(defer)
    ref = simulate_raw(trace(), cfg, engine="reference", check_invariants=True)
    fast = simulate_raw(trace(), cfg, engine="numba")
    np.testing.assert_array_equal(ref.first_token_s, fast.first_token_s)
    np.testing.assert_array_equal(ref.finish_s, fast.finish_s)
    np.testing.assert_array_equal(ref.hit_blocks, fast.hit_blocks)
    np.testing.assert_array_equal(ref.loaded_blocks, fast.loaded_blocks)


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_cached_at_admission_the_burst_hits_the_prefix_while_it_arrives(engine: str) -> None:
    """SGLang's radix tree: the loader's blocks are in HBM's cache at once; the others hit them
    in the same step and wait for their arrival, loading nothing."""
    cfg = config(False, "at_admission")
    assert cfg.shares_loading_hits and not cfg.defers_loading_hits
    raw = simulate_raw(trace(), cfg, engine=engine, check_invariants=engine == "reference")
    hits, loaded = burst_rows(raw)
    assert loaded.sum() == PREFIX
    assert sorted(hits.tolist()) == [0] + [PREFIX] * (BURST - 1)
    # none is served before the load it hit has ended (the loader's load time after its send)
    first = raw.first_token_s[-BURST:]
    sent = raw.arrival_s[-BURST:]
    loader = int(np.flatnonzero(hits == 0)[0])
    arrived = sent[loader] + raw.load_s[-BURST:][loader]
    assert np.all(first > arrived)
    deferred = simulate_raw(trace(), config(None), engine=engine)
    # the others run in the loader's first step either way: at its admission (SGLang) or at
    # its promotion (vLLM's deferral)
    assert first.max() <= deferred.first_token_s[-BURST:].max()


def test_only_vllm_v1_with_prefix_caching_defers() -> None:
    """vLLM keeps no set of blocks being loaded without prefix caching; another scheduler has
    no such connector."""
    cfg = config(None)
    assert not replace(cfg, prefix_caching=False).defers_loading_hits
    assert not replace(cfg, scheduler=0).defers_loading_hits


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefix=st.integers(2, 40),
    fillers=st.integers(0, 7),
    burst=st.integers(2, 8),
    hbm_prompts=st.sampled_from([1.5, 2.5, 2.5, 6.0]),
    outputs=st.integers(1, 40),
    instances=st.integers(1, 2),
    async_scheduling=st.booleans(),
    load_report=st.sampled_from(["step_output", "at_once"]),
    spread=st.sampled_from([0.0, 1e-3]),
    load_caching=st.sampled_from(["first_step", "first_step", "at_admission"]),
)
def test_engines_agree_on_bursts_sharing_a_loaded_prefix(
    prefix, fillers, burst, hbm_prompts, outputs, instances, async_scheduling, load_report,
    spread, load_caching,
) -> None:  # fmt: skip
    """Drawn bursts of requests extending a prefix that only the DRAM tier holds, on one or
    two instances, arrivals at one instant or a millisecond apart: identical per-request
    results from both engines, with the model's invariants checked at every step."""
    tr = trace(prefix, fillers, burst, outputs, spread)
    model = load_model("Qwen3-8B")
    hbm_gb = hbm_prompts * (prefix + 1 + outputs // B + 1) * B * model.kv_bytes_per_token("bf16")
    dram = TierPolicy(name="dram", capacity_gb=50.0, connector="vllm-offloading")
    policy = Policy(
        block_tokens=B,
        serving=ServingPolicy(instances=instances, tp=1, async_scheduling=async_scheduling),
        tiers=(TierPolicy(capacity_gb=hbm_gb / 1e9), dram),
        load_report=load_report,
        load_caching=load_caching,
    )
    hw = load_hardware("h100-node")
    hw = replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=instances))
    cfg = build_config(hw, model, policy)
    try:
        ref = simulate_raw(tr, cfg, engine="reference", check_invariants=True)
    except StallError:
        with pytest.raises(StallError):
            simulate_raw(tr, cfg, engine="numba")
        return
    fast = simulate_raw(tr, cfg, engine="numba")
    for field in ("first_token_s", "finish_s", "hit_blocks", "loaded_blocks", "preemptions"):
        np.testing.assert_array_equal(getattr(ref, field), getattr(fast, field), err_msg=field)
