"""``kvtier export``: every target parses, carries the policy's values in its own units, names
what it cannot express; the CLI's exit codes and one-line errors; random policies round-trip.

Expected sizes are recomputed here from the policy and the topology (instance ``k`` on host
``k * tp // gpus_per_host``), not taken from :class:`Deployment`, so a wrong split fails.
"""

from __future__ import annotations

import json
import math
import re
import shlex
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier import cli
from kvtier.cli import main
from kvtier.errors import InputError
from kvtier.export import TARGETS, deployment, export
from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import Hardware
from kvtier.policy.file import write_policy_file
from kvtier.policy.model import (
    EVICTIONS,
    HIERARCHIES,
    KV_DTYPES,
    KV_LAYOUTS,
    LOAD_RULES,
    LOAD_WAITS,
    ROUTERS,
    WRITE_POLICIES,
    Policy,
    ServingPolicy,
    TierPolicy,
)
from kvtier.policy.presets import load_preset, preset_names, preset_path

GIB = 2**30
MODEL = load_model("Llama-3.1-8B")
H100 = load_hardware("h100-node")  # dram, rdma, ssd
BELUGA = load_hardware("beluga-testbed")  # dram, cxl, rdma, ssd; two hosts


# --- parsing what the exporters write ------------------------------------------------------


# Control lines of the exported scripts (launch_script, shell_command, the store client):
# everything but variables, jobs and the exec'd command.
CONTROL_LINES = [
    re.escape('HERE=$(CDPATH= cd -- "$(dirname -- "$0")" && pwd) || exit 1'),
    re.escape('HOST_INDEX="${HOST_INDEX:-0}"'),
    re.escape('case "$HOST_INDEX" in'),
    r"  [0-9|]+\) ;;",
    r"  \*\) printf .* >&2; exit 2 ;;",
    "esac",
    "pids=",
    re.escape("trap 'kill $pids 2>/dev/null; exit 130' INT TERM"),
    r'if \[ "\$HOST_INDEX" = [0-9]+ \]; then',
    "fi",
    r"  printf '%s\\n' .* >&2",
    re.escape('  pids="$pids $!"'),
    "status=0",
    re.escape("for pid in $pids; do"),
    re.escape('  wait "$pid"'),
    re.escape("  rc=$?"),
    re.escape('  if [ "$status" -eq 0 ]; then status=$rc; fi'),
    "done",
    re.escape('exit "$status"'),
    "set -a",
    r"set \+a",
    r'\. "\$HERE"/[\w.-]+',
    re.escape('if [ -z "${LOCAL_HOSTNAME:-}" ]; then ') + ".*; fi",
]
CONTROL = re.compile("|".join(f"(?:{c})" for c in CONTROL_LINES))


def parse_jobs(text: str) -> list[tuple[dict[str, str], list[str]]]:
    """Each process an exported script starts: its variables (exported ones and those in front
    of it) and its words. Anything but known control lines fails the parse."""
    assert text.startswith("#!/bin/sh\n")
    exported: dict[str, str] = {}
    jobs: list[tuple[dict[str, str], list[str]]] = []
    joined = text.replace("\\\n", " ")
    guard = False  # a block refusing to start without a variable the user must set
    for line in joined.splitlines():
        if line.startswith("if [ -z ") and not line.endswith("; fi"):
            guard = True
        elif guard:
            guard = line != "fi"
        elif line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            exported[key] = shlex.split(value)[0] if value else ""
        elif line.startswith("exec "):
            jobs.append(({}, shlex.split(line[len("exec ") :])))
        elif line.startswith("  ") and line.endswith(" &"):
            words = shlex.split(line[:-2])
            own = {}
            while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
                key, _, value = words.pop(0).partition("=")
                own[key] = value
            jobs.append((own, words))
        else:
            assert line.startswith("#") or not line.strip() or CONTROL.fullmatch(line), line
    assert jobs
    return [({**exported, **own}, words) for own, words in jobs]


def parse_sh(text: str) -> tuple[dict[str, str], list[str]]:
    """The variables and words of an exported script's first serving process (instance 0)."""
    jobs = [j for j in parse_jobs(text) if "dynamo.frontend" not in j[1]]
    env, command = jobs[0]
    return env, command


def flags(command: list[str]) -> dict[str, str | bool]:
    """``--flag value`` pairs and bare ``--flag`` switches of a command."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(command):
        word = command[i]
        if word.startswith("--"):
            nxt = command[i + 1] if i + 1 < len(command) else None
            if "=" in word:
                key, _, value = word.partition("=")
                out[key] = value
            elif nxt is not None and not nxt.startswith("--"):
                out[word] = nxt
                i += 1
            else:
                out[word] = True
        i += 1
    return out


def parse_env(text: str) -> dict[str, str]:
    env = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def parse_file(name: str, text: str) -> object:
    if name.endswith(".yaml"):
        return yaml.safe_load(text)
    if name.endswith(".json"):
        return json.loads(text)
    if name.endswith(".sh"):
        return parse_sh(text)
    if name.endswith(".env"):
        return parse_env(text)
    raise AssertionError(f"unexpected file {name}")


# --- building policies and hardware ---------------------------------------------------------


def with_tp(hw: Hardware, tp: int) -> Hardware:
    return replace(hw, topology=replace(hw.topology, tp=tp))


def policy(*tiers: TierPolicy, **kw: object) -> Policy:
    serving = kw.pop("serving", ServingPolicy())
    return Policy(tiers=(TierPolicy(), *tiers), serving=serving, **kw)  # type: ignore[arg-type]


def placement(hw: Hardware, p: Policy) -> tuple[int, int, int]:
    """(instances, instances on the fullest host, hosts), computed independently."""
    topo = hw.topology
    n = p.serving.instances or topo.gpus // topo.tp
    counts = Counter(k * topo.tp // topo.gpus_per_host for k in range(n))
    return n, max(counts.values()), len(counts)


def pool_bytes(hw: Hardware, p: Policy, name: str) -> float:
    tier = p.tier(name)
    assert tier is not None
    return tier.capacity_gb * 1e9 if tier.capacity_gb is not None else hw.tiers[name].capacity_bytes


def notes_text(result: object) -> str:
    return "\n".join(result.notes)  # type: ignore[attr-defined]


# --- every preset, every target ---------------------------------------------------------------


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", preset_names())
def test_every_preset_exports_and_parses(name: str, target: str) -> None:
    p = load_preset(name)
    result = export(p, target, load_hardware(p.hardware), load_model(p.model))
    assert result.target == target
    for file_name, text in result.files.items():
        parse_file(file_name, text)
    assert result.notes, "every export says what it assumes"
    for note in result.notes:
        assert note and "\n" not in note


def test_cli_targets_are_the_exporters() -> None:
    assert cli.EXPORT_TARGETS == TARGETS


# --- vLLM ---------------------------------------------------------------------------------


def vllm_command(p: Policy, hw: Hardware = H100) -> tuple[dict, dict, object]:
    result = export(p, "vllm", hw, MODEL)
    env, command = parse_sh(result.files["vllm-serve.sh"])
    assert command[:2] == ["vllm", "serve"] and command[2] == "$MODEL"
    return env, flags(command), result


def test_vllm_flags_carry_the_policy() -> None:
    p = policy(
        block_tokens=32,
        kv_dtype="fp8",
        serving=ServingPolicy(max_num_batched_tokens=4096, max_num_seqs=64),
    )
    env, f, result = vllm_command(p, with_tp(H100, 2))
    assert f["--block-size"] == "32"
    assert f["--enable-prefix-caching"] is True
    assert f["--max-num-batched-tokens"] == "4096" and f["--max-num-seqs"] == "64"
    assert f["--kv-cache-dtype"] == "fp8"
    assert f["--tensor-parallel-size"] == "2"
    # vLLM 0.34 sizes the KV cache from measured memory unless told its bytes per GPU
    assert "--gpu-memory-utilization" not in f
    simulated = deployment(p, with_tp(H100, 2), MODEL).hbm_kv_bytes
    assert int(f["--kv-cache-memory-bytes"]) == int(simulated / 2)
    assert "--kv-transfer-config" not in f and "lmcache.yaml" not in result.files
    assert env == {"CUDA_VISIBLE_DEVICES": "0,1"} and f["--port"] == "8000"


@pytest.mark.parametrize("dtype,flag", [("bf16", "auto"), ("int4", "int4_per_token_head")])
def test_vllm_kv_dtype(dtype: str, flag: str) -> None:
    _, f, result = vllm_command(policy(kv_dtype=dtype))
    assert f["--kv-cache-dtype"] == flag
    assert f"kv_dtype = {dtype}" in notes_text(result)


def test_vllm_older_sliding_window_admission_is_a_note() -> None:
    # no vLLM 0.34.0 flag sets the sliding-window group's admission cap: a policy replayed
    # with an older release's rule says the deployment admits as 0.34.0 does
    oss = load_model("gpt-oss-120b")
    older = policy(serving=ServingPolicy(swa_admission_cap="one_batch"))

    def notes(p: Policy, model: object) -> str:
        return notes_text(export(p, "vllm", H100, model))

    assert "swa_admission_cap" not in notes(policy(), oss)
    assert "serving.swa_admission_cap = one_batch" in notes(older, oss)
    # a model without sliding-window layers is admitted alike by every release
    assert "swa_admission_cap" not in notes(older, MODEL)


def test_vllm_explicit_hbm_is_bytes_per_gpu() -> None:
    p = Policy(tiers=(TierPolicy(capacity_gb=40.0),))
    _, f, _ = vllm_command(p, with_tp(H100, 4))
    assert int(f["--kv-cache-memory-bytes"]) == 10_000_000_000
    assert "--gpu-memory-utilization" not in f


def test_vllm_lower_tiers_go_through_lmcache() -> None:
    p = policy(TierPolicy(name="dram", capacity_gb=800.0))
    env, f, result = vllm_command(p)
    assert json.loads(f["--kv-transfer-config"]) == {
        "kv_connector": "LMCacheConnectorV1",
        "kv_role": "kv_both",
    }
    assert env["LMCACHE_CONFIG_FILE"] == "$HERE/lmcache.yaml"  # the script's directory
    cfg = yaml.safe_load(result.files["lmcache.yaml"])
    assert cfg["local_cpu"] is True and cfg["max_local_cpu_size"] == pytest.approx(93.132, abs=1e-3)
    assert "--kv-offloading-size" in notes_text(result)  # DRAM only: vLLM's own offloading
    _, _, result = vllm_command(policy(TierPolicy(name="dram"), TierPolicy(name="ssd")))
    assert "--kv-offloading-size" not in notes_text(result)


def test_vllm_cxl_only_has_no_connector() -> None:
    p = load_preset("beluga-cxl")
    _, f, result = vllm_command(p, BELUGA)
    assert "--kv-transfer-config" not in f and "lmcache.yaml" not in result.files
    assert "cxl tier cannot be expressed" in notes_text(result)


# --- LMCache ------------------------------------------------------------------------------


def lmcache_cfg(p: Policy, hw: Hardware = H100) -> tuple[dict, object]:
    result = export(p, "lmcache", hw, MODEL)
    return yaml.safe_load(result.files["lmcache.yaml"]), result


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_lmcache_sizes_are_gib_per_rank(tp: int) -> None:
    hw = with_tp(H100, tp)
    p = policy(
        TierPolicy(name="dram", capacity_gb=640.0),
        TierPolicy(name="ssd", capacity_gb=3200.0),
        block_tokens=128,
    )
    cfg, _ = lmcache_cfg(p, hw)
    per_host = 8 // tp  # instances on the host
    assert cfg["chunk_size"] == 128
    assert cfg["max_local_cpu_size"] * GIB * tp * per_host == pytest.approx(640e9, rel=1e-4)
    assert cfg["max_local_disk_size"] * GIB * tp * per_host == pytest.approx(3200e9, rel=1e-4)
    assert cfg["local_disk"].startswith("file://")


@pytest.mark.parametrize(
    "eviction,policy_name", [("lru", "LRU"), ("lfu", "LFU"), ("fifo", "FIFO"), ("sieve", "LRU")]
)
def test_lmcache_cache_policy(eviction: str, policy_name: str) -> None:
    cfg, result = lmcache_cfg(policy(TierPolicy(name="dram", eviction=eviction)))
    assert cfg["cache_policy"] == policy_name
    assert (f"eviction = {eviction} has no LMCache" in notes_text(result)) == (eviction == "sieve")


def test_lmcache_cannot_express_many_things() -> None:
    p = policy(
        TierPolicy(name="dram", eviction="lfu"),
        TierPolicy(name="cxl"),
        TierPolicy(name="rdma", eviction="fifo"),
        TierPolicy(name="ssd", eviction="lru"),
        write_policy="write_back",
        hierarchy="exclusive",
        load_rule="cost_aware",
        coalesce=4,
    )
    cfg, result = lmcache_cfg(p, BELUGA)
    text = notes_text(result)
    for phrase in (
        "write_policy = write_back",
        "hierarchy = exclusive",
        "load_rule = cost_aware",
        "coalesce = 4",
        "cxl tier is not exported",
        "rdma eviction = fifo",
        "one cache_policy for CPU and disk",
    ):
        assert phrase in text, phrase
    assert cfg["cache_policy"] == "LFU"  # the dram tier's
    assert cfg["remote_url"].startswith("mooncakestore://")
    n, _, _ = placement(BELUGA, p)
    assert cfg["extra_config"]["mooncake_global_segment_size"] * n == pytest.approx(
        BELUGA.tiers["rdma"].capacity_bytes, abs=n
    )


def test_lmcache_layout() -> None:
    assert lmcache_cfg(policy(TierPolicy(name="dram")))[0]["use_layerwise"] is True
    contiguous = lmcache_cfg(policy(TierPolicy(name="dram"), kv_layout="contiguous"))[0]
    assert "use_layerwise" not in contiguous


@pytest.mark.parametrize("wait,asynchronous", [("request", True), ("batch", False)])
def test_lmcache_load_wait_is_async_loading(wait: str, asynchronous: bool) -> None:
    cfg, result = lmcache_cfg(policy(TierPolicy(name="dram"), load_wait=wait))
    assert cfg["enable_async_loading"] is asynchronous
    assert ("enable_async_loading = true" in notes_text(result)) == asynchronous
    assert "enable_async_loading" not in lmcache_cfg(policy(load_wait=wait))[0]  # no loads


@pytest.mark.parametrize("target", ["sglang", "dynamo", "mooncake"])
def test_load_wait_batch_is_noted_where_it_cannot_be_set(target: str) -> None:
    tiers = (TierPolicy(name="rdma"),) if target == "mooncake" else (TierPolicy(name="dram"),)
    hw = BELUGA if target == "mooncake" else H100
    batch = notes_text(export(policy(*tiers, load_wait="batch"), target, hw, MODEL))
    request = notes_text(export(policy(*tiers), target, hw, MODEL))
    assert "load_wait = batch" in batch
    assert "load_wait" not in request


# --- SGLang -------------------------------------------------------------------------------


def sglang_command(p: Policy, hw: Hardware = H100) -> tuple[dict, dict, object]:
    result = export(p, "sglang", hw, MODEL)
    env, command = parse_sh(result.files["sglang-serve.sh"])
    assert command[:3] == ["python3", "-m", "sglang.launch_server"]
    return env, flags(command), result


@pytest.mark.parametrize("write_policy", WRITE_POLICIES)
def test_sglang_hicache_flags(write_policy: str) -> None:
    p = policy(
        TierPolicy(name="dram", capacity_gb=500.0),
        block_tokens=64,
        write_policy=write_policy,
        kv_layout="contiguous",
        serving=ServingPolicy(max_num_batched_tokens=2048, max_num_seqs=32),
    )
    env, f, _ = sglang_command(p, with_tp(H100, 2))
    assert f["--page-size"] == "64" and f["--tp-size"] == "2"
    assert f["--enable-hierarchical-cache"] is True
    assert f["--hicache-write-policy"] == write_policy
    assert f["--hicache-mem-layout"] == "page_first"
    assert f["--hicache-size"] == str(math.floor(500e9 / 4 / 2 / 1e9))  # 4 instances, tp 2
    assert f["--chunked-prefill-size"] == "2048" and f["--max-running-requests"] == "32"
    assert f["--kv-cache-dtype"] == "bf16" and f["--radix-eviction-policy"] == "lru"
    assert "--hicache-storage-backend" not in f and env == {"CUDA_VISIBLE_DEVICES": "0,1"}


def test_sglang_small_dram_uses_a_ratio_and_int4_is_left_out() -> None:
    p = policy(TierPolicy(name="dram", capacity_gb=4.0), kv_dtype="int4", selective_k=3)
    _, f, result = sglang_command(p)
    assert "--hicache-size" not in f and float(f["--hicache-ratio"]) > 0
    assert "--kv-cache-dtype" not in f
    text = notes_text(result)
    assert "kv_dtype = int4" in text and "larger than the device pool" in text


def test_sglang_explicit_hbm_is_tokens() -> None:
    p = Policy(tiers=(TierPolicy(capacity_gb=30.0),), kv_dtype="fp8")
    _, f, _ = sglang_command(p)
    assert f["--max-total-tokens"] == str(30_000_000_000 // (MODEL.kv_bytes_per_token("fp8")))
    assert f["--kv-cache-dtype"] == "fp8_e4m3"
    assert "--enable-hierarchical-cache" not in f


def test_sglang_pool_is_the_one_replayed_not_the_default_shares() -> None:
    """SGLang sizes its pool as the smaller of --max-total-tokens and what its memory fraction
    leaves; its default fraction is below the share kvtier's budget comes from, so the export
    passes that share and the modelled pool decides."""
    from kvtier.deploy.kv_budget import kv_budget

    p = Policy(kv_dtype="fp8")
    _, f, result = sglang_command(p)
    assert f["--mem-fraction-static"] == f"{H100.gpu_memory_utilization:g}"
    budget = kv_budget(H100, MODEL, p, 1).kv_bytes
    assert f["--max-total-tokens"] == str(int(budget // MODEL.kv_bytes_per_token("fp8")))
    assert "default share is smaller" in notes_text(result)
    # the share's own pool (the share less the weights) holds the modelled one
    share_pool = H100.gpu_memory_utilization * H100.gpu.engine_hbm_bytes - MODEL.weight_bytes
    assert share_pool >= budget


def test_sglang_selective_threshold_and_evictions() -> None:
    p = policy(
        TierPolicy(name="dram", eviction="s3fifo"),
        write_policy="write_through_selective",
        selective_k=5,
        hierarchy="exclusive",
    )
    _, f, result = sglang_command(p)
    text = notes_text(result)
    assert "selective_k = 5" in text and "dram eviction = s3fifo" in text
    assert "hierarchy = exclusive" in text and f["--hicache-mem-layout"] == "layer_first"


def test_sglang_storage_backends() -> None:
    p = policy(TierPolicy(name="dram"), TierPolicy(name="rdma", capacity_gb=1000.0))
    env, f, result = sglang_command(p, with_tp(H100, 2))
    assert f["--hicache-storage-backend"] == "mooncake"
    assert int(env["MOONCAKE_GLOBAL_SEGMENT_SIZE"]) * 4 * 2 == pytest.approx(1000e9, abs=8)
    assert env["MOONCAKE_PROTOCOL"] == "rdma" and f["--hicache-mem-layout"] == "page_first"
    assert "page_first" in notes_text(result)
    env, f, result = sglang_command(policy(TierPolicy(name="ssd")))
    assert f["--hicache-storage-backend"] == "file"
    assert "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR" in env
    assert "no dram tier" in notes_text(result)
    # the default connector loads at admission: no SGLang policy does, said so
    assert "--hicache-storage-prefetch-policy" not in f
    assert "loading at the request's admission" in notes_text(result)
    ssd = TierPolicy(name="ssd", connector="sglang-hicache-file")
    _, f, result = sglang_command(policy(TierPolicy(name="dram"), ssd))
    assert f["--hicache-storage-prefetch-policy"] == "wait_complete"
    assert "loading at the request's admission" not in notes_text(result)
    # Mooncake read by the prefetch at arrival (sglang-hicache-mooncake): wait_complete too
    rdma = TierPolicy(name="rdma", capacity_gb=1000.0, connector="sglang-hicache-mooncake")
    _, f, result = sglang_command(policy(TierPolicy(name="dram"), rdma))
    assert f["--hicache-storage-backend"] == "mooncake"
    assert f["--hicache-storage-prefetch-policy"] == "wait_complete"
    assert "older SGLang" not in notes_text(result)
    # an older release's prefetch rules, exported to the current release: said so
    old = TierPolicy(name="rdma", capacity_gb=1000.0, connector="sglang-0.5.10-hicache-mooncake")
    _, f, result = sglang_command(policy(TierPolicy(name="dram"), old))
    assert f["--hicache-storage-prefetch-policy"] == "wait_complete"
    assert "an older SGLang's storage prefetch" in notes_text(result)
    _, f, _ = sglang_command(policy(TierPolicy(name="dram"), TierPolicy(name="rdma")))
    assert "--hicache-storage-prefetch-policy" not in f


# --- Dynamo -------------------------------------------------------------------------------


def dynamo_files(p: Policy, hw: Hardware = H100) -> tuple[dict, dict, dict, object]:
    result = export(p, "dynamo", hw, MODEL)
    env = parse_env(result.files["kvbm.env"])
    worker_env, command = parse_sh(result.files["dynamo-serve.sh"])
    assert command[:3] == ["python3", "-m", "dynamo.vllm"]
    return env, worker_env, flags(command), result


@pytest.mark.parametrize("tp", [1, 2])
def test_dynamo_sizes_are_gb_per_instance(tp: int) -> None:
    p = policy(
        TierPolicy(name="dram", capacity_gb=800.0),
        TierPolicy(name="ssd", capacity_gb=4000.0),
        serving=ServingPolicy(routing="prefix_affinity"),
    )
    env, worker_env, f, _ = dynamo_files(p, with_tp(H100, tp))
    per_host = 8 // tp
    assert float(env["DYN_KVBM_CPU_CACHE_GB"]) * per_host == pytest.approx(800.0, rel=1e-4)
    assert float(env["DYN_KVBM_DISK_CACHE_GB"]) * per_host == pytest.approx(4000.0, rel=1e-4)
    assert env["DYN_KVBM_DISABLE_DISK_OFFLOAD_FILTER"] == "true"
    assert env["DYN_ROUTER_MODE"] == "kv"
    assert worker_env["DYN_KVBM_CPU_CACHE_GB"] == env["DYN_KVBM_CPU_CACHE_GB"]
    connector = json.loads(f["--kv-transfer-config"])
    assert connector["kv_connector"] == "DynamoConnector" and connector["kv_role"] == "kv_both"
    assert f["--tensor-parallel-size"] == str(tp)


def test_dynamo_write_policies_and_routing() -> None:
    selective = policy(TierPolicy(name="ssd"), write_policy="write_through_selective")
    env, *_ = dynamo_files(selective)
    assert "DYN_KVBM_DISABLE_DISK_OFFLOAD_FILTER" not in env  # KVBM's frequency >= 2 filter
    p = policy(
        TierPolicy(name="dram", eviction="gdsf"),
        TierPolicy(name="rdma"),
        write_policy="write_back",
        serving=ServingPolicy(routing="least_loaded"),
    )
    env, _, _, result = dynamo_files(p)
    text = notes_text(result)
    assert env["DYN_ROUTER_MODE"] == "least-loaded"  # ai-dynamo 1.6.1's --router-mode has it
    assert "write_back" in text and "dram eviction = gdsf" in text and "rdma tier" in text
    env, _, f, result = dynamo_files(policy(TierPolicy(name="rdma")))
    assert "--kv-transfer-config" not in f and "DynamoConnector" in notes_text(result)


# --- Mooncake -----------------------------------------------------------------------------


def test_mooncake_pool_and_ssd_offload() -> None:
    p = policy(
        TierPolicy(name="rdma", capacity_gb=2000.0),
        TierPolicy(name="ssd", capacity_gb=7000.0),
        write_policy="write_back",
    )
    result = export(p, "mooncake", BELUGA, MODEL)
    client = json.loads(result.files["mooncake.json"])
    assert client["protocol"] == "rdma" and client["enable_ssd_offload"] is True
    assert client["global_segment_size"] * 2 == pytest.approx(2000e9, abs=2)  # two hosts
    env = parse_env(result.files["mooncake-store.env"])
    assert int(env["MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"]) == 7_000_000_000_000
    _, command = parse_sh(result.files["mooncake-master.sh"])
    f = flags(command)
    assert f["--enable_offload"] == "true" and f["--offload_on_evict"] == "true"


def test_mooncake_master_evicts_as_the_replay_did() -> None:
    """The rdma tier's batch eviction reaches the master's flags; without one a note says
    the master's defaults evict where the replay did not."""
    p = policy(TierPolicy(name="rdma", eviction_high_watermark=0.95, eviction_ratio=0.05))
    _, command = parse_sh(export(p, "mooncake", BELUGA, MODEL).files["mooncake-master.sh"])
    f = flags(command)
    assert f["--eviction_high_watermark_ratio"] == "0.95" and f["--eviction_ratio"] == "0.05"
    p = policy(TierPolicy(name="rdma", eviction_high_watermark=0.8))
    f = flags(parse_sh(export(p, "mooncake", BELUGA, MODEL).files["mooncake-master.sh"])[1])
    assert f["--eviction_high_watermark_ratio"] == "0.8" and f["--eviction_ratio"] == "0"
    result = export(policy(TierPolicy(name="rdma")), "mooncake", BELUGA, MODEL)
    assert "--eviction" not in result.files["mooncake-master.sh"]
    assert "sets no eviction_high_watermark" in notes_text(result)
    preset = export(load_preset("mooncake-rdma"), "mooncake", BELUGA, MODEL)
    f = flags(parse_sh(preset.files["mooncake-master.sh"])[1])
    assert f["--eviction_high_watermark_ratio"] == "0.9" and f["--eviction_ratio"] == "0.05"
    assert "eviction_high_watermark" not in notes_text(preset)


def test_mooncake_without_a_pool_writes_nothing() -> None:
    result = export(policy(TierPolicy(name="dram")), "mooncake", H100, MODEL)
    assert result.files == {} and "no rdma tier" in notes_text(result)
    result = export(policy(TierPolicy(name="rdma", eviction="lfu")), "mooncake", H100, MODEL)
    assert "rdma eviction = lfu" in notes_text(result)


def test_too_many_instances_is_input_error() -> None:
    p = policy(serving=ServingPolicy(instances=9))
    with pytest.raises(InputError, match="9 instances"):
        export(p, "vllm", H100, MODEL)
    with pytest.raises(InputError, match="tiers.cxl"):
        export(policy(TierPolicy(name="cxl")), "lmcache", H100, MODEL)


# --- random policies ------------------------------------------------------------------------


@st.composite
def deployments(draw: st.DrawFn) -> tuple[Policy, Hardware]:
    hw = with_tp(draw(st.sampled_from([H100, BELUGA])), draw(st.sampled_from([1, 2, 4])))
    names = [n for n in ("dram", "cxl", "rdma", "ssd") if n in hw.tiers and draw(st.booleans())]
    tiers = tuple(
        TierPolicy(
            name=n,
            eviction=draw(st.sampled_from(EVICTIONS)),
            capacity_gb=draw(st.one_of(st.none(), st.floats(0.5, 50_000.0))),
        )
        for n in draw(st.permutations(names))
    )
    max_instances = hw.topology.max_instances
    p = Policy(
        block_tokens=draw(st.sampled_from([1, 16, 64, 256, 1000])),
        kv_dtype=draw(st.sampled_from(KV_DTYPES)),
        serving=ServingPolicy(
            instances=draw(st.one_of(st.none(), st.integers(1, max_instances))),
            routing=draw(st.sampled_from(ROUTERS)),
            max_num_batched_tokens=draw(st.integers(1, 1 << 16)),
            max_num_seqs=draw(st.integers(1, 4096)),
        ),
        tiers=(TierPolicy(capacity_gb=draw(st.one_of(st.none(), st.floats(1.0, 80.0)))), *tiers),
        write_policy=draw(st.sampled_from(WRITE_POLICIES)),
        selective_k=draw(st.integers(1, 5)),
        hierarchy=draw(st.sampled_from(HIERARCHIES)),
        load_rule=draw(st.sampled_from(LOAD_RULES)),
        load_wait=draw(st.sampled_from(LOAD_WAITS)),
        kv_layout=draw(st.sampled_from(KV_LAYOUTS)),
        coalesce=draw(st.integers(1, 8)),
        share_across_tenants=draw(st.booleans()),
    )
    return p, hw


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(deployments())
def test_random_policies_export_and_sizes_round_trip(case: tuple[Policy, Hardware]) -> None:
    p, hw = case
    n, per_host, hosts = placement(hw, p)
    tp = hw.topology.tp
    results = {t: export(p, t, hw, MODEL) for t in TARGETS}
    for result in results.values():
        for name, text in result.files.items():
            parse_file(name, text)
        assert all(note and "\n" not in note for note in result.notes)

    def per_instance(name: str) -> float:
        shared = not hw.tiers[name].per_host
        return pool_bytes(hw, p, name) / (n if shared else per_host)

    if "lmcache.yaml" in results["vllm"].files:
        assert results["vllm"].files["lmcache.yaml"] == results["lmcache"].files["lmcache.yaml"]
    cfg = yaml.safe_load(results["lmcache"].files["lmcache.yaml"])
    assert cfg["chunk_size"] == p.block_tokens
    for tier, key in (("dram", "max_local_cpu_size"), ("ssd", "max_local_disk_size")):
        if p.tier(tier) is not None:
            exact = per_instance(tier) / tp / GIB
            assert exact - 1e-3 <= cfg[key] <= exact + 1e-9
    if p.tier("rdma") is not None:
        segment = cfg["extra_config"]["mooncake_global_segment_size"]
        assert abs(segment * n * tp - pool_bytes(hw, p, "rdma")) <= n * tp
    env, command = parse_sh(results["sglang"].files["sglang-serve.sh"])
    f = flags(command)
    assert f["--page-size"] == str(p.block_tokens)
    if p.tier("dram") is not None:
        exact = per_instance("dram") / tp / 1e9
        if exact >= 1:
            assert f["--hicache-size"] == str(math.floor(exact))
        else:
            assert "--hicache-size" not in f and "--hicache-ratio" in f
    if p.lower_tiers:
        assert f["--hicache-write-policy"] == p.write_policy
    kvbm = parse_env(results["dynamo"].files["kvbm.env"])
    for tier, key in (("dram", "DYN_KVBM_CPU_CACHE_GB"), ("ssd", "DYN_KVBM_DISK_CACHE_GB")):
        if p.tier(tier) is not None:
            exact = per_instance(tier) / 1e9
            assert exact - 1e-3 <= float(kvbm[key]) <= exact + 1e-9
    mooncake = results["mooncake"]
    if p.tier("rdma") is None:
        assert mooncake.files == {}
    else:
        client = json.loads(mooncake.files["mooncake.json"])
        assert abs(client["global_segment_size"] * hosts - pool_bytes(hw, p, "rdma")) <= hosts
    _, command = parse_sh(results["vllm"].files["vllm-serve.sh"])
    assert flags(command)["--block-size"] == str(p.block_tokens)
    if p.load_rule == "cost_aware":
        assert all("load_rule = cost_aware" in notes_text(r) for r in results.values())
    if p.lower_tiers and "lmcache.yaml" in results["lmcache"].files:
        lm = yaml.safe_load(results["lmcache"].files["lmcache.yaml"])
        assert lm["enable_async_loading"] is (p.load_wait == "request")


# --- the command line ---------------------------------------------------------------------


def run(*args: str):
    return CliRunner().invoke(main, ["export", *args])


def test_cli_prints_files_and_notes() -> None:
    res = run(str(preset_path("lmcache-cpu-disk")), "--target", "vllm")
    assert res.exit_code == 0, res.output
    assert "vllm-serve.sh" in res.output and "--kv-transfer-config" in res.output
    assert "max_local_cpu_size" in res.output and "cannot express" in res.output


def test_cli_json_and_all() -> None:
    res = run(str(preset_path("mooncake-rdma")), "--target", "mooncake", "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["target"] == "mooncake" and set(doc) == {"target", "release", "files", "notes"}
    assert doc["release"] == "mooncake-transfer-engine 0.3.13.post1"
    assert {n["kind"] for n in doc["notes"]} <= {"inexpressible", "approximate", "informational"}
    assert json.loads(doc["files"]["mooncake.json"])["protocol"] == "rdma"
    res = run(str(preset_path("mooncake-rdma")), "--target", "all", "--json")
    assert [d["target"] for d in json.loads(res.output)] == list(TARGETS)


def test_cli_writes_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    res = run(str(preset_path("dynamo-kvbm")), "--target", "dynamo", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["dynamo-serve.sh", "kvbm.env", "notes.txt"]
    assert (out / "dynamo-serve.sh").stat().st_mode & 0o111
    assert parse_env((out / "kvbm.env").read_text())["DYN_KVBM_CPU_CACHE_GB"] == "100"
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files
    res = run(str(preset_path("dynamo-kvbm")), "--target", "all", "-o", str(tmp_path / "all"))
    assert res.exit_code == 0, res.output
    assert {p.name for p in (tmp_path / "all").iterdir()} == set(TARGETS)
    assert (tmp_path / "all" / "vllm" / "lmcache.yaml").is_file()


def test_cli_policy_from_optimizer_with_provenance(tmp_path: Path) -> None:
    path = tmp_path / "found.toml"
    write_policy_file(
        path,
        policy(TierPolicy(name="dram", capacity_gb=400.0)),
        metrics={"cost_per_mtok": 0.1},
        provenance={"trial": 3},
    )
    res = run(str(path), "--target", "sglang", "--json")
    assert res.exit_code == 0, res.output
    assert "--hicache-size 50" in json.loads(res.output)["files"]["sglang-serve.sh"]


def one_line_error(res) -> str:  # noqa: ANN001
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    return lines[0]


def test_cli_bad_input_is_one_line_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('block_tokens = "sixteen"\n')
    line = one_line_error(run(str(bad), "--target", "vllm"))
    assert str(bad) in line and "block_tokens" in line
    line = one_line_error(run(str(tmp_path / "missing.toml"), "--target", "vllm"))
    assert "file not found" in line
    line = one_line_error(run(str(preset_path("vllm-hbm")), "--target", "trtllm"))
    assert "--target" in line
    many = tmp_path / "many.toml"
    many.write_text('hardware = "h100-node"\n[serving]\ninstances = 99\n')
    line = one_line_error(run(str(many), "--target", "sglang"))
    assert str(many) in line and "99 instances" in line
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    line = one_line_error(run(str(preset_path("vllm-hbm")), "--target", "vllm", "-o", str(blocker)))
    assert "-o" in line


def test_serving_tp_and_fp8_weights_reach_the_flags() -> None:
    """serving.tp overrides the profile's tp (instances follow the GPUs); fp8 weights are
    --quantization fp8 in vLLM and SGLang."""
    p = policy(serving=ServingPolicy(tp=4, weight_dtype="fp8"))
    _, f, result = vllm_command(p)
    assert f["--tensor-parallel-size"] == "4"
    assert f["--quantization"] == "fp8"
    assert "weight_dtype = fp8" in notes_text(result)
    _, f, _ = vllm_command(policy(serving=ServingPolicy(tp=2)))
    assert f["--tensor-parallel-size"] == "2" and "--quantization" not in f
    _, f, _ = sglang_command(p)
    assert f["--tp-size"] == "4" and f["--quantization"] == "fp8"
    with pytest.raises(InputError, match="serving.weight_dtype"):
        vllm_command(p, replace(H100, gpu=replace(H100.gpu, fp8_flops=0.0)))


def test_clients_that_send_token_ids_are_named_in_every_export() -> None:
    """``serving.token_ids_io`` is no server setting: each target's export says so."""
    from dataclasses import replace

    from kvtier.export import export
    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy.presets import load_preset

    p = load_preset("vllm-hbm")
    p = replace(p, serving=replace(p.serving, token_ids_io=True))
    hw, model = load_hardware("h100-node"), load_model("Llama-3.1-8B")
    for target in ("vllm", "sglang"):
        notes = export(p, target, hw, model).notes
        assert any("token_ids_io" in str(n) for n in notes), target


def test_a_load_report_the_target_engine_does_not_have_is_not_runnable_as_simulated() -> None:
    """SGLang loads host pages within the step (``at_once``), vLLM's engine reads a load's
    end with a later step's output (``step_output``): a tiered policy of the other kind is
    named inexpressible there, and ``optimize --target`` pins it to the target's."""
    from dataclasses import replace

    from kvtier.export import export
    from kvtier.export.capabilities import capabilities
    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy.presets import load_preset

    p = load_preset("sglang-hicache")
    hw, model = load_hardware(p.hardware), load_model(p.model)

    def flagged(policy, target: str) -> bool:  # noqa: ANN001
        notes = export(policy, target, hw, model).notes
        return any("load_report" in str(n) and n.kind == "inexpressible" for n in notes)

    assert not flagged(p, "sglang")
    assert flagged(replace(p, load_report="step_output"), "sglang")
    assert flagged(p, "vllm") and not flagged(replace(p, load_report="step_output"), "vllm")
    assert capabilities("sglang").allowed()["load_report"] == ("at_once",)
    assert capabilities("vllm").allowed()["load_report"] == ("step_output",)


def test_load_caching_and_deferral_the_target_engine_does_not_have_are_not_runnable() -> None:
    """SGLang's radix tree caches a load-back's pages at once (``at_admission``), vLLM when it
    sees the load end (``first_step`` in the model); whether a request waits for another's
    load of its hits is a connector's own behaviour: a policy that sets either otherwise is
    named inexpressible, and ``optimize --target`` pins ``load_caching`` to the target's."""
    from dataclasses import replace

    from kvtier.export import export
    from kvtier.export.capabilities import capabilities
    from kvtier.hardware import load_hardware, load_model
    from kvtier.policy.presets import load_preset

    def flagged(policy, target: str, key: str) -> bool:  # noqa: ANN001
        hw, model = load_hardware(policy.hardware), load_model(policy.model)
        notes = export(policy, target, hw, model).notes
        return any(key in str(n) and n.kind == "inexpressible" for n in notes)

    sg = load_preset("sglang-hicache")
    assert sg.load_caching == "at_admission" and not flagged(sg, "sglang", "load_caching")
    assert flagged(replace(sg, load_caching="first_step"), "sglang", "load_caching")
    assert capabilities("sglang").allowed()["load_caching"] == ("at_admission",)
    assert capabilities("vllm").allowed()["load_caching"] == ("first_step",)
    vl = load_preset("lmcache-cpu-disk")
    assert not flagged(vl, "vllm", "load_caching")
    assert flagged(replace(vl, load_caching="at_admission"), "vllm", "load_caching")
    tiers = tuple(
        replace(t, connector="vllm-offloading", defer_loading_hits=False) if t.name != "hbm" else t
        for t in vl.tiers
    )
    assert flagged(replace(vl, tiers=tiers), "vllm", "defer_loading_hits")
    same = tuple(replace(t, defer_loading_hits=True) if t.name != "hbm" else t for t in tiers)
    assert not flagged(replace(vl, tiers=same), "vllm", "defer_loading_hits")
