"""The SLO judge: one place that decides whether a replay meets its SLO.

Three questions are asked of an SLO, and each is answered here once:

* **during a replay**, has the run *certainly* missed it already (the early stop)?
  :class:`SloCheck` holds the bounds and the counts past which a percentile is certainly
  missed; :class:`SloTracker` keeps the reference engine's running counts, and
  :func:`certainly_missed` is the rule over them, which the numba engine compiles
  (``kvtier.sim.nb.slo_missed_nb``) over the same counts kept in its tally;
* **after a replay**, by how much each bounded term misses (:func:`violations`, the
  optimizer's constraints: ``metric - bound``, positive when missed, plus ``completion``) and
  whether the replay meets the SLO as a whole (:func:`met`, ``Metrics.slo_met``), both from
  :func:`term_violation`, whose NaN rule is the only one: a TPOT or TBT percentile with no
  interval to bound (no served request of two tokens) holds vacuously, any other missing
  value misses;
* **per request**, which requests meet every per-request bound (:func:`requests_meeting`,
  the SLO attainment).

Nothing here imports numba: the metrics, the objective and ``kvtier report`` judge without
compiling anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kvtier.policy.model import SLO, SLO_TERMS

if TYPE_CHECKING:
    from kvtier.sim.result import RawResult
    from kvtier.trace.blocked import BlockedTrace


# -- during a replay: the early stop --------------------------------------------------------


@dataclass(frozen=True)
class SloCheck:
    """Thresholds of an SLO and the counts past which each is certainly missed.

    A request that is rejected (it can never fit in HBM) misses every SLO. For a percentile
    ``q`` over ``n`` requests, ``numpy.quantile(..., method="linear")`` is at least the sorted
    value at ``k = floor((n - 1) * q)``; once ``n - k`` values exceed the threshold, that value
    does too, whatever the remaining requests do. The mean TTFT is missed once the TTFTs seen
    so far, divided by ``n``, exceed its bound (TTFTs are never negative). The TBT percentile
    is over the requests with two tokens or more (``m <= n``); its limit counts all ``n``,
    which is at least the limit for ``m``, so a stop on it is still certain.
    """

    ttft_mean_s: float
    ttft_p99_s: float
    ttft_p999_s: float
    tpot_p99_s: float
    tbt_p99_s: float = math.inf

    @classmethod
    def from_slo(cls, slo: SLO) -> SloCheck:
        def f(x: float | None) -> float:
            return math.inf if x is None else float(x)

        return cls(
            f(slo.ttft_mean_s),
            f(slo.ttft_p99_s),
            f(slo.ttft_p999_s),
            f(slo.tpot_p99_s),
            f(slo.tbt_p99_s),
        )

    def thresholds(self) -> np.ndarray:
        """The bounds in the order :func:`certainly_missed` reads them: mean, p99 and p99.9
        TTFT, p99 TPOT, p99 TBT."""
        return np.array(
            [self.ttft_mean_s, self.ttft_p99_s, self.ttft_p999_s, self.tpot_p99_s, self.tbt_p99_s],
            dtype=np.float64,
        )

    @staticmethod
    def over_limit(n: int, q: float) -> int:
        """How many values above a threshold make the ``q`` quantile of ``n`` values exceed it."""
        return n - math.floor((n - 1) * q) if n else 1

    def limits(self, n: int) -> np.ndarray:
        """The over-limits in the order :func:`certainly_missed` reads them: p99 and p99.9
        TTFT, p99 TPOT, p99 TBT."""
        return np.array(
            [
                self.over_limit(n, 0.99),
                self.over_limit(n, 0.999),
                self.over_limit(n, 0.99),
                self.over_limit(n, 0.99),
            ],
            dtype=np.int64,
        )

    def tracker(self, n: int) -> SloTracker:
        return SloTracker(self, n)


def certainly_missed(
    rejected: int,
    mean_ttft: float,
    over_p99: int,
    over_p999: int,
    over_tpot: int,
    over_tbt: int,
    thresholds: Any,
    limits: Any,
) -> bool:
    """Whether a replay has certainly missed its SLO already: a request was rejected, the
    TTFTs seen so far over all ``n`` requests (``mean_ttft``) exceed the mean bound, or the
    requests over a percentile's bound reached its limit (:class:`SloCheck`).

    ``thresholds`` and ``limits`` are :meth:`SloCheck.thresholds` and
    :meth:`SloCheck.limits` (any indexable); the numba engine compiles this very function
    (``kvtier.sim.nb.slo_missed_nb``), so both engines stop at the same event."""
    return (
        rejected > 0
        or mean_ttft > thresholds[0]
        or over_p99 >= limits[0]
        or over_p999 >= limits[1]
        or over_tpot >= limits[2]
        or over_tbt >= limits[3]
    )


class SloTracker:
    """The reference engine's running counts for :class:`SloCheck`; the numba engine keeps
    the same counts in its tally, and both ask :func:`certainly_missed`."""

    def __init__(self, check: SloCheck, n: int) -> None:
        self.check = check
        self.n = n
        self.lim = [int(x) for x in check.limits(n)]
        self.thr = (
            check.ttft_mean_s,
            check.ttft_p99_s,
            check.ttft_p999_s,
            check.tpot_p99_s,
            check.tbt_p99_s,
        )
        self.sum_ttft = 0.0
        # ttft > p99 bound, ttft > p999 bound, tpot > p99 bound, tbt tail > p99 bound
        self.over = [0, 0, 0, 0]
        self.n_rejected = 0

    def first_token(self, ttft: float) -> None:
        self.sum_ttft += ttft
        if ttft > self.check.ttft_p99_s:
            self.over[0] += 1
        if ttft > self.check.ttft_p999_s:
            self.over[1] += 1

    def finished(self, gen_time: float, output_tokens: int) -> None:
        tpot = gen_time / max(1, output_tokens - 1)
        if tpot > self.check.tpot_p99_s:
            self.over[2] += 1

    def tbt(self, tail: float) -> None:
        """A finished request's TBT (NaN below two tokens: not counted)."""
        if tail > self.check.tbt_p99_s:
            self.over[3] += 1

    def rejected(self) -> None:
        self.n_rejected += 1

    def missed(self) -> bool:
        return certainly_missed(
            self.n_rejected, self.sum_ttft / self.n, *self.over, self.thr, self.lim
        )


# -- after a replay: terms, completion, met ---------------------------------------------------


def term_violation(term: str, value: float | None, bound: float) -> float:
    """``value - bound`` for one SLO term (positive: missed).

    The one rule for a value that is not a number: a TPOT or TBT percentile is NaN when no
    served request has two tokens, so no interval is there to bound and the bound holds
    vacuously (``-bound``; a run that served nothing fails on completion); any other missing
    value (None, NaN) misses by infinity.
    """
    if term in ("tpot_p99_s", "tbt_p99_s") and value is not None and math.isnan(value):
        return -bound
    if value is None or math.isnan(value):
        return math.inf
    return value - bound


def term_violations(metrics: Any, slo: SLO) -> dict[str, float]:
    """:func:`term_violation` of every term ``slo`` bounds, read from ``metrics``."""
    out: dict[str, float] = {}
    for term in SLO_TERMS:
        bound = getattr(slo, term)
        if bound is not None:
            out[term] = term_violation(term, getattr(metrics, term), bound)
    return out


def violations(metrics: Any, slo: SLO) -> dict[str, float]:
    """``metric - bound`` per SLO term (positive: missed), plus ``completion``: 1.0 when the
    run stopped early (SLO certainly missed), refused requests that can never fit, or served
    none, else 0.0. The optimizer's constraints (Optuna's convention: ``<= 0`` holds)."""
    out = term_violations(metrics, slo)
    incomplete = metrics.early_stopped or metrics.n_rejected > 0 or metrics.n_served == 0
    out["completion"] = 1.0 if incomplete else 0.0
    return out


def met(metrics: Any, slo: SLO) -> bool:
    """Whether a replay meets ``slo``: it ran to the end, served every request, and no
    bounded term is missed (:func:`term_violation`)."""
    return (
        not metrics.early_stopped
        and metrics.n_served == metrics.n_requests
        and all(v <= 0 for v in term_violations(metrics, slo).values())
    )


# -- per request: the attainment --------------------------------------------------------------


def meets_tbt(trace: BlockedTrace, raw: RawResult, bound: float, tail: np.ndarray) -> np.ndarray:
    """Per request: served, and its TBT tail within ``bound`` (no interval: within)."""
    served = ~np.isnan(raw.finish_s)
    single = trace.output_tokens < 2
    return served & (single | (np.nan_to_num(tail, nan=math.inf) <= bound))


def requests_meeting(slo: SLO, trace: BlockedTrace, raw: RawResult, ttft: np.ndarray) -> np.ndarray:
    """Per request, whether it meets every per-request bound of ``slo``: finished, its TTFT
    (``ttft``, NaN without a first token) within the tightest TTFT bound (mean and
    percentiles alike), its TPOT within the TPOT bound and its TBT tail within the TBT bound
    (:func:`meets_tbt`). Rejected or unfinished requests miss."""
    ttft_bounds = [b for b in (slo.ttft_p99_s, slo.ttft_p999_s, slo.ttft_mean_s) if b is not None]
    ok = ~np.isnan(raw.finish_s)
    if ttft_bounds:
        ok &= np.nan_to_num(ttft, nan=math.inf) <= min(ttft_bounds)
    if slo.tpot_p99_s is not None:
        gen = raw.finish_s - raw.first_token_s
        tpot = gen / np.maximum(1, trace.output_tokens - 1)
        ok &= np.nan_to_num(tpot, nan=math.inf) <= slo.tpot_p99_s
    if slo.tbt_p99_s is not None and raw.tbt_tail_s is not None:
        ok &= meets_tbt(trace, raw, slo.tbt_p99_s, raw.tbt_tail_s)
    return ok
