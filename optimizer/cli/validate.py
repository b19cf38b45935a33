"""``kvtier validate``: reproduce published results with the model and report them beside the
published figures, exit code 1 when a reproduction target is missed."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from kvtier.cli.common import KvtierGroup, _echo_json


@click.group(cls=KvtierGroup)
def validate() -> None:
    """Reproduce published results with the model and compare (docs/validation.md)."""


def report_options(written: str) -> Callable[[Any], Any]:
    """Every ``kvtier validate`` command's ``--json`` and ``--markdown FILE`` (``written``: what
    the file gets, for the help)."""

    def decorate(command: Any) -> Any:
        command = click.option(
            "--markdown",
            "markdown_path",
            default=None,
            help=f"Also write {written} to this file.",
        )(command)
        return click.option(
            "--json", "as_json", is_flag=True, help="Print the result as one JSON object."
        )(command)

    return decorate


def _report_validation(
    result: Any,
    *,
    as_json: bool,
    to_json: Callable[[Any], Any],
    to_text: Callable[[Any], str],
    misses: list[str],
    markdown_path: str | None = None,
    to_markdown: Callable[[Any], str] | None = None,
) -> None:
    """What every ``kvtier validate`` command does with its result: the markdown file when
    asked (its location was checked before the work), JSON or text on stdout, and each missed
    reproduction target on stderr with exit code 1."""
    if markdown_path is not None and to_markdown is not None:
        from pathlib import Path

        from kvtier.files import atomic_write

        text = to_markdown(result)
        atomic_write(markdown_path, lambda tmp: Path(tmp).write_text(text))
    if as_json:
        _echo_json(to_json(result))
    else:
        click.echo(to_text(result))
    for line in misses:
        click.echo(f"target missed: {line}", err=True)
    if misses:
        sys.exit(1)


def _check_markdown(markdown_path: str | None) -> None:
    """Before the work: the report file can be written and overwrites nothing the validation
    reads (the built-in policy files and the bundled traces)."""
    if markdown_path is None:
        return
    from kvtier.builtin import CHECKOUT_POLICIES, policies_dir
    from kvtier.files import check_output, guard_outputs

    guard_outputs(
        {"--markdown": markdown_path},
        {
            "(built-in policies)": policies_dir(),
            "(bundled traces)": CHECKOUT_POLICIES.parent / "traces",
        },
    )
    check_output(markdown_path, option="--markdown")


@validate.command("beluga")
@report_options("the full report (docs/validation.md)")
def validate_beluga(as_json: bool, markdown_path: str | None) -> None:
    """The Beluga paper's LV-Eval comparison: MoonCake, Beluga, vLLM, paper beside model."""
    from kvtier.experiments.validation import run_beluga
    from kvtier.report.validation import to_markdown, to_text, validation_json

    _check_markdown(markdown_path)
    result = run_beluga()
    _report_validation(
        result,
        as_json=as_json,
        to_json=validation_json,
        to_text=to_text,
        misses=[
            f"{a.ratio}: model {a.model:.3g}, target {a.target}"
            + (f" ({a.cause})" if a.cause else "")
            for a in result.missed()
        ],
        markdown_path=markdown_path,
        to_markdown=to_markdown,
    )


@validate.command("serving")
@report_options("the table (docs/validation-serving.md)")
def validate_serving(as_json: bool, markdown_path: str | None) -> None:
    """Published serving figures (TTFT, ITL, offline throughput) beside both step-time
    backends: published / model / ratio and the MAPE per backend over the checks."""
    from kvtier.experiments.serving_validation import run_serving
    from kvtier.report.serving_validation import serving_json, to_markdown, to_text

    _check_markdown(markdown_path)
    result = run_serving()
    _report_validation(
        result,
        as_json=as_json,
        to_json=serving_json,
        to_text=to_text,
        misses=[
            f"{m.backend} MAPE {100 * m.mape:.1f} % > {100 * m.target:.0f} %"
            for m in result.missed()
        ],
        markdown_path=markdown_path,
        to_markdown=to_markdown,
    )


@validate.command("silicon")
@report_options("the report and every run (docs/validation-silicon.md)")
@click.option("--framework", default=None, help="Only this framework's runs.")
@click.option("--model", "model", default=None, help="Only this model profile's runs.")
@click.option(
    "--max-runs",
    type=click.IntRange(min=1),
    default=None,
    help="Only the first N selected runs (in the sample's id order).",
)
def validate_silicon(
    as_json: bool,
    markdown_path: str | None,
    framework: str | None,
    model: str | None,
    max_runs: int | None,
) -> None:
    """aiconfigurator-core's measured serving runs (vLLM, SGLang, TensorRT-LLM under load)
    beside the model: TTFT and TPOT per run, the MAPE per framework and over all."""
    import time

    from kvtier.cli.progress import Ticker, duration, progress_seconds
    from kvtier.errors import InputError
    from kvtier.experiments.silicon_validation import load_manifest, load_runs, run_silicon
    from kvtier.report.silicon_validation import silicon_json, to_markdown, to_text

    _check_markdown(markdown_path)
    manifest = load_manifest()
    runs = load_runs(manifest)
    for field, value in (("framework", framework), ("model", model)):
        known = sorted({r.figure.conditions[field] for r in runs})
        if value is not None and value not in known:
            valid = ", ".join(known)
            raise InputError(f"unknown {field} {value!r} (valid: {valid})", option=f"--{field}")
    done = {"runs": 0, "of": 0}
    start = time.monotonic()

    def line() -> str:
        elapsed = duration(time.monotonic() - start)
        return f"{done['runs']}/{done['of'] or '?'} runs replayed, {elapsed} elapsed"

    with Ticker("validate silicon", line, progress_seconds()):
        result = run_silicon(
            runs,
            manifest=manifest,
            framework=framework,
            model=model,
            max_runs=max_runs,
            progress=lambda n, total: done.update(runs=n, of=total),
        )
    _report_validation(
        result,
        as_json=as_json,
        to_json=silicon_json,
        to_text=to_text,
        misses=result.missed(),
        markdown_path=markdown_path,
        to_markdown=to_markdown,
    )


@validate.command("pd")
@report_options("the table (docs/validation-pd.md)")
def validate_pd(as_json: bool, markdown_path: str | None) -> None:
    """Published prefill/decode results (DistServe, Mooncake): goodput per GPU, disaggregated
    over aggregated, published beside the model's (the paper's model and GPU where kvtier
    profiles them, else a stand-in)."""
    from kvtier.experiments.pd_validation import run_pd
    from kvtier.report.pd_validation import pd_json, to_markdown, to_text

    _check_markdown(markdown_path)
    result = run_pd()
    _report_validation(
        result,
        as_json=as_json,
        to_json=pd_json,
        to_text=to_text,
        misses=[
            f"{c.name}: model {c.model:.3g}x, published {c.published:g}x "
            f"(tolerance {c.tolerance:g}x)" + (f"; cause: {c.cause}" if c.cause else "")
            for c in result.missed()
        ],
        markdown_path=markdown_path,
        to_markdown=to_markdown,
    )


@validate.command("offload")
@report_options("the table (docs/validation-offload.md)")
@click.option(
    "--run",
    "only",
    multiple=True,
    help="Replay only this run of the catalogue (a file name without .toml; repeatable).",
)
@click.option(
    "--stages",
    is_flag=True,
    help="Also each side's replay stage by stage: latencies and the prompt tokens' shares hit "
    "in HBM, loaded from a lower tier and computed (JSON: under 'stages').",
)
def validate_offload(
    as_json: bool, markdown_path: str | None, only: tuple[str, ...], stages: bool
) -> None:
    """Published, measured offload runs (vLLM's OffloadingConnector, LMCache CPU and disk,
    Mooncake Store, file-system back ends), with and without the tier: measured / model /
    error per run, TTFT and throughput MAPE and the hit ratio over the checks."""
    from kvtier.errors import InputError
    from kvtier.experiments.offload_validation import (
        HIT_METRICS,
        load_catalogue,
        run_offload,
        stage_breakdown,
    )
    from kvtier.report.offload_validation import (
        offload_json,
        stages_json,
        stages_text,
        to_markdown,
        to_text,
    )

    _check_markdown(markdown_path)
    runs = load_catalogue()
    if only:
        names = [r.name for r in runs]
        unknown = [n for n in only if n not in names]
        if unknown:
            raise InputError(
                f"--run {unknown[0]!r} is not in the catalogue (valid: {', '.join(names)})",
                option="--run",
            )
        runs = [r for r in runs if r.name in only]
    result = run_offload(runs)
    report_json, report_text = offload_json, to_text
    if stages:
        ran = [r for r in runs if not result.notes.get(r.name)]
        breakdowns = {r.name: stage_breakdown(r) for r in ran}

        def report_json(res: Any) -> Any:
            return {**offload_json(res), "stages": stages_json(breakdowns)}

        def report_text(res: Any) -> str:
            return to_text(res) + "\n" + stages_text(breakdowns)

    _report_validation(
        result,
        as_json=as_json,
        to_json=report_json,
        to_text=report_text,
        misses=[
            (
                f"{m.metric}: {', '.join(m.runs)} could not be replayed"
                if m.metric == "ran"
                else f"{m.metric}: no check among these runs"
                if not result.checks(m.metric)
                else f"{m.metric} {'worst' if m.metric in HIT_METRICS else 'MAPE'} "
                f"{100 * m.value:.1f} {'points' if m.metric in HIT_METRICS else '%'} > "
                f"{100 * m.target:.0f} (worst runs: {', '.join(m.runs)})"
            )
            for m in result.missed()
        ],  # fmt: skip
        markdown_path=markdown_path,
        to_markdown=to_markdown,
    )


@validate.command("architectures")
@report_options("the table (docs/validation-architectures.md)")
def validate_architectures(as_json: bool, markdown_path: str | None) -> None:
    """Published memory-architecture ratios (the photonic pool's 405B throughput and latency,
    GH200 against x86 H100 multiturn TTFT), published beside the model's, each residual with
    its cause."""
    from kvtier.experiments.arch_validation import run_architectures
    from kvtier.report.arch_validation import arch_json, to_markdown, to_text

    _check_markdown(markdown_path)
    result = run_architectures()
    _report_validation(
        result,
        as_json=as_json,
        to_json=arch_json,
        to_text=to_text,
        misses=[
            f"{c.name}: model {c.model:.3g}x, published {c.published:g}x "
            f"(tolerance {c.tolerance:g}x); cause: {c.gap}"
            for c in result.missed()
        ],
        markdown_path=markdown_path,
        to_markdown=to_markdown,
    )
