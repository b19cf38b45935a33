"""The ``Policy`` dataclass (what a deployment runs) and its TOML loader.

A policy is nested so that later parts can extend it without reshaping it: serving knobs live in
``serving``, cache tiers in the ``tiers`` list (``hbm`` first, then any of ``dram``, ``cxl``,
``rdma``, ``ssd``; a tier that is listed is on), the write / load / hierarchy rules at the top
level, the optional SLO in ``slo``. Numbers default to what vLLM does on an H100 when nothing is
set. Each scalar field's default, domain and help are declared once, in its field metadata
(:func:`kvtier.policy.fields.setting`): the loader below, ``--set`` / ``--pin``
(``kvtier.policy.overrides``) and the docs tables read them from there; plug-in choices
(routers, write policies, load rules, evictions) come from their registries.
``policy_from_dict`` and ``policy_to_dict`` convert to and from the plain dict a policy file
holds, so an optimizer can overlay dotted parameters (``tiers.cxl.capacity_gb``) on a dict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from kvtier.cache.registry import EVICTIONS as EVICTION_REGISTRY
from kvtier.hardware.types import LOWER_TIERS
from kvtier.policy.fields import MAX_CAPACITY_GB, check_settings, read_settings, setting
from kvtier.policy.registries import CONNECTORS as CONNECTOR_REGISTRY
from kvtier.policy.registries import LOAD_RULES as LOAD_REGISTRY
from kvtier.policy.registries import ROUTERS as ROUTER_REGISTRY
from kvtier.policy.registries import SCHEDULERS as SCHEDULER_REGISTRY
from kvtier.policy.registries import WRITE_POLICIES as WRITE_REGISTRY
from kvtier.tier_kinds import TIER_KINDS
from kvtier.tier_kinds import trait as tier_trait
from kvtier.toml_fields import Table, read_toml

POLICY_FORMAT = "kvtier-policy/1"
# llm-d-router's minBlockSizeTokens (#1160; v0.10.0 approximateprefix/plugin.go): the EPP's
# prefix indexes never hash blocks of fewer tokens (kvtier.sim.routers.epp_index, export.epp)
EPP_MIN_ENTRY_TOKENS = 64


def epp_gpu_entry_tokens(entry_tokens: int, block_tokens: int) -> int:
    """The GPU producer's tokens per entry: the stated size, else autoTune's (vLLM's block
    size, at least :data:`EPP_MIN_ENTRY_TOKENS`)."""
    return entry_tokens or max(block_tokens, EPP_MIN_ENTRY_TOKENS)


ROUTERS = ROUTER_REGISTRY.names
TIER_NAMES = ("hbm", *LOWER_TIERS)  # LOWER_TIERS (kvtier.hardware.types) in lookup order
EVICTIONS = EVICTION_REGISTRY.names  # the cache engine's policies
HBM_EVICTIONS = ("lru",)  # HBM is vLLM's block pool (LRU over unpinned blocks)
KV_DTYPES = ("bf16", "fp8", "int4")
WRITE_POLICIES = WRITE_REGISTRY.names
HIERARCHIES = ("inclusive", "exclusive")
LOAD_RULES = LOAD_REGISTRY.names
LOAD_WAITS = ("request", "batch")
LOAD_REPORTS = ("step_output", "at_once")
LOAD_CACHINGS = ("first_step", "at_admission")
KV_LAYOUTS = ("per_layer", "contiguous")
WEIGHT_DTYPES = ("bf16", "fp8")
STEP_TIMES = ("auto", "measured", "roofline")  # kvtier.sim.steptime backends
ATTENTION_BACKENDS = ("default", "triton")  # kvtier.sim.steptime.attention_backend
FRAMEWORKS = ("vllm", "sglang", "trtllm")
FRAMEWORK_VERSIONS = ("current", "previous", "next")  # aiconfigurator-core's version slots


@dataclass(frozen=True)
class ServingPolicy:
    """Per-instance scheduler and the router in front of the instances."""

    instances: int | None = setting(
        None, "instances serving the trace (unset: every instance the topology has)", kind="int"
    )
    routing: str = setting(
        "round_robin", "router in front of the instances", choices=ROUTER_REGISTRY.names
    )
    # vLLM's H100 API-server defaults (vllm/engine/arg_utils.py get_batch_defaults, V):
    max_num_batched_tokens: int = setting(
        8192, "token budget of one iteration (chunked prefill); vLLM's H100 default"
    )
    max_num_seqs: int = setting(
        1024, "most requests running at once on one instance; vLLM's H100 default"
    )
    # prefix_affinity only: an instance with this many more requests than the least loaded one
    # is skipped, so one hot prefix cannot pile everything onto one GPU (assumption).
    affinity_overload: int = setting(
        8,
        "prefix_affinity: skip an instance with this many more requests than the least loaded",
        minimum=0,
    )

    # How HBM blocks are given out (kvtier.policy.registries.SCHEDULERS): vLLM V1's
    # allocate-as-you-grow with preemption (vllm/v1/core/sched/scheduler.py, kv_cache_manager.py),
    # vLLM v0's, or the whole footprint at admission (TensorRT-LLM's GUARANTEED_NO_EVICT, its
    # default capacity scheduler: docs/sources.md [TRT-LLM-capacity]). Unset: the framework's
    # own (:attr:`engine_scheduler`).
    scheduler: str | None = setting(
        None,
        "how blocks are allocated: as requests grow, or reserved at admission (unset: the "
        "framework's own, reserve under trtllm, else vllm_v1)",
        kind="str",
        choices=SCHEDULER_REGISTRY.names,
    )
    # vLLM's async scheduling (on by default in 0.19.1 and 0.24.0, off in 0.11.0;
    # config/vllm.py, v1/engine/core.py step_with_batch_queue): the scheduler decides step
    # n + 1 as soon as step n is launched, so a request queued or a load finished during a
    # step waits for the step after next while a request runs on (docs/model.md, "Async
    # scheduling").
    async_scheduling: bool = setting(
        False,
        "vllm_v1: the scheduler runs one step ahead of the GPU (vLLM's async scheduling)",
    )
    # What one step runs (docs/model.md, "Scheduler"): "mixed", decodes and prefill chunks
    # together in one token budget (vLLM V1, v1/core/sched/scheduler.py); "prefill_first", a
    # step of prefill chunks whenever one can run and otherwise a step of decodes (SGLang
    # 0.5.13 without --enable-mixed-chunk, managers/scheduler.py get_next_batch_to_run).
    batching: str = setting(
        "mixed",
        "what a step runs: decodes and prefill chunks together (mixed), or prefill chunks "
        "whenever any can run, else decodes (prefill_first)",
        choices=("mixed", "prefill_first"),
    )
    # A waiting or preempted request is admitted only if this share of the blocks stays free,
    # when others run: vLLM v0's block manager (watermark 0.01); vLLM V1 has none in 0.11.0 to
    # 0.22.0 and 0.34.0's scheduler_config.watermark defaults to 0.0 (docs/sources.md
    # [vLLM-v1-admission]). Unset: the scheduler's own (0.01 under vllm_v0, else 0).
    watermark: float | None = setting(
        None,
        "share of HBM blocks an admission leaves free while other requests run (unset: 0.01 "
        "under vllm_v0, else 0)",
        kind="float",
        nonneg=True,
        maximum=1.0,
    )
    # vllm_v1: a waiting or preempted request is admitted only when the blocks its whole
    # sequence needs, less its prefix hits, are free, not only its first chunk's (vLLM's
    # scheduler_reserve_full_isl, on by default in 0.19.1, 0.22.0 and 0.34.0, absent from
    # 0.11.0; docs/sources.md [vLLM-v1-admission]; docs/model.md, "Memory accounting").
    reserve_full_prompt: bool = setting(
        True,
        "vllm_v1: admit a waiting or preempted request only when its whole sequence's blocks, "
        "less its hits, are free (vLLM's scheduler_reserve_full_isl)",
    )
    # vllm_v1 with sliding-window layers: under reserve_full_prompt the sliding-window group's
    # blocks count too, up to a cap on one request's reserve (kv_cache_interface.py
    # SlidingWindowSpec.max_admission_blocks_per_request): 0.34.0 caps it at the window plus
    # the tokens of every batch in flight (two under async scheduling, VllmConfig.
    # max_in_flight_tokens), 0.22.0 at the window plus one batch, 0.19.1 not at all
    # (docs/sources.md [vLLM-swa-admission]; docs/model.md, "Sliding-window blocks in the pool").
    swa_admission_cap: str = setting(
        "in_flight",
        "vllm_v1, sliding-window layers: the cap on that group's admission reserve: the window "
        "plus every batch in flight (vLLM 0.34.0), plus one batch (0.22.0), or none (0.19.1)",
        choices=("in_flight", "one_batch", "none"),
    )
    # Prefill/decode disaggregation (docs/model.md, "Prefill/decode disaggregation"): this many
    # of the instances only prefill, the rest only decode; a prompt's KV moves to a decode
    # instance through pd_connector (NIXL in Dynamo and vLLM, Mooncake's Transfer Engine).
    prefill_instances: int = setting(
        0, "instances that only prefill, the rest only decode (0: aggregated)", minimum=0
    )
    # the split as a share, for a search whose instance count varies: with prefill_instances
    # 0, round(share x instances) instances prefill, at least one of each once there are two
    # (one instance stays aggregated)
    prefill_share: float = setting(
        0.0,
        "share of the instances that only prefill when prefill_instances is 0 (0: aggregated)",
        nonneg=True,
        maximum=0.95,
    )
    pd_connector: str = setting(
        "nixl",
        "disaggregated: the connector a prompt's KV moves by from prefill to decode",
        choices=CONNECTOR_REGISTRY.names,
    )
    # kv_aware only: Dynamo's --kv-overlap-score-weight (default 1); 0 ignores every cache hit
    # and routes by active blocks alone (lib/llm/src/kv_router/scheduler.rs).
    kv_overlap_weight: float = setting(
        1.0,
        "kv_aware: weight of the prompt blocks left to prefill against the active blocks",
        nonneg=True,
        maximum=1e6,
    )
    # llmd_epp only: the weights of llm-d's EPP scorers in its scheduling profile (the
    # tiered-prefix-cache guide's router values, single-host/tiered-prefix-cache-cpu.values.yaml:
    # queue-scorer, kv-cache-utilization-scorer, GPU and CPU prefix-cache-scorer and
    # no-hit-lru-scorer listed without weights, so each takes the config loader's
    # DefaultScorerWeight 1; the guide: "defaults to 1:1:1:1:1"). docs/model.md, "Routing".
    epp_queue_weight: float = setting(
        1.0, "llmd_epp: weight of the queue scorer (waiting requests)", nonneg=True, maximum=1e6
    )
    epp_kv_util_weight: float = setting(
        1.0,
        "llmd_epp: weight of the KV-cache utilisation scorer (1 - used HBM share)",
        nonneg=True,
        maximum=1e6,
    )
    epp_gpu_prefix_weight: float = setting(
        1.0,
        "llmd_epp: weight of the GPU prefix-cache scorer (HBM prefix share of the prompt)",
        nonneg=True,
        maximum=1e6,
    )
    epp_cpu_prefix_weight: float = setting(
        1.0,
        "llmd_epp: weight of the CPU prefix-cache scorer (prefix share held in HBM or a lower "
        "tier)",
        nonneg=True,
        maximum=1e6,
    )
    epp_no_hit_lru_weight: float = setting(
        1.0,
        "llmd_epp: weight of the no-hit-LRU scorer (a request no instance has cached goes to "
        "the instance that least recently took one)",
        nonneg=True,
        maximum=1e6,
    )
    # llm-d-inference-scheduler's active-request-scorer (pkg/plugins/scorer/active_request.go,
    # v0.4.0): not in the guide's current profile, so 0 by default; an earlier version of its
    # CPU guide's values (cpu/manifests/inferencepool/values.yaml) weighted it 2.
    epp_active_weight: float = setting(
        0.0,
        "llmd_epp: weight of the active-request scorer (requests routed to the instance and "
        "not finished, against the most on any instance)",
        nonneg=True,
        maximum=1e6,
    )
    # Where the EPP's two prefix scorers read a prefix (llm-d-router v0.10.0,
    # requestcontrol/dataproducer/approximateprefix: plugin.go, indexer.go, types.go; the same
    # index in gateway-api-inference-extension v1.0.1's plugins/multi/prefix): "index", the
    # approx-prefix-cache-producers' per-server LRU indexes of the prompts the EPP sent there,
    # as llm-d runs them; "cache", the instances' actual HBM and lower-tier content (a
    # precise, KV-event-fed scorer). docs/model.md, "Routing".
    epp_prefix_source: str = setting(
        "index",
        "llmd_epp: where the prefix scorers read a prefix: the EPP's own LRU indexes of where "
        "it sent prompts (index) or the instances' cached blocks (cache)",
        choices=("index", "cache"),
    )
    # the GPU producer: autoTune takes vLLM's block count (cache_config_info num_gpu_blocks)
    # as its entries and vLLM's block size, at least 64 tokens (minBlockSizeTokens), as its
    # entry; the CPU producer of the tiered guide: autoTune false, lruCapacityPerServer set,
    # blockSizeTokens at its default 16, clamped to 64
    epp_gpu_index_entries: int = setting(
        0,
        "llmd_epp index: entries of the GPU producer's LRU per server (0: autoTune, the "
        "instance's HBM blocks)",
        minimum=0,
    )
    epp_gpu_index_entry_tokens: int = setting(
        0,
        "llmd_epp index: prompt tokens per GPU-producer entry (0: autoTune, the block size "
        "and at least 64)",
        minimum=0,
    )
    epp_cpu_index_entries: int = setting(
        31250,
        "llmd_epp index: entries of the CPU producer's LRU per server (lruCapacityPerServer; "
        "default 31,250)",
    )
    epp_cpu_index_entry_tokens: int = setting(
        64, "llmd_epp index: prompt tokens per CPU-producer entry (blockSizeTokens, >= 64)"
    )
    epp_index_max_tokens: int = setting(
        131072,
        "llmd_epp index: leading prompt tokens the producers hash (maxPrefixTokensToMatch)",
    )
    # The producers hash the request's text, not its tokens: entries of blockSizeTokens x 4
    # bytes of the prompt (averageCharactersPerToken = 4; llm-d-inference-scheduler
    # approximateprefix getKVCacheBlocksFromRawBytes, gateway-api-inference-extension's
    # hashPrompt alike), so with b bytes of text per token an entry of t "tokens" covers
    # t x 4 / b of the prompt's tokens. 4 (the default) makes the entries whole tokens;
    # random-token benchmark prompts are denser (inference-perf's shared-prefix prompts: 6.4
    # bytes a token for Qwen3 and Llama 3, 7.0 for gpt-oss; docs/sources.md [EPP-text-blocks]).
    epp_prompt_bytes_per_token: float = setting(
        4.0,
        "llmd_epp index: UTF-8 bytes of prompt text per token (the EPP hashes text at 4 bytes "
        "a token; 4 makes its entries whole tokens)",
        maximum=64.0,
    )
    # The queue and KV-utilisation scorers read each server's /metrics as the EPP last scraped
    # it: every --refresh-metrics-interval (50 ms by default: gateway-api-inference-extension
    # v1.0.2 pkg/epp/server/runserver.go, llm-d-router v0.10.0 options.go), and vLLM sets its
    # gauges once a step, after it (Scheduler.make_stats in update_from_output, 0.19.1), so a
    # request sent during a step is not yet counted. 0: the servers' exact state at each
    # arrival. docs/model.md, "Routing".
    epp_metrics_interval_s: float = setting(
        0.05,
        "llmd_epp: seconds between the EPP's scrapes of each server's queue and KV use, "
        "which vLLM updates once a step (0: the exact state at each arrival)",
        nonneg=True,
        maximum=60.0,
    )

    # vLLM's --enable-prefix-caching / --no-enable-prefix-caching: off, HBM keeps no prefix
    # across requests and every hit comes through a connector (LMCache deployments often run so).
    prefix_caching: bool = setting(
        True, "vLLM's own prefix cache in HBM (off: every hit comes from a lower tier)"
    )
    # Clients that send token ids and read token ids back (a benchmark with de/tokenization
    # off): no per-prompt-token front-end cost (kvtier.sim.steptime.frontend).
    token_ids_io: bool = setting(
        False,
        "clients send token ids and read ids back: no tokenization or detokenizer priming in TTFT",
    )
    # Deployment: GPUs per instance and the weights' element type (fp8 is lossy: the search
    # takes it only with the flag that allows lossy choices, as with fp8 KV).
    tp: int | None = setting(
        None,
        "tensor-parallel size, GPUs per instance (unset: the hardware profile's); "
        "instances follow from the GPUs",
        kind="int",
        maximum=64,
    )
    # Per-pool tensor parallelism of a disaggregated split (docs/model.md, "Per-pool tensor
    # parallelism"): prefill and decode instances may shard over different GPU counts, as
    # Dynamo's and vLLM's P/D deployments launch each role with its own --tensor-parallel-size.
    # Unset: serving.tp. Aggregated (no split), both must be unset or equal to serving.tp.
    prefill_tp: int | None = setting(
        None,
        "disaggregated: GPUs per prefill instance (unset: serving.tp)",
        kind="int",
        maximum=64,
    )
    decode_tp: int | None = setting(
        None,
        "disaggregated: GPUs per decode instance (unset: serving.tp)",
        kind="int",
        maximum=64,
    )
    # Prefill and decode pools on different GPU types (docs/model.md, "GPU type per pool"):
    # the prefill instances on this GPU profile (Rubin CPX beside Rubin, H100 beside H200).
    prefill_gpu: str | None = setting(
        None,
        "disaggregated: GPU profile of the prefill instances (unset: the hardware "
        "profile's prefill_gpu, else its gpu)",
        kind="str",
    )
    # Weights in high-bandwidth flash beside each GPU (docs/model.md, "Weights in HBF"): no
    # HBM for weights, so more KV blocks, and the weights read at the HBF's rate each step.
    weights_in_hbf: bool = setting(
        False, "keep the weights in the GPUs' HBF (a GPU profile with hbf_gb): more KV in HBM"
    )
    weight_dtype: str | None = setting(
        None,
        "weight element type (unset: the model profile's); fp8 needs a GPU with FP8",
        kind="str",
        choices=WEIGHT_DTYPES,
    )
    # The step-time backend (kvtier.sim.steptime): measured operator times of the framework
    # (aiconfigurator-core's database), the roofline, or auto (measured where data covers it).
    step_time: str = setting(
        "auto", "step-time backend (auto: measured where data covers it)", choices=STEP_TIMES
    )
    framework: str = setting("vllm", "serving framework of the measured data", choices=FRAMEWORKS)
    framework_version: str = setting(
        "current",
        "framework data version: the database's current, previous or next slot",
        choices=FRAMEWORK_VERSIONS,
    )
    # SGLang's --attention-backend: the measured tables hold the kernels SGLang picks on the GPU
    # by default; triton scales their prefill attention by aiconfigurator-core's measured ratio
    # of SGLang's Triton kernels to the default (kvtier.sim.steptime.attention_backend;
    # docs/model.md, "Attention back end").
    attention_backend: str = setting(
        "default",
        "sglang: attention kernels (default: the framework's own on the GPU, as measured; "
        "triton: SGLang's Triton kernels)",
        choices=ATTENTION_BACKENDS,
    )
    # The framework's own CPU time per scheduler iteration (scheduling, input preparation,
    # output processing, the API server sharing the process), which blocks the GPU in engines
    # that run them synchronously (vLLM before v0.6.0: docs/sources.md [vLLM-v0.6-perf]) and
    # is absent from the measured operator times; added to every iteration as the hardware
    # profile's step_overhead_s is (docs/model.md, "Step time").
    cpu_overhead_s: float = setting(
        0.0,
        "framework CPU seconds added to every iteration (0: none; docs/model.md)",
        nonneg=True,
        maximum=10.0,
    )

    def __post_init__(self) -> None:
        check_settings(self)

    @property
    def engine_scheduler(self) -> str:
        """The scheduler the instances run: ``scheduler`` when set, else the framework's own
        (TensorRT-LLM's default capacity scheduler reserves a request's whole footprint at
        admission, ``reserve``; vLLM V1's grows and preempts, ``vllm_v1``)."""
        if self.scheduler is not None:
            return self.scheduler
        return "reserve" if self.framework == "trtllm" else "vllm_v1"


def prefill_count(serving: ServingPolicy, instances: int) -> int:
    """Prefill instances of ``instances`` (0: aggregated): ``prefill_instances`` when set, else
    ``prefill_share`` of them rounded, keeping at least one prefill and one decode instance."""
    if serving.prefill_instances:
        return int(serving.prefill_instances)
    if serving.prefill_share <= 0 or instances < 2:
        return 0
    return min(max(round(serving.prefill_share * instances), 1), instances - 1)


SPLIT_ONLY_KEYS = ("serving.prefill_share", "serving.prefill_tp", "serving.decode_tp")


def inert_split_keys(serving: ServingPolicy, instances: int) -> tuple[str, ...]:
    """The split keys ``serving`` sets that take no effect on ``instances`` instances.

    A share of a single instance leaves it aggregated (:func:`prefill_count`), and then the
    share and the pool sizes do nothing: a report showing them, or a policy file carrying
    them, would describe a split that does not run.
    """
    if prefill_count(serving, instances):
        return ()
    return tuple(
        key
        for key in SPLIT_ONLY_KEYS
        if getattr(serving, key.removeprefix("serving.")) not in (None, 0, 0.0)
    )


def without_inert_split(policy: Policy, instances: int) -> Policy:
    """``policy`` as the deployment it ran: aggregated on ``instances`` instances, without the
    split keys that had no effect (:func:`inert_split_keys`). The instance count is stated,
    since unset it would follow from the GPUs at the one size and could differ."""
    if not inert_split_keys(policy.serving, instances):
        return policy
    serving = replace(
        policy.serving, instances=instances, prefill_share=0.0, prefill_tp=None, decode_tp=None
    )
    return replace(policy, serving=serving)


# Settings of how KV moves below HBM: with no lower tier listed they act on nothing.
LOWER_TIER_ONLY_KEYS = (
    "write_policy",
    "selective_k",
    "hierarchy",
    "load_rule",
    "load_wait",
    "load_report",
    "load_caching",
)
# Settings of how a transfer is cut into operations: they act on lower-tier transfers and on
# a split deployment's prefill-to-decode hand-off.
TRANSFER_ONLY_KEYS = ("kv_layout", "coalesce")


def movement_keys_without_effect(policy: Policy, split: bool) -> dict[str, str]:
    """The settings of how KV moves that take no effect on ``policy`` whatever their values,
    each with why: without a lower tier the write, hierarchy and load settings act on
    nothing; without one and without a prefill-to-decode hand-off (``split``: the deployment
    runs prefill instances), nor do the transfers' layout and coalescing; ``selective_k`` acts
    only under ``write_through_selective`` (tests/test_inert_movement.py replays each change
    to the same per-request times)."""
    tiers = bool(policy.lower_tiers)
    out: dict[str, str] = {}
    if not tiers:
        out.update(dict.fromkeys(LOWER_TIER_ONLY_KEYS, "no lower tier"))
        if not split:
            out.update(
                dict.fromkeys(TRANSFER_ONLY_KEYS, "no lower tier, no prefill-to-decode hand-off")
            )
    elif policy.write_policy != "write_through_selective":
        out["selective_k"] = "write_policy is not write_through_selective"
    return out


def inert_movement_keys(policy: Policy, split: bool) -> dict[str, str]:
    """The settings ``policy`` sets away from their defaults that take no effect
    (:func:`movement_keys_without_effect`), each with why. A search samples them whatever the
    tiers, so a winner without lower tiers carries them; a report marks them, and its policy
    file and an export carry the defaults instead (:func:`without_inert_movement`), as they
    leave out a split's keys on one instance (:func:`inert_split_keys`)."""
    defaults = Policy()
    return {
        key: why
        for key, why in movement_keys_without_effect(policy, split).items()
        if getattr(policy, key) != getattr(defaults, key)
    }


def ran_split(policy: Policy, ran: int) -> bool:
    """Whether ``policy``'s replay on ``ran`` instances ran prefill instances (unknown ``ran``:
    whether it asks for any)."""
    serving = policy.serving
    if ran:
        return prefill_count(serving, ran) > 0
    return bool(serving.prefill_instances) or serving.prefill_share > 0


def without_inert_movement(policy: Policy, split: bool) -> Policy:
    """``policy`` with the settings that take no effect (:func:`inert_movement_keys`) at their
    defaults: the same replay, described without settings that do nothing."""
    inert = inert_movement_keys(policy, split)
    if not inert:
        return policy
    defaults = Policy()
    return replace(policy, **{key: getattr(defaults, key) for key in inert})


def split_conflict(serving: ServingPolicy) -> str | None:
    """Why ``serving`` states its prefill/decode split twice, or None.

    ``prefill_instances`` and ``prefill_share`` are two ways of saying one thing; with both
    set, the count would win and the share would be ignored without a word, so a policy may
    give one of them (``prefill_instances = 0`` leaves the split to the share).
    """
    if serving.prefill_instances and serving.prefill_share > 0:
        return (
            f"serving.prefill_share = {serving.prefill_share:g} and serving.prefill_instances "
            f"= {serving.prefill_instances} both set the prefill/decode split; give one "
            "(serving.prefill_instances = 0 leaves the split to the share)"
        )
    return None


@dataclass(frozen=True)
class TierPolicy:
    """One cache tier: which one, its size and its eviction policy.

    ``capacity_gb`` is per instance for ``hbm`` (default: HBM - weights - reserve), per host for
    ``dram`` and ``ssd``, for the whole pool for ``cxl`` and ``rdma`` (default: the hardware
    profile's). ``interleave`` (cxl only) overrides the profile's device interleaving.
    ``per_engine`` (per-host tiers) splits the host's capacity evenly into a private pool per
    engine of the fullest host, as the serving systems' host caches are private to their
    engine.
    """

    name: str = setting("hbm", "the tier", choices=TIER_NAMES)
    eviction: str = setting(
        "lru", "eviction policy (hbm: lru, vLLM's free queue)", choices=EVICTION_REGISTRY.names
    )
    capacity_gb: float | None = setting(
        None,
        "GB per instance (hbm), per host (dram, ssd) or per pool (cxl, rdma); "
        "unset: the hardware profile's",
        kind="float",
        maximum=MAX_CAPACITY_GB,
    )
    interleave: bool | None = setting(
        None, "cxl only: interleave blocks over the devices (unset: the profile's)", kind="bool"
    )
    per_engine: bool | None = setting(
        None,
        "per-host tiers: each engine keeps its own share of the host's pool, none reads "
        "another's (unset: the tier kind's; dram, c2c: yes)",
        kind="bool",
    )
    # The software between this tier and the GPU (kvtier.policy.registries.CONNECTORS); the
    # six below override the connector's own values.
    connector: str = setting(
        "direct", "transfer path between the tier and the GPU", choices=CONNECTOR_REGISTRY.names
    )
    depth: int | None = setting(
        None, "operations in flight of a pipelined connector (unset: the connector's)", kind="int"
    )
    workers: int | None = setting(
        None, "connector workers per GPU or per host (unset: the connector's)", kind="int"
    )
    layerwise: bool | None = setting(
        None, "loads overlap the first layers' compute (unset: the connector's)", kind="bool"
    )
    store_blocks: bool | None = setting(
        None,
        "the engine step waits until its copies into the tier are saved (unset: the connector's)",
        kind="bool",
    )
    store_generated: bool | None = setting(
        None,
        "a finished request's full blocks of generated tokens are stored into the tier too "
        "(unset: the connector's)",
        kind="bool",
    )
    defer_loading_hits: bool | None = setting(
        None,
        "a request whose hits in the tier another request is loading waits for that load "
        "(unset: the connector's)",
        kind="bool",
    )
    visible_when_stored: bool | None = setting(
        None,
        "a look-up finds a copy in the tier only once its store has ended (unset: the connector's)",
        kind="bool",
    )
    # The pool's own eviction rule, as a store's master applies it (kvtier.cache.watermark)
    eviction_high_watermark: float | None = setting(
        None,
        "share of the pool's capacity above which it evicts a batch of blocks (Mooncake "
        "Store's eviction_high_watermark_ratio; unset: one block per insertion once full)",
        kind="float",
        maximum=1.0,
    )
    eviction_ratio: float | None = setting(
        None,
        "with eviction_high_watermark: the least share of the pool's blocks a batch evicts "
        "(Mooncake Store's eviction_ratio; unset: 0, back to the watermark)",
        kind="float",
        nonneg=True,
        maximum=1.0,
    )

    def __post_init__(self) -> None:
        check_settings(self)
        if self.name == "hbm" and self.eviction not in HBM_EVICTIONS:
            raise ValueError("the hbm tier evicts lru (vLLM's free queue)")
        if self.name == "hbm" and (
            self.eviction_high_watermark is not None or self.eviction_ratio is not None
        ):
            raise ValueError(
                "eviction_high_watermark and eviction_ratio apply to the tiers below hbm"
            )
        if self.eviction_ratio is not None and self.eviction_high_watermark is None:
            raise ValueError("eviction_ratio needs eviction_high_watermark")
        if self.interleave is not None and not tier_trait(self.name, "interleave"):
            raise ValueError(f"interleave applies to {_interleaved()} only")
        if self.per_engine is not None and (
            self.name == "hbm" or not tier_trait(self.name, "per_host")
        ):
            raise ValueError("per_engine applies to the per-host tiers only")


def _interleaved() -> str:
    """The tier kinds a policy may set ``interleave`` on, as an error names them."""
    names = [e.name for e in TIER_KINDS if e.traits.get("interleave")]
    return "the " + " and ".join(names) + (" tier" if len(names) == 1 else " tiers")


@dataclass(frozen=True)
class SLO:
    """Service-level objective; every field optional. Latencies in seconds."""

    ttft_mean_s: float | None = setting(None, "mean time to first token, s", kind="float")
    ttft_p99_s: float | None = setting(None, "99th percentile time to first token, s", kind="float")
    ttft_p999_s: float | None = setting(
        None, "99.9th percentile time to first token, s", kind="float"
    )
    tpot_p99_s: float | None = setting(
        None, "99th percentile time per output token, s", kind="float"
    )
    tbt_p99_s: float | None = setting(
        None,
        "99th percentile over requests of each request's mean of its longest 10% token "
        "intervals, s",
        kind="float",
    )

    def __post_init__(self) -> None:
        check_settings(self)

    def is_empty(self) -> bool:
        return all(v is None for v in self.__dict__.values())


SLO_TERMS = tuple(f.name for f in fields(SLO))  # ttft_mean_s, ttft_p99_s, ttft_p999_s, ...


@dataclass(frozen=True)
class Policy:
    """Everything the simulator needs besides the trace and the hardware."""

    block_tokens: int = setting(16, "tokens per KV block; vLLM's default on CUDA")
    kv_dtype: str = setting("bf16", "KV-cache element type", choices=KV_DTYPES)
    serving: ServingPolicy = field(default_factory=ServingPolicy)
    tiers: tuple[TierPolicy, ...] = (TierPolicy(),)
    slo: SLO | None = None
    # Profile names, used when the CLI is not told otherwise.
    hardware: str | None = setting(None, "hardware profile name", kind="str")
    model: str | None = setting(None, "model profile name", kind="str")
    # Lower tiers (docs/design.md 4.3, 4.4); they matter only when a tier below hbm is listed.
    write_policy: str = setting(
        "write_through",
        "how computed blocks reach the lower tiers (LMCache and Mooncake store every chunk)",
        choices=WRITE_REGISTRY.names,
    )
    selective_k: int = setting(
        2, "write_through_selective: sightings before a block is copied down"
    )
    hierarchy: str = setting(
        "inclusive", "whether a block may be in several tiers at once", choices=HIERARCHIES
    )
    load_rule: str = setting(
        "always_load",
        "when a lower-tier hit is loaded rather than recomputed",
        choices=LOAD_REGISTRY.names,
    )
    # Who waits for a load from a lower tier: the loading request only (vLLM's KV-connector
    # design; LMCache with enable_async_loading), or the instance's whole batch (LMCache up to
    # 0.3.x by default: the retrieve runs before the forward pass), docs/model.md.
    load_wait: str = setting(
        "request",
        "who waits for a lower-tier load: the loading request, or the instance's batch",
        choices=LOAD_WAITS,
    )
    # When the scheduler learns that a request's lower-tier load has ended (``load_wait =
    # "request"``, ``vllm_v1``): with the output of the first engine step launched after it
    # (vLLM's KV connector: the worker's ``get_finished`` runs as each step is launched and its
    # finished loads reach the scheduler with that step's output), or at its next decision
    # (docs/model.md, "When the scheduler sees a load end").
    load_report: str = setting(
        "step_output",
        "when the scheduler sees a finished lower-tier load: with the output of the first step "
        "launched after it (vLLM's KV connector), or at once",
        choices=LOAD_REPORTS,
    )
    # When the blocks a request loads from a lower tier enter HBM's prefix cache: at the end of
    # its first step (vLLM caches them when the load has ended, one step earlier at most), or
    # at its admission, so that a request matching them while they arrive hits them in HBM and
    # waits for their arrival instead of loading them again (SGLang's radix tree takes the
    # pages of a load-back at once; docs/model.md, "Hits another request is loading"); the
    # same tree keeps one access time for a page's HBM and host copies, so at_admission also
    # makes a request's HBM hits refresh their host copies (docs/model.md, "One access time for
    # HBM and the host tier").
    load_caching: str = setting(
        "first_step",
        "when loaded blocks enter HBM's prefix cache: after the loader's first step, or at its "
        "admission (a request that matches them waits for them; SGLang's tree, whose HBM hits "
        "also refresh their host copies)",
        choices=LOAD_CACHINGS,
    )
    kv_layout: str = setting(
        "per_layer",
        "per_layer: vLLM's K and V tensors per layer (2 x layers fragments a block); contiguous",
        choices=KV_LAYOUTS,
    )
    coalesce: int = setting(1, "fragments merged into one transfer operation")
    share_across_tenants: bool = setting(
        False, "tenants share cached prefixes (false: a block's identity includes the tenant)"
    )

    def __post_init__(self) -> None:
        check_settings(self)
        if not self.tiers or self.tiers[0].name != "hbm":
            raise ValueError("the first tier must be hbm")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names) or "hbm" in names[1:]:
            raise ValueError(f"each tier may appear once, hbm first, got {names}")

    def tier(self, name: str) -> TierPolicy | None:
        """The listed tier of that name, or None when it is off."""
        return next((t for t in self.tiers if t.name == name), None)

    @property
    def lower_tiers(self) -> tuple[TierPolicy, ...]:
        """Listed tiers below HBM, in lookup order (the tier kinds' order, kvtier.tier_kinds)."""
        return tuple(t for name in LOWER_TIERS if (t := self.tier(name)) is not None)

    def kv_bytes_per_block(self, model: Any) -> int:
        """Bytes of KV one block of this policy holds for ``model`` (a ``ModelProfile``)."""
        return self.block_tokens * int(model.kv_bytes_per_token(self.kv_dtype))

    def with_block_tokens(self, block_tokens: int) -> Policy:
        return replace(self, block_tokens=block_tokens)


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy TOML file; bad content raises :class:`InputError`."""
    path = Path(path)
    return policy_from_dict(read_toml(path), str(path))


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The policy as the plain dict a policy file holds (``policy_from_dict`` inverts it)."""
    data: dict[str, Any] = {"format": POLICY_FORMAT}
    for f in fields(Policy):
        if "help" in f.metadata and (value := getattr(policy, f.name)) is not None:
            data[f.name] = value
    serving = {k: v for k, v in asdict(policy.serving).items() if v is not None}
    data["serving"] = serving
    data["tiers"] = [{k: v for k, v in asdict(t).items() if v is not None} for t in policy.tiers]
    if policy.slo is not None and not policy.slo.is_empty():
        data["slo"] = {k: v for k, v in asdict(policy.slo).items() if v is not None}
    return data


def policy_from_dict(data: dict[str, Any], source: str = "<policy>") -> Policy:
    """Validate a policy given as a plain dict (a parsed file, or an optimizer's overlay)."""
    t = Table(data, source)
    fmt = t.string("format", POLICY_FORMAT)
    if fmt != POLICY_FORMAT:
        raise t.error("format", f"must be {POLICY_FORMAT!r}, got {fmt!r}")
    serving = ServingPolicy()
    st = t.table("serving")
    if st is not None:
        serving = ServingPolicy(**read_settings(ServingPolicy, st))
        st.done()
        if (conflict := split_conflict(serving)) is not None:
            raise t.error("serving.prefill_share", conflict)
        if serving.batching == "prefill_first" and serving.engine_scheduler == "vllm_v0":
            raise t.error(
                "serving.batching",
                "prefill_first applies to schedulers 'vllm_v1' and 'reserve'; 'vllm_v0' "
                "already runs prompts in steps without decodes",
            )
        if serving.async_scheduling and serving.engine_scheduler != "vllm_v1":
            raise t.error(
                "serving.async_scheduling",
                f"applies to scheduler 'vllm_v1' only, not {serving.engine_scheduler!r}",
            )
        if serving.attention_backend != "default" and serving.framework != "sglang":
            raise t.error(
                "serving.attention_backend",
                f"{serving.attention_backend!r} is SGLang's --attention-backend and "
                f"serving.framework is {serving.framework!r} (choices with it: default)",
            )
        if serving.async_scheduling and serving.cpu_overhead_s > 0:
            # the replay adds cpu_overhead_s to every step, as an engine that schedules in
            # step pays it; one that schedules ahead hides it behind the GPU's step
            raise t.error(
                "serving.async_scheduling",
                "hides the framework CPU time serving.cpu_overhead_s adds to every step "
                "(an engine that schedules in step pays it); set one of them",
            )
    tiers: list[TierPolicy] = []
    for i, tt in enumerate(t.tables("tiers")):
        name = tt.string("name", choices=TIER_NAMES)
        if any(x.name == name for x in tiers):
            raise tt.error(f"tiers[{i}].name", f"tier {name!r} is listed twice")
        if tt.has("interleave") and not tier_trait(name, "interleave"):
            raise tt.error(f"tiers[{i}].interleave", f"applies to {_interleaved()} only")
        if tt.has("per_engine") and (name == "hbm" or not tier_trait(name, "per_host")):
            per_host = ", ".join(n for n in TIER_NAMES if n != "hbm" and tier_trait(n, "per_host"))
            raise tt.error(f"tiers[{i}].per_engine", f"applies to the {per_host} tiers only")
        hbm = name == "hbm"
        for key in ("eviction_high_watermark", "eviction_ratio"):
            if hbm and tt.has(key):
                raise tt.error(f"tiers[{i}].{key}", "applies to the tiers below hbm")
        if tt.has("eviction_ratio") and not tt.has("eviction_high_watermark"):
            raise tt.error(
                f"tiers[{i}].eviction_ratio",
                "needs eviction_high_watermark (the share of the pool that starts a batch)",
            )
        values = read_settings(
            TierPolicy,
            tt,
            skip=("name",),
            narrow=lambda s, hbm=hbm: HBM_EVICTIONS if hbm and s.name == "eviction" else None,
        )
        tiers.append(TierPolicy(name=name, **values))
        tt.done()
    if tiers and tiers[0].name != "hbm":
        raise t.error("tiers[0].name", "the first tier must be hbm")
    slo = None
    sl = t.table("slo")
    if sl is not None:
        slo = SLO(**read_settings(SLO, sl))
        sl.done()
    policy = Policy(
        serving=serving,
        tiers=tuple(tiers) if tiers else (TierPolicy(),),
        slo=slo,
        **read_settings(Policy, t),
    )
    # Sections later parts of kvtier fill in or read; accepted, not interpreted here
    # ([[faults]]: the replay's faults, kvtier.sim.faults)
    for key in ("metrics", "provenance", "faults"):
        t.used.add(key)
    t.done()
    return policy
