"""The docs' tables of settings and plug-ins, written from the code.

Run ``python -m kvtier.report.doctables``. Each table sits in a docs page between
``<!-- BEGIN generated: NAME -->`` and ``<!-- END generated: NAME -->``; :func:`render` gives
its text from the field metadata (``kvtier.policy.fields``) and the registries, :func:`main`
rewrites the pages, and ``tests/test_registry.py`` fails when a page's table differs from what
the code says.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

from kvtier.cache.registry import EVICTIONS
from kvtier.export import EXPORTERS
from kvtier.policy.fields import settings_table
from kvtier.policy.overrides import CONNECTOR_FIELDS, POOL_FIELDS, override_keys
from kvtier.policy.registries import CONNECTORS, LOAD_RULES, ROUTERS, WRITE_POLICIES

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _settings() -> str:
    keys = override_keys()
    rows = [(k, s) for k, s in keys.items() if not k.startswith("tiers.")]
    tier_rows = {
        "tiers.NAME.enabled": "tiers.dram.enabled",
        "tiers.NAME.eviction": "tiers.dram.eviction",
        "tiers.NAME.capacity_gb": "tiers.hbm.capacity_gb",
        "tiers.cxl.interleave": "tiers.cxl.interleave",
        "tiers.NAME.per_engine": "tiers.dram.per_engine",
        **{f"tiers.NAME.{x}": f"tiers.rdma.{x}" for x in (*CONNECTOR_FIELDS, *POOL_FIELDS)},
    }
    rows += [(name, keys[key]) for name, key in tier_rows.items()]
    return settings_table(rows)


TABLES: dict[str, tuple[str, Callable[[], str]]] = {
    "policy-settings": ("policy.md", _settings),
    "routers": ("policy.md", ROUTERS.help_table),
    "write-policies": ("policy.md", WRITE_POLICIES.help_table),
    "load-rules": ("policy.md", LOAD_RULES.help_table),
    "connectors": ("policy.md", CONNECTORS.help_table),
    "eviction-policies": ("cache.md", EVICTIONS.help_table),
    "export-targets": ("export.md", EXPORTERS.help_table),
}


def _block(name: str) -> re.Pattern[str]:
    return re.compile(
        rf"(<!-- BEGIN generated: {re.escape(name)} -->\n)(.*?)(<!-- END generated: "
        rf"{re.escape(name)} -->)",
        re.S,
    )


def render(name: str) -> str:
    """The table ``name`` as the page should hold it (without the markers)."""
    return TABLES[name][1]() + "\n"


def current(name: str, docs: Path = DOCS) -> str | None:
    """The table ``name`` as the page holds it now (None: no markers)."""
    m = _block(name).search((docs / TABLES[name][0]).read_text())
    return m.group(2) if m else None


def main(docs: Path = DOCS) -> None:
    """Rewrite every generated table in place."""
    for name, (page, _) in TABLES.items():
        path = docs / page
        text = path.read_text()
        new, n = _block(name).subn(
            lambda m, name=name: m.group(1) + render(name) + m.group(3), text
        )
        if n != 1:
            raise SystemExit(f"{path}: needs one <!-- BEGIN generated: {name} --> block")
        if new != text:
            path.write_text(new)
            print(f"wrote {path} ({name})", file=sys.stderr)


if __name__ == "__main__":
    main()
