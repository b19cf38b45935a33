"""Policy TOML files: defaults, round trip of fields, one-line errors naming file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.errors import InputError
from kvtier.policy import Policy, load_policy


def write(tmp: Path, text: str) -> Path:
    path = tmp / "p.toml"
    path.write_text(text)
    return path


def test_minimal_file_gives_defaults(tmp_path: Path) -> None:
    assert load_policy(write(tmp_path, 'format = "kvtier-policy/1"\n')) == Policy()


def test_full_file(tmp_path: Path) -> None:
    p = load_policy(
        write(
            tmp_path,
            """format = "kvtier-policy/1"
block_tokens = 32
kv_dtype = "fp8"
hardware = "h100-node"
model = "Qwen3-8B"
[serving]
instances = 4
routing = "prefix_affinity"
max_num_batched_tokens = 2048
max_num_seqs = 64
affinity_overload = 2
[[tiers]]
name = "hbm"
eviction = "lru"
capacity_gb = 20.5
[slo]
ttft_p99_s = 2.0
tpot_p99_s = 0.1
""",
        )
    )
    assert p.block_tokens == 32 and p.kv_dtype == "fp8" and p.model == "Qwen3-8B"
    assert p.serving.instances == 4 and p.serving.routing == "prefix_affinity"
    assert p.serving.max_num_batched_tokens == 2048 and p.serving.affinity_overload == 2
    assert p.tiers[0].capacity_gb == 20.5
    assert p.slo is not None and p.slo.ttft_p99_s == 2.0 and p.slo.ttft_mean_s is None


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("block_tokens = 0\n", "block_tokens"),
        ('block_tokens = "16"\n', "block_tokens"),
        ('[serving]\nrouting = "random"\n', "serving.routing"),
        ("[serving]\ninstances = 0\n", "serving.instances"),
        ("[serving]\nmax_num_seq = 4\n", "serving.max_num_seq"),
        ('[[tiers]]\nname = "dram"\n', "tiers[0].name"),
        ("[slo]\nttft_p99_s = -1\n", "slo.ttft_p99_s"),
        ('format = "kvtier-policy/9"\n', "format"),
        ("blocksize = 16\n", "blocksize"),
    ],
)
def test_bad_files_name_the_key(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as err:
        load_policy(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: key '{key}'") and "\n" not in msg


def test_defaults_and_domains_come_from_the_field_metadata() -> None:
    """The loader reads each field's declaration: defaults, integer minimums, choices."""
    from dataclasses import fields

    from kvtier.policy.fields import settings
    from kvtier.policy.model import SLO, ServingPolicy, TierPolicy, policy_from_dict

    for cls in (Policy, ServingPolicy, TierPolicy, SLO):
        declared = {f.name for f in fields(cls) if "help" in f.metadata}
        assert declared == {s.name for s in settings(cls)}
        assert all(s.help for s in settings(cls))
    assert policy_from_dict({}) == Policy()
    overload = next(s for s in settings(ServingPolicy) if s.name == "affinity_overload")
    assert (overload.default, overload.minimum) == (8, 0)
    assert policy_from_dict({"serving": {"affinity_overload": 0}}).serving.affinity_overload == 0
    with pytest.raises(InputError, match="key 'tiers\\[1\\].eviction': must be one of lru, fifo"):
        policy_from_dict({"tiers": [{"name": "hbm"}, {"name": "dram", "eviction": "arc"}]})
    with pytest.raises(InputError, match="key 'tiers\\[0\\].eviction': must be one of lru, got"):
        policy_from_dict({"tiers": [{"name": "hbm", "eviction": "fifo"}]})


@pytest.mark.parametrize(
    "kwargs",
    [{"block_tokens": 0}, {"kv_dtype": "fp4"}, {"coalesce": True}, {"write_policy": "lazy"}],
)
def test_a_policy_built_in_code_is_held_to_the_same_domain(kwargs: dict) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        Policy(**kwargs)


def test_an_unknown_key_lists_the_keys_the_table_takes(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('format = "kvtier-policy/1"\n[serving]\nroutng = "round_robin"\n')
    with pytest.raises(InputError) as err:
        load_policy(path)
    text = str(err.value)
    assert "key 'serving.routng': unknown key (did you mean 'routing'?)" in text
    valid = text.split("valid keys: ")[1].split(", ")
    assert "routing" in valid and "max_num_seqs" in valid and "routng" not in valid
    path.write_text('format = "kvtier-policy/1"\nblok_tokens = 32\n')
    with pytest.raises(
        InputError, match=r"did you mean 'block_tokens'\?\); valid keys: .*kv_dtype"
    ):
        load_policy(path)
