"""Plug-in registries: one per kind, read everywhere; the cache dispatch covers every entry."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields

import pytest

from kvtier.cache import gen
from kvtier.cache.registry import EVICTIONS
from kvtier.errors import InputError
from kvtier.export import EXPORTERS
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.policy.registries import LOAD_RULES, ROUTERS, WRITE_POLICIES
from kvtier.registry import Entry, Registry

HOOKS = ("hit_nb", "admit_nb", "insert_nb", "evict_nb", "remove_nb")
CONSTANTS = ("ADMIT_FIRST", "REMOVE_ABSENT", "USES_HEAP", "USES_COST")


def test_generated_dispatch_matches_the_registry() -> None:
    """hooks.py and kernels.py are what kvtier.cache.gen writes from the registry today: a
    policy registered without regenerating them (or a hand edit) fails here."""
    for path, text in gen.sources().items():
        assert path.read_text() == text, f"{path.name} is stale: run python -m kvtier.cache.gen"


def test_every_policy_is_dispatched_once_per_hook() -> None:
    from kvtier.cache import hooks

    assert tuple(e.code for e in EVICTIONS) == hooks.CODES
    source = gen.hooks_source()
    for entry in EVICTIONS:
        module = entry.impl.rsplit(".", 1)[1]
        for hook in HOOKS:
            calls = re.findall(rf"\b{module}\.{hook}\(", source)
            assert len(calls) == 1, (entry.name, hook)
    kernels = gen.kernels_source()
    for entry in EVICTIONS:
        assert kernels.count(f"_loop_nb({entry.code}, tier, ") == 2  # one loop per kernel


def test_a_new_entry_gets_its_branches() -> None:
    """The generator writes a branch for every entry (here a registry with a seventh)."""
    extra = Registry(
        "eviction policy",
        [*EVICTIONS, Entry("clock", len(EVICTIONS), "x", impl="kvtier.cache.policies.clock")],
    )
    text = gen.hooks_source(extra)
    assert f"pol == {len(EVICTIONS) - 1}:  # {EVICTIONS.names[-1]}" in text
    assert "else:  # clock\n        clock.hit_nb(" in text
    assert text != gen.hooks_source()


@pytest.mark.parametrize("entry", list(EVICTIONS), ids=EVICTIONS.names)
def test_every_policy_module_has_the_interface(entry: Entry) -> None:
    module = entry.load()
    for name in (*HOOKS, *CONSTANTS, "check", "configure", "Reference"):
        assert hasattr(module, name), (entry.name, name)
    for name in CONSTANTS:
        assert isinstance(getattr(module, name), bool)
    module.check(dict(entry.defaults))


def test_registry_rules() -> None:
    with pytest.raises(ValueError, match="duplicate"):
        Registry("x", [Entry("a", 0, ""), Entry("a", 1, "")])
    with pytest.raises(ValueError, match="codes must be 0, 1"):
        Registry("x", [Entry("a", 1, "")])
    with pytest.raises(InputError) as err:
        ROUTERS.get("least_load", option="--set")
    assert str(err.value) == (
        "option --set: unknown router 'least_load' (did you mean 'least_loaded'?); "
        "choose from round_robin, least_loaded, prefix_affinity, kv_aware, llmd_epp"
    )
    assert ROUTERS.by_code(2).name == "prefix_affinity"
    assert EVICTIONS["s3fifo"].defaults == {"small": 0.1, "ghost": 0.9, "threshold": 2}


def test_names_and_codes_come_from_the_registries() -> None:
    from kvtier import cli
    from kvtier.cache.enums import POLICY_NAMES
    from kvtier.cache.policies import parse_policy, policy_names
    from kvtier.sim.config import ROUTER_CODES
    from kvtier.sim.tiers import WRITE_CODES

    meta = {f.name: f.metadata for f in fields(Policy)}
    assert meta["write_policy"]["choices"] == WRITE_POLICIES.names
    assert meta["load_rule"]["choices"] == LOAD_RULES.names
    serving = {f.name: f.metadata for f in fields(ServingPolicy)}
    assert serving["routing"]["choices"] == ROUTERS.names
    tier = {f.name: f.metadata for f in fields(TierPolicy)}
    assert tier["eviction"]["choices"] == EVICTIONS.names
    assert ROUTERS.codes == ROUTER_CODES and WRITE_POLICIES.codes == WRITE_CODES
    assert {e.code: e.name for e in EVICTIONS} == POLICY_NAMES
    assert policy_names() == list(EVICTIONS.names)
    assert parse_policy("s3fifo").name == "s3fifo(small=0.1,ghost=0.9,threshold=2)"
    assert EXPORTERS.names == cli.EXPORT_TARGETS
    target = next(p for p in cli.main.commands["export"].params if p.name == "target")
    assert list(target.type.choices) == [*EXPORTERS.names, "all"]


def test_every_exporter_loads() -> None:
    for entry in EXPORTERS:
        assert callable(entry.load()), entry.name


def test_registries_do_not_import_numba() -> None:
    code = (
        "import sys, kvtier.policy.model, kvtier.policy.overrides, kvtier.export, "
        "kvtier.cache.registry; print('numba' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_docs_tables_are_written_from_the_code() -> None:
    """docs/policy.md, cache.md and export.md hold the tables the registries and field metadata
    give today (python -m kvtier.report.doctables rewrites them)."""
    from kvtier.report import doctables

    for name in doctables.TABLES:
        assert doctables.current(name) == doctables.render(name), name
    row = (
        "| `serving.routing` | `round_robin`, `least_loaded`, `prefix_affinity`, `kv_aware`, "
        "`llmd_epp` |"
    )
    assert row in doctables.render("policy-settings")
