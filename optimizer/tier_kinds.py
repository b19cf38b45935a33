"""The kinds of memory below HBM: one registry, whose entries say what the rest of kvtier
needs to know of a kind without naming it.

A tier kind is data: an entry here (its name, lookup order, help and traits) and a
``[tiers.NAME]`` table in the hardware profiles that offer it (its capacity, links and price,
:class:`kvtier.hardware.types.TierHardware`). The traits:

* ``per_host``: one pool per host (host DRAM, local SSD), else one pool every host reaches
  (a CXL pool, an RDMA pool); a profile may override it (``shared``);
* ``wear``: its writes wear its devices out (SSD endurance: DWPD and wear cost reported);
* ``interleave``: a policy may choose whether data is interleaved over its devices (CXL);
* ``pd_ports``: a disaggregated deployment's KV transfer runs over this tier's host ports
  (its NICs) when the hardware offers it, else over a default NIC per GPU.

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
    wear: bool = False,
    interleave: bool = False,
    pd_ports: bool = False,
) -> Entry:
    """A tier kind's entry (see the module docstring for the traits)."""
    traits = {"per_host": per_host, "wear": wear, "interleave": interleave, "pd_ports": pd_ports}
    return Entry(name, code, help, traits=traits)


TIER_KINDS = Registry(
    "tier kind",
    [
        tier_kind("dram", 0, "host DRAM, one pool per host, over each GPU's PCIe", per_host=True),
        tier_kind(
            "cxl",
            1,
            "a CXL memory pool shared by the hosts (or an expander per host, shared = false)",
            per_host=False,
            interleave=True,
        ),
        tier_kind(
            "rdma",
            2,
            "a remote memory pool every host reaches over RDMA NICs",
            per_host=False,
            pd_ports=True,
        ),
        tier_kind("ssd", 3, "local NVMe SSD, one pool per host", per_host=True, wear=True),
    ],
)

# plug-ins may register tier kinds (and other mechanisms) before anything reads the kinds
load_plugins()


def trait(name: str, key: str) -> bool:
    """Tier kind ``name``'s trait ``key`` (False for a name no entry has)."""
    return name in TIER_KINDS and bool(TIER_KINDS[name].traits.get(key, False))
