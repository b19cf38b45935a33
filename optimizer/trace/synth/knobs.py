"""Per-kind knobs of the workload synthesiser, with their defaults and help.

Each workload kind has one frozen dataclass. A field's ``metadata["help"]`` is the single
source for the CLI option's help and the documentation; ``None`` defaults are resolved per kind
(``rag --long`` changes several of them). :func:`make_knobs` turns keyword arguments into the
dataclass and refuses unknown knobs and out-of-range values with an :class:`InputError` that
names the CLI option.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kvtier.errors import InputError
from kvtier.trace.format import MAX_TOKENS


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass(frozen=True)
class ChatKnobs:
    """Multi-turn conversations behind a few shared system prompts."""

    sessions: int | None = field(
        default=None,
        metadata=_help(
            "number of conversations; the requests are split over exactly this many "
            "(default: as many as the turn distribution needs)"
        ),
    )
    turns_mean: float = field(
        default=4.0, metadata=_help("mean turns per conversation (geometric, >= 1)")
    )
    turns_max: int = field(default=32, metadata=_help("most turns in one conversation"))
    turns_fixed: bool = field(
        default=False,
        metadata=_help(
            "every conversation has exactly --turns-max turns (a multi-round QA benchmark's "
            "fixed rounds per user) instead of a geometric number"
        ),
    )
    round_major: bool = field(
        default=False,
        metadata=_help(
            "with --sessions S: every conversation has --requests / S turns and the trace "
            "takes them round by round (each round's turns in a random order), as a multi-turn "
            "benchmark client with a round barrier sends them; replay with --concurrency N "
            "--round-barrier S"
        ),
    )
    system_prompts: int = field(default=4, metadata=_help("number of distinct system prompts"))
    system_tokens: float = field(default=1000.0, metadata=_help("mean system prompt length"))
    user_tokens: float = field(default=200.0, metadata=_help("mean new user text per turn"))
    first_tokens: float | None = field(
        default=None,
        metadata=_help(
            "mean user text of a conversation's first turn, e.g. a user's earlier history "
            "(default: as --user-tokens)"
        ),
    )
    answer_tokens: float = field(
        default=300.0, metadata=_help("mean answer length (output tokens)")
    )
    think_s: float = field(
        default=30.0, metadata=_help("mean user think time between turns, seconds")
    )
    length_sigma: float = field(
        default=0.7, metadata=_help("log-space standard deviation of every length draw")
    )


@dataclass(frozen=True)
class AgentKnobs:
    """Coding-agent loops: each step appends the model's tool call and the tool's output."""

    sessions: int | None = field(
        default=None,
        metadata=_help(
            "number of agent runs; the requests are split over exactly this many "
            "(default: as many as the step distribution needs)"
        ),
    )
    steps_mean: float = field(default=25.0, metadata=_help("mean steps per run (geometric)"))
    steps_max: int = field(default=60, metadata=_help("most steps in one run"))
    system_prompts: int = field(
        default=3, metadata=_help("distinct system prompts (instructions + tool schemas)")
    )
    system_tokens: float = field(default=6000.0, metadata=_help("mean system prompt length"))
    task_tokens: float = field(default=500.0, metadata=_help("mean task description length"))
    tool_tokens: float = field(default=1500.0, metadata=_help("mean tool output per step"))
    call_tokens: float = field(
        default=250.0, metadata=_help("mean model output per step (the tool call)")
    )
    step_s: float = field(default=5.0, metadata=_help("mean tool run time between steps, s"))
    length_sigma: float = field(
        default=0.7, metadata=_help("log-space standard deviation of every length draw")
    )


@dataclass(frozen=True)
class RagKnobs:
    """Retrieval-augmented prompts: system prompt, retrieved documents, question."""

    long: bool = field(
        default=False,
        metadata=_help(
            "LV-Eval-like long inputs: defaults become 1000 documents of 24000 tokens, "
            "1 per request, --min-input 16384"
        ),
    )
    documents: int | None = field(
        default=None, metadata=_help("document pool size (default 500; --long 1000)")
    )
    doc_tokens: float | None = field(
        default=None, metadata=_help("mean document length (default 800; --long 24000)")
    )
    docs_per_request: int | None = field(
        default=None, metadata=_help("documents per prompt (default 4; --long 1)")
    )
    min_input: int | None = field(
        default=None,
        metadata=_help(
            "lengthen documents so every prompt has at least this many tokens "
            "(default 0; --long 16384)"
        ),
    )
    zipf: float = field(
        default=1.0, metadata=_help("Zipf exponent of document popularity (0 = uniform)")
    )
    doc_order: str = field(
        default="retrieval",
        metadata=_help(
            "order of documents in the prompt: 'retrieval' (as drawn) or 'popularity' "
            "(most popular first, a cache-friendly canonical order)"
        ),
    )
    system_prompts: int = field(default=1, metadata=_help("number of distinct system prompts"))
    system_tokens: float = field(default=400.0, metadata=_help("mean system prompt length"))
    question_tokens: float = field(default=60.0, metadata=_help("mean question length"))
    answer_tokens: float = field(
        default=200.0, metadata=_help("mean answer length (output tokens)")
    )
    length_sigma: float = field(
        default=0.7, metadata=_help("log-space standard deviation of every length draw")
    )


@dataclass(frozen=True)
class ShortKnobs:
    """Independent short queries behind a very short shared system prompt."""

    system_prompts: int = field(default=4, metadata=_help("number of distinct system prompts"))
    system_tokens: float = field(default=20.0, metadata=_help("mean system prompt length"))
    query_tokens: float = field(default=250.0, metadata=_help("mean query length"))
    answer_tokens: float = field(
        default=150.0, metadata=_help("mean answer length (output tokens)")
    )
    length_sigma: float = field(
        default=0.7, metadata=_help("log-space standard deviation of every length draw")
    )


KNOBS: dict[str, type] = {
    "chat": ChatKnobs,
    "rag": RagKnobs,
    "agent": AgentKnobs,
    "short": ShortKnobs,
}

_RAG_DEFAULTS = {"documents": 500, "doc_tokens": 800.0, "docs_per_request": 4, "min_input": 0}
_RAG_LONG_DEFAULTS = {
    "documents": 1000,
    "doc_tokens": 24000.0,
    "docs_per_request": 1,
    "min_input": 16384,
}


def option_name(knob: str) -> str:
    """The CLI spelling of a knob: ``turns_mean`` -> ``--turns-mean``."""
    return "--" + knob.replace("_", "-")


def _check(ok: bool, knob: str, what: str, value: Any) -> None:
    if not ok:
        raise InputError(f"{option_name(knob)} must be {what}, got {value}")


def make_knobs(kind: str, values: dict[str, Any]) -> Any:
    """Build and check the knob dataclass of ``kind`` from keyword values (``None`` = default)."""
    if kind not in KNOBS:
        raise InputError(f"unknown workload kind {kind!r}; choose one of {', '.join(KNOBS)}")
    cls = KNOBS[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(k for k, v in values.items() if k not in names and v is not None)
    if unknown:
        raise InputError(
            f"{option_name(unknown[0])} does not apply to '{kind}' workloads "
            f"(their options: {', '.join(option_name(n) for n in sorted(names))})"
        )
    given = {k: v for k, v in values.items() if k in names and v is not None}
    for k in ("turns_mean", "turns_max", "turns_fixed", "steps_mean", "steps_max"):
        if "sessions" in given and k in given:
            raise InputError(
                f"--sessions and {option_name(k)} exclude each other: with --sessions the "
                "requests are split over the sessions"
            )
    if given.get("round_major") and "sessions" not in given:
        raise InputError("--round-major needs --sessions (the conversations of each round)")
    if given.get("round_major") and "think_s" in given:
        raise InputError(
            "--round-major and --think-s exclude each other: the rounds set the order, the "
            "arrival process the times"
        )
    if kind == "rag":
        defaults = _RAG_LONG_DEFAULTS if given.get("long") else _RAG_DEFAULTS
        given = {**defaults, **given}
    knobs = cls(**given)
    _validate(knobs)
    present = [n for n in _INTEGER_KNOBS if getattr(knobs, n, None) is not None]
    return dataclasses.replace(knobs, **{n: int(getattr(knobs, n)) for n in present})


_INTEGER_KNOBS = (
    "sessions",
    "turns_max",
    "steps_max",
    "system_prompts",
    "documents",
    "docs_per_request",
    "min_input",
)


def _validate(knobs: Any) -> None:
    for f in dataclasses.fields(knobs):
        v = getattr(knobs, f.name)
        if f.name in ("long", "doc_order", "turns_fixed", "round_major") or v is None:
            continue
        if f.name == "length_sigma":
            _check(0 <= v <= 3, f.name, "between 0 and 3", v)
        elif f.name in ("zipf", "min_input", "think_s", "step_s"):
            _check(v >= 0, f.name, ">= 0", v)
        elif f.name in ("turns_mean", "steps_mean"):
            _check(v >= 1, f.name, ">= 1", v)
        else:
            _check(v > 0, f.name, "> 0", v)
        if f.name in _INTEGER_KNOBS:
            _check(float(v).is_integer(), f.name, "an integer", v)
        if f.name.endswith("_tokens") or f.name == "min_input":
            _check(v <= MAX_TOKENS, f.name, f"<= {MAX_TOKENS:,} (the largest request)", v)
    if isinstance(knobs, ChatKnobs):
        _check(knobs.turns_max >= knobs.turns_mean, "turns_max", ">= --turns-mean", knobs.turns_max)
    if isinstance(knobs, AgentKnobs):
        _check(knobs.steps_max >= knobs.steps_mean, "steps_max", ">= --steps-mean", knobs.steps_max)
    if isinstance(knobs, RagKnobs):
        _check(
            knobs.doc_order in ("retrieval", "popularity"),
            "doc_order",
            "'retrieval' or 'popularity'",
            knobs.doc_order,
        )
        _check(
            knobs.docs_per_request <= knobs.documents,
            "docs_per_request",
            f"<= --documents ({knobs.documents})",
            knobs.docs_per_request,
        )


@dataclass(frozen=True)
class KnobSpec:
    """One knob as the CLI sees it: the union over kinds of fields with that name."""

    name: str
    kind_of_value: str  # "int", "float", "bool" or "str"
    help: str
    kinds: tuple[str, ...]


def knob_specs() -> list[KnobSpec]:
    """Every knob of every kind, once, in first-seen order, with help naming kinds and defaults."""
    seen: dict[str, list[tuple[str, dataclasses.Field[Any]]]] = {}
    for kind, cls in KNOBS.items():
        for f in dataclasses.fields(cls):
            seen.setdefault(f.name, []).append((kind, f))
    specs = []
    for name, entries in seen.items():
        type_text = str(entries[0][1].type)
        value = next(t for t in ("bool", "int", "float", "str") if t in type_text)
        defaults = []
        for kind, f in entries:
            d = f.default
            if d is not None and value != "bool":
                defaults.append(f"{kind} {d:g}" if isinstance(d, float) else f"{kind} {d}")
        text = entries[0][1].metadata["help"]
        kinds = tuple(kind for kind, _ in entries)
        if len({d.split(" ", 1)[1] for d in defaults}) == 1:
            defaults = [defaults[0]]
        if len(defaults) > 1:
            text += f" (default: {', '.join(defaults)})"
        elif defaults:
            text += f" (default {defaults[0].split(' ', 1)[1]})"
        text += f" [{'/'.join(kinds)}]"
        specs.append(KnobSpec(name=name, kind_of_value=value, help=text, kinds=kinds))
    return specs
