"""Energy of one replay: joules per token and the electricity it costs.

Computed after the replay from its :class:`kvtier.sim.result.RawResult` (numpy, no kernel), so
both engines give the same energy from their identical outputs. Over the replay's span ``T``
(first arrival to last finish, as the metrics' duration; docs/sources.md [Power-2026] for every
figure the profiles give):

- GPUs: each instance's ``g`` GPUs draw ``idle_w`` all the time and ``tdp_w - idle_w`` more
  while the instance runs iterations: ``g * (idle_w * T + (tdp_w - idle_w) * busy_s)``, with
  ``busy_s`` the instance's seconds in iterations (at most ``T``);
- hosts: ``host_w`` per occupied host (CPUs, fans, board) for ``T``;
- each lower tier: ``w_per_gb`` per GB it holds (all its pools, as it is priced), ``host_w``
  per occupied host (NICs, adapters, drives idle) and ``pool_w`` per pool (a shared pool's
  switch and chassis), for ``T``; and ``pj_per_bit`` for every bit read from it or written
  to it (the memory access and the links on its path);
- cooling: the sum above (the IT energy) times ``pue - 1``.

``energy_j`` is the facility's energy (IT energy times PUE); per token it counts the served
requests' input and output tokens, as throughput does. ``electricity_per_hour`` is the mean
power priced at ``electricity_per_kwh``, which the replay adds to its cost per hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from kvtier.hardware.types import Hardware
from kvtier.sim.config import SimConfig
from kvtier.sim.result import RawResult
from kvtier.sim.tier_stats import replay_span
from kvtier.trace.blocked import BlockedTrace

PARTS = ("gpu_idle", "gpu_busy", "host", "tier_held", "tier_moved", "cooling")


@dataclass(frozen=True)
class Energy:
    """Joules of one replay, by part (:data:`PARTS`), and its figures per token and hour."""

    parts_j: dict[str, float]
    span_s: float
    tokens: int
    electricity_per_kwh: float

    @property
    def energy_j(self) -> float:
        return float(sum(self.parts_j.values()))

    @property
    def power_w(self) -> float:
        """Mean facility power over the span (NaN for an empty span)."""
        return self.energy_j / self.span_s if self.span_s > 0 else math.nan

    @property
    def joules_per_token(self) -> float:
        return self.energy_j / self.tokens if self.tokens else math.inf

    @property
    def tokens_per_joule(self) -> float:
        return self.tokens / self.energy_j if self.energy_j > 0 else math.nan

    @property
    def electricity_per_hour(self) -> float:
        """$ per hour of the mean power at the electricity price (0 when the price is 0)."""
        if not self.electricity_per_kwh or not self.span_s > 0:
            return 0.0
        return self.power_w / 1e3 * self.electricity_per_kwh


def instance_gpus(cfg: SimConfig, hardware: Hardware) -> np.ndarray:
    """GPUs of each instance (the layout's, or the topology's ``tp`` for every instance)."""
    if len(cfg.instance_gpus) == cfg.n_instances:
        return np.asarray(cfg.instance_gpus, dtype=np.float64)
    return np.full(cfg.n_instances, float(hardware.topology.tp))


def occupied_hosts(cfg: SimConfig, hardware: Hardware) -> int:
    """Hosts the instances occupy (the layout's, or their GPUs over a host's)."""
    if cfg.hosts:
        return cfg.hosts
    gpus = int(instance_gpus(cfg, hardware).sum())
    return -(-gpus // hardware.topology.gpus_per_host)


def replay_energy(
    raw: RawResult,
    cfg: SimConfig,
    hardware: Hardware,
    arrival_s: np.ndarray,
    tokens: int,
) -> Energy:
    """The energy of one replay of ``cfg`` on ``hardware`` (see the module docstring);
    ``arrival_s`` are the requests' arrivals as replayed, ``tokens`` the served tokens."""
    span = max(replay_span(arrival_s, raw), 0.0)
    gpu = hardware.gpu
    g = instance_gpus(cfg, hardware)
    busy = np.minimum(np.asarray(raw.busy_s, dtype=np.float64), span)
    hosts = occupied_hosts(cfg, hardware)
    held = moved = 0.0
    tiers = cfg.tiers
    if tiers is not None:
        for t, name in enumerate(tiers.names):
            hw = hardware.tiers.get(name)
            if hw is None:
                continue
            pools = tiers.n_hosts if hw.per_host else 1
            watts = hw.w_per_gb * tiers.tier_gb.get(name, 0.0) + hw.host_w * hosts
            held += (watts + hw.pool_w * pools) * span
            if t < len(raw.tier_bytes_read):
                bits = 8.0 * float(raw.tier_bytes_read[t] + raw.tier_bytes_written[t])
                moved += bits * hw.pj_per_bit * 1e-12
    gpu_idle = float(g.sum()) * gpu.idle_w * span
    gpu_busy = float((g * busy).sum()) * (gpu.tdp_w - gpu.idle_w)
    pf = cfg.prefill_gpu
    if pf is not None and cfg.n_prefill:  # the prefill instances' GPU type differs
        n = cfg.n_prefill
        gpu_idle = (float(g[:n].sum()) * pf.idle_w + float(g[n:].sum()) * gpu.idle_w) * span
        gpu_busy = float((g[:n] * busy[:n]).sum()) * (pf.tdp_w - pf.idle_w) + float(
            (g[n:] * busy[n:]).sum()
        ) * (gpu.tdp_w - gpu.idle_w)
    parts = {
        "gpu_idle": gpu_idle,
        "gpu_busy": gpu_busy,
        "host": hosts * hardware.power.host_w * span,
        "tier_held": held,
        "tier_moved": moved,
    }
    parts["cooling"] = sum(parts.values()) * (hardware.power.pue - 1.0)
    return Energy(parts, span, int(tokens), hardware.power.electricity_per_kwh)


def served_tokens(trace: BlockedTrace, raw: RawResult) -> int:
    """Input and output tokens of the served requests (what throughput counts)."""
    served = ~np.isnan(raw.finish_s)
    return int(trace.input_tokens[served].sum() + trace.output_tokens[served].sum())


def energy_fields(energy: Energy) -> dict[str, Any]:
    """The :class:`kvtier.sim.metrics.Metrics` fields of ``energy``."""
    return {
        "energy_j": energy.energy_j,
        "joules_per_token": energy.joules_per_token,
        "tokens_per_joule": energy.tokens_per_joule,
        "power_w": energy.power_w,
        "energy_parts_j": dict(energy.parts_j),
        "electricity_per_hour": energy.electricity_per_hour,
    }
