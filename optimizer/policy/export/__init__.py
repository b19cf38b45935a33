"""Exporters: a kvtier policy as the configuration a serving system loads.

``export(policy, target, hardware, model)`` places the policy on the hardware profile
(:class:`~kvtier.policy.export.common.Deployment`) and hands it to one module per target;
each returns an :class:`ExportResult`: the files to write and plain notes on every setting the
target cannot express or only approximates. Each module's docstring names the source (repository
and path, or documentation page) and the version every key was read from; ``docs/export.md``
has the mapping tables.
"""

from __future__ import annotations

from collections.abc import Callable

from kvtier.errors import InputError
from kvtier.hardware.types import Hardware, ModelProfile
from kvtier.policy.export.common import Deployment, ExportResult, deployment
from kvtier.policy.export.dynamo import export_dynamo
from kvtier.policy.export.lmcache import export_lmcache
from kvtier.policy.export.mooncake import export_mooncake
from kvtier.policy.export.sglang import export_sglang
from kvtier.policy.export.vllm import export_vllm
from kvtier.policy.model import Policy

EXPORTERS: dict[str, Callable[[Deployment], ExportResult]] = {
    "vllm": export_vllm,
    "lmcache": export_lmcache,
    "sglang": export_sglang,
    "dynamo": export_dynamo,
    "mooncake": export_mooncake,
}
TARGETS = tuple(EXPORTERS)


def export(policy: Policy, target: str, hardware: Hardware, model: ModelProfile) -> ExportResult:
    """The files and notes of ``target`` for ``policy`` on ``hardware`` serving ``model``."""
    if target not in EXPORTERS:
        raise InputError(f"unknown export target {target!r} (one of {', '.join(TARGETS)})")
    return EXPORTERS[target](deployment(policy, hardware, model))


__all__ = ["TARGETS", "Deployment", "ExportResult", "deployment", "export"]
