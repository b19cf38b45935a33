"""``kvtier validate beluga``: KV geometry exact, JSON shape, and the direction of each
comparison the model reproduces (never the calibrated values themselves)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.experiments.validation import (
    METRICS,
    RUNS,
    SYSTEMS,
    geometry_checks,
    run_passes,
    with_hbm,
    with_interleave,
)
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.presets import load_preset
from kvtier.trace.synth import synthesize

# docs/sources.md, model configurations: layers / KV heads / head dim -> KiB per token at BF16.
KV_BYTES = {
    "Llama-3.1-8B": 128 * 1024,
    "Qwen3-8B": 144 * 1024,
    "Qwen3-32B": 256 * 1024,
    "Llama-3.1-70B": 320 * 1024,
    "Llama-3.1-405B": 504 * 1024,
    "DeepSeek-V3": 61 * (512 + 64) * 2,
}


@pytest.mark.parametrize("name", sorted(KV_BYTES))
def test_kv_bytes_per_token_exact(name: str) -> None:
    assert load_model(name).kv_bytes_per_token("bf16") == KV_BYTES[name]


def test_geometry_checks_all_exact() -> None:
    rows = geometry_checks()
    assert len(rows) == 8
    assert all(r.exact for r in rows), [r for r in rows if not r.exact]
    ctx = {r.check: r.model for r in rows if "GiB" in r.check}
    assert ctx["Llama-3.1-70B GiB of KV at 131,072 tokens"] == 40.0
    assert ctx["Llama-3.1-405B GiB of KV at 131,072 tokens"] == 63.0


INTERLEAVE = "Beluga full-hit QPS, interleaved / not interleaved"


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    md = tmp_path_factory.mktemp("validate") / "validation.md"
    out = CliRunner().invoke(main, ["validate", "beluga", "--json", "--markdown", str(md)])
    # the interleaving gain is not reproduced (the model loses more): it says so and exits 1
    assert out.exit_code == 1, out.output
    assert f"target missed: {INTERLEAVE}" in out.stderr
    assert "fills one device before the next" in out.stderr
    return json.loads(out.stdout), md.read_text()


def _cell(res: dict[str, Any], system: str, run: str, metric: str) -> dict[str, Any]:
    (c,) = [
        c for c in res["cells"] if (c["system"], c["run"], c["metric"]) == (system, run, metric)
    ]
    return c


def test_json_shape(result: tuple[dict[str, Any], str]) -> None:
    res, _ = result
    cells = res["cells"]
    assert len(cells) == len(SYSTEMS) * len(RUNS) * len(METRICS)
    for c in cells:
        assert set(c) == {"system", "run", "metric", "paper", "model"}
        assert c["system"] in ("mooncake", "beluga", "vllm")
        assert c["run"] in ("first", "full-hit")
        assert c["metric"] in ("ttft_mean_s", "ttft_p99_s", "tpot_mean_s", "tpot_p99_s", "qps")
        assert c["paper"] is None or isinstance(c["paper"], float)
        assert isinstance(c["model"], float) and c["model"] > 0
    # paper values as in the Beluga paper (docs/sources.md); cells it does not give are null
    assert _cell(res, "beluga", "full-hit", "qps")["paper"] == 11.32
    assert _cell(res, "mooncake", "first", "ttft_p99_s")["paper"] == 41.65
    assert _cell(res, "vllm", "full-hit", "ttft_mean_s")["paper"] == 18.23
    assert _cell(res, "vllm", "first", "qps")["paper"] is None
    # the trace's blocks fill a few of the 32 devices of a non-interleaved pool, not one
    assert 1 < res["devices_filled"] < 32


def test_every_request_served(result: tuple[dict[str, Any], str]) -> None:
    res, _ = result
    for d in res["details"].values():
        assert d["n_rejected"] == 0 and d["n_served"] == res["scenario"]["requests_per_pass"]


def test_full_hit_run_beats_first_run_with_a_pool(result: tuple[dict[str, Any], str]) -> None:
    res, _ = result
    for s in ("mooncake", "beluga"):
        first, full = (_cell(res, s, r, "ttft_mean_s")["model"] for r in RUNS)
        assert full < first
        first, full = (_cell(res, s, r, "qps")["model"] for r in RUNS)
        assert full > first


def test_pools_beat_vllm_alone_on_the_full_hit_run(result: tuple[dict[str, Any], str]) -> None:
    res, _ = result
    vllm_qps = _cell(res, "vllm", "full-hit", "qps")["model"]
    vllm_ttft = _cell(res, "vllm", "full-hit", "ttft_mean_s")["model"]
    for s in ("mooncake", "beluga"):
        assert _cell(res, s, "full-hit", "qps")["model"] > vllm_qps
        assert _cell(res, s, "full-hit", "ttft_mean_s")["model"] < vllm_ttft


def test_first_run_beluga_not_slower_than_mooncake(result: tuple[dict[str, Any], str]) -> None:
    res, _ = result
    beluga = _cell(res, "beluga", "first", "ttft_mean_s")["model"]
    mooncake = _cell(res, "mooncake", "first", "ttft_mean_s")["model"]
    assert beluga <= mooncake


def test_full_hit_tpot_mooncake_above_beluga(result: tuple[dict[str, Any], str]) -> None:
    """The direction of the paper's full-hit TPOT (1.10 s against 0.15 s); the mechanism,
    a batch waiting for loads, is tested in tests/test_sim_tiers_behaviour.py."""
    res, _ = result
    for metric in ("tpot_mean_s", "tpot_p99_s"):
        mooncake = _cell(res, "mooncake", "full-hit", metric)["model"]
        assert mooncake > _cell(res, "beluga", "full-hit", metric)["model"]


def test_small_blocks_ruin_mooncake_full_hit(result: tuple[dict[str, Any], str]) -> None:
    res, _ = result
    small, big = res["extra"][0], res["extra"][1]
    assert "16-token" in small["check"] and "256-token" in big["check"]
    assert small["model"] > big["model"]


def test_acceptance_flags_follow_values(result: tuple[dict[str, Any], str]) -> None:
    res, _ = result
    # five ratios between systems, and the model's mean TTFT within 2x of each paper cell
    assert len(res["acceptance"]) == 10
    for a in res["acceptance"]:
        target = a["target"]
        if target.startswith("["):
            lo, hi = (float(x) for x in target.strip("[]").split(","))
            assert a["met"] == (lo <= a["model"] <= hi)
        else:
            assert target.startswith(">=")
            assert a["met"] == (a["model"] >= float(target[2:]))
        if a["met"]:
            assert a["cause"] == ""


def test_interleaving_is_judged_against_the_papers_gain(
    result: tuple[dict[str, Any], str],
) -> None:
    """1.33 reproduced within half to one and a half times the gain; the model's devices
    queue, and its in-order placement loses more than the paper did (above 1.5)."""
    res, _ = result
    (a,) = [a for a in res["acceptance"] if a["ratio"] == INTERLEAVE]
    assert a["paper"] == pytest.approx(11.32 / 8.49)
    assert a["target"] == "[1.167, 1.5]"
    assert a["met"] == (1.167 <= a["model"] <= 1.5)
    assert not a["met"] and a["model"] > 1.5 and "one device before the next" in a["cause"]


def test_text_output_carries_the_tpot_caveat() -> None:
    from kvtier.experiments.validation import Cell, Validation
    from kvtier.report.validation import tpot_caveat

    cells = [
        Cell("mooncake", "first", "tpot_mean_s", 1.97, 0.1),
        Cell("beluga", "full-hit", "tpot_mean_s", 0.15, 0.03),
        Cell("vllm", "full-hit", "tpot_mean_s", None, 0.02),
        Cell("vllm", "full-hit", "qps", 0.96, 0.02),
    ]
    res = Validation(None, cells, {}, [], [], [])  # type: ignore[arg-type]
    text = tpot_caveat(res)
    assert text.startswith("Caveat: the paper's TPOTs are 5.0-20x the model's.")
    assert "TPOT not reproduced" in text


def test_every_reproduction_target_but_interleaving_is_met(
    result: tuple[dict[str, Any], str],
) -> None:
    """One calibration for all cells meets every target but the interleaving gain, which the
    model does not reproduce (docs/validation.md)."""
    res, _ = result
    missed = [a["ratio"] for a in res["acceptance"] if not a["met"]]
    assert missed == [INTERLEAVE]


def test_a_missed_target_exits_non_zero_and_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    import kvtier.experiments.validation as validation

    real = validation.run_beluga()

    def missing() -> validation.Validation:
        acc = [replace(a, met=False) if i == 0 else a for i, a in enumerate(real.acceptance)]
        return replace(real, acceptance=acc)

    monkeypatch.setattr(validation, "run_beluga", missing)
    out = CliRunner().invoke(main, ["validate", "beluga"])
    assert out.exit_code == 1
    assert f"target missed: {real.acceptance[0].ratio}" in out.output


def test_markdown_has_every_cell(result: tuple[dict[str, Any], str]) -> None:
    res, md = result
    assert md.startswith("# Validation")
    assert "| mean TTFT (s) | 19.7 / " in md
    for a in res["acceptance"]:
        assert a["ratio"] in md


def test_interleaving_shortens_a_lone_full_hit_load() -> None:
    """At light load a non-interleaved pool serves a transfer at one device's bandwidth."""
    trace = synthesize("rag", long=True, passes=2, requests=2, rate=1.0, seed=3, length_sigma=0.3)
    hw = load_hardware("beluga-testbed")
    model = load_model("Qwen3-32B")
    beluga = with_hbm(load_preset("beluga-cxl"), 28.3)
    on = run_passes(trace, hw, model, with_interleave(beluga, True))["full-hit"]
    off = run_passes(trace, hw, model, with_interleave(beluga, False))["full-hit"]
    assert on.ttft_mean_s < off.ttft_mean_s


def test_docs_validation_md_is_generated() -> None:
    doc = Path(__file__).resolve().parents[1] / "docs" / "validation.md"
    text = doc.read_text()
    assert "kvtier validate beluga --markdown docs/validation.md" in text
