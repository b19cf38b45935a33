"""Exporters: a kvtier policy as the configuration a serving system loads.

``export(policy, target, hardware, model)`` places the policy on the hardware profile
(:class:`~kvtier.export.common.Deployment`) and hands it to one module per target;
each returns an :class:`ExportResult`: the files to write and plain notes on every setting the
target cannot express or only approximates. Each module's docstring names the source (repository
and path, or documentation page) and the version every key was read from; ``docs/export.md``
has the mapping tables.
"""

from __future__ import annotations

from kvtier.export.common import Deployment, ExportResult, deployment
from kvtier.hardware.types import Hardware, ModelProfile
from kvtier.policy.model import Policy
from kvtier.registry import Entry, Registry


def _target(name: str, code: int, help: str) -> Entry:
    return Entry(name, code, help, impl=f"kvtier.export.{name}:export_{name}")


# The exporter registry: the CLI's --target choices and docs/export.md read it. An exporter is a
# module kvtier/export/NAME.py with export_NAME(Deployment) -> ExportResult, imported
# only when that target is exported.
EXPORTERS = Registry(
    "export target",
    [
        _target("vllm", 0, "a vllm serve command line, with LMCache behind --kv-transfer-config"),
        _target("lmcache", 1, "the YAML file LMCACHE_CONFIG_FILE points to"),
        _target("sglang", 2, "a sglang.launch_server command line with HiCache flags"),
        _target("dynamo", 3, "the KV Block Manager (KVBM) environment of NVIDIA Dynamo"),
        _target("mooncake", 4, "Mooncake Store client JSON per host, and the master's flags"),
    ],
)
TARGETS = EXPORTERS.names


def export(policy: Policy, target: str, hardware: Hardware, model: ModelProfile) -> ExportResult:
    """The files and notes of ``target`` for ``policy`` on ``hardware`` serving ``model``."""
    exporter = EXPORTERS.get(target, option="--target").load()
    return exporter(deployment(policy, hardware, model))


__all__ = ["EXPORTERS", "TARGETS", "Deployment", "ExportResult", "deployment", "export"]
