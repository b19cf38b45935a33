"""The EPP's approximate prefix indexes: where llm-d's endpoint picker believes a prefix is.

llm-d-router v0.10.0 (``requestcontrol/dataproducer/approximateprefix``: ``plugin.go``,
``indexer.go``, ``types.go``; gateway-api-inference-extension v1.0.1's
``plugins/multi/prefix`` keeps the same index over 64-byte blocks of text) does not read the
model servers' caches. Each ``approx-prefix-cache-producer`` hashes the prompt's leading
``maxPrefixTokensToMatch`` tokens into blocks, and after every pick adds them to the chosen
server's LRU (``hashicorp/golang-lru``: an entry already present moves to the front; a new one
evicts the oldest once the LRU is full). A server's match is the number of blocks it holds of
the leading run that some server holds (``matchLongestPrefix``), its score that count over the
prompt's blocks. So a server that took a group's prompt keeps scoring 1 for it until its LRU
has turned over, whatever vLLM evicted since; and a server whose cache still holds a prefix the
index dropped scores 0.

The tiered-prefix-cache guide runs two producers: the GPU one with ``autoTune`` (entries: vLLM's
block count, ``num_gpu_blocks``; entry: vLLM's block size, at least 64 tokens), the CPU one with
``lruCapacityPerServer`` entries of ``blockSizeTokens`` (16 by default, clamped to 64). The
no-hit-LRU scorer reads a default producer with the GPU one's parameters, so a request is cold
when the GPU index matches nowhere.

Here an index is kept at the replay's block granularity: an entry of ``t`` tokens holds
``t / block_tokens`` blocks' worth of capacity, and a prompt hashes its full blocks up to the
token cap (the EPP's hash blocks and the engine's need not align; docs/model.md, "Routing").
Both twins keep one LRU per producer and instance: the reference an ``OrderedDict`` of block
ids, the kernel a doubly linked list over the block map's entries (a block read more than once
is entry ``k * n_shared + shared[ref]`` of instance ``k``; a block read once is entry
``n_instances * n_shared + ref``: it takes room and is never matched).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.policy.model import EPP_MIN_ENTRY_TOKENS
from kvtier.sim.nb_state import INNER, InstanceState, Params, Requests

GPU = 0  # producer rows of the capacities and counts
CPU = 1
MIN_ENTRY_TOKENS = EPP_MIN_ENTRY_TOKENS  # autoTune's floor


def index_capacities(epp_index: tuple[int, ...], capacities: np.ndarray, block_tokens: int):
    """Each producer's LRU capacity per instance in blocks, shape (2, n_instances), and the
    most leading blocks a prompt hashes: from ``SimConfig.epp_index`` and the instances' HBM
    blocks (the GPU producer's autoTune reads vLLM's block count)."""
    gpu_entries, gpu_tokens, cpu_entries, cpu_tokens, max_tokens = epp_index
    gpu_tokens = gpu_tokens or max(block_tokens, MIN_ENTRY_TOKENS)
    caps = np.empty((2, len(capacities)), dtype=np.int64)
    for k, blocks in enumerate(capacities):
        entries = gpu_entries or int(blocks)
        caps[GPU, k] = max(1, entries * gpu_tokens // block_tokens)
        caps[CPU, k] = max(1, cpu_entries * cpu_tokens // block_tokens)
    return caps, max_tokens // block_tokens


def hashed_blocks(input_tokens: int, n_blocks: int, block_tokens: int, max_blocks: int) -> int:
    """The leading blocks of a prompt an index hashes: its full blocks, at most ``max_blocks``."""
    return min(input_tokens // block_tokens, n_blocks, max_blocks)


class EppIndex:
    """The reference twin: per producer and instance, an LRU of block ids."""

    def __init__(self, caps: np.ndarray, max_blocks: int) -> None:
        self.caps = caps
        self.max_blocks = max_blocks
        self.lru: list[list[OrderedDict[int, None]]] = [
            [OrderedDict() for _ in range(caps.shape[1])] for _ in range(2)
        ]

    def match(self, blocks: list[int], nh: int, n: int) -> list[list[int]]:
        """Per producer, each of the first ``n`` instances' count of the leading run's blocks
        (the run stops at the first block no instance holds)."""
        counts = [[0] * n, [0] * n]
        for p in (GPU, CPU):
            lru = self.lru[p]
            for j in range(nh):
                b = blocks[j]
                seen = False
                for k in range(n):
                    if b in lru[k]:
                        counts[p][k] += 1
                        seen = True
                if not seen:
                    break
        return counts

    def add(self, k: int, blocks: list[int], nh: int) -> None:
        """Record that the EPP sent a prompt with these leading blocks to instance ``k``."""
        for p in (GPU, CPU):
            lru = self.lru[p][k]
            cap = int(self.caps[p, k])
            for j in range(nh):
                b = blocks[j]
                if b in lru:
                    lru.move_to_end(b)
                else:
                    lru[b] = None
                    if len(lru) > cap:
                        lru.popitem(last=False)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def index_node_nb(rq: Requests, prm: Params, k: int, ref: int) -> int:
    """The index entry of reference ``ref`` on instance ``k`` (see the module docstring)."""
    m = rq.shared[ref]
    if m >= 0:
        return k * prm.n_shared + m
    return prm.n_instances * prm.n_shared + ref


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def index_match_nb(rq: Requests, ist: InstanceState, prm: Params, start: int, nh: int, n: int):
    """:meth:`EppIndex.match` into ``ist.ix_cnt`` (producer ``p``, instance ``k`` at
    ``p * n_instances + k``)."""
    cnt = ist.ix_cnt
    on = ist.ix_on
    nodes = prm.ix_nodes
    n_inst = prm.n_instances
    for p in range(2):
        for k in range(n):
            cnt[p * n_inst + k] = 0
        for j in range(nh):
            m = rq.shared[start + j]
            if m < 0:
                break  # a block read once: no earlier prompt had it
            seen = False
            for k in range(n):
                if on[p * nodes + k * prm.n_shared + m]:
                    cnt[p * n_inst + k] += 1
                    seen = True
            if not seen:
                break


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def index_add_nb(rq: Requests, ist: InstanceState, prm: Params, k: int, start: int, nh: int):
    """:meth:`EppIndex.add`: each block to the tail of instance ``k``'s list (most recent),
    a new one evicting the head once the list is over its capacity."""
    nxt = ist.ix_next
    prv = ist.ix_prev
    on = ist.ix_on
    head = ist.ix_head
    tail = ist.ix_tail
    size = ist.ix_len
    nodes = prm.ix_nodes
    n_inst = prm.n_instances
    for p in range(2):
        lst = p * n_inst + k
        cap = prm.ix_cap[lst]
        for j in range(nh):
            x = p * nodes + index_node_nb(rq, prm, k, start + j)
            fresh = not on[x]
            if not fresh:  # unlink it, to append it again
                a = prv[x]
                b = nxt[x]
                if a >= 0:
                    nxt[a] = b
                else:
                    head[lst] = b
                if b >= 0:
                    prv[b] = a
                else:
                    tail[lst] = a
            on[x] = True
            prv[x] = tail[lst]
            nxt[x] = -1
            if tail[lst] >= 0:
                nxt[tail[lst]] = x
            else:
                head[lst] = x
            tail[lst] = x
            if fresh:
                size[lst] += 1
                if size[lst] > cap:  # evict the least recently added
                    h = head[lst]
                    b = nxt[h]
                    head[lst] = b
                    if b >= 0:
                        prv[b] = -1
                    else:
                        tail[lst] = -1
                    on[h] = False
                    size[lst] -= 1
