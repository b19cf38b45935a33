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

ROOT = Path(__file__).resolve().parent.parent
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
        "c2c", "dram", "gpu_cxl", "cxl", "photonic", "rdma", "memfabric", "memserver",
        "pagecache", "ssd",
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


def _hbf_config(hw: str, model: str = "llama-3.1-8b", **serving):
    from dataclasses import replace

    from kvtier.policy import Policy
    from kvtier.sim import build_config

    p = Policy()
    p = replace(p, serving=replace(p.serving, **serving))
    return build_config(load_hardware(hw), load_model(model), p)


def test_weights_in_hbf_free_hbm_for_kv_and_are_read_at_the_hbf_rate() -> None:
    model = load_model("llama-3.1-8b")
    hbm = _hbf_config("h200-hbf-node", instances=1)
    hbf = _hbf_config("h200-hbf-node", instances=1, weights_in_hbf=True)
    block = 16 * model.kv_bytes_per_token()
    gpu = load_gpu("h200-hbf")
    # sized from the 139.80 GiB the CUDA runtime reports for an H200, not the data sheet's 141 GB
    per_gpu = gpu.engine_hbm_bytes * 0.9 - 2 * GB
    assert hbm.capacity_blocks == int((per_gpu - model.weight_bytes) // block)
    assert hbf.capacity_blocks == int(per_gpu // block)
    # the weights' bytes weighed by HBM's rate over HBF's (4.8 / 1.6 TB/s): read 3x slower
    assert hbf.weight_bytes == pytest.approx(model.weight_bytes * 3.0, rel=1e-12)
    assert hbf.step_backend == "roofline" and "HBF" in hbf.step_provenance
    # a 70B model needs two H200s in HBM, one with its weights in HBF
    big = _hbf_config("h200-hbf-node", "llama-3.1-70b", instances=1, weights_in_hbf=True)
    assert big.capacity_blocks > 0
    with pytest.raises(InputError, match="leaves no room"):
        _hbf_config("h200-hbf-node", "llama-3.1-70b", instances=1)


def test_weights_in_hbf_errors_name_the_option() -> None:
    with pytest.raises(InputError, match="has no HBF") as err:
        _hbf_config("h200-node", weights_in_hbf=True)
    assert err.value.option == "serving.weights_in_hbf"
    with pytest.raises(InputError, match="do not fit"):
        _hbf_config("h200-hbf-node", "llama-3.1-405b", instances=1, weights_in_hbf=True)


ARCH_PRESETS = {
    "beluga-gpu-cxl": "gpu_cxl",
    "emfasys-memfabric": "memfabric",
    "memoryai-memserver": "memserver",  # below a host DRAM buffer, cut to 10 GB here
    "structera-cxl": "cxl",
    "photonic-pool": "photonic",
    "gb200-kvbm": "c2c",
}


@pytest.fixture(scope="module")
def chat_head(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The first 600 requests of the bundled multi-turn chat sample (traces/README.md)."""
    from dataclasses import replace

    from kvtier.trace.io import read_trace, write_trace

    trace = read_trace(ROOT / "traces" / "sample-chat.parquet")
    path = tmp_path_factory.mktemp("chat") / "head.parquet"
    head = replace(trace, table=trace.table.slice(0, 600))
    write_trace(head, path)
    return str(path)


@pytest.mark.parametrize(("preset", "kind"), sorted(ARCH_PRESETS.items()))
def test_each_architecture_replays_from_its_preset(chat_head: str, preset: str, kind: str) -> None:
    """One instance with 20 GB of HBM for KV, so the conversations' earlier turns come back
    from the architecture's tier: a non-zero hit ratio there, every request served, a cost
    and an energy."""
    import json

    from tests.helpers import invoke

    res = invoke(
        "replay", "--trace", chat_head, "--preset", preset, "--json",
        "--set", "serving.instances=1", "--set", "tiers.hbm.capacity_gb=20",
        *(("--set", "tiers.dram.capacity_gb=10") if preset == "memoryai-memserver" else ()),
    )  # fmt: skip
    assert res.code == 0, res.stderr
    m = json.loads(res.stdout)
    assert m["n_served"] == 600
    assert m["tier_hit_blocks"][kind] > 0
    assert 0 < m["hit_ratio_tokens"][kind] < 1
    assert m["cost_per_hour"] > 0 and m["tokens_per_joule"] > 0


def test_rubin_cpx_prefill_beside_rubin_decode_replays_from_its_preset(chat_head: str) -> None:
    import json

    from tests.helpers import invoke

    res = invoke("replay", "--trace", chat_head, "--preset", "rubin-cpx-pd", "--json")
    assert res.code == 0, res.stderr
    m = json.loads(res.stdout)
    assert m["n_served"] == 600 and m["tokens_per_joule"] > 0
    # 16 CPX at their price and 8 Rubin at theirs
    cpx, rubin = load_gpu("rubin-cpx").price_per_hour, load_gpu("rubin").price_per_hour
    assert m["cost_per_hour"] == pytest.approx(16 * cpx + 8 * rubin)


@pytest.mark.parametrize(
    ("profile", "kind"), [("gh200-node", "c2c"), ("photonic-rack", "photonic")]
)
def test_both_engines_agree_over_a_gpu_link_tier(profile: str, kind: str) -> None:
    """A tier on each GPU's own link replays the same, per request, on both engines."""
    from dataclasses import replace

    from kvtier.policy.model import TierPolicy
    from kvtier.sim import build_config, simulate_raw
    from kvtier.trace.blocks import block_trace
    from kvtier.trace.synth import synthesize
    from tests.test_sim_differential import assert_same

    policy = _policy(kind)
    policy = replace(
        policy,
        tiers=(TierPolicy("hbm", capacity_gb=2.0), *policy.tiers[1:]),
        serving=replace(policy.serving, instances=2),
    )
    cfg = build_config(load_hardware(profile), load_model("llama-3.1-8b"), policy)
    trace = block_trace(synthesize("chat", requests=150, rate=20.0, seed=5), 16)
    ref = simulate_raw(trace, cfg, engine="reference")
    nb = simulate_raw(trace, cfg, engine="numba")
    assert cfg.tiers is not None
    assert_same(ref, nb, trace, cfg.tiers.names)
    assert int(ref.tier_hit_blocks.sum()) > 0  # the tier served some of the prompts


@pytest.mark.parametrize("target", [e.name for e in EXPORTERS])
def test_an_export_names_every_tier_it_cannot_place(target: str) -> None:
    from kvtier.export import export
    from kvtier.export.common import INEXPRESSIBLE
    from kvtier.policy.presets import load_preset

    policy = load_preset("gb200-kvbm")
    hw, model = load_hardware("gb200-nvl72"), load_model("Llama-3.1-70B")
    result = export(policy, target, hw, model)
    said = [n for n in result.notes if n.kind == INEXPRESSIBLE and "c2c" in n]
    assert said, [str(n) for n in result.notes]
