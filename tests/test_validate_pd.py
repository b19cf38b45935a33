"""kvtier validate pd: published P/D results beside the model's; a miss exits non-zero."""

from __future__ import annotations

from click.testing import CliRunner

from kvtier.cli import main
from kvtier.experiments import pd_validation as pv


def test_distserve_example_on_its_stand_in() -> None:
    c = pv.run_check("distserve-2p1d")
    assert c.published == 2.1 and c.source == "[DistServe]"
    # the disaggregated 2P + 1D serves more per GPU than one colocated GPU under the SLO
    assert c.disaggregated_rps_per_gpu > c.aggregated_rps_per_gpu > 0
    assert c.model == c.disaggregated_rps_per_gpu / c.aggregated_rps_per_gpu
    assert c.residual == c.model / c.published
    assert c.met == (1 / 1.5 <= c.residual <= 1.5)
    assert c.split == "1 aggregated against 2P + 1D"


def test_a_missed_target_exits_non_zero(monkeypatch) -> None:
    def check(model: float) -> pv.PdCheck:
        return pv.PdCheck("x", "[DistServe]", "r", 2.0, 1.5, model, 1.0, model, 0.1, 0.01, "s")

    for model, code in ((2.5, 0), (1.0, 1)):
        monkeypatch.setattr(pv, "run_pd", lambda m=model: pv.PdValidation((check(m),)))
        res = CliRunner().invoke(main, ["validate", "pd"])
        assert res.exit_code == code, res.output
        assert ("target missed: x" in res.output) == (code == 1)
