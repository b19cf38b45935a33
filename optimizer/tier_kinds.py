"""The kinds of memory below HBM: one registry, whose entries say what the rest of kvtier
needs to know of a kind without naming it.

A tier kind is data: an entry here (its name, lookup order, help and traits) and a
``[tiers.NAME]`` table in the hardware profiles that offer it (its capacity, links and price,
:class:`kvtier.hardware.types.TierHardware`). The traits:

* ``per_host``: one pool per host (host DRAM, local SSD), else one pool every host reaches
  (a CXL pool, an RDMA pool); a profile may override it (``shared``);
* ``per_engine``: a per-host kind whose pool the serving software keeps for each engine
  (instance) of the host alone, as every current host-memory KV cache does (vLLM's
  OffloadingConnector, LMCache's local CPU back end, SGLang HiCache's host pool, Dynamo
  KVBM's host tier; [Host-memory-per-engine]); a policy may override it
  (``tiers.NAME.per_engine``);
* ``wear``: its writes wear its devices out (SSD endurance: DWPD and wear cost reported);
* ``interleave``: a policy may choose whether data is interleaved over its devices (CXL);
* ``pd_ports``: a disaggregated deployment's KV transfer runs over this tier's host ports
  (its NICs) when the hardware offers it, else over a default NIC per GPU;
* ``gpu_link``: each GPU reaches the kind over a link of its own, not over its PCIe link
  to the host (NVLink-C2C to Grace memory, a CXL memory device on the GPU's own port): a
  profile offering it gives that link's rate (``gpu_link_gbps``);
* ``implicit``: nothing deploys it but the tier behind it: a file system client's page cache
  comes with the file tier's mount (an exporter that places the file tier places it, saying
  so; its size is the client's);
* ``power``: the kind's power where a profile's ``[tiers.NAME]`` table does not give it,
  ``(w_per_gb, pj_per_bit, host_w, pool_w)`` (:mod:`kvtier.sim.energy`; sources in
  docs/sources.md [Power-2026]); None: a profile offering the kind must give all four.

The order of the entries is the order a request looks the tiers up (fastest path first).
Plug-ins from outside the package (:mod:`kvtier.plugins`) register further kinds; they are
loaded here, before any module reads the kinds, so every layer sees the same list.
"""

from __future__ import annotations

from kvtier.plugins import load_plugins
from kvtier.registry import Entry, Registry


def tier_kind(
    name: str,
    code: int,
    help: str,
    *,
    per_host: bool,
    per_engine: bool = False,
    wear: bool = False,
    interleave: bool = False,
    pd_ports: bool = False,
    gpu_link: bool = False,
    implicit: bool = False,
    power: tuple[float, float, float, float] | None = None,
) -> Entry:
    """A tier kind's entry (see the module docstring for the traits)."""
    traits = {
        "per_host": per_host,
        "per_engine": per_engine,
        "wear": wear,
        "interleave": interleave,
        "pd_ports": pd_ports,
        "gpu_link": gpu_link,
        "implicit": implicit,
        "power": power,
    }
    return Entry(name, code, help, traits=traits)


TIER_KINDS = Registry(
    "tier kind",
    [
        tier_kind(
            "c2c",
            0,
            "NVLink-C2C host memory: the Grace CPU's LPDDR5X, one pool per host, each GPU over "
            "its own NVLink-C2C link (GH200, GB200)",
            per_host=True,
            per_engine=True,
            gpu_link=True,
            power=(0.05, 8.0, 0.0, 0.0),
        ),
        tier_kind(
            "dram",
            1,
            "host DRAM, one pool per engine (each serving instance's own host cache), over each "
            "GPU's PCIe",
            per_host=True,
            per_engine=True,
            power=(0.1, 20.0, 0.0, 0.0),
        ),
        tier_kind(
            "gpu_cxl",
            2,
            "CXL memory on the GPU's own port, no host root complex in the path (Beluga's "
            "proposed topology), one pool shared through a CXL switch",
            per_host=False,
            interleave=True,
            gpu_link=True,
            power=(0.12, 25.0, 0.0, 0.0),
        ),
        tier_kind(
            "cxl",
            3,
            "a CXL memory pool shared by the hosts (or an expander per host, shared = false)",
            per_host=False,
            interleave=True,
            power=(0.12, 30.0, 50.0, 0.0),
        ),
        tier_kind(
            "photonic",
            4,
            "a photonic shared memory pool across racks (HBM3E and DDR5 behind an optical "
            "switch, Celestial AI's Photonic Fabric Appliance), each GPU over its own optical link",
            per_host=False,
            gpu_link=True,
            power=None,
        ),
        tier_kind(
            "rdma",
            5,
            "a remote memory pool every host reaches over RDMA NICs",
            per_host=False,
            pd_ports=True,
            power=(0.35, 75.0, 416.0, 0.0),
        ),
        tier_kind(
            "memfabric",
            6,
            "an Ethernet memory fabric: CXL DDR5 behind an RDMA SuperNIC every host reaches "
            "(Enfabrica EMFASYS)",
            per_host=False,
            power=None,
        ),
        tier_kind(
            "memserver",
            7,
            "a network KV cache server: a CXL memory server GPU hosts reach over their NICs "
            "(Penguin Solutions MemoryAI)",
            per_host=False,
            power=None,
        ),
        tier_kind(
            "pagecache",
            8,
            "the page cache of a file system's client on each host, in front of the file tier "
            "(a Lustre or NFS client keeps the files it reads and writes in host DRAM), one pool "
            "per host, read through the file tier's connector",
            per_host=True,
            implicit=True,
            power=(0.1, 20.0, 0.0, 0.0),
        ),
        tier_kind(
            "ssd",
            9,
            "local NVMe SSD, one pool per host",
            per_host=True,
            wear=True,
            power=(0.0, 200.0, 28.0, 0.0),
        ),
    ],
)

# plug-ins may register tier kinds (and other mechanisms) before anything reads the kinds
load_plugins()


def trait(name: str, key: str) -> bool:
    """Tier kind ``name``'s trait ``key`` (False for a name no entry has)."""
    return name in TIER_KINDS and bool(TIER_KINDS[name].traits.get(key, False))
