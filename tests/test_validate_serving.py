"""``kvtier validate serving``: the catalogue of published figures, calibration kept apart from
the checks, the MAPE per backend and the exit code of a missed target."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.errors import InputError
from kvtier.experiments import serving_validation as sv
from kvtier.policy.model import Policy
from kvtier.sim.steptime import frontend
from kvtier.sim.steptime.frontend import FRONTEND_S


@pytest.fixture(scope="module")
def result() -> sv.ServingValidation:
    return sv.run_serving()


def test_catalogue_states_every_figure() -> None:
    figs = sv.load_catalogue()
    assert len(figs) >= 8
    assert {f.role for f in figs} == {"check", "calibration"}
    assert {f.metric for f in figs} == set(sv.METRICS)
    for f in figs:
        assert f.url.startswith("https://") and f.source and f.read
        assert str(f.published).rstrip("0").rstrip(".") in f.read.replace(",", "")
        c = f.conditions
        assert c["framework"] and c["framework_version"] and c["tp"] >= 1


def test_calibration_reproduces_and_checks_meet_the_target(result: sv.ServingValidation) -> None:
    """The front-end cost was derived from the calibration figure: the published TTFT less the
    engine's modelled time and the prompt's tokenization, floored at 0. The constant the module
    holds is the model's current time for that row, so the measured backend reproduces the
    figure where the cost is positive and overshoots it by the engine's excess where it is 0
    (today, at the power limit: docs/model.md). The checks' MAPE (calibration excluded) is
    flagged exactly when it misses the declared 10 %."""
    (cal,) = [r for r in result.rows if r.figure.role == "calibration"]
    fe = result.frontend_s["trtllm"]
    assert fe == FRONTEND_S["trtllm"] >= 0
    tokens = frontend.CALIBRATION_PROMPT_TOKENS * frontend.TOKENIZE_S_PER_TOKEN
    engine_ms = cal.model["measured"] - (fe + tokens) * 1e3
    assert engine_ms == pytest.approx(frontend.CALIBRATION_MODELLED_S * 1e3, abs=0.01)
    left = cal.figure.published * 1e-3 - frontend.CALIBRATION_MODELLED_S - tokens
    assert fe == pytest.approx(max(0.0, left), abs=1e-12)
    if fe > 0:
        assert cal.ratio("measured") == pytest.approx(1.0, abs=2e-3)
    else:
        assert cal.ratio("measured") > 1.0
    checks = result.checks()
    assert cal not in checks and len(checks) == len(result.rows) - 1
    m = result.mape("measured")
    assert m is not None and result.mape("roofline") is not None
    # the target is over every check; a miss is flagged exactly when the MAPE exceeds it
    assert [x.backend for x in result.missed()] == (
        ["measured"] if m > sv.TARGETS["measured"] else []
    )
    # single requests and offline throughput, and the inter-token latency under load, within
    # 10 % (docs/validation-serving.md); TTFT under load is where the residuals are
    assert result.mape("measured", sv.GROUPS[0]) <= 0.10
    assert result.mape("measured", sv.GROUPS[1]) <= 0.10
    sizes = result.group_sizes()
    assert sum(sizes.values()) == len(checks) and sizes[sv.GROUPS[2]] >= 10
    for r in result.rows:
        assert r.provenance["measured"].startswith("measured (aiconfigurator-core")
        assert r.provenance["roofline"].startswith("roofline")


def test_mape_ignores_calibration_and_a_miss_is_named(result: sv.ServingValidation) -> None:
    (cal,) = [r for r in result.rows if r.figure.role == "calibration"]
    off = replace(cal, model={"measured": 100 * cal.figure.published, "roofline": None})
    other = sv.ServingValidation([off, *result.checks()], result.frontend_s)
    assert other.mape("measured") == result.mape("measured")
    (check,) = result.checks()[:1]
    bad = replace(check, model={"measured": 2 * check.figure.published, "roofline": None})
    missed = sv.ServingValidation([bad], {}).missed()
    assert [(m.backend, m.mape) for m in missed] == [("measured", pytest.approx(1.0))]


def test_the_summary_says_which_way_the_errors_lean(result: sv.ServingValidation) -> None:
    """Checks below and above the published figure are counted per backend and group, in text
    and JSON; a calibration row and a backend that could not run count in neither."""
    from kvtier.report.serving_validation import serving_json, to_text

    low, high, even = result.checks()[:3]
    rows = [
        replace(low, model={"measured": 0.5 * low.figure.published, "roofline": None}),
        replace(high, model={"measured": 2.0 * high.figure.published, "roofline": None}),
        replace(even, model={"measured": even.figure.published, "roofline": None}),
        *[r for r in result.rows if r.figure.role == "calibration"],
    ]
    small = sv.ServingValidation(rows, result.frontend_s, result.frontend_token_s)
    assert small.lean("measured") == (1, 1) and small.lean("roofline") == (0, 0)
    assert "over 3 checks (target <= 10 %); 1 below the published figure, 1 above" in to_text(small)
    assert serving_json(small)["lean"]["measured"] == {"below": 1, "above": 1}


def test_cli_json_markdown_and_missed_target(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    md = tmp_path / "serving.md"
    ok = CliRunner().invoke(main, ["validate", "serving", "--json", "--markdown", str(md)])
    data = json.loads(ok.stdout)
    missed = data["mape"]["measured"] > 0.10
    assert ok.exit_code == (1 if missed else 0), ok.output
    assert ("target missed: measured MAPE" in ok.stderr) == missed
    assert set(data["mape_by_group"]["measured"]) == set(sv.GROUPS)
    text = md.read_text()
    assert "| figure |" in text and "MAPE measured" in text and "calibration" in text
    assert "closed c=25" in text and "residual: TTFT under load" in text
    monkeypatch.setitem(sv.TARGETS, "measured", 0.001)
    miss = CliRunner().invoke(main, ["validate", "serving"])
    assert miss.exit_code == 1
    assert "target missed: measured MAPE" in miss.output


def test_bad_scenario_files_are_one_line_errors(tmp_path: Path) -> None:
    texts = [p.read_text() for p in sorted(sv.SERVING_DIR.glob("*.toml"))]
    good = next(t for t in texts if 'mode = "sequential"' in t)
    p = tmp_path / "x.toml"
    p.write_text(good.replace("[conditions]", "[conditions]\nbogus = 1"))
    with pytest.raises(InputError, match=r"conditions\.bogus"):
        sv.load_figure(p)
    p.write_text(good.replace('mode = "sequential"', 'mode = "burst"'))
    with pytest.raises(InputError, match="conditions.mode 'burst'"):
        sv.load_figure(p)


def test_checks_under_load_up_to_and_past_saturation() -> None:
    """At least 10 checks at concurrency above 1, on both sides of the knee."""
    closed = [f for f in sv.load_catalogue() if f.conditions["mode"] == "closed"]
    assert len([f for f in closed if f.role == "check"]) >= 10
    for f in closed:
        assert f.conditions["concurrency"] >= 2
        assert f"concurrency {f.conditions['concurrency']}:" in f.read
    # NIM's 5000/500 sweep saturates near 100 clients (ITL flat at 93 ms from there)
    levels = {f.conditions["concurrency"] for f in closed if f.conditions["input_tokens"] == 5000}
    assert min(levels) <= 25 and max(levels) >= 200


def test_steady_window_leaves_out_the_ramp_and_the_drain() -> None:
    sent = np.array([0.0, 0.1, 0.2, 1.0, 1.5, 2.0, 3.0, 3.5])
    np.testing.assert_array_equal(
        sv.steady_window(sent, 2), [False, False, True, True, True, True, False, False]
    )
    assert sv.steady_window(sent, 0).all()  # open loop: every request


def test_bad_closed_scenarios_are_one_line_errors(tmp_path: Path) -> None:
    closed = sorted(sv.SERVING_DIR.glob("*-c025-ttft.toml"))[0].read_text()
    p = tmp_path / "x.toml"
    for old, new, match in (
        ("concurrency = 25", "concurrency = 1", "concurrency >= 2"),
        ("concurrency = 25\n", "", "concurrency >= 2"),
        ("requests = 100", "requests = 50", "requests must be >= 3 x concurrency"),
        ('metric = "ttft_ms"', 'metric = "output_tps_per_gpu"', "ttft_ms or itl_ms"),
        ('mode = "closed"', 'mode = "sequential"', "applies to mode 'closed' only"),
    ):
        assert old in closed
        p.write_text(closed.replace(old, new))
        with pytest.raises(InputError, match=match):
            sv.load_figure(p)


def test_a_scenario_can_state_the_engines_capacity_policy(tmp_path: Path) -> None:
    """``conditions.scheduler`` reaches the policy (TensorRT-LLM's GUARANTEED_NO_EVICT is
    ``reserve``); left out, the policy's default stays; a wrong name is a one-line error."""
    text = sorted(sv.SERVING_DIR.glob("*-c025-ttft.toml"))[0].read_text()
    p = tmp_path / "x.toml"
    p.write_text(text.replace("[conditions]", '[conditions]\nscheduler = "reserve"'))
    fig = sv.load_figure(p)
    assert sv._policy(fig, "measured").serving.scheduler == "reserve"
    default = sv._policy(sv.load_figure(sorted(sv.SERVING_DIR.glob("*.toml"))[0]), "measured")
    assert default.serving.scheduler == Policy().serving.scheduler
    p.write_text(text.replace("[conditions]", '[conditions]\nscheduler = "bogus"'))
    with pytest.raises(InputError, match="scheduler"):
        sv._policy(sv.load_figure(p), "measured")


def test_a_client_sending_token_ids_pays_no_per_token_front_end(
    result: sv.ServingValidation, tmp_path: Path
) -> None:
    """``conditions.token_ids_io`` (the vLLM blog's runs: "De/Tokenization disabled") reaches the
    policy, so those replays carry no per-prompt-token cost while the NIM ones do; a value that
    is not a boolean is a one-line error naming the key."""
    blog = [r for r in result.rows if r.figure.name.startswith("vllm-blog-")]
    assert len(blog) == 10 and all(r.figure.conditions["token_ids_io"] for r in blog)
    assert sv._policy(blog[0].figure, "measured").serving.token_ids_io
    assert sv.model_value(blog[0].figure, "measured")[3] == 0.0
    # the report's per-token line names the cost a framework's tokenizing clients pay: the
    # token-id runs do not overwrite it with their 0
    assert "vllm" not in result.frontend_token_s and result.frontend_token_s["trtllm"] > 0
    nim = sv.load_figure(sorted(sv.SERVING_DIR.glob("nim-*-ttft.toml"))[0])
    assert not sv._policy(nim, "measured").serving.token_ids_io
    text = Path(blog[0].figure.path).read_text()
    p = tmp_path / "x.toml"
    p.write_text(text.replace("token_ids_io = true", 'token_ids_io = "yes"'))
    with pytest.raises(InputError, match="conditions.token_ids_io must be true or false"):
        sv.load_figure(p)
