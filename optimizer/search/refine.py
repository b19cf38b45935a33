"""The refine stage: from the search's winner, shrink what costs money while the SLO holds.

A sampler proposes capacities and instance counts; nothing makes it take the smallest that
still meets the SLO, so a winner may buy a tier twice the size it needs (a 7,901 GB CXL pool
where 3,950 GB met the SLO at the same latency). This stage starts from the winner's policy
and, with replays on the study's trace, hardware, model, SLO and load mode:

1. bisects the instance count down (one instance at a time at the end: ``tp`` GPUs, the
   fewest GPUs a policy of this shape can drop);
2. for each lower tier the policy uses, tries the policy without it, then halves its
   capacity while the SLO holds and bisects on a log scale between the last size that failed
   and the last that held, until the step left is under 10%;
3. checks the **certificate**: every single step to a cheaper neighbour (each lower tier's
   capacity -10%, each lower tier removed, one instance fewer) misses the SLO or costs more
   per token. A neighbour that meets the SLO for less becomes the policy, steps 1 and 2 run
   again from it, and so does the check (at most :data:`MAX_ROUNDS` times; the report says
   when the certificate still fails);
4. replays each lower tier of the result at a few multiples of its capacity: the
   cost-vs-capacity curve a buyer reads the knee from.

A step is taken only when the SLO holds and the cost per token falls. The result is plain
data (:meth:`Refined.to_attrs`), stored in the study's user attributes so ``kvtier report``
shows it and ``report --what-if`` starts from it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvtier.errors import InputError
from kvtier.policy.model import TIER_NAMES, Policy, TierPolicy, policy_from_dict, policy_to_dict
from kvtier.search.objective import Evaluation, Evaluator

REFINE_ATTR = "kvtier_refine"  # the study's user attribute holding the last refine
STEP = 0.9  # a neighbour's capacity: 10% less
MIN_GB = 0.01  # a capacity is not halved below this
MAX_ROUNDS = 8  # neighbour moves before the certificate is given up as not holding
CURVE_FACTORS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5, 2.0)
# a cost is lower only by more than this share (replays of equal cost differ in the last bits)
COST_EPS = 1e-9


@dataclass(frozen=True)
class Point:
    """One replayed policy of the refine: what changed, what it costs, whether it meets the SLO.

    ``reason`` says why a neighbour was not taken (``misses ttft_p99_s by 0.31 s``, ``costs
    more``, or why it cannot run); empty for one that was."""

    label: str
    instances: int
    capacity_gb: float | None  # the tier's capacity, on a curve or a capacity step
    cost_per_mtok: float
    cost_per_hour: float
    ttft_p99_s: float
    feasible: bool
    reason: str = ""


@dataclass(frozen=True)
class Refined:
    """The refine of one winner (see the module docstring)."""

    from_trial: int
    start_cost_per_mtok: float
    policy: dict[str, Any]  # the refined policy, as a policy file holds it
    metrics: dict[str, Any]
    violations: dict[str, float]
    changes: list[str]  # "dram 1,260 -> 630 GB/host", "instances 8 -> 7"
    certificate: list[Point]  # each cheaper neighbour of the result, and why it was not taken
    holds: bool  # every neighbour misses the SLO or costs more
    curves: dict[str, list[Point]] = field(default_factory=dict)  # tier -> cost vs capacity
    replays: int = 0
    # the load the refined policy's metrics were replayed at: in ``capacity`` mode its own
    # bisection's, which need not be the trial's (None: a study written before it was kept)
    rate_scale: float | None = None

    @property
    def cost_per_mtok(self) -> float:
        return float(self.metrics.get("cost_per_mtok", math.inf))

    @property
    def saving(self) -> float:
        """The share of the winner's cost per token the refine saved."""
        start = self.start_cost_per_mtok
        return 1 - self.cost_per_mtok / start if start > 0 and math.isfinite(start) else 0.0

    def to_attrs(self) -> dict[str, Any]:
        """As a study user attribute (JSON: infinities as None)."""
        return _finite(asdict(self))

    @classmethod
    def from_attrs(cls, data: dict[str, Any]) -> Refined:
        def points(rows: list[dict[str, Any]]) -> list[Point]:
            return [Point(**_infinite(r)) for r in rows]

        return cls(
            from_trial=int(data["from_trial"]),
            start_cost_per_mtok=_num(data["start_cost_per_mtok"]),
            policy=data["policy"],
            metrics=data["metrics"],
            violations={k: _num(v) for k, v in data["violations"].items()},
            changes=list(data["changes"]),
            certificate=points(data["certificate"]),
            holds=bool(data["holds"]),
            curves={k: points(v) for k, v in data.get("curves", {}).items()},
            replays=int(data.get("replays", 0)),
            rate_scale=None if data.get("rate_scale") is None else float(data["rate_scale"]),
        )


def _num(value: Any) -> float:
    return math.inf if value is None else float(value)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _infinite(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for key in ("cost_per_mtok", "cost_per_hour", "ttft_p99_s"):
        out[key] = _num(out[key])
    return out


def capacity_gb(policy: Policy, tier: TierPolicy, evaluator: Evaluator) -> float:
    """A lower tier's capacity as the policy states it, or the hardware profile's."""
    if tier.capacity_gb is not None:
        return float(tier.capacity_gb)
    from kvtier.sim.tiers import GB

    return evaluator.hardware.tiers[tier.name].capacity_bytes / GB


def _per_host(evaluator: Evaluator, tier: str) -> str:
    hw = evaluator.hardware.tiers.get(tier)
    return "/host" if hw is not None and hw.per_host else ""


def _with_capacity(policy: Policy, name: str, gb: float) -> Policy:
    tiers = tuple(replace(t, capacity_gb=gb) if t.name == name else t for t in policy.tiers)
    return replace(policy, tiers=tiers)


def _without(policy: Policy, name: str) -> Policy:
    kept = sorted(
        (t for t in policy.tiers if t.name != name), key=lambda t: TIER_NAMES.index(t.name)
    )
    return replace(policy, tiers=tuple(kept))


def _gb(value: float) -> float:
    """A capacity as a step proposes it: three significant figures, at least 0.001 GB."""
    if value <= 0:
        return 0.001
    digits = 2 - int(math.floor(math.log10(value)))
    return max(round(value, digits), 0.001)


def instance_count(policy: Policy, evaluation: Evaluation, fraction: float) -> int:
    """The deployment's instance count: the policy's, or what its replay ran (a sample's
    replay runs ``fraction`` of it)."""
    if policy.serving.instances is not None:
        return int(policy.serving.instances)
    ran = int(evaluation.metrics.instances or 0)
    return max(1, round(ran / fraction)) if fraction else ran


def _miss(ev: Evaluation) -> str:
    parts = [
        f"{k} by {v:.3g}" + ("" if k == "completion" else " s")
        for k, v in ev.violations.items()
        if v > 0
    ]
    return "misses " + ", ".join(parts) if parts else "misses the SLO"


class _Replays:
    """Evaluations of policies, each replayed once (keyed by the policy file's content)."""

    def __init__(self, evaluator: Evaluator, *, full: bool = False) -> None:
        self.evaluator = evaluator
        self.full = full  # replayed to the end even once the SLO is missed
        self.seen: dict[str, Evaluation | str] = {}

    def __call__(self, policy: Policy) -> Evaluation | str:
        key = repr(sorted(_flat(policy_to_dict(policy)).items()))
        if key not in self.seen:
            try:
                self.seen[key] = self.evaluator.evaluate_policy(policy, full=self.full)
            except (InputError, ValueError) as err:
                self.seen[key] = getattr(err, "message", str(err))
        return self.seen[key]

    @property
    def count(self) -> int:
        return len(self.seen)


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    if isinstance(value, list):
        return {f"{prefix}{i}": repr(v) for i, v in enumerate(value)}
    return {prefix: value}


def _cheaper(ev: Evaluation | str, than: float) -> bool:
    return (
        isinstance(ev, Evaluation)
        and ev.feasible
        and ev.cost_per_mtok < than * (1 - COST_EPS)
        and math.isfinite(ev.cost_per_mtok)
    )


def _point(
    label: str, policy: Policy, ev: Evaluation | str, than: float, gb: float | None
) -> Point:
    n = int(policy.serving.instances or 0)
    if isinstance(ev, str):
        return Point(label, n, gb, math.inf, math.inf, math.inf, False, ev)
    cost = ev.cost_per_mtok if ev.feasible else math.inf
    if not ev.feasible:
        reason = _miss(ev)
    elif not _cheaper(ev, than):
        reason = "costs more"
    else:
        reason = ""
    m = ev.metrics
    return Point(label, n, gb, cost, m.cost_per_hour, m.ttft_p99_s, ev.feasible, reason)


def _gpus_label(label: str, ev: Evaluation | str, here: Evaluation) -> str:
    """A fewer-instances step's label with the GPUs it drops (as the replays placed them)."""
    if "fewer" not in label or not isinstance(ev, Evaluation):
        return label
    dropped = int(here.metrics.gpus or 0) - int(ev.metrics.gpus or 0)
    return f"{label} ({dropped} GPU{'s' if dropped != 1 else ''})" if dropped > 0 else label


def free_to(fixed: Collection[str], what: str, tier: str = "") -> bool:
    """Whether the refine may change ``what`` (``instances``, ``capacity`` or ``remove`` of
    ``tier``): not when the user pinned it (``fixed``: the space's pinned keys)."""
    if what == "instances":
        return "serving.instances" not in fixed
    if what == "capacity":
        return f"tiers.{tier}.capacity_gb" not in fixed
    return f"tiers.{tier}.enabled" not in fixed


def neighbours(
    policy: Policy, evaluator: Evaluator, step: int = 1, fixed: Collection[str] = ()
) -> list[tuple[str, Policy, float | None]]:
    """The single steps to a cheaper policy: each lower tier's capacity -10%, each lower tier
    removed, ``step`` instances fewer, each unless pinned (``fixed``); as ``(label, policy,
    capacity)``."""
    out: list[tuple[str, Policy, float | None]] = []
    for tier in policy.lower_tiers:
        gb = capacity_gb(policy, tier, evaluator)
        less = gb * STEP
        unit = _per_host(evaluator, tier.name)
        label = f"{tier.name} -10% ({less:,.4g} GB{unit})"
        if free_to(fixed, "capacity", tier.name):
            out.append((label, _with_capacity(policy, tier.name, less), less))
        if free_to(fixed, "remove", tier.name):
            out.append((f"without {tier.name}", _without(policy, tier.name), None))
    n = policy.serving.instances
    if n is not None and n - step >= 1 and free_to(fixed, "instances"):
        fewer = f"{step} instance{'s' if step > 1 else ''} fewer"
        out.append(
            (fewer, replace(policy, serving=replace(policy.serving, instances=n - step)), None)
        )
    return out


def refine(
    policy: Policy,
    evaluator: Evaluator,
    *,
    from_trial: int,
    fraction: float = 1.0,
    fixed: Collection[str] = (),
    curves: bool = True,
    on_step: Callable[[str], None] | None = None,
) -> Refined | None:
    """Refine ``policy`` (the search's winner; see the module docstring), leaving what the
    user pinned (``fixed``: dotted keys, :func:`free_to`) as it is. None when the winner does
    not meet the SLO when replayed again (nothing to refine from)."""
    from kvtier.trace.sample_correction import sample_instance_step

    replays = _Replays(evaluator)
    start = replays(policy)
    if not isinstance(start, Evaluation) or not start.feasible:
        return None
    step = sample_instance_step(fraction) if fraction != 1.0 else 1
    n0 = instance_count(policy, start, fraction)
    cur = replace(policy, serving=replace(policy.serving, instances=n0))
    cur_ev = replays(cur)
    if not isinstance(cur_ev, Evaluation) or not cur_ev.feasible:
        cur, cur_ev = policy, start
    say = on_step or (lambda _text: None)

    def take(candidate: Policy) -> bool:
        nonlocal cur, cur_ev
        ev = replays(candidate)
        if _cheaper(ev, cur_ev.cost_per_mtok):
            assert isinstance(ev, Evaluation)
            cur, cur_ev = candidate, ev
            return True
        return False

    def shrink() -> None:
        # 1. the instance count, bisected in steps of ``step`` (a sample's whole instances)
        if cur.serving.instances is not None and free_to(fixed, "instances"):
            say("refine: instances")
            lo, hi = 0, int(cur.serving.instances) // step
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if take(replace(cur, serving=replace(cur.serving, instances=mid * step))):
                    hi = mid
                else:
                    lo = mid
        # 2. each lower tier: removed, else its capacity halved while the SLO holds, then
        # bisected on a log scale until the step left is under 10%
        for tier in cur.lower_tiers:
            say(f"refine: {tier.name}")
            if free_to(fixed, "remove", tier.name) and take(_without(cur, tier.name)):
                continue
            if not free_to(fixed, "capacity", tier.name):
                continue
            hi_gb = capacity_gb(cur, tier, evaluator)
            lo_gb = 0.0
            while hi_gb > MIN_GB:
                half = _gb(hi_gb / 2)
                if not take(_with_capacity(cur, tier.name, half)):
                    lo_gb = half
                    break
                hi_gb = half
            while lo_gb and lo_gb < hi_gb * STEP:
                mid = _gb(math.sqrt(lo_gb * hi_gb))
                if not lo_gb < mid < hi_gb:
                    break
                if take(_with_capacity(cur, tier.name, mid)):
                    hi_gb = mid
                else:
                    lo_gb = mid

    # 3. the certificate: no single step to a cheaper neighbour meets the SLO for less; a
    # neighbour that does becomes the policy, and the shrinking runs again from it
    holds = False
    certificate: list[Point] = []
    evaluated: list[tuple[str, Policy, float | None, Evaluation | str]] = []
    for _ in range(MAX_ROUNDS):
        shrink()
        say("refine: certificate")
        evaluated = [
            (label, p, gb, replays(p)) for label, p, gb in neighbours(cur, evaluator, step, fixed)
        ]
        certificate = [
            _point(_gpus_label(label, ev, cur_ev), p, ev, cur_ev.cost_per_mtok, gb)
            for label, p, gb, ev in evaluated
        ]
        better = [(ev, p) for _, p, _, ev in evaluated if _cheaper(ev, cur_ev.cost_per_mtok)]
        if not better:
            holds = True
            break
        ev, p = min(better, key=lambda b: b[0].cost_per_mtok)  # type: ignore[union-attr]
        assert isinstance(ev, Evaluation)
        cur, cur_ev = p, ev
    # What is shown is replayed to the end: a replay the early stop cut short has the
    # latencies of the requests it reached (the verdicts stay: it stops only once the SLO is
    # certainly missed)
    whole = _Replays(evaluator, full=True)

    def shown(p: Policy, ev: Evaluation | str) -> Evaluation | str:
        return whole(p) if isinstance(ev, Evaluation) and ev.metrics.early_stopped else ev

    if holds:
        certificate = [
            _point(_gpus_label(label, ev, cur_ev), p, shown(p, ev), cur_ev.cost_per_mtok, gb)
            for label, p, gb, ev in evaluated
        ]
    # 4. the cost-vs-capacity curve of each lower tier the result uses
    tier_curves: dict[str, list[Point]] = {}
    for tier in cur.lower_tiers if curves else ():
        say(f"refine: {tier.name} curve")
        gb = capacity_gb(cur, tier, evaluator)
        rows = []
        for factor in CURVE_FACTORS:
            size = gb if factor == 1.0 else _gb(gb * factor)
            p = _with_capacity(cur, tier.name, size)
            ev = cur_ev if factor == 1.0 else shown(p, replays(p))
            point = _point(f"x{factor:g}", p, ev, math.inf, size)
            rows.append(replace(point, reason="" if point.feasible else point.reason))
        tier_curves[tier.name] = rows
    return Refined(
        from_trial=from_trial,
        start_cost_per_mtok=start.cost_per_mtok,
        policy=policy_to_dict(cur),
        metrics=cur_ev.metrics.to_dict(),
        violations=dict(cur_ev.violations),
        changes=_changes(policy, cur, evaluator, n0),
        certificate=certificate,
        holds=holds,
        curves=tier_curves,
        replays=replays.count + whole.count,
        rate_scale=cur_ev.rate_scale,
    )


def _changes(before: Policy, after: Policy, evaluator: Evaluator, n0: int) -> list[str]:
    """What the refine changed, one item each."""
    out = []
    n1 = after.serving.instances
    if n1 is not None and n1 != n0:
        out.append(f"instances {n0} -> {n1}")
    for tier in before.lower_tiers:
        unit = _per_host(evaluator, tier.name)
        was = capacity_gb(before, tier, evaluator)
        now_tier = after.tier(tier.name)
        if now_tier is None:
            out.append(f"{tier.name} {was:,.4g} GB{unit} -> removed")
            continue
        now = capacity_gb(after, now_tier, evaluator)
        if now != was:
            out.append(f"{tier.name} {was:,.4g} -> {now:,.4g} GB{unit}")
    return out


def refined_policy(refined: Refined, source: str) -> Policy:
    """The refined policy as a :class:`Policy`."""
    return policy_from_dict(refined.policy, source)


def stored_refine(study: Any, from_trial: int) -> Refined | None:
    """The study's stored refine of trial ``from_trial``, if the last one refined it."""
    data = study.user_attrs.get(REFINE_ATTR)
    if not data or int(data.get("from_trial", -1)) != from_trial:
        return None
    try:
        return Refined.from_attrs(data)
    except (KeyError, TypeError, ValueError):
        return None


def fewest_instances(
    policy: Policy, evaluator: Evaluator, start: Evaluation, fraction: float = 1.0
) -> tuple[Policy, Evaluation]:
    """``policy`` on the fewest instances that meet the SLO for less, bisected from the count
    ``start`` (its evaluation, which meets the SLO) ran; a sample's counts in whole steps
    (:func:`kvtier.trace.sample_correction.sample_instance_step`). Returns ``start``
    unchanged when no fewer instances do."""
    from kvtier.trace.sample_correction import sample_instance_step

    step = sample_instance_step(fraction) if fraction != 1.0 else 1
    n = instance_count(policy, start, fraction)
    replays = _Replays(evaluator)
    best_policy, best = replace(policy, serving=replace(policy.serving, instances=n)), start
    lo, hi = 0, n // step
    while hi - lo > 1:
        mid = (lo + hi) // 2
        candidate = replace(policy, serving=replace(policy.serving, instances=mid * step))
        ev = replays(candidate)
        if _cheaper(ev, best.cost_per_mtok):
            assert isinstance(ev, Evaluation)
            best_policy, best, hi = candidate, ev, mid
        else:
            lo = mid
    return best_policy, best
