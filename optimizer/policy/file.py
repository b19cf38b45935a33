"""Policy files (``kvtier-policy/1``) with the metrics they achieved and their provenance.

A policy file is what the optimizer hands to people and to serving systems. Besides the policy
itself (``kvtier.policy.model``) it records:

* ``[metrics]``: what the policy achieved when it was found (the simulator's ``Metrics``);
* ``[provenance]``: the trace file and its sha256, the kvtier version, the study, trial and
  seed, the hardware and model profiles, and the load (``rate_scale``) the metrics were
  measured at, so ``kvtier replay --policy FILE --trace TRACE`` reproduces them exactly.

TOML has no null: absent values are left out. Files are written atomically.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomli_w

from kvtier.errors import InputError
from kvtier.policy.model import Policy, policy_from_dict, policy_to_dict
from kvtier.toml_fields import read_toml


def sha256_of(path: str | Path) -> str:
    """The sha256 of a file, or of a directory's Parquet parts (their relative paths and
    contents, in name order: the trace a directory holds)."""
    digest = hashlib.sha256()
    path = Path(path)
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with open(file, "rb") as fh:
            for chunk in iter(lambda fh=fh: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def _clean(value: Any) -> Any:
    """Drop None (TOML has no null); keep NaN and infinities, which TOML has."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value if v is not None]
    return value


@dataclass(frozen=True)
class PolicyFile:
    policy: Policy
    metrics: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    # [[faults]] tables, as written (kvtier.sim.faults.fault_of reads each; a replay runs them)
    faults: list[dict[str, Any]] = field(default_factory=list)

    @property
    def rate_scale(self) -> float:
        value = self.provenance.get("rate_scale", 1.0)
        return float(value) if isinstance(value, int | float) and math.isfinite(value) else 1.0


def write_policy_file(
    path: str | Path,
    policy: Policy,
    *,
    metrics: dict[str, Any] | None = None,
    provenance: dict[str, Any] | None = None,
) -> None:
    from kvtier.files import atomic_write

    data = policy_to_dict(policy)
    if metrics:
        data["metrics"] = metrics
    if provenance:
        data["provenance"] = provenance
    text = tomli_w.dumps(_clean(data))

    def write(tmp: str) -> None:
        Path(tmp).write_text(text)

    atomic_write(path, write)


def read_policy_file(path: str | Path) -> PolicyFile:
    """The policy (validated strictly) with its metrics and provenance sections."""
    data = read_toml(Path(path))
    policy = policy_from_dict(data, str(path))
    metrics = data.get("metrics", {})
    provenance = data.get("provenance", {})
    faults = data.get("faults", [])
    if not isinstance(faults, list) or not all(isinstance(f, dict) for f in faults):
        raise InputError(f"{path}: faults must be [[faults]] tables")
    return PolicyFile(
        policy,
        metrics if isinstance(metrics, dict) else {},
        provenance if isinstance(provenance, dict) else {},
        faults,
    )
