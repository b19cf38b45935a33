"""The numba serving engine: validate and lay out arrays once, then one kernel call.

The kernel (:func:`kvtier.sim.nb.simulate_nb`) takes named tuples: the trace
(:class:`~kvtier.sim.nb.Requests`), the serving scalars (:class:`~kvtier.sim.nb.Params`), the
HBM pools, the lower tiers' pools, parameters and links (:mod:`kvtier.sim.nb_tiers`), and the
outputs. It does no bounds checks, so everything it indexes is checked here: the trace's own
invariants come from :class:`BlockedTrace`, the rest (dtypes, sizes of the configuration,
memory the per-instance maps need) below.

The per-block state (the per-instance prefix-cache maps and the lower-tier pools' block rows)
is kept in :data:`SCRATCH` between replays; see :class:`Scratch`.
"""

from __future__ import annotations

import math
import threading
from typing import NamedTuple

import numpy as np

from kvtier.cache.enums import BLK_LANES, NIL
from kvtier.cache.state import TierState, empty_block_row
from kvtier.errors import InputError, StallError
from kvtier.files import check_allocation
from kvtier.policy.registries import (
    KV_AWARE,
    LLMD_EPP,
    LOAD_RULES,
    ROUTERS,
    SCHEDULERS,
    VLLM_V0,
    VLLM_V1,
    WRITE_POLICIES,
)
from kvtier.sim.config import SimConfig
from kvtier.sim.faults import (
    FI_DEV,
    FI_NDEV,
    FI_POOL,
    FI_TIER,
    FT_AT,
    FT_UP,
    fault_arrays,
    lost_ids,
)
from kvtier.sim.nb import simulate_nb
from kvtier.sim.nb_hbm import AHEAD
from kvtier.sim.nb_state import DIRTY_SPAN, HbmPools, Outputs, Params, Requests
from kvtier.sim.nb_tiers import (
    LinkState,
    TierParams,
    TierPools,
    fill_rows_nb,
    no_faults,
    reset_dirty_rows_nb,
)
from kvtier.sim.result import RawResult, end_time, tbt_tail_counts
from kvtier.sim.routers.epp_index import index_geometry, index_keys
from kvtier.sim.routing import kv_route_weights
from kvtier.sim.slo import SloCheck
from kvtier.sim.steptime.pack import validate_timing
from kvtier.sim.tiers import (
    MAX_PATH,
    TierConfig,
    generated_bases,
    generated_costs,
    recompute_costs,
    window_id_space,
)
from kvtier.sim.timing import T_FRONTEND, T_FRONTEND_TOKEN
from kvtier.trace.blocked import BlockedTrace

# The cache map holds one int32 per (instance, block id); it is allocated lazily (calloc), but
# refuse sizes whose touched pages could exhaust memory. Slot counts stay far inside int32.
MAX_MAP_ENTRIES = 1 << 31
MAX_SLOTS = 1 << 30
MAX_CAP = (1 << 30) - AHEAD  # a free ring of 2 x capacity + AHEAD entries is indexed by int32
MAX_SEQS = 1 << 20
MAX_REFS = 1 << 31  # slot references of all requests (each request's blocks, summed)


def free_ring_length(capacity: int) -> int:
    """Entries of an instance's free ring in the kernel (:mod:`kvtier.sim.nb`).

    Twice the capacity plus the prefetch distance, so a compaction (dropping entries of free
    slots that hits have pinned) frees more than half the ring and stays rare. Any length
    above ``max(capacity, AHEAD)`` is correct; the tests shorten it to force compactions.
    """
    return 2 * capacity + AHEAD  # per-instance running-request tables are n_instances x max_seqs


class Scratch:
    """Large per-block arrays kept from one replay for the next replay of the same shape.

    A replay over millions of distinct blocks uses about 1 GB of per-block state: the
    per-instance prefix-cache maps (``instances x shared blocks`` int32) and, with lower tiers,
    one 16-byte row per block and pool. Allocated fresh, every page of it is faulted in and zeroed
    by the operating system on each replay, which took about a third of a warm replay with
    lower tiers; a kept array costs one pass of stores to reset (the map none: the kernel
    clears the entries it set). The HBM pools' arrays (slot records, free rings, each
    request's slots: tens of MB) are kept for the same reason: allocating and faulting them
    in cost about 1 ms a replay, 5% of a 1,000-request sample's. One array per role is kept,
    of the latest shape, so at most one configuration's worth of memory stays allocated. A
    replay that finds no fitting array (the first one, another shape, or another thread
    holding it) allocates its own, so concurrent replays never share an array.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._arrays: dict[str, np.ndarray] = {}

    def take(self, role: str, shape: tuple[int, ...], dtype: type) -> np.ndarray | None:
        """The kept array for ``role`` if it has this shape and dtype (it is then no longer
        kept: the caller owns it until :meth:`give`), else None (and a misfit is dropped)."""
        with self._lock:
            arr = self._arrays.pop(role, None)
        if arr is None or arr.shape != shape or arr.dtype != np.dtype(dtype):
            return None
        return arr

    def borrow(
        self,
        role: str,
        shape: tuple[int, ...],
        dtype: type,
        kept: dict[str, np.ndarray],
        *,
        zeros: bool = False,
    ) -> np.ndarray:
        """The kept array for ``role`` (see :meth:`take`), else a new one (``numpy.zeros``:
        pages zeroed on first touch, or uninitialised); recorded in ``kept`` for the caller
        to :meth:`give` back after a completed replay."""
        arr = self.take(role, shape, dtype)
        if arr is None:
            arr = np.zeros(shape, dtype=dtype) if zeros else np.empty(shape, dtype=dtype)
        kept[role] = arr
        return arr

    def give(self, role: str, arr: np.ndarray) -> None:
        """Keep ``arr`` for the next replay that needs ``role`` in its shape."""
        with self._lock:
            self._arrays[role] = arr

    def clear(self) -> None:
        """Free every kept array (the next replay allocates afresh)."""
        with self._lock:
            self._arrays.clear()

    def nbytes(self) -> int:
        """Bytes currently kept."""
        with self._lock:
            return sum(a.nbytes for a in self._arrays.values())


SCRATCH = Scratch()


def total_blocks(trace: BlockedTrace, block_tokens: int) -> np.ndarray:
    """Per request, ``ceil((input + max(output - 1, 0)) / B)`` HBM blocks (int64)."""
    tokens = trace.input_tokens + np.maximum(trace.output_tokens - 1, 0)
    return -(-tokens // block_tokens)


def kernel_blocks(tb: np.ndarray, capacity: int) -> np.ndarray:
    """``tb`` as the kernel takes it: a request that can never fit (more blocks than an
    instance holds) is rejected on arrival whatever its count, so its count is cut to
    ``capacity + 1``; the slot array (one entry per block of every request) then stays in
    proportion to what can be admitted, and a huge request costs no memory. Counts below 1
    (an overflowed token sum) are kept, for :func:`_check_counts` to refuse."""
    if len(tb) and int(tb.min()) < 1:
        return tb
    return np.minimum(tb, capacity + 1)


class KernelInputs(NamedTuple):
    """What :func:`kvtier.sim.nb.simulate_nb` takes, built and checked from a trace and a
    config (``kept``: scratch arrays to give back after a completed call)."""

    requests: Requests
    params: Params
    pools: HbmPools
    ts: TierPools
    tp: TierParams
    lk: LinkState
    out: Outputs
    kept: dict[str, np.ndarray]


def simulate_engine(
    trace: BlockedTrace, cfg: SimConfig, *, slo: SloCheck | None = None
) -> RawResult:
    """Replay ``trace`` with the numba kernel; same result as the reference simulator."""
    requests, params, pools, ts, tp, lk, out, kept = kernel_inputs(trace, cfg, slo=slo)
    simulate_nb(requests, params, pools, ts, tp, lk, out)
    for role, arr in kept.items():  # only after a completed call: the map is zero again
        SCRATCH.give(role, arr)
    if out.stats[4] >= 0:  # a replay that does not progress (the reference raises the same)
        stall_limit = trace.n_requests * int(params.capacity) * cfg.block_tokens
        raise StallError(
            int(out.stats[4]), int(out.stats[5]), float(out.stats[6]), stall_limit,
            behind_loads=bool(out.stats[7]),
        )  # fmt: skip
    early = bool(out.stats[1])
    return RawResult(
        first_token_s=out.first_token,
        finish_s=out.finish,
        hit_blocks=out.hit_blocks,
        instance=out.instance,
        busy_s=out.busy_s,
        n_iterations=int(out.stats[0]),
        extrapolated_iterations=int(out.stats[3]),
        early_stopped=early,
        end_s=end_time(out.finish, early, out.stats[2]),
        loaded_blocks=out.loaded_blocks,
        arrival_s=requests.arrival,
        preemptions=out.preemptions,
        preempted_tokens=out.preempted_tokens,
        decode_instance=out.decode_instance if cfg.n_prefill > 0 else None,
        kv_transfer_s=out.kv_transfer_s if cfg.n_prefill > 0 else None,
        tbt_tail_s=out.tbt_tail if cfg.track_tbt else None,
        decode_hit_blocks=out.decode_hit_blocks if cfg.n_prefill > 0 else None,
        **_tier_result(cfg.tiers, lk, out.load_s),
        **_fault_result(cfg, ts),
    )


def _swa_params(cfg: SimConfig, n_shared: int) -> tuple[int, int, int, int, int]:
    """vLLM's hybrid manager (``Params.swa_*``): the window, the pool blocks of a block's
    sliding-window copies (0: none, or prefix caching off), the copies a hit needs, where
    their map entries start, and the cap on that group's share of an admission's reserve."""
    blocks = int(cfg.swa_blocks) if cfg.prefix_caching and cfg.swa_window > 0 else 0
    need = max(1, -(-(int(cfg.swa_window) - 1) // cfg.block_tokens)) if blocks else 0
    off = cfg.n_instances * n_shared if need else 0
    return int(cfg.swa_window), blocks, need, off, int(cfg.swa_admission_blocks)


def kernel_inputs(
    trace: BlockedTrace, cfg: SimConfig, *, slo: SloCheck | None = None
) -> KernelInputs:
    """The kernel's inputs for replaying ``trace`` under ``cfg``, every array validated (no
    input can make the kernel read out of bounds)."""
    if trace.block_tokens != cfg.block_tokens:
        raise InputError(
            f"trace is blocked at B={trace.block_tokens} but the policy says B={cfg.block_tokens}"
        )
    n = trace.n_requests
    n_blocks = max(int(trace.n_blocks), 1)
    if cfg.n_instances < 1 or cfg.capacity_blocks < 1 or cfg.max_seqs < 1:
        raise ValueError("n_instances, capacity_blocks and max_seqs must be >= 1")
    if cfg.token_budget < 1 or not 0 <= cfg.router < len(ROUTERS) or cfg.affinity_overload < 0:
        raise ValueError(
            "token_budget >= 1, a router the kernel implements, affinity_overload >= 0"
        )
    caps, marks, timings, pool_of = _pool_params(cfg)
    cap = int(caps.max())  # the slot layout's stride: the largest instance's slots
    if cfg.scheduler not in SCHEDULERS.codes.values():
        raise ValueError("scheduler must be a known code")
    if cfg.max_seqs > MAX_SEQS:
        raise InputError(f"max_num_seqs {cfg.max_seqs} is above the supported {MAX_SEQS}")
    shared, n_shared = trace.shared_blocks  # computed once per trace, bounds by construction
    if maps_every_block(cfg.scheduler):
        # every block gets a map entry (its dense id, < n_blocks by BlockedTrace's checks)
        shared, n_shared = np.ascontiguousarray(trace.block_ids, dtype=np.int32), n_blocks
    n_shared = max(n_shared, 1)
    if cfg.n_instances * n_shared > MAX_MAP_ENTRIES:
        raise InputError(
            f"{cfg.n_instances} instances x {n_shared:,} blocks read more than once is too "
            "large a cache map; use a larger block size or fewer instances"
        )
    if cfg.n_instances * (cap + 1) > MAX_SLOTS or cap > MAX_CAP:
        raise InputError(
            f"{cfg.n_instances} instances x {cap:,} HBM blocks is too many "
            "slots; use a larger block size"
        )
    ring_len = free_ring_length(cap)
    if not (max(cap, AHEAD) < ring_len < 1 << 31):
        raise ValueError(f"free ring of {ring_len} entries for {cap} slots")
    tparams = timings[0]
    fit = int(caps.min())
    tb = kernel_blocks(total_blocks(trace, cfg.block_tokens), fit)
    n_refs = _check_counts(trace, cfg, tb, n_shared, ring_len)
    epp_ix = _epp_index(cfg, caps, shared, n_shared, trace)
    slo_on = slo is not None
    thr = slo.thresholds() if slo is not None else np.full(5, np.inf)
    lim = slo.limits(n) if slo is not None else np.ones(4, dtype=np.int64)
    costs, gen_base, n_ids = _block_ids_and_costs(trace, cfg, n_blocks, tparams)
    # the sliding-window copies' ids follow every prompt and generated id
    copies, win_need = cfg.tier_window
    costs, n_ids, win_off = window_id_space(costs, n_ids, copies)
    kept: dict[str, np.ndarray] = {}
    ts, tp, lk = _tier_state(cfg.tiers, n_ids, cfg.n_instances, costs, kept, gen_base)
    if cfg.tiers is not None:
        # (the tiers a storage prefetch at arrival alone reads, where one runs)
        tp = tp._replace(prefetch_at_arrival=cfg.tiers_read_at_arrival)
        if copies:
            tp = tp._replace(win_off=win_off, win_copies=copies, win_need=win_need)
    if cfg.faults:
        ts = ts._replace(**_fault_rows(cfg, n_ids, ts))
    pd_params = _pd_params(cfg, n_refs)
    if cfg.tiers is None and cfg.n_prefill > 0:
        lk = LinkState.zeros(cfg.pd.n_links, 0, 0)  # the P/D transfer's links alone
    if cfg.concurrency < 0:
        raise ValueError("concurrency must be >= 0")
    if cfg.round_size < 0 or (cfg.round_size and not cfg.concurrency):
        raise ValueError("round_size must be >= 0, and only with a closed loop")
    # a closed loop writes each request's send time over its trace time
    arrival = np.array(trace.arrival_s, dtype=np.float64)  # a copy, always writable
    requests = Requests(
        arrival,
        trace.input_tokens,
        trace.output_tokens,
        trace.block_offsets,
        trace.block_ids,
        shared,
        tb,
    )
    params = Params(
        cfg.n_instances,
        cap,
        ring_len,
        cfg.block_tokens,
        cfg.token_budget,
        cfg.max_seqs,
        cfg.router,
        cfg.affinity_overload,
        n_shared,
        tparams,
        timings,
        pool_of,
        caps,
        fit,
        slo_on,
        thr,
        lim,
        bool(cfg.prefix_caching),
        int(cfg.concurrency),
        int(cfg.round_size),
        float(cfg.kv_overlap_weight),
        _route_weights(cfg),
        _epp_weights(cfg),
        int(cfg.scheduler),
        marks,
        bool(cfg.track_tbt),
        *pd_params,
        *_swa_params(cfg, n_shared),
        *epp_ix,
        cfg.schedules_ahead,
        bool(cfg.polls_loads),
        bool(cfg.prefill_first),
        bool(cfg.defers_loading_hits),
        bool(cfg.shares_loading_hits),
        bool(cfg.prefetches_at_arrival),
        int(cfg.prefetch_min_blocks),
        int(cfg.prefetch_limit_tokens),
        int(cfg.prefetch_retry_passes),
        int(cfg.prefetch_retry_attempts),
        bool(cfg.refreshes_host_on_hbm_hit),
        bool(cfg.reserve_full_prompt),
        _epp_metrics_interval(cfg),
        _epp_metrics_every(cfg),
    )
    out = Outputs(
        first_token=np.full(n, np.nan),
        finish=np.full(n, np.nan),
        hit_blocks=np.zeros(n, dtype=np.int64),
        instance=np.full(n, -1, dtype=np.int64),
        busy_s=np.zeros(cfg.n_instances, dtype=np.float64),
        load_s=np.zeros(n),
        loaded_blocks=np.zeros((n, tp.n_tiers), dtype=np.int64),
        stats=np.array([0.0, 0.0, 0.0, 0.0, -1.0, -1.0, 0.0, 0.0]),
        preemptions=np.zeros(n, dtype=np.int64),
        preempted_tokens=np.zeros(n, dtype=np.int64),
        decode_instance=np.full(n, -1, dtype=np.int64),
        kv_transfer_s=np.zeros(n, dtype=np.float64),
        **_tbt_arrays(trace, cfg.track_tbt),
        decode_hit_blocks=np.zeros(n, dtype=np.int64),
    )
    # disaggregated: a second slot region holds the prefill slots of handed-over requests
    pools = _hbm_pools(
        cfg, cap, n_shared * (2 if params.swa_need else 1), ring_len,
        n_refs * (2 if cfg.n_prefill > 0 else 1), kept,
    )  # fmt: skip
    return KernelInputs(requests, params, pools, ts, tp, lk, out, kept)


def _block_ids_and_costs(
    trace: BlockedTrace, cfg: SimConfig, n_blocks: int, tparams: np.ndarray
) -> tuple[np.ndarray | None, np.ndarray | None, int]:
    """The lower tiers' GDSF recompute costs per block id (None: no tier uses GDSF), the
    generated blocks' id bases (None: no tier's connector stores them) and the ids in all."""
    costs = None
    gen_base = None
    n_ids = n_blocks
    if cfg.tiers is not None and cfg.tiers.stores_generated:
        gen_base = _generated_bases(trace, cfg.block_tokens, n_blocks)
        n_ids = int(gen_base[-1])
    if cfg.tiers is not None and "gdsf" in cfg.tiers.evictions:
        costs = recompute_costs(
            trace.block_offsets, trace.block_ids, n_blocks, cfg.block_tokens, *tparams[:3]
        )
        if gen_base is not None:
            costs = generated_costs(
                costs, gen_base, trace.input_tokens, cfg.block_tokens, *tparams[:3]
            )
    return costs, gen_base, n_ids


def _generated_bases(trace: BlockedTrace, block_tokens: int, n_blocks: int) -> np.ndarray:
    """The generated blocks' ids (:func:`kvtier.sim.tiers.generated_bases`), checked before
    the kernel indexes the pools' rows and its int32 buffer with them."""
    base = generated_bases(trace.input_tokens, trace.output_tokens, block_tokens, n_blocks)
    if len(base) != trace.n_requests + 1 or base[0] != n_blocks or np.any(np.diff(base) < 0):
        raise ValueError("generated block ids must follow the prompt ids, one range a request")
    if base[-1] >= 1 << 31:
        raise InputError(
            f"{int(base[-1]):,} prompt and generated blocks are too many ids; use a larger "
            "block size"
        )
    return base


def _fault_result(cfg: SimConfig, ts: TierPools) -> dict[str, tuple[np.ndarray, ...]]:
    if not cfg.faults:
        return {}
    return {"fault_lost_ids": lost_ids(ts.fault_i, ts.fault_lost, len(cfg.faults))}


def _fault_rows(cfg: SimConfig, n_blocks: int, ts: TierPools) -> dict[str, np.ndarray]:
    """The faults' rows (kvtier.sim.faults.fault_arrays), checked against the pools the
    kernel indexes."""
    fi, ft, lost = fault_arrays(cfg.faults, cfg.tiers, n_blocks)
    P = ts.meta.shape[0]
    if fi.shape[0] and (fi[:, FI_POOL].min() < 0 or fi[:, FI_POOL].max() >= P):
        raise ValueError("fault pools must lie in [0, n_pools)")
    if np.any(fi[:, FI_NDEV] < 1) or np.any(fi[:, FI_DEV] >= fi[:, FI_NDEV]):
        raise ValueError("fault devices must lie in [-1, devices)")
    if np.any(np.isnan(ft)) or np.any(ft[:, FT_UP] < ft[:, FT_AT]):
        raise ValueError("fault times must be numbers, back up no earlier than down")
    caps = cfg.tiers.capacity_blocks[fi[:, FI_TIER]] if fi.shape[0] else np.zeros(0)
    if np.any(np.minimum(caps, n_blocks) + 1 > lost.shape[1]):
        raise ValueError("the lost-block rows must hold a pool's blocks")
    return {"fault_i": fi, "fault_t": ft, "fault_lost": lost}


# the most intervals the TBT tails keep in all (8 bytes each): a tenth of the output tokens
MAX_TBT_ENTRIES = 1 << 31


def _tbt_arrays(trace: BlockedTrace, track: bool) -> dict[str, np.ndarray]:
    """The TBT-tail fields of :class:`Outputs` (kvtier.sim.nb_tbt): with ``track``, each
    request's slice of the interval heap (``tbt_tail_counts``, checked: 0 <= k <= L - 1, in
    all below :data:`MAX_TBT_ENTRIES`); empty arrays otherwise (the kernel reads none)."""
    n = trace.n_requests
    if not track:
        empty = np.zeros(0)
        return {
            "tbt_tail": empty,
            "tbt_heap": empty,
            "tbt_off": np.zeros(0, dtype=np.int64),
            "tbt_count": np.zeros(0, dtype=np.int64),
            "tbt_last": empty,
        }
    k = tbt_tail_counts(trace.output_tokens)
    if len(k) != n or (k < 0).any() or (k > np.maximum(trace.output_tokens - 1, 0)).any():
        raise ValueError("TBT tail counts must be 0 <= k <= output_tokens - 1 per request")
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(k, out=off[1:])
    if off[-1] > MAX_TBT_ENTRIES:
        raise InputError(
            f"{int(off[-1]):,} token intervals to keep for the TBT tails is too many; "
            "replay without tracking TBT or a shorter trace"
        )
    return {
        "tbt_tail": np.full(n, np.nan),
        "tbt_heap": np.zeros(int(off[-1])),
        "tbt_off": off,
        "tbt_count": np.zeros(n, dtype=np.int64),
        "tbt_last": np.zeros(n),
    }


def _pool_params(cfg: SimConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-instance HBM slots and watermarks, each pool's packed step times as rows of one
    array (zero-padded to the longest row) and each instance's row, checked: at least one slot
    per instance, ``0 <= watermark <= slots``, every row valid (its tables' lengths are in its
    own header, so the kernel never reads the padding), rows indexed in range."""
    caps = np.ascontiguousarray(cfg.instance_capacity(), dtype=np.int64)
    marks = np.ascontiguousarray(cfg.instance_watermark(), dtype=np.int64)
    if caps.shape != (cfg.n_instances,) or marks.shape != caps.shape:
        raise ValueError("one capacity and one watermark per instance")
    if int(caps.min()) < 1 or np.any(marks < 0) or np.any(marks > caps):
        raise ValueError("capacity_blocks must be >= 1 and 0 <= watermark_blocks <= capacity")
    rows = cfg.pool_timings()
    for row in rows:
        validate_timing(row)  # finite, positive rates; measured tables: grids and shapes
    width = max(r.size for r in rows)
    timings = np.zeros((len(rows), width), dtype=np.float64)
    for j, row in enumerate(rows):
        timings[j, : row.size] = row
    if len({(float(r[T_FRONTEND]), float(r[T_FRONTEND_TOKEN])) for r in rows}) != 1:
        raise ValueError("every pool has the same front-end costs")
    pool_of = np.zeros(cfg.n_instances, dtype=np.int64)
    if len(rows) > 1:
        pool_of[cfg.n_prefill :] = 1
    return caps, marks, timings, pool_of


def _pd_params(cfg: SimConfig, n_refs: int) -> tuple:
    """The disaggregation fields of :class:`Params`, checked: a prefill pool leaves at least
    one decode instance; the P/D paths index the links, whose bandwidths are finite and
    positive; costs are finite and non-negative (aggregated: typed placeholders the kernel
    never reads)."""
    n_pf = int(cfg.n_prefill)
    K = cfg.n_instances
    if not 0 <= n_pf < K or (n_pf > 0 and K < 2):
        raise InputError(
            f"prefill instances must be 0 (aggregated) or 1..{K - 1} of {K}, got {n_pf}"
        )
    pd = cfg.pd
    if n_pf == 0 or pd is None:
        if n_pf > 0:
            raise ValueError("a disaggregated configuration needs its P/D transfer (cfg.pd)")
        i3, f3 = np.full((1, 1, 1), -1, dtype=np.int64), np.ones((1, 1, 1))
        f1, i1 = np.ones(1), np.zeros(1, dtype=np.int64)
        return (0, i3, i3.copy(), f3, np.zeros((1, 1)), f1, f1, i1, 0, 1.0, 0, 1, 1, 0.0,
                np.inf, np.inf, 0, 1, 1, False, 1, 0, False)  # fmt: skip
    L = pd.n_links
    for name in ("path", "queue", "scale"):
        arr = getattr(pd, name)
        if arr.ndim != 3 or arr.shape[:2] != (K, K):
            raise ValueError(f"pd.{name} must have shape ({K}, {K}, P)")
    if pd.path.shape != pd.queue.shape or pd.path.shape != pd.scale.shape:
        raise ValueError("pd.path, pd.queue and pd.scale must have one shape")
    if pd.path.size and (pd.path.min() < -1 or pd.path.max() >= L):
        raise ValueError("P/D link indices must lie in [-1, n_links)")
    if not np.all(np.isin(pd.queue, (0, 1))) or not np.all(pd.scale > 0):
        raise ValueError("P/D queues are 0 or 1, link scales > 0")
    bws = (pd.link_bw_read, pd.link_bw_write)
    if any(len(b) != L or not np.all(np.isfinite(b)) or not np.all(b > 0) for b in bws):
        raise ValueError("P/D link bandwidths must be finite and > 0")
    if len(pd.link_duplex) != L or not np.all(np.isin(pd.link_duplex, (0, 1))):
        raise ValueError("link_duplex per link, 0 or 1")
    if cfg.tiers is not None and (
        cfg.tiers.n_links != L
        or not np.array_equal(cfg.tiers.link_bw_read, pd.link_bw_read)
        or not np.array_equal(cfg.tiers.link_bw_write, pd.link_bw_write)
        or not np.array_equal(cfg.tiers.link_duplex, pd.link_duplex)
    ):
        raise ValueError("the tiers and the P/D transfer must share one set of links")
    if pd.lat_s.shape != (K, K) or not np.all(np.isfinite(pd.lat_s)) or np.any(pd.lat_s < 0):
        raise ValueError("P/D latencies must be finite and >= 0, one per instance pair")
    costs = (pd.rpc_s, pd.block_bytes)
    rates = (pd.stream_bw, pd.stage_bw)
    if not all(math.isfinite(c) and c >= 0 for c in costs) or not all(r > 0 for r in rates):
        raise ValueError("P/D per-operation cost and block bytes finite >= 0, rates > 0")
    if pd.unit not in (0, 1, 2) or pd.serial not in (0, 1) or min(pd.depth, pd.workers) < 1:
        raise ValueError("P/D unit, ordering, depth and workers out of range")
    if min(pd.fragments, pd.coalesce, pd.layers) < 1:
        raise ValueError("P/D fragments, coalesce and layers must be >= 1")
    return (
        n_pf,
        np.ascontiguousarray(pd.path, dtype=np.int64),
        np.ascontiguousarray(pd.queue, dtype=np.int64),
        np.ascontiguousarray(pd.scale, dtype=np.float64),
        np.ascontiguousarray(pd.lat_s, dtype=np.float64),
        np.ascontiguousarray(pd.link_bw_read, dtype=np.float64),
        np.ascontiguousarray(pd.link_bw_write, dtype=np.float64),
        np.ascontiguousarray(pd.link_duplex, dtype=np.int64),
        int(L),
        float(pd.block_bytes),
        int(pd.unit),
        int(pd.fragments),
        int(pd.coalesce),
        float(pd.rpc_s),
        float(pd.stream_bw),
        float(pd.stage_bw),
        int(pd.serial),
        int(pd.depth),
        int(pd.workers),
        bool(pd.layerwise),
        int(pd.layers),
        int(n_refs),
        bool(pd.decode_hit and not pd.layerwise),
    )


def _route_weights(cfg: SimConfig) -> np.ndarray:
    """The kv_aware router's tier weights (:func:`kvtier.sim.routing.kv_route_weights`), one
    finite value in [0, 1] per tier and instance; ``(1, 1)`` zeros when unused (a typed array
    the kernel never reads)."""
    if not (np.isfinite(cfg.kv_overlap_weight) and cfg.kv_overlap_weight >= 0):
        raise InputError(f"kv_overlap_weight must be finite and >= 0, got {cfg.kv_overlap_weight}")
    if cfg.router != KV_AWARE or cfg.tiers is None:
        return np.zeros((1, 1), dtype=np.float64)
    w = np.ascontiguousarray(kv_route_weights(cfg), dtype=np.float64)
    if w.shape != (cfg.tiers.n_tiers, cfg.n_instances) or not np.all((w >= 0) & (w <= 1)):
        raise ValueError("kv_aware tier weights must be in [0, 1], one per tier and instance")
    return w


def _epp_weights(cfg: SimConfig) -> np.ndarray:
    """The llmd_epp router's six scorer weights, each finite and >= 0."""
    w = np.array(cfg.epp_weights, dtype=np.float64)
    if w.shape != (6,) or not np.all(np.isfinite(w) & (w >= 0)):
        raise InputError(f"epp_weights must be six finite numbers >= 0, got {cfg.epp_weights}")
    return w


def _epp_metrics_interval(cfg: SimConfig) -> float:
    """The EPP's scrape interval for llmd_epp (0 for other routers: nothing is recorded)."""
    dt = float(cfg.epp_metrics_interval_s)
    if not (np.isfinite(dt) and dt >= 0.0):
        raise InputError(
            f"epp_metrics_interval_s must be a finite number >= 0, got {cfg.epp_metrics_interval_s}"
        )
    return dt if cfg.router == LLMD_EPP else 0.0


def _epp_metrics_every(cfg: SimConfig) -> int:
    """How many decode steps an instance runs between two metrics reports (>= 1)."""
    every = int(cfg.epp_metrics_decode_every)
    if every < 1 or every != cfg.epp_metrics_decode_every:
        raise InputError(
            "epp_metrics_decode_every must be a whole number >= 1, got "
            f"{cfg.epp_metrics_decode_every}"
        )
    return every


def _epp_index(
    cfg: SimConfig, caps: np.ndarray, shared: np.ndarray, n_shared: int, trace: BlockedTrace
) -> tuple:
    """The kernel's ``epp_ix``, ``ix_cap``, ``ix_koff``, ``ix_key``, ``ix_nodes`` and
    ``ix_log``: the llmd_epp router's approximate indexes when it reads them
    (kvtier.sim.routers.epp_index), else none."""
    n = trace.n_requests
    if cfg.router != ROUTERS.codes["llmd_epp"] or not cfg.epp_index:
        return (
            False,
            np.ones(2 * cfg.n_instances, dtype=np.int64),
            np.zeros((2, n + 1), dtype=np.int64),
            np.full((2, 1), -1, dtype=np.int32),
            1,
            1,
        )
    if len(cfg.epp_index) != 5 or not all(
        isinstance(v, int) and 0 <= v < 1 << 40 for v in cfg.epp_index
    ):
        raise InputError(f"epp_index must be five integers >= 0, got {cfg.epp_index}")
    if min(cfg.epp_index[2:]) < 1:
        raise InputError(
            f"epp_index: CPU entries, tokens per CPU entry and hashed tokens must be >= 1, "
            f"got {cfg.epp_index}"
        )
    bpt = cfg.epp_bytes_per_token
    if not (isinstance(bpt, float) and 0.0 < bpt <= 64.0):
        raise InputError(f"epp_bytes_per_token must be a float in (0, 64], got {bpt!r}")
    g = index_geometry(cfg.epp_index, caps, cfg.block_tokens, bpt)
    # each request is routed once and adds its hashed entries: the logs' length
    koff, keys, n_keys = index_keys(
        g, shared, n_shared, trace.block_offsets, trace.input_tokens, cfg.block_tokens
    )
    log = int(koff[:, -1].max())
    nodes = cfg.n_instances * n_keys
    if nodes >= 1 << 30 or log >= 1 << 30:
        raise InputError(
            f"{cfg.n_instances} instances x {n_keys:,} keys, {log:,} index entries is too "
            "large an EPP index; use a larger block size",
            option="serving.epp_prefix_source",
        )
    check_allocation(
        2 * (nodes + 2 * log) * 4.0,
        f"the EPP's prefix indexes over {nodes:,} nodes and {log:,} entries",
        option="serving.epp_prefix_source",
    )
    return (
        True,
        np.ascontiguousarray(g.caps.reshape(-1)),
        koff,
        keys,
        max(nodes, 1),
        max(log, 1),
    )


def _check_counts(
    trace: BlockedTrace, cfg: SimConfig, tb: np.ndarray, n_shared: int, ring_len: int
) -> int:
    """Every count derived from the trace and the configuration, checked before the kernel
    indexes with it; the number of slot references (the sum of ``tb``) returned.

    Each request's block count (cut by :func:`kernel_blocks`) must be positive, their sum (the
    length of the per-request slot array, indexed by int64 offsets into int32 slots) must stay
    below 2^31, and the memory the replay's arrays take must fit the machine: a count that is
    negative or overflowed would otherwise make the kernel write outside its arrays, and a
    huge one end in ``MemoryError`` or "negative dimensions" instead of a one-line error.
    """
    if len(tb) and (int(tb.min()) < 1 or int(tb.max()) > MAX_SLOTS):
        row = int(np.argmax((tb < 1) | (tb > MAX_SLOTS)))
        raise InputError(
            f"request {row} has {int(trace.input_tokens[row]):,} input and "
            f"{int(trace.output_tokens[row]):,} output tokens, {int(tb[row]):,} blocks of "
            f"{cfg.block_tokens}: outside [1, {MAX_SLOTS:,}]; token counts are at most 2^30"
        )
    n_refs = int(tb.sum(dtype=np.int64))
    if not 0 <= n_refs < MAX_REFS:
        raise InputError(
            f"the trace's requests hold {n_refs:,} blocks of {cfg.block_tokens} tokens in all, "
            f"above the {MAX_REFS:,} one replay can track; use a larger block size or replay a "
            "slice (kvtier trace slice)"
        )
    need = replay_bytes(trace, cfg, n_shared, ring_len, n_refs)
    have = physical_memory()
    if have and need > have:
        raise InputError(
            f"this replay needs about {need / 1e9:,.1f} GB of memory, more than the "
            f"{have / 1e9:,.1f} GB this machine has; use a larger block size, fewer instances "
            "or smaller tiers, or replay a sample (kvtier trace sample)"
        )
    return n_refs


def replay_bytes(
    trace: BlockedTrace, cfg: SimConfig, n_shared: int, ring_len: int, n_refs: int
) -> int:
    """Bytes of the arrays one numba replay allocates (the cache map counted in full, although
    its untouched pages cost nothing; twice with sliding-window copies)."""
    n, inst = trace.n_requests, cfg.n_instances
    n_slots = inst * int(cfg.instance_capacity().max())
    maps = 2 if cfg.prefix_caching and cfg.swa_window > 0 and cfg.swa_blocks > 0 else 1
    maps += 1 if cfg.defers_loading_hits else 0  # the blocks being loaded, counted alike
    maps += 2 if cfg.shares_loading_hits else 0  # their arrival times (8 bytes each)
    total = 4 * inst * n_shared * maps + 24 * n_slots + 4 * (inst + 1) * ring_len
    total += 4 * n_refs * (2 if cfg.n_prefill > 0 else 1)  # slots (and held prefill slots)
    tiers = cfg.tiers
    n_tiers = 0 if tiers is None else tiers.n_tiers
    total += n * (8 * 6 + 8 * n_tiers)  # outputs
    if tiers is not None:
        n_ids = max(int(trace.n_blocks), 1)
        if tiers.stores_generated:  # the generated blocks' ids (generated_bases)
            B = cfg.block_tokens
            out = np.maximum(np.asarray(trace.output_tokens, dtype=np.int64) - 1, 0)
            inp = np.asarray(trace.input_tokens, dtype=np.int64)
            n_ids += int(np.maximum((inp + out) // B - inp // B, 0).sum())
        per_block = 24 if tiers.when_stored_flags().any() else 16  # (+ when each was stored)
        total += tiers.n_pools * n_ids * per_block
    return int(total)


def physical_memory() -> int:
    """Bytes of memory of this machine (0 when the platform does not say)."""
    import os

    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def maps_every_block(scheduler: int) -> bool:
    """Whether the prefix-cache map needs an entry for every block, not only for those read
    twice: under the schedulers that preempt, a preempted request looks its own blocks up
    again."""
    return scheduler in (VLLM_V1, VLLM_V0)


def _hbm_pools(
    cfg: SimConfig,
    cap: int,
    n_shared: int,
    ring_len: int,
    n_refs: int,
    kept: dict[str, np.ndarray],
) -> HbmPools:
    """The kernel's HBM pool arrays, kept between replays of the same shape. The map is all
    zero (new: calloc; kept: the kernel clears what it set); the kernel sets every entry of
    the others that it reads."""
    n_slots = cfg.n_instances * cap  # cap: the largest instance's slots (the stride)
    return HbmPools(
        slot_of=SCRATCH.borrow(
            "slot_of", (cfg.n_instances * n_shared,), np.int32, kept, zeros=True
        ),
        records=SCRATCH.borrow("slot_records", (4 * n_slots,), np.int32, kept),
        stamps=SCRATCH.borrow("stamps", (n_slots,), np.int64, kept),
        rings=SCRATCH.borrow("free_rings", ((cfg.n_instances + 1) * ring_len,), np.int32, kept),
        slots=SCRATCH.borrow("slots", (n_refs,), np.int32, kept),
        # new for each replay, zero pages touched only where a load marks a block
        loading=np.zeros(cfg.n_instances * n_shared if cfg.defers_loading_hits else 1, np.int32),
        loading_until=np.zeros(cfg.n_instances * n_shared if cfg.shares_loading_hits else 1),
    )


def _tier_state(
    tiers: TierConfig | None,
    n_blocks: int,
    n_instances: int,
    costs: np.ndarray | None = None,
    kept: dict[str, np.ndarray] | None = None,
    gen_base: np.ndarray | None = None,
) -> tuple[TierPools, TierParams, LinkState]:
    """The lower tiers as the kernel takes them: pools, parameters and link state.

    Without tiers, each is its empty value (``n_tiers`` 0). Each pool is a cache-engine
    :class:`TierState`; their arrays are stacked on a leading pool axis. Per-block arrays that
    only LFU and GDSF read are one element wide when no pool uses those policies, so LRU /
    FIFO / S3-FIFO / Sieve tiers cost 16 bytes per block and pool. The per-block arrays come
    from :data:`SCRATCH` when it holds them in this shape, and are added to ``kept`` (role ->
    array) for the caller to hand back after the replay.
    """
    if tiers is None:
        return TierPools.empty(), TierParams.empty(n_instances), LinkState.zeros(0, 0)
    _check_tiers(tiers, n_instances)
    if tiers.n_pools * n_blocks * 24 > (1 << 40):
        raise InputError(f"{tiers.n_pools} lower-tier pools x {n_blocks:,} blocks is too large")
    specs = []  # (policy, capacity) per pool, pools in TierConfig order
    for t in range(tiers.n_tiers):
        specs += [(tiers.evictions[t], int(tiers.capacity_blocks[t]))] * int(tiers.pool_count[t])
    # Scalars from the cache engine's own constructor (an empty id space costs nothing); the
    # per-block arrays are allocated here once, stacked, instead of per pool and then copied.
    empty = [TierState.create(policy, cap, 0) for policy, cap in specs]
    wide = any(e.policy.base in ("lfu", "gdsf") for e in empty)
    width = n_blocks if wide else 1
    heap_len = max(min(cap, n_blocks) + 1 for _, cap in specs) if wide else 1
    P = len(specs)
    meta = np.stack([e.meta for e in empty])
    fmeta = np.stack([e.fmeta for e in empty])
    kept = {} if kept is None else kept

    def filled(role: str, shape: tuple[int, ...], dtype: type, value: float) -> np.ndarray:
        arr = SCRATCH.borrow(role, shape, dtype, kept)
        arr.fill(value)
        return arr

    blk, dirty = _block_rows(P, n_blocks, kept)
    prio = filled("prio", (P, width), np.float64, 0.0)
    stamp = filled("stamp", (P, width), np.int64, 0)
    hpos = filled("hpos", (P, width), np.int32, NIL)
    cost = filled("cost", (P, width), np.float64, 1.0)
    if costs is not None:  # GDSF pools read them (recompute seconds per block)
        cost[:] = costs[:width]
    heap = filled("heap", (P, heap_len), np.int32, 0)
    selective = tiers.counts_sightings
    sightings = filled("sightings", (n_blocks if selective else 1,), np.int64, 0)
    when_stored = tiers.when_stored_flags()
    if when_stored.shape != (tiers.n_tiers,):
        raise ValueError("visible_when_stored must have one entry per tier")
    # when each pool's copy of a block was stored: only a tier that shows copies once stored
    # reads it (8 bytes per block and pool, zero: never written in this replay)
    stored_at = (
        filled("stored_at", (P, n_blocks), np.float64, 0.0)
        if when_stored.any()
        else np.zeros((0, 0), dtype=np.float64)
    )
    ts = TierPools(
        meta, fmeta, blk, prio, stamp, heap, hpos, cost, sightings, *no_faults(), dirty,
        stored_at,
    )  # fmt: skip
    tp = TierParams(
        n_tiers=tiers.n_tiers,
        per_host=tiers.per_host,
        pool_base=tiers.pool_base,
        pool_local=tiers.pool_local,
        lat_s=tiers.lat_s,
        cap_bw=tiers.cap_bw,
        rpc_s=tiers.rpc_s,
        stream_bw=tiers.stream_bw,
        stage_bw=tiers.stage_bw,
        serial=tiers.serial,
        depth=tiers.depth,
        unit=tiers.unit,
        layerwise=tiers.layerwise,
        store_blocks=tiers.store_blocks,
        w0=tiers.w0,
        nw=tiers.nw,
        link_bw_read=tiers.link_bw_read,
        link_bw_write=tiers.link_bw_write,
        link_duplex=tiers.link_duplex,
        gpu_path=tiers.gpu_path,
        gpu_scale=tiers.gpu_scale,
        casc_path=tiers.casc_path,
        casc_scale=tiers.casc_scale,
        n_links=int(tiers.n_links),
        write_policy=int(tiers.write_policy),
        cascade=tiers.cascade,
        counts_sightings=tiers.counts_sightings,
        selective_k=int(tiers.selective_k),
        exclusive=bool(tiers.exclusive),
        load_rule=int(tiers.load_rule),
        batch_waits=bool(tiers.batch_waits),
        fragments=int(tiers.fragments),
        coalesce=int(tiers.coalesce),
        layers=int(tiers.layers),
        block_bytes=float(tiers.block_bytes),
        store_generated=(
            tiers.store_generated
            if tiers.store_generated is not None
            else np.zeros(tiers.n_tiers, dtype=np.bool_)
        ),
        gen_base=gen_base if gen_base is not None else np.zeros(0, dtype=np.int64),
        load_fills_upper=(
            tiers.load_fills_upper
            if tiers.load_fills_upper is not None
            else np.zeros(tiers.n_tiers, dtype=np.bool_)
        ),
        prefetch_at_arrival=(
            tiers.prefetch_at_arrival
            if tiers.prefetch_at_arrival is not None
            else np.zeros(tiers.n_tiers, dtype=np.bool_)
        ),
        when_stored=when_stored,
        **_device_params(tiers),
        **_shed_params(tiers),
    )
    return ts, tp, LinkState.zeros(tiers.n_links, tiers.n_tiers, tiers.n_workers)


def _shed_params(tiers: TierConfig) -> dict[str, np.ndarray]:
    """The pools' batch-eviction rules of :class:`TierParams`, checked: one per tier, a
    watermark in (0, 1] and a ratio in [0, 1] (kvtier.cache.watermark)."""
    high, ratio = tiers.shed_rules()
    if high.shape != (tiers.n_tiers,) or ratio.shape != (tiers.n_tiers,):
        raise ValueError("evict_high and evict_ratio must have one entry per tier")
    if not (np.all(high > 0.0) and np.all(high <= 1.0)):
        raise ValueError("evict_high must lie in (0, 1]")
    if not (np.all(ratio >= 0.0) and np.all(ratio <= 1.0)):
        raise ValueError("evict_ratio must lie in [0, 1]")
    return {"evict_high": high, "evict_ratio": ratio}


def _device_params(tiers: TierConfig) -> dict[str, np.ndarray]:
    """The device queues of :class:`TierParams`, checked: every device link a transfer can
    name lies among the links (``device_link0[p] + devices[t] - 1 < n_links``)."""
    blocks, devs, link0 = tiers.device_queues()
    blocks = np.ascontiguousarray(blocks, dtype=np.int64)
    devs = np.ascontiguousarray(devs, dtype=np.int64)
    link0 = np.ascontiguousarray(link0, dtype=np.int64)
    if blocks.shape != (tiers.n_tiers,) or devs.shape != (tiers.n_tiers,):
        raise ValueError("device_blocks and devices must have one entry per tier")
    if link0.shape != (tiers.n_pools,):
        raise ValueError("device_link0 must have one entry per pool")
    for t in range(tiers.n_tiers):
        if blocks[t] < 0 or devs[t] < 1:
            raise ValueError(f"tier {t}: device_blocks must be >= 0 and devices >= 1")
        if blocks[t] == 0:
            continue
        for p in range(int(tiers.pool_base[t]), int(tiers.pool_base[t] + tiers.pool_count[t])):
            if link0[p] < 0 or link0[p] + devs[t] > tiers.n_links:
                raise ValueError(f"tier {t} pool {p}: device links outside the links")
    return {"dev_blocks": blocks, "devices": devs, "dev_link0": link0}


def _block_rows(
    n_pools: int, n_blocks: int, kept: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Every pool's block rows ``(P, n_blocks, BLK_LANES)``, empty, and their dirty flags
    ``(P, spans)`` (:class:`TierPools`), all clear: views of one buffer, kept in
    :data:`SCRATCH` as one array so the flags always describe the rows they are kept with.

    Kept from a completed replay, only the spans of ids that replay flagged are reset (a
    replay behind 16 per-engine pools of millions of ids touches a small part of each); new,
    every row is written once (one pass of stores, faulting the pages in)."""
    row_bytes = n_pools * n_blocks * BLK_LANES * 4
    spans = -(-n_blocks // DIRTY_SPAN)
    shape = (row_bytes + n_pools * spans,)
    buf = SCRATCH.take("blk_rows", shape, np.uint8)
    fresh = buf is None
    if fresh:
        buf = np.empty(shape, dtype=np.uint8)
    kept["blk_rows"] = buf
    blk = buf[:row_bytes].view(np.int32).reshape(n_pools, n_blocks, BLK_LANES)
    dirty = buf[row_bytes:].reshape(n_pools, spans)
    row = empty_block_row()
    if fresh:
        fill_rows_nb(blk.reshape(-1, BLK_LANES), row)
        dirty.fill(0)
    else:
        reset_dirty_rows_nb(blk, dirty, row)
    return blk, dirty


def _check_tiers(c: TierConfig, n_instances: int) -> None:
    """Everything the tier kernels index or divide by, checked once (they check nothing)."""
    T, L = c.n_tiers, c.n_links
    if len(c.inst_host) != n_instances or n_instances > L:
        raise ValueError("tier configuration was built for another instance count")
    if c.inst_host.min() < 0 or c.inst_host.max() >= c.n_hosts:
        raise ValueError("inst_host must lie in [0, n_hosts)")
    pools = np.asarray(c.pool_count)
    if len(pools) != T or np.any(pools < 1):
        raise ValueError("pool_count must give each tier at least one pool")
    if not np.array_equal(c.pool_base, np.concatenate([[0], np.cumsum(pools)[:-1]])):
        raise ValueError("pool_base must number the pools of each tier consecutively")
    if int(pools.sum()) != c.n_pools or np.any(c.capacity_blocks < 0):
        raise ValueError("n_pools must match the tiers and hosts; capacities >= 0")
    if (
        c.pool_local.shape != (T, n_instances)
        or np.any(c.pool_local < 0)
        or np.any(c.pool_local >= pools[:, None])
    ):
        raise ValueError("pool_local must name one of its tier's pools for every instance")
    K = n_instances
    shapes = {
        "gpu_path": (c.gpu_path, (T, K, MAX_PATH)),
        "casc_path": (c.casc_path, (T, K, MAX_PATH)),
        "gpu_scale": (c.gpu_scale, (T, MAX_PATH)),
        "casc_scale": (c.casc_scale, (T, MAX_PATH)),
        "stream_bw": (c.stream_bw, (T, K)),
        "stage_bw": (c.stage_bw, (T, K)),
        "w0": (c.w0, (T, K)),
    }
    for name, (arr, shape) in shapes.items():
        if arr.shape != shape:
            raise ValueError(f"{name} must have shape {shape}")
    for arr in (c.gpu_path, c.casc_path):
        if arr.size and (arr.min() < -1 or arr.max() >= L):
            raise ValueError("link indices must lie in [-1, n_links)")
    if T and (c.gpu_path[:, :, 0].min() < 0 or c.gpu_path[:, :, 2].min() < 0):
        raise ValueError("every path to a tier crosses PCIe and a port")
    for arr in (c.lat_s, c.rpc_s):
        if len(arr) != T or not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise ValueError("per-operation costs and latencies must be finite and >= 0")
    for arr in (c.cap_bw, c.stream_bw, c.stage_bw, c.gpu_scale, c.casc_scale):
        if not np.all(arr > 0):
            raise ValueError("bandwidths, caps and link scales must be > 0")
    if len(c.serial) != T or not np.all(np.isin(c.serial, (0, 1))):
        raise ValueError("serial must be 0 or 1 per tier")
    if len(c.depth) != T or np.any(c.depth < 1) or len(c.nw) != T or np.any(c.nw < 1):
        raise ValueError("depth and workers must be >= 1")
    if len(c.store_blocks) != T or c.store_blocks.dtype != np.bool_:
        raise ValueError("store_blocks must be one bool per tier")
    gen = c.store_generated
    if gen is not None and (len(gen) != T or gen.dtype != np.bool_):
        raise ValueError("store_generated must be one bool per tier")
    for name in ("load_fills_upper", "prefetch_at_arrival"):
        per_tier = getattr(c, name)
        if per_tier is not None and (len(per_tier) != T or per_tier.dtype != np.bool_):
            raise ValueError(f"{name} must be one bool per tier")
    if len(c.unit) != T or not np.all(np.isin(c.unit, (0, 1, 2))) or len(c.layerwise) != T:
        raise ValueError("unit must be a known operation unit per tier")
    if T and (c.w0.min() < 0 or np.max(c.w0 + c.nw[:, None]) > c.n_workers):
        raise ValueError("worker pools must lie in [0, n_workers)")
    bws = (c.link_bw_read, c.link_bw_write)
    if any(len(b) != L or not np.all(np.isfinite(b)) or not np.all(b > 0) for b in bws):
        raise ValueError("link bandwidths must be finite and > 0")
    if len(c.link_duplex) != L or not np.all(np.isin(c.link_duplex, (0, 1))):
        raise ValueError("link_duplex per link, 0 or 1")
    if c.fragments < 1 or c.coalesce < 1 or c.selective_k < 1 or c.layers < 1:
        raise ValueError("fragments, coalesce, selective_k and layers >= 1")
    if not (math.isfinite(c.block_bytes) and c.block_bytes > 0):
        raise ValueError("block_bytes must be finite and > 0")
    if not (0 <= c.write_policy < len(WRITE_POLICIES) and 0 <= c.load_rule < len(LOAD_RULES)):
        raise ValueError("a write policy and a load rule the kernels dispatch required")


def _tier_result(tiers: TierConfig | None, lk: LinkState, load_s: np.ndarray) -> dict:
    if tiers is None:
        return {}
    return {
        "tier_hit_blocks": lk.tier_hits,
        "tier_prefetched_blocks": lk.prefetched,
        "tier_bytes_read": lk.bytes_read,
        "tier_bytes_written": lk.bytes_written,
        "link_busy_s": lk.busy,
        "link_bytes": lk.moved,
        "worker_busy_s": lk.wbusy,
        "stage_s": lk.stage,
        "load_s": load_s,
    }
