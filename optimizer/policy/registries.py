"""Registries of the serving plug-ins a policy names: routers, write policies, load rules.

The policy loader takes its choices from here, ``kvtier.sim.config`` and ``kvtier.sim.tiers``
their integer codes, the serving kernels (``kvtier.sim.nb``, ``kvtier.sim.reference``) branch
on the code constants below, and the docs tables are printed from the same entries. Eviction
policies have their own registry beside the cache engine (``kvtier.cache.registry``) and are
re-exported here so a policy's every plug-in kind can be found in one module.
"""

from __future__ import annotations

from kvtier.cache.registry import EVICTIONS
from kvtier.plugins import load_plugins
from kvtier.registry import Entry, Registry

# ---- routers (ServingPolicy.routing): one module each in kvtier.sim.routers ------------------
ROUND_ROBIN, LEAST_LOADED, PREFIX_AFFINITY, KV_AWARE, LLMD_EPP = 0, 1, 2, 3, 4


def _router(name: str, code: int, help: str, *, content_blind: bool) -> Entry:
    """A router: its module ``kvtier.sim.routers.<name>`` holds the reference step and its
    numba twin; ``content_blind``: the choice never reads the cache (docs/traces.md)."""
    return Entry(
        name,
        code,
        help,
        impl=f"kvtier.sim.routers.{name}",
        traits={"content_blind": content_blind},
    )


ROUTERS = Registry(
    "router",
    [
        _router(
            "round_robin", ROUND_ROBIN, "requests go to the instances in turn", content_blind=True
        ),
        _router(
            "least_loaded",
            LEAST_LOADED,
            "the instance with the fewest waiting plus running requests (lower index on ties)",
            content_blind=True,
        ),
        _router(
            "prefix_affinity",
            PREFIX_AFFINITY,
            "the instance with the most HBM-resident prefix blocks among those whose load is "
            "at most the least load plus serving.affinity_overload",
            content_blind=False,
        ),
        _router(
            "kv_aware",
            KV_AWARE,
            "Dynamo's KV router cost: serving.kv_overlap_weight x the prompt blocks left to "
            "prefill (HBM hits count 1, lower-tier hits their tier's weight: loading against "
            "recomputing) plus the instance's active blocks; the lowest cost, lower index on ties",
            content_blind=False,
        ),
        _router(
            "llmd_epp",
            LLMD_EPP,
            "llm-d's endpoint picker (EPP): the weighted sum of its queue, KV-cache utilisation, "
            "GPU-prefix, CPU-prefix, no-hit-LRU and active-request scores "
            "(serving.epp_*_weight), the highest sum, lower index on ties",
            content_blind=False,
        ),
    ],
)


def content_blind_routers() -> tuple[str, ...]:
    """The routers whose choice never reads the cache (the registry's ``content_blind``)."""
    return tuple(e.name for e in ROUTERS if e.traits.get("content_blind"))


# ---- schedulers (ServingPolicy.scheduler): how an instance gives HBM blocks to requests -------
RESERVE, VLLM_V1, VLLM_V0 = 0, 1, 2
SCHEDULERS = Registry(
    "scheduler",
    [
        Entry(
            "reserve",
            RESERVE,
            "a request's whole footprint (prompt and output) is allocated at admission and no "
            "request is ever preempted (TensorRT-LLM's GUARANTEED_NO_EVICT capacity policy)",
        ),
        Entry(
            "vllm_v1",
            VLLM_V1,
            "vLLM V1: blocks are allocated as a request grows (each prompt chunk, then one "
            "block per B decode tokens); when a running request needs a block and none is "
            "free, the most recently admitted one is preempted and later recomputed",
        ),
        Entry(
            "vllm_v0",
            VLLM_V0,
            "vLLM v0 (vllm/core/scheduler.py _schedule_default, v0.4): waiting prompts are "
            "run whole (no chunking, the token budget caps the prompts of one iteration) in "
            "an iteration of their own, and the running requests decode only in iterations "
            "without a prompt; a lower-tier load is invisible to the scheduler (its prompt "
            "takes its tokens from the budget and the load runs in that step); a prompt's "
            "blocks are allocated at admission (leaving the "
            "watermark free), one block per B decode tokens later; a decode step needs a free "
            "block per request, else the most recently admitted one (whose KV is here) is "
            "preempted and later recomputed; a prompt longer than the token budget is rejected",
        ),
    ],
)

# ---- write policies (Policy.write_policy): one module each in kvtier.sim.write_policies ------
WRITE_THROUGH, WRITE_BACK, WRITE_SELECTIVE = 0, 1, 2


def _write_policy(name: str, code: int, help: str, *, cascade: bool, sightings: bool) -> Entry:
    """A write policy: its module ``kvtier.sim.write_policies.<name>`` chooses the computed
    blocks copied down; ``cascade``: evicted blocks go to the next tier down; ``sightings``:
    admissions count each block's sightings (an HBM hit reaching ``selective_k`` is copied)."""
    return Entry(
        name,
        code,
        help,
        impl=f"kvtier.sim.write_policies.{name}",
        traits={"cascade": cascade, "sightings": sightings},
    )


WRITE_POLICIES = Registry(
    "write policy",
    [
        _write_policy(
            "write_through",
            WRITE_THROUGH,
            "newly computed blocks are copied into every lower tier (only the first if exclusive)",
            cascade=False,
            sightings=False,
        ),
        _write_policy(
            "write_back",
            WRITE_BACK,
            "a block is copied into the next tier down when the tier above evicts it",
            cascade=True,
            sightings=False,
        ),
        _write_policy(
            "write_through_selective",
            WRITE_SELECTIVE,
            "write_through, only for blocks sighted at least selective_k times (SGLang HiCache)",
            cascade=False,
            sightings=True,
        ),
    ],
)

# ---- load rules (Policy.load_rule): one module each in kvtier.sim.load_rules -----------------
ALWAYS_LOAD, COST_AWARE = 0, 1
LOAD_RULES = Registry(
    "load rule",
    [
        Entry(
            "always_load",
            ALWAYS_LOAD,
            "every lower-tier hit is loaded",
            impl="kvtier.sim.load_rules.always_load",
        ),
        Entry(
            "cost_aware",
            COST_AWARE,
            "a lower-tier hit is loaded only when loading it is faster than recomputing it",
            impl="kvtier.sim.load_rules.cost_aware",
        ),
    ],
)

# ---- connectors (TierPolicy.connector): the software between a tier and the GPU ---------------
# Each entry is a transfer path (docs/model.md, "Transfer paths"; sources in docs/sources.md,
# "Connectors"): the unit of one operation (``chunk``: one block of the policy, LMCache's chunk;
# ``fragment``: one memory region, or ``coalesce`` of them; ``transfer``: one batched call),
# the per-operation submit/RPC cost on a worker (``rpc_us``; -1: the hardware profile's
# ``op_overhead_us``), the store's per-stream get/put rate (``stream_gbps``, 0: none), host
# staging copies at memcpy rate (``staging``), ``order`` serial or pipelined with ``depth``
# operations in flight, ``workers`` per GPU or per host (``scope``), whether the first layers
# compute while later ones arrive (``layerwise``), whether the engine step waits until the
# step's copies into the tier are saved (``store_blocks``: vLLM's V1 ``wait_for_save`` with a
# synchronous store; else they run behind), whether a finished request's full blocks of
# generated tokens are stored into the tier as well as its prompt's (``store_generated``: vLLM's
# OffloadingConnector before ``offload_prompt_only``, default true from vLLM PR #43797; off in
# LMCache, ``save_decode_cache`` false; docs/model.md, "Generated blocks in the lower tiers"),
# whether a request whose lower-tier hits another request of its engine is loading waits,
# skipped in the queue, until that load is in HBM instead of loading them again
# (``defer_loading_hits``: vLLM's OffloadingConnector from PR #29087, in 0.15.1 to 0.34.0, not
# in 0.11.0; docs/model.md, "Hits another request is loading"), whether a block loaded from the
# tier is also kept in the tiers above it that the instance reaches (``load_fills_upper``:
# SGLang HiCache's storage back ends prefetch into the engine's host pool and insert the pages
# into its radix tree; docs/model.md, "Loads that fill the tiers above"), whether a request's
# hits in the tier are read into the tiers above when it arrives, the request waiting in its
# queue, holding no HBM, until they are there (``prefetch_at_arrival``: SGLang HiCache's storage
# prefetch under ``--hicache-storage-prefetch-policy wait_complete``; docs/model.md, "Storage
# prefetch at arrival"), whether a declined or missed prefetch is issued again by later
# scheduling passes and a prefix lost while its request waited looked up again
# (``prefetch_retries``: SGLang 0.5.23; not in 0.5.10) and how much of the host pool the
# prefetches in flight may reserve (``prefetch_reserve``: ``half_host``, 0.5.23's half of it;
# ``host_less_device``, 0.5.10's 0.8 of the host pool past the device pool), whether a
# request's prompt blocks already in the tier become recent in its LRU when the request is
# admitted, HBM hits included (``touches_prompt``: vLLM's
# OffloadingConnector touches every block of the prompt it holds at each look-up, 0.11.0 to
# 0.22.0, and 0.34.0 ranks a request's blocks when it finishes; docs/model.md, "One access time
# for HBM and the host tier"), whether each attention group's copy of a block is an entry of
# its own, a sliding-window group's copies made recent only in the window before a hit's end
# (``group_entries``: vLLM's OffloadingConnector under the hybrid KV cache manager keys its
# CPU blocks by block hash and group and touches a sliding-window group's from the hit's last
# window on, 0.22.0; 0.34.0 ranks the window it loads; docs/model.md, "Sliding-window copies
# in the lower tiers"), whether a look-up finds a copy in the tier only once its store has
# ended (``visible_when_stored``: vLLM 0.19.1's CPU manager stops at the first block not yet
# ready, and llm-d's FS back end writes each file under a temporary name, renamed when written,
# and looks files up by name; 0.22.0 to 0.34.0 defer the request instead, closer to a copy
# visible at once, the default; docs/model.md, "A copy is found once stored"), whether the
# data passes
# through host memory
# and so the PCIe switch's uplink (``via_host``), whether the staging buffer is on the
# GPU's own socket (``numa_aware``), and, as the P/D connector (``serving.pd_connector``),
# whether the prefill side pushes each layer's KV while it computes the next
# (``pd_layerwise``: Mooncake's layer-wise prefill) instead of the decode side pulling the
# whole KV after the prefill (vLLM's NixlConnector; docs/model.md, "Prefill/decode
# disaggregation"), and whether the decode side looks the prompt up in its own prefix cache
# and moves only the blocks past its hit (``pd_decode_hit``: vLLM's NixlConnector and
# MooncakeConnector; LMCache's P/D backend and Mooncake's layer-wise push move every block).
(
    DIRECT,
    LMCACHE_03_MOONCAKE,
    LMCACHE_MOONCAKE,
    MOONCAKE_TE,
    VLLM_OFFLOADING,
    NIXL,
    BELUGA_CXL,
    LMCACHE_PD,
    SGLANG_HICACHE_FILE,
    SGLANG_HICACHE_MOONCAKE,
    SGLANG_0510_HICACHE_MOONCAKE,
) = range(11)
UNIT_CHUNK, UNIT_FRAGMENT, UNIT_TRANSFER = 0, 1, 2
UNITS = ("chunk", "fragment", "transfer")


def _path(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "unit": "fragment",
        "order": "serial",
        "depth": 1,
        "workers": 1,
        "scope": "gpu",
        "rpc_us": -1.0,
        "stream_gbps": 0.0,
        "staging": 0,
        "layerwise": False,
        "store_blocks": False,
        "store_generated": False,
        "defer_loading_hits": False,
        "load_fills_upper": False,
        "prefetch_at_arrival": False,
        "prefetch_retries": True,
        "prefetch_reserve": "half_host",
        "touches_prompt": False,
        "group_entries": False,
        "visible_when_stored": False,
        "via_host": True,
        "numa_aware": True,
        "pd_layerwise": False,
        "pd_decode_hit": True,
    }
    base.update(kw)
    return base


# SGLang HiCache's Mooncake back end, every release's: Transfer Engine batches (mooncake-te's
# per-operation cost and pipelining) read at arrival into the host pool
HICACHE_MOONCAKE_PATH: dict[str, object] = {
    "order": "pipelined",
    "depth": 64,
    "rpc_us": 7.87,
    "load_fills_upper": True,
    "prefetch_at_arrival": True,
}

CONNECTORS = Registry(
    "connector",
    [
        Entry(
            "direct",
            DIRECT,
            "the profile's per-operation cost, one fragment after another, at link rate",
            _path(),
        ),
        Entry(
            "lmcache-0.3-mooncake",
            LMCACHE_03_MOONCAKE,
            "LMCache 0.3.x with Mooncake Store: one blocking get per chunk, a CPU copy into "
            "pinned memory, then the copy to the GPU, chunk after chunk",
            _path(
                unit="chunk",
                rpc_us=45000.0,
                stream_gbps=0.67,
                staging=1,
                numa_aware=False,
                pd_decode_hit=False,
            ),
        ),
        Entry(
            "lmcache-mooncake",
            LMCACHE_MOONCAKE,
            "LMCache 0.5 with Mooncake Store: one batch_get_into per retrieve, zero copy into "
            "registered pinned memory, then the copy to the GPU, before the forward pass",
            _path(
                unit="transfer",
                rpc_us=2000.0,
                stream_gbps=10.0,
                pd_decode_hit=False,
            ),
        ),
        Entry(
            "mooncake-te",
            MOONCAKE_TE,
            "Mooncake Transfer Engine zero-copy batches (SGLang HiCache's mooncake backend)",
            _path(
                order="pipelined",
                depth=64,
                rpc_us=7.87,
                layerwise=True,
                pd_layerwise=True,
                pd_decode_hit=False,
            ),
        ),
        Entry(
            "vllm-offloading",
            VLLM_OFFLOADING,
            "vLLM's OffloadingConnector: one DMA per fragment, its cost set by fragment count",
            _path(rpc_us=7.0, defer_loading_hits=True, touches_prompt=True, group_entries=True),
        ),
        Entry(
            "nixl",
            NIXL,
            "NIXL (Dynamo KVBM): descriptor lists posted as one transfer, pipelined",
            _path(order="pipelined", depth=32, rpc_us=2.57),
        ),
        Entry(
            "beluga-cxl",
            BELUGA_CXL,
            "Beluga: GPU DMA from a CXL-attached pool, the profile's per-fragment cost",
            _path(),
        ),
        Entry(
            "lmcache-pd",
            LMCACHE_PD,
            "LMCache's P/D backend over NIXL (enable_pd, transfer_channel nixl): every chunk "
            "of the prompt is sent, whatever the decode side already holds",
            # NIXL's operations ([LMCache-PD]: the sender writes by NIXL), and no decode-side
            # trim: the sender skips only chunks already in the receiver's PD buffer
            _path(order="pipelined", depth=32, rpc_us=2.57, pd_decode_hit=False),
        ),
        Entry(
            "sglang-hicache-file",
            SGLANG_HICACHE_FILE,
            "SGLang HiCache's file back end: one file per page, read one after another by "
            "each rank's prefetch thread into a zeroed bounce page, copied into the host "
            "pool, whose radix tree then holds the page",
            # [SGLang-0.5.23] mem_cache/hicache_storage.py HiCacheFile.get (open, readinto
            # per page file), managers/cache_controller.py _generic_page_get (a
            # torch.zeros bounce page per file, set_from_flat_data_page into the pool): the
            # fill and the copy are its two staging passes; the per-file cost is the
            # hardware profile's (not published for any file system); the prefetch starts at the
            # request's arrival and wait_complete holds the request until it ends
            # (managers/scheduler.py handle_generate_request, _prefetch_kvcache,
            # check_prefetch_progress)
            _path(unit="chunk", staging=2, load_fills_upper=True, prefetch_at_arrival=True),
        ),
        Entry(
            "sglang-hicache-mooncake",
            SGLANG_HICACHE_MOONCAKE,
            "SGLang HiCache's Mooncake back end under wait_complete: the storage prefetch at "
            "the request's arrival reads the pages by Transfer Engine batches straight into "
            "the host pool (page_first_direct), the request held until it ends",
            # [SGLang-0.5.10] mem_cache/storage/mooncake_store/mooncake_store.py batch_get_v1
            # (batch_get_into the host pool's own pages: no bounce copy), managers/
            # cache_controller.py prefetch_thread_func; wait_complete holds the request
            # (managers/scheduler.py check_prefetch_progress). Per-operation cost and
            # pipelining: mooncake-te's (the Transfer Engine's), the stream at the rdma tier's
            # ports; the pages then reach the GPU from the host pool (load_fills_upper)
            _path(**HICACHE_MOONCAKE_PATH),
        ),
        Entry(
            "sglang-0.5.10-hicache-mooncake",
            SGLANG_0510_HICACHE_MOONCAKE,
            "SGLang 0.5.10's HiCache Mooncake back end: as sglang-hicache-mooncake, but a "
            "prefetch past the in-flight reserve (0.8 of the host pool past the device pool) "
            "is not issued and never retried",
            # [SGLang-0.5.10] mem_cache/hiradix_cache.py prefetch_from_storage (returns when
            # prefetch_rate_limited(); no retry queue, no second lookup after a device-hit
            # loss: neither is in the release), managers/cache_controller.py
            # prefetch_capacity_limit = int(0.8 * (host size - device size))
            _path(
                **HICACHE_MOONCAKE_PATH,
                prefetch_retries=False,
                prefetch_reserve="host_less_device",
            ),
        ),
    ],
)

# plug-ins from outside the package register here as they are imported (KVTIER_PLUGINS)
load_plugins()

__all__ = [
    "ALWAYS_LOAD",
    "CONNECTORS",
    "COST_AWARE",
    "EVICTIONS",
    "KV_AWARE",
    "LEAST_LOADED",
    "LLMD_EPP",
    "LOAD_RULES",
    "PREFIX_AFFINITY",
    "ROUND_ROBIN",
    "RESERVE",
    "ROUTERS",
    "SCHEDULERS",
    "VLLM_V0",
    "VLLM_V1",
    "WRITE_BACK",
    "WRITE_POLICIES",
    "WRITE_SELECTIVE",
    "WRITE_THROUGH",
    "content_blind_routers",
]
