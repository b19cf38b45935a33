"""``kvtier validate serving``: the catalogue of published figures, calibration kept apart from
the checks, the MAPE per backend and the exit code of a missed target."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.errors import InputError
from kvtier.experiments import serving_validation as sv
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
    """The front-end cost was derived from the calibration figure, so the measured backend
    reproduces it; the checks' MAPE (calibration excluded) meets the declared 10 %."""
    (cal,) = [r for r in result.rows if r.figure.role == "calibration"]
    assert cal.ratio("measured") == pytest.approx(1.0, abs=2e-3)
    assert result.frontend_s["trtllm"] == FRONTEND_S["trtllm"] > 0
    checks = result.checks()
    assert cal not in checks and len(checks) == len(result.rows) - 1
    m = result.mape("measured")
    assert m is not None and m <= sv.TARGETS["measured"]
    assert result.mape("roofline") is not None
    assert result.missed() == []
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


def test_cli_json_markdown_and_missed_target(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    md = tmp_path / "serving.md"
    ok = CliRunner().invoke(main, ["validate", "serving", "--json", "--markdown", str(md)])
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.output)
    assert data["missed"] == [] and data["mape"]["measured"] <= 0.10
    text = md.read_text()
    assert "| figure |" in text and "MAPE measured" in text and "calibration" in text
    monkeypatch.setitem(sv.TARGETS, "measured", 0.001)
    miss = CliRunner().invoke(main, ["validate", "serving"])
    assert miss.exit_code == 1
    assert "target missed: measured MAPE" in miss.output


def test_bad_scenario_files_are_one_line_errors(tmp_path: Path) -> None:
    good = sorted(sv.SERVING_DIR.glob("*.toml"))[0].read_text()
    p = tmp_path / "x.toml"
    p.write_text(good.replace("[conditions]", "[conditions]\nbogus = 1"))
    with pytest.raises(InputError, match=r"conditions\.bogus"):
        sv.load_figure(p)
    p.write_text(good.replace('mode = "sequential"', 'mode = "burst"'))
    with pytest.raises(InputError, match="conditions.mode 'burst'"):
        sv.load_figure(p)
