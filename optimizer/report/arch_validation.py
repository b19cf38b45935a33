"""Render ``kvtier validate architectures``: each published ratio between a memory
architecture and its baseline beside the model's, the residual (model / published), whether it
is within the check's tolerance and, when it is not, the cause the scenario names."""

from __future__ import annotations

from typing import Any

from kvtier.experiments.arch_validation import ArchValidation

HEAD = [
    "result",
    "source",
    "metric",
    "published",
    "model",
    "model / published",
    "tolerance",
    "met",
    "baseline",
    "system",
]
UNITS = {"throughput": "tok/s", "latency": "s", "ttft": "s", "ttft_reuse": "s"}


def _rows(result: ArchValidation) -> list[list[str]]:
    return [
        [
            c.name,
            c.source,
            c.metric,
            f"{c.published:.2f}x",
            f"{c.model:.2f}x",
            f"{c.residual:.2f}",
            f"1/{c.tolerance:g}..{c.tolerance:g}",
            "yes" if c.met else "MISSED",
            f"{c.baseline_value:.4g} {UNITS[c.metric]}",
            f"{c.system_value:.4g} {UNITS[c.metric]}",
        ]
        for c in result.checks
    ]


def _causes(result: ArchValidation) -> list[str]:
    return [f"{c.name}: residual {c.residual:.2f}; cause: {c.gap}" for c in result.missed()]


def to_text(result: ArchValidation) -> str:
    rows = [HEAD, *_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEAD))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines += _causes(result)
    n = len(result.checks)
    lines.append(f"{n - len(result.missed())} of {n} published architecture ratios reproduced")
    return "\n".join(lines)


def to_markdown(result: ArchValidation) -> str:
    out = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(r) + " |" for r in _rows(result)]
    causes = _causes(result)
    if causes:
        out += ["", *(f"- {line}" for line in causes)]
    return "\n".join(out) + "\n"


def arch_json(result: ArchValidation) -> dict[str, Any]:
    return {
        "checks": [
            {
                "name": c.name,
                "source": c.source,
                "read": c.read,
                "metric": c.metric,
                "published": c.published,
                "model": c.model,
                "residual": c.residual,
                "tolerance": c.tolerance,
                "met": c.met,
                "baseline": c.baseline_value,
                "system": c.system_value,
                "gap": c.gap,
            }
            for c in result.checks
        ],
        "missed": [c.name for c in result.missed()],
    }
