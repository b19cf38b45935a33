"""Render ``kvtier validate serving``: published / model / ratio per figure and backend, the
MAPE of each backend over the checks (calibration rows shown, never counted)."""

from __future__ import annotations

from typing import Any

from kvtier.experiments.serving_validation import (
    BACKENDS,
    RESIDUALS,
    TARGETS,
    ServingValidation,
)


def _num(v: float | None, unit: str) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.0f}" if unit.startswith("tok") else f"{v:.2f}"


def _ratio(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f} %"


def _rows(result: ServingValidation) -> list[list[str]]:
    out = []
    for r in result.rows:
        f = r.figure
        cells = [f.name, f.role, f.metric, f.unit, _num(f.published, f.unit)]
        for b in BACKENDS:
            cells += [_num(r.model[b], f.unit), _ratio(r.ratio(b))]
        out.append(cells)
    return out


HEAD = ["figure", "role", "metric", "unit", "published"]
HEAD += [x for b in BACKENDS for x in (b, f"{b} / published")]


def _mape_lines(result: ServingValidation) -> list[str]:
    lines = []
    n = len(result.checks())
    for b in BACKENDS:
        target = TARGETS[b]
        goal = f" (target <= {100 * target:.0f} %)" if target is not None else " (no target)"
        below, above = result.lean(b)
        lines.append(
            f"MAPE {b}: {_pct(result.mape(b))} over {n} checks{goal}; "
            f"{below} below the published figure, {above} above"
        )
        lines.append(
            "  of which "
            + "; ".join(
                f"{g} {_pct(result.mape(b, g))} ({k}: {'/'.join(map(str, result.lean(b, g)))} "
                "below/above)"
                for g, k in result.group_sizes().items()
            )
        )
    fe = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in sorted(result.frontend_s.items()))
    lines.append(f"front-end cost per request (calibrated, docs/sources.md): {fe}")
    per_token = ", ".join(
        f"{k} {v * 1e6:.2f} us" for k, v in sorted(result.frontend_token_s.items())
    )
    lines.append(f"front-end cost per prompt token (sourced, docs/sources.md): {per_token}")
    if any(r.figure.conditions["mode"] == "closed" for r in result.checks()):
        lines += [f"residual: {x}" for x in RESIDUALS]
    return lines


def to_text(result: ServingValidation) -> str:
    rows = [HEAD, *_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEAD))]
    text = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([*text, "", *_mape_lines(result)])


def to_markdown(result: ServingValidation) -> str:
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(r) + " |" for r in _rows(result)]
    lines += ["", *(f"- {x}" for x in _mape_lines(result)), ""]
    lines += ["| figure | conditions | source | what was read |", "|---|---|---|---|"]
    for r in result.rows:
        f = r.figure
        lines.append(f"| {f.name} | {f.describe()} | [{f.source}]({f.url}) | {f.read} |")
    return "\n".join(lines) + "\n"


def serving_json(result: ServingValidation) -> dict[str, Any]:
    return {
        "figures": [
            {
                "name": r.figure.name,
                "role": r.figure.role,
                "metric": r.figure.metric,
                "unit": r.figure.unit,
                "published": r.figure.published,
                "conditions": r.figure.conditions,
                "source": r.figure.source,
                "url": r.figure.url,
                "read": r.figure.read,
                "model": r.model,
                "ratio": {b: r.ratio(b) for b in BACKENDS},
                "provenance": r.provenance,
            }
            for r in result.rows
        ],
        "mape": {b: result.mape(b) for b in BACKENDS},
        "mape_by_group": {
            b: {g: result.mape(b, g) for g in result.group_sizes()} for b in BACKENDS
        },
        "lean": {b: dict(zip(("below", "above"), result.lean(b), strict=True)) for b in BACKENDS},
        "targets": TARGETS,
        "frontend_s": result.frontend_s,
        "frontend_token_s": result.frontend_token_s,
        "missed": [
            {"backend": m.backend, "mape": m.mape, "target": m.target} for m in result.missed()
        ],
    }
