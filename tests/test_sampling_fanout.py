"""A sample's replay under a content-blind router restores the full cluster's routing fan-out."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.fanout import colour_weights, fanned_out, request_colours
from kvtier.trace.io import write_trace
from kvtier.trace.sampling import sample
from kvtier.trace.synth import synthesize
from tests.helpers import invoke


@pytest.fixture(scope="module")
def chat():  # noqa: ANN201
    return synthesize("chat", requests=600, rate=5.0, seed=3)


@pytest.mark.parametrize("fraction", [1.0, 0.5, 0.4, 0.3, 0.25, 0.1, 0.07])
def test_colours_share_with_probability_the_fraction(fraction: float) -> None:
    w = colour_weights(fraction)
    assert len(w) == math.ceil(1 / fraction - 1e-9)
    assert np.all(w >= 0)
    assert w.sum() == pytest.approx(1.0, abs=1e-12)
    assert (w**2).sum() == pytest.approx(fraction, abs=1e-12)  # P(two requests share one)


def test_whole_inverse_fractions_give_equal_colours() -> None:
    assert colour_weights(0.25).tolist() == [0.25] * 4
    assert colour_weights(0.1) == pytest.approx([0.1] * 10)


def test_request_colours_follow_the_weights_and_the_seed() -> None:
    colours = request_colours(200_000, 0.4, seed=0)
    share = np.bincount(colours, minlength=3) / len(colours)
    assert share == pytest.approx(colour_weights(0.4), abs=0.005)
    assert np.array_equal(colours, request_colours(200_000, 0.4, seed=0))
    assert not np.array_equal(colours, request_colours(200_000, 0.4, seed=1))


def _seed_with(pattern: list[bool]) -> int:
    """A seed whose colours for requests 0, 1, 2 (root A's) repeat or differ as ``pattern``
    says: colour(0) == colour(1), colour(0) == colour(2)."""
    for seed in range(1000):
        c = request_colours(6, 0.25, seed)
        if [c[0] == c[1], c[0] == c[2]] == pattern:
            return seed
    raise AssertionError("no seed")


def test_root_private_blocks_are_renamed_per_colour_and_shared_blocks_kept() -> None:
    # roots A A A B B C; block 0 is read by every root, 4 by A (request 2) and C
    blocks = [[0, 1, 2], [0, 1, 2, 5], [0, 1, 4], [0, 3], [0, 3, 6], [0, 4]]
    trace = BlockedTrace.from_lists(
        [0.0, 1, 2, 3, 4, 5], [64] * 6, [1] * 6, blocks, block_tokens=16
    )
    roots = np.array([7, 7, 7, 9, 9, 11], dtype=np.uint64)
    seed = _seed_with([True, False])
    colours = request_colours(6, 0.25, seed)
    out = fanned_out(trace, roots, 0.25, seed)
    ids = [out.request_blocks(i).tolist() for i in range(6)]
    assert len({r[0] for r in ids}) == 1  # the trunk block keeps one id
    assert ids[2][2] == ids[5][1]  # block 4, read by two roots, keeps one id
    assert ids[0][1:3] == ids[1][1:3]  # same colour: root A's blocks shared
    assert ids[2][1] != ids[0][1]  # another colour: not shared
    assert (ids[3][1] == ids[4][1]) == (colours[3] == colours[4])
    flat = [b for r in ids for b in r]
    assert out.n_blocks == len(set(flat))
    firsts = list(dict.fromkeys(flat))
    assert firsts == list(range(out.n_blocks))  # numbered by first appearance
    assert fanned_out(trace, roots, 1.0) is trace


def _scenario(trace, routing: str, engine: str = "numba", preset: str | None = None):  # noqa: ANN001, ANN202
    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy.model import Policy
    from kvtier.policy.overrides import apply_overrides
    from kvtier.policy.presets import load_preset
    from kvtier.scenario import Scenario

    policy = load_preset(preset) if preset else Policy()
    policy = apply_overrides(policy, {"serving.routing": routing}, "--set")
    return Scenario(
        trace, load_hardware("h100-node"), load_model("Llama-3.1-8B"), policy, engine=engine
    )


def test_a_sample_under_round_robin_replays_fanned_out_in_both_engines(chat) -> None:  # noqa: ANN001
    from dataclasses import replace

    sampled, _ = sample(chat, 0.25, seed=2)
    fast = _scenario(sampled, "round_robin").replay()
    slow = _scenario(sampled, "round_robin", engine="reference").replay()
    assert fast.config.n_instances == 2
    for name in ("first_token_s", "finish_s", "hit_blocks", "instance"):
        np.testing.assert_array_equal(getattr(fast.raw, name), getattr(slow.raw, name), name)
    plain_trace = _scenario(sampled, "round_robin").blocked()
    assert fast.trace.n_blocks > plain_trace.n_blocks  # session blocks renamed per colour
    plain = replace(_scenario(sampled, "round_robin"), sample_fan_out=False).replay()
    assert np.array_equal(plain.trace.block_ids, plain_trace.block_ids)
    # a session's turns meet on one instance a quarter as often: fewer HBM hits
    assert fast.raw.hit_blocks.sum() < plain.raw.hit_blocks.sum()


@pytest.mark.parametrize("routing", ["prefix_affinity", "kv_aware"])
def test_content_affine_routers_replay_the_sample_unchanged(chat, routing: str) -> None:  # noqa: ANN001
    sampled, _ = sample(chat, 0.25, seed=2)
    scenario = _scenario(sampled, routing)
    replay = scenario.replay()
    assert np.array_equal(replay.trace.block_ids, scenario.blocked().block_ids)


def test_a_cluster_shared_tier_keeps_the_sample_unchanged(chat) -> None:  # noqa: ANN001
    from kvtier.deploy.sample import fan_out_applies, sample_bias

    scenario = _scenario(chat, "round_robin", preset="mooncake-rdma")
    assert not fan_out_applies(scenario.policy, scenario.hardware)
    line = sample_bias(scenario.policy, scenario.hardware, 0.25)
    assert line is not None and "rdma" in line and "HBM hit ratio is biased high" in line


def test_sample_bias_names_the_routers_the_validation_missed(chat) -> None:  # noqa: ANN001
    from kvtier.deploy.sample import sample_bias

    blind = _scenario(chat, "round_robin")
    assert sample_bias(blind.policy, blind.hardware, 0.25) is None
    affine = _scenario(chat, "prefix_affinity")
    assert sample_bias(affine.policy, affine.hardware, 1.0) is None
    line = sample_bias(affine.policy, affine.hardware, 0.25)
    assert line is not None and "prefix_affinity" in line and "biased high" in line


def test_replay_of_a_sample_warns_in_one_line_for_a_biased_router(chat, tmp_path) -> None:  # noqa: ANN001
    sampled, _ = sample(chat, 0.25, seed=2)
    path = tmp_path / "s.parquet"
    write_trace(sampled, path)
    warned = invoke("replay", "--trace", str(path), "--set", "serving.routing=prefix_affinity")
    assert warned.code == 0, warned.stderr
    lines = [x for x in warned.stderr.splitlines() if x.startswith("warning:")]
    assert len(lines) == 1 and "prefix_affinity" in lines[0]
    quiet = invoke("replay", "--trace", str(path), "--set", "serving.routing=round_robin")
    assert quiet.code == 0, quiet.stderr
    assert "warning:" not in quiet.stderr


def test_compare_and_optimize_of_a_sample_name_each_biased_policy(chat, tmp_path) -> None:  # noqa: ANN001
    import json

    sampled, _ = sample(chat, 0.25, seed=2)
    path = tmp_path / "s.parquet"
    write_trace(sampled, path)
    compared = invoke(
        "compare", "--trace", str(path), "--preset", "vllm-hbm", "--preset", "dynamo-kvbm",
        "--json",
    )  # fmt: skip
    assert compared.code == 0, compared.stderr
    rows = {r["policy"]: r for r in json.loads(compared.stdout)["policies"]}
    assert rows["vllm-hbm"]["sample_bias"] is None  # round_robin: the fan-out is restored
    assert "prefix_affinity" in rows["dynamo-kvbm"]["sample_bias"]
    shown = invoke(
        "compare", "--trace", str(path), "--preset", "vllm-hbm", "--preset", "dynamo-kvbm"
    )
    assert shown.code == 0, shown.stderr
    assert [x for x in shown.stdout.splitlines() if x.startswith("warning:")] == [
        f"warning: {rows['dynamo-kvbm']['sample_bias']}"
    ]
    optimized = invoke(
        "optimize", "--trace", str(path), "--trials", "2", "--no-presets", "--json",
        "--pin", "serving.routing=kv_aware", "--out", str(tmp_path / "p.toml"),
        "--study", "biased", "--storage", f"sqlite:///{tmp_path / 'b.db'}",
    )  # fmt: skip
    assert optimized.code in (0, 1), optimized.stderr
    warnings = json.loads(optimized.stdout)["sample_warnings"]
    assert len(warnings) == 1 and "kv_aware" in warnings[0]
    write_trace(chat, tmp_path / "whole.parquet")
    whole = invoke(
        "optimize", "--trace", str(tmp_path / "whole.parquet"), "--trials", "1", "--no-presets",
        "--json", "--pin", "serving.routing=kv_aware", "--out", str(tmp_path / "w.toml"),
        "--study", "whole", "--storage", f"sqlite:///{tmp_path / 'w.db'}",
    )  # fmt: skip
    assert json.loads(whole.stdout)["sample_warnings"] == []


def test_a_search_on_a_sample_tries_only_instance_counts_it_can_scale() -> None:
    from kvtier.errors import InputError
    from kvtier.hardware import load_hardware
    from kvtier.search.run import fit_space_to_sample
    from kvtier.search.space import load_space
    from kvtier.trace.sample_correction import sample_instance_step

    assert [sample_instance_step(f) for f in (1.0, 0.5, 0.25, 0.1, 0.3, 0.125)] == [
        1, 2, 4, 10, 10, 8,
    ]  # fmt: skip
    hw = load_hardware("h100-node")
    space = load_space("default")
    fitted = fit_space_to_sample(space, 0.25, hw)
    (instances,) = [p for p in fitted.params if p.name == "serving.instances"]
    assert all(n % 4 == 0 for n in instances.grid()) and instances.grid()[0] == 4
    assert fit_space_to_sample(space, 1.0, hw) is space
    with pytest.raises(InputError, match="multiple of 10 instances, and the hardware has room"):
        fit_space_to_sample(space, 0.1, hw)
    with pytest.raises(InputError, match="multiple of 4 instances, not 6"):
        fit_space_to_sample(space.with_pins({"serving.instances": 6}), 0.25, hw)
