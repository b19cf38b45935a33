"""The optimizer's objective: cost per 1M tokens of a policy, or its energy per token
(``objective = "energy"``: joules per served token, :mod:`kvtier.sim.energy`), under SLO
constraints.

Two load modes (docs/design.md section 5):

* ``trace``: the trace is served as recorded (arrivals divided by ``rate_scale``); the
  policy's cost per token at that load is the objective, the SLO a set of constraints.
* ``capacity``: for each policy, the largest time compression of the trace that still meets
  the SLO, found by doubling then bisection (geometric); cost per token is priced at that rate,
  so a policy that serves more load on the same hardware is cheaper per token.

Constraint values follow Optuna's convention: ``<= 0`` is satisfied. Each SLO term contributes
``metric - bound``; one more term is positive when a run stopped early (SLO certainly missed)
or refused requests that can never fit. The judgement is :func:`kvtier.sim.slo.violations`,
the one the metrics' ``slo_met`` and the engines' early stop use too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kvtier.hardware.types import Hardware, ModelProfile
from kvtier.policy.model import SLO, SLO_TERMS, Policy
from kvtier.scenario import LOAD_MODES, Scenario
from kvtier.search.overlay import apply
from kvtier.trace.format import Trace

if TYPE_CHECKING:  # the simulator (numba) is imported when a replay runs, not before
    from kvtier.sim.metrics import Metrics

__all__ = [
    "LOAD_MODES",
    "OBJECTIVES",
    "SLO_TERMS",
    "Evaluation",
    "Evaluator",
    "binding_term",
]

# What a study minimises: the metric each ``--objective`` names (lower is better).
OBJECTIVES = {"cost": "cost_per_mtok", "energy": "joules_per_token"}


def objective_metric(objective: str) -> str:
    """The metric ``objective`` minimises (:data:`OBJECTIVES`)."""
    return OBJECTIVES[objective]


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
    objective: str = "cost"  # a key of OBJECTIVES: what the study minimises

    @property
    def objective_value(self) -> float:
        """The minimised metric (infinite when the replay did not give it)."""
        value = getattr(self.metrics, OBJECTIVES[self.objective])
        return math.inf if value is None else float(value)

    def constraints(self) -> list[float]:
        return [v if math.isfinite(v) else 1e18 for v in self.violations.values()]


class Evaluator:
    """Evaluates policies in one :class:`Scenario`; safe to call from many threads.

    The scenario owns the trace's block mappings (computed once per block size and tenant
    sharing, shared between threads) and the load; this adds the judgement against the SLO
    and, in ``capacity`` mode, the search for the largest load that meets it.
    """

    def __init__(
        self,
        scenario: Scenario,
        *,
        max_rate_scale: float = 64.0,
        bisect_steps: int = 6,
        objective: str = "cost",
    ) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
        self.objective = objective
        slo = scenario.slo_for(scenario.policy) or SLO()
        self.scenario = scenario if scenario.slo == slo else replace(scenario, slo=slo)
        self.slo = slo
        self.max_rate_scale = max_rate_scale
        self.bisect_steps = bisect_steps

    @property
    def trace(self) -> Trace:
        return self.scenario.trace

    @property
    def hardware(self) -> Hardware:
        return self.scenario.hardware

    @property
    def model(self) -> ModelProfile:
        return self.scenario.model

    @property
    def base_policy(self) -> Policy:
        return self.scenario.policy

    @property
    def load(self) -> str:
        return self.scenario.load

    @property
    def rate_scale(self) -> float:
        return self.scenario.rate_scale

    def at_step_scale(self, factor: float) -> Evaluator:
        """This evaluator on the same trace, load and SLO, its hardware's engine steps
        ``factor`` times as long (:meth:`kvtier.scenario.Scenario.at_step_scale`)."""
        return Evaluator(
            self.scenario.at_step_scale(factor),
            max_rate_scale=self.max_rate_scale,
            bisect_steps=self.bisect_steps,
            objective=self.objective,
        )

    def replay(self, policy: Policy, rate_scale: float, *, stop_early: bool = True) -> Metrics:
        """``policy`` replayed at ``rate_scale``, judged by the evaluator's SLO."""
        return self.scenario.replay(policy, rate_scale=rate_scale, stop_early=stop_early).metrics

    def _judge(
        self, values: dict[str, Any], policy: Policy, metrics: Metrics, scale: float, replays: int
    ) -> Evaluation:
        from kvtier.sim.slo import violations as slo_violations

        violations = slo_violations(metrics, self.slo)
        feasible = all(v <= 0 for v in violations.values())
        return Evaluation(
            values,
            policy,
            metrics,
            scale,
            violations,
            feasible,
            metrics.cost_per_mtok,
            replays,
            objective=self.objective,
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
