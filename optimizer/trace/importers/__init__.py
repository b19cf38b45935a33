"""Importers from public and user trace formats to request-trace/1.

Each format is a module of this package registered in :mod:`.registry`; :data:`MODULES` lists
them in the order ``kvtier trace import --from`` shows. Modules are imported on first use.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import fields

from kvtier.errors import InputError
from kvtier.trace.format import Trace
from kvtier.trace.importers.registry import IMPORTERS, ImporterEntry, ImportOptions

# format name -> module defining it (so the CLI can list names without importing every module)
MODULES = {
    "mooncake": "mooncake",
    "bailian": "bailian",
    "azure": "azure",
    "burstgpt": "burstgpt",
    "csv": "mapped",
    "jsonl": "mapped",
    "openai-log": "openai_log",
    "sharegpt": "sharegpt",
    "lmsys": "lmsys",
}

OPTION_FLAGS = {
    "tokenizer": "--tokenizer",
    "chat_template": "--chat-template",
    "block_tokens": "--block-tokens",
    "columns": "--columns",
    "session_rate": "--session-rate",
    "think_time_s": "--think-time",
    "seed": "--seed",
}

__all__ = [
    "IMPORTERS",
    "MODULES",
    "ImportOptions",
    "format_names",
    "import_trace",
    "importer",
    "parse_columns",
]


def stream_plan(kind: str, path: str, options: ImportOptions, stream: bool | None):  # noqa: ANN201
    """How to import ``path`` streamed (a :class:`~.streaming.StreamPlan` for a CSV log of
    lengths, a :class:`~kvtier.trace.jsonlstream.JsonlPlan` for JSON Lines), or None to import
    it in memory. ``stream`` None decides by size (:data:`~kvtier.trace.format.STREAM_BYTES`);
    the formats of prompt text do not stream, so asking for it there is an error."""
    from kvtier.trace.format import STREAM_BYTES
    from kvtier.trace.jsonlstream import JsonlPlan
    from kvtier.trace.streaming import StreamPlan

    if stream is False:
        return None
    plan: StreamPlan | JsonlPlan | None = None
    if kind in ("mooncake", "bailian"):
        plan = JsonlPlan(kind)
    elif kind == "jsonl" and options.columns:
        from kvtier.trace.importers.mapped import column_map

        plan = JsonlPlan(kind, column_map(options.columns, allow_hashes=True))
    elif kind == "azure":
        from kvtier.trace.importers.azure import AZURE

        plan = StreamPlan(AZURE, "azure")
    elif kind == "burstgpt":
        from kvtier.trace.importers.burstgpt import BURSTGPT

        plan = StreamPlan(BURSTGPT, "burstgpt", skip_failed=True)
    elif kind == "csv" and options.columns:
        from kvtier.trace.importers.mapped import column_map

        plan = StreamPlan(column_map(options.columns, allow_hashes=False), "csv")
    if plan is None:
        if stream:
            raise InputError(
                f"--from {kind} does not stream (request logs do: azure, burstgpt, csv, "
                "mooncake, bailian, jsonl)",
                option="--stream",
            )
        return None
    if stream is None:
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as fh:
                gz = fh.read(2) == b"\x1f\x8b"
        except OSError:
            return None  # the in-memory importer reports it
        if size <= STREAM_BYTES or (gz and isinstance(plan, StreamPlan)):  # CSV scans plain
            return None
    return plan


def parse_columns(text: str) -> dict[str, str]:
    """``FIELD=COLUMN,...`` (``--columns``) as a dict; column names may hold spaces."""
    out: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise InputError(f"expected FIELD=COLUMN, got '{item.strip()}'", option="--columns")
        if key in out:
            raise InputError(f"field '{key}' is given twice", option="--columns")
        out[key] = value
    return out


def format_names() -> tuple[str, ...]:
    return tuple(MODULES)


def importer(kind: str) -> ImporterEntry:
    """The registered importer of ``kind``; unknown names list the known ones."""
    if kind not in MODULES:
        raise InputError(
            f"unknown trace format '{kind}'; choose one of {', '.join(MODULES)}", option="--from"
        )
    importlib.import_module(f"kvtier.trace.importers.{MODULES[kind]}")
    return IMPORTERS[kind]


def import_trace(
    kind: str, path: str | os.PathLike[str], options: ImportOptions | None = None
) -> Trace:
    """Import ``path`` written in format ``kind``; options the format cannot use are refused."""
    entry = importer(kind)
    options = options or ImportOptions()
    for f in fields(options):
        value = getattr(options, f.name)
        if value not in (None, {}) and f.name not in entry.options:
            raise InputError(
                f"does not apply to --from {kind}", option=OPTION_FLAGS.get(f.name, f.name)
            )
    return entry.load(str(path), options)
