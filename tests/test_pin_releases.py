"""scripts/pin_releases.py reads the names a wheel declares, and only those."""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

from tests.helpers import REPO


def pin_module():
    spec = importlib.util.spec_from_file_location("pin_releases", REPO / "scripts/pin_releases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_flags_variables_and_keys_are_read_from_the_sources(tmp_path: Path) -> None:
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(
            "dynamo/vllm/args.py",
            "import os\n"
            "def build(parser, g):\n"
            '    parser.add_argument("--block-size", "-b", type=int)\n'
            '    add_argument(g, flag_name="--router-mode", env_var="DYN_ROUTER_MODE")\n'
            '    x = os.getenv("DYN_A") or os.environ.get("DYN_B") or os.environ["DYN_C"]\n'
            '    return "DYN_D" in os.environ\n',
        )
        zf.writestr(
            "dynamo/mocker/args.py",
            'def build(parser):\n    parser.add_argument("--is-prefill-worker")\n',
        )
        # a test's names are not the release's
        zf.writestr("dynamo/vllm/tests/test_x.py", 'parser.add_argument("--only-in-tests")\n')
        zf.writestr(
            "vllm/envs.py",
            'environment_variables = {"VLLM_X": lambda: 1, "VLLM_Y": lambda: 2}\n',
        )
        zf.writestr(
            "lmcache/v1/config.py",
            '_CONFIG_DEFINITIONS = {"chunk_size": {}, "local_cpu": {}}\n',
        )
        zf.writestr("lib/_core.so", b"\x00DYN_KVBM_CPU_CACHE_GBDYN_KVBM_DISK_CACHE_GB\x00junk")
    doc = pin_module().read_wheel("kvbm", wheel)
    assert doc["flags"] == ["--block-size", "--is-prefill-worker", "--router-mode"]
    assert doc["flags_by_module"]["dynamo/vllm"] == ["--block-size", "--router-mode"]
    assert doc["flags_by_module"]["dynamo/mocker"] == ["--is-prefill-worker"]
    assert set(doc["env"]) == {
        "DYN_ROUTER_MODE",
        "DYN_A",
        "DYN_B",
        "DYN_C",
        "DYN_D",
        "VLLM_X",
        "VLLM_Y",
        "DYN_KVBM_CPU_CACHE_GB",  # names stored end to end in a compiled library, split
        "DYN_KVBM_DISK_CACHE_GB",
    }
    assert doc["config"]["lmcache.yaml"] == ["chunk_size", "local_cpu"]


def test_the_pinned_lists_are_the_packages_pinned() -> None:
    from kvtier.export.releases import PACKAGES, pins, release

    files = {p.name for p in (REPO / "optimizer/export/releases").glob("*.json")}
    assert files == {f"{package}-{version}.json" for package, version in pins()}
    for name in PACKAGES:
        r = release(name)
        assert r.version == PACKAGES[name] and r.flags | r.env


def test_gflags_stored_as_the_end_of_a_longer_name_are_read() -> None:
    """Mooncake's master keeps ``eviction_ratio`` only as the end of ``nof_eviction_ratio``
    (one string for both); its configuration dump names it, so it is a flag. A tail the dump
    does not name, or one of a name without the ``nof_`` twin prefix, is not."""
    names = [f"flag_{i}" for i in range(12)]
    run = [*names, "rpc_port", "nof_eviction_ratio", "nof_other", "cxl_size"]
    data = b"\x00" + b"\x00".join(n.encode() for n in run)
    data += b"\x00junk text\x00, eviction_ratio=\x00, size=\x00"
    flags = pin_module()._gflags(data, "rpc_port")
    assert "--eviction_ratio" in flags and "--nof_eviction_ratio" in flags
    assert "--other" not in flags and "--size" not in flags
