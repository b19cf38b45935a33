"""The numba engine's state, as named tuples the kernels and the plug-ins' twins share.

numba compiles a ``NamedTuple`` as a plain tuple: a field read by name costs nothing. The
layouts are fixed by :mod:`kvtier.sim.engine`, which fills and checks every array.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np

if TYPE_CHECKING:
    from kvtier.sim.nb_tiers import LinkState, TierParams, TierPools

# numba options of a kernel that only other kernels call (``@njit(..., **INNER)``): numba
# otherwise also compiles, for every kernel, a wrapper that converts its arguments from Python
# objects and one callable from C, each unpacking every array of every named tuple the kernel
# takes (hundreds of them for the engine's steps), and the replay never calls either. Such a
# kernel cannot be called from Python; :func:`kvtier.sim.nb.simulate_nb` is the entry point.
INNER = {"no_cpython_wrapper": True, "no_cfunc_wrapper": True}

# Integer constants a kernel passes to another kernel. numba types a literal ``0`` argument as
# ``Literal[int](0)`` and compiles the callee once more for it (a second overload of
# ``step_time``, ``path_transfer``...); a NumPy scalar global is a plain ``int64``.
ZERO = np.int64(0)
ONE = np.int64(1)
# Block ids per flag of nb_tiers.TierPools.dirty: a span's rows (16 bytes each) are reset
# together after a replay.
DIRTY_SPAN = 64


class Requests(NamedTuple):
    """The trace as the kernel reads it (read-only; :class:`BlockedTrace` checked it)."""

    arrival: np.ndarray  # f8 (n,)
    input_tokens: np.ndarray  # i8 (n,)
    output_tokens: np.ndarray  # i8 (n,)
    block_offsets: np.ndarray  # i8 (n + 1,): request i's full prompt blocks are refs boff[i]:..
    block_ids: np.ndarray  # i4 (refs,)
    shared: np.ndarray  # i4 (refs,): map index of a block read more than once, else -1
    total_blocks: np.ndarray  # i8 (n,): HBM blocks reserved at admission


class Params(NamedTuple):
    """The serving scalars of ``SimConfig`` and the early-stop bounds of ``SloCheck``."""

    n_instances: int
    capacity: int  # HBM slots per instance in the slot layout: the largest instance's
    ring_len: int  # entries of each free ring (engine.free_ring_length: 2 * capacity + AHEAD)
    block_tokens: int
    token_budget: int  # max_num_batched_tokens
    max_seqs: int  # max_num_seqs
    router: int  # ROUND_ROBIN, LEAST_LOADED, PREFIX_AFFINITY
    affinity_overload: int
    n_shared: int  # blocks read more than once (map entries per instance), >= 1
    timing: np.ndarray  # f8: packed step-time parameters (SimConfig.timing_params)
    # per-pool tensor parallelism: each pool's packed step times (rows, zero-padded to the
    # longest), the row of each instance, each instance's HBM slots (<= capacity) and the
    # most blocks a request may hold (the smallest instance's)
    timings: np.ndarray  # f8 (pools, length)
    pool_of: np.ndarray  # i8 (n_instances,)
    capacities: np.ndarray  # i8 (n_instances,)
    fit_blocks: int
    slo_on: bool
    slo_thresholds: np.ndarray  # f8 (5,): mean, p99, p999 TTFT bounds, p99 TPOT, p99 TBT
    slo_limits: np.ndarray  # i8 (4,): over-limits for p99, p999 TTFT, p99 TPOT and p99 TBT
    prefix_caching: bool  # serving.prefix_caching (off: no HBM prefix hits)
    concurrency: int  # closed-loop load generator: requests in flight (0: open loop)
    round_size: int  # closed loop: rounds of so many requests behind a barrier (0: none)
    kv_overlap_weight: float  # kv_aware router: weight of the prompt blocks left to prefill
    route_w: np.ndarray  # f8 (n_tiers, n_instances): kv_aware weight of a lower-tier hit
    epp_w: np.ndarray  # f8 (6,): llmd_epp weights (queue, KV use, GPU, CPU prefix, LRU, active)
    scheduler: int  # RESERVE (whole footprint at admission), VLLM_V1 or VLLM_V0 (grow, preempt)
    watermarks: np.ndarray  # i8 (n_instances,) vllm_v1: free blocks an admission leaves
    track_tbt: bool  # record token intervals (Outputs.tbt_*; kvtier.sim.nb_tbt)
    n_prefill: int  # disaggregated: instances [0, n_prefill) prefill, the rest decode (0: none)
    # the P/D transfer (kvtier.sim.pd.PdConfig): paths [prefill, decode, j], links, connector
    pd_path: np.ndarray  # i8 (K, K, P)
    pd_queue: np.ndarray  # i8 (K, K, P): 1 a link's outbound (write) queue, 0 its inbound
    pd_scale: np.ndarray  # f8 (K, K, P)
    pd_lat: np.ndarray  # f8 (K, K)
    pd_bw_read: np.ndarray  # f8 (L,): every link (the tiers' first)
    pd_bw_write: np.ndarray  # f8 (L,)
    pd_duplex: np.ndarray  # i8 (L,)
    pd_n_links: int
    pd_block_bytes: float  # bytes moved per block
    pd_unit: int
    pd_fragments: int
    pd_coalesce: int
    pd_rpc_s: float
    pd_stream_bw: float
    pd_stage_bw: float
    pd_serial: int
    pd_depth: int
    pd_workers: int  # connector workers per instance
    pd_layerwise: bool  # the prefill side pushes each layer as it is computed
    pd_layers: int
    pd_held_base: int  # where the held prefill slots of request i start: base + slot_off[i]
    # the decode side looks the prompt up in its HBM prefix cache and pulls only the blocks
    # past its hit (a pull only: a layer-wise push moves every block)
    pd_trim: bool
    # vLLM's hybrid KV cache manager: a sliding-window group's blocks behind its window of
    # ``swa_window`` tokens stay cached in the pool, ``swa_blocks`` pool blocks per block of
    # tokens (0: none; prefix caching off: 0, they are freed uncached)
    swa_window: int
    swa_blocks: int
    # a hit needs the sliding-window copies of its last ``swa_need`` blocks (0: none), whose
    # map entries are ``slot_of[k * n_shared + swa_off + shared[ref]]`` (swa_off: the
    # instances' map of full blocks, ``n_instances * n_shared``)
    swa_need: int
    swa_off: int
    # vllm_v1, reserves_full: that group's blocks an admission counts, at most (0: uncapped)
    swa_admission_blocks: int
    # llmd_epp reading the EPP's approximate indexes (kvtier.sim.routers.epp_index; False:
    # the instances' caches): each producer's LRU capacity per instance in entries (GPU
    # then CPU), each request's entries (offsets into the keys) and every entry's key
    # (routers.epp_index.index_keys), the nodes of one producer, the entries a replay adds
    epp_ix: bool
    ix_cap: np.ndarray  # i8 (2 * n_instances,)
    ix_koff: np.ndarray  # i8 (2, n + 1)
    ix_key: np.ndarray  # i4 (2, entries): compact key, -1 for a block read once
    ix_nodes: int  # keys x n_instances (1 when epp_ix is False)
    ix_log: int  # the most entries a replay adds to one producer's indexes (1: none)
    # vllm_v1 with vLLM's async scheduling: an iteration that follows one with a request
    # running on was scheduled at that one's start (SimConfig.async_scheduling)
    async_sched: bool
    # vLLM's KV connector: a lower-tier load's end reaches the scheduler with the output of
    # the first step launched after it, and a load starts when its step is decided
    # (SimConfig.polls_loads)
    polls_loads: bool
    # a step of prefill chunks when one can run, else one of decodes (SimConfig.prefill_first)
    prefill_first: bool
    # a waiting request whose lower-tier hits another request of its instance is loading is
    # skipped until that load is in HBM (SimConfig.defers_loading_hits)
    defers_loading_hits: bool
    # a request's loaded blocks enter HBM's cache at its admission; one hitting them before they
    # have arrived waits for them (SimConfig.shares_loading_hits)
    shares_loading_hits: bool
    # a request's hits in a prefetching tier are read into the tiers above at its arrival; it
    # waits in its queue until they are there (SimConfig.prefetches_at_arrival), if at least
    # prefetch_min_blocks of prompt are left past the host match; declined while the
    # instance's prefetches in flight hold prefetch_limit_tokens; a declined or missed one is
    # re-issued prefetch_retry_passes passes later, at most prefetch_retry_attempts times
    prefetches_at_arrival: bool
    prefetch_min_blocks: int
    prefetch_limit_tokens: int
    prefetch_retry_passes: int
    prefetch_retry_attempts: int
    # a request's HBM hits refresh their copies in the first lower tier
    # (SimConfig.refreshes_host_on_hbm_hit)
    refreshes_host: bool
    # vllm_v1: admission needs the whole sequence's blocks free (SimConfig.reserve_full_prompt)
    reserves_full: bool
    # llmd_epp: seconds between the EPP's scrapes of the instances' queue and KV use (0: it
    # reads their exact state; SimConfig.epp_metrics_interval_s, kvtier.sim.routers.epp_metrics)
    epp_mx_dt: float
    # ... and the instances report every prefill step and every this-many decode steps
    # (SimConfig.epp_metrics_decode_every)
    epp_mx_every: int


class HbmPools(NamedTuple):
    """Every instance's HBM slots, prefix-cache map and free ring (arrays the caller keeps).

    The map comes all zero and is left all zero; the other arrays are set by the kernel.
    """

    slot_of: np.ndarray  # i4 (n_instances * n_shared,): cached block -> slot + 1
    records: np.ndarray  # i4 (4 * n_instances * capacity,): POS, MAP, REF, BLOCK per slot
    stamps: np.ndarray  # i8 (n_instances * capacity,): admission stamps (distinct hit slots)
    rings: np.ndarray  # i4 ((n_instances + 1) * ring_len,): free rings, then a scratch ring
    slots: np.ndarray  # i4 (sum of total_blocks,): each request's slots, in order
    # per instance and shared block (k * n_shared + shared id), new and zero for each replay
    # (pages zeroed on first touch; one entry when off): Params.defers_loading_hits, the
    # running requests loading it not yet promoted (nb_loading.promoted_nb); shares_loading_hits,
    # when its load ends, until its loader's first step ends (0: none under way)
    loading: np.ndarray  # i4
    loading_until: np.ndarray  # f8


class Outputs(NamedTuple):
    """What a replay returns per request and per instance (filled by the caller first)."""

    first_token: np.ndarray  # f8 (n,), NaN-filled
    finish: np.ndarray  # f8 (n,), NaN-filled
    hit_blocks: np.ndarray  # i8 (n,): prefix blocks found in HBM at admission
    instance: np.ndarray  # i8 (n,), -1-filled (stays -1 for a rejected request)
    busy_s: np.ndarray  # f8 (n_instances,), zero
    load_s: np.ndarray  # f8 (n,), zero: seconds from admission to the last loaded block
    loaded_blocks: np.ndarray  # i8 (n, n_tiers), zero: blocks loaded from each lower tier
    # f8 (7,): n_iterations, early_stopped, end time, extrapolated steps; then the stall that
    # stopped the replay (request, instance, time; request -1 if none)
    stats: np.ndarray
    preemptions: np.ndarray  # i8 (n,), zero: times preempted (vllm_v1)
    preempted_tokens: np.ndarray  # i8 (n,), zero: computed KV tokens its preemptions discarded
    decode_instance: np.ndarray  # i8 (n,), -1-filled: its decode instance (disaggregated)
    kv_transfer_s: np.ndarray  # f8 (n,), zero: prefill end to its KV's arrival there
    # track_tbt (else empty): each request's TBT tail (NaN-filled), its longest intervals
    # (tbt_heap[tbt_off[i]:tbt_off[i + 1]], a min-heap of tbt_count[i]) and its last token's
    # time (kvtier.sim.nb_tbt)
    tbt_tail: np.ndarray  # f8 (n,)
    tbt_heap: np.ndarray  # f8 (tbt_off[n],)
    tbt_off: np.ndarray  # i8 (n + 1,)
    tbt_count: np.ndarray  # i8 (n,), zero
    tbt_last: np.ndarray  # f8 (n,)
    decode_hit_blocks: np.ndarray  # i8 (n,), zero: prompt blocks its decode instance held


class RequestState(NamedTuple):
    """Per-request progress (the reference's ``Request`` fields)."""

    slot_off: np.ndarray  # i8 (n + 1,): request i's slots are slots[slot_off[i]:slot_off[i+1]]
    kv: np.ndarray  # i8: tokens whose KV is computed (hits and loads included)
    generated: np.ndarray  # i8
    registered: np.ndarray  # i8: prompt blocks [0, registered) are cached or were offered
    computed_from: np.ndarray  # i8: prompt blocks from here on are computed
    ready: np.ndarray  # f8: its prefill may start once loaded blocks have arrived
    next_waiting: np.ndarray  # i8: the next request in its instance's queue, -1 at the tail
    target: np.ndarray  # i8: tokens to compute before its next token (input, + generated)
    held: np.ndarray  # i8: slots it holds, slots[slot_off[i]:slot_off[i] + held[i]]
    handed: np.ndarray  # bool: its KV came from a prefill instance, not admitted yet
    # disaggregated: the prefill instance's slots it holds (at prm.pd_held_base + slot_off[i],
    # ``pf_held`` of them) until ``release_at`` (inf until the transfer is issued), the next
    # request in that instance's list of held requests, and when its prefill ended
    pf_held: np.ndarray  # i8
    release_at: np.ndarray  # f8
    next_held: np.ndarray  # i8
    handed_at: np.ndarray  # f8
    pd_first: np.ndarray  # bool: handed over, first token not yet seen (``seen_first_nb``)
    # its lower-tier load's end reaches the scheduler with a step's output (Params.polls_loads)
    polled: np.ndarray  # bool
    # Params.defers_loading_hits or shares_loading_hits: prompt blocks [loading_lo, loading_hi)
    # it loads are marked in HbmPools.loading (loading_until) until its promotion (the end
    # of its first step; hi 0: none)
    loading_lo: np.ndarray  # i8
    loading_hi: np.ndarray  # i8
    # Params.prefetches_at_arrival: prompt blocks [pf_lo, pf_lo + pf_n), the deepest read from
    # tier pf_tier, are read into the tiers above at its arrival (pf_n 0: none); it waits in its
    # queue until
    # pf_ready (-inf: never waits)
    pf_ready: np.ndarray  # f8
    pf_tier: np.ndarray  # i8
    pf_lo: np.ndarray  # i8
    pf_n: np.ndarray  # i8
    # a declined or missed prefetch's retry: the pass it is re-issued at (0: armed, not yet
    # set; -1: none), and the re-issues it has made (SGLang's StoragePrefetchRetries)
    pf_retry: np.ndarray  # i8
    pf_tries: np.ndarray  # i8
    # the prompt blocks HBM and the tiers admission reaches held at its last prefetch lookup
    # (SGLang's storage_prefetch_last_match_len; 0: none)
    pf_match: np.ndarray  # i8


# rows of InstanceState.marks: Params.polls_loads's times, then Params.prefetches_at_arrival's
# reserved blocks and counted scheduling passes
POLL_ENDED, POLL_AT, POLL_BEFORE, PF_HELD, PF_PASSES = 0, 1, 2, 3, 4
# the running requests a scheduling pass takes (Params.prefill_first): all, only those still
# prefilling, only those decoding, or only those prefilling while others decode (a chunk
# that finds no free block then ends the pass without preempting)
PASS_ALL, PASS_PREFILL, PASS_DECODE, PASS_PREFILL_YIELDS = 0, 1, 2, 3

# rows of InstanceState.ix_log and ix_list (llmd_epp's approximate indexes)
IX_NODE, IX_NEXT = 0, 1
IX_HEAD, IX_TAIL, IX_LEN, IX_CNT, IX_FILL = 0, 1, 2, 3, 4


class InstanceState(NamedTuple):
    """Per-instance queues, running set, iteration and free-ring state (``Instance``)."""

    q_head: np.ndarray  # i8 (n_instances,): waiting queue, a list through next_waiting
    q_tail: np.ndarray
    q_len: np.ndarray
    running: np.ndarray  # i8 (n_instances, max_seqs): running requests, admission order
    n_running: np.ndarray
    sched_q: np.ndarray  # i8 (n_instances, max_seqs): tokens of each scheduled request
    sched_pos: np.ndarray  # i8 (n_instances, max_seqs): its position in ``running``
    n_sched: np.ndarray
    busy: np.ndarray  # bool: in an iteration
    busy_until: np.ndarray  # f8: when the iteration ends
    wake: np.ndarray  # f8: while idle with work, when it next schedules (`Instance.wake`)
    act: np.ndarray  # i8: instances that act at this event, in index order
    active_blocks: np.ndarray  # i8: prompt blocks of the requests routed here, not finished
    # llmd_epp: when the instance last took a request no instance had cached (the request's
    # index + 1; 0: never), the no-hit-LRU scorer's order
    cold_stamp: np.ndarray  # i8 (n_instances,)
    # disaggregated: the P/D connector's workers (pd_workers per instance), each prefill
    # instance's list of handed-over requests whose blocks it holds (through next_held, in
    # hand-off order), and each instance's last iteration time (a layer-wise push overlaps it)
    pd_wfree: np.ndarray  # f8 (n_instances * pd_workers,)
    pd_wbusy: np.ndarray  # f8 (n_instances * pd_workers,)
    held_head: np.ndarray  # i8 (n_instances,), -1: none
    held_tail: np.ndarray  # i8 (n_instances,)
    iter_dt: np.ndarray  # f8 (n_instances,)
    # decode steps run ahead of the event loop (0: none pending) and what they started from,
    # so that an early stop can count only the steps begun before it (skip_back_nb)
    seg_steps: np.ndarray
    seg_t0: np.ndarray
    seg_busy: np.ndarray
    seg_attn: np.ndarray
    seg_kv: np.ndarray
    seg_m: np.ndarray
    # free ring of instance k: head index, entries (live and stale) from the head, free slots
    ring_head: np.ndarray
    ring_count: np.ndarray
    free_len: np.ndarray
    saving: np.ndarray  # bool: the iteration has ended, its blocking stores have not
    # async scheduling: when the last iteration (the last step run ahead) started, and when
    # an iteration ended with a request running on past it (-inf: never)
    iter_start: np.ndarray  # f8 (n_instances,)
    runs_on_at: np.ndarray  # f8 (n_instances,)
    # what an instance's scheduling passes leave for later ones. Params.polls_loads: when its
    # last iteration ended (-inf: none in flight, the engine polls at once) and when the last
    # two iterations started were decided (their workers' polls for finished loads), rows
    # POLL_ENDED, POLL_AT, POLL_BEFORE; Params.prefetches_at_arrival: the prompt blocks its
    # storage prefetches in flight reserve (PF_HELD) and the passes counted for their
    # retries (PF_PASSES), both whole numbers
    marks: np.ndarray  # f8 (5, n_instances)
    # llmd_epp's approximate indexes (kvtier.sim.routers.epp_index): per producer p, an
    # append-only log of its touches (entry p * ix_log + e: the node touched, -1 for a block
    # read once; the next touch of the same list) and each node's latest touch (-1: not
    # indexed); per list p * n_instances + k its oldest and newest touch, live entries and the
    # routed request's match count; IX_FILL of column p: the touches producer p has logged.
    # Three arrays, not more: every call that takes the state passes each array's words.
    ix_last: np.ndarray  # i4 (2 * ix_nodes,)
    ix_log: np.ndarray  # i4 (2, 2 * ix_log)
    ix_list: np.ndarray  # i8 (5, 2 * n_instances)
    # llmd_epp with Params.epp_mx_dt: each instance's last steps' metrics as vLLM reports
    # them (kvtier.sim.routers.epp_metrics: steps recorded, the waiting count of the step in
    # flight, then a ring of (end, waiting, free blocks))
    epp_mx: np.ndarray  # f8 (n_instances, epp_metrics.WIDTH)


class Buffers(NamedTuple):
    """Scratch of one admission or iteration end: found slots, lower-tier sources, blocks."""

    found: np.ndarray  # i4 (longest prompt + 1,): the HBM slots of a request's prefix
    src: np.ndarray  # i4: source tier of each block found below HBM
    # i8 (2 n_tiers + 1,): blocks per tier, then sliding-window copies per tier (load_nb)
    counts: np.ndarray
    hitbuf: np.ndarray  # i4: HBM hits reaching their k-th sighting
    evbuf: np.ndarray  # i4 (capacity + 1,): blocks one admission evicted from HBM
    wbuf: np.ndarray  # i4: blocks one iteration computed
    # vllm_v1 decode steps run ahead: the batch's requests grouped by the residue (mod B) of
    # the steps at which each needs a new block, in batch order (counting sort)
    bk_start: np.ndarray  # i8 (B + 1,)
    bk_req: np.ndarray  # i8 (max_seqs,)
    # track_tbt: when each decode step run ahead ends, as its tokens are seen (longest output
    # + 1; one entry otherwise)
    tbt_seen: np.ndarray  # f8
    # a finished request's generated blocks copied down (most generated blocks of a request
    # + 1 when a tier stores them, TierParams.gen_base; one entry otherwise)
    gbuf: np.ndarray  # i4


# Fields of the replay-wide counters (``Tally.ints``): the round-robin turn, iterations begun,
# the admission stamp, and the SLO counts (rejected, TTFT over the p99 and p99.9 bounds, TPOT
# over its bound; C_OVER_TBT: TBT tails over theirs), as :class:`kvtier.sim.slo.SloTracker`
# keeps them.
# The closed-loop load generator's requests in flight (C_IN_FLIGHT) and, in ``Tally.ttft_sum[1]``,
# when the last slot freed.
# C_EXTRAP: iterations whose measured step time used values beyond the measured data.
# C_STALLS: self-preemptions of a request alone on its instance (the reference's ``stalls``).
# C_LOAD_STALLS: the others, behind requests still loading, since the last token any request
# emitted (the reference's ``load_stalls``).
# C_DEFERRED: set by an admission that did not admit because another request is loading its
# hits (Params.defers_loading_hits; the reference's ``deferred``), so the queue moves on.
C_RR, C_ITER, C_STAMP, C_REJECTED, C_OVER_P99, C_OVER_P999, C_OVER_TPOT, C_IN_FLIGHT = range(8)
C_EXTRAP = 8
C_OVER_TBT = 9
C_STALLS = 10
C_LOAD_STALLS = 11
C_DEFERRED = 12
N_COUNTERS = 13


class Tally(NamedTuple):
    """Replay-wide counters the steps update (arrays, so that a step can change them)."""

    ints: np.ndarray  # i8 (N_COUNTERS,): fields C_*
    ttft_sum: np.ndarray  # f8 (2,): summed TTFT so far (the SLO's mean bound), last slot freed


class Sim(NamedTuple):
    """The whole state of one replay in one value: what the engine's steps take, so that a step
    (or a plug-in's numba twin) has one parameter for it instead of eleven. numba passes a
    tuple's fields as it would pass them one by one, so bundling costs nothing at a call."""

    rq: Requests
    rs: RequestState
    ist: InstanceState
    pool: HbmPools
    ts: TierPools
    tp: TierParams
    lk: LinkState
    prm: Params
    out: Outputs
    ty: Tally
    buf: Buffers
