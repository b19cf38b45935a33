"""How faithful a spatial sample's replay is: samples against the full replay, per router.

The configuration was fixed before any of its figures were seen, and is not tuned after:
the bundled Mooncake conversation trace, Llama-3.1-8B on 40 H100s (a five-host copy of
``h100-node``, one GPU per instance), HBM only, B=16, open loop at the trace's own arrivals;
samples of 10% and 25% (4 and 10 instances, whole numbers), seeds 0-3, each router the
project models. The target (the project's issue 18): every sample's HBM token hit ratio within
0.02 of the full replay's, and its TTFT P50 and P99 within 10%. Each sample is replayed as
:meth:`kvtier.scenario.Scenario.replay` replays it (the routing fan-out restored under a
content-blind router) and, for comparison, without that correction.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy
from kvtier.policy.overrides import apply_overrides
from kvtier.scenario import Replay, Scenario, fan_out_applies
from kvtier.trace.format import Trace

TRACE = "traces/mooncake-conversation.parquet"
HOSTS = 5  # 5 x 8 H100s: 40 instances, so 10% and 25% are 4 and 10 instances
FRACTIONS = (0.1, 0.25)
SEEDS = (0, 1, 2, 3)
ROUTERS = ("round_robin", "least_loaded", "prefix_affinity", "kv_aware")
HIT_TOLERANCE = 0.02  # absolute, HBM token hit ratio
TTFT_TOLERANCE = 0.10  # relative, TTFT P50 and P99


@dataclass(frozen=True)
class Point:
    """One replay's figures."""

    hit: float
    ttft_p50_s: float
    ttft_p99_s: float
    instances: int
    requests: int
    # the full replay's TTFT quantiles over this sample's requests: what the sample's own
    # composition gives, whatever the replay (None for the full replay itself)
    same_p50_s: float | None = None
    same_p99_s: float | None = None
    same_hit: float | None = None  # and its HBM token hit ratio over them


@dataclass(frozen=True)
class Row:
    """One router and fraction: the full replay and each seed's sample (corrected and not)."""

    router: str
    fraction: float
    full: Point
    samples: tuple[Point, ...]
    plain: tuple[Point, ...] | None  # without the fan-out correction (content-blind only)

    def met(self) -> dict[str, bool]:
        """Per part of the target, whether every seed's sample meets it."""
        return {
            part: all(within(self.full, s)[part] for s in self.samples) for part in TARGET_PARTS
        }


TARGET_PARTS = ("hit", "P50", "P99")


def within(full: Point, sample: Point) -> dict[str, bool]:
    """The target, part by part: hit ratio within 0.02, TTFT P50 and P99 within 10% of the
    full replay's."""
    return {
        "hit": abs(sample.hit - full.hit) <= HIT_TOLERANCE,
        "P50": abs(sample.ttft_p50_s / full.ttft_p50_s - 1) <= TTFT_TOLERANCE,
        "P99": abs(sample.ttft_p99_s / full.ttft_p99_s - 1) <= TTFT_TOLERANCE,
    }


def _point(scenario: Scenario, full: Replay | None = None, kept: np.ndarray | None = None):  # noqa: ANN202
    """``(figures, replay)`` of the scenario's replay; with the ``full`` replay and the mask
    of the requests the sample ``kept``, also the full replay's TTFT quantiles and HBM hit
    ratio over those requests (what the sample's composition alone gives)."""
    replay = scenario.replay()
    m = replay.metrics
    same: list[float | None] = [None, None, None]
    if full is not None and kept is not None:
        ttft = (full.raw.first_token_s - full.trace.arrival_s)[kept]
        p50, p99 = np.quantile(ttft[np.isfinite(ttft)], (0.5, 0.99), method="linear")
        hit_tokens = full.raw.hit_blocks[kept].sum() * full.trace.block_tokens
        same = [float(p50), float(p99), float(hit_tokens / full.trace.input_tokens[kept].sum())]
    point = Point(
        m.hit_ratio_tokens.get("hbm", 0.0),
        m.ttft_p50_s,
        m.ttft_p99_s,
        m.instances,
        m.n_requests,
        *same,
    )
    return point, replay


def measure(
    trace: Trace,
    routers: Iterable[str] = ROUTERS,
    fractions: Iterable[float] = FRACTIONS,
    seeds: Iterable[int] = SEEDS,
    *,
    engine: str = "numba",
    plain: bool = True,
) -> list[Row]:
    """The table's rows: per router, its full replay, then per fraction every seed's sample
    (and, with ``plain``, the same samples without the fan-out correction)."""
    from kvtier.trace.sampling import kept_mask, sample

    hardware = load_hardware("h100-node")
    hardware = replace(hardware, topology=replace(hardware.topology, hosts=HOSTS))
    model = load_model("Llama-3.1-8B")
    seeds = tuple(seeds)
    samples = {(f, s): sample(trace, f, seed=s)[0] for f in fractions for s in seeds}
    masks = {(f, s): kept_mask(trace, f, seed=s)[0] for f in fractions for s in seeds}
    rows = []
    for router in routers:
        policy = apply_overrides(Policy(), {"serving.routing": router}, "--set")
        policy = policy.with_block_tokens(16)
        full, full_replay = _point(Scenario(trace, hardware, model, policy, engine=engine))
        blind = fan_out_applies(policy, hardware)
        for f in fractions:
            scenarios = {
                s: Scenario(samples[f, s], hardware, model, policy, engine=engine) for s in seeds
            }
            points = tuple(_point(sc, full_replay, masks[f, s])[0] for s, sc in scenarios.items())
            uncorrected = None
            if plain and blind:
                uncorrected = tuple(
                    _point(replace(sc, sample_fan_out=False))[0] for sc in scenarios.values()
                )
            rows.append(Row(router, f, full, points, uncorrected))
    return rows


def _span(values: Iterable[float], digits: int) -> str:
    v = sorted(values)
    return f"{v[0]:.{digits}f}-{v[-1]:.{digits}f}"


def markdown(rows: list[Row]) -> str:
    """The table docs/traces.md shows."""
    lines = [
        "| router | F | HBM hit ratio, full | sample, seeds 0-3 | without fan-out correction "
        "| full replay over the sample's requests | TTFT P50 / full | TTFT P99 / full "
        "| full replay's P99 over the sample's requests / full | target (every seed) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        plain = "(not applied)" if r.plain is None else _span((p.hit for p in r.plain), 3)
        p50 = _span((s.ttft_p50_s / r.full.ttft_p50_s for s in r.samples), 2)
        p99 = _span((s.ttft_p99_s / r.full.ttft_p99_s for s in r.samples), 2)
        same = _span((s.same_p99_s / r.full.ttft_p99_s for s in r.samples if s.same_p99_s), 2)
        same_hit = _span((s.same_hit for s in r.samples if s.same_hit is not None), 3)
        met = r.met()
        target = ", ".join(
            f"{part} {'met' if met[part] else '**missed**'}" for part in TARGET_PARTS
        )
        lines.append(
            f"| {r.router} | {r.fraction:g} | {r.full.hit:.3f} | "
            f"{_span((s.hit for s in r.samples), 3)} | {plain} | {same_hit} | {p50} | {p99} | "
            f"{same} | {target} |"
        )
    return "\n".join(lines)
