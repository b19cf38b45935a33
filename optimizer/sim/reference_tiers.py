"""The tiers below HBM in the reference simulator: plain Python, one rule per method.

The numba engine (:mod:`kvtier.sim.nb`) implements the same rules over stacked arrays; both
use the cache engine's eviction policies (here its reference ``RefTier``) and the shared
formulas of :mod:`kvtier.sim.transfer`. The rules (docs/model.md, "Tiers below HBM"):

- Lookup: after the HBM prefix, each further block is looked for in the tiers in order
  (the tier kinds' order), in the pool this instance reaches; the run ends at the first block
  found nowhere. The first tier that holds a block is its source.
- Load rule: ``always_load`` loads the whole run; ``cost_aware`` loads the first ``c`` blocks,
  ``c`` minimising estimated load time plus the time to recompute the rest (ties: load more).
- Loading touches each loaded block in its source, tail first (``inclusive``), or removes it
  there (``exclusive``: it moves up); then one transfer per source tier through the tier's
  connector (:func:`kvtier.sim.transfer.path_transfer`); the request's prefill waits for the
  last one, or, with a layer-wise connector, only as long as its compute cannot overlap
  (:func:`kvtier.sim.transfer.layerwise_ready`).
- Writes down: ``write_through`` copies every newly computed block, at the end of the iteration
  that computed it, into every lower tier (only the first under ``exclusive``);
  ``write_through_selective`` does so only for blocks seen at admission at least ``k`` times,
  and copies an HBM-resident block when its ``k``-th sighting is a hit; ``write_back`` copies
  a block into the first lower tier when HBM evicts it. Under ``write_back`` or ``exclusive`` a
  block a lower tier evicts is copied into the next tier (cascade). A block already resident in
  the target is not copied. Copies occupy links but delay no request directly.
- Sliding-window copies (``SimConfig.tier_window``, vLLM's OffloadingConnector under the
  hybrid KV cache manager): every block written down brings its ``copies`` window copies (ids
  ``b + c * win_off``), written before it; a lookup's run is cut back to the last block whose
  ``need`` blocks before it (or those from the run's start) have every copy held, scanning
  from the run's end; a load moves the copies of the run's last ``need`` blocks with it,
  touched before the run; a refresh touches those of the hit's last ``need`` blocks HBM holds
  before the HBM hits. No other copy is ever touched, so a prefix's other copies age out.
"""

from __future__ import annotations

import numpy as np

from kvtier.cache.reference import RefTier
from kvtier.cache.watermark import shed_count
from kvtier.policy.registries import LOAD_RULES, WRITE_POLICIES
from kvtier.sim.fault_step import RefFaults
from kvtier.sim.faults import lost_ids
from kvtier.sim.tiers import TierConfig
from kvtier.sim.timing import prefill_seconds
from kvtier.sim.transfer import (
    layerwise_ready,
    ops_of,
    path_estimate,
    path_transfer,
)


class LowerTiers:
    """Every pool of every lower tier, the links, and the per-tier counters."""

    def __init__(
        self,
        cfg: TierConfig,
        n_blocks: int,
        compute: np.ndarray | list[np.ndarray],
        costs: np.ndarray,
        faults: RefFaults | None = None,
    ) -> None:
        self.cfg = cfg
        self.faults = faults  # failed devices (kvtier.sim.fault_step), None: none
        # the packed step-time array (kvtier.sim.timing), or one per instance (pools of two
        # tensor-parallel sizes): a load overlaps the loading instance's own compute
        self.compute_of = compute if isinstance(compute, list) else None
        self.compute = compute[0] if isinstance(compute, list) else compute
        self.pools: list[RefTier] = []
        for t in range(cfg.n_tiers):
            n = int(cfg.pool_count[t])
            cap = int(cfg.capacity_blocks[t])
            self.pools += [RefTier(cfg.evictions[t], cap, cost=costs) for _ in range(n)]
        self.free = np.zeros(2 * cfg.n_links)  # read queues, then write queues
        self.busy = np.zeros(cfg.n_links)
        self.moved = np.zeros(cfg.n_links)
        # connector workers: the load workers, then the store workers (LMCache submits puts to
        # its own thread, vLLM's offloading uses a stream per direction)
        self.wfree = np.zeros(2 * max(cfg.n_workers, 1))
        self.wbusy = np.zeros(2 * max(cfg.n_workers, 1))
        self.stage = np.zeros((cfg.n_tiers, 4))
        self.hits = np.zeros(cfg.n_tiers, dtype=np.int64)
        self.prefetched = np.zeros(cfg.n_tiers, dtype=np.int64)
        self.bytes_read = np.zeros(cfg.n_tiers)
        self.bytes_written = np.zeros(cfg.n_tiers)
        self.sightings = np.zeros(max(n_blocks, 1), dtype=np.int64)
        # tiers only a storage prefetch at arrival reads (SimConfig.tiers_read_at_arrival): an
        # admission's lookup stops at them (set by the replay)
        self.read_at_arrival = np.zeros(cfg.n_tiers, dtype=np.bool_)
        self.cascade = cfg.cascade or cfg.exclusive
        # each pool's batch eviction at its high watermark (kvtier.cache.watermark)
        self.evict_high, self.evict_ratio = cfg.shed_rules()
        # the write policy's and the load rule's modules (their reference steps)
        self.writes = WRITE_POLICIES.by_code(cfg.write_policy).load()
        self.load_rule = LOAD_RULES.by_code(cfg.load_rule).load()
        # sliding-window copies (SimConfig.tier_window, set by the replay): copy c of block b
        # is id b + c * win_off, c = 1 .. win_copies; a hit needs those of its last win_need
        self.win_off = 0
        self.win_copies = 0
        self.win_need = 0
        # tiers whose copies a lookup finds only once their store has ended
        # (TierConfig.visible_when_stored), and when each pool's copy of a block was stored
        # (a block never written here reads 0: stored before the replay)
        self.when_stored = cfg.when_stored_flags()
        self.stored_at: list[dict[int, float]] = [{} for _ in self.pools]

    # ---- wiring ------------------------------------------------------------------------------
    def pool(self, t: int, inst: int) -> RefTier:
        return self.pools[self.cfg.pool_of(t, inst)]

    def down(self, t: int, inst: int, b: int) -> bool:
        """Is block ``b`` of the pool of tier ``t`` that ``inst`` reaches on a failed device?"""
        return self.faults is not None and self.faults.down(self.cfg.pool_of(t, inst), b)

    def advance_faults(self, now: float) -> None:
        """Apply the faults ``now`` has reached (once per event instant)."""
        if self.faults is not None:
            self.faults.advance(self.pools, now)

    def gpu_transfer(
        self, inst: int, now: float, t: int, cnt: int, write: bool, first: int
    ) -> float:
        """Move ``cnt`` blocks between ``inst`` and tier ``t`` through its connector (``write``:
        GPU to tier, on the write queues), the first of them block ``first`` (which names the
        device queue of a non-interleaved pool); returns when the transfer ends."""
        c = self.cfg
        dev = c.device_of(t, c.pool_of(t, inst), first)
        return path_transfer(
            now,
            cnt * c.block_bytes,
            self.ops(t, cnt),
            c.rpc_s[t],
            c.stream_bw[t, inst],
            c.stage_bw[t, inst],
            c.serial[t],
            c.depth[t],
            c.lat_s[t],
            c.cap_bw[t],
            c.gpu_path[t, inst],
            c.gpu_scale[t],
            c.link_bw_write if write else c.link_bw_read,
            c.link_duplex,
            c.n_links if write else 0,
            self.free,
            self.busy,
            self.moved,
            self.wfree,
            c.w0[t, inst] + (self.store_workers() if write else 0),
            c.nw[t],
            self.wbusy,
            self.stage[t],
            dev,
        )

    def store_workers(self) -> int:
        """Offset of the store workers in ``wfree`` (after the load workers)."""
        return max(self.cfg.n_workers, 1)

    def ops(self, t: int, blocks: int) -> int:
        return ops_of(self.cfg.unit[t], blocks, self.cfg.fragments, self.cfg.coalesce)

    # ---- lookup and loads --------------------------------------------------------------------
    def holder(self, inst: int, b: int) -> int:
        """The first tier holding block ``b`` that ``inst`` reaches (-1: none)."""
        return self.readable_holder(inst, b, np.inf)

    def readable_holder(self, inst: int, b: int, now: float) -> int:
        """The first tier ``inst`` reaches holding block ``b`` readable at ``now``: a tier whose
        copies are visible only once stored skips a copy still being stored (-1: none)."""
        c = self.cfg
        for t in range(c.n_tiers):
            p = c.pool_of(t, inst)
            if not self.pools[p].contains(b) or self.down(t, inst, b):
                continue
            if not self.when_stored[t] or self.stored_at[p].get(b, 0.0) <= now:
                return t
        return -1

    def lookup(
        self, inst: int, blocks: list[int], start: int, cap: int, now: float = np.inf
    ) -> list[int]:
        """Source tier of each block after the HBM prefix, up to the first block found nowhere
        (at ``now``: a copy still being stored into a tier that shows copies once stored is not
        found; ``inf``, the routers' view, finds it) or first found in a tier only a prefetch
        at arrival reads (SGLang's admission matches the device and host trees; storage is
        reached by the prefetch alone); with sliding-window copies, cut back to where they
        allow (``window_end``)."""
        src: list[int] = []
        for j in range(start, cap):
            found = self.readable_holder(inst, blocks[j], now)
            if found < 0 or self.read_at_arrival[found]:
                break
            src.append(found)
        if self.win_copies and src:
            src = src[: self.window_end(inst, blocks, start, start + len(src)) - start]
        return src

    def window_ids(self, b: int) -> list[int]:
        """The ids of block ``b``'s sliding-window copies."""
        return [b + c * self.win_off for c in range(1, self.win_copies + 1)]

    def window_held(self, inst: int, b: int) -> bool:
        """Does a tier admission reads hold every sliding-window copy of block ``b``?"""
        for w in self.window_ids(b):
            t = self.holder(inst, w)
            if t < 0 or self.read_at_arrival[t]:
                return False
        return True

    def window_end(self, inst: int, blocks: list[int], start: int, end: int) -> int:
        """The end of a hit on ``blocks[start:end]`` its sliding-window copies allow: from the
        end back, the first block that ends ``win_need`` blocks whose copies are all held, or,
        reaching ``start``, the run of such blocks from ``start`` (vLLM's
        ``_sliding_window_lookup``; ``start``: no hit)."""
        run = 0
        for j in range(end - 1, start - 1, -1):
            if self.window_held(inst, blocks[j]):
                run += 1
                if run == self.win_need:
                    return j + run
            else:
                run = 0
        return start + run

    def storage_run(self, inst: int, blocks: list[int], start: int, cap: int) -> list[int]:
        """The tier of each block of the run from ``start`` each first held by a tier only a
        prefetch at arrival reads (empty: none)."""
        src: list[int] = []
        for b in blocks[start:cap]:
            t = self.holder(inst, b)
            if t < 0 or not self.read_at_arrival[t]:
                break
            src.append(t)
        return src

    def timing_of(self, inst: int) -> np.ndarray:
        """The packed step-time array of instance ``inst``."""
        return self.compute if self.compute_of is None else self.compute_of[inst]

    def choose(self, inst: int, now: float, src: list[int], hbm_hits: int, B: int) -> int:
        """How many of the found blocks to load (the load rule's step)."""
        return self.load_rule.choose(self, inst, now, src, hbm_hits, B)

    def chosen_run(
        self, inst: int, now: float, blocks: list[int], src: list[int], hbm_hits: int, B: int
    ) -> int:
        """How many of the found blocks ``src`` (from ``hbm_hits`` on) to load: the load
        rule's choice, cut back, when it stops short of the run, to where the sliding-window
        copies allow (``window_end``)."""
        n = self.choose(inst, now, src, hbm_hits, B)
        if self.win_copies and 0 < n < len(src):
            n = self.window_end(inst, blocks, hbm_hits, hbm_hits + n) - hbm_hits
        return n

    def load_cost(self, inst: int, now: float, counts: list[int], q: int, ctx: int) -> float:
        """Estimated seconds until a request loading ``counts[t]`` blocks from each tier and
        computing ``q`` tokens after ``ctx`` is ready (the cost-aware rule's objective)."""
        c = self.cfg
        load = 0.0
        for t in range(c.n_tiers):
            if counts[t] > 0:
                fin = path_estimate(
                    now,
                    counts[t] * c.block_bytes,
                    self.ops(t, counts[t]),
                    c.rpc_s[t],
                    c.stream_bw[t, inst],
                    c.stage_bw[t, inst],
                    c.serial[t],
                    c.depth[t],
                    c.lat_s[t],
                    c.cap_bw[t],
                    c.gpu_path[t, inst],
                    c.gpu_scale[t],
                    c.link_bw_read,
                    c.link_duplex,
                    0,
                    self.free,
                    self.wfree,
                    c.w0[t, inst],
                    c.nw[t],
                )
                if fin - now > load:
                    load = fin - now
        return load + float(prefill_seconds(q, ctx, self.timing_of(inst)))

    def load(
        self, inst: int, now: float, blocks: list[int], start: int, src: list[int], q: int, ctx: int
    ) -> float:
        """Move the blocks ``blocks[start:start+len(src)]`` up; returns when the request may
        start its prefill (``q`` tokens left to compute after ``ctx``)."""
        c = self.cfg
        fills = c.load_fills_upper
        # the sliding-window copies of the run's last win_need blocks, tail first, each from
        # the first tier holding it, before the run (vLLM touches the sliding-window group first)
        extra = [0] * c.n_tiers
        end = start + len(src)
        for j in range(end - 1, max(start, end - self.win_need) - 1, -1):
            for w in self.window_ids(blocks[j]):
                t = self.holder(inst, w)
                if t < 0:
                    continue
                if c.exclusive:
                    self.pool(t, inst).remove(w)
                else:
                    self.pool(t, inst).access(w)
                extra[t] += 1
        for j in range(len(src) - 1, -1, -1):
            t, b = src[j], blocks[start + j]
            if c.exclusive:
                self.pool(t, inst).remove(b)
            else:
                self.pool(t, inst).access(b)
            if fills is not None and fills[t]:
                self.fill_upper(inst, now, t, b)
        compute = float(prefill_seconds(q, ctx, self.timing_of(inst)))
        ready = now
        for t in range(c.n_tiers):
            hits = src.count(t)
            cnt = hits + extra[t]
            if cnt == 0:
                continue
            # the run's first block names the device queue of every tier's transfer
            fin = self.gpu_transfer(inst, now, t, cnt, False, blocks[start])
            if c.layerwise[t]:
                fin = layerwise_ready(now, fin, c.layers, compute)
            self.hits[t] += hits
            self.bytes_read[t] += cnt * c.block_bytes
            if fin > ready:
                ready = fin
        return ready

    def prefetch(
        self, inst: int, now: float, blocks: list[int], src: list[int]
    ) -> tuple[float, int]:
        """Read ``blocks`` toward the tiers above (SGLang's storage prefetch into the host pool),
        each from its tier in ``src`` (``storage_run``'s): per tier, in lookup order, its
        blocks touched tail first and read in one transfer through its connector, each transfer
        after the one before (one prefetch thread per rank reads the pages in turn). Returns
        when they have arrived and the deepest tier read; they enter the tiers above when the
        request is next tried (``ReferenceReplay.prefetched``)."""
        fin = now
        deepest = 0
        for t in range(self.cfg.n_tiers):
            mine = [b for b, s in zip(blocks, src, strict=True) if s == t]
            if not mine:
                continue
            for b in reversed(mine):
                self.pool(t, inst).access(b)
            fin = self.gpu_transfer(inst, fin, t, len(mine), False, mine[0])
            self.prefetched[t] += len(mine)
            self.bytes_read[t] += len(mine) * self.cfg.block_bytes
            deepest = t
        return fin, deepest

    def refresh(self, inst: int, blocks: list[int], h: int, end: int) -> None:
        """The copies of the HBM hits ``blocks[:h]`` in the first lower tier are touched, tail
        first (SGLang's radix node: one access time for its device and host copies; vLLM's
        OffloadingConnector touches the prompt's blocks it holds), after the sliding-window
        copies of those of the hit's last ``win_need`` blocks (it ends at ``end``) HBM holds."""
        pool = self.pool(0, inst)
        for j in range(h - 1, max(0, end - self.win_need) - 1, -1):
            for w in self.window_ids(blocks[j]):
                if pool.contains(w) and not self.down(0, inst, w):
                    pool.access(w)
        for b in reversed(blocks[:h]):
            if pool.contains(b) and not self.down(0, inst, b):
                pool.access(b)

    def fill_upper(self, inst: int, now: float, t: int, b: int) -> None:
        """Block ``b``, loaded from tier ``t``, becomes resident in every tier above ``t`` that
        ``inst`` reaches and that lacks it (SGLang's storage prefetch lands in the host pool and
        its radix tree takes the pages); the copy is the connector's staging, already timed."""
        for u in range(t):
            if not self.pool(u, inst).contains(b) and not self.down(u, inst, b):
                self.insert(inst, now, u, b, now)

    # ---- writes down -------------------------------------------------------------------------
    def sighted(self, inst: int, now: float, blocks: list[int], hbm_hits: int) -> None:
        """Count one sighting of every block of an admitted request (selective write-through)."""
        k = self.cfg.selective_k
        reached: list[int] = []
        for j, b in enumerate(blocks):
            self.sightings[b] += 1
            if j < hbm_hits and self.sightings[b] == k:
                reached.append(b)
        if self.cfg.counts_sightings and reached:
            self.write_down(inst, now, reached, self.new_block_targets())

    def computed(self, inst: int, now: float, blocks: list[int]) -> float:
        """Blocks an iteration has just computed on ``inst``: copy them down per write policy;
        returns when the copies the engine step waits for end (``now`` if none)."""
        chosen = self.writes.chosen(self, blocks)
        if chosen:
            return self.write_down(inst, now, chosen, self.new_block_targets())
        return now

    def generated(self, inst: int, now: float, blocks: list[int]) -> None:
        """A finished request's generated blocks (ids no prompt names): copied down per the
        write policy into the tiers whose connector stores them (``store_generated``); the
        engine step does not wait for them."""
        chosen = self.writes.chosen(self, blocks)
        if chosen:
            self.write_down(inst, now, chosen, self.new_block_targets(), self.cfg.store_generated)

    def hbm_evicted(self, inst: int, now: float, blocks: list[int]) -> None:
        """Blocks HBM evicted during one admission: copied to the first lower tier if cascading."""
        if self.cascade and blocks:
            self.write_down(inst, now, blocks, 1)

    def new_block_targets(self) -> int:
        """How many tiers (from the top) a copy of a new block goes to."""
        return 1 if self.cfg.exclusive else self.cfg.n_tiers

    def write_down(
        self, inst: int, now: float, blocks: list[int], n_targets: int,
        only: np.ndarray | None = None,
    ) -> float:  # fmt: skip
        """Copy ``blocks`` into the first ``n_targets`` tiers (those of them ``only`` marks,
        when given); returns when the last copy into a tier whose connector blocks the step
        ends (``now`` if none)."""
        c = self.cfg
        saved = now
        for t in range(n_targets):
            if only is not None and not only[t]:
                continue
            pool = self.pool(t, inst)
            cnt = 0
            first = -1
            # each block's sliding-window copies, then the blocks (vLLM stores the groups in
            # that order)
            for b in blocks if self.win_copies else ():
                for w in self.window_ids(b):
                    if not pool.contains(w) and not self.down(t, inst, w):
                        self.insert(inst, now, t, w, np.inf)
                        first = w if cnt == 0 else first
                        cnt += 1
            for b in blocks:
                if not pool.contains(b) and not self.down(t, inst, b):
                    self.insert(inst, now, t, b, np.inf)
                    first = b if cnt == 0 else first
                    cnt += 1
            if cnt:
                fin = self.gpu_transfer(inst, now, t, cnt, True, first)
                self.stored(inst, t, blocks, fin)
                self.bytes_written[t] += cnt * c.block_bytes
                if c.store_blocks[t] and fin > saved:
                    saved = fin
        return saved

    def stored(self, inst: int, t: int, blocks: list[int], fin: float) -> None:
        """The copies of ``blocks`` (and their sliding-window copies) this write put into tier
        ``t`` (marked ``inf``) are stored at ``fin``."""
        if not self.when_stored[t]:
            return
        at = self.stored_at[self.cfg.pool_of(t, inst)]
        for b in blocks:
            for x in (*self.window_ids(b), b) if self.win_copies else (b,):
                if at.get(x, 0.0) == np.inf:
                    at[x] = fin

    def insert(self, inst: int, now: float, t: int, b: int, stored_at: float) -> None:
        """Admit ``b`` into tier ``t``, its copy stored at ``stored_at`` (``inf``: when the
        write's transfer ends, set by ``stored``); a pool then past its high watermark evicts
        a batch (:func:`kvtier.cache.watermark.shed_count`), one victim after another. Each
        victim cascades down while the policy says so (:meth:`cascade_down`)."""
        pool = self.pool(t, inst)
        _, victim = pool.access(b)
        if self.when_stored[t]:
            self.stored_at[self.cfg.pool_of(t, inst)][b] = stored_at
        shed = shed_count(pool.size, pool.capacity, self.evict_high[t], self.evict_ratio[t])
        if victim >= 0:
            self.cascade_down(inst, now, t, victim)
        for _ in range(shed):
            self.cascade_down(inst, now, t, pool.evict_one())

    def cascade_down(self, inst: int, now: float, t: int, victim: int) -> None:
        """``victim``, evicted from tier ``t``: under write-back or exclusive, copied into
        tier ``t + 1`` unless that pool holds it or is down, and admitted there
        (:meth:`insert`) once its copy's transfer is timed."""
        c = self.cfg
        if not self.cascade or t + 1 >= c.n_tiers:
            return
        nxt = t + 1
        if self.pool(nxt, inst).contains(victim) or self.down(nxt, inst, victim):
            return
        cap = c.cap_bw[t] if c.cap_bw[t] < c.cap_bw[nxt] else c.cap_bw[nxt]
        stored_at = path_transfer(
            now,
            c.block_bytes,
            self.ops(nxt, 1),
            c.rpc_s[nxt],
            c.stream_bw[nxt, inst],
            np.inf,
            c.serial[nxt],
            c.depth[nxt],
            c.lat_s[nxt],
            cap,
            c.casc_path[t, inst],
            c.casc_scale[t],
            c.link_bw_write,
            c.link_duplex,
            c.n_links,
            self.free,
            self.busy,
            self.moved,
            self.wfree,
            c.w0[nxt, inst] + self.store_workers(),
            c.nw[nxt],
            self.wbusy,
            self.stage[nxt],
            self.cascade_device(inst, t, victim),
        )
        self.bytes_read[t] += c.block_bytes
        self.bytes_written[nxt] += c.block_bytes
        self.insert(inst, now, nxt, victim, stored_at)

    def cascade_device(self, inst: int, t: int, b: int) -> int:
        """The device queue a copy of ``b`` from tier ``t`` into ``t + 1`` crosses: the
        target's, else the source's (-1: neither has device queues)."""
        c = self.cfg
        dev = c.device_of(t + 1, c.pool_of(t + 1, inst), b)
        return dev if dev >= 0 else c.device_of(t, c.pool_of(t, inst), b)

    def check(self) -> None:
        """Capacity invariant of every pool (run after each event when checking)."""
        for pool in self.pools:
            assert 0 <= pool.size <= pool.capacity, "lower-tier capacity exceeded"

    def result(self, load_s: np.ndarray) -> dict[str, np.ndarray]:
        """The lower-tier fields of :class:`kvtier.sim.result.RawResult`."""
        return {
            "tier_hit_blocks": self.hits.copy(),
            "tier_prefetched_blocks": self.prefetched.copy(),
            "tier_bytes_read": self.bytes_read.copy(),
            "tier_bytes_written": self.bytes_written.copy(),
            "link_busy_s": self.busy.copy(),
            "link_bytes": self.moved.copy(),
            "worker_busy_s": self.wbusy.copy(),
            "stage_s": self.stage.copy(),
            "load_s": load_s,
            **(
                {"fault_lost_ids": lost_ids(self.faults.fi, self.faults.lost, self.faults.n_faults)}
                if self.faults is not None
                else {}
            ),
        }
