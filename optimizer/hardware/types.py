"""Frozen dataclasses for model, GPU and hardware profiles, and the KV geometry.

Profiles are data (TOML files with a source for every number); these types are what the rest
of kvtier sees after :mod:`kvtier.hardware.loader` has validated a file. Sizes are in bytes
and rates in bytes or FLOPs per second, so the simulator never converts units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvtier.tier_kinds import TIER_KINDS
from kvtier.tier_kinds import trait as tier_trait

GB = 1e9  # profiles give decimal gigabytes, as GPU data sheets do
GIB = float(2**30)  # what the CUDA runtime and the engines' logs count in

KV_DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0, "int4": 0.5}


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention: one compressed latent plus a RoPE key per token and layer."""

    kv_lora_rank: int
    rope_dim: int


@dataclass(frozen=True)
class MoE:
    """Routed experts: how many, how many a token activates, and their parameters in all."""

    experts: int  # routed experts per MoE layer
    active: int  # experts each token is routed to
    expert_params: float  # parameters of every routed expert of every MoE layer


@dataclass(frozen=True)
class ModelProfile:
    """Transformer shape and size: what sets KV bytes per token, FLOPs and weight bytes."""

    name: str
    layers: int
    attention_heads: int  # query heads, for attention FLOPs
    kv_heads: int
    head_dim: int
    params: float  # total parameters (weights held in HBM)
    active_params: float  # parameters used per token (MoE: the activated experts)
    weight_dtype_bytes: float
    mla: MLA | None = None
    source: str = ""
    hf_id: str = ""  # Hugging Face name (aiconfigurator-core's model id), "" if none
    moe: MoE | None = None
    hidden: int = 0  # hidden size (all-reduce message per token); 0: heads * head_dim
    # Sliding-window attention (gpt-oss: every other layer attends to the last 128 tokens):
    # ``sliding_window_layers`` of the ``layers`` see only the last ``sliding_window`` tokens;
    # 0 and 0: every layer attends to the whole context.
    sliding_window: int = 0
    sliding_window_layers: int = 0

    @property
    def hidden_size(self) -> int:
        return self.hidden or self.attention_heads * self.head_dim

    @property
    def full_attention_layers(self) -> int:
        """Layers whose attention (and KV) spans the whole context."""
        return self.layers - self.sliding_window_layers

    def kv_replication(self, tp: int) -> float:
        """How many copies of each token's KV an instance of ``tp`` GPUs holds: MLA latents
        are replicated on every rank, and GQA KV heads once ``tp`` exceeds their number."""
        if self.mla is not None:
            return float(tp)
        return max(1.0, tp / self.kv_heads)

    def kv_bytes_per_token(self, kv_dtype: str = "bf16", *, window_bounded: bool = True) -> int:
        """KV-cache bytes per token of context (docs/design.md 4.5, docs/model.md).

        ``2 * layers * kv_heads * head_dim * dtype_bytes`` (a K and a V vector per KV head), or
        for MLA models ``layers * (kv_lora_rank + rope_dim) * dtype_bytes`` (one latent).
        Rounded up to whole bytes, which only matters for int4.

        With sliding-window layers and ``window_bounded`` (vLLM's hybrid KV cache manager,
        on by default), only the full-attention layers hold KV for every token: a
        sliding-window layer keeps at most its window per request, a constant that does not
        grow with the context and is left out. ``window_bounded=False``: every layer keeps
        the whole context (vLLM with the hybrid manager turned off, as it did with a KV
        connector that does not support it).
        """
        dtype_bytes = KV_DTYPE_BYTES[kv_dtype]
        layers = self.full_attention_layers if window_bounded else self.layers
        if self.mla is not None:
            per_layer = self.mla.kv_lora_rank + self.mla.rope_dim
            return math.ceil(layers * per_layer * dtype_bytes)
        return math.ceil(2 * layers * self.kv_heads * self.head_dim * dtype_bytes)

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights of one replica."""
        return self.params * self.weight_dtype_bytes


@dataclass(frozen=True)
class GPUProfile:
    """One accelerator's memory, bandwidths, dense BF16 throughput and rental price."""

    name: str
    hbm_bytes: float
    hbm_bw: float  # bytes/s
    peak_flops: float  # dense BF16 FLOP/s
    pcie_bw: float  # bytes/s, host link of one GPU
    price_per_hour: float  # $ per GPU-hour
    source: str = ""
    fp8_flops: float = 0.0  # dense FP8 FLOP/s (0: no FP8 tensor cores)
    nvlink_bw: float = 0.0  # bytes/s per GPU, one direction (0: no NVLink; PCIe is used)
    nvlink_latency_s: float = 0.0  # one all-reduce step's latency
    # power (kvtier.sim.energy): the board's rated power and its draw with nothing to run;
    # a GPU draws idle_w + (tdp_w - idle_w) x its busy share. Defaults: an H100 SXM's
    # (docs/sources.md [Power-2026]).
    tdp_w: float = 700.0
    idle_w: float = 80.0
    # high-bandwidth flash beside the GPU (HBF: NAND stacked as HBM is, read-optimised),
    # bytes and read bytes/s per GPU (0: none); a deployment may keep its weights there
    # (``serving.weights_in_hbf``), freeing their HBM for KV blocks
    hbf_bytes: float = 0.0
    hbf_bw: float = 0.0
    # how much longer compute-bound kernels take at the board's power limit than in the short
    # bursts the measured tables timed, for BF16 and for FP8 tensor-core work (the measured
    # backend's compute-bound share of a step is scaled by it: kvtier.sim.steptime.sustained;
    # 1: not known, no change)
    sustained_compute_scale: float = 1.0
    sustained_compute_scale_fp8: float = 1.0
    # the memory the CUDA runtime reports (``torch.cuda.mem_get_info``'s total), which a serving
    # engine sizes its KV budget from: below the data sheet's figure (an H100's "80 GB" is
    # 79.22 GiB to vLLM); 0: not measured, the data sheet's ``hbm_bytes`` stands in
    hbm_visible_bytes: float = 0.0

    @property
    def engine_hbm_bytes(self) -> float:
        """The HBM a serving engine sizes its KV budget from: the runtime's figure where it
        was measured, else the data sheet's."""
        return self.hbm_visible_bytes or self.hbm_bytes


@dataclass(frozen=True)
class Topology:
    """``hosts x gpus_per_host`` GPUs, cut into instances of ``tp`` GPUs (one replica each)."""

    hosts: int
    gpus_per_host: int
    tp: int
    # How a host is built (docs/model.md, "Host topology"): GPUs behind one PCIe switch share
    # its uplink to the CPU (1: a switch per GPU, no sharing; ``switch_uplink_bw`` 0: not
    # modelled); host DRAM bandwidth, which staging copies draw on (0: not modelled); one
    # staging copy's memcpy rate, and the rate when the buffer sits on the other socket.
    gpus_per_switch: int = 1
    switch_uplink_bw: float = 0.0
    dram_bw: float = 0.0
    sockets: int = 1
    memcpy_bw: float = 10e9
    numa_remote_memcpy_bw: float = 0.0  # 0: as memcpy_bw

    @property
    def gpus(self) -> int:
        return self.hosts * self.gpus_per_host

    @property
    def max_instances(self) -> int:
        return self.gpus // self.tp


@dataclass(frozen=True)
class Efficiency:
    """How far below the data sheet a real serving stack runs (docs/design.md 4.2)."""

    mfu: float  # share of peak FLOPs reached (compute-bound work)
    mbu: float  # share of peak HBM bandwidth reached (memory-bound work)
    step_overhead_s: float  # fixed seconds per scheduler iteration
    decode_mfu: float = 0.0  # compute share reached by decode batches (0: as mfu)
    # the measured backend's tables against this cluster's step times, fitted by ``kvtier
    # calibrate --backend measured`` (1: the tables as they are; docs/calibrate.md): the
    # memory-bound work (decode attention, the weight reads of small batches) and the
    # compute-bound work (long prefills) of a step, each scaled by its own factor
    measured_memory_scale: float = 1.0
    measured_compute_scale: float = 1.0


# The memory tiers below HBM a hardware profile may offer, in the order a request looks them up
# (fastest path first); policies list them by the same names. The registry is the one list
# (kvtier.tier_kinds), plug-in kinds included.
LOWER_TIERS = TIER_KINDS.names


@dataclass(frozen=True)
class Power:
    """What the whole deployment draws beyond its GPUs and tiers, and what energy costs.

    ``host_w``: each occupied host's CPUs, fans, board and NVSwitches (its NICs, DRAM and
    drives are the tiers'); ``pue``: facility power over IT power (cooling, power
    conversion); ``electricity_per_kwh``: $ per kWh at the meter, charged on the replay's
    energy (0: the prices already include power, as the built-in all-in prices do).
    """

    host_w: float = 1500.0
    pue: float = 1.2
    electricity_per_kwh: float = 0.0


@dataclass(frozen=True)
class TierHardware:
    """The memory below HBM of one kind (``dram``, ``cxl``, ``rdma``, ``ssd``) and its path.

    ``capacity_bytes`` is per pool: per host for ``dram``, ``ssd`` and a CXL expander (``shared =
    false``), for the whole pool for a shared ``cxl`` and
    ``rdma``. ``port_read_bw`` / ``port_write_bw`` are one host's access link to the tier
    (its CXL adapters together, its NICs together, its NVMe drives, its DRAM channels); every
    transfer also crosses the GPU's PCIe link. A pooled tier may add one link shared by all
    hosts (``pool_bw``, 0 = none) and, when data is not interleaved over the pool's
    ``devices``, one queue per memory device at ``device_bw``, which also caps a transfer.
    ``op_overhead_s`` is paid per transfer operation (one fragment, or ``coalesce``
    fragments), ``latency_s`` once per transfer. ``price_per_gb_hour`` prices the tier's capacity.
    """

    name: str
    capacity_bytes: float
    port_read_bw: float
    port_write_bw: float
    op_overhead_s: float
    latency_s: float
    pool_bw: float = 0.0
    device_bw: float = 0.0
    devices: int = 1
    interleave: bool = True
    price_per_gb_hour: float = 0.0
    # $ per occupied host-hour of the fabric this tier needs (CXL adapters and switch share,
    # RDMA NICs and switch ports), charged only when the tier is used
    fabric_per_host_hour: float = 0.0
    shared: bool | None = None  # None: cxl and rdma are shared pools, dram and ssd per host
    # ``ports`` access links per host (NICs, CXL adapters, drives), ``port_read_bw`` /
    # ``port_write_bw`` being their sum; ``attach = "gpu"``: each GPU uses the port beside it
    # (HGX: one NIC per GPU), ``"host"``: the host's transfers share the ports as one link.
    ports: int = 1
    attach: str = "host"
    # a kind with the ``gpu_link`` trait (NVLink-C2C memory, GPU-attached CXL): bytes/s of
    # the link each GPU reaches it over instead of its PCIe link (0: over PCIe)
    gpu_link_bw: float = 0.0
    # SSD endurance: drive writes per day over the warranty, drives per pool, $ per drive
    # (0: not rated); the replay reports DWPD at the trace's rate and charges wear.
    dwpd: float = 0.0
    drives: int = 1
    drive_price: float = 0.0
    warranty_years: float = 5.0
    # power (kvtier.sim.energy; defaults: the tier kind's power trait, kvtier.tier_kinds):
    # watts per GB of capacity held, picojoules per bit moved (read or written: the memory
    # access and the path's links), watts per occupied host (its NICs, adapters, drives),
    # watts per pool (a shared pool's switch and chassis; per host for a per-host tier)
    w_per_gb: float = 0.0
    pj_per_bit: float = 0.0
    host_w: float = 0.0
    pool_w: float = 0.0

    @property
    def per_host(self) -> bool:
        """One pool per host (dram, ssd, a CXL expander) or one shared by every host."""
        if self.shared is not None:
            return not self.shared
        return tier_trait(self.name, "per_host")


@dataclass(frozen=True)
class Hardware:
    """A deployment: GPU type, topology, efficiency factors, memory reserve and prices."""

    name: str
    gpu: GPUProfile
    topology: Topology
    efficiency: Efficiency
    gpu_memory_utilization: float  # share of HBM the serving engine manages
    activation_reserve_bytes: float  # per GPU, kept for activations
    host_fixed_per_hour: float  # $ per host-hour for NICs, adapters, switch share
    source: str = ""
    tiers: dict[str, TierHardware] = field(default_factory=dict)
    power: Power = field(default_factory=Power)
    # a disaggregated deployment's prefill instances run on this GPU type (Rubin CPX prefill
    # beside Rubin decode, H100 beside H200); None: every instance on ``gpu``. An aggregated
    # deployment runs on ``gpu`` alone.
    prefill_gpu: GPUProfile | None = None
    # the deployment keeps the weights in the GPUs' HBF (serving.weights_in_hbf): they take
    # no HBM and are read at the HBF's rate (kvtier.deploy.apply)
    weights_in_hbf: bool = False
    # TensorRT-LLM's share of the memory left free after the weights and the rest for its KV
    # cache (KvCacheConfig.free_gpu_memory_fraction, default 0.9: docs/sources.md
    # [TRT-LLM-kv-budget]); vLLM and SGLang take gpu_memory_utilization of the whole instead
    free_gpu_memory_fraction: float = 0.9

    def gpu_of(self, k: int, n_prefill: int) -> GPUProfile:
        """The GPU type of instance ``k`` when the first ``n_prefill`` instances prefill."""
        if k < n_prefill and self.prefill_gpu is not None:
            return self.prefill_gpu
        return self.gpu

    def kv_capacity_bytes(
        self,
        model: ModelProfile,
        tp: int | None = None,
        *,
        framework: str = "vllm",
        non_kv_bytes: float | None = None,
    ) -> float:
        """HBM bytes left for KV blocks in one instance (``tp`` GPUs, default the topology's),
        each GPU's budget as ``framework`` sizes it from the memory the CUDA runtime reports
        (:attr:`GPUProfile.engine_hbm_bytes`; docs/model.md, "The KV budget"):

        - vLLM and SGLang: ``gpu_memory_utilization`` of that memory, less the weights and the
          rest that is not KV (vLLM's ``determine_available_memory``);
        - TensorRT-LLM: ``free_gpu_memory_fraction`` of what the weights and the rest leave
          free (its ``KvCacheConfig``).

        ``non_kv_bytes``: per GPU, what the engine holds besides the weights and KV
        (activations, runtime, communication buffers; :mod:`kvtier.deploy.kv_budget` reads it
        from aiconfigurator-core's memory model), default the profile's
        ``activation_reserve_bytes``. Weights split evenly over the GPUs, as tensor
        parallelism does; none in HBM when they are in HBF.
        """
        tp = self.topology.tp if tp is None else tp
        reserve = self.activation_reserve_bytes if non_kv_bytes is None else non_kv_bytes
        weights = 0.0 if self.weights_in_hbf else model.weight_bytes / tp
        hbm = self.gpu.engine_hbm_bytes
        if framework == "trtllm":
            per_gpu = self.free_gpu_memory_fraction * (hbm - weights - reserve)
        else:
            per_gpu = hbm * self.gpu_memory_utilization - weights - reserve
        return tp * per_gpu

    def cost_per_hour(
        self,
        instances: int,
        tier_gb: dict[str, float] | None = None,
        *,
        gpus: int | None = None,
        hosts: int | None = None,
        prefill_gpus: int = 0,
    ) -> float:
        """Dollars per hour for ``instances`` replicas: their GPUs plus the hosts they occupy
        (``gpus`` / ``hosts`` when given, as a layout of pools of two tensor-parallel sizes
        counts them, :class:`kvtier.deploy.layout.Layout`); ``prefill_gpus`` of them are
        ``prefill_gpu``'s, at its price.

        ``tier_gb`` adds lower tiers: total GB of each (all hosts' DRAM, the whole pool) at
        the profile's all-in price per GB-hour, plus the fabric each needs on every occupied
        host (``fabric_per_host_hour``: CXL adapters only with a CXL tier, RDMA NICs only with
        an RDMA pool), docs/design.md 4.6 and docs/sources.md [Prices-2026].
        """
        gpus = instances * self.topology.tp if gpus is None else gpus
        hosts = -(-gpus // self.topology.gpus_per_host) if hosts is None else hosts
        cost = gpus * self.gpu.price_per_hour + hosts * self.host_fixed_per_hour
        if prefill_gpus and self.prefill_gpu is not None:
            cost += prefill_gpus * (self.prefill_gpu.price_per_hour - self.gpu.price_per_hour)
        for name, gb in (tier_gb or {}).items():
            tier = self.tiers[name]
            cost += gb * tier.price_per_gb_hour + hosts * tier.fabric_per_host_hour
        return cost
