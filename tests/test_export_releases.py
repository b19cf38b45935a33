"""Every export of every preset runs on the release it names, and deploys what was simulated.

For each preset (``policies/presets/*.toml``) and target, the exported scripts are run under
``/bin/sh`` with stand-ins for the serving commands (``tests/test_export_launch.py``), on
every host. Then:

* every flag, environment variable and configuration key that reaches a command or a file is
  one the pinned release reads (``kvtier/export/releases/*.json``, generated from the wheels
  by ``scripts/pin_releases.py``), per command: a Dynamo worker's flags are ``dynamo.vllm``'s
  and vLLM 0.31.0's, the frontend's ``dynamo.frontend``'s;
* the commands and files parse back into a deployment (instances, their hosts and GPUs, P/D
  roles, HBM and lower-tier bytes per process, shared or private caches) equal to the one
  kvtier simulated (``kvtier.deploy`` placement, the policy's pools);
* the capabilities each exporter declares agree with its notes: a policy inside them exports
  without an ``inexpressible`` note.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import yaml

from kvtier.export import TARGETS, deployment, export
from kvtier.export.capabilities import capabilities
from kvtier.export.common import NOTE_KINDS, Deployment, ExportResult
from kvtier.export.pd import role as pd_role
from kvtier.export.releases import PACKAGES, TARGET_RELEASES, release
from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import GB
from kvtier.policy.model import Policy
from kvtier.policy.presets import load_preset, preset_names
from kvtier.scenario import hardware_name, model_name
from tests.test_export_launch import Call, run, write

PRESETS = preset_names()
GIB = float(1 << 30)
# read by the CUDA driver, not by a package; the rest are the stand-ins' and the shell's own
CUDA_ENV = {"CUDA_VISIBLE_DEVICES"}
RUNNER_ENV = {"PATH", "RECORD", "MODEL", "HOST_INDEX", "PWD", "SHLVL", "_", "OLDPWD"}


def exported(name: str | Policy, target: str) -> tuple[ExportResult, Deployment]:
    """The export of a preset (by name) or of a policy, and the deployment it simulates."""
    policy = load_preset(name) if isinstance(name, str) else name
    hw = load_hardware(hardware_name(None, policy))
    mdl = load_model(model_name(None, policy))
    return export(policy, target, hw, mdl), deployment(policy, hw, mdl)


def run_everywhere(result: ExportResult, deploy: Deployment, tmp: Path) -> list[Call]:
    """Every call the exported scripts make, on every host (``HOST_INDEX``)."""
    out = write(result.files, tmp / "out")
    calls: list[Call] = []
    for name in sorted(result.files):
        if not name.endswith(".sh"):
            continue
        text = result.files[name]
        hosts = range(deploy.hosts) if "HOST_INDEX" in text else range(1)
        for host in hosts:
            done, made = run(out / name, tmp, HOST_INDEX=str(host))
            assert done.returncode == 0, (name, host, done.stderr)
            calls += made
    return calls


def flag_names(argv: list[str]) -> list[str]:
    return [w.split("=", 1)[0] for w in argv if w.startswith("--")]


def json_flag(call: Call, flag: str) -> dict | None:
    return json.loads(call.flag(flag)) if flag in call.argv else None


def connector_names(cfg: dict) -> list[str]:
    """The connectors of a ``--kv-transfer-config``, nested ones included."""
    names = [cfg["kv_connector"]]
    for child in cfg.get("kv_connector_extra_config", {}).get("connectors", []):
        names += connector_names(child)
    return names


def config_keys(cfg: dict) -> list[str]:
    keys = list(cfg)
    for child in cfg.get("kv_connector_extra_config", {}).get("connectors", []):
        keys += config_keys(child)
    return keys


def env_keys(text: str) -> list[str]:
    return [
        line.split("=", 1)[0]
        for line in text.splitlines()
        if line and not line.startswith("#") and "=" in line
    ]


@dataclass
class Emitted:
    """Names an export uses, by the list each must be in."""

    missing: list[str] = field(default_factory=list)

    def check(self, names: list[str], allowed: frozenset[str], what: str) -> None:
        self.missing += [f"{what} {n}" for n in names if n not in allowed]


def check_names(target: str, result: ExportResult, calls: list[Call]) -> list[str]:
    """The names ``result`` uses that its pinned releases do not read."""
    out = Emitted()
    files = result.files
    if target in ("vllm", "lmcache") and "lmcache.yaml" in files:
        lm = release("lmcache").config
        cfg = yaml.safe_load(files["lmcache.yaml"])
        out.check(list(cfg), lm["lmcache.yaml"], "lmcache.yaml key")
        out.check(list(cfg.get("extra_config", {})), lm["lmcache.yaml:extra_config"], "extra")
    if target == "vllm":
        vllm = release("vllm")
        env = vllm.env | release("lmcache").env | CUDA_ENV
        for call in calls:
            assert call.name == "vllm" and call.argv[0] == "serve"
            out.check(flag_names(call.argv), vllm.flags, "vllm serve flag")
            out.check(sorted(set(call.env) - RUNNER_ENV), env, "vLLM variable")
            cfg = json_flag(call, "--kv-transfer-config")
            if cfg is not None:
                out.check(config_keys(cfg), vllm.config["kv_transfer_config"], "transfer key")
                out.check(connector_names(cfg), vllm.config["kv_connector"], "connector")
    if target == "sglang":
        sglang = release("sglang")
        for call in calls:
            assert call.argv[:2] == ["-m", "sglang.launch_server"]
            out.check(flag_names(call.argv), sglang.flags, "sglang flag")
            out.check(sorted(set(call.env) - RUNNER_ENV), sglang.env | CUDA_ENV, "variable")
    if target == "dynamo":
        dyn, kvbm, engine = release("ai-dynamo"), release("kvbm"), release("vllm@dynamo")
        env = dyn.env | kvbm.env | engine.env | CUDA_ENV
        out.check(env_keys(files["kvbm.env"]), kvbm.env | dyn.env, "kvbm.env variable")
        for call in calls:
            module = call.argv[1]
            if module == "dynamo.frontend":
                allowed = dyn.flags_of("dynamo/frontend", "dynamo/common")
            else:
                assert module == "dynamo.vllm"
                allowed = dyn.flags_of("dynamo/vllm", "dynamo/common") | engine.flags
            out.check(flag_names(call.argv[2:]), allowed, f"{module} flag")
            out.check(sorted(set(call.env) - RUNNER_ENV), env, f"{module} variable")
            cfg = json_flag(call, "--kv-transfer-config")
            if cfg is not None:
                out.check(config_keys(cfg), engine.config["kv_transfer_config"], "transfer key")
                connectors = engine.config["kv_connector"] | kvbm.config["kv_connector"]
                out.check(connector_names(cfg), connectors, "connector")
            events = json_flag(call, "--kv-events-config")
            if events is not None:
                out.check(list(events), engine.config["kv_events_config"], "kv events key")
    if target == "mooncake" and files:
        mc = release("mooncake-transfer-engine")
        keys = mc.config["mooncake.json"]
        out.check(list(json.loads(files["mooncake.json"])), keys, "mooncake.json key")
        if "mooncake-store.env" in files:
            out.check(env_keys(files["mooncake-store.env"]), mc.env, "store variable")
        for call in calls:
            if call.name == "mooncake_master":
                master = mc.flags_of("mooncake/mooncake_master")
                out.check(flag_names(call.argv), master, "mooncake_master flag")
            else:
                assert call.argv[:2] == ["-m", "mooncake.mooncake_store_service"]
                service = mc.flags_of("mooncake/mooncake_store_service.py")
                out.check(flag_names(call.argv), service, "store service flag")
                defines = [w[2:].split("=", 1)[0] for w in call.argv if w.startswith("-D")]
                out.check(defines, keys, "-D key")
    return out.missing


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", PRESETS)
def test_every_emitted_name_is_read_by_the_pinned_release(name, target, tmp_path) -> None:
    result, deploy = exported(name, target)
    calls = run_everywhere(result, deploy, tmp_path)
    assert check_names(target, result, calls) == []
    # the export names the releases it is written for, and its notes the versions it needs
    packages = TARGET_RELEASES[target]
    for package in packages:
        assert f"{package.split('@')[0]} {PACKAGES[package]}" in result.release
    assert any("Minimum versions" in n and result.release in n for n in result.notes)
    assert all(n.kind in NOTE_KINDS for n in result.notes)


def test_the_lists_tell_a_removed_flag_from_a_current_one() -> None:
    # what the checks above rely on, read in the wheels: ai-dynamo 1.6.1's vLLM worker has
    # --disaggregation-mode and no --is-prefill-worker (only its mocker keeps one); vLLM
    # 0.31.0 takes --kv-events-config; nothing reads DYN_VLLM_KV_EVENT_PORT any more
    dyn = release("ai-dynamo")
    worker = dyn.flags_of("dynamo/vllm", "dynamo/common")
    assert "--disaggregation-mode" in worker and "--is-prefill-worker" not in worker
    assert "--is-prefill-worker" in dyn.flags_of("dynamo/mocker")
    assert "--kv-events-config" in release("vllm@dynamo").flags
    every_env = set().union(*(release(p).env for p in PACKAGES))
    assert "DYN_VLLM_KV_EVENT_PORT" not in every_env
    assert "MOONCAKE_LOCAL_HOSTNAME" in release("sglang").env
    assert "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE" in release("sglang").env
    assert "least-loaded" not in worker  # a value, not a flag: the frontend's choices have it


def test_a_name_no_release_reads_is_found(tmp_path) -> None:
    result, deploy = exported("dynamo-disagg", "dynamo")
    calls = run_everywhere(result, deploy, tmp_path)
    worker = next(c for c in calls if c.argv[1] == "dynamo.vllm")
    stale = Call(worker.name, [*worker.argv, "--is-prefill-worker"], {**worker.env})
    stale.env["DYN_VLLM_KV_EVENT_PORT"] = "20080"
    missing = check_names("dynamo", result, [stale])
    assert "dynamo.vllm flag --is-prefill-worker" in missing
    assert "dynamo.vllm variable DYN_VLLM_KV_EVENT_PORT" in missing


# --- round trip: the exported files as a deployment ----------------------------------------


@dataclass
class Proc:
    """One serving process read back from an export."""

    host: int
    gpus: tuple[int, ...]
    tp: int
    role: str
    hbm: float | None  # KV bytes in HBM
    hbm_unit: float  # its rounding step
    tiers: dict[str, float] = field(default_factory=dict)  # bytes this process holds
    shared: dict[str, bool] = field(default_factory=dict)  # one pool shared by processes
    unit: dict[str, float] = field(default_factory=dict)  # rounding step of each size
    ahead: bool | None = None  # the engine schedules one step ahead (async / overlap)
    full: bool | None = None  # vLLM admits a prompt only when all of it fits (None: not vLLM)


def nixl_role(cfg: dict | None) -> str:
    roles = {"kv_producer": "prefill", "kv_consumer": "decode"}
    if cfg is None:
        return "both"
    for child in [cfg, *cfg.get("kv_connector_extra_config", {}).get("connectors", [])]:
        nixl_or_lmcache = child["kv_connector"] in ("NixlConnector", "LMCacheConnectorV1")
        if nixl_or_lmcache and child["kv_role"] in roles:
            return roles[child["kv_role"]]
    return "both"


def gpus(call: Call) -> tuple[int, ...]:
    return tuple(int(g) for g in call.env["CUDA_VISIBLE_DEVICES"].split(","))


def host_of(call: Call) -> int:
    return int(call.env["HOST_INDEX"])


def lmcache_tiers(cfg: dict, ranks: int) -> tuple[dict[str, float], dict[str, float]]:
    tiers, unit = {}, {}
    if cfg.get("local_cpu"):
        tiers["dram"] = cfg["max_local_cpu_size"] * GIB * ranks
        unit["dram"] = 0.001 * GIB * ranks
    if "local_disk" in cfg:
        tiers["ssd"] = cfg["max_local_disk_size"] * GIB * ranks
        unit["ssd"] = 0.001 * GIB * ranks
    if "remote_url" in cfg:
        tiers["rdma"] = cfg["extra_config"]["mooncake_global_segment_size"] * ranks
        unit["rdma"] = ranks
    return tiers, unit


def vllm_ahead(call: Call) -> bool:
    """vLLM's async scheduling, stated either way (0.31 and 0.34 turn it on when unset)."""
    on, off = "--async-scheduling" in call.argv, "--no-async-scheduling" in call.argv
    assert on != off, "the export states the scheduling mode exactly once"
    return on


def vllm_full(call: Call) -> bool:
    """vLLM's whole-prompt admission gate, stated either way (on by default in 0.31 and 0.34)."""
    on = "--scheduler-reserve-full-isl" in call.argv
    off = "--no-scheduler-reserve-full-isl" in call.argv
    assert on != off, "the export states the admission gate exactly once"
    return on


def read_vllm(result: ExportResult, calls: list[Call]) -> list[Proc]:
    lm = yaml.safe_load(result.files["lmcache.yaml"]) if "lmcache.yaml" in result.files else {}
    procs = []
    for call in sorted(calls, key=lambda c: int(c.flag("--port"))):
        tp = int(call.flag("--tensor-parallel-size"))
        cfg = json_flag(call, "--kv-transfer-config")
        proc = Proc(
            host_of(call),
            gpus(call),
            tp,
            nixl_role(cfg),
            int(call.flag("--kv-cache-memory-bytes")) * tp,
            tp,
        )
        proc.ahead = vllm_ahead(call)
        proc.full = vllm_full(call)
        if cfg is not None and "LMCacheConnectorV1" in connector_names(cfg):
            proc.tiers, proc.unit = lmcache_tiers(lm, tp)
            proc.shared = {t: t == "rdma" for t in proc.tiers}
        procs.append(proc)
    return procs


def read_sglang(result: ExportResult, calls: list[Call], deploy: Deployment) -> list[Proc]:
    procs = []
    for call in sorted(calls, key=lambda c: int(c.flag("--port"))):
        tp = int(call.flag("--tp-size"))
        role = (
            call.flag("--disaggregation-mode") if "--disaggregation-mode" in call.argv else "both"
        )
        hbm = int(call.flag("--max-total-tokens")) * deploy.kv_bytes_per_token
        proc = Proc(host_of(call), gpus(call), tp, role, hbm, deploy.kv_bytes_per_token)
        # SGLang 0.5.23's overlap scheduler is on unless disabled
        proc.ahead = "--disable-overlap-schedule" not in call.argv
        if "--enable-hierarchical-cache" in call.argv:
            if "--hicache-size" in call.argv:
                proc.tiers["dram"] = int(call.flag("--hicache-size")) * GB * tp
                proc.unit["dram"] = GB * tp
            elif "--hicache-ratio" in call.argv:
                proc.tiers["dram"] = float(call.flag("--hicache-ratio")) * hbm
                proc.unit["dram"] = 0.001 * hbm
            backend = (
                call.flag("--hicache-storage-backend")
                if "--hicache-storage-backend" in (call.argv)
                else None
            )
            if backend == "file":
                proc.tiers["ssd"] = int(call.env["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"]) * tp
                proc.unit["ssd"] = tp
            if backend == "mooncake":
                proc.tiers["rdma"] = int(call.env["MOONCAKE_GLOBAL_SEGMENT_SIZE"]) * tp
                proc.unit["rdma"] = tp
            proc.shared = {t: t == "rdma" for t in proc.tiers}
        procs.append(proc)
    return procs


def read_dynamo(result: ExportResult, calls: list[Call]) -> list[Proc]:
    procs = []
    workers = [c for c in calls if c.argv[1] == "dynamo.vllm"]
    for call in sorted(workers, key=lambda c: (host_of(c), gpus(c))):
        tp = int(call.flag("--tensor-parallel-size"))
        role = (
            call.flag("--disaggregation-mode") if "--disaggregation-mode" in call.argv else "both"
        )
        cfg = json_flag(call, "--kv-transfer-config")
        assert nixl_role(cfg) == role  # NIXL's producer/consumer role matches the worker's
        hbm = int(call.flag("--kv-cache-memory-bytes")) * tp
        proc = Proc(host_of(call), gpus(call), tp, role, hbm, tp)
        proc.ahead = vllm_ahead(call)
        proc.full = vllm_full(call)
        if cfg is not None and "DynamoConnector" in connector_names(cfg):
            for var, tier in (("DYN_KVBM_CPU_CACHE_GB", "dram"), ("DYN_KVBM_DISK_CACHE_GB", "ssd")):
                if var in call.env:
                    proc.tiers[tier] = float(call.env[var]) * GB
                    proc.unit[tier] = 0.001 * GB
                    proc.shared[tier] = False
        procs.append(proc)
    dirs = [c.env["DYN_KVBM_DISK_CACHE_DIR"] for c in workers if "DYN_KVBM_DISK_CACHE_DIR" in c.env]
    assert len(dirs) == len(set(dirs)), "every KVBM worker has its own disk directory"
    return procs


def read_back(
    target: str, result: ExportResult, calls: list[Call], deploy: Deployment
) -> list[Proc]:
    """The serving processes ``target``'s export starts, read from their calls."""
    if target == "vllm":
        return read_vllm(result, calls)
    if target == "sglang":
        return read_sglang(result, calls, deploy)
    return read_dynamo(result, calls)


def expected(deploy: Deployment, k: int) -> tuple[int, tuple[int, ...], int, str]:
    lay = deploy.layout
    per_host = deploy.hardware.topology.gpus_per_host
    first = lay.first_gpu[k]
    tp = lay.tp_of(k)
    local = first % per_host
    return first // per_host, tuple(range(local, local + tp)), tp, pd_role(deploy, k)


def check_round_trip(target: str, result: ExportResult, deploy: Deployment, procs: list[Proc]):
    # instances, hosts, GPUs, tensor parallelism, roles: the simulator's layout
    assert len(procs) == deploy.instances
    placed = sorted((expected(deploy, k), k) for k in range(deploy.instances))
    got = sorted(((p.host, p.gpus, p.tp, p.role), p) for p in procs)
    assert [e for e, _ in placed] == [g for g, _ in got]
    # every engine schedules as the replay did (one step ahead, or in step)
    assert {p.ahead for p in procs} == {deploy.policy.serving.async_scheduling}
    # and every vLLM engine admits as the replay did (whole prompt, or first chunk)
    fulls = {p.full for p in procs} - {None}
    assert fulls <= {deploy.policy.serving.reserve_full_prompt}
    users = set(deploy.tier_users)
    for (_, k), (_, proc) in zip(placed, got, strict=True):
        # HBM KV bytes per process: what the simulator gives the instance
        assert proc.hbm == pytest.approx(deploy.hbm_kv_bytes_of(k), abs=proc.hbm_unit)
        if k not in users and result.expressible:
            assert proc.tiers == {}, "only the instances the simulator lets use tiers hold them"
    simulated = {t.name for t in deploy.policy.lower_tiers}
    caps = capabilities(target)
    if result.expressible:
        # every simulated tier is deployed on every instance that uses tiers
        for proc in (p for (_, k), (_, p) in zip(placed, got, strict=True) if k in users):
            assert set(proc.tiers) == simulated
    for tier in simulated:
        holders = [p for p in procs if tier in p.tiers]
        if not holders:
            continue
        assert all(p.shared[tier] == (tier in caps.shared_tiers) for p in holders)
        step = sum(p.unit[tier] for p in holders)
        if deploy.per_host[tier] and tier not in caps.shared_tiers:
            # private shares of each host's pool: they sum to the pool on the fullest hosts
            # and never exceed it
            sums: dict[int, float] = {}
            for p in holders:
                sums[p.host] = sums.get(p.host, 0.0) + p.tiers[tier]
            for total in sums.values():
                assert total <= deploy.pool_bytes[tier] + 1.0
            assert max(sums.values()) == pytest.approx(deploy.pool_bytes[tier], abs=step)
        else:
            # one pool: every process's segment adds up to the simulated pool
            total = sum(p.tiers[tier] for p in holders)
            assert total == pytest.approx(deploy.pool_bytes[tier], abs=step)


@pytest.mark.parametrize("target", ["vllm", "sglang", "dynamo"])
@pytest.mark.parametrize("name", PRESETS)
def test_the_export_deploys_what_was_simulated(name, target, tmp_path) -> None:
    result, deploy = exported(name, target)
    procs = read_back(target, result, run_everywhere(result, deploy, tmp_path), deploy)
    check_round_trip(target, result, deploy, procs)


def deployed_with(target: str, tmp_path, **serving) -> list[Proc]:  # noqa: ANN001
    """The processes of ``lmcache-cpu-disk`` with ``serving`` fields set, exported to
    ``target``, run everywhere and read back, the round trip checked."""
    policy = load_preset("lmcache-cpu-disk")
    policy = replace(policy, serving=replace(policy.serving, **serving))
    result, deploy = exported(policy, target)
    procs = read_back(target, result, run_everywhere(result, deploy, tmp_path), deploy)
    check_round_trip(target, result, deploy, procs)
    return procs


@pytest.mark.parametrize("ahead", [True, False])
@pytest.mark.parametrize("target", ["vllm", "sglang", "dynamo"])
def test_the_engines_schedule_as_the_replay_did(target, ahead, tmp_path) -> None:
    """A policy that schedules one step ahead deploys engines that do (vLLM's default,
    SGLang's overlap scheduler); one that schedules in step deploys engines told not to."""
    procs = deployed_with(target, tmp_path, async_scheduling=ahead)
    assert procs and all(p.ahead is ahead for p in procs)


@pytest.mark.parametrize("name", PRESETS)
def test_lmcache_and_mooncake_sizes_are_the_simulated_pools(name, tmp_path) -> None:
    result, deploy = exported(name, "lmcache")
    cfg = yaml.safe_load(result.files["lmcache.yaml"])
    tiers, unit = lmcache_tiers(cfg, deploy.tp)
    for tier, size in tiers.items():
        share = deploy.per_instance_bytes(tier)
        if tier == "rdma":
            share = deploy.pool_bytes["rdma"] / len(deploy.tier_users)
        assert size == pytest.approx(share, abs=unit[tier])
    result, deploy = exported(name, "mooncake")
    if not deploy.has("rdma"):
        assert result.files == {} and not result.expressible
        return
    client = json.loads(result.files["mooncake.json"])
    # one store pool over the hosts, each host's client a segment of it
    assert client["global_segment_size"] * deploy.hosts == pytest.approx(
        deploy.pool_bytes["rdma"], abs=deploy.hosts
    )
    if deploy.has("ssd"):
        text = result.files["mooncake-store.env"]
        env = dict(line.split("=", 1) for line in text.splitlines() if not line.startswith("#"))
        limit = int(shlex.split(env["MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"])[0])
        assert limit == pytest.approx(deploy.pool_bytes["ssd"], abs=1)


# --- capabilities and notes agree ------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", PRESETS)
def test_a_policy_inside_the_capabilities_exports_without_an_inexpressible_note(name, target):
    from dataclasses import replace

    from kvtier.policy.model import policy_from_dict, policy_to_dict

    policy = load_preset(name)
    # one GPU type for both roles: no exporter names a GPU type per role
    hw = replace(load_hardware(hardware_name(None, policy)), prefill_gpu=None)
    mdl = load_model(model_name(None, policy))
    caps = capabilities(target)
    if any(t not in hw.tiers for t in caps.need):
        return
    doc = policy_to_dict(policy)
    # the preset moved inside the target's capabilities: tiers it cannot place off, every
    # setting it restricts at its first value
    doc["tiers"] = [t for t in doc["tiers"] if t["name"] == "hbm" or t["name"] in caps.tiers]
    for t in doc["tiers"]:
        if t["name"] != "hbm":
            t["eviction"] = caps.evictions[0]
    for key, values in caps.allowed().items():
        section, _, leaf = key.rpartition(".")
        table = doc.setdefault(section, {}) if section else doc
        if table.get(leaf) not in values:
            table[leaf] = values[0]
    if not caps.pd:
        doc["serving"]["prefill_instances"] = 0
    if not caps.block.accepts(doc.get("block_tokens", 16)):
        doc["block_tokens"] = 16
    names = [t["name"] for t in doc["tiers"]]
    for tier, conditions in caps.requires.items():
        name_of = tier.split(".")[1]
        for cond, value in conditions:
            other = cond.split(".")[1]
            if name_of in names and (other in names) != value:
                doc["tiers"] = [t for t in doc["tiers"] if t["name"] != name_of]
                names.remove(name_of)
    for need in caps.need:
        if need not in names:
            doc["tiers"].append({"name": need})
    if caps.pd and doc["serving"].get("pd_connector") not in caps.pd_connectors:
        doc["serving"]["pd_connector"] = caps.pd_connectors[0]
    moved = policy_from_dict(doc, f"<{name} for {target}>")
    result = export(moved, target, hw, mdl)
    assert [n for n in result.notes if n.kind == "inexpressible"] == []


# --- --target narrows the search to what the targeted release accepts ------------------------


def test_target_vllm_never_searches_a_block_size_its_release_rejects(tmp_path) -> None:
    from kvtier.errors import InputError
    from kvtier.search.space import load_space, restrict_to_target

    text = (
        'format = "kvtier-space/1"\n'
        "[params.block_tokens]\nchoices = [8, 16, 24, 256]\n"
        '[params."tiers.dram.enabled"]\nchoices = [false, true]\n'
    )
    path = tmp_path / "s.toml"
    path.write_text(text)
    space = load_space(path)
    # vLLM 0.34.0's FlashAttention backend takes multiples of 16
    vllm = restrict_to_target(space, "vllm", ("dram",))
    assert next(p for p in vllm.params if p.name == "block_tokens").choices == (16, 256)
    # SGLang's --page-size takes any size
    sglang = restrict_to_target(space, "sglang", ("dram",))
    assert next(p for p in sglang.params if p.name == "block_tokens").choices == (8, 16, 24, 256)
    pinned = tmp_path / "pinned.toml"
    pinned.write_text(
        text.split("[params.block_tokens]")[0]
        + text.split("256]\n")[1]
        + "[pinned]\nblock_tokens = 24\n"
    )
    with pytest.raises(InputError, match=r"block_tokens = 24 cannot be expressed by vllm \(vllm"):
        restrict_to_target(load_space(pinned), "vllm", ())
    path.write_text(text.replace("[8, 16, 24, 256]", "[8, 24]"))
    with pytest.raises(InputError, match="takes no block size vllm"):
        restrict_to_target(load_space(path), "vllm", ("dram",))


def test_every_block_size_the_vllm_target_keeps_exports_without_a_block_note() -> None:
    from dataclasses import replace as with_

    from kvtier.search.space import load_space, restrict_to_target

    policy = load_preset("vllm-hbm")
    hw = load_hardware(hardware_name(None, policy))
    mdl = load_model(model_name(None, policy))
    space = restrict_to_target(load_space("default"), "vllm", tuple(hw.tiers))
    sizes = next(p for p in space.params if p.name == "block_tokens").choices
    assert 256 in sizes
    for tokens in sizes:
        result = export(with_(policy, block_tokens=tokens), "vllm", hw, mdl)
        assert result.expressible, [n for n in result.notes if n.kind == "inexpressible"]
    rejected = export(with_(policy, block_tokens=24), "vllm", hw, mdl)
    assert any(
        "--block-size 24 cannot be expressed" in n for n in rejected.of_kind("inexpressible")
    )


def test_notes_name_the_minimum_versions_read_in_older_wheels() -> None:
    from dataclasses import replace as with_

    from kvtier.policy.model import ServingPolicy

    def minimum(result: ExportResult) -> str:
        return next(n for n in result.notes if "Minimum versions" in n)

    result, _ = exported("lmcache-cpu-disk", "sglang")  # dram and ssd: the file backend
    assert "sglang 0.5.14 (SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE; 0.5.13 lacks it)" in minimum(
        result
    )
    assert "lmcache 0.5.0" in minimum(exported("mooncake-rdma", "lmcache")[0])
    policy = load_preset("dynamo-kvbm")
    hw, mdl = load_hardware(policy.hardware), load_model(policy.model)
    assert "ai-dynamo 1.0.0" in minimum(export(policy, "dynamo", hw, mdl))
    least = with_(policy, serving=ServingPolicy(routing="least_loaded"))
    assert "ai-dynamo 1.1.0 (--router-mode least-loaded" in minimum(
        export(least, "dynamo", hw, mdl)
    )
    assert "no older release was checked" in minimum(exported("mooncake-rdma", "mooncake")[0])


def test_the_file_backend_cap_is_written_only_for_a_release_that_reads_it(monkeypatch) -> None:
    from dataclasses import replace as with_

    import kvtier.export.sglang as sglang_export

    result, _ = exported("lmcache-cpu-disk", "sglang")
    assert "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE" in result.files["sglang-serve.sh"]
    pinned = release("sglang")
    older = with_(pinned, env=pinned.env - {"SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"})
    monkeypatch.setattr(sglang_export, "release", lambda name: older)
    result, _ = exported("lmcache-cpu-disk", "sglang")
    script = result.files["sglang-serve.sh"]
    assert "SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE" not in script
    assert "--hicache-storage-backend file" in script  # the tier is still the file backend
    assert "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR" in script
    assert any("grows without bound" in n for n in result.of_kind("inexpressible"))


@pytest.mark.parametrize("full", [True, False])
@pytest.mark.parametrize("target", ["vllm", "dynamo"])
def test_vllm_engines_admit_as_the_replay_did(target, full, tmp_path) -> None:
    """A policy replayed with vLLM's whole-prompt admission deploys engines told to use it (the
    releases' default); one replayed admitting on the first chunk deploys engines told not to."""
    procs = deployed_with(target, tmp_path, reserve_full_prompt=full)
    assert procs and all(p.full is full for p in procs)
