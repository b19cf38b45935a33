"""Prefill/decode disaggregation in the exported launch configurations.

A policy with ``serving.prefill_instances = P`` runs instances ``0..P-1`` as prefill workers
and the rest as decode workers (docs/model.md, "Prefill/decode disaggregation"). What each
target's launch line gets for that, as its documentation gives it ([vLLM-PD], [Dynamo-disagg]
in docs/sources.md):

- vLLM (0.34.0): ``--kv-transfer-config`` per instance: ``NixlConnector`` with ``kv_role
  kv_producer`` on prefill and ``kv_consumer`` on decode instances (``kv_both`` is deprecated
  for NixlConnector: ``kv_connector/v1/nixl/connector.py``); when LMCache holds the lower
  tiers, the prefill instances stack ``NixlConnector`` and ``LMCacheConnectorV1`` in vLLM's
  ``MultiConnector`` (its ``kv_connector_extra_config.connectors`` list, whose roles decide:
  ``config/kv_transfer.py``), since kvtier looks the lower tiers up and writes them on the
  prefill side; only LMCache's own P/D backend (``pd_connector = "lmcache-pd"``) takes
  ``LMCacheConnectorV1`` with ``kv_role kv_producer`` on prefill and ``kv_consumer`` on
  decode instances;
- Dynamo (ai-dynamo 1.6.1): ``--disaggregation-mode prefill`` on the prefill workers and
  ``--disaggregation-mode decode`` on the decode workers (``dynamo/vllm/backend_args.py``;
  ``--is-prefill-worker`` is read only by the mocker there), each with an explicit
  ``--kv-transfer-config`` (a prefill worker refuses to start without one:
  ``dynamo/vllm/args.py``): decode workers run ``NixlConnector`` (``kv_consumer``) alone and
  prefill workers KVBM and NIXL (``kv_producer``) together in Dynamo's ``PdConnector`` over
  ``DynamoConnector`` and ``NixlConnector`` (``kvbm/vllm_integration/connector/
  pd_connector.py`` of kvbm 1.6.1; the JSON Dynamo's own ``--connector kvbm nixl`` migration
  message prints);
- every NIXL instance on a host needs its own side channel: ``VLLM_NIXL_SIDE_CHANNEL_PORT``
  (vLLM's default 5600) plus the instance's first GPU, so tensor-parallel ranks above it stay
  free, as vLLM's ``tests/v1/kv_connector/nixl_integration/run_accuracy_test.sh`` spaces them
  ("Avoid clash with TP workers", vllm-project/vllm 002a105);
- SGLang: ``--disaggregation-mode prefill`` / ``decode`` with
  ``--disaggregation-transfer-backend`` ``mooncake`` or ``nixl``.

What they cannot be told, and where the target's own P/D path differs from the connector's
that kvtier models, is in :func:`pd_notes`.
"""

from __future__ import annotations

import json

from kvtier.export.common import Deployment, approximate, inexpressible, info

NIXL = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
# NixlConnector's role per P/D role: vLLM 0.34 (and 0.31) warn that kv_both "is deprecated and
# will be removed" and ask for kv_producer on prefill and kv_consumer on decode instances
# (vllm/distributed/kv_transfer/kv_connector/v1/nixl/connector.py); Dynamo 1.6.1 maps its
# prefill and decode workers the same way (dynamo/vllm/args.py, nixl_role).
NIXL_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
LMCACHE_BOTH = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
NIXL_SIDE_CHANNEL_PORT = 5600  # vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT default (vllm/envs.py)
LMCACHE_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
SGLANG_BACKENDS = {"mooncake-te": "mooncake", "nixl": "nixl"}


def prefill_count(deploy: Deployment) -> int:
    if deploy.layout is not None:
        return deploy.layout.n_prefill  # the simulator's placement (kvtier.deploy.layout)
    from kvtier.policy.model import prefill_count as count

    return count(deploy.policy.serving, deploy.instances)


# flags whose value is one instance's own: its GPUs (vLLM, SGLang) and vLLM's KV bytes per GPU
TP_FLAGS = ("--tensor-parallel-size", "--tp-size")


def per_instance_args(deploy: Deployment, instance: int, args: list[str]) -> list[str]:
    """``args`` for ``instance``: its pool's tensor-parallel size (``--tensor-parallel-size``,
    ``--tp-size``) and its HBM KV size (vLLM's ``--kv-cache-memory-bytes`` per GPU, SGLang's
    ``--max-total-tokens``).
    Aggregated or one size for both pools, ``args`` unchanged."""
    out = list(args)
    tp = deploy.tp_of(instance)
    for i, word in enumerate(out[:-1]):
        if word in TP_FLAGS:
            out[i + 1] = str(tp)
        elif word == "--kv-cache-memory-bytes":
            out[i + 1] = str(int(deploy.hbm_kv_bytes_of(instance) / tp))
        elif word == "--max-total-tokens":  # SGLang's device pool, in tokens
            out[i + 1] = str(int(deploy.hbm_kv_bytes_of(instance) // deploy.kv_bytes_per_token))
    return out


def role(deploy: Deployment, instance: int) -> str:
    """``prefill``, ``decode`` or ``both`` (aggregated)."""
    n = prefill_count(deploy)
    if n == 0:
        return "both"
    return "prefill" if instance < n else "decode"


def nixl(role: str) -> dict[str, object]:
    """NixlConnector for an instance of P/D ``role`` (``prefill`` or ``decode``)."""
    return {"kv_connector": "NixlConnector", "kv_role": NIXL_ROLES[role]}


def vllm_transfer_config(deploy: Deployment, instance: int, lmcache: bool) -> str | None:
    """The ``--kv-transfer-config`` JSON of a disaggregated instance (None: aggregated)."""
    r = role(deploy, instance)
    if r == "both":
        return None
    cfg: dict[str, object]
    if lmcache and deploy.policy.serving.pd_connector == "lmcache-pd":
        # LMCache's own P/D backend: the producer sends, the consumer receives
        cfg = {"kv_connector": "LMCacheConnectorV1", "kv_role": LMCACHE_ROLES[r]}
    elif lmcache and r == "prefill":
        # NIXL hands the KV over, LMCache holds the tiers the prefill side looks up and fills
        # MultiConnector's own kv_role must be set but its connectors' roles decide (vllm
        # 0.34 config/kv_transfer.py, _connector_roles)
        cfg = {
            "kv_connector": "MultiConnector",
            "kv_role": NIXL_ROLES[r],
            "kv_connector_extra_config": {"connectors": [nixl(r), dict(LMCACHE_BOTH)]},
        }
    else:
        cfg = nixl(r)
    return json.dumps(cfg, separators=(",", ":"))


def nixl_env(deploy: Deployment, instance: int, config: str | None) -> dict[str, str]:
    """``VLLM_NIXL_SIDE_CHANNEL_PORT`` of an instance whose ``config`` loads NixlConnector:
    instances sharing a host would otherwise all listen on vLLM's default port."""
    if config is None or "NixlConnector" not in config:
        return {}
    if deploy.layout is not None:
        first = deploy.layout.first_gpu[instance]
    else:
        first = instance * deploy.tp_of(instance)
    return {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(NIXL_SIDE_CHANNEL_PORT + first)}


def with_transfer_config(args: list[str], config: str | None) -> list[str]:
    """``args`` with its ``--kv-transfer-config`` replaced by ``config`` (kept when None)."""
    if config is None:
        return list(args)
    out = list(args)
    if "--kv-transfer-config" in out:
        i = out.index("--kv-transfer-config")
        del out[i : i + 2]
    return [*out, "--kv-transfer-config", config]


def sglang_args(deploy: Deployment, instance: int) -> list[str]:
    r = role(deploy, instance)
    if r == "both":
        return []
    backend = SGLANG_BACKENDS.get(deploy.policy.serving.pd_connector, "mooncake")
    return ["--disaggregation-mode", r, "--disaggregation-transfer-backend", backend]


def _span(a: int, b: int) -> str:
    return f"instance {a}" if a == b else f"instances {a}-{b}"


def pd_notes(deploy: Deployment, target: str) -> list[str]:
    """What a disaggregated policy means for ``target`` and what it cannot express.

    kvtier's P/D transfer is the connector's own (docs/model.md, "Prefill/decode
    disaggregation"): NIXL pulls the whole KV into blocks the decode side allocated first
    (vLLM's NixlConnector, which Dynamo's vLLM workers use and SGLang's nixl backend matches
    closely), Mooncake's Transfer Engine pushes it layer by layer. A target whose launch line
    selects that path needs no note about it; one that cannot select it gets a note of kind
    ``inexpressible``, so ``optimize`` does not list it among the targets that run the winner.
    """
    n = prefill_count(deploy)
    if n == 0:
        return []
    s = deploy.policy.serving
    last = deploy.instances - 1
    conn = s.pd_connector
    lay = deploy.layout
    sizes = ""
    if lay is not None and lay.mixed:
        sizes = (
            f" Prefill instances run at tp={lay.prefill_tp}, decode instances at "
            f"tp={lay.decode_tp}; each decode GPU pulls its share of the KV heads from the "
            "prefill GPUs (vLLM's NixlConnector handles the different sizes; kvtier moves the "
            "KV over as many GPU links as the smaller pool has GPUs)."
        )
        if deploy.policy.lower_tiers:
            sizes += (
                f" Lower-tier sizes per tensor-parallel rank are computed for tp="
                f"{lay.prefill_tp}; a decode instance's ranks would each hold "
                f"{lay.prefill_tp}/{lay.decode_tp} of that."
            )
    notes = [
        f"Disaggregated: {_span(0, n - 1)} prefill, {_span(n, last)} decode; the P/D "
        f"transfer goes through {conn}.{sizes}",
        f"{target} needs a proxy or router that sends each request to a prefill instance "
        "first and then to a decode instance (vLLM's disaggregated proxy example, Dynamo's "
        "frontend); kvtier models the router's choice among prefill instances "
        f"(routing = {s.routing}) and sends each prompt's KV to the least loaded decode "
        "instance, which a proxy may do differently.",
    ]
    layerwise = conn == "mooncake-te"
    lmcache_pd = conn == "lmcache-pd" and target == "vLLM" and _lmcache_roles(deploy)
    if target in ("vLLM", "Dynamo") and conn != "nixl" and not lmcache_pd:
        how = "Mooncake's layer-wise push" if layerwise else f"the {conn} path"
        notes.append(
            inexpressible(
                f"pd_connector = {conn} ({how}) cannot be expressed: the exported instances move "
                "the KV with vLLM's NixlConnector, which reads the whole KV after the prefill."
            )
        )
    if target == "vLLM" and conn != "lmcache-pd" and _lmcache_roles(deploy):
        notes.append(
            info(
                "Prefill instances stack NixlConnector (the P/D transfer) and LMCacheConnectorV1 "
                "(the lower tiers) in vLLM's MultiConnector; decode instances run NixlConnector "
                "alone, as kvtier looks the lower tiers up and writes them on the prefill side."
            )
        )
    if target == "Dynamo" and (deploy.has("dram") or deploy.has("ssd")):
        notes.append(
            info(
                "Prefill workers stack KVBM (DynamoConnector) and NIXL in Dynamo's PdConnector; "
                "decode workers run NixlConnector alone, as kvtier looks the lower tiers up and "
                "writes them on the prefill side."
            )
        )
    if target == "vLLM" and conn == "lmcache-pd" and _lmcache_roles(deploy):
        notes.append(
            inexpressible(
                "LMCache's P/D backend settings are not exported: LMCacheConnectorV1 moves the KV "
                "only with enable_pd, pd_role (sender on prefill, receiver on decode instances), "
                "transfer_channel nixl and the PD buffer and peer ports in each role's "
                "lmcache.yaml; without them the producers only store into the tiers."
            )
        )
    if target == "SGLang":
        if conn not in SGLANG_BACKENDS:
            notes.append(
                inexpressible(
                    f"pd_connector = {conn} cannot be expressed: SGLang's transfer backends are "
                    "mooncake and nixl (mooncake is exported)."
                )
            )
        elif layerwise:
            notes.append(
                inexpressible(
                    "Mooncake's layer-wise push has no equivalent in SGLang, whose mooncake "
                    "backend sends the KV per prefill chunk: the exported deployment waits for "
                    "the last chunk's transfer after the prefill."
                )
            )
        else:
            notes.append(
                approximate(
                    "SGLang's decode side allocates first and the prefill side sends each prefill "
                    "chunk as it is computed; kvtier moves the whole KV after the prefill, so a "
                    "chunked prompt arrives a little earlier there."
                )
            )
    if target == "LMCache":
        notes.append(
            inexpressible(
                "LMCache's P/D backend is not exported: enable_pd, pd_role, transfer_channel and "
                "the PD buffer differ per role, and this export writes one configuration for "
                "every instance."
            )
        )
    if target == "Mooncake" and conn != "mooncake-te":
        notes.append(
            info(
                f"pd_connector = {conn}: {target}'s own P/D path is the Mooncake "
                "Transfer Engine; the exported files configure the store only."
            )
        )
    return notes


def _lmcache_roles(deploy: Deployment) -> bool:
    """Whether the vLLM export gives the instances LMCacheConnectorV1 roles (LMCache holds
    the lower tiers)."""
    from kvtier.export.vllm import lmcache_tiers

    return bool(lmcache_tiers(deploy))
