"""NVIDIA Dynamo: the KV Block Manager (KVBM) environment, for vLLM workers.

Names and units, read in Dynamo's docs and source (``ai-dynamo/dynamo``:
``docs/components/kvbm/kvbm-guide.md`` at 04521f4, which cites the 1.3.1 containers;
``lib/llm/src/block_manager/distributed/leader.rs`` at ae2223b; the frontend's ``--router-mode``
argument):

* ``DYN_KVBM_CPU_CACHE_GB`` (host tier G2) <- the ``dram`` tier; ``DYN_KVBM_DISK_CACHE_GB``
  (disk tier G3) <- the ``ssd`` tier; ``DYN_KVBM_DISK_CACHE_DIR`` (default ``/tmp``). The leader
  computes ``cache_size_in_gb * 1e9 / bytes_per_block`` blocks with ``bytes_per_block`` summed
  over the tensor-parallel workers, so the unit is decimal GB and the value is per instance.
* ``DYN_KVBM_DISABLE_DISK_OFFLOAD_FILTER``: by default a block reaches disk only once its
  frequency is at least 2 (SSD lifespan protection); ``true`` writes every block.
* ``python -m dynamo.vllm --model M`` loads KVBM with ``--kv-transfer-config
  '{"kv_connector":"DynamoConnector","kv_connector_module_path":"kvbm.vllm_integration.connector",
  "kv_role":"kv_both"}'``; it takes vLLM's engine flags (the guide passes
  ``--gpu-memory-utilization`` and ``--enforce-eager``), so the others are the vLLM target's.
* ``DYN_ROUTER_MODE`` (``round-robin``, ``random``, ``kv``), read by ``python -m
  dynamo.frontend`` as ``--router-mode``.
* Disaggregated: decode workers load NIXL alone and prefill workers KVBM and NIXL together
  (``examples/backends/vllm/launch/disagg_kvbm.sh`` at 15bb523 and ``disagg_kvbm_2p2d.sh`` at
  7893f26: ``--connector nixl`` on decode, ``--connector kvbm nixl`` with
  ``--is-prefill-worker`` on prefill, a ``VLLM_NIXL_SIDE_CHANNEL_PORT`` per worker; later
  revisions spell the pair as ``PdConnector`` over ``DynamoConnector`` and ``NixlConnector``
  in ``--kv-transfer-config``, the form exported here).
"""

from __future__ import annotations

import json

from kvtier.export.common import (
    Deployment,
    ExportResult,
    Job,
    decimal,
    env_file,
    gb,
    launch_script,
    model_word,
    placements,
    shared_notes,
)
from kvtier.export.pd import (
    NIXL,
    nixl_env,
    pd_notes,
    per_instance_args,
    with_transfer_config,
)
from kvtier.export.pd import role as pd_role
from kvtier.export.vllm import vllm_args

ENV_FILE = "kvbm.env"
SERVE_FILE = "dynamo-serve.sh"
CONNECTOR = {
    "kv_connector": "DynamoConnector",
    "kv_connector_module_path": "kvbm.vllm_integration.connector",
    "kv_role": "kv_both",
}
# a disaggregated prefill worker with KVBM: Dynamo's PdConnector stacks KVBM and NIXL
PD_CONNECTOR = {
    "kv_connector": "PdConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"connectors": [CONNECTOR, NIXL]},
    "kv_connector_module_path": "kvbm.vllm_integration.connector",
}
ROUTER_MODES = {"round_robin": "round-robin", "prefix_affinity": "kv", "kv_aware": "kv"}
DISK_DIR = "/var/cache/kvbm"
FRONTEND_PORT = 8000  # dynamo.frontend --http-port default
# Per-worker ports (examples/backends/vllm/launch/disagg_kvbm_2p2d.sh): worker k takes
# KVBM_PUB_PORT + 2k and KVBM_PUB_PORT + 2k + 1 for its KVBM leader, KV_EVENT_PORT + k for
# its KV events; worker 0 keeps the defaults.
KVBM_PUB_PORT = 56001
KV_EVENT_PORT = 20080


def kvbm_env(deploy: Deployment) -> tuple[dict[str, str], list[str]]:
    """The KVBM variables of ``deploy`` and notes on what they cannot say."""
    p = deploy.policy
    env: dict[str, str] = {}
    notes: list[str] = []
    if deploy.has("dram"):
        env["DYN_KVBM_CPU_CACHE_GB"] = decimal(gb(deploy.per_instance_bytes("dram")))
    if deploy.has("ssd"):
        env["DYN_KVBM_DISK_CACHE_GB"] = decimal(gb(deploy.per_instance_bytes("ssd")))
        env["DYN_KVBM_DISK_CACHE_DIR"] = DISK_DIR
        notes.append(f"DYN_KVBM_DISK_CACHE_DIR is a placeholder ({DISK_DIR}): use the SSD.")
        _disk_filter(deploy, env, notes)
        if not deploy.has("dram"):
            notes.append(
                "Disk without host cache offloads GPU -> disk directly, which the KVBM guide "
                "calls experimental."
            )
    for name in ("cxl", "rdma"):
        if deploy.has(name):
            notes.append(
                f"The {name} tier is not exported: KVBM's tiers are host memory (G2), local "
                "disk (G3) and object storage (G4)."
            )
    _order_notes(deploy, notes)
    if p.write_policy == "write_back":
        notes.append(
            "write_policy = write_back cannot be expressed: KVBM is a write-through cache."
        )
    if p.hierarchy == "exclusive":
        notes.append(
            "hierarchy = exclusive cannot be expressed: KVBM is a write-through cache and "
            "keeps the blocks it offloads."
        )
    for t in p.lower_tiers:
        if t.name in ("dram", "ssd") and t.eviction != "lru":
            notes.append(
                f"{t.name} eviction = {t.eviction} cannot be expressed: KVBM has no eviction "
                "setting."
            )
    mode = ROUTER_MODES.get(p.serving.routing)
    if mode is not None:
        env["DYN_ROUTER_MODE"] = mode
    else:
        notes.append(
            f"routing = {p.serving.routing} has no Dynamo router mode (round-robin, random, "
            "kv); DYN_ROUTER_MODE is left at round-robin."
        )
    if p.serving.routing == "prefix_affinity":
        notes.append(
            "prefix_affinity maps to Dynamo's KV router (kv), which weighs prefix overlap "
            f"against load itself; affinity_overload = {p.serving.affinity_overload} is not a "
            "setting of it."
        )
    return env, notes


def _disk_filter(deploy: Deployment, env: dict[str, str], notes: list[str]) -> None:
    p = deploy.policy
    if p.write_policy == "write_through_selective":
        if p.selective_k != 2:
            notes.append(
                f"selective_k = {p.selective_k}: KVBM's disk filter admits blocks of "
                "frequency >= 2 (frequency doubles on a hit and decays over time); fixed."
            )
    else:
        env["DYN_KVBM_DISABLE_DISK_OFFLOAD_FILTER"] = "true"


def _order_notes(deploy: Deployment, notes: list[str]) -> None:
    """KVBM's guide: each tier must be at least as large as the one above it."""
    sizes = [("HBM", deploy.hbm_kv_bytes)]
    sizes += [(n, deploy.per_instance_bytes(n)) for n in ("dram", "ssd") if deploy.has(n)]
    for (upper, a), (lower, b) in zip(sizes, sizes[1:], strict=False):
        if b < a:
            notes.append(
                f"The {lower} share ({b / 1e9:.1f} GB per instance) is smaller than {upper} "
                f"({a / 1e9:.1f} GB); KVBM's guide warns a write-through tier smaller than "
                "the one above it brings no benefit."
            )


def export_dynamo(deploy: Deployment) -> ExportResult:
    """``kvbm.env`` and ``dynamo-serve.sh``: the frontend and a worker loading KVBM per
    instance."""
    env, notes = kvbm_env(deploy)
    args, vllm_notes = vllm_args(deploy)
    if "--kv-transfer-config" in args:
        i = args.index("--kv-transfer-config")
        del args[i : i + 2]
    files: dict[str, str] = {}
    if deploy.has("dram") or deploy.has("ssd"):
        args += ["--kv-transfer-config", json.dumps(CONNECTOR, separators=(",", ":"))]
    else:
        notes.insert(
            0,
            "The policy has no dram or ssd tier: KVBM would have no tier (it refuses to start "
            "without one), so the worker is exported without DynamoConnector.",
        )
    comments = [
        "Dynamo KVBM environment exported by kvtier; per instance (sizes in GB = 1e9 bytes).",
        "Load it before the worker and the frontend: set -a; . ./kvbm.env; set +a",
    ]
    files[ENV_FILE] = env_file(env, comments)
    serve_comments = [
        "Dynamo frontend and vLLM workers with the KV Block Manager, exported by kvtier: starts "
        "this host's processes in the background and waits (etcd and NATS must be running).",
        "MODEL is the checkpoint to serve (a Hugging Face id or a path); HOST_INDEX (default "
        "0) is this host's index; host 0 also runs the frontend.",
    ]
    worker_env = {k: v for k, v in env.items() if k.startswith("DYN_KVBM_")}
    kvbm = "--kv-transfer-config" in args
    jobs = [_frontend(env)]
    for place in placements(deploy):
        k = place.instance
        job_env = {"CUDA_VISIBLE_DEVICES": place.visible_devices}
        job_env["DYN_VLLM_KV_EVENT_PORT"] = str(KV_EVENT_PORT + k)
        r = pd_role(deploy, k)
        config = _worker_config(r, kvbm)
        if kvbm and r != "decode":  # decode workers of a disaggregated deployment run no KVBM
            job_env["DYN_KVBM_LEADER_ZMQ_PUB_PORT"] = str(KVBM_PUB_PORT + 2 * k)
            job_env["DYN_KVBM_LEADER_ZMQ_ACK_PORT"] = str(KVBM_PUB_PORT + 2 * k + 1)
        job_env.update(nixl_env(deploy, k, config))
        own = per_instance_args(deploy, k, args)  # its pool's tensor-parallel size
        own = with_transfer_config(own, config)
        argv = ["python3", "-m", "dynamo.vllm", "--model", model_word(deploy), *own]
        if r == "prefill":
            argv.append("--is-prefill-worker")  # Dynamo's disaggregated vLLM prefill workers
        label = f"Dynamo worker {k}" + ("" if r == "both" else f" ({r})")
        label += f": GPUs {place.visible_devices}"
        jobs.append(Job(place.host, job_env, argv, label))
    files[SERVE_FILE] = launch_script(serve_comments, worker_env, {}, jobs, deploy.hosts)
    notes += [n for n in vllm_notes if not n.startswith("HBM KV capacity")]
    notes.append(
        f"dynamo-serve.sh starts the frontend (port {FRONTEND_PORT}) on host 0 and one worker "
        f"per instance ({deploy.describe()}) with its own GPUs (CUDA_VISIBLE_DEVICES), KV "
        "event port and KVBM leader ports; on host h run it with HOST_INDEX=h. dynamo.vllm is "
        "assumed to pass every vLLM engine flag through, as it does those in the KVBM guide."
    )
    notes += pd_notes(deploy, "Dynamo")
    return ExportResult("dynamo", files, [*shared_notes(deploy, "Dynamo KVBM"), *notes])


def _worker_config(role: str, kvbm: bool) -> str | None:
    """A disaggregated worker's ``--kv-transfer-config`` (None: aggregated, the shared args'
    own): NIXL moves the KV from the prefill to the decode workers, KVBM holds the tiers on the
    prefill side only (the lower tiers kvtier looks up and writes there)."""
    if role == "both":
        return None
    cfg = PD_CONNECTOR if role == "prefill" and kvbm else NIXL
    return json.dumps(cfg, separators=(",", ":"))


def _frontend(env: dict[str, str]) -> Job:
    """The HTTP frontend, once, on host 0, with the router mode of ``env``."""
    argv = ["python3", "-m", "dynamo.frontend", "--http-port", str(FRONTEND_PORT)]
    if "DYN_ROUTER_MODE" in env:
        argv += ["--router-mode", env["DYN_ROUTER_MODE"]]
    return Job(0, {}, argv, f"Dynamo frontend: port {FRONTEND_PORT}")
