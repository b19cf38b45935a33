"""Faults of the tiers below HBM: what fails, when, for how long, and how it comes back.

A replay may lose, at a given time, a lower tier's pool (``kind = "tier"``), one device of a
pool striped over several (``"device"``), a host's per-host pools (``"host"``), or the
switch in front of a pool (``"switch"``: its blocks survive but cannot be reached). Written
``--fault "tier=cxl,at=120,down=30,devices=4,device=1,rebuild_gbps=25"`` on the command line
(:func:`parse_fault`) and resolved against a replay's tiers into arrays
(:func:`fault_arrays`) that both engines read through :mod:`kvtier.sim.fault_step`, where the
rules are (docs/model.md, "Faults").

Blocks map to a pool's devices by block id modulo the device count (``device = id %
devices``): the dense ids are assigned in order of first appearance, so the mapping spreads
a trace's blocks evenly, as a store that places each object on a segment chosen
independently of its key does (an assumption, docs/sources.md [Faults-2026]).

This module does not import numba: the command line parses and checks faults without it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kvtier.errors import InputError

if TYPE_CHECKING:
    from kvtier.sim.tiers import TierConfig

KINDS = ("tier", "device", "host", "switch")
KEYS = ("kind", "tier", "at", "down", "device", "devices", "host", "rebuild_gbps")

# columns of the integer fault array (one row per failed pool)
FI_POOL, FI_DEV, FI_NDEV, FI_LOSE, FI_STATE, FI_LOST, FI_CURSOR, FI_TIER, FI_FAULT = range(9)
N_FI = 9
# columns of the float fault array
FT_AT, FT_UP, FT_REBUILD = range(3)
N_FT = 3
# states (FI_STATE)
PENDING, DOWN, UP = 0, 1, 2


@dataclass(frozen=True)
class Fault:
    """One failure: ``kind`` of ``tier`` (``host``: that host's per-host pools) at ``at_s``,
    unreachable for ``down_s`` seconds, then back empty (blocks lost) or with its blocks
    (``switch``); with ``rebuild_gbps`` > 0 the lost blocks are restored from replicas at that
    rate once it is back."""

    kind: str
    tier: str | None
    at_s: float
    down_s: float = 0.0
    device: int = -1
    devices: int = 1
    host: int = -1
    rebuild_gbps: float = 0.0

    def label(self) -> str:
        where = self.tier or "hosts"
        if self.kind == "device":
            where += f" device {self.device}/{self.devices}"
        if self.host >= 0:
            where += f" host {self.host}"
        return f"{self.kind} {where} at {self.at_s:g} s for {self.down_s:g} s"


def _number(key: str, value: str, option: str) -> float:
    text = value.strip().lower()
    if key in ("at", "down") and text.endswith("s"):
        text = text[:-1]
    try:
        x = float(text)
    except ValueError:
        raise InputError(f"{option}: {key}={value!r} is not a number") from None
    if not math.isfinite(x) or x < 0:
        raise InputError(f"{option}: {key}={value!r} must be finite and >= 0")
    return x


def _integer(key: str, value: str, option: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise InputError(f"{option}: {key}={value!r} is not an integer") from None


def fault_of(fields: dict[str, object], option: str = "--fault") -> Fault:
    """A :class:`Fault` from a mapping of its keys (a ``--fault`` string's or a TOML table's);
    one-line errors name the option and the key, with the valid choices."""
    unknown = sorted(set(fields) - set(KEYS))
    if unknown:
        raise InputError(f"{option}: unknown key {unknown[0]!r}; valid keys: {', '.join(KEYS)}")
    raw = {k: str(v) for k, v in fields.items()}
    if "at" not in raw:
        raise InputError(f"{option}: 'at' (seconds from the trace's start) is required")
    device = _integer("device", raw["device"], option) if "device" in raw else -1
    devices = _integer("devices", raw["devices"], option) if "devices" in raw else 1
    host = _integer("host", raw["host"], option) if "host" in raw else -1
    implied = "device" if device >= 0 else ("host" if host >= 0 and "tier" not in raw else "tier")
    kind = raw.get("kind", implied)
    if kind not in KINDS:
        raise InputError(f"{option}: kind={kind!r}; valid kinds: {', '.join(KINDS)}")
    tier = raw.get("tier")
    if kind != "host" and not tier:
        raise InputError(f"{option}: kind={kind} needs tier=NAME (a lower tier of the policy)")
    if kind == "device" and not (devices >= 2 and 0 <= device < devices):
        raise InputError(f"{option}: a device fault needs devices >= 2 and 0 <= device < devices")
    if kind != "device" and device >= 0:
        raise InputError(f"{option}: device= applies only to kind=device")
    if kind == "host" and host < 0:
        raise InputError(f"{option}: kind=host needs host=N (the host's index, from 0)")
    if devices < 1 or host < -1:
        raise InputError(f"{option}: devices must be >= 1 and host >= 0")
    return Fault(
        kind=kind,
        tier=tier,
        at_s=_number("at", raw["at"], option),
        down_s=_number("down", raw["down"], option) if "down" in raw else 0.0,
        device=device,
        devices=devices,
        host=host,
        rebuild_gbps=_number("rebuild_gbps", raw["rebuild_gbps"], option)
        if "rebuild_gbps" in raw
        else 0.0,
    )


def parse_fault(spec: str, option: str = "--fault") -> Fault:
    """``"tier=cxl,at=120s,down=30,devices=4,device=1,rebuild_gbps=25"`` as a :class:`Fault`."""
    fields: dict[str, object] = {}
    for part in spec.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep:
            raise InputError(f"{option}: {part.strip()!r} is not KEY=VALUE; valid keys: "
                             f"{', '.join(KEYS)}")  # fmt: skip
        fields[key.strip()] = value.strip()
    return fault_of(fields, option)


def fault_arrays(
    faults: tuple[Fault, ...], tiers: TierConfig | None, n_blocks: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The faults as the engines read them: one row per failed pool (a fault of a per-host
    tier without ``host`` fails every host's pool), ``(ints (F, N_FI), floats (F, N_FT),
    lost ids (F, M))``; ``M`` bounds the blocks a pool can hold. Checks every name and index
    against the replay's tiers (one-line errors naming the option)."""
    rows: list[tuple[list[int], list[float]]] = []
    if faults and tiers is None:
        raise InputError("--fault: the policy has no tier below HBM to fail")
    for which, f in enumerate(faults):
        if tiers is None:
            break
        if f.kind == "host":
            ts = [t for t in range(tiers.n_tiers) if tiers.per_host[t]]
            if f.tier is not None:
                ts = [t for t in ts if tiers.names[t] == f.tier]
            if not ts:
                raise InputError("--fault: kind=host fails per-host tiers; the policy has none")
        else:
            if f.tier not in tiers.names:
                raise InputError(
                    f"--fault: tier={f.tier!r} is not a lower tier of the policy; valid tiers: "
                    f"{', '.join(tiers.names)}"
                )
            ts = [tiers.names.index(f.tier)]
        if f.host >= tiers.n_hosts:
            raise InputError(f"--fault: host={f.host} but the deployment has {tiers.n_hosts}")
        rebuild = math.inf
        if f.rebuild_gbps > 0:
            rebuild = float(tiers.block_bytes) / (f.rebuild_gbps * 1e9 / 8)  # s per block
        for t in ts:
            base = int(tiers.pool_base[t])
            if tiers.per_host[t] and f.host >= 0:  # that host's pool, or its engines' own
                on_host = tiers.pool_local[t][tiers.inst_host == f.host]
                locals_ = sorted({int(x) for x in on_host})
            else:  # every pool of the tier (each host's, each engine's, or the shared one)
                locals_ = list(range(int(tiers.pool_count[t])))
            for h in locals_:
                ints = [0] * N_FI
                ints[FI_POOL] = base + h
                ints[FI_DEV] = f.device if f.kind == "device" else -1
                ints[FI_NDEV] = f.devices if f.kind == "device" else 1
                ints[FI_LOSE] = 0 if f.kind == "switch" else 1
                ints[FI_STATE] = PENDING
                ints[FI_TIER] = t
                ints[FI_FAULT] = which
                floats = [f.at_s, f.at_s + f.down_s, rebuild]
                rows.append((ints, floats))
    F = len(rows)
    fi = np.zeros((F, N_FI), dtype=np.int64)
    ft = np.zeros((F, N_FT), dtype=np.float64)
    width = 1
    for x, (ints, floats) in enumerate(rows):
        fi[x] = ints
        ft[x] = floats
        cap = int(tiers.capacity_blocks[ints[FI_TIER]]) if tiers is not None else 0
        width = max(width, min(cap, max(n_blocks, 1)) + 1)
    lost = np.full((F, width if F else 0), -1, dtype=np.int32)
    return fi, ft, lost


def lost_ids(fi: np.ndarray, lost: np.ndarray, n_faults: int) -> tuple[np.ndarray, ...]:
    """Per fault, the ids of the blocks its pools held when they failed (ascending per pool,
    pools in order)."""
    out = []
    for which in range(n_faults):
        rows = [f for f in range(fi.shape[0]) if fi[f, FI_FAULT] == which]
        parts = [lost[f, : int(fi[f, FI_LOST])].astype(np.int64) for f in rows]
        out.append(np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64))
    return tuple(out)
