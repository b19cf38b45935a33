"""The memory architectures kvtier profiles: GH200 / GB200 NVLink-C2C memory, GPU-attached
CXL, a photonic shared pool, an Ethernet memory fabric, a network memory server, and the
Rubin / Rubin CPX GPUs (docs/sources.md, "Memory architectures")."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.errors import InputError
from kvtier.export import EXPORTERS
from kvtier.export.capabilities import capabilities
from kvtier.hardware import GB, load_gpu, load_hardware, load_model
from kvtier.policy.model import policy_from_dict
from kvtier.sim.tiers import build_tiers
from kvtier.tier_kinds import TIER_KINDS, trait

NEW_KINDS = ("c2c", "gpu_cxl", "photonic", "memfabric", "memserver")
PROFILES = {
    "gh200-node": "c2c",
    "gb200-nvl72": "c2c",
    "beluga-gpu-cxl": "gpu_cxl",
    "photonic-rack": "photonic",
    "emfasys-rack": "memfabric",
    "memoryai-rack": "memserver",
}


def _policy(*tiers: str):
    return policy_from_dict(
        {"format": "kvtier-policy/1", "tiers": [{"name": "hbm"}, *({"name": t} for t in tiers)]},
        "test",
    )


def test_lookup_order_puts_the_fastest_path_first() -> None:
    assert TIER_KINDS.names == (
        "c2c", "dram", "gpu_cxl", "cxl", "photonic", "rdma", "memfabric", "memserver", "ssd"
    )  # fmt: skip
    assert [trait(k, "gpu_link") for k in NEW_KINDS] == [True, True, True, False, False]
    assert trait("c2c", "per_host") and not trait("photonic", "per_host")


@pytest.mark.parametrize(("profile", "kind"), sorted(PROFILES.items()))
def test_each_architecture_profile_offers_its_kind_with_power(profile: str, kind: str) -> None:
    hw = load_hardware(profile)
    tier = hw.tiers[kind]
    assert tier.capacity_bytes > 0 and tier.port_read_bw > 0
    # every kind without a power default gets its figures from the profile
    assert tier.w_per_gb > 0 and tier.pj_per_bit > 0
    assert (tier.gpu_link_bw > 0) == trait(kind, "gpu_link")


def test_sourced_figures_reach_the_profiles() -> None:
    assert load_hardware("emfasys-rack").tiers["memfabric"].capacity_bytes == 18000 * GB
    assert load_hardware("emfasys-rack").tiers["memfabric"].pool_bw == 400 * GB  # 3.2 Tb/s
    photonic = load_hardware("photonic-rack").tiers["photonic"]
    assert photonic.capacity_bytes == 32000 * GB and photonic.pool_bw == 14375 * GB  # 115 Tb/s
    assert load_hardware("gh200-node").tiers["c2c"].gpu_link_bw == 450 * GB  # 900 GB/s both ways
    assert load_gpu("rubin-cpx").hbm_bytes == 128 * GB and load_gpu("rubin-cpx").nvlink_bw == 0
    assert load_gpu("gb200").hbm_bytes == 186 * GB


def test_a_gpu_link_tier_bypasses_the_pcie_link() -> None:
    hw, model = load_hardware("gh200-node"), load_model("llama-3.1-8b")
    cfg = build_tiers(hw, model, _policy("c2c", "ssd"), hw.topology.max_instances)
    assert cfg is not None
    c2c, ssd = cfg.names.index("c2c"), cfg.names.index("ssd")
    for k in range(hw.topology.max_instances):
        first = int(cfg.gpu_path[c2c, k, 0])
        assert cfg.link_names[first] == f"c2c.gpu_link[{k}]"
        assert cfg.link_bw_read[first] == 450 * GB
        # the SSD still sits behind the GPU's PCIe link
        assert cfg.link_names[int(cfg.gpu_path[ssd, k, 0])] == f"pcie[{k}]"


def test_a_gpu_link_kind_without_its_rate_is_a_one_line_error(tmp_path: Path) -> None:
    text = Path(load_hardware("gh200-node").source).read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(
        text.replace("gpu_link_gbps = 450", "").replace('gpu = "gh200"', 'gpu = "h100-sxm"')
    )
    with pytest.raises(InputError, match="gpu_link_gbps"):
        load_hardware(str(bad))


@pytest.mark.parametrize("target", [e.name for e in EXPORTERS])
def test_no_exporter_claims_a_kind_it_cannot_place(target: str) -> None:
    caps = capabilities(target)
    assert not set(caps.tiers) & set(NEW_KINDS)
