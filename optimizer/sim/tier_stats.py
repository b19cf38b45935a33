"""What one replay's lower tiers did, per tier: the table that answers "why did offloading make
it slower?" (docs/model.md, "What the replay shows"), and SSD wear.

Computed from a :class:`kvtier.sim.result.RawResult` after the replay, in numpy, for both
engines alike:

- effective load bandwidth per GPU: bytes the tier delivered to GPUs over the seconds the
  loading requests waited for them (admission to the last loaded block), i.e. the rate one
  GPU sees while it loads from the tier;
- share of TTFT spent waiting for loads from the tier;
- each stage's busy share: the seconds of a stage (per-operation RPC or submit, the store's
  stream, host staging copies, links) over the time the tier's connector workers had (its
  load workers and its store workers, which run apart);
- the busiest link on the tier's path and its utilisation;
- SSD wear: drive writes per day at the trace's rate (bytes written per pool, per day, over
  one pool's drives' capacity) against the profile's rating, and its cost: each drive endures
  ``dwpd x capacity x 365 x warranty_years`` bytes for its price.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvtier.hardware.types import Hardware
from kvtier.sim.result import RawResult
from kvtier.sim.tiers import STAGES, TierConfig
from kvtier.tier_kinds import trait as tier_trait

DAY_S = 86_400.0


@dataclass(frozen=True)
class TierStats:
    """One lower tier's row of the replay's tier table."""

    tier: str
    connector: str
    loaded_gb: float
    written_gb: float
    load_gbps_per_gpu: float  # NaN when nothing was loaded
    ttft_share: float  # share of all TTFT spent waiting for this tier's loads
    stage_share: dict[str, float]  # STAGES -> busy share of the tier's workers
    busiest_link: str
    busiest_link_share: float
    dwpd: float  # drive writes per day at the trace's rate (NaN: not an SSD / no rating)
    dwpd_rating: float  # the profile's rating (0: not rated)
    wear_per_hour: float  # $ of drive endurance used per hour of the replay

    @property
    def over_rating(self) -> bool:
        """Writes more per day than the drives are rated for."""
        return self.dwpd_rating > 0 and self.dwpd > self.dwpd_rating


def replay_span(arrival_s: np.ndarray, raw: RawResult) -> float:
    """Seconds from the first arrival to the last finish (the replay's end when none)."""
    served = ~np.isnan(raw.finish_s)
    start = float(arrival_s[0]) if len(arrival_s) else 0.0
    if served.any():
        return float(np.max(raw.finish_s[served])) - start
    return float(raw.end_s) - start


def tier_stats(
    tiers: TierConfig | None, raw: RawResult, arrival_s: np.ndarray, hardware: Hardware
) -> list[TierStats]:
    """One :class:`TierStats` per lower tier (none without tiers)."""
    if tiers is None or not len(raw.tier_hit_blocks):
        return []
    span = replay_span(arrival_s, raw)
    ttft = raw.first_token_s - arrival_s
    ttft_sum = float(np.nansum(ttft))
    load = raw.load_s if raw.load_s is not None else np.zeros(len(ttft))
    rows = []
    for t, name in enumerate(tiers.names):
        from_t = raw.loaded_blocks[:, t] > 0
        wait = float(load[from_t].sum())
        delivered = float(raw.loaded_blocks[:, t].sum()) * tiers.block_bytes
        # the connector's load and store workers (each direction has its own)
        workers = 2 * int(tiers.nw[t]) * len({int(w) for w in tiers.w0[t]})
        have = span * workers
        stage = raw.stage_s[t] if len(raw.stage_s) > t else np.zeros(len(STAGES))
        share = {
            s: float(v) / have if have > 0 else math.nan for s, v in zip(STAGES, stage, strict=True)
        }
        path = np.unique(tiers.gpu_path[t][tiers.gpu_path[t] >= 0])
        util = raw.link_busy_s[path] / span if span > 0 else np.full(len(path), math.nan)
        j = int(np.nanargmax(util)) if len(path) and np.any(np.isfinite(util)) else 0
        hw = hardware.tiers.get(name)
        dwpd, rating, wear = math.nan, 0.0, 0.0
        written = float(raw.tier_bytes_written[t])
        if hw is not None and tier_trait(name, "wear") and span > 0:
            n_pools = tiers.n_hosts if tiers.per_host[t] else 1
            dwpd = written / n_pools / (span / DAY_S) / hw.capacity_bytes
            rating = hw.dwpd
            if hw.dwpd > 0 and hw.drive_price > 0:
                endurance = hw.dwpd * (hw.capacity_bytes / hw.drives) * 365.0 * hw.warranty_years
                wear = written / (span / 3600.0) * hw.drive_price / endurance
        rows.append(
            TierStats(
                tier=name,
                connector=tiers.connectors[t],
                loaded_gb=delivered / 1e9,
                written_gb=written / 1e9,
                load_gbps_per_gpu=delivered / wait / 1e9 if wait > 0 else math.nan,
                ttft_share=wait / ttft_sum if ttft_sum > 0 else 0.0,
                stage_share=share,
                busiest_link=tiers.link_names[int(path[j])] if len(path) else "",
                busiest_link_share=float(util[j]) if len(path) else math.nan,
                dwpd=dwpd,
                dwpd_rating=rating,
                wear_per_hour=wear,
            )
        )
    return rows
