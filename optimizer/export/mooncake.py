"""Mooncake Store: the store-client JSON of each host contributing to the pool, and the master.

Written for mooncake-transfer-engine 0.3.13.post1: every key, flag and variable is in that
release's list (``kvtier/export/releases``: ``MooncakeConfig``'s keys, ``mooncake_master``'s
gflags, ``mooncake_store_service``'s flags, the ``MOONCAKE_*`` names of ``store.so``).

Keys and flags, read in Mooncake's repository (``kvcache-ai/Mooncake`` at 3b5a594,
v0.3.12.post1-245, 2026-08-22): ``mooncake-wheel/mooncake/mooncake_config.py``
(``MooncakeConfig.from_file``), ``docs/source/deployment/mooncake-store-deployment-guide.md``,
``docs/source/deployment/ssd/ssd-offload.md`` and ``docs/source/design/store/mooncake-store.md``:

* ``mooncake.json`` for ``python -m mooncake.mooncake_store_service --config=mooncake.json``:
  ``local_hostname``, ``metadata_server`` (``P2PHANDSHAKE`` needs no metadata service),
  ``master_server_address``, ``protocol`` (``rdma``), ``device_name``, ``global_segment_size``
  (bytes of DRAM a client contributes) <- the ``rdma`` pool spread over the hosts,
  ``local_buffer_size`` (bytes, 1 GiB default), and for an ``ssd`` tier ``enable_ssd_offload``
  and ``ssd_offload_path``.
* ``MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES`` (disk bytes per client, default 2 TB), read by the
  client's file storage <- the ``ssd`` tier per host.
* ``mooncake_master`` flags: ``--rpc_port`` (50051); ``--enable_offload=true`` (SSD persistence
  after each put, i.e. write-through) and ``--offload_on_evict=true`` (persist only what memory
  evicts, i.e. write-back).
* Eviction is "an approximate LRU policy" triggered at ``--eviction_high_watermark_ratio``
  (0.90 by default) freeing ``--eviction_ratio`` (0.05) of the objects at a time: the master
  gets the rdma tier's ``eviction_high_watermark`` and ``eviction_ratio`` (the batch eviction
  the replay models, kvtier.cache.watermark); the policy order is fixed.

Not exported: the ``cxl`` tier. The master can prefer a CXL device for new objects
(``--enable_cxl``, ``--cxl_path``, ``--cxl_size`` in bytes, ``--allocation_strategy=cxl``), which
makes CXL the pool rather than a tier below DRAM, so it is only named in the notes.
"""

from __future__ import annotations

import json
import shlex

from kvtier.export.capabilities import BlockSizes, Capabilities
from kvtier.export.common import (
    Deployment,
    ExportResult,
    approximate,
    env_file,
    inexpressible,
    info,
    shared_notes,
    shell_command,
)
from kvtier.policy.model import KV_DTYPES, KV_LAYOUTS, ROUTERS, Policy
from kvtier.policy.registries import CONNECTORS, SCHEDULERS

CLIENT_FILE = "mooncake.json"
CLIENT_ENV = "mooncake-store.env"
MASTER_FILE = "mooncake-master.sh"
STORE_FILE = "mooncake-store.sh"
MASTER_ADDRESS = "localhost:50051"  # the client's default when MOONCAKE_MASTER is unset
MASTER_PORT = 50051  # mooncake_master --rpc_port default
STORE_HTTP_PORT = 8080  # mooncake_store_service --port default (its REST API)
LOCAL_BUFFER = 1073741824  # MooncakeConfig's local_buffer_size default (1 GiB)
OFFLOAD_DIR = "/var/cache/mooncake-offload"
# mooncake_master's eviction defaults since PR #2871 (docs/sources.md [Mooncake-eviction])
DEFAULT_HIGH_WATERMARK = 0.90
DEFAULT_EVICTION_RATIO = 0.05

CAPABILITIES = Capabilities(
    target="mooncake",
    package="mooncake-transfer-engine",
    tiers=("rdma", "ssd"),  # the store's DRAM pool, persisted to each client's SSD
    routers=ROUTERS,  # the store serves whatever instance puts and gets
    schedulers=SCHEDULERS.names,
    write_policies=("write_through", "write_back"),  # --enable_offload, --offload_on_evict
    load_rules=("always_load",),
    evictions=("lru",),  # approximately LRU, fixed
    hierarchies=("inclusive",),
    kv_layouts=KV_LAYOUTS,
    kv_dtypes=KV_DTYPES,
    block_sizes={"0.3.13.post1": BlockSizes(1, source="objects of any size")},
    pd_connectors=CONNECTORS.names,  # the serving side's; the store is configured alike
    shared_tiers=("rdma", "ssd"),  # one pool over the hosts; each host's client offloads
    need=("rdma",),
)


def _client(deploy: Deployment) -> dict[str, object]:
    cfg: dict[str, object] = {
        "local_hostname": "localhost",
        "metadata_server": "P2PHANDSHAKE",
        "master_server_address": MASTER_ADDRESS,
        "protocol": "rdma",
        "device_name": "",
        "global_segment_size": int(deploy.per_host_bytes("rdma")),
        "local_buffer_size": LOCAL_BUFFER,
    }
    if deploy.has("ssd"):
        cfg["enable_ssd_offload"] = True
        cfg["ssd_offload_path"] = OFFLOAD_DIR
    return cfg


def _master(deploy: Deployment, notes: list[str]) -> list[str]:
    p = deploy.policy
    argv = ["mooncake_master", f"--rpc_port={MASTER_PORT}", *_eviction_flags(p, notes)]
    if deploy.has("ssd"):
        argv.append("--enable_offload=true")
        if p.write_policy == "write_back":
            argv.append("--offload_on_evict=true")
        if p.write_policy == "write_through_selective":
            notes.append(
                inexpressible(
                    "write_through_selective cannot be expressed for SSD offload: Mooncake "
                    "persists every object (--enable_offload) or every evicted one "
                    "(--offload_on_evict); exported as write-through."
                )
            )
        if p.hierarchy == "exclusive" and p.write_policy != "write_back":
            notes.append(
                approximate(
                    "hierarchy = exclusive: Mooncake keeps SSD copies of objects still in memory; "
                    "--offload_on_evict (write_back) is the closest, not exported here."
                )
            )
    return argv


def _eviction_flags(p: Policy, notes: list[str]) -> list[str]:
    """The master's batch eviction as the rdma tier sets it (``eviction_high_watermark``,
    ``eviction_ratio``: kvtier.cache.watermark); unset, the master's defaults evict where
    the simulation did not, which a note says."""
    rdma = p.tier("rdma")
    if rdma is None:
        return []
    if rdma.eviction_high_watermark is None:
        notes.append(
            approximate(
                "tiers.rdma sets no eviction_high_watermark: the replay filled the pool and "
                "evicted one block at a time, while the master evicts "
                f"{DEFAULT_EVICTION_RATIO:g} of its objects whenever more than "
                f"{DEFAULT_HIGH_WATERMARK:g} of the pool is used (its defaults); set "
                f"tiers.rdma.eviction_high_watermark = {DEFAULT_HIGH_WATERMARK:g} and "
                f"eviction_ratio = {DEFAULT_EVICTION_RATIO:g} to replay what it runs."
            )
        )
        return []
    return [
        f"--eviction_high_watermark_ratio={rdma.eviction_high_watermark:g}",
        f"--eviction_ratio={rdma.eviction_ratio or 0.0:g}",
    ]


def _store_script(with_env: bool) -> str:
    """The store client of one host: ``mooncake_store_service`` on ``mooncake.json`` beside the
    script, with this host's name and the master's address put in by ``-D`` (the service sets
    a config attribute from each ``-Dkey=value``)."""
    lines = [
        "#!/bin/sh",
        "# Mooncake store client exported by kvtier: run it once on every host of the pool, "
        "after the master (mooncake-master.sh).",
        "# LOCAL_HOSTNAME (default: uname -n) is the name other hosts reach this one by; "
        f"MOONCAKE_MASTER (default {MASTER_ADDRESS}) is the master's host:port.",
        'HERE=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd) || exit 1',
    ]
    if with_env:
        lines += ["set -a", f'. "$HERE"/{shlex.quote(CLIENT_ENV)}', "set +a"]
    lines += [
        'if [ -z "${LOCAL_HOSTNAME:-}" ]; then LOCAL_HOSTNAME=$(uname -n); fi',
        'if [ -z "${MOONCAKE_MASTER:-}" ]; then',
        f"  MOONCAKE_MASTER={shlex.quote(MASTER_ADDRESS)}",
        "fi",
        "exec python3 -m mooncake.mooncake_store_service \\",
        f'  --config "$HERE"/{shlex.quote(CLIENT_FILE)} \\',
        f"  --port {STORE_HTTP_PORT} \\",
        '  "-Dlocal_hostname=$LOCAL_HOSTNAME" \\',
        '  "-Dmaster_server_address=$MOONCAKE_MASTER"',
    ]
    return "\n".join(lines) + "\n"


def export_mooncake(deploy: Deployment) -> ExportResult:
    """Client JSON (one per host), its SSD variables, and the master command."""
    notes: list[str] = []
    p = deploy.policy
    if not deploy.has("rdma"):
        notes.append(
            info(
                "The policy has no rdma tier, so there is no Mooncake Store pool to configure; "
                "no files are written."
            )
        )
        if deploy.has("cxl"):
            notes.append(
                inexpressible(
                    "A cxl pool could be offered through the master's --enable_cxl, --cxl_size "
                    "(bytes) and --allocation_strategy=cxl; not exported (unverified semantics)."
                )
            )
        return ExportResult("mooncake", {}, [*shared_notes(deploy, "Mooncake"), *notes])
    files: dict[str, str] = {
        CLIENT_FILE: json.dumps(_client(deploy), indent=2) + "\n",
    }
    notes.append(
        info(
            f"Start mooncake-master.sh once (rpc port {MASTER_PORT}), then mooncake-store.sh on "
            f"each of the {deploy.hosts} host(s): each client contributes global_segment_size = "
            f"{deploy.per_host_bytes('rdma'):,.0f} bytes (the rdma pool over the hosts), takes "
            "this host's name from LOCAL_HOSTNAME (default uname -n) and the master from "
            f"MOONCAKE_MASTER (default {MASTER_ADDRESS}); device_name is a placeholder. The "
            "vllm/lmcache and sglang targets also let each serving rank contribute a segment: "
            "size the pool with these clients or with those, not both."
        )
    )
    if deploy.has("ssd"):
        env = {
            "MOONCAKE_OFFLOAD_FILE_STORAGE_PATH": OFFLOAD_DIR,
            "MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES": str(int(deploy.per_host_bytes("ssd"))),
        }
        comments = ["Mooncake store-client SSD offload, exported by kvtier; per host."]
        files[CLIENT_ENV] = env_file(env, comments)
        notes.append(info(f"ssd_offload_path is a placeholder ({OFFLOAD_DIR}): use the SSD."))
    files[STORE_FILE] = _store_script(deploy.has("ssd"))
    argv = _master(deploy, notes)
    master_comments = [
        "Mooncake master exported by kvtier: start it once, on one host, before the store "
        "clients (mooncake-store.sh) and the serving instances."
    ]
    files[MASTER_FILE] = shell_command({}, argv, master_comments)
    for t in p.lower_tiers:
        if t.name in ("rdma", "ssd") and t.eviction != "lru":
            notes.append(
                inexpressible(
                    f"{t.name} eviction = {t.eviction} cannot be expressed: Mooncake evicts "
                    "approximately least-recently-used objects."
                )
            )
    for name in ("dram", "cxl"):
        if deploy.has(name):
            notes.append(
                inexpressible(
                    f"The {name} tier is not Mooncake's: it is configured on the serving side "
                    "(see the vllm, lmcache or sglang targets)."
                )
            )
    notes.append(
        info(
            "Mooncake stores what its clients put: block size, write policy into the pool and "
            "the load rule are the serving side's (LMCache or SGLang)."
        )
    )
    from kvtier.export.pd import pd_notes

    notes += pd_notes(deploy, "Mooncake")
    return ExportResult("mooncake", files, [*shared_notes(deploy, "Mooncake"), *notes])
