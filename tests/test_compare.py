"""``kvtier compare``: each row is exactly what ``kvtier replay`` gives for that policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.policy.presets import preset_names
from kvtier.trace.io import write_trace
from kvtier.trace.synth import synthesize
from tests.helpers import assert_one_line_error, invoke


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("compare") / "rag.parquet"
    write_trace(synthesize("rag", requests=120, rate=4.0, seed=7), path)
    return path


def test_every_preset_by_default_each_equal_to_its_replay(trace_path) -> None:
    r = invoke("compare", "--trace", str(trace_path), "--json")
    assert r.code == 0, r.stderr
    rows = json.loads(r.stdout)["policies"]
    assert [row["policy"] for row in rows] == preset_names()
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
