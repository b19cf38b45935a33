"""Transfer and estimate formulas, written once for both simulators (docs/model.md, "Transfer
paths").

The numba engine compiles these very functions (as :func:`kvtier.sim.timing.iteration_time`
is compiled), the reference calls them as Python, so transfer times agree to the bit.

A transfer moves ``nbytes`` between an instance and a tier (or between two tiers) through the
tier's connector: ``ops`` operations (:func:`ops_of`), each costing a worker its software
stages and the links their bytes; :func:`path_transfer` has the rule.
"""

from __future__ import annotations

import numpy as np


def n_ops(blocks: int, fragments: int, coalesce: int) -> int:
    """``ceil(blocks * fragments / coalesce)`` transfer operations."""
    return -(-(blocks * fragments) // coalesce)


def ops_of(unit: int, blocks: int, fragments: int, coalesce: int) -> int:
    """Operations of a connector moving ``blocks``: one per chunk (block, ``unit`` 0), per
    fragment or ``coalesce`` of them (1), or one for the whole transfer (2)."""
    if unit == 0:
        return blocks
    if unit == 1:
        return -(-(blocks * fragments) // coalesce)
    return 1


def layerwise_ready(now: float, finish: float, layers: int, compute_s: float) -> float:
    """When a request loaded layer by layer may start its prefill so that it never waits for a
    layer: its first layer must have arrived (``now + (finish - now) / layers``), and its last
    layer's compute (the prefill ``compute_s`` spread over the layers) must not begin before
    the last layer arrives, ``finish - compute_s * (layers - 1) / layers``."""
    first = now + (finish - now) / layers
    last = finish - compute_s * (layers - 1) / layers
    return first if first > last else last


def device_link(first: int, per_device: int, devices: int, link0: int) -> int:
    """The device link a transfer from or to a non-interleaved pool crosses (``-1``: the pool
    interleaves, ``per_device`` 0). A pool that does not interleave fills one device before
    the next, so block ``first`` (the transfer's first block; ids are dense in order of first
    appearance, the order blocks are first written) sits on device ``(first // per_device) %
    devices``, ``per_device`` blocks a device; the transfer is taken to sit wholly there (a
    request's blocks are consecutive ids and cross a device's end rarely)."""
    if per_device <= 0:
        return -1
    return link0 + (first // per_device) % devices


def path_transfer(
    now: float,
    nbytes: float,
    ops: int,
    rpc_s: float,
    stream_bw: float,
    stage_bw: float,
    serial: int,
    depth: int,
    lat_s: float,
    cap: float,
    path: np.ndarray,
    scale: np.ndarray,
    bw: np.ndarray,
    duplex: np.ndarray,
    off: int,
    free: np.ndarray,
    busy: np.ndarray,
    moved: np.ndarray,
    wfree: np.ndarray,
    w0: int,
    nw: int,
    wbusy: np.ndarray,
    stage: np.ndarray,
    dev: int,
) -> float:
    """Run one transfer through a connector's stages; returns its finish time.

    The transfer is ``ops`` operations of ``nbytes / ops`` bytes each. Each operation costs a
    worker ``w = rpc_s + b / stream_bw + b / stage_bw`` seconds of software (submit or RPC,
    the store's per-stream get or put, the host staging copies) and the links ``c = b /
    bottleneck``. ``serial`` (``1``): every operation runs its stages one after the other, ``T
    = ops * (w + c)`` (LMCache 0.3.x's retrieve loop); pipelined with ``depth`` operations in
    flight: ``T = (w + c) + (ops - 1) * max(w / depth, c)``. It starts when the earliest free
    of the ``nw`` workers ``wfree[w0:w0 + nw]`` and every link on ``path`` are free, ends at
    ``start + T + lat_s``. The worker is busy for ``T``; link ``path[j]`` only for its bytes,
    ``scale[j] * nbytes / bw`` (software is time on a worker, not occupancy of a link). A
    full-duplex link (``duplex``) keeps a second queue at ``free[l + off]`` for the other
    direction (``off`` = number of links for writes, 0 for reads). ``stage`` (4,) adds the
    seconds of each stage: rpc, store stream, staging copies, links. Loads and stores use
    separate workers (the caller passes the store workers' ``w0``).

    ``dev`` (``-1``: none) is one more link the transfer crosses: the memory device of a pool
    whose data is not interleaved over its devices (:func:`device_link`), one queue for both
    directions, occupied for ``nbytes / bw[dev]``.
    """
    wk = w0
    for j in range(w0 + 1, w0 + nw):
        if wfree[j] < wfree[wk]:
            wk = j
    start = now
    if wfree[wk] > start:
        start = wfree[wk]
    slowest = cap
    for j in range(path.shape[0]):
        link = path[j]
        if link >= 0:
            q = link + off if duplex[link] == 1 else link
            if free[q] > start:
                start = free[q]
            eff = bw[link] / scale[j]
            if eff < slowest:
                slowest = eff
    if dev >= 0:
        if free[dev] > start:
            start = free[dev]
        if bw[dev] < slowest:
            slowest = bw[dev]
    b = nbytes / ops
    w = rpc_s + b / stream_bw + b / stage_bw
    c = b / slowest
    if serial == 1:
        span = ops * (w + c)
    else:
        per = w / depth
        if c > per:
            per = c
        span = (w + c) + (ops - 1) * per
    if dev >= 0:
        occupied = nbytes / bw[dev]
        free[dev] = start + occupied
        busy[dev] += occupied
        moved[dev] += nbytes
    for j in range(path.shape[0]):
        link = path[j]
        if link >= 0:
            q = link + off if duplex[link] == 1 else link
            occupied = scale[j] * nbytes / bw[link]
            free[q] = start + occupied
            busy[link] += occupied
            moved[link] += nbytes
    wfree[wk] = start + span
    wbusy[wk] += span
    stage[0] += ops * rpc_s
    stage[1] += nbytes / stream_bw
    stage[2] += nbytes / stage_bw
    stage[3] += nbytes / slowest
    return start + span + lat_s


def path_estimate(
    now: float,
    nbytes: float,
    ops: int,
    rpc_s: float,
    stream_bw: float,
    stage_bw: float,
    serial: int,
    depth: int,
    lat_s: float,
    cap: float,
    path: np.ndarray,
    scale: np.ndarray,
    bw: np.ndarray,
    duplex: np.ndarray,
    off: int,
    free: np.ndarray,
    wfree: np.ndarray,
    w0: int,
    nw: int,
) -> float:
    """The finish time :func:`path_transfer` would give, without occupying anything."""
    wk = w0
    for j in range(w0 + 1, w0 + nw):
        if wfree[j] < wfree[wk]:
            wk = j
    start = now
    if wfree[wk] > start:
        start = wfree[wk]
    slowest = cap
    for j in range(path.shape[0]):
        link = path[j]
        if link >= 0:
            q = link + off if duplex[link] == 1 else link
            if free[q] > start:
                start = free[q]
            eff = bw[link] / scale[j]
            if eff < slowest:
                slowest = eff
    b = nbytes / ops
    w = rpc_s + b / stream_bw + b / stage_bw
    c = b / slowest
    if serial == 1:
        span = ops * (w + c)
    else:
        per = w / depth
        if c > per:
            per = c
        span = (w + c) + (ops - 1) * per
    return start + span + lat_s


def prefill_estimate(
    q: int, ctx: int, flops_per_token: float, attn_coef: float, compute_rate: float
) -> float:
    """Seconds to compute ``q`` prompt tokens after ``ctx`` (compute term, docs/design.md 4.2)."""
    return (flops_per_token * q + attn_coef * (q * (2 * ctx + q))) / compute_rate


def pd_transfer(
    now: float,
    nbytes: float,
    ops: int,
    rpc_s: float,
    stream_bw: float,
    stage_bw: float,
    serial: int,
    depth: int,
    lat_s: float,
    path: np.ndarray,
    queue: np.ndarray,
    scale: np.ndarray,
    bw_read: np.ndarray,
    bw_write: np.ndarray,
    duplex: np.ndarray,
    n_links: int,
    free: np.ndarray,
    busy: np.ndarray,
    moved: np.ndarray,
    wfree: np.ndarray,
    w0: int,
    nw: int,
    wbusy: np.ndarray,
) -> float:
    """Move a prompt's KV from a prefill to a decode instance; returns its finish time.

    The rule of :func:`path_transfer` (the connector's ``ops`` operations, each costing a
    worker ``w = rpc_s + b / stream_bw + b / stage_bw`` and the links ``c = b / bottleneck``,
    serial or pipelined ``depth`` deep; the transfer starts when the earliest free worker of
    ``wfree[w0:w0 + nw]`` and every link of the path are free, ends ``lat_s`` after its span),
    except that the path crosses links in both directions: the sender's side outbound, the
    receiver's inbound. ``queue[j]`` says which: 0 the link's read (inbound) queue at
    ``free[l]`` with bandwidth ``bw_read``, 1 its write (outbound) queue at ``free[l +
    n_links]`` with ``bw_write`` (one queue when the link is half duplex). These are the same
    queues the tiers' loads (read) and copies down (write) use, so a P/D transfer and an RDMA
    tier's traffic through one NIC wait for each other.
    """
    wk = w0
    for j in range(w0 + 1, w0 + nw):
        if wfree[j] < wfree[wk]:
            wk = j
    start = now
    if wfree[wk] > start:
        start = wfree[wk]
    slowest = np.inf
    for j in range(path.shape[0]):
        link = path[j]
        if link >= 0:
            out = queue[j] == 1
            q = link + n_links if (out and duplex[link] == 1) else link
            if free[q] > start:
                start = free[q]
            eff = (bw_write[link] if out else bw_read[link]) / scale[j]
            if eff < slowest:
                slowest = eff
    b = nbytes / ops
    w = rpc_s + b / stream_bw + b / stage_bw
    c = b / slowest
    if serial == 1:
        span = ops * (w + c)
    else:
        per = w / depth
        if c > per:
            per = c
        span = (w + c) + (ops - 1) * per
    for j in range(path.shape[0]):
        link = path[j]
        if link >= 0:
            out = queue[j] == 1
            q = link + n_links if (out and duplex[link] == 1) else link
            carried = scale[j] * nbytes  # a share of the bytes when several NICs split them
            occupied = carried / (bw_write[link] if out else bw_read[link])
            free[q] = start + occupied
            busy[link] += occupied
            moved[link] += carried
    wfree[wk] = start + span
    wbusy[wk] += span
    return start + span + lat_s
