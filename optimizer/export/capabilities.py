"""What an export target can express, as data: the search reads it, never the notes' prose.

Every exporter module declares ``CAPABILITIES`` (a :class:`Capabilities`): the lower tiers it
can place, the routers, schedulers, write policies, load rules, evictions, hierarchies, KV
layouts and dtypes it can configure, the block sizes the release it targets accepts, whether
it can run prefill/decode disaggregation (and over which connectors), and which tiers it can
run as one cache shared by several instances rather than a private share per process.

``optimize --target`` cuts its search space down to these (``kvtier.search.space``); a policy
inside them exports without a note of kind ``inexpressible``
(``tests/test_export_releases.py`` checks both directions on every preset).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache

from kvtier.export.common import Deployment, Note, approximate, inexpressible, info
from kvtier.export.releases import PACKAGES, TARGET_RELEASES
from kvtier.tier_kinds import trait as tier_trait

Value = bool | int | float | str


@dataclass(frozen=True)
class BlockSizes:
    """The block sizes (tokens) one release accepts: multiples of ``multiple_of`` from
    ``minimum``, or only ``choices`` when given. ``source`` names where that was read."""

    multiple_of: int = 1
    choices: tuple[int, ...] | None = None
    source: str = ""
    minimum: int = 1

    def accepts(self, tokens: int) -> bool:
        if self.choices is not None:
            return tokens in self.choices
        return tokens >= self.minimum and tokens % self.multiple_of == 0

    def describe(self) -> str:
        if self.choices is not None:
            return ", ".join(map(str, self.choices))
        return f"multiples of {self.multiple_of}" if self.multiple_of > 1 else "any size"


@dataclass(frozen=True)
class Capabilities:
    """What one target can express (each field: the policy values it takes).

    ``package`` is the key of :data:`kvtier.export.releases.PACKAGES` whose version the block
    sizes are looked up by; ``requires`` adds conditions to a searched parameter (a tier that
    can only be enabled beside another), as ``kvtier.search.space`` ``when`` clauses.
    """

    target: str
    package: str
    tiers: tuple[str, ...]
    routers: tuple[str, ...]
    schedulers: tuple[str, ...]
    write_policies: tuple[str, ...]
    load_rules: tuple[str, ...]
    evictions: tuple[str, ...]  # of every lower tier
    hierarchies: tuple[str, ...]
    kv_layouts: tuple[str, ...]
    kv_dtypes: tuple[str, ...]
    block_sizes: Mapping[str, BlockSizes]  # release version -> the sizes it accepts
    pd_connectors: tuple[str, ...]  # () when it cannot run a disaggregated policy
    shared_tiers: tuple[str, ...]  # tiers it runs as one pool several instances share
    selective_k: tuple[int, ...] = (2,)
    # when its scheduler sees a lower-tier load end (``load_report``): vLLM's engine reads it
    # with a later step's output (docs/model.md, "When the scheduler sees a load end")
    load_reports: tuple[str, ...] = ("step_output",)
    # when a request's loaded blocks enter HBM's prefix cache (``load_caching``): vLLM caches
    # them when it sees the load end, one step before the model's ``first_step`` at most;
    # SGLang's radix tree at once (docs/model.md, "Hits another request is loading")
    load_cachings: tuple[str, ...] = ("first_step",)
    need: tuple[str, ...] = ()  # tiers it cannot run without
    requires: Mapping[str, tuple[tuple[str, Value], ...]] = field(default_factory=dict)

    @property
    def version(self) -> str:
        """The release of :attr:`package` the export targets."""
        return PACKAGES[self.package]

    @property
    def block(self) -> BlockSizes:
        """The block sizes of the targeted release."""
        return self.block_sizes[self.version]

    @property
    def pd(self) -> bool:
        return bool(self.pd_connectors)

    def allowed(self) -> dict[str, tuple[Value, ...]]:
        """Policy keys (dotted, as a search space names them) -> the values this target can
        express; keys with every value expressible are left out, as are the tiers."""
        from kvtier.policy.model import (
            HIERARCHIES,
            KV_DTYPES,
            KV_LAYOUTS,
            LOAD_CACHINGS,
            LOAD_REPORTS,
            LOAD_RULES,
            ROUTERS,
            WRITE_POLICIES,
        )
        from kvtier.policy.registries import CONNECTORS, SCHEDULERS

        out: dict[str, tuple[Value, ...]] = {
            # kvtier settings no serving system reads: pinned to what the systems do
            "share_across_tenants": (True,),
            "coalesce": (1,),
        }
        domains: list[tuple[str, tuple[Value, ...], tuple[Value, ...]]] = [
            ("load_rule", self.load_rules, LOAD_RULES),
            ("load_report", self.load_reports, LOAD_REPORTS),
            ("load_caching", self.load_cachings, LOAD_CACHINGS),
            ("hierarchy", self.hierarchies, HIERARCHIES),
            ("write_policy", self.write_policies, WRITE_POLICIES),
            ("kv_layout", self.kv_layouts, KV_LAYOUTS),
            ("kv_dtype", self.kv_dtypes, KV_DTYPES),
            ("serving.routing", self.routers, ROUTERS),
            ("serving.scheduler", self.schedulers, SCHEDULERS.names),
        ]
        if self.pd:
            domains.append(("serving.pd_connector", self.pd_connectors, CONNECTORS.names))
        for key, values, domain in domains:
            if set(values) != set(domain):
                out[key] = values
        if "write_through_selective" in self.write_policies:
            out["selective_k"] = self.selective_k
        if not self.pd:
            out["serving.prefill_share"] = (0.0,)
        return out


def capabilities(target: str) -> Capabilities:
    """The declared capabilities of ``target`` (its exporter module's ``CAPABILITIES``)."""
    return _load(target)


@cache
def _load(target: str) -> Capabilities:
    from kvtier.export import EXPORTERS

    EXPORTERS.get(target, option="--target")  # an unknown target: one line with the choices
    module = importlib.import_module(f"kvtier.export.{target}")
    caps = module.CAPABILITIES
    assert isinstance(caps, Capabilities) and caps.target == target
    return caps


_LOAD_REPORT_WORDS = {
    "step_output": "with the output of the first step launched after it (load_report = "
    "step_output)",
    "at_once": "at its next scheduling decision, loading within the step (load_report = at_once)",
}


def capability_notes(deploy: Deployment, caps: Capabilities) -> list[Note]:
    """Notes every target shares, read from its capabilities: a scheduler it cannot run, a
    pool the simulation shares that it splits into private caches, and the releases it is
    written for and needs."""
    from kvtier.policy.registries import CONNECTORS

    p = deploy.policy
    notes: list[Note] = []
    missing = [t for t in caps.need if not deploy.has(t)]
    if missing:
        notes.append(
            inexpressible(
                f"{caps.target} needs a {', '.join(missing)} tier, which the policy lacks: "
                "there is nothing for it to run."
            )
        )
    if p.lower_tiers and p.load_wait == "request" and p.load_report not in caps.load_reports:
        notes.append(
            inexpressible(
                f"load_report = {p.load_report} cannot be expressed: {caps.target}'s engine "
                f"sees a finished lower-tier load {_LOAD_REPORT_WORDS[caps.load_reports[0]]}."
            )
        )
    if p.lower_tiers and p.load_caching not in caps.load_cachings:
        notes.append(
            inexpressible(
                f"load_caching = {p.load_caching} cannot be expressed: {caps.target}'s engine "
                f"caches loaded blocks as load_caching = {caps.load_cachings[0]} models."
            )
        )
    # (``visible_when_stored`` states how a release's back end behaves, as a hardware profile
    # states the machine: no release takes it as a setting, so there is nothing to export)
    for tier in p.lower_tiers:
        if tier.defer_loading_hits is None:
            continue
        own = CONNECTORS.get(tier.connector).defaults["defer_loading_hits"]
        if tier.defer_loading_hits != own:
            notes.append(
                inexpressible(
                    f"tiers.{tier.name}.defer_loading_hits = "
                    f"{str(tier.defer_loading_hits).lower()} cannot be expressed: whether a "
                    f"request waits for another's load of its hits is the {tier.connector} "
                    "connector's own behaviour, with no setting in any release."
                )
            )
    if p.serving.engine_scheduler not in caps.schedulers:
        notes.append(
            inexpressible(
                f"serving.scheduler = {p.serving.engine_scheduler} cannot be expressed: "
                f"{caps.target} allocates KV blocks as {', '.join(caps.schedulers)}."
            )
        )
    for tier in p.lower_tiers:
        name = tier.name
        if not deploy.has(name) or name not in caps.tiers or name in caps.shared_tiers:
            continue
        per_engine = (
            tier.per_engine if tier.per_engine is not None else tier_trait(name, "per_engine")
        )
        if deploy.per_host[name] and per_engine:
            continue  # simulated as each engine's own share, as the target deploys it
        users = deploy.tier_users
        sharing = (
            max(deploy.users_on_host(deploy.host_of(k)) for k in users)
            if deploy.per_host[name]
            else len(users)
        )
        if sharing > 1:
            where = "a host's" if deploy.per_host[name] else "the"
            notes.append(
                approximate(
                    f"The simulated {name} tier is {where} pool shared by up to {sharing} "
                    f"instances; {caps.target} gives each instance a private share of it, the "
                    "shares summing to the pool."
                )
            )
    packages = TARGET_RELEASES[caps.target]
    pinned = ", ".join(f"{n.split('@')[0]} {PACKAGES[n]}" for n in packages)
    module = importlib.import_module(f"kvtier.export.{caps.target}")
    needs: list[Minimum] = getattr(module, "minimum_versions", lambda d: [])(deploy)
    if needs:
        listed = "; ".join(f"{m.package} {m.version} ({m.why})" for m in needs)
        minimum = (
            f"Minimum versions: {listed}; every other name was checked only in the releases above."
        )
    else:
        minimum = "Minimum versions: the releases above (no older release was checked)."
    notes.append(
        info(
            f"Written for {pinned}: every flag, environment variable and configuration key is "
            f"one those releases read (kvtier/export/releases). {minimum}"
        )
    )
    return notes


@dataclass(frozen=True)
class Minimum:
    """The oldest release of ``package`` that reads a name an export writes (``why``: the
    name, and the older release checked that lacks it)."""

    package: str
    version: str
    why: str
