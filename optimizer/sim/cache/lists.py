"""Intrusive doubly linked lists over dense block ids (numba kernels).

A list is a (head slot, tail slot) pair in ``meta`` plus the shared ``prv`` / ``nxt`` arrays,
as in libCacheSim's queues: the head is the newest entry, ``nxt`` points toward the tail (older)
and ``prv`` toward the head (newer). A block is on at most one list of a tier at a time, so
S3-FIFO's small, main and ghost queues share the link arrays.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from optimizer.sim.cache.enums import NIL


@njit(cache=True, nogil=True, _nrt=False)
def push_head_nb(
    meta: np.ndarray, hslot: int, tslot: int, prv: np.ndarray, nxt: np.ndarray, b: int
) -> None:
    """Put block ``b`` (on no list) at the head of the list ``(hslot, tslot)``."""
    head = meta[hslot]
    prv[b] = NIL
    nxt[b] = head
    if head != NIL:
        prv[head] = b
    else:
        meta[tslot] = b
    meta[hslot] = b


@njit(cache=True, nogil=True, _nrt=False)
def unlink_nb(
    meta: np.ndarray, hslot: int, tslot: int, prv: np.ndarray, nxt: np.ndarray, b: int
) -> None:
    """Take block ``b`` off the list ``(hslot, tslot)`` it is on."""
    p = prv[b]
    n = nxt[b]
    if p != NIL:
        nxt[p] = n
    else:
        meta[hslot] = n
    if n != NIL:
        prv[n] = p
    else:
        meta[tslot] = p
    prv[b] = NIL
    nxt[b] = NIL
