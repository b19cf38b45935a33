"""Render ``kvtier validate pd``: each published aggregated-against-disaggregated ratio beside
the model's on its stand-in, the residual (model / published) and whether it is within the
check's tolerance."""

from __future__ import annotations

from typing import Any

from kvtier.experiments.pd_validation import PdValidation

HEAD = [
    "result",
    "source",
    "published",
    "model",
    "model / published",
    "tolerance",
    "met",
    "aggregated rps/GPU",
    "disaggregated rps/GPU",
    "deployments",
    "SLO TTFT / TPOT",
]


def _rows(result: PdValidation) -> list[list[str]]:
    return [
        [
            c.name,
            c.source,
            f"{c.published:.2f}x",
            f"{c.model:.2f}x",
            f"{c.residual:.2f}",
            f"1/{c.tolerance:g}..{c.tolerance:g}",
            "yes" if c.met else "MISSED",
            f"{c.aggregated_rps_per_gpu:.3g}",
            f"{c.disaggregated_rps_per_gpu:.3g}",
            f"{c.split} ({c.stand_in})",
            f"{1e3 * c.ttft_slo_s:.0f} ms / {1e3 * c.tpot_slo_s:.1f} ms",
        ]
        for c in result.checks
    ]


def to_text(result: PdValidation) -> str:
    rows = [HEAD, *_rows(result)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEAD))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    missed = result.missed()
    lines.append(
        f"{len(result.checks) - len(missed)} of {len(result.checks)} published P/D results "
        "reproduced within tolerance"
    )
    return "\n".join(lines)


def to_markdown(result: PdValidation) -> str:
    out = ["| " + " | ".join(HEAD) + " |", "|" + "---|" * len(HEAD)]
    out += ["| " + " | ".join(r) + " |" for r in _rows(result)]
    return "\n".join(out) + "\n"


def pd_json(result: PdValidation) -> dict[str, Any]:
    return {
        "checks": [
            {
                "name": c.name,
                "source": c.source,
                "read": c.read,
                "published": c.published,
                "model": c.model,
                "residual": c.residual,
                "tolerance": c.tolerance,
                "met": c.met,
                "aggregated_rps_per_gpu": c.aggregated_rps_per_gpu,
                "disaggregated_rps_per_gpu": c.disaggregated_rps_per_gpu,
                "deployments": c.split,
                "stand_in": c.stand_in,
                "ttft_slo_s": c.ttft_slo_s,
                "tpot_slo_s": c.tpot_slo_s,
            }
            for c in result.checks
        ],
        "missed": [c.name for c in result.missed()],
    }
