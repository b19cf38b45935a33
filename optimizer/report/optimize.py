"""How ``optimize`` reports: a rich table for people, a JSON object for scripts."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from optimizer.search.objective import SLO_TERMS

ROWS = (
    ("cost per 1M tokens", "cost_per_mtok", "${:.4f}"),
    ("cost per hour", "cost_per_hour", "${:,.2f}"),
    ("TTFT mean", "ttft_mean_s", "{:.3f} s"),
    ("TTFT p99", "ttft_p99_s", "{:.3f} s"),
    ("TPOT p99", "tpot_p99_s", "{:.4f} s"),
    ("throughput", "throughput_tps", "{:,.0f} tok/s"),
    ("instances", "instances", "{}"),
    ("GPU busy", "gpu_busy_fraction", "{:.1%}"),
)


def _fmt(fmt: str, value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def _slo_text(slo: Any) -> str:
    return ", ".join(
        f"{t[:-2]} <= {getattr(slo, t):g} s" for t in SLO_TERMS if getattr(slo, t) is not None
    )


def _misses(violations: dict[str, float]) -> str:
    parts = [
        f"{k} by {v:.3g}" + ("" if k == "completion" else " s")
        for k, v in violations.items()
        if v > 0
    ]
    return ", ".join(parts)


def print_result(result: Any, console: Console) -> None:
    console.print(
        f"study [bold]{result.study_name}[/] ({result.storage}): {result.new_trials} new trials, "
        f"{result.n_trials} in all, {result.seconds:.1f} s; SLO: {_slo_text(result.slo)}"
    )
    best = result.best
    if best is None:
        near = result.closest
        if near is None:
            console.print("[red]no trial finished[/]")
            return
        console.print(
            f"[red]no trial met the SLO.[/] Closest: trial {near.number} "
            f"({', '.join(f'{k}={v}' for k, v in near.params.items())}), which misses "
            f"{_misses(near.violations)}; the binding constraint is [bold]{result.binding}[/]. "
            "Relax it, allow more hardware in the space, or lower --rate-scale."
        )
        return
    table = Table(title="best policy vs baselines on the same trace and SLO", title_justify="left")
    table.add_column("metric", style="bold")
    table.add_column(f"best (trial {best.number})", justify="right")
    for b in result.baselines:
        table.add_column(b.name, justify="right")
    for label, key, fmt in ROWS:
        row = [label, _fmt(fmt, best.metrics.get(key))]
        for b in result.baselines:
            row.append(_fmt(fmt, getattr(b.evaluation.metrics, key)) if b.evaluation else "-")
        table.add_row(*row)
    row = ["meets SLO", "yes"]
    for b in result.baselines:
        if b.evaluation is None:
            row.append(f"error: {b.error}")
        else:
            row.append(
                "yes" if b.evaluation.feasible else "no: " + _misses(b.evaluation.violations)
            )
    table.add_row(*row)
    console.print(table)
    params = Table(title="chosen parameters", title_justify="left", show_header=False)
    params.add_column("name", style="bold")
    params.add_column("value", justify="right")
    for k, v in sorted(best.params.items()):
        params.add_row(k, str(v))
    if result.best.rate_scale != 1.0:
        params.add_row("load (rate scale)", f"{best.rate_scale:.3g}x the trace's arrival rate")
    console.print(params)
    for b in result.baselines:
        if b.evaluation is None:
            continue
        cost = b.evaluation.cost_per_mtok
        if b.evaluation.feasible and cost > 0:
            saving = 1 - best.metrics["cost_per_mtok"] / cost
            console.print(f"{saving:.0%} cheaper per token than {b.name} at the same SLO.")
        else:
            console.print(
                f"{b.name} does not meet the SLO on this trace "
                f"(misses {_misses(b.evaluation.violations)})."
            )
    if result.front:
        front = Table(title="Pareto front (cost vs TTFT p99)", title_justify="left")
        for col in ("trial", "cost per 1M tokens", "TTFT p99"):
            front.add_column(col, justify="right")
        for s in result.front:
            front.add_row(
                str(s.number),
                f"${s.metrics['cost_per_mtok']:.4f}",
                f"{s.metrics['ttft_p99_s']:.3f} s",
            )
        console.print(front)
    if result.policy_path is not None:
        console.print(
            f"policy written to [bold]{result.policy_path}[/]; reproduce with "
            f"kvtier replay --policy {result.policy_path} --trace <trace>"
        )


def result_json(result: Any) -> dict[str, Any]:
    def trial(s: Any) -> dict[str, Any] | None:
        return None if s is None else asdict(s)

    return {
        "study": result.study_name,
        "storage": result.storage,
        "trials": result.n_trials,
        "new_trials": result.new_trials,
        "warm_started": result.warm_started,
        "seconds": result.seconds,
        "slo": {t: getattr(result.slo, t) for t in SLO_TERMS if getattr(result.slo, t) is not None},
        "best": trial(result.best),
        "closest": trial(result.closest),
        "binding_constraint": result.binding,
        "pareto_front": [asdict(s) for s in result.front],
        "baselines": [
            {
                "name": b.name,
                "error": b.error,
                "feasible": b.evaluation.feasible if b.evaluation else None,
                "violations": b.evaluation.violations if b.evaluation else None,
                "metrics": b.evaluation.metrics.to_dict() if b.evaluation else None,
            }
            for b in result.baselines
        ],
        "policy_path": str(result.policy_path) if result.policy_path else None,
    }
