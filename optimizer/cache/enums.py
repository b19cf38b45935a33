"""Integer codes and state-array layout shared by the cache kernels and their Python wrappers.

Kernels cannot take Python objects, so a tier's scalars live in one int64 array ``meta`` (and its
one float scalar in ``fmeta``) at the fixed slots below, and every per-block fact lives in an array
indexed by the dense block id. Numba treats these module-level integers as compile-time
constants, so dispatching on them costs nothing.
"""

from __future__ import annotations

from kvtier.cache.registry import EVICTIONS

# ---- eviction policy codes -------------------------------------------------------------------
# The registry (kvtier.cache.registry) assigns them; the names below are for code that needs one
# particular policy (the one-pass curve is LRU's, the ring kernels LRU's and FIFO's). Dispatch on
# codes is kvtier.cache.hooks.
LRU = EVICTIONS.code("lru")
FIFO = EVICTIONS.code("fifo")
POLICY_NAMES: dict[int, str] = {e.code: e.name for e in EVICTIONS}

# ---- accounting / request semantics ----------------------------------------------------------
PREFIX = 0  # longest contiguous resident prefix counts as hits, then touch tail-first
FLAT = 1  # every block access stands alone, in request order (libCacheSim parity)

SEMANTICS_NAMES: dict[int, str] = {PREFIX: "prefix", FLAT: "flat"}

# ---- lanes of the int32 per-block array ``blk`` (n_blocks, 4) ----------------------------------
# One row per block keeps everything an access touches about a block on one cache line.
L_PRV = 0  # link toward the list head (newer), NIL at the head
L_NXT = 1  # link toward the list tail (older), NIL at the tail
L_FREQ = 2  # policy counter: LFU/GDSF frequency, Sieve visited bit, S3-FIFO counter
L_WHERE = 3  # one of the W_* codes below
BLK_LANES = 4

# ---- where a block is, per tier (lane L_WHERE of ``blk``) -------------------------------------
W_ABSENT = 0
W_MAIN = 1  # resident; the only resident place for every policy except S3-FIFO
W_SMALL = 2  # resident in S3-FIFO's small FIFO
W_GHOST = 3  # not resident: id remembered in S3-FIFO's ghost FIFO

# ---- slots of the int64 ``meta`` array -------------------------------------------------------
M_POLICY = 0  # policy code
M_CAPACITY = 1  # capacity in blocks
M_SIZE = 2  # resident blocks (small + main for S3-FIFO)
M_CLOCK = 3  # accesses so far (the virtual time that breaks LFU / GDSF ties)
M_HEAD = 4  # main list head (newest); -1 when empty
M_TAIL = 5  # main list tail (oldest)
M_SHEAD = 6  # S3-FIFO small list head
M_STAIL = 7  # S3-FIFO small list tail
M_GHEAD = 8  # S3-FIFO ghost list head
M_GTAIL = 9  # S3-FIFO ghost list tail
M_SMALL_CAP = 10  # S3-FIFO small FIFO size in blocks
M_MAIN_CAP = 11  # S3-FIFO main FIFO size in blocks
M_GHOST_CAP = 12  # S3-FIFO ghost FIFO size in blocks
M_N_SMALL = 13  # blocks in the small FIFO
M_N_MAIN = 14  # blocks in the main FIFO
M_N_GHOST = 15  # ids in the ghost FIFO
M_THRESHOLD = 16  # S3-FIFO move-to-main threshold
M_HAND = 17  # Sieve hand (block id, -1 = start from the tail)
M_HEAP_N = 18  # entries in the LFU / GDSF heap
M_HAS_EVICTED = 19  # S3-FIFO: has the cache evicted anything yet (0/1)
M_N_EVICTIONS = 20  # evictions so far
META_LEN = 24

# ---- slots of the float64 ``fmeta`` array ----------------------------------------------------
F_INFLATION = 0  # GDSF inflation value L (priority of the last evicted block)
FMETA_LEN = 2

NIL = -1  # null link / "no block"
