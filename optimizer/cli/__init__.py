"""The ``kvtier`` command line: click commands only (parse, call, print).

Every command turns :class:`kvtier.errors.InputError` into one line on stderr and exit
code 2; the work itself lives in the subpackages.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kvtier import __version__
from kvtier.cache.registry import policy_help
from kvtier.cli.common import (
    KvtierCommand,
    KvtierGroup,
    _console,
    _echo_json,
    _overrides,
    policy_profile_options,
    set_option,
    trace_option,
    trace_output_option,
)
from kvtier.cli.export import EXPORT_TARGETS, export_cmd
from kvtier.cli.validate import validate
from kvtier.errors import InputError
from kvtier.report.jsonout import null_reason
from kvtier.trace.importers import format_names as import_format_names

# EXPORT_TARGETS: the exporters' names, as tests and scripts import them from here
__all__ = ["EXPORT_TARGETS", "main", "optimize_main"]


@click.group(cls=KvtierGroup)
@click.version_option(__version__, prog_name="kvtier")
def main() -> None:
    """kvtier: trace-driven optimizer for KV-cache tiering in LLM inference."""


@main.group(cls=KvtierGroup)
def trace() -> None:
    """Import, synthesise and inspect request traces."""


main.add_command(validate)
main.add_command(export_cmd)


@main.command("replay")
@trace_option
@policy_profile_options
@click.option(
    "--policy",
    "policy_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Policy TOML file [default: vLLM-like defaults, HBM prefix cache].",
)
@click.option(
    "--preset",
    default=None,
    help="Built-in policy of a known system (policies/presets/NAME.toml), e.g. beluga-cxl.",
)
@set_option
@click.option(
    "--block-tokens",
    "-B",
    type=int,
    default=None,
    help="KV block size in tokens [default: the policy's, 16].",
)
@click.option(
    "--rate-scale",
    type=float,
    default=None,
    help="Replay arrivals this many times as fast [default: the policy file's load, else 1].",
)
@click.option(
    "--concurrency",
    type=int,
    default=0,
    show_default=True,
    help="Closed loop: at most N requests in flight, each sent when a slot frees and not "
    "before its trace time (vllm bench serve --max-concurrency); 0: open loop.",
)
@click.option(
    "--engine",
    type=click.Choice(["numba", "reference"]),
    default="numba",
    show_default=True,
    help="Simulator implementation (same results).",
)
@click.option(
    "--prices",
    "prices",
    default=None,
    type=click.Path(dir_okay=False),
    help="TOML file of your own prices, as optimize --prices takes [default: the prices file "
    "the policy file records, else the profile's].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as one JSON object.")
@click.option(
    "--requests-out",
    default=None,
    type=click.Path(dir_okay=False),
    help="Also write one row per request (times, TTFT, TPOT, prompt tokens per tier, its "
    "weight in the latency statistics: 1.0 unless a sample with strata) to this .parquet file.",
)
@click.option(
    "--track-tbt",
    is_flag=True,
    help="Record token intervals: TBT P50/P99 (each request's mean of its longest 10% "
    "intervals) and a tbt_tail_s column in --requests-out [always with slo.tbt_p99_s].",
)
def replay_cmd(
    trace_path: str,
    hardware: str | None,
    model: str | None,
    policy_path: str | None,
    preset: str | None,
    sets: tuple[str, ...],
    block_tokens: int | None,
    rate_scale: float | None,
    concurrency: int,
    engine: str,
    prices: str | None,
    as_json: bool,
    requests_out: str | None,
    track_tbt: bool = False,
) -> None:
    """Replay a trace through the serving simulator and print latency, throughput and cost.

    A policy file that optimize found at the prices of a --prices file replays at them."""
    from dataclasses import replace

    from kvtier.scenario import Scenario, recorded_prices, sample_bias, sample_weighting

    if preset is not None and policy_path is not None:
        raise click.UsageError("give --policy or --preset, not both")
    if prices is None and policy_path is not None:
        prices, note = recorded_prices(policy_path)
        if note is not None:
            click.echo(f"note: {note}", err=True)
    scenario = Scenario.from_files(
        trace_path,
        hardware=hardware,
        model=model,
        policy_path=policy_path,
        preset=preset,
        overrides=_overrides(sets),
        block_tokens=block_tokens,
        rate_scale=rate_scale,
        engine=engine,
        prices=prices,
    )
    if concurrency:
        scenario = replace(scenario, concurrency=concurrency)
    bias = sample_bias(scenario.policy, scenario.hardware, scenario.trace.sample_fraction)
    if bias is not None:
        click.echo(f"warning: {bias}", err=True)
    if requests_out is not None:
        from kvtier.sim.requests import check_requests_path

        check_requests_path(requests_out)
    result = scenario.replay(track_tbt=track_tbt)
    metrics = result.metrics
    weighting = sample_weighting(scenario.trace)
    if weighting is not None:
        click.echo(f"note: {weighting}", err=True)
    if requests_out is not None:
        from kvtier.sim.requests import request_table, trace_request_ids, write_request_table

        tiers = result.config.tiers
        table = request_table(
            result.trace,
            result.raw,
            tiers.names if tiers is not None else (),
            trace_request_ids(scenario.trace.table),
        )
        write_request_table(requests_out, table)
    from kvtier.report.rejections import rejection_note
    from kvtier.report.tiers import tier_json, tier_table

    # a rejected request is the deployment's answer, not bad input: said plainly, exit 0
    rejected = rejection_note(result)
    if as_json:
        data = metrics.to_dict()
        if result.tiers:
            data["tiers"] = tier_json(result.tiers)
        if prices is not None:
            data["prices"] = prices
        why = null_reason(data)
        if rejected is not None and why is not None:  # one line: the cause, then the nulls
            nulls = "latencies, throughput and per-token cost are null"
            why = f"no request was served: {rejected}; {nulls}"
        elif rejected is not None:
            click.echo(f"warning: {rejected}", err=True)
        _echo_json(data, why=why)
        return
    if prices is not None:
        click.echo(f"prices: {prices}")
    _print_metrics(trace_path, scenario, metrics, _pd_row(result))
    if result.tiers:
        _console().print(tier_table(result.tiers))
    if rejected is not None:
        served = "no request was served: " if metrics.n_served == 0 else ""
        click.echo(f"warning: {served}{rejected}", err=True)


def _pd_row(result: Any) -> tuple[str, str] | None:
    """The P/D transfers' summary row of a disaggregated replay (None: aggregated)."""
    raw, cfg = result.raw, result.config
    if raw.decode_instance is None or raw.decode_hit_blocks is None or cfg.pd is None:
        return None
    from kvtier.sim.pd import pd_traffic

    tr = pd_traffic(
        result.trace.input_tokens, raw.decode_instance, raw.first_token_s,
        raw.decode_hit_blocks, cfg.block_tokens, cfg.pd.block_bytes,
    )  # fmt: skip
    whole = tr.bytes_moved + tr.bytes_saved
    share = tr.bytes_saved / whole if whole > 0 else 0.0
    return (
        "P/D transfers / GB moved / GB saved by decode hits",
        f"{tr.requests:,} / {tr.bytes_moved / 1e9:,.1f} / {tr.bytes_saved / 1e9:,.1f} "
        f"({share:.1%})",
    )


def _print_metrics(path: str, scenario: Any, m: Any, pd_row: tuple[str, str] | None = None) -> None:
    cfg = f"{scenario.hardware.name}, {scenario.model.name}, B={scenario.policy.block_tokens}, "
    cfg += f"{m.instances} instances, {scenario.policy.serving.routing}"
    table = Table(title=f"{path} ({cfg})", title_justify="left", show_header=False)
    table.add_column("metric", style="bold")
    table.add_column("value", justify="right")
    table.add_row("requests served / rejected", f"{m.n_served:,} / {m.n_rejected:,}")
    if m.step_time:
        source = m.step_time_source or m.step_time
        if m.extrapolated_share > 0:
            source += f"; {m.extrapolated_share:.1%} of iterations extrapolated past the data"
        table.add_row("step time", source)
    table.add_row(
        "TTFT mean / p50 / p90", f"{m.ttft_mean_s:.3f} / {m.ttft_p50_s:.3f} / {m.ttft_p90_s:.3f} s"
    )
    table.add_row("TTFT p99 / p99.9", f"{m.ttft_p99_s:.3f} / {m.ttft_p999_s:.3f} s")
    table.add_row("TPOT mean / p99", f"{m.tpot_mean_s * 1e3:.2f} / {m.tpot_p99_s * 1e3:.2f} ms")
    if m.tbt_p99_s is not None:  # tracked (--track-tbt, or an SLO bounding it)
        table.add_row(
            "TBT p50 / p99 (longest 10%)", f"{m.tbt_p50_s * 1e3:.2f} / {m.tbt_p99_s * 1e3:.2f} ms"
        )
    table.add_row("end-to-end mean", f"{m.e2e_mean_s:.3f} s")
    table.add_row("throughput", f"{m.throughput_rps:.2f} req/s, {m.throughput_tps:,.0f} tok/s")
    table.add_row("HBM prefix hit ratio (tokens)", f"{m.hit_ratio_tokens['hbm']:.1%}")
    for name in m.tier_hit_blocks:
        table.add_row(
            f"{name} hit ratio / GB read / written",
            f"{m.hit_ratio_tokens[name]:.1%} / {m.tier_bytes_read[name] / 1e9:,.0f} / "
            f"{m.tier_bytes_written[name] / 1e9:,.0f}",
        )
    if m.tier_hit_blocks:
        busiest = max(m.link_utilisation.items(), key=lambda kv: kv[1])
        table.add_row("TTFT share spent loading", f"{m.load_share_of_ttft:.1%}")
        table.add_row("busiest link", f"{busiest[0]} {busiest[1]:.1%}")
    table.add_row("prefill tokens saved", f"{m.prefill_tokens_saved:,}")
    if pd_row is not None:
        table.add_row(*pd_row)
    table.add_row("GPU busy", f"{m.gpu_busy_fraction:.1%}")
    table.add_row("cost", f"${m.cost_per_hour:,.2f}/h, ${m.cost_per_mtok:.4f} per 1M tokens")
    table.add_row("simulated span / iterations", f"{m.duration_s:,.1f} s / {m.n_iterations:,}")
    if m.slo_met is not None:
        table.add_row("SLO met / attainment", f"{m.slo_met} / {m.slo_attainment:.1%}")
    _console().print(table)


def _knob_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add one click option per synthesis knob, generated from the knob dataclasses."""
    from kvtier.trace.synth.knobs import knob_specs, option_name

    types = {"int": int, "float": float, "str": str}
    for spec in reversed(knob_specs()):
        if spec.kind_of_value == "bool":
            option = click.option(option_name(spec.name), spec.name, is_flag=True, default=None)
        else:
            option = click.option(
                option_name(spec.name), spec.name, type=types[spec.kind_of_value], default=None
            )
        command = option(command)
        command.__click_params__[-1].help = spec.help  # type: ignore[attr-defined]
    return command


@trace.command("synth")
@click.argument("kind", metavar="chat|rag|agent|short")
@click.option("-o", "--output", required=True, help="trace file to write (.parquet or .arrow)")
@click.option("--requests", type=int, default=None, help="requests per pass (default 1000)")
@click.option("--duration", type=float, default=None, help="seconds of arrivals per pass")
@click.option("--rate", type=float, default=1.0, show_default=True, help="requests per second")
@click.option(
    "--arrivals",
    default="poisson",
    show_default=True,
    help="poisson, or gamma (inter-arrival coefficient of variation = --burstiness)",
)
@click.option(
    "--burstiness",
    type=float,
    default=1.0,
    show_default=True,
    help="coefficient of variation of inter-arrival times (gamma arrivals)",
)
@click.option("--seed", type=int, default=0, show_default=True, help="random seed")
@click.option(
    "--block-tokens", type=int, default=16, show_default=True, help="native hash granularity G"
)
@click.option(
    "--passes", type=int, default=1, show_default=True, help="replay the requests this many times"
)
@click.option(
    "--pass-gap",
    type=float,
    default=60.0,
    show_default=True,
    help="seconds between the last arrival of a pass and the next pass",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of a line.")
@_knob_options
def trace_synth(
    kind: str,
    output: str,
    requests: int | None,
    duration: float | None,
    rate: float,
    arrivals: str,
    burstiness: float,
    seed: int,
    block_tokens: int,
    passes: int,
    pass_gap: float,
    as_json: bool,
    **knobs: Any,
) -> None:
    """Write a synthetic trace of KIND: chat, rag, agent or short (see docs/workloads.md)."""
    from kvtier.trace.io import write_trace
    from kvtier.trace.synth import synthesize
    from kvtier.trace.synth.core import META_PARAMS

    result = synthesize(
        kind,
        requests=requests,
        duration=duration,
        rate=rate,
        arrivals=arrivals,
        burstiness=burstiness,
        seed=seed,
        block_tokens=block_tokens,
        passes=passes,
        pass_gap_s=pass_gap,
        **knobs,
    )
    write_trace(result, output)
    if as_json:
        summary = {
            "path": output,
            "kind": kind,
            "requests": result.n_requests,
            "duration_s": result.duration_s,
            "block_tokens": result.block_tokens,
            "params": json.loads(result.metadata[META_PARAMS]),
        }
        _echo_json(summary)
    else:
        click.echo(
            f"wrote {result.n_requests} {kind} requests over {result.duration_s:.1f} s to {output}"
        )


IMPORT_FORMATS = import_format_names()


def _not_the_input(input_path: str, output: str) -> None:
    """Refuse an output that is the input, or lies inside an input dataset directory.

    Writing a derived trace over its source destroys the source (the write is atomic, so the
    result would be whole, but the original is gone), and a file written into a dataset
    directory becomes one of its parts on the next read.
    """
    source, target = os.path.realpath(input_path), os.path.realpath(output)
    same = target == source or (
        os.path.exists(target) and os.path.exists(source) and os.path.samefile(source, target)
    )
    if same:
        where = "is the input"
    elif os.path.isdir(source) and os.path.commonpath([source, target]) == source:
        where = "is inside the input dataset directory"
    else:
        return
    raise InputError(f"{output} {where} {input_path}; write to another path", option="--output")


@trace.command("import")
@click.option(
    "--from",
    "source_format",
    required=True,
    type=click.Choice(IMPORT_FORMATS),
    help="Format of INPUT (docs/traces.md describes each).",
)
@click.argument("input_path", metavar="INPUT", type=click.Path(dir_okay=False))
@trace_output_option
@click.option(
    "--tokenizer",
    default=None,
    type=click.Path(dir_okay=False),
    help="tokenizer.json of the served model (sources with prompt text).",
)
@click.option(
    "--chat-template",
    default=None,
    type=click.Path(dir_okay=False),
    help="tokenizer_config.json (or a Jinja file) with the model's chat template "
    "[default: the documented plain template].",
)
@click.option(
    "--block-tokens",
    "-B",
    type=int,
    default=None,
    help="Hash granularity for sources with prompt text [default: 16, vLLM's block size].",
)
@click.option(
    "--columns",
    default=None,
    help="FIELD=COLUMN,... mapping trace fields (arrival, input, output, ...) to the "
    "source's column names (--from csv / jsonl).",
)
@click.option(
    "--session-rate",
    type=float,
    default=None,
    help="Sessions started per second, for datasets without timestamps (sharegpt, lmsys) "
    "[default: 1].",
)
@click.option(
    "--think-time",
    "think_time_s",
    type=float,
    default=None,
    help="Mean seconds between a session's turns, ditto [default: 10].",
)
@click.option("--seed", type=int, default=None, help="Seed of the synthetic arrivals [default: 0].")
@click.option(
    "--stream/--no-stream",
    default=None,
    help="Import a request log (CSV or JSON Lines) in bounded memory "
    "[default: for files over 256 MiB].",
)
@click.option(
    "--batch-rows",
    type=int,
    default=None,
    help="Lines (JSON Lines) or rows (CSV) per batch of a streamed import "
    "[default: 262144, 1048576].",
)
def trace_import(
    source_format: str,
    input_path: str,
    output: str,
    tokenizer: str | None,
    chat_template: str | None,
    block_tokens: int | None,
    columns: str | None,
    session_rate: float | None,
    think_time_s: float | None,
    seed: int | None,
    stream: bool | None,
    batch_rows: int | None,
) -> None:
    """Convert a public or user trace (INPUT) to request-trace/1."""
    from kvtier.trace.importers import ImportOptions, import_trace, parse_columns, stream_plan
    from kvtier.trace.io import write_trace

    _not_the_input(input_path, output)
    if block_tokens is not None and block_tokens < 1:
        raise InputError(f"must be >= 1, got {block_tokens}", option="--block-tokens")
    if batch_rows is not None and batch_rows < 1:
        raise InputError(f"must be >= 1, got {batch_rows}", option="--batch-rows")
    options = ImportOptions(
        tokenizer=tokenizer,
        chat_template=chat_template,
        block_tokens=block_tokens,
        columns=parse_columns(columns) if columns is not None else {},
        session_rate=session_rate,
        think_time_s=think_time_s,
        seed=seed,
    )
    plan = stream_plan(source_format, input_path, options, stream)
    if plan is not None:
        from kvtier.trace.jsonlstream import JsonlPlan, stream_import_jsonl
        from kvtier.trace.streaming import stream_import

        sized = {} if batch_rows is None else {"batch_rows": batch_rows}
        if isinstance(plan, JsonlPlan):
            done = stream_import_jsonl(input_path, plan, output, **sized)
        else:
            done = stream_import(input_path, plan, output, **sized)
        what = (
            f"{done.block_tokens}-token blocks"
            if done.has_prefix_info
            else "lengths only: no prefix information"
        )
        click.echo(
            f"wrote {done.n_requests:,} requests over {done.duration_s:,.1f} s ({source_format}, "
            f"streamed, {what}) to {output}"
        )
        return
    if batch_rows is not None:
        raise InputError("applies to a streamed import only (--stream)", option="--batch-rows")
    from kvtier.report.output import check_output

    check_output(output, option="--output")  # as the streamed import does, before the work
    imported = import_trace(source_format, input_path, options)
    write_trace(imported, output)
    prefix = "" if imported.has_prefix_info else ", lengths only: no prefix information"
    click.echo(
        f"wrote {imported.n_requests:,} requests over {imported.duration_s:,.1f} s "
        f"({source_format}, {imported.block_tokens}-token blocks{prefix}) to {output}"
    )


@trace.command("capture")
@click.option(
    "--kv-events",
    "endpoint",
    default=None,
    help="vLLM's KV-event PUB endpoint to subscribe to, tcp://HOST:PORT (the server's "
    "kv_events_config endpoint).",
)
@click.option(
    "--from-log",
    "log_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="Or: an OpenAI-compatible gateway's request log (the openai-log format).",
)
@click.option("--duration", "duration_s", type=float, default=None, help="Seconds to record.")
@click.option("--max-events", type=int, default=None, help="Stop after this many events.")
@click.option("--topic", default="", help="Event topic to subscribe to [default: all].")
@click.option(
    "--join-gap",
    "join_gap_s",
    type=float,
    default=None,
    help="Seconds within which stored blocks extending a request are more of its prefill "
    "[default: 0.5].",
)
@click.option("--tokenizer", default=None, type=click.Path(dir_okay=False), help="For --from-log.")
@click.option(
    "--chat-template", default=None, type=click.Path(dir_okay=False), help="For --from-log."
)
@click.option("--block-tokens", "-B", type=int, default=None, help="For --from-log [default: 16].")
@trace_output_option
def trace_capture(
    endpoint: str | None,
    log_path: str | None,
    duration_s: float | None,
    max_events: int | None,
    topic: str,
    join_gap_s: float | None,
    tokenizer: str | None,
    chat_template: str | None,
    block_tokens: int | None,
    output: str,
) -> None:
    """Record a trace from a running server: its KV-cache events or its gateway's request log
    (docs/traces.md says what each can and cannot recover)."""
    from kvtier.trace.io import write_trace

    if (endpoint is None) == (log_path is None):
        raise InputError("give exactly one of --kv-events and --from-log", option="--kv-events")
    if endpoint is not None:
        from kvtier.trace.capture import DEFAULT_JOIN_GAP_S, requests_from_events, subscribe

        for flag, value in (("--tokenizer", tokenizer), ("--chat-template", chat_template),
                            ("--block-tokens", block_tokens)):  # fmt: skip
            if value is not None:
                raise InputError("applies to --from-log only (events carry block hashes)",
                                 option=flag)  # fmt: skip
        if duration_s is not None and not duration_s > 0:
            raise InputError(f"must be > 0, got {duration_s}", option="--duration")
        if max_events is not None and max_events < 1:
            raise InputError(f"must be >= 1, got {max_events}", option="--max-events")
        batches, missed = subscribe(
            endpoint, duration_s=duration_s, max_events=max_events, topic=topic
        )
        captured = requests_from_events(
            batches,
            join_gap_s=DEFAULT_JOIN_GAP_S if join_gap_s is None else join_gap_s,
            source=f"kv-events:{endpoint}",
            missed_batches=missed,
        )
        if missed:
            click.echo(f"warning: {missed} event batches were missed (sequence gaps)", err=True)
        what = f"{len(batches):,} event batches"
    else:
        from kvtier.trace.importers import ImportOptions, import_trace

        for flag, value in (("--duration", duration_s), ("--max-events", max_events),
                            ("--join-gap", join_gap_s), ("--topic", topic or None)):  # fmt: skip
            if value is not None:
                raise InputError("applies to --kv-events only", option=flag)
        if block_tokens is not None and block_tokens < 1:
            raise InputError(f"must be >= 1, got {block_tokens}", option="--block-tokens")
        options = ImportOptions(
            tokenizer=tokenizer, chat_template=chat_template, block_tokens=block_tokens
        )
        _not_the_input(log_path, output)  # type: ignore[arg-type]
        captured = import_trace("openai-log", log_path, options)  # type: ignore[arg-type]
        what = "the request log"
    write_trace(captured, output)
    click.echo(
        f"wrote {captured.n_requests:,} requests over {captured.duration_s:,.1f} s from {what} "
        f"({captured.block_tokens}-token blocks) to {output}"
    )


@trace.command("sample")
@click.argument("trace_path", metavar="TRACE", type=click.Path())
@click.option("--fraction", type=float, required=True, help="Share of sessions to keep, (0, 1].")
@click.option("--seed", type=int, default=0, show_default=True, help="Another, independent sample.")
@trace_output_option
@click.option(
    "--stream/--no-stream",
    default=None,
    help="Read and write by record batches, for a Parquet trace larger than memory "
    "[default: for files over 256 MiB].",
)
def trace_sample_cmd(
    trace_path: str, fraction: float, seed: int, output: str, stream: bool | None
) -> None:
    """Keep whole sessions (or prefix trees) of TRACE by a hash of their root (SHARDS-style);
    replays of the sample scale the cluster and shared tiers by the same fraction."""
    from kvtier.trace.io import read_trace, write_trace
    from kvtier.trace.sampling import sample

    _not_the_input(trace_path, output)
    if _stream_by_size(trace_path, stream):
        from kvtier.trace.samplestream import stream_sample

        read, kept, roots = stream_sample(trace_path, fraction, output, seed=seed)
        click.echo(f"wrote {kept:,} of {read:,} requests (whole {roots}, streamed) to {output}")
        return
    loaded = read_trace(trace_path)
    sampled, roots = sample(loaded, fraction, seed=seed)
    write_trace(sampled, output)
    click.echo(
        f"wrote {sampled.n_requests:,} of {loaded.n_requests:,} requests (whole {roots}, "
        f"sample fraction {sampled.sample_fraction:g}) to {output}"
    )


@trace.command("slice")
@click.argument("trace_path", metavar="TRACE", type=click.Path())
@click.option("--start", type=float, default=0.0, show_default=True, help="First second kept.")
@click.option("--end", type=float, default=None, help="End of the window, seconds [default: all].")
@trace_output_option
@click.option(
    "--stream/--no-stream",
    default=None,
    help="Read and write by record batches, for a trace larger than memory "
    "[default: for traces over 256 MiB].",
)
def trace_slice_cmd(
    trace_path: str, start: float, end: float | None, output: str, stream: bool | None
) -> None:
    """Keep the requests of TRACE arriving in [--start, --end), shifted to start at 0."""
    from kvtier.trace.io import read_trace, write_trace
    from kvtier.trace.sampling import time_slice

    _not_the_input(trace_path, output)
    if _stream_by_size(trace_path, stream):
        from kvtier.trace.batches import open_batches
        from kvtier.trace.samplestream import stream_slice
        from kvtier.trace.strata import META_SAMPLE_STRATA

        had_strata = META_SAMPLE_STRATA in open_batches(trace_path).meta
        read, kept, span = stream_slice(trace_path, start, end, output)
        click.echo(f"wrote {kept:,} of {read:,} requests ({span:,.1f} s, streamed) to {output}")
    else:
        loaded = read_trace(trace_path)
        had_strata = loaded.sample_strata is not None
        cut = time_slice(loaded, start, end)
        write_trace(cut, output)
        click.echo(
            f"wrote {cut.n_requests:,} of {loaded.n_requests:,} requests "
            f"({cut.duration_s:,.1f} s) to {output}"
        )
    if had_strata:
        click.echo(
            "note: the slice keeps no prompt-length strata (the full trace's counts they hold "
            "do not apply to a time window): its replays' latencies are not post-stratified",
            err=True,
        )


def _trace_bytes(path: str) -> int:
    """Bytes of a trace file, or of every part of a dataset directory (0 if missing)."""
    from pathlib import Path

    if os.path.isdir(path):
        return sum(p.stat().st_size for p in Path(path).rglob("*.parquet") if p.is_file())
    return os.path.getsize(path) if os.path.isfile(path) else 0


def _stream_by_size(path: str, stream: bool | None) -> bool:
    from kvtier.trace.streaming import STREAM_BYTES

    return _trace_bytes(path) > STREAM_BYTES if stream is None else stream


@trace.command("map")
@click.argument("trace_path", metavar="TRACE", type=click.Path())
@click.option(
    "--block-tokens",
    "-B",
    type=int,
    default=None,
    help="Block size to map to [default: the trace's native size].",
)
@click.option(
    "--share-across-tenants",
    is_flag=True,
    help="Let tenants share blocks (default: identities salted by tenant).",
)
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(),
    help="Mapped trace to write: a .parquet file, or a directory (a dataset of parts).",
)
@click.option(
    "--stream/--no-stream",
    default=None,
    help="Read by record batches, for a trace larger than memory "
    "[default: for traces over 256 MiB].",
)
@click.option(
    "--batch-rows",
    type=int,
    default=None,
    help="Rows per record batch when streaming [default: 1048576].",
)
def trace_map_cmd(
    trace_path: str,
    block_tokens: int | None,
    share_across_tenants: bool,
    output: str,
    stream: bool | None,
    batch_rows: int | None,
) -> None:
    """Map TRACE to dense block ids at -B tokens a block and write it as a trace at that block
    size, which replay, stats and sample read without hashing again (docs/traces.md)."""
    from kvtier.trace.batches import BATCH_ROWS
    from kvtier.trace.mapstream import map_trace_file

    if block_tokens is not None and block_tokens < 1:
        raise InputError(f"must be >= 1, got {block_tokens}", option="--block-tokens")
    if batch_rows is not None and batch_rows < 1:
        raise InputError(f"must be >= 1, got {batch_rows}", option="--batch-rows")
    _not_the_input(trace_path, output)
    if _stream_by_size(trace_path, stream):
        if block_tokens is None:
            from kvtier.trace.batches import open_batches

            block_tokens = open_batches(trace_path).block_tokens
        done = map_trace_file(
            trace_path,
            block_tokens,
            output,
            share_across_tenants=share_across_tenants,
            batch_rows=BATCH_ROWS if batch_rows is None else batch_rows,
        )
        how = "streamed"
        n, refs, distinct, B = done.n_requests, done.n_block_refs, done.n_blocks, done.block_tokens
    else:
        if batch_rows is not None:
            raise InputError("applies to a streamed mapping only (--stream)", option="--batch-rows")
        from kvtier.trace.io import read_trace, write_trace
        from kvtier.trace.mapstream import mapped_trace

        loaded = read_trace(trace_path)
        B = loaded.block_tokens if block_tokens is None else block_tokens
        if not output.lower().endswith(".parquet"):
            raise InputError(
                "an in-memory mapping writes one .parquet file (a directory with --stream)",
                path=output,
            )
        mapped, blocked = mapped_trace(loaded, B, share_across_tenants=share_across_tenants)
        write_trace(mapped, output)
        how = "in memory"
        n, refs, distinct = mapped.n_requests, blocked.n_block_refs, blocked.n_blocks
    click.echo(
        f"wrote {n:,} requests, {refs:,} full-block references to {distinct:,} distinct "
        f"{B}-token blocks ({how}) to {output}"
    )


@trace.command("stats")
@click.argument("trace_path", metavar="TRACE", type=click.Path())
@click.option(
    "--block-tokens",
    "-B",
    type=int,
    default=None,
    help="Block size for the reuse figures [default: the trace's native size].",
)
@click.option(
    "--model",
    default=None,
    help="Model profile (name or TOML path): adds the bytes of distinct KV.",
)
@click.option(
    "--share-across-tenants",
    is_flag=True,
    help="Let tenants share blocks (default: identities salted by tenant).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--stream/--no-stream",
    default=None,
    help="Read by record batches, in memory proportional to distinct blocks "
    "[default: for traces over 256 MiB].",
)
def trace_stats_cmd(
    trace_path: str,
    block_tokens: int | None,
    model: str | None,
    share_across_tenants: bool,
    as_json: bool,
    stream: bool | None,
) -> None:
    """Lengths, full-block reuse under the prefix rule, arrival peaks of TRACE."""
    if block_tokens is not None and block_tokens < 1:
        raise InputError(f"must be >= 1, got {block_tokens}", option="--block-tokens")
    kv_bytes = None
    if model is not None:
        from kvtier.hardware import load_model

        kv_bytes = load_model(model).kv_bytes_per_token()
    if _stream_by_size(trace_path, stream):
        from kvtier.trace.stats_stream import stream_trace_stats

        stats = stream_trace_stats(
            trace_path,
            block_tokens,
            share_across_tenants=share_across_tenants,
            model=model,
            kv_bytes_per_token=kv_bytes,
        )
    else:
        from kvtier.trace.blocks import block_trace
        from kvtier.trace.io import read_trace
        from kvtier.trace.stats import trace_stats

        loaded = read_trace(trace_path)
        blocked = block_trace(
            loaded,
            loaded.block_tokens if block_tokens is None else block_tokens,
            share_across_tenants=share_across_tenants,
        )
        stats = trace_stats(loaded, blocked, model=model, kv_bytes_per_token=kv_bytes)
    if as_json:
        _echo_json(stats.as_dict())
        return
    _print_stats(trace_path, stats)


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.1f} {unit}"
        n /= 1024
    return f"{n:,.1f} TiB"


def _print_stats(path: str, stats: Any) -> None:
    table = Table(title=f"{path}", title_justify="left", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    table.add_row("source", stats.source or "-")
    table.add_row("requests", f"{stats.requests:,}")
    table.add_row("duration", f"{stats.duration_s:,.1f} s")
    table.add_row(
        "mean / peak 60 s rate", f"{stats.mean_rate_rps:.2f} / {stats.peak_rate_60s_rps:.2f} req/s"
    )
    for name, s in (("input tokens", stats.input_tokens), ("output tokens", stats.output_tokens)):
        table.add_row(
            f"{name} mean / p50 / p90 / p99",
            f"{s['mean']:,.0f} / {s['p50']:,.0f} / {s['p90']:,.0f} / {s['p99']:,.0f}",
        )
    if not stats.has_prefix_info:
        table.add_row("prefix information", "none in this trace (no reuse figures)")
    else:
        table.add_row(
            "block size (native)", f"{stats.block_tokens} ({stats.native_block_tokens}) tokens"
        )
        table.add_row("full-block references", f"{stats.block_refs:,}")
        table.add_row("distinct blocks", f"{stats.distinct_blocks:,}")
        table.add_row("reuse (infinite cache), blocks", f"{stats.reuse_ratio_blocks:.1%}")
        table.add_row("reuse (infinite cache), tokens", f"{stats.reuse_ratio_tokens:.1%}")
    if stats.sessions is not None:
        table.add_row("sessions", f"{stats.sessions:,}")
    if stats.tenants is not None:
        table.add_row("tenants", f"{stats.tenants:,}")
    if stats.distinct_kv_bytes is not None:
        table.add_row(f"distinct KV ({stats.model})", _fmt_bytes(stats.distinct_kv_bytes))
    if stats.sample_fraction != 1.0:
        table.add_row("sample fraction", f"{stats.sample_fraction:g}")
    if stats.sample_strata is not None:
        strata = stats.sample_strata
        edges = [f"{e:,}" for e in strata["edges"]]
        names = [f"<= {edges[0]}"]
        names += [f"({a}, {b}]" for a, b in zip(edges, edges[1:], strict=False)]
        names += [f"> {edges[-1]}"]
        shown = [f"{n}: {c:,}" for n, c in zip(names, strata["population"], strict=True)]
        quantiles = "/".join(f"P{100 * q:g}" for q in strata["quantiles"])
        table.add_row(
            f"sample strata: full trace's requests by input tokens (edges its {quantiles})",
            "; ".join(shown),
        )
    _console().print(table)


def _parse_number(text: str, option: str, kind: type) -> Any:
    try:
        return kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise InputError(f"{option} must be {what}, but got {text!r}") from None


@trace.command("mrc")
@click.argument("trace_path", metavar="TRACE", type=click.Path())
@click.option("--block-tokens", "-B", required=True, help="Block size in tokens.")
@click.option(
    "--policy",
    default="lru",
    show_default=True,
    help=f"Eviction policy, with parameters if any: {policy_help()}.",
)
@click.option(
    "--capacities",
    default=None,
    help="Comma-separated capacities in blocks [default: 20 log-spaced up to the working set].",
)
@click.option("--warmup", default="0", help="Fraction of requests not measured, in [0, 1).")
@click.option("--flat", is_flag=True, help="Every block access alone (libCacheSim semantics).")
@click.option(
    "--method",
    default=None,
    help="stack (exact one-pass, lru only) or replay [default: stack for lru, else replay].",
)
@click.option(
    "--share-across-tenants",
    is_flag=True,
    help="Let tenants share blocks (default: identities salted by tenant).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--plot", "plot_path", default=None, help="Also write the curve as a PNG here.")
@click.option(
    "--model",
    default=None,
    help="Model profile (name or TOML path): capacities also in GB of KV.",
)
@click.option(
    "--kv-dtype",
    default="bf16",
    show_default=True,
    help="KV element type for the GB figures (with --model).",
)
def trace_mrc_cmd(
    trace_path: str,
    block_tokens: str,
    policy: str,
    capacities: str | None,
    warmup: str,
    flat: bool,
    method: str | None,
    share_across_tenants: bool,
    as_json: bool,
    plot_path: str | None,
    model: str | None,
    kv_dtype: str,
) -> None:
    """Hit ratio against cache capacity (miss-ratio curve) of TRACE."""
    from kvtier.cache import miss_ratio_curve, parse_policy
    from kvtier.trace.blocks import block_trace
    from kvtier.trace.io import read_trace

    B = _parse_number(block_tokens, "--block-tokens", int)
    if B <= 0:
        raise InputError(f"--block-tokens must be > 0, but got {B}")
    warm = _parse_number(warmup, "--warmup", float)
    spec = parse_policy(policy)
    caps = None
    if capacities is not None:
        caps = [_parse_number(c.strip(), "--capacities", int) for c in capacities.split(",")]
    if method is not None and method not in ("stack", "replay"):
        raise InputError(f"--method must be 'stack' or 'replay', but got {method!r}")
    block_gb = None
    if model is not None:
        from kvtier.hardware import load_model
        from kvtier.hardware.types import GB
        from kvtier.policy.model import KV_DTYPES

        if kv_dtype not in KV_DTYPES:
            raise InputError(
                f"must be one of {', '.join(KV_DTYPES)}, got {kv_dtype!r}", option="--kv-dtype"
            )
        block_gb = load_model(model).kv_bytes_per_token(kv_dtype) * B / GB
    elif kv_dtype != "bf16":
        raise InputError("applies with --model only", option="--kv-dtype")
    loaded = read_trace(trace_path)
    blocked = block_trace(loaded, B, share_across_tenants=share_across_tenants)
    result = miss_ratio_curve(blocked, spec, caps, flat=flat, warmup=warm, method=method)
    if plot_path is not None:
        from kvtier.cache.plot import plot_curve

        plot_curve(result, plot_path)
    if as_json:
        data = result.to_json()
        if block_gb is not None:
            data["model"] = model
            data["kv_dtype"] = kv_dtype
            data["block_gb"] = block_gb
            for point in data.get("points", []):
                point["capacity_gb"] = point["capacity_blocks"] * block_gb
        _echo_json(data)
        return
    semantics = "flat" if result.flat else "prefix"
    table = Table(
        title=f"{trace_path}: {result.policy}, {semantics} semantics, {result.method}, "
        f"B={result.block_tokens}, warm-up {result.warmup:g}"
    )
    table.add_column("capacity (blocks)", justify="right")
    table.add_column("capacity (tokens)", justify="right")
    if block_gb is not None:
        table.add_column(f"capacity (GB, {model} {kv_dtype})", justify="right")
    table.add_column("hit ratio (blocks)", justify="right")
    table.add_column("hit ratio (tokens)", justify="right")
    for p in result.points:
        gb = [] if block_gb is None else [f"{p.capacity_blocks * block_gb:,.2f}"]
        table.add_row(
            f"{p.capacity_blocks:,}",
            f"{p.capacity_blocks * result.block_tokens:,}",
            *gb,
            f"{p.hit_ratio_blocks:.2%}",
            f"{p.hit_ratio_tokens:.2%}",
        )
    _console().print(table)
    if plot_path is not None:
        click.echo(f"wrote {plot_path}")


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


def _run_optimize(**kwargs: Any) -> None:
    from kvtier.search.run import optimize
    from kvtier.search.space import parse_pins

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


@main.command("optimize")
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


@main.command("compare")
@trace_option
@click.option(
    "--preset",
    "presets",
    multiple=True,
    help="A built-in preset to include (repeatable) [default: every preset, when no --policy].",
)
@click.option(
    "--policy",
    "policy_paths",
    multiple=True,
    type=click.Path(dir_okay=False),
    help="A policy file to include (repeatable), e.g. one that optimize wrote.",
)
@click.option(
    "--hardware",
    default=None,
    help="Run every policy on this hardware profile [default: each policy's own].",
)
@click.option(
    "--model", default=None, help="Serve this model in every policy [default: each policy's own]."
)
@click.option(
    "--slo",
    "slo_text",
    default=None,
    help="Report whether each meets it, e.g. ttft_p99=5,tpot_p99=0.1.",
)
@click.option(
    "--rate-scale",
    type=float,
    default=1.0,
    show_default=True,
    help="Replay arrivals this many times as fast.",
)
@click.option(
    "--what-if",
    "what_if",
    is_flag=True,
    help="Also replay each policy without each lower tier, with each halved and doubled, and "
    "with each tier the hardware offers that it leaves out.",
)
@set_option
@click.option(
    "--prices",
    "prices",
    default=None,
    type=click.Path(dir_okay=False),
    help="TOML file of your own prices for every row, as optimize --prices takes [default: "
    "the profiles'].",
)
@click.option(
    "--track-tbt",
    is_flag=True,
    help="Record token intervals: a TBT p99 column (each request's mean of its longest 10% "
    "intervals) and tbt_p50_s / tbt_p99_s in --json [always with an SLO bounding tbt_p99].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as one JSON object.")
def compare_cmd(
    trace_path: str,
    presets: tuple[str, ...],
    policy_paths: tuple[str, ...],
    hardware: str | None,
    model: str | None,
    slo_text: str | None,
    rate_scale: float,
    what_if: bool,
    sets: tuple[str, ...],
    prices: str | None,
    as_json: bool,
    track_tbt: bool = False,
) -> None:
    """Replay several policies on one trace and show their cost and latency side by side.

    --set changes every policy compared the same way (e.g. each preset at --set
    block_tokens=64).
    """
    from kvtier.experiments.compare import compare_policies
    from kvtier.policy.presets import preset_names
    from kvtier.report.compare import comparison_json, print_comparison
    from kvtier.search.run import parse_slo

    chosen = [("preset", p) for p in presets] + [("policy", p) for p in policy_paths]
    if not chosen:
        chosen = [("preset", p) for p in preset_names()]
    if prices is None:
        from kvtier.scenario import recorded_prices

        for path in policy_paths:
            found, note = recorded_prices(path)
            if found is not None:
                note = (
                    f"{path} was found at the prices in {found}; every row here is at the "
                    f"profiles' prices (pass --prices {found} to compare at them)"
                )
            if note is not None:
                click.echo(f"note: {note}", err=True)
    rows = compare_policies(
        trace_path,
        chosen,
        hardware=hardware,
        model=model,
        slo=parse_slo(slo_text) if slo_text else None,
        rate_scale=rate_scale,
        what_if=what_if,
        overrides=_overrides(sets),
        prices=prices,
        track_tbt=track_tbt,
    )
    if as_json:
        _echo_json(comparison_json(rows))
    else:
        print_comparison(trace_path, rows, _console())


@main.command("report")
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
    from kvtier.report.output import check_output
    from kvtier.report.study import (
        html_study_report,
        load_existing_study,
        plot_study,
        print_study_report,
        study_report,
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


@main.command("batch")
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
