"""An OpenAI-compatible gateway's request log (JSON Lines), prompts tokenized and hashed.

One line per request::

    {"timestamp": 1764620000.25,                 # Unix seconds, or ISO 8601 ("...Z", "+02:00")
     "request": {"model": "...", "messages": [{"role": "user", "content": "..."}],
                 "cache_salt": "team-a"},        # or "prompt": "text" | [token ids]
     "response": {"usage": {"completion_tokens": 87}},   # or choices[0].message.content / .text
     "session_id": "conv-17", "tenant": "team-a", "request_id": "req-1"}   # optional

``request`` may be called ``body``. Chat ``messages`` go through the chat template; a
completion ``prompt`` is text (special tokens added, as vLLM does) or a list of token ids used
as they are. The output length is ``response.usage.completion_tokens`` when present, else the
token count of the response text; ``usage.prompt_tokens``, when present, is compared with the
tokenized prompt, and a difference (the wrong tokenizer or template) is warned about.
``cache_salt`` (vLLM's request field) salts the block hashes as vLLM does; ``tenant`` names
the owner and salts them too when there is no ``cache_salt`` (requests of different tenants
never share blocks). Arrivals are the timestamps, from the
first request.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from kvtier.errors import InputError
from kvtier.trace.format import Trace
from kvtier.trace.importers.records import Record, json_records
from kvtier.trace.importers.registry import ImportOptions, register
from kvtier.trace.importers.text import (
    TEXT_OPTIONS,
    TextRequests,
    chat_messages,
    logged_lengths_trace,
    text_setup,
    tokenized_trace,
)

OPENAI_LOG_OPTIONS = tuple(
    o for o in TEXT_OPTIONS if o not in ("session_rate", "think_time_s", "seed")
)


def _timestamp(rec: Record) -> float:
    key = next((k for k in ("timestamp", "time", "created") if rec.has(k)), "timestamp")
    value = rec.get(key, (int, float, str))
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            raise rec.error(f"not a number or an ISO 8601 time: {value!r}", key) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    if value != value or value in (float("inf"), float("-inf")):
        raise rec.error(f"{value!r} is not a finite number", key)
    return float(value)


def _prompt(body: Record) -> list[dict[str, str]] | str | list[int]:
    if body.has("messages"):
        return chat_messages(body.items("messages"), body)
    if not body.has("prompt"):
        raise body.error("missing field (neither 'messages' nor 'prompt')", "messages")
    prompt = body.get("prompt", (str, list))
    if isinstance(prompt, list):
        if len(prompt) == 1 and isinstance(prompt[0], str):
            return prompt[0]
        if not prompt or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**32 for t in prompt
        ):
            raise body.error("expected a string or a list of token ids", "prompt")
        return list(prompt)
    return prompt


def _output(rec: Record) -> int | str:
    if not rec.has("response"):
        raise rec.error("missing field", "response")
    response = rec.child("response")
    if response.has("usage"):
        usage = response.child("usage")
        if usage.has("completion_tokens"):
            n = usage.get("completion_tokens", int)
            if n < 0:
                raise usage.error(f"must be >= 0, got {n}", "completion_tokens")
            return n
    if response.has("choices"):
        choices = response.items("choices")
        if choices:
            first = choices[0]
            if first.has("message"):
                return first.child("message").get("content", str, "")
            if first.has("text"):
                return first.get("text", str)
    raise response.error("missing field (no usage nor choices text)", "usage.completion_tokens")


def _logged_prompt_tokens(rec: Record) -> int | None:
    usage = rec.obj["response"].get("usage")  # _output checked that response is an object
    if isinstance(usage, dict):
        n = usage.get("prompt_tokens")
        if isinstance(n, int) and not isinstance(n, bool):
            return n
    return None


@register(
    "openai-log",
    "OpenAI-compatible request log, JSON Lines with prompt text (tokenized, vLLM block hashes)",
    options=OPENAI_LOG_OPTIONS,
)
def import_openai_log(path: str, options: ImportOptions) -> Trace:
    """A gateway's JSON Lines request log: timestamps, request bodies, responses.

    Without a tokenizer the lengths are the log's own ``usage`` counts and the trace has no
    block hashes (:func:`~kvtier.trace.importers.text.logged_lengths_trace`, with a warning).
    """
    setup = None if options.tokenizer is None else text_setup(options, "openai-log")
    req = TextRequests([], [], [], [], None, [], [], [], {})
    sessions: dict[Any, int] = {}
    ids: dict[str, int] = {}
    request_ids: list[str] = []
    for line, obj in json_records(path):
        rec = Record(path, line, obj)
        body = rec.child("body" if rec.has("body") and not rec.has("request") else "request")
        salt = body.get("cache_salt", str, None)
        tenant = rec.get("tenant", str, None)
        req.lines.append(line)
        req.arrival_s.append(_timestamp(rec))
        req.prompts.append(_prompt(body))
        req.outputs.append(_output(rec))
        req.logged_prompt_tokens.append(_logged_prompt_tokens(rec))
        req.salts.append(salt if salt is not None else tenant)
        req.tenants.append(tenant if tenant is not None else salt)
        sid = rec.get("session_id", (int, str), None)
        req.session.append(-1 if sid is None else sessions.setdefault(sid, len(sessions)))
        rid = rec.get("request_id", (int, str), None)
        if rid is not None:
            key = str(rid)
            if key in ids:
                raise rec.error(f"duplicate request id (first at line {ids[key]})", "request_id")
            ids[key] = line
            request_ids.append(key)
    if request_ids and len(request_ids) != len(req.lines):
        missing = next(i for i, ln in enumerate(req.lines) if ln not in ids.values())
        raise InputError(
            "missing field (other requests have one)",
            path=path,
            line=req.lines[missing],
            column="request_id",
        )
    if request_ids:
        req.extra["request_id"] = request_ids
    source = f"openai-log:{os.path.basename(path)}"
    if setup is None:
        return logged_lengths_trace(req, options, path=path, source=source)
    return tokenized_trace(req, setup, path=path, source=source)
