"""``kvtier optimize``, ``kvtier batch`` and ``kvtier report``: run a policy search on one trace
or many, with a progress bar of trials, and report what a study has found."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console

from kvtier.cli.common import _console, _echo_json, trace_option
from kvtier.errors import InputError


def _optimize_options(command: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        trace_option,
        click.option(
            "--hardware",
            default=None,
            help="Hardware profile name or TOML path [default: h100-node].",
        ),
        click.option(
            "--model", default=None, help="Model profile name or TOML path [default: Llama-3.1-8B]."
        ),
        click.option(
            "--space",
            default="default",
            show_default=True,
            help="Search space: a name in policies/spaces or a TOML path.",
        ),
        click.option(
            "--pin",
            "pins",
            multiple=True,
            metavar="NAME=VALUE",
            help="Fix a parameter, e.g. --pin block_tokens=64 (repeatable).",
        ),
        click.option(
            "--slo",
            "slo_text",
            default=None,
            help="Constraints in seconds, e.g. ttft_p99=5,ttft_mean=2,tpot_p99=0.1 "
            "[default: ttft_p99=2,tpot_p99=0.1].",
        ),
        click.option(
            "--load",
            type=click.Choice(["trace", "capacity"]),
            default="trace",
            show_default=True,
            help="trace: serve the trace as recorded; capacity: the largest load "
            "meeting the SLO, priced at that rate.",
        ),
        click.option(
            "--rate-scale",
            type=float,
            default=1.0,
            show_default=True,
            help="With --load trace: replay arrivals this many times as fast.",
        ),
        click.option(
            "--trials",
            "n_trials",
            type=click.IntRange(min=1),
            default=60,
            show_default=True,
            help="Trials the study should hold: a rerun of a finished study reports it, one cut "
            "short runs what it lacks; raise N to search further.",
        ),
        click.option(
            "--timeout",
            type=click.FloatRange(min=0, min_open=True),
            default=None,
            help="Stop starting trials after this many seconds.",
        ),
        click.option(
            "--jobs",
            "n_jobs",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Trials run at once, in threads.",
        ),
        click.option("--seed", type=int, default=0, show_default=True, help="Sampler seed."),
        click.option(
            "--pareto", is_flag=True, help="NSGA-II on cost and TTFT P99; prints the Pareto front."
        ),
        click.option(
            "--study",
            "study_name",
            default=None,
            help="Study name; running the same name again continues it "
            "[default: from trace, hardware and model].",
        ),
        click.option(
            "--storage",
            default=None,
            help="Optuna storage URL [default: sqlite:///runs/STUDY.db]; "
            "postgresql://... for many machines.",
        ),
        click.option(
            "--allow-lossy-kv",
            is_flag=True,
            help="Let the search store KV in fp8 (changes model outputs slightly).",
        ),
        click.option(
            "--no-presets",
            "compare_presets",
            is_flag=True,
            flag_value=False,
            default=True,
            help="Do not evaluate the built-in presets for comparison.",
        ),
        click.option(
            "--no-warm-start",
            "warm_start",
            is_flag=True,
            flag_value=False,
            default=True,
            help="Do not enqueue trials at the miss-ratio curve's knees.",
        ),
        click.option(
            "--out",
            default=None,
            type=click.Path(dir_okay=False),
            help="Policy file to write [default: runs/STUDY.toml].",
        ),
        click.option(
            "--target",
            type=click.Choice(["vllm", "lmcache", "sglang", "dynamo", "mooncake"]),
            default=None,
            help="Search only what this serving system can express, so its export runs the "
            "simulated policy [default: search everything; the report names the targets "
            "that can run the winner].",
        ),
        click.option(
            "--max-hosts",
            type=click.IntRange(min=1),
            default=None,
            help="Let the search add hosts of the hardware profile, up to this many "
            "(cost counts the hosts a policy occupies) [default: the profile's hosts].",
        ),
        click.option(
            "--prices",
            default=None,
            type=click.Path(dir_okay=False),
            help="TOML file of your own prices (GPU-hour, host-hour, per tier GB-hour and "
            "fabric host-hour; docs/search.md) [default: the profiles' owned all-in prices].",
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def _trial_progress(console: Console, disable: bool) -> Any:
    """A rich progress bar of trials (on a terminal only) and the ``on_trial`` hook feeding it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[best]}"),
        console=console,
        disable=disable or not console.is_terminal,
    )


# Shown until the first trial ends: with an empty numba cache (a fresh install) the first
# replay compiles the simulator's kernels, 30-60 s on a 2-core machine (docs/benchmarks.md).
FIRST_TRIAL_TEXT = "first trial (a first run on this machine compiles the simulator: ~1 min)"


def _on_trial(progress: Any, task: Any) -> Callable[[int, Any], None]:
    def on_trial(done: int, best: Any) -> None:
        text = (
            f"best ${best.metrics['cost_per_mtok']:.4f}/Mtok" if best else "no feasible trial yet"
        )
        progress.update(task, completed=done, best=text)

    return on_trial


def _on_bound(console: Console) -> Callable[[Any], None]:
    """Say before the search when the SLO is out of reach (the report repeats it)."""

    def on_bound(bound: Any) -> None:
        if bound.unreachable:
            from kvtier.report.optimize import bound_text

            console.print(bound_text(bound))

    return on_bound


def _interrupted() -> None:
    click.echo(
        "interrupted: finished trials are kept in the study; run the same command again "
        "(same --study) to continue it",
        err=True,
    )
    sys.exit(130)


def _refuse_ignored(kwargs: dict[str, Any]) -> None:
    """Options that would be stored but never used, refused before any work."""
    if kwargs.get("load") == "capacity" and kwargs.get("rate_scale", 1.0) != 1.0:
        raise InputError(
            "applies with --load trace only (--load capacity searches the rate itself)",
            option="--rate-scale",
        )
    scale = kwargs.get("rate_scale", 1.0)
    if not (scale > 0 and scale < float("inf")):
        raise InputError(f"must be a positive finite number, got {scale}", option="--rate-scale")


def _run_optimize(**kwargs: Any) -> None:
    from kvtier.search.run import optimize
    from kvtier.search.space import parse_pins
    from kvtier.search.study import check_study_name

    check_study_name(kwargs.get("study_name"))
    _refuse_ignored(kwargs)

    as_json = kwargs.pop("as_json")
    pins = parse_pins(kwargs.pop("pins"))
    progress = _trial_progress(_console(stderr=True), as_json)
    task = progress.add_task("optimizing", total=kwargs["n_trials"], best=FIRST_TRIAL_TEXT)
    try:
        with progress:
            result = optimize(
                pins=pins,
                on_trial=_on_trial(progress, task),
                on_bound=None if as_json else _on_bound(progress.console),
                **kwargs,
            )
    except KeyboardInterrupt:
        _interrupted()
    from kvtier.report.optimize import print_result, result_json

    if as_json:
        _echo_json(result_json(result))
    else:
        print_result(result, _console())
    if result.best is None:
        sys.exit(1)


def _without(command: Any, *flags: str) -> Any:
    """Drop the options spelled ``flags`` from a function decorated with click options."""
    command.__click_params__ = [p for p in command.__click_params__ if not set(p.opts) & set(flags)]
    return command


@click.command("optimize")
@_optimize_options
def optimize_cmd(**kwargs: Any) -> None:
    """Find the cheapest policy per token that meets the SLO on a trace; write a policy file."""
    _run_optimize(**kwargs)


@click.command("report")
@click.option("--study", "study_name", required=True, help="Study name (as optimize named it).")
@click.option(
    "--storage",
    default=None,
    help="Optuna storage URL [default: sqlite:///runs/STUDY.db, which must exist].",
)
@click.option(
    "--top", type=click.IntRange(min=1), default=10, show_default=True, help="Trials listed."
)
@click.option(
    "--plot",
    "plot_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write a PNG of every trial's cost against TTFT p99.",
)
@click.option(
    "--html",
    "html_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write the report as one self-contained HTML page (plot embedded).",
)
@click.option(
    "--what-if",
    "what_if",
    is_flag=True,
    help="Also replay the best policy without each lower tier, with each halved and doubled, "
    "and with each tier the hardware offers that it leaves out.",
)
@click.option(
    "--trace",
    "trace_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="The study's trace, for --what-if, if it has moved since the study ran.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def report_cmd(
    study_name: str,
    storage: str | None,
    top: int,
    plot_path: str | None,
    html_path: str | None,
    what_if: bool,
    trace_path: str | None,
    as_json: bool,
) -> None:
    """What a study has found so far: best policy, next best, Pareto front, what mattered.

    With --what-if, the best policy is also replayed with its memory tiers changed, one change
    at a time, on the study's trace, hardware, model, SLO and load mode.
    """
    from kvtier.files import check_output, guard_outputs
    from kvtier.report.study import (
        html_study_report,
        load_existing_study,
        plot_study,
        print_study_report,
        study_report,
    )
    from kvtier.search.study import RUNS_DIR, check_study_name

    check_study_name(study_name)
    guard_outputs(
        {"--plot": plot_path, "--html": html_path},
        {"--trace": trace_path},
        {"--storage": storage if storage is not None else f"sqlite:///{RUNS_DIR}/{study_name}.db"},
    )
    for option, written in (("--plot", plot_path), ("--html", html_path)):
        if written is not None:
            check_output(written, option=option)
    study = load_existing_study(study_name, storage)
    rep = study_report(study, top=top)
    if what_if:
        from kvtier.experiments.whatif import what_if_for_study
        from kvtier.report.whatif import study_what_if_json

        status = _console(stderr=True).status("architecture what-if")
        with status:

            def progress(k: int, n: int, label: str) -> None:
                status.update(f"architecture what-if: {k + 1}/{n} {label}")

            found = what_if_for_study(study, trace_path=trace_path, on_variant=progress)
        rep["what_if"] = study_what_if_json(found)
    elif trace_path is not None:
        raise InputError("--trace is only read with --what-if", option="--trace")
    if plot_path is not None:
        plot_study(rep, plot_path)
    if html_path is not None:
        html_study_report(rep, html_path)
    if as_json:
        _echo_json(rep)
    else:
        print_study_report(rep, _console())
        for written in (plot_path, html_path):
            if written is not None:
                click.echo(f"wrote {written}")


@click.command("batch")
@click.argument("traces", nargs=-1, required=True, type=click.Path())
@click.option(
    "--out-dir",
    default="runs",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Directory of the policy files, one per trace (STUDY.toml).",
)
@click.option(
    "--study-prefix",
    default="",
    help="Prefix of every study name (the rest: TRACE-HARDWARE-MODEL).",
)
@lambda f: _without(_optimize_options(f), "--trace", "--study", "--out")
def batch_cmd(traces: tuple[str, ...], out_dir: str, study_prefix: str, **kwargs: Any) -> None:
    """Optimize every trace given (one study and one policy file each); a summary table.

    All traces are checked before the first trial. On many machines, run the same command
    with one shared --storage and a different --seed each: the workers add their trials to
    the same studies. Exit code 1 when some trace found no policy meeting the SLO.
    """
    from pathlib import Path

    from kvtier.report.batch import batch_json, print_batch
    from kvtier.search.batch import plan_batch, run_batch
    from kvtier.search.space import parse_pins

    as_json = kwargs.pop("as_json")
    kwargs.pop("trace_path", None)
    _refuse_ignored(kwargs)
    pins = parse_pins(kwargs.pop("pins"))
    items = plan_batch(
        traces,
        hardware=kwargs["hardware"],
        model=kwargs["model"],
        out_dir=Path(out_dir),
        study_prefix=study_prefix,
    )
    progress = _trial_progress(_console(stderr=True), as_json)

    def on_start(i: int, item: Any) -> Callable[[int, Any], None]:
        label = f"{i + 1}/{len(items)} {Path(item.trace).name}"
        task = progress.add_task(label, total=kwargs["n_trials"], best=FIRST_TRIAL_TEXT)
        return _on_trial(progress, task)

    try:
        with progress:
            run_batch(items, on_start=on_start, pins=pins, **kwargs)
    except KeyboardInterrupt:
        _interrupted()
    if as_json:
        _echo_json(batch_json(items))
    else:
        print_batch(items, _console())
    if any(item.result is None or item.result.best is None for item in items):
        sys.exit(1)
