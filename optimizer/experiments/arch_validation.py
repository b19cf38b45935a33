"""``kvtier validate architectures``: published ratios between a memory architecture and its
baseline, beside the model's.

Each scenario is a file under ``policies/presets/validation/architectures/``: the published
ratio and where it was read (``[figure]``, whose ``role`` is declared ``check`` before any
replay: none of these figures sets a parameter), the workload both deployments replay
(``[workload]``: fixed lengths sent by a closed loop of ``concurrency`` clients, or the head
of a bundled trace) and the two deployments (``[baseline]`` and ``[system]``, each a policy
table with its ``hardware`` and ``model``, read by :func:`kvtier.policy.model.policy_from_dict`).

The metric (``figure.metric``) is a ratio of the two replays: ``throughput`` (system over
baseline, output tokens per second from the first arrival to the last finish), ``latency``
(baseline over system, mean end-to-end seconds per request), ``ttft`` (baseline over system,
mean time to first token) or ``ttft_reuse`` (as ``ttft``, over the requests that reuse KV
from an earlier one: a later turn of a conversation, its prefix found in HBM or a lower
tier). A check is met when model / published lies within ``1 / tolerance .. tolerance``;
:meth:`ArchValidation.missed` names each that does not, and
``gap`` (the scenario's own words) says what the model leaves out that the published figure
holds, so a residual is reported with its cause.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.builtin import CHECKOUT_POLICIES
from kvtier.errors import InputError
from kvtier.policy.presets import BUILTIN_DIR

ARCH_DIR = BUILTIN_DIR / "validation" / "architectures"
METRICS = ("throughput", "latency", "ttft", "ttft_reuse")
ROLES = ("check",)  # every figure here is a check: none calibrates a parameter
_FIGURE_KEYS = {"role", "metric", "published", "tolerance", "source", "read", "gap"}
_WORKLOAD_KEYS = {"input_tokens", "output_tokens", "requests", "concurrency", "trace"}
TRACES_DIR = CHECKOUT_POLICIES.parent / "traces"  # the bundled traces (a checkout's)


@dataclass(frozen=True)
class ArchCheck:
    """One published ratio and the model's, with each deployment's value of the metric."""

    name: str
    source: str
    read: str
    metric: str
    published: float
    tolerance: float
    model: float
    baseline_value: float
    system_value: float
    gap: str

    @property
    def residual(self) -> float:
        """Model over published (1: reproduced)."""
        return self.model / self.published

    @property
    def met(self) -> bool:
        r = self.residual
        return math.isfinite(r) and 1.0 / self.tolerance <= r <= self.tolerance


@dataclass(frozen=True)
class ArchValidation:
    checks: list[ArchCheck]

    def missed(self) -> list[ArchCheck]:
        return [c for c in self.checks if not c.met]


def _keys(data: dict[str, Any], allowed: set[str], table: str, path: Path) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise InputError(
            f"unknown key {table}.{unknown[0]} (valid: {', '.join(sorted(allowed))})",
            path=str(path),
        )


def load_scenario(path: Path) -> dict[str, Any]:
    """One scenario file, checked: its tables and keys, the role declared ``check``."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    _keys(data, {"figure", "workload", "baseline", "system"}, "", path)
    for table in ("figure", "workload", "baseline", "system"):
        if not isinstance(data.get(table), dict):
            raise InputError(f"missing table [{table}]", path=str(path))
    fig, work = data["figure"], data["workload"]
    _keys(fig, _FIGURE_KEYS, "figure", path)
    _keys(work, _WORKLOAD_KEYS, "workload", path)
    if fig.get("role") not in ROLES:
        raise InputError(
            f"key 'figure.role': {fig.get('role')!r} (choices: {', '.join(ROLES)})",
            path=str(path),
        )
    if fig.get("metric") not in METRICS:
        raise InputError(
            f"key 'figure.metric': {fig.get('metric')!r} (choices: {', '.join(METRICS)})",
            path=str(path),
        )
    for key in ("published", "tolerance"):
        value = fig.get(key)
        if not isinstance(value, int | float) or not value > 0:
            raise InputError(f"key 'figure.{key}': a number > 0 is needed", path=str(path))
    if fig["tolerance"] < 1:
        raise InputError("key 'figure.tolerance': a factor >= 1 is needed", path=str(path))
    return data


def _trace(work: dict[str, Any], path: Path) -> Any:
    """The workload: the first ``requests`` of a bundled trace, or fixed lengths with random
    prompts (no block shared), every request available at t = 0 (the closed loop sends them)."""
    from kvtier.trace.format import Trace

    n = int(work["requests"])
    if "trace" in work:
        from kvtier.trace.io import read_trace

        trace = read_trace(TRACES_DIR / str(work["trace"]))
        if n > trace.n_requests:
            raise InputError("key 'workload.requests': more than the trace's", path=str(path))
        from dataclasses import replace

        return replace(trace, table=trace.table.slice(0, n))
    isl, osl = int(work["input_tokens"]), int(work["output_tokens"])
    block = 16
    per = -(-isl // block)
    return Trace.from_arrays(
        arrival_s=np.zeros(n),
        input_tokens=np.full(n, isl, dtype=np.int64),
        output_tokens=np.full(n, osl, dtype=np.int64),
        hash_offsets=np.arange(n + 1, dtype=np.int64) * per,
        hashes=np.arange(1, n * per + 1, dtype=np.uint64),
        block_tokens=block,
        source="validation",
    )


def _replay(trace: Any, side: dict[str, Any], concurrency: int, where: str) -> Any:
    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy.model import policy_from_dict
    from kvtier.scenario import Scenario

    policy = policy_from_dict({"format": "kvtier-policy/1", **side}, where)
    if policy.hardware is None or policy.model is None:
        raise InputError(f"{where}: give hardware and model")
    scenario = Scenario(trace, load_hardware(policy.hardware), load_model(policy.model), policy)
    return scenario.replay(concurrency=concurrency)


def _value(metric: str, rep: Any) -> float:
    raw = rep.raw
    served = ~np.isnan(raw.finish_s)
    if not served.any():
        return math.nan
    if metric == "throughput":
        out = float(np.sum(rep.trace.output_tokens[served]))
        span = float(np.max(raw.finish_s[served]) - np.min(raw.arrival_s))
        return out / span if span > 0 else math.nan
    if metric == "latency":
        return float(np.mean(raw.finish_s[served] - raw.arrival_s[served]))
    pick = served
    if metric == "ttft_reuse":  # the turns that found earlier KV (HBM or a lower tier)
        reused = raw.hit_blocks > 0
        if raw.loaded_blocks.size:
            reused |= raw.loaded_blocks.sum(axis=1) > 0
        pick = served & reused
        if not pick.any():
            return math.nan
    return float(np.mean(raw.first_token_s[pick] - raw.arrival_s[pick]))


def run_check(path: Path) -> ArchCheck:
    data = load_scenario(path)
    fig, work = data["figure"], data["workload"]
    trace = _trace(work, path)
    conc = int(work.get("concurrency", 0))
    base = _value(fig["metric"], _replay(trace, data["baseline"], conc, f"{path} [baseline]"))
    syst = _value(fig["metric"], _replay(trace, data["system"], conc, f"{path} [system]"))
    model = syst / base if fig["metric"] == "throughput" else base / syst
    return ArchCheck(
        name=path.stem,
        source=str(fig.get("source", "")),
        read=str(fig.get("read", "")),
        metric=fig["metric"],
        published=float(fig["published"]),
        tolerance=float(fig["tolerance"]),
        model=float(model),
        baseline_value=base,
        system_value=syst,
        gap=str(fig.get("gap", "")),
    )


def run_architectures(directory: Path | None = None) -> ArchValidation:
    """Every scenario of ``directory`` (the built-in ones by default), in name order."""
    directory = ARCH_DIR if directory is None else directory
    return ArchValidation([run_check(p) for p in sorted(directory.glob("*.toml"))])
