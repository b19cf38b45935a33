"""How ``optimize`` reports: a rich table for people, a JSON object for scripts."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvtier.scenario import SLO_TERMS

ROWS = (
    ("$ per 1M tok", "cost_per_mtok", "{:.4f}"),
    ("$ per hour", "cost_per_hour", "{:,.2f}"),
    ("TTFT mean s", "ttft_mean_s", "{:.3f}"),
    ("TTFT p99 s", "ttft_p99_s", "{:.3f}"),
    ("TPOT p99 s", "tpot_p99_s", "{:.4f}"),
    ("tok/s", "throughput_tps", "{:,.0f}"),
    ("inst.", "instances", "{}"),
)


def fmt_cell(fmt: str, value: Any) -> str:
    """A table cell: ``value`` formatted, or ``-`` when there is none (None, NaN, infinite)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
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
    table = Table(
        title="best policy and the presets, on this trace, hardware, model and SLO",
        title_justify="left",
    )
    table.add_column("policy", style="bold")
    for label, _, _ in ROWS:
        table.add_column(label, justify="right")
    table.add_column("meets SLO")
    table.add_row(
        f"best (trial {best.number})",
        *(fmt_cell(fmt, best.metrics.get(key)) for _, key, fmt in ROWS),
        "yes",
    )
    for b in result.baselines:
        if b.evaluation is None:
            table.add_row(b.name, *("-" for _ in ROWS), escape(f"n/a: {b.error}"))
            continue
        m = b.evaluation.metrics
        verdict = "yes" if b.evaluation.feasible else "no: " + _misses(b.evaluation.violations)
        table.add_row(
            b.name, *(fmt_cell(fmt, getattr(m, key)) for _, key, fmt in ROWS), escape(verdict)
        )
    console.print(table)
    params = Table(title="chosen parameters", title_justify="left", show_header=False)
    params.add_column("name", style="bold")
    params.add_column("value", justify="right")
    for k, v in sorted(best.params.items()):
        params.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
    if result.best.rate_scale != 1.0:
        params.add_row("load (rate scale)", f"{best.rate_scale:.3g}x the trace's arrival rate")
    console.print(params)
    feasible = {
        b.name: b.evaluation
        for b in result.baselines
        if b.evaluation is not None and b.evaluation.feasible
    }
    if feasible:
        cheapest = min(feasible, key=lambda n: feasible[n].cost_per_mtok)
        named = [n for n in ("vllm-hbm", cheapest) if n in feasible]
        for name in dict.fromkeys(named):
            saving = 1 - best.metrics["cost_per_mtok"] / feasible[name].cost_per_mtok
            word = "cheaper" if saving >= 0 else "more expensive"
            label = f"{name} (the cheapest preset that meets it)" if name == cheapest else name
            console.print(f"{abs(saving):.0%} {word} per token than {label} at the same SLO.")
    elif result.baselines:
        console.print("No preset meets the SLO on this trace and hardware.")
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
        trace = result.extra.get("trace", "TRACE")
        console.print(
            f"policy written to [bold]{result.policy_path}[/]; reproduce with "
            f"kvtier replay --policy {result.policy_path} --trace {trace}"
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
