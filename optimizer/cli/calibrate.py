"""``kvtier calibrate``: fit a hardware profile to vLLM's ``/metrics`` (docs/calibrate.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from kvtier.cli.common import _echo_json, _overrides, set_option
from kvtier.errors import InputError


@click.command("calibrate")
@click.option(
    "--metrics",
    "metrics_path",
    required=True,
    help="A vLLM server's Prometheus /metrics text (curl http://HOST:8000/metrics > FILE).",
)
@click.option(
    "--trace",
    "trace_path",
    required=True,
    help="The kvtier trace of the requests that server served (kvtier trace import).",
)
@click.option(
    "--hardware",
    default=None,
    help="Hardware profile to start from, name or TOML path "
    "[default: the policy's, else h100-node].",
)
@click.option(
    "--model",
    default=None,
    help="Model profile name or path [default: the policy's, else Llama-3.1-8B].",
)
@click.option(
    "--policy",
    "policy_path",
    default=None,
    help="The served deployment as a policy file (tiers, connectors, serving settings).",
)
@click.option("--preset", default=None, help="... or as a built-in preset (kvtier replay's).")
@set_option
@click.option(
    "--backend",
    type=click.Choice(["auto", "roofline", "measured"]),
    default="auto",
    show_default=True,
    help="Step-time backend to fit: auto is the one the policy's replays use (the measured "
    "tables where they cover the GPU, model and framework, else the roofline).",
)
@click.option(
    "--fit",
    default=None,
    help="Comma-separated parameters to fit. Roofline: step_overhead_s, mfu, mbu, decode_mfu "
    "[default: step_overhead_s,mfu,mbu]; measured: measured_memory_scale, "
    "measured_compute_scale [default: both]; either: tiers.NAME.op_overhead_us, "
    "tiers.NAME.port_read_gbps.",
)
@click.option(
    "--sample",
    default=400,
    show_default=True,
    type=int,
    help="Requests per replay (the trace's first ones).",
)
@click.option("--max-replays", default=300, show_default=True, type=int, help="Replay budget.")
@click.option(
    "--check-metrics",
    default=None,
    help="A held-back scrape (another server or time window) to report the error on, before "
    "and after the fit; needs --check-trace.",
)
@click.option("--check-trace", default=None, help="The trace of --check-metrics' requests.")
@click.option("--out", "out_path", required=True, help="The calibrated hardware profile (TOML).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def calibrate_cmd(
    metrics_path: str,
    trace_path: str,
    hardware: str | None,
    model: str | None,
    policy_path: str | None,
    preset: str | None,
    sets: tuple[str, ...],
    backend: str,
    fit: str | None,
    sample: int,
    max_replays: int,
    check_metrics: str | None,
    check_trace: str | None,
    out_path: str,
    as_json: bool,
) -> None:
    """Fit the step-time model (the roofline's per-step cost and efficiencies, or the measured
    tables' cluster factors) and connector costs to a vLLM server's /metrics."""
    from kvtier.files import atomic_write, check_output

    check_output(out_path, option="--out")
    if (check_metrics is None) != (check_trace is None):
        given, other = ("--check-metrics", "--check-trace")[:: 1 if check_trace is None else -1]
        raise InputError(f"needs {other} too (a held-back scrape and its trace)", option=given)
    from kvtier.experiments.calibrate import (
        calibrate,
        check_match,
        evaluate,
        mean_abs_error,
        profile_toml,
        resolve_backend,
    )
    from kvtier.hardware import load_hardware, load_model
    from kvtier.hardware.loader import resolve
    from kvtier.policy.model import Policy
    from kvtier.policy.overrides import apply_overrides
    from kvtier.scenario import hardware_name, model_name
    from kvtier.trace.io import read_trace
    from kvtier.trace.vllm_metrics import read_metrics

    metrics = read_metrics(metrics_path)
    trace = read_trace(trace_path)
    if policy_path is not None and preset is not None:
        raise InputError("give --policy or --preset, not both", option="--preset")
    if policy_path is not None:
        from kvtier.policy.file import read_policy_file

        policy = read_policy_file(policy_path).policy
    elif preset is not None:
        from kvtier.policy.presets import load_preset

        policy = load_preset(preset)
    else:
        policy = Policy()
    overrides = _overrides(sets)
    if overrides:
        policy = apply_overrides(policy, overrides, "--set")
    hw_name = hardware_name(hardware, policy)
    hw = load_hardware(hw_name)
    names = None if fit is None else [n.strip() for n in fit.split(",") if n.strip()]
    held = None
    if check_metrics is not None and check_trace is not None:
        held = (read_metrics(check_metrics), read_trace(check_trace))
        try:
            check_match(held[1], held[0])
        except InputError as err:
            raise InputError(err.message, option="--check-trace") from None
    mdl = load_model(model_name(model, policy))
    backend = resolve_backend(backend, hw, mdl, policy)
    cal = calibrate(
        trace,
        hw,
        mdl,
        policy,
        metrics,
        fit=names,
        sample=sample,
        max_replays=max_replays,
        backend=backend,
    )
    text = profile_toml(cal, resolve("hardware", hw_name), Path(out_path).stem,
                        f"{Path(metrics_path).name} and {Path(trace_path).name}")  # fmt: skip
    atomic_write(out_path, lambda tmp: Path(tmp).write_text(text))
    check: dict[str, float] = {}
    if held is not None:
        for key, hw_at in (("before", hw), ("after", cal.hardware)):
            errs = evaluate(held[1], hw_at, mdl, policy, held[0], sample=sample, backend=backend)
            check[key] = mean_abs_error(errs)
    scrape = _scrape_json(metrics)
    if as_json:
        data = _to_json(cal, out_path)
        data["scrape"] = scrape
        if check:
            data["check_error_before"], data["check_error_after"] = check["before"], check["after"]
        _echo_json(data)
    else:
        click.echo(_scrape_text(scrape))
        click.echo(_to_text(cal, out_path))
        if cal.error_after > cal.error_before:
            click.echo(
                "warning: the fit lowered the weighted loss (means count 10x) but not the mean "
                "abs. error: these parameters do not explain the difference; fit others too",
                err=True,
            )
        if check:
            click.echo(
                f"held-back scrape {Path(str(check_metrics)).name}: mean abs. error "
                f"{check['before']:.1%} -> {check['after']:.1%}"
            )


def _scrape_json(m: Any) -> dict[str, Any]:
    """What the scrape holds beside the fitted statistics (None: not exported)."""
    return {
        "requests": m.ttft.count,
        "hit_ratio": m.hit_ratio,
        "lookups_per_prompt_token": m.lookups_per_prompt_token,
        "hit_ratio_compared": not m.hit_ratio_counts_retries,
        "external_hit_ratio": m.external_hit_ratio,
        "offload_load_gbps": None if m.offload_load_rate is None else m.offload_load_rate / 1e9,
        "offload_load_ops": m.offload_load_ops,
        "inter_token_metric": m.names.get("itl"),
    }


def _scrape_text(s: dict[str, Any]) -> str:
    parts = [f"scrape: {s['requests']:,.0f} requests, prefix-cache hit ratio {s['hit_ratio']:.1%}"]
    if not s["hit_ratio_compared"]:
        parts[0] += (
            f" (not compared: {s['lookups_per_prompt_token']:.2f} lookups per prompt token; this "
            "vLLM counted a lookup at each retry of a waiting request, fixed in PR #48860)"
        )
    if s["external_hit_ratio"] is not None:
        parts.append(f"through the KV connector {s['external_hit_ratio']:.1%}")
    if s["offload_load_gbps"] is not None:
        parts.append(
            f"offload loads {s['offload_load_gbps']:.2f} GB/s over "
            f"{s['offload_load_ops'] or 0:,.0f} operations"
        )
    return "; ".join(parts)


def _to_json(cal: Any, out_path: str) -> dict[str, Any]:
    return {
        "profile": out_path,
        "backend": cal.backend,
        "params": {
            p.name: {"before": cal.before[p.name], "after": cal.after[p.name]} for p in cal.params
        },  # fmt: skip
        "errors_before": cal.errors_before,
        "errors_after": cal.errors_after,
        "error_before": cal.error_before,
        "error_after": cal.error_after,
        "replays": cal.replays,
        "sample": cal.sample,
        "requests": cal.requests,
    }


def _to_text(cal: Any, out_path: str) -> str:
    lines = [
        f"calibrated the {cal.backend} step-time backend on {cal.sample:,} of {cal.requests:,} "
        f"requests, {cal.replays} replays"
    ]
    for p in cal.params:
        lines.append(f"  {p.name:<28} {cal.before[p.name]:>10.4g} -> {cal.after[p.name]:<10.4g}")
    lines.append(f"  {'statistic':<28} {'before':>10}    {'after':<10}")
    for key, before in cal.errors_before.items():
        after = cal.errors_after[key]
        unit = " pts" if key == "hit ratio" else ""
        scale = 100.0
        lines.append(f"  {key:<28} {before * scale:>+9.1f}%{unit}   {after * scale:+.1f}%{unit}")
    how = "--set serving.step_time=roofline" if cal.backend == "roofline" else "the measured tables"
    lines.append(
        f"mean abs. error {cal.error_before:.1%} -> {cal.error_after:.1%}; wrote {out_path} "
        f"(replay it with --hardware and {how})"
    )
    return "\n".join(lines)
