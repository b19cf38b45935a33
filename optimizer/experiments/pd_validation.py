"""``kvtier validate pd``: published aggregated-against-disaggregated results beside the model's.

Each result is a scenario file under ``policies/presets/validation/pd/``: where it was
published and what was read (``[figure]``: the published ratio of goodput per GPU,
disaggregated over aggregated, and the tolerance of the check), and the stand-in deployment
the model replays (``[conditions]``): a model and hardware profile, the paper's own where
kvtier can profile them. The SLO is either the paper's (``ttft_s``, ``tpot_s``) or, for a
stand-in deployment, scaled to it: ``ttft_x_unloaded`` and ``tpot_x_unloaded`` are the
paper's SLO over its unloaded prefill time and decode step, applied to the stand-in's own
unloaded times (a single request replayed alone). Each deployment may set the serving
settings the paper's systems ran with (``scheduler``, ``max_num_batched_tokens``,
``max_num_seqs``, ``cpu_overhead_s``: e.g. the aggregated baseline as vLLM of the paper's time,
``vllm_v0`` with its CPU time per iteration). The
workload is either fixed lengths with Poisson arrivals (``input_tokens``,
``output_tokens``, ``requests``) or a bundled trace (``trace``) whose arrivals are compressed.

Goodput is the largest request rate (Poisson rate, or trace compression) at which at least
``attainment`` of the requests meet both per-request bounds (TTFT and TPOT), DistServe's
definition (with ``attainment_per_metric``: the share meeting each bound, i.e. the P90 TTFT
and the P90 TPOT each within its bound, as DistServe's Figure 1 reads them), found by
doubling then bisection; per GPU it is divided by the GPUs the deployment
uses. Nothing is calibrated on these figures: every one is a check, and
:meth:`PdValidation.missed` names each whose model ratio is outside the tolerance.

A scenario with ``kind = "capacity"`` is instead Mooncake's effective request capacity at the
trace's own rate, one check per TBT threshold (:mod:`kvtier.experiments.pd_capacity`).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.errors import InputError
from kvtier.experiments.pd_capacity import CapacityCheck, RatioCheck, run_capacity
from kvtier.policy.presets import BUILTIN_DIR

PD_DIR = BUILTIN_DIR / "validation" / "pd"
BISECT_STEPS = 10
SEED = 0


@dataclass(frozen=True)
class PdCheck(RatioCheck):
    """One published result: its ratio and the model's, with each deployment's goodput."""

    name: str
    source: str
    read: str
    published: float
    tolerance: float
    model: float  # goodput per GPU, disaggregated / aggregated
    aggregated_rps_per_gpu: float
    disaggregated_rps_per_gpu: float
    ttft_slo_s: float
    tpot_slo_s: float
    stand_in: str
    split: str = ""
    cause: str = ""  # the scenario's named cause of a residual ([figure] residual_cause)


@dataclass(frozen=True)
class PdValidation:
    checks: tuple[PdCheck, ...]
    capacity: tuple[CapacityCheck, ...] = ()

    def missed(self) -> list[PdCheck | CapacityCheck]:
        return [c for c in (*self.checks, *self.capacity) if not c.met]


def scenario_names() -> list[str]:
    return sorted(p.stem for p in PD_DIR.glob("*.toml"))


def load_pd_scenario(name: str) -> dict[str, Any]:
    path = PD_DIR / f"{name}.toml"
    if not path.is_file():
        raise InputError(
            f"no P/D validation scenario {name!r}; choose from {', '.join(scenario_names())}"
        )
    with path.open("rb") as f:
        data = tomllib.load(f)
    for section, keys in (("figure", ("source", "read", "published", "tolerance")),):
        missing = [k for k in keys if k not in data.get(section, {})]
        if missing:
            raise InputError(f"{path}: [{section}] lacks {', '.join(missing)}")
    if not isinstance(data["figure"].get("residual_cause", ""), str):
        raise InputError(f"{path}: [figure] residual_cause must be a string")
    return data


class _Workload:
    """The requests of one scenario at a given rate, as blocked traces."""

    def __init__(self, cond: dict[str, Any], block_tokens: int) -> None:
        from kvtier.trace.blocked import BlockedTrace

        self.B = block_tokens
        if "trace" in cond:
            from kvtier.scenario import Scenario

            path = Path(__file__).resolve().parents[2] / "traces" / cond["trace"]
            self.base = Scenario.from_files(str(path), block_tokens=block_tokens).blocked()
            self.poisson = False
        else:
            n = int(cond["requests"])
            inp, out = int(cond["input_tokens"]), int(cond["output_tokens"])
            self.base = BlockedTrace.from_lists(
                [0.0] * n, [inp] * n, [out] * n, [[]] * n, block_tokens
            )
            self.poisson = True
        self.n = self.base.n_requests
        gaps = np.random.default_rng(SEED).exponential(1.0, self.n)
        self.unit = np.cumsum(gaps)  # Poisson arrivals at rate 1

    def at(self, rate: float):  # noqa: ANN201
        """The workload at ``rate`` (Poisson: requests per second; trace: compression)."""
        if self.poisson:
            return self.base.with_arrivals(np.ascontiguousarray(self.unit / rate))
        return self.base.with_arrivals(np.ascontiguousarray(self.base.arrival_s / rate))

    def mean_request(self):  # noqa: ANN201
        """One request of mean lengths, alone (for the unloaded times)."""
        from kvtier.trace.blocked import BlockedTrace

        inp = max(int(round(float(self.base.input_tokens.mean()))), 1)
        out = max(int(round(float(self.base.output_tokens.mean()))), 2)
        return BlockedTrace.from_lists([0.0], [inp], [out], [[]], self.B)


def _attainment(  # noqa: ANN001
    trace, cfg, ttft_s: float | np.ndarray, tpot_s: float, per_metric: bool = False
) -> float:
    """The share of requests meeting both bounds (``per_metric``: the lower of the shares
    meeting each bound)."""
    from kvtier.sim import simulate_raw

    raw = simulate_raw(trace, cfg, engine="numba")
    ttft = raw.first_token_s - trace.arrival_s
    tpot = (raw.finish_s - raw.first_token_s) / np.maximum(trace.output_tokens - 1, 1)
    ttft_ok = np.nan_to_num(ttft, nan=math.inf) <= ttft_s
    tpot_ok = np.nan_to_num(tpot, nan=math.inf) <= tpot_s
    if per_metric:
        return float(min(ttft_ok.mean(), tpot_ok.mean()))
    return float((ttft_ok & tpot_ok).mean())


def goodput(  # noqa: ANN001
    work: _Workload,
    cfg,
    ttft_s: float | np.ndarray,
    tpot_s: float,
    share: float,
    per_metric: bool = False,
) -> float:
    """The largest rate at which ``share`` of the requests meet both bounds (0: none)."""
    ok = lambda r: _attainment(work.at(r), cfg, ttft_s, tpot_s, per_metric) >= share  # noqa: E731
    lo, hi = 0.0, 1.0
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > 1e6:
            return lo
    if lo == 0.0:
        lo = hi
        while not ok(lo):
            hi, lo = lo, lo / 2
            if lo < 1e-6:
                return 0.0
    for _ in range(BISECT_STEPS):
        mid = math.sqrt(lo * hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


SERVING_KEYS = ("scheduler", "max_num_batched_tokens", "max_num_seqs", "cpu_overhead_s")


def _serving_settings(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """The serving settings a deployment names (the paper's systems' own), checked."""
    from kvtier.policy.registries import SCHEDULERS

    unknown = sorted(set(spec) - {"instances", "prefill_instances", *SERVING_KEYS})
    if unknown:
        raise InputError(
            f"P/D scenario {name!r}: unknown deployment key {unknown[0]!r}; choose from "
            f"instances, prefill_instances, {', '.join(SERVING_KEYS)}"
        )
    out: dict[str, Any] = {}
    if "scheduler" in spec:
        if spec["scheduler"] not in SCHEDULERS.names:
            raise InputError(
                f"P/D scenario {name!r}: scheduler {spec['scheduler']!r}; choose from "
                f"{', '.join(SCHEDULERS.names)}"
            )
        out["scheduler"] = str(spec["scheduler"])
    for key in ("max_num_batched_tokens", "max_num_seqs"):
        if key in spec:
            v = spec[key]
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(f"P/D scenario {name!r}: {key} must be a positive integer")
            out[key] = v
    if "cpu_overhead_s" in spec:  # the framework's CPU time per iteration (vLLM v0.5 era)
        v = spec["cpu_overhead_s"]
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 10
        if not ok or not math.isfinite(v):
            raise InputError(f"P/D scenario {name!r}: cpu_overhead_s must be a number in [0, 10]")
        out["cpu_overhead_s"] = float(v)
    return out


def run_check(name: str) -> PdCheck:
    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy import Policy
    from kvtier.sim import build_config, simulate_raw

    data = load_pd_scenario(name)
    fig, cond = data["figure"], data["conditions"]
    hw, md = load_hardware(cond["hardware"]), load_model(cond["model"])
    base = Policy()

    def config(spec: dict[str, Any]):  # noqa: ANN202
        serving = replace(
            base.serving,
            instances=int(spec["instances"]),
            prefill_instances=int(spec.get("prefill_instances", 0)),
            **_serving_settings(name, spec),
        )
        return build_config(hw, md, replace(base, serving=serving))

    agg = config(cond["aggregated"])
    split = cond["disaggregated"].get("prefill_instances", 1)
    splits = split if isinstance(split, list) else [split]  # the papers tuned the split
    dis_all = [config({**cond["disaggregated"], "prefill_instances": p}) for p in splits]
    work = _Workload(cond, base.block_tokens)
    one = work.mean_request()
    alone = simulate_raw(one, config({"instances": 1}), engine="numba")
    prefill_s = float(alone.first_token_s[0])
    step_s = float(alone.finish_s[0] - alone.first_token_s[0]) / (int(one.output_tokens[0]) - 1)
    if "ttft_s" in cond:  # the paper's own bounds, on the paper's model and GPU
        ttft_s: float | np.ndarray = float(cond["ttft_s"])
        tpot_s = float(cond["tpot_s"])
    else:  # a stand-in: the bounds scaled by its unloaded times
        ttft_s = float(cond["ttft_x_unloaded"]) * prefill_s
        tpot_s = float(cond["tpot_x_unloaded"]) * step_s
    if cond.get("ttft_per_request", False):
        # each request's bound from its own unloaded prefill (Mooncake's SLO definition)
        from kvtier.sim.timing import prefill_seconds

        tp = agg.timing_params()
        base_s = prefill_s - float(prefill_seconds(int(one.input_tokens[0]), 0, tp))
        own = np.array([prefill_seconds(int(x), 0, tp) for x in work.base.input_tokens])
        ttft_s = float(cond["ttft_x_unloaded"]) * (own + base_s)
    share = float(cond["attainment"])
    each = bool(cond.get("attainment_per_metric", False))
    gpus = hw.topology.tp
    # a trace's rate is its compression: as requests per second over the trace's span
    span = float(work.base.arrival_s.max() - work.base.arrival_s.min())
    rps = 1.0 if work.poisson or span <= 0 else work.n / span
    a = goodput(work, agg, ttft_s, tpot_s, share, each) * rps / (agg.n_instances * gpus)
    d, best = -1.0, 0
    for c in dis_all:
        g = goodput(work, c, ttft_s, tpot_s, share, each) * rps / (c.n_instances * gpus)
        if g > d:
            d, best = g, c.n_prefill
    return PdCheck(
        name=name,
        source=str(fig["source"]),
        read=str(fig["read"]),
        published=float(fig["published"]),
        tolerance=float(fig["tolerance"]),
        model=d / a if a > 0 else math.inf,
        aggregated_rps_per_gpu=a,
        disaggregated_rps_per_gpu=d,
        ttft_slo_s=float(np.median(ttft_s)),
        tpot_slo_s=tpot_s,
        stand_in=f"{cond['model']} on {cond['hardware']}",
        split=f"{agg.n_instances} aggregated against {best}P + {dis_all[0].n_instances - best}D",
        cause=str(fig.get("residual_cause", "")),
    )


CAPACITY = "capacity"


def is_capacity(name: str) -> bool:
    """Whether scenario ``name`` is an effective-capacity one (else a goodput ratio)."""
    return load_pd_scenario(name).get("kind") == CAPACITY


def run_pd() -> PdValidation:
    goodput: list[PdCheck] = []
    capacity: list[CapacityCheck] = []
    for n in scenario_names():
        data = load_pd_scenario(n)
        kind = data.get("kind", "goodput")
        if kind == CAPACITY:
            capacity.extend(run_capacity(n, data))
        elif kind == "goodput":
            goodput.append(run_check(n))
        else:
            raise InputError(f"P/D scenario {n!r}: kind {kind!r}; choose from goodput, capacity")
    return PdValidation(tuple(goodput), tuple(capacity))
