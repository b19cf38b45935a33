"""Architecture what-if: one policy replayed with its memory tiers changed, one change at a time.

A search answers "which policy"; the sizing question behind it is whether each memory tier pays
for itself and what another one would add (Beluga's CXL pool cut TTFT sharply when prefixes
were reused and hardly at all on a cold cache). This takes a policy (a study's best) with the
study's trace, hardware, model, SLO and load mode, and evaluates:

* the policy as found;
* without each of its lower tiers, and with none of them (HBM only);
* each lower tier at half and at twice its capacity;
* with each tier the hardware offers that the policy leaves out (its profile capacity, LRU);
* with a step-time margin ``m`` (``kvtier report --what-if --step-time-margin``), the policy as
  found with every engine step ``1 - m`` and ``1 + m`` times as long
  (:func:`kvtier.sim.steptime.calibrated.with_step_scale`): whether the winner's cost and SLO
  hold when the cluster's steps are a little faster or slower than the model's.

Every variant is evaluated as the study evaluated its trials, but replayed to the end (no early
stop), so cost per token, latency and hits compare like with like. Capacities above the
hardware profile's are hypothetical purchases, priced at the profile's price per GB-hour.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from kvtier.errors import InputError
from kvtier.hardware.types import Hardware
from kvtier.policy.model import LOWER_TIERS, TIER_NAMES, Policy, TierPolicy
from kvtier.search.objective import Evaluation, Evaluator
from kvtier.sim.tiers import GB


@dataclass(frozen=True)
class Variant:
    """A policy with one change to its tiers, and a label that says which."""

    label: str
    policy: Policy


@dataclass(frozen=True)
class WhatIfRow:
    """One variant evaluated, or why it could not be.

    ``cost_change`` is the change in cost per token against the first row (the policy as
    found), when both have a positive, finite cost.
    """

    label: str
    evaluation: Evaluation | None = None
    error: str | None = None
    cost_change: float | None = None
    # the policy as found on steps this many times as long (None: a tier variant)
    step_factor: float | None = None


@dataclass(frozen=True)
class StudyWhatIf:
    """The what-if of a study's best trial (or of the closest one, when none meets the SLO)."""

    trial: int
    trial_meets_slo: bool
    trace: str
    load: str
    rows: list[WhatIfRow]
    refined: bool = False  # the policy is the best trial as optimize's refine left it


def _capacity_text(gb: float, per_host: bool) -> str:
    return f"{gb:,.0f} GB{'/host' if per_host else ''}"


def _with_tiers(policy: Policy, tiers: list[TierPolicy]) -> Policy:
    """``policy`` with these tiers, HBM first and the rest in lookup order."""
    return replace(policy, tiers=tuple(sorted(tiers, key=lambda t: TIER_NAMES.index(t.name))))


def tier_variants(policy: Policy, hardware: Hardware) -> list[Variant]:
    """The variants evaluated, in the order shown (see the module docstring)."""
    out = [Variant("as found", policy)]
    lower = policy.lower_tiers
    for t in lower:
        kept = [x for x in policy.tiers if x.name != t.name]
        out.append(Variant(f"without {t.name}", _with_tiers(policy, kept)))
    if len(lower) > 1:
        out.append(Variant("hbm only", _with_tiers(policy, [policy.tiers[0]])))
    for t in lower:
        hw = hardware.tiers.get(t.name)
        if hw is None:  # the as-found row reports it
            continue
        gb = t.capacity_gb if t.capacity_gb is not None else hw.capacity_bytes / GB
        for factor in (0.5, 2.0):
            resized = replace(t, capacity_gb=gb * factor)
            tiers = [resized if x.name == t.name else x for x in policy.tiers]
            label = f"{t.name} x{factor:g} ({_capacity_text(gb * factor, hw.per_host)})"
            out.append(Variant(label, _with_tiers(policy, tiers)))
    for name in LOWER_TIERS:
        hw = hardware.tiers.get(name)
        if hw is None or policy.tier(name) is not None:
            continue
        added = [*policy.tiers, TierPolicy(name=name)]
        label = f"with {name} ({_capacity_text(hw.capacity_bytes / GB, hw.per_host)})"
        out.append(Variant(label, _with_tiers(policy, added)))
    return out


def _cost_change(ev: Evaluation, base: Evaluation | None) -> float | None:
    if base is None or not (base.cost_per_mtok > 0 and math.isfinite(base.cost_per_mtok)):
        return None
    return ev.cost_per_mtok / base.cost_per_mtok - 1.0


def step_label(factor: float) -> str:
    """The label of the row with every engine step ``factor`` times as long."""
    return f"every step {factor:g}x as long"


def run_what_if(
    policy: Policy,
    evaluator: Evaluator,
    *,
    on_variant: Callable[[int, int, str], None] | None = None,
    step_margin: float = 0.0,
) -> list[WhatIfRow]:
    """Evaluate every variant of ``policy`` with ``evaluator`` (replayed to the end), and with
    ``step_margin`` > 0 the policy on steps ``1 -/+ step_margin`` times as long.

    A variant the hardware cannot run (a tier too small to hold one block) becomes a row with
    its reason; ``on_variant(k, n, label)`` is called before each one, for progress.
    """
    variants: list[tuple[str, Policy, Evaluator, float | None]] = [
        (v.label, v.policy, evaluator, None) for v in tier_variants(policy, evaluator.hardware)
    ]
    if step_margin > 0:
        for f in (1.0 - step_margin, 1.0 + step_margin):
            variants.append((step_label(f), policy, evaluator.at_step_scale(f), f))
    rows: list[WhatIfRow] = []
    for k, (label, pol, ev, factor) in enumerate(variants):
        if on_variant is not None:
            on_variant(k, len(variants), label)
        try:
            rows.append(WhatIfRow(label, ev.evaluate_policy(pol, full=True), step_factor=factor))
        except InputError as err:
            rows.append(WhatIfRow(label, error=err.message, step_factor=factor))
    base = rows[0].evaluation if rows else None
    return [
        replace(r, cost_change=_cost_change(r.evaluation, base)) if r.evaluation else r
        for r in rows
    ]


def study_best_on_its_trace(study: Any, trace_path: str | None) -> tuple[Any, Any, str, Policy]:
    """The setup a study recorded, its best trial (the closest when none meets the SLO), the
    trace path (``trace_path`` when the file has moved; it must hold the same trace, by its
    SHA-256) and the trial's policy: what replaying a study's winner starts from."""
    from kvtier.policy.model import policy_from_dict
    from kvtier.search.setup import StudySetup, check_study_trace, slo_to_dict, trace_sha256
    from kvtier.search.study import best_feasible, closest

    setup = StudySetup.from_study(study)
    best = best_feasible(study) or closest(study, slo_to_dict(setup.slo))
    if best is None:
        raise InputError(f"study {study.study_name!r} has no finished trial", option="--study")
    path = trace_path or setup.trace
    digest = trace_sha256(
        path,
        unreadable=f"the study's trace {path!r} cannot be read; pass --trace with its new path",
        option="--trace",
    )
    check_study_trace(
        study,
        digest,
        mismatch=f"{path} is not the trace study {study.study_name!r} ran on (sha256 {{sha}})",
        option="--trace",
    )
    policy = policy_from_dict(best.policy, f"trial {best.number} of {study.study_name}")
    return setup, best, path, policy


def what_if_for_study(
    study: Any,
    *,
    trace_path: str | None = None,
    on_variant: Callable[[int, int, str], None] | None = None,
    step_margin: float = 0.0,
) -> StudyWhatIf:
    """The what-if of a study's best policy (or, when none meets the SLO, the closest trial's).

    Uses the setup the study recorded (trace, hardware, model, SLO, load mode); ``trace_path``
    replaces the recorded trace path when the file has moved, and must hold the same trace.
    """
    from kvtier.policy.model import policy_from_dict
    from kvtier.search.refine import stored_refine

    setup, best, path, policy = study_best_on_its_trace(study, trace_path)
    stored = stored_refine(study, best.number) if best.feasible else None
    if stored is not None:  # the winner as optimize refined and wrote it
        policy = policy_from_dict(stored.policy, f"refined trial {best.number}")
    evaluator = Evaluator(setup.scenario(policy, trace_path=path))
    rows = run_what_if(policy, evaluator, on_variant=on_variant, step_margin=step_margin)
    refined = stored is not None
    return StudyWhatIf(best.number, best.feasible, path, evaluator.load, rows, refined)
