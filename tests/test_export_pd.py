"""Exports of a disaggregated policy: each instance's P/D role in the launch lines, notes."""

from __future__ import annotations

import re
from dataclasses import replace

from kvtier.export import export
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.presets import load_preset


def exported(preset: str, target: str):  # noqa: ANN201
    p = load_preset(preset)
    return export(p, target, load_hardware(p.hardware), load_model(p.model))


def script(result) -> str:  # noqa: ANN001
    return next(v for k, v in result.files.items() if k.endswith(".sh"))


def test_vllm_lmcache_producers_and_consumers() -> None:
    r = exported("vllm-pd-lmcache", "vllm")
    roles = re.findall(r'"kv_role":"(kv_\w+)"', script(r))
    assert roles == ["kv_producer"] * 2 + ["kv_consumer"] * 6
    split = "Disaggregated: instances 0-1 prefill, instances 2-7 decode; the P/D transfer"
    assert any(n.startswith(split) for n in r.notes)
    assert any("proxy" in n for n in r.notes)


def test_vllm_nixl_without_lmcache() -> None:

    p = load_preset("vllm-pd-lmcache")
    p = replace(p, tiers=p.tiers[:1])  # HBM only: the NIXL connector moves the KV
    r = export(p, "vllm", load_hardware(p.hardware), load_model(p.model))
    # vLLM 0.34 deprecates kv_both for NixlConnector: producers prefill, consumers decode
    text = script(r)
    assert text.count('{"kv_connector":"NixlConnector","kv_role":"kv_producer"}') == 2
    assert text.count('{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}') == 6


def test_dynamo_prefill_workers_and_sglang_modes() -> None:
    dyn = script(exported("dynamo-disagg", "dynamo"))
    assert "--is-prefill-worker" not in dyn  # removed from ai-dynamo 1.6.1's vLLM worker
    assert dyn.count("--disaggregation-mode prefill") == 4
    assert dyn.count("--disaggregation-mode decode") == 4
    sg = script(exported("mooncake-pd", "sglang"))
    assert sg.count("--disaggregation-mode prefill") == 4
    assert sg.count("--disaggregation-mode decode") == 4
    assert sg.count("--disaggregation-transfer-backend mooncake") == 8


def test_aggregated_exports_have_no_roles() -> None:
    r = exported("dynamo-kvbm", "vllm")
    assert "kv_producer" not in script(r) and "(prefill)" not in script(r)
    assert not any(n.startswith("Disaggregated") for n in r.notes)


def test_targets_that_run_a_disaggregated_winner() -> None:
    # dynamo-disagg's NIXL pull is what vLLM's (NixlConnector beside LMCache in a
    # MultiConnector), SGLang's and Dynamo's launch lines select; the LMCache target exports
    # no P/D backend; its host tier's loads are read with a later step's output, as vLLM's
    # engine reads them, which SGLang's (loading within the step, the pages cached at once)
    # does not do
    from kvtier.policy.model import policy_to_dict
    from kvtier.search.run import runnable_targets

    p = load_preset("dynamo-disagg")
    hw, mdl = load_hardware(p.hardware), load_model(p.model)
    assert runnable_targets(policy_to_dict(p), hw, mdl) == ["vllm", "dynamo"]
    as_sglang = replace(p, load_report="at_once", load_caching="at_admission")
    assert "sglang" in runnable_targets(policy_to_dict(as_sglang), hw, mdl)
    # HBM only: vLLM's NixlConnector is the modelled path; its launch line runs the winner
    hbm = replace(p, tiers=p.tiers[:1])
    assert "vllm" in runnable_targets(policy_to_dict(hbm), hw, mdl)
    assert not any("Not expressible" in n for n in exported("dynamo-disagg", "vllm").notes)


def test_layerwise_push_is_not_what_vllm_or_sglang_run() -> None:

    p = load_preset("mooncake-pd")
    p = replace(p, load_rule="always_load")
    hw, mdl = load_hardware(p.hardware), load_model(p.model)
    for target in ("vllm", "sglang"):
        notes = export(p, target, hw, mdl).notes
        assert any("layer-wise push" in n for n in notes), target
