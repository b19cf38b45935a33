"""Sampling validated on the bundled Mooncake trace (docs/traces.md, "How faithful a sample's
replay is"): 10% and 25% samples, seeds 0-3, against the full replay on 40 instances.

Asserted here are the parts of the target the measurement met, for the routers it met them
for (content-blind: round_robin, least_loaded); the misses are reported in docs/traces.md.
A sample's TTFT figures are post-stratified by prompt length (kvtier.trace.strata).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.experiments import sampling_validation as sv
from kvtier.policy.registries import content_blind_routers
from kvtier.trace.io import read_trace

CONTENT_BLIND_ROUTERS = content_blind_routers()

MOONCAKE = Path(__file__).resolve().parents[1] / sv.TRACE

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def rows() -> list[sv.Row]:
    return sv.measure(read_trace(str(MOONCAKE)), routers=CONTENT_BLIND_ROUTERS)


def test_the_validation_covers_both_fractions_and_four_seeds(rows: list[sv.Row]) -> None:
    assert {(r.router, r.fraction) for r in rows} == {
        (router, f) for router in CONTENT_BLIND_ROUTERS for f in (0.1, 0.25)
    }
    for r in rows:
        assert r.full.instances == 40
        assert len(r.samples) == 4
        assert {s.instances for s in r.samples} == {round(40 * r.fraction)}


def test_sample_hit_ratios_are_within_002_of_the_full_replay(rows: list[sv.Row]) -> None:
    for r in rows:
        for seed, s in enumerate(r.samples):
            assert abs(s.hit - r.full.hit) <= sv.HIT_TOLERANCE, (r.router, r.fraction, seed, s)


def test_without_the_fan_out_correction_a_10_percent_sample_misses(rows: list[sv.Row]) -> None:
    for r in rows:
        assert r.plain is not None
        if r.fraction == 0.1:
            assert all(p.hit > r.full.hit + sv.HIT_TOLERANCE for p in r.plain), r


def test_samples_meet_the_ttft_p50_target(rows: list[sv.Row]) -> None:
    for r in rows:
        assert r.met()["P50"], r


def test_25_percent_post_stratified_samples_meet_the_ttft_p99_target(rows: list[sv.Row]) -> None:
    """Met at 25% for every seed; at 10% one seed of four misses (docs/traces.md), so that
    fraction is not asserted."""
    for r in rows:
        if r.fraction == 0.25:
            assert r.met()["P99"], r


def test_sample_figures_are_post_stratified(rows: list[sv.Row]) -> None:
    """The sample's P99 is the weighted one: an unweighted replay of the same sample gives
    another figure for at least one seed."""
    from dataclasses import replace

    from kvtier.trace.sampling import sample

    trace = read_trace(str(MOONCAKE))
    hardware, model = sv._cluster()
    r = next(r for r in rows if r.router == "round_robin" and r.fraction == 0.1)
    differ = []
    for seed, s in enumerate(r.samples):
        sampled = sample(trace, 0.1, seed=seed)[0]
        assert sampled.sample_strata is not None
        plain = replace(sampled, sample_strata=None)
        scenario = sv.Scenario(plain, hardware, model, sv._policy("round_robin"))
        differ.append(scenario.replay().metrics.ttft_p99_s != s.ttft_p99_s)
    assert any(differ)


def test_a_sample_replays_its_own_requests_as_the_full_replay_does(rows: list[sv.Row]) -> None:
    """The TTFT misses are the sample's composition, not the replay: each sample's TTFT P50
    and P99 are within 10% of the full replay's over the same requests, both post-stratified
    alike (a diagnostic added after the first measurement, docs/traces.md)."""
    for r in rows:
        for seed, s in enumerate(r.samples):
            assert s.same_p50_s is not None and s.same_p99_s is not None
            assert abs(s.ttft_p50_s / s.same_p50_s - 1) <= sv.TTFT_TOLERANCE, (r, seed)
            assert abs(s.ttft_p99_s / s.same_p99_s - 1) <= sv.TTFT_TOLERANCE, (r, seed)


@pytest.fixture(scope="module")
def affine_rows() -> list[sv.Row]:
    return sv.measure(
        read_trace(str(MOONCAKE)), routers=("prefix_affinity", "kv_aware"), plain=False
    )


def test_content_affine_samples_are_biased_high_as_replay_warns(
    affine_rows: list[sv.Row],
) -> None:
    """The direction ``kvtier replay``'s warning states: on average over the seeds, a
    sample's hit ratio exceeds the full replay's over the same requests by more than the
    target's 0.02."""
    for r in affine_rows:
        excess = [s.hit - s.same_hit for s in r.samples if s.same_hit is not None]
        assert len(excess) == 4
        assert sum(excess) / 4 > sv.HIT_TOLERANCE, r
