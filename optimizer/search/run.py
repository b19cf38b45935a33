"""``optimize``: the main job, from a trace file to a policy file.

Loads the trace and profiles, builds the evaluator and the study, warm-starts it, runs the
trials (threads share one process; the numba engine releases the GIL), picks the cheapest
policy per token that meets the SLO, evaluates the baselines on the same trace, and writes the
winner as a policy file with its metrics and provenance.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from kvtier import __version__
from kvtier.deploy.sample import sample_bias
from kvtier.errors import InputError
from kvtier.files import check_output, guard_outputs
from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import LOWER_TIERS
from kvtier.policy.file import sha256_of, write_policy_file
from kvtier.policy.model import (
    SLO,
    SLO_TERMS,
    Policy,
    movement_keys_without_effect,
    policy_from_dict,
    policy_to_dict,
    ran_split,
    without_inert_movement,
    without_inert_split,
)
from kvtier.scenario import Scenario, hardware_name, model_name
from kvtier.search.objective import Evaluation, Evaluator, binding_term
from kvtier.search.revision import model_revision
from kvtier.search.setup import StudySetup, check_study_trace, slo_to_dict
from kvtier.search.space import SearchSpace, load_space, restrict_to_target
from kvtier.search.study import (
    TrialSummary,
    best_feasible,
    check_study_setup,
    check_study_space,
    make_objective,
    make_runs_dir,
    open_study,
    pareto_front,
    record_outcome,
    tally,
)
from kvtier.search.warmstart import knee_capacities_gb, tier_additions, warm_start_trials
from kvtier.trace.sample_correction import sample_weighting

if TYPE_CHECKING:
    from kvtier.search.refine import Refined
    from kvtier.search.request import OptimizeRequest

DEFAULT_SLO = SLO(ttft_p99_s=2.0, tpot_p99_s=0.1)
SLO_ALIASES = {
    "ttft_mean": "ttft_mean_s",
    "ttft_p99": "ttft_p99_s",
    "ttft_p999": "ttft_p999_s",
    "tpot_p99": "tpot_p99_s",
    "tbt_p99": "tbt_p99_s",
}


def parse_slo(text: str | None) -> SLO:
    """``ttft_p99=5,ttft_mean=2,tpot_p99=0.1`` (seconds); None gives the default, an empty
    text is refused (an empty ``--slo`` is a mistake, not a request for the default)."""
    if text is None:
        return DEFAULT_SLO
    if not text.strip():
        raise InputError(
            "is empty; give terms like ttft_p99=5,tpot_p99=0.1 or leave it out for the default",
            option="--slo",
        )
    values: dict[str, float] = {}
    for part in text.split(","):
        name, sep, raw = part.partition("=")
        key = SLO_ALIASES.get(name.strip(), name.strip())
        if not sep or key not in SLO_TERMS:
            raise InputError(
                f"--slo takes terms like ttft_p99=5,ttft_mean=2,tpot_p99=0.1 "
                f"(known: {', '.join(SLO_ALIASES)}), got {part.strip()!r}",
                option="--slo",
            )
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise InputError(
                f"--slo {name.strip()} must be a positive number of seconds, got {raw.strip()!r}",
                option="--slo",
            )
        if key in values:
            raise InputError(f"--slo gives {name.strip()} twice", option="--slo")
        values[key] = value
    return SLO(**values)


@dataclass
class Baseline:
    name: str
    evaluation: Evaluation | None
    error: str | None = None


@dataclass
class OptimizeResult:
    study_name: str
    storage: str
    n_trials: int
    best: TrialSummary | None
    closest: TrialSummary | None
    binding: str | None
    front: list[TrialSummary]
    baselines: list[Baseline]
    policy_path: Path | None
    slo: SLO
    seconds: float
    new_trials: int
    warm_started: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    # the value of tiering: the cheapest policies meeting the SLO with and without lower tiers
    tiered: Choice | None = None
    hbm_only: Choice | None = None
    bound: Any = None  # kvtier.search.bound.SLOBound: what the SLO asks against what is possible
    runnable_by: list[str] = field(default_factory=list)  # targets that export the winner as is
    # --step-time-margin: the winner on every engine step (1 -/+ margin)x as long, per factor:
    # {factor, cost_per_mtok, ttft_p99_s, feasible, slo_attainment}
    step_margin: list[dict[str, Any]] = field(default_factory=list)
    target: str | None = None
    reached: list[TrialSummary] = field(default_factory=list)  # cost vs TTFT p99, all trials
    # on a sampled trace: which way the winner's and the presets' hit ratios are biased
    sample_warnings: list[str] = field(default_factory=list)
    sample_fraction: float = 1.0  # of a sampled trace: its replays ran on that share of the cluster
    # of a sample with prompt-length strata: how its latencies are weighted
    sample_weighting: str | None = None
    # the winner shrunk while the SLO holds (kvtier.search.refine); None with --no-refine
    refined: Refined | None = None
    # the winner's parameters as they took effect (effective_params)
    winner_params: dict[str, Any] = field(default_factory=dict)
    # without --target: the cheapest policy each target can run, beside the winner
    per_target: list[TargetBest] = field(default_factory=list)


@dataclass(frozen=True)
class Choice:
    """One answer to 'what should I run': its cost, GPUs and lower tiers, and where it came
    from (a trial of the study, or the HBM-only instance sweep)."""

    label: str
    cost_per_mtok: float
    cost_per_hour: float
    gpus: int
    tiers: dict[str, float]  # lower tier -> GB (pool sizes as the policy gives them)
    ttft_p99_s: float
    params: dict[str, Any]


# The trials that count toward --trials: those that ran to the end. A FAIL is a trial cut
# short (Ctrl-C, or a killed worker's trial failed by the heartbeat check, which enqueues it
# again); counting it would leave a resumed study one evaluated trial short of N.
FINISHED = (
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.PRUNED,
)


WORKER_ATTR = "kvtier_worker"  # the user attribute naming the worker that ran a trial


def _ran_by(study: optuna.Study, worker: str) -> int:
    """Finished trials that ``worker`` ran: on a study shared by several workers, each counts
    only its own."""
    return sum(
        1
        for t in study.get_trials(deepcopy=False, states=FINISHED)
        if t.user_attrs.get(WORKER_ATTR) == worker
    )


def _finished(study: optuna.Study) -> int:
    """Trials that ran (complete, pruned or failed); enqueued ones still waiting do not count.

    Read without copying the trials (``study.trials`` deep-copies every one of them, which
    after each trial of a long study cost more than the trial's replay)."""
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def baseline_policies(
    base: Policy, hw: Any = None, mdl: Any = None
) -> dict[str, Policy | InputError]:
    """What the best policy is compared with: every built-in preset of a current release, on
    the user's hardware (a past release's, kept for its validation scenario, is returned as the
    reason it is left out: :data:`kvtier.policy.presets.PAST_RELEASE_PRESETS`).

    A preset keeps its policy (block size, tiers, write policy, ...) but runs on the hardware
    and model being optimized, at the same SLO, with all instances; its tier capacities are its
    own. Given the hardware ``hw`` and model ``mdl``, a preset whose tensor-parallel size
    cannot hold the model's weights with room for KV runs at the smallest size that can
    (:func:`model_tp`). A preset that cannot run here is returned as the error saying why.
    """
    from kvtier.policy.presets import PAST_RELEASE_PRESETS, load_preset, preset_names

    out: dict[str, Policy | InputError] = {}
    for name in preset_names():
        if name in PAST_RELEASE_PRESETS:
            out[name] = InputError(PAST_RELEASE_PRESETS[name])
            continue
        try:
            preset = load_preset(name)
            serving = replace(preset.serving, instances=None)
            if hw is not None and mdl is not None:
                serving = _serving_that_fits(replace(preset, serving=serving), hw, mdl)
            out[name] = replace(
                preset, hardware=base.hardware, model=base.model, slo=base.slo, serving=serving
            )
        except InputError as err:
            out[name] = err
    return out


def kv_room(hw: Any, mdl: Any, tp: int, policy: Policy | None = None) -> float:
    """KV bytes an instance of ``tp`` GPUs of ``hw`` leaves beside ``mdl``'s weights, as the
    engine of ``policy`` (default: the default policy) sizes its budget at the policy's weight
    type (:func:`kvtier.deploy.kv_budget.kv_budget`, what the simulator then gives it)."""
    from kvtier.deploy.apply import apply_deployment
    from kvtier.deploy.kv_budget import kv_budget

    policy = Policy() if policy is None else policy
    hw, mdl = apply_deployment(hw, mdl, replace(policy, serving=replace(policy.serving, tp=None)))
    return kv_budget(hw, mdl, policy, tp).kv_bytes


def model_tp(hw: Any, mdl: Any, tp: int, policy: Policy | None = None) -> int | None:
    """``tp``, or when ``tp`` GPUs cannot hold ``mdl``'s weights with room for KV
    (:func:`kv_room` under ``policy``) the smallest size that can and that the hardware can
    place (:func:`kvtier.deploy.layout.pool_tp_choices`); None when none can."""
    from kvtier.deploy.layout import pool_tp_choices

    if kv_room(hw, mdl, tp, policy) > 0:
        return tp
    sizes = [t for t in pool_tp_choices(hw.topology) if t > tp]
    return next((t for t in sizes if kv_room(hw, mdl, t, policy) > 0), None)


def _serving_that_fits(policy: Policy, hw: Any, mdl: Any) -> Any:
    """``policy``'s serving at the tensor-parallel sizes ``mdl`` needs on ``hw`` under it
    (:func:`model_tp`)."""
    serving = policy.serving
    tp = serving.tp or hw.topology.tp
    fits = model_tp(hw, mdl, tp, policy)
    if fits is None:
        raise InputError(
            f"{mdl.name} does not fit on any tensor-parallel size of {hw.name} "
            f"(weights {mdl.weight_bytes / 1e9:,.0f} GB)"
        )
    changes: dict[str, Any] = {}
    if fits != tp:
        changes["tp"] = fits
    for key in ("prefill_tp", "decode_tp"):
        pool = getattr(serving, key)
        if pool is not None and (size := model_tp(hw, mdl, pool, policy)) != pool:
            if size is None:
                raise InputError(f"{mdl.name} does not fit on serving.{key} = {pool} GPUs")
            changes[key] = size
    return replace(serving, **changes) if changes else serving


def pool_tp_sizes(hardware: Any, model: Any = None) -> tuple[int, ...]:
    """Tensor-parallel sizes a prefill or decode pool can take on ``hardware`` beside the other
    pool at any size of this list: sizes that fit a host or whole hosts
    (:func:`kvtier.deploy.layout.pool_tp_choices`), at most half the GPUs (so one instance of
    each fits), and, given ``model``, whose GPUs hold its weights with room for KV."""
    from kvtier.deploy.layout import pool_tp_choices

    topo = hardware.topology
    sizes = [t for t in pool_tp_choices(topo) if 2 * t <= topo.gpus]
    if model is not None:
        sizes = [t for t in sizes if kv_room(hardware, model, t) > 0]
    return tuple(sizes)


def one_size_when_pinned(space: SearchSpace) -> SearchSpace:
    """A pinned ``serving.tp`` fixes every instance's size: the pool sizes a split could take
    (``serving.prefill_tp`` / ``serving.decode_tp``) are left out unless pinned themselves."""
    if "serving.tp" not in space.pinned:
        return space
    pools = ("serving.prefill_tp", "serving.decode_tp")
    kept = tuple(p for p in space.params if p.name not in pools or p.name in space.pinned)
    return replace(space, params=kept)


def check_pinned_size(pinned: dict[str, Any], hw: Any, option: str = "--pin") -> None:
    """Refuse settings that contradict each other on ``hw``: ``serving.instances`` instances
    of ``serving.tp`` GPUs each that the hardware cannot hold (a search's sampled count beyond
    the GPUs runs as many as fit, but a count the user gave would silently not be what ran).
    ``option`` names where they were given (``--pin``, ``--set``)."""
    tp, n = pinned.get("serving.tp"), pinned.get("serving.instances")
    if tp is None or n is None:
        return
    tp, n = int(tp), int(n)
    gpus = hw.topology.gpus
    if n * tp > gpus:
        most = gpus // tp
        verb = "set" if option == "--set" else "pin"
        raise InputError(
            f"serving.tp={tp} and serving.instances={n} need {n * tp} GPUs; {hw.name} has "
            f"{gpus} (at most {most} instance{'s' if most != 1 else ''} of tp {tp}): {verb} "
            "fewer instances or a smaller tp"
            + (", or allow more hosts (--max-hosts)" if option == "--pin" else ""),
            option=option,
        )


def fit_space_to_hardware(space: SearchSpace, hardware: Any, model: Any = None) -> SearchSpace:
    """Switch off tiers the hardware lacks; cap the instance count at what it has; keep the
    per-pool tensor-parallel sizes every pair of which can be placed (``pool_tp_sizes``)."""
    most = hardware.topology.max_instances
    fitted = []
    for p in space.params:
        if p.name == "serving.instances" and p.choices is None and p.high is not None:
            high = min(p.high, most)
            p = replace(p, low=min(p.low, high), high=high)
        elif p.name == "serving.instances" and p.choices is not None:
            kept = tuple(c for c in p.choices if isinstance(c, int) and c <= most)
            p = replace(p, choices=kept or (most,))
        elif p.name == "serving.tp" and p.choices is not None:
            gpus = hardware.topology.gpus
            kept = tuple(c for c in p.choices if isinstance(c, int) and gpus % c == 0)
            p = replace(p, choices=kept or (hardware.topology.tp,))
        elif p.name in ("serving.prefill_tp", "serving.decode_tp") and p.choices is not None:
            sizes = pool_tp_sizes(hardware, model)
            kept = tuple(c for c in p.choices if c in sizes)
            p = replace(p, choices=kept or (hardware.topology.tp,))
        fitted.append(p)
    space = replace(space, params=tuple(fitted))
    params = {p.name for p in space.params}
    pins = {
        f"tiers.{tier}.enabled": False
        for tier in LOWER_TIERS
        if tier not in hardware.tiers
        and f"tiers.{tier}.enabled" in params
        and f"tiers.{tier}.enabled" not in space.pinned
    }
    return space.with_pins(pins) if pins else space


def fit_space_to_sample(space: SearchSpace, fraction: float, hardware: Any) -> SearchSpace:
    """On a sampled trace, search only instance counts the sample scales to whole instances.

    A ``fraction`` sample replays a deployment of ``n`` instances on ``n x fraction`` of them
    (:func:`kvtier.deploy.sample.scaled_for_sample`), so ``n`` must be a multiple of
    :func:`kvtier.trace.sample_correction.sample_instance_step`; any other count would only be
    pruned. A pinned count that is not one, or hardware too small for any, is refused before
    the search.
    """
    if fraction == 1.0:
        return space
    from kvtier.trace.sample_correction import sample_instance_step

    step = sample_instance_step(fraction)
    most = hardware.topology.max_instances
    advice = (
        f"the trace is a {fraction:g} sample: a deployment it replays needs a multiple of {step} "
        "instances"
    )
    pinned = space.pinned.get("serving.instances")
    if pinned is not None:
        if int(pinned) % step:
            raise InputError(f"{advice}, not {pinned}", option="--pin")
        return space
    if most < step:
        raise InputError(
            f"{advice}, and the hardware has room for {most}; search more hosts "
            "(--max-hosts) or sample a larger fraction",
            option="--trace",
        )
    fitted = []
    for p in space.params:
        if p.name == "serving.instances" and p.choices is None and p.high is not None:
            low = max(step, -(-int(p.low or 1) // step) * step)
            high = max(step, int(p.high) // step * step)
            if p.log:  # Optuna takes no step on a log range: the multiples as choices
                p = replace(p, choices=tuple(range(min(low, high), high + 1, step)))
            else:
                p = replace(p, low=min(low, high), high=high, step=step, integer=True)
        elif p.name == "serving.instances" and p.choices is not None:
            kept = tuple(c for c in p.choices if isinstance(c, int) and c % step == 0)
            p = replace(p, choices=kept or (most // step * step,))
        fitted.append(p)
    return replace(space, params=tuple(fitted))


def check_max_hosts(max_hosts: int, trace: Any, hw: Any) -> None:
    """Refuse ``--max-hosts`` above what the trace could ever occupy: one single-GPU instance
    per request of the full trace (a sample's requests divided by its fraction) fills
    ``ceil(requests / GPUs per host)`` hosts, or the profile's own hosts if more; a larger
    count adds only idle hosts and makes every trial slower."""
    requests = math.ceil(trace.n_requests / trace.sample_fraction)
    per_host = hw.topology.gpus_per_host
    limit = max(hw.topology.hosts, -(-requests // per_host))
    if max_hosts > limit:
        filled = -(-requests // per_host)
        raise InputError(
            f"must be at most {limit:,} for this trace: its {requests:,} requests fill at most "
            f"{filled:,} host{'s' if filled != 1 else ''} of {per_host} GPUs with one "
            f"single-GPU instance each (the profile has {hw.topology.hosts}), got {max_hosts:,}",
            option="--max-hosts",
        )


def hosts_profile(ref: str, hw: Any, hosts: int, runs_dir: Path) -> str:
    """A copy of ``hw``'s profile file with ``hosts`` hosts, under ``runs_dir``: the search may
    then place instances on up to that many hosts (each host adds its GPUs and its per-host
    tiers; cost counts only the hosts a policy occupies), and the policy file names this
    profile, so its replay and export see the same hardware."""
    import re

    from kvtier.files import atomic_write
    from kvtier.hardware.loader import resolve

    if hosts < 1:
        raise InputError(f"must be at least 1, got {hosts}", option="--max-hosts")
    if hosts == hw.topology.hosts:
        return ref
    source = resolve("hardware", ref)
    text = source.read_text()
    text, n = re.subn(r"(?m)^(\s*hosts\s*=\s*)\d+", rf"\g<1>{hosts}", text, count=1)
    if n != 1:
        raise InputError(f"profile {hw.name!r} has no topology.hosts line", option="--max-hosts")
    text = re.sub(r'(?m)^name\s*=\s*"[^"]*"', f'name = "{hw.name}-x{hosts}"', text, count=1)
    path = runs_dir / f"{hw.name}-x{hosts}.toml"
    # the profile goes under runs_dir whatever --storage and --out say (the policy file names
    # it): the way round an unmakeable directory is a profile of one's own
    make_runs_dir(
        runs_dir,
        purpose=f"the --max-hosts profile {path}",
        advice=f"give --hardware a copy of profile {hw.name!r} with hosts = {hosts} "
        "in place of --max-hosts",
        option="--max-hosts",
    )
    atomic_write(path, lambda tmp: Path(tmp).write_text(text))
    return str(path)


def optimize(trace_path: str, **kwargs: Any) -> OptimizeResult:
    """Run :func:`run_request` on ``OptimizeRequest(trace_path, **kwargs)`` (the fields of
    :class:`kvtier.search.request.OptimizeRequest` as keywords)."""
    from kvtier.search.request import OptimizeRequest

    return run_request(OptimizeRequest(trace_path=trace_path, **kwargs))


def run_request(request: OptimizeRequest) -> OptimizeResult:
    """The search as named stages, each reading what the ones before it found: fit the space
    to the hardware, open the study, warm-start it, search, compare the presets, sweep the
    winner's tiers, refine the winner, find what each target can run, and write the policy
    file."""
    started = time.perf_counter()
    from kvtier.sim import compile_ahead
    from kvtier.sim.steptime.calibrated import check_step_margin

    check_step_margin(request.step_margin)  # before the search, not after it
    compile_ahead.start()  # before the trace is read: the kernels' compile starts now
    fitted = fit_space(request)
    opened = open_study_stage(request, fitted)
    baselines = compare_baselines(request, fitted)
    warmed = warm_start(request, fitted, opened, baselines)
    searched = search(request, fitted, opened)
    swept = sweep_tiers(request, fitted, opened, searched)
    refined = refine_stage(request, fitted, opened, swept)
    targeted = targets_stage(request, fitted, swept, refined, opened.name)
    result = write_result(
        request, fitted, opened, searched, swept, refined, targeted, baselines, warmed, started
    )
    result.step_margin = margin_stage(request, fitted, swept, refined)
    return result


@dataclass
class Fitted:
    """The fit-space stage's answer: the loaded inputs and the space fitted to them."""

    trace: Any
    hardware: str  # the profile as the policy file names it (a --max-hosts copy included)
    model: str
    hw: Any
    mdl: Any
    slo: SLO
    space: SearchSpace
    base: Policy
    scenario: Scenario
    evaluator: Evaluator
    bound: Any


def fit_space(request: OptimizeRequest) -> Fitted:
    """Load the trace, profiles, SLO and space; add hosts and prices; keep only what the
    hardware, the sample and the target can run; say the SLO's lower bound."""
    from kvtier.trace.io import read_trace

    if request.out is not None:
        check_output(request.out, option="--out")
    trace = read_trace(request.trace_path)
    hardware = hardware_name(request.hardware)
    model = model_name(request.model)
    hw = load_hardware(hardware)
    mdl = load_model(model)
    slo = parse_slo(request.slo_text)
    search_space: SearchSpace = load_space(request.space)
    if not request.allow_lossy_kv:
        # FP8 KV is lossy: without the flag a searched kv_dtype stays at bf16
        if any(p.name == "kv_dtype" for p in search_space.free()):
            search_space = search_space.with_pins({"kv_dtype": "bf16"})
        # FP8 weights are lossy too: without the flag the model profile's own weights are kept
        if "serving.weight_dtype" not in search_space.pinned:
            kept = tuple(p for p in search_space.params if p.name != "serving.weight_dtype")
            search_space = replace(search_space, params=kept)
    if request.max_hosts is not None:
        check_max_hosts(request.max_hosts, trace, hw)
        hardware = hosts_profile(hardware, hw, request.max_hosts, request.runs_dir)
        hw = load_hardware(hardware)
    if request.prices is not None:
        from kvtier.hardware.prices import apply_prices, load_prices

        hw = apply_prices(hw, load_prices(request.prices))
    search_space = search_space.with_pins(request.pins or {})
    check_pinned_size(search_space.pinned, hw)
    search_space = fit_space_to_hardware(search_space, hw, mdl)
    search_space = fit_space_to_sample(search_space, trace.sample_fraction, hw)
    search_space = one_size_when_pinned(search_space)
    if request.target is not None:
        search_space = restrict_to_target(search_space, request.target, hw.tiers)
    base = policy_from_dict({"hardware": hardware, "model": model}, "<defaults>")
    base = replace(base, slo=slo)
    scenario = Scenario(
        trace, hw, mdl, base, slo=slo, load=request.load, rate_scale=request.rate_scale
    )
    evaluator = Evaluator(scenario, objective=request.objective)
    bound = _slo_bound(scenario, base, slo, search_space, request.load)
    if bound is not None and request.on_bound is not None:
        request.on_bound(bound)
    return Fitted(
        trace, hardware, model, hw, mdl, slo, search_space, base, scenario, evaluator, bound
    )


@dataclass
class Opened:
    """The open-study stage's answer: the study, its name and storage, the trace's digest."""

    name: str
    storage: str
    study: optuna.Study
    digest: str


def open_study_stage(request: OptimizeRequest, fitted: Fitted) -> Opened:
    """Open (or continue) the study; refuse one run on another trace, setup or space; record
    what this run searches."""
    from kvtier.hardware.prices import price_figures

    hw, mdl = fitted.hw, fitted.mdl
    trace_path, runs_dir = request.trace_path, request.runs_dir
    name = request.study_name or f"{Path(trace_path).stem}-{hw.name}-{mdl.name}".lower()
    storage = request.storage
    default_storage = storage is None
    if storage is None:
        storage = f"sqlite:///{runs_dir / (name + '.db')}"
    guard_outputs(
        {"--out": request.out if request.out is not None else runs_dir / f"{name}.toml"},
        {
            "--trace": trace_path,
            "--hardware": fitted.hardware,
            "--model": fitted.model,
            "--prices": request.prices,
        },
        {"--storage": storage},
    )
    if default_storage:
        make_runs_dir(runs_dir)
    study = open_study(name, storage=storage, seed=request.seed, pareto=request.pareto)
    if request.out is None:
        # results go under runs/, never into policies/ (the shipped presets and spaces)
        check_output(runs_dir / f"{name}.toml", option="--out")
    digest = sha256_of(trace_path)
    check_study_trace(
        study,
        digest,
        mismatch=f"study {name!r} in {storage} was run on a different trace (sha256 {{sha}}); "
        "choose another --study name",
        option="--study",
    )
    # What the latest run searched, for `kvtier report` (each trial also keeps its own policy).
    setup = StudySetup(
        trace=str(trace_path),
        trace_sha256=digest,
        hardware=fitted.hardware,
        model=fitted.model,
        slo=fitted.slo,
        load=request.load,
        rate_scale=request.rate_scale,
        space=fitted.space.source,
        prices=price_figures(hw),
        objective=request.objective,
        model_revision=model_revision(),
    )
    check_study_setup(study, setup, storage)
    # before the setup is recorded: the refusal names the space the study ran with
    check_study_space(study, fitted.space, storage)
    setup.record(study)
    return Opened(name, storage, study, digest)


def warm_start(
    request: OptimizeRequest, fitted: Fitted, opened: Opened, baselines: list[Baseline]
) -> int:
    """Enqueue trials in a new study: each preset that met the SLO, as far as the space states
    it, then the knees of the trace's miss-ratio curve (:mod:`kvtier.search.warmstart`); the
    number enqueued."""
    from kvtier.search.warmstart import preset_trials

    study, base, search_space = opened.study, fitted.base, fitted.space
    warmed = 0
    if request.warm_start and len(study.trials) == 0:
        worked = [
            b.evaluation.policy
            for b in baselines
            if b.evaluation is not None and b.evaluation.feasible
        ]
        for values in preset_trials(search_space, worked, fitted.hw.topology.tp):
            study.enqueue_trial(values, skip_if_exists=True)
            warmed += 1
        # The curve of the trace as the pinned fields map it (block size, tenant sharing).
        pinned: dict[str, Any] = dict(search_space.pinned)
        warm_policy = replace(
            base,
            block_tokens=int(pinned.get("block_tokens", base.block_tokens)),
            share_across_tenants=bool(
                pinned.get("share_across_tenants", base.share_across_tenants)
            ),
        )
        blocked = fitted.scenario.blocked(warm_policy)
        for values in warm_start_trials(search_space, blocked, fitted.mdl, base):
            study.enqueue_trial(values, skip_if_exists=True)
            warmed += 1
    return warmed


@dataclass
class Searched:
    """The search stage's answer: how the trials ran, and the trials kept for the sweeps."""

    worker: str
    objective: Callable[[optuna.Trial], Any]
    callbacks: list[Callable[[optuna.Study, optuna.trial.FrozenTrial], None]]
    budget: int  # trials this run lacked when it started
    reserve: int  # of those, left for the tier sweeps
    expressible: bool  # whether the space can express the sweeps' policies
    deadline: float | None


def search(request: OptimizeRequest, fitted: Fitted, opened: Opened) -> Searched:
    """Run the trials the study lacks, all but the last two (kept for the tier sweeps)."""
    study, search_space, hw = opened.study, fitted.space, fitted.hw
    n_trials, timeout = request.n_trials, request.timeout
    judge = make_objective(fitted.evaluator, search_space, pareto=request.pareto)
    # Each trial records the worker that started it, so that a worker counts only its own
    # trials (an enqueued trial is claimed by one worker: HeartbeatStorage.set_trial_state_values).
    worker = uuid.uuid4().hex

    def objective(trial: optuna.Trial) -> Any:
        trial.set_user_attr(WORKER_ATTR, worker)
        try:
            return judge(trial)
        except KeyboardInterrupt:
            # Optuna fails the trial; the next run of the command runs it again with the
            # parameters it had, as it does a killed worker's trial
            study.enqueue_trial(trial.params, user_attrs={"kvtier_interrupted": trial.number})
            raise

    # The trials this process ran: other workers on a shared study add theirs meanwhile, so
    # a count of the study's trials before and after would credit each worker with them all.
    mine: list[int] = []
    # --trials is the study's total: a finished study is reported, not extended, and one cut
    # short runs only what it lacks; workers sharing a study stop once it holds that many
    already = _finished(study)
    budget = max(0, n_trials - already)

    def count(_st: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        mine.append(trial.number)  # list.append is atomic under the GIL (n_jobs threads)

    callbacks: list[Callable[[optuna.Study, optuna.trial.FrozenTrial], None]] = [count]
    on_trial = request.on_trial
    if on_trial is not None:

        def report(st: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
            on_trial(already + len(mine), best_feasible(st), tally(st))

        callbacks.append(report)
    # The last two trials of the budget are kept for the instance sweeps of
    # kvtier.search.tiering (the winner without its lower tiers, and with one lower tier in
    # place of its own), so the study, the winner and its policy file include their answers; a space
    # that pins a lower tier on or the instance count cannot express those policies.
    expressible = "serving.instances" not in search_space.pinned and not any(
        k.startswith("tiers.") and k.endswith(".enabled") and v is True
        for k, v in search_space.pinned.items()
    )
    reserve = min(2, budget - 1) if expressible and hw.tiers and budget > 1 else 0
    main_phase = budget - reserve
    # other workers' trials count too: stop when the study holds all but the reserved ones
    stop = optuna.study.MaxTrialsCallback(n_trials - reserve, states=FINISHED)
    deadline = None if timeout is None else time.monotonic() + timeout
    if main_phase > 0 and _finished(study) < n_trials:
        # enqueued (warm-start) trials are taken first, by whichever thread or worker claims
        # each (HeartbeatStorage.set_trial_state_values: one claimant per trial)
        study.optimize(
            objective,
            n_trials=main_phase,
            timeout=timeout,
            n_jobs=request.n_jobs,
            callbacks=[*callbacks, stop],
            catch=(),
        )
    reserve = min(reserve, max(0, n_trials - _finished(study)))
    return Searched(worker, objective, callbacks, budget, reserve, expressible, deadline)


def compare_baselines(request: OptimizeRequest, fitted: Fitted) -> list[Baseline]:
    """Replay every built-in preset on the same trace, hardware, model and SLO."""
    from kvtier.search.refine import fewest_instances

    baselines = []
    if not request.compare_presets:
        return baselines
    evaluator, fraction = fitted.evaluator, fitted.trace.sample_fraction
    for bname, policy in baseline_policies(fitted.base, fitted.hw, fitted.mdl).items():
        if isinstance(policy, InputError):
            baselines.append(Baseline(bname, None, policy.message))
            continue
        try:
            evaluation = evaluator.evaluate_policy(policy, full=True)
            if evaluation.feasible:
                # each preset at its own cheapest size: the fewest instances meeting the SLO
                _, evaluation = fewest_instances(policy, evaluator, evaluation, fraction)
            baselines.append(Baseline(bname, evaluation))
        except InputError as err:
            baselines.append(Baseline(bname, None, err.message))
    return baselines


@dataclass
class Swept:
    """The sweep stage's answer: the study's winner and the cheapest policies with and without
    lower tiers."""

    best: TrialSummary | None
    done: list[TrialSummary]
    tiered: Choice | None
    hbm_only: Choice | None
    closest: TrialSummary | None  # when the search found no winner: the trial nearest the SLO


def sweep_tiers(
    request: OptimizeRequest, fitted: Fitted, opened: Opened, searched: Searched
) -> Swept:
    """The winner without its lower tiers and with one lower tier in place of its own, each
    on the fewest instances that meet the SLO (:mod:`kvtier.search.tiering`), run as the
    reserved trials so the study and the winner include them."""
    from kvtier.search.study import summaries
    from kvtier.search.tiering import compare_tiering

    study, hw, n_trials = opened.study, fitted.hw, request.n_trials
    reserve = searched.reserve
    best = best_feasible(study)
    near = None if best is not None else closest_trial(study, fitted)
    done = summaries(study)
    additions: list[dict[str, Any]] = []
    # A study finished by an earlier run already holds its sweeps' answers as trials (they were
    # its reserved ones): it is reported from its trials, without sweeping again.
    finished_before = searched.budget == 0 and searched.expressible and hw.tiers
    sweep_from = None if finished_before else best
    if reserve and best is not None:
        won = policy_from_dict(best.policy, "<best>")
        knees = knee_capacities_gb(fitted.scenario.blocked(won), fitted.mdl, won.kv_dtype)
        additions = tier_additions(fitted.space, knees)
    tiered, hbm_only = compare_tiering(
        fitted.evaluator,
        done,
        sweep_from,
        hw.topology.max_instances,
        hw.topology.tp,
        hardware_has_tiers=bool(hw.tiers),
        tier_additions=additions,
    )
    if reserve and (searched.deadline is None or time.monotonic() < searched.deadline):
        swept = [c for c in (tiered, hbm_only) if c is not None and c.label.endswith(SWEPT)]
        for choice in sorted(swept, key=lambda c: c.cost_per_mtok)[:reserve]:
            study.enqueue_trial(choice.params, skip_if_exists=True)
        total = optuna.study.MaxTrialsCallback(n_trials, states=FINISHED)
        study.optimize(
            searched.objective,
            n_trials=reserve,
            callbacks=[*searched.callbacks, total],
            catch=(),
        )
        best = best_feasible(study)
        done = summaries(study)
        tiered, hbm_only = compare_tiering(
            fitted.evaluator,
            done,
            None,
            hw.topology.max_instances,
            hw.topology.tp,
            hardware_has_tiers=bool(hw.tiers),
        )
    return Swept(best, done, tiered, hbm_only, near)


def as_ran(policy: Policy, metrics: dict[str, Any], fraction: float) -> Policy:
    """``policy`` as the deployment its replay ran: the instance count that ran (a count
    beyond what ``serving.tp`` leaves room for runs as many as fit), a split that left one
    instance aggregated without its share and pool sizes, which would otherwise describe (and
    export) a split never run, and without the settings of lower tiers and transfers it has
    none of (:func:`kvtier.policy.model.inert_movement_keys`)."""
    ran = int(metrics.get("instances", 0) or 0)
    full = round(ran / fraction) if fraction else ran
    if ran and policy.serving.instances is not None and policy.serving.instances != full:
        policy = replace(policy, serving=replace(policy.serving, instances=full))
    policy = without_inert_split(policy, ran)
    if ran and policy.serving.instances is not None and policy.serving.instances != full:
        # a sample's replay ran ``ran`` of the deployment's ``full`` instances
        policy = replace(policy, serving=replace(policy.serving, instances=full))
    return without_inert_movement(policy, split=ran_split(policy, ran))


def effective_params(params: dict[str, Any], policy: Policy) -> dict[str, Any]:
    """A trial's ``params`` as the winner ``policy`` has them: each value as it took effect
    (the instances that ran, the refined capacities), without settings of a tier the policy
    does not use or split settings that an aggregated deployment ignores; a lower tier turned
    off stays (``tiers.X.enabled = False``)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        parts = key.split(".")
        if parts[0] == "tiers" and len(parts) == 3:
            tier = policy.tier(parts[1])
            if parts[2] == "enabled":
                out[key] = tier is not None
            elif tier is not None:
                out[key] = getattr(tier, parts[2], value)
            continue
        owner: Any = policy.serving if parts[0] == "serving" and len(parts) == 2 else policy
        actual = getattr(owner, parts[-1], value)
        if actual is None:
            continue
        out[key] = actual
    return out


def refine_stage(
    request: OptimizeRequest, fitted: Fitted, opened: Opened, swept: Swept
) -> Refined | None:
    """Shrink the winner's tiers and instances while the SLO holds and the cost falls
    (:mod:`kvtier.search.refine`); kept in the study, so a rerun and ``kvtier report`` read
    it instead of replaying again."""
    from kvtier.search.refine import REFINE_ATTR, refine, stored_refine

    best = swept.best
    if not request.refine or best is None:
        return None
    stored = stored_refine(opened.study, best.number)
    if stored is not None:
        return stored
    fraction = fitted.trace.sample_fraction
    won = as_ran(policy_from_dict(best.policy, f"trial {best.number}"), best.metrics, fraction)
    refined = refine(
        won,
        fitted.evaluator,
        from_trial=best.number,
        fraction=fraction,
        fixed=tuple(fitted.space.pinned),
    )
    if refined is not None:
        opened.study.set_user_attr(REFINE_ATTR, refined.to_attrs())
    return refined


def margin_stage(
    request: OptimizeRequest, fitted: Fitted, swept: Swept, refined: Refined | None
) -> list[dict[str, Any]]:
    """With ``--step-time-margin m``: the winner (as refined, when it was) evaluated as the
    trials were, on every engine step ``1 - m`` and ``1 + m`` times as long
    (:func:`kvtier.sim.steptime.calibrated.with_step_scale`): whether it still meets the SLO
    when the cluster's steps run a little faster or slower than the model's."""
    best = swept.best
    if request.step_margin <= 0 or best is None:
        return []
    raw = refined.policy if refined is not None else best.policy
    policy = policy_from_dict(raw, f"trial {best.number}")
    out = []
    for factor in (1.0 - request.step_margin, 1.0 + request.step_margin):
        ev = fitted.evaluator.at_step_scale(factor).evaluate_policy(policy, full=True)
        out.append(
            {
                "factor": factor,
                "cost_per_mtok": ev.cost_per_mtok,
                "ttft_p99_s": ev.metrics.ttft_p99_s,
                "feasible": ev.feasible,
                "slo_attainment": ev.metrics.slo_attainment,
            }
        )
    return out


def _with_refined(
    tiered: Choice | None,
    hbm_only: Choice | None,
    refined: Refined,
    best: TrialSummary,
    default_tp: int,
) -> tuple[Choice | None, Choice | None]:
    """The tiering answers with the refined winner in place of its trial, on the side its
    tiers put it, when it is the cheaper there."""
    from kvtier.search.tiering import gpus_of, lower_tiers

    tiers = lower_tiers(refined.policy)
    m = refined.metrics
    mine = Choice(
        label=f"trial {best.number}, refined",
        cost_per_mtok=float(m["cost_per_mtok"]),
        cost_per_hour=float(m["cost_per_hour"]),
        gpus=gpus_of(m, refined.policy, default_tp),
        tiers=tiers,
        ttft_p99_s=float(m["ttft_p99_s"]),
        params=effective_params(best.params, policy_from_dict(refined.policy, "<refined>")),
    )
    if tiers:
        if tiered is None or mine.cost_per_mtok <= tiered.cost_per_mtok:
            tiered = mine
    elif hbm_only is None or mine.cost_per_mtok <= hbm_only.cost_per_mtok:
        hbm_only = mine
    return tiered, hbm_only


def closest_trial(study: optuna.Study, fitted: Fitted) -> TrialSummary | None:
    """The trial nearest the SLO when none meets it, judged on whole replays.

    A trial the early stop cut short has the metrics of the requests it reached: its misses
    and rejections describe part of the trace. The closest is chosen among trials that served
    the whole trace (:func:`kvtier.search.study.closest`'s measure); when the early stop cut
    every trial short, the trial that got furthest (the largest share of requests finished)
    is replayed to the end, and its summary carries that replay's metrics and violations
    (``metrics["replayed_to_end"]`` says so)."""
    from kvtier.search.study import summaries

    done = summaries(study)
    if not done:
        return None
    whole = closest_whole(done, slo_to_dict(fitted.slo))
    if whole is not None:
        return whole

    def share(s: TrialSummary) -> float:
        n = int(s.metrics.get("n_requests", 0) or 0)
        return int(s.metrics.get("n_served", 0) or 0) / n if n else 0.0

    furthest = max(done, key=lambda s: (share(s), -s.number))
    try:
        policy = policy_from_dict(furthest.policy, f"trial {furthest.number}")
        ev = fitted.evaluator.evaluate_policy(policy, full=True)
    except InputError:
        return furthest
    metrics = {**ev.metrics.to_dict(), "replayed_to_end": True, "share_before": share(furthest)}
    return replace(furthest, metrics=metrics, violations=dict(ev.violations), feasible=False)


def closest_whole(done: list[TrialSummary], bounds: dict[str, float]) -> TrialSummary | None:
    """Of the trials that served the whole trace (not cut short by the early stop), the one
    that misses the SLO by the least (relative violations summed); None when there is none."""
    whole = [s for s in done if not s.metrics.get("early_stopped")]
    if not whole:
        return None
    return min(whole, key=lambda s: (_miss(s.violations, bounds), s.number))


def _miss(violations: dict[str, float], bounds: dict[str, float]) -> float:
    """Relative violations summed (as :func:`kvtier.search.study.closest` measures them)."""
    total = 0.0
    for term, v in violations.items():
        if v > 0:
            total += v / bounds[term] if bounds.get(term) else v
    return total


@dataclass
class Targeted:
    """The targets stage's answer: the winner as it will be written (refined, or as it ran),
    its metrics, the targets that run it, and each target's cheapest policy."""

    policy: Policy | None
    metrics: dict[str, Any]
    runnable: list[str]
    per_target: list[TargetBest]


def targets_stage(
    request: OptimizeRequest, fitted: Fitted, swept: Swept, refined: Refined | None, name: str
) -> Targeted:
    """The winner as written, the targets that run it as simulated, and without ``--target``
    the cheapest policy each target can run (:func:`best_per_target`, refined and the
    winner adapted to each target: :func:`refine_per_target`, :func:`project_winner`)."""
    best, hw, mdl = swept.best, fitted.hw, fitted.mdl
    won_policy = None
    metrics = best.metrics if best is not None else {}
    if refined is not None:
        won_policy = policy_from_dict(refined.policy, f"{name} refined trial {refined.from_trial}")
        metrics = refined.metrics
    elif best is not None:
        fraction = fitted.trace.sample_fraction
        won_policy = as_ran(
            policy_from_dict(best.policy, f"{name} trial {best.number}"), best.metrics, fraction
        )
    runnable = [] if won_policy is None else runnable_targets(policy_to_dict(won_policy), hw, mdl)
    per_target: list[TargetBest] = []
    if request.target is None and best is not None:
        winner = (float(metrics["cost_per_mtok"]), runnable)
        fraction = fitted.trace.sample_fraction
        per_target = best_per_target(swept.done, winner, hw, mdl, fraction)
        if request.refine and won_policy is not None:
            fixed = tuple(fitted.space.pinned)
            cost = winner[0]
            per_target = refine_per_target(per_target, swept.done, fitted, fixed, cost)
            per_target = project_winner(per_target, won_policy, best.number, fitted, fixed, cost)
    return Targeted(won_policy, metrics, runnable, per_target)


def write_result(
    request: OptimizeRequest,
    fitted: Fitted,
    opened: Opened,
    searched: Searched,
    swept: Swept,
    refined: Refined | None,
    targeted: Targeted,
    baselines: list[Baseline],
    warmed: int,
    started: float,
) -> OptimizeResult:
    """Write the winner as it ran to its policy file, and gather what the report shows."""
    study, name, hw = opened.study, opened.name, fitted.hw
    best, slo, near = swept.best, fitted.slo, swept.closest
    binding = binding_term(near.violations, slo) if near is not None else None
    won_policy, metrics = targeted.policy, targeted.metrics
    tiered, hbm_only = swept.tiered, swept.hbm_only
    if refined is not None and best is not None and refined.changes:
        tiered, hbm_only = _with_refined(tiered, hbm_only, refined, best, hw.topology.tp)
    record_outcome(study, baselines=baselines, tiered=tiered, hbm_only=hbm_only)
    shown = best or near  # the winner, or the closest trial when none met the SLO
    sample_warnings = _sample_warnings(
        fitted.scenario,
        None if shown is None else policy_from_dict(shown.policy, "<trial>"),
        baselines,
    )
    policy_path = None
    if best is not None and won_policy is not None:
        policy_path = Path(request.out) if request.out else request.runs_dir / f"{name}.toml"
        write_policy_file(
            policy_path,
            won_policy,
            metrics=metrics,
            provenance=_provenance(request, fitted, opened, best, refined),
        )
    return OptimizeResult(
        study_name=name,
        storage=opened.storage,
        n_trials=_finished(study),
        best=best,
        closest=near,
        binding=binding,
        front=pareto_front(study) if request.pareto else [],
        baselines=baselines,
        policy_path=policy_path,
        slo=slo,
        seconds=time.perf_counter() - started,
        new_trials=_ran_by(study, searched.worker),
        warm_started=warmed,
        extra={"trace": request.trace_path},
        tiered=tiered,
        hbm_only=hbm_only,
        bound=fitted.bound,
        runnable_by=targeted.runnable,
        target=request.target,
        reached=reached_front(swept.done),
        sample_warnings=sample_warnings,
        sample_fraction=fitted.scenario.trace.sample_fraction,
        sample_weighting=sample_weighting(fitted.scenario.trace),
        refined=refined,
        per_target=targeted.per_target,
        winner_params={}
        if best is None or won_policy is None
        else effective_params(best.params, won_policy),
    )


def _provenance(
    request: OptimizeRequest,
    fitted: Fitted,
    opened: Opened,
    best: TrialSummary,
    refined: Refined | None = None,
) -> dict[str, Any]:
    """Where the written policy came from: trace, study, trial, seed, setup and versions."""
    best_trial = opened.study.trials[best.number]
    prices = request.prices
    return {
        "trace": str(request.trace_path),
        "trace_sha256": opened.digest,
        "kvtier_version": __version__,
        "study": opened.name,
        "storage": opened.storage,
        "trial": best.number,
        "seed": request.seed,
        "hardware": fitted.hardware,
        "model": fitted.model,
        "load": request.load,
        # the load the written metrics ran at: the refine's own (capacity mode bisects again
        # for the refined policy), else the trial's
        "rate_scale": (
            refined.rate_scale
            if refined is not None and refined.rate_scale is not None
            else best.rate_scale
        ),
        "space": fitted.space.source,
        "params": best_trial.user_attrs.get("params", {}),
        # the step-time backend and the package / data versions behind the metrics
        "step_time": best.metrics.get("step_time_source", ""),
        # where the instances' HBM for KV came from (kvtier.deploy.kv_budget)
        "hbm_kv": best.metrics.get("hbm_kv_source", ""),
        "prices": str(prices) if prices else "the profiles' (owned, all-in)",
        # what the refine changed from the trial (kvtier.search.refine); empty: nothing
        "refined": list(refined.changes) if refined is not None else [],
    }


def _sample_warnings(
    scenario: Scenario, best: Policy | None, baselines: list[Baseline]
) -> list[str]:
    """On a sampled trace, one line for each distinct way the reported trial's or a preset's
    hit ratios are biased against the full trace's (:func:`kvtier.deploy.sample.sample_bias`)."""
    fraction = scenario.trace.sample_fraction
    if fraction == 1.0:
        return []
    policies = [] if best is None else [best]
    policies += [b.evaluation.policy for b in baselines if b.evaluation is not None]
    lines = (sample_bias(p, scenario.hardware, fraction) for p in policies)
    return list(dict.fromkeys(line for line in lines if line))


def _slo_bound(scenario: Scenario, base: Policy, slo: SLO, space: SearchSpace, load: str) -> Any:
    """The SLO's lower bound on this trace and hardware (:mod:`kvtier.search.bound`), for the
    fastest tensor-parallel size the space allows; None with ``--load capacity`` (the rate is
    what the search finds) or when nothing can be said."""
    from kvtier.search.bound import slo_bound

    if load != "trace":
        return None
    tps: tuple[int, ...] | None = None
    if "serving.tp" in space.pinned:
        tps = (int(space.pinned["serving.tp"]),)
    else:
        for p in space.params:
            if p.name == "serving.tp" and p.choices is not None:
                tps = tuple(int(c) for c in p.choices)
    # a split's pools may run at their own sizes: the bound takes the fastest of all
    pool: set[int] = set()
    for key in ("serving.prefill_tp", "serving.decode_tp"):
        if key in space.pinned:
            pool.add(int(space.pinned[key]))
        for p in space.params:
            if p.name == key and key not in space.pinned and p.choices is not None:
                pool.update(int(c) for c in p.choices)
    if tps is not None and pool:
        tps = tuple(sorted({*tps, *pool}))
    pinned = dict(space.pinned)
    policy = replace(
        base,
        block_tokens=int(pinned.get("block_tokens", base.block_tokens)),
        share_across_tenants=bool(pinned.get("share_across_tenants", base.share_across_tenants)),
    )
    try:
        return slo_bound(scenario, policy, slo, tps)
    except InputError:
        return None


# the labels of the instance sweeps' answers (kvtier.search.tiering): "trial N without lower
# tiers", "trial N with dram"
SWEPT = ("without lower tiers", "on fewest instances", *(f"with {t}" for t in LOWER_TIERS))


def runnable_targets(policy: dict[str, Any], hw: Any, mdl: Any) -> list[str]:
    """The export targets whose export of ``policy`` has no note of kind ``inexpressible``
    (:class:`kvtier.export.common.Note`): each runs the policy as simulated, or close to it."""
    from kvtier.export import TARGETS, export

    chosen = policy_from_dict(policy, "<best>")
    out = []
    for target in TARGETS:
        try:
            result = export(chosen, target, hw, mdl)
        except InputError:
            continue
        if result.expressible:
            out.append(target)
    return out


@dataclass(frozen=True)
class TargetBest:
    """The cheapest policy one export target can run as simulated, and what it costs beyond
    the unrestricted winner (``extra``: a share of its cost per token; 0 when it is the
    winner itself). ``trial`` None: no policy meeting the SLO that this target can run."""

    target: str
    trial: int | None
    cost_per_mtok: float | None
    extra: float | None
    winner: bool = False  # the winner itself (the refined one, when refined)
    refined: bool = False  # the trial refined (kvtier.search.refine), not as sampled
    # the winner with these settings changed to what the target expresses (trial: the winner's)
    changed: tuple[str, ...] = ()


def best_per_target(
    done: list[TrialSummary],
    winner: tuple[float, list[str]] | None,
    hw: Any,
    mdl: Any,
    fraction: float = 1.0,
) -> list[TargetBest]:
    """For every export target, the cheapest policy meeting the SLO that it can run
    (:func:`runnable_targets`): the winner (``(cost, runnable targets)``) when it can, else
    the cheapest feasible trial it can, each trial taken as it ran (:func:`as_ran`)."""
    from kvtier.export import TARGETS

    found: dict[str, TargetBest] = {}
    best_cost = winner[0] if winner is not None else None
    if winner is not None:
        for target in winner[1]:
            found[target] = TargetBest(target, None, winner[0], 0.0, winner=True)
    feasible = sorted((s for s in done if s.feasible), key=lambda s: s.metrics["cost_per_mtok"])
    for s in feasible:
        if len(found) == len(TARGETS):
            break
        policy = as_ran(policy_from_dict(s.policy, f"trial {s.number}"), s.metrics, fraction)
        for target in runnable_targets(policy_to_dict(policy), hw, mdl):
            if target not in found:
                cost = float(s.metrics["cost_per_mtok"])
                extra = cost / best_cost - 1 if best_cost else None
                found[target] = TargetBest(target, s.number, cost, extra)
    return [found.get(t, TargetBest(t, None, None, None)) for t in TARGETS]


def refine_per_target(
    rows: list[TargetBest],
    done: list[TrialSummary],
    fitted: Fitted,
    fixed: tuple[str, ...],
    winner_cost: float,
) -> list[TargetBest]:
    """Each target's cheapest trial (not the winner) refined as the winner is
    (:func:`kvtier.search.refine.refine`, without curves), kept when the refined policy is
    cheaper and the target still runs it as simulated; its extra cost against the
    unrestricted winner's ``winner_cost``."""
    from kvtier.search.refine import refine

    by_trial = {s.number: s for s in done}
    fraction = fitted.trace.sample_fraction
    cache: dict[int, tuple[Any, list[str]]] = {}
    out = []
    for r in rows:
        if r.winner or r.trial is None or r.cost_per_mtok is None:
            out.append(r)
            continue
        if r.trial not in cache:
            s = by_trial[r.trial]
            policy = as_ran(policy_from_dict(s.policy, f"trial {s.number}"), s.metrics, fraction)
            ref = refine(
                policy,
                fitted.evaluator,
                from_trial=s.number,
                fraction=fraction,
                fixed=fixed,
                curves=False,
            )
            runs = [] if ref is None else runnable_targets(ref.policy, fitted.hw, fitted.mdl)
            cache[r.trial] = (ref, runs)
        ref, runs = cache[r.trial]
        if ref is None or r.target not in runs or not ref.cost_per_mtok < r.cost_per_mtok:
            out.append(r)
            continue
        cost = ref.cost_per_mtok
        extra = cost / winner_cost - 1 if winner_cost else None
        out.append(replace(r, cost_per_mtok=cost, extra=extra, refined=True))
    return out


def project_to_target(policy: Policy, target: str, hw: Any) -> tuple[Policy, tuple[str, ...]]:
    """``policy`` with each setting ``target`` cannot express set to one it can (its first
    allowed value, as the target's exporter declares it:
    :func:`kvtier.export.capabilities.capabilities`), its lower tiers the target has no place
    for removed and their evictions its first; with the settings changed, as ``key=value``.
    Whether the target then runs it is :func:`runnable_targets`'s to say."""
    from kvtier.export.capabilities import capabilities
    from kvtier.search.overlay import apply

    rules = capabilities(target)
    changes: dict[str, Any] = {}
    idle = movement_keys_without_effect(policy, ran_split(policy, policy.serving.instances or 0))
    for key, values in rules.allowed().items():
        if key in idle:  # the target need not express what the policy leaves without effect
            continue
        parts = key.split(".")
        owner: Any = policy.serving if parts[0] == "serving" else policy
        current = getattr(owner, parts[-1], values[0])
        if key == "serving.scheduler":  # unset: the framework's own
            current = policy.serving.engine_scheduler
        if len(parts) <= 2 and current not in values:
            changes[key] = values[0]
    for tier in policy.lower_tiers:
        if tier.name not in rules.tiers or tier.name not in hw.tiers:
            changes[f"tiers.{tier.name}.enabled"] = False
        elif tier.eviction not in rules.evictions:
            changes[f"tiers.{tier.name}.eviction"] = rules.evictions[0]
    if not changes:
        return policy, ()
    shown = tuple(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in changes.items())
    return apply(policy, changes, f"<{target}>"), shown


def project_winner(
    rows: list[TargetBest],
    won: Policy,
    from_trial: int,
    fitted: Fitted,
    fixed: tuple[str, ...],
    winner_cost: float,
) -> list[TargetBest]:
    """For each target that cannot run the winner: the winner projected onto what the target
    expresses (:func:`project_to_target`), replayed and refined; it replaces the target's row
    when it meets the SLO, the target runs it, and it costs less than the row's policy; its
    extra cost against the unrestricted winner's ``winner_cost``."""
    from kvtier.search.refine import refine

    fraction = fitted.trace.sample_fraction
    cache: dict[str, tuple[Any, list[str]]] = {}
    out = []
    for r in rows:
        if r.winner:
            out.append(r)
            continue
        projected, changed = project_to_target(won, r.target, fitted.hw)
        key = repr(policy_to_dict(projected))
        if key not in cache:
            ref = None
            if changed and r.target in runnable_targets(
                policy_to_dict(projected), fitted.hw, fitted.mdl
            ):
                try:
                    ref = refine(
                        projected,
                        fitted.evaluator,
                        from_trial=from_trial,
                        fraction=fraction,
                        fixed=fixed,
                        curves=False,
                    )
                except InputError:
                    ref = None
            runs = [] if ref is None else runnable_targets(ref.policy, fitted.hw, fitted.mdl)
            cache[key] = (ref, runs)
        ref, runs = cache[key]
        better = r.cost_per_mtok is None or (
            ref is not None and ref.cost_per_mtok < r.cost_per_mtok
        )
        if ref is None or r.target not in runs or not better:
            out.append(r)
            continue
        cost = ref.cost_per_mtok
        extra = cost / winner_cost - 1 if winner_cost else None
        out.append(TargetBest(r.target, from_trial, cost, extra, refined=True, changed=changed))
    return out


def reached_front(done: list[TrialSummary]) -> list[TrialSummary]:
    """Every finished trial not dominated on (cost per token, TTFT P99), feasible or not: what
    was reached, for a report whose SLO no trial met."""
    points = [
        s
        for s in done
        if math.isfinite(s.metrics.get("cost_per_mtok", math.inf))
        and math.isfinite(s.metrics.get("ttft_p99_s", math.inf))
    ]
    front = []
    for s in points:
        c, t = s.metrics["cost_per_mtok"], s.metrics["ttft_p99_s"]
        if not any(
            o.metrics["cost_per_mtok"] <= c
            and o.metrics["ttft_p99_s"] <= t
            and (o.metrics["cost_per_mtok"] < c or o.metrics["ttft_p99_s"] < t)
            for o in points
        ):
            front.append(s)
    return sorted(front, key=lambda s: s.metrics["cost_per_mtok"])
