"""``kvtier compare``: several policies replayed on one trace, side by side.

The quick what-if before a search: vLLM alone against an LMCache CPU tier, a CXL pool or an
RDMA pool, or two exported policies against each other; with ``what_if``, each policy also
without each of its lower tiers, with each halved and doubled, and with each tier its hardware
offers that it leaves out. Every policy is replayed to the end on the same trace (no early
stop), each on its own hardware and model profile unless one is given for all, so cost per
token compares whole systems.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kvtier.deploy.sample import sample_bias
from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import SLO, Policy, load_policy
from kvtier.scenario import (
    BlockCache,
    Scenario,
    check_rate_scale,
    hardware_name,
    model_name,
)
from kvtier.sim.steptime.calibrated import check_step_margin

if TYPE_CHECKING:
    from kvtier.sim.metrics import Metrics


@dataclass
class Compared:
    """One policy's row: its label, where it ran, and its metrics or why it could not run."""

    label: str
    hardware: str
    model: str
    block_tokens: int
    metrics: Metrics | None = None
    error: str | None = None
    variant_of: str | None = None  # with what_if: the policy this row changes
    tiers: tuple = ()  # per lower tier: what the replay shows (kvtier.sim.tier_stats)
    # on a sampled trace: which way its hit ratios are biased (kvtier.deploy.sample.sample_bias)
    sample_bias: str | None = None
    # with a step-time margin m: the metrics with every step (1 - m) and (1 + m) times as long
    faster: Metrics | None = None
    slower: Metrics | None = None
    step_margin: float = 0.0


def load_compared(kind: str, name: str, overrides: Mapping[str, Any] | None = None) -> Policy:
    """A ``preset`` or ``policy`` file by name, with ``overrides`` (``--set``) applied."""
    from kvtier.policy.presets import load_preset

    policy = load_preset(name) if kind == "preset" else load_policy(name)
    if overrides:
        from kvtier.policy.overrides import apply_overrides

        policy = apply_overrides(policy, dict(overrides), "--set")
    return policy


def compare_policies(
    trace_path: str,
    policies: list[tuple[str, str]],
    *,
    hardware: str | None = None,
    model: str | None = None,
    slo: SLO | None = None,
    rate_scale: float = 1.0,
    engine: str = "numba",
    what_if: bool = False,
    overrides: Mapping[str, Any] | None = None,
    prices: str | None = None,
    track_tbt: bool = False,
    step_margin: float = 0.0,
) -> list[Compared]:
    """Replay each ``(kind, name)`` (kind ``preset`` or ``policy`` file) on the trace.

    A preset that needs a tier the chosen hardware lacks becomes a row with its reason rather
    than stopping the comparison; a policy file the user named that cannot be read is an error.
    With ``what_if``, each policy is followed by its tier variants
    (:func:`kvtier.experiments.whatif.tier_variants`), labelled ``NAME: VARIANT``. Every
    scenario shares one cache of the trace's block mappings. ``prices`` (a ``--prices`` file)
    prices every row's hardware, so the rows stay on one basis. ``track_tbt`` records token
    intervals in every replay (TBT p50 / p99), as a row whose SLO bounds ``tbt_p99_s`` does.
    ``step_margin`` ``m`` > 0 replays every row twice more, with each engine step ``1 - m`` and
    ``1 + m`` times as long (:func:`kvtier.sim.steptime.calibrated.with_step_scale`): a verdict
    that changes within the margin turns on step-time accuracy the model cannot promise
    (docs/validation-offload.md, "How much a step-time gap explains").
    """
    from kvtier.experiments.whatif import tier_variants
    from kvtier.trace.io import read_trace

    check_rate_scale(rate_scale)  # once for every row, before the trace is read
    check_step_margin(step_margin)
    from kvtier.hardware.prices import apply_prices, load_prices

    user_prices = load_prices(prices) if prices is not None else None  # a bad file stops here
    blocks = BlockCache(read_trace(trace_path))
    rows: list[Compared] = []
    for kind, name in policies:
        policy = load_compared(kind, name, overrides)
        if slo is not None:
            policy = replace(policy, slo=slo)
        hw_name, mdl_name = hardware_name(hardware, policy), model_name(model, policy)
        try:
            hw = load_hardware(hw_name)
            if user_prices is not None:
                hw = apply_prices(hw, user_prices)
            scenario = Scenario(
                blocks.trace,
                hw,
                load_model(mdl_name),
                policy,
                rate_scale=rate_scale,
                engine=engine,
                blocks=blocks,
            )
        except InputError as err:
            if kind == "policy":
                raise err.with_path(name) from None
            rows.append(Compared(name, hw_name, mdl_name, policy.block_tokens, error=err.message))
            continue
        variants = tier_variants(policy, scenario.hardware) if what_if else []
        labelled = [(name, policy, None)]
        labelled += [(f"{name}: {v.label}", v.policy, name) for v in variants[1:]]
        for label, pol, variant_of in labelled:
            row = Compared(label, hw_name, mdl_name, pol.block_tokens, variant_of=variant_of)
            row.sample_bias = sample_bias(pol, scenario.hardware, blocks.trace.sample_fraction)
            rows.append(row)
            try:
                replayed = scenario.replay(pol, track_tbt=track_tbt)
                row.metrics, row.tiers = replayed.metrics, tuple(replayed.tiers)
                if step_margin > 0:
                    row.step_margin = step_margin
                    row.faster, row.slower = (
                        scenario.at_step_scale(f).replay(pol, track_tbt=track_tbt).metrics
                        for f in (1.0 - step_margin, 1.0 + step_margin)
                    )
            except InputError as err:
                if kind == "policy" and variant_of is None:
                    raise err.with_path(name) from None
                row.error = err.message
    return rows
