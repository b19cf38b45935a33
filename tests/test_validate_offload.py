"""``kvtier validate offload``: the catalogue's files, the targets' arithmetic, and the command
on one run (its table's structure, and exit code 1 naming each missed target)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.errors import InputError
from kvtier.experiments.offload_validation import (
    OFFLOAD_DIR,
    Cell,
    OffloadValidation,
    build_trace,
    load_catalogue,
    load_run,
)

SMALL = "mooncake-store-lmcache-qwen72b-h800"  # 2 x 50 requests on one instance


def test_catalogue_runs_are_each_sourced_and_declared_first() -> None:
    runs = load_catalogue()
    assert len(runs) >= 12
    for r in runs:
        assert r.role in ("check", "calibration")
        assert r.source["url"].startswith("https://") and r.source["read"]
        text = Path(r.path).read_text()
        # both sides are replayed; a side whose published figures repeat another run's is not
        # counted again, and the file says why in place of its figures
        assert r.measured["baseline"] or r.measured["tiered"]
        for side in ("baseline", "tiered"):
            assert r.measured[side] or f"# no measured.{side} figures: " in text
        first = next(ln for ln in text.splitlines() if ln and not ln.startswith("#"))
        assert first.startswith("role")  # declared before anything else


def test_shared_prefix_trace_shares_only_the_system_prompt() -> None:
    run = next(r for r in load_catalogue() if r.name.endswith("c45-low-cache"))
    trace = build_trace(run)
    table = trace.table
    assert len(table) == run.conditions["requests"]
    hashes = table.column("block_hashes").to_pylist()
    sys_blocks = run.conditions["system_tokens"] // 16
    groups = {tuple(h[:sys_blocks]) for h in hashes}
    assert len(groups) == run.conditions["groups"]
    assert len({tuple(h[sys_blocks:]) for h in hashes}) == 450  # every question its own


def test_concurrency_run_takes_the_prompts_in_turn_from_one_shuffle() -> None:
    """inference-perf's shared-prefix datagen: request k takes prompt k mod P of one shuffle,
    so 2700 requests over 2500 prompts send each once, then the first 200 again."""
    run = next(r for r in load_catalogue() if r.name == "llmd-fs-connector-lustre-qwen3-32b-30k")
    c = run.conditions
    n, p = c["requests"], c["groups"] * c["prompts_per_group"]
    assert (n, p) == (2700, 2500)
    hashes = [tuple(h) for h in build_trace(run).table.column("block_hashes").to_pylist()]
    assert len(set(hashes[:p])) == p
    assert hashes[p:] == hashes[: n - p]
    sys_blocks = c["system_tokens"] // 16
    assert len({h[:sys_blocks] for h in hashes[:50]}) > 10  # shuffled, not group after group


def test_concurrency_run_queues_every_request_within_the_first_second() -> None:
    """inference-perf's concurrent load is a one-second constant-rate stage of every request
    (exponential gaps scaled to sum to 1 s): queued times rise from just after 0 to 1 s."""
    run = next(r for r in load_catalogue() if r.name.endswith("c45-low-cache"))
    t = np.asarray(build_trace(run).arrival_s)
    assert len(t) == run.conditions["requests"]
    assert t[0] > 0 and np.all(np.diff(t) > 0) and abs(t[-1] - 1.0) < 1e-9
    n = len(t)
    assert 0.3 * 45 / n < t[44] < 3 * 45 / n  # the first wave of 45: about 45 / n of a second


def test_fs_runs_read_the_shared_lustre_pool_of_the_guides_storage_class() -> None:
    """18000 GiB at 1000 MB/s per TiB, one pool every host mounts (the FS connector's PVC)."""
    from kvtier.hardware import load_hardware

    for r in load_catalogue():
        if r.name.startswith("llmd-fs-connector-lustre"):
            assert r.conditions["hardware"] == "a3-highgpu-4g-lustre"
    hw = load_hardware("a3-highgpu-4g-lustre")
    ssd = hw.tiers["ssd"]
    assert not ssd.per_host
    assert ssd.pool_bw == pytest.approx(18000 / 1024 * 1000 * 1e6, rel=2e-3)
    assert (hw.topology.hosts, hw.topology.gpus_per_host) == (4, 4)


def test_qps_sweep_is_one_trace_of_its_stages_in_order() -> None:
    """inference-perf's sweep: int(rate x duration) requests per stage, each stage resending
    the previous stages' prompts from the same shuffled list, stages far apart in time."""
    from kvtier.experiments.offload_validation import STAGE_GAP_S, stage_of

    run = next(r for r in load_catalogue() if r.name.endswith("qwen3-32b-20qps"))
    c = run.conditions
    assert c["load"] == "poisson_stages" and c["measured_stage"] == 4
    trace = build_trace(run)
    stage = stage_of(trace)
    counts = [int(r * d) for r, d in c["stages"]]
    assert np.bincount(stage).tolist() == counts
    hashes = trace.table.column("block_hashes").to_pylist()
    first = [tuple(h) for h, s in zip(hashes, stage, strict=True) if s == 0]
    second = [tuple(h) for h, s in zip(hashes, stage, strict=True) if s == 1]
    assert second[: len(first)] == first  # request k of every stage: the same prompt
    assert len(set(first)) == len(first)  # a stage of 300 sends 300 distinct prompts
    arrival = np.asarray(trace.arrival_s)
    for s, (_rate, duration) in enumerate(c["stages"]):
        t = arrival[stage == s] - s * STAGE_GAP_S
        assert t.min() >= 0 and 0.85 * duration <= t.max() <= 1.15 * duration  # Poisson counts
        assert (np.diff(t) >= 0).all()
    # the other stages' runs replay the same sweep (one replay per side serves them all)
    from kvtier.experiments.offload_validation import _replay_key

    other = next(r for r in load_catalogue() if r.name.endswith("qwen3-32b-40qps"))
    assert _replay_key(run, "tiered") == _replay_key(other, "tiered")


def test_role_must_come_first_and_keys_are_checked(tmp_path: Path) -> None:
    src = (OFFLOAD_DIR / f"{SMALL}.toml").read_text()
    body = src.split("\n", 1)[1]
    bad = tmp_path / "late.toml"
    bad.write_text(body + '\nrole = "check"\n')
    with pytest.raises(InputError, match="declared first"):
        load_run(bad)
    typo = tmp_path / "typo.toml"
    typo.write_text(src.replace("[conditions]", "[conditions]\nbogus = 1"))
    with pytest.raises(InputError, match=r"conditions\.bogus"):
        load_run(typo)
    neg = tmp_path / "neg.toml"
    neg.write_text(src.replace("ttft_mean_s = 6.71", "ttft_mean_s = -1"))
    with pytest.raises(InputError, match="out of range"):
        load_run(neg)


def _result(errors: dict[str, float], role: str = "check") -> OffloadValidation:
    runs = [r for r in load_catalogue() if r.name == SMALL]
    cells = [
        Cell(SMALL, role, "tiered", m, 10.0 if "hit_ratio" not in m else 0.5,
             (10.0 * (1 + e)) if "hit_ratio" not in m else 0.5 + e)
        for m, e in errors.items()
    ]  # fmt: skip
    return OffloadValidation(runs, cells, {SMALL: ""})


def test_targets_met_and_missed() -> None:
    ok = _result({"ttft_mean_s": 0.149, "throughput": -0.099, "hit_ratio": 0.049})
    assert ok.missed() == []
    bad = _result({"ttft_mean_s": 0.151, "throughput": 0.10001, "hit_ratio": -0.051})
    assert {m.metric for m in bad.missed()} == {"ttft_mean_s", "throughput", "hit_ratio"}
    # calibration cells are shown, never counted
    calib = _result({"ttft_mean_s": 5.0, "throughput": 5.0}, role="calibration")
    assert calib.mape("ttft_mean_s") is None
    assert {m.metric for m in calib.missed()} == {"ttft_mean_s", "throughput"}  # no checks


def test_sweep_external_hit_ratio_is_in_points_and_checked() -> None:
    ok = _result({"sweep_external_hit_ratio": 0.049})
    assert "sweep_external_hit_ratio" not in {m.metric for m in ok.missed()}
    bad = _result({"sweep_external_hit_ratio": -0.2})
    (cell,) = bad.cells
    assert cell.error == pytest.approx(-0.2)
    assert "sweep_external_hit_ratio" in {m.metric for m in bad.missed()}


def test_sweep_hit_ratio_needs_a_sweep_and_external_ratio_arithmetic(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from kvtier.experiments.offload_validation import _external_hit_ratio, _figures

    src = (OFFLOAD_DIR / f"{SMALL}.toml").read_text()
    bad = tmp_path / "notasweep.toml"
    bad.write_text(
        src.replace("[measured.tiered]", "[measured.tiered]\nsweep_external_hit_ratio = 0.4")
    )
    with pytest.raises(InputError, match="needs load poisson_stages"):
        load_run(bad)
    # 2 requests of 1,000 prompt tokens (blocks of 100): 300 tokens hit in HBM, 1,190 loaded
    trace = SimpleNamespace(
        block_tokens=100,
        input_tokens=np.array([1000, 1000]),
        output_tokens=np.array([10, 30]),
        arrival_s=np.array([0.0, 1.0]),
    )
    raw = SimpleNamespace(
        hit_blocks=np.array([3, 0]),
        loaded_blocks=np.array([0, 7]),
        arrival_s=None,
        first_token_s=np.array([0.5, 1.5]),
        finish_s=np.array([1.0, 3.0]),
    )
    assert _external_hit_ratio(trace, raw) == pytest.approx(700 / 1700)
    sel = np.arange(2)
    assert _figures(trace, raw, None, sel, "out tok/s")["throughput"] == pytest.approx(40 / 3)
    assert _figures(trace, raw, None, sel, "tok/s")["throughput"] == pytest.approx(2040 / 3)
    # a harness that counted 1.5 tokens for each one sent: only the output side is counted so
    assert _figures(trace, raw, None, sel, "out tok/s", 1.5)["throughput"] == pytest.approx(20)
    assert _figures(trace, raw, None, sel, "tok/s", 1.5)["throughput"] == pytest.approx(2060 / 3)
    assert _figures(trace, raw, None, sel, "tok/s", 1.5)["ttft_mean_s"] == pytest.approx(0.5)


def test_latency_tail_and_end_to_end_are_inference_perfs_figures() -> None:
    """P90 by numpy's linear rule over the selected requests (inference-perf's ``summarize``),
    end-to-end from send to last token; an unfinished request is left out, not counted as 0."""
    from types import SimpleNamespace

    from kvtier.experiments.offload_validation import _figures

    n = 11
    trace = SimpleNamespace(
        block_tokens=16,
        input_tokens=np.full(n, 100),
        output_tokens=np.full(n, 10),
        arrival_s=np.arange(n, dtype=float),
    )
    ttft = np.linspace(0.1, 1.1, n)  # 0.1, 0.2, ... 1.1
    finish = np.arange(n) + ttft + 2.0
    finish[0] = np.nan  # still running at the end
    raw = SimpleNamespace(arrival_s=None, first_token_s=np.arange(n) + ttft, finish_s=finish)
    figs = _figures(trace, raw, None, np.arange(n), "tok/s")
    assert figs["ttft_p90_s"] == pytest.approx(1.0)
    assert figs["e2e_mean_s"] == pytest.approx(2.0 + np.mean(ttft[1:]))
    assert figs["e2e_p90_s"] == pytest.approx(2.0 + np.percentile(ttft[1:], 90))


def test_reported_figures_have_a_mape_and_no_target() -> None:
    """A P90 or end-to-end error, however large, never makes the command miss; its MAPE is
    printed and written beside the targeted ones."""
    from kvtier.report.offload_validation import offload_json, to_text

    res = _result({"ttft_mean_s": 0.05, "throughput": 0.02, "e2e_mean_s": -0.6})
    assert res.missed() == []
    assert res.mape("e2e_mean_s") == pytest.approx(0.6)
    assert "E2E latency mean s MAPE over 1 checks: 60.0 % (no target)" in to_text(res)
    assert offload_json(res)["mape"]["e2e_mean_s"] == pytest.approx(0.6)


def test_the_summary_says_which_way_the_errors_lean() -> None:
    """A MAPE alone hides whether the errors cancel; the summary counts the checks below and
    above the measured figure, in text and JSON."""
    from kvtier.report.offload_validation import offload_json, to_text

    res = _result({"ttft_mean_s": -0.3, "throughput": 0.2, "e2e_mean_s": -0.1})
    assert res.lean("ttft_mean_s") == (1, 0) and res.lean("throughput") == (0, 1)
    text = to_text(res)
    assert "(target <= 15 %: missed); 1 below the measured, 0 above" in text
    assert "(no target); 1 below the measured, 0 above" in text
    assert offload_json(res)["lean"]["throughput"] == {"below": 0, "above": 1}
    assert res.lean("ttft_p90_s") == (0, 0)  # no check: nothing said
    assert "TTFT P90 s" not in text


def test_harness_output_count_is_checked_and_changes_no_replay(tmp_path: Path) -> None:
    """``harness_output_tokens``: one count per side, at least the server's, only with a
    throughput in tokens; it scales what the model reports, never what it replays."""
    from kvtier.experiments.offload_validation import _replay_key

    src = (OFFLOAD_DIR / f"{SMALL}.toml").read_text()  # output_tokens = 64, throughput req/s
    tok = src.replace('throughput_unit = "req/s"', 'throughput_unit = "tok/s"')
    assert tok != src

    def with_count(text: str, table: str) -> Path:
        path = tmp_path / "counted.toml"
        line = f"[conditions]\nharness_output_tokens = {table}"
        path.write_text(text.replace("[conditions]", line))
        return path

    run = load_run(with_count(tok, "{ baseline = 96.0, tiered = 80 }"))
    assert run.output_count("baseline") == pytest.approx(1.5)
    assert run.output_count("tiered") == pytest.approx(1.25)
    plain = load_run(OFFLOAD_DIR / f"{SMALL}.toml")
    assert plain.output_count("tiered") == 1.0
    for side in ("baseline", "tiered"):  # the same replay as without the count
        assert _replay_key(run, side) == _replay_key(
            load_run(with_count(tok, "{ baseline = 64, tiered = 64 }")), side
        )
    for table, why in (
        ("{ baseline = 96.0 }", "tiered must be a number"),
        ("{ baseline = 96.0, tiered = 32 }", "at least output_tokens"),
        ("{ baseline = 96.0, tiered = true }", "tiered must be a number"),
        ("{ baseline = 96.0, tiered = 80, rounds = 1 }", "harness_output_tokens.rounds"),
        ("96.0", "must be a table"),
    ):
        with pytest.raises(InputError, match=why):
            load_run(with_count(tok, table))
    with pytest.raises(InputError, match="needs a throughput in tokens"):
        load_run(with_count(src, "{ baseline = 96.0, tiered = 80 }"))


def test_gpt_oss_sweep_files() -> None:
    """The gpt-oss-120b sweep: eight checks of one replay, output-token throughput, both sides
    behind llm-d's optimized-baseline router of the run's date (2:2:3 with no-hit-LRU 2 and no
    CPU prefix scorer: llm-d's blog of the sweep, routing scored only the GPU), vLLM 0.22.0's
    stores of generated blocks, the whole sweep's external hit ratio stated once."""
    runs = [r for r in load_catalogue() if "gpt-oss-120b" in r.name]
    assert len(runs) == 8 and all(r.role == "check" for r in runs)
    assert sorted(r.conditions["measured_stage"] for r in runs) == list(range(1, 9))
    assert {r.unit for r in runs} == {"out tok/s"}
    # inference-perf's count per request (summary output tokens/s over requests/s), each file
    for r in runs:
        assert r.conditions["harness_output_tokens"] == {"baseline": 382.2, "tiered": 358.9}
        assert r.output_count("baseline") == pytest.approx(3704 / 9.69 / 256, rel=1e-3)
        assert r.output_count("tiered") == pytest.approx(4120 / 11.48 / 256, rel=1e-3)
    tiered = runs[0].deploy["tiered"]["set"]
    weights = [tiered[f"serving.epp_{k}_weight"] for k in ("queue", "kv_util", "gpu_prefix")]
    assert weights + [tiered["serving.epp_cpu_prefix_weight"]] == [2.0, 2.0, 3.0, 0.0]
    baseline = runs[0].deploy["baseline"]["set"]
    for key in [k for k in tiered if k.startswith("serving.epp_")] + ["serving.routing"]:
        assert baseline[key] == tiered[key], key  # one router for both arms
    assert tiered["serving.epp_no_hit_lru_weight"] == 2.0
    assert tiered["tiers.dram.store_generated"] is True
    with_hit = [r for r in runs if "sweep_external_hit_ratio" in r.measured["tiered"]]
    assert [r.measured["tiered"]["sweep_external_hit_ratio"] for r in with_hit] == [0.451]


def test_unknown_run_is_a_one_line_error() -> None:
    res = CliRunner().invoke(main, ["validate", "offload", "--run", "nope"])
    assert res.exit_code == 2
    assert "--run" in res.output and SMALL in res.output and "Traceback" not in res.output


def test_command_on_one_run_prints_its_table_and_exit_code_follows_the_targets() -> None:
    res = CliRunner().invoke(main, ["validate", "offload", "--run", SMALL, "--json"])
    assert res.exit_code in (0, 1), res.output
    data = json.loads(res.stdout)
    (run,) = data["runs"]
    assert run["name"] == SMALL and run["role"] == "check" and run["error"] is None
    cells = {(c["side"], c["metric"]): c for c in run["cells"]}
    assert set(cells) == {
        (s, m) for s in ("baseline", "tiered") for m in ("ttft_mean_s", "throughput")
    }
    for c in cells.values():
        assert c["model"] > 0 and c["error"] == pytest.approx(c["model"] / c["measured"] - 1)
    # one replay gives both rounds of a rounds run: its cold round and its full-hit round differ
    assert cells["tiered", "ttft_mean_s"]["model"] != cells["baseline", "ttft_mean_s"]["model"]
    missed = {m["metric"] for m in data["missed"]}
    assert (res.exit_code == 1) == bool(missed)
    for metric in missed:
        assert f"target missed: {metric}" in res.stderr
    text = CliRunner().invoke(main, ["validate", "offload", "--run", SMALL])
    assert text.exit_code == res.exit_code
    for word in ("measured", "model", "error", "role", "TTFT mean s", "MAPE"):
        assert word in text.stdout


BLOG = "vllm-offloading-blog-llama8b-h100-100k"  # one 100K-token prompt, cold then from CPU


def test_stages_say_where_each_rounds_prompt_tokens_came_from() -> None:
    res = CliRunner().invoke(main, ["validate", "offload", "--run", BLOG, "--stages", "--json"])
    data = json.loads(res.stdout)
    cold, hit = data["stages"][BLOG]  # a rounds run: one replay, its two rounds
    for row in (cold, hit):
        assert row["side"] == "tiered" and row["requests"] == 1
        shares = row["hbm_share"] + row["loaded_share"] + row["computed_share"]
        assert shares == pytest.approx(1.0)
    # GPU prefix caching off: the cold round computes its prompt, the second loads it from
    # the CPU but for the last block, which vLLM always computes
    assert cold["computed_share"] == pytest.approx(1.0) and cold["hbm_share"] == 0.0
    assert 0.99 < hit["loaded_share"] < 1.0 and hit["hbm_share"] == 0.0
    (run,) = data["runs"]
    ttft = {c["side"]: c["model"] for c in run["cells"] if c["metric"] == "ttft_mean_s"}
    assert (cold["ttft_mean_s"], hit["ttft_mean_s"]) == pytest.approx(
        (ttft["baseline"], ttft["tiered"])
    )
    text = CliRunner().invoke(main, ["validate", "offload", "--run", BLOG, "--stages"])
    assert "stages of each side's replay" in text.stdout and "computed" in text.stdout


def test_a_target_with_nothing_to_check_in_a_selection_is_missed_and_says_so() -> None:
    # the blog run publishes TTFT only: its throughput target has nothing to check, and a
    # target is met only on checks
    res = CliRunner().invoke(main, ["validate", "offload", "--run", BLOG])
    assert res.exit_code == 1
    assert "target missed: throughput: no check among these runs" in res.stderr
    assert "nan" not in res.stderr
    assert "throughput: no check among these runs (target <= 10 %: missed)" in res.stdout


def test_a_sensitivity_study_sets_the_profile_factors_the_validation_leaves_alone() -> None:
    """``efficiency`` (scripts/step_time_sensitivity.py) scales the replay's step times and is
    part of the replay's cache key; without it the figures are the profile's."""
    from kvtier.experiments.offload_validation import _replay_key, model_figures

    run = load_run(OFFLOAD_DIR / "vllm-offloading-blog-llama8b-h100-100k.toml")
    base = model_figures(run)
    slow = model_figures(run, {"measured_compute_scale": 1.2, "measured_memory_scale": 1.2})
    assert model_figures(run) == base
    # a 100K-token prefill is compute-bound: about 1.2x, less the unscaled front end
    ratio = slow["baseline"]["ttft_mean_s"] / base["baseline"]["ttft_mean_s"]
    assert 1.15 < ratio < 1.2
    eff = {"measured_memory_scale": 1.1}
    assert _replay_key(run, "tiered") != _replay_key(run, "tiered", eff)
    assert _replay_key(run, "tiered", {}) == _replay_key(run, "tiered")


@pytest.mark.slow
def test_full_catalogue_replays() -> None:
    res = CliRunner().invoke(main, ["validate", "offload", "--json"])
    assert res.exit_code in (0, 1), res.output
    data = json.loads(res.stdout)
    assert all(r["error"] is None for r in data["runs"])
    assert (res.exit_code == 1) == bool(data["missed"])


def test_the_mooncake_run_replays_the_same_on_both_engines() -> None:
    """The validation's replay of a run through the reference: identical per-request times."""
    from kvtier.experiments.offload_validation import _hardware, _policy
    from kvtier.hardware import load_model
    from kvtier.scenario import Scenario

    run = next(r for r in load_catalogue() if r.name == SMALL)
    trace, hw = build_trace(run), _hardware(run)
    model = load_model(run.conditions["model"])
    policy = _policy(run, "tiered")
    fast = Scenario(trace, hw, model, policy).replay()
    ref = Scenario(trace, hw, model, policy, engine="reference").replay()
    assert (fast.raw.first_token_s == ref.raw.first_token_s).all()
    assert (fast.raw.finish_s == ref.raw.finish_s).all()


def test_vllm_v0_counts_a_connector_load_in_the_token_budget() -> None:
    """vLLM v0's scheduler does not see a KV connector's hits (the connector loads inside the
    step, before the forward pass): in the Mooncake run's full-hit round each step admits the
    three 9,728-token prompts its 32,768-token budget holds, loads them and emits their first
    tokens together, instead of admitting all 50 at once."""
    from kvtier.experiments.offload_validation import _hardware, _policy
    from kvtier.hardware import load_model
    from kvtier.scenario import Scenario

    run = next(r for r in load_catalogue() if r.name == SMALL)
    assert run.deploy["tiered"]["set"]["serving.scheduler"] == "vllm_v0"
    trace, hw = build_trace(run), _hardware(run)
    policy = _policy(run, "tiered")
    rep = Scenario(trace, hw, load_model(run.conditions["model"]), policy).replay()
    n = int(run.conditions["requests"])
    first = rep.raw.first_token_s[n:]
    groups = np.unique(first)
    per_step = policy.serving.max_num_batched_tokens // int(run.conditions["input_tokens"])
    assert per_step == 3
    assert len(groups) == -(-n // per_step)
    assert all((first == g).sum() <= per_step for g in groups)


def test_lmcache_lustre_runs_keep_per_engine_files_on_the_one_lustre_instance() -> None:
    """LMCache's local-disk back end on the guide's Lustre PVC: each engine's own files (a
    per-host tier, no engine reads another's), every host's traffic through the instance's one
    17.6 GB/s link; the rest of the cluster as the FS runs' profile."""
    from kvtier.hardware import load_hardware

    runs = [r for r in load_catalogue() if r.name.startswith("llmd-lmcache-cpu-lustre")]
    assert len(runs) == 2
    for r in runs:
        assert r.conditions["hardware"] == "a3-highgpu-4g-lustre-local"
    local, shared = (
        load_hardware("a3-highgpu-4g-lustre-local"),
        load_hardware("a3-highgpu-4g-lustre"),
    )
    assert local.tiers["ssd"].per_host and not shared.tiers["ssd"].per_host
    assert local.tiers["ssd"].pool_bw == shared.tiers["ssd"].pool_bw
    assert local.topology == shared.topology
    assert local.tiers["dram"] == shared.tiers["dram"]


def test_sglang_lustre_runs_share_the_9000_gib_instance_through_the_file_back_end() -> None:
    """llm-d PR #2093: SGLang's file back end (``sglang-hicache-file``, filling the host pool
    it prefetches into) on one 9,000 GiB Lustre volume at 1000 MB/s per TiB every engine
    shares; the rest of the cluster as the FS runs' profile. A side whose figures repeat
    another table's is replayed but carries no measured figure."""
    from kvtier.hardware import load_hardware

    runs = [r for r in load_catalogue() if r.name.startswith("llmd-sglang-hicache-file-lustre")]
    assert len(runs) == 5 and all(r.role == "check" for r in runs)
    for r in runs:
        assert r.conditions["hardware"] == "a3-highgpu-4g-lustre-9t"
        tiered, base = r.deploy["tiered"]["set"], r.deploy["baseline"]["set"]
        assert tiered["tiers.ssd.connector"] == "sglang-hicache-file"
        assert "tiers.ssd.capacity_gb" not in base
        assert tiered["tiers.dram.capacity_gb"] == base["tiers.dram.capacity_gb"]
    uncounted = {r.name: [s for s in ("baseline", "tiered") if not r.measured[s]] for r in runs}
    assert uncounted == {
        "llmd-sglang-hicache-file-lustre-qwen3-32b-200g-20qps": ["baseline"],
        "llmd-sglang-hicache-file-lustre-qwen3-32b-200g-40qps": ["baseline"],
        "llmd-sglang-hicache-file-lustre-qwen3-32b-64g-15qps": [],
        "llmd-sglang-hicache-file-lustre-qwen3-32b-64g-20qps": ["tiered"],
        "llmd-sglang-hicache-file-lustre-qwen3-32b-64g-35qps": [],
    }
    small, fs = load_hardware("a3-highgpu-4g-lustre-9t"), load_hardware("a3-highgpu-4g-lustre")
    ssd = small.tiers["ssd"]
    assert not ssd.per_host
    assert ssd.pool_bw == pytest.approx(9000 / 1024 * 1000 * 1e6, rel=2e-3)
    assert ssd.capacity_bytes == pytest.approx(9000 * 2**30, rel=1e-4)
    assert small.topology == fs.topology and small.tiers["dram"] == fs.tiers["dram"]


def test_c45_files_run_behind_the_epp_profile_of_their_guide() -> None:
    """The concurrency-45 runs (llm-d PR #457): both sides behind llmd_epp at the guide's
    2:2:1:1 (queue : KV use : GPU prefix : CPU prefix), no LRU or active-request scorer; the
    KV-use scorer at 0, the constant score it gave with its metric missing from the runs'
    vLLM (docs/sources.md [llm-d-epp])."""
    runs = [r for r in load_catalogue() if "-c45-" in r.name]
    assert len(runs) == 2 and all(r.role == "check" for r in runs)
    keys = ("queue", "kv_util", "gpu_prefix", "cpu_prefix", "no_hit_lru", "active")
    for r in runs:
        for side in ("baseline", "tiered"):
            s = r.deploy[side]["set"]
            assert s["serving.routing"] == "llmd_epp"
            assert [s[f"serving.epp_{k}_weight"] for k in keys] == [2.0, 0.0, 1.0, 1.0, 0.0, 0.0]


def test_a_mape_beside_its_target_shows_the_digit_that_decides_it() -> None:
    """A MAPE that one decimal would print as the target gets a second decimal, so the
    verdict beside it is not read off a rounded figure; others keep one."""
    from kvtier.report.offload_validation import _percent

    assert _percent(0.09984, 0.10) == "9.98 %"
    assert _percent(0.10041, 0.10) == "10.04 %"
    assert _percent(0.303, 0.15) == "30.3 %"
    assert _percent(0.101, 0.10) == "10.1 %"
