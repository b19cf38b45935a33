"""The importer registry: one entry per source format, with the options it takes.

Adding a format is one module that defines ``import_X(path, options) -> Trace`` decorated with
:func:`register`, plus its name in :data:`MODULES` (``kvtier.trace.importers``), which is what
``kvtier trace import --from`` lists and loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvtier.trace.format import Trace


@dataclass(frozen=True)
class ImportOptions:
    """What a source may need beyond its path; each importer refuses the options it cannot use.

    ``tokenizer`` and ``chat_template`` are for sources with prompt text, ``block_tokens`` the
    hash granularity of text sources (vLLM's default block size), ``columns`` a mapping of
    trace fields to the source's own column names (``--columns``). ``session_rate``,
    ``think_time_s`` and ``seed`` shape the synthetic arrivals of conversation datasets that
    have no timestamps (``kvtier.trace.importers.text.schedule``).
    """

    tokenizer: str | None = None
    chat_template: str | None = None
    block_tokens: int | None = None
    columns: dict[str, str] = field(default_factory=dict)
    session_rate: float | None = None
    think_time_s: float | None = None
    seed: int | None = None


Importer = Callable[[str, ImportOptions], Trace]


@dataclass(frozen=True)
class ImporterEntry:
    name: str
    help: str
    load: Importer
    options: frozenset[str]  # the ImportOptions fields this importer reads


IMPORTERS: dict[str, ImporterEntry] = {}


def register(
    name: str, help: str, *, options: tuple[str, ...] = ()
) -> Callable[[Importer], Importer]:
    """Register ``import_X`` under ``name``; ``options`` names the :class:`ImportOptions`
    fields it reads (any other option given is refused, never silently ignored)."""

    def wrap(fn: Importer) -> Importer:
        IMPORTERS[name] = ImporterEntry(name, help, fn, frozenset(options))
        return fn

    return wrap
