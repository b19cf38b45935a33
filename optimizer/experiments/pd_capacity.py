"""Effective request capacity (Mooncake FAST'25, section 5.2): a scenario of ``kvtier validate pd``.

A capacity scenario (``kind = "capacity"`` in ``policies/presets/validation/pd/``) replays one
trace at its own timestamps on every system it names (``[conditions.systems.NAME]``: a
``preset`` or kvtier's defaults, with dotted ``set`` overrides as ``kvtier replay --set``
takes them) and counts, for each TBT threshold, the share of all requests that are
*effective*: TTFT within ``ttft_s`` and TBT (the mean of the request's longest 10 % of token
intervals, ``RawResult.tbt_tail_s``) within the threshold
(:func:`kvtier.sim.metrics.effective_share`). A rejected or unfinished request is never
effective. The published value at each threshold is the paper's ratio of Mooncake's
capacity over one baseline's (``against``); the model's is the same ratio on the replays. The
curves' values read from the figure (``[figure.capacity]``) are shown beside the model's and
not checked. Nothing is calibrated on these figures. ``[figure] residual_cause`` names, in a
sentence, the cause of a residual the model leaves (printed with each missed threshold).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.errors import InputError

MOONCAKE = "mooncake"  # the system whose capacity is the ratio's numerator
SYSTEM_KEYS = ("preset", "set")


class RatioCheck:
    """A published ratio against the model's, met within a factor ``tolerance`` either way
    (the dataclasses that use it hold ``model``, ``published`` and ``tolerance``)."""

    model: float
    published: float
    tolerance: float

    @property
    def residual(self) -> float:
        """Model over published (1: reproduced)."""
        return self.model / self.published

    @property
    def met(self) -> bool:
        return 1 / self.tolerance <= self.residual <= self.tolerance


@dataclass(frozen=True)
class CapacityCheck(RatioCheck):
    """One threshold of a capacity scenario: the published ratio and the model's."""

    name: str  # scenario @ threshold
    source: str
    read: str
    threshold_ms: float
    ttft_slo_s: float
    against: str
    published: float
    tolerance: float
    model: float  # Mooncake's capacity over ``against``'s, on the replays
    capacity: dict[str, float]  # each system's effective share, the model's
    published_capacity: dict[str, float]  # read from the figure (NaN: not read)
    best_baseline: str  # the model's best baseline at this threshold
    stand_in: str
    cause: str = ""  # the scenario's named cause of a residual ([figure] residual_cause)


def _fail(name: str, msg: str) -> InputError:
    return InputError(f"P/D capacity scenario {name!r}: {msg}")


def check_scenario(name: str, data: dict[str, Any]) -> None:
    """The keys a capacity scenario needs, each checked; a bad one is a one-line error."""
    fig, cond = data.get("figure", {}), data.get("conditions", {})
    for key in ("thresholds_ms", "published", "against", "tolerance"):
        if key not in fig:
            raise _fail(name, f"[figure] lacks {key}")
    for key in ("hardware", "model", "trace", "ttft_s", "systems"):
        if key not in cond:
            raise _fail(name, f"[conditions] lacks {key}")
    thr, pub = fig["thresholds_ms"], fig["published"]
    if not isinstance(thr, list) or not isinstance(pub, list) or len(thr) != len(pub) or not thr:
        raise _fail(name, "thresholds_ms and published must be lists of one length")
    if not all(isinstance(v, int | float) and v > 0 for v in (*thr, *pub)):
        raise _fail(name, "thresholds_ms and published must be positive numbers")
    systems = cond["systems"]
    if not isinstance(systems, dict) or MOONCAKE not in systems:
        raise _fail(name, f"[conditions.systems] must name {MOONCAKE!r} and its baselines")
    if fig["against"] not in systems or fig["against"] == MOONCAKE:
        raise _fail(
            name,
            f"against = {fig['against']!r}; choose from "
            f"{', '.join(s for s in systems if s != MOONCAKE)}",
        )
    for sname, spec in systems.items():
        unknown = sorted(set(spec) - set(SYSTEM_KEYS))
        if unknown:
            raise _fail(
                name,
                f"system {sname!r}: unknown key {unknown[0]!r}; choose from "
                f"{', '.join(SYSTEM_KEYS)}",
            )
    for sname, values in fig.get("capacity", {}).items():
        if sname not in systems:
            raise _fail(name, f"[figure.capacity] names {sname!r}, not a system")
        if not isinstance(values, list) or len(values) != len(thr):
            raise _fail(name, f"[figure.capacity] {sname}: one share per threshold")


def system_policy(name: str, sname: str, spec: dict[str, Any]):  # noqa: ANN201
    """The policy of one system: its preset (or kvtier's defaults) with its overrides."""
    from kvtier.policy import Policy
    from kvtier.policy.overrides import apply_overrides
    from kvtier.policy.presets import load_preset

    base = load_preset(str(spec["preset"])) if "preset" in spec else Policy()
    sets = spec.get("set", {})
    if not isinstance(sets, dict):
        raise _fail(name, f"system {sname!r}: set must be a table of dotted keys")
    return apply_overrides(base, sets, f"{name}: systems.{sname}.set")


def replay_system(blocks, hw, md, pol):  # noqa: ANN001, ANN201
    """One replay of the trace at its own timestamps, with each request's TBT tail; ``blocks``
    (:class:`kvtier.scenario.BlockCache`) maps the trace once per block size."""
    from kvtier.sim import build_config, simulate_raw

    trace = blocks.get(pol)
    return trace, simulate_raw(trace, build_config(hw, md, pol), engine="numba", track_tbt=True)


def run_capacity(name: str, data: dict[str, Any]) -> tuple[CapacityCheck, ...]:
    """Every threshold of capacity scenario ``name``, each system replayed once."""
    from kvtier.hardware import load_hardware, load_model
    from kvtier.scenario import BlockCache
    from kvtier.sim.metrics import effective_share
    from kvtier.trace.io import read_trace

    check_scenario(name, data)
    fig, cond = data["figure"], data["conditions"]
    hw, md = load_hardware(cond["hardware"]), load_model(cond["model"])
    path = Path(__file__).resolve().parents[2] / "traces" / cond["trace"]
    ttft_s = float(cond["ttft_s"])
    thresholds = [float(t) for t in fig["thresholds_ms"]]
    shares: dict[str, list[float]] = {}
    blocks = BlockCache(read_trace(str(path)))
    for sname, spec in cond["systems"].items():
        pol = system_policy(name, sname, spec)
        trace, raw = replay_system(blocks, hw, md, pol)
        shares[sname] = [effective_share(trace, raw, ttft_s, t / 1e3) for t in thresholds]
    against = str(fig["against"])
    read_cap = fig.get("capacity", {})
    out = []
    for i, t in enumerate(thresholds):
        cap = {s: v[i] for s, v in shares.items()}
        base = cap[against]
        baselines = {s: v for s, v in cap.items() if s != MOONCAKE}
        out.append(
            CapacityCheck(
                name=f"{name} @ {t:g} ms",
                source=str(fig["source"]),
                read=str(fig["read"]),
                threshold_ms=t,
                ttft_slo_s=ttft_s,
                against=against,
                published=float(fig["published"][i]),
                tolerance=float(fig["tolerance"]),
                model=cap[MOONCAKE] / base if base > 0 else math.inf,
                capacity=cap,
                published_capacity={
                    s: float(read_cap[s][i]) if s in read_cap else math.nan for s in cap
                },
                best_baseline=max(baselines, key=lambda s: (baselines[s], s)),
                stand_in=f"{cond['model']} on {cond['hardware']}",
                cause=str(fig.get("residual_cause", "")),
            )
        )
    return tuple(out)
