"""Hypothesis strategies for serving-simulator tests: prefix-sharing traces and small configs."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from optimizer.sim.config import SimConfig
from optimizer.trace.blocked import BlockedTrace


@st.composite
def blocked_traces(draw: st.DrawFn, *, max_requests: int = 25) -> BlockedTrace:
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
        outputs.append(draw(st.integers(0, 12)))
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
