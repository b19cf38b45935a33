"""kvtier validate pd: published P/D results beside the model's; a miss exits non-zero."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.errors import InputError
from kvtier.experiments import pd_validation as pv
from kvtier.trace.blocked import BlockedTrace


@pytest.mark.slow
def test_distserve_example_on_the_papers_model_and_gpu() -> None:
    c = pv.run_check("distserve-2p1d")
    assert c.published == 2.1 and c.source == "[DistServe]"
    # OPT-13B on an A100 under the paper's own SLO, not a stand-in's scaled one
    assert c.stand_in == "OPT-13B on a100-node"
    assert (c.ttft_slo_s, c.tpot_slo_s) == (0.4, 0.04)
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


def test_the_papers_baselines_run_vllm_v0() -> None:
    for name in [n for n in pv.scenario_names() if not pv.is_capacity(n)]:
        agg = pv.load_pd_scenario(name)["conditions"]["aggregated"]
        assert pv._serving_settings(name, agg)["scheduler"] == "vllm_v0"


def test_a_deployment_names_only_known_serving_settings() -> None:
    ok = pv._serving_settings("x", {"instances": 1, "scheduler": "vllm_v0", "max_num_seqs": 4})
    assert ok == {"scheduler": "vllm_v0", "max_num_seqs": 4}
    with pytest.raises(InputError, match="unknown deployment key 'chunked'"):
        pv._serving_settings("x", {"instances": 1, "chunked": True})
    with pytest.raises(InputError, match="scheduler 'v0'; choose from reserve, vllm_v1, vllm_v0"):
        pv._serving_settings("x", {"instances": 1, "scheduler": "v0"})
    with pytest.raises(InputError, match="max_num_batched_tokens must be a positive integer"):
        pv._serving_settings("x", {"instances": 1, "max_num_batched_tokens": 0})
    got = pv._serving_settings("x", {"instances": 1, "cpu_overhead_s": 0.043})
    assert got == {"cpu_overhead_s": 0.043}
    for bad in (-0.1, "1", True, float("nan")):
        with pytest.raises(InputError, match="cpu_overhead_s must be a number in"):
            pv._serving_settings("x", {"instances": 1, "cpu_overhead_s": bad})


def test_attainment_both_bounds_or_each_bound(monkeypatch) -> None:
    # four requests of 3 output tokens (2 intervals): TTFT 0.1, 0.5, 0.1, 0.1 s and TPOT
    # 0.01, 0.01, 0.05, 0.01 s against bounds 0.4 s / 0.04 s. Both bounds: 2 of 4 requests;
    # each bound: 3 of 4 meet TTFT, 3 of 4 meet TPOT, so 0.75
    trace = BlockedTrace.from_lists([0.0] * 4, [8] * 4, [3] * 4, [[]] * 4, 4)
    first = np.array([0.1, 0.5, 0.1, 0.1])
    raw = SimpleNamespace(
        first_token_s=first, finish_s=first + 2 * np.array([0.01, 0.01, 0.05, 0.01])
    )
    monkeypatch.setattr("kvtier.sim.simulate_raw", lambda *a, **k: raw)
    assert pv._attainment(trace, None, 0.4, 0.04) == 0.5
    assert pv._attainment(trace, None, 0.4, 0.04, per_metric=True) == 0.75
    # a request never served (NaN) meets neither bound
    raw.first_token_s = np.array([np.nan, 0.1, 0.1, 0.1])
    raw.finish_s = raw.first_token_s + 0.02
    assert pv._attainment(trace, None, 0.4, 0.04, per_metric=True) == 0.75


def test_a_miss_prints_its_named_cause(monkeypatch) -> None:
    """A scenario's [figure] residual_cause is printed with its miss and in the text output,
    never with a met check; every bundled scenario that misses names one."""
    base = ("x", "[Mooncake-FAST25]", "r", 2.0, 1.5)
    missed = pv.PdCheck(*base, 1.0, 1.0, 1.0, 0.1, 0.01, "s", cause="eager decode")
    met = pv.PdCheck(*base, 2.5, 1.0, 2.5, 0.1, 0.01, "s", cause="not printed")
    monkeypatch.setattr(pv, "run_pd", lambda: pv.PdValidation((missed, met)))
    res = CliRunner().invoke(main, ["validate", "pd"])
    assert res.exit_code == 1
    assert "target missed: x: model 1x, published 2x (tolerance 1.5x); cause: eager decode" in (
        res.output
    )
    assert "residual, x: eager decode" in res.output and "not printed" not in res.output
    for name in ("mooncake-conversation-capacity", "mooncake-kimi"):
        cause = pv.load_pd_scenario(name)["figure"]["residual_cause"]
        assert isinstance(cause, str) and len(cause) > 40


def test_a_residual_cause_must_be_text(tmp_path, monkeypatch) -> None:
    src = (pv.PD_DIR / "mooncake-kimi.toml").read_text()
    (tmp_path / "k.toml").write_text(src.replace('residual_cause = "', "residual_cause = 3 #"))
    monkeypatch.setattr(pv, "PD_DIR", tmp_path)
    with pytest.raises(InputError, match="residual_cause must be a string"):
        pv.load_pd_scenario("k")
