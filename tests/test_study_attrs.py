"""What a study holds for optuna-dashboard and ``kvtier report``: named objectives, the main
metrics as attributes of their own, each trial's feasibility, the presets and the tiering
verdict of the latest run."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from kvtier.search.study import TRIAL_METRICS
from kvtier.trace.io import write_trace
from kvtier.trace.synth import synthesize
from tests.helpers import invoke


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("attrs")
    path = root / "chat.parquet"
    write_trace(synthesize("chat", requests=150, rate=6.0, seed=4), path)
    return path


def _optimize(trace: Path, study: str, *extra: str) -> tuple[dict, optuna.Study]:
    db = trace.parent / f"{study}.db"
    r = invoke(
        "optimize",
        "--trace",
        str(trace),
        "--trials",
        "5",
        "--study",
        study,
        "--storage",
        f"sqlite:///{db}",
        "--out",
        str(trace.parent / f"{study}.toml"),
        "--slo",
        "ttft_p99=2,tpot_p99=0.1",
        "--json",
        *extra,
    )
    assert r.code in (0, 1), r.stderr
    return json.loads(r.stdout), optuna.load_study(study_name=study, storage=f"sqlite:///{db}")


def test_objectives_are_named_and_metrics_are_columns(trace) -> None:
    found, study = _optimize(trace, "named")
    assert study.metric_names == ["cost_per_mtok"]
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done
    for t in done:
        metrics = t.user_attrs["metrics"]
        for key in TRIAL_METRICS:
            assert t.user_attrs[key] == metrics[key], key
        assert isinstance(t.user_attrs["cost_per_mtok"], float)
        for tier, ratio in metrics["hit_ratio_tokens"].items():
            assert t.user_attrs[f"hit_ratio_{tier}"] == pytest.approx(ratio)
        # feasibility three ways that must agree: the flag, its word, the constraints
        # optuna-dashboard reads (system attribute ``constraints``, feasible when all <= 0)
        feasible = t.user_attrs["feasible"]
        assert t.user_attrs["slo"] == ("met" if feasible else "missed")
        assert all(c <= 0 for c in t.system_attrs["constraints"]) is feasible
    outcome = study.user_attrs["outcome"]
    names = {p["name"] for p in outcome["presets"]}
    assert names == {b["name"] for b in found["baselines"]} and names
    for p, b in zip(
        sorted(outcome["presets"], key=lambda p: p["name"]),
        sorted(found["baselines"], key=lambda b: b["name"]),
        strict=True,
    ):
        if b["metrics"] is None:
            assert p["error"] == b["error"] and "metrics" not in p
        else:
            assert p["feasible"] == b["feasible"]
            assert p["metrics"]["cost_per_mtok"] == pytest.approx(b["metrics"]["cost_per_mtok"])
    for key in ("tiered", "hbm_only"):
        if found[key] is None:
            assert outcome[key] is None
        else:
            assert outcome[key]["cost_per_mtok"] == pytest.approx(found[key]["cost_per_mtok"])
            assert outcome[key]["label"] == found[key]["label"]


def test_pareto_names_both_objectives(trace) -> None:
    _, study = _optimize(trace, "named-pareto", "--pareto", "--no-presets")
    assert study.metric_names == ["cost_per_mtok", "ttft_p99_s"]
    assert study.user_attrs["outcome"]["presets"] == []
