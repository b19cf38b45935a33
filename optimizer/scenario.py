"""One way to replay a policy on a trace: the scenario every command goes through.

``kvtier replay``, ``compare``, the what-if of ``report``, ``validate`` and the optimizer's
evaluator all replay "this policy, on this trace, hardware and model, at this load". Written
by hand in each, the copies drifted: one blocked the trace by block size alone and evaluated
``share_across_tenants = true`` on a tenant-salted trace. A :class:`Scenario` owns the facts
such a replay depends on, once:

* the profile defaults (``h100-node``, ``Llama-3.1-8B``) when neither the command line nor
  the policy names one;
* the blocked-trace cache, keyed by every policy field that changes block identities
  (:func:`block_key`: the block size *and* tenant sharing), safe to share between threads;
* rate scaling (:func:`scale_arrivals`);
* the setup a study records (:class:`StudySetup`) and the one check that a trace is the one
  a study ran on (:func:`check_study_trace`).

Nothing here imports numba until a replay runs, so commands that only read (``report``,
``export``) stay quick to start.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvtier.errors import InputError
from kvtier.hardware.types import Hardware, ModelProfile
from kvtier.policy.model import SLO, Policy
from kvtier.policy.registries import content_blind_routers
from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.format import Trace

if TYPE_CHECKING:
    from kvtier.sim.config import SimConfig
    from kvtier.sim.metrics import Metrics
    from kvtier.sim.result import RawResult
    from kvtier.sim.tier_stats import TierStats

DEFAULT_HARDWARE = "h100-node"
DEFAULT_MODEL = "Llama-3.1-8B"
LOAD_MODES = ("trace", "capacity")
ENGINES = ("numba", "reference")
MAX_CONCURRENCY = 1 << 20  # requests in flight of a closed loop (as kvtier.sim.engine.MAX_SEQS)
SLO_TERMS = tuple(f.name for f in fields(SLO))  # ttft_mean_s, ttft_p99_s, ttft_p999_s, ...


# -- rate scaling ---------------------------------------------------------------------------


def check_rate_scale(rate_scale: float, option: str = "--rate-scale") -> float:
    """``rate_scale`` itself when it is a positive finite number, else an :class:`InputError`."""
    if not (isinstance(rate_scale, int | float) and math.isfinite(rate_scale) and rate_scale > 0):
        raise InputError(f"must be a positive number, got {rate_scale}", option=option)
    return float(rate_scale)


def scale_arrivals(trace: BlockedTrace, rate_scale: float) -> BlockedTrace:
    """The same requests arriving ``rate_scale`` times as fast (``arrival_s / rate_scale``)."""
    rate_scale = check_rate_scale(rate_scale)
    if rate_scale == 1.0:
        return trace
    return trace.with_arrivals(trace.arrival_s / rate_scale)


# -- profiles -------------------------------------------------------------------------------


DEFAULT_PRICES = "the profiles' (owned, all-in)"  # what optimize records without --prices


def recorded_prices(policy_path: str) -> tuple[str | None, str | None]:
    """The prices file a policy file's provenance records (``optimize --prices``), so a policy
    found at a user's prices replays at them: ``(path, None)`` when it still exists (as
    recorded, else beside the policy file), ``(None, note)`` saying plainly that it does not
    exist any more, ``(None, None)`` when the policy was found at the profile's prices."""
    from kvtier.policy.file import read_policy_file

    recorded = read_policy_file(policy_path).provenance.get("prices")
    if not isinstance(recorded, str) or not recorded or recorded == DEFAULT_PRICES:
        return None, None
    for candidate in (Path(recorded), Path(policy_path).parent / recorded):
        if candidate.is_file():
            return str(candidate), None
    return None, (
        f"{policy_path}: its metrics were measured at the prices in {recorded}, which does not "
        "exist any more; replaying at the hardware profile's prices (pass --prices FILE)"
    )


def hardware_name(explicit: str | None, policy: Policy | None = None) -> str:
    """The hardware profile to use: the one named, else the policy's, else the default."""
    return explicit or (policy.hardware if policy is not None else None) or DEFAULT_HARDWARE


def model_name(explicit: str | None, policy: Policy | None = None) -> str:
    """The model profile to use: the one named, else the policy's, else the default."""
    return explicit or (policy.model if policy is not None else None) or DEFAULT_MODEL


# -- the blocked-trace cache ----------------------------------------------------------------


def block_key(policy: Policy) -> tuple[int, bool]:
    """Every policy field that changes the block identities of a trace.

    Two policies with the same key replay the same :class:`BlockedTrace`; a field that
    changes how a trace maps to blocks belongs here, and only here.
    """
    return (policy.block_tokens, policy.share_across_tenants)


class BlockCache:
    """A trace's block mappings, computed once per :func:`block_key` and shared.

    Mapping a trace to blocks is the expensive part of preparing a replay, and the numba
    engine releases the GIL, so an optimizer's threads share one cache; the lock makes sure
    each mapping is computed once.
    """

    def __init__(self, trace: Trace) -> None:
        self.trace = trace
        self._blocked: dict[tuple[int, bool], BlockedTrace] = {}
        self._fanned: dict[tuple[int, bool, str], BlockedTrace] = {}
        self._lock = threading.Lock()

    def get(self, policy: Policy) -> BlockedTrace:
        key = block_key(policy)
        with self._lock:
            if key not in self._blocked:
                from kvtier.trace.blocks import block_trace

                block_tokens, share = key
                self._blocked[key] = block_trace(
                    self.trace, block_tokens, share_across_tenants=share
                )
            return self._blocked[key]

    def fanned_out(self, policy: Policy) -> BlockedTrace:
        """:meth:`get`, with the blocks private to a root renamed per request colour
        (:func:`kvtier.trace.fanout.fanned_out`): how a sample replays under a router that
        spreads load without looking at content. Cached beside the plain mapping."""
        blocked = self.get(policy)
        key = (*block_key(policy), "fan-out")
        with self._lock:
            if key not in self._fanned:
                from kvtier.trace.fanout import fanned_out
                from kvtier.trace.sampling import root_keys

                population = round(self.trace.n_requests / self.trace.sample_fraction)
                roots, _ = root_keys(self.trace, population)
                self._fanned[key] = fanned_out(blocked, roots, self.trace.sample_fraction)
            return self._fanned[key]


# -- the scenario ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Replay:
    """One replay: its metrics, and what they were computed from.

    ``raw`` holds the per-request times, ``trace`` the blocked trace as replayed (arrivals
    scaled), ``config`` the deployment the kernels ran; a per-request table is built from
    these without replaying again.
    """

    metrics: Metrics
    raw: RawResult
    trace: BlockedTrace
    config: SimConfig
    policy: Policy
    rate_scale: float
    tiers: tuple[TierStats, ...] = ()  # per lower tier: loads, stages, wear (tier_stats)


@dataclass(frozen=True, eq=False)  # compared by identity: a trace is too large to compare
class Scenario:
    """A trace, the hardware and model that serve it, a base policy, an SLO and a load.

    ``slo`` of None means each policy's own (``kvtier replay`` of a policy file); the
    optimizer passes the SLO it searches under. ``load`` and ``rate_scale`` say how the
    trace is served: as recorded with arrivals divided by ``rate_scale`` (``trace``), or at
    the largest load that meets the SLO (``capacity``, searched by
    :class:`kvtier.search.objective.Evaluator`). ``concurrency`` N > 0 serves the trace
    closed loop: at most N requests in flight, each sent at the later of its (scaled) trace
    time and the moment a slot frees (``kvtier replay --concurrency``; docs/model.md, "Load
    generator"). ``blocks`` may be passed to share one
    trace's block mappings between scenarios that differ in hardware or policy.
    """

    trace: Trace
    hardware: Hardware
    model: ModelProfile
    policy: Policy = field(default_factory=Policy)
    slo: SLO | None = None
    load: str = "trace"
    rate_scale: float = 1.0
    engine: str = "numba"
    blocks: BlockCache | None = field(default=None, repr=False, compare=False)
    concurrency: int = 0
    # a sample's replay under a content-blind router restores the full cluster's routing
    # fan-out (kvtier.trace.fanout); off only to measure what that correction changes
    sample_fan_out: bool = True

    def __post_init__(self) -> None:
        if self.load not in LOAD_MODES:
            raise InputError(
                f"must be one of {', '.join(LOAD_MODES)}, got {self.load!r}", option="--load"
            )
        object.__setattr__(self, "rate_scale", check_rate_scale(self.rate_scale))
        if not 0 <= self.concurrency <= MAX_CONCURRENCY:
            raise InputError(
                f"must be in [0, {MAX_CONCURRENCY:,}] (0: open loop), got {self.concurrency}",
                option="--concurrency",
            )
        if self.engine not in ENGINES:
            raise InputError(
                f"must be one of {', '.join(ENGINES)}, got {self.engine!r}", option="--engine"
            )
        if self.blocks is None or self.blocks.trace is not self.trace:
            object.__setattr__(self, "blocks", BlockCache(self.trace))

    @classmethod
    def from_files(
        cls,
        trace_path: str,
        *,
        hardware: str | None = None,
        model: str | None = None,
        policy_path: str | None = None,
        preset: str | None = None,
        overrides: Mapping[str, Any] | None = None,
        block_tokens: int | None = None,
        rate_scale: float | None = None,
        engine: str = "numba",
        prices: str | None = None,
    ) -> Scenario:
        """What ``kvtier replay`` replays: a trace file with a policy file, a preset or the
        defaults; ``overrides`` (``--set``) and ``block_tokens`` applied over it; profiles as
        named, else the policy's, else the defaults; ``rate_scale`` as given, else the load a
        policy file's metrics were measured at, else 1; the hardware at the prices of the
        ``prices`` file (``--prices``) when given, else at the profile's."""
        from kvtier.trace.io import read_trace

        if policy_path is not None and preset is not None:
            raise InputError("give --policy or --preset, not both", option="--preset")
        recorded_scale = 1.0
        if policy_path is not None:
            from kvtier.policy.file import read_policy_file

            policy_file = read_policy_file(policy_path)
            policy, recorded_scale = policy_file.policy, policy_file.rate_scale
        elif preset is not None:
            from kvtier.policy.presets import load_preset

            policy = load_preset(preset)
        else:
            policy = Policy()
        if overrides:
            from kvtier.policy.overrides import apply_overrides

            policy = apply_overrides(policy, dict(overrides), "--set")
        if block_tokens is not None:
            if block_tokens < 1:
                raise InputError(f"must be >= 1, got {block_tokens}", option="--block-tokens")
            policy = policy.with_block_tokens(block_tokens)
        from kvtier.hardware import load_hardware, load_model

        hw = load_hardware(hardware_name(hardware, policy))
        if prices is not None:
            from kvtier.hardware.prices import apply_prices, load_prices

            hw = apply_prices(hw, load_prices(prices))
        return cls(
            read_trace(trace_path),
            hw,
            load_model(model_name(model, policy)),
            policy,
            rate_scale=recorded_scale if rate_scale is None else rate_scale,
            engine=engine,
        )

    def with_policy(self, policy: Policy) -> Scenario:
        """The same trace, profiles and load under another base policy (mappings shared)."""
        return replace(self, policy=policy)

    def slo_for(self, policy: Policy) -> SLO | None:
        """The SLO a replay of ``policy`` is judged by: the scenario's, else the policy's."""
        return self.slo if self.slo is not None else policy.slo

    def blocked(self, policy: Policy | None = None) -> BlockedTrace:
        """The trace mapped to ``policy``'s blocks (the base policy's by default), cached."""
        assert self.blocks is not None  # set in __post_init__
        return self.blocks.get(self.policy if policy is None else policy)

    def replay(
        self,
        policy: Policy | None = None,
        *,
        rate_scale: float | None = None,
        stop_early: bool = False,
        arrival_s: np.ndarray | None = None,
        concurrency: int | None = None,
        track_tbt: bool = False,
    ) -> Replay:
        """Replay ``policy`` (the base policy by default) to its metrics.

        Arrivals are divided by ``rate_scale`` (the scenario's by default), or replaced by
        ``arrival_s`` (a load generator of one's own, e.g. validation's bursts). With
        ``stop_early`` the run ends once the SLO is certainly missed, except for a sample with
        prompt-length strata, whose SLO is judged on weighted latencies the engines' early
        stop does not count (:func:`kvtier.sim.simulate_raw` turns it off). ``concurrency``
        overrides the scenario's closed loop (0: open loop); the metrics then count each
        request from when it was sent. ``track_tbt`` records each request's token intervals
        (``raw.tbt_tail_s``, ``metrics.tbt_p99_s``); an SLO with ``tbt_p99_s`` always does.
        """
        from kvtier.sim import build_config, replay_metrics, simulate_raw

        policy = self.policy if policy is None else policy
        scale = self.rate_scale if rate_scale is None else check_rate_scale(rate_scale)
        trace = self.blocked(policy)
        if (
            trace.sample_fraction != 1.0
            and self.sample_fan_out
            and fan_out_applies(policy, self.hardware)
        ):
            assert self.blocks is not None
            trace = self.blocks.fanned_out(policy)
        if arrival_s is not None:
            trace = trace.with_arrivals(np.ascontiguousarray(arrival_s, dtype=np.float64))
        else:
            trace = scale_arrivals(trace, scale)
        slo = self.slo_for(policy)
        hardware = self.hardware
        if trace.sample_fraction != 1.0:
            policy_run, hardware = scaled_for_sample(policy, hardware, trace.sample_fraction)
        else:
            policy_run = policy
        cfg = build_config(hardware, self.model, policy_run)
        closed = self.concurrency if concurrency is None else concurrency
        if closed:
            cfg = replace(cfg, concurrency=int(closed))
        raw = simulate_raw(
            trace, cfg, engine=self.engine, slo=slo, stop_early=stop_early, track_tbt=track_tbt
        )
        metrics, stats = replay_metrics(trace, raw, cfg, hardware, slo=slo, engine=self.engine)
        if closed and raw.arrival_s is not None:
            trace = trace.with_arrivals(raw.arrival_s)  # each request counts from its send
        return Replay(metrics, raw, trace, cfg, policy, scale, stats)


# Routers that place a request without looking at its blocks (the registry's content_blind
# trait): the replay of a sample restores their fan-out (kvtier.trace.fanout). The
# content-affine ones send a turn to its prefix.
CONTENT_BLIND_ROUTERS = content_blind_routers()


def _cluster_shared_tiers(policy: Policy, hardware: Hardware) -> list[str]:
    return [
        t.name
        for t in policy.tiers
        if t.name != "hbm" and t.name in hardware.tiers and not hardware.tiers[t.name].per_host
    ]


def fan_out_applies(policy: Policy, hardware: Hardware) -> bool:
    """Whether a sample's replay of ``policy`` renames root-private blocks per request colour
    (:mod:`kvtier.trace.fanout`): under a content-blind router and with no tier shared by the
    whole cluster (CXL, RDMA), where a turn finds its prefix whichever instance it lands on,
    so colours would hide reuse the full cluster has."""
    return policy.serving.routing in CONTENT_BLIND_ROUTERS and not _cluster_shared_tiers(
        policy, hardware
    )


def sample_bias(policy: Policy, hardware: Hardware, fraction: float) -> str | None:
    """One line saying which way a ``fraction`` sample's hit ratios are biased under
    ``policy``, or None where the validation (docs/traces.md, "How faithful a sample's replay
    is") found them within its target."""
    if fraction == 1.0:
        return None
    routing = policy.serving.routing
    shared = _cluster_shared_tiers(policy, hardware)
    if routing in CONTENT_BLIND_ROUTERS and shared:
        return (
            f"a {fraction:g} sample under {routing} with the cluster-shared "
            f"{'/'.join(shared)} tier: its HBM hit ratio is biased high and the "
            f"{'/'.join(shared)} hit ratio low (docs/traces.md, sampling)"
        )
    if routing not in CONTENT_BLIND_ROUTERS:
        return (
            f"a {fraction:g} sample under {routing}: its hit ratios are biased high against the "
            "full trace's, content-affine routing concentrating less (docs/traces.md, sampling)"
        )
    return None


def sample_weighting(trace: Trace) -> str | None:
    """One line saying how a replay of ``trace`` weights its latencies: post-stratified by
    prompt length when it is a sample with strata (:mod:`kvtier.trace.strata`), else None."""
    strata = trace.sample_strata
    return None if strata is None else strata.describe()


def sample_instance_step(fraction: float) -> int:
    """The smallest instance count a ``fraction`` sample scales to a whole number of instances
    (10 for 0.1 and 0.3, 4 for 0.25): every full deployment it replays must be a multiple."""
    from fractions import Fraction

    return Fraction(fraction).limit_denominator(1_000_000).denominator


def scaled_for_sample(
    policy: Policy, hardware: Hardware, fraction: float
) -> tuple[Policy, Hardware]:
    """The deployment a spatial sample (``kvtier trace sample``) of ``fraction`` replays on.

    The sample holds about ``fraction`` of the sessions and of the load, so the cluster keeps
    its per-instance load and cache pressure only if it shrinks by the same fraction: the
    instance count is multiplied by it (it must come out whole), and each shared pool (CXL,
    RDMA) keeps ``fraction`` of its capacity and of its pool link's bandwidth. Per-host tiers
    (DRAM, SSD) shrink with the hosts, but the sample's instances may fill fewer hosts than
    ``fraction`` of the full deployment's (4 of 40 instances on 8-GPU hosts: half a host, yet
    one whole host's DRAM): each per-host pool, and the host's ports to it, then keep
    ``fraction x full hosts / hosts used`` of their size (the ports only when the host's
    instances share them, ``attach = "host"``), so that the sample's per-host tiers hold
    ``fraction`` of the full deployment's in all. The policy a user
    sees and stores stays the full deployment's.
    """

    from kvtier.hardware.types import GB

    topo = hardware.topology
    full = policy.serving.instances if policy.serving.instances is not None else topo.max_instances
    scaled = full * fraction
    instances = round(scaled)
    if instances < 1 or abs(scaled - instances) > 1e-6 * max(1.0, scaled):
        raise InputError(
            f"the trace is a {fraction:g} sample, so the {full} instances of the policy must "
            f"shrink to {scaled:g}, which is not a whole number; set serving.instances to a "
            f"multiple of {sample_instance_step(fraction)} (e.g. --set serving.instances=N) or "
            "sample another fraction",
            option="--set",
        )
    per_host = max(topo.gpus_per_host // (policy.serving.tp or topo.tp), 1)
    host_share = fraction * math.ceil(full / per_host) / math.ceil(instances / per_host)
    tiers = []
    scaled_hw = dict(hardware.tiers)
    for tier in policy.tiers:
        hw_tier = hardware.tiers.get(tier.name)
        if tier.name == "hbm" or hw_tier is None:
            tiers.append(tier)
            continue
        capacity = (
            tier.capacity_gb if tier.capacity_gb is not None else (hw_tier.capacity_bytes / GB)
        )
        if not hw_tier.per_host:
            tier = replace(tier, capacity_gb=capacity * fraction)
            scaled_hw[tier.name] = replace(hw_tier, pool_bw=hw_tier.pool_bw * fraction)
        elif abs(host_share - 1) > 1e-9:
            tier = replace(tier, capacity_gb=capacity * host_share)
            if hw_tier.attach == "host":  # shared by the host's instances (not one per GPU)
                scaled_hw[tier.name] = replace(
                    hw_tier,
                    port_read_bw=hw_tier.port_read_bw * host_share,
                    port_write_bw=hw_tier.port_write_bw * host_share,
                )
        tiers.append(tier)
    run_policy = replace(
        policy, serving=replace(policy.serving, instances=instances), tiers=tuple(tiers)
    )
    return run_policy, replace(hardware, tiers=scaled_hw)


# -- the setup a study records --------------------------------------------------------------

SETUP_ATTR = "setup"  # the study's user attributes: what the latest run searched ...
SHA256_ATTR = "trace_sha256"  # ... and the trace it ran on


def slo_to_dict(slo: SLO) -> dict[str, float]:
    """The SLO's set terms, as a study and a policy file record them."""
    return {t: getattr(slo, t) for t in SLO_TERMS if getattr(slo, t) is not None}


def slo_from_dict(data: Mapping[str, Any]) -> SLO:
    return SLO(**{k: float(v) for k, v in data.items()})


def check_study_trace(study: Any, digest: str, *, mismatch: str, option: str) -> None:
    """Raise unless ``study`` ran on the trace whose sha256 is ``digest`` (or records none).

    ``mismatch`` is the message, with ``{sha}`` standing for the recorded digest (shortened):
    resuming a study on another trace and pointing the what-if at a moved trace say it in
    their own words.
    """
    recorded = study.user_attrs.get(SHA256_ATTR)
    if recorded is not None and recorded != digest:
        raise InputError(mismatch.replace("{sha}", f"{recorded[:12]}..."), option=option)


@dataclass(frozen=True)
class StudySetup:
    """What an optimize run searched, recorded with its study so it can be replayed later."""

    trace: str
    trace_sha256: str | None
    hardware: str
    model: str
    slo: SLO
    load: str = "trace"
    rate_scale: float = 1.0
    space: str = ""
    # the price figures every trial was costed at (kvtier.hardware.prices.price_figures);
    # None for a study recorded before they were kept
    prices: dict[str, Any] | None = None
    # what the study minimises (kvtier.search.objective.OBJECTIVES); recorded unless "cost"
    objective: str = "cost"

    def to_attrs(self) -> dict[str, Any]:
        """The study user attributes this setup is stored as."""
        setup = {
            "trace": self.trace,
            "hardware": self.hardware,
            "model": self.model,
            "slo": slo_to_dict(self.slo),
            "load": self.load,
            "rate_scale": self.rate_scale,
            "space": self.space,
        }
        if self.prices is not None:
            setup["prices"] = self.prices
        if self.objective != "cost":
            setup["objective"] = self.objective
        return {SHA256_ATTR: self.trace_sha256, SETUP_ATTR: setup}

    def record(self, study: Any) -> None:
        for key, value in self.to_attrs().items():
            study.set_user_attr(key, value)

    @classmethod
    def from_study(cls, study: Any) -> StudySetup:
        """The setup ``study`` recorded; an :class:`InputError` when it records none."""
        setup = dict(study.user_attrs.get(SETUP_ATTR) or {})
        if not setup:
            raise InputError(
                f"study {study.study_name!r} records no setup to replay", option="--study"
            )
        return cls(
            trace=str(setup.get("trace", "")),
            trace_sha256=study.user_attrs.get(SHA256_ATTR),
            hardware=str(setup.get("hardware")),
            model=str(setup.get("model")),
            slo=slo_from_dict(setup.get("slo") or {}),
            load=str(setup.get("load", "trace")),
            rate_scale=float(setup.get("rate_scale", 1.0)),
            space=str(setup.get("space", "")),
            prices=setup.get("prices"),
            objective=str(setup.get("objective", "cost")),
        )

    def scenario(self, policy: Policy, *, trace_path: str | None = None) -> Scenario:
        """The scenario the study evaluated its trials in, with ``policy`` as the base.

        ``trace_path`` replaces the recorded path of a trace that has moved; it must hold the
        same trace (:func:`check_study_trace` first).
        """
        from kvtier.hardware import load_hardware, load_model
        from kvtier.hardware.prices import with_price_figures
        from kvtier.trace.io import read_trace

        hardware = load_hardware(self.hardware)
        if self.prices is not None:
            hardware = with_price_figures(hardware, self.prices)
        return Scenario(
            read_trace(trace_path or self.trace),
            hardware,
            load_model(self.model),
            policy,
            slo=self.slo,
            load=self.load,
            rate_scale=self.rate_scale,
        )


def trace_sha256(path: str | Path, *, unreadable: str, option: str) -> str:
    """The sha256 of a trace file; ``unreadable`` is the message when it cannot be read."""
    from kvtier.policy.file import sha256_of

    try:
        return sha256_of(path)
    except OSError:
        raise InputError(unreadable, option=option) from None
