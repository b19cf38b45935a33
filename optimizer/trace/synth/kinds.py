"""Prompt construction for each workload kind.

Every builder returns :class:`Prompts`: for each request (in arrival order) its segments
(content ids and token lengths, see :mod:`kvtier.trace.synth.content`), its output length
and, for session kinds, its session id. Shared content (system prompts, documents) is placed at
the *front* of prompts, so that its reuse is a prefix reuse, the only kind a chained-hash prefix
cache can exploit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtier.trace.synth.content import random_ids
from kvtier.trace.synth.knobs import AgentKnobs, ChatKnobs, RagKnobs, ShortKnobs
from kvtier.trace.synth.sessions import build_sessions, plan_sessions


@dataclass(frozen=True)
class Prompts:
    """Requests as segment lists, in arrival order."""

    seg_offsets: np.ndarray  # int64 (n + 1,)
    seg_ids: np.ndarray  # uint64
    seg_lens: np.ndarray  # int64, each > 0
    output_tokens: np.ndarray  # int64 (n,)
    session_id: np.ndarray | None = None  # int64 (n,)


def lengths(rng: np.random.Generator, mean: float, sigma: float, n: int, lo: int = 1) -> np.ndarray:
    """Lognormal token lengths with the given mean, rounded, clipped to ``[lo, 8 * mean]``."""
    mu = np.log(mean) - sigma**2 / 2
    x = np.rint(rng.lognormal(mu, sigma, size=n)).astype(np.int64)
    return np.clip(x, max(1, lo), max(max(1, lo), int(8 * mean)))


def _system_prompts(
    rng: np.random.Generator, count: int, mean: float, sigma: float
) -> tuple[np.ndarray, np.ndarray]:
    """A few shared system prompts, lengths drawn with a quarter of the usual spread.

    There are only a handful of them, so a wide spread would make the whole trace's reuse
    hinge on one or two draws (and thus on the seed) rather than on the knobs.
    """
    return random_ids(rng, count), lengths(rng, mean, sigma / 4, count)


def build_chat(rng: np.random.Generator, n: int, rate: float, k: ChatKnobs) -> Prompts:
    """Conversations: each turn re-sends the history (previous prompt + answer) plus new text."""
    sys_ids, sys_lens = _system_prompts(rng, k.system_prompts, k.system_tokens, k.length_sigma)
    plan = plan_sessions(
        rng,
        n,
        rate,
        k.sessions,
        k.turns_mean,
        k.turns_max,
        k.think_s,
        fixed=k.turns_fixed,
        round_major=k.round_major,
    )
    user = lengths(rng, k.user_tokens, k.length_sigma, plan.total)
    answer = lengths(rng, k.answer_tokens, k.length_sigma, plan.total)
    # drawn last, and only when asked for, so traces made without it keep their bytes
    first = (
        user if k.first_tokens is None else lengths(rng, k.first_tokens, k.length_sigma, plan.total)
    )
    return Prompts(*build_sessions(rng, plan, sys_ids, sys_lens, first, user, answer))


def build_agent(rng: np.random.Generator, n: int, rate: float, k: AgentKnobs) -> Prompts:
    """Agent runs: each step appends the model's tool call and the tool's output."""
    sys_ids, sys_lens = _system_prompts(rng, k.system_prompts, k.system_tokens, k.length_sigma)
    plan = plan_sessions(rng, n, rate, k.sessions, k.steps_mean, k.steps_max, k.step_s)
    task = lengths(rng, k.task_tokens, k.length_sigma, plan.total)
    tool = lengths(rng, k.tool_tokens, k.length_sigma, plan.total)
    call = lengths(rng, k.call_tokens, k.length_sigma, plan.total)
    return Prompts(*build_sessions(rng, plan, sys_ids, sys_lens, task, tool, call))


def build_rag(rng: np.random.Generator, n: int, rate: float, k: RagKnobs) -> Prompts:
    """System prompt, Zipf-popular documents, a unique question: shared content first."""
    del rate
    sys_ids, sys_lens = _system_prompts(rng, k.system_prompts, k.system_tokens, k.length_sigma)
    assert k.documents is not None and k.docs_per_request is not None
    assert k.doc_tokens is not None and k.min_input is not None
    d, m = int(k.documents), int(k.docs_per_request)
    doc_ids = random_ids(rng, d)
    doc_min = -(-int(k.min_input) // m)
    doc_lens = lengths(rng, k.doc_tokens, k.length_sigma, d, lo=doc_min)
    docs = _zipf_choice(rng, n, d, m, k.zipf)
    if k.doc_order == "popularity":
        docs = np.sort(docs, axis=1)
    which_sys = rng.integers(0, len(sys_ids), size=n)
    question = lengths(rng, k.question_tokens, k.length_sigma, n)
    ids = np.empty((n, m + 2), dtype=np.uint64)
    lens = np.empty((n, m + 2), dtype=np.int64)
    ids[:, 0], lens[:, 0] = sys_ids[which_sys], sys_lens[which_sys]
    ids[:, 1:-1], lens[:, 1:-1] = doc_ids[docs], doc_lens[docs]
    ids[:, -1], lens[:, -1] = random_ids(rng, n), question
    return Prompts(
        seg_offsets=np.arange(0, n * (m + 2) + 1, m + 2, dtype=np.int64),
        seg_ids=ids.ravel(),
        seg_lens=lens.ravel(),
        output_tokens=lengths(rng, k.answer_tokens, k.length_sigma, n),
    )


def _zipf_choice(rng: np.random.Generator, n: int, d: int, m: int, s: float) -> np.ndarray:
    """``n`` draws of ``m`` distinct documents out of ``d``, popularity ``p_i ~ (i+1)^-s``.

    Gumbel-top-k: adding Gumbel noise to log-weights and keeping the ``m`` largest gives an
    ordered weighted sample without replacement, the same law as drawing one document at a
    time. Document 0 is the most popular. Rows are processed in chunks to bound memory.
    """
    logw = -s * np.log(np.arange(1, d + 1, dtype=np.float64))
    out = np.empty((n, m), dtype=np.int64)
    chunk = max(1, 2_000_000 // d)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        key = logw + rng.gumbel(size=(hi - lo, d))
        top = (
            np.argpartition(-key, m - 1, axis=1)[:, :m]
            if m < d
            else np.tile(np.arange(d), (hi - lo, 1))
        )
        rank = np.argsort(-np.take_along_axis(key, top, axis=1), axis=1, kind="stable")
        out[lo:hi] = np.take_along_axis(top, rank, axis=1)
    return out


def build_short(rng: np.random.Generator, n: int, rate: float, k: ShortKnobs) -> Prompts:
    """A very short shared system prompt and a unique query: little to reuse."""
    del rate
    sys_ids, sys_lens = _system_prompts(rng, k.system_prompts, k.system_tokens, k.length_sigma)
    which_sys = rng.integers(0, len(sys_ids), size=n)
    ids = np.empty((n, 2), dtype=np.uint64)
    lens = np.empty((n, 2), dtype=np.int64)
    ids[:, 0], lens[:, 0] = sys_ids[which_sys], sys_lens[which_sys]
    ids[:, 1], lens[:, 1] = random_ids(rng, n), lengths(rng, k.query_tokens, k.length_sigma, n)
    return Prompts(
        seg_offsets=np.arange(0, 2 * n + 1, 2, dtype=np.int64),
        seg_ids=ids.ravel(),
        seg_lens=lens.ravel(),
        output_tokens=lengths(rng, k.answer_tokens, k.length_sigma, n),
    )


BUILDERS = {"chat": build_chat, "rag": build_rag, "agent": build_agent, "short": build_short}
