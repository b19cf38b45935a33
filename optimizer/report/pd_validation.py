"""Render ``kvtier validate pd``: each published aggregated-against-disaggregated ratio beside
the model's on its stand-in, the residual (model / published) and whether it is within the
check's tolerance; then each effective-capacity check (Mooncake over a baseline at one TBT
threshold) with every system's share, the model's beside the one read from the figure."""

from __future__ import annotations

import math
from typing import Any

from kvtier.experiments.pd_validation import PdValidation

# the columns every check shows: what it is, the published ratio beside the model's, the verdict
CHECK_HEAD = ["result", "source", "published", "model", "model / published", "tolerance", "met"]
HEAD = [
    *CHECK_HEAD,
    "aggregated rps/GPU",
    "disaggregated rps/GPU",
    "deployments",
    "SLO TTFT / TPOT",
]


def _check_cells(c: Any, published: str) -> list[str]:
    """The :data:`CHECK_HEAD` cells of check ``c`` (``published`` as the check words it)."""
    return [
        c.name,
        c.source,
        published,
        f"{c.model:.2f}x",
        f"{c.residual:.2f}",
        f"1/{c.tolerance:g}..{c.tolerance:g}",
        "yes" if c.met else "MISSED",
    ]


def _rows(result: PdValidation) -> list[list[str]]:
    return [
        [
            *_check_cells(c, f"{c.published:.2f}x"),
            f"{c.aggregated_rps_per_gpu:.3g}",
            f"{c.disaggregated_rps_per_gpu:.3g}",
            f"{c.split} ({c.stand_in})",
            f"{1e3 * c.ttft_slo_s:.0f} ms / {1e3 * c.tpot_slo_s:.1f} ms",
        ]
        for c in result.checks
    ]


CAPACITY_HEAD = [
    *CHECK_HEAD,
    "effective share, model (figure)",
    "model's best baseline",
    "SLO TTFT / TBT",
]


def _share(model: float, read: float) -> str:
    fig = "not read" if math.isnan(read) else f"{100 * read:.0f} %"
    return f"{100 * model:.1f} % ({fig})"


def _capacity_rows(result: PdValidation) -> list[list[str]]:
    return [
        [
            *_check_cells(c, f"{c.published:.2f}x over {c.against}"),
            "; ".join(f"{s} {_share(v, c.published_capacity[s])}" for s, v in c.capacity.items()),
            c.best_baseline,
            f"{c.ttft_slo_s:g} s / {c.threshold_ms:g} ms",
        ]
        for c in result.capacity
    ]


def _text_table(head: list[str], body: list[list[str]]) -> list[str]:
    rows = [head, *body]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]


def to_text(result: PdValidation) -> str:
    lines = _text_table(HEAD, _rows(result)) if result.checks else []
    if result.capacity:
        lines += ["", *_text_table(CAPACITY_HEAD, _capacity_rows(result))]
    n = len(result.checks) + len(result.capacity)
    lines.append(
        f"{n - len(result.missed())} of {n} published P/D results reproduced within tolerance"
    )
    causes = dict.fromkeys(
        f"{c.name.split(' @ ')[0]}: {c.cause}" for c in result.missed() if c.cause
    )
    lines += [f"residual, {line}" for line in causes]
    return "\n".join(lines)


def _md_table(head: list[str], body: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return out + ["| " + " | ".join(r) + " |" for r in body]


def to_markdown(result: PdValidation) -> str:
    out = _md_table(HEAD, _rows(result)) if result.checks else []
    if result.capacity:
        out += [""] if out else []
        out += _md_table(CAPACITY_HEAD, _capacity_rows(result))
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
                "cause": c.cause,
                "ttft_slo_s": c.ttft_slo_s,
                "tpot_slo_s": c.tpot_slo_s,
            }
            for c in result.checks
        ],
        "capacity": [
            {
                "name": c.name,
                "source": c.source,
                "read": c.read,
                "threshold_ms": c.threshold_ms,
                "ttft_slo_s": c.ttft_slo_s,
                "against": c.against,
                "published": c.published,
                "model": c.model,
                "residual": c.residual,
                "tolerance": c.tolerance,
                "met": c.met,
                "capacity": c.capacity,
                "published_capacity": {
                    s: None if math.isnan(v) else v for s, v in c.published_capacity.items()
                },
                "best_baseline": c.best_baseline,
                "stand_in": c.stand_in,
                "cause": c.cause,
            }
            for c in result.capacity
        ],
        "missed": [c.name for c in result.missed()],
    }
