"""Prompt construction for each workload kind.

Every builder returns :class:`Prompts`: for each request (in arrival order) its segments
(content ids and token lengths, see :mod:`optimizer.trace.synth.content`), its output length
and, for session kinds, its session id. Shared content (system prompts, documents) is placed at
the *front* of prompts, so that its reuse is a prefix reuse, the only kind a chained-hash prefix
cache can exploit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from optimizer.errors import InputError
from optimizer.trace.synth.content import random_ids
from optimizer.trace.synth.knobs import AgentKnobs, ChatKnobs, RagKnobs, ShortKnobs


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


def _take_prefixes(
    script_offsets: np.ndarray, script_of: np.ndarray, counts: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Request ``r`` takes the first ``counts[r]`` segments of script ``script_of[r]``.

    Returns ``(seg_offsets, index into the flat script arrays)``.
    """
    seg_offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    shift = np.repeat(script_offsets[script_of] - seg_offsets[:-1], counts)
    return seg_offsets, shift + np.arange(seg_offsets[-1], dtype=np.int64)


def _session_sizes(
    rng: np.random.Generator, n: int, sessions: int | None, mean: float, most: int
) -> np.ndarray:
    """Turns per session, summing to ``n``."""
    if sessions is not None:
        if sessions > n:
            raise InputError(f"--sessions {sessions} exceeds the number of requests ({n})")
        shares = rng.dirichlet(np.ones(sessions)) if sessions > 1 else np.ones(1)
        return 1 + rng.multinomial(n - sessions, shares).astype(np.int64)
    sizes: list[np.ndarray] = []
    total = 0
    while total < n:
        draw = np.minimum(rng.geometric(1.0 / mean, size=int(n / mean) + 16), most)
        sizes.append(draw.astype(np.int64))
        total += int(draw.sum())
    size = np.concatenate(sizes)
    upto = np.cumsum(size)
    k = int(np.searchsorted(upto, n))  # first session that reaches n requests
    size = size[: k + 1].copy()
    size[k] -= int(upto[k] - n)
    return size


def _sessions(
    rng: np.random.Generator,
    n: int,
    span_s: float,
    sizes: np.ndarray,
    gap_s: float,
    sys_ids: np.ndarray,
    sys_lens: np.ndarray,
    first_lens: np.ndarray,
    new_lens: np.ndarray,
    out_lens: np.ndarray,
) -> Prompts:
    """Growing-context sessions: prompt of turn k = turn k-1's prompt + its output + new text.

    Lengths are per request in session-major order (``first_lens`` only for turn 0,
    ``new_lens`` for later turns). Each session's *script* is ``[system, first, out_0, new_1,
    out_1, ..., new_{T-1}]``; turn k's prompt is its first ``2k + 2`` segments. Turns are put in
    time order by session start (uniform over the trace) plus exponential gaps of mean
    ``gap_s``, and that order is laid onto the arrival times, which stay exactly those of the
    arrival process.
    """
    n_sess = len(sizes)
    sess = np.repeat(np.arange(n_sess, dtype=np.int64), sizes)
    starts = np.concatenate(([0], np.cumsum(sizes)))
    turn = np.arange(n, dtype=np.int64) - starts[:-1][sess]
    # Scripts, 2T segments per session.
    script_offsets = np.concatenate(([0], np.cumsum(2 * sizes))).astype(np.int64)
    total = int(script_offsets[-1])
    s_ids = random_ids(rng, total)
    s_lens = np.empty(total, dtype=np.int64)
    which_sys = rng.integers(0, len(sys_ids), size=n_sess)
    s_ids[script_offsets[:-1]] = sys_ids[which_sys]
    s_lens[script_offsets[:-1]] = sys_lens[which_sys]
    new_pos = script_offsets[:-1][sess] + 1 + 2 * turn
    s_lens[new_pos] = np.where(turn == 0, first_lens, new_lens)
    out_pos = new_pos + 1
    has_out = turn < sizes[sess] - 1
    s_lens[out_pos[has_out]] = out_lens[has_out]
    # Time order of the turns.
    gaps = rng.exponential(gap_s, size=n) if gap_s > 0 else np.zeros(n)
    gaps[turn == 0] = 0.0
    ideal = rng.uniform(0.0, max(span_s, 1e-9), size=n_sess)[sess] + _segmented_cumsum(gaps, starts)
    order = np.lexsort((turn, sess, ideal))
    seg_offsets, idx = _take_prefixes(script_offsets, sess[order], 2 * turn[order] + 2)
    return Prompts(
        seg_offsets=seg_offsets,
        seg_ids=s_ids[idx],
        seg_lens=s_lens[idx],
        output_tokens=out_lens[order],
        session_id=sess[order],
    )


def _segmented_cumsum(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Cumulative sums of ``x`` restarting at each ``starts[i]``."""
    c = np.cumsum(x)
    base = np.concatenate(([0.0], c))[starts[:-1]]
    return c - np.repeat(base, np.diff(starts))


def _system_prompts(
    rng: np.random.Generator, count: int, mean: float, sigma: float
) -> tuple[np.ndarray, np.ndarray]:
    """A few shared system prompts, lengths drawn with a quarter of the usual spread.

    There are only a handful of them, so a wide spread would make the whole trace's reuse
    hinge on one or two draws (and thus on the seed) rather than on the knobs.
    """
    return random_ids(rng, count), lengths(rng, mean, sigma / 4, count)


def build_chat(rng: np.random.Generator, n: int, span_s: float, k: ChatKnobs) -> Prompts:
    sys_ids, sys_lens = _system_prompts(rng, k.system_prompts, k.system_tokens, k.length_sigma)
    sizes = _session_sizes(rng, n, k.sessions, k.turns_mean, k.turns_max)
    user = lengths(rng, k.user_tokens, k.length_sigma, n)
    answer = lengths(rng, k.answer_tokens, k.length_sigma, n)
    return _sessions(rng, n, span_s, sizes, k.think_s, sys_ids, sys_lens, user, user, answer)


def build_agent(rng: np.random.Generator, n: int, span_s: float, k: AgentKnobs) -> Prompts:
    sys_ids, sys_lens = _system_prompts(rng, k.system_prompts, k.system_tokens, k.length_sigma)
    sizes = _session_sizes(rng, n, k.sessions, k.steps_mean, k.steps_max)
    task = lengths(rng, k.task_tokens, k.length_sigma, n)
    tool = lengths(rng, k.tool_tokens, k.length_sigma, n)
    call = lengths(rng, k.call_tokens, k.length_sigma, n)
    return _sessions(rng, n, span_s, sizes, k.step_s, sys_ids, sys_lens, task, tool, call)


def build_rag(rng: np.random.Generator, n: int, span_s: float, k: RagKnobs) -> Prompts:
    del span_s
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


def build_short(rng: np.random.Generator, n: int, span_s: float, k: ShortKnobs) -> Prompts:
    del span_s
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
