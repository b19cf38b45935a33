"""What tiering buys: the cheapest policy meeting the SLO with lower tiers, and without.

The search's winner may or may not use a tier below HBM; either way the user's question is
what the other answer costs. The HBM-only answer is the cheaper of (a) the best HBM-only
trial of the study and (b) the winner with every lower tier switched off and the fewest
instances that meet the SLO, found by bisection on the instance count (more instances never
make the SLO harder to meet in the model, so feasibility is monotone in it). The tiered answer
is the best trial that uses a lower tier.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvtier.errors import InputError
from kvtier.hardware.types import LOWER_TIERS
from kvtier.search.objective import Evaluation, Evaluator
from kvtier.search.run import Choice
from kvtier.search.study import TrialSummary


def lower_tiers(policy: dict[str, Any]) -> dict[str, float]:
    """A policy dict's tiers below HBM and their capacities (GB; 0: the profile's size)."""
    return {
        t["name"]: float(t.get("capacity_gb") or 0.0)
        for t in policy.get("tiers", [])
        if t.get("name") != "hbm"
    }


def gpus_of(metrics: dict[str, Any], policy: dict[str, Any], default_tp: int) -> int:
    tp = policy.get("serving", {}).get("tp") or default_tp
    return int(metrics.get("instances", 0)) * int(tp)


def choice_of_trial(s: TrialSummary, default_tp: int) -> Choice:
    return Choice(
        label=f"trial {s.number}",
        cost_per_mtok=float(s.metrics["cost_per_mtok"]),
        cost_per_hour=float(s.metrics["cost_per_hour"]),
        gpus=gpus_of(s.metrics, s.policy, default_tp),
        tiers=lower_tiers(s.policy),
        ttft_p99_s=float(s.metrics["ttft_p99_s"]),
        params=dict(s.params),
    )


def _choice_of_eval(ev: Evaluation, label: str, default_tp: int) -> Choice:
    from kvtier.policy.model import policy_to_dict

    m = ev.metrics.to_dict()
    policy = policy_to_dict(ev.policy)
    return Choice(
        label=label,
        cost_per_mtok=float(ev.cost_per_mtok),
        cost_per_hour=float(m["cost_per_hour"]),
        gpus=gpus_of(m, policy, default_tp),
        tiers=lower_tiers(policy),
        ttft_p99_s=float(m["ttft_p99_s"]),
        params=dict(ev.values),
    )


def hbm_only_values(values: dict[str, Any]) -> dict[str, Any]:
    """Trial values with every lower tier switched off (their sizes and evictions dropped)."""
    out = {
        k: v for k, v in values.items() if not k.startswith("tiers.") or k.startswith("tiers.hbm")
    }
    out.update({f"tiers.{t}.enabled": False for t in LOWER_TIERS})
    return out


def sweep_instances(
    evaluator: Evaluator, values: dict[str, Any], most: int, label: str, default_tp: int
) -> Choice | None:
    """The fewest instances (1..``most``) at which ``values`` meets the SLO, by bisection."""

    def run(n: int) -> Evaluation | None:
        try:
            return evaluator.evaluate({**values, "serving.instances": n})
        except InputError:
            return None

    top = run(most)
    if top is None or not top.feasible:
        return None
    lo, hi, best = 0, most, top  # lo fails (0 instances serve nothing), hi meets
    while hi - lo > 1:
        mid = (lo + hi) // 2
        ev = run(mid)
        if ev is not None and ev.feasible:
            hi, best = mid, ev
        else:
            lo = mid
    return _choice_of_eval(best, label, default_tp)


def compare_tiering(
    evaluator: Evaluator,
    trials: Iterable[TrialSummary],
    best: TrialSummary | None,
    most_instances: int,
    default_tp: int,
    *,
    hardware_has_tiers: bool,
) -> tuple[Choice | None, Choice | None]:
    """(cheapest tiered policy, cheapest HBM-only policy) meeting the SLO, either None."""
    feasible = [s for s in trials if s.feasible]
    tiered = [s for s in feasible if lower_tiers(s.policy)]
    flat = [s for s in feasible if not lower_tiers(s.policy)]
    key = lambda s: (s.metrics["cost_per_mtok"], s.number)  # noqa: E731
    best_tiered = choice_of_trial(min(tiered, key=key), default_tp) if tiered else None
    candidates = [choice_of_trial(min(flat, key=key), default_tp)] if flat else []
    if best is not None and hardware_has_tiers:
        swept = sweep_instances(
            evaluator,
            hbm_only_values(best.params),
            most_instances,
            f"trial {best.number} without lower tiers",
            default_tp,
        )
        if swept is not None:
            candidates.append(swept)
    hbm = min(candidates, key=lambda c: c.cost_per_mtok) if candidates else None
    return best_tiered, hbm
