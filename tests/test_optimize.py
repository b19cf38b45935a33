"""The optimizer end to end: optimum quality, exact replay of exports, failures and resumption."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.file import read_policy_file
from kvtier.policy.model import SLO, Policy
from kvtier.scenario import Scenario
from kvtier.search.objective import Evaluator
from kvtier.search.run import optimize, parse_slo
from kvtier.search.space import load_space
from kvtier.trace.io import read_trace, write_trace
from kvtier.trace.synth import synthesize
from tests.helpers import assert_one_line_error, invoke

# The enumerable space of the optimum test: 4 block sizes x 8 instance counts x 3 routers
# x 3 token budgets = 288 points.
SMALL_SPACE = """
format = "kvtier-space/1"
description = "288 points: block size, instances, routing, token budget"
[params.block_tokens]
choices = [16, 32, 64, 128]
[params."serving.instances"]
low = 1
high = 8
[params."serving.routing"]
choices = ["round_robin", "least_loaded", "prefix_affinity"]
[params."serving.max_num_batched_tokens"]
choices = [1024, 4096, 16384]
"""


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("opt") / "chat.parquet"
    write_trace(synthesize("chat", requests=400, rate=12.0, seed=3), path)
    return path


@pytest.fixture()
def space_path(tmp_path) -> Path:
    path = tmp_path / "small.toml"
    path.write_text(SMALL_SPACE)
    return path


SLO_TEXT = "ttft_p99=0.5,tpot_p99=0.05"


def test_tpe_finds_the_exhaustive_optimum_within_two_percent(
    trace_path, space_path, tmp_path
) -> None:
    space = load_space(space_path)
    assert space.size() == 288
    slo = parse_slo(SLO_TEXT)
    base = Policy(hardware="h100-node", model="Llama-3.1-8B", slo=slo)
    evaluator = Evaluator(
        Scenario(
            read_trace(trace_path),
            load_hardware("h100-node"),
            load_model("Llama-3.1-8B"),
            base,
            slo=slo,
        )
    )
    costs = [ev.cost_per_mtok for ev in map(evaluator.evaluate, space.grid()) if ev.feasible]
    optimum = min(costs)
    assert len(costs) < 288  # the SLO binds: some points are infeasible
    assert max(costs) > 3 * optimum  # and the space is not flat: a random pick is far off
    result = optimize(
        str(trace_path),
        space=str(space_path),
        slo_text=SLO_TEXT,
        n_trials=100,
        seed=7,
        runs_dir=tmp_path / "runs",
        out=str(tmp_path / "best.toml"),
    )
    assert result.best is not None
    assert result.best.metrics["cost_per_mtok"] <= optimum * 1.02


def test_exported_policy_replays_to_its_metrics(trace_path, tmp_path) -> None:
    out = tmp_path / "p.toml"
    for load in ("trace", "capacity"):
        result = invoke(
            "optimize",
            "--trace",
            str(trace_path),
            "--trials",
            "6",
            "--load",
            load,
            "--slo",
            SLO_TEXT,
            "--out",
            str(out),
            "--study",
            f"exp-{load}",
            "--storage",
            f"sqlite:///{tmp_path / 'runs.db'}",
        )
        assert result.code == 0, result.stderr
        stored = read_policy_file(out)
        assert stored.provenance["trial"] >= 0 and len(stored.provenance["trace_sha256"]) == 64
        replayed = invoke("replay", "--policy", str(out), "--trace", str(trace_path), "--json")
        assert replayed.code == 0, replayed.stderr
        metrics = json.loads(replayed.stdout)
        for key, value in stored.metrics.items():
            if key != "engine":
                assert metrics[key] == value, key


def test_unmeetable_slo_names_closest_trial_and_binding_constraint(trace_path, tmp_path) -> None:
    result = invoke(
        "optimize",
        "--trace",
        str(trace_path),
        "--trials",
        "4",
        "--slo",
        "ttft_p99=0.000001,tpot_p99=10",
        "--storage",
        f"sqlite:///{tmp_path / 'r.db'}",
        "--out",
        str(tmp_path / "none.toml"),
    )
    assert result.code == 1
    assert "no trial met the SLO" in result.stdout
    assert "Closest: trial" in result.stdout and "ttft_p99_s" in result.stdout
    assert not (tmp_path / "none.toml").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--pin", "block_tokens"], "--pin takes name=value"),
        (["--pin", "serving.instances=99"], "outside"),
        (["--space", "no-such-space"], "no such search space"),
        (["--slo", "ttft_p42=3"], "--slo takes terms"),
        (["--slo", "ttft_p99=-1"], "positive number"),
        (["--hardware", "no-such-gpu-box"], "no-such-gpu-box"),
    ],
)
def test_bad_options_are_one_line_errors(trace_path, tmp_path, args, needle) -> None:
    result = invoke(
        "optimize",
        "--trace",
        str(trace_path),
        "--trials",
        "1",
        "--storage",
        f"sqlite:///{tmp_path / 'x.db'}",
        *args,
    )
    assert_one_line_error(result, needle)


def test_rerun_reports_a_finished_study_and_a_larger_total_continues_it(
    trace_path, tmp_path
) -> None:
    # --trials is the study's total: the same command twice gives the same answer
    common = dict(
        slo_text=SLO_TEXT,
        study_name="again",
        runs_dir=tmp_path / "runs",
        out=str(tmp_path / "a.toml"),
        seed=1,
    )
    first = optimize(str(trace_path), n_trials=5, **common)
    written = (tmp_path / "a.toml").read_text()
    second = optimize(str(trace_path), n_trials=5, **common)
    assert (first.n_trials, first.new_trials) == (5, 5)
    assert (second.n_trials, second.new_trials) == (5, 0)
    assert second.best is not None and first.best is not None
    assert (second.best.number, second.best.params) == (first.best.number, first.best.params)
    assert (second.tiered, second.hbm_only) == (first.tiered, first.hbm_only)
    assert (tmp_path / "a.toml").read_text() == written
    third = optimize(str(trace_path), n_trials=7, **common)
    assert (third.n_trials, third.new_trials) == (7, 2)
    assert (tmp_path / "runs" / "again.db").exists()


def test_interrupt_leaves_a_resumable_study(trace_path, tmp_path, monkeypatch) -> None:
    import kvtier.search.study as study_mod

    calls = {"n": 0}
    original = study_mod.record

    def interrupt_on_third(trial, ev):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        original(trial, ev)

    monkeypatch.setattr(study_mod, "record", interrupt_on_third)
    args = [
        "optimize",
        "--trace",
        str(trace_path),
        "--trials",
        "10",
        "--slo",
        SLO_TEXT,
        "--study",
        "cut",
        "--storage",
        f"sqlite:///{tmp_path / 'cut.db'}",
        "--out",
        str(tmp_path / "c.toml"),
    ]
    cut = invoke(*args)
    assert cut.code == 130 and "run the same command again" in cut.stderr
    monkeypatch.setattr(study_mod, "record", original)
    resumed = invoke(*args, "--json")
    assert resumed.code == 0, resumed.stderr
    data = json.loads(resumed.stdout)
    # the cut run's interrupted trial failed and is not one of the 10: the study holds 10
    # trials that ran to the end, 8 of them run by the resumed command
    assert data["trials"] == 10 and data["new_trials"] == 10 - 2
    import optuna

    study = optuna.load_study(study_name="cut", storage=f"sqlite:///{tmp_path / 'cut.db'}")
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(done) == 10


def test_pareto_and_threads(trace_path, tmp_path) -> None:
    result = optimize(
        str(trace_path),
        slo_text=SLO_TEXT,
        n_trials=8,
        n_jobs=2,
        pareto=True,
        runs_dir=tmp_path / "runs",
        out=str(tmp_path / "p.toml"),
    )
    assert result.front
    costs = [s.metrics["cost_per_mtok"] for s in result.front]
    p99s = [s.metrics["ttft_p99_s"] for s in result.front]
    assert costs == sorted(costs) and p99s == sorted(p99s, reverse=True)


def test_trace_changed_under_a_study_is_refused(trace_path, tmp_path) -> None:
    other = tmp_path / "other.parquet"
    write_trace(synthesize("short", requests=50, rate=5.0, seed=1), other)
    common = dict(
        slo_text=SLO_TEXT,
        study_name="same",
        runs_dir=tmp_path / "runs",
        n_trials=1,
        out=str(tmp_path / "o.toml"),
    )
    optimize(str(trace_path), **common)
    from kvtier.errors import InputError

    with pytest.raises(InputError, match="different trace"):
        optimize(str(other), **common)


def test_slo_parsing() -> None:
    assert parse_slo("ttft_p99=5,ttft_mean=2,tpot_p99=0.1") == SLO(
        ttft_mean_s=2.0, ttft_p99_s=5.0, tpot_p99_s=0.1
    )
    assert parse_slo(None).ttft_p99_s is not None


def test_optimize_console_script(trace_path, tmp_path) -> None:
    """The stand-alone `optimize` entry point, in a subprocess, as installed."""
    import subprocess
    import sys

    from tests.helpers import REPO

    code = "from kvtier.cli import optimize_main; optimize_main()"
    base = [
        sys.executable,
        "-c",
        code,
        "--trace",
        str(trace_path),
        "--trials",
        "3",
        "--slo",
        SLO_TEXT,
        "--storage",
        f"sqlite:///{tmp_path / 's.db'}",
        "--out",
        str(tmp_path / "o.toml"),
    ]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    ok = subprocess.run(base, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "per token than vllm-hbm" in ok.stdout or "does not meet" in ok.stdout
    bad = subprocess.run(
        [*base, "--jobs", "0"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


def test_space_is_fitted_to_the_hardware() -> None:
    from kvtier.search.run import fit_space_to_hardware

    space = fit_space_to_hardware(load_space("default"), load_hardware("h100-node"))
    assert space.pinned["tiers.cxl.enabled"] is False  # h100-node has no CXL pool
    assert "tiers.dram.enabled" not in space.pinned
    instances = next(p for p in space.params if p.name == "serving.instances")
    assert instances.high == 8


def test_presets_are_compared_on_the_same_trace(trace_path, tmp_path) -> None:
    result = invoke(
        "optimize",
        "--trace",
        str(trace_path),
        "--trials",
        "4",
        "--slo",
        SLO_TEXT,
        "--storage",
        f"sqlite:///{tmp_path / 'p.db'}",
        "--out",
        str(tmp_path / "p.toml"),
        "--json",
    )
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    by_name = {b["name"]: b for b in data["baselines"]}
    assert {"vllm-hbm", "mooncake-rdma", "beluga-cxl"} <= set(by_name)
    assert by_name["vllm-hbm"]["metrics"]["n_served"] == 400  # replayed in full
    assert "cxl" in by_name["beluga-cxl"]["error"]  # h100-node has no CXL pool


def test_cxl_sizing_space_on_a_pooled_testbed(tmp_path) -> None:
    path = tmp_path / "rag.parquet"
    write_trace(synthesize("rag", requests=60, rate=2.0, seed=5), path)
    result = optimize(
        str(path),
        hardware="beluga-testbed",
        model="Qwen3-32B",
        space="cxl-sizing",
        slo_text="ttft_p99=30",
        n_trials=3,
        runs_dir=tmp_path / "runs",
        out=str(tmp_path / "c.toml"),
        compare_presets=False,
    )
    assert result.n_trials == 3
    assert result.best is not None
    tiers = {t["name"] for t in result.best.policy["tiers"]}
    assert "cxl" in tiers


def test_a_tbt_slo_is_a_constraint_of_every_trial(trace_path, tmp_path) -> None:
    """``--slo tbt_p99=...``: each trial's replay tracks token intervals and the term is one
    of its constraints; the table shows the TBT column, the policy file keeps the bound."""
    import optuna

    db = tmp_path / "t.db"
    out = tmp_path / "p.toml"
    result = invoke(
        "optimize", "--trace", str(trace_path), "--trials", "2",
        "--slo", "ttft_p99=0.5,tbt_p99=0.05", "--storage", f"sqlite:///{db}", "--out", str(out),
    )  # fmt: skip
    assert result.code == 0, result.stderr
    assert "TBT p99 s" in result.stdout and "tbt_p99 >= " in result.stdout  # lower bound too
    stored = read_policy_file(out)
    assert stored.policy.slo is not None and stored.policy.slo.tbt_p99_s == 0.05
    assert 0 < stored.metrics["tbt_p99_s"] <= 0.05
    (name,) = optuna.study.get_all_study_names(f"sqlite:///{db}")
    study = optuna.load_study(study_name=name, storage=f"sqlite:///{db}")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done
    for trial in done:
        violations = trial.user_attrs["violations"]
        assert list(violations) == ["ttft_p99_s", "tbt_p99_s", "completion"]
        assert len(trial.system_attrs["constraints"]) == 3  # what the samplers read
        tbt = trial.user_attrs["metrics"]["tbt_p99_s"]
        assert violations["tbt_p99_s"] == tbt - 0.05


# A study's first space, and spaces a rerun of it may (compatible) or may not use: Optuna
# keeps one distribution per parameter name in a study.
FIRST_SPACE = """
format = "kvtier-space/1"
[params."serving.routing"]
choices = ["round_robin", "least_loaded"]
[params."serving.max_num_batched_tokens"]
low = 2048
high = 8192
[params.block_tokens]
choices = [16, 64]
"""
# another range of the same kind, a parameter dropped (block_tokens), one added (coalesce)
COMPATIBLE_SPACE = """
format = "kvtier-space/1"
[params."serving.routing"]
choices = ["round_robin", "least_loaded"]
[params."serving.max_num_batched_tokens"]
low = 1024
high = 16384
[params.coalesce]
choices = [1, 16]
"""


@pytest.mark.parametrize(
    ("param", "spec", "was", "now"),
    [
        (
            "serving.routing",
            'choices = ["round_robin", "prefix_affinity"]',
            "choices round_robin, least_loaded",
            "choices round_robin, prefix_affinity",
        ),
        (
            "serving.max_num_batched_tokens",
            "choices = [2048, 8192]",
            "integers 2048 to 8192",
            "choices 2048, 8192",
        ),
        (
            "serving.max_num_batched_tokens",
            "low = 2048\nhigh = 8192\nlog = true",
            "integers 2048 to 8192",
            "integers 2048 to 8192, log scale",
        ),
    ],
)
def test_a_rerun_may_change_the_space_only_compatibly(
    trace_path, tmp_path, param, spec, was, now
) -> None:
    first = tmp_path / "first.toml"
    first.write_text(FIRST_SPACE)
    storage = f"sqlite:///{tmp_path / 'spaces.db'}"
    common = dict(slo_text=SLO_TEXT, study_name="spaces", storage=storage, compare_presets=False)
    out = str(tmp_path / "p.toml")
    done = optimize(str(trace_path), space=str(first), n_trials=2, out=out, **common)
    assert done.n_trials == 2
    # a parameter whose distribution Optuna cannot change within a study: one line before
    # any trial, naming it, both distributions and what to do
    changed = tmp_path / "changed.toml"
    changed.write_text(
        FIRST_SPACE.replace(
            {
                "serving.routing": 'choices = ["round_robin", "least_loaded"]',
                "serving.max_num_batched_tokens": "low = 2048\nhigh = 8192",
            }[param],
            spec,
        )
    )
    args = ["optimize", "--trace", str(trace_path), "--slo", SLO_TEXT, "--no-presets"]
    args += ["--study", "spaces", "--storage", storage, "--out", out, "--trials", "3"]
    refused = invoke(*args, "--space", str(changed))
    assert_one_line_error(refused, param, was, now, "--study", str(first))
    # new and dropped parameters, and another range of the same kind, continue the study
    compatible = tmp_path / "compatible.toml"
    compatible.write_text(COMPATIBLE_SPACE)
    again = invoke(*args, "--space", str(compatible), "--json")
    assert again.code == 0, again.stderr
    assert json.loads(again.stdout)["trials"] == 3
