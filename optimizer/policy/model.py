"""The ``Policy`` dataclass (what a deployment runs) and its TOML loader.

A policy is nested so that later parts can extend it without reshaping it: serving knobs live in
``serving``, cache tiers in the ``tiers`` list (issue 4 knows only ``hbm``), the optional SLO in
``slo``. Numbers default to what vLLM does on an H100 when nothing is set.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from optimizer.toml_fields import Table, read_toml

POLICY_FORMAT = "kvtier-policy/1"
ROUTERS = ("round_robin", "least_loaded", "prefix_affinity")
TIER_NAMES = ("hbm",)
EVICTIONS = ("lru",)
KV_DTYPES = ("bf16", "fp8", "int4")


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
    """One cache tier. Issue 4 has only ``hbm`` (its size follows from the hardware)."""

    name: str = "hbm"
    eviction: str = "lru"
    capacity_gb: float | None = None  # None: what the hardware leaves (HBM - weights - reserve)


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

    def __post_init__(self) -> None:
        if self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {self.block_tokens}")
        if self.kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {KV_DTYPES}, got {self.kv_dtype!r}")
        if not self.tiers or self.tiers[0].name != "hbm":
            raise ValueError("the first tier must be hbm")

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
    for tt in t.tables("tiers"):
        tiers.append(
            TierPolicy(
                name=tt.string("name", choices=TIER_NAMES),
                eviction=tt.string("eviction", "lru", choices=EVICTIONS),
                capacity_gb=tt.optional_number("capacity_gb"),
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
    )
    for key in ("hardware", "model"):
        t.used.add(key)
    # Sections later parts of kvtier fill in; accepted, not interpreted here.
    for key in ("metrics", "provenance"):
        t.used.add(key)
    t.done()
    return policy
