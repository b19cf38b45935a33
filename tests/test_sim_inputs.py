"""Inputs the simulator refuses, with errors instead of crashes."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy import Policy
from kvtier.sim import build_config, simulate, simulate_raw
from kvtier.trace.blocked import BlockedTrace

TRACE = BlockedTrace.from_lists([0.0, 1.0], [40, 20], [3, 2], [[0, 1], [0]], 16)


@pytest.fixture(scope="module")
def cfg():
    return build_config(load_hardware("h100-node"), load_model("Llama-3.1-8B"), Policy())


def test_block_size_mismatch(cfg) -> None:
    hw, model = load_hardware("h100-node"), load_model("Llama-3.1-8B")
    with pytest.raises(InputError, match="B=16 but the policy says B=32"):
        simulate(TRACE, hw, model, Policy(block_tokens=32))
    with pytest.raises(InputError, match="blocked at B=16"):
        simulate_raw(TRACE, replace(cfg, block_tokens=32))


@pytest.mark.parametrize(
    "change",
    [
        {"capacity_blocks": 0},
        {"n_instances": 0},
        {"max_seqs": 0},
        {"token_budget": 0},
        {"router": 7},
        {"mem_rate": 0.0},
        {"compute_rate": float("nan")},
    ],
)
def test_bad_config_never_reaches_the_kernel(cfg, change) -> None:
    with pytest.raises(ValueError):
        simulate_raw(TRACE, replace(cfg, **change))


def test_model_that_does_not_fit() -> None:
    with pytest.raises(InputError, match="leaves no room for KV blocks"):
        build_config(load_hardware("h100-node"), load_model("Llama-3.1-405B"), Policy())


def test_unknown_engine(cfg) -> None:
    with pytest.raises(InputError, match="unknown engine"):
        simulate_raw(TRACE, cfg, engine="gpu")


def test_empty_trace_on_both_engines(cfg) -> None:
    empty = BlockedTrace.from_lists([], [], [], [], 16)
    for engine in ("numba", "reference"):
        m = simulate(
            empty, load_hardware("h100-node"), load_model("Llama-3.1-8B"), Policy(), engine=engine
        )
        assert m.n_requests == 0 and m.n_served == 0 and m.n_iterations == 0


def test_an_hbm_size_below_one_block_names_the_key() -> None:
    # the policy's own capacity_gb is what to change, not the model's weights
    from kvtier.policy.overrides import apply_overrides

    policy = apply_overrides(Policy(), {"tiers.hbm.capacity_gb": 0.001}, "--set")
    with pytest.raises(InputError) as err:
        build_config(load_hardware("h100-node"), load_model("Llama-3.1-8B"), policy)
    assert err.value.option == "tiers.hbm.capacity_gb"
    assert "holds no KV block" in err.value.message and "at least 0.0021" in err.value.message


def test_a_decode_pool_without_room_names_its_tp_and_the_sizes_that_fit() -> None:
    from kvtier.policy.overrides import apply_overrides

    policy = apply_overrides(
        Policy(),
        {"serving.prefill_instances": 1, "serving.prefill_tp": 4, "serving.decode_tp": 1},
        "--set",
    )
    with pytest.raises(InputError, match="leaves no room for KV blocks") as err:
        build_config(load_hardware("h100-node"), load_model("Llama-3.1-70B"), policy)
    assert err.value.option == "serving.decode_tp"
    # two H100s hold its 141 GB of BF16 weights with about 2 GB to spare (docs/model.md,
    # "The KV budget"), one cannot
    assert "sizes that leave room: 2, 4, 8" in err.value.message
