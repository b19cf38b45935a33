"""Policy schema for lower tiers, dict round trips, presets, hardware tier tables, --preset."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvtier.errors import InputError
from kvtier.hardware import load_hardware
from kvtier.policy.model import Policy, load_policy, policy_from_dict, policy_to_dict
from kvtier.policy.presets import (
    PAST_RELEASE_PRESETS,
    current_preset_names,
    load_preset,
    preset_names,
)
from tests.helpers import assert_one_line_error, invoke

PRESETS = [
    "beluga-cxl",
    "beluga-gpu-cxl",
    "dynamo-disagg",
    "dynamo-kvbm",
    "emfasys-memfabric",
    "gb200-kvbm",
    "lmcache-0.3-mooncake-beluga",
    "lmcache-cpu-disk",
    "memoryai-memserver",
    "mooncake-pd",
    "mooncake-rdma",
    "photonic-pool",
    "rubin-cpx-pd",
    "sglang-hicache",
    "structera-cxl",
    "vistara-cxl-expander",
    "vllm-0.8.5-hbm-beluga",
    "vllm-hbm",
    "vllm-pd-lmcache",
]
ROOT = Path(__file__).resolve().parent.parent


def test_every_preset_is_there_and_round_trips() -> None:
    assert preset_names() == PRESETS
    for name in PRESETS:
        policy = load_preset(name)
        assert policy_from_dict(policy_to_dict(policy), name) == policy
        text = (ROOT / "policies" / "presets" / f"{name}.toml").read_text()
        assert text.startswith(f"# {name}:")  # a line on what it models


def test_past_release_presets_are_kept_for_their_scenario_only() -> None:
    """The Beluga paper's software as it ran (names saying the release and the scenario) loads
    by name and serves ``validate beluga``; a search and a comparison are set against the
    current releases, and say why the others are left out."""
    from kvtier.search.run import baseline_policies

    assert set(PAST_RELEASE_PRESETS) == {n for n in PRESETS if n.endswith("-beluga")}
    assert current_preset_names() == [n for n in PRESETS if n not in PAST_RELEASE_PRESETS]
    scenario = (ROOT / "policies" / "presets" / "validation" / "beluga-lveval.toml").read_text()
    baselines = baseline_policies(Policy(hardware="h100-node"))
    for name in PAST_RELEASE_PRESETS:
        load_preset(name)  # still loads by name
        assert f'"{name}"' in scenario
        left_out = baselines[name]
        assert isinstance(left_out, InputError) and "validate beluga" in str(left_out)
    assert all(isinstance(baselines[n], Policy) for n in ("vllm-hbm", "mooncake-rdma"))


def test_vllm_presets_schedule_as_their_releases() -> None:
    """``vllm-hbm`` models the current release (one step ahead, vLLM 0.19.1 to 0.34.0's
    default), the Beluga paper's vLLM 0.8.5 baseline schedules in step; otherwise the same."""
    current, beluga = load_preset("vllm-hbm"), load_preset("vllm-0.8.5-hbm-beluga")
    assert current.serving.async_scheduling and not beluga.serving.async_scheduling
    assert replace(current, serving=beluga.serving) == beluga


def test_preset_parameters_that_issue_7_relies_on() -> None:
    beluga, mooncake = load_preset("beluga-cxl"), load_preset("lmcache-0.3-mooncake-beluga")
    assert beluga.block_tokens == 16 and [t.name for t in beluga.tiers] == ["hbm", "cxl"]
    assert mooncake.block_tokens == 256 and [t.name for t in mooncake.tiers] == ["hbm", "rdma"]
    assert beluga.hardware == mooncake.hardware == "beluga-testbed"
    hw = load_hardware("beluga-testbed")
    assert hw.topology.gpus == 16 and hw.tiers["cxl"].devices == 32
    assert hw.tiers["cxl"].capacity_bytes == 8000e9 and not hw.tiers["cxl"].per_host
    assert load_hardware("structera-rack").tiers["cxl"].capacity_bytes == 48000e9
    assert load_hardware("vistara-memserver").tiers["cxl"].per_host


def test_dict_round_trip_with_every_field() -> None:
    data = {
        "format": "kvtier-policy/1",
        "block_tokens": 32,
        "write_policy": "write_through_selective",
        "selective_k": 3,
        "hierarchy": "exclusive",
        "load_rule": "cost_aware",
        "load_wait": "batch",
        "kv_layout": "contiguous",
        "coalesce": 8,
        "share_across_tenants": True,
        "tiers": [
            {"name": "hbm"},
            {"name": "dram", "capacity_gb": 64.0, "eviction": "s3fifo"},
            {"name": "cxl", "capacity_gb": 512.0, "eviction": "gdsf", "interleave": False},
            {"name": "ssd", "eviction": "sieve"},
        ],
    }
    policy = policy_from_dict(data, "<test>")
    assert policy.tier("cxl").interleave is False and policy.tier("rdma") is None
    assert [t.name for t in policy.lower_tiers] == ["dram", "cxl", "ssd"]
    again = policy_to_dict(policy)
    assert policy_from_dict(again, "<again>") == policy
    assert policy_to_dict(policy_from_dict(again, "<again>")) == again


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"write_policy": "sometimes"}, "write_policy"),
        ({"hierarchy": "flat"}, "hierarchy"),
        ({"load_wait": "sometimes"}, "load_wait"),
        ({"coalesce": 0}, "coalesce"),
        ({"tiers": [{"name": "hbm"}, {"name": "nvram"}]}, "tiers[1].name"),
        ({"tiers": [{"name": "hbm"}, {"name": "dram", "eviction": "mru"}]}, "tiers[1].eviction"),
        ({"tiers": [{"name": "hbm"}, {"name": "dram", "interleave": True}]}, "interleave"),
        ({"tiers": [{"name": "hbm"}, {"name": "ssd"}, {"name": "ssd"}]}, "tiers[2].name"),
        ({"tiers": [{"name": "hbm", "eviction": "fifo"}]}, "tiers[0].eviction"),
        ({"tiers": [{"name": "hbm"}, {"name": "cxl", "capacity_gb": -1}]}, "capacity_gb"),
        ({"share_across_tenants": "yes"}, "share_across_tenants"),
    ],
)
def test_bad_policy_dicts_name_the_key(data: dict, key: str) -> None:
    with pytest.raises(InputError) as err:
        policy_from_dict({"format": "kvtier-policy/1", **data}, "p.toml")
    assert key in str(err.value) and "p.toml" in str(err.value)


def test_policy_file_with_tiers(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        'format = "kvtier-policy/1"\nwrite_policy = "write_back"\n'
        '[[tiers]]\nname = "hbm"\n[[tiers]]\nname = "rdma"\ncapacity_gb = 10\n'
    )
    policy = load_policy(path)
    assert policy.write_policy == "write_back" and policy.tier("rdma").capacity_gb == 10.0
    assert Policy().lower_tiers == ()


def test_hardware_tier_table_errors(tmp_path: Path) -> None:
    src = Path(load_hardware("beluga-testbed").source).read_text()
    bad = tmp_path / "hw.toml"
    bad.write_text(src.replace("[tiers.ssd]", "[tiers.tape]"))
    with pytest.raises(InputError, match=r"tiers\.tape"):
        load_hardware(bad)
    bad.write_text(src.replace("devices = 32", "devices = 32\nbogus = 1"))
    with pytest.raises(InputError, match=r"tiers\.cxl\.bogus"):
        load_hardware(bad)


def test_replay_with_a_preset_and_errors(tmp_path: Path) -> None:
    trace = str(ROOT / "traces" / "sample-chat.parquet")
    res = invoke("replay", "--trace", trace, "--preset", "lmcache-cpu-disk", "--json")
    assert res.code == 0, res.stderr
    m = json.loads(res.stdout)
    assert set(m["tier_hit_blocks"]) == {"dram", "ssd"}
    assert m["tier_bytes_written"]["dram"] > 0 and 0 <= m["load_share_of_ttft"] < 1
    assert_one_line_error(invoke("replay", "--trace", trace, "--preset", "nope"), "nope")
    policy = tmp_path / "p.toml"
    policy.write_text('[[tiers]]\nname = "hbm"\n[[tiers]]\nname = "cxl"\n')
    res = invoke("replay", "--trace", trace, "--policy", str(policy), "--hardware", "h100-node")
    assert_one_line_error(res, "cxl", "h100-node")


def test_tenancy_follows_the_policy(tmp_path: Path) -> None:
    """Two tenants with the same prompt share blocks only when the policy allows it."""
    from kvtier.scenario import Scenario
    from kvtier.trace.io import write_trace
    from tests.helpers import make_trace

    trace = make_trace([list(range(64)), list(range(64))], 16, tenants=["a", "b"])
    path = tmp_path / "t.parquet"
    write_trace(trace, path)
    for share, distinct in ((False, 8), (True, 4)):
        policy = tmp_path / f"p{share}.toml"
        policy.write_text(f"share_across_tenants = {str(share).lower()}\n")
        scenario = Scenario.from_files(str(path), policy_path=str(policy))
        assert scenario.blocked().n_blocks == distinct
