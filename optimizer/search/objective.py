"""The optimizer's objective: cost per 1M tokens of a policy, under SLO constraints.

Two load modes (docs/design.md section 5):

* ``trace``: the trace is served as recorded (arrivals divided by ``rate_scale``); the
  policy's cost per token at that load is the objective, the SLO a set of constraints.
* ``capacity``: for each policy, the largest time compression of the trace that still meets
  the SLO, found by doubling then bisection (geometric); cost per token is priced at that rate,
  so a policy that serves more load on the same hardware is cheaper per token.

Constraint values follow Optuna's convention: ``<= 0`` is satisfied. Each SLO term contributes
``metric - bound``; one more term is positive when a run stopped early (SLO certainly missed)
or refused requests that can never fit.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field, replace
from typing import Any

from kvtier.errors import InputError
from kvtier.hardware.types import Hardware, ModelProfile
from kvtier.policy.model import SLO, Policy
from kvtier.search.overlay import apply
from kvtier.sim import simulate
from kvtier.sim.metrics import Metrics
from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.format import Trace

SLO_TERMS = ("ttft_mean_s", "ttft_p99_s", "ttft_p999_s", "tpot_p99_s")
LOAD_MODES = ("trace", "capacity")


def slo_violations(metrics: Metrics, slo: SLO) -> dict[str, float]:
    """``metric - bound`` per SLO term (positive: missed), plus ``completion``."""
    out: dict[str, float] = {}
    for term in SLO_TERMS:
        bound = getattr(slo, term)
        if bound is not None:
            value = getattr(metrics, term)
            out[term] = math.inf if math.isnan(value) else value - bound
    incomplete = metrics.early_stopped or metrics.n_rejected > 0 or metrics.n_served == 0
    out["completion"] = 1.0 if incomplete else 0.0
    return out


def binding_term(violations: dict[str, float], slo: SLO) -> str:
    """The term missed by the largest margin relative to its bound."""

    def rel(term: str) -> float:
        bound = getattr(slo, term, None)
        v = violations[term]
        return v / bound if bound else v

    return max(violations, key=rel)


@dataclass(frozen=True)
class Evaluation:
    """One policy, evaluated."""

    values: dict[str, Any]
    policy: Policy
    metrics: Metrics
    rate_scale: float
    violations: dict[str, float]
    feasible: bool
    cost_per_mtok: float
    replays: int = 1
    extra: dict[str, Any] = field(default_factory=dict)

    def constraints(self) -> list[float]:
        return [v if math.isfinite(v) else 1e18 for v in self.violations.values()]


class Evaluator:
    """Replays policies on one trace, hardware and model; safe to call from many threads.

    Block mappings are computed once per block size and shared: they are the expensive part
    of preparing a replay, and the numba engine itself releases the GIL.
    """

    def __init__(
        self,
        trace: Trace,
        hardware: Hardware,
        model: ModelProfile,
        base_policy: Policy,
        slo: SLO,
        *,
        load: str = "trace",
        rate_scale: float = 1.0,
        max_rate_scale: float = 64.0,
        bisect_steps: int = 6,
        engine: str = "numba",
    ) -> None:
        if load not in LOAD_MODES:
            raise InputError(f"--load must be one of {LOAD_MODES}, got {load!r}", option="--load")
        if not (math.isfinite(rate_scale) and rate_scale > 0):
            raise InputError(f"--rate-scale must be > 0, got {rate_scale}", option="--rate-scale")
        self.trace = trace
        self.hardware = hardware
        self.model = model
        self.base_policy = base_policy
        self.slo = slo
        self.load = load
        self.rate_scale = rate_scale
        self.max_rate_scale = max_rate_scale
        self.bisect_steps = bisect_steps
        self.engine = engine
        self._blocked: dict[int, BlockedTrace] = {}
        self._lock = threading.Lock()

    def blocked(self, block_tokens: int) -> BlockedTrace:
        with self._lock:
            if block_tokens not in self._blocked:
                from kvtier.trace.blocks import block_trace

                self._blocked[block_tokens] = block_trace(self.trace, block_tokens)
            return self._blocked[block_tokens]

    def replay(self, policy: Policy, rate_scale: float, *, stop_early: bool = True) -> Metrics:
        trace = self.blocked(policy.block_tokens)
        if rate_scale != 1.0:
            trace = trace.with_arrivals(trace.arrival_s / rate_scale)
        return simulate(
            trace,
            self.hardware,
            self.model,
            policy,
            engine=self.engine,
            slo=self.slo,
            stop_early=stop_early and not self.slo.is_empty(),
        )

    def _judge(
        self, values: dict[str, Any], policy: Policy, metrics: Metrics, scale: float, replays: int
    ) -> Evaluation:
        violations = slo_violations(metrics, self.slo)
        feasible = all(v <= 0 for v in violations.values())
        return Evaluation(
            values, policy, metrics, scale, violations, feasible, metrics.cost_per_mtok, replays
        )

    def evaluate_policy(
        self, policy: Policy, values: dict[str, Any] | None = None, *, full: bool = False
    ) -> Evaluation:
        """Evaluate ``policy``; ``full`` replays to the end even once the SLO is missed."""
        values = dict(values or {})
        if self.load == "trace":
            metrics = self.replay(policy, self.rate_scale, stop_early=not full)
            return self._judge(values, policy, metrics, self.rate_scale, 1)
        return self._capacity(policy, values)

    def evaluate(self, values: dict[str, Any]) -> Evaluation:
        """Evaluate the base policy with trial ``values`` overlaid."""
        return self.evaluate_policy(apply(self.base_policy, values), values)

    def _capacity(self, policy: Policy, values: dict[str, Any]) -> Evaluation:
        """Largest compression meeting the SLO: double or halve to bracket, then bisect."""
        replays = 0

        def attempt(scale: float) -> Evaluation:
            nonlocal replays
            replays += 1
            return self._judge(values, policy, self.replay(policy, scale), scale, replays)

        first = attempt(1.0)
        best: Evaluation | None = first if first.feasible else None
        lo, hi = (1.0, None) if first.feasible else (None, 1.0)
        if best is not None:
            scale = 1.0
            while scale < self.max_rate_scale:
                scale *= 2.0
                ev = attempt(scale)
                if not ev.feasible:
                    hi = scale
                    break
                lo, best = scale, ev
        else:
            scale = 1.0
            while scale > 1.0 / self.max_rate_scale:
                scale /= 2.0
                ev = attempt(scale)
                if ev.feasible:
                    lo, best = scale, ev
                    break
                hi = scale
        if best is None or lo is None:
            return replace(first, replays=replays)  # no load at all meets the SLO
        if hi is not None:
            for _ in range(self.bisect_steps):
                mid = math.sqrt(lo * hi)
                ev = attempt(mid)
                if ev.feasible:
                    lo, best = mid, ev
                else:
                    hi = mid
        return replace(best, replays=replays)
