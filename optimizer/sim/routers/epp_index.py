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
index dropped scores 0. The producers hash the prompt's text, not its tokens: an entry of ``t``
tokens is ``4 t`` bytes of text, so prompts denser than 4 bytes a token (random-token benchmark
prompts: 6.4-7.0) fill an LRU with more entries per prompt token than its size suggests.

The tiered-prefix-cache guide runs two producers: the GPU one with ``autoTune`` (entries: vLLM's
block count, ``num_gpu_blocks``; entry: vLLM's block size, at least 64 tokens), the CPU one with
``lruCapacityPerServer`` entries of ``blockSizeTokens`` (16 by default, clamped to 64). The
no-hit-LRU scorer reads a default producer with the GPU one's parameters, so a request is cold
when the GPU index matches nowhere.

Here an index is kept at the replay's block granularity: an entry of ``t`` tokens holds
``t / block_tokens`` blocks' worth of capacity, and a prompt hashes its full blocks up to the
token cap (the EPP's hash blocks and the engine's need not align; docs/model.md, "Routing").
Both twins keep one LRU per producer and instance: the reference an ``OrderedDict`` of entry
keys, the kernel a log of touches per producer with each entry's latest touch
(``InstanceState.ix_last``, ``ix_log``, ``ix_list``): a touch appends to the log and
supersedes the entry's earlier one, and eviction walks the list's touches from the oldest,
skipping superseded ones, which gives the LRU order with one write per touch where a linked
list moves its neighbours. An entry whose last block is read more than once is node
``key * n_instances + k`` of instance ``k``, ``key`` the compact number of that block among
the producer's keys (a match reads every instance's node of an entry in one cache line); an
entry whose last block is read once has no node (it takes room and is never matched). The
keys are computed once per replay (:func:`index_keys`).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.policy.model import epp_gpu_entry_tokens
from kvtier.sim.nb_state import (
    INNER,
    IX_CNT,
    IX_FILL,
    IX_HEAD,
    IX_LEN,
    IX_NEXT,
    IX_NODE,
    IX_TAIL,
    InstanceState,
    Params,
)

GPU = 0  # producer rows of the capacities and counts
CPU = 1
# bytes of prompt text the EPP counts as one token: it hashes text, not tokens, in blocks of
# blockSizeTokens x averageCharactersPerToken (4) bytes (llm-d-inference-scheduler
# approximateprefix getKVCacheBlocksFromRawBytes; gateway-api-inference-extension's hashPrompt,
# cacheBlockSizeChars; docs/sources.md [EPP-text-blocks])
EPP_BYTES_PER_TOKEN = 4.0


class IndexGeometry(NamedTuple):
    """Each producer's entries in the replay's blocks: ``step[p]`` blocks per entry, the LRU
    capacity ``caps[p, k]`` of instance ``k`` in entries, the most entries a prompt hashes."""

    step: np.ndarray  # i8 (2,)
    caps: np.ndarray  # i8 (2, n_instances)
    max_entries: np.ndarray  # i8 (2,)


def index_geometry(
    epp_index: tuple[int, ...],
    capacities: np.ndarray,
    block_tokens: int,
    bytes_per_token: float = EPP_BYTES_PER_TOKEN,
) -> IndexGeometry:
    """The producers' entries from ``SimConfig.epp_index`` and the instances' HBM blocks (the
    GPU producer's autoTune reads vLLM's block count and size). The EPP cuts the prompt's text
    into entries of ``t x 4`` bytes for ``t`` "tokens" (:data:`EPP_BYTES_PER_TOKEN`), so with
    ``bytes_per_token`` bytes of text per prompt token an entry covers
    ``t' = t x 4 / bytes_per_token`` tokens, and the ``maxPrefixTokensToMatch`` cap as many
    times fewer. An entry of ``t'`` tokens is ``t' / block_tokens`` blocks when that is whole
    (the entry's key is its last block, whose chained id names the whole prefix through it, as
    the EPP's chained hash does); otherwise one block, the capacity converted at
    ``t' / block_tokens`` blocks per entry."""
    gpu_entries, gpu_tokens, cpu_entries, cpu_tokens, max_tokens = epp_index
    gpu_tokens = epp_gpu_entry_tokens(gpu_tokens, block_tokens)
    exact = bytes_per_token == EPP_BYTES_PER_TOKEN  # entries are whole prompt tokens
    scale = EPP_BYTES_PER_TOKEN / bytes_per_token
    step = np.ones(2, dtype=np.int64)
    caps = np.empty((2, len(capacities)), dtype=np.int64)
    for p, tokens in ((GPU, gpu_tokens), (CPU, cpu_tokens)):
        whole = exact and tokens % block_tokens == 0
        if whole:
            step[p] = tokens // block_tokens
        for k, blocks in enumerate(capacities):
            entries = cpu_entries if p == CPU else gpu_entries or int(blocks)
            if whole:
                caps[p, k] = max(1, entries)
            elif exact:
                caps[p, k] = max(1, entries * tokens // block_tokens)
            else:
                caps[p, k] = max(1, int(entries * tokens * scale // block_tokens))
    hashed = max_tokens if exact else int(max_tokens * scale)
    max_entries = np.array([hashed // (int(r) * block_tokens) for r in step], dtype=np.int64)
    return IndexGeometry(step, caps, max_entries)


def hashed_entries(
    input_tokens: int | np.ndarray,
    n_blocks: int | np.ndarray,
    block_tokens: int,
    step: int,
    most: int,
) -> int | np.ndarray:
    """The entries a prompt hashes: its full entries of ``step`` blocks, at most ``most``
    (element-wise over arrays of prompts too)."""
    return np.minimum(np.minimum(input_tokens // (step * block_tokens), n_blocks // step), most)


class EppIndex:
    """The reference twin: per producer and instance, an LRU of entry keys (block ids)."""

    def __init__(self, geometry: IndexGeometry) -> None:
        self.geometry = geometry
        self.lru: list[list[OrderedDict[int, None]]] = [
            [OrderedDict() for _ in range(geometry.caps.shape[1])] for _ in range(2)
        ]

    def keys(self, blocks: list[int], input_tokens: int, block_tokens: int) -> list[list[int]]:
        """Per producer, the keys of a prompt's hashed entries: the last block of each."""
        g = self.geometry
        out = []
        for p in (GPU, CPU):
            r = int(g.step[p])
            most = int(g.max_entries[p])
            nh = int(hashed_entries(input_tokens, len(blocks), block_tokens, r, most))
            out.append([blocks[(j + 1) * r - 1] for j in range(nh)])
        return out

    def match(self, keys: list[list[int]], n: int) -> list[list[int]]:
        """Per producer, each of the first ``n`` instances' count of the leading run's entries
        (the run stops at the first entry no instance holds)."""
        counts = [[0] * n, [0] * n]
        for p in (GPU, CPU):
            lru = self.lru[p]
            for b in keys[p]:
                seen = False
                for k in range(n):
                    if b in lru[k]:
                        counts[p][k] += 1
                        seen = True
                if not seen:
                    break
        return counts

    def add(self, k: int, keys: list[list[int]]) -> None:
        """Record that the EPP sent a prompt with these entries to instance ``k``."""
        for p in (GPU, CPU):
            lru = self.lru[p][k]
            cap = int(self.geometry.caps[p, k])
            for b in keys[p]:
                if b in lru:
                    lru.move_to_end(b)
                else:
                    lru[b] = None
                    if len(lru) > cap:
                        lru.popitem(last=False)


def index_keys(
    geometry: IndexGeometry,
    shared: np.ndarray,
    n_shared: int,
    block_offsets: np.ndarray,
    input_tokens: np.ndarray,
    block_tokens: int,
) -> tuple[np.ndarray, np.ndarray, int]:
    """The kernel's entry keys, computed once per replay: per producer, each request's hashed
    entries (offsets, shape (2, n + 1)), every entry's node (the compact number of its last
    block among the producer's keys read more than once; -1 for a block read once; shape
    (2, most entries of a producer)) and the most distinct nodes of a producer. Numbering only
    the blocks that are keys keeps the per-instance nodes dense (a quarter of the blocks at
    64-token entries of 16-token blocks), so the look-ups stay in cache."""
    nb = np.diff(np.asarray(block_offsets, dtype=np.int64))
    inp = np.asarray(input_tokens, dtype=np.int64)
    offs = np.zeros((2, len(nb) + 1), dtype=np.int64)
    for p in (GPU, CPU):
        r = int(geometry.step[p])
        nh = hashed_entries(inp, nb, block_tokens, r, int(geometry.max_entries[p]))
        np.cumsum(np.maximum(nh, 0), out=offs[p, 1:])
    width = max(1, int(offs[:, -1].max()))
    keys = np.full((2, width), -1, dtype=np.int32)
    n_keys = number_keys_nb(
        shared, np.asarray(block_offsets, dtype=np.int64), offs, geometry.step, keys, n_shared
    )
    return offs, keys, int(n_keys)


@njit(cache=True, nogil=True)
def number_keys_nb(
    shared: np.ndarray,
    block_offsets: np.ndarray,
    offs: np.ndarray,
    step: np.ndarray,
    keys: np.ndarray,
    n_shared: int,
) -> int:
    """Fill ``keys`` (see :func:`index_keys`): the blocks that are some entry's last block,
    numbered in block order; returns the most of either producer."""
    most = 0
    for p in range(2):
        r = step[p]
        rank = np.zeros(n_shared + 1, dtype=np.int64)
        for i in range(block_offsets.shape[0] - 1):
            for e in range(offs[p, i], offs[p, i + 1]):
                m = shared[block_offsets[i] + (e - offs[p, i] + 1) * r - 1]
                if m >= 0:
                    rank[m] = 1
        total = 0
        for m in range(n_shared):
            if rank[m] != 0:
                rank[m] = total
                total += 1
            else:
                rank[m] = -1
        for i in range(block_offsets.shape[0] - 1):
            for e in range(offs[p, i], offs[p, i + 1]):
                m = shared[block_offsets[i] + (e - offs[p, i] + 1) * r - 1]
                if m >= 0:
                    keys[p, e] = rank[m]
        if total > most:
            most = total
    return most


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def index_match_nb(ist: InstanceState, prm: Params, i: int, n: int) -> None:
    """:meth:`EppIndex.match` for request ``i`` into row ``IX_CNT`` of ``ist.ix_list``
    (producer ``p``, instance ``k`` at ``p * n_instances + k``)."""
    cnt = ist.ix_list[IX_CNT]
    last = ist.ix_last
    nodes = prm.ix_nodes
    n_inst = prm.n_instances
    for p in range(2):
        keys = prm.ix_key[p]
        for k in range(n):
            cnt[p * n_inst + k] = 0
        for e in range(prm.ix_koff[p, i], prm.ix_koff[p, i + 1]):
            m = keys[e]
            if m < 0:
                break  # a block read once: no earlier prompt had it
            seen = False
            base = p * nodes + m * n_inst  # the entry's node on every instance, together
            for k in range(n):
                if last[base + k] >= 0:
                    cnt[p * n_inst + k] += 1
                    seen = True
            if not seen:
                break


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def index_add_nb(ist: InstanceState, prm: Params, k: int, i: int) -> None:
    """:meth:`EppIndex.add` of request ``i`` on instance ``k``'s lists: each entry's touch
    appended to its producer's log (the newest of the list) and made the entry's latest; a new
    entry evicts the oldest live one once the list is over its capacity, skipping touches a
    later touch of the same entry superseded (so the list's order is the LRU order, as a move
    to the front keeps it)."""
    last = ist.ix_last
    node = ist.ix_log[IX_NODE]
    nxt = ist.ix_log[IX_NEXT]
    head = ist.ix_list[IX_HEAD]
    tail = ist.ix_list[IX_TAIL]
    size = ist.ix_list[IX_LEN]
    fill = ist.ix_list[IX_FILL]
    nodes = prm.ix_nodes
    n_inst = prm.n_instances
    for p in range(2):
        keys = prm.ix_key[p]
        lst = p * n_inst + k
        cap = prm.ix_cap[lst]
        for ke in range(prm.ix_koff[p, i], prm.ix_koff[p, i + 1]):
            m = keys[ke]
            x = -1  # a block read once: it takes room, no later prompt looks it up
            if m >= 0:
                x = p * nodes + m * n_inst + k
            fresh = x < 0 or last[x] < 0
            e = p * prm.ix_log + fill[p]
            fill[p] += 1
            node[e] = x
            nxt[e] = -1
            if tail[lst] >= 0:
                nxt[tail[lst]] = e
            else:
                head[lst] = e
            tail[lst] = e
            if x >= 0:
                last[x] = e
            if fresh:
                size[lst] += 1
                if size[lst] > cap:  # evict the least recently touched live entry
                    while True:
                        h = head[lst]
                        head[lst] = nxt[h]
                        y = node[h]
                        if y < 0 or last[y] == h:
                            if y >= 0:
                                last[y] = -1
                            size[lst] -= 1
                            break
