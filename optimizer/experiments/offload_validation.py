"""``kvtier validate offload``: published, measured offload runs beside the model's replay.

Each run is a scenario file under ``policies/presets/validation/offload/``. It declares, before
anything is replayed, its ``role`` (``calibration``: a figure some parameter was set from, shown
but never counted; ``check``: counted), where it was published and exactly what was read
(``[source]``), the conditions it ran under (``[conditions]``: hardware and its topology,
model, instances and tp, the workload, the load generator), the two deployments it compares
(``[baseline]`` without the tier, ``[tiered]`` with it: a built-in preset and ``--set``
overrides), and the measured figures of each (``[measured.baseline]``, ``[measured.tiered]``:
mean TTFT, throughput, the hit ratio where published; a sweep may publish its whole replay's
external hit ratio, ``sweep_external_hit_ratio`` below). Where a source publishes them, the
P90 TTFT and the mean and P90 end-to-end latency (``ttft_p90_s``, ``e2e_mean_s``,
``e2e_p90_s``) are compared too and reported with their MAPE, without a target: the
targets are on mean TTFT, throughput and hit ratio, and these show where a replay's time goes
wrong (queueing in the tail, decode speed in the end-to-end latency).

Workloads (``conditions.workload``):

- ``shared_prefix``: inference-perf's shared-prefix generator, ``groups`` system prompts of
  ``system_tokens`` each, ``prompts_per_group`` questions of ``question_tokens`` per group,
  ``output_tokens`` out; ``requests`` requests take the prompts of one seeded shuffle in turn
  (request ``k``: prompt ``k mod P``, inference-perf's ``load_lazy_data``), so past ``P``
  requests the first prompts are sent again;
- ``rounds``: ``requests`` distinct prompts of ``input_tokens`` sent at once, then the same
  prompts again once the first round has finished (a cold round, then a full-hit round: the
  baseline figures are the first round's, the tiered figures the second's, one replay);
- ``multiturn``: SGLang's ``benchmark/hicache/bench_multiturn.py``: ``clients``
  conversations of ``rounds`` rounds, each round's prompt the conversation so far (every
  earlier prompt and answer) plus ``request_tokens`` new tokens, ``output_tokens`` out; the
  requests round-major, each round's clients in a seeded random order (its ready queue pops
  at random). Its load is ``round_barrier``.

Load (``conditions.load``): ``poisson`` at ``rate`` requests/s (seeded), ``concurrency`` (a
closed loop of ``concurrency`` clients, ``kvtier replay --concurrency``), ``burst`` (all at
t = 0), ``round_barrier`` (a ``multiturn`` run's: at most ``concurrency`` requests in flight,
no round's request sent before the last round's have all finished, ``kvtier replay
--concurrency N --round-barrier clients``; the client's own pacing between sends is not
modelled), or ``poisson_stages``: inference-perf's multi-stage Poisson sweep as it runs it
(kubernetes-sigs/inference-perf ``loadgen/load_generator.py`` and ``load_timer.py``, read at
main 2026-08-19): ``stages`` ``[rate, duration]`` one after the other against the same servers,
each stage sending ``int(rate * duration)`` requests, drained before the next starts, with
``stage_interval_s`` between stages; each second of a stage carries a Poisson(rate) count of
requests spread over it; request ``k`` of every stage takes prompt ``k mod P`` of one shuffled
list (the datagen's ``get_data`` restarts at index 0 each stage), so later stages resend the
earlier stages' prompts into a warm cache. The run's figures are those of stage
``measured_stage`` (1-based) over its own requests, as inference-perf's per-stage report. One
replay of the sweep serves every run that measures another stage of it (cached per process).
Throughput is ``throughput_unit``: ``tok/s`` (input plus output tokens over the run's
span, as inference-perf's "overall throughput"), ``out tok/s`` (output tokens only over the
same span, as llm-d's gpt-oss results tabulate it), ``in tok/s`` (prompt tokens only, as
``bench_multiturn.py``'s "input token throughput") or ``req/s``.

``harness_output_tokens`` (``{baseline = n, tiered = n}``, optional): the output tokens per
request the load generator *counted*, where that differs from what the server generated.
inference-perf from PR #410 (2026-04-24) to PR #565 (2026-06-23) re-counted a streamed
response chunk by chunk, each chunk tokenized with the tokenizer's special tokens, so a
tokenizer that adds one per call counted up to twice the tokens the server sent (its issue
#564: "output_len above the configured max_tokens cap"); its throughput figures summed those
counts (``reportgen/base.py`` ``summarize_requests``, read at both commits). The server's count
is ``output_tokens`` (the requests' ``max_tokens`` with ``ignore_eos``); the harness's is its
summary's output tokens over its requests. The model's output tokens are then counted as the
harness counted them, ``harness_output_tokens / output_tokens`` each, so the measured figure
stays the published one; only what the model reports changes, never what it replays.

``sweep_external_hit_ratio`` (``poisson_stages`` runs only): vLLM's fleet
``vllm:external_prefix_cache_hits`` over ``_queries`` for the whole sweep, the tokens a KV
connector supplied over the prompt tokens not found in HBM when each request was scheduled
(vLLM 0.24.0 ``v1/core/sched/scheduler.py``, docs/sources.md [vLLM-0.24.0-hma]); the model's is
the lower tiers' loaded tokens over the prompt tokens less the HBM hits, over every request of
the sweep's replay, not the run's stage. A sweep states it in one of its stage files only.

The targets over the checks (docs/validation-offload.md): TTFT MAPE <= 15 %, throughput MAPE
<= 10 %, hit ratios within 5 points; :meth:`OffloadValidation.missed` names each one missed.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.errors import InputError
from kvtier.experiments.serving_validation import check_keys
from kvtier.policy.presets import BUILTIN_DIR

OFFLOAD_DIR = BUILTIN_DIR / "validation" / "offload"
ROLES = ("check", "calibration")
WORKLOADS = ("shared_prefix", "rounds", "multiturn")
LOADS = ("poisson", "concurrency", "burst", "poisson_stages", "round_barrier")
UNITS = ("tok/s", "out tok/s", "in tok/s", "req/s")
SIDES = ("baseline", "tiered")
# a multiturn run's counts, each an integer >= 1
MULTITURN_COUNTS = ("clients", "rounds", "request_tokens", "concurrency")
# figures compared without a target: the latency tail and the whole request's latency, which
# show where the model's time goes wrong when the mean TTFT alone does not (the figures llm-d's
# simulator study scores itself on; docs/validation-offload.md)
REPORTED = ("ttft_p90_s", "e2e_mean_s", "e2e_p90_s")
METRICS = ("ttft_mean_s", "throughput", "hit_ratio", "sweep_external_hit_ratio", *REPORTED)
HIT_METRICS = ("hit_ratio", "sweep_external_hit_ratio")  # shares: errors in points
TARGETS = {"ttft_mean_s": 0.15, "throughput": 0.10}  # MAPE over the checks
HIT_POINTS = 0.05  # hit ratio within 5 points
NATIVE_BLOCK = 16  # the traces' hash granularity: every published length is a multiple of it
ROUND_GAP_S = 1.0e6  # the second round starts long after the first has finished
# A sweep's stage k starts at k * STAGE_GAP_S: after the previous stage has drained (checked
# after the replay) and its interval has passed. Nothing in the model ages with idle time, so
# a longer idle gap than the measured one (drain + stage_interval_s) changes no figure.
STAGE_GAP_S = 1.0e5

_TOP = {"role", "system", "source", "conditions", "baseline", "tiered", "measured"}
_SOURCE = {"title", "url", "date", "read"}
_CONDITIONS = {
    "hardware",
    "hosts",
    "gpus_per_host",
    "model",
    "workload",
    "groups",
    "prompts_per_group",
    "system_tokens",
    "question_tokens",
    "input_tokens",
    "clients",
    "rounds",
    "request_tokens",
    "output_tokens",
    "requests",
    "load",
    "rate",
    "concurrency",
    "stages",
    "stage_interval_s",
    "measured_stage",
    "throughput_unit",
    "harness_output_tokens",
    "seed",
    "notes",
}
_DEPLOY = {"preset", "set"}


@dataclass(frozen=True)
class OffloadRun:
    """One published run: its role, source, conditions and both deployments' figures."""

    name: str
    role: str
    system: str
    source: dict[str, str]
    conditions: dict[str, Any]
    deploy: dict[str, dict[str, Any]]  # side -> {"preset", "set"}
    measured: dict[str, dict[str, float]]  # side -> metric -> value
    path: str

    @property
    def unit(self) -> str:
        return str(self.conditions.get("throughput_unit", "tok/s"))

    def output_count(self, side: str) -> float:
        """How many output tokens the harness counted for each one the server sent (1 unless
        ``harness_output_tokens`` says otherwise)."""
        counted = self.conditions.get("harness_output_tokens")
        if counted is None:
            return 1.0
        return float(counted[side]) / float(self.conditions["output_tokens"])


@dataclass(frozen=True)
class Cell:
    """One measured figure of a run beside the model's."""

    run: str
    role: str
    side: str
    metric: str
    measured: float
    model: float | None

    @property
    def error(self) -> float | None:
        """Relative error (model / measured - 1); for a hit ratio, the difference in points."""
        if self.model is None:
            return None
        if self.metric in HIT_METRICS:
            return self.model - self.measured
        return self.model / self.measured - 1.0


@dataclass(frozen=True)
class Miss:
    metric: str
    value: float
    target: float
    runs: tuple[str, ...] = ()


@dataclass
class OffloadValidation:
    runs: list[OffloadRun]
    cells: list[Cell]
    notes: dict[str, str]  # run -> why the model could not run it (empty when it ran)

    def checks(self, metric: str) -> list[Cell]:
        return [c for c in self.cells if c.role == "check" and c.metric == metric]

    def mape(self, metric: str) -> float | None:
        errs = [abs(c.error) for c in self.checks(metric) if c.error is not None]
        return float(np.mean(errs)) if errs else None

    def lean(self, metric: str) -> tuple[int, int]:
        """How many checks of ``metric`` the model puts below and above the measured figure: a
        MAPE hides whether its errors cancel or all point one way (an optimistic model)."""
        errs = [c.error for c in self.checks(metric) if c.error is not None]
        return sum(e < 0 for e in errs), sum(e > 0 for e in errs)

    def missed(self) -> list[Miss]:
        out = []
        for metric, target in TARGETS.items():
            m = self.mape(metric)
            if m is None or m > target:
                worst = sorted(
                    (c for c in self.checks(metric) if c.error is not None),
                    key=lambda c: -abs(c.error or 0.0),
                )
                out.append(
                    Miss(metric, float("nan") if m is None else m, target,
                         tuple(dict.fromkeys(c.run for c in worst[:3])))
                )  # fmt: skip
        for metric in HIT_METRICS:
            far = [c for c in self.checks(metric) if c.error is None or abs(c.error) > HIT_POINTS]
            if far:
                worst = max(abs(c.error) if c.error is not None else np.inf for c in far)
                runs = tuple(dict.fromkeys(c.run for c in far))
                out.append(Miss(metric, float(worst), HIT_POINTS, runs))
        for name, why in self.notes.items():
            if why and any(r.name == name and r.role == "check" for r in self.runs):
                out.append(Miss("ran", float("nan"), 0.0, (name,)))
        return out


def load_run(path: Path) -> OffloadRun:
    """One scenario file, checked: every key known, the role declared first, the workload,
    load and unit valid, both sides' figures positive."""
    text = path.read_text()
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"{path}: not TOML ({err})") from None
    first = next((ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")), "")
    if not first.replace(" ", "").startswith("role="):
        raise InputError(f"{path}: the role (calibration or check) must be declared first")
    check_keys(data, _TOP, "", str(path))
    for key in _TOP:
        if key not in data:
            raise InputError(f"{path}: missing key {key}")
    if data["role"] not in ROLES:
        raise InputError(f"{path}: role {data['role']!r} (valid: {', '.join(ROLES)})")
    check_keys(data["source"], _SOURCE, "source", str(path))
    if sorted(_SOURCE - set(data["source"])):
        raise InputError(f"{path}: missing key source.{sorted(_SOURCE - set(data['source']))[0]}")
    cond = dict(data["conditions"])
    check_keys(cond, _CONDITIONS, "conditions", str(path))
    for key, choices in (("workload", WORKLOADS), ("load", LOADS)):
        if cond.get(key) not in choices:
            raise InputError(
                f"{path}: conditions.{key} {cond.get(key)!r} (valid: {', '.join(choices)})"
            )
    if cond.get("throughput_unit", "tok/s") not in UNITS:
        raise InputError(f"{path}: conditions.throughput_unit (valid: {', '.join(UNITS)})")
    required = ["hardware", "model", "output_tokens"]
    _check_harness_count(cond, path)
    if cond["load"] == "poisson_stages":
        required += ["stages", "measured_stage"]
        stages = cond.get("stages")
        ok = isinstance(stages, list) and bool(stages) and all(
            isinstance(st, list) and len(st) == 2 and all(
                isinstance(v, (int, float)) and v > 0 for v in st
            ) for st in stages
        )  # fmt: skip
        if "stages" in cond and not ok:
            raise InputError(f"{path}: conditions.stages must be a list of [rate, duration] > 0")
        m = cond.get("measured_stage")
        if "measured_stage" in cond and not (isinstance(m, int) and ok and 1 <= m <= len(stages)):
            raise InputError(f"{path}: conditions.measured_stage must be a stage number (1-based)")
        if cond["workload"] != "shared_prefix":
            raise InputError(f"{path}: load poisson_stages needs workload shared_prefix")
    elif cond["workload"] == "multiturn" or cond["load"] == "round_barrier":
        if cond["workload"] != "multiturn" or cond["load"] != "round_barrier":
            raise InputError(f"{path}: workload multiturn goes with load round_barrier, only")
        required += MULTITURN_COUNTS
        for key in MULTITURN_COUNTS:
            v = cond.get(key)
            if key in cond and not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise InputError(f"{path}: conditions.{key} must be an integer >= 1, got {v!r}")
    else:
        required.append("requests")
    for key in required:
        if key not in cond:
            raise InputError(f"{path}: missing key conditions.{key}")
    deploy: dict[str, dict[str, Any]] = {}
    for side in SIDES:
        table = data.get(side, {})
        check_keys(table, _DEPLOY, side, str(path))
        if "preset" not in table:
            raise InputError(f"{path}: missing key {side}.preset")
        deploy[side] = {"preset": table["preset"], "set": dict(table.get("set", {}))}
    measured: dict[str, dict[str, float]] = {}
    for side in SIDES:
        figs = dict(data["measured"].get(side, {}))
        check_keys(figs, set(METRICS), f"measured.{side}", str(path))
        for metric, value in figs.items():
            ok = 0 <= value <= 1 if metric in HIT_METRICS else value > 0
            if not isinstance(value, (int, float)) or not ok:
                raise InputError(f"{path}: measured.{side}.{metric} out of range: {value!r}")
        if "sweep_external_hit_ratio" in figs and cond["load"] != "poisson_stages":
            raise InputError(
                f"{path}: measured.{side}.sweep_external_hit_ratio needs load poisson_stages"
            )
        measured[side] = {k: float(v) for k, v in figs.items()}
    if not any(measured[s] for s in SIDES):
        raise InputError(f"{path}: no measured figure")
    return OffloadRun(
        path.stem,
        data["role"],
        str(data["system"]),
        dict(data["source"]),
        cond,
        deploy,
        measured,
        str(path),
    )


def _check_harness_count(cond: dict[str, Any], path: Path) -> None:
    """``harness_output_tokens``: a count per side, each at least the server's, on a run whose
    throughput counts output tokens."""
    counted = cond.get("harness_output_tokens")
    if counted is None:
        return
    where = f"{path}: conditions.harness_output_tokens"
    if not isinstance(counted, dict):
        raise InputError(f"{where} must be a table {{baseline = n, tiered = n}}")
    check_keys(counted, set(SIDES), "conditions.harness_output_tokens", str(path))
    if cond.get("throughput_unit", "tok/s") == "req/s":
        raise InputError(f"{where} needs a throughput in tokens (throughput_unit req/s)")
    out = cond.get("output_tokens")
    for side in SIDES:
        value = counted.get(side)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise InputError(f"{where}.{side} must be a number (missing or {value!r})")
        if isinstance(out, (int, float)) and not out <= value < 100 * out:
            raise InputError(
                f"{where}.{side} {value!r} must be at least output_tokens ({out}) and "
                "below 100 times it"
            )


def load_catalogue(directory: Path = OFFLOAD_DIR) -> list[OffloadRun]:
    """Every run of the catalogue, by file name."""
    return [load_run(p) for p in sorted(directory.glob("*.toml"))]


def _prompts(c: dict[str, Any]) -> list[np.ndarray]:
    """Each distinct prompt's native block hashes (16-token blocks, chained by construction:
    a shared system prompt's blocks are shared, every other block is the prompt's own)."""
    nxt = 1
    out: list[np.ndarray] = []
    if c["workload"] == "rounds":
        per = int(c["input_tokens"]) // NATIVE_BLOCK
        for _ in range(int(c["requests"])):
            out.append(np.arange(nxt, nxt + per, dtype=np.uint64))
            nxt += per
        return out
    sys_blocks = int(c["system_tokens"]) // NATIVE_BLOCK
    q_blocks = -(-int(c["question_tokens"]) // NATIVE_BLOCK)
    for _ in range(int(c["groups"])):
        system = np.arange(nxt, nxt + sys_blocks, dtype=np.uint64)
        nxt += sys_blocks
        for _ in range(int(c["prompts_per_group"])):
            q = np.arange(nxt, nxt + q_blocks, dtype=np.uint64)
            nxt += q_blocks
            out.append(np.concatenate([system, q]))
    return out


def _conversations(c: dict[str, Any], rng: np.random.Generator) -> tuple[list[np.ndarray], Any]:
    """A ``multiturn`` run's prompts (native block hashes) and lengths, round-major, each
    round's clients in a seeded random order. Each conversation is one token stream whose
    16-token blocks are its own; round ``r``'s prompt is its first ``(r + 1) * request_tokens +
    r * output_tokens`` tokens (every answer is part of the history), a partial last block a
    hash of that prompt alone."""
    clients, rounds = int(c["clients"]), int(c["rounds"])
    new, out = int(c["request_tokens"]), int(c["output_tokens"])
    longest = rounds * new + (rounds - 1) * out
    per_stream = -(-longest // NATIVE_BLOCK)
    tail_id = 1 + clients * per_stream  # partial blocks: ids past every stream's
    prompts: list[np.ndarray] = []
    lengths: list[int] = []
    for r in range(rounds):
        length = (r + 1) * new + r * out
        full, part = divmod(length, NATIVE_BLOCK)
        for client in rng.permutation(clients):
            base = 1 + int(client) * per_stream
            blocks = np.arange(base, base + full, dtype=np.uint64)
            if part:
                blocks = np.append(blocks, np.uint64(tail_id))
                tail_id += 1
            prompts.append(blocks)
            lengths.append(length)
    return prompts, np.asarray(lengths, dtype=np.int64)


def _poisson_stage(rng: np.random.Generator, rate: float, n: int) -> np.ndarray:
    """inference-perf's ``PoissonLoadTimer``: each second a Poisson(rate) count of requests,
    their exponential gaps scaled to fill that second (``ConstantLoadTimer`` over 1 s); the
    first ``n`` send times from 0."""
    out: list[float] = []
    second = 0.0
    while len(out) < n:
        k = int(rng.poisson(rate))
        if k >= 1:
            gaps = rng.exponential(1.0 / rate, k)
            out.extend(second + np.cumsum(gaps / gaps.sum()))
        second += 1.0
    return np.asarray(out[:n])


def _concurrent_sends(rng: np.random.Generator, n: int) -> np.ndarray:
    """inference-perf's concurrent load: ``main.py`` turns the stage into ``rate = n`` over
    ``duration = 1`` s, so ``ConstantLoadTimer`` queues every request within the first second
    (``n`` exponential gaps scaled to sum to 1 s); the closed loop then sends each at the later
    of that time and a freed slot."""
    gaps = rng.exponential(1.0 / n, n)
    return np.cumsum(gaps / gaps.sum())


def _sweep(c: dict[str, Any], rng: np.random.Generator, n_prompts: int) -> tuple[Any, Any]:
    """The prompt of each request and its send time over a multi-stage sweep: one shuffled
    prompt list, stage ``s`` sends ``int(rate * duration)`` requests taking prompts 0, 1, ...
    of it (mod its length), starting at ``s * STAGE_GAP_S``."""
    shuffled = rng.permutation(n_prompts)
    order, arrival = [], []
    for s, (rate, duration) in enumerate(c["stages"]):
        n = int(float(rate) * float(duration))
        order.append(shuffled[np.arange(n) % n_prompts])
        arrival.append(s * STAGE_GAP_S + _poisson_stage(rng, float(rate), n))
    return np.concatenate(order), np.concatenate(arrival)


def stage_of(trace: Any) -> np.ndarray:
    """Each request's stage (0-based) in a sweep's trace."""
    return (np.asarray(trace.arrival_s) // STAGE_GAP_S).astype(np.int64)


def build_trace(run: OffloadRun) -> Any:
    """The run's requests as a trace (arrivals of the open-loop or burst load; a closed loop's
    sends are the replay's)."""
    c = run.conditions
    rng = np.random.default_rng(int(c.get("seed", 1)))
    if c["workload"] == "multiturn":
        blocks, input_tokens = _conversations(c, rng)
        return _trace(run, np.zeros(len(blocks)), input_tokens, blocks)
    prompts = _prompts(c)
    if c["workload"] == "rounds":
        n = int(c["requests"])
        order = np.concatenate([np.arange(n), np.arange(n)])
        input_tokens = np.full(2 * n, int(c["input_tokens"]), dtype=np.int64)
        arrival = np.concatenate([np.zeros(n), np.full(n, ROUND_GAP_S)])
    else:
        isl = int(c["system_tokens"]) + int(c["question_tokens"])
        if c["load"] == "poisson_stages":
            order, arrival = _sweep(c, rng, len(prompts))
        else:
            # inference-perf's shared-prefix datagen: the prompts shuffled once, request k
            # takes prompt k mod P (its concurrent, constant and Poisson loads alike)
            n = int(c["requests"])
            order = rng.permutation(len(prompts))[np.arange(n) % len(prompts)]
            if c["load"] == "poisson":
                arrival = np.cumsum(rng.exponential(1.0 / float(c["rate"]), n))
                arrival -= arrival[0]
            else:
                arrival = _concurrent_sends(rng, n)
        input_tokens = np.full(len(order), isl, dtype=np.int64)
    return _trace(run, arrival, input_tokens, [prompts[i] for i in order])


def _trace(run: OffloadRun, arrival: Any, input_tokens: Any, blocks: list[np.ndarray]) -> Any:
    """A trace of these requests (every one ``output_tokens`` out)."""
    from kvtier.trace.format import Trace

    c = run.conditions
    offsets = np.zeros(len(blocks) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in blocks])
    return Trace.from_arrays(
        arrival_s=arrival,
        input_tokens=input_tokens,
        output_tokens=np.full(len(blocks), int(c["output_tokens"]), dtype=np.int64),
        hash_offsets=offsets,
        hashes=np.concatenate(blocks),
        block_tokens=NATIVE_BLOCK,
        source=f"validation offload {run.name}",
    )


def _hardware(run: OffloadRun) -> Any:
    from kvtier.hardware import load_hardware

    c = run.conditions
    hw = load_hardware(c["hardware"])
    topo = hw.topology
    return replace(
        hw,
        topology=replace(
            topo,
            hosts=int(c.get("hosts", topo.hosts)),
            gpus_per_host=int(c.get("gpus_per_host", topo.gpus_per_host)),
        ),
    )


def _policy(run: OffloadRun, side: str) -> Any:
    from kvtier.policy.overrides import apply_overrides
    from kvtier.policy.presets import load_preset

    d = run.deploy[side]
    policy = load_preset(d["preset"])
    return apply_overrides(policy, d["set"], f"{run.path} [{side}.set]")


def _arrivals(trace: Any, raw: Any) -> np.ndarray:
    """When each request was sent: the replay's (a closed loop's sends) or the trace's."""
    return raw.arrival_s if raw.arrival_s is not None else trace.arrival_s


def _prompt_blocks(raw: Any, sel: np.ndarray) -> tuple[int, int]:
    """The blocks of the requests ``sel``'s prompts hit in HBM and loaded from a lower tier."""
    loaded = int(raw.loaded_blocks[sel].sum()) if raw.loaded_blocks.size else 0
    return int(raw.hit_blocks[sel].sum()), loaded


def _figures(
    trace: Any, raw: Any, metrics: Any, sel: np.ndarray, unit: str, output_count: float = 1.0
) -> dict[str, float]:
    """Mean TTFT, throughput and hit ratio of the requests ``sel`` of one replay; output tokens
    counted ``output_count`` times each (:meth:`OffloadRun.output_count`)."""
    arrival = _arrivals(trace, raw)
    first, finish = raw.first_token_s[sel], raw.finish_s[sel]
    served = ~np.isnan(finish)
    span = float(np.max(finish[served]) - np.min(arrival[sel])) if served.any() else np.nan
    if unit == "req/s":
        throughput = float(served.sum()) / span
    elif unit == "out tok/s":
        throughput = output_count * float(trace.output_tokens[sel][served].sum()) / span
    elif unit == "in tok/s":
        throughput = float(trace.input_tokens[sel][served].sum()) / span
    else:
        out_tokens = output_count * float(trace.output_tokens[sel][served].sum())
        throughput = (float(trace.input_tokens[sel][served].sum()) + out_tokens) / span
    ttft, e2e = first - arrival[sel], finish - arrival[sel]
    out = {
        "ttft_mean_s": float(np.nanmean(ttft)),
        "throughput": throughput,
        # inference-perf's percentiles are numpy's (reportgen/base.py summarize), its request
        # latency end_time - start_time
        "ttft_p90_s": float(np.nanpercentile(ttft, 90)),
        "e2e_mean_s": float(np.nanmean(e2e)),
        "e2e_p90_s": float(np.nanpercentile(e2e, 90)),
    }
    if metrics is not None:
        out["hit_ratio"] = float(sum(metrics.hit_ratio_tokens.values()))
    return out


def _hit_ratio(trace: Any, raw: Any, sel: np.ndarray) -> float:
    """Prompt tokens found in HBM or a lower tier over prompt tokens, for the requests
    ``sel``."""
    hbm, loaded = _prompt_blocks(raw, sel)
    return float((hbm + loaded) * trace.block_tokens) / float(trace.input_tokens[sel].sum())


def _external_hit_ratio(trace: Any, raw: Any) -> float:
    """Lower-tier loaded tokens over the prompt tokens not hit in HBM, over the whole replay
    (vLLM's ``external_prefix_cache_hits / _queries``)."""
    loaded = float(raw.loaded_blocks.sum()) if raw.loaded_blocks.size else 0.0
    queried = float(trace.input_tokens.sum()) - float(raw.hit_blocks.sum()) * trace.block_tokens
    return loaded * trace.block_tokens / queried if queried > 0 else 0.0


# each side's replay per deployment: a sweep's is shared by its stages' runs, and
# stage_breakdown reads the replays validate offload made
_REPLAYS: dict[str, Any] = {}


def _replay_key(run: OffloadRun, side: str, efficiency: Mapping[str, float] | None = None) -> str:
    """What a replay depends on: the conditions (but which stage is measured, and notes), the
    side's deployment, the efficiency fields set over the profile's."""
    import json

    report_only = ("measured_stage", "notes", "harness_output_tokens")
    cond = {k: v for k, v in run.conditions.items() if k not in report_only}
    return json.dumps([cond, run.deploy[side], dict(efficiency or {})], sort_keys=True)


def _check_drained(run: OffloadRun, side: str, rep: Any) -> None:
    """inference-perf starts a stage only once the previous one has finished: every stage's
    last request must finish before the next stage's first send."""
    stage = stage_of(rep.trace)
    finish = np.asarray(rep.raw.finish_s)
    for s in range(int(stage.max())):
        last = float(np.nanmax(finish[stage == s]))
        if np.isnan(finish[stage == s]).any() or last >= (s + 1) * STAGE_GAP_S:
            raise InputError(
                f"{run.name} [{side}]: stage {s + 1} did not drain before stage {s + 2}"
            )


def _stages(run: OffloadRun, trace: Any) -> np.ndarray:
    """Each request's stage (0-based): a sweep's stages, a ``rounds`` run's cold round (0) and
    its repeat (1), one stage for any other load."""
    c = run.conditions
    n = len(trace.arrival_s)
    if c["load"] == "poisson_stages":
        return stage_of(trace)
    if c["workload"] == "rounds":
        return (np.arange(n) >= n // 2).astype(np.int64)
    if c["workload"] == "multiturn":
        return np.arange(n, dtype=np.int64) // int(c["clients"])
    return np.zeros(n, dtype=np.int64)


def model_figures(
    run: OffloadRun, efficiency: Mapping[str, float] | None = None
) -> dict[str, dict[str, float]]:
    """The model's figures of both sides (a ``rounds`` run: one replay, its two rounds).
    ``efficiency`` sets fields of the hardware profile's ``[efficiency]`` over the run's (a
    sensitivity study, ``scripts/step_time_sensitivity.py``; the validation sets none)."""
    from kvtier.hardware import load_model
    from kvtier.scenario import Scenario

    c = run.conditions
    hw, model = _hardware(run), load_model(c["model"])
    if efficiency:
        hw = replace(hw, efficiency=replace(hw.efficiency, **efficiency))
    trace = build_trace(run)
    closed = int(c.get("concurrency", 0)) if c["load"] in ("concurrency", "round_barrier") else 0
    barrier = int(c["clients"]) if c["load"] == "round_barrier" else 0
    out: dict[str, dict[str, float]] = {}
    sides = ("tiered",) if c["workload"] == "rounds" else SIDES
    for side in sides:
        key = _replay_key(run, side, efficiency)
        rep = _REPLAYS.get(key)
        if rep is None:
            policy = _policy(run, side)
            rep = Scenario(trace, hw, model, policy).replay(concurrency=closed, round_size=barrier)
            if c["load"] == "poisson_stages":
                _check_drained(run, side, rep)
            _REPLAYS[key] = rep
        n = len(rep.trace.arrival_s)
        if c["load"] == "poisson_stages":
            sel = np.flatnonzero(_stages(run, rep.trace) == int(c["measured_stage"]) - 1)
            figs = _figures(rep.trace, rep.raw, None, sel, run.unit, run.output_count(side))
            figs["hit_ratio"] = _hit_ratio(rep.trace, rep.raw, sel)
            figs["sweep_external_hit_ratio"] = _external_hit_ratio(rep.trace, rep.raw)
            out[side] = figs
        elif c["workload"] == "rounds":
            rounds = _stages(run, rep.trace)
            for r, name in enumerate(("baseline", "tiered")):
                sel = np.flatnonzero(rounds == r)
                figs = _figures(rep.trace, rep.raw, None, sel, run.unit, run.output_count(name))
                figs["hit_ratio"] = _hit_ratio(rep.trace, rep.raw, sel)
                out[name] = figs
        else:
            count = run.output_count(side)
            figs = _figures(rep.trace, rep.raw, rep.metrics, np.arange(n), run.unit, count)
            out[side] = figs
    return out


@dataclass(frozen=True)
class StageRow:
    """One stage of one side's replay (a sweep's stage, a round, or a whole closed-loop run):
    what decided its figures. The prompt tokens split into those hit in HBM, those loaded from
    a lower tier and those computed; TPOT is first token to last over the tokens after the
    first."""

    side: str
    stage: int  # 1-based
    requests: int
    ttft_mean_s: float
    ttft_p50_s: float
    e2e_mean_s: float
    tpot_ms: float
    hbm_share: float
    loaded_share: float
    computed_share: float
    preemptions: int


def stage_breakdown(run: OffloadRun) -> list[StageRow]:
    """Per side and stage, the requests' latencies and where their prompt tokens came from,
    read from the replays :func:`model_figures` made (replayed here if it has not run)."""
    c = run.conditions
    sides = ("tiered",) if c["workload"] == "rounds" else SIDES
    if any(_replay_key(run, side) not in _REPLAYS for side in sides):
        model_figures(run)
    rows: list[StageRow] = []
    for side in sides:
        rep = _REPLAYS[_replay_key(run, side)]
        trace, raw = rep.trace, rep.raw
        stage = _stages(run, trace)
        for s in range(int(stage.max()) + 1):
            rows.append(_stage_row(side, s, trace, raw, np.flatnonzero(stage == s)))
    return rows


def _stage_row(side: str, s: int, trace: Any, raw: Any, sel: np.ndarray) -> StageRow:
    arrival = _arrivals(trace, raw)
    first, finish = raw.first_token_s[sel], raw.finish_s[sel]
    ttft = first - arrival[sel]
    after_first = np.maximum(trace.output_tokens[sel] - 1, 1)
    prompt = float(trace.input_tokens[sel].sum())
    hbm_blocks, loaded_blocks = _prompt_blocks(raw, sel)
    hbm = hbm_blocks * trace.block_tokens / prompt
    loaded = loaded_blocks * trace.block_tokens / prompt
    preempted = raw.preemptions[sel].sum() if raw.preemptions is not None else 0
    return StageRow(
        side=side,
        stage=s + 1,
        requests=len(sel),
        ttft_mean_s=float(np.nanmean(ttft)),
        ttft_p50_s=float(np.nanmedian(ttft)),
        e2e_mean_s=float(np.nanmean(finish - arrival[sel])),
        tpot_ms=1e3 * float(np.nanmean((finish - first) / after_first)),
        hbm_share=hbm,
        loaded_share=loaded,
        computed_share=1.0 - hbm - loaded,
        preemptions=int(preempted),
    )


def run_offload(
    runs: list[OffloadRun] | None = None, efficiency: Mapping[str, float] | None = None
) -> OffloadValidation:
    """Replay every run, both sides, and set each measured figure beside the model's
    (``efficiency``: :func:`model_figures`'s)."""
    runs = load_catalogue() if runs is None else runs
    if not runs:
        raise InputError(f"no offload runs in {OFFLOAD_DIR}")
    cells: list[Cell] = []
    notes: dict[str, str] = {}
    for run in runs:
        try:
            model = model_figures(run, efficiency)
            notes[run.name] = ""
        except InputError as err:
            model, notes[run.name] = {}, err.message
        for side in SIDES:
            for metric, value in run.measured[side].items():
                got = model.get(side, {}).get(metric)
                cells.append(Cell(run.name, run.role, side, metric, value, got))
    return OffloadValidation(runs, cells, notes)
