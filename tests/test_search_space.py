"""Search-space files, pins and policy overlays."""

from __future__ import annotations

import pytest

from kvtier.errors import InputError
from kvtier.policy.model import Policy, policy_from_dict, policy_to_dict
from kvtier.search.overlay import apply, overlay
from kvtier.search.space import Param, load_space, parse_pin


def test_builtin_default_space_loads() -> None:
    space = load_space("default")
    names = {p.name for p in space.params}
    assert {"block_tokens", "serving.instances", "serving.routing"} <= names
    # kv_dtype is searched; optimize keeps it at bf16 unless --allow-lossy-kv
    assert "kv_dtype" in names and "kv_dtype" not in space.pinned


def write(tmp_path, text: str):
    path = tmp_path / "s.toml"
    path.write_text('format = "kvtier-space/1"\n' + text)
    return path


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[params.coalesce]\nlow = 5\nhigh = 3\n", "low <= high must hold, but got low=5, high=3"),
        ("[params.coalesce]\nchoices = []\n", "choices must not be empty"),
        ("[params.coalesce]\nlow = 0\nhigh = 3\nlog = true\n", "log range needs low > 0"),
        ("[params.coalesce]\nlow = 1\n", "needs choices, or low and high"),
        ("[params.coalesce]\nchoices = [1]\nbogus = 1\n", "unknown key"),
        ("[params.coalesce]\nlow = 'a'\nhigh = 2\n", "low must be a number"),
        ("", "needs at least one"),
        ("[params.coalesce]\nchoices = [1, 2]\n[pinned]\ncoalesce = 3\n", "both searched"),
        ("[params.coalesce\n", "invalid TOML"),
        # The space's own parameters are policy keys, their values in the policy's domain.
        ("[params.blocktokens]\nchoices = [16]\n", "unknown key 'blocktokens'"),
        ("[params.block_tokens]\nlow = 0\nhigh = 64\n", "'block_tokens': must be >= 1"),
        ('[params."serving.routing"]\nchoices = ["lru"]\n', "must be one of round_robin"),
        ("[params.coalesce]\nchoices = [1]\n[pinned]\nfoo = 3\n", "unknown key 'foo'"),
        ("[params.coalesce]\nchoices = [1]\nwhen = { bogus = 1 }\n", "unknown key 'bogus'"),
        ("[params.block_tokens]\nchoices = [16]\n[pinned]\n'slo.ttft_p99_s' = 1.0\n", "--slo"),
    ],
)
def test_bad_space_files(tmp_path, text: str, needle: str) -> None:
    with pytest.raises(InputError) as err:
        load_space(write(tmp_path, text))
    assert needle in str(err.value) and str(tmp_path) in str(err.value)
    assert "\n" not in str(err.value)


def test_wrong_format_and_missing(tmp_path) -> None:
    path = tmp_path / "f.toml"
    path.write_text('format = "other"\n[params.coalesce]\nchoices=[1]\n')
    with pytest.raises(InputError, match="kvtier-space/1"):
        load_space(path)
    with pytest.raises(InputError, match="no such search space"):
        load_space("does-not-exist")


def test_pins() -> None:
    assert parse_pin("block_tokens=64") == ("block_tokens", 64)
    assert parse_pin("serving.routing=least_loaded") == ("serving.routing", "least_loaded")
    assert parse_pin("tiers.cxl.enabled=true") == ("tiers.cxl.enabled", True)
    for bad in ("block_tokens", "=3", "x=", "x=[1,2]"):
        with pytest.raises(InputError, match="--pin"):
            parse_pin(bad)
    space = load_space("default")
    with pytest.raises(InputError, match="outside"):
        space.with_pins({"serving.instances": 99})
    pinned = space.with_pins({"block_tokens": 64})
    assert "block_tokens" not in {p.name for p in pinned.free()}


def test_grid_and_conditions() -> None:
    a = Param("a", choices=(True, False))
    b = Param("b", low=1, high=3, integer=True, when=(("a", True),))
    from kvtier.search.space import SearchSpace

    space = SearchSpace((a, b))
    grid = space.grid()
    assert grid == [{"a": True, "b": 1}, {"a": True, "b": 2}, {"a": True, "b": 3}, {"a": False}]
    assert space.size() is None  # conditional: counted by the grid instead
    assert (
        SearchSpace((Param("c", choices=(1, 2)), Param("d", low=0, high=4, integer=True))).size()
        == 10
    )


def test_overlay_and_round_trip() -> None:
    base = policy_to_dict(Policy())
    data = overlay(base, {"block_tokens": 64, "serving.routing": "least_loaded"})
    assert data["block_tokens"] == 64 and data["serving"]["routing"] == "least_loaded"
    assert base["block_tokens"] == 16  # the base is not modified
    policy = apply(Policy(), {"serving.instances": 3})
    assert policy.serving.instances == 3
    assert policy_from_dict(policy_to_dict(policy)) == policy
    with pytest.raises(InputError):
        apply(Policy(), {"serving.routing": "nope"})
    with pytest.raises(InputError, match="hbm tier cannot be disabled"):
        overlay(base, {"tiers.hbm.enabled": False})


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        # a parameter table's keys
        ("[params.coalesce]\nchoices = [1]\nchoice = [2]\n", "choices, high, log, low, step, when"),
        # the file's top-level keys
        ("pined = {}\n[params.coalesce]\nchoices = [1]\n", "description, format, params, pinned"),
    ],
)
def test_unknown_space_keys_list_the_valid_ones(tmp_path, text: str, valid: str) -> None:
    # as the prices file's error does: the user sees what the key should have been
    with pytest.raises(InputError) as err:
        load_space(write(tmp_path, text))
    assert f"(valid: {valid})" in str(err.value), str(err.value)
    assert "\n" not in str(err.value)
