"""The reference serving simulator: the executable specification of docs/design.md 4.2-4.4.

Plain Python, one object per request and per instance, slow on purpose so that every rule is
visible. The numba engine (:mod:`kvtier.sim.nb`) must produce *identical* per-request times;
any change here changes it too, in the same commit. Each step is a function of its own, and
the kernel has one of the same name (suffix ``_nb``) so the two can be read side by side:
``next_event``, ``end_iteration`` (with ``first_token`` and ``finish``), the SLO test
(``SloTracker.missed`` / ``slo_missed_nb``), ``arrive`` (reject or ``route``) and
``start_iteration`` (with ``admit``). The kernel's ``run_ahead_nb`` (decode steps run ahead of
the event loop) is a faster way to do what repeated iterations do here. The rules, in the
order they apply:

Events. Time advances to the next event: the end of an instance's iteration or an arrival. At
one instant, iteration ends are processed first (instances in index order), then arrivals (trace
order), then every idle instance with work whose own event it is starts its next iteration. A
busy instance starts its next iteration at the end of the current one, so requests that arrive
in the same instant join the same iteration. An idle instance schedules only at its own events
(``Instance.wake``): a request routed or handed over to it, and its wake-up. One whose running
requests are all still loading blocks from a lower tier (or receiving their KV) wakes when the
first of them is ready (a third kind of event instant); a prefill instance whose held blocks
keep its queue waiting, when the first of them is freed; one whose step preempted and ran
nothing, at once. Another instance's events do not make it schedule (vLLM's instances are
processes of their own; docs/model.md, "Each instance schedules at its own events only").

Lower tiers (``cfg.tiers``) are :class:`kvtier.sim.reference_tiers.LowerTiers`; its
docstring has their rules. Hooks: at admission (after the HBM fit check) the lower-tier look-up,
the load rule, the loads (the request's ``ready`` time) and the sightings, then HBM's evictions
(write-back); at an iteration's end the newly computed blocks (write-through), before its
tokens are emitted: when a tier's connector blocks the step until its copies are saved
(``store_blocks``, vLLM's ``wait_for_save``), the instance stays busy until they end and the
tokens are emitted then. A request still
loading takes no tokens. With ``load_wait = "batch"`` (``cfg.tiers.batch_waits``) no request
does: while any running request is loading, after admission, the instance starts no iteration
and wakes when the last of them is ready (LMCache up to 0.3.x retrieves before the forward
pass, so every decode of the batch waits). With ``cfg.defers_loading_hits`` (vLLM's
OffloadingConnector) a load's blocks are marked until the loader is promoted (first taken into a
step after its load; its blocks are cached then) and a waiting request whose lower-tier hits
include one is skipped in the queue; with ``cfg.shares_loading_hits`` (SGLang's radix tree)
the blocks are cached at the loader's admission, marked until its first step ends, and a request
that hits them waits for their arrival (docs/model.md, "Hits another request is loading").

Load generator. Open loop (``cfg.concurrency`` 0): each request arrives at its trace time.
Closed loop (``concurrency`` N, as ``vllm bench serve --max-concurrency`` and GuideLLM's
concurrent mode): at most N requests are in flight; request ``i`` is sent at the later of its
trace time and the moment a slot frees (the last finish, or a rejection, that brought the
in-flight count below N), in trace order, and its TTFT counts from then. With every trace time
0 this is N clients each sending its next request when the last one finishes. A round barrier
(``cfg.round_size`` R, SGLang's ``bench_multiturn.py --enable-round-barrier``) also holds
request ``i`` until the first ``(i // R) * R`` requests have finished: rounds of R in trace
order, the next round sent only once the last has been answered.

Routing (at arrival). A request whose prompt plus output can never fit an instance's HBM
(``total_blocks > capacity``; with pools of two tensor-parallel sizes, the smaller pool's
capacity, :meth:`SimConfig.fit_blocks`) is rejected. Otherwise ``load`` = waiting + running
requests: ``round_robin`` takes instances in turn; ``least_loaded`` the lowest load;
``prefix_affinity``
the most HBM-resident prefix blocks among instances whose load is at most the minimum load plus
``affinity_overload``, ties by lower load, then lower index; ``kv_aware`` the lowest
``kv_overlap_weight * (input / B - eff) + active_blocks + ceil(input / B) - hbm_hits``, ``eff``
the HBM hits plus each further block found in a lower tier weighted by
:func:`kvtier.sim.routing.kv_route_weights`, ``active_blocks`` the prompt blocks of the
requests routed to the instance and not finished (Dynamo's KV router), ties by lower index.

HBM (per instance, vLLM's block pool). ``capacity`` slots (per-pool tensor parallelism: each
pool's own, :meth:`SimConfig.instance_capacity`; each iteration then takes its instance's
pool's step-time array, :meth:`SimConfig.instance_timings`). A slot holds a cached block id or
nothing. Unpinned slots wait in one free queue: allocation pops its head (evicting the cached
block there, if any); a freed slot holding a block id joins the tail, a freed anonymous slot
the head (vLLM's block_pool.free_blocks). A request frees its slots in reverse order, so its
tail leaves before its prefix (docs/design.md 4.3).

Sliding-window copies (``cfg.swa_window`` and ``swa_blocks``, prefix caching on; vLLM's hybrid
KV cache manager, docs/model.md "Sliding-window blocks in the pool"). A computed block's copies
for the sliding-window layers are born once the window has passed it (``swa_skipped``): at a
prefill chunk's end, at the request's end (the rest, its generated blocks' too) and, for loaded
blocks inside the window, at admission; each copy takes the free queue's head (evicting) and
goes back cached to its tail, a prompt block's first copy under its id (``sw_cached``). A
look-up cuts the hit back to the longest prefix whose last ``need`` copies are cached; the
admitted hit's copies inside the window go to the tail (``HbmPool.touch_sw``).

Admission (FCFS, at iteration start, after the running requests took their tokens, while
budget and ``max_num_seqs`` allow). The head of the queue looks up its prefix: the longest run
of its full blocks from block 0 cached on the instance, capped at ``(input - 1) // B`` blocks
(vLLM recomputes at least one prompt token). It needs ``total_blocks - hits`` fresh slots, where
``total_blocks = ceil((input + max(output - 1, 0)) / B)``: the whole prompt and every generated
token's KV are reserved at admission, so no running request is ever preempted. If the free queue
(minus the hit slots it holds) is too short, admission stops for this iteration (head-of-line
blocking, as vLLM). Otherwise the hit slots are pinned and the fresh slots allocated.

Iteration. Running requests in admission order take ``min(remaining prompt, budget)`` prefill
tokens or one decode token until the budget is spent; then admissions take prefill chunks. Its
time is :func:`kvtier.sim.timing.iteration_time`. At its end each scheduled request adds its
tokens to its KV; a full prompt block whose tokens are all computed gets its id registered in
the instance's cache (unless that id is already cached: then its slot stays anonymous). A
request whose prompt completes emits its first token at the iteration's end; each decode step
emits one more; after ``max(output, 1)`` tokens it finishes and frees its slots.

Token intervals (``cfg.track_tbt``). A request's first token is at the end (plus the
per-request front-end cost) of the iteration that emitted it; each later token likewise, on
whichever instance; the interval between two tokens is the difference. Its TBT tail is the
mean of its ``ceil(TBT_TAIL_SHARE * (L - 1))`` longest intervals (``L`` its output tokens),
summed in ascending order, at its finish (NaN below two tokens).

Front end. The client sees a request's first token, and its finish, the front-end costs after
the iteration that produced it: per request (``T_FRONTEND`` of the step-time array: HTTP and
the rest) and per prompt token (``T_FRONTEND_TOKEN``: tokenization, and vLLM's detokenizer
priming on the prompt); the recorded times are those. The engine does not wait for them; a
closed-loop client's freed slot (``gate``) does.
"""

from __future__ import annotations

import heapq
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from kvtier.errors import StallError
from kvtier.policy.registries import LLMD_EPP, RESERVE, ROUTERS, VLLM_V0
from kvtier.sim.config import SimConfig
from kvtier.sim.fault_step import RefFaults
from kvtier.sim.faults import fault_arrays
from kvtier.sim.reference_tiers import LowerTiers
from kvtier.sim.result import RawResult, end_time, tbt_tail_counts
from kvtier.sim.routers import RouteView
from kvtier.sim.routers.epp_index import EppIndex, index_geometry
from kvtier.sim.routers.epp_metrics import new_metrics, step_ended, step_scheduled
from kvtier.sim.routing import kv_route_weights
from kvtier.sim.slo import SloCheck
from kvtier.sim.tiers import generated_bases, generated_costs, recompute_costs, window_id_space
from kvtier.sim.timing import (
    T_FRONTEND,
    T_FRONTEND_TOKEN,
    prefill_attn_ns,
    prefill_out_of_range,
    step_extrapolated,
    step_time,
)
from kvtier.sim.transfer import layerwise_ready, ops_of, pd_transfer
from kvtier.trace.blocked import BlockedTrace

# a slot's block when it holds a full block of generated tokens (HbmPool.cache_generated)
GENERATED = -2
# a slot holding the sliding-window copy of prompt block b holds SW_MARK - b (HbmPool.churn)
SW_MARK = -3


@dataclass
class Request:
    idx: int
    arrival: float
    input_tokens: int
    output_tokens: int
    blocks: list[int]  # full prompt block ids
    total_blocks: int
    kv: int = 0  # tokens whose KV is computed (prefix hits included)
    generated: int = 0
    registered: int = 0  # prompt blocks [0, registered) are cached or were offered to the cache
    computed_from: int = 0  # prompt blocks from here on are computed (not hits, not loaded)
    ready: float = 0.0  # its prefill may start once loaded blocks have arrived
    target: int = 0  # tokens to compute before its next token: input (+ generated, resumed)
    preemptions: int = 0  # times preempted (vllm_v1)
    preempted_tokens: int = 0  # computed KV tokens discarded by its preemptions
    handed: bool = False  # disaggregated: its KV came from a prefill instance (not admitted yet)
    slots: list[int] = field(default_factory=list)  # prompt blocks' slots, then anonymous ones
    # disaggregated: its prefill instance's slots, held until its KV has been moved
    # (``release_at``; inf until the transfer is issued), and when the prefill ended
    held_slots: list[int] = field(default_factory=list)
    release_at: float = np.inf
    handed_at: float = 0.0
    pd_first: bool = False  # handed over, its first token not yet seen (at its KV's arrival)
    # its lower-tier load's end reaches the scheduler with a step's output (``polls_loads``)
    polled: bool = False
    # ``defers_loading_hits`` or ``shares_loading_hits``: its loaded prompt blocks [lo, hi),
    # marked in its instance's ``loading`` (``loading_until``) ((0, 0): none)
    loading: tuple[int, int] = (0, 0)
    # ``prefetches_at_arrival``: its prompt blocks [lo, lo + n), the deepest read from tier
    # ``t``, are read into the tiers above at its arrival, (t, lo, n) ((0, 0, 0): none), and it
    # waits in its queue until ``prefetch_ready``
    prefetch: tuple[int, int, int] = (0, 0, 0)
    prefetch_ready: float = -np.inf
    # a prefetch declined by its instance's in-flight limit or finding nothing arms a retry:
    # the scheduling pass it is re-issued at (0: armed, its pass not yet set; -1: none), and
    # the re-issues it has made (SGLang's ``StoragePrefetchRetries``)
    prefetch_retry: int = -1
    prefetch_tries: int = 0
    # the prompt blocks HBM and the tiers admission reaches held at its last prefetch lookup
    # (SGLang's ``storage_prefetch_last_match_len``; 0: none)
    prefetch_match: int = 0


class HbmPool:
    """One instance's KV block slots, its prefix cache map and its free queue."""

    def __init__(self, capacity: int, need: int = 0) -> None:
        self.capacity = capacity
        self.slot_block = [-1] * capacity
        self.ref = [0] * capacity
        self.free: OrderedDict[int, None] = OrderedDict((s, None) for s in range(capacity))
        self.cached: dict[int, int] = {}  # block id -> slot
        # vLLM's hybrid manager: a hit needs the sliding-window copies of the prefix's last
        # ``need`` blocks (0: no sliding-window layers); block id -> the slot of its copy,
        # which holds ``sw_mark(block)``
        self.need = need
        self.sw_cached: dict[int, int] = {}

    def lookup(self, blocks: list[int], cap: int) -> int:
        """Number of leading blocks cached here (the reusable prefix), at most ``cap``; with
        sliding-window layers, cut back to the longest prefix whose last ``need`` blocks'
        sliding-window copies are cached too (vLLM's ``SlidingWindowManager.
        find_longest_cache_hit``, searched from the right; a run from block 0 shorter than
        ``need`` counts)."""
        hits = 0
        while hits < cap and blocks[hits] in self.cached:
            hits += 1
        if self.need == 0:
            return hits
        run = 0
        for i in range(hits - 1, -1, -1):
            if blocks[i] in self.sw_cached:
                run += 1
                if run >= self.need:
                    return i + run
            else:
                run = 0
        return run

    def touch_sw(self, blocks: list[int], lo: int, hi: int) -> None:
        """A hit touches the sliding-window copies of blocks ``lo:hi`` (those inside the
        window); vLLM frees them again when the window passes them, one step later: here they
        go to the free queue's tail at once."""
        for j in range(lo, hi):
            slot = self.sw_cached.get(blocks[j])
            if slot is not None and slot in self.free:
                self.free.move_to_end(slot)

    def can_admit(self, blocks: list[int], hits: int, need: int) -> bool:
        """Whether ``need`` fresh slots remain after pinning the ``hits`` cached slots."""
        pinned_from_free = {self.cached[b] for b in blocks[:hits] if self.ref[self.cached[b]] == 0}
        return need <= len(self.free) - len(pinned_from_free)

    def pin(self, block: int) -> int:
        slot = self.cached[block]
        if self.ref[slot] == 0:
            del self.free[slot]
        self.ref[slot] += 1
        return slot

    def take_head(self, evicted: list[int]) -> int:
        """Take the free queue's head slot; a block cached there is evicted (a prompt's is
        appended to ``evicted``; a sliding-window copy leaves its map; a generated block,
        which no prompt names, goes nowhere)."""
        slot, _ = self.free.popitem(last=False)
        old = self.slot_block[slot]
        if old >= 0:
            del self.cached[old]
            evicted.append(old)
        elif old <= SW_MARK:
            del self.sw_cached[SW_MARK - old]
        return slot

    def allocate(self, evicted: list[int]) -> int:
        """Take the free queue's head for a request (:meth:`take_head`), held once."""
        slot = self.take_head(evicted)
        self.slot_block[slot] = -1
        self.ref[slot] = 1
        return slot

    def register(self, slot: int, block: int) -> None:
        if block not in self.cached:
            self.cached[block] = slot
            self.slot_block[slot] = block

    def cache_generated(self, slots: list[int]) -> None:
        """A finished request's full blocks of generated tokens stay cached, as vLLM V1 hashes
        and caches them (``Request.append_output_token_ids`` extends ``block_hashes``,
        ``KVCacheManager.allocate_slots`` caches up to ``request.num_tokens``): released, they
        join the free queue's tail (least recently used last) where an anonymous slot goes to
        its head. No later prompt names them, so they are never hit nor copied down."""
        for slot in slots:
            if self.slot_block[slot] == -1:
                self.slot_block[slot] = GENERATED

    def churn(self, n: int, evicted: list[int], name: int = -1) -> None:
        """vLLM's hybrid KV cache manager: ``n`` sliding-window copies of a block left the
        window. Each took a slot from the free queue's head (evicting the block cached there,
        appended to ``evicted`` if a prompt's) and went back, cached, to its tail (at most one
        pass over the free queue). The first is the copy of prompt block ``name`` that look-ups
        ask for (unless one is cached already; -1: a generated token's block); the others
        (more sliding-window groups) are cached under hashes no look-up here names."""
        for x in range(min(n, len(self.free))):
            slot = self.take_head(evicted)
            self.slot_block[slot] = GENERATED
            if x == 0 and name >= 0 and name not in self.sw_cached:
                self.sw_cached[name] = slot
                self.slot_block[slot] = SW_MARK - name
            self.free[slot] = None

    def release(self, slots: list[int]) -> None:
        for slot in reversed(slots):
            self.ref[slot] -= 1
            if self.ref[slot] == 0:
                self.free[slot] = None
                if self.slot_block[slot] == -1:
                    self.free.move_to_end(slot, last=False)

    def check(self, running: list[Request], grows_b: int = 0, held: int = 0) -> None:
        """Capacity invariant: pinned + free == capacity, pins match the running requests
        (and the ``held`` slots of handed-over requests whose KV is still moving); each holds
        its whole footprint (vllm_v1, ``grows_b`` = B: at least its computed KV, at most the
        footprint)."""
        pinned = sum(1 for r in self.ref if r > 0)
        assert pinned + len(self.free) == self.capacity, "HBM slots lost or double-counted"
        assert pinned <= self.capacity, "HBM capacity exceeded"
        assert sum(self.ref) == sum(len(r.slots) for r in running) + held, "pin count mismatch"
        if grows_b:
            assert all(-(-r.kv // grows_b) <= len(r.slots) <= r.total_blocks for r in running)
        else:
            assert all(len(r.slots) == r.total_blocks for r in running), "footprint not reserved"
        for block, slot in self.cached.items():
            assert self.slot_block[slot] == block
        for block, slot in self.sw_cached.items():
            assert self.slot_block[slot] == SW_MARK - block and self.ref[slot] == 0
        assert all(self.ref[s] == 0 for s in self.free)


class Instance:
    def __init__(self, capacity: int, need: int = 0) -> None:
        self.pool = HbmPool(capacity, need)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.busy_until: float | None = None
        self.scheduled: list[tuple[Request, int]] = []
        self.busy_time = 0.0
        # while idle with work: when it next schedules (now: its iteration ended, a request
        # was routed or handed to it, or it preempted; else a load's or a transfer's end)
        self.wake = np.inf
        self.active_blocks = 0  # prompt blocks of the requests routed here, not finished
        self.saving = False  # the iteration has ended, its blocking stores have not
        self.held: list[Request] = []  # handed-over requests whose blocks it holds, in order
        self.iter_dt = 0.0  # the last iteration's duration (a layer-wise push overlaps it)
        # async scheduling: when the last iteration started, and when an iteration ended with
        # a request running on past it (-inf: never), whose next step was scheduled ahead
        self.iter_start = -np.inf
        self.runs_on_at = -np.inf
        # vLLM's KV connector (``polls_loads``): when the last iteration ended (-inf: none in
        # flight, the engine polls at once), and when the last two started were decided,
        # i.e. when their workers polled for finished loads (``get_finished``)
        self.ended_at = -np.inf
        self.polled_at = -np.inf
        self.polled_before = -np.inf
        # ``defers_loading_hits``: block id -> running requests loading it whose loaded
        # blocks are not yet in HBM's cache (vLLM's ``_blocks_being_loaded``)
        self.loading: Counter[int] = Counter()
        # ``shares_loading_hits``: block id -> when the load of a block cached at its loader's
        # admission ends, until the loader's first step ends
        self.loading_until: dict[int, float] = {}
        # ``prefetches_at_arrival``: prompt blocks the storage prefetches in flight have
        # reserved (SGLang's ``prefetch_tokens_occupied``, in blocks), and the scheduling passes
        # counted for their retries
        self.prefetch_held = 0
        self.passes = 0

    def held_slots(self) -> int:
        return sum(len(r.held_slots) for r in self.held)

    @property
    def load(self) -> int:
        return len(self.waiting) + len(self.running)


def total_blocks_of(input_tokens: int, output_tokens: int, block_tokens: int) -> int:
    """HBM blocks a request holds at its largest: prompt plus every generated token but the last."""
    tokens = input_tokens + max(output_tokens - 1, 0)
    return -(-tokens // block_tokens)


class ReferenceReplay:
    """One replay in the reference engine: the state of every request, instance and tier as
    plain attributes, and each step of the event loop a method over it (the numba engine's
    steps in :mod:`kvtier.sim.nb` carry the same names)."""

    def __init__(
        self,
        trace: BlockedTrace,
        cfg: SimConfig,
        slo: SloCheck | None,
        check_invariants: bool,
    ) -> None:
        self.trace = trace
        self.cfg = cfg
        self.slo = slo
        self.check_invariants = check_invariants
        self.n = trace.n_requests
        self.B = self.cfg.block_tokens
        tp = self.cfg.timing_params()
        self.fe = float(tp[T_FRONTEND])  # per-request front-end seconds (kvtier.sim.timing)
        self.fe_token = float(tp[T_FRONTEND_TOKEN])  # and per prompt token
        self.first = np.full(self.n, np.nan)
        self.finish_s = np.full(self.n, np.nan)
        self.hits_out = np.zeros(self.n, dtype=np.int64)
        self.inst_of = np.full(self.n, -1, dtype=np.int64)
        # per-pool tensor parallelism: each instance's HBM blocks, watermark and step-time array
        caps = [int(c) for c in self.cfg.instance_capacity()]
        self.marks = [int(w) for w in self.cfg.instance_watermark()]
        self.timing_of = self.cfg.instance_timings()
        self.fit = min(caps)  # a request larger than the smallest instance is never served
        # vLLM's hybrid manager: the sliding-window copies a hit needs (0: none)
        need = 0
        if self.cfg.prefix_caching and self.cfg.swa_window > 0 and self.cfg.swa_blocks > 0:
            need = max(1, -(-(self.cfg.swa_window - 1) // self.B))
        self.instances = [Instance(caps[k], need) for k in range(self.cfg.n_instances)]
        self.requests = [
            Request(
                idx=i,
                arrival=float(trace.arrival_s[i]),
                input_tokens=int(trace.input_tokens[i]),
                output_tokens=int(trace.output_tokens[i]),
                blocks=trace.request_blocks(i).tolist(),
                total_blocks=total_blocks_of(
                    int(trace.input_tokens[i]), int(trace.output_tokens[i]), self.B
                ),
                target=int(trace.input_tokens[i]),
            )
            for i in range(self.n)
        ]
        self.tracker = slo.tracker(self.n) if slo is not None else None
        self.prefix = self.cfg.prefix_caching  # vLLM's own prefix cache (off: no HBM hits)
        # vLLM's hybrid KV cache manager: sliding-window blocks stay cached in the pool
        self.swa = self.prefix and self.cfg.swa_window > 0 and self.cfg.swa_blocks > 0
        self.lower = None
        self.gen_base = None  # ids of the generated blocks a connector stores (generated_bases)
        if self.cfg.tiers is not None:
            self.lower = self.lower_tiers(trace, tp)
        self.grows = self.cfg.scheduler != RESERVE  # blocks allocated as requests grow, preemption
        self.v0 = self.cfg.scheduler == VLLM_V0  # prompts whole, in iterations without decodes
        # a waiting request whose lower-tier hits another request is loading is skipped
        # (``admit`` sets ``deferred``: the admission loop moves on to the next request)
        self.defers = self.cfg.defers_loading_hits
        self.deferred = False
        # a request's loaded blocks enter HBM's cache at its admission; one that hits them
        # before they have arrived waits for them (``share_loads``)
        self.shares = self.cfg.shares_loading_hits
        # a request's hits in a prefetching tier are read into the tiers above at its arrival;
        # it waits in its queue until they are there (``prefetch``)
        self.prefetches = self.cfg.prefetches_at_arrival
        # a request's HBM hits refresh their copies in the first lower tier (``refresh``)
        self.refreshes = self.cfg.refreshes_host_on_hbm_hit
        self.reserves_full = self.cfg.reserve_full_prompt
        # disaggregated: instances [0, n_pf) prefill, the rest decode
        self.n_pf = self.cfg.n_prefill
        # the router's instances
        self.n_route = self.n_pf if self.n_pf > 0 else self.cfg.n_instances
        self.pd = self.cfg.pd if self.n_pf > 0 else None
        if self.pd is not None and self.lower is not None:
            self.link_free, self.link_busy, self.link_moved = (
                self.lower.free,
                self.lower.busy,
                self.lower.moved,
            )  # shared queues
        else:
            n_links = self.pd.n_links if self.pd is not None else 0
            self.link_free, self.link_busy, self.link_moved = (
                np.zeros(2 * n_links),
                np.zeros(n_links),
                np.zeros(n_links),
            )
        pd_workers = self.pd.workers if self.pd is not None else 1
        # the decode side moves only the blocks past its own prefix hit (a pull: a layer-wise
        # push leaves before the decode instance admits the request, so it moves every block)
        self.trim = self.pd is not None and self.pd.decode_hit and not self.pd.layerwise
        self.pd_wfree = np.zeros(self.cfg.n_instances * pd_workers)  # the P/D connector's workers
        self.pd_wbusy = np.zeros(self.cfg.n_instances * pd_workers)
        self.decode_of = np.full(self.n, -1, dtype=np.int64)
        self.pd_s = np.zeros(self.n)  # seconds from prefill end to the KV's arrival
        self.decode_hits = np.zeros(self.n, dtype=np.int64)  # prompt blocks its decode held
        self.preempted_out = np.zeros(self.n, dtype=np.int64)
        self.preempted_tok = np.zeros(self.n, dtype=np.int64)
        self.load_s = np.zeros(self.n)
        self.loaded_blocks = np.zeros(
            (self.n, self.cfg.tiers.n_tiers if self.cfg.tiers is not None else 0), np.int64
        )
        # the router: its module's reference step over the instances it reads
        self.router = ROUTERS.by_code(self.cfg.router).load()
        # llmd_epp: each instance's last steps' metrics, as the EPP scrapes them
        stale = self.cfg.router == LLMD_EPP and self.cfg.epp_metrics_interval_s > 0
        self.epp_mx = new_metrics(self.cfg.n_instances) if stale else None
        self.routing = RouteView(
            self.instances,
            self.n_route,
            self.cfg,
            self.prefix,
            self.lower,
            kv_route_weights(self.cfg),
            cold_stamp=[0] * self.cfg.n_instances,
            epp_index=self._epp_index(),
            epp_metrics=self.epp_mx,
        )
        self.nxt = 0
        self.in_flight = 0  # requests sent and not finished (closed loop)
        self.gate = 0.0  # when the last slot freed (closed loop)
        self.sent_s = np.array([r.arrival for r in self.requests], dtype=np.float64)
        self.n_iter = 0
        # self-preemptions of a request alone on its instance, and how many stop the replay
        self.stalls = 0
        self.load_stalls = 0  # the others, since the last token any request emitted
        self.stall_limit = self.n * max(caps) * self.B
        self.n_extrap = 0  # iterations whose measured step time was extrapolated
        self.early = False
        self.track = self.cfg.track_tbt  # token intervals (RawResult.tbt_tail_s)
        self.tail_k = [int(x) for x in tbt_tail_counts(trace.output_tokens)] if self.track else []
        # min-heaps
        self.tails: list[list[float]] = [[] for _ in range(self.n)] if self.track else []
        # when each request's last token was seen
        self.last_token = [0.0] * self.n if self.track else []
        self.tbt_out = np.full(self.n, np.nan) if self.track else None

    def lower_tiers(self, trace: BlockedTrace, tp: np.ndarray) -> LowerTiers:
        """The tiers below HBM: GDSF's recompute cost per block id, the ids of the generated
        blocks a connector stores (``gen_base``), the failed devices, and the tiers an
        admission's lookup stops at (those only a storage prefetch at arrival reads)."""
        compute = (float(tp[0]), float(tp[1]), float(tp[2]))
        costs = recompute_costs(
            trace.block_offsets, trace.block_ids, trace.n_blocks, self.B, *compute
        )  # GDSF's cost per block
        n_ids = trace.n_blocks
        if self.cfg.tiers.stores_generated:
            self.gen_base = generated_bases(
                trace.input_tokens, trace.output_tokens, self.B, trace.n_blocks
            )
            n_ids = int(self.gen_base[-1])
            costs = generated_costs(costs, self.gen_base, trace.input_tokens, self.B, *compute)
        copies, need = self.cfg.tier_window
        costs, n_ids, win_off = window_id_space(costs, n_ids, copies)
        faults = None
        if self.cfg.faults:
            fi, ft, lost = fault_arrays(self.cfg.faults, self.cfg.tiers, n_ids)
            faults = RefFaults(fi, ft, lost, n_ids, len(self.cfg.faults))
        lower = LowerTiers(
            self.cfg.tiers, n_ids, self.timing_of if self.cfg.two_pools else tp, costs, faults
        )
        lower.read_at_arrival = self.cfg.tiers_read_at_arrival
        if copies:
            lower.win_off, lower.win_copies, lower.win_need = win_off, copies, need
        return lower

    def token(self, req: Request, t: float) -> None:
        """``req`` emitted a token after its first in the iteration ending at ``t``: its
        interval joins the request's longest ones (a min-heap of ``tail_k`` values)."""
        self.load_stalls = 0  # the replay progresses
        if not self.track:
            return
        i = req.idx
        seen = t + self.fe
        x = seen - self.last_token[i]
        self.last_token[i] = seen
        h = self.tails[i]
        if len(h) < self.tail_k[i]:
            heapq.heappush(h, x)
        elif self.tail_k[i] > 0 and x > h[0]:
            heapq.heapreplace(h, x)

    def tbt_tail(self, req: Request) -> None:
        """At ``req``'s finish: the mean of its longest intervals, summed in ascending order
        (as the kernel does), counted by the SLO."""
        i = req.idx
        if not self.track or self.tail_k[i] == 0:
            return
        s = 0.0
        for v in sorted(self.tails[i]):
            s += v
        self.tbt_out[i] = s / self.tail_k[i]
        if self.tracker is not None:
            self.tracker.tbt(self.tbt_out[i])

    def next_arrival(self) -> float:
        """When request ``nxt`` is sent (closed loop: once a slot is free and, behind a round
        barrier of ``cfg.round_size``, every request of the rounds before its own finished)."""
        if self.nxt >= self.n:
            return np.inf
        a = self.requests[self.nxt].arrival
        if self.cfg.concurrency > 0:
            if self.in_flight >= self.cfg.concurrency:
                return np.inf
            size = self.cfg.round_size
            if size > 0 and self.nxt - self.in_flight < (self.nxt // size) * size:
                return np.inf  # (the sent less those in flight: finished or rejected)
            return a if a > self.gate else self.gate
        return a

    def next_event(self) -> float:
        """The next instant: an arrival, an iteration's end or an idle instance's wake-up."""
        t_arr = self.next_arrival()
        busy = [inst.busy_until for inst in self.instances if inst.busy_until is not None]
        t_end = min(busy) if busy else np.inf
        wakes = [inst.wake for inst in self.instances if inst.busy_until is None]
        t_wake = min(wakes) if wakes else np.inf
        return min(t_arr, t_end, t_wake)

    def _epp_index(self) -> EppIndex | None:
        """llmd_epp's approximate indexes when it reads them (``SimConfig.epp_index``)."""
        if self.cfg.router != ROUTERS.codes["llmd_epp"] or not self.cfg.epp_index:
            return None
        caps = np.array([inst.pool.capacity for inst in self.instances], dtype=np.int64)
        return EppIndex(
            index_geometry(self.cfg.epp_index, caps, self.B, self.cfg.epp_bytes_per_token)
        )

    def arrive(self, req: Request, t: float) -> None:
        """``req`` arrives at ``t``: rejected if it can never fit, else routed to a waiting
        queue (closed loop: it takes a slot until it finishes)."""
        req.arrival = t
        self.sent_s[req.idx] = t
        if req.total_blocks > self.fit or (self.v0 and req.input_tokens > self.cfg.token_budget):
            # (vLLM v0 ignores a prompt longer than its token budget: it can never be scheduled)
            if self.tracker is not None:
                self.tracker.rejected()
            return
        self.in_flight += 1
        k = self.router.route(self.routing, req)
        self.inst_of[req.idx] = k
        self.instances[k].waiting.append(req)
        self.instances[k].wake = t  # its scheduler sees the new request now
        self.instances[k].active_blocks += -(-req.input_tokens // self.B)
        if self.prefetches:
            self.prefetch(self.instances[k], k, req, t)

    def prefetch(self, inst: Instance, k: int, req: Request, t: float) -> None:
        """SGLang's storage prefetch (``_prefetch_kvcache``, at arrival and at a retry): past
        the prefix HBM and the tiers admission reaches hold, the run of blocks the prefetching
        tiers hold is read into the tiers above now, and the request waits in its queue until
        it has arrived (``wait_complete``). Declined when the prompt left is under
        ``prefetch_min_blocks``; when the instance's prefetches in flight already hold
        ``prefetch_limit_tokens``, or the tier holds none of it, a retry is armed."""
        cap = self.prompt_cap(req)
        lo = self.reachable(inst, k, req, cap)
        req.prefetch_match = lo
        if cap - lo < self.cfg.prefetch_min_blocks:
            return  # (no lookup was issued: no retry)
        if inst.prefetch_held * self.B >= self.cfg.prefetch_limit_tokens:
            req.prefetch_retry = 0  # (declined, rate limited)
            return
        src = self.lower.storage_run(k, req.blocks, lo, cap)
        n = len(src)
        if n == 0:
            req.prefetch_retry = 0  # (a miss: a backup may still be committing)
            return
        inst.prefetch_held += cap - lo  # (the whole prompt left is reserved)
        req.prefetch_ready, tier = self.lower.prefetch(k, t, req.blocks[lo : lo + n], src)
        req.prefetch = (tier, lo, n)

    def prompt_cap(self, req: Request) -> int:
        """The prompt blocks ``req`` may find cached: those before its last token."""
        return min((req.target - 1) // self.B, len(req.blocks))

    def reachable(self, inst: Instance, k: int, req: Request, cap: int) -> int:
        """The prompt blocks HBM and then the tiers admission reaches hold, at most ``cap``."""
        h = inst.pool.lookup(req.blocks, cap)
        return h + len(self.lower.lookup(k, req.blocks, h, cap))

    def hit_lost(self, inst: Instance, k: int, req: Request, t: float) -> bool:
        """Did ``req``'s prefix in HBM and the host tier shrink since its last prefetch lookup
        (evicted while it waited)? Then, within its attempts, the storage lookup is issued
        again and the request skipped this pass (SGLang's ``_prefetch_after_device_hit_loss``);
        past them the shorter match is admitted."""
        now_held = self.reachable(inst, k, req, self.prompt_cap(req))
        if now_held >= req.prefetch_match:
            return False
        if req.prefetch_tries >= self.cfg.prefetch_retry_attempts:
            req.prefetch_match = now_held
            return False
        req.prefetch_tries += 1
        self.prefetch(inst, k, req, t)
        return True

    def prefetched(self, inst: Instance, k: int, req: Request, t: float) -> None:
        """``req``'s prefetch has ended and the scheduler reaches it: the blocks it read enter
        the tiers above their sources (SGLang inserts them into the host radix tree; each
        fills the tiers above the deepest read that lack it) and its reservation is released."""
        tier, lo, n = req.prefetch
        req.prefetch = (0, 0, 0)
        inst.prefetch_held -= self.prompt_cap(req) - lo
        for b in req.blocks[lo : lo + n]:
            self.lower.fill_upper(k, t, tier, b)

    def retry_prefetches(self, inst: Instance, k: int, t: float) -> None:
        """A scheduling pass re-issues the prefetches whose retry is due, in queue order
        (SGLang's ``StoragePrefetchRetries.pop_ready``): the queue's head drops its retry (it
        is admitted with what the device and host hold); a retry is due
        ``prefetch_retry_passes`` passes after the first that sees it, and a request makes at
        most ``prefetch_retry_attempts`` re-issues."""
        inst.passes += 1
        if inst.waiting:
            inst.waiting[0].prefetch_retry = -1
        for req in list(inst.waiting):
            if req.prefetch_retry < 0:
                continue
            if req.prefetch_tries >= self.cfg.prefetch_retry_attempts:
                req.prefetch_retry = -1
                continue
            if self.cfg.prefetch_retry_passes <= 0:
                req.prefetch_retry = -1
                continue
            if req.prefetch_retry == 0:
                req.prefetch_retry = inst.passes + self.cfg.prefetch_retry_passes
            if req.prefetch_retry > inst.passes:
                continue
            req.prefetch_retry = -1
            req.prefetch_tries += 1
            self.prefetch(inst, k, req, t)

    def admit(
        self,
        inst: Instance,
        k: int,
        req: Request,
        now: float,
        budget: int,
        busy: bool,
        issue: float | None = None,
        keep: int = 0,
    ) -> bool:
        """Admit ``req`` on instance ``k`` if its fresh slots fit: look up its prefix (HBM,
        then the lower tiers), load, pin the hits and allocate the rest (``reserve``: the whole
        footprint; ``vllm_v1``: the blocks of its first chunk of ``budget`` tokens, keeping
        the watermark free when another request is ``busy`` in this iteration, and ``keep``
        blocks more: prefill_first's running decodes' next blocks; ``vllm_v0``:
        the blocks of its whole prompt, always keeping the watermark free). A load starts at
        ``issue`` (default ``now``: ``polls_loads`` with async scheduling, when the step was
        decided)."""
        pool = inst.pool
        issue = now if issue is None else issue
        if req.handed:
            return self.admit_handed(inst, k, req, now)
        cap = self.prompt_cap(req)
        h = pool.lookup(req.blocks, cap) if self.prefix else 0
        src: list[int] = []
        loaded = 0
        if self.grows:
            # vLLM V1's allocate_slots: the blocks of the tokens this step computes
            if self.lower is not None:
                src = self.lower.lookup(k, req.blocks, h, cap, now)
                if self.defers and any(inst.loading[b] for b in req.blocks[h : h + len(src)]):
                    # vLLM's OffloadingConnector: its hits are being loaded, it waits
                    self.deferred = True
                    return False
                loaded = self.lower.chosen_run(k, now, req.blocks, src, h, self.B)
            kv0 = (h + loaded) * self.B
            step = req.target - kv0 if self.v0 else min(req.target - kv0, budget)
            need = -(-(kv0 + step) // self.B) - h
            # vLLM v0's can_allocate keeps the watermark free whatever else runs (kvtier: not
            # when the instance runs nothing, where vLLM would drop a prompt that cannot fit)
            reserve = self.marks[k] if busy or (self.v0 and inst.running) else 0
            reserve += keep
            gate = self.admission_gate(req.target, h, kv0, need, pool.capacity)
        else:
            need = gate = req.total_blocks - h
            reserve = 0
        if not pool.can_admit(req.blocks, h, gate + reserve):
            return False
        req.ready = now
        req.polled = False
        if self.lower is not None:
            if not self.grows:
                src = self.lower.lookup(k, req.blocks, h, cap, now)
                loaded = self.lower.chosen_run(k, now, req.blocks, src, h, self.B)
            if loaded:
                done_tokens = (h + loaded) * self.B
                req.ready = self.lower.load(
                    k, issue, req.blocks, h, src[:loaded], req.target - done_tokens,
                    done_tokens,
                )  # fmt: skip
                req.polled = self.cfg.polls_loads
                if self.defers:
                    req.loading = (h, h + loaded)
                    inst.loading.update(req.blocks[h : h + loaded])
                if req.preemptions == 0:  # the first admission's (the prompt's)
                    self.load_s[req.idx] = req.ready - issue
                    for t in src[:loaded]:
                        self.loaded_blocks[req.idx, t] += 1
            self.lower.sighted(k, now, req.blocks, h)
        evicted: list[int] = []
        req.slots = [pool.pin(b) for b in req.blocks[:h]]
        req.slots += [pool.allocate(evicted) for _ in range(need)]
        if self.lower is not None:
            self.lower.hbm_evicted(k, now, evicted)
        if self.swa and h + loaded > 0:
            self.swa_admitted(inst, k, req, h, (h + loaded) * self.B, now)
        req.kv = (h + loaded) * self.B
        req.registered = h
        req.computed_from = h + loaded
        if self.shares:
            self.share_loads(inst, req, h, loaded)
        if req.preemptions == 0:  # hits and loads of its first admission (the prompt's)
            self.hits_out[req.idx] = h
        return True

    def admit_handed(self, inst: Instance, k: int, req: Request, now: float) -> bool:
        """A decode instance admits a request whose KV a prefill instance computed: blocks for
        its prompt and first decode token (``reserve``: its footprint). A connector that moves
        only what the decode side lacks (``trim``: vLLM's NixlConnector) first looks
        the prompt up in this instance's HBM prefix cache, as an aggregated admission does
        (vLLM's ``get_computed_blocks``, capped below the last prompt token): the hits are
        pinned, blocks are allocated for the rest, and the pulled blocks become cache entries
        at the end of the request's first iteration here (its KV has arrived). Otherwise no
        look-up, and the pulled blocks are not cached on the decode side. It decodes once its
        KV has arrived (``ready``)."""
        kv0 = req.input_tokens
        pool = inst.pool
        h = 0
        if self.trim and self.prefix:
            h = pool.lookup(req.blocks, min((kv0 - 1) // self.B, len(req.blocks)))
        need = (-(-(kv0 + 1) // self.B) if self.grows else req.total_blocks) - h
        if not pool.can_admit(req.blocks, h, need):
            return False
        evicted: list[int] = []
        req.slots = [pool.pin(b) for b in req.blocks[:h]]
        req.slots += [pool.allocate(evicted) for _ in range(need)]
        if self.lower is not None:
            self.lower.hbm_evicted(k, now, evicted)
        if self.swa and h > 0:
            self.swa_admitted(inst, k, req, h, h * self.B, now)
        req.handed = False
        req.polled = False  # its KV's arrival is not read through the connector poll
        req.kv = req.target = kv0
        # cached from the hit on (trim), else never on the decode side
        req.registered = h if self.trim else len(req.blocks)
        req.computed_from = len(req.blocks)  # pulled, not computed: no copies to lower tiers
        self.decode_hits[req.idx] = h
        if not self.pd.layerwise:
            # the decode side pulls the KV past its hit into the blocks it has just allocated
            # (vLLM's NixlConnector); the prefill instance frees its blocks once they are read
            end = self.pd_move(int(self.inst_of[req.idx]), k, req, now, k, h)
            self.arrived(req, end)
        return True

    def pd_move(self, p: int, d: int, req: Request, now: float, worker: int, hits: int) -> float:
        """Move ``req``'s prompt KV from instance ``p`` to ``d`` through the P/D connector
        (on instance ``worker``'s connector workers), all but the ``hits`` leading blocks the
        decode side holds; returns when it ends."""
        blocks = -(-req.input_tokens // self.B) - hits
        pd = self.pd
        w = pd.workers
        return pd_transfer(
            now, blocks * pd.block_bytes, ops_of(pd.unit, blocks, pd.fragments, pd.coalesce),
            pd.rpc_s, pd.stream_bw, pd.stage_bw, pd.serial, pd.depth, pd.lat_s[p, d],
            pd.path[p, d], pd.queue[p, d], pd.scale[p, d], pd.link_bw_read, pd.link_bw_write,
            pd.link_duplex, pd.n_links, self.link_free, self.link_busy, self.link_moved,
            self.pd_wfree, worker * w, w, self.pd_wbusy,
        )  # fmt: skip

    def arrived(self, req: Request, end: float) -> None:
        """``req``'s KV is on its decode instance at ``end`` (its first token then, recorded
        by ``seen_first`` when it is first scheduled there); its prefill instance frees its
        blocks at its first step from then on (waking then if idle with work)."""
        req.ready = max(req.ready, end)
        req.release_at = end
        p = self.instances[int(self.inst_of[req.idx])]
        if p.busy_until is None and (p.running or p.waiting) and end < p.wake:
            p.wake = end

    def seen_first(self, req: Request) -> None:
        """The first iteration of a handed-over request on its decode instance has ended: its
        first token was seen when its KV arrived (``ready``). Recorded at an iteration's end,
        as every first token is (the SLO's early stop sees them there), and only once the
        KV is in use: a request preempted while its KV is still arriving pulls it again and
        records the arrival that counted."""
        req.pd_first = False
        self.first_token(req, req.ready)
        self.pd_s[req.idx] = req.ready - req.handed_at

    def release_held(self, inst: Instance, t: float) -> None:
        """Disaggregated prefill instance: free the blocks of handed-over requests whose KV
        has been moved by ``t`` (in hand-off order; their prompt blocks stay cached)."""
        if not inst.held:
            return
        keep: list[Request] = []
        for req in inst.held:
            if req.release_at <= t:
                inst.pool.release(req.held_slots)
                req.held_slots = []
            else:
                keep.append(req)
        inst.held = keep

    def hand_off(self, inst: Instance, k: int, req: Request, t: float) -> None:
        """Disaggregated: ``req``'s prompt is complete on a prefill instance, which keeps its
        blocks until the KV has been moved; it joins the least loaded decode instance (lower
        index on ties). A layer-wise connector pushes the KV now, overlapped with the
        iteration that computed it (``layerwise_ready``); otherwise the decode side pulls it
        once it has allocated the request's blocks (``admit_handed``)."""
        req.held_slots = req.slots
        req.slots = []
        req.release_at = np.inf
        req.handed_at = t
        inst.held.append(req)
        loads = [self.instances[d].load for d in range(self.n_route, self.cfg.n_instances)]
        d = self.n_route + loads.index(min(loads))
        req.generated = 1
        self.decode_of[req.idx] = d
        req.handed = True
        req.pd_first = True
        req.ready = t
        if self.pd.layerwise:
            end = layerwise_ready(t, self.pd_move(k, d, req, t, k, 0), self.pd.layers, inst.iter_dt)
            self.arrived(req, end)
        inst.active_blocks -= -(-req.input_tokens // self.B)
        self.instances[d].active_blocks += -(-req.input_tokens // self.B)
        self.instances[d].waiting.append(req)
        self.instances[d].wake = t  # its scheduler sees the handed-over request now

    def grow(self, inst: Instance, k: int, req: Request, tokens: int, now: float) -> bool:
        """vllm_v1: allocate the blocks ``req`` needs to hold ``tokens`` tokens of KV; False
        (nothing allocated) when the free queue is too short."""
        need = -(-tokens // self.B) - len(req.slots)
        if need <= 0:
            return True
        if need > len(inst.pool.free):
            return False
        evicted: list[int] = []
        req.slots += [inst.pool.allocate(evicted) for _ in range(need)]
        if self.lower is not None:
            self.lower.hbm_evicted(k, now, evicted)
        return True

    def admission_gate(self, tokens: int, h: int, kv0: int, need: int, capacity: int) -> int:
        """The fresh blocks a vllm_v1 admission checks for: its first chunk's ``need``, or
        under vLLM's scheduler_reserve_full_isl those of its whole sequence of ``tokens`` less
        its ``h`` hits when more. vLLM's ``can_fit_full_sequence`` sums every KV cache group's
        blocks: with sliding-window layers, that group's too, from the window's start after
        the ``kv0`` tokens hit or loaded (``SlidingWindowManager.get_num_blocks_to_allocate``:
        a cold prompt checks for twice its blocks, a full hit for its window's), never more than
        an idle instance of ``capacity`` blocks has beside the hits: vLLM sizes its pool so that
        one request of the longest length passes (a request kvtier routes fits the pool)."""
        if not self.reserves_full or self.v0:
            return need
        blocks = -(-tokens // self.B)
        full = blocks - h
        if self.swa:
            # vLLM caps the group's count of the sequence (max_admission_blocks_per_request)
            # and compares it with block positions, as here
            cap = self.cfg.swa_admission_blocks
            window = min(blocks, cap) if cap > 0 else blocks
            full += self.cfg.swa_blocks * max(window - max(self.swa_skipped(kv0), h), 0)
            full = min(full, capacity - h)
        return max(need, full)

    def swa_skipped(self, tokens: int) -> int:
        """Blocks of a sliding-window group behind the window once ``tokens`` tokens are
        computed (vLLM's ``SlidingWindowManager.get_num_skipped_tokens`` in whole blocks)."""
        return max(tokens - self.cfg.swa_window + 1, 0) // self.B

    def swa_churn(self, inst: Instance, k: int, req: Request, lo: int, hi: int, t: float) -> None:
        """The sliding-window copies of ``req``'s blocks ``lo:hi`` left the window on instance
        ``k``: vLLM's hybrid manager frees them cached into the shared block pool, the last
        first (:meth:`HbmPool.churn`, ``cfg.swa_blocks`` pool blocks each, a prompt block's
        first copy named); HBM's evictions go to the lower tiers, block by block."""
        nb = len(req.blocks)
        for j in range(hi - 1, lo - 1, -1):
            evicted: list[int] = []
            inst.pool.churn(self.cfg.swa_blocks, evicted, req.blocks[j] if j < nb else -1)
            if self.lower is not None:
                self.lower.hbm_evicted(k, t, evicted)

    def swa_admitted(
        self, inst: Instance, k: int, req: Request, h: int, kv0: int, t: float
    ) -> None:
        """``req`` was admitted on instance ``k`` with ``h`` blocks hit in HBM and its KV up
        to ``kv0`` tokens hit or being loaded: vLLM touches the sliding-window copies of the
        hit blocks inside the window (:meth:`HbmPool.touch_sw`) and allocates, and caches,
        copies for the loaded blocks inside it (born now, :meth:`swa_churn`)."""
        lo = self.swa_skipped(kv0)
        inst.pool.touch_sw(req.blocks, lo, h)
        self.swa_churn(inst, k, req, max(lo, h), kv0 // self.B, t)

    def preempt(self, inst: Instance, req: Request) -> None:
        """vllm_v1: ``req`` (the most recently admitted running request) gives its blocks back
        and returns to the head of the queue; it recomputes its prompt and generated tokens."""
        inst.running.remove(req)
        inst.pool.release(req.slots)
        req.slots = []
        self.unmark_loading(inst, req)  # (loaded, not yet run: given back uncached)
        req.preemptions += 1
        req.preempted_tokens += req.kv
        self.preempted_out[req.idx] = req.preemptions
        self.preempted_tok[req.idx] = req.preempted_tokens
        req.target = req.input_tokens + req.generated
        req.kv = req.registered = req.computed_from = 0
        req.handed = req.pd_first  # its KV had not arrived: it is pulled again
        inst.waiting.appendleft(req)

    def unmark_loading(self, inst: Instance, req: Request) -> None:
        """``req`` no longer loads its marked blocks: they are in HBM's cache (its promotion
        under ``defers_loading_hits``, its first step's end under ``shares_loading_hits``) or
        it was preempted."""
        lo, hi = req.loading
        for b in req.blocks[lo:hi]:
            if self.defers:
                inst.loading[b] -= 1
                if inst.loading[b] == 0:
                    del inst.loading[b]
            if self.shares:
                inst.loading_until.pop(b, None)
        req.loading = (0, 0)

    def promote(self, inst: Instance, req: Request) -> None:
        """``req``'s load has ended and it is taken into a step for the first time since
        (``defers_loading_hits``): vLLM promotes it and caches its loaded blocks then
        (``_update_waiting_for_remote_kv``), before it tries the waiting requests, so its marks
        end and a deferred request hits them in this step (``kvtier.sim.nb_loading.
        promoted_nb``)."""
        for j in range(req.registered, req.computed_from):
            inst.pool.register(req.slots[j], req.blocks[j])
        req.registered = req.computed_from
        self.unmark_loading(inst, req)

    def share_loads(self, inst: Instance, req: Request, h: int, loaded: int) -> None:
        """``req`` was just admitted with ``h`` HBM hits and ``loaded`` blocks loading
        (``shares_loading_hits``, SGLang's radix tree): a hit on a block still arriving makes
        it wait for that block; its own loaded blocks enter HBM's cache now, marked with when
        they arrive until its first step ends (``kvtier.sim.nb_loading.share_loads_nb``)."""
        wait = max((inst.loading_until.get(b, -np.inf) for b in req.blocks[:h]), default=-np.inf)
        if loaded:
            for j in range(h, h + loaded):
                inst.pool.register(req.slots[j], req.blocks[j])
                inst.loading_until[req.blocks[j]] = req.ready
            req.registered = h + loaded
            req.loading = (h, h + loaded)
        req.ready = max(req.ready, wait)

    def stalled(self, inst: Instance, req: Request, k: int, t: float) -> None:
        """``req`` preempted itself on instance ``k`` with no other request running there
        whose KV is in place: a stall. While the instance holds blocks for handed-over
        requests whose KV is not yet pulled, every such stall counts; else (the blocks are
        held by requests still loading from a lower tier, which a preempted request, loading
        again, may hold in turn) those since the last token any request emitted. More than
        ``stall_limit`` of either stop the replay (docs/model.md, "A replay that does not
        progress")."""
        if inst.held:
            self.stalls += 1
            if self.stalls > self.stall_limit:
                raise StallError(req.idx, k, t, self.stall_limit)
            return
        self.load_stalls += 1
        if self.load_stalls > self.stall_limit:
            raise StallError(req.idx, k, t, self.stall_limit, behind_loads=True)

    def schedule_v0(
        self, inst: Instance, k: int, t: float
    ) -> tuple[list[tuple[Request, int]], bool, float]:
        """vLLM v0's ``_schedule_default`` (vllm/core/scheduler.py, v0.4): prompts first, each
        whole (no chunking), FCFS while the token budget, ``max_num_seqs`` and the free blocks
        allow (a prompt over the budget's remainder stops admission; alone it runs whole, so a
        recomputed preempted request longer than the budget cannot stall). An iteration with
        a prompt runs no decode. Without one, every running request decodes; each needs a free
        block (``can_append_slots``: one per running request, whether or not it starts a
        block), else the most recently admitted request is preempted. A KV connector is
        invisible to v0's scheduler (vLLM 0.8.5: ``recv_kv_caches_and_hidden_states`` runs in
        ``ModelRunner.execute_model`` before the forward pass): a prompt admitted with a
        lower-tier load takes its uncached tokens (all but its HBM hits) from the budget and
        belongs to the iteration, which runs nothing until the last of its loads has ended
        (the engine is inside that step); then those prompts' remainder, and the prompts
        admitted beside them, run with no further admission (the same engine step). A
        handed-over request (disaggregated) is not such a load: its KV arrives while its
        decode instance runs on. Returns the iteration's requests, whether it preempted, and
        the end of the iteration's last lower-tier load (``-inf`` if none: it runs now)."""
        budget = self.cfg.token_budget
        sched: list[tuple[Request, int]] = []
        for req in inst.running:  # prompts whose lower-tier loads have ended
            if req.ready > t or req.kv >= req.target or budget == 0:
                continue
            q = req.target - req.kv
            if sched and q > budget:
                continue
            sched.append((req, q))
            budget = max(budget - q, 0)
        resumed = bool(sched)  # the loaded prompts' step: nobody else is admitted to it
        load_end = -np.inf  # the end of the last lower-tier load admitted in this iteration
        while not resumed and budget > 0 and inst.waiting and len(inst.running) < self.cfg.max_seqs:
            req = inst.waiting[0]
            handed = req.handed  # (admission clears it)
            planned = 1 if handed else req.target  # a handed-over request: one decode step
            if (sched or load_end > t) and planned > budget:
                break
            if not self.admit(inst, k, req, t, budget, bool(sched)):
                break
            inst.waiting.popleft()
            inst.running.append(req)
            if req.ready > t:
                if not handed:  # its uncached tokens, as if computed in this step
                    load_end = max(load_end, req.ready)
                    budget = max(budget - (req.target - req.registered * self.B), 0)
                continue
            q = req.target - req.kv if req.kv < req.target else 1
            sched.append((req, q))
            budget = max(budget - q, 0)
        if load_end > t:  # the step waits for its loads: its prompts run once they have ended
            return [], False, load_end
        if sched:
            return sched, False, load_end
        preempted = False
        x = 0
        while x < len(inst.running):
            req = inst.running[x]
            if req.ready > t or req.kv < req.target:
                x += 1
                continue
            ok, made_room = self.grow_or_preempt(inst, k, req, req.kv + 1, t, sched, v0_rule=True)
            preempted = preempted or made_room
            if not ok:
                break
            sched.append((req, 1))
            x += 1
        return sched, preempted, -np.inf

    def scheduled_at(self, inst: Instance, t: float) -> float:
        """When the scheduler decided the iteration instance ``inst`` starts at ``t``: then,
        or with async scheduling (vLLM's, on by default in 0.19.1 and 0.24.0) at the start of
        the step that has just ended, if a request of that step runs on: the engine schedules step
        ``n + 1`` as soon as it has launched step ``n`` (``EngineCore.step_with_batch_queue``,
        a queue of two batches), so a request queued or a load finished during step ``n`` is
        first scheduled for step ``n + 2``. An engine with nothing running on schedules at
        once (docs/model.md, "Async scheduling")."""
        if self.cfg.schedules_ahead and inst.runs_on_at == t:
            return inst.iter_start
        return t

    def loads_seen(self, inst: Instance, t: float) -> float:
        """Until when the scheduler deciding the iteration instance ``inst`` starts at ``t``
        knows which lower-tier loads have ended (``polls_loads``: vLLM's KV connector). The
        worker polls for finished loads (``get_finished``) as it launches each step, and the
        scheduler reads them with that step's output: in step, the output of the step that has
        just ended, launched when it was decided; scheduling ahead (a request of that step runs
        on), the output of the step before it. With no step in flight the engine polls at once
        (an empty step, ``kv_connector_no_forward``). docs/model.md, "When the scheduler sees
        a load end"."""
        if inst.ended_at != t:
            return t
        if self.cfg.schedules_ahead and inst.runs_on_at == t:
            return inst.polled_before
        return inst.polled_at

    def grow_or_preempt(
        self,
        inst: Instance,
        k: int,
        req: Request,
        tokens: int,
        t: float,
        sched: list[tuple[Request, int]],
        v0_rule: bool = False,
    ) -> tuple[bool, bool]:
        """vLLM's rule when a running request needs blocks: allocate those ``req`` needs to hold
        ``tokens`` tokens, preempting the most recently admitted request whose KV is here (a
        handed-over request whose KV is still arriving is not yet running in vLLM's sense)
        while none is free. Returns whether ``req`` runs and whether anyone was preempted.
        ``v0_rule``: vLLM v0's decode step, which wants a free block even when ``req``'s next
        token fits its own, and lets a request alone within its blocks decode (vLLM would
        re-admit it for ever)."""
        fits = v0_rule and -(-tokens // self.B) <= len(req.slots)
        preempted = False
        while (v0_rule and not inst.pool.free) or not self.grow(inst, k, req, tokens, t):
            victim = next(r for r in reversed(inst.running) if r.ready <= t)
            if victim is req and fits:
                return True, preempted
            self.preempt(inst, victim)
            preempted = True
            if victim is req:
                if not sched:
                    self.stalled(inst, req, k, t)
                return False, True
        return True, preempted

    def schedule_passes(
        self, inst: Instance, k: int, t: float, seen: float, loads_seen: float
    ) -> tuple[list[tuple[Request, int]], bool]:
        """``vllm_v1`` and ``reserve``: the requests instance ``k``'s next iteration takes and
        whether it preempted. Batching ``mixed``: one pass, running requests then admissions
        (FCFS; one whose lower-tier hits another request is loading is skipped, ``defers``),
        decodes and prefill chunks together (vLLM V1). ``prefill_first`` (SGLang without
        --enable-mixed-chunk): a pass of prefill work (running requests still prefilling, then
        admissions) and, only if it takes nothing and admits nobody, a pass of decodes."""
        polls = self.cfg.polls_loads
        budget = self.cfg.token_budget
        sched: list[tuple[Request, int]] = []
        preempted = blocked = False
        split = self.cfg.prefill_first and not 0 < self.cfg.n_prefill <= k
        decoding = [r for r in inst.running if r.kv >= r.target] if split else []
        # prefill_first: admissions leave free the blocks the decoding requests' next tokens
        # need (one each whose tokens fill its blocks), as SGLang's prefill batch leaves room
        # for its running requests' decode
        keep = sum(1 for r in decoding if r.kv % self.B == 0) if self.grows else 0
        for prefills in (True, False) if split else (None,):
            n_before = len(inst.running)
            x = 0
            while x < len(inst.running):
                req = inst.running[x]
                if budget == 0:
                    break
                if req.ready > (loads_seen if req.polled else seen) or (
                    prefills is not None and (req.kv < req.target) != prefills
                ):
                    # loading (async scheduling: or seen loaded only after; polls_loads: or
                    # its end not yet reported), or not of this pass
                    x += 1
                    continue
                q = min(req.target - req.kv, budget) if req.kv < req.target else 1
                if (
                    prefills
                    and self.grows
                    and decoding
                    and not self.grow(inst, k, req, req.kv + q, t)
                ):
                    # (prefill_first) a chunk finds no free block while requests decode: no
                    # prefill step, the decodes run (SGLang forms no prefill batch its memory
                    # cannot hold); with nobody decoding it preempts as below
                    blocked = True
                    break
                if self.grows:  # (vllm_v1 here)
                    ok, made_room = self.grow_or_preempt(inst, k, req, req.kv + q, t, sched)
                    preempted = preempted or made_room
                    if not ok:
                        break
                if self.defers and req.loading[1]:
                    self.promote(inst, req)  # (vLLM caches its loaded blocks as it promotes it)
                sched.append((req, q))
                budget -= q
                x += 1
            w = 0  # the first waiting request not yet tried (those before it wait on)
            while (
                prefills is not False
                and not blocked
                and not preempted
                and budget > 0
                and w < len(inst.waiting)
                and len(inst.running) < self.cfg.max_seqs
            ):  # (vLLM V1 admits nobody in a step that preempted)
                req = inst.waiting[w]
                if (req.handed_at if req.handed else req.arrival) > seen:
                    break  # (async scheduling) queued after this step was scheduled
                if req.prefetch_ready > seen:
                    w += 1  # its storage prefetch is in flight: it waits, the next is tried
                    continue
                if req.prefetch[2]:
                    self.prefetched(inst, k, req, t)
                if self.prefetches and req.prefetch_match and self.hit_lost(inst, k, req, t):
                    w += 1  # its prefix shrank while it waited: looked up in storage again
                    continue
                # (polls_loads: a load starts when its step is decided, on the worker that
                # launches it)
                issue = seen if polls else t
                self.deferred = False
                handed = req.handed
                if not self.admit(inst, k, req, t, budget, bool(sched), issue, keep):
                    if not self.deferred:
                        break
                    w += 1  # another request loads its hits: it waits, the next is tried
                    continue
                if self.refreshes and not handed:
                    self.lower.refresh(k, req.blocks, req.registered, req.computed_from)
                del inst.waiting[w]
                inst.running.append(req)
                req.prefetch_retry = -1  # (SGLang cancels an admitted request's retry)
                if req.ready > t or req.polled:
                    continue  # (a polled load's end is reported with a later step's output)
                # a prefill chunk (a decode instance's handed-over request: its first decode
                # step)
                q = min(req.target - req.kv, budget) if req.kv < req.target else 1
                sched.append((req, q))
                budget -= q
            if sched or preempted or len(inst.running) > n_before:
                # (prefill_first) a step of prefill chunks, or of admissions that wait for
                # their loads (SGLang loads a host hit inside the prefill batch that takes
                # it), or one that preempted: no decode pass
                break
        return sched, preempted

    def start_iteration(self, inst: Instance, k: int, t: float) -> None:
        """Idle instance ``k`` schedules an iteration: running requests take their tokens, then
        admissions (FCFS) take prefill chunks (``vllm_v0``: :func:`schedule_v0`); requests
        still loading take no tokens. With nothing to run (every running request is loading)
        it stays idle until one is ready."""
        self.release_held(inst, t)
        if self.prefetches:
            self.retry_prefetches(inst, k, t)
        seen = self.scheduled_at(inst, t)
        polls = self.cfg.polls_loads
        loads_seen = self.loads_seen(inst, t) if polls else seen
        tokens = attn = kv_read = 0
        load_end = -np.inf
        if self.v0:
            sched, preempted, load_end = self.schedule_v0(inst, k, t)
        else:
            sched, preempted = self.schedule_passes(inst, k, t, seen, loads_seen)
        if self.check_invariants and self.lower is not None:
            self.lower.check()
        if self.cfg.tiers is not None and self.cfg.tiers.batch_waits:
            loading = [r.ready for r in inst.running if r.ready > t]
            if loading:
                inst.wake = max(loading)
                return
        if self.epp_mx is not None:  # what this step leaves waiting (if it runs)
            step_scheduled(self.epp_mx, k, len(inst.waiting))
        if load_end > t:
            # (vllm_v0) the step admitted lower-tier loads: the engine is inside it, busy until
            # the last has ended (no arrival starts another); its prompts then run their
            # remainder in the iteration that follows (the same vLLM step, not counted twice)
            inst.scheduled = []
            inst.busy_until = load_end
            inst.wake = np.inf
            return
        if not sched:
            # every running request is loading: it wakes when the first is ready; a prefill
            # instance whose blocks are held wakes when the first is freed; after a preemption
            # at once, to admit the preempted request (vLLM's engine loop schedules again at
            # once after a step that ran nothing)
            w = min((r.ready for r in inst.running), default=np.inf)
            w = min([w] + [r.release_at for r in inst.held])
            # waiting requests whose prefetch is in flight: when the first ends (every one
            # waiting so, and nothing else to wait for: only then)
            gated = [r.prefetch_ready for r in inst.waiting if r.prefetch_ready > seen]
            all_gated = bool(gated) and len(gated) == len(inst.waiting)
            if preempted or (not inst.running and not inst.held and not all_gated):
                w = t
            w = min([w, *gated])
            # no step in flight: the next one is decided when it starts (async scheduling: a
            # load that ended after this attempt's decision, by now, runs in it, at once)
            inst.wake = max(w, t)
            inst.runs_on_at = -np.inf
            inst.ended_at = -np.inf  # (polls_loads: the next attempt polls at once)
            return
        inst.wake = np.inf
        inst.iter_start = t
        if polls:
            # this step's worker polls for finished loads when it is launched (decided)
            inst.polled_before = inst.polled_at if inst.ended_at == t else seen
            inst.polled_at = seen
        n_dec = dec_kv = pf_ns = pf_ext = 0
        tpk = self.timing_of[k]  # this instance's pool's step times
        for req, q in sched:
            tokens += q
            attn += q * (2 * req.kv + q)
            kv_read += req.kv + q
            if req.kv < req.target:
                pf_ns += prefill_attn_ns(q, req.kv, tpk)
                pf_ext += prefill_out_of_range(q, req.kv, tpk)
            else:
                n_dec += 1
                dec_kv += req.kv + q
        dt = float(step_time(tokens, attn, kv_read, n_dec, dec_kv, pf_ns, tpk))
        self.n_extrap += step_extrapolated(tokens, n_dec, dec_kv, pf_ext, tpk)
        inst.scheduled = sched
        inst.iter_dt = dt
        inst.busy_until = t + dt
        inst.busy_time += dt
        self.n_iter += 1
        if self.check_invariants:
            inst.pool.check(inst.running, self.B if self.grows else 0, inst.held_slots())

    def client_sees(self, t: float, req: Request) -> float:
        """When the client sees what the engine produced for ``req`` at ``t``: the front-end
        costs later, per request and per prompt token (module docstring, "Front end")."""
        return t + self.fe + self.fe_token * req.input_tokens

    def first_token(self, req: Request, t: float) -> None:
        """``req``'s prompt is complete at ``t``: the client sees its first token the
        front-end costs later (SLO counts)."""
        self.load_stalls = 0  # the replay progresses
        seen = self.client_sees(t, req)
        self.first[req.idx] = seen
        if self.track:  # its token intervals run from the per-request cost alone
            self.last_token[req.idx] = t + self.fe
        if self.tracker is not None:
            self.tracker.first_token(seen - req.arrival)

    def finish(self, inst: Instance, k: int, req: Request, t: float) -> None:
        """``req`` emitted its last token: record it, count its TPOT, store its generated
        blocks (a connector that stores them), free its slots."""
        seen = self.client_sees(t, req)  # the whole response
        self.in_flight -= 1
        self.gate = seen
        self.finish_s[req.idx] = seen
        if self.tracker is not None:
            self.tracker.finished(seen - self.first[req.idx], req.output_tokens)
        self.tbt_tail(req)
        if self.swa:
            # its sliding-window blocks not yet left behind: the prompt's last ones and those
            # of its generated tokens (vLLM frees the window's at the end, the generated ones
            # as decoding passes them; here all at the end, before its own slots)
            start = max(req.computed_from, min(self.swa_skipped(req.target), len(req.blocks)))
            self.swa_churn(inst, k, req, start, req.kv // self.B, t)
        if self.prefix:
            inst.pool.cache_generated(req.slots[req.input_tokens // self.B : req.kv // self.B])
        if self.gen_base is not None:
            self.store_generated(k, req, t)
        inst.pool.release(req.slots)
        inst.active_blocks -= -(-req.input_tokens // self.B)

    def store_generated(self, k: int, req: Request, t: float) -> None:
        """A finished request's full blocks of generated tokens, ``slots[input // B :
        kv // B]`` (those :meth:`HbmPool.cache_generated` keeps), are copied into the tiers
        whose connector stores them (ids ``gen_base[idx]`` on, which no prompt names: never hit).
        vLLM's OffloadingConnector stores each as it fills; here they go at the finish, in one
        transfer per tier (docs/model.md, "Generated blocks in the lower tiers")."""
        assert self.lower is not None and self.gen_base is not None
        j0 = req.input_tokens // self.B
        j1 = min(req.kv // self.B, len(req.slots))
        base = int(self.gen_base[req.idx])
        cnt = min(j1 - j0, int(self.gen_base[req.idx + 1]) - base)
        if cnt > 0:
            self.lower.generated(k, t, list(range(base, base + cnt)))

    def end_iteration(self, inst: Instance, k: int, t: float) -> None:
        """Instance ``k``'s iteration ends: KV grows, full blocks register and are copied
        down, tokens are emitted. A connector that blocks the step (vLLM's ``wait_for_save``)
        keeps the instance busy until its copies end; the tokens are emitted then."""
        pool = inst.pool
        if inst.saving:
            inst.saving = False  # the blocking stores are done: emit the step's tokens
        else:
            computed: list[int] = []
            for req, q in inst.scheduled:
                req.kv += q
                full = min(req.kv // self.B, len(req.blocks))
                for j in range(req.registered, full):
                    pool.register(req.slots[j], req.blocks[j])
                    if j >= req.computed_from:
                        computed.append(req.blocks[j])
                req.registered = max(req.registered, full)
                self.unmark_loading(inst, req)  # its loaded blocks are in the cache now
                if self.swa and req.kv - q < req.target:  # a prefill chunk
                    nb = len(req.blocks)
                    lo = max(min(self.swa_skipped(req.kv - q), nb), req.computed_from)
                    self.swa_churn(inst, k, req, lo, min(self.swa_skipped(req.kv), nb), t)
            if self.lower is not None and computed:
                saved = self.lower.computed(k, t, computed)
                if saved > t:
                    inst.saving = True
                    inst.busy_until = saved
                    return
        done: list[Request] = []
        handed: list[Request] = []
        prefill_step = False
        for req, q in inst.scheduled:
            if req.pd_first:
                self.seen_first(req)
            if req.kv - q < req.target:  # it was a prefill
                prefill_step = True
                first_done = req.kv == req.target and req.generated == 0
                if first_done and k < self.n_pf and req.output_tokens > 1:
                    self.hand_off(inst, k, req, t)
                    handed.append(req)
                elif first_done:
                    req.generated = 1
                    self.first_token(req, t)
                    if req.output_tokens <= 1:
                        done.append(req)
                elif req.kv == req.target:  # a preempted request has recomputed its KV
                    req.generated += 1
                    self.token(req, t)
                    if req.generated >= req.output_tokens:
                        done.append(req)
            else:
                req.generated += 1
                self.token(req, t)
                if req.generated >= req.output_tokens:
                    done.append(req)
            if done and done[-1] is req:
                self.finish(inst, k, req, t)
        for req in done + handed:
            inst.running.remove(req)
        # a request runs on: its next step was scheduled while this one ran (async scheduling)
        inst.runs_on_at = t if len(inst.scheduled) > len(done) + len(handed) else -np.inf
        inst.ended_at = t
        inst.scheduled = []
        inst.busy_until = None
        if self.epp_mx is not None:  # the step's statistics, as the engine reports them
            every = self.cfg.epp_metrics_decode_every
            step_ended(self.epp_mx, k, t, len(pool.free), prefill_step, every)
        # with work left it schedules its next iteration now
        inst.wake = t if inst.running or inst.waiting else np.inf
        if self.check_invariants:
            pool.check(inst.running, self.B if self.grows else 0, inst.held_slots())
            if self.lower is not None:
                self.lower.check()

    def run(self) -> RawResult:
        """Replay every request; per-request first-token and finish times (NaN when not reached)."""
        # The event loop; the numba kernel's loop (kvtier.sim.nb.simulate_nb) has the same steps
        # under the same names (next_event_nb, end_iteration_nb, slo_missed_nb, arrive_nb,
        # start_iteration_nb).
        last, same = -np.inf, 0
        # events at one instant: each ends an iteration, sends a request, starts an iteration
        # or preempts a request, so more than this many in a row make no progress
        bound = 4 * (self.n + self.cfg.n_instances) + 16
        while True:
            now = self.next_event()
            if now == np.inf:
                break
            if self.check_invariants:
                # events come in time order (no instance wakes before the present), and an
                # instant passes (no instance schedules at it for ever)
                assert now >= last, f"event at {now} after one at {last}"
                same = same + 1 if now == last else 0
                assert same <= bound, f"{same} events at {now} without progress"
                last = now
            if self.lower is not None:
                self.lower.advance_faults(now)  # failed devices first (kvtier.sim.fault_step)
            for k, inst in enumerate(self.instances):
                if inst.busy_until is not None and inst.busy_until == now:
                    self.end_iteration(inst, k, now)
            if self.tracker is not None and self.tracker.missed():
                self.early = True
                break
            while self.next_arrival() == now:
                self.arrive(self.requests[self.nxt], now)
                self.nxt += 1
            for k, inst in enumerate(self.instances):
                # an idle instance schedules only at an event of its own (``wake``), never at
                # another instance's
                if inst.busy_until is None and (inst.running or inst.waiting) and inst.wake <= now:
                    self.start_iteration(inst, k, now)

        return RawResult(
            first_token_s=self.first,
            finish_s=self.finish_s,
            hit_blocks=self.hits_out,
            instance=self.inst_of,
            busy_s=np.array([inst.busy_time for inst in self.instances]),
            n_iterations=self.n_iter,
            extrapolated_iterations=self.n_extrap,
            early_stopped=self.early,
            end_s=end_time(self.finish_s, self.early, now),
            loaded_blocks=self.loaded_blocks,
            arrival_s=self.sent_s,
            preemptions=self.preempted_out,
            preempted_tokens=self.preempted_tok,
            decode_instance=self.decode_of,
            kv_transfer_s=self.pd_s,
            tbt_tail_s=self.tbt_out,
            decode_hit_blocks=self.decode_hits if self.pd is not None else None,
            **(self.lower.result(self.load_s) if self.lower is not None else {}),
        )


def simulate_reference(
    trace: BlockedTrace,
    cfg: SimConfig,
    *,
    slo: SloCheck | None = None,
    check_invariants: bool = False,
) -> RawResult:
    """Replay ``trace``; per-request first-token and finish times (NaN when not reached)."""
    return ReferenceReplay(trace, cfg, slo, check_invariants).run()
