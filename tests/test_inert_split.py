"""A split that leaves one instance aggregated: optimize marks its share and pool sizes as
having no effect, and the policy file it writes is the aggregated deployment that ran."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from kvtier.policy.model import Policy
from kvtier.policy.overrides import apply_overrides
from kvtier.trace.io import write_trace
from tests.helpers import invoke, make_trace

SPLIT = {"serving.prefill_share": 0.5, "serving.prefill_tp": 2, "serving.decode_tp": 1}


def test_a_share_of_one_instance_makes_its_split_keys_inert() -> None:
    from kvtier.policy.model import inert_split_keys, without_inert_split

    policy = apply_overrides(Policy(), SPLIT, "--set")
    assert inert_split_keys(policy.serving, 1) == tuple(SPLIT)
    assert inert_split_keys(policy.serving, 4) == ()  # split: every key applies
    assert inert_split_keys(Policy().serving, 1) == ()  # nothing set: nothing inert
    ran = without_inert_split(policy, 1)
    s = ran.serving
    assert (s.instances, s.prefill_share, s.prefill_tp, s.decode_tp) == (1, 0.0, None, None)
    assert without_inert_split(policy, 4) is policy


@pytest.fixture(scope="module")
def small_trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("inert") / "t.parquet"
    write_trace(make_trace([list(range(64))] * 8, 16), path)
    return path


def test_optimize_marks_inert_split_keys_and_writes_the_policy_that_ran(
    small_trace: Path, tmp_path: Path
) -> None:
    out = tmp_path / "best.toml"
    pins = [f"{k}={v}" for k, v in {"serving.instances": 1, **SPLIT}.items()]
    result = invoke(
        "optimize", "--trace", str(small_trace), "--trials", "2", "--no-presets",
        "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", str(out),
        *(a for pin in pins for a in ("--pin", pin)),
    )  # fmt: skip
    assert result.code == 0, result.stderr
    rows = {ln.split("│")[1].strip(): ln.split("│")[2] for ln in result.stdout.splitlines()
            if ln.count("│") == 3}  # fmt: skip
    for key in SPLIT:
        assert "no effect: aggregated" in rows[key], (key, rows.get(key))
    assert "no effect" not in rows["serving.instances"]
    data = tomllib.loads(out.read_text())
    serving = data["serving"]
    assert "prefill_tp" not in serving and "decode_tp" not in serving
    assert serving["prefill_share"] == 0.0 and serving["instances"] == 1
    # the file replays to the metrics the trial recorded
    replay = invoke("replay", "--trace", str(small_trace), "--policy", str(out), "--json")
    assert replay.code == 0, replay.stderr
    got = json.loads(replay.stdout)
    assert got["instances"] == 1
    assert got["ttft_p99_s"] == pytest.approx(data["metrics"]["ttft_p99_s"])
    assert got["cost_per_mtok"] == pytest.approx(data["metrics"]["cost_per_mtok"])
    js = invoke(
        "optimize", "--trace", str(small_trace), "--trials", "2", "--no-presets",
        "--storage", f"sqlite:///{tmp_path / 's.db'}", "--out", str(out), "--json",
        *(a for pin in pins for a in ("--pin", pin)),
    )  # fmt: skip
    assert js.code == 0, js.stderr
    assert sorted(json.loads(js.stdout)["inert_params"]) == sorted(SPLIT)
