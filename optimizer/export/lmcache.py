"""LMCache: the YAML file ``LMCACHE_CONFIG_FILE`` points to (in-process LMCache under vLLM).

Written for LMCache 0.5.6: every key is in that release's list (``kvtier/export/releases``).

Keys, units and defaults, read in LMCache's source and docs (``LMCache/LMCache``, dev branch,
``lmcache/v1/config.py`` and ``lmcache/v1/storage_backend/cache_policy/__init__.py`` at commit
000620e; docs ``docs/source/api_reference/configurations.rst``,
``docs/source/kv_cache/storage_backends/{local_storage,mooncake}.rst``):

* ``chunk_size`` (tokens, default 256) <- ``block_tokens``.
* ``local_cpu`` (bool, default true), ``max_local_cpu_size`` (default 5.0) <- the ``dram`` tier.
  The allocator reserves ``int(max_local_cpu_size * 1024**3)`` bytes, so the unit is GiB, and
  every tensor-parallel rank builds its own engine (maintainers, LMCache issue #2901), so the
  value is per rank: the host's DRAM over its instances over ``tp``.
* ``local_disk`` (``"file:///path/"``), ``max_local_disk_size`` (GiB, ``* 1024**3`` in the disk
  backend, default 0) <- the ``ssd`` tier, per rank as above.
* ``remote_url: "mooncakestore://host:port/"`` with ``extra_config`` keys
  ``mooncake_local_hostname``, ``mooncake_metadata_server``, ``mooncake_master_server_address``,
  ``mooncake_protocol``, ``mooncake_device_name``, ``mooncake_global_segment_size`` (bytes,
  "memory contributed by each vLLM worker") and ``mooncake_local_buffer_size`` (bytes, default
  1073741824) <- the ``rdma`` tier (a Mooncake Store pool). The spelling is LMCache 0.5.6's
  (``lmcache/v1/storage_backend/connector/mooncakestore_connector.py``,
  ``MooncakeStoreConfig._build_setup_dict``: a ``mooncake_`` key is forwarded to Mooncake's
  ``store.setup()`` with the prefix stripped and wins over the legacy unprefixed key, which is
  still accepted). Every top-level key written is one ``lmcache/v1/config.py`` of 0.5.6
  declares (``tests/test_export_launch.py`` pins that list).
* ``cache_policy`` (``LRU`` default, ``LFU``, ``FIFO``, ``MRU``): one policy shared by the CPU
  and disk backends.
* ``use_layerwise`` (bool, default false): layer-by-layer store and retrieve, the closest
  setting to kvtier's ``kv_layout = "per_layer"``.
* ``enable_async_loading`` (bool, default false; LMCache pull request #1513, from v0.3.7)
  <- ``load_wait``: false retrieves before the forward pass, so the whole batch waits
  (``"batch"``); true lets the loading request alone wait (``"request"``).

Not exported: a ``cxl`` tier. LMCache has no CXL tier of its own; the CXL backends it can load
(Maru shared memory, a Device-DAX storage plugin) are spelt differently from one version to the
next (``maru_path``/``maru_pool_size`` in config.py against ``remote_url: maru://`` with
``extra_config.maru_pool_size`` in Maru's own examples), so they are left to the user. Newer
LMCache also recommends its multi-process server (``lmcache server --l1-size-gb ...``); this
exporter writes the in-process configuration that vLLM's ``LMCacheConnectorV1`` reads.
"""

from __future__ import annotations

import yaml

from kvtier.export.capabilities import BlockSizes, Capabilities, Minimum
from kvtier.export.common import (
    Deployment,
    ExportResult,
    approximate,
    gib,
    inexpressible,
    info,
    shared_notes,
)
from kvtier.policy.model import KV_LAYOUTS, ROUTERS

FILE = "lmcache.yaml"
CACHE_POLICIES = {"lru": "LRU", "lfu": "LFU", "fifo": "FIFO"}
STAGING_GIB = 5.0  # LMCache's max_local_cpu_size default: its pinned staging buffer
DISK_PATH = "file:///var/cache/lmcache/"
MOONCAKE_BUFFER = 1073741824  # extra_config.mooncake_local_buffer_size default (bytes)
# mooncakestore_connector.py (0.5.6): extra_config keys with this prefix reach Mooncake's
# store.setup() with it stripped, and win over the unprefixed legacy spelling.
MOONCAKE_PREFIX = "mooncake_"

CAPABILITIES = Capabilities(
    target="lmcache",
    package="lmcache",
    tiers=("dram", "ssd", "rdma"),  # local_cpu, local_disk, a Mooncake Store remote_url
    routers=ROUTERS,  # LMCache serves whatever instance vLLM runs
    schedulers=("vllm_v1",),  # under vLLM's V1 engine (LMCacheConnectorV1)
    write_policies=("write_through",),
    load_rules=("always_load",),
    evictions=("lru",),
    hierarchies=("inclusive",),
    kv_layouts=KV_LAYOUTS,  # per_layer: use_layerwise
    kv_dtypes=("bf16", "fp8", "int4"),
    block_sizes={"0.5.6": BlockSizes(1, source="lmcache 0.5.6 v1/config.py chunk_size (int)")},
    pd_connectors=(),  # one file for every instance: no per-role P/D settings
    shared_tiers=("rdma",),  # CPU and disk are each rank's own
)


def lmcache_config(deploy: Deployment) -> tuple[dict[str, object], list[str]]:
    """The LMCache settings of ``deploy`` and notes on what they cannot say."""
    p = deploy.policy
    notes: list[str] = []
    cfg: dict[str, object] = {"chunk_size": p.block_tokens}
    if deploy.has("dram"):
        cfg["local_cpu"] = True
        cfg["max_local_cpu_size"] = gib(deploy.per_rank_bytes("dram"))
    else:
        cfg["local_cpu"] = False
        cfg["max_local_cpu_size"] = STAGING_GIB
        notes.append(
            info(
                "No dram tier: local_cpu is false, but LMCache still pins max_local_cpu_size "
                f"({STAGING_GIB:g} GiB, its default) per rank as a staging buffer."
            )
        )
    if deploy.has("ssd"):
        cfg["local_disk"] = DISK_PATH
        cfg["max_local_disk_size"] = gib(deploy.per_rank_bytes("ssd"))
        notes.append(info(f"local_disk is a placeholder ({DISK_PATH}): point it at the SSD."))
    if deploy.has("rdma"):
        cfg["remote_url"] = "mooncakestore://localhost:50051/"
        cfg["remote_serde"] = "naive"
        segment = int(deploy.pool_bytes["rdma"] / deploy.tier_ranks)
        cfg["extra_config"] = {
            f"{MOONCAKE_PREFIX}{key}": value
            for key, value in (
                ("local_hostname", "localhost"),
                ("metadata_server", "P2PHANDSHAKE"),
                ("master_server_address", "localhost:50051"),
                ("protocol", "rdma"),
                ("device_name", ""),
                ("global_segment_size", segment),
                ("local_buffer_size", MOONCAKE_BUFFER),
            )
        }
        notes.append(
            info(
                "The rdma tier is a Mooncake Store pool reached through remote_url; every rank "
                "contributes global_segment_size bytes (the pool over the ranks of the instances "
                "that use the tiers). Host names, "
                "the master address and device_name are placeholders; start mooncake_master first "
                "(see the mooncake target)."
            )
        )
    if deploy.has("cxl"):
        notes.append(
            inexpressible(
                "The cxl tier is not exported: LMCache has no CXL tier of its own, and the "
                "third-party CXL backends it can load (Maru, Device-DAX) use keys that differ "
                "between versions."
            )
        )
    cfg.update(_eviction(deploy, notes))
    if p.lower_tiers:
        cfg["enable_async_loading"] = p.load_wait == "request"
        if p.load_wait == "request":
            notes.append(
                approximate(
                    "load_wait = request maps to enable_async_loading = true (LMCache 0.3.7 and "
                    "later); LMCache's default, false, makes the whole batch wait for each load "
                    "(load_wait = batch)."
                )
            )
    if p.kv_layout == "per_layer":
        cfg["use_layerwise"] = True
        notes.append(
            approximate(
                "kv_layout = per_layer maps to use_layerwise = true (store and load one layer at "
                "a time); LMCache still moves K and V of a layer together."
            )
        )
    if p.write_policy != "write_through":
        notes.append(
            inexpressible(
                f"write_policy = {p.write_policy} cannot be expressed: LMCache writes every "
                "stored chunk to each enabled backend (write-through)."
            )
        )
    if p.hierarchy == "exclusive":
        notes.append(
            inexpressible(
                "hierarchy = exclusive cannot be expressed: LMCache keeps a chunk in every "
                "backend it was written to (inclusive)."
            )
        )
    return cfg, notes


def _eviction(deploy: Deployment, notes: list[str]) -> dict[str, object]:
    """One ``cache_policy`` for CPU and disk: the dram tier's choice, else the ssd tier's."""
    local = [t for t in deploy.policy.lower_tiers if t.name in ("dram", "ssd")]
    for t in deploy.policy.lower_tiers:
        if t.name == "rdma" and t.eviction != "lru":
            notes.append(
                inexpressible(
                    f"rdma eviction = {t.eviction} cannot be expressed: the Mooncake master evicts "
                    "approximately least-recently-used objects."
                )
            )
    if not local:
        return {}
    chosen = local[0].eviction
    if any(t.eviction != chosen for t in local):
        notes.append(
            approximate(
                "LMCache has one cache_policy for CPU and disk; the tiers' different evictions "
                f"are exported as the {local[0].name} tier's ({chosen})."
            )
        )
    if chosen not in CACHE_POLICIES:
        notes.append(
            approximate(
                f"eviction = {chosen} has no LMCache cache_policy (LRU, LFU, FIFO, MRU); "
                "exported as LRU."
            )
        )
    return {"cache_policy": CACHE_POLICIES.get(chosen, "LRU")}


def lmcache_yaml(cfg: dict[str, object]) -> str:
    header = (
        "# LMCache configuration exported by kvtier; load it with "
        "LMCACHE_CONFIG_FILE set to this file's absolute path under vLLM's "
        "LMCacheConnectorV1 (vllm-serve.sh sets it).\n"
        "# Sizes in GiB per tensor-parallel rank.\n"
    )
    return header + yaml.safe_dump(cfg, sort_keys=False)


def export_lmcache(deploy: Deployment) -> ExportResult:
    """LMCache YAML for one vLLM instance of ``deploy`` (every rank reads the same file)."""
    cfg, notes = lmcache_config(deploy)
    if not deploy.policy.lower_tiers:
        notes.insert(0, info("The policy has no tier below HBM: LMCache would add nothing to it."))
    files = {FILE: lmcache_yaml(cfg)}
    from kvtier.export.pd import pd_notes

    notes += pd_notes(deploy, "LMCache")
    return ExportResult("lmcache", files, [*shared_notes(deploy, "LMCache"), *notes])


def minimum_versions(deploy: Deployment) -> list[Minimum]:
    """LMCache releases the file needs, read in older wheels: the ``mooncake_`` prefixed
    ``extra_config`` keys are read by 0.5.0's ``mooncakestore_connector.py``, not 0.3.9's;
    ``enable_async_loading`` by 0.3.9's ``config.py`` (from 0.3.7: pull request #1513)."""
    out = []
    if deploy.has("rdma"):
        out.append(Minimum("lmcache", "0.5.0", "mooncake_ extra_config keys; 0.3.9 lacks them"))
    elif deploy.policy.lower_tiers:
        out.append(Minimum("lmcache", "0.3.7", "enable_async_loading"))
    return out
