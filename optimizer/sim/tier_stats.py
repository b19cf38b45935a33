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
- the verdict "link slower than recomputing" (``net_loss``): the seconds one request's typical
  load from the tier takes through its connector on an idle path (the mean blocks a loading
  request took from it, or the mean prompt when none did) against the seconds its instance
  computes those tokens from scratch. A tier whose loads lose to recompute makes a full hit
  slower than a cold prefill; the report says so beside the tier (docs/model.md, "What the
  replay shows");
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
    loaded_gb: float  # loaded from the tier into HBM
    written_gb: float
    load_gbps_per_gpu: float  # NaN when nothing was loaded
    ttft_share: float  # share of all TTFT spent waiting for this tier's loads
    stage_share: dict[str, float]  # STAGES -> busy share of the tier's workers
    busiest_link: str
    busiest_link_share: float
    dwpd: float  # drive writes per day at the trace's rate (NaN: not an SSD / no rating)
    dwpd_rating: float  # the profile's rating (0: not rated)
    wear_per_hour: float  # $ of drive endurance used per hour of the replay
    judged_blocks: float = math.nan  # the load the verdict below is taken on (blocks)
    load_s_idle: float = math.nan  # seconds to load them through the connector, idle path
    recompute_s: float = math.nan  # seconds the instance computes their tokens from scratch
    # read from the tier by storage prefetches into the tiers above (SGLang's prefetch at
    # arrival): those blocks reach HBM as loads of the tier they were prefetched into
    prefetched_gb: float = 0.0
    # seconds the tier's load workers spent on transfers, summed over the workers: each
    # transfer's span from its start to its last byte, queueing before it excluded (vLLM's
    # OffloadingConnector times each load job between CUDA events on its own stream and sums
    # them in vllm:kv_offload_load_time)
    load_busy_s: float = 0.0

    @property
    def net_loss(self) -> bool:
        """The tier's path is slower than recomputing: loading a typical hit takes longer
        than computing its tokens again (a full hit is then slower than a cold prefill)."""
        return self.load_s_idle > self.recompute_s

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


def load_vs_recompute(
    tiers: TierConfig, timing: np.ndarray, block_tokens: int, t: int, blocks: float, inst: int = 0
) -> tuple[float, float]:
    """(seconds to load ``blocks`` blocks from tier ``t`` into instance ``inst`` through the
    tier's connector on an idle path, seconds the instance takes to compute their tokens with no
    prefix): the two sides of the net-loss verdict, from the formulas both engines run."""
    from kvtier.sim.timing import prefill_seconds
    from kvtier.sim.transfer import ops_of, path_estimate

    n = max(int(round(blocks)), 1)
    fin = path_estimate(
        0.0,
        n * tiers.block_bytes,
        ops_of(int(tiers.unit[t]), n, tiers.fragments, tiers.coalesce),
        float(tiers.rpc_s[t]),
        float(tiers.stream_bw[t, inst]),
        float(tiers.stage_bw[t, inst]),
        int(tiers.serial[t]),
        int(tiers.depth[t]),
        float(tiers.lat_s[t]),
        float(tiers.cap_bw[t]),
        tiers.gpu_path[t, inst],
        tiers.gpu_scale[t],
        tiers.link_bw_read,
        tiers.link_duplex,
        0,
        np.zeros(2 * max(tiers.n_links, 1)),
        np.zeros(2 * max(tiers.n_workers, 1)),
        int(tiers.w0[t, inst]),
        int(tiers.nw[t]),
    )
    return float(fin), float(prefill_seconds(n * block_tokens, 0, timing))


def tier_stats(
    tiers: TierConfig | None,
    raw: RawResult,
    arrival_s: np.ndarray,
    hardware: Hardware,
    *,
    timing: np.ndarray | None = None,
    block_tokens: int = 0,
    prompt_blocks: float = 0.0,
) -> list[TierStats]:
    """One :class:`TierStats` per lower tier (none without tiers). With ``timing`` (the
    instances' packed step-time array) and ``block_tokens``, each row carries the net-loss
    verdict, judged on the mean load from the tier or, when nothing loaded, on
    ``prompt_blocks`` (the mean prompt's full blocks)."""
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
        prefetched = 0.0
        if len(raw.tier_prefetched_blocks):
            prefetched = float(raw.tier_prefetched_blocks[t]) * tiers.block_bytes
        # the connector's load and store workers (each direction has its own; the load
        # workers are the first half of the replay's worker array)
        pools = sorted({int(w) for w in tiers.w0[t]})
        workers = 2 * int(tiers.nw[t]) * len(pools)
        load_busy = 0.0
        if len(raw.worker_busy_s):
            idx = np.add.outer(np.asarray(pools), np.arange(int(tiers.nw[t]))).ravel()
            load_busy = float(raw.worker_busy_s[idx].sum())
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
        judged, load_idle, recompute = math.nan, math.nan, math.nan
        if timing is not None and block_tokens > 0:
            judged = float(raw.loaded_blocks[from_t, t].mean()) if from_t.any() else prompt_blocks
            if judged >= 1:
                load_idle, recompute = load_vs_recompute(tiers, timing, block_tokens, t, judged)
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
                judged_blocks=judged,
                load_s_idle=load_idle,
                recompute_s=recompute,
                prefetched_gb=prefetched / 1e9,
                load_busy_s=load_busy,
            )
        )
    return rows
