"""Metrics: definitions on hand-made results, JSON round trip, SLO attainment."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvtier.policy import SLO
from kvtier.sim.metrics import Metrics, compute_metrics
from kvtier.sim.result import RawResult
from kvtier.sim.slo import SloCheck
from kvtier.trace.blocked import BlockedTrace


def raw(first, finish, inst, hits=None, busy=(1.0,)) -> RawResult:
    n = len(first)
    return RawResult(
        first_token_s=np.asarray(first, dtype=float),
        finish_s=np.asarray(finish, dtype=float),
        hit_blocks=np.asarray(hits if hits is not None else [0] * n, dtype=np.int64),
        instance=np.asarray(inst, dtype=np.int64),
        busy_s=np.asarray(busy, dtype=float),
        n_iterations=7,
        early_stopped=False,
        end_s=float(np.nanmax(finish)),
    )


TRACE = BlockedTrace.from_lists([0.0, 1.0, 2.0], [32, 48, 16], [1, 5, 3], [[0], [0, 1], []], 16)


def test_definitions() -> None:
    r = raw([0.5, 1.5, 3.0], [0.5, 2.5, 4.0], [0, 0, 0], hits=[0, 1, 0], busy=[2.0])
    m = compute_metrics(TRACE, r, cost_per_hour=36.0)
    ttft = np.array([0.5, 0.5, 1.0])
    assert m.ttft_mean_s == pytest.approx(ttft.mean())
    assert m.ttft_p99_s == float(np.quantile(ttft, 0.99, method="linear"))
    # TPOT: (finish - first) / (out - 1) = none (one token), 1/4, 1/2
    assert m.tpot_mean_s == pytest.approx((0.25 + 0.5) / 2)
    assert m.e2e_mean_s == pytest.approx((0.5 + 1.5 + 2.0) / 3)
    assert m.duration_s == 4.0
    assert m.throughput_rps == 3 / 4.0
    assert m.throughput_tps == (96 + 9) / 4.0
    assert m.prefill_tokens_saved == 16
    assert m.hit_ratio_tokens == {"hbm": 16 / 96}
    assert m.gpu_busy_fraction == 2.0 / 4.0
    assert m.cost_per_mtok == pytest.approx(36.0 / ((105 / 4.0) * 3600 / 1e6))
    assert m.slo_met is None


def test_json_round_trip() -> None:
    m = compute_metrics(TRACE, raw([0.5, 1.5, 3.0], [0.5, 2.5, 4.0], [0, 0, 0]), cost_per_hour=1)
    back = Metrics.from_json(m.to_json())
    assert back == m


def test_rejected_request_and_slo() -> None:
    r = raw([0.5, math.nan, 3.0], [0.5, math.nan, 4.0], [0, -1, 0])
    m = compute_metrics(TRACE, r, cost_per_hour=1.0, slo=SLO(ttft_p99_s=10.0))
    assert m.n_rejected == 1 and m.n_served == 2
    assert m.slo_met is False  # a rejected request fails the SLO
    assert m.slo_attainment == pytest.approx(2 / 3)
    ok = raw([0.5, 1.5, 3.0], [0.5, 2.5, 4.0], [0, 0, 0])
    tight = compute_metrics(TRACE, ok, cost_per_hour=1.0, slo=SLO(ttft_p99_s=0.6))
    assert tight.slo_met is False and tight.slo_attainment == pytest.approx(2 / 3)
    loose = compute_metrics(TRACE, ok, cost_per_hour=1.0, slo=SLO(ttft_p99_s=1.0))
    assert loose.slo_met is True and loose.slo_attainment == 1.0


@pytest.mark.parametrize("n", [1, 2, 5, 99, 100, 101, 1000, 1001])
@pytest.mark.parametrize("q", [0.99, 0.999])
def test_over_limit_values_above_a_bound_prove_the_quantile_above_it(n: int, q: float) -> None:
    limit = SloCheck.over_limit(n, q)
    assert 1 <= limit <= n
    # the least favourable case: exactly `limit` values just above the bound, the rest at 0
    x = np.zeros(n)
    x[n - limit :] = np.nextafter(1.0, 2.0)
    assert np.quantile(x, q, method="linear") > 1.0
