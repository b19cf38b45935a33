"""The serving simulator: a pure-Python reference and a numba engine with one semantics.

``simulate(blocked_trace, hardware, model, policy)`` replays a trace on the deployment and
returns :class:`Metrics`. ``engine="reference"`` runs the executable specification
(:mod:`kvtier.sim.reference`), ``engine="numba"`` the fast kernel; both give identical
metrics on every trace. The engines are imported when a replay runs, so the package's plain
parts (configuration, metrics, the dispatch generator :mod:`kvtier.sim.gen`) load without the
kernels.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from kvtier.errors import InputError
from kvtier.hardware.types import Hardware, ModelProfile
from kvtier.policy.model import SLO, Policy
from kvtier.sim.config import SimConfig, build_config
from kvtier.sim.metrics import Metrics, compute_metrics
from kvtier.sim.result import RawResult
from kvtier.sim.slo import SloCheck
from kvtier.trace.blocked import BlockedTrace

ENGINES = ("numba", "reference")


def tracks_tbt(slo: SLO | None) -> bool:
    """Whether judging a replay by ``slo`` needs each request's TBT tail."""
    return slo is not None and slo.tbt_p99_s is not None


__all__ = [
    "ENGINES",
    "Metrics",
    "RawResult",
    "SimConfig",
    "SloCheck",
    "build_config",
    "compute_metrics",
    "replay_metrics",
    "simulate",
    "simulate_raw",
    "tracks_tbt",
]


def simulate_raw(
    trace: BlockedTrace,
    cfg: SimConfig,
    *,
    engine: str = "numba",
    slo: SLO | None = None,
    stop_early: bool = False,
    check_invariants: bool = False,
    track_tbt: bool = False,
) -> RawResult:
    """Per-request times from one engine; ``stop_early`` acts only with a non-empty ``slo``,
    and never on a sample with prompt-length strata: the engines' early stop counts requests
    unweighted, while that sample's SLO is judged on post-stratified latencies
    (:mod:`kvtier.sim.metrics`), so an unweighted count could stop a run the weighted figures
    pass.

    Token intervals (``RawResult.tbt_tail_s``) are tracked with ``track_tbt`` or
    ``cfg.track_tbt``, and always when ``slo`` bounds the TBT (its check needs them)."""
    if track_tbt or tracks_tbt(slo):
        cfg = replace(cfg, track_tbt=True)
    use_slo = stop_early and slo is not None and not slo.is_empty() and trace.sample_strata is None
    check = SloCheck.from_slo(slo) if use_slo else None
    if engine == "numba":
        from kvtier.sim import compile_ahead
        from kvtier.sim.engine import simulate_engine

        compile_ahead.start()  # (a second core compiles the event loop's callees, once)

        return simulate_engine(trace, cfg, slo=check)
    if engine == "reference":
        from kvtier.sim.reference import simulate_reference

        return simulate_reference(trace, cfg, slo=check, check_invariants=check_invariants)
    raise InputError(f"unknown engine {engine!r} (choose from {', '.join(ENGINES)})")


def simulate(
    trace: BlockedTrace,
    hardware: Hardware,
    model: ModelProfile,
    policy: Policy,
    *,
    engine: str = "numba",
    slo: SLO | None = None,
    stop_early: bool = False,
    track_tbt: bool = False,
) -> Metrics:
    """Replay ``trace`` on ``hardware`` serving ``model`` under ``policy``.

    ``slo`` defaults to the policy's. With ``stop_early`` the run ends as soon as that SLO is
    certainly missed (``Metrics.early_stopped``), which is all an optimizer needs to know.
    ``track_tbt`` records token intervals (``Metrics.tbt_p50_s``, ``tbt_p99_s``); an SLO
    with ``tbt_p99_s`` turns it on.
    """
    if trace.block_tokens != policy.block_tokens:
        raise InputError(
            f"trace is blocked at B={trace.block_tokens} but the policy says "
            f"B={policy.block_tokens}"
        )
    slo = slo if slo is not None else policy.slo
    cfg = build_config(hardware, model, policy)
    raw = simulate_raw(
        trace, cfg, engine=engine, slo=slo, stop_early=stop_early, track_tbt=track_tbt
    )
    return replay_metrics(trace, raw, cfg, hardware, slo=slo, engine=engine)[0]


def replay_metrics(
    trace: BlockedTrace,
    raw: RawResult,
    cfg: SimConfig,
    hardware: Hardware,
    *,
    slo: SLO | None,
    engine: str,
) -> tuple[Metrics, tuple]:
    """The metrics of one replay and its per-tier statistics: what every replay path reports.

    ``trace`` is the trace as replayed (a closed-loop run's arrivals are each request's send
    time, in ``raw.arrival_s``). SSD wear is charged as cost; the step-time backend that
    produced the iterations and its share of extrapolated ones are recorded. The replay's
    energy (:mod:`kvtier.sim.energy`) gives the energy metrics, and its electricity at the
    hardware's price per kWh is added to the cost per hour.
    """
    from kvtier.sim.energy import energy_fields, replay_energy, served_tokens
    from kvtier.sim.tier_stats import tier_stats

    if cfg.concurrency and raw.arrival_s is not None:
        trace = trace.with_arrivals(raw.arrival_s)  # each request counts from its send
    stats = tuple(
        tier_stats(
            cfg.tiers,
            raw,
            trace.arrival_s,
            hardware,
            timing=cfg.timing_params(),
            block_tokens=cfg.block_tokens,
            prompt_blocks=float(np.mean(np.diff(trace.block_offsets)))
            if len(trace.arrival_s)
            else 0.0,
        )
    )
    wear = sum(x.wear_per_hour for x in stats)  # SSD endurance used, charged as cost
    energy = replay_energy(raw, cfg, hardware, trace.arrival_s, served_tokens(trace, raw))
    metrics = compute_metrics(
        trace,
        raw,
        cost_per_hour=cfg.cost_per_hour + wear + energy.electricity_per_hour,
        slo=slo,
        engine=engine,
        tiers=cfg.tiers,
    )
    metrics = replace(
        metrics,
        step_time=cfg.step_backend,
        step_time_source=cfg.step_provenance,
        hbm_kv_source=cfg.hbm_provenance,
        extrapolated_share=raw.extrapolated_iterations / max(raw.n_iterations, 1),
        gpus=cfg.gpus,
        **energy_fields(energy),
    )
    return metrics, stats
