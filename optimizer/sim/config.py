"""``SimConfig``: the numbers both simulators run on, derived once from hardware, model, policy.

Both the reference and the numba engine read the same ``SimConfig``, so a profile or policy is
turned into block counts and rates in exactly one place. Router codes are small integers so the
jitted engine can branch on them; they come from the router registry
(``kvtier.policy.registries.ROUTERS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from kvtier.deploy.apply import apply_deployment, check_hbf
from kvtier.deploy.kv_budget import kv_budget
from kvtier.deploy.layout import plan_layout, pool_tp_choices
from kvtier.errors import InputError
from kvtier.files import check_allocation
from kvtier.hardware.types import GB, GPUProfile, Hardware, ModelProfile
from kvtier.policy.model import Policy, ServingPolicy
from kvtier.policy.registries import CONNECTORS, ROUTERS, SCHEDULERS, VLLM_V1
from kvtier.sim.pd import PdConfig, build_pd
from kvtier.sim.steptime.backend import step_timing
from kvtier.sim.tiers import TierConfig, build_tiers
from kvtier.sim.timing import T_FRONTEND, T_FRONTEND_TOKEN

ROUTER_CODES = ROUTERS.codes  # {name: code}, from the router registry
# SGLang reports its metrics after every this-many decode batches (decode_log_interval's
# default, 0.5.13.post1 server_args.py; docs/sources.md [EPP-scraped-metrics])
SGLANG_DECODE_LOG_INTERVAL = 40
# SGLang's storage prefetch threshold in tokens (managers/cache_controller.py, the
# prefetch_threshold default; docs/sources.md [SGLang-0.5.23])
PREFETCH_MIN_TOKENS = 256
# SGLang's retries of a declined or missed storage prefetch: scheduling passes before one is
# re-issued and re-issues per request (--hicache-storage-prefetch-retry-poll-interval and
# -max-attempts, arg_groups/fields/memory.py defaults; docs/sources.md [SGLang-0.5.23])
PREFETCH_RETRY_PASSES = 8
PREFETCH_RETRY_ATTEMPTS = 8
# the share of its host pool an engine's storage prefetches in flight may reserve
# (managers/cache_controller.py: prefetch_capacity_limit = int(0.5 * logical_size))
PREFETCH_HOST_SHARE = 0.5
# SGLang 0.5.10's rule instead (a connector's ``prefetch_reserve = "host_less_device"``):
# prefetch_capacity_limit = int(0.8 * (host pool size - device pool size)), both in tokens
# (managers/cache_controller.py; docs/sources.md [SGLang-0.5.10])
PREFETCH_SPARE_SHARE = 0.8
PREFETCH_RESERVES = ("half_host", "host_less_device")


@dataclass(frozen=True)
class SimConfig:
    """Integer and float parameters of one replay (see docs/design.md 4.2 for the formulas)."""

    n_instances: int
    capacity_blocks: int  # HBM KV blocks per instance
    block_tokens: int
    token_budget: int  # max_num_batched_tokens
    max_seqs: int  # max_num_seqs
    router: int  # ROUTER_CODES
    affinity_overload: int
    # iteration time: max((flops_per_token*tokens + attn_coef*attn) / compute_rate,
    #                     (weight_bytes + kv_bytes_per_token*kv_tokens) / mem_rate) + overhead
    flops_per_token: float  # 2 * active params
    attn_coef: float  # 2 * layers * query heads * head_dim (attn = sum q*(2*ctx + q))
    compute_rate: float  # tp * peak FLOP/s * MFU
    weight_bytes: float  # whole replica
    kv_bytes_per_token: float
    mem_rate: float  # tp * HBM bytes/s * MBU
    step_overhead_s: float
    cost_per_hour: float
    tiers: TierConfig | None = None  # tiers below HBM (None: HBM only)
    prefix_caching: bool = True  # serving.prefix_caching: HBM prefix hits across requests
    concurrency: int = 0  # closed-loop load generator: requests in flight (0: open loop)
    # closed loop: the trace's requests in rounds of so many, none of a round sent before every
    # request of the rounds before it has finished (SGLang bench_multiturn.py
    # --enable-round-barrier; 0: no barrier)
    round_size: int = 0
    kv_overlap_weight: float = 1.0  # kv_aware router: weight of prefill blocks (Dynamo's)
    # llmd_epp router: weights of the queue, KV utilisation, GPU prefix, CPU prefix,
    # no-hit-LRU and active-request scorers (llm-d's EPP; kvtier.sim.routers.llmd_epp)
    epp_weights: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0, 0.0)
    # llmd_epp prefix source: () reads the instances' cached blocks; else the EPP's two
    # approximate indexes of where it sent prompts, (GPU entries per server, 0: the instance's
    # HBM blocks; tokens per GPU entry, 0: max(block_tokens, 64); CPU entries; tokens per CPU
    # entry; leading prompt tokens hashed) (kvtier.sim.routers.epp_index)
    epp_index: tuple[int, ...] = ()
    # llmd_epp index: UTF-8 bytes of the prompts' text per token; the EPP cuts text into entries
    # of 4 bytes a token, so 4 makes an entry whole tokens (kvtier.sim.routers.epp_index)
    epp_bytes_per_token: float = 4.0
    # llmd_epp: the queue and KV-utilisation scorers read each instance's state as of the last
    # step that ended at or before the EPP's last scrape, every this many seconds (0: the
    # exact state at the arrival) (kvtier.sim.routers.epp_metrics)
    epp_metrics_interval_s: float = 0.0
    # ... and the engine reports after every prefill step and every this-many decode steps
    # (vLLM each step: 1; SGLang its decode_log_interval, 40) (kvtier.sim.routers.epp_metrics)
    epp_metrics_decode_every: int = 1
    scheduler: int = 0  # SCHEDULERS code: 0 reserve at admission, 1 vLLM V1 (grow, preempt)
    watermark_blocks: int = 0  # vllm_v1: free blocks an admission leaves when others run
    # vllm_v1: a waiting or preempted request is admitted only when the blocks of its whole
    # sequence, less its hits, are free (vLLM's scheduler_reserve_full_isl; both engines)
    reserve_full_prompt: bool = False
    # prefill/decode disaggregation: instances [0, n_prefill) prefill, the rest decode (0:
    # aggregated); a prompt's KV moves to a decode instance through the P/D connector over the
    # links of ``pd`` (kvtier.sim.pd; None when aggregated)
    n_prefill: int = 0
    pd: PdConfig | None = field(default=None, compare=False, repr=False)
    # per-pool tensor parallelism (docs/model.md, "Per-pool tensor parallelism"): the decode
    # instances' HBM blocks, watermark and packed step-time array when the decode pool shards
    # over another GPU count than the prefill pool (None: the fields above, one pool)
    decode_capacity_blocks: int | None = None
    decode_watermark_blocks: int | None = None
    decode_timing: np.ndarray | None = field(default=None, compare=False, repr=False)
    gpus: int = 0  # GPUs the instances use (0: not derived from a deployment)
    # per instance, its GPUs, and the hosts the instances occupy (the energy model's counts,
    # kvtier.sim.energy; empty / 0: not derived from a deployment)
    instance_gpus: tuple[int, ...] = field(default=(), compare=False, repr=False)
    hosts: int = 0
    # the prefill instances' GPU type when it is not the hardware's gpu (step times, HBM
    # blocks, price and power of the prefill pool; None: one GPU type)
    prefill_gpu: GPUProfile | None = field(default=None, compare=False, repr=False)

    # the packed step-time array (kvtier.sim.timing layout; None: the plain roofline of the
    # fields above), the backend that made it and its provenance (package and data versions)
    timing: np.ndarray | None = field(default=None, compare=False, repr=False)
    step_backend: str = "roofline"
    step_provenance: str = ""
    # where each pool's HBM for KV came from: the policy's capacity_gb, or the engine's budget
    # and what it took besides the weights (kvtier.deploy.kv_budget)
    hbm_provenance: str = ""
    # seconds per request outside the engine (HTTP, tokenization, detokenization), added to
    # the first-token and finish times a client sees (kvtier.sim.steptime.frontend)
    frontend_s: float = 0.0
    # and seconds per prompt token (tokenization; vLLM: the detokenizer's priming), added to
    # both times as well (kvtier.sim.steptime.frontend; 0: token ids in and out)
    frontend_token_s: float = 0.0
    # record each request's token intervals for its TBT tail (RawResult.tbt_tail_s); off, the
    # replay does no per-token work for it
    track_tbt: bool = False
    # failures of lower-tier pools, devices, hosts or switches during the replay
    # (kvtier.sim.faults.Fault; docs/model.md "Faults"); empty: none
    faults: tuple = field(default=(), compare=False, repr=False)
    # vLLM V1's hybrid KV cache manager with sliding-window layers (docs/model.md, "Sliding-
    # window blocks in the pool"): a sliding-window group's blocks that fall behind the window
    # of ``swa_window`` tokens stay cached in the shared block pool, ``swa_blocks`` pool blocks
    # per block of tokens (0 and 0: no sliding-window layers, or another engine)
    swa_window: int = 0
    swa_blocks: int = 0
    # ... and under reserve_full_prompt an admission counts that group's blocks of the whole
    # sequence from the window's start, at most this many (0: uncapped; vLLM's
    # SlidingWindowSpec.max_admission_blocks_per_request)
    swa_admission_blocks: int = 0
    # vllm_v1: the scheduler runs one step ahead of the GPU (vLLM's async scheduling, on by
    # default in 0.19.1 and 0.24.0, off in 0.11.0; docs/model.md, "Async scheduling"): a
    # request queued or a load finished during a step is scheduled for the step after next
    # while a request runs on
    async_scheduling: bool = False
    # vllm_v1 with lower tiers and ``load_wait = "request"``: a finished load reaches the
    # scheduler with the output of the first step launched after it (vLLM's KV connector,
    # ``get_finished``; policy ``load_report = "step_output"``; docs/model.md, "When the
    # scheduler sees a load end"), and a load starts when its step is decided
    polls_loads: bool = False
    # a step of prefill chunks whenever one can run, else a step of decodes, never both
    # (SGLang's scheduler without --enable-mixed-chunk, managers/scheduler.py
    # get_next_batch_to_run: "Run prefill first if possible"; serving.batching
    # "prefill_first"); off: every step mixes them, as vLLM V1 does. Not on a disaggregated
    # deployment's decode instances, nor under vllm_v0 (which never mixes them)
    prefill_first: bool = False
    # a request's loaded blocks enter HBM's prefix cache at its admission, and one that hits
    # them before they have arrived waits for them (policy ``load_caching = "at_admission"``,
    # SGLang's radix tree; off: at the end of the loader's first step); in effect with lower
    # tiers and prefix caching (``shares_loading_hits``)
    caches_loads_at_admission: bool = False
    # the fewest tokens a storage prefetch at arrival reads (``prefetches_at_arrival``)
    prefetch_min_tokens: int = PREFETCH_MIN_TOKENS
    # a declined or missed prefetch's retries: passes before one is re-issued, re-issues
    prefetch_retry_passes: int = PREFETCH_RETRY_PASSES
    prefetch_retry_attempts: int = PREFETCH_RETRY_ATTEMPTS
    # how much the prefetches in flight may reserve (PREFETCH_RESERVES; prefetch_limit_tokens)
    prefetch_reserve: str = "half_host"

    def timing_params(self) -> np.ndarray:
        """The packed step-time array both simulators read (layout: :mod:`kvtier.sim.timing`),
        its first seven entries the scalar fields above (so a changed field is what runs)."""
        if self.timing is not None:
            packed = self.timing.copy()
            packed[:7] = (
                self.flops_per_token,
                self.attn_coef,
                self.compute_rate,
                self.weight_bytes,
                self.kv_bytes_per_token,
                self.mem_rate,
                self.step_overhead_s,
            )
            packed[T_FRONTEND] = self.frontend_s
            packed[T_FRONTEND_TOKEN] = self.frontend_token_s
            return packed
        from kvtier.sim.steptime.pack import roofline_params

        return roofline_params(
            flops_per_token=self.flops_per_token,
            attn_coef=self.attn_coef,
            prefill_rate=self.compute_rate,
            decode_rate=self.compute_rate,
            weight_bytes=self.weight_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
            mem_rate=self.mem_rate,
            step_overhead_s=self.step_overhead_s,
            frontend_s=self.frontend_s,
            frontend_token_s=self.frontend_token_s,
        )

    @property
    def schedules_ahead(self) -> bool:
        """vLLM's async scheduling in effect: set, under ``vllm_v1`` (the only scheduler that
        has it; both engines read this)."""
        return self.async_scheduling and self.scheduler == VLLM_V1

    @property
    def defers_loading_hits(self) -> bool:
        """A waiting request whose lower-tier hits another request of its instance is loading
        is skipped until that load is in HBM (a tier's connector's ``defer_loading_hits``,
        under ``vllm_v1`` with prefix caching: vLLM keeps no set of blocks being loaded
        without it; both engines read this; docs/model.md, "Hits another request is
        loading")."""
        return (
            self.tiers is not None
            and self.tiers.defer_loading_hits
            and self.scheduler == VLLM_V1
            and self.prefix_caching
        )

    @property
    def refreshes_host_on_hbm_hit(self) -> bool:
        """A request's HBM hits make their copies in the first lower tier recent too: SGLang's
        radix tree keeps one node, with one access time, for a page's device and host copies
        (``load_caching = "at_admission"``, the policy's SGLang tree), and vLLM's
        OffloadingConnector touches every prompt block it holds when it looks the request up
        (its connector's ``touches_prompt``); under ``vllm_v1`` with prefix caching; both
        engines read this; docs/model.md, "One access time for HBM and the host tier")."""
        touches = self.tiers is not None and self.prefix_caching and self.tiers.touches_prompt
        return (self.shares_loading_hits or touches) and self.scheduler == VLLM_V1

    @property
    def tier_window(self) -> tuple[int, int]:
        """The lower tiers' sliding-window copies: ``(copies, blocks)``, ``copies`` entries of a
        block's size per block (one per sliding-window group, ``swa_blocks``) beside its
        full-attention entry, and the ``blocks`` before a hit's end whose copies a hit needs
        (vLLM's ``cdiv(sliding_window, block_size)``); ``(0, 0)``: none. vLLM's
        OffloadingConnector under the hybrid KV cache manager (its connector's
        ``group_entries``; ``vllm_v1`` with prefix caching and sliding-window layers) keys
        its CPU blocks by block and group, looks a sliding-window group up from the hit's end
        and touches its copies only there (offloading/scheduler.py ``_lookup``,
        ``_sliding_window_lookup``, ``_touch``, 0.22.0); both engines read this;
        docs/model.md, "Sliding-window copies in the lower tiers"."""
        if (
            self.tiers is None
            or not self.tiers.group_entries
            or not self.prefix_caching
            or self.swa_blocks <= 0
            or self.swa_window <= 0
        ):
            return (0, 0)
        return (int(self.swa_blocks), -(-int(self.swa_window) // int(self.block_tokens)))

    @property
    def prefetches_at_arrival(self) -> bool:
        """A request's hits in a tier whose connector prefetches are read into the tiers above
        it at the request's arrival, and the request waits in its queue, holding no HBM, until
        they are there (SGLang HiCache's storage prefetch with ``wait_complete``, under
        ``vllm_v1`` with prefix caching, the radix cache it extends; both engines read this;
        docs/model.md, "Storage prefetch at arrival")."""
        return (
            self.tiers is not None
            and self.tiers.prefetches
            and self.scheduler == VLLM_V1
            and self.prefix_caching
        )

    @property
    def tiers_read_at_arrival(self) -> np.ndarray:
        """bool per lower tier: those only a storage prefetch at arrival reads, where one runs
        (``prefetches_at_arrival``); an admission's lookup stops at them (SGLang matches the
        device and host trees; storage pages reach the host pool through a prefetch alone).
        The first lower tier has none above it to read into, so it is never one."""
        if self.tiers is None:
            return np.zeros(0, dtype=np.bool_)
        out = np.zeros(self.tiers.n_tiers, dtype=np.bool_)
        if self.prefetches_at_arrival:
            out[1:] = self.tiers.prefetch_at_arrival[1:]
        return out

    @property
    def prefetch_limit_tokens(self) -> int:
        """The tokens an instance's storage prefetches in flight may reserve before another is
        declined: half its first lower tier (SGLang's ``prefetch_capacity_limit``, half the host
        pool; ``prefetch_tokens_occupied`` counts each prefetch's whole prompt left past the
        host match, from its issue until the scheduler takes its result)."""
        if self.tiers is None or self.tiers.n_tiers == 0:
            return 0
        cap = int(self.tiers.capacity_blocks[0]) * self.block_tokens
        if self.prefetch_reserve == "host_less_device":  # SGLang 0.5.10's rule
            spare = cap - int(self.capacity_blocks) * self.block_tokens
            return int(PREFETCH_SPARE_SHARE * max(spare, 0))
        return int(PREFETCH_HOST_SHARE * cap)

    @property
    def prefetch_min_blocks(self) -> int:
        """The fewest blocks of prompt past the host match a prefetch is issued for:
        ``prefetch_min_tokens`` (SGLang's ``prefetch_threshold``, 256 tokens) or a page if
        longer (``managers/cache_controller.py``: ``max(prefetch_threshold, page_size)``; the
        radix cache's ``prefetch_from_storage`` declines a shorter key)."""
        return -(-max(self.prefetch_min_tokens, self.block_tokens) // self.block_tokens)

    @property
    def shares_loading_hits(self) -> bool:
        """A request's loaded blocks enter HBM's prefix cache at its admission and a request
        hitting them before they have arrived waits for them (``caches_loads_at_admission``
        with lower tiers and prefix caching; both engines read this; docs/model.md, "Hits
        another request is loading")."""
        return self.tiers is not None and self.prefix_caching and self.caches_loads_at_admission

    @property
    def two_pools(self) -> bool:
        """The decode instances differ from the prefill ones (capacity, watermark or timing)."""
        return self.n_prefill > 0 and (
            self.decode_capacity_blocks is not None
            or self.decode_watermark_blocks is not None
            or self.decode_timing is not None
        )

    def instance_capacity(self) -> np.ndarray:
        """HBM blocks of each instance (int64): the prefill (or only) pool's, then the
        decode pool's."""
        cap = np.full(self.n_instances, self.capacity_blocks, dtype=np.int64)
        if self.n_prefill > 0 and self.decode_capacity_blocks is not None:
            cap[self.n_prefill :] = self.decode_capacity_blocks
        return cap

    def instance_watermark(self) -> np.ndarray:
        """vllm_v1's free blocks an admission leaves, per instance (int64)."""
        wm = np.full(self.n_instances, self.watermark_blocks, dtype=np.int64)
        if self.n_prefill > 0 and self.decode_watermark_blocks is not None:
            wm[self.n_prefill :] = self.decode_watermark_blocks
        return wm

    def fit_blocks(self) -> int:
        """The most blocks a request may hold and still be served: the smallest instance's
        (a disaggregated request is held by a prefill and then a decode instance)."""
        return int(self.instance_capacity().min())

    def pool_timings(self) -> list[np.ndarray]:
        """The packed step-time array of each pool: the prefill (or only) pool's, then the
        decode pool's when it has its own (front-end costs: ``frontend_s`` and
        ``frontend_token_s`` in both)."""
        first = self.timing_params()
        if self.n_prefill == 0 or self.decode_timing is None:
            return [first]
        second = self.decode_timing.copy()
        second[T_FRONTEND] = self.frontend_s
        second[T_FRONTEND_TOKEN] = self.frontend_token_s
        return [first, second]

    def instance_timings(self) -> list[np.ndarray]:
        """The packed step-time array of each instance (the same object within a pool)."""
        pools = self.pool_timings()
        return [pools[1 if k >= self.n_prefill and len(pools) > 1 else 0]
                for k in range(self.n_instances)]  # fmt: skip


def build_config(hardware: Hardware, model: ModelProfile, policy: Policy) -> SimConfig:
    """Derive a :class:`SimConfig`; impossible deployments raise :class:`InputError`."""
    hardware, model = apply_deployment(hardware, model, policy)
    topo = hardware.topology
    serving = policy.serving
    layout = plan_layout(topo, serving, hardware.name)
    n_inst = layout.n_instances
    kvb = model.kv_bytes_per_token(policy.kv_dtype)
    n_pf = layout.n_prefill
    if n_pf and not 1 <= n_pf < n_inst:
        raise InputError(
            f"serving.prefill_instances = {n_pf} leaves no decode instance of {n_inst}; "
            f"choose 0 (aggregated) or 1..{n_inst - 1}"
        )
    hardware = _prefill_gpu(hardware, serving.prefill_gpu, n_pf)
    hetero = hardware.prefill_gpu is not None
    two = layout.mixed or hetero  # the decode pool has its own blocks and step times
    keys = ("serving.prefill_tp", "serving.decode_tp") if two else ("serving.tp",) * 2
    prefill_hw = replace(hardware, gpu=hardware.prefill_gpu) if hetero else hardware
    pools = [_pool(prefill_hw, model, policy, layout.prefill_tp, float(kvb), keys[0])]
    if two:
        pools.append(_pool(hardware, model, policy, layout.decode_tp, float(kvb), keys[1]))
    first = pools[0]
    timing, backend, provenance = first.timing, first.backend, first.provenance
    hbm_source = first.hbm_source
    if two and pools[1].hbm_source != hbm_source:
        hbm_source = f"prefill: {hbm_source}; decode: {pools[1].hbm_source}"
    if two:
        pf_name = f"{prefill_hw.gpu.name} " if hetero else ""
        dc_name = f"{hardware.gpu.name} " if hetero else ""
        provenance = f"prefill {pf_name}tp={layout.prefill_tp}: {provenance}; decode " + (
            f"{dc_name}tp={layout.decode_tp}: {pools[1].provenance}"
        )
        if pools[1].backend != backend:
            backend = f"{backend}+{pools[1].backend}"
    # the scheduler's per-instance queues: three int64 slots per sequence and instance
    check_allocation(
        24 * n_inst * serving.max_num_seqs,
        f"{n_inst:,} instances of {serving.max_num_seqs:,} sequences each",
        option="serving.max_num_seqs",
    )
    if (
        serving.routing == "llmd_epp"
        and serving.epp_prefix_source == "index"
        and serving.epp_gpu_index_entries == 0
        and serving.epp_gpu_index_entry_tokens != 0
    ):
        # the EPP's autoTune takes both from vLLM: a stated entry size needs stated entries
        raise InputError(
            "is set while serving.epp_gpu_index_entries is 0 (autoTune, which takes the entry "
            "size from vLLM's block size); set both or neither",
            option="serving.epp_gpu_index_entry_tokens",
        )
    tiers = build_tiers(hardware, model, policy, n_inst, layout)
    pd = None
    if n_pf:
        # each instance's links at its own GPUs (kvtier.sim.pd): the KV crosses the smaller
        # pool's links, each decode GPU pulling its share (docs/model.md)
        pd, tiers = build_pd(hardware, model, policy, n_inst, tiers, layout)
    last = pools[-1]
    watermark = admission_watermark(serving)
    return SimConfig(
        n_instances=n_inst,
        capacity_blocks=first.blocks,
        block_tokens=policy.block_tokens,
        token_budget=serving.max_num_batched_tokens,
        max_seqs=serving.max_num_seqs,
        router=ROUTER_CODES[serving.routing],
        affinity_overload=serving.affinity_overload,
        # the roofline scalars of the packed array's header (timing_params writes them back)
        flops_per_token=float(timing[0]),
        attn_coef=float(timing[1]),
        compute_rate=float(timing[2]),
        weight_bytes=float(timing[3]),
        kv_bytes_per_token=float(timing[4]),
        mem_rate=float(timing[5]),
        step_overhead_s=float(timing[6]),
        cost_per_hour=hardware.cost_per_hour(
            n_inst,
            tiers.tier_gb if tiers else None,
            gpus=layout.gpus,
            hosts=layout.hosts,
            prefill_gpus=n_pf * layout.prefill_tp if hetero else 0,
        ),
        tiers=tiers,
        timing=timing,
        step_backend=backend,
        step_provenance=provenance,
        hbm_provenance=hbm_source,
        frontend_s=float(timing[T_FRONTEND]),
        frontend_token_s=float(timing[T_FRONTEND_TOKEN]),
        prefix_caching=serving.prefix_caching,
        kv_overlap_weight=float(serving.kv_overlap_weight),
        epp_weights=(
            float(serving.epp_queue_weight),
            float(serving.epp_kv_util_weight),
            float(serving.epp_gpu_prefix_weight),
            float(serving.epp_cpu_prefix_weight),
            float(serving.epp_no_hit_lru_weight),
            float(serving.epp_active_weight),
        ),
        epp_index=(
            (
                int(serving.epp_gpu_index_entries),
                int(serving.epp_gpu_index_entry_tokens),
                int(serving.epp_cpu_index_entries),
                int(serving.epp_cpu_index_entry_tokens),
                int(serving.epp_index_max_tokens),
            )
            if serving.epp_prefix_source == "index"
            else ()
        ),
        epp_bytes_per_token=float(serving.epp_prompt_bytes_per_token),
        epp_metrics_interval_s=float(serving.epp_metrics_interval_s),
        epp_metrics_decode_every=(
            SGLANG_DECODE_LOG_INTERVAL if serving.framework == "sglang" else 1
        ),
        scheduler=SCHEDULERS.codes[serving.engine_scheduler],
        n_prefill=n_pf,
        pd=pd,
        watermark_blocks=int(watermark * first.blocks),
        decode_capacity_blocks=last.blocks if two else None,
        decode_watermark_blocks=int(watermark * last.blocks) if two else None,
        reserve_full_prompt=bool(serving.reserve_full_prompt),
        decode_timing=last.timing if two else None,
        gpus=layout.gpus,
        instance_gpus=layout.tps,
        hosts=layout.hosts,
        prefill_gpu=hardware.prefill_gpu,
        **_sliding_groups(model, serving, policy.block_tokens),
        **_prefetch_rules(policy),
        async_scheduling=serving.async_scheduling,
        prefill_first=serving.batching == "prefill_first",
        caches_loads_at_admission=policy.load_caching == "at_admission",
        polls_loads=(
            bool(policy.lower_tiers)
            and serving.engine_scheduler == "vllm_v1"
            and policy.load_wait == "request"
            and policy.load_report == "step_output"
        ),
    )


def _prefetch_rules(policy: Policy) -> dict[str, Any]:
    """The storage prefetch's retries and in-flight reserve, as the connectors of the tiers
    that prefetch at arrival model them (SGLang's release: 0.5.23 retries a declined or
    missed prefetch and reserves half the host pool; 0.5.10 neither retries nor looks again,
    and reserves 0.8 of the host pool past the device pool). Tiers whose connectors disagree
    are one engine's storage back ends of two releases: refused."""
    rules: dict[tuple[bool, str], str] = {}
    for tp in policy.lower_tiers:
        d = CONNECTORS.get(tp.connector, path=f"tiers.{tp.name}.connector").defaults
        if d["prefetch_at_arrival"]:
            rules.setdefault((bool(d["prefetch_retries"]), str(d["prefetch_reserve"])), tp.name)
    if len(rules) > 1:
        names = ", ".join(f"tiers.{name}.connector" for name in rules.values())
        raise InputError(
            f"{names} model the storage prefetch of different SGLang releases; give the tiers "
            "one release's connectors",
            option=f"tiers.{list(rules.values())[-1]}.connector",
        )
    if not rules:
        return {}
    (retries, reserve) = next(iter(rules))
    return {
        "prefetch_retry_attempts": PREFETCH_RETRY_ATTEMPTS if retries else 0,
        "prefetch_reserve": reserve,
    }


def admission_watermark(serving: ServingPolicy) -> float:
    """The share of HBM blocks an admission leaves free: the policy's, or unset the
    scheduler's own ([vLLM-v1-admission]): vLLM v0's block manager keeps 1 %, vLLM V1 none,
    TensorRT-LLM's capacity scheduler none (it reserves every admitted request's whole
    footprint instead, ``reserve``)."""
    if serving.watermark is not None:
        return float(serving.watermark)
    return 0.01 if serving.engine_scheduler == "vllm_v0" else 0.0


def _sliding_groups(
    model: ModelProfile, serving: ServingPolicy, block_tokens: int
) -> dict[str, int]:
    """vLLM V1's hybrid KV cache manager (v1/core/kv_cache_utils.py, 0.24.0,
    ``_get_kv_cache_groups_uniform_page_size``): the layers of each attention type split into
    groups of ``group_size`` layers (the smaller type's count, or the larger's when it is
    under 1.5 times the smaller), every group drawing blocks of ``group_size`` layers' pages
    from one shared pool. A block of tokens of the full-attention layers (what kvtier's HBM
    slot holds) is ``full / group_size`` pool blocks, its sliding-window copy ``sliding /
    group_size``: ``swa_blocks`` is their ratio, rounded down (1 for gpt-oss's 18 and 18).
    ``swa_admission_blocks`` caps that group's share of an admission's reserve at the blocks of
    the window and the tokens in flight (``SlidingWindowSpec.max_admission_blocks_per_request``:
    ``cdiv(window - 1 + tokens, block) + 1``; ``serving.swa_admission_cap``)."""
    if model.sliding_window <= 0 or serving.engine_scheduler != "vllm_v1":
        return {}
    full, sliding = model.full_attention_layers, model.sliding_window_layers
    size = min(full, sliding)
    if max(full, sliding) < 1.5 * size:
        size = max(full, sliding)
    full_groups = -(-full // size)
    sliding_groups = -(-sliding // size)
    batches = {"none": 0, "one_batch": 1, "in_flight": 2 if serving.async_scheduling else 1}
    in_flight = batches[serving.swa_admission_cap] * int(serving.max_num_batched_tokens)
    cap = -(-(model.sliding_window - 1 + in_flight) // block_tokens) + 1 if in_flight else 0
    return {
        "swa_window": model.sliding_window,
        "swa_blocks": sliding_groups // full_groups,
        "swa_admission_blocks": cap,
    }


def _prefill_gpu(hardware: Hardware, name: str | None, n_prefill: int) -> Hardware:
    """``hardware`` with the prefill instances' GPU type: the policy's
    ``serving.prefill_gpu``, else the profile's ``prefill_gpu``; none when the deployment is
    aggregated (every instance on ``gpu``) or the type is ``gpu`` itself."""
    gpu = hardware.prefill_gpu
    if name is not None:
        if not n_prefill:
            raise InputError(
                f"serving.prefill_gpu = {name!r} needs a prefill/decode split; set "
                "serving.prefill_instances or serving.prefill_share, or leave it unset",
                option="serving.prefill_gpu",
            )
        from kvtier.hardware.loader import load_gpu

        try:
            gpu = load_gpu(name)
        except InputError as err:
            raise InputError(f"{err}", option="serving.prefill_gpu") from None
    if not n_prefill or gpu is None or gpu == hardware.gpu:
        gpu = None
    return replace(hardware, prefill_gpu=gpu)


@dataclass(frozen=True)
class _Pool:
    """One pool's HBM blocks per instance and step-time array (its tensor-parallel size)."""

    blocks: int
    timing: np.ndarray
    backend: str
    provenance: str
    hbm_source: str  # where its KV budget came from (kvtier.deploy.kv_budget)


def _pool(
    hardware: Hardware, model: ModelProfile, policy: Policy, tp: int, kvb: float, key: str
) -> _Pool:
    """HBM blocks of an instance of ``tp`` GPUs (weights and KV split over them, MLA latents
    and GQA heads beyond ``tp`` replicated) and its step times (the tables of that tp).

    An instance that cannot hold one block is refused naming what to change: the policy's
    hbm ``capacity_gb`` when it set one, else ``key`` (the pool's tensor-parallel size) with
    the sizes whose GPUs leave room beside the weights."""
    topo = hardware.topology
    if tp != topo.tp:
        hardware = replace(hardware, topology=replace(topo, tp=tp))
    if hardware.weights_in_hbf:  # this pool's GPUs hold the weights in their HBF
        check_hbf(hardware.gpu, model, tp)
    block_bytes = policy.kv_bytes_per_block(model)
    hbm_tier = policy.tiers[0]
    if hbm_tier.capacity_gb is not None:
        kv_bytes = hbm_tier.capacity_gb * GB
        hbm_source = "tiers.hbm.capacity_gb"
    else:
        budget = kv_budget(hardware, model, policy, tp)
        kv_bytes, hbm_source = budget.kv_bytes, budget.source
    replicated = block_bytes * model.kv_replication(tp)
    if kv_bytes < replicated:
        if hbm_tier.capacity_gb is not None:
            raise InputError(
                f"tiers.hbm.capacity_gb = {hbm_tier.capacity_gb:g} GB holds no KV block of "
                f"{policy.block_tokens} tokens at tp={tp} ({replicated / GB:.3g} GB); give at "
                f"least {replicated / GB:.3g}",
                option="tiers.hbm.capacity_gb",
            )
        fits = [
            t
            for t in pool_tp_choices(topo)
            if kv_budget(hardware, model, policy, t).kv_bytes
            >= block_bytes * model.kv_replication(t)
        ]
        raise InputError(
            f"model {model.name!r} leaves no room for KV blocks on {hardware.name!r}: "
            f"{kv_bytes / GB:.1f} GB after weights per instance of {key} = {tp} (sizes that "
            f"leave room: {', '.join(map(str, fits)) or 'none on this hardware'})",
            option=key,
        )
    timing, backend, provenance = step_timing(hardware, model, policy, kvb)
    return _Pool(int(kv_bytes // replicated), timing, backend, provenance, hbm_source)
