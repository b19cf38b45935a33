"""LMSYS-Chat-1M conversations as JSON Lines.

Each line is ``{"conversation_id": "...", "model": "...", "conversation": [{"role": "user",
"content": "..."}, {"role": "assistant", "content": "..."}, ...], "tstamp": 1690000000.0}``
(``tstamp``, Unix seconds, is optional; other fields such as ``language`` are ignored). A
conversation is a session with one request per assistant turn; ``model`` is kept as a column.
When every line has ``tstamp`` it is the session's start, else sessions start as a Poisson
process (``--session-rate``); turns follow each other after think times (``--think-time``,
``--seed``), as ``kvtier.trace.importers.text.schedule`` documents.
"""

from __future__ import annotations

import math
import os

from kvtier.trace.format import Trace
from kvtier.trace.importers.records import Record, json_records
from kvtier.trace.importers.registry import ImportOptions, register
from kvtier.trace.importers.text import (
    TEXT_OPTIONS,
    TextRequests,
    add_conversation,
    chat_messages,
    text_setup,
    tokenized_trace,
)

ROLES = ("system", "user", "assistant", "tool")


@register(
    "lmsys",
    "LMSYS-Chat-1M JSON Lines (tokenized; one request per assistant turn, sessions)",
    options=TEXT_OPTIONS,
)
def import_lmsys(path: str, options: ImportOptions) -> Trace:
    """LMSYS-Chat-1M rows: each conversation a session, each assistant turn a request."""
    setup = text_setup(options, "lmsys")
    req = TextRequests([], [], [], [], None, [], [], [], {})
    starts: list[float | None] = []
    for line, obj in json_records(path):
        rec = Record(path, line, obj)
        conv_id = rec.get("conversation_id", (str, int))
        model = rec.get("model", str)
        turns = rec.items("conversation")
        messages = chat_messages(turns, rec) if turns else []
        for turn, m in zip(turns, messages, strict=True):
            if m["role"] not in ROLES:
                raise turn.error(
                    f"unknown role '{m['role']}'; expected one of {', '.join(ROLES)}", "role"
                )
        tstamp = rec.get("tstamp", (int, float), None)
        if tstamp is not None and not math.isfinite(tstamp):
            raise rec.error(f"{tstamp!r} is not a finite number", "tstamp")
        extra = {"conversation_id": str(conv_id), "model": model}
        if add_conversation(req, line, messages, len(starts), extra):
            starts.append(tstamp)
    if starts and all(s is not None for s in starts):
        req.session_starts = [float(s) for s in starts]  # type: ignore[arg-type]
    return tokenized_trace(req, setup, path=path, source=f"lmsys:{os.path.basename(path)}")
