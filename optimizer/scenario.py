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
* the replay itself (:meth:`Scenario.replay`), a spatial sample's on the deployment
  :mod:`kvtier.deploy.sample` shrinks for it (the rules: :mod:`kvtier.trace.sample_correction`).

The setup a study records lives with the search (:mod:`kvtier.search.setup`).

Nothing here imports numba until a replay runs, so commands that only read (``report``,
``export``) stay quick to start.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kvtier.errors import InputError
from kvtier.hardware.types import Hardware, ModelProfile
from kvtier.policy.model import SLO, Policy
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
                try:
                    fanned = fanned_out(blocked, roots, self.trace.sample_fraction)
                except InputError as err:
                    raise err.with_path(self.trace.path) if self.trace.path else err from None
                self._fanned[key] = fanned
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


def _check_barrier(concurrency: int, round_size: int) -> None:
    """A round barrier holds a closed loop's rounds: none without one."""
    if round_size and not concurrency:
        raise InputError(
            "holds a closed loop's rounds: give --concurrency N too", option="--round-barrier"
        )


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
    generator"); ``ramp_s`` spreads that loop's first wave of sends over so many seconds
    (:mod:`kvtier.sim.ramp`; None: one request's lifetime under the loop's own load,
    :func:`kvtier.sim.ramp.auto_ramp_s`; 0: every first send at once); ``round_size`` R > 0
    puts that loop's requests in rounds of R behind a barrier (``kvtier replay
    --round-barrier``: none of a round is sent before the rounds before it have finished, as
    SGLang's multi-turn benchmark client runs). ``blocks`` may be
    passed to share one trace's block mappings between scenarios that differ in hardware or policy.
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
    ramp_s: float | None = 0.0
    # closed loop: rounds of so many requests in trace order behind a barrier (0: none)
    round_size: int = 0
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
        if not 0 <= self.round_size <= MAX_CONCURRENCY:
            raise InputError(
                f"must be in [0, {MAX_CONCURRENCY:,}] (0: no barrier), got {self.round_size}",
                option="--round-barrier",
            )
        _check_barrier(self.concurrency, self.round_size)
        if self.ramp_s is not None:
            r = float(self.ramp_s)
            if not (math.isfinite(r) and r >= 0):
                raise InputError(
                    f"must be 'auto' or finite seconds >= 0, got {self.ramp_s!r}", option="--ramp"
                )
            object.__setattr__(self, "ramp_s", r)
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
        set_block = (overrides or {}).get("block_tokens")
        if block_tokens is not None and set_block is not None and set_block != block_tokens:
            raise InputError(
                f"-B {block_tokens} and --set block_tokens={set_block} disagree; give the "
                "block size once",
                option="--block-tokens",
            )
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

    def at_step_scale(self, factor: float) -> Scenario:
        """The same trace, load and policy on hardware whose engine steps take ``factor``
        times as long (:func:`kvtier.sim.steptime.calibrated.with_step_scale`; mappings
        shared): the step-time margin of ``optimize``, ``report --what-if`` and ``compare``."""
        from kvtier.sim.steptime.calibrated import with_step_scale

        return replace(self, hardware=with_step_scale(self.hardware, factor))

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
        faults: tuple = (),
        round_size: int | None = None,
    ) -> Replay:
        """Replay ``policy`` (the base policy by default) to its metrics.

        Arrivals are divided by ``rate_scale`` (the scenario's by default), or replaced by
        ``arrival_s`` (a load generator of one's own, e.g. validation's bursts). With
        ``stop_early`` the run ends once the SLO is certainly missed, except for a sample with
        prompt-length strata, whose SLO is judged on weighted latencies the engines' early
        stop does not count (:func:`kvtier.sim.simulate_raw` turns it off). ``concurrency``
        overrides the scenario's closed loop (0: open loop), ``round_size`` its round barrier
        (0: none; only with a closed loop); the metrics then count each request from when it
        was sent. ``track_tbt`` records each request's token intervals
        (``raw.tbt_tail_s``, ``metrics.tbt_p99_s``); an SLO with ``tbt_p99_s`` always does.
        ``faults`` (:class:`kvtier.sim.faults.Fault`) fail lower-tier devices during the
        replay (``raw.fault_lost_ids``; figures by :mod:`kvtier.sim.fault_metrics`).
        """
        from kvtier.deploy.sample import fan_out_applies, scaled_for_sample
        from kvtier.sim import build_config, replay_metrics, simulate_raw
        from kvtier.sim.ramp import auto_ramp_s, ramp_arrivals

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
            try:
                policy_run, hardware = scaled_for_sample(policy, hardware, trace.sample_fraction)
            except InputError as err:
                raise err.with_path(self.trace.path) if self.trace.path else err from None
        else:
            policy_run = policy
        cfg = build_config(hardware, self.model, policy_run)
        closed = self.concurrency if concurrency is None else concurrency
        rounds = self.round_size if round_size is None else round_size
        _check_barrier(closed, rounds)
        if closed:
            cfg = replace(cfg, concurrency=int(closed), round_size=int(rounds))
            ramp = self.ramp_s
            if ramp is None:
                ramp = auto_ramp_s(trace, cfg, self.engine)
            if ramp > 0:
                trace = trace.with_arrivals(ramp_arrivals(trace.arrival_s, int(closed), ramp))
        if faults:
            cfg = replace(cfg, faults=tuple(faults))
        raw = simulate_raw(
            trace, cfg, engine=self.engine, slo=slo, stop_early=stop_early, track_tbt=track_tbt
        )
        metrics, stats = replay_metrics(trace, raw, cfg, hardware, slo=slo, engine=self.engine)
        if closed and raw.arrival_s is not None:
            trace = trace.with_arrivals(raw.arrival_s)  # each request counts from its send
        return Replay(metrics, raw, trace, cfg, policy, scale, stats)
