"""Exported launch scripts run as a person would run them: every instance with its own GPUs and
port, on its host, with absolute config paths; Mooncake's master and store clients; LMCache's
keys as LMCache 0.5.6 declares them.

Each script is written to a directory and run under ``/bin/sh`` with stand-ins for ``vllm``,
``python3`` and ``mooncake_master`` on ``PATH``: each records its arguments and environment and
exits, so what reaches the serving commands is checked exactly, without starting a server.
"""

from __future__ import annotations

import json
import shutil
import stat
import subprocess
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml

from kvtier.export import export
from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import Hardware
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy

MODEL = load_model("Llama-3.1-8B")
H100 = load_hardware("h100-node")  # one host of 8 GPUs
BELUGA = load_hardware("beluga-testbed")  # two hosts of 8 GPUs
STUBS = ("vllm", "python3", "mooncake_master")

# The top-level keys LMCache's config class declares: ``_CONFIG_DEFINITIONS`` in
# ``lmcache/v1/config.py`` of the lmcache 0.5.6 wheel (PyPI, cp311 manylinux), pinned here so
# the check needs no install; tests/test_lmcache_config.py loads the YAML with LMCache itself.
_LMCACHE_056_KEYS = """
    chunk_size local_cpu max_local_cpu_size local_cpu_use_hugepages reserve_local_cpu_size
    local_disk local_disk_path_sharding max_local_disk_size remote_url remote_serde use_layerwise
    save_decode_cache pre_caching_hash_algorithm enable_blending blend_recompute_ratios
    blend_thresholds blend_check_layers blend_min_tokens blend_special_str retrieve_locations
    store_location mp_host mp_port enable_controller lmcache_instance_id controller_pull_url
    controller_reply_url lmcache_worker_ports lmcache_worker_ids
    lmcache_worker_heartbeat_delay_time lmcache_worker_heartbeat_time enable_pd pd_role
    pd_buffer_size pd_buffer_device pd_peer_host pd_peer_init_port pd_peer_alloc_port
    pd_peer_query_port pd_proxy_host pd_proxy_port pd_allocation_timeout_sec
    pd_shutdown_timeout_sec pd_condition_poll_interval_sec pd_max_prefill_len pd_backend_mode
    pd_skip_proxy_notification pd_bidirectional transfer_channel nixl_backends nixl_buffer_size
    nixl_buffer_device gds_path gds_path_sharding gds_buffer_size maru_path maru_pool_size use_gds
    gds_backend audit_actual_remote_url internal_api_server_host extra_config save_unfull_chunk
    blocking_timeout_secs external_lookup_client py_enable_gc cache_policy numa_mode
    enable_async_loading internal_api_server_enabled internal_api_server_port_start
    priority_limit internal_api_server_include_index_list internal_api_server_socket_path_prefix
    runtime_plugin_locations storage_plugins remote_storage_plugins lookup_timeout_ms
    min_retrieve_tokens hit_miss_ratio lookup_server_worker_ids enable_scheduler_bypass_lookup
    script_allowed_imports run_script_api_enabled enable_lazy_memory_allocator
    lazy_memory_initial_ratio lazy_memory_expand_trigger_ratio lazy_memory_step_ratio
    lazy_memory_safe_size enable_chunk_statistics chunk_statistics_auto_start_statistics
    chunk_statistics_auto_exit_timeout_hours chunk_statistics_auto_exit_target_unique_chunks
    chunk_statistics_strategy enable_kv_events pin_timeout_sec pin_check_interval_sec
    remote_config_url app_id enable_hidden_state_cache max_hidden_state_cpu_size
    hidden_state_layers hidden_states_retrieve_mode"""
LMCACHE_056_KEYS = frozenset(_LMCACHE_056_KEYS.split())
# ``mooncakestore_connector.py`` of 0.5.6: the setup keys Mooncake's store.setup() takes, spelt
# with the ``mooncake_`` prefix that ``MooncakeStoreConfig._build_setup_dict`` strips.
MOONCAKE_SETUP_KEYS = frozenset(
    {
        "local_hostname",
        "metadata_server",
        "global_segment_size",
        "local_buffer_size",
        "protocol",
        "device_name",
        "master_server_address",
    }
)


@dataclass(frozen=True)
class Call:
    """One run of a stand-in command: its name, arguments and environment."""

    name: str
    argv: list[str]
    env: dict[str, str]

    def flag(self, name: str) -> str:
        return self.argv[self.argv.index(name) + 1]


def stub_dir(tmp_path: Path) -> Path:
    """Stand-ins recording ``argv`` and the environment (NUL-separated) under ``$RECORD``, and
    exiting 3 when one argument equals ``$FAIL_ON``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in STUBS:
        stub = bin_dir / name
        stub.write_text(
            "#!/bin/sh\n"
            f'out="$RECORD/{name}.$$"\n'
            'printf \'%s\\000\' "$@" > "$out.argv"\n'
            'env -0 > "$out.env"\n'
            'for a in "$@"; do [ "$a" != "${FAIL_ON:-}" ] || exit 3; done\n'
        )
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return bin_dir


def write(files: dict[str, str], directory: Path) -> Path:
    directory.mkdir(parents=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory


def run(
    script: Path, tmp_path: Path, **env: str
) -> tuple[subprocess.CompletedProcess[str], list[Call]]:
    """Run ``script`` from an unrelated directory; the calls it made, sorted by argument list."""
    record = tmp_path / "record"
    shutil.rmtree(record, ignore_errors=True)
    record.mkdir()
    bin_dir = tmp_path / "bin" if (tmp_path / "bin").exists() else stub_dir(tmp_path)
    full = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RECORD": str(record), "MODEL": "m", **env}
    done = subprocess.run(
        ["/bin/sh", str(script)],
        env=full,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = []
    for argv_file in sorted(record.glob("*.argv")):
        name = argv_file.name.split(".")[0]
        argv = argv_file.read_text().split("\0")[:-1]
        pairs = argv_file.with_suffix(".env").read_text().split("\0")[:-1]
        calls.append(Call(name, argv, dict(p.split("=", 1) for p in pairs)))
    return done, calls


def serving(calls: list[Call], port_flag: str = "--port") -> dict[int, Call]:
    """The serving calls by port."""
    return {int(c.flag(port_flag)): c for c in calls if port_flag in c.argv}


def tp(hw: Hardware, size: int) -> Hardware:
    return replace(hw, topology=replace(hw.topology, tp=size))


def tiers(*names: str) -> Policy:
    return Policy(tiers=(TierPolicy(), *(TierPolicy(name=n) for n in names)))


# --- vLLM -----------------------------------------------------------------------------------


def test_vllm_starts_every_instance_with_its_gpus_and_port(tmp_path: Path) -> None:
    out = write(export(tiers("dram"), "vllm", tp(H100, 2), MODEL).files, tmp_path / "out")
    done, calls = run(out / "vllm-serve.sh", tmp_path)
    assert done.returncode == 0, done.stderr
    by_port = serving(calls)
    assert sorted(by_port) == [8000, 8001, 8002, 8003]
    for k, port in enumerate(sorted(by_port)):
        call = by_port[port]
        assert call.name == "vllm" and call.argv[:2] == ["serve", "m"]
        assert call.env["CUDA_VISIBLE_DEVICES"] == f"{2 * k},{2 * k + 1}"
        assert call.flag("--tensor-parallel-size") == "2"
        config = Path(call.env["LMCACHE_CONFIG_FILE"])
        assert config.is_absolute() and config == out / "lmcache.yaml" and config.is_file()
    assert "vLLM instance 3: GPUs 6,7, port 8003" in done.stderr


def test_the_script_finds_its_files_after_the_directory_moves(tmp_path: Path) -> None:
    out = write(export(tiers("dram"), "vllm", H100, MODEL).files, tmp_path / "out")
    moved = tmp_path / "elsewhere" / "with space"
    moved.parent.mkdir()
    out.rename(moved)
    done, calls = run(moved / "vllm-serve.sh", tmp_path)
    assert done.returncode == 0, done.stderr
    assert {c.env["LMCACHE_CONFIG_FILE"] for c in calls} == {str(moved / "lmcache.yaml")}
    assert len(calls) == 8


def test_each_host_starts_its_own_instances(tmp_path: Path) -> None:
    """Two hosts of 8 GPUs, 12 instances of tp 1: host 0 runs 0-7, host 1 runs 8-11 on its
    GPUs 0-3; every port is distinct."""
    p = replace(tiers("dram"), serving=ServingPolicy(instances=12))
    out = write(export(p, "vllm", BELUGA, MODEL).files, tmp_path / "out")
    _, host0 = run(out / "vllm-serve.sh", tmp_path)
    assert sorted(serving(host0)) == list(range(8000, 8008))
    done, host1 = run(out / "vllm-serve.sh", tmp_path, HOST_INDEX="1")
    assert done.returncode == 0, done.stderr
    by_port = serving(host1)
    assert sorted(by_port) == list(range(8008, 8012))
    assert [by_port[8008 + i].env["CUDA_VISIBLE_DEVICES"] for i in range(4)] == [
        "0",
        "1",
        "2",
        "3",
    ]
    bad, calls = run(out / "vllm-serve.sh", tmp_path, HOST_INDEX="2")
    assert bad.returncode == 2 and calls == []
    assert "HOST_INDEX is the host this script runs on, 0 to 1" in bad.stderr


def test_a_failing_instance_fails_the_script(tmp_path: Path) -> None:
    out = write(export(Policy(), "vllm", H100, MODEL).files, tmp_path / "out")
    done, calls = run(out / "vllm-serve.sh", tmp_path, FAIL_ON="8005")
    assert done.returncode == 3 and len(calls) == 8  # the others still started


# --- SGLang ---------------------------------------------------------------------------------


def test_sglang_instances_gpus_ports_and_file_backend(tmp_path: Path) -> None:
    hw = tp(H100, 4)
    out = write(export(tiers("dram", "ssd"), "sglang", hw, MODEL).files, tmp_path / "out")
    done, calls = run(out / "sglang-serve.sh", tmp_path)
    assert done.returncode == 0, done.stderr
    by_port = serving(calls)
    assert sorted(by_port) == [30000, 30001]
    per_rank = int(hw.tiers["ssd"].capacity_bytes / 2 / 4)  # the host's SSD, 2 instances, tp 4
    for k, port in enumerate((30000, 30001)):
        call = by_port[port]
        assert call.argv[:4] == ["-m", "sglang.launch_server", "--model-path", "m"]
        assert call.env["CUDA_VISIBLE_DEVICES"] == ",".join(str(4 * k + g) for g in range(4))
        assert call.flag("--tp-size") == "4"
        assert call.flag("--hicache-storage-backend") == "file"
        assert int(call.env["SGLANG_HICACHE_FILE_BACKEND_MAX_SIZE"]) == per_rank
        assert call.env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] == (
            f"/var/cache/sglang-hicache/instance-{k}"
        )


# --- Dynamo ---------------------------------------------------------------------------------


def test_dynamo_frontend_once_and_workers_with_their_own_ports(tmp_path: Path) -> None:
    p = replace(tiers("dram"), serving=ServingPolicy(routing="prefix_affinity"))
    out = write(export(p, "dynamo", tp(H100, 2), MODEL).files, tmp_path / "out")
    done, calls = run(out / "dynamo-serve.sh", tmp_path)
    assert done.returncode == 0, done.stderr
    frontends = [c for c in calls if "dynamo.frontend" in c.argv]
    assert len(frontends) == 1
    assert frontends[0].flag("--http-port") == "8000" and frontends[0].flag("--router-mode") == "kv"
    workers = sorted(
        (c for c in calls if "dynamo.vllm" in c.argv),
        key=lambda c: int(c.env["DYN_KVBM_LEADER_ZMQ_PUB_PORT"]),
    )
    assert len(workers) == 4
    ports = set()
    for k, call in enumerate(workers):
        assert call.env["CUDA_VISIBLE_DEVICES"] == f"{2 * k},{2 * k + 1}"
        assert call.flag("--tensor-parallel-size") == "2" and call.flag("--model") == "m"
        own = (
            call.env["DYN_KVBM_LEADER_ZMQ_PUB_PORT"],
            call.env["DYN_KVBM_LEADER_ZMQ_ACK_PORT"],
            json.loads(call.flag("--kv-events-config"))["endpoint"].rsplit(":", 1)[1],
        )
        assert own == (str(56001 + 2 * k), str(56002 + 2 * k), str(20080 + k))
        ports |= set(own)
        assert "DYN_KVBM_CPU_CACHE_GB" in call.env
    assert len(ports) == 12
    bad, none = run(out / "dynamo-serve.sh", tmp_path, HOST_INDEX="1")  # one host only
    assert bad.returncode == 2 and none == []


# --- Mooncake -------------------------------------------------------------------------------


def test_mooncake_master_and_a_store_client_per_host(tmp_path: Path) -> None:
    p = replace(tiers("rdma", "ssd"), write_policy="write_back")
    files = export(p, "mooncake", BELUGA, MODEL).files
    assert {"mooncake-master.sh", "mooncake-store.sh", "mooncake.json"} <= set(files)
    out = write(files, tmp_path / "out")
    done, calls = run(out / "mooncake-master.sh", tmp_path)
    assert done.returncode == 0, done.stderr
    [master] = calls
    assert master.name == "mooncake_master"
    assert master.argv == ["--rpc_port=50051", "--enable_offload=true", "--offload_on_evict=true"]
    done, calls = run(out / "mooncake-store.sh", tmp_path, LOCAL_HOSTNAME="host-b")
    assert done.returncode == 0, done.stderr
    [client] = calls
    assert client.argv == [
        "-m",
        "mooncake.mooncake_store_service",
        "--config",
        str(out / "mooncake.json"),
        "--port",
        "8080",
        "-Dlocal_hostname=host-b",
        "-Dmaster_server_address=localhost:50051",
    ]
    # The SSD offload variables of mooncake-store.env reach the client.
    assert client.env["MOONCAKE_OFFLOAD_FILE_STORAGE_PATH"] == "/var/cache/mooncake-offload"
    per_host_ssd = BELUGA.tiers["ssd"].capacity_bytes
    assert int(client.env["MOONCAKE_OFFLOAD_TOTAL_SIZE_LIMIT_BYTES"]) == int(per_host_ssd)
    _, calls = run(out / "mooncake-store.sh", tmp_path, MOONCAKE_MASTER="10.0.0.1:50051")
    [client] = calls
    assert client.argv[-1] == "-Dmaster_server_address=10.0.0.1:50051"
    assert client.argv[-2].startswith("-Dlocal_hostname=") and client.argv[-2] != (
        "-Dlocal_hostname="
    )


# --- LMCache --------------------------------------------------------------------------------


def test_lmcache_keys_are_those_lmcache_declares() -> None:
    cfg = yaml.safe_load(
        export(tiers("dram", "rdma", "ssd"), "lmcache", H100, MODEL).files["lmcache.yaml"]
    )
    assert set(cfg) <= LMCACHE_056_KEYS, set(cfg) - LMCACHE_056_KEYS
    extra = cfg["extra_config"]
    assert all(k.startswith("mooncake_") for k in extra)
    assert {k.removeprefix("mooncake_") for k in extra} == MOONCAKE_SETUP_KEYS
    n = 8  # instances x tp on h100-node
    assert extra["mooncake_global_segment_size"] == int(H100.tiers["rdma"].capacity_bytes / n)


@pytest.mark.parametrize("target", ["vllm", "sglang", "dynamo"])
def test_every_launch_script_runs_with_stub_commands(tmp_path: Path, target: str) -> None:
    """Every tier the hardware has, one host: each instance gets distinct GPUs."""
    files = export(tiers("dram", "rdma", "ssd"), target, H100, MODEL).files
    out = write(files, tmp_path / "out")
    [script] = [n for n in files if n.endswith("-serve.sh")]
    done, calls = run(out / script, tmp_path)
    assert done.returncode == 0, done.stderr
    gpus = [c.env["CUDA_VISIBLE_DEVICES"] for c in calls if "CUDA_VISIBLE_DEVICES" in c.env]
    assert sorted(gpus, key=int) == [str(g) for g in range(8)]


# --- per-pool tensor parallelism ------------------------------------------------------------


def pools(**serving) -> Policy:
    return replace(Policy(), serving=ServingPolicy(**serving))


def test_vllm_prefill_and_decode_instances_have_their_own_tp_and_gpus(tmp_path: Path) -> None:
    # one host of 8: 2 prefill instances of tp=2 (GPUs 0-3), then 4 decode instances of tp=1
    p = pools(prefill_instances=2, prefill_tp=2, decode_tp=1)
    out = write(export(p, "vllm", H100, MODEL).files, tmp_path / "out")
    done, calls = run(out / "vllm-serve.sh", tmp_path)
    assert done.returncode == 0, done.stderr
    by_port = serving(calls)
    assert sorted(by_port) == list(range(8000, 8006))
    gpus = [by_port[8000 + k].env["CUDA_VISIBLE_DEVICES"] for k in range(6)]
    assert gpus == ["0,1", "2,3", "4", "5", "6", "7"]
    tps = [by_port[8000 + k].flag("--tensor-parallel-size") for k in range(6)]
    assert tps == ["2", "2", "1", "1", "1", "1"]
    assert all('"kv_connector":"NixlConnector"' in c.flag("--kv-transfer-config") for c in calls)
    assert "vLLM instance 0 (prefill): GPUs 0,1, port 8000, tp=2" in done.stderr
    assert "vLLM instance 5 (decode): GPUs 7, port 8005, tp=1" in done.stderr


def test_vllm_kv_bytes_per_gpu_follow_each_pools_tp(tmp_path: Path) -> None:
    p = pools(prefill_instances=1, prefill_tp=4, decode_tp=2, instances=3)
    p = replace(p, tiers=(TierPolicy(capacity_gb=40.0),))
    out = write(export(p, "vllm", H100, MODEL).files, tmp_path / "out")
    _, calls = run(out / "vllm-serve.sh", tmp_path)
    by_port = serving(calls)
    assert [by_port[8000 + k].flag("--kv-cache-memory-bytes") for k in range(3)] == [
        str(int(40e9 / 4)),
        str(int(40e9 / 2)),
        str(int(40e9 / 2)),
    ]
    assert [by_port[8000 + k].env["CUDA_VISIBLE_DEVICES"] for k in range(3)] == [
        "0,1,2,3",
        "4,5",
        "6,7",
    ]


def test_sglang_and_dynamo_roles_with_their_tp(tmp_path: Path) -> None:
    p = pools(prefill_instances=1, prefill_tp=4, decode_tp=2)  # 1 x 4 + 2 x 2 GPUs
    out = write(export(p, "sglang", H100, MODEL).files, tmp_path / "sglang")
    done, calls = run(out / "sglang-serve.sh", tmp_path)
    assert done.returncode == 0, done.stderr
    by_port = serving(calls)
    assert [by_port[30000 + k].flag("--tp-size") for k in range(3)] == ["4", "2", "2"]
    assert [by_port[30000 + k].flag("--disaggregation-mode") for k in range(3)] == [
        "prefill",
        "decode",
        "decode",
    ]
    assert by_port[30002].env["CUDA_VISIBLE_DEVICES"] == "6,7"
    out = write(export(p, "dynamo", H100, MODEL).files, tmp_path / "dynamo")
    done, calls = run(out / "dynamo-serve.sh", tmp_path)
    assert done.returncode == 0, done.stderr
    workers = sorted(
        (c for c in calls if "dynamo.vllm" in c.argv), key=lambda c: c.env["CUDA_VISIBLE_DEVICES"]
    )
    assert [(w.env["CUDA_VISIBLE_DEVICES"], w.flag("--tensor-parallel-size")) for w in workers] == [
        ("0,1,2,3", "4"),
        ("4,5", "2"),
        ("6,7", "2"),
    ]
    assert [w.flag("--disaggregation-mode") for w in workers] == ["prefill", "decode", "decode"]


def test_decode_instances_start_on_the_next_host_when_one_would_straddle(tmp_path: Path) -> None:
    # two hosts of 8: 3 prefill instances of tp=1 (host 0, GPUs 0-2), decode instances of tp=4:
    # GPUs 3-6 of host 0, then host 1's 0-3 and 4-7 (GPU 7 of host 0 stays idle)
    p = pools(prefill_instances=3, prefill_tp=1, decode_tp=4)
    files = export(p, "vllm", BELUGA, MODEL).files
    out = write(files, tmp_path / "out")
    _, host0 = run(out / "vllm-serve.sh", tmp_path)
    _, host1 = run(out / "vllm-serve.sh", tmp_path, HOST_INDEX="1")
    h0, h1 = serving(host0), serving(host1)
    assert [h0[8000 + k].env["CUDA_VISIBLE_DEVICES"] for k in range(4)] == [
        "0",
        "1",
        "2",
        "3,4,5,6",
    ]
    assert [h1[8004 + k].env["CUDA_VISIBLE_DEVICES"] for k in range(2)] == ["0,1,2,3", "4,5,6,7"]
    assert [h1[8004 + k].flag("--tensor-parallel-size") for k in range(2)] == ["4", "4"]


# --- the P/D connectors of a disaggregated launch --------------------------------------------


def pd_with_dram(**serving) -> Policy:
    """A disaggregated policy whose tier below HBM is host DRAM (LMCache's or KVBM's)."""
    return replace(tiers("dram"), serving=ServingPolicy(**serving))


def transfer(call: Call) -> dict:
    return json.loads(call.flag("--kv-transfer-config"))


def test_vllm_nixl_handover_beside_lmcache_tiers(tmp_path: Path) -> None:
    # the NIXL pull is the modelled P/D path and LMCache holds the DRAM tier the prefill side
    # looks up: the prefill instances stack both in vLLM's MultiConnector, the decode
    # instances pull with NixlConnector (never an LMCache producer/consumer pair, which
    # moves nothing without LMCache's own P/D settings)
    p = pd_with_dram(prefill_instances=2, prefill_tp=2, decode_tp=1)
    out = write(export(p, "vllm", H100, MODEL).files, tmp_path / "out")
    done, calls = run(out / "vllm-serve.sh", tmp_path)
    assert done.returncode == 0, done.stderr
    by_port = serving(calls)
    configs = [transfer(by_port[8000 + k]) for k in range(6)]
    producer = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    consumer = {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}
    stacked = {
        "kv_connector": "MultiConnector",
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {
            "connectors": [producer, {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}]
        },
    }
    assert configs == [stacked] * 2 + [consumer] * 4
    # every NIXL instance of the host listens on its own side channel, its tp ranks above it
    ports = [int(by_port[8000 + k].env["VLLM_NIXL_SIDE_CHANNEL_PORT"]) for k in range(6)]
    assert ports == [5600, 5602, 5604, 5605, 5606, 5607]


def test_dynamo_disaggregated_workers_connect_kvbm_and_nixl(tmp_path: Path) -> None:
    # Dynamo's disagg_kvbm launch: KVBM and NIXL on the prefill workers, NIXL alone on the
    # decode workers (which start no KVBM leader)
    p = pd_with_dram(prefill_instances=1, prefill_tp=4, decode_tp=2)
    out = write(export(p, "dynamo", H100, MODEL).files, tmp_path / "out")
    done, calls = run(out / "dynamo-serve.sh", tmp_path)
    assert done.returncode == 0, done.stderr
    workers = sorted(
        (c for c in calls if "dynamo.vllm" in c.argv), key=lambda c: c.env["CUDA_VISIBLE_DEVICES"]
    )
    prefill, *decode = (transfer(w) for w in workers)
    assert prefill["kv_connector"] == "PdConnector"
    assert prefill["kv_connector_module_path"] == "kvbm.vllm_integration.connector"
    inner = [c["kv_connector"] for c in prefill["kv_connector_extra_config"]["connectors"]]
    assert inner == ["DynamoConnector", "NixlConnector"]
    assert decode == [{"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}] * 2
    assert [w.flag("--disaggregation-mode") for w in workers] == ["prefill", "decode", "decode"]
    assert ["DYN_KVBM_LEADER_ZMQ_PUB_PORT" in w.env for w in workers] == [True, False, False]
    ports = [w.env["VLLM_NIXL_SIDE_CHANNEL_PORT"] for w in workers]
    assert ports == ["5600", "5604", "5606"]
