"""``PdConfig``: the prefill-to-decode KV transfer as a connector transfer over real links.

Derived once from the hardware, the model and the policy so that both simulators read the same
numbers (docs/model.md, "Prefill/decode disaggregation"). A prompt's KV moves from prefill
instance ``p`` to decode instance ``d`` by :func:`kvtier.sim.transfer.pd_transfer` over the
links ``path[p, d]``:

- within a host, NVLink: ``nvlink[p]`` outbound, ``nvlink[d]`` inbound (``tp`` GPUs' links
  together; PCIe peer to peer when the GPU has no NVLink);
- across hosts, GPUDirect RDMA: ``pcie[p]`` and the NICs beside ``p``'s GPUs outbound, the
  NICs beside ``d``'s GPUs and ``pcie[d]`` inbound, the bytes split evenly over an instance's
  NICs (``scale``). The NICs are the hardware's ``rdma`` tier ports (one per GPU on HGX-class
  hosts, ``attach = "gpu"``), named as :func:`kvtier.sim.tiers.build_tiers` names them, so a
  policy with an rdma tier shares their queues with the tier's loads and copies; without an
  rdma tier in the profile, one 400 Gb/s NIC per GPU.

The links are the lower tiers' links followed by those only the P/D transfer uses
(:func:`build_pd` returns the tier configuration extended with them, so both index one set of
link queues). The connector (``serving.pd_connector``, :data:`kvtier.policy.registries.CONNECTORS`)
gives the operation unit, per-operation cost, ordering, workers, whether the prefill side
streams layer by layer (``pd_layerwise``) and whether the decode side moves only the blocks
past its own prefix-cache hit (``pd_decode_hit``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from kvtier.deploy.layout import Layout
from kvtier.hardware.types import GB, Hardware, ModelProfile
from kvtier.policy.model import Policy
from kvtier.policy.registries import CONNECTORS, UNITS
from kvtier.sim.tiers import TierConfig, fragments_per_block
from kvtier.tier_kinds import trait as tier_trait

# A ConnectX-7 NIC per GPU (400 Gb/s) when the profile has no RDMA tier to take it from.
DEFAULT_NIC_BW = 50e9
OUT, IN = 1, 0  # a path entry's queue: the link's write (outbound) or read (inbound) queue


@dataclass(frozen=True, eq=False)
class PdConfig:
    """The P/D transfer of one replay; paths indexed ``[prefill, decode, j]``."""

    connector: str
    path: np.ndarray  # int64 (K, K, P): links, -1 unused
    queue: np.ndarray  # int64 (K, K, P): OUT (write queue) or IN (read queue)
    scale: np.ndarray  # float64 (K, K, P): share of the bytes each link carries
    lat_s: np.ndarray  # float64 (K, K): seconds once per transfer (the RDMA round trip)
    link_bw_read: np.ndarray  # float64 (L,): every link, the tiers' first
    link_bw_write: np.ndarray  # float64 (L,)
    link_duplex: np.ndarray  # int64 (L,)
    link_names: tuple[str, ...]
    block_bytes: float  # bytes moved per block: every rank's copy of its KV
    unit: int  # UNITS index of one operation
    fragments: int  # memory regions per block (KV layout)
    coalesce: int
    rpc_s: float  # worker seconds per operation
    stream_bw: float  # the store's per-stream rate (inf: none)
    stage_bw: float  # host staging copies (inf: none)
    serial: int  # 1 serial, 0 pipelined
    depth: int  # operations in flight when pipelined
    workers: int  # per instance: the receiver's (pull) or the sender's (layer-wise push)
    layerwise: bool  # the prefill side pushes each layer's KV as it is computed
    layers: int  # model layers
    # the decode side looks the prompt up in its own HBM prefix cache and the transfer moves
    # only the blocks past the hit (vLLM's NixlConnector); False: every block moves
    decode_hit: bool = False

    @property
    def n_links(self) -> int:
        return len(self.link_names)


class _Links:
    """Links by name: the tiers' links first (same indices), then the P/D transfer's own."""

    def __init__(self, tiers: TierConfig | None) -> None:
        self.names: list[str] = list(tiers.link_names) if tiers is not None else []
        self.read: list[float] = list(tiers.link_bw_read) if tiers is not None else []
        self.write: list[float] = list(tiers.link_bw_write) if tiers is not None else []
        self.duplex: list[int] = [int(x) for x in tiers.link_duplex] if tiers is not None else []
        self.index = {n: i for i, n in enumerate(self.names)}

    def get(self, name: str, read: float, write: float) -> int:
        """The link named ``name`` (a tier's, when the tiers have it), else a new one."""
        if name not in self.index:
            self.index[name] = len(self.names)
            self.names.append(name)
            self.read.append(read)
            self.write.append(write)
            self.duplex.append(1)
        return self.index[name]


def build_pd(
    hardware: Hardware,
    model: ModelProfile,
    policy: Policy,
    n_instances: int,
    tiers: TierConfig | None,
    layout: Layout | None = None,
) -> tuple[PdConfig, TierConfig | None]:
    """The P/D transfer of a disaggregated policy, and ``tiers`` with its links appended.
    ``layout`` places the instances (per-pool tensor parallelism: each instance's links are
    its own GPUs'); None: ``tp`` GPUs each, consecutive."""
    topo = hardware.topology
    tp, gph = topo.tp, topo.gpus_per_host
    tps = list(layout.tps) if layout is not None else [tp] * n_instances
    links = _Links(tiers)
    n_pf = layout.n_prefill if layout is not None else 0
    gpus = [hardware.gpu_of(k, n_pf) for k in range(n_instances)]  # each instance's GPU type
    pcie = [links.get(f"pcie[{k}]", t * gpus[k].pcie_bw, t * gpus[k].pcie_bw)
            for k, t in enumerate(tps)]  # fmt: skip
    nvlink = [links.get(f"nvlink[{k}]", t * gpus[k].nvlink_bw, t * gpus[k].nvlink_bw)
              if gpus[k].nvlink_bw > 0 else -1 for k, t in enumerate(tps)]  # fmt: skip
    # the tier whose host ports (NICs) the transfer runs over (the tier kinds' pd_ports)
    nic = next((hw for name, hw in hardware.tiers.items() if tier_trait(name, "pd_ports")), None)
    if nic is not None:
        n_ports = nic.ports if nic.attach == "gpu" else 1
        read, write, prefix = nic.port_read_bw / n_ports, nic.port_write_bw / n_ports, nic.name
    else:
        n_ports, read, write, prefix = gph, DEFAULT_NIC_BW, DEFAULT_NIC_BW, "nic"
    gpu0 = list(layout.first_gpu) if layout is not None else [k * tp for k in range(n_instances)]
    host = [g // gph for g in gpu0]
    nics: list[list[int]] = []
    for k in range(n_instances):
        ports = sorted({(gpu0[k] % gph + i) * n_ports // gph for i in range(tps[k])})
        names = [
            f"{prefix}.port[{host[k]}]" if n_ports == 1 else f"{prefix}.port[{host[k]}.{j}]"
            for j in ports
        ]
        nics.append([links.get(n, read, write) for n in names])
    width = 2 + 2 * max(len(x) for x in nics)
    K = n_instances
    path = np.full((K, K, width), -1, dtype=np.int64)
    queue = np.zeros((K, K, width), dtype=np.int64)
    scale = np.ones((K, K, width), dtype=np.float64)
    lat = np.zeros((K, K), dtype=np.float64)
    for p in range(K):
        for d in range(K):
            if host[p] == host[d]:
                both = nvlink[p] >= 0 and nvlink[d] >= 0  # NVLink only if both GPUs have it
                a, b = (nvlink[p], nvlink[d]) if both else (pcie[p], pcie[d])
                entries = [(a, OUT, 1.0), (b, IN, 1.0)]
            else:
                entries = [(pcie[p], OUT, 1.0)]
                entries += [(x, OUT, 1.0 / len(nics[p])) for x in nics[p]]
                entries += [(x, IN, 1.0 / len(nics[d])) for x in nics[d]]
                entries += [(pcie[d], IN, 1.0)]
                lat[p, d] = nic.latency_s if nic is not None else 0.0
            for j, (link, q, s) in enumerate(entries):
                path[p, d, j], queue[p, d, j], scale[p, d, j] = link, q, s
    name = policy.serving.pd_connector
    c = CONNECTORS.get(name, path="serving.pd_connector").defaults
    rpc = float(c["rpc_us"])
    op_s = rpc * 1e-6 if rpc >= 0 else (nic.op_overhead_s if nic is not None else 0.0)
    sg = float(c["stream_gbps"])
    staging = int(c["staging"])
    pd = PdConfig(
        connector=name,
        path=path,
        queue=queue,
        scale=scale,
        lat_s=lat,
        link_bw_read=np.array(links.read, dtype=np.float64),
        link_bw_write=np.array(links.write, dtype=np.float64),
        link_duplex=np.array(links.duplex, dtype=np.int64),
        link_names=tuple(links.names),
        # every decode rank's copy (the decode side pulls: its tp sets the replication)
        block_bytes=float(policy.kv_bytes_per_block(model) * model.kv_replication(tps[-1])),
        unit=UNITS.index(str(c["unit"])),
        fragments=fragments_per_block(model, policy.kv_layout),
        coalesce=policy.coalesce,
        rpc_s=op_s,
        # each decode rank pulls its shard through its own stream and staging copy
        # (kvtier.sim.tiers.add_connector: every connector runs on each rank)
        stream_bw=sg * GB * int(tps[-1]) if sg > 0 else math.inf,
        stage_bw=topo.memcpy_bw * int(tps[-1]) / staging if staging > 0 else math.inf,
        serial=1 if c["order"] == "serial" else 0,
        depth=int(c["depth"]),
        workers=int(c["workers"]),
        layerwise=bool(c["pd_layerwise"]),
        layers=model.layers,
        decode_hit=bool(c["pd_decode_hit"]),
    )
    if tiers is not None:
        tiers = replace(
            tiers,
            link_bw_read=pd.link_bw_read,
            link_bw_write=pd.link_bw_write,
            link_duplex=pd.link_duplex,
            link_names=pd.link_names,
        )
    return pd, tiers


@dataclass(frozen=True)
class PdTraffic:
    """What a disaggregated replay's P/D transfers moved, and what decode-side hits saved."""

    requests: int  # handed over, their KV arrived on the decode instance
    blocks: int  # prompt blocks those transfers moved
    hit_blocks: int  # prompt blocks the decode instances already held (not moved)
    block_bytes: float

    @property
    def bytes_moved(self) -> float:
        return self.blocks * self.block_bytes

    @property
    def bytes_saved(self) -> float:
        return self.hit_blocks * self.block_bytes


def pd_traffic(
    input_tokens: np.ndarray,
    decode_instance: np.ndarray,
    first_token_s: np.ndarray,
    decode_hit_blocks: np.ndarray,
    block_tokens: int,
    block_bytes: float,
) -> PdTraffic:
    """Blocks the P/D transfers of the requests whose KV arrived moved: each prompt's
    ``ceil(input / B)`` blocks less those its decode instance held (a request pulled again
    after a preemption counts once)."""
    done = (decode_instance >= 0) & ~np.isnan(first_token_s)
    prompt = -(-input_tokens[done].astype(np.int64) // block_tokens)
    hits = decode_hit_blocks[done].astype(np.int64)
    return PdTraffic(int(done.sum()), int((prompt - hits).sum()), int(hits.sum()), block_bytes)
