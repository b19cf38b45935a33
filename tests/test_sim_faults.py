"""Faults of the lower tiers (kvtier.sim.faults, kvtier.sim.fault_step): what a failed device
loses is recomputed, block for block, and both engines agree on every replay with faults."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import Topology
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.sim.fault_metrics import fault_impacts
from kvtier.sim.faults import Fault, parse_fault
from kvtier.trace.blocked import BlockedTrace
from tests.sim_strategies import blocked_traces, tiered_configs
from tests.test_sim_tiers_differential import assert_same_tiers, tiered_engines_agree

B = 256
GAP = 1000.0  # seconds between requests: each finishes before the next arrives


def pool_trace(n_docs: int, seed: int = 3) -> tuple[BlockedTrace, list[list[int]]]:
    """``n_docs`` distinct prompts, then each again: every prompt's first blocks have odd ids
    (device 1 of two), its tail even ids (device 0), the split point drawn per prompt."""
    rng = np.random.default_rng(seed)
    odd, even = iter(range(1, 10**6, 2)), iter(range(0, 10**6, 2))
    prompts = []
    for _ in range(n_docs):
        head, tail = int(rng.integers(1, 12)), int(rng.integers(0, 12))
        prompts.append([next(odd) for _ in range(head)] + [next(even) for _ in range(tail)])
    ids = sorted({b for p in prompts for b in p})
    dense = {b: b for b in ids}  # ids are kept (their parity is the device)
    blocks = [[dense[b] for b in p] for p in prompts] * 2
    n = len(blocks)
    trace = BlockedTrace.from_lists(
        [GAP * i for i in range(n)],
        [len(p) * B + 1 for p in blocks],
        [2] * n,
        blocks,
        B,
        n_blocks=max(ids) + 1,
    )
    return trace, prompts


def pool_config(faults: tuple[Fault, ...]):
    """Two instances on two hosts sharing one CXL pool, round robin, without HBM prefix
    caching: every reuse comes from the pool."""
    hw = load_hardware("beluga-testbed")
    hw = replace(hw, topology=Topology(hosts=2, gpus_per_host=1, tp=1))
    policy = Policy(
        block_tokens=B,
        serving=ServingPolicy(instances=2, routing="round_robin", prefix_caching=False),
        tiers=(TierPolicy(), TierPolicy(name="cxl", capacity_gb=100.0)),
    )
    return replace(build_config(hw, load_model("Qwen3-32B"), policy), faults=faults)


def both(trace: BlockedTrace, cfg):
    ref = simulate_raw(trace, cfg, engine="reference", check_invariants=True)
    fast = simulate_raw(trace, cfg, engine="numba")
    assert_same_tiers(ref, fast, trace, cfg)
    assert (ref.fault_lost_ids is None) == (not cfg.faults)
    for a, b in zip(ref.fault_lost_ids or (), fast.fault_lost_ids or (), strict=True):
        np.testing.assert_array_equal(a, b)
    return fast


def recomputed_tokens(trace: BlockedTrace, raw) -> np.ndarray:
    loaded = raw.loaded_blocks.sum(axis=1)
    return trace.input_tokens - (raw.hit_blocks + loaded) * trace.block_tokens


def test_a_failed_pool_device_costs_exactly_its_blocks() -> None:
    n_docs = 9
    trace, prompts = pool_trace(n_docs)
    at = GAP * (n_docs - 0.5)  # after the first pass, before the repeats
    fault = parse_fault(f"tier=cxl,at={at}s,devices=2,device=0")
    raw = both(trace, pool_config((fault,)))
    healthy = both(trace, pool_config(()))
    written = {b for p in prompts for b in p}
    (lost,) = raw.fault_lost_ids
    assert set(lost.tolist()) == {b for b in written if b % 2 == 0}  # device 0's share
    repeats = slice(n_docs, 2 * n_docs)
    lost_requested = sum(sum(1 for b in p if b % 2 == 0) for p in prompts)
    assert lost_requested > 0
    # without the fault every repeat loads its whole prompt; with it, exactly the blocks the
    # device held are computed again (each prompt's tail), plus the one token vLLM recomputes
    assert recomputed_tokens(trace, healthy)[repeats].tolist() == [1] * n_docs
    extra = recomputed_tokens(trace, raw)[repeats] - 1
    assert extra.sum() == B * lost_requested
    assert extra.tolist() == [B * sum(1 for b in p if b % 2 == 0) for p in prompts]
    assert np.all(raw.first_token_s[repeats] >= healthy.first_token_s[repeats])


def test_a_device_down_drops_writes_and_returns_empty() -> None:
    """Down across the repeats: nothing of device 0 is found or written; after it is back the
    next pass loads device 1's blocks and refills device 0 by write-through."""
    n_docs = 9
    trace, prompts = pool_trace(n_docs)
    tripled = BlockedTrace.from_lists(
        [GAP * i for i in range(3 * n_docs)],
        list(trace.input_tokens) + list(trace.input_tokens[:n_docs]),
        [2] * (3 * n_docs),
        prompts * 3,
        B,
        n_blocks=trace.n_blocks,
    )
    at, down = GAP * (n_docs - 0.5), GAP * n_docs
    raw = both(
        tripled, pool_config((parse_fault(f"tier=cxl,at={at},down={down},device=0,devices=2"),))
    )
    rec = recomputed_tokens(tripled, raw) - 1
    tails = [B * sum(1 for b in p if b % 2 == 0) for p in prompts]
    assert rec[n_docs : 2 * n_docs].tolist() == tails  # down: the tails are recomputed
    assert rec[2 * n_docs :].tolist() == tails  # back empty: the writes while down were lost


def test_a_switch_fault_keeps_the_blocks() -> None:
    n_docs = 9
    trace, prompts = pool_trace(n_docs)
    at, down = GAP * (n_docs - 0.5), GAP * 4
    raw = both(trace, pool_config((parse_fault(f"kind=switch,tier=cxl,at={at},down={down}"),)))
    rec = recomputed_tokens(trace, raw)[n_docs:] - 1
    assert raw.fault_lost_ids[0].size == 0
    whole = [B * len(p) for p in prompts]
    # the repeats inside the outage recompute everything, the later ones load everything
    assert rec[:4].tolist() == whole[:4] and rec[4:].tolist() == [0] * (n_docs - 4)


def test_rebuild_restores_lost_blocks_at_its_rate() -> None:
    n_docs = 9
    trace, prompts = pool_trace(n_docs)
    at = GAP * (n_docs - 0.5)
    fast_rebuild = parse_fault(f"tier=cxl,at={at},devices=2,device=0,rebuild_gbps=400")
    raw = both(trace, pool_config((fast_rebuild,)))
    rec = recomputed_tokens(trace, raw)[n_docs:] - 1
    assert rec.tolist() == [0] * n_docs  # rebuilt long before the repeats


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("tier=cxl", "'at'"),
        ("tier=cxl,at=x", "at='x'"),
        ("tier=cxl,at=1,colour=red", "valid keys"),
        ("tier=cxl,at=1,kind=meteor", "valid kinds"),
        ("tier=cxl,at=1,device=2,devices=2", "devices"),
        ("at=1", "tier=NAME"),
    ],
)
def test_bad_fault_specs_are_one_line_errors(spec: str, needle: str) -> None:
    with pytest.raises(InputError) as err:
        parse_fault(spec)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_a_fault_of_a_tier_the_policy_lacks_names_the_valid_ones() -> None:
    trace, _ = pool_trace(3)
    cfg = pool_config((parse_fault("tier=rdma,at=1"),))
    with pytest.raises(InputError, match="valid tiers: cxl"):
        simulate_raw(trace, cfg, engine="reference")


@st.composite
def fault_cases(draw: st.DrawFn):
    trace = draw(blocked_traces())
    cfg = draw(tiered_configs(trace.block_tokens))
    if cfg.tiers is None:
        return trace, cfg
    end = float(trace.arrival_s.max()) + 1.0 if trace.n_requests else 1.0
    faults = []
    for _ in range(draw(st.integers(1, 2))):
        t = draw(st.integers(0, cfg.tiers.n_tiers - 1))
        kind = draw(st.sampled_from(["tier", "device", "switch", "host"]))
        if kind == "host" and not cfg.tiers.per_host[t]:
            kind = "tier"
        devices = draw(st.integers(2, 4))
        faults.append(
            Fault(
                kind=kind,
                tier=cfg.tiers.names[t],
                at_s=draw(st.floats(0, end)),
                down_s=draw(st.sampled_from([0.0, 0.5, 3.0, float(end)])),
                device=draw(st.integers(0, devices - 1)) if kind == "device" else -1,
                devices=devices if kind == "device" else 1,
                host=draw(st.integers(0, cfg.tiers.n_hosts - 1)) if kind == "host" else -1,
                rebuild_gbps=draw(st.sampled_from([0.0, 0.0, 10.0, 1000.0])),
            )
        )
    return trace, replace(cfg, faults=tuple(faults))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fault_cases())
def test_engines_agree_with_faults(case) -> None:
    trace, cfg = case
    pair = tiered_engines_agree(trace, cfg)
    if pair is None:  # both stopped at the same stall
        return
    ref, fast = pair
    if cfg.faults and cfg.tiers is not None:
        for a, b in zip(ref.fault_lost_ids, fast.fault_lost_ids, strict=True):
            np.testing.assert_array_equal(a, b)


def test_recovery_time_and_tail_ttft_of_a_pool_fault() -> None:
    """Four passes over the prompts; device 0 fails before the second and is back (empty)
    before the third, which recomputes and rewrites the tails: the hit ratio is back at its
    level from the fourth pass, so recovery ends where that pass's window starts."""
    n_docs = 9
    _, prompts = pool_trace(n_docs)
    passes = 4
    blocks = prompts * passes
    n = len(blocks)
    trace = BlockedTrace.from_lists(
        [GAP * i for i in range(n)],
        [len(p) * B + 1 for p in blocks],
        [2] * n,
        blocks,
        B,
        n_blocks=max(b for p in prompts for b in p) + 1,
    )
    w = GAP * n_docs  # one pass per window
    at = w - GAP / 2
    fault = parse_fault(f"tier=cxl,at={at},down={w},devices=2,device=0")
    raw = both(trace, pool_config((fault,)))
    base = both(trace, pool_config(()))
    (impact,) = fault_impacts(trace, raw, (fault,), baseline=base, window_s=w)
    assert impact.lost_blocks == len(raw.fault_lost_ids[0]) > 0
    assert impact.recovery_s == pytest.approx(3 * w - at)
    assert impact.requests_during == 2 * n_docs
    assert impact.ttft_p99_s > impact.baseline_ttft_p99_s
    assert impact.lowest_hit_ratio < impact.level_hit_ratio - impact.band
    # without a baseline the level is the pre-fault hit ratio (the first pass: nothing reused)
    (alone,) = fault_impacts(trace, raw, (fault,), window_s=w)
    assert alone.level_hit_ratio == 0.0 and alone.recovery_s == pytest.approx(w - at)


def test_replay_fault_option_reports_the_fault(tmp_path) -> None:
    """``kvtier replay --fault``: the JSON carries each fault's figures; a bad spec is a
    one-line error with exit code 2."""
    import json

    from kvtier.trace.io import write_trace
    from tests.helpers import assert_one_line_error, invoke, make_trace

    docs = [list(range(d * 1000, d * 1000 + 512)) for d in range(3)]
    prompts = [docs[i % 3] + [50_000 + i] * 20 for i in range(30)]
    path = tmp_path / "t.parquet"
    write_trace(make_trace(prompts, 16, arrivals=[0.2 * i for i in range(30)]), path)
    args = ["replay", "--trace", str(path), "--hardware", "beluga-testbed",
            "--set", "serving.instances=2", "--preset", "beluga-cxl"]  # fmt: skip
    bad = invoke(*args, "--fault", "tier=cxl,at=soon")
    assert bad.code == 2
    assert_one_line_error(bad, "--fault", "at='soon'")
    ok = invoke(*args, "--fault", "tier=cxl,at=2,down=1,devices=4,device=1", "--json")
    assert ok.code == 0, ok.stderr
    (fault,) = json.loads(ok.stdout)["faults"]
    assert fault["at_s"] == 2.0 and fault["back_s"] == 3.0
    assert fault["lost_blocks"] > 0 and fault["requests_during"] >= 0


def test_a_policy_files_faults_tables_run_in_replay(tmp_path) -> None:
    import json

    from kvtier.trace.io import write_trace
    from tests.helpers import assert_one_line_error, invoke, make_trace

    prompts = [list(range(512)) + [9000 + i] * 20 for i in range(12)]
    trace = tmp_path / "t.parquet"
    write_trace(make_trace(prompts, 16, arrivals=[0.3 * i for i in range(12)]), trace)
    policy = tmp_path / "p.toml"
    base = (
        'format = "kvtier-policy/1"\nblock_tokens = 16\n[serving]\ninstances = 2\n'
        '[[tiers]]\nname = "hbm"\n[[tiers]]\nname = "cxl"\ncapacity_gb = 20.0\n'
    )
    policy.write_text(base + '[[faults]]\ntier = "cxl"\nat = 1.0\ndown = 0.5\n')
    args = [
        "replay",
        "--trace",
        str(trace),
        "--hardware",
        "beluga-testbed",
        "--policy",
        str(policy),
    ]
    ok = invoke(*args, "--json")
    assert ok.code == 0, ok.stderr
    (fault,) = json.loads(ok.stdout)["faults"]
    assert fault["fault"].startswith("tier cxl") and fault["back_s"] == 1.5
    policy.write_text(base + '[[faults]]\ntier = "cxl"\nat = 1.0\ncolour = "red"\n')
    bad = invoke(*args)
    assert bad.code == 2
    assert_one_line_error(bad, "faults[0]", "colour")
