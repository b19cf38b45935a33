"""The search space's per-pool tensor parallelism: conditional sampling, fitted choices, and
no trial of the default space failing to place its split."""

from __future__ import annotations

import itertools

import pytest

from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy import Policy
from kvtier.search.overlay import apply
from kvtier.search.run import fit_space_to_hardware, pool_tp_sizes
from kvtier.search.space import Param, load_space
from kvtier.sim import build_config


def choices(space, name: str) -> tuple:
    return next(p.choices for p in space.params if p.name == name)


def test_pool_sizes_are_sampled_only_for_a_split() -> None:
    space = load_space("default")
    ptp = next(p for p in space.params if p.name == "serving.prefill_tp")
    tp = next(p for p in space.params if p.name == "serving.tp")
    for share, split in ((0.0, False), (0.25, True), (0.5, True), (0.75, True)):
        values = {"serving.prefill_share": share}
        assert ptp.active(values) is split and tp.active(values) is not split


def test_a_when_list_must_name_values_the_parameter_takes(tmp_path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        'format = "kvtier-space/1"\n[params."serving.prefill_share"]\nchoices = [0.0, 0.5]\n'
        '[params."serving.decode_tp"]\nchoices = [1, 2]\n'
        'when = { "serving.prefill_share" = [0.5, 0.9] }\n'
    )
    with pytest.raises(InputError, match="a value that parameter never takes"):
        load_space(path)
    assert Param("x", choices=(1,), when=(("y", (1, 2)),)).active({"y": 2})
    assert not Param("x", choices=(1,), when=(("y", (1, 2)),)).active({"y": 3})


def test_fitted_pool_sizes_fit_the_host_the_other_pool_and_the_weights() -> None:
    hw = load_hardware("h100-node")  # one host of 8 H100s
    assert pool_tp_sizes(hw) == (1, 2, 4)  # 8 would leave no GPU for the other pool
    # Llama-3.1-70B's 141 GB of bf16 weights leave no KV room on one 80 GB GPU
    big = load_model("Llama-3.1-70B")
    assert 1 not in pool_tp_sizes(hw, big) and 4 in pool_tp_sizes(hw, big)
    space = fit_space_to_hardware(load_space("default"), hw, big)
    assert choices(space, "serving.prefill_tp") == pool_tp_sizes(hw, big)
    assert choices(space, "serving.decode_tp") == pool_tp_sizes(hw, big)
    two = load_hardware("beluga-testbed")  # two hosts of 8
    assert pool_tp_sizes(two) == (1, 2, 4, 8)


def test_no_split_of_the_fitted_default_space_fails_to_place() -> None:
    # every share, pool sizes and instance count the fitted space can draw builds a config
    hw, model = load_hardware("h100-node"), load_model("Llama-3.1-8B")
    space = fit_space_to_hardware(load_space("default"), hw, model)
    shares = choices(space, "serving.prefill_share")
    sizes = choices(space, "serving.prefill_tp")
    built = 0
    for share, ptp, dtp, n in itertools.product(shares, sizes, sizes, range(1, 9)):
        if share == 0.0:
            continue
        values = {
            "serving.prefill_share": share,
            "serving.prefill_tp": ptp,
            "serving.decode_tp": dtp,
            "serving.instances": n,
        }
        cfg = build_config(hw, model, apply(Policy(), values))
        gpus = cfg.n_prefill * ptp + (cfg.n_instances - cfg.n_prefill) * dtp
        assert cfg.n_prefill == 0 or gpus <= 8
        built += 1
    assert built == 3 * 9 * 8


def test_a_pinned_tp_fixes_both_pools() -> None:
    from kvtier.search.run import one_size_when_pinned

    space = load_space("default")
    assert one_size_when_pinned(space) is space
    pinned = one_size_when_pinned(space.with_pins({"serving.tp": 2}))
    names = {p.name for p in pinned.params}
    assert "serving.prefill_tp" not in names and "serving.decode_tp" not in names
    both = one_size_when_pinned(space.with_pins({"serving.tp": 2, "serving.prefill_tp": 4}))
    assert "serving.prefill_tp" in {p.name for p in both.params}
    assert "serving.decode_tp" not in {p.name for p in both.params}
