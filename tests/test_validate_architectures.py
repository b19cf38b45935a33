"""``kvtier validate architectures``: scenario files declare their role before any replay, a
ratio is the two deployments' replays, a missed target exits 1 naming its cause."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.errors import InputError
from kvtier.experiments import arch_validation
from kvtier.experiments.arch_validation import ARCH_DIR, load_scenario, run_check

SMALL = """
[figure]
role = "check"
metric = "{metric}"
published = {published}
tolerance = 1.25
source = "[test]"
gap = "a stated cause"

[workload]
input_tokens = 512
output_tokens = 8
requests = 16
concurrency = 4

[baseline]
hardware = "h100-node"
model = "Llama-3.1-8B"
serving = {{ instances = 1, step_time = "roofline" }}

[system]
hardware = "h200-node"
model = "Llama-3.1-8B"
serving = {{ instances = 1, step_time = "roofline" }}
"""


def _write(tmp_path: Path, metric: str = "throughput", published: float = 1.0) -> Path:
    path = tmp_path / "case.toml"
    path.write_text(SMALL.format(metric=metric, published=published))
    return path


def test_every_builtin_scenario_is_a_declared_check() -> None:
    paths = sorted(ARCH_DIR.glob("*.toml"))
    assert [p.stem for p in paths] == [
        "gh200-multiturn-ttft",
        "photonic-405b-latency",
        "photonic-405b-throughput",
    ]
    for path in paths:
        data = load_scenario(path)
        assert data["figure"]["role"] == "check" and data["figure"]["gap"]


def test_a_role_other_than_check_or_an_unknown_key_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path)
    path.write_text(path.read_text().replace('role = "check"', 'role = "calibration"'))
    with pytest.raises(InputError, match="figure.role"):
        load_scenario(path)
    path = _write(tmp_path)
    path.write_text(path.read_text().replace("[workload]", "[workload]\nbogus = 1"))
    with pytest.raises(InputError, match="workload.bogus"):
        load_scenario(path)


def test_the_ratio_is_the_two_replays(tmp_path: Path) -> None:
    check = run_check(_write(tmp_path, "ttft"))
    # H200's faster HBM and the same compute: a TTFT ratio a little above 1
    assert check.model == pytest.approx(check.baseline_value / check.system_value)
    assert check.model >= 1.0
    thr = run_check(_write(tmp_path, "throughput"))
    assert thr.model == pytest.approx(thr.system_value / thr.baseline_value)


def test_a_missed_target_exits_1_naming_its_cause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _write(tmp_path, "throughput", published=50.0)
    monkeypatch.setattr(arch_validation, "ARCH_DIR", tmp_path)
    res = CliRunner().invoke(main, ["validate", "architectures", "--json"])
    assert res.exit_code == 1
    out = json.loads(res.stdout)
    assert out["missed"] == ["case"] and not out["checks"][0]["met"]
    assert "target missed: case" in res.stderr and "a stated cause" in res.stderr
