"""``kvtier validate silicon``: aiconfigurator-core's measured serving runs as checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.errors import InputError
from kvtier.experiments import silicon_validation as si
from tests.helpers import assert_one_line_error, invoke


def test_the_manifest_selects_rows_of_profiled_models_and_gpus_as_checks() -> None:
    manifest = si.load_manifest()
    assert manifest.role == "check"
    runs = si.load_runs(manifest)
    assert len(runs) >= 900
    from kvtier.hardware import load_hardware, load_model

    for model in {r.figure.conditions["model"] for r in runs}:
        load_model(model)
    for hw in {r.figure.conditions["hardware"] for r in runs}:
        load_hardware(hw)
    frameworks = {r.figure.conditions["framework"] for r in runs}
    assert frameworks == {"vllm", "sglang", "trtllm"}
    for r in runs:
        c = r.figure.conditions
        assert r.ttft_ms > 0 and r.tpot_ms > 0
        assert c["weight_dtype"] in ("bf16", "fp8")
        if c["mode"] == "closed":
            assert c["requests"] >= 3 * c["concurrency"]
        assert f"concurrency {c.get('concurrency', 1)}:" in r.figure.read


def test_a_bad_manifest_or_row_is_a_one_line_error(tmp_path: Path) -> None:
    text = si.MANIFEST.read_text()
    p = tmp_path / "m.toml"
    p.write_text(text.replace('role = "check"', 'role = "bogus"'))
    with pytest.raises(InputError, match="role 'bogus'"):
        si.load_manifest(p)
    p.write_text("bogus = 1\n" + text)
    with pytest.raises(InputError, match="unknown key bogus"):
        si.load_manifest(p)
    p.write_text(text + "bogus = 1\n")  # inside the last table, [kv_dtype]
    with pytest.raises(InputError, match=r"unknown key kv_dtype\.bogus"):
        si.load_manifest(p)
    p.write_text(text.replace("requests_per_client = 3", "requests_per_client = 2"))
    with pytest.raises(InputError, match="requests_per_client must be >= 3"):
        si.load_manifest(p)
    # a sample whose row states a non-positive TTFT names the file, the row and the field
    manifest = si.load_manifest()
    head = (
        "id,silicon_data_source,backend,backend_version,model_path,system,precision,mode,isl,"
        "osl,batch_size,tp_size,pp_size,attention_dp_size,silicon_ttft_ms,silicon_tpot_ms\n"
    )
    row = "r1,x,vllm,0.12.0,Qwen/Qwen3-32B,h100_sxm,,agg,1024,128,8,2,1,,-1.0,10.0\n"
    csv = tmp_path / "s.csv"
    csv.write_text(head + row)
    with pytest.raises(InputError, match=r"s\.csv: line 2 \(id r1\): silicon_ttft_ms"):
        si.load_runs(manifest, csv)
    csv.write_text(head.replace("silicon_tpot_ms", "tpot") + row)
    with pytest.raises(InputError, match="no column silicon_tpot_ms"):
        si.load_runs(manifest, csv)


def test_a_run_is_replayed_once_for_both_figures() -> None:
    """A small vLLM run: the model's TTFT and TPOT are finite and positive, the ratio is the
    model over the measured figure, and the MAPE is their mean error."""
    runs = [
        r
        for r in si.load_runs()
        if r.figure.conditions["framework"] == "vllm"
        and r.figure.conditions.get("concurrency") == 8
        and r.figure.conditions["output_tokens"] == 128
    ][:2]
    assert runs
    result = si.run_silicon(runs)
    assert len(result.replayed()) == len(runs)
    for r in result.replayed():
        for m in si.METRICS:
            assert r.model[m] > 0
            assert r.ratio(m) == pytest.approx(r.model[m] / r.run.published(m))
    errs = [abs(r.ratio(m) - 1) for r in result.replayed() for m in si.METRICS]
    assert result.mape() == pytest.approx(sum(errs) / len(errs))
    assert bool(result.missed()) == (result.mape() > si.TARGET)


def test_cli_filters_and_reports(tmp_path: Path) -> None:
    md = tmp_path / "s.md"
    res = invoke(
        "validate",
        "silicon",
        "--framework",
        "vllm",
        "--model",
        "qwen3-32b",
        "--max-runs",
        "2",
        "--json",
        "--markdown",
        str(md),
    )
    data = json.loads(res.stdout)
    assert len(data["runs"]) == 2 and data["target"] == si.TARGET
    assert all(r["conditions"]["framework"] == "vllm" for r in data["runs"])
    assert res.code == (1 if data["mape"] > si.TARGET else 0)
    assert "| framework |" in md.read_text()
    bad = invoke("validate", "silicon", "--model", "gpt-2")
    assert_one_line_error(bad, "--model", "gpt-2", "qwen3-32b")


@pytest.mark.slow
def test_every_selected_run_replays() -> None:
    """The whole catalogue: no run is skipped for want of step-time tables, every figure is
    finite and positive (about 20 s warm)."""
    result = si.run_silicon()
    assert not [r for r in result.results if r.skipped is not None]
    for r in result.replayed():
        for m in si.METRICS:
            assert 0 < r.model[m] < float("inf")
    assert result.mape() is not None
