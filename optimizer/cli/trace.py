"""``kvtier trace``: import, capture, synthesise, sample, slice, map and inspect request
traces. Only ``trace mrc`` runs the cache engine's kernels; the imports they need stay inside
the commands, so the others start without numba."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table

from kvtier.cache.registry import policy_help
from kvtier.cli.common import (
    KvtierGroup,
    _console,
    _echo_json,
    quiet_option,
    streaming,
    trace_output_option,
)
from kvtier.errors import InputError
from kvtier.trace.importers import format_names as import_format_names


@click.group(cls=KvtierGroup)
def trace() -> None:
    """Import, synthesise and inspect request traces."""


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


def _not_the_input(
    input_path: str, output: str, label: str = "TRACE", **inputs: str | None
) -> None:
    """Refuse an output that is the input (or another input file), or lies inside an input
    dataset directory (:func:`kvtier.files.guard_outputs`, which every writing command uses).

    Writing a derived trace over its source destroys the source (the write is atomic, so the
    result would be whole, but the original is gone), and a file written into a dataset
    directory becomes one of its parts on the next read.
    """
    from kvtier.files import guard_outputs

    guard_outputs({"--output": output}, {label: input_path, **inputs})


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
    type=click.Path(),
    help="The served model's tokenizer.json, or its model directory (sources with prompt "
    "text; offline and gated models: docs/traces.md). openai-log without it: lengths from "
    "the log's usage counts, no block hashes.",
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
@quiet_option
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
    quiet: bool,
) -> None:
    """Convert a public or user trace (INPUT) to request-trace/1."""
    from kvtier.trace.importers import ImportOptions, import_trace, parse_columns, stream_plan
    from kvtier.trace.io import write_trace

    _not_the_input(
        input_path, output, "INPUT", **{"--tokenizer": tokenizer, "--chat-template": chat_template}
    )
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
        with streaming("trace import", quiet):
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
    from kvtier.files import check_output

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
@click.option(
    "--tokenizer",
    default=None,
    type=click.Path(),
    help="For --from-log: tokenizer.json or the model directory.",
)
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
        _not_the_input(
            log_path,  # type: ignore[arg-type]
            output,
            "--from-log",
            **{"--tokenizer": tokenizer, "--chat-template": chat_template},
        )
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
@quiet_option
def trace_sample_cmd(
    trace_path: str, fraction: float, seed: int, output: str, stream: bool | None, quiet: bool
) -> None:
    """Keep whole sessions (or prefix trees) of TRACE by a hash of their root (SHARDS-style);
    replays of the sample scale the cluster and shared tiers by the same fraction."""
    from kvtier.trace.io import read_trace, write_trace
    from kvtier.trace.sampling import sample

    _not_the_input(trace_path, output)
    if _stream_by_size(trace_path, stream):
        from kvtier.trace.samplestream import stream_sample

        with streaming("trace sample", quiet):
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
@quiet_option
def trace_slice_cmd(
    trace_path: str,
    start: float,
    end: float | None,
    output: str,
    stream: bool | None,
    quiet: bool,
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
        with streaming("trace slice", quiet):
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
    from kvtier.trace.format import STREAM_BYTES

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
@quiet_option
def trace_map_cmd(
    trace_path: str,
    block_tokens: int | None,
    share_across_tenants: bool,
    output: str,
    stream: bool | None,
    batch_rows: int | None,
    quiet: bool,
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
        with streaming("trace map", quiet):
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
@quiet_option
def trace_stats_cmd(
    trace_path: str,
    block_tokens: int | None,
    model: str | None,
    share_across_tenants: bool,
    as_json: bool,
    stream: bool | None,
    quiet: bool,
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

        with streaming("trace stats", quiet):
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
    """``text`` as a plain decimal integer or finite number (no ``1_6``, spaces or ``nan``)."""
    from kvtier.toml_fields import strict_float, strict_int

    value = strict_int(text) if kind is int else strict_float(text)
    if value is None:
        what = "an integer" if kind is int else "a finite number"
        raise InputError(f"{option} must be {what}, but got {text!r}")
    return value


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
@click.option(
    "--plot",
    "plot_path",
    default=None,
    help="Also write the curve as a PNG here (capacity in GB of KV with --model).",
)
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

    if plot_path is not None:
        from kvtier.files import guard_outputs

        guard_outputs({"--plot": plot_path}, {"TRACE": trace_path, "--model": model})
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

        label = "" if model is None else f"{model} {kv_dtype}"
        plot_curve(result, plot_path, block_gb=block_gb, model=label)
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
