"""The llm-d endpoint picker configuration the vLLM export writes for ``routing = llmd_epp``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import yaml

from kvtier.errors import InputError
from kvtier.export import export
from kvtier.export.common import APPROXIMATE, INEXPRESSIBLE
from kvtier.export.epp import EPP_FILE, PLUGIN_PARAMETERS
from kvtier.hardware import load_hardware, load_model
from kvtier.policy import Policy
from kvtier.sim import build_config

MODEL = load_model("Llama-3.1-8B")
H100 = load_hardware("h100-node")


def epp_policy(**serving: object) -> Policy:
    p = Policy()
    return replace(p, serving=replace(p.serving, routing="llmd_epp", **serving))


def epp_file(p: Policy) -> dict:
    result = export(p, "vllm", H100, MODEL)
    assert "llm-d-router 0.10.0" in result.release
    return yaml.safe_load(result.files[EPP_FILE])


def test_the_default_router_deploys_the_guide_profile_with_its_indexes() -> None:
    cfg = epp_file(epp_policy())
    assert cfg["apiVersion"] == "llm-d.ai/v1alpha1"
    assert cfg["kind"] == "EndpointPickerConfig"
    plugins = {p.get("name", p["type"]): p for p in cfg["plugins"]}
    # every plugin is a type llm-d-router 0.10.0 has, with parameters it decodes
    for p in cfg["plugins"]:
        assert set(p.get("parameters", {})) <= PLUGIN_PARAMETERS[p["type"]], p
    gpu = plugins["gpu-prefix-cache-producer"]["parameters"]
    cpu = plugins["cpu-prefix-cache-producer"]["parameters"]
    assert gpu == {"autoTune": True, "maxPrefixTokensToMatch": 131072}
    assert cpu == {
        "autoTune": False,
        "maxPrefixTokensToMatch": 131072,
        "lruCapacityPerServer": 31250,
        "blockSizeTokens": 64,
    }
    profile = cfg["schedulingProfiles"][0]["plugins"]
    weights = {p["pluginRef"]: p["weight"] for p in profile}
    # 1:1:1:1:1, the active-request scorer (weight 0) left out
    assert weights == {
        "queue-scorer": 1.0,
        "kv-cache-utilization-scorer": 1.0,
        "gpu-prefix-cache-scorer": 1.0,
        "cpu-prefix-cache-scorer": 1.0,
        "no-hit-lru-scorer": 1.0,
    }
    for ref in weights:
        assert ref in plugins
    producers = {
        n: p["parameters"]["prefixMatchInfoProducerName"]
        for n, p in plugins.items()
        if "prefixMatchInfoProducerName" in p.get("parameters", {})
    }
    assert producers == {
        "gpu-prefix-cache-scorer": "gpu-prefix-cache-producer",
        "cpu-prefix-cache-scorer": "cpu-prefix-cache-producer",
        "no-hit-lru-scorer": "gpu-prefix-cache-producer",
    }


def test_stated_index_sizes_and_weights_are_deployed_as_simulated() -> None:
    p = epp_policy(
        epp_queue_weight=2.0,
        epp_no_hit_lru_weight=0.0,
        epp_active_weight=2.0,
        epp_gpu_index_entries=5000,
        epp_gpu_index_entry_tokens=128,
        epp_cpu_index_entries=82000,
        epp_index_max_tokens=4096,
    )
    cfg = epp_file(p)
    plugins = {p.get("name", p["type"]): p for p in cfg["plugins"]}
    assert plugins["gpu-prefix-cache-producer"]["parameters"] == {
        "autoTune": False,
        "maxPrefixTokensToMatch": 4096,
        "lruCapacityPerServer": 5000,
        "blockSizeTokens": 128,
    }
    assert plugins["cpu-prefix-cache-producer"]["parameters"]["lruCapacityPerServer"] == 82000
    weights = {r["pluginRef"]: r["weight"] for r in cfg["schedulingProfiles"][0]["plugins"]}
    assert weights["queue-scorer"] == 2.0 and weights["active-request-scorer"] == 2.0
    assert "no-hit-lru-scorer" not in weights and "no-hit-lru-scorer" not in plugins


def test_an_entry_below_the_epps_floor_is_said_to_differ() -> None:
    result = export(epp_policy(epp_cpu_index_entry_tokens=16), "vllm", H100, MODEL)
    notes = [n for n in result.notes if n.kind == APPROXIMATE and "minBlockSizeTokens" in n]
    assert len(notes) == 1 and "4 times" in notes[0]


def test_the_metrics_interval_is_said_where_the_file_cannot_carry_it() -> None:
    # the default is the EPP's own 50 ms: nothing to say
    result = export(epp_policy(), "vllm", H100, MODEL)
    assert not [n for n in result.notes if "refresh-metrics-interval" in n]
    slower = export(epp_policy(epp_metrics_interval_s=0.2), "vllm", H100, MODEL)
    notes = [n for n in slower.notes if "refresh-metrics-interval" in n]
    assert len(notes) == 1 and "--refresh-metrics-interval=200ms" in notes[0]
    exact = export(epp_policy(epp_metrics_interval_s=0.0), "vllm", H100, MODEL)
    notes = [n for n in exact.notes if "refresh-metrics-interval" in n]
    assert len(notes) == 1 and notes[0].kind == APPROXIMATE


def test_the_exact_cache_source_writes_no_epp_file_and_says_why() -> None:
    result = export(epp_policy(epp_prefix_source="cache"), "vllm", H100, MODEL)
    assert EPP_FILE not in result.files
    assert "llm-d-router" not in result.release
    assert any(n.kind == INEXPRESSIBLE and "precise-prefix-cache-scorer" in n for n in result.notes)


def test_an_entry_size_without_entries_is_refused_naming_the_option() -> None:
    # autoTune takes the entry size from vLLM: a stated size alone could not be deployed
    with pytest.raises(InputError, match="option serving.epp_gpu_index_entry_tokens"):
        build_config(H100, MODEL, epp_policy(epp_gpu_index_entry_tokens=64))
    build_config(H100, MODEL, epp_policy(epp_gpu_index_entry_tokens=64, epp_gpu_index_entries=9))
