"""How ``kvtier batch`` reports: one row per trace, and a JSON list for scripts."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvtier.report.optimize import _misses, fmt_cell, result_json


def _cheapest_feasible_preset(result: Any) -> tuple[str, float] | None:
    feasible = [
        (b.name, b.evaluation.cost_per_mtok)
        for b in result.baselines
        if b.evaluation is not None and b.evaluation.feasible
    ]
    return min(feasible, key=lambda x: x[1]) if feasible else None


def print_batch(items: list[Any], console: Console) -> None:
    with_presets = any(item.result.baselines for item in items)
    table = Table(title="batch: best policy per trace", title_justify="left")
    table.add_column("trace", overflow="fold")
    for col in ("trials", "$ per 1M tok", "TTFT p99 s", "TPOT p99 s"):
        table.add_column(col, justify="right")
    if with_presets:
        table.add_column("cheapest preset meeting SLO")
    table.add_column("policy file", overflow="fold")
    for item in items:
        r = item.result
        best = r.best
        preset = _cheapest_feasible_preset(r)
        preset_text = "-" if preset is None else f"{preset[0]} ${preset[1]:.4f}"
        if best is None:
            near = r.closest
            miss = f"none meets the SLO; closest misses {_misses(near.violations)}" if near else "-"
            cells = [item.trace, str(r.n_trials), "-", "-", "-", preset_text, escape(miss)]
            table.add_row(*(cells if with_presets else cells[:5] + cells[6:]))
            continue
        # the winner as written to the policy file: refined, when the refine ran
        m = r.refined.metrics if getattr(r, "refined", None) is not None else best.metrics
        cells = [
            item.trace,
            str(r.n_trials),
            fmt_cell("{:.4f}", m.get("cost_per_mtok")),
            fmt_cell("{:.3f}", m.get("ttft_p99_s")),
            fmt_cell("{:.4f}", m.get("tpot_p99_s")),
            preset_text,
            str(r.policy_path),
        ]
        table.add_row(*(cells if with_presets else cells[:5] + cells[6:]))
    console.print(table)


def batch_json(items: list[Any]) -> dict[str, Any]:
    return {
        "traces": [
            {"trace": item.trace, **result_json(item.result)}
            for item in items
            if item.result is not None
        ]
    }
