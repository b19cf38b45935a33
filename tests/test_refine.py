"""The refine stage: the reported winner is the cheapest of its neighbours within the SLO.

Each test checks the certificate independently of the refine's own bookkeeping: it builds
the cheaper neighbours itself (each lower tier's capacity -10%, each lower tier removed, one
instance fewer), replays them on a fresh evaluator, and requires each to miss the SLO or cost
more; then ``report --what-if`` on the study must find no cheaper variant within the SLO.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.file import read_policy_file
from kvtier.policy.model import SLO, Policy, TierPolicy
from kvtier.scenario import Scenario
from kvtier.search.objective import Evaluator
from kvtier.search.refine import Refined, capacity_gb, refine
from kvtier.search.run import optimize
from kvtier.trace.io import read_trace
from kvtier.trace.synth import synthesize
from tests.helpers import REPO, invoke

SAMPLE = REPO / "traces" / "sample-multiround-qa.parquet"


def cheaper_neighbours(policy: Policy, evaluator: Evaluator) -> list[tuple[str, Policy]]:
    """Built here, not by the refine: each capacity x0.9, each tier removed, one instance
    fewer."""
    out = []
    for tier in policy.lower_tiers:
        gb = capacity_gb(policy, tier, evaluator)
        tiers = tuple(
            replace(t, capacity_gb=gb * 0.9) if t.name == tier.name else t for t in policy.tiers
        )
        out.append((f"{tier.name} x0.9", replace(policy, tiers=tiers)))
        kept = tuple(t for t in policy.tiers if t.name != tier.name)
        out.append((f"without {tier.name}", replace(policy, tiers=kept)))
    n = policy.serving.instances
    assert n is not None  # the refine states the count it ran
    if n > 1:
        out.append(("one fewer", replace(policy, serving=replace(policy.serving, instances=n - 1))))
    return out


def assert_certificate(policy: Policy, evaluator: Evaluator) -> None:
    """``policy`` meets the SLO and no cheaper neighbour does for less."""
    here = evaluator.evaluate_policy(policy, full=True)
    assert here.feasible
    for label, other in cheaper_neighbours(policy, evaluator):
        try:
            ev = evaluator.evaluate_policy(other, full=True)
        except Exception as err:  # a neighbour the hardware cannot run is no cheaper policy
            assert "InputError" in type(err).__name__, (label, err)
            continue
        assert not (ev.feasible and ev.cost_per_mtok < here.cost_per_mtok * (1 - 1e-9)), (
            label,
            ev.cost_per_mtok,
            here.cost_per_mtok,
        )


def test_refine_shrinks_an_oversized_tier_and_instance_count_and_holds_the_certificate() -> None:
    trace = synthesize("chat", requests=160, rate=4.0, seed=3)
    hw, mdl = load_hardware("h100-node"), load_model("Llama-3.1-8B")
    slo = SLO(ttft_p99_s=5.0, tpot_p99_s=0.2)
    base = Policy(slo=slo)
    evaluator = Evaluator(Scenario(trace, hw, mdl, base, slo=slo))
    start = replace(
        base,
        serving=replace(base.serving, instances=8),
        tiers=(TierPolicy(), TierPolicy(name="dram", capacity_gb=512.0)),
    )
    before = evaluator.evaluate_policy(start)
    assert before.feasible
    refined = refine(start, evaluator, from_trial=0)
    assert refined is not None and refined.holds
    assert refined.cost_per_mtok < before.cost_per_mtok  # 8 instances and 512 GB are too many
    assert refined.changes
    from kvtier.policy.model import policy_from_dict

    won = policy_from_dict(refined.policy)
    assert_certificate(won, Evaluator(Scenario(trace, hw, mdl, base, slo=slo)))
    # the stored form reads back to the same refine
    again = Refined.from_attrs(json.loads(json.dumps(refined.to_attrs())))
    assert again.policy == refined.policy and again.holds and again.changes == refined.changes
    # each curve is the winner's tier at multiples of its capacity, the x1 point the winner
    for tier, points in refined.curves.items():
        assert [p.label for p in points][4] == "x1"
        assert points[4].feasible and points[4].cost_per_mtok == pytest.approx(
            refined.cost_per_mtok
        )
        hourly = [p.cost_per_hour for p in points if p.feasible]
        assert hourly == sorted(hourly), tier  # more capacity, more dollars per hour


def _study_report(study: str, storage: str) -> dict:
    result = invoke("report", "--study", study, "--storage", storage, "--what-if", "--json")
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


def _check_study(result, trace_path: Path, storage: str, hw_name: str) -> None:
    assert result.best is not None and result.refined is not None
    assert result.refined.holds
    written = read_policy_file(result.policy_path)
    assert written.policy.serving.instances == result.refined.policy["serving"]["instances"]
    assert written.metrics["cost_per_mtok"] == pytest.approx(result.refined.cost_per_mtok)
    hw = load_hardware(written.policy.hardware or hw_name)
    mdl = load_model(written.policy.model or "Llama-3.1-8B")
    base = replace(written.policy, slo=result.slo)
    evaluator = Evaluator(Scenario(read_trace(trace_path), hw, mdl, base, slo=result.slo))
    assert_certificate(written.policy, evaluator)
    rep = _study_report(result.study_name, storage)
    assert rep["refine"]["holds"] and rep["refine"]["from_trial"] == result.best.number
    wi = rep["what_if"]
    assert wi["refined"] and wi["trial_meets_slo"]
    first = wi["variants"][0]
    assert first["cost_per_mtok"] == pytest.approx(result.refined.cost_per_mtok)
    cheaper = [
        v["variant"]
        for v in wi["variants"][1:]
        if v.get("error") is None and v["feasible"] and v["cost_change"] < -1e-9
    ]
    assert cheaper == []


@pytest.mark.slow
def test_readme_sample_winner_passes_the_certificate_and_what_if(tmp_path) -> None:
    storage = f"sqlite:///{tmp_path / 'sample.db'}"
    result = optimize(
        str(SAMPLE),
        n_trials=6,
        seed=1,
        storage=storage,
        study_name="sample",
        runs_dir=tmp_path / "runs",
        out=str(tmp_path / "best.toml"),
    )
    _check_study(result, SAMPLE, storage, "h100-node")


@pytest.mark.slow
def test_long_rag_winner_passes_the_certificate_and_what_if(tmp_path) -> None:
    trace_path = tmp_path / "long-rag.parquet"
    made = invoke(
        "trace",
        "synth",
        "rag",
        "--long",
        "--requests",
        "120",
        "--rate",
        "0.5",
        "--documents",
        "40",
        "-o",
        str(trace_path),
    )
    assert made.code == 0, made.stderr
    storage = f"sqlite:///{tmp_path / 'rag.db'}"
    result = optimize(
        str(trace_path),
        hardware="beluga-testbed",
        slo_text="ttft_p99=10,tpot_p99=0.2",
        n_trials=6,
        seed=2,
        storage=storage,
        study_name="rag",
        runs_dir=tmp_path / "runs",
        out=str(tmp_path / "best.toml"),
    )
    _check_study(result, trace_path, storage, "beluga-testbed")
