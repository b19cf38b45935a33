"""``--set`` / ``--pin`` overrides: parsing, every error, applying, and the optimize CLI."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from kvtier.errors import InputError
from kvtier.hardware.types import LOWER_TIERS
from kvtier.policy.model import SLO, Policy, ServingPolicy, TierPolicy
from kvtier.policy.overrides import apply_overrides, override_keys, parse_overrides
from kvtier.search.space import parse_pins
from kvtier.trace.io import write_trace
from tests.helpers import assert_one_line_error, invoke, make_trace


def test_values_parse_as_toml_scalars_or_bare_strings() -> None:
    got = parse_overrides(
        (
            "block_tokens=64",
            "kv_dtype=fp8",
            "serving.routing = least_loaded",
            "serving.instances=2",
            "tiers.cxl.capacity_gb=64",
            "tiers.dram.enabled=true",
            "tiers.dram.eviction=s3fifo",
            "tiers.cxl.interleave=false",
            "share_across_tenants=true",
            'hierarchy="exclusive"',
            "slo.ttft_p99_s=2.5",
        ),
        "--set",
    )
    assert got == {
        "block_tokens": 64,
        "kv_dtype": "fp8",
        "serving.routing": "least_loaded",
        "serving.instances": 2,
        "tiers.cxl.capacity_gb": 64.0,
        "tiers.dram.enabled": True,
        "tiers.dram.eviction": "s3fifo",
        "tiers.cxl.interleave": False,
        "share_across_tenants": True,
        "hierarchy": "exclusive",
        "slo.ttft_p99_s": 2.5,
    }
    assert isinstance(got["tiers.cxl.capacity_gb"], float)


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("blocktokens=64", ["unknown key 'blocktokens'", "did you mean 'block_tokens'"]),
        ("foo=3", ["unknown key 'foo'", "valid keys: block_tokens, kv_dtype"]),
        ("tiers.gpu.capacity_gb=3", ["unknown key 'tiers.gpu.capacity_gb'"]),
        ("tiers.hbm.enabled=false", ["unknown key 'tiers.hbm.enabled'"]),
        ("tiers.hbm.eviction=fifo", ["unknown key 'tiers.hbm.eviction'"]),
        ("tiers.dram.interleave=true", ["unknown key 'tiers.dram.interleave'"]),
        ("hardware=h100-node", ["unknown key 'hardware'", "--hardware"]),
        ("serving=3", ["unknown key 'serving'"]),
        ("block_tokens", ["--set takes name=value, got 'block_tokens'"]),
        ("=3", ["--set takes name=value"]),
        ("block_tokens=", ["--set takes name=value"]),
        ("block_tokens=[1, 2]", ["key 'block_tokens': a single value is needed"]),
        ("block_tokens=0", ["key 'block_tokens': must be >= 1, got 0"]),
        ("block_tokens=abc", ["key 'block_tokens': must be an integer, got 'abc'"]),
        ("block_tokens=16.0", ["key 'block_tokens': must be an integer"]),
        ("serving.affinity_overload=-1", ["key 'serving.affinity_overload': must be >= 0"]),
        (
            "serving.routing=fastest",
            ["key 'serving.routing'", "round_robin, least_loaded, prefix_affinity"],
        ),
        ("tiers.dram.eviction=arc", ["key 'tiers.dram.eviction'", "lru, fifo, lfu, s3fifo"]),
        ("write_policy=lazy", ["key 'write_policy'", "write_through_selective"]),
        ("load_rule=never", ["key 'load_rule'", "always_load, cost_aware"]),
        ("tiers.cxl.capacity_gb=-1", ["key 'tiers.cxl.capacity_gb': must be > 0"]),
        ("tiers.cxl.capacity_gb=big", ["key 'tiers.cxl.capacity_gb': must be a finite number"]),
        ("tiers.cxl.enabled=yes", ["key 'tiers.cxl.enabled': must be true or false"]),
        ("share_across_tenants=1", ["key 'share_across_tenants': must be true or false"]),
    ],
)
def test_every_bad_item_is_one_line_naming_option_and_key(text: str, needles: list[str]) -> None:
    with pytest.raises(InputError) as err:
        parse_overrides((text,), "--set")
    message = str(err.value)
    assert "\n" not in message
    assert "--set" in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_a_key_given_twice_is_refused() -> None:
    with pytest.raises(InputError, match="key 'block_tokens' is given twice"):
        parse_overrides(("block_tokens=16", "block_tokens=64"), "--set")


def test_every_declared_field_is_a_key() -> None:
    keys = override_keys()
    for f in fields(Policy):
        if "help" in f.metadata and f.name not in ("hardware", "model"):
            assert f.name in keys
    for f in fields(ServingPolicy):
        assert f"serving.{f.name}" in keys
    for f in fields(SLO):
        assert f"slo.{f.name}" in keys
    assert {"tiers.ssd.enabled", "tiers.hbm.capacity_gb", "tiers.cxl.interleave"} <= set(keys)
    assert {"tiers.dram.per_engine", "tiers.ssd.per_engine", "tiers.c2c.per_engine"} <= set(keys)
    # enabled, eviction, eight connector keys and the two of a pool's batch eviction per lower
    # tier, capacity per tier, interleave, per_engine for the four per-host kinds (c2c, dram,
    # pagecache, ssd)
    n = len(LOWER_TIERS)
    assert len([k for k in keys if k.startswith("tiers.")]) == n * (2 + 8 + 2) + (n + 1) + 1 + 4
    assert {"tiers.rdma.eviction_high_watermark", "tiers.rdma.eviction_ratio"} <= set(keys)
    assert "tiers.hbm.eviction_high_watermark" not in keys
    assert "tiers.dram.defer_loading_hits" in keys
    assert "tiers.ssd.visible_when_stored" in keys


def test_connector_keys_set_a_tiers_transfer_path() -> None:
    base = Policy(tiers=(TierPolicy(), TierPolicy("rdma")))
    got = apply_overrides(
        base,
        parse_overrides(
            ("tiers.rdma.connector=lmcache-mooncake", "tiers.rdma.depth=4",
             "tiers.rdma.store_blocks=true"),
            "--set",
        ),
        "--set",
    )  # fmt: skip
    rdma = got.tier("rdma")
    assert (rdma.connector, rdma.depth, rdma.store_blocks) == ("lmcache-mooncake", 4, True)
    with pytest.raises(InputError, match="lmcache-mooncake"):
        apply_overrides(base, {"tiers.rdma.connector": "lmcache"}, "--set")


def test_apply_overrides_over_a_policy() -> None:
    base = Policy(tiers=(TierPolicy(), TierPolicy("cxl", capacity_gb=512.0)))
    overrides = parse_overrides(
        (
            "block_tokens=64",
            "serving.routing=prefix_affinity",
            "tiers.dram.capacity_gb=128",
            "tiers.cxl.enabled=false",
            "slo.ttft_p99_s=2",
        ),
        "--set",
    )
    got = apply_overrides(base, overrides, "--set")
    assert got.block_tokens == 64
    assert got.serving.routing == "prefix_affinity"
    assert [t.name for t in got.tiers] == ["hbm", "dram"]
    assert got.tier("dram").capacity_gb == 128.0
    assert got.slo == SLO(ttft_p99_s=2.0)
    # Untouched fields keep the base's values; an empty override is the policy itself.
    assert got.kv_dtype == base.kv_dtype and got.serving.max_num_seqs == 1024
    assert apply_overrides(base, {}, "--set") is base
    # A tier listed by an override goes in lookup order, whatever the override order.
    both = apply_overrides(Policy(), {"tiers.ssd.enabled": True, "tiers.dram.enabled": True}, "x")
    assert [t.name for t in both.tiers] == ["hbm", "dram", "ssd"]


def test_apply_overrides_checks_a_dict_not_from_the_parser() -> None:
    with pytest.raises(InputError, match="option --set: unknown key 'blocktokens'"):
        apply_overrides(Policy(), {"blocktokens": 64}, "--set")
    with pytest.raises(InputError, match="option --set: key 'kv_dtype': must be one of"):
        apply_overrides(Policy(), {"kv_dtype": "fp4"}, "--set")
    with pytest.raises(InputError, match="option --set: key 'tiers.dram.enabled': must be true"):
        apply_overrides(Policy(), {"tiers.dram.enabled": 1}, "--set")


def test_pins_are_overrides_less_the_slo() -> None:
    assert parse_pins(("block_tokens=64", "tiers.cxl.enabled=true")) == {
        "block_tokens": 64,
        "tiers.cxl.enabled": True,
    }
    with pytest.raises(InputError, match="option --pin: unknown key 'blocktokens'"):
        parse_pins(("blocktokens=64",))
    with pytest.raises(InputError, match="option --pin: key 'slo.ttft_p99_s'.*--slo"):
        parse_pins(("slo.ttft_p99_s=1",))


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("pins") / "t.parquet"
    write_trace(make_trace([list(range(64))] * 4, 16), path)
    return path


@pytest.mark.parametrize(
    ("pin", "needles"),
    [
        ("blocktokens=64", ["option --pin", "unknown key 'blocktokens'", "block_tokens"]),
        ("foo=3", ["option --pin", "unknown key 'foo'", "valid keys: block_tokens"]),
        ("block_tokens=0", ["option --pin", "key 'block_tokens': must be >= 1"]),
        ("serving.routing=fastest", ["option --pin", "key 'serving.routing'", "least_loaded"]),
    ],
)
def test_optimize_refuses_a_bad_pin(small_trace: Path, tmp_path: Path, pin, needles) -> None:
    result = invoke(
        "optimize",
        "--trace",
        str(small_trace),
        "--trials",
        "1",
        "--storage",
        f"sqlite:///{tmp_path / 'x.db'}",
        "--pin",
        pin,
    )
    assert_one_line_error(result, *needles)
    assert not (tmp_path / "x.db").exists()  # refused before any study was opened


def test_pin_errors_list_the_keys_a_search_takes() -> None:
    with pytest.raises(InputError) as err:
        parse_pins(("foo=3",))
    assert "slo." not in str(err.value) and "serving.routing" in str(err.value)
    with pytest.raises(InputError) as err:
        parse_overrides(("foo=3",), "--set")
    assert "slo.ttft_p99_s" in str(err.value)


@pytest.mark.parametrize("command", ["replay", "compare"])
def test_replay_and_compare_refuse_a_bad_set(small_trace: Path, command: str) -> None:
    result = invoke(
        command, "--trace", str(small_trace), "--preset", "vllm-hbm", "--set", "blocktokens=32"
    )
    assert_one_line_error(result, "option --set", "unknown key 'blocktokens'", "block_tokens")


def test_per_engine_on_a_shared_tier_in_a_policy_file_is_one_line(tmp_path) -> None:
    """``per_engine`` applies to the per-host tiers only; in a policy file on another tier it
    is refused in one line naming the file and key (no traceback)."""
    from tests.helpers import REPO, assert_one_line_error, invoke

    policy = tmp_path / "p.toml"
    policy.write_text('[[tiers]]\nname = "hbm"\n[[tiers]]\nname = "cxl"\nper_engine = true\n')
    result = invoke("replay", "--trace", str(REPO / "traces" / "sample-chat.parquet"),
                    "--policy", str(policy), "--hardware", "beluga-testbed")  # fmt: skip
    assert_one_line_error(result, str(policy), "tiers[1].per_engine", "c2c, dram, pagecache, ssd")
