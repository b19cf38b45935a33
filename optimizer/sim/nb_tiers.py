"""Numba kernels of the tiers below HBM: the rules of :mod:`kvtier.sim.reference_tiers`.

State is passed as three tuples of arrays so the serving kernel can hand them on unchanged:

- ``ts``: the stacked cache-engine state of every pool, ``(meta, fmeta, blk, prio, stamp,
  heap, hpos, cost)``, each with a leading pool axis; ``ts[x][p]`` is pool ``p``'s array, which
  the cache engine's primitives (:mod:`kvtier.cache.nb`) take unchanged;
- ``tp``: read-only parameters ``(per_host, pool_base, inst_host, op_s, lat_s, cap_bw,
  link_bw_read, link_bw_write, link_ops, port_link, pool_link, ints, block_bytes)`` with
  ``ints = (write policy, k, exclusive, cost_aware, fragments, coalesce, batch_waits)``;
- ``lk``: counters ``(link_free, link_busy, link_bytes, tier_hits, bytes_read, bytes_written)``.

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

import numpy as np
from numba import njit

from kvtier.cache.enums import L_WHERE, M_POLICY, W_MAIN, W_SMALL
from kvtier.cache.nb import _access_nb, remove_nb
from kvtier.sim.tiers import WRITE_BACK, WRITE_SELECTIVE, WRITE_THROUGH
from kvtier.sim.transfer import estimate, n_ops, prefill_estimate, transfer

transfer_nb = njit(cache=True, nogil=True, _nrt=False)(transfer)
estimate_nb = njit(cache=True, nogil=True, _nrt=False)(estimate)
n_ops_nb = njit(cache=True, nogil=True)(n_ops)
prefill_estimate_nb = njit(cache=True, nogil=True)(prefill_estimate)

I_WRITE, I_K, I_EXCL, I_COST, I_FRAG, I_COAL, I_BATCH_WAIT = 0, 1, 2, 3, 4, 5, 6


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def pool_nb(tp, t, k):  # noqa: ANN001, ANN201
    """Pool of tier ``t`` reached by instance ``k``."""
    if tp[0][t]:
        return tp[1][t] + tp[2][k]
    return tp[1][t]


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def has_nb(ts, p, b):  # noqa: ANN001, ANN201
    """Is ``b`` resident in pool ``p``? The cache engine's ``contains_nb`` rule (main or
    S3-FIFO small queue; a ghost entry is not residency), read from the block's row directly
    so that no per-pool array views are built for the most frequent question."""
    w = ts[2][p, b, L_WHERE]
    return w == W_MAIN or w == W_SMALL  # noqa: SIM109


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def touch_nb(ts, p, b):  # noqa: ANN001, ANN201
    """Access ``b`` in pool ``p``; returns the evicted block or -1.

    The cache engine's access is inlined here, dispatching on the pool's policy, rather than
    called: a call passes the pool's eight arrays as about sixty machine words, once per block
    copied below."""
    meta = ts[0][p]
    _, victim = _access_nb(
        meta[M_POLICY], meta, ts[1][p], ts[2][p], ts[3][p], ts[4][p], ts[5][p], ts[6][p],
        ts[7][p], b,
    )  # fmt: skip
    return victim


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def drop_nb(ts, p, b):  # noqa: ANN001, ANN201
    remove_nb(ts[0][p], ts[1][p], ts[2][p], ts[3][p], ts[4][p], ts[5][p], ts[6][p], ts[7][p], b)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def gpu_path_nb(tp, k, t, path):  # noqa: ANN001, ANN201
    path[0] = k
    path[1] = tp[9][t, tp[2][k]]
    path[2] = tp[10][t]
    path[3] = -1


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def tier_path_nb(tp, k, a, b, path):  # noqa: ANN001, ANN201
    h = tp[2][k]
    path[0] = tp[9][a, h]
    path[1] = tp[10][a]
    path[2] = tp[9][b, h]
    path[3] = tp[10][b]


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def gpu_transfer_nb(tp, lk, k, t, now, cnt, bw, path):  # noqa: ANN001, ANN201
    """Move ``cnt`` blocks between instance ``k`` and tier ``t`` over the links of its path
    (``bw``: the read or the write bandwidths); returns when the transfer ends."""
    ints = tp[11]
    gpu_path_nb(tp, k, t, path)
    return transfer_nb(
        now,
        cnt * tp[12],
        n_ops_nb(cnt, ints[I_FRAG], ints[I_COAL]),
        tp[3][t],
        tp[4][t],
        tp[5][t],
        path,
        bw,
        tp[8],
        lk[0],
        lk[1],
        lk[2],
    )


@njit(cache=True, nogil=True, _nrt=False)
def lookup_nb(ts, tp, n_tiers, k, block_ids, bo, start, cap, src):  # noqa: ANN001, ANN201
    """Source tier of blocks ``start..`` (into ``src``) until one is found nowhere; the count."""
    n = 0
    for j in range(start, cap):
        b = block_ids[bo + j]
        found = -1
        for t in range(n_tiers):
            if has_nb(ts, pool_nb(tp, t, k), b):
                found = t
                break
        if found < 0:
            break
        src[n] = found
        n += 1
    return n


@njit(cache=True, nogil=True, _nrt=False)
def _cost_nb(tp, lk, n_tiers, k, now, counts, q, ctx, comp, path):  # noqa: ANN001, ANN201
    ints = tp[11]
    load = 0.0
    for t in range(n_tiers):
        if counts[t] > 0:
            gpu_path_nb(tp, k, t, path)
            fin = estimate_nb(
                now,
                counts[t] * tp[12],
                n_ops_nb(counts[t], ints[I_FRAG], ints[I_COAL]),
                tp[3][t],
                tp[4][t],
                tp[5][t],
                path,
                tp[6],
                lk[0],
            )
            if fin - now > load:
                load = fin - now
    return load + prefill_estimate_nb(q, ctx, comp[0], comp[1], comp[2])


@njit(cache=True, nogil=True, _nrt=False)
def choose_nb(tp, lk, n_tiers, k, now, src, n_src, hbm_hits, B, counts, comp, path):  # noqa: ANN001, ANN201
    """How many found blocks to load: all, or the cost-aware choice (ties: load more)."""
    if tp[11][I_COST] == 0:
        return n_src
    for t in range(n_tiers):
        counts[t] = 0
    best_c = 0
    best = _cost_nb(tp, lk, n_tiers, k, now, counts, n_src * B, hbm_hits * B, comp, path)
    for c in range(1, n_src + 1):
        counts[src[c - 1]] += 1
        v = _cost_nb(
            tp, lk, n_tiers, k, now, counts, (n_src - c) * B, (hbm_hits + c) * B, comp, path
        )
        if v <= best:
            best = v
            best_c = c
    return best_c


@njit(cache=True, nogil=True, _nrt=False)
def load_nb(ts, tp, lk, n_tiers, k, now, block_ids, bo, start, src, c, counts, path):  # noqa: ANN001, ANN201
    """Touch (or remove) the ``c`` loaded blocks tail first, one transfer per source tier."""
    ints = tp[11]
    excl = ints[I_EXCL] == 1
    for t in range(n_tiers):
        counts[t] = 0
    for j in range(c - 1, -1, -1):
        p = pool_nb(tp, src[j], k)
        b = block_ids[bo + start + j]
        if excl:
            drop_nb(ts, p, b)
        else:
            touch_nb(ts, p, b)
        counts[src[j]] += 1
    ready = now
    for t in range(n_tiers):
        cnt = counts[t]
        if cnt == 0:
            continue
        fin = gpu_transfer_nb(tp, lk, k, t, now, cnt, tp[6], path)
        lk[3][t] += cnt
        lk[4][t] += cnt * tp[12]
        if fin > ready:
            ready = fin
    return ready


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def insert_nb(ts, tp, lk, n_tiers, k, now, t, b, path):  # noqa: ANN001, ANN201
    """Admit ``b`` into tier ``t``; victims cascade down under write-back or exclusive."""
    ints = tp[11]
    cascade = ints[I_WRITE] == WRITE_BACK or ints[I_EXCL] == 1
    while True:
        victim = touch_nb(ts, pool_nb(tp, t, k), b)
        if victim < 0 or not cascade or t + 1 >= n_tiers:
            return
        nxt = t + 1
        if has_nb(ts, pool_nb(tp, nxt, k), victim):
            return
        cap = tp[5][t] if tp[5][t] < tp[5][nxt] else tp[5][nxt]
        tier_path_nb(tp, k, t, nxt, path)
        transfer_nb(
            now,
            tp[12],
            n_ops_nb(1, ints[I_FRAG], ints[I_COAL]),
            tp[3][nxt],
            tp[4][nxt],
            cap,
            path,
            tp[7],
            tp[8],
            lk[0],
            lk[1],
            lk[2],
        )
        lk[4][t] += tp[12]
        lk[5][nxt] += tp[12]
        t = nxt
        b = victim


@njit(cache=True, nogil=True, _nrt=False)
def write_down_nb(ts, tp, lk, n_tiers, k, now, buf, nbuf, n_targets, path):  # noqa: ANN001, ANN201
    """Copy ``buf[:nbuf]`` into the first ``n_targets`` tiers, one transfer per tier."""
    for t in range(n_targets):
        p = pool_nb(tp, t, k)
        cnt = 0
        for x in range(nbuf):
            b = buf[x]
            if not has_nb(ts, p, b):
                insert_nb(ts, tp, lk, n_tiers, k, now, t, b, path)
                cnt += 1
        if cnt > 0:
            gpu_transfer_nb(tp, lk, k, t, now, cnt, tp[7], path)
            lk[5][t] += cnt * tp[12]


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def new_targets_nb(tp, n_tiers):  # noqa: ANN001, ANN201
    return 1 if tp[11][I_EXCL] == 1 else n_tiers


@njit(cache=True, nogil=True, _nrt=False)
def sighted_nb(ts, tp, lk, n_tiers, k, now, block_ids, bo, nb, hbm_hits, sightings, buf, path):  # noqa: ANN001, ANN201
    """One sighting of each block of an admitted request; selective copies of HBM hits at k."""
    ints = tp[11]
    n = 0
    for j in range(nb):
        b = block_ids[bo + j]
        sightings[b] += 1
        if j < hbm_hits and sightings[b] == ints[I_K]:
            buf[n] = b
            n += 1
    if ints[I_WRITE] == WRITE_SELECTIVE and n > 0:
        targets = new_targets_nb(tp, n_tiers)
        write_down_nb(ts, tp, lk, n_tiers, k, now, buf, np.int64(n), np.int64(targets), path)


@njit(cache=True, nogil=True, _nrt=False)
def computed_nb(ts, tp, lk, n_tiers, k, now, buf, nbuf, sightings, path):  # noqa: ANN001, ANN201
    """Newly computed blocks ``buf[:nbuf]``: copy down per the write policy."""
    ints = tp[11]
    wp = ints[I_WRITE]
    if wp == WRITE_THROUGH:
        n = nbuf
    elif wp == WRITE_SELECTIVE:
        n = 0
        for x in range(nbuf):
            if sightings[buf[x]] >= ints[I_K]:
                buf[n] = buf[x]
                n += 1
    else:
        return
    if n > 0:
        targets = new_targets_nb(tp, n_tiers)
        write_down_nb(ts, tp, lk, n_tiers, k, now, buf, np.int64(n), np.int64(targets), path)


@njit(cache=True, nogil=True, _nrt=False)
def hbm_evicted_nb(ts, tp, lk, n_tiers, k, now, buf, nbuf, path):  # noqa: ANN001, ANN201
    ints = tp[11]
    if (ints[I_WRITE] == WRITE_BACK or ints[I_EXCL] == 1) and nbuf > 0:
        write_down_nb(ts, tp, lk, n_tiers, k, now, buf, np.int64(nbuf), np.int64(1), path)


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
