"""Render ``kvtier validate silicon``: per framework and model, the MAPE and lean of TTFT and
TPOT over aiconfigurator-core's measured runs, and per run the measured and modelled figures."""

from __future__ import annotations

from typing import Any

from kvtier.experiments.silicon_validation import METRICS, TARGET, SiliconValidation

LABEL = {"ttft_ms": "TTFT", "tpot_ms": "TPOT"}


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{100 * v:.1f} %"


def _group_line(key: tuple[str, str, str], group: SiliconValidation) -> list[str]:
    cells = [*key, str(len(group.replayed()))]
    for m in METRICS:
        ratios = group.ratios(m)
        below, above = group.lean(m)
        span = f"{min(ratios):.2f}-{max(ratios):.2f}x" if ratios else "n/a"
        cells += [_pct(group.mape(m)), f"{below}/{above}", span]
    return cells


HEAD = ["framework", "model", "hardware", "runs"]
HEAD += [x for m in METRICS for x in (f"{LABEL[m]} MAPE", "below/above", "model/measured")]


def summary_lines(result: SiliconValidation) -> list[str]:
    """The overall MAPE against its target, per metric and framework, and the runs not
    replayed."""
    n = len(result.replayed())
    lines = [
        f"MAPE: {_pct(result.mape())} over {2 * n} checks of {n} runs (target <= "
        f"{100 * TARGET:.0f} %)"
    ]
    for m in METRICS:
        below, above = result.lean(m)
        per_fw = "; ".join(f"{fw} {_pct(result.mape(m, fw))}" for fw in result.frameworks())
        lines.append(
            f"  {LABEL[m]}: {_pct(result.mape(m))} ({below} below the measured, {above} above; "
            f"{per_fw})"
        )
    skipped = [r for r in result.results if r.skipped is not None]
    if skipped:
        reasons = sorted({r.skipped or "" for r in skipped})
        lines.append(f"not replayed: {len(skipped)} runs ({'; '.join(reasons)})")
    lines.append(f"runs: {result.manifest.source}")
    return lines


def to_text(result: SiliconValidation) -> str:
    rows = [HEAD] + [_group_line(k, v) for k, v in result.groups().items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEAD))]
    text = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join([*text, "", *summary_lines(result)])


def to_markdown(result: SiliconValidation) -> str:
    """The per-group table, the summary, and every run (measured, model, ratio)."""
    lines = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    lines += ["| " + " | ".join(_group_line(k, v)) + " |" for k, v in result.groups().items()]
    lines += ["", *(f"- {x}" for x in summary_lines(result)), ""]
    head = ["run", "conditions", "TTFT ms", "model", "ratio", "TPOT ms", "model", "ratio"]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in result.results:
        cells = [r.run.id, r.run.figure.read.split(": TTFT")[0]]
        for m in METRICS:
            ratio = r.ratio(m)
            cells += [
                f"{r.run.published(m):.2f}",
                "n/a" if r.skipped else f"{r.model[m]:.2f}",
                "n/a" if ratio is None else f"{ratio:.3f}",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def silicon_json(result: SiliconValidation) -> dict[str, Any]:
    return {
        "source": result.manifest.source,
        "target": TARGET,
        "mape": result.mape(),
        "mape_by_metric": {m: result.mape(m) for m in METRICS},
        "mape_by_framework": {
            fw: {m: result.mape(m, fw) for m in METRICS} for fw in result.frameworks()
        },
        "lean": {m: dict(zip(("below", "above"), result.lean(m), strict=True)) for m in METRICS},
        "runs": [
            {
                "id": r.run.id,
                "read": r.run.figure.read,
                "conditions": r.run.figure.conditions,
                "framework_version": r.run.framework_version,
                "data_source": r.run.data_source,
                "measured": {m: r.run.published(m) for m in METRICS},
                "model": None if r.skipped else r.model,
                "skipped": r.skipped,
            }
            for r in result.results
        ],
        "missed": result.missed(),
    }
