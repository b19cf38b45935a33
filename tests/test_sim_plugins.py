"""The serving engines' plug-in families: one module per mechanism, the registry the only list.

A router is a module of :mod:`kvtier.sim.routers` holding its reference step and its numba
twin; its registry entry names the module and carries its traits; the kernels reach it through
the dispatch :mod:`kvtier.sim.gen` writes from the registry. These tests fail when a registry
entry has no module, a module lacks a twin, or the checked-in dispatch is stale.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest

from kvtier.policy.registries import LOAD_RULES, ROUTERS, WRITE_POLICIES, content_blind_routers
from kvtier.registry import Entry, Registry
from kvtier.sim import gen


def test_generated_dispatch_is_current() -> None:
    for path, text in gen.sources().items():
        assert path.read_text() == text, f"{path} is stale: run python -m kvtier.sim.gen"


# family -> (reference step, numba twin, traits every entry declares)
TWINS = {
    "router": ("route", "route_nb", ("content_blind",)),
    "write policy": ("chosen", "chosen_nb", ("cascade", "sightings")),
    "load rule": ("choose", "choose_nb", ()),
}
ENTRIES = [e for reg in (ROUTERS, WRITE_POLICIES, LOAD_RULES) for e in reg]
KINDS = {e.name: reg.kind for reg in (ROUTERS, WRITE_POLICIES, LOAD_RULES) for e in reg}


@pytest.mark.parametrize("entry", ENTRIES, ids=[e.name for e in ENTRIES])
def test_every_plugin_module_holds_both_twins(entry: Entry) -> None:
    step, twin, traits = TWINS[KINDS[entry.name]]
    module = importlib.import_module(entry.impl)
    assert callable(getattr(module, step)), entry.name
    assert hasattr(getattr(module, twin), "py_func"), f"{entry.name}: {twin} is not numba's"
    for trait in traits:
        assert isinstance(entry.traits.get(trait), bool), (entry.name, trait)


@pytest.mark.parametrize("family", gen.FAMILIES, ids=lambda f: f.registry.kind)
def test_dispatch_has_one_branch_per_registered_plugin(family: gen.Family) -> None:
    dispatch = importlib.import_module(f"{family.package}.dispatch")
    assert tuple(e.code for e in family.registry) == dispatch.CODES
    text = gen.dispatch_source(family)
    for entry in family.registry:
        assert f"{entry.impl.rsplit('.', 1)[1]}.{family.step}(" in text, entry.name


def test_a_new_registry_entry_gets_its_branch() -> None:
    """The generator writes a branch for an entry it was not written for (a plug-in from
    outside the package), and the checked-in text then differs."""
    extra = Entry("sticky", len(ROUTERS), "a test router", impl="my_plugins.sticky")
    family = gen.Family(
        **{**gen.ROUTER_FAMILY.__dict__, "registry": Registry("router", [*ROUTERS, extra])}
    )
    text = gen.dispatch_source(family)
    assert "import my_plugins.sticky as sticky" in text
    assert "    # sticky\n    return sticky.route_nb(sim, i)\n" in text
    assert text != gen.dispatch_source(gen.ROUTER_FAMILY)


def test_two_plugin_modules_with_one_name_are_refused() -> None:
    clash = Entry("other", len(ROUTERS), "clash", impl="elsewhere.round_robin")
    family = gen.Family(
        **{**gen.ROUTER_FAMILY.__dict__, "registry": Registry("router", [*ROUTERS, clash])}
    )
    with pytest.raises(ValueError, match="share a name"):
        gen.dispatch_source(family)


def test_content_blind_routers_come_from_the_traits() -> None:
    from kvtier.deploy.sample import content_blind
    from kvtier.policy import Policy

    assert content_blind_routers() == ("round_robin", "least_loaded")
    for name in ROUTERS.names:
        policy = Policy()
        policy = replace(policy, serving=replace(policy.serving, routing=name))
        assert content_blind(policy) == (name in content_blind_routers())
