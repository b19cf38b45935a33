"""``SimConfig``: the numbers both simulators run on, derived once from hardware, model, policy.

Both the reference and the numba engine read the same ``SimConfig``, so a profile or policy is
turned into block counts and rates in exactly one place. Router codes are small integers so the
jitted engine can branch on them; they come from the router registry
(``kvtier.policy.registries.ROUTERS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvtier.errors import InputError
from kvtier.hardware.deploy import apply_deployment
from kvtier.hardware.types import GB, Hardware, ModelProfile
from kvtier.policy.model import Policy, prefill_count
from kvtier.policy.registries import ROUTERS, SCHEDULERS
from kvtier.sim.pd import PdConfig, build_pd
from kvtier.sim.steptime.backend import step_timing
from kvtier.sim.tiers import TierConfig, build_tiers
from kvtier.sim.timing import T_FRONTEND

ROUTER_CODES = ROUTERS.codes  # {name: code}, from the router registry


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
    kv_overlap_weight: float = 1.0  # kv_aware router: weight of prefill blocks (Dynamo's)
    scheduler: int = 0  # SCHEDULERS code: 0 reserve at admission, 1 vLLM V1 (grow, preempt)
    watermark_blocks: int = 0  # vllm_v1: free blocks an admission leaves when others run
    # prefill/decode disaggregation: instances [0, n_prefill) prefill, the rest decode (0:
    # aggregated); a prompt's KV moves to a decode instance through the P/D connector over the
    # links of ``pd`` (kvtier.sim.pd; None when aggregated)
    n_prefill: int = 0
    pd: PdConfig | None = field(default=None, compare=False, repr=False)

    # the packed step-time array (kvtier.sim.timing layout; None: the plain roofline of the
    # fields above), the backend that made it and its provenance (package and data versions)
    timing: np.ndarray | None = field(default=None, compare=False, repr=False)
    step_backend: str = "roofline"
    step_provenance: str = ""
    # seconds per request outside the engine (HTTP, tokenization, detokenization), added to
    # the first-token and finish times a client sees (kvtier.sim.steptime.frontend)
    frontend_s: float = 0.0

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
        )


def build_config(hardware: Hardware, model: ModelProfile, policy: Policy) -> SimConfig:
    """Derive a :class:`SimConfig`; impossible deployments raise :class:`InputError`."""
    hardware, model = apply_deployment(hardware, model, policy)
    topo = hardware.topology
    serving = policy.serving
    n_inst = serving.instances if serving.instances is not None else topo.max_instances
    if serving.tp is not None:
        n_inst = min(n_inst, topo.max_instances)  # serving.tp set: instances follow the GPUs
    if n_inst > topo.max_instances:
        raise InputError(
            f"policy asks for {n_inst} instances but hardware {hardware.name!r} has only "
            f"{topo.max_instances} (tp={topo.tp})"
        )
    kvb = model.kv_bytes_per_token(policy.kv_dtype)
    block_bytes = policy.kv_bytes_per_block(model)
    hbm_tier = policy.tiers[0]
    if hbm_tier.capacity_gb is not None:
        kv_bytes = hbm_tier.capacity_gb * GB
    else:
        kv_bytes = hardware.kv_capacity_bytes(model)
    # MLA latents (and GQA heads when tp > kv_heads) are replicated across the TP ranks
    replicated = block_bytes * model.kv_replication(topo.tp)
    if kv_bytes < replicated:
        raise InputError(
            f"model {model.name!r} leaves no room for KV blocks on {hardware.name!r}: "
            f"{kv_bytes / GB:.1f} GB after weights per instance of tp={topo.tp}"
        )
    n_pf = prefill_count(serving, n_inst)
    if n_pf and not 1 <= n_pf < n_inst:
        raise InputError(
            f"serving.prefill_instances = {n_pf} leaves no decode instance of {n_inst}; "
            f"choose 0 (aggregated) or 1..{n_inst - 1}"
        )
    tiers = build_tiers(hardware, model, policy, n_inst)
    pd = None
    if n_pf:
        pd, tiers = build_pd(hardware, model, policy, n_inst, tiers)
    timing, backend, provenance = step_timing(hardware, model, policy, float(kvb))
    return SimConfig(
        n_instances=n_inst,
        capacity_blocks=int(kv_bytes // replicated),
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
        cost_per_hour=hardware.cost_per_hour(n_inst, tiers.tier_gb if tiers else None),
        tiers=tiers,
        timing=timing,
        step_backend=backend,
        step_provenance=provenance,
        frontend_s=float(timing[T_FRONTEND]),
        prefix_caching=serving.prefix_caching,
        kv_overlap_weight=float(serving.kv_overlap_weight),
        scheduler=SCHEDULERS.codes[serving.scheduler],
        n_prefill=n_pf,
        pd=pd,
        watermark_blocks=int(serving.watermark * int(kv_bytes // replicated)),
    )
