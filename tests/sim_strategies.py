"""Hypothesis strategies for serving-simulator tests: prefix-sharing traces and small configs."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import strategies as st

from kvtier.sim.config import SimConfig
from kvtier.sim.tiers import TierConfig
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


@st.composite
def sim_configs(draw: st.DrawFn, block_tokens: int) -> SimConfig:
    """Small pools (HBM pressure and rejections), small budgets (chunking), every router."""
    return SimConfig(
        n_instances=draw(st.integers(1, 4)),
        capacity_blocks=draw(st.one_of(st.integers(1, 12), st.integers(12, 80))),
        block_tokens=block_tokens,
        token_budget=draw(st.sampled_from([1, 2, 3, 8, 16, 64, 4096])),
        max_seqs=draw(st.integers(1, 5)),
        router=draw(st.integers(0, 2)),
        affinity_overload=draw(st.integers(0, 3)),
        flops_per_token=draw(st.sampled_from([1.0, 3.0])),
        attn_coef=draw(st.sampled_from([0.0, 0.01, 0.5])),
        compute_rate=1000.0,
        weight_bytes=draw(st.sampled_from([1.0, 5.0])),
        kv_bytes_per_token=draw(st.sampled_from([0.01, 0.3])),
        mem_rate=draw(st.sampled_from([100.0, 1000.0])),
        step_overhead_s=draw(st.sampled_from([0.0, 1e-3])),
        cost_per_hour=10.0,
    )


@st.composite
def tier_configs(draw: st.DrawFn, n_instances: int, block_tokens: int) -> TierConfig:
    """Every lower tier on (or a random subset), tiny pools, slow links: evictions, cascades
    and queueing on every link happen within a few requests."""
    names = ["dram", "cxl", "rdma", "ssd"]
    if draw(st.booleans()):
        names = [x for x in names if draw(st.booleans())] or ["cxl"]
    gpus_per_host = draw(st.sampled_from([1, 2, 4]))
    inst_host = np.array([k // gpus_per_host for k in range(n_instances)], dtype=np.int64)
    n_hosts = int(inst_host.max()) + 1
    per_host = np.array([x in ("dram", "ssd") for x in names], dtype=np.bool_)
    pools = [n_hosts if ph else 1 for ph in per_host]
    pool_base = np.concatenate([[0], np.cumsum(pools)[:-1]]).astype(np.int64)
    bw = st.sampled_from([1.0, 50.0, 1e4])
    link_r = [draw(bw) for _ in range(n_instances)]
    link_w = list(link_r)
    link_ops = [1] * n_instances
    port = np.full((len(names), n_hosts), -1, dtype=np.int64)
    pool_link = np.full(len(names), -1, dtype=np.int64)
    for t, name in enumerate(names):
        for h in range(n_hosts):
            port[t, h] = len(link_r)
            link_r.append(draw(bw))
            link_w.append(draw(bw))
            link_ops.append(1)
        if name == "cxl" and draw(st.booleans()):
            pool_link[t] = len(link_r)
            link_r.append(draw(bw))
            link_w.append(link_r[-1])
            link_ops.append(0)
    return TierConfig(
        names=tuple(names),
        evictions=tuple(draw(st.sampled_from(POLICIES)) for _ in names),
        capacity_blocks=np.array([draw(st.integers(1, 10)) for _ in names], dtype=np.int64),
        per_host=per_host,
        pool_base=pool_base,
        n_pools=int(sum(pools)),
        n_hosts=n_hosts,
        inst_host=inst_host,
        op_s=np.array([draw(st.sampled_from([0.0, 1e-4, 1e-2])) for _ in names]),
        lat_s=np.array([draw(st.sampled_from([0.0, 1e-3])) for _ in names]),
        cap_bw=np.array([draw(st.sampled_from([np.inf, 1.0])) for _ in names]),
        link_bw_read=np.array(link_r),
        link_bw_write=np.array(link_w),
        link_ops=np.array(link_ops, dtype=np.int64),
        link_names=tuple(f"l{j}" for j in range(len(link_r))),
        port_link=port,
        pool_link=pool_link,
        write_policy=draw(st.integers(0, 2)),
        selective_k=draw(st.integers(1, 3)),
        exclusive=draw(st.booleans()),
        cost_aware=draw(st.booleans()),
        batch_waits=draw(st.booleans()),
        fragments=draw(st.sampled_from([1, 4])),
        coalesce=draw(st.sampled_from([1, 3])),
        block_bytes=float(block_tokens) * draw(st.sampled_from([0.01, 0.3])),
        tier_gb={name: 1.0 for name in names},
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
    return replace(cfg, tiers=draw(tier_configs(cfg.n_instances, block_tokens)))
