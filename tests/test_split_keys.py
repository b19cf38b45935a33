"""The prefill/decode split is stated once: ``serving.prefill_instances`` or
``serving.prefill_share``, never both, from a policy file, ``--set``, a preset plus an override
or ``--pin``; a pinned count takes the share out of a search instead of ignoring it per trial."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvtier.errors import InputError
from kvtier.policy.model import Policy, prefill_count
from kvtier.policy.overrides import apply_overrides
from kvtier.policy.presets import load_preset
from kvtier.search.overlay import apply
from kvtier.search.space import load_space, parse_pins
from kvtier.trace.io import write_trace
from tests.helpers import assert_one_line_error, invoke, make_trace

BOTH = ("serving.prefill_share", "serving.prefill_instances")


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("split") / "t.parquet"
    write_trace(make_trace([list(range(64))] * 4, 16), path)
    return path


def test_a_policy_file_with_both_keys_is_refused(small_trace: Path, tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(
        'format = "kvtier-policy/1"\n[serving]\ninstances = 4\n'
        "prefill_instances = 1\nprefill_share = 0.5\n"
    )
    result = invoke("replay", "--trace", str(small_trace), "--policy", str(path))
    assert_one_line_error(result, str(path), *BOTH)


def test_both_keys_in_set_are_refused(small_trace: Path) -> None:
    result = invoke(
        "replay", "--trace", str(small_trace),
        "--set", "serving.prefill_share=0.5", "--set", "serving.prefill_instances=2",
    )  # fmt: skip
    assert_one_line_error(result, "option --set", *BOTH)


def test_a_share_over_a_preset_that_counts_is_refused_with_the_fix() -> None:
    preset = load_preset("dynamo-disagg")
    assert preset.serving.prefill_instances > 0
    with pytest.raises(InputError) as err:
        apply_overrides(preset, {"serving.prefill_share": 0.25}, "--set")
    text = str(err.value)
    assert "option --set" in text and all(k in text for k in BOTH)
    assert "--set serving.prefill_instances=0" in text
    # the fix the message names: the share then decides the split
    fixed = apply_overrides(
        preset, {"serving.prefill_share": 0.25, "serving.prefill_instances": 0}, "--set"
    )
    assert prefill_count(fixed.serving, 8) == 2
    # the same key as the preset's, or a share of 0 (aggregated's default), is no conflict
    assert apply_overrides(preset, {"serving.prefill_instances": 2}, "--set").serving
    assert apply_overrides(preset, {"serving.prefill_share": 0.0}, "--set").serving


def test_a_count_over_a_policy_with_a_share_is_refused() -> None:
    shared = apply_overrides(Policy(), {"serving.prefill_share": 0.5}, "--set")
    with pytest.raises(InputError, match="serving.prefill_share=0.0"):
        apply_overrides(shared, {"serving.prefill_instances": 2}, "--set")


def test_both_pinned_are_refused() -> None:
    pins = parse_pins(("serving.prefill_share=0.5", "serving.prefill_instances=2"))
    with pytest.raises(InputError) as err:
        load_space("default").with_pins(pins)
    assert "option --pin" in str(err.value) and all(k in str(err.value) for k in BOTH)


def test_a_pinned_count_takes_the_share_out_of_the_search() -> None:
    space = load_space("default")
    pinned = space.with_pins({"serving.prefill_instances": 2})
    names = {p.name for p in pinned.params}
    assert "serving.prefill_share" not in names
    # the split is on: its pool sizes are always sampled, the aggregated size never
    assert "serving.tp" not in names
    for key in ("serving.prefill_tp", "serving.decode_tp"):
        param = next(p for p in pinned.params if p.name == key)
        assert param.when == () and param.active({})
    # every trial of the pinned space is a policy the loader accepts
    values = {**pinned.pinned, "serving.prefill_tp": 2, "serving.decode_tp": 1}
    policy = apply(Policy(), {**values, "serving.instances": 4})
    assert prefill_count(policy.serving, 4) == 2
    # a count of 0 leaves the split to the share: the space is unchanged
    assert space.with_pins({"serving.prefill_instances": 0}).params == space.params


def test_optimize_refuses_both_pins_before_a_study(small_trace: Path, tmp_path: Path) -> None:
    result = invoke(
        "optimize", "--trace", str(small_trace), "--trials", "1",
        "--storage", f"sqlite:///{tmp_path / 'x.db'}",
        "--pin", "serving.prefill_share=0.5", "--pin", "serving.prefill_instances=1",
    )  # fmt: skip
    assert_one_line_error(result, "option --pin", *BOTH)
    assert not (tmp_path / "x.db").exists()
