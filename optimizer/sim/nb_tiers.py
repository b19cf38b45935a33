"""Numba kernels of the tiers below HBM: the rules of :mod:`kvtier.sim.reference_tiers`.

State is passed as three named tuples of arrays so the serving kernel can hand them on
unchanged (numba compiles a ``NamedTuple`` as a plain tuple: a field is read by its name at
no cost):

- :class:`TierPools` (``ts``): the stacked cache-engine state of every pool, each array with
  a leading pool axis (``ts.blk[p]`` is pool ``p``'s block rows, which the cache engine's
  primitives in :mod:`kvtier.cache.nb` take unchanged), and the per-block sightings of
  ``write_through_selective``;
- :class:`TierParams` (``tp``): read-only wiring, costs and policy switches;
- :class:`LinkState` (``lk``): the links' FIFO state and the per-link and per-tier counters.

Without lower tiers each is its ``empty`` value (``n_tiers`` 0, zero-length arrays of the
same types), so the serving kernel compiles once for both cases and never calls in here.

No bounds checks: :mod:`kvtier.sim.engine` builds and checks every array.

Counts handed to another kernel are wrapped in ``np.int64(...)``: numba compiles a separate
specialisation of the callee for an argument typed as a literal (a constant, or a counter
that starts at 0), and each specialisation of :func:`write_down_nb` carries an inlined copy
of every eviction policy, so literals there cost compile time and nothing else.

The per-block helpers (pool choice, residency, touch, insert) are inlined into their callers
(``inline="always"``). A call between two kernels passes each array of the three tuples as
separate machine words, about 220 of them; with one such call per block copied below, the
argument copying was most of a replay's time. Inlined, the only per-block call left is the
cache engine's ``access_nb`` (one pool's eight arrays).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
import kvtier.sim.write_policies.dispatch  # noqa: F401  (its sources, for kvtier.jitcache)
from kvtier.cache.enums import L_WHERE, M_CAPACITY, M_POLICY, M_SIZE, W_MAIN, W_SMALL
from kvtier.cache.nb import access_as_nb, discard_nb, evict_one_nb
from kvtier.cache.nb_state import TierArrays
from kvtier.cache.watermark import shed_count
from kvtier.sim.fault_step import fault_down_nb
from kvtier.sim.faults import N_FI, N_FT
from kvtier.sim.gen import WRITE_POLICY_FAMILY, twin
from kvtier.sim.nb_state import DIRTY_SPAN, INNER, ONE, ZERO
from kvtier.sim.steptime.jit import prefill_seconds_nb
from kvtier.sim.transfer import (
    device_link,
    layerwise_ready,
    ops_of,
    path_estimate,
    path_transfer,
)

transfer_nb = njit(cache=True, nogil=True, _nrt=False, **INNER)(path_transfer)
estimate_nb = njit(cache=True, nogil=True, _nrt=False, **INNER)(path_estimate)
ops_of_nb = njit(cache=True, nogil=True, **INNER)(ops_of)
layerwise_ready_nb = njit(cache=True, nogil=True, **INNER)(layerwise_ready)
device_link_nb = njit(cache=True, nogil=True, _nrt=False, **INNER)(device_link)
shed_count_nb = njit(cache=True, nogil=True, **INNER)(shed_count)
# the write policies' dispatch (kvtier.sim.gen; plug-ins from outside the package extend it)
chosen_nb = twin(WRITE_POLICY_FAMILY)


def no_faults() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fault rows of a replay without faults."""
    return (
        np.zeros((0, N_FI), dtype=np.int64),
        np.zeros((0, N_FT), dtype=np.float64),
        np.zeros((0, 1), dtype=np.int32),
    )


class Refs(NamedTuple):
    """A request's prompt blocks ``j0:j1``: references ``bo + j0 .. bo + j1`` of ``ids``."""

    ids: np.ndarray  # i4: the trace's block ids (Requests.block_ids)
    bo: int  # the request's first reference (Requests.block_offsets[i])
    j0: int
    j1: int


class Prefill(NamedTuple):
    """The prefill a request has left once loaded: ``q`` tokens after ``ctx`` tokens of KV, on
    its instance's step times ``timing``."""

    q: int
    ctx: int
    timing: np.ndarray  # f8: packed step-time parameters (Params.timings[pool])


class TierPools(NamedTuple):
    """Every lower-tier pool's cache-engine arrays, stacked on a leading pool axis."""

    meta: np.ndarray  # i8 (P, meta lanes): policy code, capacity, size, list heads...
    fmeta: np.ndarray  # f8 (P, fmeta lanes)
    blk: np.ndarray  # i4 (P, n_blocks, BLK_LANES): one row per block and pool
    prio: np.ndarray  # f8 (P, w): LFU / GDSF priorities (w = 1 when no pool uses them)
    stamp: np.ndarray  # i8 (P, w)
    heap: np.ndarray  # i4 (P, heap length)
    hpos: np.ndarray  # i4 (P, w)
    cost: np.ndarray  # f8 (P, w): GDSF recompute seconds per block
    sightings: np.ndarray  # i8 (n_blocks or 1,): admissions that named each block (selective)
    # faults (kvtier.sim.faults, kvtier.sim.fault_step): one row per failed pool (F may be 0)
    fault_i: np.ndarray  # i8 (F, N_FI): pool, device, devices, loses blocks, state, lost...
    fault_t: np.ndarray  # f8 (F, N_FT): at, back up, rebuild seconds per block
    fault_lost: np.ndarray  # i4 (F, M): ids of the blocks each lost, ascending
    # u1 (P, ceil(n_blocks / DIRTY_SPAN)): 1 where a block of that span of ids was ever missed
    # in the pool. Every row the pool wrote belongs to such a block (a row changes only once
    # its block has been inserted), so the next replay on these arrays resets the flagged
    # spans' rows instead of every row (kvtier.sim.engine, "blk_rows").
    dirty: np.ndarray
    # f8 (P, n_blocks) when a tier shows copies once stored (TierParams.when_stored), else
    # (0, 0): when each pool's copy of a block was stored (0: never written this replay; inf
    # while the write that put it there is being timed)
    stored_at: np.ndarray

    @classmethod
    def empty(cls) -> TierPools:
        """No pool: the value the HBM-only replay passes."""
        i8, f8, i4 = np.int64, np.float64, np.int32
        z2 = np.zeros((0, 0), dtype=i8)
        f2 = np.zeros((0, 0), dtype=f8)
        i2 = np.zeros((0, 0), dtype=i4)
        blk = np.zeros((0, 0, 4), dtype=i4)
        return cls(
            z2, f2, blk, f2, z2, i2, i2, f2, np.zeros(0, dtype=i8), *no_faults(),
            np.zeros((0, 0), dtype=np.uint8), f2,
        )  # fmt: skip


class TierParams(NamedTuple):
    """The read-only facts of the lower tiers: wiring, connectors, policy switches
    (the fields of :class:`kvtier.sim.tiers.TierConfig` of the same names)."""

    n_tiers: int  # 0: HBM only
    per_host: np.ndarray  # bool (T,): one pool per host (else one shared pool)
    pool_base: np.ndarray  # i8 (T,): first pool of each tier
    pool_local: np.ndarray  # i8 (T, n_instances): the pool each instance reaches, from pool_base
    lat_s: np.ndarray  # f8 (T,): seconds per transfer
    cap_bw: np.ndarray  # f8 (T,): per-transfer bandwidth cap (inf: none)
    rpc_s: np.ndarray  # f8 (T,): worker seconds per operation
    stream_bw: np.ndarray  # f8 (T, n_instances): the store's stream rate (inf: none)
    stage_bw: np.ndarray  # f8 (T, n_instances): staging copy rate (inf: none)
    serial: np.ndarray  # i8 (T,)
    depth: np.ndarray  # i8 (T,)
    unit: np.ndarray  # i8 (T,)
    layerwise: np.ndarray  # bool (T,)
    store_blocks: np.ndarray  # bool (T,): the engine step waits for copies into the tier
    w0: np.ndarray  # i8 (T, n_instances)
    nw: np.ndarray  # i8 (T,)
    link_bw_read: np.ndarray  # f8 (L,)
    link_bw_write: np.ndarray  # f8 (L,)
    link_duplex: np.ndarray  # i8 (L,)
    gpu_path: np.ndarray  # i8 (T, n_instances, MAX_PATH)
    gpu_scale: np.ndarray  # f8 (T, MAX_PATH)
    casc_path: np.ndarray  # i8 (T, n_instances, MAX_PATH)
    casc_scale: np.ndarray  # f8 (T, MAX_PATH)
    n_links: int
    write_policy: int  # the write policy's registry code (kvtier.sim.write_policies)
    cascade: bool  # its trait: evicted blocks are copied into the next tier down
    counts_sightings: bool  # its trait: admissions count sightings (a hit may be copied down)
    selective_k: int  # sightings before write_through_selective copies a block
    exclusive: bool  # a loaded block leaves its tier (it moves up)
    load_rule: int  # the load rule's registry code (kvtier.sim.load_rules)
    batch_waits: bool  # load_wait = batch: no iteration while a running request loads
    fragments: int  # memory regions per block
    coalesce: int  # fragments per transfer operation
    layers: int  # model layers (layer-wise loading)
    block_bytes: float
    store_generated: np.ndarray  # bool (T,): a finished request's generated blocks go there
    # i8 (n_requests + 1,): request i's generated blocks have ids gen_base[i] .. gen_base[i+1]
    # - 1 (kvtier.sim.tiers.generated_bases); empty: no tier stores them
    gen_base: np.ndarray
    load_fills_upper: np.ndarray  # bool (T,): a block loaded from the tier fills those above
    # bool (T,): tiers only a storage prefetch at arrival reads (SimConfig.tiers_read_at_arrival)
    prefetch_at_arrival: np.ndarray
    # bool (T,): a look-up finds a copy there only once stored (TierConfig.visible_when_stored)
    when_stored: np.ndarray
    # device queues of non-interleaved pools (TierConfig.device_queues): blocks a device
    # holds (0: none), devices per pool, each pool's first device link (-1: none)
    dev_blocks: np.ndarray  # i8 (T,)
    devices: np.ndarray  # i8 (T,)
    dev_link0: np.ndarray  # i8 (P,)
    # f8 (T,): the share of a pool's capacity above which it evicts a batch (1: never), and
    # the least share of its blocks a batch evicts (TierConfig.shed_rules)
    evict_high: np.ndarray
    evict_ratio: np.ndarray
    # sliding-window copies (SimConfig.tier_window): copy c of block b is id b + c * win_off,
    # c = 1 .. win_copies (0: none); a hit needs those of its last win_need blocks
    win_off: int = 0
    win_copies: int = 0
    win_need: int = 0

    @classmethod
    def empty(cls, n_instances: int) -> TierParams:
        """No tier (``n_tiers`` 0): the value the HBM-only replay passes."""
        i8, f8 = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
        b1 = np.zeros(0, dtype=np.bool_)
        i2, f2 = np.zeros((0, 0), dtype=np.int64), np.zeros((0, 0), dtype=np.float64)
        i3 = np.zeros((0, 0, 0), dtype=np.int64)
        return cls(
            0, b1, i8, np.zeros((0, n_instances), dtype=np.int64), f8, f8, f8, f2, f2, i8, i8, i8,
            b1, b1, i2, i8, f8, f8, i8, i3, f2, i3, f2, 0, 0, False, False, 1, False, 0, False,
            1, 1, 1, 0.0, b1, i8, b1, b1, b1, i8, i8, i8, f8, f8,
        )  # fmt: skip


class LinkState(NamedTuple):
    """The links' and workers' FIFO state and the counters a replay reports (set by the
    kernels)."""

    free: np.ndarray  # f8 (2 L,): when each link is next free, reads then writes
    busy: np.ndarray  # f8 (L,): seconds each link was occupied
    moved: np.ndarray  # f8 (L,): bytes each link carried
    tier_hits: np.ndarray  # i8 (T,): blocks loaded from each tier into HBM
    prefetched: np.ndarray  # i8 (T,): blocks storage prefetches read from each tier
    bytes_read: np.ndarray  # f8 (T,): loads, prefetches and cascades out of each tier
    bytes_written: np.ndarray  # f8 (T,): copies into each tier
    wfree: np.ndarray  # f8 (2 W,): when each connector worker is next free, load then store
    wbusy: np.ndarray  # f8 (2 W,): seconds each worker was busy
    stage: np.ndarray  # f8 (T, 4): seconds of each stage per tier (STAGES)
    # i8 (T,): scratch of insert_nb, the victims each level's batch eviction still owes
    shed: np.ndarray

    @classmethod
    def zeros(cls, n_links: int, n_tiers: int, n_workers: int = 0) -> LinkState:
        f = np.zeros
        w = 2 * max(n_workers, 1)  # load workers, then store workers
        return cls(
            f(2 * n_links), f(n_links), f(n_links), f(n_tiers, np.int64), f(n_tiers, np.int64),
            f(n_tiers), f(n_tiers), f(w), f(w), f((n_tiers, 4)), f(n_tiers, np.int64),
        )  # fmt: skip


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def pool_nb(tp, t, k):  # noqa: ANN001, ANN201
    """Pool of tier ``t`` reached by instance ``k`` (its host's, its own, or the shared one)."""
    return tp.pool_base[t] + tp.pool_local[t, k]


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def has_nb(ts, p, b):  # noqa: ANN001, ANN201
    """Is ``b`` resident in pool ``p``? The cache engine's ``contains_nb`` rule (main or
    S3-FIFO small queue; a ghost entry is not residency), read from the block's row directly
    so that no per-pool array views are built for the most frequent question."""
    w = ts.blk[p, b, L_WHERE]
    return w == W_MAIN or w == W_SMALL  # noqa: SIM109


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def pool_arrays_nb(ts, p):  # noqa: ANN001, ANN201
    """Pool ``p``'s arrays as the cache engine's :class:`TierArrays` (views; inlined, so the
    tuple is taken apart again at compile time)."""
    return TierArrays(
        ts.meta[p], ts.fmeta[p], ts.blk[p], ts.prio[p], ts.stamp[p], ts.heap[p], ts.hpos[p],
        ts.cost[p],
    )  # fmt: skip


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def touch_nb(ts, p, b):  # noqa: ANN001, ANN201
    """Access ``b`` in pool ``p``; returns the evicted block or -1. A miss flags ``b``'s span
    of ids in ``ts.dirty`` (the only way a row starts to change).

    The cache engine's access is inlined here, dispatching on the pool's policy, rather than
    called: a call passes the pool's eight arrays as about sixty machine words, once per block
    copied below."""
    hit, victim = access_as_nb(ts.meta[p, M_POLICY], pool_arrays_nb(ts, p), b)
    if not hit:
        ts.dirty[p, b // DIRTY_SPAN] = 1
    return victim


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def drop_nb(ts, p, b):  # noqa: ANN001, ANN201
    discard_nb(pool_arrays_nb(ts, p), b)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def device_nb(tp, t, k, b):  # noqa: ANN001, ANN201
    """The device link of a transfer of tier ``t`` (the pool ``k`` reaches) whose first block
    is ``b`` (-1: none; :func:`kvtier.sim.transfer.device_link`)."""
    return device_link_nb(b, tp.dev_blocks[t], tp.devices[t], tp.dev_link0[pool_nb(tp, t, k)])


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def gpu_transfer_nb(tp, lk, k, t, now, cnt, write, first):  # noqa: ANN001, ANN201
    """Move ``cnt`` blocks between instance ``k`` and tier ``t`` through its connector
    (``write``: GPU to tier, on the write queues), the first of them block ``first`` (which
    names the device queue of a non-interleaved pool); returns when the transfer ends."""
    return transfer_nb(
        now,
        cnt * tp.block_bytes,
        ops_of_nb(tp.unit[t], cnt, tp.fragments, tp.coalesce),
        tp.rpc_s[t],
        tp.stream_bw[t, k],
        tp.stage_bw[t, k],
        tp.serial[t],
        tp.depth[t],
        tp.lat_s[t],
        tp.cap_bw[t],
        tp.gpu_path[t, k],
        tp.gpu_scale[t],
        tp.link_bw_write if write else tp.link_bw_read,
        tp.link_duplex,
        tp.n_links if write else ZERO,
        lk.free,
        lk.busy,
        lk.moved,
        lk.wfree,
        tp.w0[t, k] + (lk.wfree.shape[0] // 2 if write else 0),
        tp.nw[t],
        lk.wbusy,
        lk.stage[t],
        device_nb(tp, t, k, first),
    )


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def readable_holder_nb(ts, tp, k, b, now):  # noqa: ANN001, ANN201
    """The first tier instance ``k`` reaches holding block ``b`` readable at ``now``: a tier
    that shows copies once stored skips a copy still being stored (-1: none; the reference's
    ``LowerTiers.readable_holder``)."""
    for t in range(tp.n_tiers):
        p = pool_nb(tp, t, k)
        if not has_nb(ts, p, b) or fault_down_nb(ts, p, b):
            continue
        if not tp.when_stored[t] or ts.stored_at[p, b] <= now:
            return t
    return -1


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def holder_nb(ts, tp, k, b):  # noqa: ANN001, ANN201
    """The first tier holding block ``b`` that instance ``k`` reaches (-1: none)."""
    return readable_holder_nb(ts, tp, k, b, np.inf)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def window_held_nb(ts, tp, k, b):  # noqa: ANN001, ANN201
    """Does a tier admission reads hold every sliding-window copy of block ``b``? (the
    reference's ``LowerTiers.window_held``)"""
    for c in range(1, tp.win_copies + 1):
        t = holder_nb(ts, tp, k, b + c * tp.win_off)
        if t < 0 or tp.prefetch_at_arrival[t]:
            return False
    return True


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def window_end_nb(ts, tp, k, block_ids, bo, start, end):  # noqa: ANN001, ANN201
    """The end of a hit on blocks ``start:end`` its sliding-window copies allow (vLLM's
    ``_sliding_window_lookup``; the reference's ``LowerTiers.window_end``)."""
    run = ZERO
    for j in range(end - 1, start - 1, -1):
        if window_held_nb(ts, tp, k, np.int64(block_ids[bo + j])):
            run += 1
            if run == tp.win_need:
                return np.int64(j + run)
        else:
            run = ZERO
    return np.int64(start + run)


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def lookup_nb(ts, tp, k, refs, src, now):  # noqa: ANN001, ANN201
    """Source tier of the blocks ``refs`` (:class:`Refs`, from ``refs.j0`` to at most
    ``refs.j1``; into ``src``) until one is found nowhere (at ``now``:
    a copy still being stored into a tier that shows copies once stored is not found; ``inf``,
    the routers' view, finds it) or first found in a tier only a prefetch at arrival reads
    (``TierParams.prefetch_at_arrival``: SGLang's admission matches the device and host trees
    alone); the count, cut back to where the sliding-window copies allow
    (``window_end_nb``)."""
    block_ids, bo, start = refs.ids, refs.bo, refs.j0
    n = 0
    for j in range(start, refs.j1):
        found = readable_holder_nb(ts, tp, k, block_ids[bo + j], now)
        if found < 0 or tp.prefetch_at_arrival[found]:
            break
        src[n] = found
        n += 1
    if tp.win_copies > 0 and n > 0:
        n = window_end_nb(ts, tp, k, block_ids, bo, start, start + n) - start
    return n


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def storage_run_nb(ts, tp, k, block_ids, bo, start, cap, src):  # noqa: ANN001, ANN201
    """The run of blocks from ``start`` each first held by a tier only a prefetch at arrival
    reads, their tiers into ``src``; its length (0: none; the reference's
    ``LowerTiers.storage_run``)."""
    n = 0
    while start + n < cap:
        t = holder_nb(ts, tp, k, block_ids[bo + start + n])
        if t < 0 or not tp.prefetch_at_arrival[t]:
            break
        src[n] = t
        n += 1
    return np.int64(n)


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def load_cost_nb(tp, lk, k, now, counts, pf):  # noqa: ANN001, ANN201
    """Estimated seconds until a request loading ``counts[t]`` blocks from each tier ``t`` and
    computing its prefill ``pf`` (:class:`Prefill`) is ready (the cost-aware load rule's
    objective)."""
    load = 0.0
    for t in range(tp.n_tiers):
        if counts[t] > 0:
            fin = estimate_nb(
                now,
                counts[t] * tp.block_bytes,
                ops_of_nb(tp.unit[t], counts[t], tp.fragments, tp.coalesce),
                tp.rpc_s[t],
                tp.stream_bw[t, k],
                tp.stage_bw[t, k],
                tp.serial[t],
                tp.depth[t],
                tp.lat_s[t],
                tp.cap_bw[t],
                tp.gpu_path[t, k],
                tp.gpu_scale[t],
                tp.link_bw_read,
                tp.link_duplex,
                0,
                lk.free,
                lk.wfree,
                tp.w0[t, k],
                tp.nw[t],
            )
            if fin - now > load:
                load = fin - now
    return load + prefill_seconds_nb(pf.q, pf.ctx, pf.timing)


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def load_nb(ts, tp, lk, k, now, refs, buf, pf):  # noqa: ANN001, ANN201
    """Touch (or remove) the loaded blocks ``refs`` (:class:`Refs`) tail first, one transfer per
    source tier (``buf.src``, from ``refs.j0`` on; the blocks per tier into ``buf.counts``);
    returns when the request may start its prefill ``pf`` (:class:`Prefill`)."""
    excl = tp.exclusive
    src = buf.src
    counts = buf.counts
    block_ids = refs.ids
    o = refs.bo + refs.j0
    T = tp.n_tiers
    for t in range(T):
        counts[t] = 0
        counts[T + t] = 0
    # the sliding-window copies of the run's last win_need blocks (counts[T + t]), tail first,
    # each from the first tier holding it, before the run
    n_run = refs.j1 - refs.j0
    lo = n_run - tp.win_need if n_run > tp.win_need else 0
    if tp.win_copies > 0:
        for j in range(n_run - 1, lo - 1, -1):
            for c in range(1, tp.win_copies + 1):
                w = block_ids[o + j] + c * tp.win_off
                t = holder_nb(ts, tp, k, w)
                if t < 0:
                    continue
                p = pool_nb(tp, t, k)
                if excl:
                    drop_nb(ts, p, w)
                else:
                    touch_nb(ts, p, w)
                counts[T + t] += 1
    for j in range(refs.j1 - refs.j0 - 1, -1, -1):
        t = src[j]
        p = pool_nb(tp, t, k)
        b = block_ids[o + j]
        if excl:
            drop_nb(ts, p, b)
        else:
            touch_nb(ts, p, b)
        if tp.load_fills_upper[t]:
            fill_upper_nb(ts, tp, lk, k, now, t, b)
        counts[t] += 1
    compute = prefill_seconds_nb(pf.q, pf.ctx, pf.timing)
    ready = now
    for t in range(tp.n_tiers):
        cnt = counts[t] + counts[T + t]
        if cnt == 0:
            continue
        # the run's first block names the device queue of every tier's transfer
        fin = gpu_transfer_nb(tp, lk, k, t, now, cnt, False, block_ids[o])
        if tp.layerwise[t]:
            fin = layerwise_ready_nb(now, fin, tp.layers, compute)
        lk.tier_hits[t] += counts[t]
        lk.bytes_read[t] += cnt * tp.block_bytes
        if fin > ready:
            ready = fin
    return ready


@njit(cache=True, nogil=True, _nrt=False)
def prefetch_blocks_nb(ts, tp, lk, k, now, refs, src):  # noqa: ANN001, ANN201
    """Read the blocks ``refs`` (:class:`Refs`) toward the tiers above (SGLang's storage
    prefetch into the host pool), each from its tier in ``src`` (``storage_run_nb``'s): per
    tier, in lookup order, touched tail first and read in one transfer through its connector,
    each after the one before; returns when they have arrived and the deepest tier read (the
    reference's ``LowerTiers.prefetch``)."""
    fin = now
    deepest = ZERO
    for t in range(tp.n_tiers):
        p = pool_nb(tp, t, k)
        n = 0
        first = -1
        for j in range(refs.j1 - 1, refs.j0 - 1, -1):
            if src[j - refs.j0] == t:
                first = refs.ids[refs.bo + j]
                touch_nb(ts, p, first)
                n += 1
        if n == 0:
            continue
        fin = gpu_transfer_nb(tp, lk, k, t, fin, np.int64(n), False, first)
        lk.prefetched[t] += n
        lk.bytes_read[t] += n * tp.block_bytes
        deepest = np.int64(t)
    return fin, deepest


@njit(cache=True, nogil=True, _nrt=False)
def refresh_nb(ts, tp, k, refs, end):  # noqa: ANN001, ANN201
    """The copies of the HBM hits ``refs`` (:class:`Refs`) in the first lower tier are
    touched, tail first, after the sliding-window copies of those of the hit's last
    ``win_need`` blocks (it ends at ``end``) HBM holds (the reference's
    ``LowerTiers.refresh``)."""
    p = pool_nb(tp, 0, k)
    lo = end - tp.win_need if end > tp.win_need else 0
    if tp.win_copies > 0:
        for j in range(refs.j1 - 1, lo - 1, -1):
            for c in range(1, tp.win_copies + 1):
                w = refs.ids[refs.bo + j] + c * tp.win_off
                if has_nb(ts, p, w) and not fault_down_nb(ts, p, w):
                    touch_nb(ts, p, w)
    for j in range(refs.j1 - 1, refs.j0 - 1, -1):
        b = refs.ids[refs.bo + j]
        if has_nb(ts, p, b) and not fault_down_nb(ts, p, b):
            touch_nb(ts, p, b)


@njit(cache=True, nogil=True, _nrt=False)
def fill_upper_nb(ts, tp, lk, k, now, t, b):  # noqa: ANN001, ANN201
    """Block ``b``, loaded from tier ``t``, becomes resident in every tier above ``t`` that
    instance ``k`` reaches and that lacks it (the reference's ``fill_upper``)."""
    for u in range(t):
        p = pool_nb(tp, u, k)
        if not has_nb(ts, p, b) and not fault_down_nb(ts, p, b):
            insert_nb(ts, tp, lk, k, now, u, b, now)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def insert_nb(ts, tp, lk, k, now, t, b, stored):  # noqa: ANN001, ANN201
    """Admit ``b`` into tier ``t``, its copy stored at ``stored`` (``inf``: when the write's
    transfer ends, set by ``stored_nb``); victims cascade down under write-back or exclusive,
    each stored when its copy's transfer ends. A pool past its high watermark hands the rest
    of the walk to :func:`spill_nb`, a kernel of its own and rarely called (inlined here, its
    batch walk lengthened the compile of every caller of this function)."""
    cascade = tp.cascade or tp.exclusive
    while True:
        p = pool_nb(tp, t, k)
        victim = touch_nb(ts, p, b)
        if tp.when_stored[t]:
            ts.stored_at[p, b] = stored
        if tp.evict_high[t] < 1.0 and (
            ts.meta[p, M_SIZE] > tp.evict_high[t] * ts.meta[p, M_CAPACITY]
        ):
            # (int64 and float64 arguments: a literal would compile an overload of its own)
            spill_nb(ts, tp, lk, np.int64(k), np.float64(now), np.int64(t), np.int64(victim))
            return
        if victim < 0 or not cascade:
            return
        at = cascade_nb(ts, tp, lk, k, now, t, victim)
        if at < 0.0:
            return
        t += 1
        b = victim
        stored = at


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def spill_nb(ts, tp, lk, k, now, t, victim):  # noqa: ANN001, ANN201
    """After an insertion into tier ``t`` that left its pool past its high watermark: the
    pool evicts a batch (:mod:`kvtier.cache.watermark`), one victim after another; under
    write-back or exclusive each victim (``victim`` first, the one the insertion evicted, -1
    if none) cascades into the next tier down, stored when its copy's transfer ends, and is
    admitted there by the same rule, shedding there too, before the next leaves (the
    reference's recursion, walked with one counter per level in ``lk.shed``: a level's
    remaining victims)."""
    top = t
    p = pool_nb(tp, t, k)
    lk.shed[t] = shed_count_nb(
        ts.meta[p, M_SIZE], ts.meta[p, M_CAPACITY], tp.evict_high[t], tp.evict_ratio[t]
    )
    while True:
        if victim >= 0:
            at = cascade_nb(ts, tp, lk, k, now, t, victim)
            if at >= 0.0:  # copied into the tier below: admit it there
                t += 1
                b = victim
                p = pool_nb(tp, t, k)
                victim = touch_nb(ts, p, b)
                if tp.when_stored[t]:
                    ts.stored_at[p, b] = at
                lk.shed[t] = shed_count_nb(
                    ts.meta[p, M_SIZE], ts.meta[p, M_CAPACITY], tp.evict_high[t],
                    tp.evict_ratio[t],
                )  # fmt: skip
                continue
        while t > top and lk.shed[t] == 0:
            t -= 1
        if lk.shed[t] == 0:
            return
        lk.shed[t] -= 1
        victim = evict_one_nb(pool_arrays_nb(ts, pool_nb(tp, t, k)))


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def cascade_nb(ts, tp, lk, k, now, t, victim):  # noqa: ANN001, ANN201
    """Copy ``victim``, evicted from tier ``t``, into tier ``t + 1`` when the policy cascades
    and that pool neither holds it nor is down; returns when the copy is stored, -1 when not
    copied (the reference's ``cascade_down``)."""
    if not (tp.cascade or tp.exclusive) or t + 1 >= tp.n_tiers:
        return -1.0
    nxt = t + 1
    pn = pool_nb(tp, nxt, k)
    if has_nb(ts, pn, victim) or fault_down_nb(ts, pn, victim):
        return -1.0
    cap = tp.cap_bw[t] if tp.cap_bw[t] < tp.cap_bw[nxt] else tp.cap_bw[nxt]
    # the target's device queue, else the source's (LowerTiers.cascade_device)
    dev = device_nb(tp, nxt, k, victim)
    if dev < 0:
        dev = device_nb(tp, t, k, victim)
    at = transfer_nb(
        now,
        tp.block_bytes,
        ops_of_nb(tp.unit[nxt], ONE, tp.fragments, tp.coalesce),
        tp.rpc_s[nxt],
        tp.stream_bw[nxt, k],
        np.inf,
        tp.serial[nxt],
        tp.depth[nxt],
        tp.lat_s[nxt],
        cap,
        tp.casc_path[t, k],
        tp.casc_scale[t],
        tp.link_bw_write,
        tp.link_duplex,
        tp.n_links,
        lk.free,
        lk.busy,
        lk.moved,
        lk.wfree,
        tp.w0[nxt, k] + lk.wfree.shape[0] // 2,
        tp.nw[nxt],
        lk.wbusy,
        lk.stage[nxt],
        dev,
    )
    lk.bytes_read[t] += tp.block_bytes
    lk.bytes_written[nxt] += tp.block_bytes
    return at


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def copy_into_nb(ts, tp, lk, k, now, t, buf, nbuf):  # noqa: ANN001, ANN201
    """Copy those of ``buf[:nbuf]`` tier ``t``'s pool (the one ``k`` reaches) lacks into it, one
    transfer; returns when it ends (``now`` if nothing was copied)."""
    p = pool_nb(tp, t, k)
    cnt = ZERO  # (a literal 0 would compile ops_of a second time)
    first = -1
    # each block's sliding-window copies, then the blocks (vLLM stores the groups in that order)
    if tp.win_copies > 0:
        for x in range(nbuf):
            for c in range(1, tp.win_copies + 1):
                w = buf[x] + c * tp.win_off
                if not has_nb(ts, p, w) and not fault_down_nb(ts, p, w):
                    insert_nb(ts, tp, lk, k, now, t, w, np.inf)
                    if cnt == 0:
                        first = w
                    cnt += 1
    for x in range(nbuf):
        b = buf[x]
        if not has_nb(ts, p, b) and not fault_down_nb(ts, p, b):
            insert_nb(ts, tp, lk, k, now, t, b, np.inf)
            if cnt == 0:
                first = b
            cnt += 1
    if cnt == 0:
        return now
    lk.bytes_written[t] += cnt * tp.block_bytes
    fin = gpu_transfer_nb(tp, lk, k, t, now, cnt, True, first)
    if tp.when_stored[t]:
        stored_nb(ts, tp, p, buf, nbuf, fin)
    return fin


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def stored_nb(ts, tp, p, buf, nbuf, fin):  # noqa: ANN001, ANN201
    """The copies of ``buf[:nbuf]`` (and their sliding-window copies) a write put into pool
    ``p`` (marked ``inf``) are stored at ``fin`` (the reference's ``LowerTiers.stored``)."""
    for x in range(nbuf):
        for c in range(tp.win_copies + 1):
            w = buf[x] + c * tp.win_off
            if ts.stored_at[p, w] == np.inf:
                ts.stored_at[p, w] = fin


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def write_down_nb(ts, tp, lk, k, now, buf, nbuf, n_targets):  # noqa: ANN001, ANN201
    """Copy ``buf[:nbuf]`` into the first ``n_targets`` tiers, one transfer per tier; returns
    when the last copy into a tier whose connector blocks the step ends (``now`` if none)."""
    saved = now
    for t in range(n_targets):
        fin = copy_into_nb(ts, tp, lk, k, now, t, buf, nbuf)
        if tp.store_blocks[t] and fin > saved:
            saved = fin
    return saved


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def generated_nb(ts, tp, lk, k, now, i, cnt, buf):  # noqa: ANN001, ANN201
    """Request ``i``'s first ``cnt`` generated blocks (ids ``tp.gen_base[i]`` on; ``buf``
    holds at least as many): copied down per the write policy into the tiers whose connector
    stores them, one transfer per tier; the step does not wait for them (the reference's
    ``LowerTiers.generated``)."""
    g0 = tp.gen_base[i]
    for x in range(cnt):
        buf[x] = g0 + x
    n = chosen_nb(ts, tp, buf, cnt)
    if n == 0:
        return
    for t in range(new_targets_nb(tp)):
        if tp.store_generated[t]:
            copy_into_nb(ts, tp, lk, k, now, t, buf, n)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def new_targets_nb(tp):  # noqa: ANN001, ANN201
    return 1 if tp.exclusive else tp.n_tiers


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def sighted_nb(ts, tp, lk, k, now, refs, hbm_hits, buf):  # noqa: ANN001, ANN201
    """One sighting of each block ``refs`` (:class:`Refs`) of an admitted request; selective
    copies of HBM hits at k."""
    n = 0
    block_ids = refs.ids
    for j in range(refs.j0, refs.j1):
        b = block_ids[refs.bo + j]
        ts.sightings[b] += 1
        if j < hbm_hits and ts.sightings[b] == tp.selective_k:
            buf[n] = b
            n += 1
    if tp.counts_sightings and n > 0:
        targets = new_targets_nb(tp)
        write_down_nb(ts, tp, lk, k, now, buf, np.int64(n), np.int64(targets))


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def computed_nb(ts, tp, lk, k, now, buf, nbuf):  # noqa: ANN001, ANN201
    """Newly computed blocks ``buf[:nbuf]``: copy down per the write policy; returns when the
    copies the engine step waits for end (``now`` if none)."""
    n = chosen_nb(ts, tp, buf, nbuf)
    if n > 0:
        targets = new_targets_nb(tp)
        return write_down_nb(ts, tp, lk, k, now, buf, np.int64(n), np.int64(targets))
    return now


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def hbm_evicted_nb(ts, tp, lk, k, now, buf, nbuf):  # noqa: ANN001, ANN201
    if (tp.cascade or tp.exclusive) and nbuf > 0:
        write_down_nb(ts, tp, lk, k, now, buf, np.int64(nbuf), np.int64(1))


@njit(cache=True, nogil=True, _nrt=False)
def reset_dirty_rows_nb(blk: np.ndarray, dirty: np.ndarray, row: np.ndarray) -> None:
    """Set the rows of every span ``dirty`` flags to ``row`` and clear the flags: pools kept
    from a completed replay are empty again after a pass over the spans it touched, not over
    every block (16 per-engine pools x millions of ids are GBs of rows, few of them used)."""
    n = blk.shape[1]
    for p in range(dirty.shape[0]):
        for w in range(dirty.shape[1]):
            if dirty[p, w]:
                hi = min((w + 1) * DIRTY_SPAN, n)
                for b in range(w * DIRTY_SPAN, hi):
                    blk[p, b, 0] = row[0]
                    blk[p, b, 1] = row[1]
                    blk[p, b, 2] = row[2]
                    blk[p, b, 3] = row[3]
                dirty[p, w] = 0


@njit(cache=True, nogil=True, _nrt=False)
def fill_rows_nb(rows: np.ndarray, row: np.ndarray) -> None:
    """Set every row of ``rows`` (n, 4) to ``row``: the empty block row of every pool.

    One pass of four stores per row; numpy's broadcast assignment of a 4-lane row runs about
    four times slower, which matters at hundreds of MB per replay.
    """
    a, b, c, d = row[0], row[1], row[2], row[3]
    for x in range(rows.shape[0]):
        rows[x, 0] = a
        rows[x, 1] = b
        rows[x, 2] = c
        rows[x, 3] = d
