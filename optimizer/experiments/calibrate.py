"""``kvtier calibrate``: fit a hardware profile's free parameters to a vLLM server's ``/metrics``.

The server's scrape (:mod:`kvtier.trace.vllm_metrics`) and the trace of the requests it served
(``kvtier trace import`` of its request log) go in; the trace is replayed on one step-time
backend (``--backend``: by default the one the policy's own replays use) for candidate
parameters, the replay's per-request latencies are binned into vLLM's own histogram buckets,
and the statistics the scrape holds are compared:

- the means (exact: a histogram's ``_sum`` over its ``_count``) and the p50, p90 and p99
  interpolated from the buckets as Prometheus's ``histogram_quantile`` does, of the time to
  first token and of the inter-token latency (per token, and per request where exported);
- the GPU prefix cache's hit ratio (``prefix_cache_hits`` over ``prefix_cache_queries``),
  unless the scrape's queries exceed its prompt tokens: releases before vLLM PR #48860
  (2026-07-21) counted a lookup at every scheduling retry of a waiting request, a ratio no
  replay's per-request hit ratio can be compared with
  (:attr:`~kvtier.trace.vllm_metrics.ServingMetrics.hit_ratio_counts_retries`).

Both sides go through the same buckets and the same interpolation, so at the parameters the
server really has the error is only what the model cannot reproduce. The fit minimises the sum
of squared relative errors of the latency statistics (and of the offload load rate, where the
scrape has it) with bounded Nelder-Mead (``scipy.optimize.minimize``) over the logarithms of
the parameters: on the roofline, the per-step CPU cost (``step_overhead_s``) and the prefill
and decode efficiencies (``mfu``, ``mbu``, optionally ``decode_mfu``); on the measured tables,
the cluster's factors on their memory-bound and compute-bound work (``measured_memory_scale``,
``measured_compute_scale``, :mod:`kvtier.sim.steptime.calibrated`); on either, for a tier the
policy uses, its connector's per-operation cost and stream rate (``tiers.NAME.op_overhead_us``,
``tiers.NAME.port_read_gbps``). A replay holds at most ``sample`` requests (the trace's first
ones), so one fit takes a few hundred short replays.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.errors import InputError
from kvtier.hardware.types import GB, Hardware, ModelProfile
from kvtier.policy.model import Policy
from kvtier.trace.format import Trace
from kvtier.trace.vllm_metrics import (
    ITL_BUCKETS,
    TTFT_BUCKETS,
    Histogram,
    ServingMetrics,
    bucketize,
)

BACKENDS = ("roofline", "measured")
# what each step-time backend's fit frees by default: the roofline's efficiencies and per-step
# cost, the measured tables' two cluster factors (the measured backend reads neither mfu, mbu
# nor the profile's step_overhead_s)
DEFAULT_FITS = {
    "roofline": ("step_overhead_s", "mfu", "mbu"),
    "measured": ("measured_memory_scale", "measured_compute_scale"),
}
DEFAULT_FIT = DEFAULT_FITS["roofline"]
DEFAULT_SAMPLE = 400  # requests per replay
DEFAULT_MAX_REPLAYS = 300
QUANTILES = (0.5, 0.9, 0.99)
# the OffloadingConnector's loads, bytes over the seconds its load jobs ran (exact: two counters)
OFFLOAD_RATE = "offload load rate"
# the means are exact (a histogram's sum over its count) and smooth in the parameters; the
# quantiles are interpolated inside buckets and move in steps: the means weigh this much more
MEAN_WEIGHT = 10.0
# a trace "matches" a scrape when their request counts differ by at most this share (a scrape
# taken a little after the log was cut, or requests still running, differ by a few)
MATCH_TOLERANCE = 0.02


@dataclass(frozen=True)
class Param:
    """One free parameter: how to read it from and set it on a hardware profile, its bounds
    (in the profile's TOML units) and where it is written in the profile."""

    name: str
    table: str  # TOML table: "efficiency" or "tiers.NAME"
    key: str
    low: float
    high: float
    scale: float  # TOML unit -> SI (us -> s: 1e-6; GB/s -> B/s: GB)
    help: str

    def get(self, hw: Hardware) -> float:
        if self.table == "efficiency":
            return float(getattr(hw.efficiency, _EFF_FIELD[self.key])) / self.scale
        tier = hw.tiers[self.table.split(".", 1)[1]]
        return float(getattr(tier, _TIER_FIELD[self.key])) / self.scale

    def set(self, hw: Hardware, value: float) -> Hardware:
        si = value * self.scale
        if self.table == "efficiency":
            return replace(hw, efficiency=replace(hw.efficiency, **{_EFF_FIELD[self.key]: si}))
        name = self.table.split(".", 1)[1]
        tier = replace(hw.tiers[name], **{_TIER_FIELD[self.key]: si})
        return replace(hw, tiers={**hw.tiers, name: tier})


_EFF_FIELD = {"mfu": "mfu", "mbu": "mbu", "decode_mfu": "decode_mfu",
              "step_overhead_s": "step_overhead_s",
              "measured_memory_scale": "measured_memory_scale",
              "measured_compute_scale": "measured_compute_scale"}  # fmt: skip
_TIER_FIELD = {"op_overhead_us": "op_overhead_s", "port_read_gbps": "port_read_bw"}
_EFFICIENCY_PARAMS = {
    "step_overhead_s": (1e-5, 0.2, 1.0, "scheduler CPU seconds per iteration"),
    "mfu": (0.02, 1.0, 1.0, "prefill share of peak FLOPs"),
    "mbu": (0.02, 1.0, 1.0, "decode share of peak HBM bandwidth"),
    "decode_mfu": (0.02, 1.0, 1.0, "decode share of peak FLOPs"),
}
_MEASURED_PARAMS = {
    "measured_memory_scale": (0.25, 4.0, 1.0, "memory-bound work over the measured tables'"),
    "measured_compute_scale": (0.25, 4.0, 1.0, "compute-bound work over the measured tables'"),
}
_TIER_PARAMS = {
    "op_overhead_us": (0.1, 1e6, 1e-6, "connector seconds per transfer operation"),
    "port_read_gbps": (0.01, 1e4, GB, "connector stream rate, tier to GPU"),
}


def fit_params(
    names: Sequence[str],
    hardware: Hardware,
    policy: Policy | None = None,
    backend: str = "roofline",
) -> list[Param]:
    """The parameters ``names`` (``--fit``) on ``hardware`` for the step-time ``backend``; an
    error names a bad one. A tier's parameters need the tier in ``policy`` and, for the
    per-operation cost, a connector that takes it from the profile (one whose own ``rpc_us`` is
    unset, as ``direct``)."""
    from kvtier.policy.registries import CONNECTORS

    policy = Policy() if policy is None else policy
    backend_params, other_params = (
        (_EFFICIENCY_PARAMS, _MEASURED_PARAMS)
        if backend == "roofline"
        else (_MEASURED_PARAMS, _EFFICIENCY_PARAMS)
    )
    used = {t.name: t for t in policy.lower_tiers}
    tier_names = [f"tiers.{t}.{k}" for t in hardware.tiers if t in used for k in _TIER_PARAMS]
    valid = ", ".join([*backend_params, *tier_names])
    out: list[Param] = []
    for name in names:
        if name in backend_params:
            lo, hi, scale, text = backend_params[name]
            out.append(Param(name, "efficiency", name, lo, hi, scale, text))
            continue
        if name in other_params:
            raise InputError(
                f"{name} sets the {'measured' if backend == 'roofline' else 'roofline'} "
                f"step-time backend, and this fit replays the {backend} one (--backend; "
                f"valid: {valid})",
                option="--fit",
            )
        parts = name.split(".")
        if len(parts) == 3 and parts[0] == "tiers" and parts[2] in _TIER_PARAMS:
            tier = parts[1]
            if tier not in hardware.tiers or tier not in used:
                where = "hardware profile" if tier not in hardware.tiers else "policy (--set)"
                raise InputError(
                    f"{name}: the {where} has no tier {tier!r} (valid: {valid})", option="--fit"
                )
            connector = used[tier].connector
            own = float(CONNECTORS.get(connector).defaults["rpc_us"])
            if parts[2] == "op_overhead_us" and own >= 0:
                raise InputError(
                    f"{name}: the {tier} tier's connector {connector!r} sets its own "
                    f"per-operation cost ({own:g} us), so the profile's is not used",
                    option="--fit",
                )
            lo, hi, scale, text = _TIER_PARAMS[parts[2]]
            out.append(Param(name, f"tiers.{tier}", parts[2], lo, hi, scale, text))
            continue
        raise InputError(f"unknown parameter {name!r} (valid: {valid})", option="--fit")
    if len({p.name for p in out}) != len(out):
        raise InputError("a parameter is named twice", option="--fit")
    if not out:
        raise InputError(f"name at least one parameter (valid: {valid})", option="--fit")
    return out


# -- the statistics compared ------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """The statistics of one scrape (or one replay binned as a scrape) the fit compares."""

    values: dict[str, float]  # latency statistics (seconds) and the offload load rate (B/s)
    hit_ratio: float | None  # None: the scrape's counters count retried lookups, not requests


def stats_of(m: ServingMetrics) -> Stats:
    values: dict[str, float] = {}

    def add(prefix: str, h: Histogram) -> None:
        values[f"{prefix} mean"] = h.mean
        for q in QUANTILES:
            values[f"{prefix} p{round(q * 100)}"] = h.quantile(q)

    add("TTFT", m.ttft)
    if m.tpot is not None:
        # a server observes every token's gap, a replay knows each request's mean interval:
        # the per-token histogram gives its mean, the per-request one the spread
        values["ITL mean"] = m.itl.mean
        add("TPOT", m.tpot)
    else:
        add("ITL", m.itl)
    if m.offload_load_rate is not None:
        values[OFFLOAD_RATE] = m.offload_load_rate
    # a scrape whose prefix-cache queries exceed its prompt tokens counted a lookup per
    # scheduling retry (vLLM before PR #48860): its ratio is not a per-request hit ratio
    return Stats(values, None if m.hit_ratio_counts_retries else m.hit_ratio)


def replay_metrics(
    ttft_s: np.ndarray,
    itl_s: np.ndarray,
    output_tokens: np.ndarray,
    hit_ratio: float,
    *,
    with_tpot: bool = True,
    offload: OffloadLoads | None = None,
) -> ServingMetrics:
    """A replay's per-request latencies binned as vLLM bins them (the per-token histogram
    counts a request's mean interval once per output token after the first), and its lower
    tiers' loads as vLLM's OffloadingConnector counts them (``offload``)."""
    done = np.isfinite(ttft_s)
    steps = np.where(done & np.isfinite(itl_s), np.maximum(output_tokens - 1, 0), 0)
    with_tokens = steps > 0
    return ServingMetrics(
        ttft=bucketize(ttft_s[done], TTFT_BUCKETS),
        itl=bucketize(itl_s[with_tokens], ITL_BUCKETS, steps[with_tokens].astype(np.float64)),
        prefix_queries=1.0,
        prefix_hits=hit_ratio,
        tpot=bucketize(itl_s[with_tokens], ITL_BUCKETS) if with_tpot else None,
        offload_load_bytes=None if offload is None else offload.bytes,
        offload_load_time_s=None if offload is None else offload.time_s,
        offload_load_ops=None if offload is None else float(offload.sizes.size),
    )


@dataclass(frozen=True)
class OffloadLoads:
    """A replay's loads from its lower tiers into HBM as vLLM's OffloadingConnector counts
    them (``vllm:kv_offload_load_bytes``, ``_load_time``, ``_load_size``; vLLM 0.34.0
    ``v1/kv_offload/cpu/gpu_worker.py``, ``offloading/common.py``): each tensor-parallel
    rank's worker times each load job between CUDA events on its own stream, and the
    scheduler sums the ranks' bytes and seconds. The replay's instance moves its ranks'
    shares at once, so its transfer seconds count once per rank."""

    bytes: float
    time_s: float
    sizes: np.ndarray  # bytes of each rank's load job (one per loading request and rank)

    @property
    def rate(self) -> float | None:
        return self.bytes / self.time_s if self.time_s > 0 else None


@dataclass(frozen=True)
class RequestTimes:
    """One replay's per-request latencies (NaN: not reached), its prefix-cache hit ratio and
    its loads from lower tiers (None: the policy has none)."""

    ttft_s: np.ndarray
    itl_s: np.ndarray
    output_tokens: np.ndarray
    input_tokens: np.ndarray
    hit_ratio: float
    hit_tokens: np.ndarray
    offload: OffloadLoads | None = None


def replay_times(
    trace: Trace, hardware: Hardware, model: ModelProfile, policy: Policy
) -> RequestTimes:
    """Replay ``trace`` once and return each request's TTFT and mean inter-token latency."""
    from kvtier.scenario import Scenario

    rep = Scenario(trace, hardware, model, policy).replay()
    raw = rep.raw
    arrival = raw.arrival_s if raw.arrival_s is not None else rep.trace.arrival_s
    out = np.asarray(rep.trace.output_tokens, dtype=np.int64)
    inp = np.asarray(rep.trace.input_tokens, dtype=np.int64)
    ttft = raw.first_token_s - arrival
    with np.errstate(invalid="ignore", divide="ignore"):
        itl = np.where(out > 1, (raw.finish_s - raw.first_token_s) / np.maximum(out - 1, 1), np.nan)
    hit_tokens = np.minimum(raw.hit_blocks * trace.block_tokens, inp)
    offload = None
    tiers = rep.config.tiers
    if tiers is not None and rep.tiers:
        ranks = int(rep.config.instance_gpus[0]) if rep.config.instance_gpus else 1
        per_request = raw.loaded_blocks.sum(axis=1).astype(np.float64) * tiers.block_bytes
        jobs = per_request[per_request > 0] / ranks
        offload = OffloadLoads(
            bytes=float(per_request.sum()),
            time_s=ranks * sum(t.load_busy_s for t in rep.tiers),
            sizes=np.repeat(jobs, ranks),
        )
    hbm_ratio = float(rep.metrics.hit_ratio_tokens.get("hbm", 0.0))
    return RequestTimes(ttft, itl, out, inp, hbm_ratio, hit_tokens, offload)


def exact(key: str) -> bool:
    """A statistic the scrape holds exactly (a mean from a histogram's sum and count, the
    offload rate from two counters), which the fit weighs :data:`MEAN_WEIGHT` times an
    interpolated quantile."""
    return key.endswith("mean") or key == OFFLOAD_RATE


def errors(model: Stats, target: Stats) -> dict[str, float]:
    """Relative error per latency statistic (model / target - 1) and the hit ratio's absolute
    difference (``hit ratio``, in points of 1; left out when either side has none to compare)."""
    out = {}
    for key, want in target.values.items():
        got = model.values.get(key, float("nan"))
        out[key] = got / want - 1.0 if want > 0 and math.isfinite(got) else float("inf")
    if model.hit_ratio is not None and target.hit_ratio is not None:
        out["hit ratio"] = model.hit_ratio - target.hit_ratio
    return out


def mean_abs_error(errs: Mapping[str, float]) -> float:
    """The mean absolute relative error over the statistics compared (the hit ratio apart)."""
    vals = [abs(v) for k, v in errs.items() if k != "hit ratio"]
    return float(np.mean(vals)) if vals else float("nan")


# -- the fit ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """A fit: the parameters before and after, the errors before and after, and the replays
    it took."""

    params: list[Param]
    before: dict[str, float]  # parameter -> value (TOML units)
    after: dict[str, float]
    errors_before: dict[str, float]
    errors_after: dict[str, float]
    hardware: Hardware
    replays: int
    sample: int  # requests per replay
    requests: int  # requests in the trace
    backend: str = "roofline"  # the step-time backend replayed

    @property
    def error_before(self) -> float:
        return mean_abs_error(self.errors_before)

    @property
    def error_after(self) -> float:
        return mean_abs_error(self.errors_after)


def check_match(trace: Trace, metrics: ServingMetrics) -> None:
    """The trace must hold the requests the scrape counted, and their prompt tokens where the
    scrape has ``vllm:prompt_tokens`` (each within :data:`MATCH_TOLERANCE`)."""
    n = trace.n_requests
    counted = metrics.ttft.count
    if n == 0 or abs(counted - n) > MATCH_TOLERANCE * max(n, counted):
        raise InputError(
            f"the trace has {n:,} requests but the /metrics counts {counted:,.0f} first tokens "
            f"(vllm:time_to_first_token_seconds_count); give the trace of the requests that "
            f"server served",
            option="--trace",
        )
    if metrics.prompt_tokens is not None:  # every prefill's prompt, cached tokens included
        tokens = float(np.sum(trace.input_tokens))
        if abs(metrics.prompt_tokens - tokens) > MATCH_TOLERANCE * max(
            tokens, metrics.prompt_tokens
        ):
            raise InputError(
                f"the trace's prompts hold {tokens:,.0f} tokens but the /metrics counts "
                f"{metrics.prompt_tokens:,.0f} (vllm:prompt_tokens); give the trace of the "
                f"requests that server served",
                option="--trace",
            )


def check_offload(metrics: ServingMetrics, policy: Policy) -> None:
    """A scrape whose OffloadingConnector loaded bytes needs the tier they came from in the
    served deployment: its load rate is a statistic of the fit."""
    if metrics.offload_load_rate is not None and not policy.lower_tiers:
        raise InputError(
            f"the /metrics shows {metrics.offload_load_bytes / 1e9:,.3g} GB loaded by the KV "
            "offloading connector (vllm:kv_offload_load_bytes) but the served deployment has no "
            "tier below HBM; give it (--policy, --preset, or --set tiers.dram.capacity_gb=...)",
            option="--policy",
        )


def head(trace: Trace, n: int) -> Trace:
    """The first ``n`` requests of ``trace`` (all of it when it is no longer)."""
    if trace.n_requests <= n:
        return trace
    return Trace.from_table(
        trace.table.slice(0, n),
        block_tokens=trace.block_tokens,
        source=trace.source,
        has_prefix_info=trace.has_prefix_info,
        metadata=trace.metadata,
        sample_fraction=trace.sample_fraction,
        sample_strata=trace.sample_strata,
    )


def backend_policy(policy: Policy, backend: str) -> Policy:
    """``policy`` on the step-time ``backend`` whose parameters the fit sets."""
    from kvtier.policy.overrides import apply_overrides

    if backend not in BACKENDS:
        raise InputError(
            f"unknown step-time backend {backend!r} (choices: auto, {', '.join(BACKENDS)})",
            option="--backend",
        )
    if policy.serving.step_time == backend:
        return policy
    return apply_overrides(policy, {"serving.step_time": backend}, "calibrate")


def resolve_backend(choice: str, hardware: Hardware, model: ModelProfile, policy: Policy) -> str:
    """The backend a fit replays: ``auto`` is the one the policy's own replays use (the
    measured tables where they cover the scenario); ``measured`` must be covered."""
    from kvtier.sim.config import build_config

    if choice == "auto":
        return build_config(hardware, model, policy).step_backend
    try:
        return build_config(hardware, model, backend_policy(policy, choice)).step_backend
    except InputError as err:
        raise InputError(err.message, option="--backend") from None


def evaluate(
    trace: Trace,
    hardware: Hardware,
    model: ModelProfile,
    policy: Policy,
    metrics: ServingMetrics,
    *,
    sample: int = DEFAULT_SAMPLE,
    backend: str = "roofline",
) -> dict[str, float]:
    """The errors of ``hardware`` against ``metrics`` (a held-back scrape, or the fitted one)."""
    t = replay_times(head(trace, sample), hardware, model, backend_policy(policy, backend))
    sim = replay_metrics(t.ttft_s, t.itl_s, t.output_tokens, t.hit_ratio,
                         with_tpot=metrics.tpot is not None, offload=t.offload)  # fmt: skip
    return errors(stats_of(sim), stats_of(metrics))


def calibrate(
    trace: Trace,
    hardware: Hardware,
    model: ModelProfile,
    policy: Policy,
    metrics: ServingMetrics,
    *,
    fit: Sequence[str] | None = None,
    sample: int = DEFAULT_SAMPLE,
    max_replays: int = DEFAULT_MAX_REPLAYS,
    progress: Callable[[int, float], None] | None = None,
    backend: str = "roofline",
) -> Calibration:
    """Fit ``fit`` (parameter names; the ``backend``'s defaults when None) so a replay of
    ``trace`` on the step-time ``backend`` reproduces ``metrics``."""
    from scipy.optimize import minimize

    if sample < 1:
        raise InputError(f"must be >= 1, got {sample}", option="--sample")
    if max_replays < 1:
        raise InputError(f"must be >= 1, got {max_replays}", option="--max-replays")
    policy = backend_policy(policy, backend)
    params = fit_params(DEFAULT_FITS[backend] if fit is None else fit, hardware, policy, backend)
    check_match(trace, metrics)
    check_offload(metrics, policy)
    target = stats_of(metrics)
    short = head(trace, sample)
    with_tpot = metrics.tpot is not None
    before = {p.name: p.get(hardware) for p in params}
    lows = np.log([p.low for p in params])
    highs = np.log([p.high for p in params])
    x0 = np.clip(np.log([max(before[p.name], p.low) for p in params]), lows, highs)
    count = 0

    def hardware_at(x: np.ndarray) -> Hardware:
        hw = hardware
        for p, v in zip(params, np.clip(x, lows, highs), strict=True):
            hw = p.set(hw, float(np.exp(v)))
        return hw

    def errs_at(hw: Hardware) -> dict[str, float]:
        nonlocal count
        count += 1
        t = replay_times(short, hw, model, policy)
        sim = replay_metrics(t.ttft_s, t.itl_s, t.output_tokens, t.hit_ratio,
                             with_tpot=with_tpot, offload=t.offload)  # fmt: skip
        return errors(stats_of(sim), target)

    def objective(x: np.ndarray) -> float:
        e = errs_at(hardware_at(x))
        vals = np.array([v * (MEAN_WEIGHT if exact(k) else 1.0)
                         for k, v in e.items() if k != "hit ratio"])  # fmt: skip
        loss = float(np.sum(np.minimum(vals**2, 1e6)))
        if progress is not None:
            progress(count, loss)
        return loss

    errors_before = errs_at(hardware)
    best_x, best = x0, objective(x0)
    budget = max_replays - count
    # restarts from the best point found: Nelder-Mead's simplex shrinks onto the
    # steps the bucketed quantiles make, and a fresh simplex steps over them
    for step in (0.4, 0.1, 0.02):
        if budget <= len(params) + 1:
            break
        simplex = np.vstack([best_x] + [best_x + step * np.eye(len(params))[i]
                                        for i in range(len(params))])  # fmt: skip
        res = minimize(
            objective,
            best_x,
            method="Nelder-Mead",
            bounds=list(zip(lows, highs, strict=True)),
            options={"maxfev": budget, "initial_simplex": np.clip(simplex, lows, highs),
                     "xatol": 1e-4, "fatol": 1e-10},
        )  # fmt: skip
        budget = max_replays - count
        if res.fun <= best:
            best_x, best = np.asarray(res.x), float(res.fun)
    fitted = hardware_at(best_x)
    errors_after = errs_at(fitted)
    return Calibration(
        params=params,
        before=before,
        after={p.name: p.get(fitted) for p in params},
        errors_before=errors_before,
        errors_after=errors_after,
        hardware=fitted,
        replays=count,
        sample=short.n_requests,
        requests=trace.n_requests,
        backend=backend,
    )


# -- the profile written ---------------------------------------------------------------------


# how to replay a profile fitted on each backend
REPLAY_WITH = {
    "roofline": "replay with --set serving.step_time=roofline",
    "measured": "replay with the measured tables (serving.step_time auto or measured)",
}


def profile_toml(cal: Calibration, base_path: str | Path, name: str, note: str = "") -> str:
    """The base hardware profile's TOML with the fitted values in place (a profile
    ``--hardware`` takes); a header says what was fitted and the errors before and after."""
    import tomli_w

    from kvtier.toml_fields import read_toml

    base = Path(base_path)
    data: dict[str, Any] = read_toml(base)
    data["name"] = name
    gpu = str(data.get("gpu", ""))
    gpu_file = base.parent / gpu
    if gpu.endswith(".toml") or gpu_file.is_file():  # a path relative to the base profile
        data["gpu"] = str(gpu_file.resolve())
    for p in cal.params:
        table = data
        for part in p.table.split("."):
            table = table.setdefault(part, {})
        table[p.key] = float(f"{cal.after[p.name]:.6g}")
        if p.key == "port_read_gbps":  # the fit kept the write rate, which defaults to the read's
            write = cal.hardware.tiers[p.table.split(".", 1)[1]].port_write_bw / GB
            table.setdefault("port_write_gbps", float(f"{write:.6g}"))
    lines = [
        f"# Calibrated by kvtier calibrate from {base.name}: {note}".rstrip(": "),
        f"# Fitted for the {cal.backend} step-time backend: {REPLAY_WITH[cal.backend]}",
    ]
    for p in cal.params:
        lines.append(f"# {p.name}: {cal.before[p.name]:.6g} -> {cal.after[p.name]:.6g} ({p.help})")
    lines.append(
        f"# mean abs. error of the statistics compared: {cal.error_before:.1%} before, "
        f"{cal.error_after:.1%} after ({cal.replays} replays of {cal.sample} requests)"
    )
    return "\n".join(lines) + "\n" + tomli_w.dumps(data)
