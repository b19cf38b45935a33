"""ShareGPT conversations (a JSON array, or JSON Lines, of ``{"id", "conversations"}``).

Each record is ``{"id": "...", "conversations": [{"from": "human", "value": "..."},
{"from": "gpt", "value": "..."}, ...]}``; ``from`` is ``human`` / ``user``, ``gpt`` /
``chatgpt`` / ``assistant`` / ``bard`` / ``bing``, or ``system``. A conversation is a session
with one request per assistant turn (``kvtier.trace.importers.text.add_conversation``); the
dataset has no timestamps, so arrivals follow the synthetic schedule
(``kvtier.trace.importers.text.schedule``: ``--session-rate``, ``--think-time``, ``--seed``).
"""

from __future__ import annotations

import os

from kvtier.trace.format import Trace
from kvtier.trace.importers.records import Record, json_records
from kvtier.trace.importers.registry import ImportOptions, register
from kvtier.trace.importers.text import (
    TEXT_OPTIONS,
    Message,
    TextRequests,
    add_conversation,
    text_setup,
    tokenized_trace,
)

ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "assistant": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "system": "system",
}


@register(
    "sharegpt",
    "ShareGPT conversations JSON (tokenized; one request per assistant turn, sessions)",
    options=TEXT_OPTIONS,
)
def import_sharegpt(path: str, options: ImportOptions) -> Trace:
    """ShareGPT JSON: each conversation a session, each assistant turn a request."""
    setup = text_setup(options, "sharegpt")
    req = TextRequests([], [], [], [], None, [], [], [], {})
    n_sessions = 0
    for line, obj in json_records(path, allow_array=True):
        rec = Record(path, line, obj)
        conv_id = rec.get("id", (str, int))
        messages: list[Message] = []
        for turn in rec.items("conversations"):
            who = turn.get("from", str)
            if who not in ROLES:
                raise turn.error(
                    f"unknown speaker '{who}'; expected one of {', '.join(ROLES)}", "from"
                )
            messages.append({"role": ROLES[who], "content": turn.get("value", str)})
        if add_conversation(req, line, messages, n_sessions, {"conversation_id": str(conv_id)}):
            n_sessions += 1
    return tokenized_trace(req, setup, path=path, source=f"sharegpt:{os.path.basename(path)}")
