"""Sessions whose context grows turn by turn (chat conversations, agent runs).

A session's *script* is ``[system, first, out_0, new_1, out_1, ..., new_{T-1}]``: turn ``k``'s
prompt is the script's first ``2k + 2`` segments, that is the previous turn's prompt, the
previous turn's output, and the new text (a user message, a tool result).

Timing. By default the trace is a window of a steady stream of sessions: sessions start at a
constant rate from well before time 0 (long enough that the longest session is under way), so
the window opens in the middle of conversations, exactly like a production trace cut out of
continuous traffic, and sessions still running at the end are cut off. Turns of a session are
separated by gaps of mean ``gap_s``: a quarter of the mean as a floor (nobody answers before
reading) plus an exponential. This gives every request an ideal time; requests are ordered by it
and that order is laid onto the arrival times of the arrival process, which therefore stay
exactly Poisson or gamma. With an explicit session count the requests are instead split over
exactly that many sessions (shares from a flat Dirichlet), all starting inside the trace; with
``round_major`` too, each has the same number of turns and the trace takes them round by round,
every session's turn ``r`` before any turn ``r + 1`` (a multi-turn benchmark client with a round
barrier), each round's sessions in a random order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtier.errors import InputError
from kvtier.trace.synth.content import random_ids


@dataclass(frozen=True)
class SessionPlan:
    """Which generated turns make up the trace, and in which order they arrive."""

    sizes: np.ndarray  # int64: turns of every generated session
    sess: np.ndarray  # int64: session of every generated turn (session-major order)
    turn: np.ndarray  # int64: turn index within its session
    order: np.ndarray  # int64 (n,): generated turns in the trace, in arrival order

    @property
    def total(self) -> int:
        """Number of generated turns (>= n; length of the per-turn length arrays)."""
        return len(self.sess)


def _turns(rng: np.random.Generator, count: int, mean: float, most: int) -> np.ndarray:
    return np.minimum(rng.geometric(1.0 / mean, size=count), most).astype(np.int64)


def _ideal_times(
    rng: np.random.Generator, sizes: np.ndarray, starts: np.ndarray, gap_s: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    sess = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    first = np.concatenate(([0], np.cumsum(sizes)))
    turn = np.arange(len(sess), dtype=np.int64) - first[:-1][sess]
    gaps = gap_s * (0.25 + rng.exponential(0.75, size=len(sess)))
    gaps[turn == 0] = 0.0
    c = np.cumsum(gaps)
    base = np.concatenate(([0.0], c))[first[:-1]]
    return sess, turn, starts[sess] + c - np.repeat(base, sizes)


def plan_sessions(
    rng: np.random.Generator,
    n: int,
    rate: float,
    sessions: int | None,
    mean: float,
    most: int,
    gap_s: float,
    *,
    fixed: bool = False,
    round_major: bool = False,
) -> SessionPlan:
    """Choose ``n`` turns of a session stream and their arrival order (see the module doc).

    ``fixed``: every session has exactly ``most`` turns (no geometric draw). ``round_major``
    (with ``sessions``): every session has ``n / sessions`` turns, taken round by round, each
    round's turns in a random order (a round-barrier client's order).
    """
    span = n / rate
    if round_major:
        if sessions is None or n % sessions:
            raise InputError(
                f"--round-major needs --requests ({n}) a multiple of --sessions ({sessions})"
            )
        rounds = n // sessions
        sess = np.repeat(np.arange(sessions, dtype=np.int64), rounds)
        turn = np.tile(np.arange(rounds, dtype=np.int64), sessions)
        sizes = np.full(sessions, rounds, dtype=np.int64)
        return SessionPlan(sizes, sess, turn, np.lexsort((rng.random(n), turn)))
    if sessions is not None:
        if sessions > n:
            raise InputError(f"--sessions {sessions} exceeds the number of requests ({n})")
        shares = rng.dirichlet(np.ones(sessions)) if sessions > 1 else np.ones(1)
        sizes = 1 + rng.multinomial(n - sessions, shares).astype(np.int64)
        starts = rng.uniform(0.0, span, size=sessions)
        sess, turn, ideal = _ideal_times(rng, sizes, starts, gap_s)
        return SessionPlan(sizes, sess, turn, np.lexsort((turn, sess, ideal)))
    p = 1.0 / mean
    turns_per_session = most if fixed else (1.0 - (1.0 - p) ** most) / p  # mean turns
    warm = gap_s * most  # longer than any session lasts, on average per gap
    horizon = 1.5 * span + gap_s + 1.0
    while True:
        count = max(1, int(rng.poisson(rate / turns_per_session * (warm + horizon))))
        starts = rng.uniform(-warm, horizon, size=count)
        sizes = np.full(count, most, dtype=np.int64) if fixed else _turns(rng, count, mean, most)
        sess, turn, ideal = _ideal_times(rng, sizes, starts, gap_s)
        inside = np.flatnonzero((ideal >= 0) & (ideal < horizon))
        if len(inside) >= n:
            break
        horizon *= 2  # rare: the stream came out short; widen the window and draw again
    keep = inside[np.lexsort((turn[inside], sess[inside], ideal[inside]))][:n]
    # Drop sessions without a turn in the trace (most of the warm-up at high rates), so that
    # lengths and scripts are only drawn for sessions that matter.
    used = np.zeros(len(sizes), dtype=bool)
    used[sess[keep]] = True
    mask = used[sess]
    new_index = np.cumsum(mask) - 1
    renumber = np.cumsum(used) - 1
    return SessionPlan(sizes[used], renumber[sess[mask]], turn[mask], new_index[keep])


def build_sessions(
    rng: np.random.Generator,
    plan: SessionPlan,
    sys_ids: np.ndarray,
    sys_lens: np.ndarray,
    first_lens: np.ndarray,
    new_lens: np.ndarray,
    out_lens: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Segments of the planned turns, in arrival order.

    Length arrays are per generated turn (``plan.total``): ``first_lens`` is used for turn 0,
    ``new_lens`` for later turns, ``out_lens`` is every turn's output. Returns
    ``(seg_offsets, seg_ids, seg_lens, output_tokens, session_id)``; session ids are numbered
    0, 1, ... in order of their first request in the trace.
    """
    sizes, sess, turn, order = plan.sizes, plan.sess, plan.turn, plan.order
    script_offsets = np.concatenate(([0], np.cumsum(2 * sizes))).astype(np.int64)
    total = int(script_offsets[-1])
    s_ids = random_ids(rng, total)
    s_lens = np.zeros(total, dtype=np.int64)
    which_sys = rng.integers(0, len(sys_ids), size=len(sizes))
    s_ids[script_offsets[:-1]] = sys_ids[which_sys]
    s_lens[script_offsets[:-1]] = sys_lens[which_sys]
    new_pos = script_offsets[:-1][sess] + 1 + 2 * turn
    s_lens[new_pos] = np.where(turn == 0, first_lens, new_lens)
    has_out = turn < sizes[sess] - 1
    s_lens[new_pos[has_out] + 1] = out_lens[has_out]
    counts = 2 * turn[order] + 2
    seg_offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
    shift = np.repeat(script_offsets[sess[order]] - seg_offsets[:-1], counts)
    idx = shift + np.arange(seg_offsets[-1], dtype=np.int64)
    _, first_seen, inverse = np.unique(sess[order], return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first_seen, kind="stable"), kind="stable")
    return seg_offsets, s_ids[idx], s_lens[idx], out_lens[order], rank[inverse].astype(np.int64)
