"""``TierConfig``: the tiers below HBM, their pools, connectors and links, as arrays.

Derived once from the hardware profile and the policy (docs/design.md 4.1, 4.4; docs/model.md,
"Transfer paths" and "Host topology") so that both simulators read the same numbers. Pools: a
per-host tier (``dram``, ``ssd``) has one pool per host, a shared tier (``cxl``, ``rdma``) one
pool; pool ``pool_base[t] + p``. Links, each a FIFO server per direction when full duplex:

- ``k`` for ``k < n_instances``: instance ``k``'s PCIe link (``tp`` GPUs' links together);
- a PCIe switch's uplink, shared by the GPUs behind it (``topology.gpus_per_switch``);
- tier ``t``'s ports: one per host, or ``ports`` per host with each GPU on its own
  (``attach = "gpu"``: one NIC per GPU on HGX-class hosts);
- a pooled tier's aggregate bandwidth shared by every host;
- each host's DRAM bandwidth, which staging copies draw on (half duplex: reads and writes);
- a ``gpu_link`` tier's own link per instance (NVLink-C2C, a CXL port on the GPU), which
  takes the place of the instance's PCIe link and switch uplink on the paths to that tier.

Each instance reaches tier ``t`` by the precomputed path ``gpu_path[t, k]`` (``MAX_PATH``
links, -1 unused; ``gpu_scale[t]`` the bytes each carries per byte moved), a cascade from tier
``t`` to ``t + 1`` by ``casc_path[t, k]``. The connector of tier ``t`` (its transfer path,
:data:`kvtier.policy.registries.CONNECTORS`) gives the per-operation worker cost and the
ordering that :func:`kvtier.sim.transfer.path_transfer` applies; its workers are
``wfree[w0[t, k]:w0[t, k] + nw[t]]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kvtier.deploy.layout import Layout
from kvtier.errors import InputError
from kvtier.files import check_allocation
from kvtier.hardware.types import GB, Hardware, ModelProfile, TierHardware, Topology
from kvtier.policy.model import Policy, TierPolicy
from kvtier.policy.registries import (
    CONNECTORS,
    LOAD_RULES,
    UNITS,
    WRITE_POLICIES,
)
from kvtier.sim.transfer import device_link
from kvtier.tier_kinds import trait as tier_trait

# Write-policy codes come from their registry (the kernels import the constants from there).
WRITE_CODES = WRITE_POLICIES.codes  # {name: code}
MAX_PATH = 5  # links on the longest path: pcie, switch uplink, port, pool, host DRAM
STAGES = ("rpc", "stream", "staging", "links")  # stage seconds counted per tier


@dataclass(frozen=True, eq=False)
class TierConfig:
    """Lower tiers of one replay; arrays are indexed by tier ``t`` (lookup order) or link."""

    names: tuple[str, ...]
    evictions: tuple[str, ...]
    connectors: tuple[str, ...]
    capacity_blocks: np.ndarray  # int64 (T,), per pool
    per_host: np.ndarray  # bool (T,)
    pool_base: np.ndarray  # int64 (T,)
    n_pools: int
    # pools per tier (1 shared, one per host, or one per engine) and the pool of each tier
    # each instance reaches, counted from the tier's first (``pool_base``)
    pool_count: np.ndarray  # int64 (T,)
    pool_local: np.ndarray  # int64 (T, n_instances)
    n_hosts: int
    inst_host: np.ndarray  # int64 (n_instances,)
    lat_s: np.ndarray  # float64 (T,) seconds per transfer
    cap_bw: np.ndarray  # float64 (T,) per-transfer cap (one CXL device), inf when none
    rpc_s: np.ndarray  # float64 (T,) worker seconds per operation
    # an instance's transfer rate through the store's streams and the staging copies: one
    # worker's rate times the instance's tensor-parallel ranks, each moving its own shard
    stream_bw: np.ndarray  # float64 (T, n_instances), inf when none
    stage_bw: np.ndarray  # float64 (T, n_instances) memcpy rate / staging copies, inf: none
    serial: np.ndarray  # int64 (T,) 1: serial, 0: pipelined
    depth: np.ndarray  # int64 (T,) operations in flight when pipelined
    unit: np.ndarray  # int64 (T,) UNIT_* of one operation
    layerwise: np.ndarray  # bool (T,) loads overlap the first layers' compute
    store_blocks: np.ndarray  # bool (T,) the engine step waits for its copies into the tier
    w0: np.ndarray  # int64 (T, n_instances) first worker of the pool instance k uses
    nw: np.ndarray  # int64 (T,) workers in that pool
    n_workers: int
    link_bw_read: np.ndarray  # float64 (L,)
    link_bw_write: np.ndarray  # float64 (L,)
    link_duplex: np.ndarray  # int64 (L,) 1: reads and writes queue apart
    link_names: tuple[str, ...]
    gpu_path: np.ndarray  # int64 (T, n_instances, MAX_PATH)
    gpu_scale: np.ndarray  # float64 (T, MAX_PATH)
    casc_path: np.ndarray  # int64 (T, n_instances, MAX_PATH): tier t to t + 1
    casc_scale: np.ndarray  # float64 (T, MAX_PATH)
    write_policy: int  # the write policy's registry code (kvtier.sim.write_policies)
    selective_k: int
    exclusive: bool
    load_rule: int  # the load rule's registry code (kvtier.sim.load_rules)
    batch_waits: bool  # policy load_wait = "batch": no iteration while a request loads
    fragments: int  # fragments per block (KV layout)
    coalesce: int
    layers: int  # model layers (layer-wise loading)
    block_bytes: float
    tier_gb: dict[str, float]  # total GB of each tier over all its pools (for cost)
    # bool (T,): a finished request's full blocks of generated tokens are copied into the tier
    # (the connector's ``store_generated``); None: into no tier
    store_generated: np.ndarray | None = None
    # a request whose lower-tier hits another request of its instance is loading waits for
    # that load (any tier's connector's ``defer_loading_hits``; docs/model.md, "Hits another
    # request is loading")
    defer_loading_hits: bool = False
    # a request's HBM hits make their copies in the first lower tier recent at its admission
    # (that tier's connector's ``touches_prompt``: vLLM's OffloadingConnector; docs/model.md,
    # "One access time for HBM and the host tier")
    touches_prompt: bool = False
    # each attention group's copy of a block is an entry of its own in the lower tiers, and a
    # sliding-window group's copies are made recent only in the window before a hit's end
    # (the first tier's connector's ``group_entries``: vLLM's OffloadingConnector under the
    # hybrid KV cache manager; SimConfig.tier_window says when it applies; docs/model.md,
    # "Sliding-window copies in the lower tiers")
    group_entries: bool = False
    # bool (T,): a block loaded from the tier is also made resident in every tier above it
    # that the instance reaches (the connector's ``load_fills_upper``: SGLang HiCache's storage
    # prefetch lands in the host pool); None: in no tier
    load_fills_upper: np.ndarray | None = None
    # bool (T,): a request's hits in the tier are read into the tiers above it when the request
    # arrives, and it waits in its queue until they are there (the connector's
    # ``prefetch_at_arrival``: SGLang HiCache's storage prefetch, wait_complete); None: none
    prefetch_at_arrival: np.ndarray | None = None
    # memory devices of a pool whose data is not interleaved over them (docs/model.md, "Host
    # topology"): each a queue of its own (a link, ``device_link0[pool] + d``), the blocks
    # ``device_blocks[t]`` a device holds, ``devices[t]`` of them; device_blocks 0 (or None):
    # the tier's transfers cross no device queue
    device_blocks: np.ndarray | None = None  # int64 (T,)
    devices: np.ndarray | None = None  # int64 (T,)
    device_link0: np.ndarray | None = None  # int64 (n_pools,), -1 where none
    # bool (T,): a lookup finds a copy in the tier only once its store has ended (the tier's
    # ``visible_when_stored``, else its connector's: vLLM 0.19.1's CPU manager, LMCache
    # 0.5.6's disk back end; docs/model.md, "A copy is found once stored"); None: in no tier
    visible_when_stored: np.ndarray | None = None
    # float64 (T,): the share of a pool's capacity above which it evicts a batch, and the
    # least share of its blocks a batch evicts (the tier's ``eviction_high_watermark`` and
    # ``eviction_ratio``: Mooncake Store's master; kvtier.cache.watermark); None: no tier
    # sheds (each evicts one block per insertion once full)
    evict_high: np.ndarray | None = None
    evict_ratio: np.ndarray | None = None

    def shed_rules(self) -> tuple[np.ndarray, np.ndarray]:
        """``evict_high`` and ``evict_ratio``, 1 and 0 (no batch) where unset."""
        T = self.n_tiers
        high = np.ones(T) if self.evict_high is None else self.evict_high
        ratio = np.zeros(T) if self.evict_ratio is None else self.evict_ratio
        return (
            np.ascontiguousarray(high, dtype=np.float64),
            np.ascontiguousarray(ratio, dtype=np.float64),
        )

    def when_stored_flags(self) -> np.ndarray:
        """``visible_when_stored``, all False where unset."""
        if self.visible_when_stored is None:
            return np.zeros(len(self.names), dtype=np.bool_)
        return np.asarray(self.visible_when_stored, dtype=np.bool_)

    def device_queues(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(device_blocks, devices, device_link0)``, zeros / ones / -1 where unset."""
        T = len(self.names)
        blocks = self.device_blocks if self.device_blocks is not None else np.zeros(T, np.int64)
        devs = self.devices if self.devices is not None else np.ones(T, np.int64)
        link0 = (
            self.device_link0 if self.device_link0 is not None
            else np.full(self.n_pools, -1, np.int64)
        )  # fmt: skip
        return blocks, devs, link0

    def device_of(self, t: int, pool: int, first: int) -> int:
        """The device link of a transfer of tier ``t``'s ``pool`` starting at block ``first``
        (:func:`kvtier.sim.transfer.device_link`; -1: none)."""
        blocks, devs, link0 = self.device_queues()
        return device_link(first, int(blocks[t]), int(devs[t]), int(link0[pool]))

    @property
    def prefetches(self) -> bool:
        """Does any tier prefetch at arrival?"""
        return self.prefetch_at_arrival is not None and bool(np.any(self.prefetch_at_arrival))

    @property
    def stores_generated(self) -> bool:
        """Does any tier take a finished request's generated blocks?"""
        return self.store_generated is not None and bool(np.any(self.store_generated))

    @property
    def n_tiers(self) -> int:
        return len(self.names)

    @property
    def cascade(self) -> bool:
        """The write policy's ``cascade`` trait: evicted blocks go to the next tier down."""
        return bool(WRITE_POLICIES.by_code(self.write_policy).traits["cascade"])

    @property
    def counts_sightings(self) -> bool:
        """The write policy's ``sightings`` trait: admissions count each block's sightings."""
        return bool(WRITE_POLICIES.by_code(self.write_policy).traits["sightings"])

    @property
    def n_links(self) -> int:
        return len(self.link_names)

    def pool_of(self, t: int, inst: int) -> int:
        """The pool of tier ``t`` that instance ``inst`` reaches."""
        return int(self.pool_base[t] + self.pool_local[t, inst])


def fragments_per_block(model: ModelProfile, kv_layout: str) -> int:
    """Separate memory regions one block occupies: a K and a V tensor per layer in vLLM's
    layout (one latent per layer for MLA), or one for a contiguous chunk (docs/design.md 4.4)."""
    if kv_layout == "contiguous":
        return 1
    return model.layers * (1 if model.mla is not None else 2)


class _Links:
    """Links as they are added: names, bandwidths, duplex flags."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.read: list[float] = []
        self.write: list[float] = []
        self.duplex: list[int] = []

    def add(self, name: str, read: float, write: float, duplex: bool = True) -> int:
        self.names.append(name)
        self.read.append(read)
        self.write.append(write)
        self.duplex.append(int(duplex))
        return len(self.names) - 1


@dataclass
class _Placement:
    """Where the instances sit: each one's first GPU, tensor-parallel size, host and first GPU
    within its host."""

    gpu0: np.ndarray
    tps: np.ndarray
    inst_host: np.ndarray
    local: np.ndarray
    n_hosts: int
    n_prefill: int = 0  # the first n_prefill instances prefill (their GPU type may differ)

    @classmethod
    def of(cls, topo: Topology, n_instances: int, layout: Layout | None) -> _Placement:
        if layout is not None:
            gpu0 = np.array(layout.first_gpu, dtype=np.int64)
            tps = np.array(layout.tps, dtype=np.int64)
        else:
            gpu0 = np.array([k * topo.tp for k in range(n_instances)], dtype=np.int64)
            tps = np.full(n_instances, topo.tp, dtype=np.int64)
        inst_host = gpu0 // topo.gpus_per_host
        local = gpu0 % topo.gpus_per_host  # first GPU of the instance within its host
        n_prefill = layout.n_prefill if layout is not None else 0
        return cls(gpu0, tps, inst_host, local, int(inst_host.max()) + 1, n_prefill)


@dataclass
class _HostLinks:
    """The links every tier's path shares: each instance's PCIe, its PCIe switch's uplink
    (-1: none), each host's memory bus (-1: none), and each instance's socket."""

    pcie: list[int]
    switch: np.ndarray
    membus: np.ndarray
    socket: np.ndarray


def _host_links(links: _Links, hardware: Hardware, at: _Placement) -> _HostLinks:
    topo = hardware.topology
    n_instances = len(at.gpu0)
    pcie_bw = [int(at.tps[k]) * hardware.gpu_of(k, at.n_prefill).pcie_bw
               for k in range(n_instances)]  # fmt: skip
    pcie = [links.add(f"pcie[{k}]", pcie_bw[k], pcie_bw[k]) for k in range(n_instances)]
    switch = np.full(n_instances, -1, dtype=np.int64)
    if topo.switch_uplink_bw > 0:
        ids: dict[tuple[int, int], int] = {}
        for k in range(n_instances):
            key = (int(at.inst_host[k]), int(at.local[k]) // topo.gpus_per_switch)
            if key not in ids:
                bw = topo.switch_uplink_bw
                ids[key] = links.add(f"switch[{key[0]}.{key[1]}]", bw, bw)
            switch[k] = ids[key]
    membus = np.full(at.n_hosts, -1, dtype=np.int64)
    if topo.dram_bw > 0:
        for h in range(at.n_hosts):
            membus[h] = links.add(f"dram.bus[{h}]", topo.dram_bw, topo.dram_bw, duplex=False)
    socket = at.local * topo.sockets // topo.gpus_per_host
    return _HostLinks(pcie, switch, membus, socket)


class _TierColumns:
    """The per-tier columns of a :class:`TierConfig`, filled one tier at a time."""

    def __init__(self, n_tiers: int, n_instances: int) -> None:
        T = n_tiers
        self.names: list[str] = []
        self.evictions: list[str] = []
        self.connectors: list[str] = []
        self.caps: list[int] = []
        self.per_host: list[bool] = []
        self.base: list[int] = []
        self.pool_count: list[int] = []
        self.pool_local = np.zeros((T, n_instances), dtype=np.int64)
        self.lat_s: list[float] = []
        self.cap_bw: list[float] = []
        self.rpc_s: list[float] = []
        self.serial: list[int] = []
        self.depth: list[int] = []
        self.unit: list[int] = []
        self.layerwise: list[bool] = []
        self.blocks_step: list[bool] = []
        self.gen_step: list[bool] = []
        self.defer: list[bool] = []
        self.fills: list[bool] = []
        self.touch: list[bool] = []
        self.groups: list[bool] = []
        self.prefetch: list[bool] = []
        self.when_stored: list[bool] = []
        self.evict_high: list[float] = []
        self.evict_ratio: list[float] = []
        self.stream_bw = np.full((T, n_instances), math.inf)
        self.stage_bw = np.full((T, n_instances), math.inf)
        self.port = np.full((T, n_instances), -1, dtype=np.int64)
        self.pool_link = np.full(T, -1, dtype=np.int64)
        self.w0 = np.zeros((T, n_instances), dtype=np.int64)
        self.nw = np.zeros(T, dtype=np.int64)
        self.via_host = np.zeros(T, dtype=np.bool_)
        # a tier on each GPU's own link (NVLink-C2C, GPU-attached CXL): that link per
        # instance, in place of its PCIe link and switch uplink; -1: over PCIe
        self.own_link = np.full((T, n_instances), -1, dtype=np.int64)
        self.staging = np.zeros(T, dtype=np.int64)
        self.dev_blocks = np.zeros(T, dtype=np.int64)
        self.devices = np.ones(T, dtype=np.int64)
        self.dev_link0: list[int] = []  # per pool
        self.n_workers = 0
        self.n_pools = 0
        self.tier_gb: dict[str, float] = {}

    def add_tier(
        self, tp: TierPolicy, hw: TierHardware, block_bytes: float, at: _Placement
    ) -> None:
        """The tier's pools, capacity in blocks, latency and device bandwidth."""
        cap_bytes = tp.capacity_gb * GB if tp.capacity_gb is not None else hw.capacity_bytes
        t = len(self.names)
        per_engine = (
            tp.per_engine if tp.per_engine is not None else tier_trait(tp.name, "per_engine")
        )
        if hw.per_host and per_engine:
            # each engine's own pool: the host's capacity split evenly over the engines of the
            # fullest host (the share an export gives each engine, kvtier.export.common)
            pools = len(at.inst_host)
            share = cap_bytes / int(np.bincount(at.inst_host).max())
            self.pool_local[t] = np.arange(pools)
        elif hw.per_host:
            pools, share = at.n_hosts, cap_bytes
            self.pool_local[t] = at.inst_host
        else:
            pools, share = 1, cap_bytes
        blocks = int(share // block_bytes)
        if blocks < 1:
            raise InputError(f"tier {tp.name!r} of {share / GB:g} GB per pool holds no block")
        self.names.append(tp.name)
        self.evictions.append(tp.eviction)
        high = tp.eviction_high_watermark
        self.evict_high.append(1.0 if high is None else float(high))
        self.evict_ratio.append(float(tp.eviction_ratio or 0.0))
        self.connectors.append(tp.connector)
        self.caps.append(blocks)
        self.per_host.append(hw.per_host)
        self.base.append(self.n_pools)
        self.pool_count.append(pools)
        self.n_pools += pools
        # the memory bought: the pool, or each host's (an engine's share is part of its host's)
        self.tier_gb[tp.name] = cap_bytes / GB * (at.n_hosts if hw.per_host else 1)
        self.lat_s.append(hw.latency_s)
        interleave = hw.interleave if tp.interleave is None else tp.interleave
        queued = hw.device_bw > 0 and not interleave
        self.cap_bw.append(hw.device_bw if queued else math.inf)
        if queued and hw.devices > 1:
            # the hardware's devices, each its share of the whole pool (the policy may use
            # less of it: a non-interleaved allocator then fills the first devices)
            self.dev_blocks[t] = max(int(hw.capacity_bytes / hw.devices // block_bytes), 1)
            self.devices[t] = hw.devices

    def add_connector(
        self, t: int, tp: TierPolicy, hw: TierHardware, topo: Topology, at: _Placement,
        host: _HostLinks,
    ) -> None:  # fmt: skip
        """Tier ``t``'s transfer path (the connector registry's entry): its stages, ordering,
        staging copies and workers."""
        d = CONNECTORS.get(tp.connector, path=f"tiers.{tp.name}.connector").defaults
        rpc = float(d["rpc_us"])
        self.rpc_s.append(hw.op_overhead_s if rpc < 0 else rpc * 1e-6)
        self.serial.append(1 if d["order"] == "serial" else 0)
        self.depth.append(int(tp.depth if tp.depth is not None else d["depth"]))
        self.unit.append(UNITS.index(str(d["unit"])))
        self.layerwise.append(bool(tp.layerwise if tp.layerwise is not None else d["layerwise"]))
        store = tp.store_blocks if tp.store_blocks is not None else d["store_blocks"]
        self.blocks_step.append(bool(store))
        gen = tp.store_generated if tp.store_generated is not None else d["store_generated"]
        self.gen_step.append(bool(gen))
        defer = tp.defer_loading_hits
        self.defer.append(bool(d["defer_loading_hits"] if defer is None else defer))
        self.fills.append(bool(d["load_fills_upper"]))
        self.touch.append(bool(d["touches_prompt"]))
        self.groups.append(bool(d["group_entries"]))
        self.prefetch.append(bool(d["prefetch_at_arrival"]))
        vws = tp.visible_when_stored
        self.when_stored.append(bool(d["visible_when_stored"] if vws is None else vws))
        self.via_host[t] = bool(d["via_host"])
        self.staging[t] = int(d["staging"])
        n_instances = len(at.gpu0)
        # Every tensor-parallel rank runs the connector's worker side on its own shard of each
        # block (LMCache builds one engine per rank, its KV shape with the rank's share of the
        # KV heads, keyed by worker_id = rank: [LMCache-0.5.6-wheel] integration/vllm/utils.py;
        # vLLM's connectors run in every worker): an operation's per-call cost is paid by all
        # ranks at once, its bytes split over their streams and staging copies
        sg = float(d["stream_gbps"])
        if sg > 0:
            self.stream_bw[t] = sg * GB * at.tps
        if self.staging[t] > 0:
            for k in range(n_instances):
                remote = host.socket[k] != 0 and not d["numa_aware"]
                rate = topo.memcpy_bw
                if remote and topo.numa_remote_memcpy_bw > 0:
                    rate = topo.numa_remote_memcpy_bw
                self.stage_bw[t, k] = int(at.tps[k]) * rate / self.staging[t]
        workers = int(tp.workers if tp.workers is not None else d["workers"])
        self.nw[t] = workers
        pool_count = at.n_hosts if d["scope"] == "host" else n_instances
        # each worker has 5 float64 slots in the simulator's state (load and store: when
        # free, seconds busy; the router's estimate)
        check_allocation(
            5 * 8 * (self.n_workers + pool_count * workers),
            f"{workers:,} connector workers per {d['scope']} ({pool_count:,} pools)",
            option=f"tiers.{tp.name}.workers",
        )
        if d["scope"] == "host":
            self.w0[t] = self.n_workers + at.inst_host * workers
            self.n_workers += at.n_hosts * workers
        else:
            self.w0[t] = self.n_workers + np.arange(n_instances) * workers
            self.n_workers += n_instances * workers

    def add_ports(
        self, t: int, tp: TierPolicy, hw: TierHardware, topo: Topology, at: _Placement,
        links: _Links,
    ) -> None:  # fmt: skip
        """Tier ``t``'s ports (one per host, or ``ports`` per host with each GPU on the one
        beside it) and its pool's own link."""
        n_ports = hw.ports if hw.attach == "gpu" else 1
        ids: dict[tuple[int, int], int] = {}
        for k in range(len(at.gpu0)):
            h = int(at.inst_host[k])
            j = int(at.local[k]) * n_ports // topo.gpus_per_host
            if (h, j) not in ids:
                label = f"{tp.name}.port[{h}]" if n_ports == 1 else f"{tp.name}.port[{h}.{j}]"
                ids[(h, j)] = links.add(label, hw.port_read_bw / n_ports,
                                        hw.port_write_bw / n_ports)  # fmt: skip
            self.port[t, k] = ids[(h, j)]
        if hw.pool_bw > 0:
            self.pool_link[t] = links.add(f"{tp.name}.pool", hw.pool_bw, hw.pool_bw)
        if hw.gpu_link_bw > 0:
            for k in range(len(at.gpu0)):
                bw = int(at.tps[k]) * hw.gpu_link_bw
                self.own_link[t, k] = links.add(f"{tp.name}.gpu_link[{k}]", bw, bw)
        for p in range(self.pool_count[t]):
            first = -1
            if self.dev_blocks[t] > 0:
                # one queue per memory device, for reads and writes alike (its DRAM)
                for d in range(int(self.devices[t])):
                    label = f"{tp.name}.device[{d}]" if self.pool_count[t] == 1 else (
                        f"{tp.name}.device[{p}.{d}]"
                    )  # fmt: skip
                    j = links.add(label, hw.device_bw, hw.device_bw, duplex=False)
                    first = j if d == 0 else first
            self.dev_link0.append(first)

    def paths(
        self, at: _Placement, host: _HostLinks
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The links of each tier's path to each instance's GPU, and of each cascade from tier
        ``t`` to ``t + 1``, with their scale (a staging copy reads and writes DRAM)."""
        T, n_instances = self.port.shape
        gpu_path = np.full((T, n_instances, MAX_PATH), -1, dtype=np.int64)
        gpu_scale = np.ones((T, MAX_PATH), dtype=np.float64)
        casc_path = np.full((T, n_instances, MAX_PATH), -1, dtype=np.int64)
        casc_scale = np.ones((T, MAX_PATH), dtype=np.float64)
        port, pool_link = self.port, self.pool_link
        for t in range(T):
            gpu_scale[t, 4] = 2.0 * max(int(self.staging[t]), 1)  # each copy reads and writes
            for k in range(n_instances):
                h = int(at.inst_host[k])
                own = int(self.own_link[t, k])
                gpu_path[t, k, 0] = host.pcie[k] if own < 0 else own
                gpu_path[t, k, 1] = host.switch[k] if self.via_host[t] and own < 0 else -1
                gpu_path[t, k, 2] = port[t, k]
                gpu_path[t, k, 3] = pool_link[t]
                gpu_path[t, k, 4] = host.membus[h] if self.staging[t] > 0 else -1
                if t + 1 < T:
                    casc_path[t, k, :4] = (
                        port[t, k], pool_link[t], port[t + 1, k], pool_link[t + 1]
                    )  # fmt: skip
        return gpu_path, gpu_scale, casc_path, casc_scale


def build_tiers(
    hardware: Hardware,
    model: ModelProfile,
    policy: Policy,
    n_instances: int,
    layout: Layout | None = None,
) -> TierConfig | None:
    """The lower tiers the policy lists, sized and wired from the hardware; None if none.
    ``layout`` places the instances (per-pool tensor parallelism); None: ``tp`` GPUs each,
    consecutive."""
    lower = policy.lower_tiers
    if not lower:
        return None
    topo = hardware.topology
    block_bytes = float(policy.kv_bytes_per_block(model))
    at = _Placement.of(topo, n_instances, layout)
    links = _Links()
    host = _host_links(links, hardware, at)
    cols = _TierColumns(len(lower), n_instances)
    for t, tp in enumerate(lower):
        hw = hardware.tiers.get(tp.name)
        if hw is None:
            raise InputError(
                f"policy lists tier {tp.name!r} but hardware {hardware.name!r} has no "
                f"[tiers.{tp.name}] table"
            )
        cols.add_tier(tp, hw, block_bytes, at)
        cols.add_connector(t, tp, hw, topo, at, host)
        cols.add_ports(t, tp, hw, topo, at, links)
    gpu_path, gpu_scale, casc_path, casc_scale = cols.paths(at, host)
    return TierConfig(
        names=tuple(cols.names),
        evictions=tuple(cols.evictions),
        connectors=tuple(cols.connectors),
        capacity_blocks=np.array(cols.caps, dtype=np.int64),
        per_host=np.array(cols.per_host, dtype=np.bool_),
        pool_base=np.array(cols.base, dtype=np.int64),
        n_pools=cols.n_pools,
        pool_count=np.array(cols.pool_count, dtype=np.int64),
        pool_local=cols.pool_local,
        n_hosts=at.n_hosts,
        inst_host=at.inst_host,
        lat_s=np.array(cols.lat_s, dtype=np.float64),
        cap_bw=np.array(cols.cap_bw, dtype=np.float64),
        rpc_s=np.array(cols.rpc_s, dtype=np.float64),
        stream_bw=cols.stream_bw,
        stage_bw=cols.stage_bw,
        serial=np.array(cols.serial, dtype=np.int64),
        depth=np.array(cols.depth, dtype=np.int64),
        unit=np.array(cols.unit, dtype=np.int64),
        layerwise=np.array(cols.layerwise, dtype=np.bool_),
        store_blocks=np.array(cols.blocks_step, dtype=np.bool_),
        w0=cols.w0,
        nw=cols.nw,
        n_workers=cols.n_workers,
        link_bw_read=np.array(links.read, dtype=np.float64),
        link_bw_write=np.array(links.write, dtype=np.float64),
        link_duplex=np.array(links.duplex, dtype=np.int64),
        link_names=tuple(links.names),
        gpu_path=gpu_path,
        gpu_scale=gpu_scale,
        casc_path=casc_path,
        casc_scale=casc_scale,
        write_policy=WRITE_CODES[policy.write_policy],
        selective_k=policy.selective_k,
        exclusive=policy.hierarchy == "exclusive",
        load_rule=LOAD_RULES.code(policy.load_rule),
        batch_waits=policy.load_wait == "batch",
        fragments=fragments_per_block(model, policy.kv_layout),
        coalesce=policy.coalesce,
        layers=model.layers,
        block_bytes=block_bytes,
        tier_gb=cols.tier_gb,
        store_generated=np.array(cols.gen_step, dtype=np.bool_),
        defer_loading_hits=any(cols.defer),
        touches_prompt=cols.touch[0],
        group_entries=cols.groups[0],
        load_fills_upper=np.array(cols.fills, dtype=np.bool_),
        prefetch_at_arrival=np.array(cols.prefetch, dtype=np.bool_),
        visible_when_stored=np.array(cols.when_stored, dtype=np.bool_),
        evict_high=np.array(cols.evict_high, dtype=np.float64),
        evict_ratio=np.array(cols.evict_ratio, dtype=np.float64),
        device_blocks=cols.dev_blocks,
        devices=cols.devices,
        device_link0=np.array(cols.dev_link0, dtype=np.int64),
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


def generated_bases(
    input_tokens: np.ndarray, output_tokens: np.ndarray, block_tokens: int, n_blocks: int
) -> np.ndarray:
    """The ids of the requests' full blocks of generated tokens, for a connector that stores
    them (``TierConfig.store_generated``): request ``i``'s are ``base[i] .. base[i + 1] - 1``,
    after the trace's ``n_blocks`` prompt ids (no prompt names them, so they are never hit).

    Request ``i`` has at most ``(input + max(output - 1, 0)) // B - input // B`` of them: the
    full blocks from its prompt's last partial block on, the last token's KV never computed
    (vLLM's block pool caches them, docs/model.md, "HBM prefix cache"). ``base[n]`` is the id
    space's size. One numpy pass; both engines take the same array.
    """
    inp = np.asarray(input_tokens, dtype=np.int64)
    out = np.asarray(output_tokens, dtype=np.int64)
    B = int(block_tokens)
    counts = np.maximum((inp + np.maximum(out - 1, 0)) // B - inp // B, 0)
    base = np.empty(len(inp) + 1, dtype=np.int64)
    base[0] = max(int(n_blocks), 1)
    np.cumsum(counts, out=base[1:])
    base[1:] += base[0]
    return base


def window_id_space(
    costs: np.ndarray | None, n_ids: int, copies: int
) -> tuple[np.ndarray | None, int, int]:
    """The lower tiers' ids with each block's sliding-window copies as entries of their own
    (``SimConfig.tier_window``): copy ``c`` (1 to ``copies``) of block ``b`` is id
    ``b + c * offset``, ``offset`` being the ids of every prompt and generated block (at least
    one). A copy's GDSF cost is its block's. Returns the costs over the whole id space (None
    stays None), its size and the offset; ``copies`` 0: the costs unchanged. Both engines
    take the same."""
    offset = max(int(n_ids), 1)
    if copies <= 0:
        return costs, offset, offset
    total = offset * (1 + int(copies))
    if total >= 1 << 31:
        raise InputError(
            f"{total:,} block ids with their sliding-window copies are too many; use a larger "
            "block size"
        )
    if costs is None:
        return None, total, offset
    full = np.ones(offset, dtype=np.float64)
    full[: min(len(costs), offset)] = costs[:offset]
    return np.tile(full, 1 + int(copies)), total, offset


def generated_costs(
    costs: np.ndarray,
    base: np.ndarray,
    input_tokens: np.ndarray,
    block_tokens: int,
    flops_per_token: float,
    attn_coef: float,
    compute_rate: float,
) -> np.ndarray:
    """GDSF's cost per block (:func:`recompute_costs`) extended over the generated blocks'
    ids (:func:`generated_bases`): generated block ``m`` of request ``i`` costs ``B`` tokens
    after ``(input // B + m) * B`` tokens of context."""
    total = int(base[-1])
    full = np.ones(total, dtype=np.float64)
    full[: len(costs)] = costs[:total]
    counts = np.diff(base)
    n_gen = int(counts.sum())
    if n_gen == 0:
        return full
    req = np.repeat(np.arange(len(counts)), counts)
    m = np.arange(n_gen, dtype=np.int64) - (base[:-1] - base[0])[req]
    q = block_tokens
    ctx = (np.asarray(input_tokens, dtype=np.int64)[req] // q + m) * q
    full[base[0] :] = (flops_per_token * q + attn_coef * (q * (2 * ctx + q))) / compute_rate
    return full
