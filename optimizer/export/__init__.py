"""Exporters: a kvtier policy as the configuration a serving system loads.

``export(policy, target, hardware, model)`` places the policy on the hardware profile
(:class:`~kvtier.export.common.Deployment`) and hands it to one module per target; each returns
an :class:`ExportResult`: the files to write and structured notes
(:class:`~kvtier.export.common.Note`: inexpressible, approximate, informational) on every
setting the target cannot express or only approximates. Each module also declares its
capabilities as data (:mod:`kvtier.export.capabilities`), which ``optimize --target``
searches within, and every export names the releases it is written for
(:mod:`kvtier.export.releases`). Each module's docstring names the source every key was read
from; ``docs/export.md`` has the mapping tables.
"""

from __future__ import annotations

from dataclasses import replace

from kvtier.export.common import Deployment, ExportResult, Note, deployment
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
    """The files and notes of ``target`` for ``policy`` on ``hardware`` serving ``model``,
    with the releases the files are written for (:attr:`ExportResult.release`) and the notes
    every target shares (:func:`kvtier.export.capabilities.capability_notes`)."""
    from kvtier.export.capabilities import capabilities, capability_notes
    from kvtier.export.releases import target_release

    exporter = EXPORTERS.get(target, option="--target").load()
    deploy = deployment(policy, hardware, model)
    policy, inert = _without_inert(deploy)
    if inert:
        deploy = replace(deploy, policy=policy)
    result = exporter(deploy)
    caps = capabilities(target)
    notes = [*result.notes, *capability_notes(deploy, caps), *inert]
    notes += _unplaced_tiers(policy, caps.tiers, caps.target, notes)
    # an exporter's own release names a further file's target (llm-d's EPP config)
    release = ", ".join(r for r in (target_release(target), result.release) if r)
    return replace(result, notes=notes, release=release)


def _without_inert(deploy: Deployment) -> tuple[Policy, list[Note]]:
    """The deployment's policy without the settings that took no effect in its replay
    (:func:`kvtier.policy.model.inert_movement_keys`: no lower tier, no prefill-to-decode
    hand-off), and a note naming them: they need no setting, and none is inexpressible."""
    from kvtier.export.common import info
    from kvtier.policy.model import inert_movement_keys, without_inert_movement

    policy = deploy.policy
    split = deploy.layout is not None and deploy.layout.n_prefill > 0
    inert = inert_movement_keys(policy, split)
    if not inert:
        return policy, []
    said = ", ".join(f"{k} = {getattr(policy, k)} ({why})" for k, why in inert.items())
    note = info(f"Settings with no effect in the simulation, which need no setting: {said}.")
    return without_inert_movement(policy, split), [note]


def _unplaced_tiers(
    policy: Policy, placed: tuple[str, ...], target: str, notes: list[Note]
) -> list[Note]:
    """An inexpressible note for each lower tier the target cannot place (its capabilities'
    ``tiers``) that no inexpressible note of the exporter names already: a tier kind is never
    left out of an export silently. An implicit kind (a file system's page cache) is placed
    with the tier behind it (the next in lookup order) and the exporter says so."""
    from kvtier.export.common import INEXPRESSIBLE, inexpressible, info
    from kvtier.hardware.types import LOWER_TIERS
    from kvtier.tier_kinds import trait

    def behind(name: str) -> str:
        i = LOWER_TIERS.index(name)
        return LOWER_TIERS[i + 1] if i + 1 < len(LOWER_TIERS) else ""

    said = " ".join(n for n in notes if n.kind == INEXPRESSIBLE)
    every = " ".join(notes)
    listed = {t.name for t in policy.lower_tiers}
    out = []
    for t in policy.lower_tiers:
        if t.name in placed:
            continue
        if trait(t.name, "implicit") and behind(t.name) in placed and behind(t.name) in listed:
            if f" {t.name} " not in f" {every} ":
                out.append(
                    info(
                        f"The {t.name} tier comes with the {behind(t.name)} tier's mount: "
                        f"{target} sets nothing for it; its size is the host's own."
                    )
                )
        elif f" {t.name} " not in f" {said} ":
            out.append(
                inexpressible(
                    f"The {t.name} tier is not exported: {target} places only "
                    f"{', '.join(placed) or 'no tier'} below HBM; its blocks would be recomputed."
                )
            )
    return out


__all__ = ["EXPORTERS", "TARGETS", "Deployment", "ExportResult", "Note", "deployment", "export"]
