"""A user's own prices (``optimize --prices FILE``): one TOML file over a hardware profile.

The built-in profiles price everything on one basis, owned hardware all-in (docs/sources.md,
[Prices-2026]): a GPU-hour and a tier's GB-hour are the hardware amortised over its life plus
power, space and its share of the host, and each fabric's fixed cost sits with the tier that
needs it. A user with other figures (a committed cloud rate, their own memory price) writes
them here, and must keep them on one basis too: the file names the basis it uses.

.. code-block:: toml

    basis = "owned"                 # or "cloud": a label the report prints; not a conversion
    gpu_per_hour = 1.9              # $ per GPU-hour
    host_per_hour = 0.0             # $ per occupied host-hour beyond the GPUs
    electricity_per_kwh = 0.08      # $ per kWh, charged on each replay's energy (PUE included)
    [tiers.dram]
    per_gb_hour = 5.7e-4            # $ per GB-hour of the tier's capacity
    fabric_per_host_hour = 0.0      # $ per occupied host-hour of the fabric it needs

``electricity_per_kwh`` charges the energy a replay draws (:mod:`kvtier.sim.energy`) on top
of the other figures, so it belongs with GPU and tier prices that leave power out; the
built-in all-in prices include power at full draw and charge no electricity (0).

Every key is optional; an unknown key, table or tier name is refused in one line naming it.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvtier.errors import InputError
from kvtier.hardware.types import LOWER_TIERS, Hardware

BASES = ("owned", "cloud")
TOP_KEYS = ("basis", "gpu_per_hour", "host_per_hour", "electricity_per_kwh", "tiers")
TIER_KEYS = ("per_gb_hour", "fabric_per_host_hour")


@dataclass(frozen=True)
class Prices:
    basis: str = "owned"
    gpu_per_hour: float | None = None
    host_per_hour: float | None = None
    tiers: dict[str, dict[str, float]] = field(default_factory=dict)
    source: str = ""
    electricity_per_kwh: float | None = None


# The largest price kvtier takes, in dollars (per hour, per GB-hour or per drive): a thousand
# times any real figure (an 8-GPU host rents for about $100/hour), far below where a cost
# summed over a trial's hours and tokens would overflow to infinity. A larger number is a
# typo or a unit mix-up, and is refused rather than reported as an infinite or null cost.
MAX_PRICE = 1e6


def _number(value: Any, path: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InputError(f"must be a finite number, got {value!r}", path=path, column=key)
    if value < 0:
        raise InputError(f"must be >= 0, got {value}", path=path, column=key)
    if value > MAX_PRICE:
        raise InputError(
            f"must be <= {MAX_PRICE:g} dollars (a price, not a typo or a unit mix-up), "
            f"got {value:g}",
            path=path,
            column=key,
        )
    return float(value)


def load_prices(path: str | Path) -> Prices:
    """Read and check a prices file (see the module docstring)."""
    spath = str(path)
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise InputError("prices file not found", path=spath, option="--prices") from None
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"invalid TOML: {err}", path=spath) from None
    except (OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read: {err}", path=spath) from None
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise InputError(f"unknown key(s) {unknown} (valid: {', '.join(TOP_KEYS)})", path=spath)
    basis = data.get("basis", "owned")
    if basis not in BASES:
        raise InputError(
            f"must be one of {', '.join(BASES)}, got {basis!r}", path=spath, column="basis"
        )
    tiers: dict[str, dict[str, float]] = {}
    raw_tiers = data.get("tiers", {})
    if not isinstance(raw_tiers, dict):
        raise InputError("must be a table of [tiers.NAME]", path=spath, column="tiers")
    for name, table in raw_tiers.items():
        where = f"tiers.{name}"
        if name not in LOWER_TIERS:
            raise InputError(
                f"unknown tier {name!r} (valid: {', '.join(LOWER_TIERS)})", path=spath, column=where
            )
        if not isinstance(table, dict):
            raise InputError("must be a table", path=spath, column=where)
        bad = sorted(set(table) - set(TIER_KEYS))
        if bad:
            raise InputError(
                f"unknown key(s) {bad} (valid: {', '.join(TIER_KEYS)})", path=spath, column=where
            )
        tiers[name] = {k: _number(v, spath, f"{where}.{k}") for k, v in table.items()}
    return Prices(
        basis=basis,
        gpu_per_hour=_number(data["gpu_per_hour"], spath, "gpu_per_hour")
        if "gpu_per_hour" in data
        else None,
        host_per_hour=_number(data["host_per_hour"], spath, "host_per_hour")
        if "host_per_hour" in data
        else None,
        tiers=tiers,
        source=spath,
        electricity_per_kwh=_number(data["electricity_per_kwh"], spath, "electricity_per_kwh")
        if "electricity_per_kwh" in data
        else None,
    )


def apply_prices(hardware: Hardware, prices: Prices) -> Hardware:
    """``hardware`` with the file's prices in place of the profile's."""
    gpu = hardware.gpu
    if prices.gpu_per_hour is not None:
        gpu = replace(gpu, price_per_hour=prices.gpu_per_hour)
    host = hardware.host_fixed_per_hour if prices.host_per_hour is None else prices.host_per_hour
    tiers = dict(hardware.tiers)
    for name, values in prices.tiers.items():
        if name not in tiers:
            raise InputError(
                f"hardware {hardware.name!r} has no {name} tier to price "
                f"(it has: {', '.join(tiers) or 'none'})",
                path=prices.source,
                column=f"tiers.{name}",
            )
        tier = tiers[name]
        tiers[name] = replace(
            tier,
            price_per_gb_hour=values.get("per_gb_hour", tier.price_per_gb_hour),
            fabric_per_host_hour=values.get("fabric_per_host_hour", tier.fabric_per_host_hour),
        )
    power = hardware.power
    if prices.electricity_per_kwh is not None:
        power = replace(power, electricity_per_kwh=prices.electricity_per_kwh)
    return replace(hardware, gpu=gpu, host_fixed_per_hour=host, tiers=tiers, power=power)


def price_figures(hardware: Hardware) -> dict[str, Any]:
    """The figures ``hardware`` is priced at, as plain numbers a study records.

    A study's trials are priced at these; a rerun at other figures (another ``--prices``
    file, or none after one) would mix costs computed on two bases, so the study keeps them
    as part of its identity, and ``report --what-if`` prices its variants at them too.
    """
    figures: dict[str, Any] = {
        "gpu_per_hour": hardware.gpu.price_per_hour,
        "host_per_hour": hardware.host_fixed_per_hour,
        "tiers": {
            name: {
                "per_gb_hour": tier.price_per_gb_hour,
                "fabric_per_host_hour": tier.fabric_per_host_hour,
            }
            for name, tier in hardware.tiers.items()
            if name in LOWER_TIERS
        },
    }
    if hardware.power.electricity_per_kwh > 0:  # recorded only when charged (older studies)
        figures["electricity_per_kwh"] = hardware.power.electricity_per_kwh
    return figures


def with_price_figures(hardware: Hardware, figures: dict[str, Any]) -> Hardware:
    """``hardware`` priced at ``figures`` (what :func:`price_figures` recorded)."""
    tiers = {k: v for k, v in (figures.get("tiers") or {}).items() if k in hardware.tiers}
    return apply_prices(
        hardware,
        Prices(
            gpu_per_hour=figures.get("gpu_per_hour"),
            host_per_hour=figures.get("host_per_hour"),
            tiers=tiers,
            source="<study>",
            electricity_per_kwh=figures.get("electricity_per_kwh", 0.0),
        ),
    )
