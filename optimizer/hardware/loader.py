"""Load model, GPU and hardware profiles by name or by path.

A name is looked up first in the directories of ``$KVTIER_PROFILE_PATH`` (``:``-separated, each
holding ``models/``, ``gpus/``, ``hardware/``), then among the built-in profiles shipped in
``optimizer/hardware/profiles``; so a user's file overrides a built-in one of the same name.
Anything that ends in ``.toml`` or names an existing file is read as a path. Names match file
stems case-insensitively (``Llama-3.1-8B`` finds ``llama-3.1-8b.toml``).
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

from kvtier.errors import InputError
from kvtier.hardware.prices import MAX_PRICE
from kvtier.hardware.types import (
    GB,
    GIB,
    LOWER_TIERS,
    MLA,
    Efficiency,
    GPUProfile,
    Hardware,
    ModelProfile,
    MoE,
    Power,
    TierHardware,
    Topology,
)
from kvtier.tier_kinds import TIER_KINDS
from kvtier.toml_fields import Table, read_toml

KINDS = ("models", "gpus", "hardware")


def _builtin_dir(kind: str) -> Path:
    return Path(str(resources.files("kvtier.hardware"))) / "profiles" / kind


def _search_dirs(kind: str) -> list[Path]:
    dirs = [Path(p) / kind for p in os.environ.get("KVTIER_PROFILE_PATH", "").split(":") if p]
    return [*dirs, _builtin_dir(kind)]


def builtin_names(kind: str) -> list[str]:
    """Stems of the built-in profiles of one kind, sorted."""
    return sorted(p.stem for p in _builtin_dir(kind).glob("*.toml"))


def resolve(kind: str, name_or_path: str | Path, *, base: Path | None = None) -> Path:
    """The file a profile reference points to; :class:`InputError` if there is none."""
    text = str(name_or_path)
    candidate = Path(text)
    if base is not None and not candidate.is_absolute():
        relative = base / candidate
        if relative.is_file():
            return relative
    if candidate.is_file() or text.endswith(".toml"):
        if not candidate.is_file():
            raise InputError(f"{kind} profile file not found", path=text)
        return candidate
    stem = text.lower()
    for directory in _search_dirs(kind):
        path = directory / f"{stem}.toml"
        if path.is_file():
            return path
    known = ", ".join(builtin_names(kind))
    raise InputError(f"unknown {kind} profile {text!r} (built-in: {known})")


def load_model(name_or_path: str | Path) -> ModelProfile:
    """A model profile (shape, parameter counts, weight dtype), validated.

    A ``.json`` path is a Hugging Face ``config.json`` and a name ``org/model`` one of the
    configs aiconfigurator-core ships (:mod:`kvtier.hardware.hf_config`)."""
    text = str(name_or_path)
    if text.endswith(".json") or ("/" in text and not Path(text).exists()):
        from kvtier.hardware.hf_config import profile_from_config, shipped_config

        if text.endswith(".json"):
            if not Path(text).is_file():
                raise InputError("model config.json not found", path=text)
            return profile_from_config(text)
        shipped = shipped_config(text)
        if shipped is not None:
            return profile_from_config(shipped, hf_id=text)
    path = resolve("models", name_or_path)
    t = Table(read_toml(path), str(path))
    mla_table = t.table("mla")
    mla = None
    if mla_table is not None:
        mla = MLA(mla_table.integer("kv_lora_rank"), mla_table.integer("rope_dim"))
        mla_table.done()
    moe_table = t.table("moe")
    moe = None
    if moe_table is not None:
        experts = moe_table.integer("experts")
        moe = MoE(
            experts,
            moe_table.integer("active"),
            moe_table.number("expert_params", positive=True),
        )
        moe_table.done()
        if moe.active > moe.experts:
            raise InputError("key 'moe.active': more than moe.experts", path=str(path))
    params = t.number("params", positive=True)
    model = ModelProfile(
        name=t.string("name"),
        layers=t.integer("layers"),
        attention_heads=t.integer("attention_heads"),
        kv_heads=t.integer("kv_heads"),
        head_dim=t.integer("head_dim"),
        params=params,
        active_params=t.number("active_params", positive=True, at_most=params),
        weight_dtype_bytes=t.number("weight_dtype_bytes", positive=True),
        mla=mla,
        source=str(path),
        hf_id=t.string("hf_id", "") if t.has("hf_id") else "",
        moe=moe,
        hidden=t.integer("hidden_size") if t.has("hidden_size") else 0,
        sliding_window=t.integer("sliding_window") if t.has("sliding_window") else 0,
        sliding_window_layers=(
            t.integer("sliding_window_layers") if t.has("sliding_window_layers") else 0
        ),
    )
    t.done()
    if moe is not None and moe.expert_params > model.params:
        raise InputError("key 'moe.expert_params': more than params", path=str(path))
    check_sliding_window(model, str(path))
    return model


def check_sliding_window(model: ModelProfile, where: str) -> None:
    """Sliding-window layers need a window, a window needs layers, and at least one layer
    must attend to the whole context (the KV that grows with it)."""
    if model.sliding_window < 0 or model.sliding_window_layers < 0:
        raise InputError("keys 'sliding_window*': must not be negative", path=where)
    if (model.sliding_window > 0) != (model.sliding_window_layers > 0):
        raise InputError(
            "keys 'sliding_window' and 'sliding_window_layers': give both (or neither)",
            path=where,
        )
    if model.sliding_window_layers >= model.layers:
        raise InputError(
            f"key 'sliding_window_layers': {model.sliding_window_layers} leaves no "
            f"full-attention layer of {model.layers}",
            path=where,
        )


def load_gpu(name_or_path: str | Path, *, base: Path | None = None) -> GPUProfile:
    """A GPU profile; numbers in the file are GB, GB/s, TFLOPS and $ per hour."""
    path = resolve("gpus", name_or_path, base=base)
    t = Table(read_toml(path), str(path))
    gpu = GPUProfile(
        name=t.string("name"),
        hbm_bytes=t.number("hbm_gb", positive=True) * GB,
        hbm_visible_bytes=t.number("hbm_visible_gib", 0.0, nonneg=True) * GIB,
        hbm_bw=t.number("hbm_bw_gbps", positive=True) * GB,
        peak_flops=t.number("bf16_tflops", positive=True) * 1e12,
        pcie_bw=t.number("pcie_gbps", positive=True) * GB,
        price_per_hour=t.number("price_per_hour", nonneg=True, at_most=MAX_PRICE),
        source=str(path),
        fp8_flops=t.number("fp8_tflops", 0.0, nonneg=True) * 1e12,
        nvlink_bw=t.number("nvlink_gbps", 0.0, nonneg=True) * GB,
        nvlink_latency_s=t.number("nvlink_latency_us", 0.0, nonneg=True) * 1e-6,
        tdp_w=t.number("tdp_w", GPUProfile.tdp_w, positive=True),
        idle_w=t.number("idle_w", GPUProfile.idle_w, nonneg=True),
        hbf_bytes=t.number("hbf_gb", 0.0, nonneg=True) * GB,
        hbf_bw=t.number("hbf_bw_gbps", 0.0, nonneg=True) * GB,
        sustained_compute_scale=t.number("sustained_compute_scale", 1.0, at_most=2.0),
        sustained_compute_scale_fp8=t.number("sustained_compute_scale_fp8", 1.0, at_most=2.0),
    )
    t.done()
    for key in ("sustained_compute_scale", "sustained_compute_scale_fp8"):
        if getattr(gpu, key) < 1.0:
            raise t.error(key, f"must be >= 1, got {getattr(gpu, key):g}")
    if (gpu.hbf_bytes > 0) != (gpu.hbf_bw > 0):
        raise InputError("keys 'hbf_gb' and 'hbf_bw_gbps': give both or neither", path=str(path))
    if gpu.hbm_visible_bytes > gpu.hbm_bytes * 1.1:
        raise t.error(
            "hbm_visible_gib",
            f"{gpu.hbm_visible_bytes / GIB:g} GiB is more than the GPU's {gpu.hbm_bytes / GB:g} GB",
        )
    if gpu.idle_w > gpu.tdp_w:
        raise InputError(
            f"key 'idle_w': {gpu.idle_w:g} W is more than tdp_w ({gpu.tdp_w:g} W)", path=str(path)
        )
    return gpu


def load_hardware(name_or_path: str | Path) -> Hardware:
    """A hardware profile with its GPU profile resolved (by name, or path relative to the file)."""
    path = resolve("hardware", name_or_path)
    t = Table(read_toml(path), str(path))
    name = t.string("name")
    gpu_ref = t.string("gpu")
    try:
        gpu = load_gpu(gpu_ref, base=path.parent)
    except InputError as err:
        raise InputError(f"key 'gpu': {err}", path=str(path)) from None
    prefill_gpu = None
    if t.has("prefill_gpu"):
        try:
            prefill_gpu = load_gpu(t.string("prefill_gpu"), base=path.parent)
        except InputError as err:
            raise InputError(f"key 'prefill_gpu': {err}", path=str(path)) from None
    topo = t.table("topology", required=True)
    eff = t.table("efficiency", required=True)
    mem = t.table("memory")
    prices = t.table("prices")
    power_table = t.table("power")
    assert topo is not None and eff is not None
    topology = Topology(
        hosts=topo.integer("hosts"),
        gpus_per_host=topo.integer("gpus_per_host"),
        tp=topo.integer("tp"),
        gpus_per_switch=topo.integer("gpus_per_switch", 1),
        switch_uplink_bw=topo.number("switch_uplink_gbps", 0.0, nonneg=True) * GB,
        dram_bw=topo.number("dram_gbps", 0.0, nonneg=True) * GB,
        sockets=topo.integer("sockets", 1),
        memcpy_bw=topo.number("memcpy_gbps", 10.0, positive=True) * GB,
        numa_remote_memcpy_bw=topo.number("numa_remote_memcpy_gbps", 0.0, nonneg=True) * GB,
    )
    topo.done()
    if topology.gpus_per_host % topology.gpus_per_switch or (
        topology.gpus_per_host % topology.sockets
    ):
        raise InputError(
            "key 'topology.gpus_per_switch' / 'topology.sockets': must divide gpus_per_host "
            f"({topology.gpus_per_host})",
            path=str(path),
        )
    if topology.gpus % topology.tp:
        raise InputError(
            f"key 'topology.tp': {topology.gpus} GPUs do not split into instances of {topology.tp}",
            path=str(path),
        )
    efficiency = Efficiency(
        mfu=eff.number("mfu", positive=True, at_most=1.0),
        mbu=eff.number("mbu", positive=True, at_most=1.0),
        step_overhead_s=eff.number("step_overhead_s", nonneg=True),
        decode_mfu=eff.number("decode_mfu", 0.0, nonneg=True, at_most=1.0),
        measured_memory_scale=eff.number("measured_memory_scale", 1.0, positive=True, at_most=10.0),
        measured_compute_scale=eff.number(
            "measured_compute_scale", 1.0, positive=True, at_most=10.0
        ),
    )
    eff.done()
    gmu, reserve, free_fraction = 0.9, 0.0, Hardware.free_gpu_memory_fraction
    if mem is not None:
        gmu = mem.number("gpu_memory_utilization", 0.9, positive=True, at_most=1.0)
        reserve = mem.number("activation_reserve_gb", 0.0, nonneg=True) * GB
        free_fraction = mem.number(
            "free_gpu_memory_fraction", free_fraction, positive=True, at_most=1.0
        )
        mem.done()
    host_fixed = 0.0
    power = Power()
    if power_table is not None:
        power = Power(
            host_w=power_table.number("host_w", Power.host_w, nonneg=True),
            pue=power_table.number("pue", Power.pue, positive=True),
        )
        if power.pue < 1.0:
            raise power_table.error("power.pue", f"must be >= 1, got {power.pue}")
        power_table.done()
    if prices is not None:
        host_fixed = prices.number("host_fixed_per_hour", 0.0, nonneg=True, at_most=MAX_PRICE)
        if prices.has("electricity_per_kwh"):
            kwh = prices.number("electricity_per_kwh", nonneg=True, at_most=MAX_PRICE)
            power = Power(power.host_w, power.pue, kwh)
        if prices.has("gpu_price_per_hour"):
            price = prices.number("gpu_price_per_hour", nonneg=True, at_most=MAX_PRICE)
            gpu = GPUProfile(**{**gpu.__dict__, "price_per_hour": price})
        prices.done()
    tiers: dict[str, TierHardware] = {}
    tt = t.table("tiers")
    if tt is not None:
        for tier_name in list(tt.data):
            if tier_name not in LOWER_TIERS:
                known = ", ".join(LOWER_TIERS)
                raise tt.error(f"tiers.{tier_name}", f"unknown tier (one of {known})")
            sub = tt.table(tier_name)
            assert sub is not None
            tiers[tier_name] = _tier_hardware(tier_name, sub)
        tt.done()
    t.done()
    return Hardware(
        name=name,
        gpu=gpu,
        topology=topology,
        efficiency=efficiency,
        gpu_memory_utilization=gmu,
        activation_reserve_bytes=reserve,
        free_gpu_memory_fraction=free_fraction,
        host_fixed_per_hour=host_fixed,
        source=str(path),
        tiers=tiers,
        power=power,
        prefill_gpu=prefill_gpu,
    )


def _tier_hardware(name: str, t: Table) -> TierHardware:
    """One ``[tiers.NAME]`` table: GB, GB/s, microseconds, $ per GB-hour, W and pJ/bit (the
    power keys default to the tier kind's ``power`` trait, :mod:`kvtier.tier_kinds`; a kind
    without one needs all four in the table)."""
    w_gb, pj, host_w, pool_w = TIER_KINDS[name].traits.get("power") or (None,) * 4
    read = t.number("port_read_gbps", positive=True) * GB
    tier = TierHardware(
        name=name,
        capacity_bytes=t.number("capacity_gb", positive=True) * GB,
        port_read_bw=read,
        port_write_bw=t.number("port_write_gbps", read / GB, positive=True) * GB,
        op_overhead_s=t.number("op_overhead_us", nonneg=True) * 1e-6,
        latency_s=t.number("latency_us", 0.0, nonneg=True) * 1e-6,
        pool_bw=t.number("pool_gbps", 0.0, nonneg=True) * GB,
        device_bw=t.number("device_gbps", 0.0, nonneg=True) * GB,
        devices=t.integer("devices", 1),
        interleave=t.boolean("interleave", True),
        price_per_gb_hour=t.number("price_per_gb_hour", 0.0, nonneg=True, at_most=MAX_PRICE),
        fabric_per_host_hour=t.number("fabric_per_host_hour", 0.0, nonneg=True),
        shared=t.boolean("shared") if t.has("shared") else None,
        ports=t.integer("ports", 1),
        attach=t.string("attach", "host", choices=("host", "gpu")),
        gpu_link_bw=t.number("gpu_link_gbps", 0.0, nonneg=True) * GB,
        dwpd=t.number("dwpd", 0.0, nonneg=True),
        drives=t.integer("drives", 1),
        drive_price=t.number("drive_price", 0.0, nonneg=True, at_most=MAX_PRICE),
        warranty_years=t.number("warranty_years", 5.0, positive=True),
        w_per_gb=t.number("w_per_gb", w_gb, nonneg=True),
        pj_per_bit=t.number("pj_per_bit", pj, nonneg=True),
        host_w=t.number("host_w", host_w, nonneg=True),
        pool_w=t.number("pool_w", pool_w, nonneg=True),
    )
    t.done()
    if TIER_KINDS[name].traits.get("gpu_link") and tier.gpu_link_bw <= 0:
        raise t.error(
            f"tiers.{name}.gpu_link_gbps",
            "required: each GPU reaches this kind over a link of its own (GB/s per GPU, > 0)",
        )
    return tier
