"""What optimize reports is what ran: settings that took effect, presets compared like with
like, contradictory pins refused, and a diagnosis from whole replays."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, TierPolicy
from kvtier.search.run import (
    as_ran,
    baseline_policies,
    check_pinned_size,
    effective_params,
    kv_room,
    model_tp,
    optimize,
)
from tests.helpers import REPO, assert_one_line_error, invoke

SAMPLE = REPO / "traces" / "sample-multiround-qa.parquet"
MOONCAKE = REPO / "traces" / "mooncake-conversation.parquet"


def test_contradictory_pins_are_refused_in_one_line(tmp_path, monkeypatch) -> None:
    # (no progress line: on a busy machine reading the trace and profiles can pass the 10 s
    # between lines before the pins are checked; the error itself is what is tested)
    monkeypatch.setenv("KVTIER_PROGRESS_S", "3600")
    result = invoke(
        "optimize",
        "--trace",
        str(SAMPLE),
        "--pin",
        "serving.tp=8",
        "--pin",
        "serving.instances=3",
        "--storage",
        f"sqlite:///{tmp_path / 's.db'}",
    )
    assert_one_line_error(result, "--pin", "serving.tp=8", "serving.instances=3", "24 GPUs")


def test_contradictory_sets_are_refused_by_replay_in_one_line() -> None:
    chat = str(REPO / "traces" / "sample-chat.parquet")
    args = ("replay", "--trace", chat, "--set", "serving.tp=8")
    result = invoke(*args, "--set", "serving.instances=3")
    assert_one_line_error(result, "--set", "serving.tp=8", "serving.instances=3", "24 GPUs")
    assert invoke(*args, "--set", "serving.instances=1", "--json").code == 0


def test_pins_that_fit_are_not_refused() -> None:
    hw = load_hardware("h100-node")
    check_pinned_size({"serving.tp": 8, "serving.instances": 1}, hw)
    check_pinned_size({"serving.tp": 2, "serving.instances": 4}, hw)
    check_pinned_size({"serving.instances": 30}, hw)  # tp searched: instances follow the GPUs
    with pytest.raises(Exception, match="at most 4 instances of tp 2"):
        check_pinned_size({"serving.tp": 2, "serving.instances": 5}, hw)


def test_presets_run_at_a_tensor_parallel_size_that_holds_the_model() -> None:
    hw, big = load_hardware("h100-node"), load_model("Llama-3.1-70B")
    assert hw.kv_capacity_bytes(big, hw.topology.tp) <= 0  # the presets' own tp cannot hold it
    base = Policy(hardware="h100-node", model="Llama-3.1-70B")
    presets = baseline_policies(base, hw, big)
    ran = {n: p for n, p in presets.items() if isinstance(p, Policy)}
    assert ran, presets
    plain = baseline_policies(Policy(hardware="h100-node"))
    for name, policy in ran.items():
        sizes = [policy.serving.tp or hw.topology.tp]
        sizes += [t for t in (policy.serving.prefill_tp, policy.serving.decode_tp) if t]
        for tp in sizes:  # room for KV as the preset's engine sizes it
            assert kv_room(hw, big, tp, policy) > 0, (name, tp)
        # a preset whose own size holds the model keeps it, else it runs at the smallest that does
        own = plain[name].serving.tp or hw.topology.tp
        held = kv_room(hw, big, own, policy) > 0
        ran_at = policy.serving.tp or hw.topology.tp
        assert ran_at == (own if held else model_tp(hw, big, own, policy)), name
    # a model that fits keeps each preset's own size
    small = load_model("Llama-3.1-8B")
    kept = baseline_policies(Policy(hardware="h100-node"), hw, small)
    for name, policy in kept.items():
        if isinstance(policy, Policy):
            assert policy.serving == plain[name].serving, name


def test_the_winner_shows_the_instances_that_ran_and_no_settings_of_unused_tiers() -> None:
    policy = Policy(serving=replace(Policy().serving, instances=11, tp=8))
    ran = as_ran(policy, {"instances": 4}, 1.0)
    assert ran.serving.instances == 4
    assert as_ran(policy, {"instances": 2}, 0.5).serving.instances == 4  # a half sample ran 2
    # a split left aggregated on a sample's one instance: aggregated, at the deployment's two
    split = Policy(serving=replace(Policy().serving, instances=2, prefill_share=0.25))
    ran_half = as_ran(split, {"instances": 1}, 0.5)
    assert ran_half.serving.instances == 2 and ran_half.serving.prefill_share == 0.0
    params = {
        "serving.instances": 11,
        "serving.tp": 8,
        "tiers.dram.enabled": False,
        "tiers.dram.capacity_gb": 640.0,
        "tiers.dram.eviction": "s3fifo",
        "block_tokens": 64,
    }
    shown = effective_params(params, replace(ran, block_tokens=64))
    assert shown == {
        "serving.instances": 4,
        "serving.tp": 8,
        "tiers.dram.enabled": False,
        "block_tokens": 64,
    }
    with_dram = replace(ran, tiers=(TierPolicy(), TierPolicy(name="dram", capacity_gb=320.0)))
    params["tiers.dram.enabled"] = True
    shown = effective_params(params, with_dram)
    assert shown["tiers.dram.capacity_gb"] == 320.0  # as refined, not as sampled
    assert shown["tiers.dram.eviction"] == "lru"


@pytest.mark.slow
def test_no_feasible_diagnosis_names_a_trial_that_served_the_whole_trace(tmp_path) -> None:
    result = optimize(
        str(MOONCAKE),
        target="dynamo",
        slo_text="ttft_p99=0.05,tpot_p99=0.01",
        n_trials=4,
        seed=0,
        compare_presets=False,
        storage=f"sqlite:///{tmp_path / 'm.db'}",
        study_name="mooncake",
        runs_dir=tmp_path / "runs",
    )
    assert result.best is None
    near = result.closest
    assert near is not None
    m = near.metrics
    # its figures are of the whole trace: a trial that ran to the end, or one replayed to it
    assert not m.get("early_stopped") or m.get("replayed_to_end")
    assert m["n_served"] + m["n_rejected"] == m["n_requests"]
    assert result.binding in near.violations and near.violations[result.binding] > 0
    from rich.console import Console

    from kvtier.report.optimize import print_result

    console = Console(record=True, width=200)
    print_result(result, console)
    text = console.export_text()
    assert f"Closest: trial {near.number}" in text
    assert "served the whole trace" in text or "replayed to the end" in text
    if m["n_rejected"]:
        assert f"rejected {m['n_rejected']:,} of" in text
    else:
        assert "rejected" not in text


@pytest.fixture(scope="module")
def chat_trace(tmp_path_factory):
    from kvtier.trace.io import write_trace
    from kvtier.trace.synth import synthesize

    path = tmp_path_factory.mktemp("words") / "chat.parquet"
    write_trace(synthesize("chat", requests=200, rate=6.0, seed=5), path)
    return path


@pytest.mark.slow
def test_presets_at_their_own_cheapest_size_and_the_best_each_target_can_run(
    chat_trace, tmp_path
) -> None:
    from kvtier.scenario import Scenario
    from kvtier.search.objective import Evaluator
    from kvtier.search.run import runnable_targets
    from kvtier.trace.io import read_trace

    result = optimize(
        str(chat_trace),
        max_hosts=2,
        slo_text="ttft_p99=3,tpot_p99=0.2",
        n_trials=6,
        seed=3,
        storage=f"sqlite:///{tmp_path / 'h.db'}",
        study_name="hosts",
        runs_dir=tmp_path / "runs",
        out=str(tmp_path / "best.toml"),
    )
    hw = load_hardware(str(tmp_path / "runs" / "h100-node-x2.toml"))
    mdl = load_model("Llama-3.1-8B")
    assert hw.topology.gpus == 16
    evaluator = Evaluator(
        Scenario(read_trace(chat_trace), hw, mdl, Policy(slo=result.slo), slo=result.slo)
    )
    feasible = [b for b in result.baselines if b.evaluation and b.evaluation.feasible]
    assert feasible
    for b in feasible:
        ev = b.evaluation
        n = ev.metrics.instances
        assert n < hw.topology.max_instances, b.name  # not priced on every GPU
        if n > 1:  # one instance fewer misses the SLO or costs more
            fewer = replace(ev.policy, serving=replace(ev.policy.serving, instances=n - 1))
            try:
                other = evaluator.evaluate_policy(fewer, full=True)
            except InputError:  # e.g. a fixed prefill count then leaves no decode instance
                continue
            assert not (other.feasible and other.cost_per_mtok < ev.cost_per_mtok), b.name
    assert result.best is not None and result.refined is not None
    best_cost = result.refined.cost_per_mtok
    names = [r.target for r in result.per_target]
    assert names == ["vllm", "lmcache", "sglang", "dynamo", "mooncake"]
    import optuna

    from kvtier.policy.model import policy_from_dict, policy_to_dict
    from kvtier.search.run import as_ran
    from kvtier.search.study import summaries

    study = optuna.load_study(study_name="hosts", storage=f"sqlite:///{tmp_path / 'h.db'}")
    trials = {s.number: s for s in summaries(study)}
    for r in result.per_target:
        if r.cost_per_mtok is None:  # no feasible trial this target can run
            for s in trials.values():
                if s.feasible:
                    ran = as_ran(policy_from_dict(s.policy), s.metrics, 1.0)
                    assert r.target not in runnable_targets(policy_to_dict(ran), hw, mdl)
            continue
        assert r.cost_per_mtok >= best_cost * (1 - 1e-9), r
        if r.winner:
            assert r.target in result.runnable_by and r.extra == 0.0
            continue
        assert r.target not in result.runnable_by
        assert r.extra == pytest.approx(r.cost_per_mtok / best_cost - 1)
        if r.changed:  # the winner projected onto what the target expresses, refined
            assert r.trial == result.best.number and r.refined
            from kvtier.search.run import project_to_target

            projected, changed = project_to_target(
                policy_from_dict(result.refined.policy), r.target, hw
            )
            assert changed == r.changed
            assert r.target in runnable_targets(policy_to_dict(projected), hw, mdl)
            continue
        s = trials[r.trial]
        assert s.feasible
        ran = as_ran(policy_from_dict(s.policy), s.metrics, 1.0)
        if r.refined:  # the trial refined: cheaper than sampled
            assert r.cost_per_mtok < s.metrics["cost_per_mtok"]
        else:
            assert s.metrics["cost_per_mtok"] == pytest.approx(r.cost_per_mtok)
            assert r.target in runnable_targets(policy_to_dict(ran), hw, mdl)
        assert r.extra == pytest.approx(r.cost_per_mtok / best_cost - 1)


@pytest.mark.slow
def test_a_70b_optimize_compares_the_presets_at_a_tp_that_holds_it(chat_trace, tmp_path) -> None:
    result = optimize(
        str(chat_trace),
        model="Llama-3.1-70B",
        slo_text="ttft_p99=5,tpot_p99=0.3",
        n_trials=3,
        seed=1,
        storage=f"sqlite:///{tmp_path / 'b.db'}",
        study_name="big",
        runs_dir=tmp_path / "runs",
        out=str(tmp_path / "best.toml"),
    )
    ran = [b for b in result.baselines if b.evaluation is not None]
    left = {b.name: b.error for b in result.baselines if b.evaluation is None}
    assert ran, left
    hw, big = load_hardware("h100-node"), load_model("Llama-3.1-70B")
    for b in ran:  # every preset at a size whose GPUs leave its weights room for KV
        policy = b.evaluation.policy
        assert kv_room(hw, big, policy.serving.tp or 1, policy) > 0, b.name
    for name, why in left.items():  # left out for a reason of its own, not the model's size
        assert "does not fit" not in why and "weights" not in why, (name, why)
        reasons = ("has no [tiers.", "leaves no decode instance", "kept for validate beluga")
        assert any(r in why for r in reasons), (name, why)
