"""The replay's per-tier table (:mod:`kvtier.sim.tier_stats`): terminal and JSON."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from rich.table import Table

from kvtier.sim.tier_stats import TierStats


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.1%}"


def tier_table(stats: tuple[TierStats, ...] | list[TierStats]) -> Table:
    """One row per lower tier: connector, what it moved (loaded into HBM, read by storage
    prefetches into the tiers above, written), how fast a GPU loaded from it, how
    much of TTFT waited for it, where its connector's workers spent their time, its busiest
    link and, for SSDs, drive writes per day against the rating."""
    table = Table(title="lower tiers", title_justify="left")
    for col in (
        "tier",
        "connector",
        "loaded / written GB",
        "load GB/s per GPU",
        "TTFT waiting",
        "workers: rpc / stream / staging / links",
        "busiest link",
        "DWPD (rating)",
        "load / recompute s",
    ):
        table.add_column(col, justify="left" if col in ("tier", "connector") else "right")
    for s in stats:
        share = s.stage_share
        stages = " / ".join(_pct(share[k]) for k in ("rpc", "stream", "staging", "links"))
        gbps = "-" if math.isnan(s.load_gbps_per_gpu) else f"{s.load_gbps_per_gpu:.2f}"
        dwpd = "-"
        if not math.isnan(s.dwpd):
            rating = f"{s.dwpd_rating:g}" if s.dwpd_rating > 0 else "not rated"
            dwpd = f"{s.dwpd:.2f} ({rating})"
            if s.over_rating:
                dwpd = f"[bold red]{dwpd} over rating[/]"
        versus = "-"
        if not math.isnan(s.load_s_idle):
            versus = f"{s.load_s_idle:.3g} / {s.recompute_s:.3g}"
            if s.net_loss:
                versus = f"[bold red]{versus} net loss[/]"
        moved = f"{s.loaded_gb:,.1f}"
        if s.prefetched_gb > 0:
            moved += f" (+ {s.prefetched_gb:,.1f} prefetched)"
        table.add_row(
            s.tier,
            s.connector,
            f"{moved} / {s.written_gb:,.1f}",
            gbps,
            _pct(s.ttft_share),
            stages,
            f"{s.busiest_link} {_pct(s.busiest_link_share)}",
            dwpd,
            versus,
        )
    return table


def net_loss_lines(stats: tuple[TierStats, ...] | list[TierStats]) -> list[str]:
    """One sentence per tier whose path is slower than recomputing (empty when none is)."""
    return [
        f"tier {s.tier} ({s.connector}) is a net loss: loading {s.judged_blocks:.0f} blocks "
        f"takes {s.load_s_idle:.3g} s on an idle path, recomputing them {s.recompute_s:.3g} s, "
        "so a full hit is slower than a cold prefill"
        for s in stats
        if s.net_loss
    ]


def tier_json(stats: tuple[TierStats, ...] | list[TierStats]) -> list[dict[str, Any]]:
    """The rows as plain dicts (NaN as None), with the over-rating flag."""

    def clean(v: Any) -> Any:
        if isinstance(v, float) and math.isnan(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        return v

    return [
        {**clean(asdict(s)), "over_rating": s.over_rating, "net_loss": s.net_loss} for s in stats
    ]
