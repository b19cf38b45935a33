"""How ``kvtier validate offload`` reports: a table per run (measured, model, error, role), the
MAPE per metric over the checks against its target, as text, JSON and markdown; with
``--stages`` each replay's stages (latencies and where the prompt tokens came from)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvtier.experiments.offload_validation import (
    HIT_METRICS,
    HIT_POINTS,
    REPORTED,
    SIDES,
    TARGETS,
)

if TYPE_CHECKING:
    from kvtier.experiments.offload_validation import Cell, OffloadValidation, StageRow

LABELS = {
    "ttft_mean_s": "TTFT mean s",
    "throughput": "throughput",
    "hit_ratio": "hit ratio",
    "sweep_external_hit_ratio": "external hit ratio (whole sweep)",
    "ttft_p90_s": "TTFT P90 s",
    "e2e_mean_s": "E2E latency mean s",
    "e2e_p90_s": "E2E latency P90 s",
}


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _err(c: Cell) -> str:
    e = c.error
    if e is None:
        return "-"
    if c.metric in HIT_METRICS:
        return f"{100 * e:+.1f} pts"
    return f"{100 * e:+.1f} %"


def _rows(result: OffloadValidation, run: str) -> list[list[str]]:
    the_run = next(r for r in result.runs if r.name == run)
    out = []
    for c in result.cells:
        if c.run != run:
            continue
        label = LABELS[c.metric]
        if c.metric == "throughput":
            counted = the_run.output_count(c.side) != 1.0
            label += f" ({the_run.unit}{', as the harness counted' if counted else ''})"
        out.append([c.side, label, _num(c.measured), _num(c.model), _err(c), c.role])
    return out


def _percent(value: float, target: float) -> str:
    """``value`` in percent, with a second decimal where one would print it as the target,
    so that the verdict beside it can be read off the figure (9.98 % met, 10.04 % missed)."""
    text = f"{100 * value:.1f}"
    if text == f"{100 * target:.1f}":
        text = f"{100 * value:.2f}"
    return f"{text} %"


def _lean(result: OffloadValidation, metric: str) -> str:
    """``; N below the measured, M above`` (empty without checks)."""
    below, above = result.lean(metric)
    return f"; {below} below the measured, {above} above" if below or above else ""


def _summary(result: OffloadValidation) -> list[str]:
    lines = []
    for metric, target in TARGETS.items():
        m = result.mape(metric)
        got = "-" if m is None else _percent(m, target)
        n = len(result.checks(metric))
        if n == 0:  # a target with nothing to check is not met
            lines.append(
                f"{LABELS[metric]}: no check among these runs (target <= {100 * target:.0f} %: "
                "missed)"
            )
            continue
        met = m is not None and m <= target
        lines.append(
            f"{LABELS[metric]} MAPE over {n} checks: {got} (target <= {100 * target:.0f} %: "
            f"{'met' if met else 'missed'}){_lean(result, metric)}"
        )
    any_hits = False
    for metric in HIT_METRICS:
        hits = [c for c in result.checks(metric) if c.error is not None]
        if not hits:
            continue
        any_hits = True
        worst = max(abs(c.error or 0.0) for c in hits)
        lines.append(
            f"{LABELS[metric]} over {len(hits)} checks: worst {100 * worst:.1f} points "
            f"(target within {100 * HIT_POINTS:.0f}: {'met' if worst <= HIT_POINTS else 'missed'})"
        )
    if not any_hits:
        lines.append("hit ratio: no check among these runs")
    for metric in REPORTED:
        m = result.mape(metric)
        if m is not None:
            n = len(result.checks(metric))
            lines.append(
                f"{LABELS[metric]} MAPE over {n} checks: {100 * m:.1f} % (no target)"
                f"{_lean(result, metric)}"
            )
    return lines


def to_text(result: OffloadValidation) -> str:
    head = ["side", "metric", "measured", "model", "error", "role"]
    lines: list[str] = []
    for run in result.runs:
        lines.append(f"{run.name}: {run.system} ({run.role})")
        lines.append(f"  {run.source['title']}, {run.source['date']}")
        why = result.notes.get(run.name)
        if why:
            lines.append(f"  the model could not run it: {why}")
        rows = [head, *_rows(result, run.name)]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        for r in rows:
            cells = zip(r, widths, strict=True)
            lines.append(
                "  "
                + "  ".join(v.rjust(w) if i > 1 else v.ljust(w) for i, (v, w) in enumerate(cells))
            )
        lines.append("")
    lines += _summary(result)
    return "\n".join(lines)


def offload_json(result: OffloadValidation) -> dict[str, Any]:
    return {
        "runs": [
            {
                "name": r.name,
                "role": r.role,
                "system": r.system,
                "source": r.source,
                "conditions": r.conditions,
                "throughput_unit": r.unit,
                "error": result.notes.get(r.name) or None,
                "cells": [
                    {
                        "side": c.side,
                        "metric": c.metric,
                        "measured": c.measured,
                        "model": c.model,
                        "error": c.error,
                    }
                    for c in result.cells
                    if c.run == r.name
                ],
            }
            for r in result.runs
        ],
        "mape": {m: result.mape(m) for m in (*TARGETS, *REPORTED)},
        "lean": {
            m: dict(zip(("below", "above"), result.lean(m), strict=True))
            for m in (*TARGETS, *REPORTED)
        },
        "targets": {**TARGETS, "hit_ratio_points": HIT_POINTS},
        "missed": [
            {"metric": m.metric, "value": m.value, "target": m.target, "runs": list(m.runs)}
            for m in result.missed()
        ],
    }


def to_markdown(result: OffloadValidation) -> str:
    lines = [
        "| run | role | side | metric | measured | model | error |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for run in result.runs:
        for side in SIDES:
            for row in _rows(result, run.name):
                if row[0] == side:
                    lines.append(
                        f"| `{run.name}` | {run.role} | {side} | {row[1]} | {row[2]} | "
                        f"{row[3]} | {row[4]} |"
                    )
    lines += ["", *(f"- {s}" for s in _summary(result))]
    return "\n".join(lines) + "\n"


STAGE_HEAD = (
    "side", "stage", "requests", "TTFT mean s", "TTFT p50 s", "E2E mean s", "TPOT ms",
    "HBM hit", "loaded", "computed", "preempted",
)  # fmt: skip


def stages_text(breakdowns: dict[str, list[StageRow]]) -> str:
    """Per run, a row per side and stage: what decided the figures above (the prompt tokens'
    shares hit in HBM, loaded from a lower tier and computed)."""
    lines: list[str] = []
    for name, rows in breakdowns.items():
        lines.append(f"{name}: stages of each side's replay")
        table = [list(STAGE_HEAD)] + [
            [
                r.side,
                str(r.stage),
                str(r.requests),
                f"{r.ttft_mean_s:.3f}",
                f"{r.ttft_p50_s:.3f}",
                f"{r.e2e_mean_s:.2f}",
                f"{r.tpot_ms:.1f}",
                f"{100 * r.hbm_share:.1f} %",
                f"{100 * r.loaded_share:.1f} %",
                f"{100 * r.computed_share:.1f} %",
                str(r.preemptions),
            ]  # fmt: skip
            for r in rows
        ]
        widths = [max(len(row[i]) for row in table) for i in range(len(STAGE_HEAD))]
        for row in table:
            cells = enumerate(zip(row, widths, strict=True))
            lines.append("  " + "  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in cells))
        lines.append("")
    return "\n".join(lines)


def stages_json(breakdowns: dict[str, list[StageRow]]) -> dict[str, list[dict[str, Any]]]:
    from dataclasses import asdict

    return {name: [asdict(r) for r in rows] for name, rows in breakdowns.items()}
