"""``kvtier optimize``, ``kvtier batch`` and ``kvtier report``: run a policy search on one trace
or many, with a progress bar of trials, and report what a study has found."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console

from kvtier import __version__
from kvtier.cli.common import KvtierCommand, _console, _echo_json, step_margin_option
from kvtier.errors import InputError
from kvtier.search.request import OptimizeRequest, cli_fields


def _click_option(name: str, opt: Any) -> Callable[..., Any]:
    """The click option a request field declares (:class:`kvtier.search.request.CliOption`)."""
    kwargs: dict[str, Any] = {"help": opt.help}
    if opt.kind == "flag":
        kwargs["is_flag"] = True
        if opt.flag_value is not True:  # a --no-X flag: the field is True unless given
            kwargs.update(flag_value=opt.flag_value, default=not opt.flag_value)
    else:
        default = OptimizeRequest.__dataclass_fields__[name].default
        if opt.kind == "multiple":
            kwargs["multiple"] = True
        elif not opt.required:
            kwargs["default"] = default
        if opt.kind == "int":
            kwargs["type"] = click.INT if opt.minimum is None else click.IntRange(min=opt.minimum)
        elif opt.kind == "float":
            kwargs["type"] = (
                click.FLOAT
                if opt.minimum is None
                else click.FloatRange(min=opt.minimum, min_open=opt.min_open)
            )
        elif opt.kind == "choice":
            kwargs["type"] = click.Choice(list(opt.choices))
        elif opt.kind == "path":
            kwargs["type"] = click.Path()
        elif opt.kind == "file":
            kwargs["type"] = click.Path(dir_okay=False)
        if opt.required:
            kwargs["required"] = True
        if opt.show_default:
            kwargs["show_default"] = True
        if opt.metavar is not None:
            kwargs["metavar"] = opt.metavar
    return click.option(*opt.decls, name, **kwargs)


def _optimize_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """The options of ``optimize`` and ``batch``: one per field of
    :class:`~kvtier.search.request.OptimizeRequest` that declares one, and ``--json``."""
    options = [_click_option(name, opt) for name, opt in cli_fields()]
    as_json = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
    quiet = click.option(
        "--quiet",
        "-q",
        is_flag=True,
        help="No progress: neither the bar on a terminal nor the lines on stderr that "
        "stand for it elsewhere (every 10 s, $KVTIER_PROGRESS_S).",
    )
    options += [as_json, quiet]
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


def _on_trial(progress: Any, task: Any, state: Any) -> Callable[..., None]:
    """The ``on_trial`` hook: feeds the bar (on a terminal) and the state the progress lines
    read (elsewhere)."""

    def on_trial(done: int, best: Any, tally: Any = None) -> None:
        state.update(done, best, tally)
        text = state.best_text()
        if state.finished:
            text += f"; {state.feasible}/{state.finished} meet the SLO"
        progress.update(task, completed=done, best=text)

    return on_trial


def _ticker(label: str, text: Callable[[], str], console: Console, quiet: bool) -> Any:
    """Progress lines on stderr every few seconds where the bar cannot draw (not a terminal)."""
    from contextlib import nullcontext

    from kvtier.cli.progress import Ticker, progress_seconds

    if quiet or console.is_terminal:
        return nullcontext()
    # read here, so that a bad $KVTIER_PROGRESS_S is refused before any work
    return Ticker(label, text, progress_seconds())


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
    from dataclasses import replace

    from kvtier.cli.progress import TrialProgress
    from kvtier.search.request import request_from_options
    from kvtier.search.run import run_request
    from kvtier.search.study import check_study_name

    check_study_name(kwargs.get("study_name"))
    _refuse_ignored(kwargs)

    as_json = kwargs.pop("as_json")
    quiet = kwargs.pop("quiet")
    request = request_from_options(kwargs)
    err_console = _console(stderr=True)
    progress = _trial_progress(err_console, as_json or quiet)
    task = progress.add_task("optimizing", total=request.n_trials, best=FIRST_TRIAL_TEXT)
    state = TrialProgress(request.n_trials)
    try:
        with progress, _ticker("optimize", state.line, err_console, quiet):
            result = run_request(
                replace(
                    request,
                    on_trial=_on_trial(progress, task, state),
                    on_bound=None if as_json else _on_bound(progress.console),
                )
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


@click.command("optimize", cls=KvtierCommand)
@_optimize_options
@click.version_option(__version__, prog_name="kvtier")
def optimize_main(**kwargs: Any) -> None:
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
    help="Write a PNG of every trial's cost against TTFT p99: the SLO, the best trial and the "
    "presets marked.",
)
@click.option(
    "--html",
    "html_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Write the report as one self-contained HTML page with interactive charts (cost "
    "against TTFT and TPOT, what tiering buys, capacity curves, the trace's miss-ratio curve "
    "in GB).",
)
@click.option(
    "--what-if",
    "what_if",
    is_flag=True,
    help="Also replay the best policy without each lower tier, with each halved and doubled, "
    "and with each tier the hardware offers that it leaves out.",
)
@step_margin_option("the best policy, with --what-if,")
@click.option(
    "--trace",
    "trace_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="The study's trace, for --what-if and --html, if it has moved since the study ran.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
def report_cmd(
    study_name: str,
    storage: str | None,
    top: int,
    plot_path: str | None,
    html_path: str | None,
    what_if: bool,
    step_margin: float,
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
    from kvtier.sim.steptime.calibrated import check_step_margin

    check_step_margin(step_margin)
    if step_margin > 0 and not what_if:
        raise InputError("needs --what-if (its rows are what-if rows)", option="--step-time-margin")
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

            found = what_if_for_study(
                study, trace_path=trace_path, on_variant=progress, step_margin=step_margin
            )
        rep["what_if"] = study_what_if_json(found)
    elif trace_path is not None and html_path is None:
        raise InputError("--trace is only read with --what-if or --html", option="--trace")
    if plot_path is not None:
        plot_study(rep, plot_path)
    if html_path is not None:
        from kvtier.report.study import model_curve

        status = _console(stderr=True).status("miss-ratio curve of the study's trace")
        with status:
            curve = model_curve(rep, trace_path)
            if not rep.get("hit_ratio_over_time") and rep["finished"]:
                from kvtier.experiments.hit_timeline import study_hit_ratio_over_time

                status.update("the best trial replayed for its hit ratios over time")
                try:
                    rep["hit_ratio_over_time"] = study_hit_ratio_over_time(
                        study, trace_path=trace_path
                    )
                except InputError as err:  # the trace has moved: the page says so
                    rep["hit_ratio_over_time"] = err.message
        html_study_report(rep, html_path, curve)
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

    from kvtier.cli.progress import TrialProgress
    from kvtier.report.batch import batch_json, print_batch
    from kvtier.search.batch import plan_batch, run_batch
    from kvtier.search.request import request_values

    as_json = kwargs.pop("as_json")
    quiet = kwargs.pop("quiet")
    kwargs.pop("trace_path", None)
    _refuse_ignored(kwargs)
    kwargs = request_values(kwargs)
    items = plan_batch(
        traces,
        hardware=kwargs["hardware"],
        model=kwargs["model"],
        out_dir=Path(out_dir),
        study_prefix=study_prefix,
    )
    err_console = _console(stderr=True)
    progress = _trial_progress(err_console, as_json or quiet)
    current: dict[str, Any] = {"label": "", "state": TrialProgress(kwargs["n_trials"])}

    def on_start(i: int, item: Any) -> Callable[..., None]:
        label = f"{i + 1}/{len(items)} {Path(item.trace).name}"
        task = progress.add_task(label, total=kwargs["n_trials"], best=FIRST_TRIAL_TEXT)
        current.update(label=label, state=TrialProgress(kwargs["n_trials"]))
        return _on_trial(progress, task, current["state"])

    def line() -> str:
        if not current["label"]:  # before the first trace's study opens
            return "starting"
        return f"{current['label']}: {current['state'].line()}"

    try:
        with progress, _ticker("batch", line, err_console, quiet):
            run_batch(items, on_start=on_start, **kwargs)
    except KeyboardInterrupt:
        _interrupted()
    if as_json:
        _echo_json(batch_json(items))
    else:
        print_batch(items, _console())
    if any(item.result is None or item.result.best is None for item in items):
        sys.exit(1)
