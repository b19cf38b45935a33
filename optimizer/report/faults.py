"""A replay's faults (:mod:`kvtier.sim.fault_metrics`): terminal table and JSON."""

from __future__ import annotations

import math

from rich.table import Table

from kvtier.sim.fault_metrics import FaultImpact


def _s(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return f"{x:.3g} s" if x < 100 else f"{x:,.0f} s"


def _ratio(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.1%}"


def fault_table(impacts: list[FaultImpact]) -> Table:
    """One row per fault: what it lost, how far the hit ratio fell, how long until it was
    back within the band, and the tail TTFT of the requests in between (beside the same
    requests without the fault)."""
    table = Table(title="faults", title_justify="left")
    for col in (
        "fault",
        "blocks lost",
        "hit ratio: level / lowest",
        "recovery",
        "requests",
        "TTFT P99 (no fault)",
        "TTFT P99.9 (no fault)",
    ):
        table.add_column(col, justify="left" if col == "fault" else "right")
    for f in impacts:
        rec = _s(f.recovery_s) if f.recovery_s is not None else "not in the trace"
        table.add_row(
            f.label,
            f"{f.lost_blocks:,}",
            f"{_ratio(f.level_hit_ratio)} / {_ratio(f.lowest_hit_ratio)}",
            rec,
            f"{f.requests_during:,}",
            f"{_s(f.ttft_p99_s)} ({_s(f.baseline_ttft_p99_s)})",
            f"{_s(f.ttft_p999_s)} ({_s(f.baseline_ttft_p999_s)})",
        )
    table.caption = (
        f"recovered: windowed hit ratio ({impacts[0].window_s:.3g} s windows) back within "
        f"{impacts[0].band:.0%} of the replay without the fault"
        if impacts
        else None
    )
    return table


def fault_json(impacts: list[FaultImpact]) -> list[dict[str, object]]:
    return [f.as_dict() for f in impacts]
