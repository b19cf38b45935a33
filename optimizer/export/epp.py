"""llm-d's endpoint picker configuration for ``serving.routing = "llmd_epp"``.

``epp-config.yaml`` is an ``EndpointPickerConfig`` that deploys the scorers, weights and prefix
indexes the replay simulated (docs/model.md, "Routing"), written for llm-d-router v0.10.0
(``apix/config/v1alpha1/endpointpickerconfig_types.go``: ``plugins`` of ``type``, ``name``,
``parameters``; ``schedulingProfiles`` of ``pluginRef`` and ``weight``). The EPP decodes each
plugin's parameters strictly (unknown fields are refused, llm-d-router #1068), so the
parameters written are checked against :data:`PLUGIN_PARAMETERS`, read in that release's Go
source (llm-d-router has no Python package to read them from, unlike the pinned wheels of
:mod:`kvtier.export.releases`).

A scorer weighted 0 adds nothing to the sum the picker maximises, so it is left out.
"""

from __future__ import annotations

import yaml

from kvtier.export.common import Deployment, Note, approximate, inexpressible, info
from kvtier.policy.model import EPP_MIN_ENTRY_TOKENS, epp_gpu_entry_tokens

EPP_FILE = "epp-config.yaml"
EPP_RELEASE = "llm-d-router 0.10.0"

# plugin type -> the parameters it decodes, at llm-d-router v0.10.0 (tag 2026-08-17):
# scorer/queuedepth/queue.go, scorer/kvcacheutilization/kvcache_utilization.go (none),
# requestcontrol/dataproducer/approximateprefix/types.go (config), scorer/prefix/plugin.go,
# scorer/nohitlru/no_hit_lru.go, scorer/activerequest/active_request.go
PLUGIN_PARAMETERS: dict[str, frozenset[str]] = {
    "queue-scorer": frozenset(),
    "kv-cache-utilization-scorer": frozenset(),
    "approx-prefix-cache-producer": frozenset(
        {
            "autoTune",
            "blockSizeTokens",
            "blockSize",
            "maxPrefixBlocksToMatch",
            "maxPrefixTokensToMatch",
            "lruCapacityPerServer",
        }
    ),
    "prefix-cache-scorer": frozenset(
        {"prefixMatchInfoProducerName", "matchLengthWeight", "matchLengthScaleTokens"}
    ),
    "no-hit-lru-scorer": frozenset(
        {"prefixPluginType", "prefixPluginName", "lruSize", "prefixMatchInfoProducerName"}
    ),
    "active-request-scorer": frozenset(
        {"requestTimeout", "idleThreshold", "maxBusyScore", "inFlightLoadProducerName"}
    ),
}
# the EPP's --refresh-metrics-interval default (pkg/epp/server/runserver.go), seconds: how
# often it scrapes the load its queue and KV-utilisation scorers read
EPP_REFRESH_METRICS_S = 0.05
GPU_PRODUCER = "gpu-prefix-cache-producer"
CPU_PRODUCER = "cpu-prefix-cache-producer"


def _producer(name: str, entries: int, tokens: int, max_tokens: int) -> dict[str, object]:
    """An approx-prefix-cache-producer: autoTune when ``entries`` is 0 (vLLM's block count
    and block size), else the stated entries of ``tokens`` tokens."""
    params: dict[str, object] = {"autoTune": entries == 0, "maxPrefixTokensToMatch": max_tokens}
    if entries:
        params["lruCapacityPerServer"] = entries
        params["blockSizeTokens"] = tokens
    return {"type": "approx-prefix-cache-producer", "name": name, "parameters": params}


def epp_config(deploy: Deployment) -> tuple[dict[str, object] | None, list[Note]]:
    """The EndpointPickerConfig of ``deploy``'s llmd_epp router, and what it cannot deploy
    as simulated (None when the simulated prefix source has no approximate-producer form)."""
    s = deploy.policy.serving
    if s.epp_prefix_source != "index":
        return None, [
            inexpressible(
                "llmd_epp was simulated with its prefix scorers reading the instances' cached "
                "blocks (serving.epp_prefix_source = cache): llm-d deploys that as its "
                "precise-prefix-cache-scorer fed by vLLM's KV events (llm-d-kv-cache), which "
                "kvtier does not write; no epp-config.yaml."
            )
        ]
    notes: list[Note] = []
    for key, tokens in (
        ("epp_gpu_index_entry_tokens", s.epp_gpu_index_entry_tokens),
        ("epp_cpu_index_entry_tokens", s.epp_cpu_index_entry_tokens),
    ):
        floor = EPP_MIN_ENTRY_TOKENS
        if 0 < tokens < floor:
            notes.append(
                approximate(
                    f"serving.{key} = {tokens}: llm-d-router 0.10.0 raises a block size below "
                    f"{floor} tokens to {floor} (minBlockSizeTokens), so the deployed index "
                    f"holds {floor / tokens:g} times the simulated prompt tokens."
                )
            )
    gpu = _producer(
        GPU_PRODUCER,
        s.epp_gpu_index_entries,
        epp_gpu_entry_tokens(s.epp_gpu_index_entry_tokens, deploy.policy.block_tokens),
        s.epp_index_max_tokens,
    )
    cpu = _producer(
        CPU_PRODUCER, s.epp_cpu_index_entries, s.epp_cpu_index_entry_tokens, s.epp_index_max_tokens
    )
    scorers = [
        ("queue-scorer", s.epp_queue_weight, None),
        ("kv-cache-utilization-scorer", s.epp_kv_util_weight, None),
        ("gpu-prefix-cache-scorer", s.epp_gpu_prefix_weight, GPU_PRODUCER),
        ("cpu-prefix-cache-scorer", s.epp_cpu_prefix_weight, CPU_PRODUCER),
        # the replay's cold request is one the GPU index matches nowhere
        ("no-hit-lru-scorer", s.epp_no_hit_lru_weight, GPU_PRODUCER),
        ("active-request-scorer", s.epp_active_weight, None),
    ]
    plugins: list[dict[str, object]] = [gpu, cpu]
    profile: list[dict[str, object]] = []
    for name, weight, producer in scorers:
        if weight <= 0:
            continue
        kind = "prefix-cache-scorer" if "prefix-cache" in name else name
        plugin: dict[str, object] = {"type": kind}
        if kind != name:
            plugin["name"] = name
        if producer is not None:
            plugin["parameters"] = {"prefixMatchInfoProducerName": producer}
        plugins.append(plugin)
        profile.append({"pluginRef": name, "weight": float(weight)})
    notes.extend(_metrics_interval_notes(s.epp_metrics_interval_s))
    if s.epp_active_weight > 0:
        notes.append(
            approximate(
                "active-request-scorer: the EPP forgets a request after its requestTimeout "
                "(2 minutes by default); the replay counts it until it finishes."
            )
        )
    config = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": plugins,
        "schedulingProfiles": [{"name": "default", "plugins": profile}],
    }
    return config, notes


def _metrics_interval_notes(interval_s: float) -> list[Note]:
    """What the plugins file cannot carry: the scrape interval is a flag of the EPP's own."""
    if interval_s == EPP_REFRESH_METRICS_S:
        return []
    if interval_s == 0:
        return [
            approximate(
                "serving.epp_metrics_interval_s = 0 was simulated (the queue and KV-utilisation "
                "scorers reading each server's exact state at each arrival); the EPP reads them "
                "from the /metrics it scrapes every --refresh-metrics-interval (50 ms by "
                "default), which vLLM updates once a step, so the deployed router sees the "
                "load later than simulated."
            )
        ]
    ms = round(interval_s * 1000.0, 3)
    return [
        info(
            f"serving.epp_metrics_interval_s = {interval_s:g}: start the EPP with "
            f"--refresh-metrics-interval={ms:g}ms (a flag of the EPP, not of this file)."
        )
    ]


def epp_yaml(config: dict[str, object]) -> str:
    header = (
        f"# llm-d endpoint picker configuration exported by kvtier for {EPP_RELEASE}: the "
        "scorers, weights and\n# prefix indexes of the simulated llmd_epp router. Give it to "
        "the EPP as its plugins config file\n# (the router chart's "
        "epp.pluginsCustomConfig, as llm-d's tiered-prefix-cache guide does).\n"
    )
    return header + yaml.safe_dump(config, sort_keys=False)
