"""How the refine stage reports (``kvtier.search.refine``): what it changed, the certificate
that no single step to a cheaper neighbour meets the SLO for less, and each tier's
cost-vs-capacity curve.

Everything here reads the refine as the study stores it (``Refined.to_attrs``: plain data,
infinities as None), so ``optimize`` and ``report`` print the same sections.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console

from kvtier.report.optimize import fmt_cell


def refine_sentence(data: dict[str, Any]) -> str:
    """One sentence: what the refine changed and what it saved, or that it changed nothing."""
    start = data["start_cost_per_mtok"]
    cost = data["metrics"].get("cost_per_mtok")
    replays = data.get("replays", 0)
    if not data["changes"]:
        return (
            f"Refine: trial {data['from_trial']} is already the cheapest of its neighbours "
            f"(${start:.4f} per 1M tokens; {_replays(replays)})."
        )
    saving = 1 - cost / start if start else 0.0
    return (
        f"Refine: from trial {data['from_trial']}, {', '.join(data['changes'])}: "
        f"${start:.4f} -> ${cost:.4f} per 1M tokens ({saving:.1%} less), still within the SLO "
        f"({_replays(replays)})."
    )


def _replays(n: int) -> str:
    return f"{n} replay" if n == 1 else f"{n} replays"


def certificate_sentence(data: dict[str, Any]) -> str:
    if data["holds"] and not data["certificate"]:
        return (
            "Certificate: no cheaper neighbour exists (no lower tier to shrink or remove, no "
            "instance to drop, or each pinned)."
        )
    if data["holds"]:
        return (
            "Certificate: every single step to a cheaper neighbour (each lower tier's capacity "
            "-10%, each lower tier removed, one instance fewer) misses the SLO or costs more."
        )
    return (
        "Certificate not reached: a cheaper neighbour still met the SLO after the refine's "
        "last round (listed below)."
    )


def refine_sections(data: dict[str, Any]) -> list[Any]:
    """The refine as report sections (:class:`kvtier.report.study.Section`)."""
    from kvtier.report.study import Section

    out = [
        Section(refine_sentence(data)),
        Section(certificate_sentence(data), alert=not data["holds"]),
    ]
    rows = [
        [
            p["label"],
            fmt_cell("{:.4f}", p["cost_per_mtok"]),
            fmt_cell("{:,.2f}", p["cost_per_hour"]),
            fmt_cell("{:.3f}", p["ttft_p99_s"]),
            p["reason"] or "cheaper and meets the SLO",
        ]
        for p in data["certificate"]
    ]
    if rows:
        out.append(
            Section(
                "cheaper neighbours of the refined winner",
                ["neighbour", "$/1M tok", "$/hour", "TTFT p99 s", "why not taken"],
                rows,
                left=(0, 4),
            )
        )
    for tier, points in data.get("curves", {}).items():
        rows = [
            [
                p["label"],
                fmt_cell("{:,.4g}", p["capacity_gb"]),
                fmt_cell("{:,.2f}", p["cost_per_hour"]),
                fmt_cell("{:.4f}", p["cost_per_mtok"]),
                fmt_cell("{:.3f}", p["ttft_p99_s"]),
                "yes" if p["feasible"] else "no: " + (p["reason"] or "misses the SLO"),
            ]
            for p in points
        ]
        out.append(
            Section(
                f"cost vs capacity: {tier} (the refined winner, other settings fixed)",
                ["capacity", "GB", "$/hour", "$/1M tok", "TTFT p99 s", "meets SLO"],
                rows,
                left=(0, 5),
            )
        )
    return out


def print_refine(data: dict[str, Any], console: Console) -> None:
    """The refine's sections on the terminal."""
    from kvtier.report.study import print_sections

    print_sections(refine_sections(data), console)
