"""The ``Policy`` dataclass (what a deployment runs) and its TOML loader.

A policy is nested so that later parts can extend it without reshaping it: serving knobs live in
``serving``, cache tiers in the ``tiers`` list (``hbm`` first, then any of ``dram``, ``cxl``,
``rdma``, ``ssd``; a tier that is listed is on), the write / load / hierarchy rules at the top
level, the optional SLO in ``slo``. Numbers default to what vLLM does on an H100 when nothing is
set. ``policy_from_dict`` and ``policy_to_dict`` convert to and from the plain dict a policy file
holds, so an optimizer can overlay dotted parameters (``tiers.cxl.capacity_gb``) on a dict.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kvtier.toml_fields import Table, read_toml

POLICY_FORMAT = "kvtier-policy/1"
ROUTERS = ("round_robin", "least_loaded", "prefix_affinity")
TIER_NAMES = ("hbm", "dram", "cxl", "rdma", "ssd")
LOWER_TIERS = TIER_NAMES[1:]  # in lookup order: fastest path first
EVICTIONS = ("lru", "fifo", "lfu", "s3fifo", "sieve", "gdsf")  # the cache engine's policies
HBM_EVICTIONS = ("lru",)  # HBM is vLLM's block pool (LRU over unpinned blocks)
KV_DTYPES = ("bf16", "fp8", "int4")
WRITE_POLICIES = ("write_through", "write_back", "write_through_selective")
HIERARCHIES = ("inclusive", "exclusive")
LOAD_RULES = ("always_load", "cost_aware")
LOAD_WAITS = ("request", "batch")
KV_LAYOUTS = ("per_layer", "contiguous")


@dataclass(frozen=True)
class ServingPolicy:
    """Per-instance scheduler and the router in front of the instances."""

    instances: int | None = None  # None: every instance the hardware topology has
    routing: str = "round_robin"
    # vLLM's H100 API-server defaults (vllm/engine/arg_utils.py get_batch_defaults, V):
    max_num_batched_tokens: int = 8192  # token budget of one iteration (chunked prefill)
    max_num_seqs: int = 1024  # most requests running at once on one instance
    # prefix_affinity only: an instance with this many more requests than the least loaded one
    # is skipped, so one hot prefix cannot pile everything onto one GPU (assumption).
    affinity_overload: int = 8

    def __post_init__(self) -> None:
        if self.routing not in ROUTERS:
            raise ValueError(f"routing must be one of {ROUTERS}, got {self.routing!r}")
        if self.instances is not None and self.instances < 1:
            raise ValueError(f"instances must be >= 1, got {self.instances}")
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ValueError("max_num_batched_tokens and max_num_seqs must be >= 1")
        if self.affinity_overload < 0:
            raise ValueError("affinity_overload must be >= 0")


@dataclass(frozen=True)
class TierPolicy:
    """One cache tier: which one, its size and its eviction policy.

    ``capacity_gb`` is per instance for ``hbm`` (default: HBM - weights - reserve), per host for
    ``dram`` and ``ssd``, for the whole pool for ``cxl`` and ``rdma`` (default: the hardware
    profile's). ``interleave`` (cxl only) overrides the profile's device interleaving.
    """

    name: str = "hbm"
    eviction: str = "lru"
    capacity_gb: float | None = None
    interleave: bool | None = None

    def __post_init__(self) -> None:
        if self.name not in TIER_NAMES:
            raise ValueError(f"tier name must be one of {TIER_NAMES}, got {self.name!r}")
        if self.eviction not in EVICTIONS:
            raise ValueError(f"eviction must be one of {EVICTIONS}, got {self.eviction!r}")
        if self.name == "hbm" and self.eviction not in HBM_EVICTIONS:
            raise ValueError("the hbm tier evicts lru (vLLM's free queue)")
        if self.capacity_gb is not None and not self.capacity_gb > 0:
            raise ValueError(f"capacity_gb must be > 0, got {self.capacity_gb}")
        if self.interleave is not None and self.name != "cxl":
            raise ValueError("interleave applies to the cxl tier only")


@dataclass(frozen=True)
class SLO:
    """Service-level objective; every field optional. Latencies in seconds."""

    ttft_mean_s: float | None = None
    ttft_p99_s: float | None = None
    ttft_p999_s: float | None = None
    tpot_p99_s: float | None = None

    def is_empty(self) -> bool:
        return all(v is None for v in self.__dict__.values())


@dataclass(frozen=True)
class Policy:
    """Everything the simulator needs besides the trace and the hardware."""

    block_tokens: int = 16  # vLLM's default block size on CUDA (R)
    kv_dtype: str = "bf16"
    serving: ServingPolicy = field(default_factory=ServingPolicy)
    tiers: tuple[TierPolicy, ...] = (TierPolicy(),)
    slo: SLO | None = None
    hardware: str | None = None  # profile names, used when the CLI is not told otherwise
    model: str | None = None
    # Lower tiers (docs/design.md 4.3, 4.4); they matter only when a tier below hbm is listed.
    write_policy: str = "write_through"  # LMCache and Mooncake store every computed chunk
    selective_k: int = 2  # write_through_selective: sightings before a block is copied down
    hierarchy: str = "inclusive"
    load_rule: str = "always_load"
    # Who waits for a load from a lower tier: the loading request only (vLLM's KV-connector
    # design; LMCache with enable_async_loading), or the instance's whole batch (LMCache up to
    # 0.3.x by default: the retrieve runs before the forward pass), docs/model.md.
    load_wait: str = "request"
    kv_layout: str = "per_layer"  # vLLM's per-layer K and V tensors: 2 x layers fragments
    coalesce: int = 1  # fragments merged into one transfer operation
    share_across_tenants: bool = False

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {self.kv_dtype!r}")
        if not self.tiers or self.tiers[0].name != "hbm":
            raise ValueError("the first tier must be hbm")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names) or "hbm" in names[1:]:
            raise ValueError(f"each tier may appear once, hbm first, got {names}")
        for name, value, choices in (
            ("write_policy", self.write_policy, WRITE_POLICIES),
            ("hierarchy", self.hierarchy, HIERARCHIES),
            ("load_rule", self.load_rule, LOAD_RULES),
            ("load_wait", self.load_wait, LOAD_WAITS),
            ("kv_layout", self.kv_layout, KV_LAYOUTS),
        ):
            if value not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {value!r}")
        if self.selective_k < 1 or self.coalesce < 1:
            raise ValueError("selective_k and coalesce must be >= 1")

    def tier(self, name: str) -> TierPolicy | None:
        """The listed tier of that name, or None when it is off."""
        return next((t for t in self.tiers if t.name == name), None)

    @property
    def lower_tiers(self) -> tuple[TierPolicy, ...]:
        """Listed tiers below HBM, in lookup order (dram, cxl, rdma, ssd)."""
        return tuple(t for name in LOWER_TIERS if (t := self.tier(name)) is not None)

    def with_block_tokens(self, block_tokens: int) -> Policy:
        return replace(self, block_tokens=block_tokens)


def load_policy(path: str | Path) -> Policy:
    """Read and validate a policy TOML file; bad content raises :class:`InputError`."""
    path = Path(path)
    return policy_from_dict(read_toml(path), str(path))


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The policy as the plain dict a policy file holds (``policy_from_dict`` inverts it)."""
    data: dict[str, Any] = {
        "format": POLICY_FORMAT,
        "block_tokens": policy.block_tokens,
        "kv_dtype": policy.kv_dtype,
    }
    if policy.hardware is not None:
        data["hardware"] = policy.hardware
    if policy.model is not None:
        data["model"] = policy.model
    for key in (
        "write_policy",
        "selective_k",
        "hierarchy",
        "load_rule",
        "load_wait",
        "kv_layout",
        "coalesce",
        "share_across_tenants",
    ):
        data[key] = getattr(policy, key)
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
    defaults = ServingPolicy()
    serving = defaults
    st = t.table("serving")
    if st is not None:
        serving = ServingPolicy(
            instances=st.optional_integer("instances"),
            routing=st.string("routing", defaults.routing, choices=ROUTERS),
            max_num_batched_tokens=st.integer(
                "max_num_batched_tokens", defaults.max_num_batched_tokens
            ),
            max_num_seqs=st.integer("max_num_seqs", defaults.max_num_seqs),
            affinity_overload=st.integer(
                "affinity_overload", defaults.affinity_overload, minimum=0
            ),
        )
        st.done()
    tiers: list[TierPolicy] = []
    for i, tt in enumerate(t.tables("tiers")):
        name = tt.string("name", choices=TIER_NAMES)
        if any(x.name == name for x in tiers):
            raise tt.error(f"tiers[{i}].name", f"tier {name!r} is listed twice")
        interleave = None
        if tt.has("interleave"):
            if name != "cxl":
                raise tt.error(f"tiers[{i}].interleave", "applies to the cxl tier only")
            interleave = tt.boolean("interleave")
        tiers.append(
            TierPolicy(
                name=name,
                eviction=tt.string(
                    "eviction", "lru", choices=HBM_EVICTIONS if name == "hbm" else EVICTIONS
                ),
                capacity_gb=tt.optional_number("capacity_gb"),
                interleave=interleave,
            )
        )
        tt.done()
    if tiers and tiers[0].name != "hbm":
        raise t.error("tiers[0].name", "the first tier must be hbm")
    slo = None
    sl = t.table("slo")
    if sl is not None:
        slo = SLO(
            ttft_mean_s=sl.optional_number("ttft_mean_s"),
            ttft_p99_s=sl.optional_number("ttft_p99_s"),
            ttft_p999_s=sl.optional_number("ttft_p999_s"),
            tpot_p99_s=sl.optional_number("tpot_p99_s"),
        )
        sl.done()
    policy = Policy(
        block_tokens=t.integer("block_tokens", 16),
        kv_dtype=t.string("kv_dtype", "bf16", choices=KV_DTYPES),
        serving=serving,
        tiers=tuple(tiers) if tiers else (TierPolicy(),),
        slo=slo,
        hardware=t.string("hardware") if t.has("hardware") else None,
        model=t.string("model") if t.has("model") else None,
        write_policy=t.string("write_policy", "write_through", choices=WRITE_POLICIES),
        selective_k=t.integer("selective_k", 2),
        hierarchy=t.string("hierarchy", "inclusive", choices=HIERARCHIES),
        load_rule=t.string("load_rule", "always_load", choices=LOAD_RULES),
        load_wait=t.string("load_wait", "request", choices=LOAD_WAITS),
        kv_layout=t.string("kv_layout", "per_layer", choices=KV_LAYOUTS),
        coalesce=t.integer("coalesce", 1),
        share_across_tenants=t.boolean("share_across_tenants", False),
    )
    for key in ("hardware", "model"):
        t.used.add(key)
    # Sections later parts of kvtier fill in; accepted, not interpreted here.
    for key in ("metrics", "provenance"):
        t.used.add(key)
    t.done()
    return policy
