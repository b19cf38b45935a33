"""SGLang: a ``sglang.launch_server`` command line with HiCache flags.

Written for SGLang 0.5.23: every flag and variable is in that release's list
(``kvtier/export/releases``). On more than one host a Mooncake backend gets
``MOONCAKE_LOCAL_HOSTNAME`` (0.5.23's ``_resolve_local_hostname``); the hierarchical cache
runs only on the instances that use the lower tiers (not on decode instances).

Flags, read in SGLang's source and docs (``sgl-project/sglang``, main after the
``arg_groups`` split: ``python/sglang/srt/arg_groups/fields/memory.py`` at 00fe477,
``fields/schedule.py`` at 001b886, ``choices.py`` at 0099dee, the ``tp_size`` and
``kv_cache_dtype`` fields of ``server_args.py``; ``docs/advanced_features/
hicache_best_practices.md``; ``python/sglang/srt/mem_cache/storage/mooncake_store/README.md``;
the host pools in ``mem_cache/memory_pool_host.py`` and ``hiradix_cache.py``):

* ``--page-size`` (tokens) <- ``block_tokens``; ``--tp-size`` <- ``serving.tp`` (unset: the
  hardware's ``tp``); ``--quantization fp8`` <- ``serving.weight_dtype = "fp8"``.
* ``--kv-cache-dtype`` (``auto``, ``bf16``, ``fp8_e4m3``, ``fp8_e5m2``, 4-bit float formats):
  ``bf16`` -> ``bf16``, ``fp8`` -> ``fp8_e4m3``; ``int4`` has no counterpart.
* ``--chunked-prefill-size`` <- ``max_num_batched_tokens`` (prefill tokens per chunk);
  ``--max-running-requests`` <- ``max_num_seqs``.
* ``--attention-backend`` <- ``serving.attention_backend`` when not ``default`` (SGLang
  then picks its own kernels for the GPU, the ones the measured tables hold).
* ``--disable-overlap-schedule`` unless ``serving.async_scheduling``: SGLang's overlap
  scheduler (on by default in 0.5.23, ``fields/schedule.py``) decides batch ``n + 1`` before
  it processes batch ``n``'s result (``managers/scheduler.py`` ``event_loop_overlap``), the
  one-step-ahead schedule ``async_scheduling`` replays.
* ``--max-total-tokens`` (tokens in the device pool) <- the HBM KV bytes kvtier simulates per
  instance (an explicit hbm ``capacity_gb``, else the hardware profile's share);
  ``--mem-fraction-static`` <- that share (``gpu_memory_utilization``), above SGLang's own
  default, so that the pool SGLang sizes from it is not the smaller of the two.
* ``--radix-eviction-policy`` (``lru``, ``lfu``, ``slru``, ``priority``, ``tlru``) <- ``lru``,
  the HBM tier's (one policy for the radix tree).
* ``--enable-hierarchical-cache``; ``--hicache-size`` (integer GB: the host pool holds
  ``hicache_size * 1e9 // size_per_token`` tokens, built by every tensor-parallel rank, so the
  value is per rank) <- the ``dram`` tier; ``--hicache-ratio`` (host pool over device pool,
  default 2) when a rank's share is under 1 GB.
* ``--hicache-write-policy`` (``write_through``, ``write_through_selective``, ``write_back``)
  <- ``write_policy``; the selective threshold is fixed at 2 hits in ``hiradix_cache.py``.
* ``--hicache-mem-layout`` (``layer_first``, ``page_first``, ...) <- ``kv_layout``.
* ``--hicache-storage-backend``: ``mooncake`` <- the ``rdma`` tier, configured by the
  ``MOONCAKE_*`` variables of its README (``MOONCAKE_GLOBAL_SEGMENT_SIZE`` in bytes);
  ``file`` <- the ``ssd`` tier, its directory from ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR``
  (``HiCacheFile`` in ``mem_cache/hicache_storage.py``), one directory per instance, and its
  cap from ``SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE`` (``mem_cache/storage/file/
  lru_file_evictor.py`` at 16739a6: parsed by ``human_readable_int``, so plain bytes or
  ``"200G"``; unset or ``"0"`` means unbounded; a non-MLA rank owns and evicts its own files,
  so the cap is per tensor-parallel rank) <- the ``ssd`` tier per rank, in bytes;
  ``--hicache-storage-prefetch-policy wait_complete`` <- the ``ssd`` tier's connector
  ``sglang-hicache-file``, or the ``rdma`` tier's ``sglang-hicache-mooncake`` (its prefetch at
  arrival, the request held until it ends).
* ``--port`` (default 30000) per instance; ``CUDA_VISIBLE_DEVICES`` selects its GPUs.
"""

from __future__ import annotations

import math

from kvtier.export.capabilities import BlockSizes, Capabilities, Minimum
from kvtier.export.common import (
    Deployment,
    ExportResult,
    Job,
    ShellVar,
    approximate,
    inexpressible,
    info,
    launch_script,
    model_word,
    placements,
    shared_notes,
)
from kvtier.export.pd import pd_notes, per_instance_args
from kvtier.export.pd import sglang_args as sglang_pd_args
from kvtier.export.releases import release
from kvtier.hardware.types import GB
from kvtier.policy.model import ROUTERS
from kvtier.policy.registries import CONNECTORS

FILE = "sglang-serve.sh"
KV_DTYPES = {"bf16": "bf16", "fp8": "fp8_e4m3"}
LAYOUTS = {"contiguous": "page_first", "per_layer": "layer_first"}
SELECTIVE_THRESHOLD = 2  # hiradix_cache.py: write_through_threshold for the other policies
FILE_DIR = "/var/cache/sglang-hicache"
# the file backend's cap, read only by recent releases (0.5.14 on): exported when the
# targeted release reads it
FILE_CAP = "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"
BASE_PORT = 30000  # sglang.launch_server --port default; instance k listens on BASE_PORT + k
# Each host's own name for its Mooncake Store client: sglang 0.5.23 reads
# MOONCAKE_LOCAL_HOSTNAME (else LOCAL_HOSTNAME, else "localhost":
# srt/mem_cache/storage/mooncake_store/mooncake_store.py _resolve_local_hostname).
LOCAL_HOSTNAME = ShellVar(
    "LOCAL_HOSTNAME", "LOCAL_HOSTNAME: the name other hosts reach this one by", "uname -n"
)

CAPABILITIES = Capabilities(
    target="sglang",
    package="sglang",
    tiers=("dram", "ssd", "rdma"),  # HiCache's host pool, file and Mooncake backends
    routers=ROUTERS,  # the router sits in front of the instances, outside SGLang
    schedulers=("vllm_v1",),  # pages allocated as a request grows, retraction when full
    write_policies=("write_through", "write_back", "write_through_selective"),
    load_rules=("always_load",),
    evictions=("lru",),
    hierarchies=("inclusive",),
    kv_layouts=("contiguous",),  # page_first: the layout its Mooncake backend supports
    kv_dtypes=tuple(KV_DTYPES),
    block_sizes={"0.5.23": BlockSizes(1, source="sglang 0.5.23 --page-size (an int)")},
    pd_connectors=("nixl",),  # mooncake moves the KV per chunk, not layer by layer
    shared_tiers=("rdma",),  # one Mooncake Store pool; the host pool is per rank
    selective_k=(SELECTIVE_THRESHOLD,),
    # host pages are loaded within the step that schedules the request (docs/model.md)
    load_reports=("at_once",),
    # the radix tree takes a load-back's pages at once ([SGLang-0.5.23], docs/sources.md)
    load_cachings=("at_admission",),
    # one L3 backend beside a host pool: Mooncake, or the file backend
    requires={
        "tiers.rdma.enabled": (("tiers.dram.enabled", True),),
        "tiers.ssd.enabled": (("tiers.dram.enabled", True), ("tiers.rdma.enabled", False)),
    },
)


def _host_pool(deploy: Deployment, args: list[str], notes: list[str]) -> None:
    """Size the host (L2) pool from the dram tier; SGLang wants it larger than the device's."""
    if not deploy.has("dram"):
        notes.append(
            inexpressible(
                "The policy has no dram tier, but SGLang stages every L3 transfer through a "
                "host pool (default --hicache-ratio 2, twice the device pool); that pool is not "
                "modelled."
            )
        )
        return
    per_rank = deploy.per_rank_bytes("dram")
    size = math.floor(per_rank / GB)
    if size >= 1:
        args += ["--hicache-size", str(size)]
        if size * GB != per_rank:
            notes.append(
                approximate(
                    f"--hicache-size takes whole GB per rank: {per_rank / GB:.3f} GB rounded "
                    f"down to {size}."
                )
            )
    else:
        ratio = deploy.per_instance_bytes("dram") / deploy.hbm_kv_bytes
        args += ["--hicache-ratio", f"{ratio:.3f}"]
        notes.append(
            approximate(
                f"A rank's dram share ({per_rank / GB:.3f} GB) is under SGLang's 1 GB step; "
                "exported as --hicache-ratio (host pool over device pool)."
            )
        )
    if deploy.per_instance_bytes("dram") <= deploy.hbm_kv_bytes:
        notes.append(
            info(
                "SGLang expects the host pool to be larger than the device pool (older versions "
                "refuse to start, newer ones warn); this policy's dram share is not."
            )
        )


def _storage(deploy: Deployment, args: list[str], env: dict[str, str], notes: list[str]) -> None:
    """One L3 backend: Mooncake for an rdma tier, else the file backend for an ssd tier."""
    if deploy.has("pagecache") and deploy.has("ssd") and not deploy.has("rdma"):
        notes.append(
            info(
                "The pagecache tier is the file system client's own page cache in front of the "
                "file back end's directory: SGLang sets nothing for it, the mount does. Its "
                f"size was simulated as {deploy.pool_bytes['pagecache'] / GB:.0f} GB per host; a "
                "Lustre client caches up to half the host's RAM unless llite.*.max_cached_mb "
                "says otherwise, and a pod's memory limit counts the pages it caches."
            )
        )
    if deploy.has("rdma"):
        args += ["--hicache-storage-backend", "mooncake"]
        segment = int(deploy.pool_bytes["rdma"] / deploy.tier_ranks)
        if deploy.hosts > 1:
            env["MOONCAKE_LOCAL_HOSTNAME"] = LOCAL_HOSTNAME
            notes.append(
                info(
                    "On more than one host each SGLang rank registers its Mooncake segment "
                    "under MOONCAKE_LOCAL_HOSTNAME: sglang-serve.sh sets it from LOCAL_HOSTNAME "
                    "(default: uname -n), which must name this host as the others reach it."
                )
            )
        env.update(
            {
                "MOONCAKE_MASTER": "localhost:50051",
                "MOONCAKE_TE_META_DATA_SERVER": "P2PHANDSHAKE",
                "MOONCAKE_PROTOCOL": "rdma",
                "MOONCAKE_DEVICE": "",
                "MOONCAKE_GLOBAL_SEGMENT_SIZE": str(segment),
            }
        )
        notes.append(
            info(
                "The rdma tier is a Mooncake Store pool: every rank contributes "
                "MOONCAKE_GLOBAL_SEGMENT_SIZE bytes (the pool over the ranks of the instances "
                "that use the tiers); the master "
                "address and MOONCAKE_DEVICE are placeholders."
            )
        )
        if _prefetches_at_arrival(deploy, "rdma"):
            args += ["--hicache-storage-prefetch-policy", "wait_complete"]
        connector = deploy.policy.tier("rdma").connector
        if not CONNECTORS.get(connector).defaults["prefetch_retries"]:
            notes.append(
                approximate(
                    f"The rdma tier was replayed with {connector}, an older SGLang's storage "
                    f"prefetch (no retries, 0.8 of the host pool past the device pool in "
                    f"flight); SGLang {CAPABILITIES.version} retries a declined prefetch and "
                    "reserves half the host pool: replay with sglang-hicache-mooncake to model "
                    "the release exported."
                )
            )
        if deploy.has("ssd"):
            notes.append(
                inexpressible(
                    "SGLang takes one storage backend: the ssd tier is not exported next to "
                    "Mooncake (Mooncake's own SSD offload can hold it, see the mooncake target)."
                )
            )
    elif deploy.has("ssd"):
        args += ["--hicache-storage-backend", "file"]
        _prefetch_policy(deploy, args, notes)
        if FILE_CAP not in release("sglang").env:
            notes.append(
                inexpressible(
                    f"The ssd tier's size cannot be expressed: SGLang {CAPABILITIES.version} "
                    f"does not read {FILE_CAP}, so the file backend grows without bound."
                )
            )
            return
        env[FILE_CAP] = str(int(deploy.per_rank_bytes("ssd")))
        notes.append(
            info(
                f"The ssd tier is SGLang's file backend, one directory per instance under "
                f"{FILE_DIR} (a placeholder: use the SSD), capped by "
                "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE in bytes per tensor-parallel rank (each rank "
                "evicts its own files, least recently used first): the host's ssd tier over its "
                "instances over tp."
            )
        )
    if deploy.has("cxl"):
        notes.append(
            inexpressible("The cxl tier is not exported: SGLang HiCache has no CXL backend.")
        )


def _prefetch_policy(deploy: Deployment, args: list[str], notes: list[str]) -> None:
    """The file tier's prefetch as replayed: a connector that prefetches at arrival
    (``sglang-hicache-file``) holds the request until its prefetch ends, SGLang's
    ``wait_complete``; another loads at admission, which no SGLang policy does."""
    if _prefetches_at_arrival(deploy, "ssd"):  # (called with an ssd tier)
        args += ["--hicache-storage-prefetch-policy", "wait_complete"]
        return
    connector = deploy.policy.tier("ssd").connector
    notes.append(
        approximate(
            f"The ssd tier was replayed behind the {connector} "
            "connector, loading at the request's admission; SGLang prefetches storage hits "
            "when a request arrives (--hicache-storage-prefetch-policy, best_effort by "
            "default): replay with connector sglang-hicache-file to model it."
        )
    )


def _prefetches_at_arrival(deploy: Deployment, tier: str) -> bool:
    """Whether ``tier``'s connector reads its hits when a request arrives and holds the
    request until they are in (SGLang's ``wait_complete``)."""
    return bool(CONNECTORS.get(deploy.policy.tier(tier).connector).defaults["prefetch_at_arrival"])


def _backend(args: list[str]) -> str | None:
    """The ``--hicache-storage-backend`` of ``args`` (None: none)."""
    flag = "--hicache-storage-backend"
    return args[args.index(flag) + 1] if flag in args else None


def _write_notes(deploy: Deployment, notes: list[str]) -> None:
    p = deploy.policy
    if p.write_policy == "write_through_selective" and p.selective_k != SELECTIVE_THRESHOLD:
        notes.append(
            approximate(
                f"selective_k = {p.selective_k}: SGLang's write_through_selective copies a page "
                f"down after {SELECTIVE_THRESHOLD} hits (fixed in hiradix_cache.py)."
            )
        )
    if p.hierarchy == "exclusive":
        notes.append(
            approximate(
                "hierarchy = exclusive is not a SGLang setting: host copies are kept; with "
                "write_back a page is copied down only when HBM evicts it, the closest behaviour."
            )
        )
    for t in p.lower_tiers:
        if t.eviction != "lru":
            notes.append(
                inexpressible(
                    f"{t.name} eviction = {t.eviction} cannot be expressed: SGLang has one "
                    "--radix-eviction-policy for the radix tree, exported as lru (the HBM tier's)."
                )
            )


def export_sglang(deploy: Deployment) -> ExportResult:
    """``sglang-serve.sh``: ``python3 -m sglang.launch_server`` for every instance."""
    p = deploy.policy
    notes: list[str] = []
    env: dict[str, str] = {}
    args = [
        "--page-size",
        str(p.block_tokens),
        "--tp-size",
        str(deploy.tp),
        "--chunked-prefill-size",
        str(p.serving.max_num_batched_tokens),
        "--max-running-requests",
        str(p.serving.max_num_seqs),
        "--radix-eviction-policy",
        "lru",
    ]
    if not p.serving.async_scheduling:
        args.append("--disable-overlap-schedule")  # the replay's engine schedules in step
    if p.serving.attention_backend != "default":
        args += ["--attention-backend", p.serving.attention_backend]
    if p.serving.weight_dtype == "fp8":
        args += ["--quantization", "fp8"]
        notes.append(
            approximate(
                "serving.weight_dtype = fp8 maps to --quantization fp8; with an FP8 checkpoint of "
                "the model, drop the flag."
            )
        )
    if p.kv_dtype in KV_DTYPES:
        args += ["--kv-cache-dtype", KV_DTYPES[p.kv_dtype]]
    else:
        notes.append(
            approximate(
                "kv_dtype = int4 has no SGLang counterpart (its 4-bit KV formats are floating "
                "point: nvfp4, fp4_mx_block16); --kv-cache-dtype is left at auto."
            )
        )
    # the device pool in tokens, as kvtier simulated it (an explicit hbm capacity, else the
    # engine's KV budget: kvtier.deploy.kv_budget)
    tokens = int(deploy.hbm_kv_bytes // deploy.kv_bytes_per_token)
    args += ["--max-total-tokens", str(tokens)]
    # SGLang's pool is the smaller of --max-total-tokens and what --mem-fraction-static leaves
    # after the weights (model_runner_kv_cache_mixin.py). Its default fraction is below the
    # share kvtier's budget is sized from (0.828 on an H100 at TP 2 with 8,192-token chunks:
    # docs/sources.md [llm-d-sglang-hicache]) and would leave a smaller pool than the one
    # replayed; at the budget's share the fraction's pool holds the budget's (which also sets
    # the activations and runtime aside), so --max-total-tokens decides.
    share = deploy.hardware.gpu_memory_utilization
    args += ["--mem-fraction-static", f"{share:g}"]
    if p.tiers[0].capacity_gb is None:
        notes.append(
            info(
                f"--max-total-tokens sets the device KV pool kvtier models "
                f"({deploy.hbm_kv_bytes / GB:.1f} GB per instance) and --mem-fraction-static "
                f"the {share:g} share of HBM its budget is sized from: SGLang's own default "
                "share is smaller and would cut the pool below it."
            )
        )
    else:
        notes.append(
            info(
                f"--max-total-tokens sets the device KV pool to the policy's "
                f"{p.tiers[0].capacity_gb:g} GB; SGLang takes the smaller of it and what "
                f"--mem-fraction-static {share:g} leaves after the weights."
            )
        )
    notes.append(
        approximate(
            "max_num_batched_tokens maps to --chunked-prefill-size, which bounds prefill tokens "
            "per chunk; SGLang schedules decode tokens outside that budget."
        )
    )
    # the hierarchical cache: only on the instances that use the lower tiers (every instance,
    # or the prefill instances of a disaggregated policy, as kvtier simulates them)
    tier_args: list[str] = []
    if p.lower_tiers:
        tier_args += ["--enable-hierarchical-cache"]
        _host_pool(deploy, tier_args, notes)
        tier_args += ["--hicache-write-policy", p.write_policy]
        layout = LAYOUTS[p.kv_layout]
        if deploy.has("rdma") and layout != "page_first":
            notes.append(
                approximate(
                    "kv_layout = per_layer: exported as page_first, the only layout SGLang's "
                    "Mooncake backend supports (its README)."
                )
            )
            layout = "page_first"
        tier_args += ["--hicache-mem-layout", layout]
        _storage(deploy, tier_args, env, notes)
        _write_notes(deploy, notes)
    notes.append(
        info(
            f"sglang-serve.sh starts every instance ({deploy.describe()}) with its own GPUs "
            f"(CUDA_VISIBLE_DEVICES) and port ({BASE_PORT} + instance); on host h run it with "
            f"HOST_INDEX=h. routing = {p.serving.routing} is the job of SGLang's separate router, "
            "not configured here."
        )
    )
    comments = [
        "SGLang instances exported by kvtier: starts this host's instances in the background "
        "and waits for them.",
        "MODEL is the checkpoint to serve (a Hugging Face id or a path); HOST_INDEX (default "
        "0) is this host's index.",
    ]
    head = ["python3", "-m", "sglang.launch_server", "--model-path", model_word(deploy)]
    jobs = []
    users = set(deploy.tier_users)
    if tier_args and len(users) < deploy.instances:
        notes.append(
            info(
                "Decode instances run without the hierarchical cache: kvtier looks the lower "
                "tiers up and writes them on the prefill side."
            )
        )
    for place in placements(deploy):
        port = BASE_PORT + place.instance
        job_env = {"CUDA_VISIBLE_DEVICES": place.visible_devices}
        own = tier_args if place.instance in users else []
        if own and _backend(own) == "file":
            job_env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = (
                f"{FILE_DIR}/instance-{place.instance}"
            )
        jobs.append(
            Job(
                host=place.host,
                env=job_env,
                argv=[
                    *head,
                    "--port",
                    str(port),
                    *per_instance_args(deploy, place.instance, [*args, *own]),
                    *sglang_pd_args(deploy, place.instance),
                ],
                label=f"SGLang instance {place.instance}: GPUs {place.visible_devices}, "
                f"port {port}",
            )
        )
    files = {FILE: launch_script(comments, env, {}, jobs, deploy.hosts)}
    notes += pd_notes(deploy, "SGLang")
    return ExportResult("sglang", files, [*shared_notes(deploy, "SGLang"), *notes])


def minimum_versions(deploy: Deployment) -> list[Minimum]:
    """SGLang releases the script needs, read in older wheels (``srt/environ.py``):
    ``SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE`` from 0.5.14 (0.5.13 lacks it),
    ``MOONCAKE_LOCAL_HOSTNAME`` from 0.5.6 (0.5.5 lacks it)."""
    out = []
    if deploy.has("ssd") and not deploy.has("rdma"):
        why = "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE; 0.5.13 lacks it"
        out.append(Minimum("sglang", "0.5.14", why))
    if deploy.has("rdma") and deploy.hosts > 1:
        out.append(Minimum("sglang", "0.5.6", "MOONCAKE_LOCAL_HOSTNAME; 0.5.5 lacks it"))
    return out
