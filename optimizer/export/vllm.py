"""vLLM: a ``vllm serve`` command line, with LMCache behind ``--kv-transfer-config``.

Written for vLLM 0.34.0 (with LMCache 0.5.6): every flag, variable and key is in those
releases' lists (``kvtier/export/releases``). Flags, read in the 0.34.0 wheel
(``engine/arg_utils.py``, ``config/cache.py``, ``config/kv_transfer.py``,
``distributed/kv_transfer/kv_connector/factory.py``; earlier in ``vllm-project/vllm`` at
99d7eb5, 002f10e and 007c643):

* ``--block-size`` (tokens) <- ``block_tokens``; on CUDA the default FlashAttention backend
  takes multiples of 16 (``v1/attention/backends/flash_attn.py``), which
  :data:`CAPABILITIES` declares, so ``optimize --target vllm`` searches only those.
* ``--enable-prefix-caching``: the HBM tier is vLLM's prefix cache (its free-block queue is LRU).
* ``--max-num-batched-tokens``, ``--max-num-seqs`` <- ``serving``.
* ``--async-scheduling`` / ``--no-async-scheduling`` <- ``serving.async_scheduling``, always
  stated: 0.31.0 and 0.34.0 schedule one step ahead unless told not to (``config/vllm.py``:
  ``async_scheduling`` ``None`` becomes ``True``), so a policy simulated without it must say so.
* ``--scheduler-reserve-full-isl`` / ``--no-scheduler-reserve-full-isl`` <-
  ``serving.reserve_full_prompt``, always stated (``config/scheduler.py``, on by default);
  ``--watermark`` <- ``serving.watermark`` when one is set (unset: none, vLLM's default);
  ``serving.swa_admission_cap`` other than ``in_flight`` (an older release's admission for
  sliding-window layers) has no flag; a model with such layers gets a note.
* ``--kv-cache-dtype`` (``CacheDType``: ``auto``, ``fp8``, ..., ``int4_per_token_head``, ...):
  ``bf16`` -> ``auto`` (the model's own dtype; ``bfloat16`` is documented as valid only for
  models that default to fp8), ``fp8`` -> ``fp8``, ``int4`` -> ``int4_per_token_head``.
* ``--tensor-parallel-size`` <- ``serving.tp`` (unset: the hardware profile's ``tp``); a
  disaggregated policy's prefill and decode instances each get their pool's
  ``serving.prefill_tp`` / ``serving.decode_tp``.
* ``--quantization fp8`` <- ``serving.weight_dtype = "fp8"`` (online FP8 weights).
* ``--kv-cache-memory-bytes`` (bytes of KV cache per GPU; "ignores gpu_memory_utilization")
  <- the HBM KV bytes kvtier simulates per instance over ``tp``, always: 0.34.0's
  ``--gpu-memory-utilization`` defaults to 1.0 under the extensible KV cache, sized from the
  memory measured after warm-up, which is not what kvtier models.
* ``--kv-transfer-config`` JSON (``KVTransferConfig``: ``kv_connector``, ``kv_role``) with the
  registered connector ``LMCacheConnectorV1`` and role ``kv_both`` when the policy has lower
  tiers; their configuration is the LMCache target's file (``lmcache.py``). A disaggregated
  policy's roles are :mod:`kvtier.export.pd`'s (NIXL ``kv_producer`` / ``kv_consumer``).

vLLM's own CPU offloading (``--kv-offloading-size`` in GiB, ``--kv-offloading-backend
native|lmcache``) can replace LMCache for a DRAM-only policy; it is named in the notes, not
exported.
"""

from __future__ import annotations

import json
from dataclasses import replace

from kvtier.export.capabilities import BlockSizes, Capabilities, Minimum
from kvtier.export.common import (
    Deployment,
    ExportResult,
    Job,
    Note,
    approximate,
    inexpressible,
    info,
    launch_script,
    model_word,
    placements,
    shared_notes,
)
from kvtier.export.lmcache import FILE as LMCACHE_FILE
from kvtier.export.lmcache import lmcache_config, lmcache_yaml
from kvtier.policy.model import KV_LAYOUTS, ROUTERS

FILE = "vllm-serve.sh"
BASE_PORT = 8000  # vllm serve --port default; instance k listens on BASE_PORT + k
KV_DTYPES = {"bf16": "auto", "fp8": "fp8", "int4": "int4_per_token_head"}
CONNECTOR = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
OLD_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)  # vLLM 0.9-0.10's BlockSize literal

# The block sizes a vLLM release accepts on CUDA: FlashAttention, the default backend, asks
# for multiples of 16 (vllm/v1/attention/backends/flash_attn.py,
# get_supported_kernel_block_sizes -> [MultipleOf(16)], in 0.31.0 and 0.34.0 alike).
VLLM_BLOCKS = {
    "0.34.0": BlockSizes(16, source="vllm 0.34.0 v1/attention/backends/flash_attn.py"),
    "0.31.0": BlockSizes(16, source="vllm 0.31.0 v1/attention/backends/flash_attn.py"),
    "0.10": BlockSizes(choices=OLD_BLOCK_SIZES, source="vllm 0.9-0.10 BlockSize literal"),
}

CAPABILITIES = Capabilities(
    target="vllm",
    package="vllm",
    tiers=("dram", "ssd", "rdma"),  # LMCache's CPU, disk and Mooncake Store backends
    routers=ROUTERS,  # the router sits in front of the instances, outside vLLM
    schedulers=("vllm_v1",),
    write_policies=("write_through",),
    load_rules=("always_load",),
    evictions=("lru",),
    hierarchies=("inclusive",),
    kv_layouts=KV_LAYOUTS,
    kv_dtypes=("bf16", "fp8", "int4"),
    block_sizes=VLLM_BLOCKS,
    pd_connectors=("nixl",),
    shared_tiers=("rdma",),  # one Mooncake Store pool; LMCache's CPU and disk are per rank
)


def block_notes(deploy: Deployment, caps: Capabilities, name: str) -> list[Note]:
    """Whether the release ``caps`` targets accepts the policy's block size."""
    tokens = deploy.policy.block_tokens
    if caps.block.accepts(tokens):
        return []
    return [
        inexpressible(
            f"--block-size {tokens} cannot be expressed: {name} {caps.version} accepts "
            f"{caps.block.describe()} ({caps.block.source})."
        )
    ]


def vllm_args(
    deploy: Deployment, caps: Capabilities = CAPABILITIES
) -> tuple[list[str], list[Note]]:
    """The ``vllm serve`` flags of ``deploy`` (without the model) and notes."""
    p = deploy.policy
    notes: list[Note] = []
    args = [
        "--block-size",
        str(p.block_tokens),
        "--enable-prefix-caching",
        "--max-num-batched-tokens",
        str(p.serving.max_num_batched_tokens),
        "--max-num-seqs",
        str(p.serving.max_num_seqs),
        "--kv-cache-dtype",
        KV_DTYPES[p.kv_dtype],
        "--tensor-parallel-size",
        str(deploy.tp),
        # vLLM schedules one step ahead by default: the replay's choice, stated either way
        "--async-scheduling" if p.serving.async_scheduling else "--no-async-scheduling",
        # admission on the whole prompt (vLLM's default) or on its first chunk, as replayed
        "--scheduler-reserve-full-isl"
        if p.serving.reserve_full_prompt
        else "--no-scheduler-reserve-full-isl",
    ]
    if p.serving.watermark:  # a stated watermark (vLLM's default, and kvtier's, is none)
        args += ["--watermark", f"{p.serving.watermark:g}"]
    swa_older = p.serving.swa_admission_cap != "in_flight" and p.serving.reserve_full_prompt
    if swa_older and deploy.model.sliding_window > 0:
        # an older release's admission rule, simulated; 0.34.0 has only its own (no flag)
        notes.append(
            approximate(
                f"serving.swa_admission_cap = {p.serving.swa_admission_cap} replays an older "
                "vLLM's admission for sliding-window layers; vLLM 0.34.0 caps that group's "
                "reserve at the tokens of every batch in flight (no flag sets it): the model's "
                "requests are admitted as 0.34.0 admits them, not as replayed."
            )
        )
    if p.serving.weight_dtype == "fp8":
        args += ["--quantization", "fp8"]
        notes.append(
            approximate(
                "serving.weight_dtype = fp8 maps to --quantization fp8 (vLLM quantizes BF16 "
                "weights to FP8 at load); with an FP8 checkpoint of the model, drop the flag."
            )
        )
    # The KV cache per GPU is what kvtier simulated, in bytes: vLLM 0.34 sizes it otherwise
    # from the memory it measures after warm-up (the extensible KV cache, with
    # --gpu-memory-utilization defaulting to 1.0), 0.31 from a 0.92 share of HBM.
    args += ["--kv-cache-memory-bytes", str(int(deploy.hbm_kv_bytes / deploy.tp))]
    if p.tiers[0].capacity_gb is None:
        notes.append(
            info(
                "HBM KV capacity is fixed with --kv-cache-memory-bytes at what kvtier models "
                f"({deploy.hbm_kv_bytes / 1e9:.1f} GB per instance: the hardware profile's "
                f"{deploy.hardware.gpu_memory_utilization:g} share of the HBM the CUDA runtime "
                'reports, less the weights, activations and runtime, docs/model.md "The KV '
                f'budget"); vLLM {caps.version} would otherwise size it from the memory it '
                "measures, which differs."
            )
        )
    notes += block_notes(deploy, caps, "vLLM")
    if p.kv_dtype == "int4":
        notes.append(
            approximate(
                "kv_dtype = int4 maps to --kv-cache-dtype int4_per_token_head (vllm "
                f"{caps.version} config/cache.py); older releases have no 4-bit KV cache."
            )
        )
    if p.kv_dtype == "bf16":
        notes.append(info("kv_dtype = bf16 maps to --kv-cache-dtype auto (the model's dtype)."))
    if lmcache_tiers(deploy):
        args += ["--kv-transfer-config", json.dumps(CONNECTOR, separators=(",", ":"))]
    elif deploy.has("cxl"):
        notes.append(
            inexpressible(
                "The cxl tier cannot be expressed: vLLM has no CXL tier and LMCache none of its "
                "own, so the command serves from HBM only, without a KV connector."
            )
        )
    return args, notes


def lmcache_tiers(deploy: Deployment) -> list[str]:
    """The lower tiers LMCache can hold for vLLM."""
    return [t for t in ("dram", "ssd", "rdma") if deploy.has(t)]


def _routing_notes(deploy: Deployment) -> list[str]:
    s = deploy.policy.serving
    notes = [
        f"vllm-serve.sh starts every instance ({deploy.describe()}) with its own GPUs "
        f"(CUDA_VISIBLE_DEVICES) and port ({BASE_PORT} + instance); on host h run it with "
        f"HOST_INDEX=h. vLLM has no setting for the router in front of them "
        f"(routing = {s.routing})."
    ]
    if s.routing == "prefix_affinity":
        notes.append(
            info(f"affinity_overload = {s.affinity_overload} belongs to the router, not to vLLM.")
        )
    if s.routing == "llmd_epp":
        from kvtier.export.epp import EPP_FILE

        notes.append(
            info(
                "llmd_epp is llm-d's endpoint picker (llm-d-router): its scorers, weights "
                f"and prefix indexes as simulated are in {EPP_FILE} (when they can be "
                "deployed), the plugins config file of the EPP in front of these instances."
            )
        )
    return notes


def vllm_jobs(deploy: Deployment, head: list[str], args: list[str], name: str) -> list[Job]:
    """One background job per instance: ``head`` (the command and model) with ``--port`` and
    ``args``, on its host's GPUs; a disaggregated policy's instances get their P/D role's
    ``--kv-transfer-config`` (:mod:`kvtier.export.pd`)."""
    from kvtier.export.pd import (
        nixl_env,
        per_instance_args,
        role,
        vllm_transfer_config,
        with_transfer_config,
    )

    lmcache = bool(lmcache_tiers(deploy))
    jobs = []
    for place in placements(deploy):
        port = BASE_PORT + place.instance
        config = vllm_transfer_config(deploy, place.instance, lmcache)
        own = with_transfer_config(args, config)
        own = per_instance_args(deploy, place.instance, own)  # its pool's tp
        r = role(deploy, place.instance)
        jobs.append(
            Job(
                host=place.host,
                env={
                    "CUDA_VISIBLE_DEVICES": place.visible_devices,
                    **nixl_env(deploy, place.instance, config),
                },
                argv=[*head, "--port", str(port), *own],
                label=f"{name} instance {place.instance}"
                + ("" if r == "both" else f" ({r})")
                + f": GPUs {place.visible_devices}, port {port}"
                + (f", tp={deploy.tp_of(place.instance)}" if _mixed(deploy) else ""),
            )
        )
    return jobs


def _mixed(deploy: Deployment) -> bool:
    return deploy.layout is not None and deploy.layout.mixed


def export_vllm(deploy: Deployment) -> ExportResult:
    """``vllm-serve.sh`` starting every instance, plus ``lmcache.yaml`` when lower tiers exist."""
    p = deploy.policy
    args, notes = vllm_args(deploy)
    files: dict[str, str] = {}
    file_env: dict[str, str] = {}
    comments = [
        "vLLM instances exported by kvtier: starts this host's instances in the background "
        "and waits for them.",
        "MODEL is the checkpoint to serve (a Hugging Face id or a path); HOST_INDEX (default "
        "0) is this host's index.",
    ]
    if lmcache_tiers(deploy):
        if p.serving.pd_connector == "lmcache-pd" and deploy.tier_users != list(
            range(deploy.instances)
        ):
            # LMCache's own P/D: producers and consumers alike run LMCacheConnectorV1
            deploy = replace(deploy, every_instance_holds_tiers=True)
        cfg, lm_notes = lmcache_config(deploy)
        files[LMCACHE_FILE] = lmcache_yaml(cfg)
        file_env["LMCACHE_CONFIG_FILE"] = LMCACHE_FILE
        comments.append("LMCACHE_CONFIG_FILE is the lmcache.yaml beside this script.")
        notes.append(
            info(
                "Tiers below HBM are LMCache's (LMCacheConnectorV1, kv_role kv_both), configured "
                "by lmcache.yaml (LMCACHE_CONFIG_FILE, its absolute path resolved from the "
                "script's directory when it runs); vLLM's HBM prefix cache stays LRU."
            )
        )
        notes += [n.prefixed("LMCache: ") for n in lm_notes]
        if [t.name for t in p.lower_tiers] == ["dram"]:
            notes.append(
                info(
                    "For a DRAM-only policy recent vLLM can offload without LMCache: "
                    "--kv-offloading-size (GiB, summed over TP ranks) with "
                    "--kv-offloading-backend native."
                )
            )
    jobs = vllm_jobs(deploy, ["vllm", "serve", model_word(deploy)], args, "vLLM")
    files[FILE] = launch_script(comments, {}, file_env, jobs, deploy.hosts)
    from kvtier.export.pd import pd_notes

    notes += pd_notes(deploy, "vLLM")
    release = ""
    if p.serving.routing == "llmd_epp":
        from kvtier.export.epp import EPP_FILE, EPP_RELEASE, epp_config, epp_yaml

        epp, epp_notes = epp_config(deploy)
        notes += [n.prefixed("llm-d EPP: ") for n in epp_notes]
        if epp is not None:
            files[EPP_FILE] = epp_yaml(epp)
            release = EPP_RELEASE
    return ExportResult(
        "vllm",
        files,
        [*shared_notes(deploy, "vLLM"), *_routing_notes(deploy), *notes],
        release=release,
    )


def minimum_versions(deploy: Deployment) -> list[Minimum]:
    """The LMCache file's needs (:func:`kvtier.export.lmcache.minimum_versions`) when the
    policy has tiers LMCache holds."""
    from kvtier.export.lmcache import minimum_versions as lmcache_minimums

    return lmcache_minimums(deploy) if lmcache_tiers(deploy) else []
