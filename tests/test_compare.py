"""``kvtier compare``: each row is exactly what ``kvtier replay`` gives for that policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.policy.presets import PAST_RELEASE_PRESETS, current_preset_names
from kvtier.trace.io import write_trace
from kvtier.trace.synth import synthesize
from tests.helpers import assert_one_line_error, invoke


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("compare") / "rag.parquet"
    write_trace(synthesize("rag", requests=120, rate=4.0, seed=7), path)
    return path


def test_every_current_preset_by_default_each_equal_to_its_replay(trace_path) -> None:
    r = invoke("compare", "--trace", str(trace_path), "--json")
    assert r.code == 0, r.stderr
    rows = json.loads(r.stdout)["policies"]
    # a past release's preset, kept for its validation scenario, only when named
    assert [row["policy"] for row in rows] == current_preset_names()
    assert set(json.loads(r.stdout)["left_out"]) == set(PAST_RELEASE_PRESETS)
    shown = invoke("compare", "--trace", str(trace_path))
    assert shown.code == 0, shown.stderr
    assert "Not compared unless named with --preset: lmcache-0.3-mooncake-beluga" in " ".join(
        shown.stdout.split()
    )
    named = invoke("compare", "--trace", str(trace_path), "--preset", "vllm-0.8.5-hbm-beluga",
                   "--json")  # fmt: skip
    assert named.code == 0, named.stderr
    data = json.loads(named.stdout)
    assert [row["policy"] for row in data["policies"]] == ["vllm-0.8.5-hbm-beluga"]
    assert "left_out" not in data
    for row in rows[:3]:
        alone = invoke("replay", "--trace", str(trace_path), "--preset", row["policy"], "--json")
        assert alone.code == 0, alone.stderr
        assert row["error"] is None
        replayed = json.loads(alone.stdout)
        assert row["tiers"] == replayed.pop("tiers", None)  # the per-tier table, when tiered
        assert row["metrics"] == replayed


def test_a_preset_the_hardware_cannot_run_is_a_row_not_a_failure(trace_path) -> None:
    r = invoke(
        "compare",
        "--trace",
        str(trace_path),
        "--hardware",
        "h100-node",
        "--model",
        "Llama-3.1-8B",
        "--preset",
        "beluga-cxl",
        "--preset",
        "vllm-hbm",
        "--slo",
        "ttft_p99=2",
    )
    assert r.code == 0, r.stderr
    assert "beluga-cxl could not run" in r.stdout and "cxl" in r.stdout
    data = json.loads(
        invoke(
            "compare",
            "--trace",
            str(trace_path),
            "--hardware",
            "h100-node",
            "--preset",
            "vllm-hbm",
            "--slo",
            "ttft_p99=2",
            "--json",
        ).stdout
    )
    (row,) = data["policies"]
    assert row["hardware"] == "h100-node" and row["metrics"]["slo_met"] in (True, False)


def test_policy_files_and_bad_ones(trace_path, tmp_path) -> None:
    good = tmp_path / "p.toml"
    good.write_text('format = "kvtier-policy/1"\nblock_tokens = 32\n')
    r = invoke("compare", "--trace", str(trace_path), "--policy", str(good), "--json")
    assert r.code == 0, r.stderr
    assert json.loads(r.stdout)["policies"][0]["block_tokens"] == 32
    bad = tmp_path / "bad.toml"
    bad.write_text('format = "kvtier-policy/1"\nblock_tokens = "many"\n')
    assert_one_line_error(
        invoke("compare", "--trace", str(trace_path), "--policy", str(bad)), "bad.toml"
    )
    assert_one_line_error(
        invoke("compare", "--trace", str(trace_path), "--preset", "no-such-system"),
        "no-such-system",
    )


def test_what_if_rows_follow_each_policy_and_equal_their_replays(trace_path, tmp_path) -> None:
    from dataclasses import replace

    import tomli_w

    from kvtier.policy.model import policy_to_dict
    from kvtier.policy.presets import load_preset

    r = invoke(
        "compare", "--trace", str(trace_path), "--preset", "beluga-cxl", "--what-if", "--json"
    )
    assert r.code == 0, r.stderr
    rows = json.loads(r.stdout)["policies"]
    assert rows[0]["policy"] == "beluga-cxl" and rows[0]["variant_of"] is None
    labels = [row["policy"] for row in rows[1:]]
    assert labels[0] == "beluga-cxl: without cxl"
    assert {row["variant_of"] for row in rows[1:]} == {"beluga-cxl"}
    assert any(label.startswith("beluga-cxl: cxl x2 ") for label in labels)
    assert any(label.startswith("beluga-cxl: with dram ") for label in labels)
    preset = load_preset("beluga-cxl")
    without = replace(preset, tiers=tuple(t for t in preset.tiers if t.name != "cxl"))
    path = tmp_path / "without-cxl.toml"
    path.write_text(tomli_w.dumps(policy_to_dict(without)))
    alone = invoke("replay", "--trace", str(trace_path), "--policy", str(path), "--json")
    assert alone.code == 0, alone.stderr
    assert rows[1]["metrics"] == json.loads(alone.stdout)
    shown = invoke("compare", "--trace", str(trace_path), "--preset", "beluga-cxl", "--what-if")
    assert shown.code == 0 and "beluga-cxl: without cxl" in shown.stdout


def _header(stdout: str) -> list[str]:
    line = next(ln for ln in stdout.splitlines() if "TTFT mean" in ln)
    return [c.strip() for c in line.strip("┃ ").split("┃")]


def test_a_tbt_slo_adds_the_tbt_column_as_replay_shows_it(trace_path) -> None:
    slo = "ttft_p99=5,tbt_p99=0.05"
    r = invoke("compare", "--trace", str(trace_path), "--preset", "vllm-hbm", "--slo", slo)
    assert r.code == 0, r.stderr
    header = _header(r.stdout)
    assert header.index("TBT p99 ms") == header.index("TPOT p99 ms") + 1
    alone = invoke(
        "replay", "--trace", str(trace_path), "--preset", "vllm-hbm", "--track-tbt", "--json"
    )
    tbt_ms = json.loads(alone.stdout)["tbt_p99_s"] * 1e3
    row = next(ln for ln in r.stdout.splitlines() if "vllm-hbm" in ln and "│" in ln)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    assert cells[header.index("TBT p99 ms")] == f"{tbt_ms:.1f}"
    # no SLO on TBT and no --track-tbt: the column is left out (nothing was tracked)
    plain = invoke("compare", "--trace", str(trace_path), "--preset", "vllm-hbm")
    assert "TBT p99 ms" not in _header(plain.stdout)


def test_track_tbt_records_tbt_in_the_table_and_json(trace_path) -> None:
    args = ("compare", "--trace", str(trace_path), "--preset", "vllm-hbm", "--track-tbt")
    assert "TBT p99 ms" in _header(invoke(*args).stdout)
    r = invoke(*args, "--json")
    assert r.code == 0, r.stderr
    (row,) = json.loads(r.stdout)["policies"]
    alone = invoke(
        "replay", "--trace", str(trace_path), "--preset", "vllm-hbm", "--track-tbt", "--json"
    )
    replayed = json.loads(alone.stdout)
    assert row["metrics"]["tbt_p99_s"] == replayed["tbt_p99_s"] is not None
    assert row["metrics"]["tbt_p50_s"] == replayed["tbt_p50_s"]


def test_a_step_time_margin_replays_each_row_slower_and_faster(trace_path, tmp_path) -> None:
    """Each row also at every step 0.9x and 1.1x as long: the slower replay is the replay on a
    profile calibrated to 1.1x (the measured tables' two factors), TTFT moves with it, and the
    report says whether the cheapest holds."""
    args = ("compare", "--trace", str(trace_path), "--preset", "vllm-hbm", "--preset",
            "lmcache-cpu-disk", "--hardware", "h100-node", "--model", "llama-3.1-8b",
            "--slo", "ttft_p99=5", "--step-time-margin", "0.1")  # fmt: skip
    r = invoke(*args, "--json")
    assert r.code == 0, r.stderr
    rows = json.loads(r.stdout)["policies"]
    for row in rows:
        margin = row["step_time_margin"]
        assert margin["margin"] == 0.1
        fast, base, slow = margin["faster"], row["metrics"], margin["slower"]
        assert fast["ttft_mean_s"] < base["ttft_mean_s"] < slow["ttft_mean_s"]
    from kvtier.hardware import load_hardware

    src = Path(str(load_hardware("h100-node").source)).read_text()
    factors = "[efficiency]\nmeasured_memory_scale = 1.1\nmeasured_compute_scale = 1.1"
    (tmp_path / "slow.toml").write_text(src.replace("[efficiency]", factors))
    alone = invoke("replay", "--trace", str(trace_path), "--preset", "vllm-hbm", "--hardware",
                   str(tmp_path / "slow.toml"), "--model", "llama-3.1-8b", "--json")  # fmt: skip
    assert alone.code == 0, alone.stderr
    replayed = json.loads(alone.stdout)
    slow = rows[0]["step_time_margin"]["slower"]
    assert "calibrated x1.1 memory-bound" in slow["step_time_source"]
    for key in ("ttft_mean_s", "ttft_p99_s", "tpot_p99_s", "cost_per_mtok", "n_served"):
        assert slow[key] == pytest.approx(replayed[key], rel=1e-12), key
    text = invoke(*args)
    assert text.code == 0, text.stderr
    assert "step time 0.9x / as modelled / 1.1x" in text.stdout
    assert "cheapest meeting the SLO" in text.stdout
    # without the option, no margin replays
    plain = json.loads(invoke("compare", "--trace", str(trace_path), "--preset", "vllm-hbm",
                              "--json").stdout)  # fmt: skip
    assert plain["policies"][0]["step_time_margin"] is None
    bad = invoke("compare", "--trace", str(trace_path), "--preset", "vllm-hbm",
                 "--step-time-margin", "0.7")  # fmt: skip
    assert_one_line_error(bad, "--step-time-margin", "between 0 and 0.5")


def test_the_report_says_when_the_cheapest_changes_within_the_margin() -> None:
    from types import SimpleNamespace

    from kvtier.experiments.compare import Compared
    from kvtier.report.compare import margin_lines

    def m(cost: float, met: bool) -> SimpleNamespace:
        return SimpleNamespace(cost_per_mtok=cost, n_served=10, slo_met=met, ttft_p99_s=1.0,
                               slo_attainment=1.0 if met else 0.5)  # fmt: skip

    rows = [
        Compared("a", "h", "m", 16, metrics=m(1.0, True), faster=m(0.9, True),
                 slower=m(1.1, False), step_margin=0.1),
        Compared("b", "h", "m", 16, metrics=m(1.2, True), faster=m(1.1, True),
                 slower=m(1.3, True), step_margin=0.1),
    ]  # fmt: skip
    lines = margin_lines(rows)
    assert lines[0].startswith("step time 0.9x / as modelled / 1.1x")
    assert "a: TTFT p99 1.000 / 1.000 / 1.000 s" in lines[1] and "SLO met / met / 50%" in lines[1]
    assert "cheapest per token: a at 0.9x, as modelled and at 1.1x" in lines
    changed = next(ln for ln in lines if "meeting the SLO changes" in ln)
    assert "a at 0.9x, a as modelled, b at 1.1x" in changed
    assert margin_lines([Compared("a", "h", "m", 16, metrics=m(1.0, True))]) == []
