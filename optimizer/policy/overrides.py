"""``KEY=VALUE`` overrides of a policy: ``--set`` on replay and compare, ``--pin`` on optimize.

Keys are dotted paths into the policy file, the names a search space uses: ``block_tokens``,
``serving.routing``, ``slo.ttft_p99_s``, ``tiers.dram.capacity_gb``, ``tiers.cxl.enabled``.
In ``tiers.NAME.FIELD`` the middle part names a tier (not a list index); setting a field of a
tier lists that tier, and ``tiers.NAME.enabled = false`` removes it.

The valid keys and each value's type and domain come from the policy dataclasses' field
metadata (``kvtier.policy.fields``), so a key or choice added there is accepted here with no
further edit. A bad key or value is an :class:`InputError` naming the option and key, listing
the valid ones: the CLI prints one line and exits 2.
"""

from __future__ import annotations

import copy
import difflib
import tomllib
from collections.abc import Iterable, Mapping
from functools import cache
from typing import Any

from kvtier.errors import InputError
from kvtier.policy.fields import Setting, settings
from kvtier.policy.model import (
    LOWER_TIERS,
    SLO,
    TIER_NAMES,
    Policy,
    ServingPolicy,
    TierPolicy,
    policy_from_dict,
    policy_to_dict,
)
from kvtier.tier_kinds import trait as tier_trait
from kvtier.toml_fields import Table

# Profiles are chosen with --hardware / --model, never as overrides of a policy. The hbm tier is
# always on and evicts lru only, so it has no enabled / eviction keys.
NOT_OVERRIDABLE = ("hardware", "model")
# A lower tier's connector and the connector values a policy may override (TierPolicy).
CONNECTOR_FIELDS = (
    "connector", "depth", "workers", "layerwise", "store_blocks", "store_generated",
    "defer_loading_hits", "visible_when_stored",
)  # fmt: skip
# a pool's own eviction rule (Mooncake Store's master: kvtier.cache.watermark)
POOL_FIELDS = ("eviction_high_watermark", "eviction_ratio")
ENABLED = Setting("enabled", None, "list the tier (false: remove it)", "bool")
# the per-host tier kinds, whose pool may be each engine's own (``per_engine``)
PER_HOST_TIERS = tuple(t for t in LOWER_TIERS if tier_trait(t, "per_host"))


@cache
def override_keys() -> dict[str, Setting]:
    """Every key ``--set`` and ``--pin`` accept, with the setting that validates its value."""
    keys: dict[str, Setting] = {
        s.name: s for s in settings(Policy) if s.name not in NOT_OVERRIDABLE
    }
    keys.update({f"serving.{s.name}": s for s in settings(ServingPolicy)})
    keys.update({f"slo.{s.name}": s for s in settings(SLO)})
    tier_settings = {s.name: s for s in settings(TierPolicy)}
    for tier in TIER_NAMES:
        if tier != "hbm":
            keys[f"tiers.{tier}.enabled"] = ENABLED
            keys[f"tiers.{tier}.eviction"] = tier_settings["eviction"]
            for name in (*CONNECTOR_FIELDS, *POOL_FIELDS):
                keys[f"tiers.{tier}.{name}"] = tier_settings[name]
        keys[f"tiers.{tier}.capacity_gb"] = tier_settings["capacity_gb"]
    keys["tiers.cxl.interleave"] = tier_settings["interleave"]
    for tier in PER_HOST_TIERS:
        keys[f"tiers.{tier}.per_engine"] = tier_settings["per_engine"]
    return keys


def keys_text(*, search: bool = False) -> str:
    """The valid keys, with tier keys grouped (``tiers.{dram,cxl,rdma,ssd}.enabled``); for a
    search (``--pin``, a space file) without ``slo.*``, which the search takes from ``--slo``."""
    lower, every = ",".join(LOWER_TIERS), ",".join(TIER_NAMES)
    plain = [
        k
        for k in override_keys()
        if not k.startswith("tiers.") and not (search and k.startswith("slo."))
    ]
    tiers = [
        f"tiers.{{{lower}}}.enabled",
        f"tiers.{{{lower}}}.eviction",
        *(f"tiers.{{{lower}}}.{name}" for name in (*CONNECTOR_FIELDS, *POOL_FIELDS)),
        f"tiers.{{{every}}}.capacity_gb",
        "tiers.cxl.interleave",
        f"tiers.{{{','.join(PER_HOST_TIERS)}}}.per_engine",
    ]
    return ", ".join([*plain, *tiers])


def _unknown(key: str, option: str) -> InputError:
    close = difflib.get_close_matches(key, list(override_keys()), n=1, cutoff=0.7)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if key in NOT_OVERRIDABLE:
        hint = f" (choose the profile with --{key})"
    search = option.startswith("--pin")
    return InputError(
        f"unknown key {key!r}{hint}; valid keys: {keys_text(search=search)}", option=option
    )


def check_override(key: str, value: Any, option: str) -> Any:
    """``value`` for ``key`` type- and range-checked (ints become floats for float keys)."""
    setting = override_keys().get(key)
    if setting is None:
        raise _unknown(key, option)
    section, _, name = key.rpartition(".")
    table = Table({name: value}, "", f"{section}." if section else "")
    try:
        return setting.read(table)
    except InputError as err:
        raise InputError(err.message, option=option) from None


def parse_value(raw: str) -> Any:
    """A TOML scalar (``64``, ``0.5``, ``true``, ``"text"``), else the text itself."""
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):  # not a scalar: the text itself
        return raw
    return value


def parse_overrides(texts: Iterable[str], option: str) -> dict[str, Any]:
    """``("KEY=VALUE", ...)`` from the command line -> ``{key: checked value}``.

    Values are TOML scalars or bare strings (``serving.routing=least_loaded``). A malformed
    item, an unknown key, a key given twice or a bad value raises :class:`InputError`.
    """
    out: dict[str, Any] = {}
    for text in texts:
        key, sep, raw = text.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep or not key or not raw:
            raise InputError(f"{option} takes name=value, got {text!r}")
        value = parse_value(raw)
        if isinstance(value, list | dict):
            raise InputError(f"key {key!r}: a single value is needed, got {raw!r}", option=option)
        if key in out:
            raise InputError(f"key {key!r} is given twice", option=option)
        out[key] = check_override(key, value, option)
    return out


def _tier(data: dict[str, Any], name: str) -> dict[str, Any]:
    tiers = data.setdefault("tiers", [{"name": "hbm"}])
    for tier in tiers:
        if tier.get("name") == name:
            return tier
    tier = {"name": name}
    tiers.append(tier)
    tiers.sort(key=lambda t: TIER_NAMES.index(t["name"]) if t.get("name") in TIER_NAMES else 99)
    return tier


def overlay(base: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the policy dict ``base`` with ``values`` set at their dotted paths.

    Keys are not checked here (a search space's own parameters go through it too); use
    :func:`apply_overrides` for user input.
    """
    data = copy.deepcopy(dict(base))
    disabled: set[str] = set()
    for name, value in values.items():
        parts = name.split(".")
        if parts[0] == "tiers":
            if len(parts) != 3:
                raise InputError(
                    f"tier parameters are named tiers.TIER.FIELD, got {name!r}", column=name
                )
            if parts[2] == "enabled":
                if not value:
                    disabled.add(parts[1])
                else:
                    _tier(data, parts[1])
                continue
            _tier(data, parts[1])[parts[2]] = value
            continue
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise InputError(f"{part!r} is not a section of the policy", column=name)
            node = child
        node[parts[-1]] = value
    if disabled:
        if "hbm" in disabled:
            raise InputError("the hbm tier cannot be disabled", column="tiers.hbm.enabled")
        data["tiers"] = [t for t in data.get("tiers", []) if t.get("name") not in disabled]
    return data


SPLIT_KEYS = ("serving.prefill_instances", "serving.prefill_share")


def _check_split(policy: Policy, checked: Mapping[str, Any], option: str) -> None:
    """Refuse an override of one form of the prefill/decode split over a policy that states
    the other: the count would win and the share be ignored (or the share be ignored while
    the user believes it applies), so the user says which one is meant."""
    given = [k for k in SPLIT_KEYS if k in checked and checked[k]]
    if len(given) != 1:
        return  # neither, or both (the policy's own rule reports both in one place)
    key = given[0]
    other = SPLIT_KEYS[1 - SPLIT_KEYS.index(key)]
    name = other.removeprefix("serving.")
    base = getattr(policy.serving, name)
    if other in checked or not base:
        return
    zero = "0" if name == "prefill_instances" else "0.0"
    raise InputError(
        f"{key} = {checked[key]:g} and the policy's {other} = {base:g} both set the "
        f"prefill/decode split; add {option.split()[0]} {other}={zero} to use {key}",
        option=option,
    )


def apply_overrides(policy: Policy, overrides: Mapping[str, Any], option: str) -> Policy:
    """``policy`` with ``overrides`` applied, validated like a policy file.

    Keys and values are checked again (the dict may not come from :func:`parse_overrides`);
    a combination the policy itself refuses (a rule across fields) is reported against
    ``option`` too, on one line.
    """
    if not overrides:
        return policy
    checked = {k: check_override(k, v, option) for k, v in overrides.items()}
    _check_split(policy, checked, option)
    try:
        return policy_from_dict(overlay(policy_to_dict(policy), checked), option)
    except InputError as err:
        raise InputError(err.message, option=option) from None
    except ValueError as err:
        raise InputError(str(err), option=option) from None
