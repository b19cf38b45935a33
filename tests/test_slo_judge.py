"""The one SLO judge (kvtier.sim.slo): its early-stop rule and the numba engine's compiled
twin agree on every case, NaN and infinity included; after a replay, the terms, ``slo_met``
and the optimizer's constraints follow one NaN rule."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.policy.model import SLO, SLO_TERMS
from kvtier.sim.slo import (
    SloCheck,
    certainly_missed,
    met,
    term_violation,
    violations,
)

ANY_FLOAT = st.floats(allow_nan=True, allow_infinity=True, width=64)
BOUND = st.floats(min_value=1e-6, max_value=1e3, allow_nan=False, allow_infinity=False)
# thresholds as SloCheck holds them: finite bounds, or inf for a term the SLO leaves out
THRESHOLD = st.one_of(BOUND, st.just(math.inf), st.floats(allow_nan=True, allow_infinity=True))
COUNT = st.integers(min_value=0, max_value=50)


@st.composite
def early_stop_cases(draw: st.DrawFn) -> tuple:
    return (
        draw(st.integers(min_value=0, max_value=2)),
        draw(st.one_of(ANY_FLOAT, st.just(math.nan), st.just(math.inf))),
        *(draw(COUNT) for _ in range(4)),
        np.array([draw(THRESHOLD) for _ in range(5)], dtype=np.float64),
        np.array([draw(st.integers(min_value=1, max_value=50)) for _ in range(4)], dtype=np.int64),
    )


@settings(max_examples=400, deadline=None)
@given(early_stop_cases())
def test_the_kernel_twin_judges_as_the_python_rule(case: tuple) -> None:
    from kvtier.sim.nb import certainly_missed_nb

    expected = bool(certainly_missed(*case))
    assert bool(certainly_missed_nb(*case)) is expected
    # the reference's tracker passes plain tuples and lists: the same answer
    *head, thresholds, limits = case
    assert certainly_missed(*head, tuple(thresholds), [int(x) for x in limits]) == expected


def test_the_early_stop_rule_on_named_cases() -> None:
    check = SloCheck.from_slo(SLO(ttft_mean_s=1.0, ttft_p99_s=2.0))
    thr, lim = check.thresholds(), check.limits(100)  # 2 over the p99 bound: missed
    assert list(lim[:1]) == [2]
    assert not certainly_missed(0, 0.5, 1, 0, 0, 0, thr, lim)
    assert certainly_missed(0, 0.5, 2, 0, 0, 0, thr, lim)
    assert certainly_missed(1, 0.0, 0, 0, 0, 0, thr, lim)  # a rejection misses every SLO
    assert certainly_missed(0, 1.5, 0, 0, 0, 0, thr, lim)  # the mean already over its bound
    assert not certainly_missed(0, math.nan, 0, 0, 0, 0, thr, lim)  # NaN proves nothing
    # unbounded terms (inf) never stop a run, however many requests are slow
    free = SloCheck.from_slo(SLO())
    assert not certainly_missed(0, 1e300, 1, 1, 1, 1, free.thresholds(), free.limits(1) + 1)


def test_the_tracker_asks_the_same_rule() -> None:
    tracker = SloCheck.from_slo(SLO(ttft_p99_s=1.0)).tracker(3)
    tracker.first_token(1.5)
    assert not tracker.missed()
    tracker.first_token(1.5)  # over_limit(3, 0.99) = 2: two slow requests decide the p99
    assert tracker.missed()


@settings(max_examples=400, deadline=None)
@given(term=st.sampled_from(SLO_TERMS), value=ANY_FLOAT, bound=BOUND)
def test_a_term_holds_exactly_when_its_value_is_within_the_bound(
    term: str, value: float, bound: float
) -> None:
    """``value - bound <= 0`` is ``value <= bound`` for every float, and NaN follows the one
    rule: a NaN TPOT or TBT percentile (no interval) holds, any other NaN misses."""
    held = term_violation(term, value, bound) <= 0
    if term in ("tpot_p99_s", "tbt_p99_s"):
        assert held == (not value > bound)
    else:
        assert held == (value <= bound)


def _metrics(**values: float | None) -> SimpleNamespace:
    base = {t: 0.1 for t in SLO_TERMS}
    base.update(values)
    return SimpleNamespace(early_stopped=False, n_requests=10, n_served=10, n_rejected=0, **base)


def test_met_and_the_constraints_agree_on_nan_and_missing_values() -> None:
    slo = SLO(ttft_p99_s=1.0, tbt_p99_s=0.05)
    # no served request of two tokens: the TBT bound holds vacuously, for both
    m = _metrics(tbt_p99_s=math.nan)
    assert met(m, slo) and violations(m, slo)["tbt_p99_s"] == -0.05
    # a TTFT that is not a number misses, for both
    m = _metrics(ttft_p99_s=math.nan)
    assert not met(m, slo) and violations(m, slo)["ttft_p99_s"] == math.inf
    # a value the metrics do not hold at all misses by infinity
    assert violations(_metrics(tbt_p99_s=None), slo)["tbt_p99_s"] == math.inf
    assert not met(_metrics(tbt_p99_s=None), slo)
    # at the bound: met, no violation
    m = _metrics(ttft_p99_s=1.0, tbt_p99_s=0.05)
    assert met(m, slo) and max(violations(m, slo).values()) == 0.0


def test_completion_is_judged_apart_from_the_terms() -> None:
    slo = SLO(ttft_p99_s=1.0)
    stopped = _metrics()
    stopped.early_stopped = True
    assert not met(stopped, slo) and violations(stopped, slo)["completion"] == 1.0
    unserved = _metrics()
    unserved.n_served, unserved.n_rejected = 9, 1
    assert not met(unserved, slo) and violations(unserved, slo)["completion"] == 1.0
    assert violations(_metrics(), slo) == {"ttft_p99_s": 0.1 - 1.0, "completion": 0.0}
