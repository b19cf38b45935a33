"""Prompt text to token ids, as a serving system tokenizes it, and text requests to a trace.

**Tokenizer**: a Hugging Face ``tokenizer.json`` read with ``tokenizers.Tokenizer.from_file``
(``--tokenizer``), or a model directory holding one (a Hugging Face snapshot, a vLLM model
directory); nothing is downloaded. Prompts are encoded in one ``encode_batch`` call. A model
directory also gives the chat template when ``--chat-template`` is not: its
``chat_template.jinja`` (with the special tokens of ``tokenizer_config.json``), else the
``chat_template`` key of its ``tokenizer_config.json``, as transformers picks. How to get
these files offline, and for gated models: docs/traces.md.

**Chat template** (``--chat-template``): the Jinja template of the model, given as its
``tokenizer_config.json`` (key ``chat_template``, a string or a list of named templates, of
which ``default`` is used) or as a ``.jinja`` file. It is rendered as ``transformers``'
``apply_chat_template`` renders it: a sandboxed ``jinja2`` environment with ``trim_blocks``,
``lstrip_blocks`` and the ``loopcontrols`` extension, ``raise_exception``, ``strftime_now``
and a ``tojson`` filter, the variables ``messages``, ``add_generation_prompt=True`` and the
special tokens of ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ...). Without one,
the documented default is ChatML (used by Qwen and many others)::

    <|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n

As vLLM does, a chat prompt (templated text) is encoded without adding special tokens (the
template writes them), a plain completion ``prompt`` with them (the tokenizer's
post-processor, for example a BOS token). Output text is encoded without special tokens.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from kvtier.errors import InputError
from kvtier.trace.format import MAX_TOKENS, Trace
from kvtier.trace.importers.registry import ImportOptions
from kvtier.trace.importers.vllm_hash import prompt_block_hashes

DEFAULT_BLOCK_TOKENS = 16  # vLLM's default block size
ENCODE_BATCH = 1024  # texts per tokenizer call
DEFAULT_SESSION_RATE = 1.0  # sessions per second, for sources without timestamps
DEFAULT_THINK_TIME_S = 10.0  # mean seconds between a session's turns, ditto
TEXT_OPTIONS = (
    "tokenizer",
    "chat_template",
    "block_tokens",
    "session_rate",
    "think_time_s",
    "seed",
)

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")

Message = dict[str, str]


def tokenizer_file(path: str) -> str:
    """``path`` itself, or the ``tokenizer.json`` of the model directory ``path``."""
    if not os.path.isdir(path):
        return path
    found = os.path.join(path, "tokenizer.json")
    if os.path.isfile(found):
        return found
    names = sorted(os.listdir(path))
    if "tokenizer.model" in names or "vocab.json" in names:
        raise InputError(
            "has no tokenizer.json, only a slow tokenizer ("
            + ", ".join(n for n in names if n in ("tokenizer.model", "vocab.json", "merges.txt"))
            + "): save it as tokenizer.json once with transformers "
            "(AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR); docs/traces.md)",
            path=path,
        )
    raise InputError(
        "has no tokenizer.json: give the served model's directory or its tokenizer.json",
        path=path,
    )


def model_dir_template(path: str | None) -> tuple[str | None, str | None]:
    """The chat template a model directory holds, as ``(template file, config for special
    tokens)``: its ``chat_template.jinja`` (with ``tokenizer_config.json``'s special tokens),
    else its ``tokenizer_config.json`` when that has a ``chat_template`` key; ``(None, None)``
    for a file or a directory with neither. The order is transformers' (a template file
    takes priority over the config's entry: [transformers-chat-template])."""
    if path is None or not os.path.isdir(path):
        return None, None
    config = os.path.join(path, "tokenizer_config.json")
    has_config = os.path.isfile(config)
    jinja = os.path.join(path, "chat_template.jinja")
    if os.path.isfile(jinja):
        return jinja, config if has_config else None
    if has_config:
        try:
            with open(config, encoding="utf-8") as fh:
                if "chat_template" in json.load(fh):
                    return config, None
        except (OSError, ValueError, TypeError):
            pass  # a bad config is reported if it is used
    return None, None


class TextTokenizer:
    """A ``tokenizers.Tokenizer`` from a local file or model directory, with batch encoding
    to numpy arrays."""

    def __init__(self, path: str | None, *, source_format: str) -> None:
        if path is None:
            raise InputError(
                f"--from {source_format} needs the served model's tokenizer.json or model "
                "directory (offline and gated models: docs/traces.md)",
                option="--tokenizer",
            )
        from tokenizers import Tokenizer

        if not os.path.exists(path):
            raise InputError("no such file or directory", path=path)
        given, path = path, tokenizer_file(path)
        # a file by its name; a model directory's by the directory's: Llama-3.1-8B/tokenizer.json
        self.name = os.path.basename(path)
        if path != given:
            self.name = f"{os.path.basename(os.path.normpath(given))}/{self.name}"
        try:
            self._tok = Tokenizer.from_file(path)
        except Exception as err:  # tokenizers raises a bare Exception on bad files
            first = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise InputError(f"not a tokenizers tokenizer.json: {first}", path=path) from None
        self.path = path

    def encode(self, texts: Sequence[str], *, add_special_tokens: bool) -> list[np.ndarray]:
        """Token ids of each text; batches of :data:`ENCODE_BATCH` texts keep the tokenizer's
        per-token objects (offsets, strings) from piling up for a whole dataset."""
        batch = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)  # no offsets
        out: list[np.ndarray] = []
        for start in range(0, len(texts), ENCODE_BATCH):
            chunk = list(texts[start : start + ENCODE_BATCH])
            encodings = batch(chunk, add_special_tokens=add_special_tokens)
            out.extend(np.asarray(e.ids, dtype=np.uint32) for e in encodings)
        return out


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template ready to render message lists to prompt text."""

    render_fn: Callable[[list[Message]], str]
    name: str

    def render(self, messages: list[Message]) -> str:
        return self.render_fn(messages)


def _special_tokens(config: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key in _SPECIAL_KEYS:
        value = config.get(key)
        if isinstance(value, dict):  # AddedToken form: {"content": "<s>", ...}
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


def _template_from_config(path: str, config: object) -> str:
    if not isinstance(config, dict) or "chat_template" not in config:
        raise InputError("has no 'chat_template' key", path=path, column="chat_template")
    template = config["chat_template"]
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
        if template is None:
            names = ", ".join(str(n) for n in named)
            raise InputError(
                f"no template named 'default' (has: {names})", path=path, column="chat_template"
            )
    if not isinstance(template, str):
        raise InputError("is not a template string", path=path, column="chat_template")
    return template


def load_chat_template(path: str | None, *, specials_from: str | None = None) -> ChatTemplate:
    """The model's template from ``tokenizer_config.json`` or a Jinja file, else ChatML.

    ``specials_from``: a ``tokenizer_config.json`` whose special tokens a Jinja file's
    template gets (a model directory's ``chat_template.jinja`` beside its config)."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    specials: dict[str, str] = {}
    if path is None:
        source, name = CHATML, "chatml"
    else:
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            raise InputError("no such file", path=path) from None
        except (OSError, UnicodeDecodeError) as err:
            raise InputError(f"cannot read: {err}", path=path) from None
        if path.endswith(".json"):
            try:
                config = json.loads(text)
            except json.JSONDecodeError as err:
                raise InputError(f"malformed JSON: {err.msg}", path=path, line=err.lineno) from None
            source = _template_from_config(path, config)
            specials = _special_tokens(config)
        else:
            source = text
            if specials_from is not None:
                try:
                    with open(specials_from, encoding="utf-8") as fh:
                        specials = _special_tokens(json.load(fh))
                except (OSError, ValueError) as err:
                    raise InputError(f"cannot read: {err}", path=specials_from) from None
        name = os.path.basename(path)

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt: str) -> str:
        from datetime import datetime

        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(  # noqa: E731
        x, ensure_ascii=False, indent=indent
    )
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now)
    try:
        compiled = env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as err:
        raise InputError(
            f"chat template does not parse: {err.message}", path=path, line=err.lineno
        ) from None

    def render(messages: list[Message]) -> str:
        try:
            return compiled.render(messages=messages, add_generation_prompt=True, **specials)
        except jinja2.exceptions.TemplateError as err:
            raise InputError(f"chat template failed: {err}", path=path) from None

    return ChatTemplate(render, name)


# -- text requests to a trace ------------------------------------------------------------------
@dataclass
class TextRequests:
    """Requests gathered by a text importer, in source order, before tokenizing.

    A request's prompt is either chat ``messages`` (templated) or a completion ``prompt`` text
    or token-id list; its output is a token count or a text to tokenize.
    """

    lines: list[int]  # source line of each request, for error messages
    prompts: list[list[Message] | str | list[int]]
    outputs: list[int | str]
    arrival_s: list[float | None]  # None: scheduled synthetically (see :func:`schedule`)
    session_starts: list[float] | None  # per session, when the source dates sessions only
    session: list[int]  # dense session index, -1 for none
    salts: list[str | None]
    tenants: list[str | None]
    extra: dict[str, list[Any]]
    logged_prompt_tokens: list[int | None] = field(default_factory=list)  # the server's count


def schedule(
    session: np.ndarray, options: ImportOptions, *, starts: np.ndarray | None = None
) -> np.ndarray:
    """Synthetic arrivals for sources without timestamps (documented in docs/traces.md).

    Sessions start as a Poisson process at ``--session-rate`` per second (or at ``starts[s]``
    when the source dates its sessions); within a session, each turn follows the previous
    one after an exponentially distributed think time of mean ``--think-time`` seconds. The
    draws come from ``numpy.random.default_rng(--seed)``.
    """
    rate, think = _schedule_parameters(options)
    rng = np.random.default_rng(options.seed if options.seed is not None else 0)
    n_sessions = int(session.max()) + 1 if len(session) else 0
    if starts is None:
        starts = np.cumsum(rng.exponential(1.0 / rate, n_sessions)) - 1.0 / rate
        starts = np.maximum(starts, 0.0)
    gaps = rng.exponential(think, len(session)) if think > 0 else np.zeros(len(session))
    first = np.ones(len(session), dtype=bool)
    first[1:] = session[1:] != session[:-1]
    gaps[first] = 0.0
    # cumulative think time within each (contiguous) session
    total = np.cumsum(gaps)
    session_base = np.maximum.accumulate(np.where(first, total, 0.0))
    return starts[session] + total - session_base


@dataclass(frozen=True)
class TextSetup:
    """What a text import needs before it reads its input, checked first so that a missing
    tokenizer or a bad option is reported before a large file is parsed."""

    tokenizer: TextTokenizer
    template: ChatTemplate
    options: ImportOptions


def text_setup(options: ImportOptions, kind: str) -> TextSetup:
    _schedule_parameters(options)
    tokenizer = TextTokenizer(options.tokenizer, source_format=kind)
    if options.chat_template is not None:
        return TextSetup(tokenizer, load_chat_template(options.chat_template), options)
    template, specials = model_dir_template(options.tokenizer)
    return TextSetup(tokenizer, load_chat_template(template, specials_from=specials), options)


def _schedule_parameters(options: ImportOptions) -> tuple[float, float]:
    rate = options.session_rate if options.session_rate is not None else DEFAULT_SESSION_RATE
    think = options.think_time_s if options.think_time_s is not None else DEFAULT_THINK_TIME_S
    if not (rate > 0 and np.isfinite(rate)):
        raise InputError(f"must be a finite number > 0, got {rate}", option="--session-rate")
    if not (think >= 0 and np.isfinite(think)):
        raise InputError(f"must be a finite number >= 0, got {think}", option="--think-time")
    return rate, think


def tokenized_trace(requests: TextRequests, setup: TextSetup, *, path: str, source: str) -> Trace:
    """Tokenize, hash and assemble ``requests`` into a request-trace/1 :class:`Trace`."""
    n = len(requests.prompts)
    if n == 0:
        raise InputError("no requests in the file", path=path)
    options = setup.options
    block_tokens = options.block_tokens or DEFAULT_BLOCK_TOKENS
    tokenizer, template = setup.tokenizer, setup.template
    chat_idx = [i for i, p in enumerate(requests.prompts) if _is_chat(p)]
    text_idx = [i for i, p in enumerate(requests.prompts) if isinstance(p, str)]
    tokens: list[np.ndarray] = [np.zeros(0, dtype=np.uint32)] * n
    rendered = []
    for i in chat_idx:
        try:
            rendered.append(template.render(requests.prompts[i]))  # type: ignore[arg-type]
        except InputError as err:
            err.message = f"{err.message} (request at line {requests.lines[i]} of {path})"
            err.args = (err.format(),)
            raise
    for i, ids in zip(chat_idx, tokenizer.encode(rendered, add_special_tokens=False), strict=True):
        tokens[i] = ids
    texts = [requests.prompts[i] for i in text_idx]
    for i, ids in zip(text_idx, tokenizer.encode(texts, add_special_tokens=True), strict=True):  # type: ignore[arg-type]
        tokens[i] = ids
    for i, p in enumerate(requests.prompts):
        if not _is_chat(p) and not isinstance(p, str):
            tokens[i] = np.asarray(p, dtype=np.uint32)

    out_text_idx = [i for i, o in enumerate(requests.outputs) if isinstance(o, str)]
    output_tokens = np.zeros(n, dtype=np.int64)
    for i, o in enumerate(requests.outputs):
        if not isinstance(o, str):
            output_tokens[i] = o
    texts = [requests.outputs[i] for i in out_text_idx]
    for i, ids in zip(out_text_idx, tokenizer.encode(texts, add_special_tokens=False), strict=True):  # type: ignore[arg-type]
        output_tokens[i] = len(ids)

    input_tokens = np.fromiter((len(t) for t in tokens), dtype=np.int64, count=n)
    for bad, why in (
        (input_tokens == 0, "prompt has no tokens"),
        (input_tokens > MAX_TOKENS, f"prompt has more than {MAX_TOKENS} tokens"),
    ):
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(why, path=path, line=requests.lines[i])

    _check_logged_prompt_tokens(requests, input_tokens, path)
    session = np.asarray(requests.session, dtype=np.int64)
    arrivals = _arrivals(requests, session, options, path)
    previous = _previous_in_session(session)
    offsets, hashes = prompt_block_hashes(
        tokens, block_tokens, cache_salts=requests.salts, previous=previous
    )
    order = np.argsort(arrivals, kind="stable")
    extra: dict[str, pa.Array] = {}
    if (session >= 0).any():
        sid = np.where(session >= 0, session, session.max() + 1 + np.arange(n))
        extra["session_id"] = pa.array(sid[order], type=pa.int64())
    if any(t is not None for t in requests.tenants):
        extra["tenant"] = pa.array([requests.tenants[i] or "" for i in order], type=pa.string())
    for name, values in requests.extra.items():
        extra[name] = pa.array([values[i] for i in order])
    counts = np.diff(offsets)[order]
    new_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=new_offsets[1:])
    idx = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in order])
    return Trace.from_arrays(
        arrival_s=arrivals[order] - (arrivals.min() if n else 0.0),
        input_tokens=input_tokens[order],
        output_tokens=output_tokens[order],
        hash_offsets=new_offsets,
        hashes=hashes[idx.astype(np.int64)] if len(idx) else hashes,
        block_tokens=block_tokens,
        source=source,
        extra_columns=extra,
        metadata={
            "import.tokenizer": tokenizer.name,
            "import.chat_template": template.name,
            "import.block_hash": "vllm-sha256_cbor-seed0",
        },
    )


class LoggedCountsWarning(UserWarning):
    """A text log was imported without a tokenizer: lengths from its own token counts, no
    block hashes."""


def logged_lengths_trace(
    requests: TextRequests, options: ImportOptions, *, path: str, source: str
) -> Trace:
    """A lengths-only trace from a log's own token counts (``usage.prompt_tokens`` and
    ``usage.completion_tokens``), for an import given no tokenizer; warns that it has no
    block hashes. Every request needs both counts (a token-id prompt counts itself)."""
    n = len(requests.prompts)
    if n == 0:
        raise InputError("no requests in the file", path=path)
    if options.chat_template is not None:
        raise InputError("applies with --tokenizer only", option="--chat-template")
    inputs = np.zeros(n, dtype=np.int64)
    outputs = np.zeros(n, dtype=np.int64)
    for i, (prompt, out) in enumerate(zip(requests.prompts, requests.outputs, strict=True)):
        logged = requests.logged_prompt_tokens[i] if requests.logged_prompt_tokens else None
        if logged is None and isinstance(prompt, list) and not _is_chat(prompt):
            logged = len(prompt)
        if logged is None or isinstance(out, str):
            field = "usage.prompt_tokens" if logged is None else "usage.completion_tokens"
            raise InputError(
                f"no {field}, so its length needs the served model's tokenizer: give "
                "--tokenizer (tokenizer.json or the model directory; docs/traces.md)",
                path=path,
                line=requests.lines[i],
                column=f"response.{field}",
            )
        if not 1 <= logged <= MAX_TOKENS:
            raise InputError(
                f"usage.prompt_tokens must be in [1, {MAX_TOKENS}], got {logged}",
                path=path,
                line=requests.lines[i],
            )
        inputs[i], outputs[i] = logged, out
    warnings.warn(
        f"{path}: no --tokenizer: prompt and output lengths are the log's own usage counts, "
        "and the trace has no block hashes, so its replays find no prefix hits; give the "
        "served model's tokenizer.json or model directory to hash prompts (docs/traces.md)",
        LoggedCountsWarning,
        stacklevel=2,
    )
    session = np.asarray(requests.session, dtype=np.int64)
    arrivals = _arrivals(requests, session, options, path)
    order = np.argsort(arrivals, kind="stable")
    extra: dict[str, pa.Array] = {}
    if (session >= 0).any():
        sid = np.where(session >= 0, session, session.max() + 1 + np.arange(n))
        extra["session_id"] = pa.array(sid[order], type=pa.int64())
    if any(t is not None for t in requests.tenants):
        extra["tenant"] = pa.array([requests.tenants[i] or "" for i in order], type=pa.string())
    for name, values in requests.extra.items():
        extra[name] = pa.array([values[i] for i in order])
    return Trace.from_arrays(
        arrival_s=arrivals[order] - arrivals.min(),
        input_tokens=inputs[order],
        output_tokens=outputs[order],
        hash_offsets=np.zeros(n + 1, dtype=np.int64),
        hashes=np.zeros(0, dtype=np.uint64),
        block_tokens=options.block_tokens or DEFAULT_BLOCK_TOKENS,
        source=source,
        has_prefix_info=False,
        extra_columns=extra,
        metadata={"import.tokenizer": "none: the log's usage.prompt_tokens"},
    )


def _check_logged_prompt_tokens(requests: TextRequests, counts: np.ndarray, path: str) -> None:
    """Warn when the server's own prompt token counts (a log's ``usage.prompt_tokens``) differ
    from the tokenized prompts: the tokenizer or chat template is then not the served one, and
    the block hashes will not be the server's."""
    logged = requests.logged_prompt_tokens
    if not logged:
        return
    known = np.fromiter((-1 if v is None else v for v in logged), dtype=np.int64, count=len(logged))
    differ = (known >= 0) & (known != counts)
    if differ.any():
        i = int(np.flatnonzero(differ)[0])
        warnings.warn(
            f"{path}: {int(differ.sum())} of {int((known >= 0).sum())} requests have "
            f"usage.prompt_tokens other than the tokenized prompt (first at line "
            f"{requests.lines[i]}: {int(known[i])} logged, {int(counts[i])} tokenized); is "
            "--tokenizer / --chat-template the served model's?",
            stacklevel=2,
        )


def _is_chat(prompt: object) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict)


def _arrivals(
    requests: TextRequests, session: np.ndarray, options: ImportOptions, path: str
) -> np.ndarray:
    given = [a is not None for a in requests.arrival_s]
    if all(given):
        return np.asarray(requests.arrival_s, dtype=np.float64)
    if any(given):
        i = given.index(False)
        raise InputError(
            "has no timestamp, but earlier requests have one", path=path, line=requests.lines[i]
        )
    sid = session.copy()
    missing = sid < 0
    sid[missing] = sid.max(initial=-1) + 1 + np.arange(int(missing.sum()))
    starts = None
    if requests.session_starts is not None:
        starts = np.asarray(requests.session_starts, dtype=np.float64)
    return schedule(sid, options, starts=starts)


def _previous_in_session(session: np.ndarray) -> np.ndarray:
    """Index of the previous request of the same session (source order), or -1."""
    prev = np.full(len(session), -1, dtype=np.int64)
    same = (session[1:] == session[:-1]) & (session[1:] >= 0)
    prev[1:][same] = np.flatnonzero(same)
    return prev


def chat_messages(messages: list[Any], where: Any) -> list[Message]:
    """OpenAI-style ``messages`` (``where``: the :class:`~.records.Record` holding them) as
    ``{"role", "content"}`` dicts; list content keeps its text parts, in order."""
    out: list[Message] = []
    for m in messages:
        role = m.get("role", str)
        content = m.obj.get("content")
        if content is None:
            content = ""
        elif isinstance(content, list):
            texts = []
            for k, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise m.error("only text content parts can be tokenized", f"content[{k}]")
                if not isinstance(part.get("text"), str):
                    raise m.error("missing field", f"content[{k}].text")
                texts.append(part["text"])
            content = "".join(texts)
        elif not isinstance(content, str):
            raise m.error("expected a string or a list of text parts", "content")
        out.append({"role": role, "content": content})
    if not out:
        raise where.error("no messages", "messages")
    return out


def add_conversation(
    req: TextRequests, line: int, messages: list[Message], session: int, extra: dict[str, Any]
) -> int:
    """One request per assistant turn of a conversation: its prompt is every message before
    the turn (templated), its output the turn's text. Assistant messages before the first
    other message have no prompt and are skipped. Returns the number of requests added."""
    added = 0
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        if not any(m["role"] != "assistant" for m in messages[:k]):
            continue
        req.lines.append(line)
        req.prompts.append(messages[:k])
        req.outputs.append(message["content"])
        req.arrival_s.append(None)
        req.session.append(session)
        req.salts.append(None)
        req.tenants.append(None)
        for name, value in extra.items():
            req.extra.setdefault(name, []).append(value)
        req.extra.setdefault("turn", []).append(added)
        added += 1
    return added
