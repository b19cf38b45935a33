"""What tiering buys: the cheapest policy meeting the SLO with lower tiers, and without.

The search's winner may or may not use a tier below HBM; either way the user's question is
what the other answer costs, and both answers get the same targeted search, so that neither
depends on whether the sampler happened to try it. The HBM-only answer is the cheaper of (a)
the best HBM-only trial of the study and (b) a tiered winner with every lower tier switched
off and the fewest instances that meet the SLO, found by bisection on the instance count (more
instances never make the SLO harder to meet in the model, so feasibility is monotone in it).
The tiered answer is the cheapest of (a) the best trial that uses a lower tier, (b) the
winner with its lower tiers replaced by one, each tier the space offers in turn at the capacity
where the trace's LRU curve reaches 99% of its unbounded hit ratio (the warm start's largest
knee, :mod:`kvtier.search.warmstart`), and (c) a tiered winner as it is, each on the fewest
instances that meet the SLO, by the same bisection. A tier can only pay by letting fewer
GPUs meet the SLO, which a sampler rarely finds by itself: the tier alone only adds its cost,
fewer instances alone miss the SLO, and only the two together are cheaper.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kvtier.errors import InputError
from kvtier.hardware.types import LOWER_TIERS
from kvtier.search.objective import Evaluation, Evaluator
from kvtier.search.run import Choice
from kvtier.search.study import TrialSummary

WITH_TIER = "with"  # label of a swept tiered answer: "trial N with dram"
WITHOUT_TIERS = "without lower tiers"  # label of the swept HBM-only answer
FEWER = "on fewest instances"  # label of a tiered winner swept with its own tiers


def lower_tiers(policy: dict[str, Any]) -> dict[str, float]:
    """A policy dict's tiers below HBM and their capacities (GB; 0: the profile's size)."""
    return {
        t["name"]: float(t.get("capacity_gb") or 0.0)
        for t in policy.get("tiers", [])
        if t.get("name") != "hbm"
    }


def gpus_of(metrics: dict[str, Any], policy: dict[str, Any], default_tp: int) -> int:
    if metrics.get("gpus"):  # the replay's own count (pools of two sizes included)
        return int(metrics["gpus"])
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


def with_tier_values(values: dict[str, Any], addition: dict[str, Any]) -> dict[str, Any]:
    """Trial values with every lower tier off but the one ``addition`` switches on.

    ``addition`` sets the tier's switch and capacity and every parameter that becomes active
    with it (an eviction choice), so the values are a complete trial the study replays exactly.
    """
    return {**hbm_only_values(values), **addition}


def sweep_instances(
    evaluator: Evaluator, values: dict[str, Any], most: int, label: str, default_tp: int
) -> Choice | None:
    """The fewest instances (1..``most``) at which ``values`` meets the SLO, by bisection.

    ``most`` counts instances of the hardware's own tensor-parallel size; a policy with a
    larger ``serving.tp`` fits fewer (the simulator clamps a larger count to them), so the
    bisection runs over the counts that exist.
    """
    tp = int(values.get("serving.tp") or default_tp)
    most = max(1, most * default_tp // tp)

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
    tier_additions: Iterable[dict[str, Any]] = (),
) -> tuple[Choice | None, Choice | None]:
    """(cheapest tiered policy, cheapest HBM-only policy) meeting the SLO, either None.

    ``tier_additions``: the values that switch one lower tier on (see the module docstring and
    :func:`kvtier.search.warmstart.tier_additions`), each tried on ``best`` in place of its
    own tiers; a tiered ``best`` is also tried as it is, on the fewest instances.
    """
    feasible = [s for s in trials if s.feasible]
    tiered = [s for s in feasible if lower_tiers(s.policy)]
    flat = [s for s in feasible if not lower_tiers(s.policy)]
    key = lambda s: (s.metrics["cost_per_mtok"], s.number)  # noqa: E731
    tiered_candidates = [choice_of_trial(min(tiered, key=key), default_tp)] if tiered else []
    if best is not None:
        tried = [(with_tier_values(best.params, a), a) for a in tier_additions]
        if lower_tiers(best.policy):  # the winner's own tiers, on the fewest instances
            tried.insert(0, (dict(best.params), {}))
        for values, addition in tried:
            tier = next((k.split(".")[1] for k in addition if k.endswith(".capacity_gb")), None)
            label = f"trial {best.number} " + (f"{WITH_TIER} {tier}" if tier else FEWER)
            swept = sweep_instances(evaluator, values, most_instances, label, default_tp)
            if swept is not None:
                tiered_candidates.append(swept)
    best_tiered = min(tiered_candidates, key=lambda c: c.cost_per_mtok, default=None)
    candidates = [choice_of_trial(min(flat, key=key), default_tp)] if flat else []
    if best is not None and hardware_has_tiers:
        swept = sweep_instances(
            evaluator,
            hbm_only_values(best.params),
            most_instances,
            f"trial {best.number} {WITHOUT_TIERS}",
            default_tp,
        )
        if swept is not None:
            candidates.append(swept)
    hbm = min(candidates, key=lambda c: c.cost_per_mtok) if candidates else None
    return best_tiered, hbm
