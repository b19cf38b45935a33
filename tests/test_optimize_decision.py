"""The main job's answer: the SLO's bound, what tiering buys, targets, and where results go."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvtier.export import export
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.file import read_policy_file
from kvtier.search.bound import first_seen_prefix, round_up
from kvtier.search.run import optimize
from kvtier.search.space import TARGETS, load_space, restrict_to_target
from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.io import write_trace
from kvtier.trace.synth import synthesize
from tests.helpers import invoke


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("decide") / "chat.parquet"
    write_trace(synthesize("chat", requests=300, rate=8.0, seed=5), path)
    return path


def test_first_seen_prefix_counts_only_blocks_read_before() -> None:
    # r0 reads 0 1 2; r1 reads 0 1 3 (prefix 0 1 seen); r2 reads 4 0 (4 unseen: no prefix)
    blocked = BlockedTrace(
        arrival_s=np.array([0.0, 1.0, 2.0]),
        input_tokens=np.array([48, 48, 32], dtype=np.int64),
        output_tokens=np.array([1, 1, 1], dtype=np.int64),
        block_offsets=np.array([0, 3, 6, 8], dtype=np.int64),
        block_ids=np.array([0, 1, 2, 0, 1, 3, 4, 0], dtype=np.int32),
        n_blocks=5,
        block_tokens=16,
    )
    inputs, hit = first_seen_prefix(blocked)
    assert inputs.tolist() == [48, 48, 32]
    assert hit.tolist() == [0, 32, 0]


def test_round_up_keeps_two_significant_figures() -> None:
    assert round_up(3.412) == 3.5
    assert round_up(0.01971) == 0.02
    assert round_up(12.0) == 12.0


def test_unreachable_slo_prints_the_bound_and_a_reachable_slo(tmp_path) -> None:
    """Long prompts of one-off documents at tp=1: the default TTFT P99 of 2 s is below the
    prefill of the slowest prompts on an idle H100, so the job says so and what can be met."""
    path = tmp_path / "long.parquet"
    write_trace(synthesize("rag", requests=40, rate=0.2, seed=2, long=True, min_input=90000), path)
    result = invoke(
        "optimize",
        "--trace",
        str(path),
        "--trials",
        "2",
        "--pin",
        "serving.tp=1",
        "--no-presets",
        "--no-warm-start",
        "--storage",
        f"sqlite:///{tmp_path / 'r.db'}",
        "--out",
        str(tmp_path / "p.toml"),
    )
    assert result.code == 1, result.stdout
    assert "The SLO is out of reach on this hardware" in result.stdout
    assert "--slo ttft_p99=" in result.stdout
    suggested = result.stdout.split("--slo ttft_p99=")[1].split(",")[0]
    assert float(suggested) > 2.0
    assert "no trial met the SLO" in result.stdout
    assert "the binding constraint is" in result.stdout


@pytest.mark.parametrize("target", TARGETS)
def test_target_policy_exports_without_an_inexpressible_note(trace_path, tmp_path, target) -> None:
    out = tmp_path / f"{target}.toml"
    result = optimize(
        str(trace_path),
        n_trials=4,
        target=target,
        compare_presets=False,
        warm_start=False,
        slo_text="ttft_p99=30,tpot_p99=1",
        storage=f"sqlite:///{tmp_path / 'r.db'}",
        out=str(out),
        runs_dir=tmp_path / "runs",
    )
    assert result.best is not None
    policy = read_policy_file(out).policy
    exported = export(policy, target, load_hardware("h100-node"), load_model("llama-3.1-8b"))
    bad = [n for n in exported.notes if n.kind == "inexpressible"]
    assert bad == []
    if target == "mooncake":
        assert "rdma" in [t.name for t in policy.lower_tiers]


def test_target_pin_it_cannot_express_is_refused() -> None:
    space = load_space("default").with_pins({"write_policy": "write_back"})
    with pytest.raises(Exception, match="cannot be expressed by lmcache"):
        restrict_to_target(space, "lmcache", ("dram", "ssd", "rdma", "cxl"))


def test_sglang_never_pairs_mooncake_with_the_file_backend() -> None:
    space = restrict_to_target(load_space("default"), "sglang", ("dram", "ssd", "rdma"))
    ssd = next(p for p in space.params if p.name == "tiers.ssd.enabled")
    assert ("tiers.rdma.enabled", False) in ssd.when
    assert space.pinned["tiers.cxl.enabled"] is False
    assert space.pinned["kv_layout"] == "contiguous"


def test_results_go_to_runs_never_to_policies(trace_path, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "policies").mkdir()
    result = invoke("optimize", "--trace", str(trace_path), "--trials", "2", "--no-presets")
    assert result.code in (0, 1), result.stdout
    assert list((tmp_path / "policies").iterdir()) == []
    assert any(p.suffix == ".db" for p in (tmp_path / "runs").iterdir())
    if result.code == 0:
        assert any(p.suffix == ".toml" for p in (tmp_path / "runs").iterdir())
        assert "what tiering buys" in result.stdout


def test_trials_carry_constraints_for_the_dashboard(trace_path, tmp_path) -> None:
    import optuna

    storage = f"sqlite:///{tmp_path / 'c.db'}"
    optimize(
        str(trace_path),
        n_trials=2,
        compare_presets=False,
        warm_start=False,
        storage=storage,
        study_name="c",
        out=str(tmp_path / "c.toml"),
    )
    study = optuna.load_study(study_name="c", storage=storage)
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        values = t.system_attrs["constraints"]
        assert values == [t.system_attrs[f"constraints:{k}"] for k in t.user_attrs["violations"]]


def test_max_hosts_lets_the_search_use_more_gpus(trace_path, tmp_path) -> None:
    result = optimize(
        str(trace_path),
        n_trials=2,
        max_hosts=2,
        compare_presets=False,
        warm_start=False,
        pins={"serving.instances": 12, "serving.tp": 1},
        storage=f"sqlite:///{tmp_path / 'h.db'}",
        out=str(tmp_path / "h.toml"),
        runs_dir=tmp_path / "runs",
    )
    assert (tmp_path / "runs" / "h100-node-x2.toml").is_file()
    done = result.best or result.closest
    assert done is not None and done.metrics["instances"] == 12
