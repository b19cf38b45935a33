"""The exported ``lmcache.yaml`` loads with LMCache's own config class, every key known to it.

LMCache's wheel declares torch as a dependency, but its config module imports without it. The
fixture installs the pinned wheel without dependencies into pytest's cache directory (once),
and each check runs LMCache in a subprocess, so its logging and globals stay out of this one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvtier.export import export
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy

LMCACHE = "lmcache==0.5.6"  # the version docs/export.md checks the keys against

LOAD = """
import json, sys
from lmcache.v1.config import LMCacheEngineConfig
config = LMCacheEngineConfig.from_file(sys.argv[1])
keys = ("chunk_size", "local_cpu", "max_local_cpu_size", "local_disk", "max_local_disk_size",
        "remote_url", "remote_serde", "save_decode_cache", "enable_pd", "pd_role",
        "extra_config")
print(json.dumps({k: getattr(config, k, None) for k in keys}, default=str))
"""


@pytest.fixture(scope="module")
def lmcache_path(request: pytest.FixtureRequest) -> Path:
    target = Path(request.config.cache.mkdir("lmcache-0.5.6"))
    if not (target / "lmcache" / "v1" / "config.py").is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--target",
                str(target),
                LMCACHE,
            ],
            check=True,
        )
    return target


def _load(lmcache_path: Path, yaml_file: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(lmcache_path)}
    out = subprocess.run(
        [sys.executable, "-c", LOAD, str(yaml_file)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    # LMCache's loggers do not propagate: what it says about a key reaches stderr only
    rejected = [
        line
        for line in out.stderr.splitlines()
        if "unknown config" in line.lower() or "deprecat" in line.lower()
    ]
    return {"values": json.loads(out.stdout.strip().splitlines()[-1]), "rejected": rejected}


MODEL = load_model("Llama-3.1-8B")
H100 = load_hardware("h100-node")


def _policy(*names: str) -> Policy:
    tiers = [TierPolicy(name="hbm")] + [TierPolicy(name=n, capacity_gb=64.0) for n in names]
    return Policy(tiers=tiers, serving=ServingPolicy())


def test_an_unknown_key_is_seen(lmcache_path: Path, tmp_path: Path) -> None:
    yaml_file = tmp_path / "lmcache.yaml"
    yaml_file.write_text("chunk_size: 256\nmooncake_segment: 3\n")
    loaded = _load(lmcache_path, yaml_file)
    assert len(loaded["rejected"]) == 1 and "mooncake_segment" in loaded["rejected"][0]
    assert loaded["values"]["chunk_size"] == 256


@pytest.mark.parametrize(
    "names", [("dram",), ("dram", "ssd"), ("dram", "rdma"), ("dram", "rdma", "ssd")]
)
def test_lmcache_loads_the_export_with_every_key_known(
    lmcache_path: Path, tmp_path: Path, names: tuple[str, ...]
) -> None:
    files = export(_policy(*names), "lmcache", H100, MODEL).files
    yaml_file = tmp_path / "lmcache.yaml"
    yaml_file.write_text(files["lmcache.yaml"])
    loaded = _load(lmcache_path, yaml_file)
    assert loaded["rejected"] == []
    values = loaded["values"]
    assert values["local_cpu"] is True
    assert values["max_local_cpu_size"] > 0
    assert (values["remote_url"] is not None) == ("rdma" in names)
    assert (values["max_local_disk_size"] > 0) == ("ssd" in names)


@pytest.mark.parametrize("preset", ["lmcache-cpu-disk", "vllm-pd-lmcache", "mooncake-rdma"])
def test_lmcache_loads_the_export_of_the_presets(
    lmcache_path: Path, tmp_path: Path, preset: str
) -> None:
    from kvtier.policy.presets import load_preset

    files = export(load_preset(preset), "lmcache", H100, MODEL).files
    yaml_file = tmp_path / "lmcache.yaml"
    yaml_file.write_text(files["lmcache.yaml"])
    loaded = _load(lmcache_path, yaml_file)
    assert loaded["rejected"] == []
    assert loaded["values"]["chunk_size"] > 0
