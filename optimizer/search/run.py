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
from typing import Any

import optuna

from kvtier import __version__
from kvtier.deploy.sample import sample_bias
from kvtier.errors import InputError
from kvtier.files import check_output
from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import LOWER_TIERS
from kvtier.policy.file import sha256_of, write_policy_file
from kvtier.policy.model import (
    SLO,
    SLO_TERMS,
    Policy,
    policy_from_dict,
    policy_to_dict,
    without_inert_split,
)
from kvtier.scenario import Scenario, hardware_name, model_name
from kvtier.search.objective import Evaluation, Evaluator, binding_term
from kvtier.search.setup import StudySetup, check_study_trace, slo_to_dict
from kvtier.search.space import SearchSpace, load_space, restrict_to_target
from kvtier.search.study import (
    TrialSummary,
    best_feasible,
    check_study_setup,
    check_study_space,
    closest,
    make_objective,
    make_runs_dir,
    open_study,
    pareto_front,
)
from kvtier.search.warmstart import knee_capacities_gb, tier_additions, warm_start_trials
from kvtier.trace.sample_correction import sample_weighting

DEFAULT_SLO = SLO(ttft_p99_s=2.0, tpot_p99_s=0.1)
SLO_ALIASES = {
    "ttft_mean": "ttft_mean_s",
    "ttft_p99": "ttft_p99_s",
    "ttft_p999": "ttft_p999_s",
    "tpot_p99": "tpot_p99_s",
    "tbt_p99": "tbt_p99_s",
}


def parse_slo(text: str | None) -> SLO:
    """``ttft_p99=5,ttft_mean=2,tpot_p99=0.1`` (seconds); empty or None gives the default."""
    if not text:
        return DEFAULT_SLO
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
    target: str | None = None
    reached: list[TrialSummary] = field(default_factory=list)  # cost vs TTFT p99, all trials
    # on a sampled trace: which way the winner's and the presets' hit ratios are biased
    sample_warnings: list[str] = field(default_factory=list)
    sample_fraction: float = 1.0  # of a sampled trace: its replays ran on that share of the cluster
    # of a sample with prompt-length strata: how its latencies are weighted
    sample_weighting: str | None = None


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


def baseline_policies(base: Policy) -> dict[str, Policy | InputError]:
    """What the best policy is compared with: every built-in preset, on the user's hardware.

    A preset keeps its policy (block size, tiers, write policy, ...) but runs on the hardware
    and model being optimized, at the same SLO, with all instances; its tier capacities are its
    own. A preset that needs a tier the hardware lacks is reported as not applicable.
    """
    from kvtier.policy.presets import load_preset, preset_names

    out: dict[str, Policy | InputError] = {}
    for name in preset_names():
        try:
            preset = load_preset(name)
            out[name] = replace(
                preset,
                hardware=base.hardware,
                model=base.model,
                slo=base.slo,
                serving=replace(preset.serving, instances=None),
            )
        except InputError as err:
            out[name] = err
    return out


def pool_tp_sizes(hardware: Any, model: Any = None) -> tuple[int, ...]:
    """Tensor-parallel sizes a prefill or decode pool can take on ``hardware`` beside the other
    pool at any size of this list: sizes that fit a host or whole hosts
    (:func:`kvtier.deploy.layout.pool_tp_choices`), at most half the GPUs (so one instance of
    each fits), and, given ``model``, whose GPUs hold its weights with room for KV."""
    from kvtier.deploy.layout import pool_tp_choices

    topo = hardware.topology
    sizes = [t for t in pool_tp_choices(topo) if 2 * t <= topo.gpus]
    if model is not None:
        sizes = [t for t in sizes if hardware.kv_capacity_bytes(model, t) > 0]
    return tuple(sizes)


def one_size_when_pinned(space: SearchSpace) -> SearchSpace:
    """A pinned ``serving.tp`` fixes every instance's size: the pool sizes a split could take
    (``serving.prefill_tp`` / ``serving.decode_tp``) are left out unless pinned themselves."""
    if "serving.tp" not in space.pinned:
        return space
    pools = ("serving.prefill_tp", "serving.decode_tp")
    kept = tuple(p for p in space.params if p.name not in pools or p.name in space.pinned)
    return replace(space, params=kept)


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
    (:func:`kvtier.scenario.scaled_for_sample`), so ``n`` must be a multiple of
    :func:`kvtier.scenario.sample_instance_step`; any other count would only be pruned. A
    pinned count that is not one, or hardware too small for any, is refused before the search.
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


def optimize(
    trace_path: str,
    *,
    hardware: str | None = None,
    model: str | None = None,
    space: str = "default",
    pins: dict[str, Any] | None = None,
    slo_text: str | None = None,
    load: str = "trace",
    rate_scale: float = 1.0,
    study_name: str | None = None,
    storage: str | None = None,
    seed: int = 0,
    n_trials: int = 60,
    timeout: float | None = None,
    n_jobs: int = 1,
    pareto: bool = False,
    warm_start: bool = True,
    allow_lossy_kv: bool = False,
    compare_presets: bool = True,
    target: str | None = None,
    max_hosts: int | None = None,
    prices: str | None = None,
    out: str | None = None,
    runs_dir: Path = Path("runs"),
    on_trial: Callable[[int, TrialSummary | None], None] | None = None,
    on_bound: Callable[[Any], None] | None = None,
) -> OptimizeResult:
    from kvtier.hardware.prices import price_figures
    from kvtier.trace.io import read_trace

    started = time.perf_counter()
    if out is not None:
        check_output(out, option="--out")
    trace = read_trace(trace_path)
    hardware = hardware_name(hardware)
    model = model_name(model)
    hw = load_hardware(hardware)
    mdl = load_model(model)
    slo = parse_slo(slo_text)
    search_space: SearchSpace = load_space(space)
    if allow_lossy_kv:
        search_space = replace(
            search_space, pinned={k: v for k, v in search_space.pinned.items() if k != "kv_dtype"}
        )
    elif "serving.weight_dtype" not in search_space.pinned:
        # FP8 weights are lossy too: without the flag the model profile's own weights are kept
        kept = tuple(p for p in search_space.params if p.name != "serving.weight_dtype")
        search_space = replace(search_space, params=kept)
    if max_hosts is not None:
        hardware = hosts_profile(hardware, hw, max_hosts, runs_dir)
        hw = load_hardware(hardware)
    if prices is not None:
        from kvtier.hardware.prices import apply_prices, load_prices

        hw = apply_prices(hw, load_prices(prices))
    search_space = fit_space_to_hardware(search_space.with_pins(pins or {}), hw, mdl)
    search_space = fit_space_to_sample(search_space, trace.sample_fraction, hw)
    search_space = one_size_when_pinned(search_space)
    if target is not None:
        search_space = restrict_to_target(search_space, target, hw.tiers)
    base = policy_from_dict({"hardware": hardware, "model": model}, "<defaults>")
    base = replace(base, slo=slo)
    scenario = Scenario(trace, hw, mdl, base, slo=slo, load=load, rate_scale=rate_scale)
    evaluator = Evaluator(scenario)
    bound = _slo_bound(scenario, base, slo, search_space, load)
    if bound is not None and on_bound is not None:
        on_bound(bound)

    name = study_name or f"{Path(trace_path).stem}-{hw.name}-{mdl.name}".lower()
    if storage is None:
        make_runs_dir(runs_dir)
        storage = f"sqlite:///{runs_dir / (name + '.db')}"
    study = open_study(name, storage=storage, seed=seed, pareto=pareto)
    if out is None:
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
        hardware=hardware,
        model=model,
        slo=slo,
        load=load,
        rate_scale=rate_scale,
        space=search_space.source,
        prices=price_figures(hw),
    )
    check_study_setup(study, setup, storage)
    # before the setup is recorded: the refusal names the space the study ran with
    check_study_space(study, search_space, storage)
    setup.record(study)

    warmed = 0
    if warm_start and len(study.trials) == 0:
        # The curve of the trace as the pinned fields map it (block size, tenant sharing).
        pinned: dict[str, Any] = dict(search_space.pinned)
        warm_policy = replace(
            base,
            block_tokens=int(pinned.get("block_tokens", base.block_tokens)),
            share_across_tenants=bool(
                pinned.get("share_across_tenants", base.share_across_tenants)
            ),
        )
        blocked = scenario.blocked(warm_policy)
        for values in warm_start_trials(search_space, blocked, mdl, base):
            study.enqueue_trial(values, skip_if_exists=True)
            warmed += 1

    judge = make_objective(evaluator, search_space, pareto=pareto)
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
    if on_trial is not None:

        def report(st: optuna.Study, _trial: optuna.trial.FrozenTrial) -> None:
            on_trial(already + len(mine), best_feasible(st))

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
            n_jobs=n_jobs,
            callbacks=[*callbacks, stop],
            catch=(),
        )
    reserve = min(reserve, max(0, n_trials - _finished(study)))

    best = best_feasible(study)
    near = None if best is not None else closest(study, slo_to_dict(slo))
    binding = binding_term(near.violations, slo) if near is not None else None

    baselines = []
    if compare_presets:
        for bname, policy in baseline_policies(base).items():
            if isinstance(policy, InputError):
                baselines.append(Baseline(bname, None, policy.message))
                continue
            try:
                baselines.append(Baseline(bname, evaluator.evaluate_policy(policy, full=True)))
            except InputError as err:
                baselines.append(Baseline(bname, None, err.message))

    from kvtier.search.study import summaries
    from kvtier.search.tiering import compare_tiering

    done = summaries(study)
    additions: list[dict[str, Any]] = []
    # A study finished by an earlier run already holds its sweeps' answers as trials (they were
    # its reserved ones): it is reported from its trials, without sweeping again.
    sweep_from = None if budget == 0 and expressible and hw.tiers else best
    if reserve and best is not None:
        won = policy_from_dict(best.policy, "<best>")
        knees = knee_capacities_gb(scenario.blocked(won), mdl, won.kv_dtype)
        additions = tier_additions(search_space, knees)
    tiered, hbm_only = compare_tiering(
        evaluator,
        done,
        sweep_from,
        hw.topology.max_instances,
        hw.topology.tp,
        hardware_has_tiers=bool(hw.tiers),
        tier_additions=additions,
    )
    if reserve and (deadline is None or time.monotonic() < deadline):
        swept = [c for c in (tiered, hbm_only) if c is not None and c.label.endswith(SWEPT)]
        for choice in sorted(swept, key=lambda c: c.cost_per_mtok)[:reserve]:
            study.enqueue_trial(choice.params, skip_if_exists=True)
        total = optuna.study.MaxTrialsCallback(n_trials, states=FINISHED)
        study.optimize(objective, n_trials=reserve, callbacks=[*callbacks, total], catch=())
        best = best_feasible(study)
        done = summaries(study)
        tiered, hbm_only = compare_tiering(
            evaluator,
            done,
            None,
            hw.topology.max_instances,
            hw.topology.tp,
            hardware_has_tiers=bool(hw.tiers),
        )
    # the winner as it ran: a split that left one instance aggregated is written without its
    # share and pool sizes, which would otherwise describe (and export) a split never run
    won_policy = None
    if best is not None:
        won_policy = without_inert_split(
            policy_from_dict(best.policy, f"{name} trial {best.number}"),
            int(best.metrics.get("instances", 0) or 0),
        )
    runnable = [] if won_policy is None else runnable_targets(policy_to_dict(won_policy), hw, mdl)
    shown = best or near  # the winner, or the closest trial when none met the SLO
    sample_warnings = _sample_warnings(
        scenario, None if shown is None else policy_from_dict(shown.policy, "<trial>"), baselines
    )

    policy_path = None
    if best is not None and won_policy is not None:
        policy_path = Path(out) if out else runs_dir / f"{name}.toml"
        best_trial = study.trials[best.number]
        write_policy_file(
            policy_path,
            won_policy,
            metrics=best.metrics,
            provenance={
                "trace": str(trace_path),
                "trace_sha256": digest,
                "kvtier_version": __version__,
                "study": name,
                "storage": storage,
                "trial": best.number,
                "seed": seed,
                "hardware": hardware,
                "model": model,
                "load": load,
                "rate_scale": best.rate_scale,
                "space": search_space.source,
                "params": best_trial.user_attrs.get("params", {}),
                # the step-time backend and the package / data versions behind the metrics
                "step_time": best.metrics.get("step_time_source", ""),
                "prices": str(prices) if prices else "the profiles' (owned, all-in)",
            },
        )
    return OptimizeResult(
        study_name=name,
        storage=storage,
        n_trials=_finished(study),
        best=best,
        closest=near,
        binding=binding,
        front=pareto_front(study) if pareto else [],
        baselines=baselines,
        policy_path=policy_path,
        slo=slo,
        seconds=time.perf_counter() - started,
        new_trials=_ran_by(study, worker),
        warm_started=warmed,
        extra={"trace": trace_path},
        tiered=tiered,
        hbm_only=hbm_only,
        bound=bound,
        runnable_by=runnable,
        target=target,
        reached=reached_front(done),
        sample_warnings=sample_warnings,
        sample_fraction=scenario.trace.sample_fraction,
        sample_weighting=sample_weighting(scenario.trace),
    )


def _sample_warnings(
    scenario: Scenario, best: Policy | None, baselines: list[Baseline]
) -> list[str]:
    """On a sampled trace, one line for each distinct way the reported trial's or a preset's
    hit ratios are biased against the full trace's (:func:`kvtier.scenario.sample_bias`)."""
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

# Export notes that mean the deployed system would not do what the simulated policy does.
INEXPRESSIBLE = (
    "cannot be expressed",
    "is not exported",
    "not exported:",
    "has no equivalent",
    "is not Mooncake's",
    "not modelled",
)


def runnable_targets(policy: dict[str, Any], hw: Any, mdl: Any) -> list[str]:
    """The export targets whose export of ``policy`` has no note that a setting could not be
    expressed (:data:`INEXPRESSIBLE`)."""
    from kvtier.export import TARGETS, export

    chosen = policy_from_dict(policy, "<best>")
    out = []
    for target in TARGETS:
        try:
            result = export(chosen, target, hw, mdl)
        except InputError:
            continue
        if target == "mooncake" and not result.files:
            continue
        if not any(m in n for n in result.notes for m in INEXPRESSIBLE):
            out.append(target)
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
