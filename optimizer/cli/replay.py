"""``kvtier replay`` and ``kvtier compare``: replay one policy, or several side by side, on a
trace and print latency, throughput and cost."""

from __future__ import annotations

from typing import Any

import click
from rich.table import Table

from kvtier.cli.common import (
    _console,
    _echo_json,
    _overrides,
    policy_profile_options,
    set_option,
    step_margin_option,
    trace_option,
)
from kvtier.report.energy import energy_cell
from kvtier.report.jsonout import null_reason


def _ramp_seconds(text: str) -> float | None:
    """``--ramp``: 'auto' (None: one request's lifetime alone) or seconds (checked by
    :class:`kvtier.scenario.Scenario`)."""
    if text.strip().lower() == "auto":
        return None
    try:
        return float(text)
    except ValueError:
        from kvtier.errors import InputError

        raise InputError(f"must be 'auto' or seconds, got {text!r}", option="--ramp") from None


@click.command("replay")
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
    "--round-barrier",
    "round_barrier",
    type=int,
    default=0,
    show_default=True,
    metavar="N",
    help="Closed loop: the trace's requests in rounds of N (in trace order), none of a round "
    "sent before every request of the rounds before it has finished (SGLang "
    "bench_multiturn.py --enable-round-barrier with N clients); 0: no barrier.",
)
@click.option(
    "--ramp",
    default="auto",
    show_default=True,
    help="Closed loop: spread the first N sends over this many seconds, as benchmark clients "
    "ramp up and de-synchronise (AIPerf --concurrency-ramp-duration); 'auto': one "
    "request's mean lifetime under the loop's load (a pilot replay); 0: every first send at once. "
    "Measured benchmarks of identical requests lie between the two (docs/validation-silicon.md): "
    "read TTFT from both.",
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
@click.option(
    "--fault",
    "fault_specs",
    multiple=True,
    metavar="SPEC",
    help="Fail a lower tier's pool, device, host or switch during the replay, e.g. "
    '"tier=cxl,at=120s,down=30,devices=4,device=1,rebuild_gbps=25" (keys: kind, tier, at, '
    'down, device, devices, host, rebuild_gbps; docs/model.md "Faults"); repeatable. The '
    "trace is replayed without it too, for the recovery time and the tail TTFT beside it. A "
    "--policy file's [[faults]] tables (the same keys) add theirs.",
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
    round_barrier: int,
    ramp: str,
    engine: str,
    prices: str | None,
    as_json: bool,
    requests_out: str | None,
    track_tbt: bool = False,
    fault_specs: tuple[str, ...] = (),
) -> None:
    """Replay a trace through the serving simulator and print latency, throughput and cost.

    A policy file that optimize found at the prices of a --prices file replays at them."""
    from dataclasses import replace

    from kvtier.deploy.sample import sample_bias
    from kvtier.scenario import Scenario, recorded_prices
    from kvtier.sim.faults import parse_fault
    from kvtier.trace.sample_correction import sample_weighting

    if preset is not None and policy_path is not None:
        raise click.UsageError("give --policy or --preset, not both")
    faults = tuple(parse_fault(spec) for spec in fault_specs)
    if policy_path is not None:
        from kvtier.policy.file import read_policy_file
        from kvtier.sim.faults import fault_of

        tables = read_policy_file(policy_path).faults
        faults += tuple(
            fault_of(f, option=f"{policy_path}: faults[{i}]") for i, f in enumerate(tables)
        )
    if prices is None and policy_path is not None:
        prices, note = recorded_prices(policy_path)
        if note is not None:
            click.echo(f"note: {note}", err=True)
    if requests_out is not None:
        from kvtier.files import guard_outputs

        guard_outputs(
            {"--requests-out": requests_out},
            {
                "--trace": trace_path,
                "--policy": policy_path,
                "--prices": prices,
                "--hardware": hardware,
                "--model": model,
            },
        )
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
    overrides = _overrides(sets)
    if "serving.tp" in overrides or "serving.instances" in overrides:
        # --set instances the hardware cannot hold at that tp: refused, not silently cut
        from kvtier.search.run import check_pinned_size

        serving = scenario.policy.serving
        given = {"serving.tp": serving.tp, "serving.instances": serving.instances}
        check_pinned_size(given, scenario.hardware, option="--set")
    if concurrency or round_barrier:
        scenario = replace(
            scenario,
            concurrency=concurrency,
            ramp_s=_ramp_seconds(ramp),
            round_size=round_barrier,
        )
    bias = sample_bias(scenario.policy, scenario.hardware, scenario.trace.sample_fraction)
    if bias is not None:
        click.echo(f"warning: {bias}", err=True)
    if requests_out is not None:
        from kvtier.sim.requests import check_requests_path

        check_requests_path(requests_out)
    result = scenario.replay(track_tbt=track_tbt, faults=faults)
    metrics = result.metrics
    impacts = None
    if faults:
        from kvtier.sim.fault_metrics import fault_impacts

        healthy = scenario.replay(track_tbt=track_tbt)
        impacts = fault_impacts(result.trace, result.raw, faults, baseline=healthy.raw)
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
    from kvtier.report.tiers import net_loss_lines, tier_json, tier_table

    # a rejected request is the deployment's answer, not bad input: said plainly, exit 0
    rejected = rejection_note(result)
    if as_json:
        data = metrics.to_dict()
        if result.tiers:
            data["tiers"] = tier_json(result.tiers)
        if prices is not None:
            data["prices"] = prices
        if impacts is not None:
            from kvtier.report.faults import fault_json

            data["faults"] = fault_json(impacts)
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
        for line in net_loss_lines(result.tiers):
            click.echo(f"note: {line}")
    if impacts is not None:
        from kvtier.report.faults import fault_table

        _console().print(fault_table(impacts))
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
    if m.hbm_kv_source:
        table.add_row("HBM for KV", m.hbm_kv_source)
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
    cost = f"${m.cost_per_hour:,.2f}/h, ${m.cost_per_mtok:.4f} per 1M tokens"
    if m.electricity_per_hour > 0:
        cost += f" (electricity ${m.electricity_per_hour:,.2f}/h)"
    table.add_row("cost", cost)
    if m.tokens_per_joule is not None:
        table.add_row("energy", energy_cell(m))
    table.add_row("simulated span / iterations", f"{m.duration_s:,.1f} s / {m.n_iterations:,}")
    if m.slo_met is not None:
        table.add_row("SLO met / attainment", f"{m.slo_met} / {m.slo_attainment:.1%}")
    _console().print(table)


@click.command("compare")
@trace_option
@click.option(
    "--preset",
    "presets",
    multiple=True,
    help="A built-in preset to include (repeatable) [default: every preset of a current "
    "release, when no --policy].",
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
@step_margin_option("every policy (the cheapest and each SLO verdict)")
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
    step_margin: float = 0.0,
) -> None:
    """Replay several policies on one trace and show their cost and latency side by side.

    --set changes every policy compared the same way (e.g. each preset at --set
    block_tokens=64).
    """
    from kvtier.experiments.compare import compare_policies
    from kvtier.policy.presets import PAST_RELEASE_PRESETS, current_preset_names
    from kvtier.report.compare import comparison_json, print_comparison
    from kvtier.search.run import parse_slo

    chosen = [("preset", p) for p in presets] + [("policy", p) for p in policy_paths]
    left_out: dict[str, str] = {}
    if not chosen:
        chosen = [("preset", p) for p in current_preset_names()]
        left_out = dict(PAST_RELEASE_PRESETS)
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
        slo=parse_slo(slo_text) if slo_text is not None else None,
        rate_scale=rate_scale,
        what_if=what_if,
        overrides=_overrides(sets),
        prices=prices,
        track_tbt=track_tbt,
        step_margin=step_margin,
    )
    if as_json:
        data = comparison_json(rows)
        if left_out:  # the default set's presets of past releases: named, never silently
            data["left_out"] = left_out
        _echo_json(data)
    else:
        console = _console()
        print_comparison(trace_path, rows, console)
        if left_out:
            from rich.markup import escape

            said = "; ".join(f"{name} ({why})" for name, why in left_out.items())
            console.print(escape(f"Not compared unless named with --preset: {said}."))
