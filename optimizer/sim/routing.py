"""The KV-aware router's tier weights: what a prefix block found below HBM is worth.

Dynamo's KV router (ai-dynamo/dynamo ``lib/llm/src/kv_router/scheduler.rs``, v0.4; later
``lib/kv-router/src/scheduling/selector.rs``) costs a worker as ``overlap_weight *
prefill_blocks + decode_blocks`` and, with KVBM, lets a block found beyond the device prefix
take ``shared_cache_multiplier`` off the prefill; llm-d's precise prefix-cache scorer
(llm-d/llm-d-kv-cache ``pkg/kvcache/kvblock_scorer.go``, ``LongestPrefixScorer``) weights each
matched block by its medium (``gpu`` 1.0, ``cpu`` 0.8 in its examples). Both are constants a
user sets. Here the weight of a block in tier ``t`` reached by instance ``k`` follows from the
profile instead: ``1 - load / recompute`` per block (clamped to [0, 1]), ``load`` the time a
chunk-sized run (``max_num_batched_tokens / B`` blocks) takes through the tier's connector on
idle links, ``recompute`` the time its prefill takes at context 0. A tier that loads no faster
than recomputing is worth nothing to the router, a free one as much as an HBM hit.

Both serving engines read the same array (computed once per replay here, in Python), so the
router's floating-point sums are identical in both.
"""

from __future__ import annotations

import numpy as np

from kvtier.sim.config import SimConfig
from kvtier.sim.timing import prefill_seconds
from kvtier.sim.transfer import ops_of, path_estimate


def kv_route_weights(cfg: SimConfig) -> np.ndarray:
    """Weight of one prefix block in tier ``t`` for instance ``k``: float64 ``(T, n_instances)``
    (``T`` = 0 without lower tiers)."""
    c = cfg.tiers
    n = cfg.n_instances
    if c is None:
        return np.zeros((0, n), dtype=np.float64)
    timing = cfg.timing_params()
    run = max(cfg.token_budget // cfg.block_tokens, 1)
    recompute = float(prefill_seconds(run * cfg.block_tokens, 0, timing))
    free = np.zeros(2 * c.n_links)
    wfree = np.zeros(max(c.n_workers, 1))
    w = np.zeros((c.n_tiers, n), dtype=np.float64)
    for t in range(c.n_tiers):
        for k in range(n):
            load = path_estimate(
                0.0,
                run * c.block_bytes,
                ops_of(c.unit[t], run, c.fragments, c.coalesce),
                c.rpc_s[t],
                c.stream_bw[t, k],
                c.stage_bw[t, k],
                c.serial[t],
                c.depth[t],
                c.lat_s[t],
                c.cap_bw[t],
                c.gpu_path[t, k],
                c.gpu_scale[t],
                c.link_bw_read,
                c.link_duplex,
                0,
                free,
                wfree,
                c.w0[t, k],
                c.nw[t],
            )
            v = 1.0 - load / recompute if recompute > 0 else 0.0
            w[t, k] = min(max(v, 0.0), 1.0)
    return w
