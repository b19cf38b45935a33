"""``TierConfig``: the tiers below HBM, their pools and the links between them, as arrays.

Derived once from the hardware profile and the policy (docs/design.md 4.1, 4.4) so that both
simulators read the same numbers. Pools: a per-host tier (``dram``, ``ssd``) has one pool per
host, a shared tier (``cxl``, ``rdma``) one pool; pool ``pool_base[t] + p``. Links, each a FIFO
server with a read and a write bandwidth:

- ``k`` for ``k < n_instances``: instance ``k``'s PCIe link (``tp`` GPUs' links together);
- ``port_link[t, h]``: host ``h``'s access link to tier ``t`` (CXL adapters, NICs, NVMe, DRAM);
- ``pool_link[t]``: a pooled tier's aggregate bandwidth shared by every host (-1: none).

A transfer between an instance and tier ``t`` crosses PCIe, the port and the pool link; a copy
from tier ``a`` to tier ``b`` on host ``h`` crosses both ports (and pool links).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvtier.errors import InputError
from kvtier.hardware.types import GB, Hardware, ModelProfile
from kvtier.policy.model import Policy
from kvtier.policy.registries import COST_AWARE, LOAD_RULES, WRITE_POLICIES

# Write-policy codes come from their registry (the kernels import the constants from there).
WRITE_CODES = WRITE_POLICIES.codes  # {name: code}
MAX_PATH = 4  # links on the longest path (tier to tier: port, pool, port, pool)


@dataclass(frozen=True, eq=False)
class TierConfig:
    """Lower tiers of one replay; arrays are indexed by tier ``t`` (lookup order) or link."""

    names: tuple[str, ...]
    evictions: tuple[str, ...]
    capacity_blocks: np.ndarray  # int64 (T,), per pool
    per_host: np.ndarray  # bool (T,)
    pool_base: np.ndarray  # int64 (T,)
    n_pools: int
    n_hosts: int
    inst_host: np.ndarray  # int64 (n_instances,)
    op_s: np.ndarray  # float64 (T,) seconds per transfer operation
    lat_s: np.ndarray  # float64 (T,) seconds per transfer
    cap_bw: np.ndarray  # float64 (T,) per-transfer cap (one CXL device), inf when none
    link_bw_read: np.ndarray  # float64 (L,)
    link_bw_write: np.ndarray  # float64 (L,)
    link_ops: np.ndarray  # int64 (L,) 1 if the link carries the per-operation overhead
    link_names: tuple[str, ...]
    port_link: np.ndarray  # int64 (T, hosts)
    pool_link: np.ndarray  # int64 (T,), -1 when the tier has no shared link
    write_policy: int  # WRITE_* code
    selective_k: int
    exclusive: bool
    cost_aware: bool
    batch_waits: bool  # policy load_wait = "batch": no iteration while a request loads
    fragments: int  # fragments per block (KV layout)
    coalesce: int
    block_bytes: float
    tier_gb: dict[str, float]  # total GB of each tier over all its pools (for cost)

    @property
    def n_tiers(self) -> int:
        return len(self.names)

    @property
    def n_links(self) -> int:
        return len(self.link_names)

    def pool_of(self, t: int, inst: int) -> int:
        """The pool of tier ``t`` that instance ``inst`` reaches."""
        return int(self.pool_base[t] + (self.inst_host[inst] if self.per_host[t] else 0))

    def int_params(self) -> np.ndarray:
        """Kernel scalars (int64): write policy, k, exclusive, cost_aware, fragments, coalesce,
        batch_waits."""
        return np.array(
            [
                self.write_policy,
                self.selective_k,
                int(self.exclusive),
                int(self.cost_aware),
                self.fragments,
                self.coalesce,
                int(self.batch_waits),
            ],
            dtype=np.int64,
        )


def fragments_per_block(model: ModelProfile, kv_layout: str) -> int:
    """Separate memory regions one block occupies: a K and a V tensor per layer in vLLM's
    layout (one latent per layer for MLA), or one for a contiguous chunk (docs/design.md 4.4)."""
    if kv_layout == "contiguous":
        return 1
    return model.layers * (1 if model.mla is not None else 2)


def build_tiers(
    hardware: Hardware, model: ModelProfile, policy: Policy, n_instances: int
) -> TierConfig | None:
    """The lower tiers the policy lists, sized and wired from the hardware; None if none."""
    lower = policy.lower_tiers
    if not lower:
        return None
    topo = hardware.topology
    block_bytes = float(policy.kv_bytes_per_block(model))
    inst_host = np.array(
        [(k * topo.tp) // topo.gpus_per_host for k in range(n_instances)], dtype=np.int64
    )
    n_hosts = int(inst_host.max()) + 1
    names, evictions, caps, per_host, base = [], [], [], [], []
    op_s, lat_s, cap_bw = [], [], []
    link_r = [topo.tp * hardware.gpu.pcie_bw] * n_instances
    link_w = list(link_r)
    link_ops = [1] * n_instances
    link_names = [f"pcie[{k}]" for k in range(n_instances)]
    port = np.full((len(lower), n_hosts), -1, dtype=np.int64)
    pool_link = np.full(len(lower), -1, dtype=np.int64)
    tier_gb: dict[str, float] = {}
    n_pools = 0
    for t, tp in enumerate(lower):
        hw = hardware.tiers.get(tp.name)
        if hw is None:
            raise InputError(
                f"policy lists tier {tp.name!r} but hardware {hardware.name!r} has no "
                f"[tiers.{tp.name}] table"
            )
        cap_bytes = tp.capacity_gb * GB if tp.capacity_gb is not None else hw.capacity_bytes
        blocks = int(cap_bytes // block_bytes)
        if blocks < 1:
            raise InputError(f"tier {tp.name!r} of {cap_bytes / GB:g} GB holds no block")
        names.append(tp.name)
        evictions.append(tp.eviction)
        caps.append(blocks)
        per_host.append(hw.per_host)
        base.append(n_pools)
        pools = n_hosts if hw.per_host else 1
        n_pools += pools
        tier_gb[tp.name] = cap_bytes / GB * pools
        op_s.append(hw.op_overhead_s)
        lat_s.append(hw.latency_s)
        interleave = hw.interleave if tp.interleave is None else tp.interleave
        cap_bw.append(hw.device_bw if (hw.device_bw > 0 and not interleave) else math.inf)
        for h in range(n_hosts):
            port[t, h] = len(link_names)
            link_names.append(f"{tp.name}.port[{h}]")
            link_r.append(hw.port_read_bw)
            link_w.append(hw.port_write_bw)
            link_ops.append(1)
        if hw.pool_bw > 0:
            pool_link[t] = len(link_names)
            link_names.append(f"{tp.name}.pool")
            link_r.append(hw.pool_bw)
            link_w.append(hw.pool_bw)
            link_ops.append(0)
    return TierConfig(
        names=tuple(names),
        evictions=tuple(evictions),
        capacity_blocks=np.array(caps, dtype=np.int64),
        per_host=np.array(per_host, dtype=np.bool_),
        pool_base=np.array(base, dtype=np.int64),
        n_pools=n_pools,
        n_hosts=n_hosts,
        inst_host=inst_host,
        op_s=np.array(op_s, dtype=np.float64),
        lat_s=np.array(lat_s, dtype=np.float64),
        cap_bw=np.array(cap_bw, dtype=np.float64),
        link_bw_read=np.array(link_r, dtype=np.float64),
        link_bw_write=np.array(link_w, dtype=np.float64),
        link_ops=np.array(link_ops, dtype=np.int64),
        link_names=tuple(link_names),
        port_link=port,
        pool_link=pool_link,
        write_policy=WRITE_CODES[policy.write_policy],
        selective_k=policy.selective_k,
        exclusive=policy.hierarchy == "exclusive",
        cost_aware=LOAD_RULES.code(policy.load_rule) == COST_AWARE,
        batch_waits=policy.load_wait == "batch",
        fragments=fragments_per_block(model, policy.kv_layout),
        coalesce=policy.coalesce,
        block_bytes=block_bytes,
        tier_gb=tier_gb,
    )


def recompute_costs(
    block_offsets: np.ndarray,
    block_ids: np.ndarray,
    n_blocks: int,
    block_tokens: int,
    flops_per_token: float,
    attn_coef: float,
    compute_rate: float,
) -> np.ndarray:
    """GDSF's per-block cost (docs/design.md 4.3): the prefill seconds a cached block saves.

    Block ``j`` of a prompt costs ``B`` tokens of compute after ``j * B`` tokens of context
    (the compute term of the iteration time, ``kvtier.sim.transfer.prefill_estimate``), at
    the position where its id first appears in the trace (a chained id always sits at the same
    position). Every block has the same size, so GDSF's ``cost * freq / size`` needs no size.
    Computed once, in numpy, and handed to both engines.
    """
    costs = np.ones(max(n_blocks, 1), dtype=np.float64)
    refs = len(block_ids)
    if refs == 0:
        return costs
    req = np.repeat(np.arange(len(block_offsets) - 1), np.diff(block_offsets))
    pos = np.arange(refs, dtype=np.int64) - block_offsets[req]
    ids, first = np.unique(block_ids, return_index=True)
    q = block_tokens
    ctx = pos[first] * block_tokens
    costs[ids] = (flops_per_token * q + attn_coef * (q * (2 * ctx + q))) / compute_rate
    return costs
