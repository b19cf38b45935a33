"""``kvtier report --what-if``: a study's best policy replayed with its memory tiers changed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvtier.experiments.whatif import run_what_if, tier_variants
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import SLO, Policy, TierPolicy
from kvtier.scenario import Scenario
from kvtier.search.objective import Evaluator
from kvtier.sim import simulate
from kvtier.trace.blocks import block_trace
from kvtier.trace.io import write_trace
from kvtier.trace.synth import synthesize
from tests.helpers import assert_one_line_error, invoke


def test_variants_cover_each_tier_removed_resized_and_added() -> None:
    hw = load_hardware("beluga-testbed")
    listed = (TierPolicy(), TierPolicy(name="cxl", capacity_gb=1000.0), TierPolicy(name="dram"))
    variants = tier_variants(Policy(tiers=listed), hw)
    dram_gb = hw.tiers["dram"].capacity_bytes / 1e9
    tiers = {v.label: [(t.name, t.capacity_gb) for t in v.policy.tiers] for v in variants}
    assert list(tiers) == [
        "as found",
        "without dram",
        "without cxl",
        "hbm only",
        f"dram x0.5 ({dram_gb / 2:,.0f} GB/host)",
        f"dram x2 ({dram_gb * 2:,.0f} GB/host)",
        "cxl x0.5 (500 GB)",
        "cxl x2 (2,000 GB)",
        f"with rdma ({hw.tiers['rdma'].capacity_bytes / 1e9:,.0f} GB)",
        f"with ssd ({hw.tiers['ssd'].capacity_bytes / 1e9:,.0f} GB/host)",
    ]
    assert tiers["as found"] == [("hbm", None), ("cxl", 1000.0), ("dram", None)]  # untouched
    assert tiers["without dram"] == [("hbm", None), ("cxl", 1000.0)]
    assert tiers["hbm only"] == [("hbm", None)]
    assert tiers["cxl x2 (2,000 GB)"] == [("hbm", None), ("dram", None), ("cxl", 2000.0)]
    assert tiers[f"dram x0.5 ({dram_gb / 2:,.0f} GB/host)"][1] == ("dram", dram_gb / 2)
    assert [n for n, _ in tiers[variants[-1].label]] == ["hbm", "dram", "cxl", "ssd"]


def test_an_hbm_only_policy_gets_one_row_per_tier_the_hardware_offers() -> None:
    variants = tier_variants(Policy(), load_hardware("h100-node"))
    assert [v.label.split(" (")[0] for v in variants] == [
        "as found",
        "with dram",
        "with rdma",
        "with ssd",
    ]


@pytest.fixture(scope="module")
def evaluator_and_policy() -> tuple[Evaluator, Policy]:
    """Chat sessions whose prefixes outgrow a small HBM: a DRAM tier then finds hits."""
    trace = synthesize("chat", requests=120, rate=4.0, seed=3)
    hw, mdl = load_hardware("h100-node"), load_model("Llama-3.1-8B")
    policy = Policy(tiers=(TierPolicy(capacity_gb=0.2), TierPolicy(name="dram", capacity_gb=8.0)))
    return Evaluator(Scenario(trace, hw, mdl, policy, slo=SLO(ttft_p99_s=30.0))), policy


def test_each_row_is_a_full_replay_of_its_variant(evaluator_and_policy) -> None:
    evaluator, policy = evaluator_and_policy
    rows = {r.label: r for r in run_what_if(policy, evaluator)}
    blocked = block_trace(evaluator.trace, policy.block_tokens)
    for label, variant in ((v.label, v) for v in tier_variants(policy, evaluator.hardware)):
        expected = simulate(
            blocked, evaluator.hardware, evaluator.model, variant.policy, slo=evaluator.slo
        )
        got = rows[label].evaluation
        assert got is not None and got.metrics.same_as(expected), label
    found, alone = rows["as found"].evaluation, rows["without dram"].evaluation
    assert found is not None and alone is not None
    assert found.metrics.hit_ratio_tokens["dram"] > 0  # the tier is used ...
    assert alone.metrics.hit_ratio_tokens["hbm"] < sum(found.metrics.hit_ratio_tokens.values())
    assert alone.metrics.cost_per_hour < found.metrics.cost_per_hour  # ... and priced
    bigger = rows["dram x2 (16 GB/host)"].evaluation
    assert bigger is not None and bigger.metrics.cost_per_hour > found.metrics.cost_per_hour


def test_step_rows_replay_the_policy_on_slower_and_faster_steps(evaluator_and_policy) -> None:
    """With a margin, two more rows: the policy as found on hardware whose every step is 0.8x
    and 1.2x as long, each the replay on that hardware (the measured tables' factors)."""
    from dataclasses import replace

    from kvtier.experiments.whatif import step_label

    evaluator, policy = evaluator_and_policy
    rows = run_what_if(policy, evaluator, step_margin=0.2)
    labels = [r.label for r in rows]
    assert (
        labels[-2:]
        == [step_label(0.8), step_label(1.2)]
        == [
            "every step 0.8x as long",
            "every step 1.2x as long",
        ]
    )
    assert len(rows) == len(tier_variants(policy, evaluator.hardware)) + 2
    found = rows[0].evaluation
    fast, slow = rows[-2].evaluation, rows[-1].evaluation
    assert found is not None and fast is not None and slow is not None
    assert fast.metrics.ttft_mean_s < found.metrics.ttft_mean_s < slow.metrics.ttft_mean_s
    hw = evaluator.hardware
    eff = replace(hw.efficiency, measured_memory_scale=1.2, measured_compute_scale=1.2)
    expected = simulate(
        block_trace(evaluator.trace, policy.block_tokens),
        replace(hw, efficiency=eff),
        evaluator.model,
        policy,
        slo=evaluator.slo,
    )
    assert slow.metrics.same_as(expected)
    assert rows[-1].cost_change is not None  # against the policy as found


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("whatif")
    write_trace(synthesize("chat", requests=100, rate=5.0, seed=5), root / "chat.parquet")
    r = invoke(
        "optimize",
        "--trace",
        str(root / "chat.parquet"),
        "--trials",
        "5",
        "--study",
        "w",
        "--slo",
        "ttft_p99=5",
        "--storage",
        f"sqlite:///{root / 'w.db'}",
        "--no-presets",
        "--out",
        str(root / "w.toml"),
    )
    assert r.code in (0, 1), r.stderr
    return root


def report(root: Path, *extra: str):  # noqa: ANN201
    return invoke("report", "--study", "w", "--storage", f"sqlite:///{root / 'w.db'}", *extra)


def test_what_if_starts_from_the_best_trial_as_the_study_measured_it(study_dir) -> None:
    r = report(study_dir, "--what-if", "--json")
    assert r.code == 0, r.stderr
    rep = json.loads(r.stdout)
    wi, best = rep["what_if"], rep["best"]
    assert wi["trial"] == best["number"] and wi["trial_meets_slo"] is True
    first = wi["variants"][0]
    assert first["variant"] == "as found" and first["feasible"] is True
    assert first["cost_per_mtok"] == best["metrics"]["cost_per_mtok"]
    assert first["ttft_p99_s"] == best["metrics"]["ttft_p99_s"]
    assert len(wi["variants"]) > 1
    assert all(v["cost_change"] is not None for v in wi["variants"] if "error" not in v)

    shown = report(study_dir, "--what-if")
    assert shown.code == 0 and "architecture what-if" in shown.stdout
    margin = report(study_dir, "--what-if", "--step-time-margin", "0.1", "--json")
    assert margin.code == 0, margin.stderr
    names = [v["variant"] for v in json.loads(margin.stdout)["what_if"]["variants"]]
    assert names[-2:] == ["every step 0.9x as long", "every step 1.1x as long"]
    assert_one_line_error(report(study_dir, "--step-time-margin", "0.1"), "--what-if")
    bad = report(study_dir, "--what-if", "--step-time-margin", "2")
    assert_one_line_error(bad, "--step-time-margin", "between 0 and 0.5")


def test_a_moved_trace_is_found_with_trace_and_checked(study_dir, tmp_path) -> None:
    moved = tmp_path / "moved.parquet"
    shutil.copy(study_dir / "chat.parquet", moved)
    assert report(study_dir, "--what-if", "--json", "--trace", str(moved)).code == 0
    other = tmp_path / "other.parquet"
    write_trace(synthesize("chat", requests=20, rate=5.0, seed=9), other)
    assert_one_line_error(report(study_dir, "--what-if", "--trace", str(other)), "sha256")
    missing = str(tmp_path / "gone.parquet")
    assert_one_line_error(report(study_dir, "--what-if", "--trace", missing), "gone.parquet")
    assert_one_line_error(report(study_dir, "--trace", str(moved)), "--what-if")


def _variant(name: str, cost: float, change: float | None, feasible: bool) -> dict:
    return {
        "variant": name,
        "cost_per_mtok": cost,
        "cost_change": change,
        "cost_per_hour": 1.0,
        "ttft_mean_s": 0.1,
        "ttft_p99_s": 0.5,
        "tpot_p99_s": 0.02,
        "hit_ratio_tokens": {"hbm": 0.5},
        "rate_scale": 1.0,
        "feasible": feasible,
        "slo_attainment": 1.0 if feasible else 0.4,
    }


def test_report_names_the_variants_that_beat_the_policy_found() -> None:
    from kvtier.report.study import _what_if_sections

    wi = {
        "trial": 3,
        "trial_meets_slo": True,
        "load": "trace",
        "variants": [
            _variant("as found", 1.0, 0.0, True),
            _variant("without ssd", 0.9, -0.1, True),
            _variant("without dram", 0.8, -0.2, False),  # cheaper, but misses the SLO
            _variant("with cxl (2,000 GB)", 1.2, 0.2, True),
            {"variant": "with rdma (1 GB)", "error": "tier 'rdma' of 1 GB holds no block"},
        ],
    }
    table, hint = _what_if_sections(wi)
    assert [r[0] for r in table.rows] == [v["variant"] for v in wi["variants"]]
    assert table.rows[2][-1] == "missed (40% of requests meet it)"
    assert table.rows[4][-1] == "tier 'rdma' of 1 GB holds no block"
    assert hint.title == "cheaper and still within the SLO: without ssd (-10.0%)"
    wi["trial_meets_slo"] = False
    assert _what_if_sections(wi)[1].title == "within the SLO: without ssd, with cxl (2,000 GB)"


def test_capacity_mode_shows_the_load_each_variant_reached() -> None:
    from kvtier.report.study import _what_if_sections

    found, halved = _variant("as found", 1.0, 0.0, True), _variant("dram x0.5", 1.1, 0.1, True)
    halved["rate_scale"] = 2.5
    wi = {"trial": 1, "trial_meets_slo": True, "load": "capacity", "variants": [found, halved]}
    (table,) = _what_if_sections(wi)
    column = table.headers.index("load x")
    assert [row[column] for row in table.rows] == ["1", "2.5"]


def test_step_rows_are_no_alternative_and_an_slo_they_break_is_flagged() -> None:
    """The step-time rows are the same policy on another cluster, not a cheaper choice; when
    one misses the SLO the policy found meets, the report says the verdict turns on it."""
    from kvtier.report.study import _what_if_sections

    def step(factor: float, cost: float, change: float, feasible: bool) -> dict:
        return {**_variant(f"every step {factor:g}x as long", cost, change, feasible),
                "step_factor": factor}  # fmt: skip

    base = [_variant("as found", 1.0, 0.0, True), _variant("without ssd", 1.1, 0.1, True)]
    steps = [step(0.9, 0.97, -0.03, True), step(1.1, 1.03, 0.03, True)]
    held = {"trial": 1, "trial_meets_slo": True, "load": "trace", "variants": [*base, *steps]}
    sections = _what_if_sections(held)
    titles = [s.title for s in sections]
    assert not any(t.startswith("cheaper and still within") for t in titles)
    line = next(s for s in sections if s.title.startswith("the policy found, every engine step"))
    assert "0.9x as long: SLO met, cost -3.0%; 1.1x as long: SLO met, cost +3.0%" in line.title
    assert not line.alert
    broken = {**held, "variants": [*base, step(0.9, 0.97, -0.03, True),
                                   step(1.1, 1.03, 0.03, False)]}  # fmt: skip
    line = next(s for s in _what_if_sections(broken) if s.title.startswith("the policy found"))
    assert line.alert and "1.1x as long: SLO missed" in line.title
    assert "turns on step-time accuracy" in line.title


def test_optimize_checks_its_winner_on_slower_and_faster_steps(study_dir, tmp_path) -> None:
    """``optimize --step-time-margin``: the winner on every step 0.9x and 1.1x as long, the
    same evaluations as ``report --what-if``'s step rows; a bad margin stops before the
    search."""
    args = ["optimize", "--trace", str(study_dir / "chat.parquet"), "--trials", "5", "--slo",
            "ttft_p99=5", "--storage", f"sqlite:///{tmp_path / 'm.db'}", "--study", "m",
            "--no-presets", "--out", str(tmp_path / "m.toml")]  # fmt: skip
    r = invoke(*args, "--step-time-margin", "0.1", "--json")
    assert r.code == 0, r.stderr
    rows = json.loads(r.stdout)["step_time_margin"]
    assert [row["factor"] for row in rows] == [0.9, 1.1]
    wi = invoke("report", "--study", "m", "--storage", f"sqlite:///{tmp_path / 'm.db'}",
                "--what-if", "--step-time-margin", "0.1", "--json")  # fmt: skip
    assert wi.code == 0, wi.stderr
    steps = [v for v in json.loads(wi.stdout)["what_if"]["variants"] if v["step_factor"]]
    for row, v in zip(rows, steps, strict=True):
        assert row["cost_per_mtok"] == v["cost_per_mtok"] and row["feasible"] == v["feasible"]
        assert row["ttft_p99_s"] == v["ttft_p99_s"]
    text = invoke(*args, "--step-time-margin", "0.1")  # the finished study, reported again
    assert "The winner with every engine step 0.9x" in text.stdout
    assert json.loads(invoke(*args, "--json").stdout)["step_time_margin"] == []
    bad = invoke(*args[:-2], "--out", str(tmp_path / "n.toml"), "--study", "n",
                 "--step-time-margin", "0.9")  # fmt: skip
    assert_one_line_error(bad, "--step-time-margin", "between 0 and 0.5")
    assert not (tmp_path / "n.toml").exists()
