"""NVIDIA Dynamo: the KV Block Manager (KVBM) environment, for vLLM workers.

Written for ai-dynamo 1.6.1 with kvbm 1.6.1 and the vLLM it requires (``ai-dynamo[vllm]``
1.6.1: ``vllm==0.31.0``); every flag, variable and key is in those releases' lists
(``kvtier/export/releases``, ``scripts/pin_releases.py``). Names and units, read in the
released wheels (and Dynamo's KVBM guide, ``docs/components/kvbm/kvbm-guide.md`` at 04521f4;
``lib/llm/src/block_manager/distributed/leader.rs`` at ae2223b):

* ``DYN_KVBM_CPU_CACHE_GB`` (host tier G2) <- the ``dram`` tier; ``DYN_KVBM_DISK_CACHE_GB``
  (disk tier G3) <- the ``ssd`` tier; ``DYN_KVBM_DISK_CACHE_DIR`` (default ``/tmp``), one
  directory per worker. The leader computes ``cache_size_in_gb * 1e9 / bytes_per_block``
  blocks with ``bytes_per_block`` summed over the tensor-parallel workers, so the unit is
  decimal GB and the value is per worker (read by kvbm 1.6.1's ``_core`` library). Each
  worker that runs KVBM gets its host's pool over the KVBM workers on that host, so the sizes
  sum to the pools kvtier simulated; in a disaggregated deployment only the prefill workers
  run KVBM.
* ``DYN_KVBM_DISABLE_DISK_OFFLOAD_FILTER``: by default a block reaches disk only once its
  frequency is at least 2 (SSD lifespan protection); ``true`` writes every block.
* ``python -m dynamo.vllm --model M`` loads KVBM with ``--kv-transfer-config
  '{"kv_connector":"DynamoConnector","kv_connector_module_path":"kvbm.vllm_integration.connector",
  "kv_role":"kv_both"}'``; it builds vLLM's own engine arguments (``dynamo/vllm/args.py``:
  ``AsyncEngineArgs.add_cli_args``), so the engine flags are the vLLM target's, checked
  against vLLM 0.31.0.
* KV events for the KV router: ``--kv-events-config`` (vLLM's ``KVEventsConfig``:
  ``enable_kv_cache_events``, ``publisher`` ``zmq``, ``endpoint``) per worker on its own port;
  Dynamo 1.6.1 publishes only a user-provided config (``create_kv_events_config``) and no
  longer reads ``DYN_VLLM_KV_EVENT_PORT``.
* ``DYN_ROUTER_MODE`` / ``--router-mode`` of ``python -m dynamo.frontend`` (``round-robin``,
  ``random``, ``power-of-two``, ``kv``, ``direct``, ``least-loaded``,
  ``device-aware-weighted``: ``dynamo/common/configuration/groups/router_args.py``).
* Disaggregated: ``--disaggregation-mode prefill`` / ``decode`` (``dynamo/vllm/
  backend_args.py``); decode workers load NIXL alone (``kv_consumer``) and prefill workers
  KVBM and NIXL (``kv_producer``) together in ``PdConnector`` (:mod:`kvtier.export.pd`).
"""

from __future__ import annotations

import json

from kvtier.export.capabilities import Capabilities, Minimum
from kvtier.export.common import (
    Deployment,
    ExportResult,
    Job,
    approximate,
    decimal,
    env_file,
    gb,
    inexpressible,
    info,
    launch_script,
    model_word,
    placements,
    shared_notes,
)
from kvtier.export.pd import (
    nixl,
    nixl_env,
    pd_notes,
    per_instance_args,
    with_transfer_config,
)
from kvtier.export.pd import role as pd_role
from kvtier.export.vllm import VLLM_BLOCKS, vllm_args
from kvtier.policy.model import KV_LAYOUTS

ENV_FILE = "kvbm.env"
SERVE_FILE = "dynamo-serve.sh"
CONNECTOR = {
    "kv_connector": "DynamoConnector",
    "kv_connector_module_path": "kvbm.vllm_integration.connector",
    "kv_role": "kv_both",
}
# a disaggregated prefill worker with KVBM: Dynamo's PdConnector stacks KVBM and NIXL
# (the JSON ai-dynamo 1.6.1 itself prints for "--connector kvbm nixl" on a prefill worker,
# dynamo/vllm/args.py _connector_to_kv_transfer_json)
PD_CONNECTOR = {
    "kv_connector": "PdConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"connectors": [CONNECTOR, nixl("prefill")]},
    "kv_connector_module_path": "kvbm.vllm_integration.connector",
}
# dynamo.frontend --router-mode (ai-dynamo 1.6.1 dynamo/common/configuration/groups/
# router_args.py: round-robin, random, power-of-two, kv, direct, least-loaded,
# device-aware-weighted)
ROUTER_MODES = {
    "round_robin": "round-robin",
    "least_loaded": "least-loaded",
    "prefix_affinity": "kv",
    "kv_aware": "kv",
}
DISK_DIR = "/var/cache/kvbm"
FRONTEND_PORT = 8000  # dynamo.frontend --http-port default
# Per-worker ports (examples/backends/vllm/launch/disagg_kvbm_2p2d.sh): worker k takes
# KVBM_PUB_PORT + 2k and KVBM_PUB_PORT + 2k + 1 for its KVBM leader, KV_EVENT_PORT + k for
# its KV events; worker 0 keeps the defaults.
KVBM_PUB_PORT = 56001
PER_WORKER = ("DYN_KVBM_CPU_CACHE_GB", "DYN_KVBM_DISK_CACHE_GB", "DYN_KVBM_DISK_CACHE_DIR")

CAPABILITIES = Capabilities(
    target="dynamo",
    package="vllm@dynamo",  # block sizes: the vLLM its workers run
    tiers=("dram", "ssd"),  # KVBM's host (G2) and disk (G3) tiers
    routers=tuple(ROUTER_MODES),
    schedulers=("vllm_v1",),
    write_policies=("write_through", "write_through_selective"),  # the disk filter: k = 2
    load_rules=("always_load",),
    evictions=("lru",),
    hierarchies=("inclusive",),
    kv_layouts=KV_LAYOUTS,
    kv_dtypes=("bf16", "fp8", "int4"),
    block_sizes=VLLM_BLOCKS,
    pd_connectors=("nixl",),
    shared_tiers=(),  # every KVBM worker holds its own host and disk cache
)
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
        notes.append(
            info(
                f"DYN_KVBM_DISK_CACHE_DIR is a placeholder ({DISK_DIR}): use the SSD; each "
                "worker gets its own directory under it (worker-K)."
            )
        )
        _disk_filter(deploy, env, notes)
        if not deploy.has("dram"):
            notes.append(
                info(
                    "Disk without host cache offloads GPU -> disk directly, which the KVBM guide "
                    "calls experimental."
                )
            )
    for name in ("cxl", "rdma"):
        if deploy.has(name):
            notes.append(
                inexpressible(
                    f"The {name} tier is not exported: KVBM's tiers are host memory (G2), local "
                    "disk (G3) and object storage (G4)."
                )
            )
    _order_notes(deploy, notes)
    if p.write_policy == "write_back":
        notes.append(
            inexpressible(
                "write_policy = write_back cannot be expressed: KVBM is a write-through cache."
            )
        )
    if p.hierarchy == "exclusive":
        notes.append(
            inexpressible(
                "hierarchy = exclusive cannot be expressed: KVBM is a write-through cache and "
                "keeps the blocks it offloads."
            )
        )
    for t in p.lower_tiers:
        if t.name in ("dram", "ssd") and t.eviction != "lru":
            notes.append(
                inexpressible(
                    f"{t.name} eviction = {t.eviction} cannot be expressed: KVBM has no eviction "
                    "setting."
                )
            )
    mode = ROUTER_MODES.get(p.serving.routing)
    if mode is not None:
        env["DYN_ROUTER_MODE"] = mode
    else:
        notes.append(
            inexpressible(
                f"routing = {p.serving.routing} has no Dynamo router mode; DYN_ROUTER_MODE is "
                "left at round-robin."
            )
        )
    if p.serving.routing == "prefix_affinity":
        notes.append(
            approximate(
                "prefix_affinity maps to Dynamo's KV router (kv), which weighs prefix overlap "
                f"against load itself; affinity_overload = {p.serving.affinity_overload} is not a "
                "setting of it."
            )
        )
    return env, notes


def _disk_filter(deploy: Deployment, env: dict[str, str], notes: list[str]) -> None:
    p = deploy.policy
    if p.write_policy == "write_through_selective":
        if p.selective_k != 2:
            notes.append(
                approximate(
                    f"selective_k = {p.selective_k}: KVBM's disk filter admits blocks of "
                    "frequency >= 2 (frequency doubles on a hit and decays over time); fixed."
                )
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
                info(
                    f"The {lower} share ({b / 1e9:.1f} GB per instance) is smaller than {upper} "
                    f"({a / 1e9:.1f} GB); KVBM's guide warns a write-through tier smaller than "
                    "the one above it brings no benefit."
                )
            )


def export_dynamo(deploy: Deployment) -> ExportResult:
    """``kvbm.env`` and ``dynamo-serve.sh``: the frontend and a worker loading KVBM per
    instance."""
    env, notes = kvbm_env(deploy)
    args, vllm_notes = vllm_args(deploy, CAPABILITIES)
    if "--kv-transfer-config" in args:
        i = args.index("--kv-transfer-config")
        del args[i : i + 2]
    files: dict[str, str] = {}
    if deploy.has("dram") or deploy.has("ssd"):
        args += ["--kv-transfer-config", json.dumps(CONNECTOR, separators=(",", ":"))]
    else:
        notes.insert(
            0,
            info(
                "The policy has no dram or ssd tier: KVBM would have no tier (it refuses to start "
                "without one), so the worker is exported without DynamoConnector."
            ),
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
    # sizes and the disk directory are each worker's own (dynamo-serve.sh sets them per job)
    worker_env = {k: v for k, v in env.items() if k.startswith("DYN_KVBM_") and k not in PER_WORKER}
    kvbm = "--kv-transfer-config" in args
    jobs = [_frontend(env)]
    for place in placements(deploy):
        k = place.instance
        job_env = {"CUDA_VISIBLE_DEVICES": place.visible_devices}
        r = pd_role(deploy, k)
        config = _worker_config(r, kvbm)
        if kvbm and r != "decode":  # decode workers of a disaggregated deployment run no KVBM
            job_env.update(_worker_kvbm(deploy, k))
            job_env["DYN_KVBM_LEADER_ZMQ_PUB_PORT"] = str(KVBM_PUB_PORT + 2 * k)
            job_env["DYN_KVBM_LEADER_ZMQ_ACK_PORT"] = str(KVBM_PUB_PORT + 2 * k + 1)
        job_env.update(nixl_env(deploy, k, config))
        own = per_instance_args(deploy, k, args)  # its pool's tensor-parallel size
        own = with_transfer_config(own, config)
        argv = ["python3", "-m", "dynamo.vllm", "--model", model_word(deploy), *own]
        argv += ["--kv-events-config", _events_config(k)]
        if r != "both":  # ai-dynamo 1.6.1: --disaggregation-mode prefill|decode
            argv += ["--disaggregation-mode", r]
        label = f"Dynamo worker {k}" + ("" if r == "both" else f" ({r})")
        label += f": GPUs {place.visible_devices}"
        jobs.append(Job(place.host, job_env, argv, label))
    files[SERVE_FILE] = launch_script(serve_comments, worker_env, {}, jobs, deploy.hosts)
    notes += vllm_notes
    notes.append(
        info(
            f"dynamo-serve.sh starts the frontend (port {FRONTEND_PORT}) on host 0 and one worker "
            f"per instance ({deploy.describe()}) with its own GPUs (CUDA_VISIBLE_DEVICES), KV "
            "event port and KVBM leader ports; on host h run it with HOST_INDEX=h. dynamo.vllm "
            "parses vLLM's own engine flags (ai-dynamo 1.6.1 dynamo/vllm/args.py)."
        )
    )
    notes += pd_notes(deploy, "Dynamo")
    return ExportResult("dynamo", files, [*shared_notes(deploy, "Dynamo KVBM"), *notes])


def _worker_config(role: str, kvbm: bool) -> str | None:
    """A disaggregated worker's ``--kv-transfer-config`` (None: aggregated, the shared args'
    own): NIXL moves the KV from the prefill to the decode workers, KVBM holds the tiers on the
    prefill side only (the lower tiers kvtier looks up and writes there)."""
    if role == "both":
        return None
    cfg = PD_CONNECTOR if role == "prefill" and kvbm else nixl(role)
    return json.dumps(cfg, separators=(",", ":"))


def _events_config(worker: int) -> str:
    """vLLM's ``--kv-events-config`` of ``worker``: its KV cache events published over ZMQ on
    its own port, for the KV router (ai-dynamo 1.6.1 reads only a user-provided config with
    ``enable_kv_cache_events`` true: ``dynamo/vllm/args.py`` create_kv_events_config; the
    fields are vLLM 0.31's ``KVEventsConfig``, ``vllm/config/kv_events.py``)."""
    cfg = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://*:{KV_EVENT_PORT + worker}",
    }
    return json.dumps(cfg, separators=(",", ":"))


def _worker_kvbm(deploy: Deployment, worker: int) -> dict[str, str]:
    """``worker``'s own KVBM sizes (its host's pools over the KVBM workers there, which sum
    to the pools kvtier simulated) and disk directory."""
    env: dict[str, str] = {}
    if deploy.has("dram"):
        env["DYN_KVBM_CPU_CACHE_GB"] = decimal(gb(deploy.per_instance_bytes("dram", worker)))
    if deploy.has("ssd"):
        env["DYN_KVBM_DISK_CACHE_GB"] = decimal(gb(deploy.per_instance_bytes("ssd", worker)))
        env["DYN_KVBM_DISK_CACHE_DIR"] = f"{DISK_DIR}/worker-{worker}"
    return env


def _frontend(env: dict[str, str]) -> Job:
    """The HTTP frontend, once, on host 0, with the router mode of ``env``."""
    argv = ["python3", "-m", "dynamo.frontend", "--http-port", str(FRONTEND_PORT)]
    if "DYN_ROUTER_MODE" in env:
        argv += ["--router-mode", env["DYN_ROUTER_MODE"]]
    return Job(0, {}, argv, f"Dynamo frontend: port {FRONTEND_PORT}")


def minimum_versions(deploy: Deployment) -> list[Minimum]:
    """ai-dynamo releases the script needs, read in the 1.0.0 to 1.6.1 wheels: a vLLM worker
    reads ``--disaggregation-mode`` and a user-provided ``--kv-events-config`` from 1.0.0
    (``dynamo/vllm/backend_args.py``, ``args.py``); ``--router-mode least-loaded`` is a choice
    from 1.1.0 (1.0.0 lacks it)."""
    if deploy.policy.serving.routing == "least_loaded":
        return [Minimum("ai-dynamo", "1.1.0", "--router-mode least-loaded; 1.0.0 lacks it")]
    why = "--disaggregation-mode, a user-provided --kv-events-config"
    return [Minimum("ai-dynamo", "1.0.0", why)]
