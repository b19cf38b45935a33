"""Hypothesis strategies for serving-simulator tests: prefix-sharing traces and small configs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

from kvtier.policy.registries import LOAD_RULES, WRITE_POLICIES
from kvtier.sim.config import SimConfig
from kvtier.sim.pd import PdConfig
from kvtier.sim.steptime.measured import MeasuredKey, MeasuredTables
from kvtier.sim.steptime.pack import pack_measured, roofline_params
from kvtier.sim.tiers import MAX_PATH, TierConfig
from kvtier.trace.blocked import BlockedTrace


@st.composite
def blocked_traces(
    draw: st.DrawFn, *, max_requests: int = 25, max_output: int = 12
) -> BlockedTrace:
    """Requests reading prefixes of a few shared documents (a prefix tree), bursty arrivals.

    With ``chained=False`` block ids are drawn at random, repeats within a request included,
    so the engines must agree even on traces no real mapper would produce.
    """
    B = draw(st.sampled_from([1, 2, 4, 8]))
    chained = draw(st.booleans())
    n = draw(st.integers(1, max_requests))
    n_docs = draw(st.integers(1, 4))
    docs: list[list[int]] = []
    for d in range(n_docs):
        length = draw(st.integers(1, 12))
        shared = draw(st.integers(0, min(length, len(docs[0])))) if docs else 0
        head = docs[0][:shared] if docs else []
        docs.append(head + [1000 * (d + 1) + j for j in range(shared, length)])
    gap = st.sampled_from([0.0, 0.0, 1e-4, 1e-3, 0.01, 0.1, 1.0])
    gaps = draw(st.lists(gap, min_size=n, max_size=n))
    arrival = np.cumsum(np.asarray(gaps, dtype=np.float64))
    inputs, outputs, blocks = [], [], []
    for _ in range(n):
        if chained:
            doc = docs[draw(st.integers(0, n_docs - 1))]
            ids = doc[: draw(st.integers(0, len(doc)))]
        else:
            ids = draw(st.lists(st.integers(0, 6), max_size=8))
        extra = draw(st.integers(0 if ids else 1, 3 * B))
        inputs.append(len(ids) * B + extra)
        outputs.append(draw(st.integers(0, max_output)))
        blocks.append(ids)
    uniq = sorted({b for ids in blocks for b in ids})
    dense = {b: i for i, b in enumerate(uniq)}
    return BlockedTrace.from_lists(
        arrival.tolist(),
        inputs,
        outputs,
        [[dense[b] for b in ids] for ids in blocks],
        B,
        n_blocks=len(uniq),
    )


def disaggregated(draw: st.DrawFn, cfg: SimConfig) -> SimConfig:
    """``cfg`` aggregated, or (half the time, with two instances or more) split into a prefill
    pool and a decode pool, the P/D transfer over random paths through the tiers' links (their
    queues shared) and links of its own, slow enough to queue, a random connector, pulled
    after the prefill or pushed layer by layer, moving every block or only those past the
    decode instance's own prefix hit."""
    # one pool unless two_pools draws a second (a config drawn before may carry one)
    cfg = replace(
        cfg, decode_capacity_blocks=None, decode_watermark_blocks=None, decode_timing=None
    )
    if cfg.n_instances < 2 or draw(st.booleans()):
        return replace(cfg, n_prefill=0)
    K = cfg.n_instances
    tiers = cfg.tiers
    bw = st.sampled_from([0.5, 1.0, 50.0, 1e4])
    read = list(tiers.link_bw_read) if tiers is not None else []
    write = list(tiers.link_bw_write) if tiers is not None else []
    duplex = [int(x) for x in tiers.link_duplex] if tiers is not None else []
    names = list(tiers.link_names) if tiers is not None else []
    for j in range(draw(st.integers(0 if read else 1, 3))):
        read.append(draw(bw))
        write.append(draw(bw))
        duplex.append(draw(st.integers(0, 1)))
        names.append(f"pd[{j}]")
    L = len(read)
    width = draw(st.integers(1, 4))
    path = np.full((K, K, width), -1, dtype=np.int64)
    queue = np.zeros((K, K, width), dtype=np.int64)
    scale = np.ones((K, K, width), dtype=np.float64)
    for p in range(K):
        for d in range(K):
            for j in range(draw(st.integers(0, width))):
                path[p, d, j] = draw(st.integers(0, L - 1))
                queue[p, d, j] = draw(st.integers(0, 1))
                scale[p, d, j] = draw(st.sampled_from([0.5, 1.0, 2.0]))
    lat = np.full((K, K), draw(st.sampled_from([0.0, 1e-3])))
    pd = PdConfig(
        connector="drawn",
        path=path,
        queue=queue,
        scale=scale,
        lat_s=lat,
        link_bw_read=np.array(read, dtype=np.float64),
        link_bw_write=np.array(write, dtype=np.float64),
        link_duplex=np.array(duplex, dtype=np.int64),
        link_names=tuple(names),
        block_bytes=draw(st.sampled_from([0.0, 0.5, 3.0])) * cfg.block_tokens,
        unit=draw(st.integers(0, 2)),
        fragments=draw(st.integers(1, 3)),
        coalesce=draw(st.integers(1, 2)),
        rpc_s=draw(st.sampled_from([0.0, 1e-4, 1e-2])),
        stream_bw=draw(st.sampled_from([np.inf, 2.0])),
        stage_bw=draw(st.sampled_from([np.inf, 5.0])),
        serial=draw(st.integers(0, 1)),
        depth=draw(st.sampled_from([1, 4])),
        workers=draw(st.integers(1, 2)),
        layerwise=draw(st.booleans()),
        layers=draw(st.sampled_from([1, 4])),
        decode_hit=draw(st.booleans()),
    )
    if tiers is not None:
        tiers = replace(
            tiers,
            link_bw_read=pd.link_bw_read,
            link_bw_write=pd.link_bw_write,
            link_duplex=pd.link_duplex,
            link_names=pd.link_names,
        )
    split = replace(cfg, n_prefill=draw(st.integers(1, K - 1)), pd=pd, tiers=tiers)
    return two_pools(draw, split)


def two_pools(draw: st.DrawFn, cfg: SimConfig) -> SimConfig:
    """A split ``cfg`` as is, or (half the time) with a decode pool of another tensor-parallel
    size: its own HBM blocks (fewer or more than the prefill pool's), watermark and step
    times."""
    if draw(st.booleans()):
        return cfg
    cap = draw(st.one_of(st.integers(1, 12), st.integers(12, 80)))
    return replace(
        cfg,
        decode_capacity_blocks=cap,
        decode_watermark_blocks=draw(st.sampled_from([0, min(1, cap)])),
        decode_timing=draw(st.one_of(st.none(), timings())),
    )


@st.composite
def sim_configs(draw: st.DrawFn, block_tokens: int) -> SimConfig:
    """Small pools (HBM pressure and rejections), small budgets (chunking), every router,
    aggregated or disaggregated."""
    return disaggregated(draw, _sim_config(draw, block_tokens))


def _sim_config(draw: st.DrawFn, block_tokens: int) -> SimConfig:
    return SimConfig(
        n_instances=draw(st.integers(1, 4)),
        capacity_blocks=draw(st.one_of(st.integers(1, 12), st.integers(12, 80))),
        block_tokens=block_tokens,
        token_budget=draw(st.sampled_from([1, 2, 3, 8, 16, 64, 4096])),
        max_seqs=draw(st.integers(1, 5)),
        router=draw(st.integers(0, 4)),
        affinity_overload=draw(st.integers(0, 3)),
        kv_overlap_weight=draw(st.sampled_from([0.0, 1.0, 2.5])),
        epp_weights=draw(
            st.sampled_from(
                [
                    (1.0,) * 5 + (0.0,),
                    (2.0, 2.0, 1.0, 1.0, 0.0, 0.0),
                    (0.5, 0.0, 3.0, 1.0, 1.0, 0.0),
                    (0.0, 2.0, 1.0, 1.0, 0.0, 2.0),
                    (1.0, 0.0, 0.5, 0.0, 1.0, 3.0),
                ]
            )
        ),
        # llmd_epp's prefix source: the caches, the EPP's indexes at their defaults (never
        # full here), or indexes of a few entries (turning over; entries of one or several
        # blocks or of a size the block does not divide; a short hashed head)
        epp_index=draw(
            st.sampled_from(
                [
                    (),
                    (0, 0, 31250, 64, 131072),
                    (1, 0, 2, 16, 1 << 20),
                    (3, 16, 1, 32, 64),
                    (2, 24, 3, 40, 200),
                ]
            )
        ),
        # prompt text at the EPP's own 4 bytes a token, or denser (entries of fewer tokens)
        epp_bytes_per_token=draw(st.sampled_from([4.0, 4.0, 7.0, 9.5])),
        # llmd_epp reading the queue and KV use as last scraped: the exact state, or scrapes
        # shorter or longer than the steps (longer: more steps than the ring keeps)
        epp_metrics_interval_s=draw(st.sampled_from([0.0, 0.0, 0.003, 0.05, 0.7, 40.0])),
        # reported every decode step (vLLM) or every few (SGLang's decode_log_interval)
        epp_metrics_decode_every=draw(st.sampled_from([1, 1, 2, 40])),
        scheduler=draw(st.integers(0, 2)),  # reserve, vllm_v1, vllm_v0
        watermark_blocks=draw(st.sampled_from([0, 0, 1])),
        # vLLM's scheduler_reserve_full_isl (vllm_v1's alone)
        reserve_full_prompt=draw(st.booleans()),
        flops_per_token=draw(st.sampled_from([1.0, 3.0])),
        attn_coef=draw(st.sampled_from([0.0, 0.01, 0.5])),
        compute_rate=1000.0,
        weight_bytes=draw(st.sampled_from([1.0, 5.0])),
        kv_bytes_per_token=draw(st.sampled_from([0.01, 0.3])),
        mem_rate=draw(st.sampled_from([100.0, 1000.0])),
        step_overhead_s=draw(st.sampled_from([0.0, 1e-3])),
        cost_per_hour=10.0,
        timing=draw(st.one_of(st.none(), timings())),
        frontend_s=draw(st.sampled_from([0.0, 0.0, 7e-3])),
        frontend_token_s=draw(st.sampled_from([0.0, 0.0, 3e-5])),
        track_tbt=draw(st.sampled_from([True, True, False])),  # token intervals, mostly on
        # sliding-window blocks cached in the pool (vLLM's hybrid manager), mostly off
        swa_window=draw(st.sampled_from([0, 0, 0, 1, 2, 5])),
        swa_blocks=draw(st.sampled_from([1, 2])),
        # ... counted at an admission under reserve_full_prompt, capped or not
        swa_admission_blocks=draw(st.sampled_from([0, 0, 1, 3])),
        # vLLM's async scheduling (vllm_v1's alone; the other schedulers ignore it)
        async_scheduling=draw(st.booleans()),
        # vLLM's KV connector: a load's end reported with a later step's output
        polls_loads=draw(st.booleans()),
        # SGLang's batching: a step of prefill chunks when one can run, else of decodes
        prefill_first=draw(st.booleans()),
    )


@st.composite
def timings(draw: st.DrawFn) -> np.ndarray:
    """A packed step-time array: the improved roofline (separate decode rate, all-reduce, MoE
    distinct experts) or synthetic measured tables on small grids, so that the traces' batches
    and contexts run past them (extrapolated lookups)."""
    moe = draw(st.sampled_from([None, 5, 300]))
    base = roofline_params(
        flops_per_token=draw(st.sampled_from([1.0, 3.0])),
        attn_coef=draw(st.sampled_from([0.0, 0.01, 0.5])),
        prefill_rate=1000.0,
        decode_rate=draw(st.sampled_from([1000.0, 250.0])),
        weight_bytes=draw(st.sampled_from([1.0, 5.0])),
        kv_bytes_per_token=draw(st.sampled_from([0.01, 0.3])),
        mem_rate=draw(st.sampled_from([100.0, 1000.0])),
        step_overhead_s=draw(st.sampled_from([0.0, 1e-3])),
        ar_s_per_token=draw(st.sampled_from([0.0, 1e-5])),
        ar_fixed_s=draw(st.sampled_from([0.0, 3e-4])),
        expert_bytes=0.0 if moe is None else 40.0,
        moe_fraction=None if moe is None else 1.0 - 0.9 ** np.arange(moe, dtype=np.float64),
    )
    if not draw(st.booleans()):
        return base
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))

    def grid(values: list[float]) -> np.ndarray:
        return np.array(values, dtype=np.float64)

    tok, pq, pc = grid([1, 2, 4, 8, 16]), grid([1, 3, 8, 20]), grid([0, 4, 16, 40])
    db, dc = grid([1, 2, 4]), grid([1, 8, 32, 64])
    tables = MeasuredTables(
        MeasuredKey("synthetic", "none", "vllm", "0", 1, "bf16", "bf16"),
        tok,
        np.sort(rng.uniform(1e-3, 5e-3, tok.size)),
        pq,
        pc,
        rng.uniform(0.0, 1e-3, (pq.size, pc.size)),
        float(rng.uniform(0.0, 2e-4)),
        db,
        dc,
        rng.uniform(1e-5, 1e-3, (db.size, dc.size)),
    )
    return pack_measured(base, tables, draw(st.sampled_from([0.0, 1e-3])))


@st.composite
def tier_configs(draw: st.DrawFn, n_instances: int, block_tokens: int) -> TierConfig:
    """Every lower tier on (or a random subset), tiny pools, slow links: evictions, cascades
    and queueing on every link and worker happen within a few requests. Each tier's connector
    is drawn at random: operation unit, serial or pipelined with a depth, workers per GPU or
    per host, per-operation cost, stream and staging rates, layer-wise overlap, whether a load
    fills the tiers above, whether a request's hits are prefetched at its arrival; links may
    be full duplex, shared by a switch, or a host's DRAM bus."""
    names = ["dram", "cxl", "rdma", "ssd"]
    if draw(st.booleans()):
        names = [x for x in names if draw(st.booleans())] or ["cxl"]
    T = len(names)
    gpus_per_host = draw(st.sampled_from([1, 2, 4]))
    inst_host = np.array([k // gpus_per_host for k in range(n_instances)], dtype=np.int64)
    n_hosts = int(inst_host.max()) + 1
    per_host = np.array([x in ("dram", "ssd") for x in names], dtype=np.bool_)
    # a per-host tier is one pool per host or one per engine (each instance its own)
    per_engine = [bool(ph) and draw(st.booleans()) for ph in per_host]
    pools = [
        n_instances if pe else n_hosts if ph else 1
        for ph, pe in zip(per_host, per_engine, strict=True)
    ]
    pool_base = np.concatenate([[0], np.cumsum(pools)[:-1]]).astype(np.int64)
    pool_local = np.zeros((T, n_instances), dtype=np.int64)
    for t in range(T):
        if per_engine[t]:
            pool_local[t] = np.arange(n_instances)
        elif per_host[t]:
            pool_local[t] = inst_host
    bw = st.sampled_from([1.0, 50.0, 1e4])
    link_r: list[float] = []
    link_w: list[float] = []
    duplex: list[int] = []

    def add(r: float, w: float, dup: int) -> int:
        link_r.append(r)
        link_w.append(w)
        duplex.append(dup)
        return len(link_r) - 1

    pcie = [add(b, b, draw(st.integers(0, 1))) for b in [draw(bw) for _ in range(n_instances)]]
    switch = [-1] * n_instances
    if draw(st.booleans()):
        per_switch = draw(st.sampled_from([1, 2]))
        ids: dict[tuple[int, int], int] = {}
        for k in range(n_instances):
            key = (int(inst_host[k]), (k % gpus_per_host) // per_switch)
            if key not in ids:
                ids[key] = add(draw(bw), draw(bw), draw(st.integers(0, 1)))
            switch[k] = ids[key]
    membus = [add(draw(bw), 0.0, 0) for _ in range(n_hosts)] if draw(st.booleans()) else None
    if membus is not None:
        for h in membus:
            link_w[h] = link_r[h]
    port = np.full((T, n_instances), -1, dtype=np.int64)
    pool_link = np.full(T, -1, dtype=np.int64)
    for t, name in enumerate(names):
        per_gpu = draw(st.booleans())
        ids = {}
        for k in range(n_instances):
            key = (int(inst_host[k]), k if per_gpu else -1)
            if key not in ids:
                ids[key] = add(draw(bw), draw(bw), draw(st.integers(0, 1)))
            port[t, k] = ids[key]
        if name == "cxl" and draw(st.booleans()):
            b = draw(bw)
            pool_link[t] = add(b, b, draw(st.integers(0, 1)))
    # device queues of non-interleaved pools: a few blocks a device, so transfers spread
    # over the devices and queue on each
    dev_blocks = np.zeros(T, dtype=np.int64)
    devices = np.ones(T, dtype=np.int64)
    dev_link0 = np.full(int(sum(pools)), -1, dtype=np.int64)
    for t in range(T):
        if draw(st.booleans()):
            dev_blocks[t] = draw(st.sampled_from([1, 2, 5]))
            devices[t] = draw(st.integers(2, 3))
            b = draw(bw)
            for p in range(int(pool_base[t]), int(pool_base[t]) + pools[t]):
                dev_link0[p] = add(b, b, 0)
                for _ in range(int(devices[t]) - 1):
                    add(b, b, 0)
    staging = [draw(st.integers(0, 2)) for _ in names]
    via = [draw(st.booleans()) for _ in names]
    gpu_path = np.full((T, n_instances, MAX_PATH), -1, dtype=np.int64)
    casc_path = np.full((T, n_instances, MAX_PATH), -1, dtype=np.int64)
    gpu_scale = np.ones((T, MAX_PATH))
    for t in range(T):
        gpu_scale[t, 4] = 2.0 * max(staging[t], 1)
        for k in range(n_instances):
            gpu_path[t, k, 0] = pcie[k]
            gpu_path[t, k, 1] = switch[k] if via[t] else -1
            gpu_path[t, k, 2] = port[t, k]
            gpu_path[t, k, 3] = pool_link[t]
            if membus is not None and staging[t] > 0:
                gpu_path[t, k, 4] = membus[int(inst_host[k])]
            if t + 1 < T:
                casc_path[t, k, :4] = (port[t, k], pool_link[t], port[t + 1, k], pool_link[t + 1])
    stage_bw = np.full((T, n_instances), np.inf)
    for t in range(T):
        if staging[t] > 0:
            stage_bw[t] = [draw(st.sampled_from([5.0, 500.0])) / staging[t]
                           for _ in range(n_instances)]  # fmt: skip
    nw = np.array([draw(st.integers(1, 3)) for _ in names], dtype=np.int64)
    w0 = np.zeros((T, n_instances), dtype=np.int64)
    n_workers = 0
    for t in range(T):
        if draw(st.booleans()):  # per host
            w0[t] = n_workers + inst_host * nw[t]
            n_workers += n_hosts * int(nw[t])
        else:
            w0[t] = n_workers + np.arange(n_instances) * nw[t]
            n_workers += n_instances * int(nw[t])
    return TierConfig(
        names=tuple(names),
        evictions=tuple(draw(st.sampled_from(POLICIES)) for _ in names),
        connectors=tuple("direct" for _ in names),
        capacity_blocks=np.array([draw(st.integers(1, 10)) for _ in names], dtype=np.int64),
        per_host=per_host,
        pool_base=pool_base,
        n_pools=int(sum(pools)),
        pool_count=np.array(pools, dtype=np.int64),
        pool_local=pool_local,
        n_hosts=n_hosts,
        inst_host=inst_host,
        lat_s=np.array([draw(st.sampled_from([0.0, 1e-3])) for _ in names]),
        cap_bw=np.array([draw(st.sampled_from([np.inf, 1.0])) for _ in names]),
        rpc_s=np.array([draw(st.sampled_from([0.0, 1e-4, 1e-2])) for _ in names]),
        # per instance (an instance's tensor-parallel ranks each stream their shard)
        stream_bw=np.array(
            [
                [draw(st.sampled_from([np.inf, 2.0, 30.0])) for _ in range(n_instances)]
                for _ in names
            ]  # fmt: skip
        ).reshape(T, n_instances),
        stage_bw=stage_bw,
        serial=np.array([draw(st.integers(0, 1)) for _ in names], dtype=np.int64),
        depth=np.array([draw(st.sampled_from([1, 2, 8])) for _ in names], dtype=np.int64),
        unit=np.array([draw(st.integers(0, 2)) for _ in names], dtype=np.int64),
        layerwise=np.array([draw(st.booleans()) for _ in names], dtype=np.bool_),
        store_blocks=np.array([draw(st.booleans()) for _ in names], dtype=np.bool_),
        store_generated=np.array([draw(st.booleans()) for _ in names], dtype=np.bool_),
        defer_loading_hits=draw(st.booleans()),
        touches_prompt=draw(st.booleans()),
        group_entries=draw(st.booleans()),
        load_fills_upper=np.array([draw(st.booleans()) for _ in names], dtype=np.bool_),
        prefetch_at_arrival=np.array([draw(st.booleans()) for _ in names], dtype=np.bool_),
        w0=w0,
        nw=nw,
        n_workers=n_workers,
        link_bw_read=np.array(link_r),
        link_bw_write=np.array(link_w),
        link_duplex=np.array(duplex, dtype=np.int64),
        link_names=tuple(f"l{j}" for j in range(len(link_r))),
        gpu_path=gpu_path,
        gpu_scale=gpu_scale,
        casc_path=casc_path,
        casc_scale=np.ones((T, MAX_PATH)),
        write_policy=draw(st.integers(0, len(WRITE_POLICIES) - 1)),
        selective_k=draw(st.integers(1, 3)),
        exclusive=draw(st.booleans()),
        load_rule=draw(st.integers(0, len(LOAD_RULES) - 1)),
        batch_waits=draw(st.booleans()),
        fragments=draw(st.sampled_from([1, 4])),
        coalesce=draw(st.sampled_from([1, 3])),
        layers=draw(st.sampled_from([1, 4])),
        block_bytes=float(block_tokens) * draw(st.sampled_from([0.01, 0.3])),
        tier_gb={name: 1.0 for name in names},
        visible_when_stored=np.array([draw(st.booleans()) for _ in names], dtype=np.bool_),
        device_blocks=dev_blocks,
        devices=devices,
        device_link0=dev_link0,
        # batch eviction at a high watermark (kvtier.cache.watermark): off (1) or shedding
        # within a few blocks of these tiny pools
        evict_high=np.array([draw(st.sampled_from([1.0, 1.0, 0.5, 0.8])) for _ in names]),
        evict_ratio=np.array([draw(st.sampled_from([0.0, 0.05, 0.3])) for _ in names]),
    )


POLICIES = ("lru", "fifo", "lfu", "s3fifo", "sieve", "gdsf")


@st.composite
def tiered_configs(draw: st.DrawFn, block_tokens: int) -> SimConfig:
    """:func:`sim_configs` with lower tiers attached."""
    cfg = draw(sim_configs(block_tokens))
    # HBM pools just large enough for a request or two, so prefixes leave HBM and come back
    # from below; more instances, so other instances' blocks are found below.
    cfg = replace(
        cfg, capacity_blocks=draw(st.integers(4, 24)), n_instances=draw(st.integers(1, 6))
    )
    return disaggregated(
        draw,
        replace(
            cfg,
            tiers=draw(tier_configs(cfg.n_instances, block_tokens)),
            prefix_caching=draw(st.booleans()),
            concurrency=draw(st.sampled_from([0, 0, 1, 3])),
            caches_loads_at_admission=draw(st.booleans()),
            # short enough that the small drawn prompts' prefetches happen
            prefetch_min_tokens=draw(st.sampled_from([1, 2, 4])) * block_tokens,
        ),
    )


def branching_prompts(draw: st.DrawFn, n: int) -> list[list[int]]:
    """``n`` token prompts, each extending or branching from an earlier one or new, so they
    share prefixes often (the block mapping's and statistics' property tests)."""
    prompts: list[list[int]] = []
    for _ in range(n):
        if prompts and draw(st.booleans()):
            base = draw(st.sampled_from(prompts))
            cut = draw(st.integers(0, len(base)))
            prompt = base[:cut] + draw(st.lists(st.integers(0, 2), max_size=12))
        else:
            prompt = draw(st.lists(st.integers(0, 2), max_size=24))
        prompts.append(prompt or [0])
    return prompts
