"""Settings of how KV moves below HBM take no effect without a lower tier (and the transfers'
layout and coalescing none without a prefill-to-decode hand-off either): each replays to the
same per-request times, in both engines. So a report marks them, a policy file leaves them out
and an export neither writes them nor calls them inexpressible."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import (
    Policy,
    ServingPolicy,
    TierPolicy,
    inert_movement_keys,
    without_inert_movement,
)
from kvtier.sim.config import build_config
from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.io import write_trace
from tests.helpers import assert_fields_equal, invoke, make_trace, replay_both

B = 16
# a value away from the default for every setting of how KV moves below HBM
CHANGED = {
    "write_policy": "write_back",
    "selective_k": 5,
    "hierarchy": "exclusive",
    "load_rule": "cost_aware",
    "load_wait": "batch",
    "load_report": "at_once",
    "load_caching": "at_admission",
    "kv_layout": "contiguous",
    "coalesce": 8,
}
TRANSFER_KEYS = ("kv_layout", "coalesce")


def shared_prefixes() -> BlockedTrace:
    """Forty requests over four 6-block prefixes and a block of their own each, arriving 50 ms
    apart: prefix hits, and evictions in a 20-block HBM."""
    rng = np.random.default_rng(11)
    arrivals, inputs, outputs, blocks = [], [], [], []
    for i in range(40):
        p = int(rng.integers(4))
        arrivals.append(0.05 * i)
        inputs.append(7 * B)
        outputs.append(int(rng.integers(8, 40)))
        blocks.append([*range(6 * p, 6 * p + 6), 24 + i])
    return BlockedTrace.from_lists(arrivals, inputs, outputs, blocks, B, n_blocks=64)


def policy(split: bool, **changed: object) -> Policy:
    """Llama-3.1-8B on two H100 instances with a 20-block HBM and no lower tier; ``split``:
    one prefill and one decode instance."""
    serving = ServingPolicy(instances=2, prefill_share=0.5 if split else 0.0)
    hbm = TierPolicy(capacity_gb=20 * B * 131_072 / 1e9)
    return Policy(block_tokens=B, serving=serving, tiers=(hbm,), **changed)  # type: ignore[arg-type]


def replay(p: Policy):  # noqa: ANN201
    cfg = build_config(load_hardware("h100-node"), load_model("Llama-3.1-8B"), p)
    both = replay_both(shared_prefixes(), cfg)
    assert both is not None
    ref, fast = both
    assert_fields_equal(ref, fast)
    return fast


@pytest.mark.parametrize("split", [False, True], ids=["aggregated", "split"])
def test_settings_without_a_lower_tier_replay_the_same(split: bool) -> None:
    base = replay(policy(split))
    assert base.hit_blocks.sum() > 0  # prefixes are hit: the trace exercises the cache
    for key, value in CHANGED.items():
        if split and key in TRANSFER_KEYS:
            continue
        assert_fields_equal(base, replay(policy(split, **{key: value})))
        assert key in inert_movement_keys(policy(split, **{key: value}), split)


def test_a_split_hand_off_feels_the_transfer_settings() -> None:
    """With prefill and decode instances the layout and coalescing cut the hand-off into
    operations, so they are not inert there."""
    base = replay(policy(True))
    for key in TRANSFER_KEYS:
        changed = replay(policy(True, **{key: CHANGED[key]}))
        assert not np.array_equal(base.first_token_s, changed.first_token_s), key
        assert key not in inert_movement_keys(policy(True, **{key: CHANGED[key]}), True)


def test_selective_k_outside_selective_write_through_replays_the_same() -> None:
    """With a lower tier, ``selective_k`` acts only under ``write_through_selective``."""
    dram = TierPolicy(name="dram", capacity_gb=1.0)
    tiered = replace(policy(False), tiers=(policy(False).tiers[0], dram))
    base = replay(tiered)
    assert base.loaded_blocks.sum() > 0  # the lower tier serves hits: writes reached it
    assert_fields_equal(base, replay(replace(tiered, selective_k=5)))
    selective = replace(tiered, write_policy="write_through_selective")
    assert "selective_k" not in inert_movement_keys(replace(selective, selective_k=5), False)


def test_inert_keys_with_a_lower_tier_and_their_defaults() -> None:
    dram = TierPolicy(name="dram", capacity_gb=1.0)
    tiered = replace(policy(False, **CHANGED), tiers=(TierPolicy(), dram))
    # with a lower tier only selective_k, outside write_through_selective, does nothing
    assert inert_movement_keys(tiered, False) == {
        "selective_k": "write_policy is not write_through_selective"
    }
    assert inert_movement_keys(policy(False), False) == {}  # defaults: nothing to drop
    reset = without_inert_movement(policy(False, **CHANGED), False)
    assert inert_movement_keys(reset, False) == {}
    assert all(getattr(reset, k) == getattr(Policy(), k) for k in CHANGED)
    assert without_inert_movement(policy(False), False) == policy(False)


def test_export_of_an_hbm_only_policy_skips_its_inert_settings(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    lines = [f"{k} = {json.dumps(v)}" for k, v in CHANGED.items()]
    path.write_text('format = "kvtier-policy/1"\n' + "\n".join(lines) + "\n")
    result = invoke("export", str(path), "--target", "vllm", "--json")
    assert result.code == 0, result.stderr
    notes = json.loads(result.stdout)["notes"]
    assert not [n for n in notes if n["kind"] == "inexpressible"], notes
    said = [n["text"] for n in notes if "no effect" in n["text"]]
    assert len(said) == 1 and all(k in said[0] for k in CHANGED if k != "selective_k")


def test_optimize_marks_inert_movement_settings_and_leaves_them_out(tmp_path: Path) -> None:
    trace = tmp_path / "t.parquet"
    write_trace(make_trace([list(range(64))] * 8, 16), trace)
    out = tmp_path / "best.toml"
    pins = {"serving.instances": 1, "load_rule": "cost_aware", "coalesce": 16}
    pins |= {f"tiers.{t}.enabled": "false" for t in ("cxl", "dram", "rdma", "ssd")}
    result = invoke(
        "optimize", "--trace", str(trace), "--trials", "2", "--no-presets", "--no-refine",
        "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", str(out),
        *(a for k, v in pins.items() for a in ("--pin", f"{k}={v}")),
    )  # fmt: skip
    assert result.code == 0, result.stderr
    rows = {ln.split("│")[1].strip(): ln.split("│")[2] for ln in result.stdout.splitlines()
            if ln.count("│") == 3}  # fmt: skip
    assert "no effect: no lower tier" in rows["load_rule"]
    assert "no effect" in rows["coalesce"]
    # sampled at their defaults, the other settings of lower tiers are marked too
    assert all("no effect" in rows[k] for k in ("write_policy", "hierarchy") if k in rows)
    assert "no effect" not in rows["block_tokens"]
    data = tomllib.loads(out.read_text())
    assert data.get("load_rule", "always_load") == "always_load"
    assert data.get("coalesce", 1) == 1
