"""Intrusive doubly linked lists over dense block ids (numba kernels).

A list is a (head slot, tail slot) pair in ``meta`` plus the shared link lanes of ``blk``, as
in libCacheSim's queues: the head is the newest entry, ``blk[b, L_NXT]`` points toward the tail
(older) and ``blk[b, L_PRV]`` toward the head (newer). A block is on at most one list of a tier
at a time, so
S3-FIFO's small, main and ghost queues share the link arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache.enums import L_NXT, L_PRV, NIL


@njit(cache=True, nogil=True, _nrt=False)
def push_head_nb(meta: np.ndarray, hslot: int, tslot: int, blk: np.ndarray, b: int) -> None:
    """Put block ``b`` (on no list) at the head of the list ``(hslot, tslot)``."""
    head = meta[hslot]
    blk[b, L_PRV] = NIL
    blk[b, L_NXT] = head
    if head != NIL:
        blk[head, L_PRV] = b
    else:
        meta[tslot] = b
    meta[hslot] = b


@njit(cache=True, nogil=True, _nrt=False)
def unlink_nb(meta: np.ndarray, hslot: int, tslot: int, blk: np.ndarray, b: int) -> None:
    """Take block ``b`` off the list ``(hslot, tslot)`` it is on."""
    p = blk[b, L_PRV]
    n = blk[b, L_NXT]
    if p != NIL:
        blk[p, L_NXT] = n
    else:
        meta[hslot] = n
    if n != NIL:
        blk[n, L_PRV] = p
    else:
        meta[tslot] = p
    blk[b, L_PRV] = NIL
    blk[b, L_NXT] = NIL
