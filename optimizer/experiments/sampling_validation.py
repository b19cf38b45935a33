"""How faithful a spatial sample's replay is: samples against the full replay, per router.

The configuration was fixed before any of its figures were seen, and is not tuned after:
the bundled Mooncake conversation trace, Llama-3.1-8B on 40 H100s (a five-host copy of
``h100-node``, one GPU per instance), HBM only, B=16, open loop at the trace's own arrivals;
samples of 10% and 25% (4 and 10 instances, whole numbers), seeds 0-3, each router the
project models. The target (the project's issue 18): every sample's HBM token hit ratio within
0.02 of the full replay's, and its TTFT P50 and P99 within 10%. Each sample is replayed as
:meth:`kvtier.scenario.Scenario.replay` replays it (the routing fan-out restored under a
content-blind router) and, for comparison, without that correction.

A sample's latency figures are post-stratified by prompt length (:mod:`kvtier.trace.strata`,
through :func:`kvtier.sim.metrics.compute_metrics`): an estimator introduced after the
unweighted TTFT P99 of whole-root samples was seen to miss the target, because the P99 of a
thousand requests rests on its dozen largest values, the longest prompts, whose number a
whole-root sample leaves to chance. The full replay's figures over a sample's requests are
weighted the same way, so the two stay comparable.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

import numpy as np

from kvtier.deploy.sample import fan_out_applies
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy
from kvtier.policy.overrides import apply_overrides
from kvtier.scenario import Replay, Scenario
from kvtier.trace.format import Trace
from kvtier.trace.strata import SampleStrata

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
    # the full replay's TTFT quantiles over this sample's requests, post-stratified as the
    # sample's replay is: what the sample's own composition gives, whatever the replay (None
    # for the full replay itself)
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


def _cluster():  # noqa: ANN202
    """The validation's deployment: Llama-3.1-8B on :data:`HOSTS` copies of ``h100-node``."""
    hardware = load_hardware("h100-node")
    hardware = replace(hardware, topology=replace(hardware.topology, hosts=HOSTS))
    return hardware, load_model("Llama-3.1-8B")


def _policy(router: str) -> Policy:
    """The validation's policy under ``router``: HBM only, B=16."""
    return apply_overrides(Policy(), {"serving.routing": router}, "--set").with_block_tokens(16)


def _point(scenario: Scenario, full: Replay | None = None, kept: np.ndarray | None = None):  # noqa: ANN202
    """``(figures, replay)`` of the scenario's replay; with the ``full`` replay and the mask
    of the requests the sample ``kept``, also the full replay's TTFT quantiles over those
    requests, weighted by the sample's strata as its replay's are, and its HBM hit ratio over
    them (what the sample's composition alone gives)."""
    replay = scenario.replay()
    m = replay.metrics
    same: list[float | None] = [None, None, None]
    if full is not None and kept is not None:
        ttft = (full.raw.first_token_s - full.trace.arrival_s)[kept]
        finite = np.isfinite(ttft)
        strata = scenario.trace.sample_strata
        # the sample replay's own weights: its stratum counts over all its requests
        w = None if strata is None else strata.weights(full.trace.input_tokens[kept])[finite]
        p50, p99 = quantiles(ttft[finite], (0.5, 0.99), w)
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


def quantiles(
    values: np.ndarray, qs: tuple[float, ...], weights: np.ndarray | None = None
) -> list[float]:
    """The ``qs`` quantiles of ``values`` as a replay's metrics compute them: linear
    unweighted; with post-stratification ``weights``, weighted ``inverted_cdf``
    (:mod:`kvtier.sim.metrics`)."""
    if weights is None:
        return [float(v) for v in np.quantile(values, qs, method="linear")]
    return [float(v) for v in np.quantile(values, qs, weights=weights, method="inverted_cdf")]


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

    hardware, model = _cluster()
    seeds = tuple(seeds)
    samples = {(f, s): sample(trace, f, seed=s)[0] for f in fractions for s in seeds}
    masks = {(f, s): kept_mask(trace, f, seed=s)[0] for f in fractions for s in seeds}
    rows = []
    for router in routers:
        policy = _policy(router)
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


# The statistical floor of the TTFT target: how often a sample of the same size meets it even
# when each kept request has exactly its full-replay TTFT. Not a parameter of any replay.
FLOOR_DRAWS = 2000  # simple random samples of requests per fraction
FLOOR_SEEDS = 200  # whole-root samples (kvtier trace sample's seeds 0..199) per fraction


@dataclass(frozen=True)
class Floor:
    """For one router and fraction, the share of samples whose full-replay TTFT quantile is
    within :data:`TTFT_TOLERANCE` of the full replay's: simple random samples of requests and
    kvtier's whole-root samples, for P50 and P99."""

    router: str
    fraction: float
    requests: int  # requests in the full trace
    iid: dict[str, float]  # part -> share of simple random samples within the tolerance
    roots: dict[str, float]  # part -> share of whole-root samples within the tolerance
    # part -> share of whole-root samples within it, their quantiles post-stratified by
    # prompt length as a sample's replay computes them
    post: dict[str, float]


def within_shares(
    ttft: np.ndarray,
    subsets: Iterable[np.ndarray],
    q: float,
    tolerance: float = TTFT_TOLERANCE,
    *,
    strata: SampleStrata | None = None,
    input_tokens: np.ndarray | None = None,
) -> float:
    """The share of ``subsets`` (boolean masks or index arrays of ``ttft``) whose ``q``
    quantile is within ``tolerance`` (relative) of the quantile of all of ``ttft`` (linear).
    With ``strata`` and every request's ``input_tokens``, each subset's quantile is
    post-stratified (:func:`quantiles`), as a sample's replay reports it."""
    whole = float(np.quantile(ttft, q, method="linear"))
    ratios = []
    for s in subsets:
        w = None
        if strata is not None and input_tokens is not None:
            w = strata.weights(input_tokens[s])
        ratios.append(quantiles(ttft[s], (q,), w)[0] / whole)
    return float(np.mean(np.abs(np.asarray(ratios) - 1.0) <= tolerance))


def composition_floor(
    trace: Trace,
    routers: Iterable[str] = ROUTERS,
    fractions: Iterable[float] = FRACTIONS,
    *,
    draws: int = FLOOR_DRAWS,
    seeds: int = FLOOR_SEEDS,
    engine: str = "numba",
) -> list[Floor]:
    """What any sample of a fraction's size can reach on the TTFT target, per router.

    The full replay's per-request TTFTs are taken as they are, and their P50 and P99 are
    computed over (a) ``draws`` simple random samples of ``F x n`` requests (the best case of
    a sampler that could keep single requests, which a cache replay cannot: it would cut
    every conversation) and (b) the requests of ``kvtier trace sample`` for ``seeds`` seeds,
    unweighted and (c) post-stratified by prompt length as a sample's replay reports them.
    Where (a) rarely meets the target, no unweighted sampler of that size can meet it
    reliably: the sample's own replay adds its error on top."""
    from kvtier.trace.sampling import kept_mask

    hardware, model = _cluster()
    fractions = tuple(fractions)
    masks = {f: [kept_mask(trace, f, seed=s)[0] for s in range(seeds)] for f in fractions}
    rng = np.random.default_rng(0)
    n = trace.n_requests
    strata = SampleStrata.of_lengths(trace.input_tokens)  # what every sample of it records
    lengths = trace.input_tokens
    out = []
    for router in routers:
        full = Scenario(trace, hardware, model, _policy(router), engine=engine)
        replay = full.replay()
        ttft = replay.raw.first_token_s - replay.trace.arrival_s
        for f in fractions:
            k = max(1, round(f * n))
            iid = [rng.choice(n, k, replace=False) for _ in range(draws)]
            shares = {
                part: (
                    within_shares(ttft, iid, q),
                    within_shares(ttft, masks[f], q),
                    within_shares(ttft, masks[f], q, strata=strata, input_tokens=lengths),
                )
                for part, q in (("P50", 0.5), ("P99", 0.99))
            }
            out.append(
                Floor(
                    router,
                    f,
                    n,
                    {p: v[0] for p, v in shares.items()},
                    {p: v[1] for p, v in shares.items()},
                    {p: v[2] for p, v in shares.items()},
                )
            )
    return out


def floor_markdown(floors: list[Floor]) -> str:
    """The floor table docs/traces.md shows."""
    lines = [
        "| router | F | requests kept "
        "| P50 within 10%: random requests / whole roots / whole roots post-stratified "
        "| P99 within 10%: random requests / whole roots / whole roots post-stratified "
        "| P99, 4 of 4 seeds within (random requests / post-stratified roots, if independent) |",
        "|---|---|---|---|---|---|",
    ]
    for fl in floors:
        lines.append(
            f"| {fl.router} | {fl.fraction:g} | {round(fl.fraction * fl.requests):,} | "
            f"{fl.iid['P50']:.0%} / {fl.roots['P50']:.0%} / {fl.post['P50']:.0%} | "
            f"{fl.iid['P99']:.0%} / {fl.roots['P99']:.0%} / {fl.post['P99']:.0%} | "
            f"{fl.iid['P99'] ** 4:.0%} / {fl.post['P99'] ** 4:.0%} |"
        )
    return "\n".join(lines)
