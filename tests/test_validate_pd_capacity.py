"""kvtier validate pd, capacity scenarios: Mooncake's effective request capacity (FAST'25 5.2)."""

from __future__ import annotations

import copy
import math

import pytest
from click.testing import CliRunner

from kvtier.cli import main
from kvtier.errors import InputError
from kvtier.experiments import pd_capacity as pc
from kvtier.experiments import pd_validation as pv
from kvtier.report.pd_validation import pd_json, to_markdown, to_text

CAPACITY = [n for n in pv.scenario_names() if pv.is_capacity(n)]


def test_the_capacity_scenarios_are_bundled() -> None:
    assert "mooncake-conversation-capacity" in CAPACITY
    # the goodput scenarios keep their kind
    assert {"distserve-2p1d", "mooncake-kimi"} <= set(pv.scenario_names()) - set(CAPACITY)


def _scenario() -> dict:
    return pv.load_pd_scenario("mooncake-conversation-capacity")


def test_a_capacity_scenario_is_checked_key_by_key() -> None:
    good = _scenario()
    pc.check_scenario("x", good)

    def bad(edit, match: str) -> None:
        data = copy.deepcopy(good)
        edit(data)
        with pytest.raises(InputError, match=match):
            pc.check_scenario("x", data)

    bad(lambda d: d["figure"].pop("against"), r"\[figure\] lacks against")
    bad(lambda d: d["figure"].update(against="sglang"), "against = 'sglang'; choose from vllm")
    bad(lambda d: d["figure"].update(published=[1.0]), "lists of one length")
    bad(lambda d: d["conditions"].pop("ttft_s"), r"\[conditions\] lacks ttft_s")
    bad(lambda d: d["conditions"]["systems"].pop("mooncake"), "must name 'mooncake'")
    bad(
        lambda d: d["conditions"]["systems"]["vllm"].update(chunked=True),
        "system 'vllm': unknown key 'chunked'; choose from preset, set",
    )
    bad(lambda d: d["figure"]["capacity"].update(sglang=[1, 1, 1]), "names 'sglang'")


def test_the_systems_are_the_papers_baselines_and_mooncake() -> None:
    from kvtier.hardware import load_hardware, load_model
    from kvtier.sim import build_config

    data = _scenario()
    cond = data["conditions"]
    hw, md = load_hardware(cond["hardware"]), load_model(cond["model"])
    assert (hw.topology.hosts, hw.topology.gpus_per_host, hw.topology.tp) == (16, 8, 8)
    pols = {s: pc.system_policy("x", s, spec) for s, spec in cond["systems"].items()}
    # vLLM v0.5.1: v0 scheduling without chunked prefill, prefix caching only where named
    assert pols["vllm"].serving.scheduler == "vllm_v0"
    assert not pols["vllm"].serving.prefix_caching
    assert pols["vllm-prefix-caching"].serving.prefix_caching
    assert pols["vllm-chunked-prefill"].serving.max_num_batched_tokens == 512
    assert not pols["vllm-chunked-prefill"].serving.prefix_caching
    cfgs = {s: build_config(hw, md, p) for s, p in pols.items()}
    assert all(c.n_instances == 16 for c in cfgs.values())
    # Mooncake: 8 prefill + 8 decode nodes, the store behind RDMA, its 256-token blocks
    assert cfgs["mooncake"].n_prefill == 8 and cfgs["vllm"].n_prefill == 0
    assert pols["mooncake"].block_tokens == 256
    assert [t.name for t in pols["mooncake"].lower_tiers] == ["rdma"]
    with pytest.raises(InputError, match="systems.vllm.set"):
        pc.system_policy("x", "vllm", {"set": {"serving.no_such_key": 1}})


def _check(model_ratio: float, threshold: float = 100.0) -> pc.CapacityCheck:
    return pc.CapacityCheck(
        name=f"c @ {threshold:g} ms",
        source="[Mooncake-FAST25]",
        read="r",
        threshold_ms=threshold,
        ttft_slo_s=30.0,
        against="vllm",
        published=2.0,
        tolerance=1.5,
        model=model_ratio,
        capacity={"mooncake": 0.9, "vllm": 0.9 / model_ratio},
        published_capacity={"mooncake": 0.97, "vllm": math.nan},
        best_baseline="vllm",
        stand_in="s",
    )


def test_a_missed_capacity_check_exits_non_zero(monkeypatch) -> None:
    for ratio, code in ((2.5, 0), (1.0, 1)):
        result = pv.PdValidation((), (_check(ratio),))
        monkeypatch.setattr(pv, "run_pd", lambda r=result: r)
        res = CliRunner().invoke(main, ["validate", "pd"])
        assert res.exit_code == code, res.output
        assert ("target missed: c @ 100 ms" in res.output) == (code == 1)


def test_the_capacity_table_shows_model_beside_figure() -> None:
    result = pv.PdValidation((), (_check(2.5), _check(1.0, 200.0)))
    text, md, js = to_text(result), to_markdown(result), pd_json(result)
    assert "2.00x over vllm" in text and "MISSED" in text
    assert "mooncake 90.0 % (97 %); vllm 36.0 % (not read)" in md
    assert "30 s / 200 ms" in md
    assert "1 of 2 published P/D results reproduced within tolerance" in text
    assert js["missed"] == ["c @ 200 ms"]
    assert js["capacity"][0]["published_capacity"] == {"mooncake": 0.97, "vllm": None}


@pytest.mark.slow
def test_mooncake_conversation_capacity_runs_every_threshold() -> None:
    checks = pc.run_capacity("mooncake-conversation-capacity", _scenario())
    assert [c.threshold_ms for c in checks] == [100.0, 200.0, 300.0]
    for c in checks:
        assert set(c.capacity) == {
            "mooncake",
            "vllm",
            "vllm-prefix-caching",
            "vllm-chunked-prefill",
        }
        assert all(0.0 <= v <= 1.0 for v in c.capacity.values())
        assert c.model == c.capacity["mooncake"] / c.capacity["vllm"]
    # a looser TBT bound never makes fewer requests effective
    for s in checks[0].capacity:
        shares = [c.capacity[s] for c in checks]
        assert shares == sorted(shares)
